//! The records of schedules (the contract, section 16): what a schedule fires and when, as a
//! user declares it (in `homing.toml` or through the API, the same record either way), and the
//! state its ticks move forward: the watermark of handled fire times, the fires waiting for
//! their turn, a pause and the last outcomes. When a schedule fires, what a missed or
//! overlapping slot becomes and what its dispatches are called are the rules'
//! (`rules::schedules`).

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::bytes_as_text;

/// When a schedule fires, in its zone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Spec {
    /// A cron expression: five fields (minute to day of week), six (seconds first) or a
    /// shorthand (`@daily`, `@hourly`...), matched against wall time in the zone.
    Cron(String),
    /// Every `every_ms` of absolute time, at `anchor_ms + k * every_ms` (UTC milliseconds).
    Every {
        /// The interval.
        every_ms: u64,
        /// A fire time the others are counted from (default: the Unix epoch).
        #[serde(default)]
        anchor_ms: u64,
    },
    /// Once, at this time (UTC milliseconds).
    At(u64),
}

/// What a wall time that does not exist (a spring-forward gap) becomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Gap {
    /// It fires once, at the first instant after the gap.
    #[default]
    Shift,
    /// It does not fire; the slot is recorded as skipped (`dst_gap`).
    Skip,
}

/// Which occurrences of a wall time that happens twice (an autumn fold) fire, for a cron whose
/// hour field names hours; one whose hour field is `*` or a step fires at every occurrence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fold {
    /// The first (the earlier instant).
    #[default]
    First,
    /// The second.
    Last,
    /// Both.
    Both,
}

/// The daylight-saving policy of a cron schedule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dst {
    /// A nonexistent wall time.
    #[serde(default)]
    pub gap: Gap,
    /// A repeated wall time.
    #[serde(default)]
    pub fold: Fold,
}

/// What a fire does while the schedule's last dispatch is still live (queued, claimed or
/// waiting).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// Nothing fires; the slot is recorded as skipped (`overlap_skip`).
    #[default]
    Skip,
    /// The newest such slot waits, and fires when the last dispatch ends; an older waiting one
    /// is recorded as skipped (`buffer_full`).
    BufferOne,
    /// Every such slot waits, up to `max_buffered`; past that, skipped (`buffer_full`).
    BufferAll,
    /// The last dispatch's thread is interrupted, then the slot fires.
    CancelOther,
    /// The slot fires anyway (only with a thread per fire: one thread runs one dispatch at a
    /// time).
    Allow,
}

/// Which missed slots fire after downtime or a forward jump of the clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CatchupPolicy {
    /// Only the newest slot within the window (the others are recorded as `coalesced`).
    #[default]
    Latest,
    /// Every slot within the window, oldest first, at most `max`.
    All,
    /// None.
    None,
}

/// The catch-up of missed slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catchup {
    /// Which slots fire.
    #[serde(default)]
    pub policy: CatchupPolicy,
    /// How far back a missed slot may be and still fire (milliseconds); an older one is
    /// recorded as `missed_window`.
    pub window_ms: u64,
    /// The most slots one catch-up fires with `all`.
    pub max: u32,
}

/// The default catch-up window: one hour.
pub const DEFAULT_CATCHUP_WINDOW_MS: u64 = 3_600_000;
/// The default number of slots a catch-up with `all` fires.
pub const DEFAULT_CATCHUP_MAX: u32 = 10;
/// The default number of slots `buffer_all` keeps.
pub const DEFAULT_MAX_BUFFERED: u32 = 16;
/// The most slots `buffer_all` may be set to keep.
pub const MAX_BUFFERED: u32 = 1_000;
/// The outcomes a schedule keeps (the newest).
pub const KEPT_OUTCOMES: usize = 20;

impl Default for Catchup {
    fn default() -> Self {
        Catchup {
            policy: CatchupPolicy::Latest,
            window_ms: DEFAULT_CATCHUP_WINDOW_MS,
            max: DEFAULT_CATCHUP_MAX,
        }
    }
}

/// The thread a fire's dispatch runs on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThreadChoice {
    /// Always this thread: one fire's dispatch runs after another's.
    Fixed(String),
    /// A thread of its own per fire, `<schedule>/<fire time>`.
    PerFire,
}

/// A schedule as declared: everything a user sets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleDef {
    /// Its name: the key of its record and of its dispatches' ids.
    pub name: String,
    /// The agent its dispatches are routed to.
    pub agent: String,
    /// The payload of every fire.
    #[serde(with = "bytes_as_text")]
    pub payload: Vec<u8>,
    /// Metadata of every fire (the rules add what names the fire).
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// The thread of its dispatches.
    pub thread: ThreadChoice,
    /// When it fires.
    pub spec: Spec,
    /// The IANA zone its cron is read in (`UTC` by default).
    pub timezone: String,
    /// No fire before this time (UTC milliseconds).
    #[serde(default)]
    pub start_at: Option<u64>,
    /// No fire after this time (UTC milliseconds).
    #[serde(default)]
    pub end_at: Option<u64>,
    /// Each fire's due time is its fire time plus a delay in `[0, jitter_ms)` derived from the
    /// schedule and the fire time (the same on every host), kept before the next fire time.
    #[serde(default)]
    pub jitter_ms: u64,
    /// What a fire does while the last dispatch is live.
    #[serde(default)]
    pub overlap: Overlap,
    /// The slots `buffer_all` keeps at most.
    pub max_buffered: u32,
    /// Which missed slots fire.
    #[serde(default)]
    pub catchup: Catchup,
    /// The daylight-saving policy.
    #[serde(default)]
    pub dst: Dst,
    /// Pause the schedule when one of its dispatches dead-letters.
    #[serde(default)]
    pub pause_on_failure: bool,
}

/// Where a schedule was declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// `[schedules.NAME]` in `homing.toml`: a reload that no longer declares it deletes it.
    Config,
    /// The API or the CLI: it stays until deleted.
    Api,
}

impl Source {
    /// Its stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Config => "config",
            Source::Api => "api",
        }
    }
}

/// Why a slot did not fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// It was due longer ago than the catch-up window (or the policy is `none`).
    MissedWindow,
    /// A newer missed slot fired in its place (catch-up `latest`).
    Coalesced,
    /// The last dispatch was still live (overlap `skip`).
    OverlapSkip,
    /// The buffer of waiting slots was full.
    BufferFull,
    /// The schedule was paused.
    Paused,
    /// Its wall time does not exist in the zone (`dst.gap = skip`).
    DstGap,
}

impl SkipReason {
    /// Its stable name (the API's, the metrics' label).
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::MissedWindow => "missed_window",
            SkipReason::Coalesced => "coalesced",
            SkipReason::OverlapSkip => "overlap_skip",
            SkipReason::BufferFull => "buffer_full",
            SkipReason::Paused => "paused",
            SkipReason::DstGap => "dst_gap",
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a fire came about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FireKind {
    /// At its time.
    OnTime,
    /// Late, after downtime or a jump of the clock, within the catch-up window.
    CatchUp,
    /// Held back by overlap, fired when the last dispatch ended.
    Buffered,
    /// By an operator's `backfill` of past slots.
    Backfill,
    /// By an operator's `trigger`.
    Manual,
}

impl FireKind {
    /// Its stable name (the `fire` metadata of the dispatch).
    pub fn as_str(self) -> &'static str {
        match self {
            FireKind::OnTime => "on-time",
            FireKind::CatchUp => "catch-up",
            FireKind::Buffered => "buffered",
            FireKind::Backfill => "backfill",
            FireKind::Manual => "manual",
        }
    }
}

impl FromStr for Overlap {
    type Err = String;

    fn from_str(s: &str) -> Result<Overlap, String> {
        match s {
            "skip" => Ok(Overlap::Skip),
            "buffer_one" => Ok(Overlap::BufferOne),
            "buffer_all" => Ok(Overlap::BufferAll),
            "cancel_other" => Ok(Overlap::CancelOther),
            "allow" => Ok(Overlap::Allow),
            other => Err(format!(
                "unknown overlap `{}` (expected skip, buffer_one, buffer_all, cancel_other or allow)",
                other.escape_debug()
            )),
        }
    }
}

/// What became of one slot (or, for slots skipped together for one reason, of a run of them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// The slot's fire time (UTC milliseconds); the first of a run.
    pub fire: u64,
    /// The last fire time of a run of slots skipped together (absent for one slot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub through: Option<u64>,
    /// How many slots the outcome covers (1 for one).
    pub slots: u64,
    /// When it was decided (store clock).
    pub at: u64,
    /// The dispatch it enqueued, when it fired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatch: Option<String>,
    /// How it fired, when it fired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<FireKind>,
    /// Why it did not fire, when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<SkipReason>,
}

/// A pause of a schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedulePause {
    /// Why, as the operator (or `pause_on_failure`) said.
    pub reason: String,
    /// When (store clock).
    pub at: u64,
}

/// A stored schedule: its declaration and the state its ticks move forward.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    /// What the user declared.
    pub def: ScheduleDef,
    /// Where.
    pub source: Source,
    /// Every fire time up to this one is handled (fired, buffered or skipped); only later ones
    /// may fire. It never moves back.
    pub watermark: u64,
    /// The id of the tick dispatch that handles the schedule next (none while it is paused);
    /// a tick with another id is stale and does nothing.
    #[serde(default)]
    pub tick: Option<String>,
    /// How many ticks were made for it: numbers the next one's id, so no two share one.
    #[serde(default)]
    pub ticks: u64,
    /// The last dispatch a fire enqueued.
    #[serde(default)]
    pub last_dispatch: Option<String>,
    /// Fire times held back by overlap, oldest first.
    #[serde(default)]
    pub buffered: VecDeque<u64>,
    /// The pause in force.
    #[serde(default)]
    pub paused: Option<SchedulePause>,
    /// The newest outcomes, oldest first (at most [`KEPT_OUTCOMES`]).
    #[serde(default)]
    pub outcomes: VecDeque<Outcome>,
    /// When it was created (store clock).
    pub created_at: u64,
    /// When it last changed.
    pub updated_at: u64,
}
