//! What follows a change of a dispatch's status besides its own record: the one verdict every
//! transition of both backends takes (the contract, section 2.5). A backend applies it in one
//! place: the embedded store in `embedded::effects::apply`, the NATS store in `nats::effects::applied`.

use crate::store::model::Status;

/// `settled_by` of a waitpoint cancelled by an interrupt of its thread (its dispatch was
/// superseded).
pub const BY_INTERRUPT: &str = "interrupt";
/// `settled_by` of a waitpoint cancelled because its dispatch reached a terminal status.
pub const BY_DISPATCH_ENDED: &str = "dispatch-ended";

/// What must follow one dispatch's change of status, beyond storing its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Effects {
    /// The dispatch held its thread (claimed or waiting) and no longer does: the thread is free
    /// for its other dispatches. (NATS derives the holder from the records: nothing to write.)
    pub release: bool,
    /// Its pending waitpoints end (W4), cancelled with this `settled_by`.
    pub end_waitpoints: Option<&'static str>,
    /// The queued dispatches of its agent on its thread changed: its lane's head may be another.
    /// (NATS derives the lanes from the records: nothing to write.)
    pub refresh_lane: bool,
    /// M4, case b: the thread's pending messages no follow-up covers are answered when the
    /// thread has no live work left.
    pub answer_inbox: bool,
    /// Work may have become claimable: the claimers wake.
    pub wake_claimers: bool,
    /// The dispatch changed status: its thread's watchers wake.
    pub wake_watchers: bool,
}

impl Effects {
    /// Nothing follows: a write that changes no status (a lease extension, a start, a result).
    pub(crate) const NONE: Effects = Effects {
        release: false,
        end_waitpoints: None,
        refresh_lane: false,
        answer_inbox: false,
        wake_claimers: false,
        wake_watchers: false,
    };

    /// What follows two changes applied together (an interrupt's supersede of a thread's queued
    /// and waiting dispatches in one step): every effect either has. Where both end waitpoints,
    /// `self`'s `settled_by` is kept.
    pub(crate) fn or(self, other: Effects) -> Effects {
        Effects {
            release: self.release || other.release,
            end_waitpoints: self.end_waitpoints.or(other.end_waitpoints),
            refresh_lane: self.refresh_lane || other.refresh_lane,
            answer_inbox: self.answer_inbox || other.answer_inbox,
            wake_claimers: self.wake_claimers || other.wake_claimers,
            wake_watchers: self.wake_watchers || other.wake_watchers,
        }
    }
}

/// Whether a dispatch in `status` holds its thread: no other dispatch of the thread is claimed
/// while it is claimed or waiting.
fn holds_thread(status: Status) -> bool {
    matches!(status, Status::Claimed | Status::Waiting)
}

/// The `settled_by` of the pending waitpoints of a dispatch that reached `status`, when it is
/// terminal: a superseded dispatch was stopped by an interrupt, any other one ended.
pub(crate) fn waitpoints_end(status: Status) -> Option<&'static str> {
    match status {
        Status::Superseded => Some(BY_INTERRUPT),
        s if s.is_terminal() => Some(BY_DISPATCH_ENDED),
        _ => None,
    }
}

/// The effects of a dispatch going from `before` to `after`.
///
/// - The thread is released when the dispatch stops holding it (T3 of a waiting dispatch, T8 to
///   T15, a resume, a suspend whose waitpoints were all settled).
/// - Its pending waitpoints end when it becomes terminal (W4).
/// - Its lane changes when it leaves or enters `queued`.
/// - Its thread's inbox is answered when a claim ends it as delivered or given up (T8, T10,
///   T11, T13: `acked` or `dead_letter` from `claimed`); never after a cancel, an interrupt or
///   a supersede (the messages wait for the thread's next run), nor after a requeue (the
///   thread still has live work).
/// - Claimers wake when the thread is released or the dispatch is queued again; watchers when
///   the status changed.
pub(crate) fn effects(before: Status, after: Status) -> Effects {
    if before == after {
        return Effects::NONE;
    }
    let release = holds_thread(before) && !holds_thread(after);
    Effects {
        release,
        end_waitpoints: waitpoints_end(after),
        refresh_lane: before == Status::Queued || after == Status::Queued,
        answer_inbox: before == Status::Claimed
            && matches!(after, Status::Acked | Status::DeadLetter),
        wake_claimers: release || after == Status::Queued,
        wake_watchers: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Status::*;

    /// Every transition of the contract, with what follows it.
    #[test]
    fn each_transition_has_the_effects_the_contract_gives_it() {
        // (before, after, release, end, lane, inbox, claimers)
        type Row = (Status, Status, bool, Option<&'static str>, bool, bool, bool);
        #[rustfmt::skip]
        let table: &[Row] = &[
            // T2: a claim occupies its thread (the claim path's own write).
            (Queued, Claimed, false, None, true, false, false),
            // T3: cancel.
            (Queued, Cancelled, false, Some(BY_DISPATCH_ENDED), true, false, false),
            (Waiting, Cancelled, true, Some(BY_DISPATCH_ENDED), false, false, true),
            // T4: an interrupt, or a stale candidate met by a claim.
            (Queued, Superseded, false, Some(BY_INTERRUPT), true, false, false),
            (Waiting, Superseded, true, Some(BY_INTERRUPT), false, false, true),
            // T8, T10, T11, T13.
            (Claimed, Acked, true, Some(BY_DISPATCH_ENDED), false, true, true),
            (Claimed, DeadLetter, true, Some(BY_DISPATCH_ENDED), false, true, true),
            // T9, T12, a suspend whose waitpoints were all settled.
            (Claimed, Queued, true, None, true, false, true),
            // T14, T15.
            (Claimed, Superseded, true, Some(BY_INTERRUPT), false, false, true),
            // A suspend: the thread stays held.
            (Claimed, Waiting, false, None, false, false, false),
            // T18: a resume.
            (Waiting, Queued, true, None, true, false, true),
        ];
        for &(before, after, release, end, lane, inbox, claimers) in table {
            let e = effects(before, after);
            let what = format!("{before} -> {after}: {e:?}");
            assert_eq!(e.release, release, "{what}");
            assert_eq!(e.end_waitpoints, end, "{what}");
            assert_eq!(e.refresh_lane, lane, "{what}");
            assert_eq!(e.answer_inbox, inbox, "{what}");
            assert_eq!(e.wake_claimers, claimers, "{what}");
            assert!(e.wake_watchers, "{what}");
        }
    }

    /// A write that keeps the status (T5, T6, T7) has no effects.
    #[test]
    fn a_write_that_keeps_the_status_has_none() {
        for s in Status::ALL {
            assert_eq!(effects(s, s), Effects::NONE, "{s}");
        }
    }

    /// A terminal status never lets go of the thread a second time or answers the inbox: only
    /// a change out of a live status has effects of that kind.
    #[test]
    fn only_a_change_out_of_a_live_status_releases_or_answers() {
        for before in Status::ALL.into_iter().filter(|s| s.is_terminal()) {
            for after in Status::ALL {
                let e = effects(before, after);
                assert!(!e.release && !e.answer_inbox, "{before} -> {after}");
            }
        }
    }
}
