//! The one place the NATS backend follows a dispatch's change of status: [`applied`] turns the
//! rules' verdict (`rules::effects`) into the writes of one atomic batch beside the record, and
//! [`in_batch`] does the same for a change that goes into a larger batch fenced by its caller
//! (an interrupt). The thread's holder and lanes are derived from the records by every view, so
//! a release or a lane refresh writes nothing here; the end of the pending waitpoints (W4) goes
//! in the batch before the record when the verdict says so; the inbox's follow-ups (M4 b) after
//! it when the verdict says so. Every write of an existing dispatch's record comes through here
//! (one that keeps the status has no effects); `commit::put_dispatch_expecting` alone writes a
//! new record (an enqueue, a follow-up).

use super::commit::{Expect, Write, fence_first, put_dispatch_expecting, put_waitpoint};
use super::inbox::{Answer, answer_inbox, follow_up_writes};
use super::view::{Stored, View};
use crate::store::model::Status;
use crate::store::rules::{self, Effects};
use crate::store::waitpoints::{WaitpointState, settle};
use crate::store::{StoreError, StoreResult};

/// What a change of status writes, and whether this host's claimers wake after it.
pub(super) struct Applied {
    /// The record with its effects, fenced by its thread's tree: one atomic batch.
    pub writes: Vec<Write>,
    /// Whether work may have become claimable.
    pub wake: bool,
}

/// The writes of `stored`, a dispatch that went from `before` to its status now, with the
/// effects of that change. `None` when the verdict asks for the inbox to be answered and the
/// view does not hold the thread's live work (a client's read of one record): the caller reads
/// the whole thread and decides again. A verdict that does not answer the inbox is never
/// `None`.
pub(super) fn applied(
    view: &View,
    before: Status,
    stored: Stored,
    now: u64,
) -> StoreResult<Option<Applied>> {
    let e = rules::effects(before, stored.dispatch.status);
    let d = e.answer_inbox.then(|| stored.dispatch.clone());
    let thread = stored.dispatch.thread.clone();
    let mut writes = change_writes(view, e, stored)?;
    fence_first(view, &thread, &mut writes);
    let mut wake = e.wake_claimers;
    if let Some(d) = d {
        match answer_inbox(view, &d, now)? {
            Answer::Nothing => {}
            Answer::NeedThread => return Ok(None),
            Answer::FollowUps(follow_ups, rec) => {
                writes.extend(follow_up_writes(&d.thread, follow_ups, rec)?);
                wake = true;
            }
        }
    }
    Ok(Some(Applied { writes, wake }))
}

/// [`applied`] for a change the rules never make answer the inbox (T2 a claim, T4, T14 and T15 a
/// supersede, T18 a resume): it never needs the whole thread.
///
/// # Errors
///
/// `Invalid` when the verdict does answer the inbox (a caller's mistake: it must use
/// [`applied`]), besides the encoding's.
pub(super) fn changed(view: &View, before: Status, stored: Stored) -> StoreResult<Applied> {
    let e = no_inbox(before, &stored)?;
    let thread = stored.dispatch.thread.clone();
    let mut writes = change_writes(view, e, stored)?;
    fence_first(view, &thread, &mut writes);
    Ok(Applied {
        writes,
        wake: e.wake_claimers,
    })
}

/// The writes of `stored`'s change from `before` inside a batch its caller fences (none with an
/// expectation), for a change whose verdict answers no inbox: an interrupt's supersede (the
/// inbox of a thread an interrupt stopped waits for its next run), a resume (T18) beside the
/// waitpoint whose settlement caused it.
///
/// # Errors
///
/// As [`changed`]'s.
pub(super) fn in_batch(view: &View, before: Status, stored: Stored) -> StoreResult<Vec<Write>> {
    let e = no_inbox(before, &stored)?;
    change_writes(view, e, stored)
}

/// The verdict on `stored`'s change from `before`, refused when it answers the inbox.
fn no_inbox(before: Status, stored: &Stored) -> StoreResult<Effects> {
    let e = rules::effects(before, stored.dispatch.status);
    if e.answer_inbox {
        return Err(StoreError::Invalid(format!(
            "dispatch {}: {before} -> {} answers the inbox; the change must be applied with it",
            stored.dispatch.id, stored.dispatch.status
        )));
    }
    Ok(e)
}

/// The record of a change with effects `e`, unfenced: the record alone, unless the verdict ends
/// the dispatch's pending waitpoints (W4) and it has some. Then they are cancelled in the same
/// batch, written *before* the record, so that in the stream every write of a waitpoint
/// precedes the record that ends its dispatch (what a lean view relies on to drop them, see
/// `View::apply_waitpoint`), and the record says it has waitpoints (for the archiver). The
/// view must hold the dispatch's waitpoints: a host's holds those of every live dispatch, and a
/// read for one operation reads those of every thread it reads (`fetch`).
fn change_writes(view: &View, e: Effects, mut stored: Stored) -> StoreResult<Vec<Write>> {
    let d = &stored.dispatch;
    let mut writes = Vec::new();
    if let Some(by) = e.end_waitpoints
        && view.has_waitpoints(&d.thread, &d.id)
    {
        for held in view.waitpoints_of(&d.thread, &d.id) {
            if held.waitpoint.is_pending() {
                let mut w = held.waitpoint.clone();
                settle(&mut w, WaitpointState::Cancelled, None, by, d.updated_at);
                writes.push(put_waitpoint(Expect::None, &w)?);
            }
        }
        stored.waitpoints = true;
    }
    writes.push(put_dispatch_expecting(Expect::None, stored)?);
    Ok(writes)
}
