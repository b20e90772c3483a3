//! The waitpoints' rules (the contract, section 10): the pending record a create stores, a
//! settlement, what a completion decides, what a suspend reads of them, and when a run is
//! handed a fresh completion token. Pure, shared by both backends and the host.

use super::holder::WaitpointsSeen;
use crate::store::StoreResult;
use crate::store::model::{Dispatch, NewWaitpoint, Waitpoint, WaitpointState};

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
        timeout_at: super::clamp(now.saturating_add(new.timeout_ms)),
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

/// T17's decision (`rules::suspend`, the holder write's `HolderOp::Suspend`) for the live
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
    super::suspend(&mut d, seen(wps), max_resumes, now)?;
    Ok(d)
}

/// Whether a run's first look at waitpoint `w`, one it did not create, hands it a fresh
/// completion token (section 10.4): `w` is still pending, it was made by another claim than
/// `claims` (the run's), and this claim was not handed a token for it yet (`given`). Its
/// earlier tokens may have been lost with the run that had them; all stay valid.
pub fn hands_token(w: &Waitpoint, claims: u32, given: &[String]) -> bool {
    w.is_pending() && w.created_claim != claims && !given.contains(&w.id)
}
