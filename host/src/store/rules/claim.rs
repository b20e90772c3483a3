//! Taking a queued dispatch and giving an expired claim back.
//!
//! A claim is decided on the candidate record and its thread's epoch: a candidate from an older
//! epoch (its thread was interrupted after it was enqueued) is superseded instead of run. A
//! reclaim is decided on the claimed record, its thread's epoch and the time: a lease that has
//! not run out is left alone, one of an interrupted thread supersedes the dispatch, any other
//! costs one attempt and requeues the dispatch or, at its last attempt, dead-letters it.

use super::{clamp, fail_attempt, terminate};
use crate::store::model::{Claim, Dispatch, Status};
use crate::store::{REASON_EXPIRED_AFTER_INTERRUPT, REASON_LEASE_EXPIRED_AT_MAX};

/// Whether `d` was stamped before its thread's latest interrupt (its epoch is behind the
/// thread's `thread_epoch`).
pub(crate) fn stale(d: &Dispatch, thread_epoch: u64) -> bool {
    d.epoch < thread_epoch
}

/// Whether `d` has a claim whose lease still runs at `now` (`lease_until >= now`).
pub(crate) fn lease_live(d: &Dispatch, now: u64) -> bool {
    d.claim.as_ref().is_some_and(|c| c.lease_until >= now)
}

/// Whether `d` is claimed under a lease that ended strictly before `now`: what maintenance
/// reclaims.
pub(crate) fn lease_expired(d: &Dispatch, now: u64) -> bool {
    d.status == Status::Claimed && d.claim.as_ref().is_some_and(|c| c.lease_until < now)
}

/// `d` (queued or claimed) superseded with `reason`: terminal, and the projection of any run it
/// had started is dropped with its claim.
pub(crate) fn superseded(mut d: Dispatch, now: u64, reason: &str) -> Dispatch {
    terminate(&mut d, Status::Superseded, now, Some(reason));
    d.started_at = None;
    d.result = None;
    d
}

/// What a claim of a queued candidate came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Take {
    /// The record, claimed: store it and mark its thread as held.
    Claimed(Dispatch),
    /// The candidate's thread moved on: store this superseded record and pick again.
    Stale(Dispatch),
}

/// Whether the queued `d` may be claimed at `now`: never before its `available_at`. Checked at
/// every claim, not only when a dispatch is first found due, so a clock that steps back (a wall
/// clock corrected by NTP or an operator, or another host's clock behind this one's) never
/// releases work early (the contract's guarantee 5).
pub(crate) fn due(d: &Dispatch, now: u64) -> bool {
    d.available_at <= now
}

/// Claims the queued `d` for `consumer` until `now + lease_ms` with a fresh token (and records
/// the start when `start` is set), unless its thread's epoch moved past it. `log_latest` is its
/// thread log's latest sequence, kept as [`Dispatch::log_from`] by its first claim.
pub(crate) fn take(
    mut d: Dispatch,
    (thread_epoch, log_latest): (u64, u64),
    consumer: &str,
    lease_ms: u64,
    now: u64,
    start: bool,
) -> Take {
    if stale(&d, thread_epoch) {
        return Take::Stale(superseded(d, now, crate::store::REASON_STALE_EPOCH));
    }
    d.status = Status::Claimed;
    d.claims = d.claims.saturating_add(1);
    d.log_from.get_or_insert(log_latest);
    if start {
        d.started_at = Some(now);
    }
    d.claim = Some(Claim {
        token: uuid::Uuid::now_v7().to_string(),
        claimed_by: consumer.to_owned(),
        lease_until: clamp(now.saturating_add(lease_ms)),
    });
    d.updated_at = now;
    Take::Claimed(d)
}

/// What a reclaim of a claimed record came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reclaim {
    /// The lease still runs (or the record is not claimed): nothing to do.
    Live,
    /// One more failed attempt; queued again and available at once.
    Requeued(Dispatch),
    /// One more failed attempt, and it was the last.
    DeadLettered(Dispatch),
    /// The thread was interrupted while the lease ran: superseded (not reported to the caller).
    Superseded(Dispatch),
}

impl Reclaim {
    /// The record to report to the caller of `reclaim_expired`, when there is one.
    pub(crate) fn reported(&self) -> Option<&Dispatch> {
        match self {
            Reclaim::Requeued(d) | Reclaim::DeadLettered(d) => Some(d),
            Reclaim::Live | Reclaim::Superseded(_) => None,
        }
    }
}

/// Gives back the claim of `d` if its lease ended strictly before `now`.
pub(crate) fn reclaim(mut d: Dispatch, thread_epoch: u64, now: u64) -> Reclaim {
    if !lease_expired(&d, now) {
        return Reclaim::Live;
    }
    if stale(&d, thread_epoch) {
        return Reclaim::Superseded(superseded(d, now, REASON_EXPIRED_AFTER_INTERRUPT));
    }
    fail_attempt(&mut d, now, now, None, REASON_LEASE_EXPIRED_AT_MAX);
    // The abandoned run's projection goes with its lease, whether requeued or dead-lettered.
    d.started_at = None;
    d.result = None;
    if d.status == Status::Queued {
        Reclaim::Requeued(d)
    } else {
        Reclaim::DeadLettered(d)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::store::REASON_STALE_EPOCH;
    use crate::store::model::NewDispatch;
    use crate::store::rules::queued_record;

    fn queued(epoch: u64) -> Dispatch {
        let new = NewDispatch::new("agent", "t", b"p".to_vec());
        queued_record("d1", &new, epoch, 1_000)
    }

    fn claimed(epoch: u64, lease_until: u64) -> Dispatch {
        let Take::Claimed(mut d) = take(queued(epoch), (epoch, 0), "w", 0, 1_000, true) else {
            panic!("a current record is taken");
        };
        if let Some(c) = &mut d.claim {
            c.lease_until = lease_until;
        }
        d
    }

    #[test]
    fn take_claims_a_current_record_with_a_fresh_token_and_lease() {
        let Take::Claimed(d) = take(queued(2), (2, 0), "w", 500, 1_000, false) else {
            panic!("expected a claim");
        };
        assert_eq!(d.status, Status::Claimed);
        let claim = d.claim.clone().unwrap();
        assert!(!claim.token.is_empty());
        assert_eq!(claim.claimed_by, "w");
        assert_eq!(claim.lease_until, 1_500);
        assert_eq!(d.started_at, None);
        assert_eq!(d.updated_at, 1_000);
        let Take::Claimed(started) = take(queued(2), (2, 0), "w", 500, 1_000, true) else {
            panic!("expected a claim");
        };
        assert_eq!(started.started_at, Some(1_000));
        assert_ne!(started.claim.unwrap().token, claim.token);
    }

    #[test]
    fn the_first_claim_keeps_where_the_log_stood_and_later_claims_keep_it() {
        let Take::Claimed(mut d) = take(queued(2), (2, 7), "w", 500, 1_000, false) else {
            panic!("expected a claim");
        };
        assert_eq!(d.log_from, Some(7));
        d.status = Status::Queued;
        d.claim = None;
        let Take::Claimed(again) = take(d, (2, 12), "w", 500, 2_000, false) else {
            panic!("expected a claim");
        };
        assert_eq!(
            again.log_from,
            Some(7),
            "a retry's run is the same dispatch's"
        );
        assert_eq!(again.claims, 2);
    }

    #[test]
    fn take_clamps_the_lease_into_signed_range() {
        let Take::Claimed(d) = take(queued(0), (0, 0), "w", u64::MAX, 1_000, false) else {
            panic!("expected a claim");
        };
        assert_eq!(d.claim.unwrap().lease_until, i64::MAX as u64);
    }

    #[test]
    fn take_supersedes_a_candidate_of_an_older_epoch() {
        match take(queued(1), (2, 0), "w", 500, 2_000, true) {
            Take::Stale(d) => {
                assert_eq!(d.status, Status::Superseded);
                assert_eq!(d.claim, None);
                assert_eq!(d.completed_at, Some(2_000));
                assert_eq!(d.last_error.as_deref(), Some(REASON_STALE_EPOCH));
            }
            other => panic!("expected Stale, got {other:?}"),
        }
    }

    #[test]
    fn reclaim_leaves_a_live_lease_alone_including_at_its_last_millisecond() {
        assert_eq!(reclaim(claimed(0, 5_000), 0, 5_000), Reclaim::Live);
        assert_eq!(reclaim(claimed(0, 5_000), 0, 4_000), Reclaim::Live);
        assert_eq!(reclaim(queued(0), 0, 9_000), Reclaim::Live);
    }

    #[test]
    fn reclaim_requeues_with_one_more_attempt_and_drops_the_run() {
        let mut d = claimed(0, 5_000);
        d.result = Some(crate::store::RunResult::success(b"o".to_vec()));
        match reclaim(d, 0, 5_001) {
            Reclaim::Requeued(d) => {
                assert_eq!(d.status, Status::Queued);
                assert_eq!(d.attempt, 1);
                assert_eq!(d.available_at, 5_001);
                assert_eq!((d.claim, d.started_at, d.result), (None, None, None));
            }
            other => panic!("expected Requeued, got {other:?}"),
        }
    }

    #[test]
    fn reclaim_at_the_last_attempt_dead_letters_with_the_reason() {
        let mut d = claimed(0, 5_000);
        d.max_attempts = 1;
        let verdict = reclaim(d, 0, 6_000);
        assert!(verdict.reported().is_some());
        match verdict {
            Reclaim::DeadLettered(d) => {
                assert_eq!(d.status, Status::DeadLetter);
                assert_eq!(d.completed_at, Some(6_000));
                assert_eq!(d.last_error.as_deref(), Some(REASON_LEASE_EXPIRED_AT_MAX));
            }
            other => panic!("expected DeadLettered, got {other:?}"),
        }
    }

    #[test]
    fn reclaim_of_an_interrupted_threads_claim_supersedes_without_reporting() {
        let verdict = reclaim(claimed(0, 5_000), 1, 6_000);
        assert_eq!(verdict.reported(), None);
        match verdict {
            Reclaim::Superseded(d) => {
                assert_eq!(d.status, Status::Superseded);
                assert_eq!(d.attempt, 0, "a supersede costs no attempt");
                assert_eq!(
                    d.last_error.as_deref(),
                    Some(REASON_EXPIRED_AFTER_INTERRUPT)
                );
            }
            other => panic!("expected Superseded, got {other:?}"),
        }
    }

    #[test]
    fn leases_are_live_through_their_last_millisecond() {
        let d = claimed(0, 5_000);
        assert!(lease_live(&d, 5_000));
        assert!(!lease_live(&d, 5_001));
        assert!(!lease_expired(&d, 5_000));
        assert!(lease_expired(&d, 5_001));
        assert!(!lease_live(&queued(0), 0));
        assert!(stale(&queued(1), 2));
        assert!(!stale(&queued(2), 2));
    }
}
