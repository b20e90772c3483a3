//! The journal of a dispatch (the contract, docs/contract.md, section 11): what its runs got
//! from the world, kept so a later run of the same dispatch (a retry, a resume) is answered
//! from it instead of asking again.
//!
//! Two kinds of record:
//!
//! - a **call entry** is the `pos`-th journaled call of a run (an outbound HTTP exchange, a
//!   thread-log read or append, an enqueue): what identifies the call (a digest), and what it
//!   answered. The host replays a run against these in order (`runtime::journal`).
//! - a **step** is a value a guest stored under a key of its own (`step-put`), found by key.
//!
//! Every write is a holder write, fenced like a thread-log append (a lost lease or an
//! interrupted thread refuses it and stores nothing). Entries are kept across the dispatch's
//! attempts and resumes and removed with the dispatch. A log append recorded in the journal is
//! written in the same atomic step as its entry ([`Journal::record_append`]), so a replay
//! never makes it twice.

use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::model::Fence;
use super::{StoreError, StoreResult};

/// The longest step key (bytes).
pub const MAX_STEP_KEY: usize = 256;

/// The start of the step keys the host keeps for itself (a brokered MCP call's record): a
/// guest's step key starting with it is refused.
pub const HOST_STEP_PREFIX: &str = "homing/";

/// What a call entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CallKind {
    /// An outbound `wasi:http` exchange.
    Http,
    /// A thread-log read (`read-log`).
    LogRead,
    /// The thread log's watermark (`latest`).
    LogLatest,
    /// A thread-log append (`append`).
    LogAppend,
    /// A conditional thread-log append (`append-expected`).
    LogAppendExpected,
    /// A follow-up enqueued through the claim.
    Enqueue,
    /// A tool call the host brokered to an MCP server (`mcp-call`): first an intent (sent, no
    /// answer yet), then what it answered, at the same position.
    Mcp,
}

impl CallKind {
    /// Every kind, in a fixed order.
    pub const ALL: [CallKind; 7] = [
        CallKind::Http,
        CallKind::LogRead,
        CallKind::LogLatest,
        CallKind::LogAppend,
        CallKind::LogAppendExpected,
        CallKind::Enqueue,
        CallKind::Mcp,
    ];

    /// The kind's name, as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            CallKind::Http => "http",
            CallKind::LogRead => "log-read",
            CallKind::LogLatest => "log-latest",
            CallKind::LogAppend => "log-append",
            CallKind::LogAppendExpected => "log-append-expected",
            CallKind::Enqueue => "enqueue",
            CallKind::Mcp => "mcp",
        }
    }

    /// Whether entries of this kind are written with their effect
    /// ([`Journal::record_append`]).
    pub fn is_append(self) -> bool {
        matches!(self, CallKind::LogAppend | CallKind::LogAppendExpected)
    }
}

impl fmt::Display for CallKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CallKind {
    type Err = String;

    fn from_str(s: &str) -> Result<CallKind, String> {
        CallKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown journal entry kind `{s}`"))
    }
}

/// The wall-clock and random values a run read between two journaled calls, in the order it
/// read them: they ride on the entry of the call that follows them, so a replay gives the run
/// the same values at the same points.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cheap {
    /// Wall-clock reads (ns since the Unix epoch).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clock: Vec<u64>,
    /// The bytes drawn from `wasi:random/random`, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "bytes_b64")]
    pub random: Vec<u8>,
    /// The bytes drawn from `wasi:random/insecure`, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "bytes_b64")]
    pub insecure: Vec<u8>,
}

impl Cheap {
    /// Whether nothing was read.
    pub fn is_empty(&self) -> bool {
        self.clock.is_empty() && self.random.is_empty() && self.insecure.is_empty()
    }

    /// The bytes it takes.
    pub fn len(&self) -> usize {
        self.clock.len() * 8 + self.random.len() + self.insecure.len()
    }
}

/// One journaled call of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallEntry {
    /// The dispatch whose runs made it.
    pub dispatch: String,
    /// Its position: the `pos`-th journaled call of a run, from 0.
    pub pos: u32,
    /// What kind of call.
    pub kind: CallKind,
    /// The SHA-256 (hex) of what identifies the call ([`identity`]): a later run's call is
    /// answered from this entry only when its own identity is the same.
    pub identity: String,
    /// What the call returned (JSON, by kind): for `http` the status, the response headers
    /// (less `set-cookie`) and the URL shown without query values; for a log read the range
    /// it returned; for an append its sequence (set by the store); for an enqueue the new id.
    pub answer: serde_json::Value,
    /// The wall-clock and random values the run read after the previous call started and
    /// before this one did.
    #[serde(default, skip_serializing_if = "Cheap::is_empty")]
    pub cheap: Cheap,
    /// The response body of an `http` entry (`None` when it was too large to keep: a replay
    /// then makes the call live).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_bytes")]
    pub body: Option<Vec<u8>>,
    /// The claim number (the dispatch's `claims` when it ran) that recorded it.
    pub claim: u32,
    /// The attempt that recorded it.
    pub attempt: u32,
    /// When it was recorded (store time, ms).
    pub recorded_at: u64,
    /// How long the call took live (µs).
    pub duration_us: u64,
    /// Its stored size (bytes): the answer's JSON, the body and the identity.
    pub size: u64,
}

impl CallEntry {
    /// A new entry of `kind` at `pos`, its size computed; `recorded_at` is set by the store.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        dispatch: &str,
        pos: u32,
        kind: CallKind,
        identity: String,
        answer: serde_json::Value,
        body: Option<Vec<u8>>,
        claim: u32,
        attempt: u32,
        duration_us: u64,
    ) -> CallEntry {
        let mut entry = CallEntry {
            dispatch: dispatch.to_owned(),
            pos,
            kind,
            identity,
            answer,
            cheap: Cheap::default(),
            body,
            claim,
            attempt,
            recorded_at: 0,
            duration_us,
            size: 0,
        };
        entry.size = entry.measure();
        entry
    }

    /// The size this entry takes ([`CallEntry::size`]).
    pub fn measure(&self) -> u64 {
        let answer = serde_json::to_string(&self.answer).map_or(0, |s| s.len());
        (answer + self.body.as_ref().map_or(0, Vec::len) + self.identity.len() + self.cheap.len())
            as u64
    }

    /// The entry with the cheap values read before its call, its size measured again.
    pub fn with_cheap(mut self, cheap: Cheap) -> CallEntry {
        self.cheap = cheap;
        self.size = self.measure();
        self
    }

    /// The entry as a listing shows it: without its body (its size stays).
    pub fn without_body(mut self) -> CallEntry {
        self.body = None;
        self
    }
}

/// A value a guest stored under a key of its own (`step-put`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// The dispatch.
    pub dispatch: String,
    /// The guest's key.
    pub key: String,
    /// The value.
    #[serde(with = "bytes_b64")]
    pub value: Vec<u8>,
    /// The claim number that stored it.
    pub claim: u32,
    /// The attempt that stored it.
    pub attempt: u32,
    /// When (store time, ms).
    pub recorded_at: u64,
    /// Its size: key and value.
    pub size: u64,
}

/// What a store holds of one dispatch's journal.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JournalData {
    /// The valid call entries, by position (ascending; there may be gaps).
    pub calls: Vec<CallEntry>,
    /// The steps, by key (ascending).
    pub steps: Vec<Step>,
}

impl JournalData {
    /// The bytes the journal holds (what `journal_max_bytes` bounds).
    pub fn bytes(&self) -> u64 {
        self.calls.iter().map(|c| c.size).sum::<u64>()
            + self.steps.iter().map(|s| s.size).sum::<u64>()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty() && self.steps.is_empty()
    }
}

/// What a listing holds of an entry besides its answer and identity (its numbers, kind and
/// dispatch), as [`CallSummary::held`] counts it.
pub const SUMMARY_ROOM: usize = 256;

/// A call entry as a listing reads it: without its body and its cheap values, with the body's
/// size.
#[derive(Debug, Clone, PartialEq)]
pub struct CallSummary {
    /// The entry: its `body` is `None` and its `cheap` empty (its `size` stays).
    pub entry: CallEntry,
    /// The size of the kept body; `None` when none was kept.
    pub body_size: Option<u64>,
}

impl CallSummary {
    /// The summary of `entry`: its body and cheap values dropped.
    pub fn of(mut entry: CallEntry) -> CallSummary {
        let body_size = entry.body.take().map(|b| b.len() as u64);
        entry.cheap = Cheap::default();
        CallSummary { entry, body_size }
    }

    /// The bytes a listing holds of it (what [`JournalAsk::max_bytes`] bounds): its answer's
    /// JSON, its identity and [`SUMMARY_ROOM`].
    pub fn held(&self) -> usize {
        serde_json::to_string(&self.entry.answer).map_or(0, |s| s.len())
            + self.entry.identity.len()
            + SUMMARY_ROOM
    }
}

/// The bytes a listing holds of a step without its value (what [`JournalAsk::max_step_bytes`]
/// bounds): its key and [`SUMMARY_ROOM`].
pub fn step_held(step: &Step) -> usize {
    step.key.len() + SUMMARY_ROOM
}

/// Which part of a journal [`Journal::journal_page`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalAsk {
    /// The call entries after this position (from the first without it).
    pub after: Option<u32>,
    /// At most this many call entries.
    pub limit: usize,
    /// At most this many bytes of call entries, as [`CallSummary::held`] counts them (the
    /// first entry is listed whatever its size).
    pub max_bytes: usize,
    /// At most this many bytes of steps, as [`step_held`] counts them (0: no steps are
    /// listed; else the first is listed whatever its size).
    pub max_step_bytes: usize,
}

/// A page of a journal as a listing shows it: no body and no step value is read into it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JournalPage {
    /// The call entries asked for, by position (ascending).
    pub calls: Vec<CallSummary>,
    /// Whether entries after the last one listed remain (left out for the page's bounds).
    pub more: bool,
    /// The steps by key (ascending), without their values, when asked for.
    pub steps: Vec<Step>,
    /// Whether steps past the last one listed remain (steps asked for).
    pub more_steps: bool,
    /// How many call entries the whole journal holds.
    pub call_count: u64,
    /// How many steps the whole journal holds.
    pub step_count: u64,
    /// The bytes the whole journal holds (what `journal_max_bytes` bounds), as
    /// [`JournalData::bytes`] counts them.
    pub bytes: u64,
}

/// A page of up to `ask.limit` call summaries and `ask.max_bytes` of them out of `calls`
/// (any order; those at or before `ask.after` left out), by position: what a backend that
/// reads whole records one at a time keeps. Offer each summary once with
/// [`CallPicker::offer`]; at most the page and one more summary are held at a time.
#[derive(Debug)]
pub struct CallPicker {
    ask: JournalAsk,
    kept: std::collections::BTreeMap<u32, (CallSummary, usize)>,
    held: usize,
    /// The lowest position left out for the page's bounds: nothing at or past it is kept.
    ceiling: Option<u32>,
}

impl CallPicker {
    /// A picker for `ask`.
    pub fn new(ask: JournalAsk) -> CallPicker {
        CallPicker {
            ask,
            kept: std::collections::BTreeMap::new(),
            held: 0,
            ceiling: None,
        }
    }

    /// Offers `call`.
    pub fn offer(&mut self, call: CallSummary) {
        let pos = call.entry.pos;
        if self.ask.after.is_some_and(|a| pos <= a) || self.ceiling.is_some_and(|c| pos >= c) {
            return;
        }
        let held = call.held();
        self.held += held;
        if let Some((_, (_, old))) = self.kept.remove_entry(&pos) {
            self.held -= old;
        }
        self.kept.insert(pos, (call, held));
        // Drop the highest positions while the page is over its bounds (never the first).
        while self.kept.len() > self.ask.limit.max(1)
            || (self.kept.len() > 1 && self.held > self.ask.max_bytes)
        {
            let Some((dropped, (_, size))) = self.kept.pop_last() else {
                break;
            };
            self.held -= size;
            self.ceiling = Some(self.ceiling.map_or(dropped, |c| c.min(dropped)));
        }
    }

    /// The page, and whether entries past it remain.
    pub fn finish(self) -> (Vec<CallSummary>, bool) {
        (
            self.kept.into_values().map(|(call, _)| call).collect(),
            self.ceiling.is_some(),
        )
    }
}

/// A new step: what `put_step` stores.
#[derive(Debug, Clone)]
pub struct NewStep {
    /// The guest's key: not blank, at most [`MAX_STEP_KEY`] bytes.
    pub key: String,
    /// The value.
    pub value: Vec<u8>,
    /// The claim number storing it.
    pub claim: u32,
    /// The attempt storing it.
    pub attempt: u32,
}

impl NewStep {
    /// Refuses a blank or over-long key (`Invalid`, naming `key`).
    pub fn validate(&self) -> StoreResult<()> {
        check_step_key(&self.key)
    }

    /// The stored record, recorded at `now`.
    pub fn record(self, dispatch: &str, now: u64) -> Step {
        Step {
            dispatch: dispatch.to_owned(),
            size: (self.key.len() + self.value.len()) as u64,
            key: self.key,
            value: self.value,
            claim: self.claim,
            attempt: self.attempt,
            recorded_at: now,
        }
    }
}

/// Refuses a blank step key or one over [`MAX_STEP_KEY`] bytes.
pub fn check_step_key(key: &str) -> StoreResult<()> {
    if key.trim().is_empty() {
        return Err(StoreError::Invalid(
            "key: a step key must not be blank".into(),
        ));
    }
    if key.len() > MAX_STEP_KEY {
        return Err(StoreError::Invalid(format!(
            "key: {} bytes is over the limit of {MAX_STEP_KEY} bytes for a step key",
            key.len()
        )));
    }
    Ok(())
}

/// Refuses an entry that is not the fenced dispatch's, or whose body is over `max_body` (`why`
/// says where that limit comes from): what every backend checks before a journal write.
pub(crate) fn check_entry(
    fence: &Fence,
    entry: &CallEntry,
    max_body: u64,
    why: &str,
) -> StoreResult<()> {
    if entry.dispatch != fence.dispatch {
        return Err(StoreError::Invalid(format!(
            "dispatch: the entry is for `{}`, the claim for `{}`",
            entry.dispatch, fence.dispatch
        )));
    }
    super::check_size(
        "body",
        entry.body.as_deref().unwrap_or_default(),
        max_body,
        why,
    )
}

/// The SHA-256 (hex) of `parts`, each length-prefixed so no two lists of parts collide.
pub fn identity<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// A dispatch's journal (the contract, docs/contract.md, section 11).
///
/// Every write is a holder write fenced as section 4.4 (and stores nothing when refused).
#[async_trait]
pub trait Journal: Send + Sync + fmt::Debug + 'static {
    /// The valid call entries of `dispatch` in position order, and its steps. Empty for a
    /// dispatch with no journal (or none stored).
    async fn load_journal(&self, dispatch: &str) -> StoreResult<JournalData>;

    /// A page of the journal of `dispatch` as a listing shows it ([`JournalAsk`]): call
    /// entries without bodies, steps without values, the whole journal's counts and bytes.
    /// It holds at most the page's bytes and what one record read at a time takes, whatever
    /// the journal holds: no body or step value is read where the backend can leave it
    /// unread (the embedded backend), else each is dropped as it is read (NATS, where a body
    /// shares its record's message). An empty page for a dispatch with no journal.
    async fn journal_page(&self, dispatch: &str, ask: &JournalAsk) -> StoreResult<JournalPage>;

    /// The call entry at `pos` of `dispatch` without its body ([`CallSummary`]), reading no
    /// more than that one record; `None` when there is none.
    async fn call_summary(&self, dispatch: &str, pos: u32) -> StoreResult<Option<CallSummary>> {
        Ok(self.call_entry(dispatch, pos).await?.map(CallSummary::of))
    }

    /// The call entry at `pos` of `dispatch`, with its body, reading no other record; `None`
    /// when there is none.
    async fn call_entry(&self, dispatch: &str, pos: u32) -> StoreResult<Option<CallEntry>>;

    /// Stores `entry` at its position, replacing what was there. `recorded_at` is the store's
    /// time. Entries of an append kind go through [`Journal::record_append`] instead
    /// (`Invalid` here).
    async fn record(&self, fence: &Fence, entry: CallEntry) -> StoreResult<()>;

    /// Appends `data` to the fenced dispatch's thread log (only when its `latest` is
    /// `expected`, if given: else `Conflict`) and stores `entry` with the new sequence as its
    /// answer (`{"seq": N}`), in one atomic step. Returns the sequence.
    async fn record_append(
        &self,
        fence: &Fence,
        entry: CallEntry,
        data: &[u8],
        expected: Option<u64>,
    ) -> StoreResult<u64>;

    /// Removes the call entries at positions `>= from` (a run diverged there).
    async fn drop_calls(&self, fence: &Fence, from: u32) -> StoreResult<()>;

    /// Stores `step`, replacing an earlier value under its key.
    async fn put_step(&self, fence: &Fence, step: NewStep) -> StoreResult<()>;

    /// The largest body an entry keeps: a larger one is recorded without it.
    fn max_body(&self) -> u64;
}

/// Optional bytes as base64 in JSON (API output, NATS records).
pub mod opt_bytes {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serializes.
    pub fn serialize<S: Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(b) => s.serialize_some(&base64::engine::general_purpose::STANDARD.encode(b)),
            None => s.serialize_none(),
        }
    }

    /// Deserializes.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        text.map(|t| {
            base64::engine::general_purpose::STANDARD
                .decode(t)
                .map_err(serde::de::Error::custom)
        })
        .transpose()
    }
}

/// Bytes as base64 in JSON.
pub mod bytes_b64 {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serializes.
    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    /// Deserializes.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn kinds_parse_their_names() {
        for kind in CallKind::ALL {
            assert_eq!(kind.as_str().parse::<CallKind>().unwrap(), kind);
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                serde_json::json!(kind.as_str())
            );
        }
        assert!("nope".parse::<CallKind>().is_err());
    }

    #[test]
    fn identities_keep_their_parts_apart() {
        let a = identity([&b"ab"[..], b"c"]);
        let b = identity([&b"a"[..], b"bc"]);
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
        assert_eq!(a, identity([&b"ab"[..], b"c"]));
    }

    #[test]
    fn step_keys_are_checked() {
        assert!(check_step_key("a").is_ok());
        assert!(check_step_key(" ").is_err());
        assert!(check_step_key(&"k".repeat(MAX_STEP_KEY + 1)).is_err());
        assert!(check_step_key(&"k".repeat(MAX_STEP_KEY)).is_ok());
    }

    #[test]
    fn a_picker_keeps_the_first_positions_that_fit_in_any_order() {
        let call = |pos: u32, answer: usize| {
            CallSummary::of(CallEntry::new(
                "d",
                pos,
                CallKind::Http,
                identity([&b"x"[..]]),
                serde_json::json!("a".repeat(answer)),
                Some(vec![0; 10]),
                1,
                0,
                5,
            ))
        };
        let one = call(0, 0).held();
        for order in [[0, 1, 2, 3, 4, 5], [5, 3, 1, 0, 4, 2], [2, 5, 4, 3, 1, 0]] {
            // By limit.
            let mut picker = CallPicker::new(JournalAsk {
                after: Some(0),
                limit: 3,
                max_bytes: usize::MAX,
                max_step_bytes: 0,
            });
            for pos in order {
                picker.offer(call(pos, 0));
            }
            let (calls, more) = picker.finish();
            let kept: Vec<u32> = calls.iter().map(|c| c.entry.pos).collect();
            assert_eq!((kept, more), (vec![1, 2, 3], true), "{order:?}");
            assert_eq!(calls[0].body_size, Some(10));
            // By bytes: two fit.
            let mut picker = CallPicker::new(JournalAsk {
                after: None,
                limit: 100,
                max_bytes: 2 * one + one / 2,
                max_step_bytes: 0,
            });
            for pos in order {
                picker.offer(call(pos, 0));
            }
            let (calls, more) = picker.finish();
            let kept: Vec<u32> = calls.iter().map(|c| c.entry.pos).collect();
            assert_eq!((kept, more), (vec![0, 1], true), "{order:?}");
            // The first whatever its size.
            let mut picker = CallPicker::new(JournalAsk {
                after: Some(3),
                limit: 100,
                max_bytes: 1,
                max_step_bytes: 0,
            });
            for pos in order {
                picker.offer(call(pos, 1000));
            }
            let (calls, more) = picker.finish();
            let kept: Vec<u32> = calls.iter().map(|c| c.entry.pos).collect();
            assert_eq!((kept, more), (vec![4], true), "{order:?}");
        }
    }

    #[test]
    fn entries_measure_what_they_store() {
        let e = CallEntry::new(
            "d",
            0,
            CallKind::Http,
            identity([&b"x"[..]]),
            serde_json::json!({"status": 200}),
            Some(vec![0; 10]),
            1,
            0,
            5,
        );
        assert_eq!(e.size, (r#"{"status":200}"#.len() + 10 + 64) as u64);
        let json = serde_json::to_string(&e).unwrap();
        let back: CallEntry = serde_json::from_str(&json).unwrap();
        assert_eq!(back, e);
        assert_eq!(e.without_body().body, None);
    }
}
