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

use std::fmt;

use async_trait::async_trait;
use sha2::{Digest, Sha256};

use super::model::Fence;
/// The waitpoint's records live with the dispatch's (`model`), its rules with the others
/// (`rules::waitpoints`).
pub use super::model::{
    MAX_WAITPOINT_METADATA, MAX_WAITPOINT_TIMEOUT_MS, NewWaitpoint, WAITPOINT_ROOM, Waitpoint,
    WaitpointState, held_size,
};
pub use super::rules::resume;
pub use super::rules::waitpoints::{
    Completion, completion, hands_token, pending_record, seen, settle, suspended,
};
use super::{StoreError, StoreResult};

/// The most waitpoints one dispatch may create.
pub const MAX_WAITPOINTS: u32 = 256;
/// The most token digests one waitpoint keeps (each later claim that finds its waitpoint
/// still pending may add one: the contract, section 10.4).
pub const MAX_TOKEN_DIGESTS: usize = 8;
/// How many resumes a dispatch may use when its plugin names no limit (a setting's default).
pub use crate::config::DEFAULT_MAX_RESUMES;
/// `settled_by` of a timeout.
pub const BY_TIMEOUT: &str = "timeout";
/// `settled_by` of an interrupt of the waitpoint's thread, and of a waitpoint cancelled because
/// its dispatch reached a terminal status (decided by `rules::effects`).
pub use crate::store::rules::{BY_DISPATCH_ENDED, BY_INTERRUPT};

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
    /// Page size (0: every listing's default, [`super::rules::DEFAULT_PAGE`]).
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
        super::rules::page(self.limit)
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::store::model::{Dispatch, NewDispatch, Status};
    use crate::store::rules::{Take, queued_record, take};
    use std::collections::BTreeMap;

    fn claimed() -> Dispatch {
        let d = queued_record("d1", &NewDispatch::new("a", "t", b"p".to_vec()), 0, 10);
        match take(d, (0, 0), "w", 5_000, 100, true) {
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
                Err(m) => m,
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
