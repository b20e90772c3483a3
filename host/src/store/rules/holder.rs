//! Who may write a claimed dispatch: the holder check of every holder operation, the fence of a
//! guest's log append, and a supersede by the holder or the control plane.
//!
//! A holder write carries the claim token; it is refused when the record is missing, not
//! claimed, or claimed under another token, and it supersedes the dispatch (and still fails)
//! when the thread's epoch moved past the dispatch's. Settling operations are idempotent per
//! token: repeating the operation that settled a record, with the same token, is answered with
//! the record as it is.

use super::claim::{lease_live, stale, superseded};
use super::{fail_attempt, terminate};
use crate::store::model::{Dispatch, Fence, RunResult, Status, Usage};
use crate::store::{REASON_LEASE_EXPIRED_AT_MAX, REASON_STALE_EPOCH, StoreError, StoreResult};

/// The operations that settle a dispatch. A settled record keeps the token and operation that
/// settled it, so a repeat after a lost reply is recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    /// `ack` or `complete`.
    Ack,
    /// `nack`.
    Nack,
    /// `dead_letter`.
    DeadLetter,
    /// A supersede by the holder (or of the holder's claim, by a stale-epoch write).
    Supersede,
    /// `suspend` (waiting, or queued again at once).
    Suspend,
    /// `release` (queued again without an attempt, T19).
    Release,
}

impl Settle {
    /// The name stored with the settling token.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Settle::Ack => "ack",
            Settle::Nack => "nack",
            Settle::DeadLetter => "dead_letter",
            Settle::Supersede => "supersede",
            Settle::Suspend => "suspend",
            Settle::Release => "release",
        }
    }
}

/// A dispatch as a backend read it: the record and the token and operation that settled it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Found<'a> {
    /// The record.
    pub dispatch: &'a Dispatch,
    /// The settling token and operation name, when a holder settled it.
    pub settled: Option<(&'a str, &'a str)>,
}

impl Found<'_> {
    fn settled_by(&self, token: &str, op: Settle) -> bool {
        self.settled == Some((token, op.as_str()))
    }
}

/// What a holder check decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Holder {
    /// The caller holds the live claim: apply its operation to this record.
    Live(Dispatch),
    /// The caller already settled the record with this operation: answer with it unchanged.
    Repeat(Dispatch),
    /// Refused; nothing changes.
    Refuse(StoreError),
    /// The thread moved on: store `record` (superseded, settled by `token`), then fail with
    /// `error`.
    Supersede {
        /// The superseded record.
        record: Dispatch,
        /// The claim token to record as the one that settled it.
        token: String,
        /// The caller's answer (`StaleEpoch`).
        error: StoreError,
    },
}

/// Checks that `token` holds the dispatch `id` at a current epoch. `found` is the stored record
/// (if any), `settles` the settling operation the caller is about to make (if it is one),
/// `thread_epoch` the epoch of the record's thread.
pub(crate) fn check_holder(
    found: Option<Found<'_>>,
    id: &str,
    token: &str,
    settles: Option<Settle>,
    thread_epoch: u64,
    now: u64,
) -> Holder {
    let Some(found) = found else {
        return Holder::Refuse(StoreError::NotFound { id: id.to_owned() });
    };
    if let Some(op) = settles
        && found.settled_by(token, op)
    {
        return Holder::Repeat(found.dispatch.clone());
    }
    let d = found.dispatch;
    let Some(claim) = &d.claim else {
        return Holder::Refuse(StoreError::NotClaimed {
            id: id.to_owned(),
            status: d.status,
        });
    };
    if claim.token != token {
        return Holder::Refuse(StoreError::LostClaim { id: id.to_owned() });
    }
    if stale(d, thread_epoch) {
        return Holder::Supersede {
            record: superseded(d.clone(), now, REASON_STALE_EPOCH),
            token: token.to_owned(),
            error: StoreError::StaleEpoch {
                id: id.to_owned(),
                dispatch: d.epoch,
                thread: thread_epoch,
            },
        };
    }
    Holder::Live(d.clone())
}

/// [`check_holder`] for the holder operation `op`: an extension is refused as a lost claim
/// once the lease has run out (`lease_until < now`), reclaimed or not. From that moment another
/// claim may hold the slot of a concurrency key the expired one held, so reviving it could run a
/// key over its cap; and the holder's guest is stopped when its extension fails (docs/contract.md,
/// "Leases"). Every other operation of a holder whose lease ran out but was not yet reclaimed is
/// still its own (the record is unchanged until a reclaim).
pub(crate) fn check_holder_op(
    found: Option<Found<'_>>,
    id: &str,
    token: &str,
    op: &HolderOp,
    thread_epoch: u64,
    now: u64,
) -> Holder {
    match check_holder(found, id, token, op.settles(), thread_epoch, now) {
        Holder::Live(d)
            if matches!(op.unmetered(), HolderOp::Extend { .. }) && !lease_live(&d, now) =>
        {
            Holder::Refuse(StoreError::LostClaim { id: id.to_owned() })
        }
        // A bound already past: the slot block the claim ran under has lapsed, and its slots
        // may be another claim's.
        Holder::Live(_) if matches!(op.unmetered(), HolderOp::Extend { until_max: Some(max), .. } if *max < now) => {
            Holder::Refuse(StoreError::LostClaim { id: id.to_owned() })
        }
        verdict => verdict,
    }
}

/// What a fence check of a guest's append decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fenced {
    /// The claim is live and current: append.
    Live,
    /// Refused; nothing changes.
    Refuse(StoreError),
    /// The thread moved on: store `record` (superseded, settled by `token`), append nothing,
    /// fail with `error`.
    Supersede {
        /// The superseded record.
        record: Box<Dispatch>,
        /// The claim token to record as the one that settled it.
        token: String,
        /// The caller's answer (`StaleEpoch`).
        error: StoreError,
    },
}

/// Checks a guest's fence for an append to `thread`: the dispatch is claimed under the fence's
/// token and epoch with a live lease (`lease_until >= now`: once it runs out, another holder may
/// be one reclaim away, and the log is shared by every later holder of the thread), it belongs
/// to `thread`, and `thread_epoch` has not moved past it.
pub(crate) fn check_fence(
    found: Option<&Dispatch>,
    thread: &str,
    fence: &Fence,
    thread_epoch: u64,
    now: u64,
) -> Fenced {
    let Some(d) = found else {
        return Fenced::Refuse(StoreError::NotFound {
            id: fence.dispatch.clone(),
        });
    };
    let Some(claim) = &d.claim else {
        return Fenced::Refuse(StoreError::NotClaimed {
            id: d.id.clone(),
            status: d.status,
        });
    };
    if claim.token != fence.token || d.epoch != fence.epoch || !lease_live(d, now) {
        return Fenced::Refuse(StoreError::LostClaim { id: d.id.clone() });
    }
    if d.thread != thread {
        return Fenced::Refuse(StoreError::Invalid(format!(
            "dispatch `{}` belongs to thread `{}`, not `{thread}`",
            d.id, d.thread
        )));
    }
    if stale(d, thread_epoch) {
        return Fenced::Supersede {
            record: Box::new(superseded(d.clone(), now, REASON_STALE_EPOCH)),
            token: claim.token.clone(),
            error: StoreError::StaleEpoch {
                id: d.id.clone(),
                dispatch: d.epoch,
                thread: thread_epoch,
            },
        };
    }
    Fenced::Live
}

/// What `supersede_claimed` decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SupersedeClaimed {
    /// Missing or not claimed: the answer is `None`.
    Nothing,
    /// The same holder already superseded it: answer with the record unchanged.
    Repeat(Dispatch),
    /// Another token holds it: refused.
    Refuse(StoreError),
    /// Store `record` (superseded, settled by the claim's `token`) and answer with it.
    Supersede {
        /// The superseded record.
        record: Dispatch,
        /// The claim's token (the holder's, whoever asked).
        token: String,
    },
}

/// Supersedes a claimed dispatch for its holder (`token` given) or for the control plane
/// (`token` `None`), with `reason`.
pub(crate) fn supersede_claimed(
    found: Option<Found<'_>>,
    id: &str,
    token: Option<&str>,
    reason: &str,
    now: u64,
) -> SupersedeClaimed {
    let Some(found) = found else {
        return SupersedeClaimed::Nothing;
    };
    if let Some(token) = token
        && found.settled_by(token, Settle::Supersede)
    {
        return SupersedeClaimed::Repeat(found.dispatch.clone());
    }
    let Some(claim) = &found.dispatch.claim else {
        return SupersedeClaimed::Nothing;
    };
    if token.is_some_and(|token| claim.token != token) {
        return SupersedeClaimed::Refuse(StoreError::LostClaim { id: id.to_owned() });
    }
    SupersedeClaimed::Supersede {
        token: claim.token.clone(),
        record: superseded(found.dispatch.clone(), now, reason),
    }
}

/// What the holder of a live claim does to its dispatch: the one argument of
/// [`Mailbox::hold`](crate::store::Mailbox::hold), a constructor for each transition a holder
/// makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HolderOp {
    /// Moves the lease to `now + extension_ms`, never past `until_max`.
    Extend {
        /// The new lease, from now.
        extension_ms: u64,
        /// The latest instant the lease may reach, whatever the clock reads when the write is
        /// decided: a NATS claim under a slot block ends before the block does, and the
        /// block's lapse is read earlier than the write's clock (`None`: no bound).
        until_max: Option<u64>,
    },
    /// Records the start of the run (dropping any earlier result).
    Start,
    /// Records what the run produced; the dispatch stays claimed.
    Result(RunResult),
    /// Settles as delivered, keeping the recorded result.
    Ack,
    /// One more failed attempt: back to the queue at `retry_at`, or dead-lettered at the last.
    Nack {
        /// When the dispatch may be claimed again.
        retry_at: u64,
        /// Why the attempt failed.
        error: String,
    },
    /// Gives up on the dispatch.
    DeadLetter {
        /// Why.
        error: String,
    },
    /// Records the result and settles as delivered.
    Complete(RunResult),
    /// T19: back to the queue at `available_at`, no attempt counted.
    Release {
        /// When it may be claimed again.
        available_at: u64,
        /// Why it was released (its `last_error`).
        reason: String,
    },
    /// T17: waits for one of its waitpoints (or runs again at once when one was settled during
    /// this run). Decided with what the store reads of the dispatch's waitpoints under the same
    /// fence ([`WaitpointsSeen`]).
    Suspend {
        /// How many resumes the dispatch may use.
        max_resumes: u32,
    },
    /// `op`, adding the tokens the run's metered model calls used to the record's `usage`
    /// (docs/contract.md, section 2: it costs no write of its own). Added only when `op` is
    /// applied: a refused or repeated write adds nothing.
    Metered(Usage, Box<HolderOp>),
}

/// What a suspend reads of its dispatch's waitpoints, in the holder write's own atomic step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitpointsSeen {
    /// Whether one of them is still pending.
    pub pending: bool,
    /// The latest `settled_at` of those no longer pending.
    pub last_settled: Option<u64>,
}

/// T17's decision for the live holder's record `d`, with what was read of its waitpoints: the
/// new record (`waiting`, or `queued` now as a resume when one was settled during this run), or
/// the refusal.
///
/// # Errors
///
/// `Limit` past `max_resumes`; `Invalid` with no pending waitpoint and none settled during
/// this run.
pub(crate) fn suspend(
    d: &mut Dispatch,
    seen: WaitpointsSeen,
    max_resumes: u32,
    now: u64,
) -> Result<(), StoreError> {
    if d.resumes >= max_resumes {
        return Err(StoreError::Limit(format!(
            "max_resumes: dispatch `{}` has resumed {} times (the limit is {max_resumes})",
            d.id, d.resumes
        )));
    }
    let run_started = d.started_at.unwrap_or(0);
    let settled_in_run = seen.last_settled.is_some_and(|at| at >= run_started);
    if !settled_in_run && !seen.pending {
        return Err(StoreError::Invalid(format!(
            "suspend: dispatch `{}` has no pending waitpoint",
            d.id
        )));
    }
    d.claim = None;
    d.started_at = None;
    d.result = None;
    d.updated_at = now;
    if settled_in_run {
        resume(d, now);
    } else {
        d.status = Status::Waiting;
    }
    Ok(())
}

/// T18 (and T17's immediate resume): back to `queued`, available now, one more resume.
pub fn resume(d: &mut Dispatch, now: u64) {
    d.status = Status::Queued;
    d.available_at = now;
    d.resumes = d.resumes.saturating_add(1);
    d.updated_at = now;
}

impl HolderOp {
    /// An extension of the lease to `now + extension_ms`, with no bound of its own.
    pub fn extend(extension_ms: u64) -> HolderOp {
        HolderOp::Extend {
            extension_ms,
            until_max: None,
        }
    }

    /// `self` carrying `usage` (itself when nothing was metered).
    pub fn metered(self, usage: Usage) -> HolderOp {
        if usage == Usage::default() {
            return self;
        }
        HolderOp::Metered(usage, Box::new(self))
    }

    /// The operation itself, without the usage it carries.
    pub fn unmetered(&self) -> &HolderOp {
        match self {
            HolderOp::Metered(_, op) => op.unmetered(),
            op => op,
        }
    }

    /// The operation's name, as the store's metrics and errors give it.
    pub fn name(&self) -> &'static str {
        match self {
            HolderOp::Metered(_, op) => op.name(),
            HolderOp::Extend { .. } => "extend_lease",
            HolderOp::Start => "record_start",
            HolderOp::Result(_) => "record_result",
            HolderOp::Ack => "ack",
            HolderOp::Nack { .. } => "nack",
            HolderOp::DeadLetter { .. } => "dead_letter",
            HolderOp::Complete(_) => "complete",
            HolderOp::Release { .. } => "release",
            HolderOp::Suspend { .. } => "suspend",
        }
    }

    /// Whether the operation is decided with the dispatch's waitpoints ([`WaitpointsSeen`]),
    /// which the backend then reads in the same atomic step.
    pub(crate) fn reads_waitpoints(&self) -> bool {
        matches!(self.unmetered(), HolderOp::Suspend { .. })
    }

    /// The run output the operation stores, if it stores one.
    pub(crate) fn output(&self) -> Option<&[u8]> {
        match self.unmetered() {
            HolderOp::Result(r) | HolderOp::Complete(r) => Some(&r.output),
            _ => None,
        }
    }

    /// Refuses an output larger than the backend's largest value (`limit`, set by `why`),
    /// before anything is written.
    ///
    /// # Errors
    ///
    /// `Invalid` naming the output, its size and the limit.
    pub(crate) fn check_output(&self, limit: u64, why: &str) -> StoreResult<()> {
        match self.output() {
            Some(output) => super::check_size("output", output, limit, why),
            None => Ok(()),
        }
    }

    /// The settlement this operation makes, if it makes one.
    pub(crate) fn settles(&self) -> Option<Settle> {
        match self {
            HolderOp::Metered(_, op) => op.settles(),
            HolderOp::Extend { .. } | HolderOp::Start | HolderOp::Result(_) => None,
            HolderOp::Ack | HolderOp::Complete(_) => Some(Settle::Ack),
            HolderOp::Nack { .. } => Some(Settle::Nack),
            HolderOp::DeadLetter { .. } => Some(Settle::DeadLetter),
            HolderOp::Release { .. } => Some(Settle::Release),
            HolderOp::Suspend { .. } => Some(Settle::Suspend),
        }
    }

    /// Applies the operation to the live holder's record `d` at `now`, a suspend with `seen`
    /// (what the backend read of the dispatch's waitpoints when [`HolderOp::reads_waitpoints`];
    /// every other operation ignores it). Returns whether the record is queued and available
    /// now (a nack with a retry time already past, a suspend that resumes at once).
    ///
    /// # Errors
    ///
    /// Only a suspend's refusals ([`suspend`]); the record is then unchanged.
    pub(crate) fn apply(
        self,
        d: &mut Dispatch,
        now: u64,
        seen: WaitpointsSeen,
    ) -> Result<bool, StoreError> {
        Ok(match self {
            HolderOp::Metered(usage, op) => {
                let ready = op.apply(d, now, seen)?;
                d.usage.get_or_insert_default().add(&usage);
                ready
            }
            HolderOp::Extend {
                extension_ms,
                until_max,
            } => {
                if let Some(claim) = &mut d.claim {
                    let until = now.saturating_add(extension_ms);
                    claim.lease_until = super::clamp(until_max.map_or(until, |m| until.min(m)));
                }
                d.updated_at = now;
                false
            }
            HolderOp::Start => {
                d.started_at = Some(now);
                d.result = None;
                d.updated_at = now;
                false
            }
            HolderOp::Result(result) => {
                d.result = Some(result);
                d.updated_at = now;
                false
            }
            HolderOp::Ack => {
                terminate(d, Status::Acked, now, None);
                false
            }
            HolderOp::Nack { retry_at, error } => {
                fail_attempt(d, now, retry_at, Some(&error), REASON_LEASE_EXPIRED_AT_MAX)
            }
            HolderOp::DeadLetter { error } => {
                terminate(d, Status::DeadLetter, now, Some(&error));
                false
            }
            HolderOp::Complete(result) => {
                d.result = Some(result);
                terminate(d, Status::Acked, now, None);
                false
            }
            HolderOp::Release {
                available_at,
                reason,
            } => {
                d.status = Status::Queued;
                d.claim = None;
                d.started_at = None;
                d.result = None;
                d.available_at = super::clamp(available_at);
                d.last_error = Some(super::error_text(&reason));
                d.updated_at = now;
                d.available_at <= now
            }
            HolderOp::Suspend { max_resumes } => {
                suspend(d, seen, max_resumes, now)?;
                d.status == Status::Queued
            }
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::store::model::NewDispatch;
    use crate::store::rules::{Take, queued_record, take};

    const NOW: u64 = 10_000;

    /// The `last_error` a supersede records for `reason` (cut like every error text).
    fn recorded(reason: &str) -> Option<String> {
        Some(crate::store::rules::error_text(reason))
    }

    fn claimed(epoch: u64) -> Dispatch {
        let new = NewDispatch::new("agent", "t", b"p".to_vec());
        let d = queued_record("d1", &new, epoch, 1_000);
        match take(d, (epoch, 0), "w", 5_000, NOW - 1_000, false) {
            Take::Claimed(d) => d,
            other => panic!("expected a claim, got {other:?}"),
        }
    }

    fn tok(d: &Dispatch) -> String {
        d.claim.as_ref().map(|c| c.token.clone()).unwrap()
    }

    fn found(d: &Dispatch) -> Option<Found<'_>> {
        Some(Found {
            dispatch: d,
            settled: None,
        })
    }

    #[test]
    fn holder_with_the_token_at_a_current_epoch_is_live() {
        let d = claimed(3);
        let verdict = check_holder(found(&d), "d1", &tok(&d), Some(Settle::Ack), 3, NOW);
        assert_eq!(verdict, Holder::Live(d));
    }

    #[test]
    fn holder_of_a_missing_record_is_not_found() {
        assert_eq!(
            check_holder(None, "d1", "x", None, 0, NOW),
            Holder::Refuse(StoreError::NotFound { id: "d1".into() })
        );
    }

    #[test]
    fn holder_of_an_unclaimed_record_is_not_claimed() {
        let new = NewDispatch::new("agent", "t", b"p".to_vec());
        let d = queued_record("d1", &new, 0, 1_000);
        assert_eq!(
            check_holder(found(&d), "d1", "x", None, 0, NOW),
            Holder::Refuse(StoreError::NotClaimed {
                id: "d1".into(),
                status: Status::Queued
            })
        );
    }

    #[test]
    fn holder_with_another_token_lost_its_claim_even_when_the_epoch_is_stale() {
        let d = claimed(0);
        assert_eq!(
            check_holder(found(&d), "d1", "other", None, 5, NOW),
            Holder::Refuse(StoreError::LostClaim { id: "d1".into() })
        );
    }

    #[test]
    fn holder_at_a_stale_epoch_supersedes_and_fails() {
        let d = claimed(1);
        let token = tok(&d);
        match check_holder(found(&d), "d1", &token, None, 2, NOW) {
            Holder::Supersede {
                record,
                token: settled,
                error,
            } => {
                assert_eq!(record.status, Status::Superseded);
                assert_eq!((record.claim, record.started_at), (None, None));
                assert_eq!(record.completed_at, Some(NOW));
                assert_eq!(record.last_error, recorded(REASON_STALE_EPOCH));
                assert_eq!(settled, token);
                assert_eq!(
                    error,
                    StoreError::StaleEpoch {
                        id: "d1".into(),
                        dispatch: 1,
                        thread: 2
                    }
                );
            }
            other => panic!("expected Supersede, got {other:?}"),
        }
    }

    #[test]
    fn repeating_the_settling_operation_with_its_token_is_a_repeat() {
        let mut d = claimed(0);
        let token = tok(&d);
        HolderOp::Ack
            .apply(&mut d, NOW, WaitpointsSeen::default())
            .unwrap();
        let settled = Some(Found {
            dispatch: &d,
            settled: Some((token.as_str(), "ack")),
        });
        assert_eq!(
            check_holder(settled, "d1", &token, Some(Settle::Ack), 9, NOW),
            Holder::Repeat(d.clone())
        );
        // Another operation, or the same one without a settlement, is refused.
        assert!(matches!(
            check_holder(settled, "d1", &token, Some(Settle::Nack), 0, NOW),
            Holder::Refuse(StoreError::NotClaimed { .. })
        ));
        assert!(matches!(
            check_holder(settled, "d1", "other", Some(Settle::Ack), 0, NOW),
            Holder::Refuse(StoreError::NotClaimed { .. })
        ));
    }

    fn fence_of(d: &Dispatch) -> Fence {
        Fence::of(d).unwrap()
    }

    #[test]
    fn fence_of_a_live_current_claim_appends() {
        let d = claimed(2);
        assert_eq!(
            check_fence(Some(&d), "t", &fence_of(&d), 2, NOW),
            Fenced::Live
        );
        let lease_end = d.claim.as_ref().unwrap().lease_until;
        assert_eq!(
            check_fence(Some(&d), "t", &fence_of(&d), 2, lease_end),
            Fenced::Live,
            "the lease is live through its last millisecond"
        );
    }

    #[test]
    fn fence_refusals_name_what_was_wrong() {
        let d = claimed(2);
        let fence = fence_of(&d);
        assert_eq!(
            check_fence(None, "t", &fence, 2, NOW),
            Fenced::Refuse(StoreError::NotFound { id: "d1".into() })
        );
        let lost = Fenced::Refuse(StoreError::LostClaim { id: "d1".into() });
        let wrong_token = Fence {
            token: "other".into(),
            ..fence.clone()
        };
        assert_eq!(check_fence(Some(&d), "t", &wrong_token, 2, NOW), lost);
        let wrong_epoch = Fence {
            epoch: 1,
            ..fence.clone()
        };
        assert_eq!(check_fence(Some(&d), "t", &wrong_epoch, 2, NOW), lost);
        let lease_end = d.claim.as_ref().unwrap().lease_until;
        assert_eq!(check_fence(Some(&d), "t", &fence, 2, lease_end + 1), lost);
        assert!(matches!(
            check_fence(Some(&d), "u", &fence, 2, NOW),
            Fenced::Refuse(StoreError::Invalid(_))
        ));
        let mut acked = d.clone();
        HolderOp::Ack
            .apply(&mut acked, NOW, WaitpointsSeen::default())
            .unwrap();
        assert_eq!(
            check_fence(Some(&acked), "t", &fence, 2, NOW),
            Fenced::Refuse(StoreError::NotClaimed {
                id: "d1".into(),
                status: Status::Acked
            })
        );
    }

    #[test]
    fn fence_at_a_stale_epoch_supersedes_and_fails() {
        let d = claimed(0);
        match check_fence(Some(&d), "t", &fence_of(&d), 1, NOW) {
            Fenced::Supersede {
                record,
                token,
                error,
            } => {
                assert_eq!(record.status, Status::Superseded);
                assert_eq!(record.last_error, recorded(REASON_STALE_EPOCH));
                assert_eq!(token, tok(&d));
                assert!(matches!(
                    error,
                    StoreError::StaleEpoch {
                        dispatch: 0,
                        thread: 1,
                        ..
                    }
                ));
            }
            other => panic!("expected Supersede, got {other:?}"),
        }
    }

    #[test]
    fn supersede_claimed_verdicts() {
        let d = claimed(0);
        let token = tok(&d);
        assert_eq!(
            supersede_claimed(None, "d1", None, "r", NOW),
            SupersedeClaimed::Nothing
        );
        assert_eq!(
            supersede_claimed(found(&d), "d1", Some("other"), "r", NOW),
            SupersedeClaimed::Refuse(StoreError::LostClaim { id: "d1".into() })
        );
        for asked in [None, Some(token.as_str())] {
            match supersede_claimed(found(&d), "d1", asked, "why", NOW) {
                SupersedeClaimed::Supersede { record, token: t } => {
                    assert_eq!(t, token, "the holder's token is recorded");
                    assert_eq!(record.status, Status::Superseded);
                    assert_eq!(record.last_error.as_deref(), Some("why"));
                }
                other => panic!("expected Supersede, got {other:?}"),
            }
        }
        let done = superseded(d.clone(), NOW, "why");
        let settled = Some(Found {
            dispatch: &done,
            settled: Some((token.as_str(), "supersede")),
        });
        assert_eq!(
            supersede_claimed(settled, "d1", Some(&token), "again", NOW),
            SupersedeClaimed::Repeat(done.clone())
        );
        assert_eq!(
            supersede_claimed(settled, "d1", None, "again", NOW),
            SupersedeClaimed::Nothing
        );
    }

    #[test]
    fn holder_operations_change_what_they_say() {
        let base = claimed(0);
        let mut d = base.clone();
        let extend = |extension_ms, until_max| HolderOp::Extend {
            extension_ms,
            until_max,
        };
        assert!(
            !extend(700, None)
                .apply(&mut d, NOW, WaitpointsSeen::default())
                .unwrap()
        );
        assert_eq!(d.claim.as_ref().unwrap().lease_until, NOW + 700);
        assert!(
            !extend(700, Some(NOW + 300))
                .apply(&mut d, NOW, WaitpointsSeen::default())
                .unwrap()
        );
        assert_eq!(
            d.claim.as_ref().unwrap().lease_until,
            NOW + 300,
            "an extension stops at its bound"
        );
        assert!(
            !extend(700, Some(NOW + 900))
                .apply(&mut d, NOW, WaitpointsSeen::default())
                .unwrap()
        );
        assert_eq!(d.claim.as_ref().unwrap().lease_until, NOW + 700);
        assert!(
            !HolderOp::Start
                .apply(&mut d, NOW, WaitpointsSeen::default())
                .unwrap()
        );
        assert_eq!(d.started_at, Some(NOW));
        let result = RunResult::success(b"out".to_vec());
        assert!(
            !HolderOp::Result(result.clone())
                .apply(&mut d, NOW, WaitpointsSeen::default())
                .unwrap()
        );
        assert_eq!(
            (d.status, d.result.clone()),
            (Status::Claimed, Some(result.clone()))
        );

        let mut acked = d.clone();
        HolderOp::Ack
            .apply(&mut acked, NOW, WaitpointsSeen::default())
            .unwrap();
        assert_eq!((acked.status, acked.claim.clone()), (Status::Acked, None));
        assert_eq!(
            acked.result,
            Some(result.clone()),
            "an ack keeps the result"
        );

        let mut completed = base.clone();
        HolderOp::Complete(result.clone())
            .apply(&mut completed, NOW, WaitpointsSeen::default())
            .unwrap();
        assert_eq!(
            (completed.status, completed.result),
            (Status::Acked, Some(result))
        );

        let mut nacked = base.clone();
        let error = "boom".to_owned();
        let ready = HolderOp::Nack {
            retry_at: NOW,
            error: error.clone(),
        }
        .apply(&mut nacked, NOW, WaitpointsSeen::default())
        .unwrap();
        assert!(ready);
        assert_eq!((nacked.status, nacked.attempt), (Status::Queued, 1));
        let mut later = base.clone();
        assert!(
            !HolderOp::Nack {
                retry_at: NOW + 1,
                error,
            }
            .apply(&mut later, NOW, WaitpointsSeen::default())
            .unwrap()
        );

        let mut dead = base;
        HolderOp::DeadLetter {
            error: "gave up".into(),
        }
        .apply(&mut dead, NOW, WaitpointsSeen::default())
        .unwrap();
        assert_eq!(dead.status, Status::DeadLetter);
        assert_eq!(dead.last_error.as_deref(), Some("gave up"));

        assert_eq!(HolderOp::Start.settles(), None);
        assert_eq!(
            HolderOp::Complete(RunResult::failure("x")).settles(),
            Some(Settle::Ack)
        );
        assert_eq!(
            HolderOp::DeadLetter {
                error: String::new()
            }
            .settles(),
            Some(Settle::DeadLetter)
        );
    }
}
