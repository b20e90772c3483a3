//! The records the store keeps: dispatches, run results, interrupts and log entries.
//!
//! A [`Dispatch`] is the unit of agent work (the contract, docs/contract.md, section 1). Its shape rules are structural
//! where Rust allows it: the three claim fields live in one `Option<Claim>`, so a record can
//! never carry half a claim. The rest (a queued record has no result, a terminal one has
//! `completed_at`) is checked by [`Dispatch::check_shape`] on every decode and every write.

pub mod inbox;
pub mod limits;
pub mod schedules;
pub mod window;

pub use window::{Debounce, Gather, Item, Window};

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The priority a dispatch gets when the submitter names none (0 is most urgent).
pub const DEFAULT_PRIORITY: u8 = 128;

/// How many failed attempts a dispatch may use when the submitter names no limit (a setting's
/// default, so it lives with the config).
pub use crate::config::DEFAULT_MAX_ATTEMPTS;

/// The lifecycle state of a dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Waiting to be claimed (possibly not before `available_at`).
    Queued,
    /// Held by one claim token until the lease runs out.
    Claimed,
    /// Suspended by its holder until one of its waitpoints leaves `pending`: no claim, no
    /// lease; its thread stays busy.
    Waiting,
    /// Delivered and settled by its holder.
    Acked,
    /// Withdrawn by the control plane before anyone claimed it.
    Cancelled,
    /// Made obsolete by an interrupt of its thread (epoch fencing).
    Superseded,
    /// Gave up: attempts exhausted, or the holder said so.
    DeadLetter,
}

impl Status {
    /// Every status, in lifecycle order.
    pub const ALL: [Status; 7] = [
        Status::Queued,
        Status::Claimed,
        Status::Waiting,
        Status::Acked,
        Status::Cancelled,
        Status::Superseded,
        Status::DeadLetter,
    ];

    /// Whether a cancel (T3) takes a dispatch in this status: queued or waiting (a claimed one
    /// is stopped by its host, a terminal one is settled).
    pub fn can_cancel(self) -> bool {
        matches!(self, Status::Queued | Status::Waiting)
    }

    /// Terminal states never change again; only purge removes them.
    pub fn is_terminal(self) -> bool {
        !matches!(self, Status::Queued | Status::Claimed | Status::Waiting)
    }

    /// The stable lowercase name used in storage, the CLI and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::Claimed => "claimed",
            Status::Waiting => "waiting",
            Status::Acked => "acked",
            Status::Cancelled => "cancelled",
            Status::Superseded => "superseded",
            Status::DeadLetter => "dead_letter",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for Status {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Status::ALL
            .into_iter()
            .find(|status| status.as_str() == s || (s == "dead-letter" && *status == Status::DeadLetter))
            .ok_or_else(|| {
                format!(
                    "unknown status `{s}` (expected one of queued, claimed, waiting, acked, cancelled, superseded, dead_letter)"
                )
            })
    }
}

/// The live claim on a dispatch. Present exactly when the dispatch is `Claimed`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// The bearer token of this claim; minted by the store, never by the claimer.
    pub token: String,
    /// Who claimed it (a host id plus worker); informational.
    pub claimed_by: String,
    /// The lease deadline: live while `lease_until >= now`.
    pub lease_until: u64,
}

/// How a run ended, as recorded by the holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// The agent produced its output.
    Succeeded,
    /// The agent failed; `error` says why.
    Failed,
}

impl RunStatus {
    /// The stable lowercase name used in storage.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
        }
    }

    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "succeeded" => Some(RunStatus::Succeeded),
            "failed" => Some(RunStatus::Failed),
            _ => None,
        }
    }
}

/// The run projection a holder records before settling: what the agent produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunResult {
    /// Whether the run succeeded.
    pub status: RunStatus,
    /// The agent's output bytes (opaque to the store).
    #[serde(with = "bytes_as_text")]
    pub output: Vec<u8>,
    /// The error text of a failed run.
    pub error: Option<String>,
}

/// Tokens a claim's model calls used, as the host read them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Input (prompt) tokens.
    pub input_tokens: u64,
    /// Output (completion) tokens.
    pub output_tokens: u64,
    /// Input tokens read from the provider's cache (part of `input_tokens`).
    pub cached_tokens: u64,
    /// Model calls metered.
    pub calls: u64,
}

impl Usage {
    /// Adds `other`.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(other.cached_tokens);
        self.calls = self.calls.saturating_add(other.calls);
    }
}

impl RunResult {
    /// A successful result with these output bytes.
    pub fn success(output: impl Into<Vec<u8>>) -> Self {
        RunResult {
            status: RunStatus::Succeeded,
            output: output.into(),
            error: None,
        }
    }

    /// A failed result with this error text.
    pub fn failure(error: impl Into<String>) -> Self {
        RunResult {
            status: RunStatus::Failed,
            output: Vec::new(),
            error: Some(error.into()),
        }
    }
}

/// A stored dispatch (the contract, docs/contract.md, section 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dispatch {
    /// Unique id (UUID v7 when the submitter gives none).
    pub id: String,
    /// The plugin this dispatch is routed to.
    pub agent: String,
    /// The serialization key: at most one live claim per thread.
    pub thread: String,
    /// The agent run this dispatch activates (defaults to `id`).
    pub run_id: String,
    /// Opaque input for the agent.
    #[serde(with = "bytes_as_text")]
    pub payload: Vec<u8>,
    /// A small string map for the agent and for operators.
    pub metadata: BTreeMap<String, String>,
    /// 0 is most urgent.
    pub priority: u8,
    /// Not claimable by the queue before this time.
    pub available_at: u64,
    /// At most one non-terminal dispatch per (thread, key).
    pub dedupe_key: Option<String>,
    /// The number of failed attempts after which the dispatch dead-letters.
    pub max_attempts: u32,
    /// Failed attempts so far (nack, lease expiry, crash).
    pub attempt: u32,
    /// Its thread log's latest sequence when it was first claimed (stamped by the store): the
    /// entries its runs wrote come after it, which is what a `rollback` message masks.
    /// Serialized only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_from: Option<u64>,
    /// How many times it has been claimed (each claim adds one; never lowered): the number of
    /// the run a claim starts, which numbers that run's streamed output and journal entries.
    /// Serialized only when set, so a record that never ran keeps its bytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub claims: u32,
    /// How many times it came back from waiting on its waitpoints (never lowered; never an
    /// attempt).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resumes: u32,
    /// The key its runs are limited by (flow control: at most `key_concurrency` of the
    /// plugin's dispatches with one key run at once). Serialized only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// The version of its plugin each claim ran, oldest first (at most
    /// [`MAX_VERSION_RUNS`]); the last is the version its run
    /// is pinned to. Serialized only when set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<VersionRun>,
    /// Its debounce window, when it was enqueued with one: what joined it and when it is
    /// due. Open (others may join) while queued, never claimed and not sealed. Serialized
    /// only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<Window>,
    /// The tokens its runs' metered model calls used, summed over the attempts whose claim
    /// settled it (added by the settling holder write). Serialized only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The thread's epoch when this dispatch was enqueued (stamped by the store).
    pub epoch: u64,
    /// Lifecycle state.
    pub status: Status,
    /// The live claim, exactly when `status` is `Claimed`.
    pub claim: Option<Claim>,
    /// When the current holder recorded the start of its run.
    pub started_at: Option<u64>,
    /// What the run produced, once recorded.
    pub result: Option<RunResult>,
    /// The last failure or terminal reason (nack error, dead-letter reason, supersede reason).
    pub last_error: Option<String>,
    /// When the dispatch was enqueued.
    pub created_at: u64,
    /// When the dispatch last changed.
    pub updated_at: u64,
    /// When the dispatch reached a terminal state.
    pub completed_at: Option<u64>,
}

impl Dispatch {
    /// The claim token, when the dispatch is claimed.
    pub fn token(&self) -> Option<&str> {
        self.claim.as_ref().map(|claim| claim.token.as_str())
    }

    /// Checks the shape rules of the contract (docs/contract.md) section 1: which fields each status may carry.
    ///
    /// # Errors
    ///
    /// A description of the first rule the record breaks.
    pub fn check_shape(&self) -> Result<(), String> {
        if self.id.trim().is_empty() {
            return Err("dispatch id is blank".into());
        }
        if self.agent.trim().is_empty() {
            return Err(format!("dispatch {}: agent is blank", self.id));
        }
        if self.thread.trim().is_empty() {
            return Err(format!("dispatch {}: thread is blank", self.id));
        }
        if self.max_attempts == 0 {
            return Err(format!("dispatch {}: max_attempts is 0", self.id));
        }
        if self.attempt > self.max_attempts {
            return Err(format!(
                "dispatch {}: attempt {} exceeds max_attempts {}",
                self.id, self.attempt, self.max_attempts
            ));
        }
        match self.status {
            Status::Queued | Status::Waiting => {
                let status = self.status;
                if self.claim.is_some() {
                    return Err(format!("{status} dispatch {} carries a claim", self.id));
                }
                if self.result.is_some() || self.started_at.is_some() {
                    return Err(format!(
                        "{status} dispatch {} carries a run projection",
                        self.id
                    ));
                }
                if self.completed_at.is_some() {
                    return Err(format!("{status} dispatch {} has completed_at", self.id));
                }
            }
            Status::Claimed => {
                let Some(claim) = &self.claim else {
                    return Err(format!("claimed dispatch {} has no claim", self.id));
                };
                if claim.token.is_empty() || claim.claimed_by.is_empty() {
                    return Err(format!(
                        "claimed dispatch {} has a blank token or holder",
                        self.id
                    ));
                }
                if self.completed_at.is_some() {
                    return Err(format!("claimed dispatch {} has completed_at", self.id));
                }
            }
            _ => {
                if self.claim.is_some() {
                    return Err(format!("terminal dispatch {} carries a claim", self.id));
                }
                if self.completed_at.is_none() {
                    return Err(format!("terminal dispatch {} has no completed_at", self.id));
                }
            }
        }
        Ok(())
    }
}

/// A dispatch as a list shows it: every field of the record but its payload and its run's
/// output, which it gives by size, and its claim token, which no list shows. What
/// [`Mailbox::list_rows`](crate::store::Mailbox::list_rows) returns: a backend reads no payload
/// or output for it where it can, so a page of rows costs the same whatever the dispatches
/// carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DispatchRow {
    /// Unique id.
    pub id: String,
    /// The plugin this dispatch is routed to.
    pub agent: String,
    /// The serialization key.
    pub thread: String,
    /// The agent run this dispatch activates.
    pub run_id: String,
    /// The payload's size in bytes.
    pub payload_size: u64,
    /// The metadata (at most [`MAX_METADATA`] bytes).
    pub metadata: BTreeMap<String, String>,
    /// 0 is most urgent.
    pub priority: u8,
    /// Not claimable by the queue before this time.
    pub available_at: u64,
    /// At most one non-terminal dispatch per (thread, key).
    pub dedupe_key: Option<String>,
    /// Failed attempts after which it dead-letters.
    pub max_attempts: u32,
    /// Failed attempts so far.
    pub attempt: u32,
    /// Claims so far.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub claims: u32,
    /// Resumes so far.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resumes: u32,
    /// The key its runs are limited by (flow control), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// The thread's epoch when it was enqueued.
    pub epoch: u64,
    /// Lifecycle state.
    pub status: Status,
    /// Who holds the claim, while claimed.
    pub claimed_by: Option<String>,
    /// The claim's lease deadline, while claimed.
    pub lease_until: Option<u64>,
    /// When the current holder recorded the start of its run.
    pub started_at: Option<u64>,
    /// What the run produced, once recorded: its status, output size and error.
    pub result: Option<RowResult>,
    /// The last failure or terminal reason.
    pub last_error: Option<String>,
    /// When the dispatch was enqueued.
    pub created_at: u64,
    /// When the dispatch last changed.
    pub updated_at: u64,
    /// When the dispatch reached a terminal state.
    pub completed_at: Option<u64>,
}

/// A recorded run as a list shows it: the output by its size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowResult {
    /// Whether the run succeeded.
    pub status: RunStatus,
    /// The output's size in bytes.
    pub output_size: u64,
    /// The error text of a failed run.
    pub error: Option<String>,
}

impl DispatchRow {
    /// The row of a whole record (a backend that read the record anyway).
    pub fn of(d: &Dispatch) -> DispatchRow {
        DispatchRow {
            id: d.id.clone(),
            agent: d.agent.clone(),
            thread: d.thread.clone(),
            run_id: d.run_id.clone(),
            payload_size: d.payload.len() as u64,
            metadata: d.metadata.clone(),
            priority: d.priority,
            available_at: d.available_at,
            dedupe_key: d.dedupe_key.clone(),
            max_attempts: d.max_attempts,
            attempt: d.attempt,
            claims: d.claims,
            resumes: d.resumes,
            concurrency_key: d.concurrency_key.clone(),
            epoch: d.epoch,
            status: d.status,
            claimed_by: d.claim.as_ref().map(|c| c.claimed_by.clone()),
            lease_until: d.claim.as_ref().map(|c| c.lease_until),
            started_at: d.started_at,
            result: d.result.as_ref().map(|r| RowResult {
                status: r.status,
                output_size: r.output.len() as u64,
                error: r.error.clone(),
            }),
            last_error: d.last_error.clone(),
            created_at: d.created_at,
            updated_at: d.updated_at,
            completed_at: d.completed_at,
        }
    }

    /// The list cursor of this row.
    pub fn cursor(&self) -> ListCursor {
        ListCursor {
            priority: self.priority,
            created_at: self.created_at,
            id: self.id.clone(),
        }
    }
}

/// What a producer submits: a dispatch before the store stamps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDispatch {
    /// The id to use; the store mints a UUID v7 when `None`.
    pub id: Option<String>,
    /// The plugin the dispatch is routed to.
    pub agent: String,
    /// The serialization key.
    pub thread: String,
    /// The run this dispatch activates; defaults to the id.
    pub run_id: Option<String>,
    /// Opaque input for the agent.
    pub payload: Vec<u8>,
    /// A small string map.
    pub metadata: BTreeMap<String, String>,
    /// 0 is most urgent; default 128.
    pub priority: u8,
    /// Delay before the queue may hand it out, in milliseconds from enqueue.
    pub delay_ms: u64,
    /// At most one non-terminal dispatch per (thread, key).
    pub dedupe_key: Option<String>,
    /// Failed attempts after which it dead-letters; default 5.
    pub max_attempts: u32,
    /// Failed attempts already used (for re-submissions); must stay below `max_attempts`.
    pub attempt: u32,
    /// The key its runs are limited by (flow control), at most [`MAX_CONCURRENCY_KEY`] bytes.
    pub concurrency_key: Option<String>,
    /// Join the open window of (thread, key) instead of adding work, or open one.
    pub debounce: Option<Debounce>,
}

impl NewDispatch {
    /// A dispatch for `agent` on `thread` with default priority, attempts and no delay.
    pub fn new(
        agent: impl Into<String>,
        thread: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Self {
        NewDispatch {
            id: None,
            agent: agent.into(),
            thread: thread.into(),
            run_id: None,
            payload: payload.into(),
            metadata: BTreeMap::new(),
            priority: DEFAULT_PRIORITY,
            delay_ms: 0,
            dedupe_key: None,
            concurrency_key: None,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            attempt: 0,
            debounce: None,
        }
    }

    /// Debounces it: it joins the open window of (thread, `debounce.key`), or opens one.
    pub fn with_debounce(mut self, debounce: Debounce) -> Self {
        self.debounce = Some(debounce);
        self
    }

    /// Sets the id.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Sets the priority (0 most urgent).
    pub fn with_priority(mut self, priority: u8) -> Self {
        self.priority = priority;
        self
    }

    /// Delays the first claim by `delay_ms` milliseconds.
    pub fn with_delay_ms(mut self, delay_ms: u64) -> Self {
        self.delay_ms = delay_ms;
        self
    }

    /// Sets the dedupe key.
    pub fn with_dedupe_key(mut self, key: impl Into<String>) -> Self {
        self.dedupe_key = Some(key.into());
        self
    }

    /// Sets the concurrency key.
    pub fn with_concurrency_key(mut self, key: impl Into<String>) -> Self {
        self.concurrency_key = Some(key.into());
        self
    }

    /// Sets the attempt limit.
    pub fn with_max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// Sets the run id.
    pub fn with_run_id(mut self, run_id: impl Into<String>) -> Self {
        self.run_id = Some(run_id.into());
        self
    }

    /// Adds one metadata entry.
    pub fn with_metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// Checks what enqueue requires of a submission (the contract, docs/contract.md, section 2).
    ///
    /// # Errors
    ///
    /// A description naming the offending field.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(id) = &self.id {
            check_name("id", id)?;
        }
        check_name("agent", &self.agent)?;
        check_name("thread", &self.thread)?;
        if let Some(run) = &self.run_id {
            check_name("run_id", run)?;
        }
        if let Some(key) = &self.dedupe_key {
            if key.is_empty() {
                return Err("dedupe_key is empty".into());
            }
            check_text("dedupe_key", key)?;
        }
        if let Some(key) = &self.concurrency_key {
            check_concurrency_key(key)?;
        }
        check_metadata(&self.metadata, MAX_METADATA)?;
        if let Some(debounce) = &self.debounce {
            debounce.validate()?;
            if self.dedupe_key.is_some() {
                return Err(
                    "debounce: a debounced enqueue takes no dedupe_key (its window \
                     already admits one open dispatch per key)"
                        .into(),
                );
            }
            if self.delay_ms > 0 {
                return Err(
                    "debounce: a debounced enqueue takes no delay (its window's quiet \
                     and max_wait say when it is due)"
                        .into(),
                );
            }
        }
        if self.max_attempts == 0 {
            return Err("max_attempts must be at least 1".into());
        }
        if self.attempt >= self.max_attempts {
            return Err(format!(
                "attempt {} must be below max_attempts {}",
                self.attempt, self.max_attempts
            ));
        }
        Ok(())
    }
}

/// Checks a small string map (a dispatch's or a message's metadata): keys are names, keys
/// and values together at most `max` bytes.
///
/// # Errors
///
/// A sentence starting with `metadata`.
pub fn check_metadata(metadata: &BTreeMap<String, String>, max: usize) -> Result<(), String> {
    let mut total = 0usize;
    for (key, value) in metadata {
        check_name("metadata", key)?;
        total = total.saturating_add(key.len() + value.len());
    }
    if total > max {
        return Err(format!(
            "metadata: its keys and values take {total} bytes; at most {max} are kept"
        ));
    }
    Ok(())
}

/// Ids, agent and thread names, run ids, dedupe keys and metadata keys are bounded so keys
/// stay small on every backend.
pub const MAX_NAME_LEN: usize = 256;

/// The most bytes of a concurrency key: it names a slot record on every backend.
pub const MAX_CONCURRENCY_KEY: usize = 128;

/// Checks a concurrency key: not blank, printable, at most [`MAX_CONCURRENCY_KEY`] bytes.
///
/// # Errors
///
/// A sentence naming `concurrency_key` and the limit it broke.
pub fn check_concurrency_key(key: &str) -> Result<(), String> {
    if key.len() > MAX_CONCURRENCY_KEY {
        return Err(format!(
            "concurrency_key is {} bytes, over the store's limit of {MAX_CONCURRENCY_KEY} bytes",
            key.len()
        ));
    }
    check_name("concurrency_key", key)
}

/// The most bytes a dispatch's metadata takes, its keys and values together: metadata is "a
/// small string map", shown in every list of dispatches.
pub const MAX_METADATA: usize = 64 * 1024;

/// Checks a name a producer chose (an id, agent, thread, run id or metadata key), as every
/// entry point does before it is stored or looked up: not blank, at most [`MAX_NAME_LEN`]
/// bytes, and printable ([`check_text`]).
///
/// # Errors
///
/// A sentence that starts with `field` and says what is wrong (never the value itself, which
/// may not be printable).
pub fn check_name(field: &str, value: &str) -> Result<(), String> {
    if value.trim().is_empty() {
        return Err(format!("{field} is blank"));
    }
    check_text(field, value)
}

/// Checks that `value` is at most [`MAX_NAME_LEN`] bytes and printable: no control character
/// (C0, DEL, C1: a newline would forge a log line, an ESC drive a terminal), no line or
/// paragraph separator, and no invisible formatting character (bidirectional overrides,
/// zero-width characters, the byte order mark) that would make it show as another name.
///
/// # Errors
///
/// As [`check_name`].
pub fn check_text(field: &str, value: &str) -> Result<(), String> {
    if value.len() > MAX_NAME_LEN {
        return Err(format!("{field} is longer than {MAX_NAME_LEN} bytes"));
    }
    if let Some((at, c)) = value.char_indices().find(|(_, c)| !printable(*c)) {
        return Err(format!(
            "{field} holds the non-printable character U+{:04X} at byte {at}; names must be printable",
            u32::from(c)
        ));
    }
    Ok(())
}

/// Whether `c` may appear in a name: not a control character (general category Cc), a line
/// or paragraph separator (Zl, Zp), or one of the invisible format characters (Cf) that
/// change how text around them shows.
pub(crate) fn printable(c: char) -> bool {
    !(c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{061C}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFB}'
                | '\u{E0000}'..='\u{E007F}'
        ))
}

/// What `interrupt(thread)` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interrupt {
    /// The thread's epoch after the interrupt.
    pub epoch: u64,
    /// The dispatch claimed on the thread when the interrupt ran (still claimed: the host
    /// must stop its guest; its next holder write is fenced).
    pub active: Option<Dispatch>,
    /// The ids of the queued dispatches this interrupt superseded.
    pub superseded: Vec<String>,
}

/// Which dispatches `list` returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    /// Only this thread.
    pub thread: Option<String>,
    /// Only this agent.
    pub agent: Option<String>,
    /// Only these statuses (all when empty).
    pub statuses: Vec<Status>,
    /// Page size (0 means the backend's default of 100).
    pub limit: usize,
    /// Start after this row: the cursor of the previous page's last row.
    pub after: Option<ListCursor>,
}

/// Where a page of `list` ended: the order key (priority, then `created_at`, then id) of its
/// last row. The next page starts after it, so rows that come and go between pages neither
/// shift nor repeat the rest. Shown as `priority:created_at:id`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ListCursor {
    /// The row's priority.
    pub priority: u8,
    /// Its creation time.
    pub created_at: u64,
    /// Its id.
    pub id: String,
}

impl ListCursor {
    /// The cursor of a row.
    pub fn of(d: &Dispatch) -> ListCursor {
        ListCursor {
            priority: d.priority,
            created_at: d.created_at,
            id: d.id.clone(),
        }
    }
}

impl fmt::Display for ListCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.priority, self.created_at, self.id)
    }
}

impl FromStr for ListCursor {
    type Err = String;

    fn from_str(s: &str) -> Result<ListCursor, String> {
        let bad = || format!("`{s}` is not a list cursor (priority:created_at:id)");
        let mut parts = s.splitn(3, ':');
        let priority = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let created_at = parts.next().and_then(|c| c.parse().ok()).ok_or_else(bad)?;
        let id = parts.next().filter(|id| !id.is_empty()).ok_or_else(bad)?;
        Ok(ListCursor {
            priority,
            created_at,
            id: id.to_owned(),
        })
    }
}

/// One row of `counts`: how many dispatches an agent has in a status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusCount {
    /// The agent.
    pub agent: String,
    /// The status.
    pub status: Status,
    /// How many.
    pub count: u64,
}

/// The fence a guest's holder writes carry: which claim, at which epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The claimed dispatch.
    pub dispatch: String,
    /// Its claim token.
    pub token: String,
    /// The dispatch's epoch.
    pub epoch: u64,
}

impl Fence {
    /// The fence of a claimed dispatch, or `None` when it is not claimed.
    pub fn of(dispatch: &Dispatch) -> Option<Fence> {
        dispatch.claim.as_ref().map(|claim| Fence {
            dispatch: dispatch.id.clone(),
            token: claim.token.clone(),
            epoch: dispatch.epoch,
        })
    }
}

/// One entry of a thread log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    /// Its sequence number (unique per thread, increasing, never reused).
    pub seq: u64,
    /// The opaque bytes appended.
    #[serde(with = "bytes_as_text")]
    pub data: Vec<u8>,
    /// When it was appended.
    pub appended_at: u64,
    /// Set when the entry records an acknowledged inbox message (its payload is `data`).
    #[serde(default, rename = "message", skip_serializing_if = "Option::is_none")]
    pub note: Option<MessageNote>,
    /// Set when the store wrote the entry to mark where a turn ended (its `data` is empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<TurnMark>,
}

/// What ended a turn, as a log entry the store appends records it (the contract, section 9.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnEvent {
    /// A message sent under the `interrupt` policy stopped the run that held the thread.
    Interrupted,
    /// A message sent under the `rollback` policy stopped the run that held the thread and
    /// masked what its runs wrote to the log ([`TurnMark::masked`]).
    RolledBack,
    /// A message sent under the `merge` policy stopped it, masked what its runs wrote and
    /// returned the messages it had acknowledged to pending.
    Merged,
}

impl TurnEvent {
    /// Its stable name (storage, JSON, the CLI).
    pub fn as_str(self) -> &'static str {
        match self {
            TurnEvent::Interrupted => "interrupted",
            TurnEvent::RolledBack => "rolled_back",
            TurnEvent::Merged => "merged",
        }
    }
}

/// A turn's end, recorded in the thread log: the entries before it were written by the run it
/// names, and what that run left unfinished (a model's tool calls without results) never
/// gets an answer from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnMark {
    /// What ended it.
    pub event: TurnEvent,
    /// The dispatch whose run it ended.
    pub dispatch: String,
    /// The inbox sequence of the message that ended it.
    pub message: u64,
    /// The entries a rollback masked: every entry after the one that was the log's latest
    /// when the stopped dispatch was first claimed ([`Dispatch::log_from`]), up to this mark.
    /// They stay stored (the log is append-only); readers hide them unless asked for all.
    /// `None` for an interrupt, and for a rollback whose run wrote nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub masked: Option<LogRange>,
}

/// An inclusive range of a thread log's sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogRange {
    /// The first sequence in it.
    pub first: u64,
    /// The last sequence in it.
    pub last: u64,
}

impl LogRange {
    /// Whether `seq` is in it.
    pub fn contains(&self, seq: u64) -> bool {
        (self.first..=self.last).contains(&seq)
    }
}

/// The entries of `entries` a reader shows by default: all but those a rollback's mark among
/// them masked. A mark masks entries before it, so a read that stops before a mark shows what
/// it later masks; a read to the log's end sees every mark.
pub fn unmasked(entries: Vec<LogEntry>) -> Vec<LogEntry> {
    let masks: Vec<LogRange> = entries
        .iter()
        .filter_map(|e| e.turn.as_ref().and_then(|t| t.masked))
        .collect();
    if masks.is_empty() {
        return entries;
    }
    entries
        .into_iter()
        .filter(|e| !masks.iter().any(|m| m.contains(e.seq)))
        .collect()
}

/// The note a stored log entry carries, as the backends keep it (one JSON text): the message it
/// records, or the turn it marks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EntryNote {
    /// A turn's end (`{"turn": {...}}`).
    Turn {
        /// The mark.
        turn: TurnMark,
    },
    /// An acknowledged message (the note's fields at the top level, as first stored).
    Message(MessageNote),
}

impl EntryNote {
    /// Puts the note on `entry`.
    pub fn set_on(self, entry: &mut LogEntry) {
        match self {
            EntryNote::Turn { turn } => entry.turn = Some(turn),
            EntryNote::Message(note) => entry.note = Some(note),
        }
    }
}

/// The watermarks of a thread log (the contract, docs/contract.md, section 4): `reserved >= latest >= trimmed`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watermarks {
    /// The highest sequence handed to any writer.
    pub reserved: u64,
    /// The highest visible sequence.
    pub latest: u64,
    /// Entries at or below this were trimmed or deleted.
    pub trimmed: u64,
}

/// Bytes in JSON: a UTF-8 string when they are valid text, else `{"base64": ...}` (standard
/// alphabet, padded). `{"hex": ...}`, what earlier versions wrote, is still read.
pub(crate) mod bytes_as_text {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Text(String),
        Base64 { base64: String },
        Hex { hex: String },
    }

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(bytes) {
            Ok(text) => Repr::Text(text.to_owned()).serialize(serializer),
            Err(_) => Repr::Base64 {
                base64: STANDARD.encode(bytes),
            }
            .serialize(serializer),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        match Repr::deserialize(deserializer)? {
            Repr::Text(text) => Ok(text.into_bytes()),
            Repr::Base64 { base64 } => STANDARD
                .decode(base64.as_bytes())
                .map_err(|e| D::Error::custom(format!("invalid base64: {e}"))),
            Repr::Hex { hex } => {
                if hex.len() % 2 != 0 {
                    return Err(D::Error::custom("odd-length hex"));
                }
                (0..hex.len())
                    .step_by(2)
                    .map(|i| {
                        hex.get(i..i + 2)
                            .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                            .ok_or_else(|| D::Error::custom("invalid hex"))
                    })
                    .collect()
            }
        }
    }
}

/// Whether a counter is zero (counters are left out of serialized records while they are).
fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// How many version entries a dispatch keeps: the oldest go first. A run moved from version to
/// version more often than this still has its pin (the last entry).
pub const MAX_VERSION_RUNS: usize = 16;

/// The version of its plugin one claim of a dispatch ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionRun {
    /// The claim that ran it (the dispatch's `claims` once it was taken).
    pub claim: u32,
    /// The component's content hash, short form.
    pub version: String,
    /// The plugin's `version` label at the time, when it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// What a message asks of its thread (section 9.3 of the contract).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageKind {
    /// For the run that is live now; waits for the thread's next run when none is.
    Steer,
    /// Asks for a next turn: starts a follow-up dispatch at once when the thread is idle.
    FollowUp,
}

impl MessageKind {
    /// The stable name used in storage, the CLI and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageKind::Steer => "steer",
            MessageKind::FollowUp => "follow_up",
        }
    }
}

impl fmt::Display for MessageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for MessageKind {
    type Err = String;

    /// `steer`, `follow_up` or `follow-up`.
    fn from_str(s: &str) -> Result<MessageKind, String> {
        match s {
            "steer" => Ok(MessageKind::Steer),
            "follow_up" | "follow-up" => Ok(MessageKind::FollowUp),
            other => Err(format!(
                "unknown message kind `{}` (expected steer or follow-up)",
                other.escape_debug()
            )),
        }
    }
}

/// What a log entry that records an acknowledged message says of it (its payload is the
/// entry's data).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageNote {
    /// The message's inbox sequence.
    pub seq: u64,
    /// Its kind.
    pub kind: MessageKind,
    /// The sender's metadata.
    pub metadata: BTreeMap<String, String>,
    /// When it was sent.
    pub sent_at: u64,
    /// Who sent it.
    pub sent_by: String,
}

/// The longest timeout a waitpoint may have: 30 days.
pub const MAX_WAITPOINT_TIMEOUT_MS: u64 = 30 * 24 * 3600 * 1000;
/// The most bytes a waitpoint's metadata takes, keys and values together.
pub const MAX_WAITPOINT_METADATA: usize = 16 * 1024;

/// Where a waitpoint is in its life. It leaves `pending` once and never changes again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitpointState {
    /// Waiting for a completion, a cancellation or its timeout.
    Pending,
    /// Completed through the API, the CLI or the dashboard.
    Completed,
    /// Its timeout passed first.
    TimedOut,
    /// Cancelled by an operator, an interrupt, or because its dispatch ended.
    Cancelled,
}

impl WaitpointState {
    /// Every state.
    pub const ALL: [WaitpointState; 4] = [
        WaitpointState::Pending,
        WaitpointState::Completed,
        WaitpointState::TimedOut,
        WaitpointState::Cancelled,
    ];

    /// The stable name used in storage, the CLI and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitpointState::Pending => "pending",
            WaitpointState::Completed => "completed",
            WaitpointState::TimedOut => "timed_out",
            WaitpointState::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for WaitpointState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for WaitpointState {
    type Err = String;

    /// The stored names; `timed-out` is accepted too.
    fn from_str(s: &str) -> Result<WaitpointState, String> {
        WaitpointState::ALL
            .into_iter()
            .find(|state| state.as_str() == s || (s == "timed-out" && *state == WaitpointState::TimedOut))
            .ok_or_else(|| {
                format!(
                    "unknown waitpoint state `{}` (expected pending, completed, timed_out or cancelled)",
                    s.escape_debug()
                )
            })
    }
}

/// A stored waitpoint (section 10.1 of the contract).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waitpoint {
    /// A UUID v7 minted by the store.
    pub id: String,
    /// The dispatch whose run created it.
    pub dispatch: String,
    /// That dispatch's thread.
    pub thread: String,
    /// That dispatch's agent.
    pub agent: String,
    /// Unique per dispatch.
    pub name: String,
    /// Where it is in its life.
    pub state: WaitpointState,
    /// The hex SHA-256 digests of the tokens that complete it (never the tokens).
    pub token_digests: Vec<String>,
    /// The guest's annotations, shown to operators.
    pub metadata: BTreeMap<String, String>,
    /// When it times out unless something settles it first.
    pub timeout_at: u64,
    /// What a completion sent.
    #[serde(
        default,
        with = "optional_bytes",
        skip_serializing_if = "Option::is_none"
    )]
    pub result: Option<Vec<u8>>,
    /// What made it leave `pending`: `token`, `operator:<name>`, `cli`, `timeout`,
    /// `interrupt`, `dispatch-ended`.
    pub settled_by: Option<String>,
    /// When it was created.
    pub created_at: u64,
    /// When it left `pending`.
    pub settled_at: Option<u64>,
    /// The claim number of the run that created it.
    pub created_claim: u32,
}

/// What a page of waitpoints holds of one besides its result and metadata (its ids, names,
/// state and times), as [`Waitpoint::held`] counts it.
pub const WAITPOINT_ROOM: usize = 512;

/// The bytes a page holds of a waitpoint whose result, metadata (keys and values) and name
/// take `result`, `metadata` and `name` bytes ([`Waitpoint::held`]).
pub fn held_size(result: usize, metadata: usize, name: usize) -> usize {
    result
        .saturating_add(metadata)
        .saturating_add(name)
        .saturating_add(WAITPOINT_ROOM)
}

impl Waitpoint {
    /// The bytes a page of waitpoints holds of it (what `Waitpoints::read_waitpoints`
    /// bounds): its result, its metadata's keys and values, its name and [`WAITPOINT_ROOM`].
    pub fn held(&self) -> usize {
        let metadata = self.metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
        held_size(
            self.result.as_ref().map_or(0, Vec::len),
            metadata,
            self.name.len(),
        )
    }

    /// Whether it is still pending.
    pub fn is_pending(&self) -> bool {
        self.state == WaitpointState::Pending
    }

    /// The record as a reader may see it: without token digests.
    pub fn public(mut self) -> Waitpoint {
        self.token_digests.clear();
        self
    }
}

/// `Option<Vec<u8>>` as [`bytes_as_text`] writes bytes.
mod optional_bytes {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    struct Bytes(#[serde(with = "super::bytes_as_text")] Vec<u8>);

    pub fn serialize<S: Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        bytes.as_ref().map(|b| Bytes(b.clone())).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        Ok(Option::<Bytes>::deserialize(d)?.map(|b| b.0))
    }
}

/// What a run asks for when it creates a waitpoint (W1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewWaitpoint {
    /// Unique per dispatch: a second create with this name returns the first.
    pub name: String,
    /// From now; 1 ms to [`MAX_WAITPOINT_TIMEOUT_MS`].
    pub timeout_ms: u64,
    /// Shown to operators.
    pub metadata: BTreeMap<String, String>,
    /// The digest of the token the host minted for it (`waitpoints::token_digest`).
    pub token_digest: String,
}

impl NewWaitpoint {
    /// Checks the name, timeout and metadata (section 7 of the contract).
    ///
    /// # Errors
    ///
    /// The message naming the field (a store turns it into `Invalid`).
    pub fn validate(&self) -> Result<(), String> {
        check_name("waitpoint name", &self.name)?;
        if self.timeout_ms == 0 || self.timeout_ms > MAX_WAITPOINT_TIMEOUT_MS {
            return Err(format!(
                "waitpoint timeout: {} ms is outside 1 ms to 30 days",
                self.timeout_ms
            ));
        }
        check_metadata(&self.metadata, MAX_WAITPOINT_METADATA)?;
        if self.token_digest.len() != 64
            || !self.token_digest.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err("waitpoint token digest: not a hex SHA-256".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_must_be_printable_and_bounded() {
        for good in [
            "t",
            "user 42",
            "a/b",
            "caf\u{e9}",
            "\u{4f60}\u{597d}",
            "emoji \u{1f600}",
        ] {
            assert_eq!(check_name("thread", good), Ok(()), "{good:?}");
        }
        for bad in [
            "",
            "  ",
            "a\nb",
            "a\rb",
            "a\tb",
            "\u{1b}[2J",
            "\u{0}",
            "\u{7f}",
            "\u{85}",
            "\u{9b}31m",
            "\u{2028}",
            "\u{202e}txt",
            "\u{200b}",
            "\u{2066}x",
            "\u{feff}x",
            "\u{e0041}",
        ] {
            let e = check_name("thread", bad).unwrap_err();
            assert!(e.starts_with("thread "), "{bad:?}: {e}");
            assert!(!e.chars().any(|c| c.is_control()), "{e}");
        }
        assert!(check_name("id", &"x".repeat(MAX_NAME_LEN)).is_ok());
        assert!(check_name("id", &"x".repeat(MAX_NAME_LEN + 1)).is_err());
        let new = NewDispatch::new("a", "t", "").with_metadata("k", "v".repeat(MAX_METADATA));
        assert!(new.validate().unwrap_err().starts_with("metadata:"));
        let new = NewDispatch::new("a", "t", "").with_dedupe_key("k\u{1b}");
        assert!(new.validate().unwrap_err().starts_with("dedupe_key "));
    }

    #[test]
    fn binary_bytes_are_base64_in_json_and_hex_is_still_read() {
        let result = RunResult::success(vec![0xff, 0x00, 0x41]);
        let json = serde_json::to_string(&result).unwrap_or_default();
        assert!(json.contains(r#""output":{"base64":"/wBB"}"#), "{json}");
        let back: Option<RunResult> = serde_json::from_str(&json).ok();
        assert_eq!(back, Some(result.clone()));
        let legacy = r#"{"status":"succeeded","output":{"hex":"ff0041"},"error":null}"#;
        assert_eq!(serde_json::from_str::<RunResult>(legacy).ok(), Some(result));
        let text: Option<RunResult> =
            serde_json::from_str(r#"{"status":"succeeded","output":"hi","error":null}"#).ok();
        assert_eq!(text.map(|r| r.output), Some(b"hi".to_vec()));
        assert!(
            serde_json::from_str::<RunResult>(
                r#"{"status":"succeeded","output":{"base64":"@@"},"error":null}"#
            )
            .is_err()
        );
    }
}
