//! The one place the NATS backend follows a dispatch's change of status: [`applied`] turns the
//! rules' verdict (`rules::effects`) into the writes of one atomic batch beside the record, and
//! [`in_batch`] does the same for a change that goes into a larger batch fenced by its caller
//! (an interrupt). The thread's holder and lanes are derived from the records by every view, so
//! a release or a lane refresh writes nothing here; the end of the pending waitpoints (W4) goes
//! in the batch before the record when the verdict says so; the inbox's follow-ups (M4 b) after
//! it when the verdict says so ([`answer_inbox`]), and T4's supersedes for a whole thread
//! ([`superseding`]). Every write of an existing dispatch's record comes through here
//! (one that keeps the status has no effects); `commit::put_dispatch_expecting` alone writes a
//! new record (an enqueue, a follow-up).

use super::commit::{Expect, Write, fence_first, plain, put_dispatch_expecting, put_waitpoint};
use super::keys::{Key, encode_thread};
use super::view::{Record, Stored, ThreadRec, View};
use crate::store::model::{Dispatch, Status};
use crate::store::rules::inbox::{follow_up_dispatch, follow_up_targets};
use crate::store::rules::{self, Effects, queued_record};
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

/// What the M4 hook of a settlement found.
pub(super) enum Answer {
    /// Nothing to answer: no message above `followed`, or the thread still has live work.
    Nothing,
    /// The view does not hold every dispatch of the thread (a client's read of one record):
    /// decide again on the whole thread.
    NeedThread,
    /// The follow-up dispatches to enqueue and the thread record to write with them.
    FollowUps(Vec<Dispatch>, ThreadRec),
}

/// M4, case b: what the settlement of `settled` (already changed by its operation, and one the
/// rules' verdict says answers the inbox: `rules::effects`) must write besides its record so
/// that the inbox of its thread is answered: when the thread has no other live work and it has
/// pending messages above `followed`, one follow-up dispatch per target (a message's agent,
/// else the settled dispatch's) and the thread record with `followed = latest`. Decided from
/// the view alone: with no pending message above `followed` it looks at nothing else.
pub(super) fn answer_inbox(view: &View, settled: &Dispatch, now: u64) -> StoreResult<Answer> {
    let thread = &settled.thread;
    let mut t = view.thread(thread)?;
    if !view.has_pending_after(thread, t.inbox_followed) {
        return Ok(Answer::Nothing);
    }
    if !view.knows_live(thread) {
        return Ok(Answer::NeedThread);
    }
    if view
        .live_of(thread)
        .iter()
        .any(|s| s.dispatch.id != settled.id)
    {
        return Ok(Answer::Nothing);
    }
    let uncovered = view.pending_after(thread, t.inbox_followed);
    let targets = follow_up_targets(
        uncovered.iter().map(|(n, h)| (*n, h.agent.as_deref())),
        Some(settled.agent.as_str()),
    );
    let follow_ups = targets
        .into_iter()
        .map(|(agent, first, last)| {
            let id = uuid::Uuid::now_v7().to_string();
            queued_record(
                &id,
                &follow_up_dispatch(&agent, thread, first, last, None),
                t.epoch,
                now,
            )
        })
        .collect();
    t.inbox_followed = view.inbox_marks(thread).latest;
    Ok(Answer::FollowUps(follow_ups, t))
}

/// The writes that go after the first of an atomic batch for M4: each follow-up's record and
/// the thread record, none with an expectation of its own.
pub(super) fn follow_up_writes(
    thread: &str,
    follow_ups: Vec<Dispatch>,
    rec: ThreadRec,
) -> StoreResult<Vec<Write>> {
    let mut writes = Vec::with_capacity(follow_ups.len() + 1);
    for d in follow_ups {
        writes.push(put_dispatch_expecting(Expect::None, plain(d))?);
    }
    writes.push(Write {
        key: Key::Thread(thread.to_owned()),
        expect: Expect::None,
        payload: encode_thread(&rec)?,
        record: Record::Thread(thread.to_owned(), rec),
    });
    Ok(writes)
}

/// What [`superseding`] wrote.
pub(super) struct Superseding {
    /// The writes, for the caller's batch.
    pub writes: Vec<Write>,
    /// The dispatches they supersede.
    pub ids: Vec<String>,
    /// Whether some were left for a later batch.
    pub more: bool,
}

/// T4 for the queued and waiting dispatches of `thread`, whose epoch is `epoch` now: the
/// writes superseding them with `reason` (each after its pending waitpoints cancelled), the
/// waiting one (which holds the thread) first, as many as fit in `room` writes. Those left
/// keep their older epoch, so a claim supersedes them instead of running them.
pub(super) fn superseding(
    view: &View,
    thread: &str,
    epoch: u64,
    reason: &str,
    now: u64,
    room: usize,
) -> StoreResult<Superseding> {
    let mut doomed: Vec<&Stored> = view
        .live_of(thread)
        .into_iter()
        .filter(|s| {
            matches!(s.dispatch.status, Status::Queued | Status::Waiting)
                && rules::stale(&s.dispatch, epoch)
        })
        .collect();
    doomed.sort_by(|a, b| {
        let key = |s: &Stored| s.dispatch.status != Status::Waiting;
        (key(a), &a.dispatch.id).cmp(&(key(b), &b.dispatch.id))
    });
    let mut out = Superseding {
        writes: Vec::new(),
        ids: Vec::new(),
        more: false,
    };
    for s in doomed {
        let record = Stored {
            dispatch: rules::superseded(s.dispatch.clone(), now, reason),
            ..s.clone()
        };
        let these = in_batch(view, s.dispatch.status, record)?;
        if out.writes.len() + these.len() > room {
            out.more = true;
            break;
        }
        out.ids.push(s.dispatch.id.clone());
        out.writes.extend(these);
    }
    Ok(out)
}
