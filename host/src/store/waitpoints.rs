//! Waitpoints and the `waiting` status (the contract, docs/contract.md, section 10): a run
//! that must wait for a person or a webhook creates a waitpoint, a store record, and then
//! suspends; the dispatch holds no claim, no lease and no worker while it waits, and is
//! claimable again, as a resume that counts no attempt, once one of its waitpoints leaves
//! `pending`.
//!
//! The record exists before the run suspends, so a completion that arrives in between is
//! kept: the suspend sees it and resumes at once (T17). The first completion, cancellation or
//! timeout wins, on every store instance and host (W2 to W4). Every waitpoint has a timeout,
//! which the sweeper of any host applies exactly once.
//!
//! The store never holds a completion token: the host mints one per waitpoint it creates and
//! stores its SHA-256 digest ([`token_digest`]); the API compares digests in constant time.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::model::{Dispatch, Fence, bytes_as_text, check_metadata, check_name};
use super::rules::{self, WaitpointsSeen};
use super::{StoreError, StoreResult};

/// The most waitpoints one dispatch may create.
pub const MAX_WAITPOINTS: u32 = 256;
/// The longest timeout a waitpoint may have: 30 days.
pub const MAX_WAITPOINT_TIMEOUT_MS: u64 = 30 * 24 * 3600 * 1000;
/// The most bytes a waitpoint's metadata takes, keys and values together.
pub const MAX_WAITPOINT_METADATA: usize = 16 * 1024;
/// The most token digests one waitpoint keeps (each later claim that finds its waitpoint
/// still pending may add one: the contract, section 10.4).
pub const MAX_TOKEN_DIGESTS: usize = 8;
/// How many resumes a dispatch may use when its plugin names no limit (a setting's default).
pub use crate::config::DEFAULT_MAX_RESUMES;
/// The page size of [`Waitpoints::list_waitpoints`] when the caller gives 0.
pub const DEFAULT_WAITPOINT_PAGE: usize = 100;

/// `settled_by` of a timeout.
pub const BY_TIMEOUT: &str = "timeout";
/// `settled_by` of an interrupt of the waitpoint's thread, and of a waitpoint cancelled because
/// its dispatch reached a terminal status (decided by `rules::effects`).
pub use crate::store::rules::{BY_DISPATCH_ENDED, BY_INTERRUPT};

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
    /// The bytes a page of waitpoints holds of it (what [`Waitpoints::read_waitpoints`]
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
    /// The digest of the token the host minted for it ([`token_digest`]).
    pub token_digest: String,
}

impl NewWaitpoint {
    /// Checks the name, timeout and metadata (section 7 of the contract).
    ///
    /// # Errors
    ///
    /// `Invalid` naming the field.
    pub fn validate(&self) -> StoreResult<()> {
        let invalid = StoreError::Invalid;
        check_name("waitpoint name", &self.name).map_err(invalid)?;
        if self.timeout_ms == 0 || self.timeout_ms > MAX_WAITPOINT_TIMEOUT_MS {
            return Err(invalid(format!(
                "waitpoint timeout: {} ms is outside 1 ms to 30 days",
                self.timeout_ms
            )));
        }
        check_metadata(&self.metadata, MAX_WAITPOINT_METADATA).map_err(invalid)?;
        if self.token_digest.len() != 64
            || !self.token_digest.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err(invalid("waitpoint token digest: not a hex SHA-256".into()));
        }
        Ok(())
    }
}

/// What W1 answered: the waitpoint, and whether this call created it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    /// The stored record.
    pub waitpoint: Waitpoint,
    /// `false` when the dispatch already had a waitpoint with this name (returned unchanged).
    pub created: bool,
}

/// What W2 or W4 answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    /// This call settled it (and resumed its dispatch when that was waiting).
    Settled(Waitpoint),
    /// It had left `pending` already (possibly by timing out just now): unchanged.
    Already(Waitpoint),
}

impl Settlement {
    /// The record, settled either way.
    pub fn waitpoint(&self) -> &Waitpoint {
        match self {
            Settlement::Settled(w) | Settlement::Already(w) => w,
        }
    }
}

/// Which waitpoints [`Waitpoints::list_waitpoints`] returns, oldest first by
/// `(created_at, id)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WaitpointFilter {
    /// Only this thread.
    pub thread: Option<String>,
    /// Only this dispatch.
    pub dispatch: Option<String>,
    /// Only this state.
    pub state: Option<WaitpointState>,
    /// Start after this `(created_at, id)`.
    pub after: Option<(u64, String)>,
    /// Page size (0: [`DEFAULT_WAITPOINT_PAGE`]).
    pub limit: usize,
}

/// What [`Waitpoints::read_waitpoints`] answered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WaitpointPage {
    /// The page, oldest first by `(created_at, id)`.
    pub waitpoints: Vec<Waitpoint>,
    /// Whether waitpoints past the last one remain (the page was cut by its limit or bytes).
    pub more: bool,
}

impl WaitpointFilter {
    /// Whether `w` passes the filter's thread, dispatch, state and cursor.
    pub fn admits(&self, w: &Waitpoint) -> bool {
        self.thread.as_ref().is_none_or(|t| *t == w.thread)
            && self.dispatch.as_ref().is_none_or(|d| *d == w.dispatch)
            && self.state.is_none_or(|s| s == w.state)
            && self
                .after
                .as_ref()
                .is_none_or(|(at, id)| (w.created_at, &w.id) > (*at, id))
    }

    /// The page size.
    pub fn page(&self) -> usize {
        if self.limit == 0 {
            DEFAULT_WAITPOINT_PAGE
        } else {
            self.limit
        }
    }
}

/// Waitpoints of every dispatch (the contract, docs/contract.md, section 10).
///
/// Every method is atomic with respect to every other call on any instance of the same
/// backend, including the mailbox's: a suspend and a completion decide against each other.
/// None panics on any input or stored state.
#[async_trait]
pub trait Waitpoints: Send + Sync + fmt::Debug + 'static {
    /// W1: the waitpoint `new.name` of the fenced dispatch, created pending when it does not
    /// exist. A holder write, refused as a fenced append is (section 4.4).
    ///
    /// # Errors
    ///
    /// `Invalid` for a bad name, timeout or metadata; `Limit` past [`MAX_WAITPOINTS`];
    /// `NotFound`, `NotClaimed`, `LostClaim`, `StaleEpoch` from the fence.
    async fn create_waitpoint(&self, fence: &Fence, new: NewWaitpoint) -> StoreResult<Created>;

    /// Adds a token digest to a pending waitpoint of the fenced dispatch (at most
    /// [`MAX_TOKEN_DIGESTS`]; earlier tokens stay valid): a run that found its waitpoint
    /// without a token gets a fresh one. `Ok(false)` when it is not pending or full.
    async fn add_token(&self, fence: &Fence, id: &str, digest: &str) -> StoreResult<bool>;

    /// W2: completes a pending waitpoint with `result` (T18 when its dispatch waits). The
    /// caller has checked the completer's token or role.
    ///
    /// # Errors
    ///
    /// `NotFound` for an unknown id; `Invalid` for a result over [`Waitpoints::max_result`].
    async fn complete_waitpoint(
        &self,
        id: &str,
        result: Vec<u8>,
        settled_by: &str,
    ) -> StoreResult<Settlement>;

    /// W4 by an operator: cancels a pending waitpoint (T18 when its dispatch waits: the run
    /// reads `cancelled`).
    ///
    /// # Errors
    ///
    /// `NotFound` for an unknown id.
    async fn cancel_waitpoint(&self, id: &str, settled_by: &str) -> StoreResult<Settlement>;

    /// W3: times out up to `limit` pending waitpoints whose `timeout_at` is before `now`,
    /// earliest first (T18 for each waiting dispatch). Returns what this call timed out.
    async fn time_out_waitpoints(&self, now: u64, limit: usize) -> StoreResult<Vec<Waitpoint>>;

    /// One waitpoint, by id.
    async fn waitpoint(&self, id: &str) -> StoreResult<Option<Waitpoint>>;

    /// The waitpoints of a dispatch, oldest first.
    async fn waitpoints_of(&self, dispatch: &str) -> StoreResult<Vec<Waitpoint>>;

    /// A page of waitpoints, whole: [`Waitpoints::read_waitpoints`] without a byte bound.
    async fn list_waitpoints(&self, filter: &WaitpointFilter) -> StoreResult<Vec<Waitpoint>> {
        Ok(self
            .read_waitpoints(filter, usize::MAX, true)
            .await?
            .waitpoints)
    }

    /// A page of waitpoints (as [`Waitpoints::list_waitpoints`]) that ends early rather than
    /// hold more than `max_bytes` of them as [`Waitpoint::held`] counts them (the first is
    /// returned whatever its size); their results only when `results` (else `None`, and not
    /// counted). A result that is not returned is not read where the backend can leave it
    /// unread (the embedded backend), else it is dropped as it is read (NATS, where a result
    /// shares its record's message): the read holds the page and one record at a time.
    async fn read_waitpoints(
        &self,
        filter: &WaitpointFilter,
        max_bytes: usize,
        results: bool,
    ) -> StoreResult<WaitpointPage>;

    /// The largest completion result this backend keeps.
    fn max_result(&self) -> u64;
}

/// The prefix of every completion token (so a leaked one is recognisable as Homing's).
pub const TOKEN_PREFIX: &str = "hwp_";

/// A fresh completion token: [`TOKEN_PREFIX`] and 32 random bytes, base64url.
///
/// # Errors
///
/// When the system's random source fails.
pub fn mint_token() -> StoreResult<String> {
    use base64::Engine;
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| {
        StoreError::Unavailable(format!("no randomness for a waitpoint token: {e}"))
    })?;
    let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    Ok(format!("{TOKEN_PREFIX}{encoded}"))
}

/// The hex SHA-256 digest of a completion token: what the store keeps of it.
pub fn token_digest(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(64), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// The pending record W1 stores.
pub fn pending_record(id: &str, d: &Dispatch, new: &NewWaitpoint, now: u64) -> Waitpoint {
    Waitpoint {
        id: id.to_owned(),
        dispatch: d.id.clone(),
        thread: d.thread.clone(),
        agent: d.agent.clone(),
        name: new.name.clone(),
        state: WaitpointState::Pending,
        token_digests: vec![new.token_digest.clone()],
        metadata: new.metadata.clone(),
        timeout_at: super::rules::clamp(now.saturating_add(new.timeout_ms)),
        result: None,
        settled_by: None,
        created_at: now,
        settled_at: None,
        created_claim: d.claims,
    }
}

/// Settles a pending waitpoint: `state`, `result`, `settled_by`, `settled_at = now`.
pub fn settle(
    w: &mut Waitpoint,
    state: WaitpointState,
    result: Option<Vec<u8>>,
    by: &str,
    now: u64,
) {
    w.state = state;
    w.result = result;
    w.settled_by = Some(by.to_owned());
    w.settled_at = Some(now);
}

/// What W2 decides for a waitpoint read at `now`: `Ok(())` to complete it, else the
/// settlement to answer with (a pending one past its timeout is timed out first: the caller
/// stores the changed record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// Pending and in time: complete it.
    Complete,
    /// Pending but past its timeout: store this timed-out record (and resume), answer
    /// `Already`.
    TimedOut,
    /// Settled before: answer `Already` unchanged.
    Settled,
}

/// W2's decision for `w` at `now`.
pub fn completion(w: &Waitpoint, now: u64) -> Completion {
    if !w.is_pending() {
        Completion::Settled
    } else if w.timeout_at < now {
        Completion::TimedOut
    } else {
        Completion::Complete
    }
}

/// What a suspend reads of a dispatch's waitpoints `wps` (all of them): whether one is
/// pending, and the latest settlement among the others.
pub fn seen<'a>(wps: impl IntoIterator<Item = &'a Waitpoint>) -> WaitpointsSeen {
    let mut seen = WaitpointsSeen::default();
    for w in wps {
        if w.is_pending() {
            seen.pending = true;
        } else if let Some(at) = w.settled_at {
            seen.last_settled = Some(seen.last_settled.map_or(at, |last| last.max(at)));
        }
    }
    seen
}

/// T17's decision (`rules::suspend`, the holder write's [`HolderOp::Suspend`]) for the live
/// holder's record `d` with its waitpoints `wps`: the new record (`waiting`, or `queued` now as
/// a resume), or the refusal.
///
/// # Errors
///
/// `Limit` past `max_resumes`; `Invalid` with no pending waitpoint and none settled during
/// this run.
pub fn suspended(
    mut d: Dispatch,
    wps: &[Waitpoint],
    max_resumes: u32,
    now: u64,
) -> StoreResult<Dispatch> {
    rules::suspend(&mut d, seen(wps), max_resumes, now)?;
    Ok(d)
}

/// T18 (and T17's immediate resume): back to `queued`, available now, one more resume.
pub use crate::store::rules::resume;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::store::model::{NewDispatch, Status};
    use crate::store::rules::{Take, queued_record, take};

    fn claimed() -> Dispatch {
        let d = queued_record("d1", &NewDispatch::new("a", "t", b"p".to_vec()), 0, 10);
        match take(d, 0, "w", 5_000, 100, true) {
            Take::Claimed(d) => d,
            other => panic!("{other:?}"),
        }
    }

    fn new(name: &str) -> NewWaitpoint {
        NewWaitpoint {
            name: name.into(),
            timeout_ms: 1_000,
            metadata: BTreeMap::new(),
            token_digest: token_digest("hwp_x"),
        }
    }

    #[test]
    fn states_parse_their_names() {
        for s in WaitpointState::ALL {
            assert_eq!(s.as_str().parse::<WaitpointState>(), Ok(s));
        }
        assert_eq!("timed-out".parse(), Ok(WaitpointState::TimedOut));
        assert!(
            "done"
                .parse::<WaitpointState>()
                .unwrap_err()
                .contains("expected pending")
        );
    }

    #[test]
    fn creation_is_checked() {
        assert!(new("approve").validate().is_ok());
        let bad = |f: &dyn Fn(&mut NewWaitpoint)| {
            let mut n = new("x");
            f(&mut n);
            match n.validate() {
                Err(StoreError::Invalid(m)) => m,
                other => panic!("{other:?}"),
            }
        };
        assert!(bad(&|n| n.name = " ".into()).starts_with("waitpoint name"));
        assert!(bad(&|n| n.name = "x".repeat(257)).starts_with("waitpoint name"));
        assert!(bad(&|n| n.timeout_ms = 0).starts_with("waitpoint timeout"));
        assert!(
            bad(&|n| n.timeout_ms = MAX_WAITPOINT_TIMEOUT_MS + 1).starts_with("waitpoint timeout")
        );
        assert!(
            bad(&|n| {
                n.metadata
                    .insert("k".into(), "v".repeat(MAX_WAITPOINT_METADATA));
            })
            .starts_with("metadata")
        );
        assert_eq!(token_digest("abc").len(), 64);
    }

    #[test]
    fn suspend_waits_resumes_or_refuses() {
        let d = claimed();
        let mut w = pending_record("w1", &d, &new("a"), 100);
        let waiting = suspended(d.clone(), std::slice::from_ref(&w), 100, 200).unwrap();
        assert_eq!((waiting.status, waiting.resumes), (Status::Waiting, 0));
        assert!(waiting.claim.is_none() && waiting.started_at.is_none());
        waiting.check_shape().unwrap();

        settle(
            &mut w,
            WaitpointState::Completed,
            Some(b"ok".to_vec()),
            "token",
            150,
        );
        let resumed = suspended(d.clone(), std::slice::from_ref(&w), 100, 200).unwrap();
        assert_eq!(
            (resumed.status, resumed.resumes, resumed.available_at),
            (Status::Queued, 1, 200)
        );
        assert_eq!(resumed.attempt, d.attempt, "a resume is not an attempt");

        // Settled before this run started: it does not count; nothing pending is invalid.
        let mut old = w.clone();
        old.settled_at = Some(50);
        assert!(matches!(
            suspended(d.clone(), &[old], 100, 200),
            Err(StoreError::Invalid(_))
        ));
        assert!(matches!(
            suspended(d.clone(), &[], 100, 200),
            Err(StoreError::Invalid(_))
        ));
        let mut used = d;
        used.resumes = 3;
        match suspended(used, &[w], 3, 200) {
            Err(StoreError::Limit(m)) => assert!(m.starts_with("max_resumes"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_completion_past_the_timeout_times_out() {
        let d = claimed();
        let mut w = pending_record("w1", &d, &new("a"), 100);
        assert!(matches!(completion(&w, 1_100), Completion::Complete));
        assert!(matches!(completion(&w, 1_101), Completion::TimedOut));
        settle(&mut w, WaitpointState::Cancelled, None, BY_INTERRUPT, 120);
        assert!(matches!(completion(&w, 110), Completion::Settled));
        assert!(w.clone().public().token_digests.is_empty());
        let json = serde_json::to_string(&w).unwrap();
        assert_eq!(serde_json::from_str::<Waitpoint>(&json).unwrap(), w);
    }
}
