//! The one place the embedded backend follows a dispatch's change of status: [`apply`] turns
//! the rules' verdict (`rules::effects`: release the thread, end the waitpoints, refresh the
//! lane, answer the inbox) into SQL in the transition's own transaction. Every transition site
//! stores its record, then calls [`apply`] with the verdict, nothing else; the wakes after the
//! commit are [`EmbeddedStore::woken`]'s.
//!
//! Below the feature files (the inbox, the waitpoints, the log, the mailbox), above the
//! scheduling tables (`lanes`) and the rows: the inbox's follow-ups (M4) and the end of
//! waitpoints (W4) live here because transitions of every file cause them.

use rusqlite::{Connection, OptionalExtension, params};

use super::EmbeddedStore;
use super::lanes::{insert_queued, refresh_lane, release_thread, thread_row};
use super::rows::{self, db};
use crate::store::StoreResult;
use crate::store::model::inbox::InboxMarks;
use crate::store::model::{Dispatch, Status};
use crate::store::rules::inbox::{
    Stopped, follow_up_dispatch, follow_up_targets, follow_up_window,
};
use crate::store::rules::{self, Effects, Reclaim, Settle, clamp};

/// What the transition already read in its transaction, so that an effect with nothing to do
/// costs no statement: the dispatch's waitpoint counter, its thread's pending messages.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Known {
    /// How many waitpoints the dispatch ever made (its row's counter).
    pub waitpoints: Option<u32>,
    /// How many messages its thread has pending.
    pub inbox_pending: Option<u64>,
}

/// Applies `e`, the effects of `d`'s change of status (`d` already stored), in the
/// transaction: frees the thread, cancels the pending waitpoints (W4), refreshes the lane and
/// answers the inbox (M4 b), each only when the verdict says so.
pub(super) fn apply(
    tx: &Connection,
    d: &Dispatch,
    e: Effects,
    known: Known,
    now: u64,
) -> StoreResult<()> {
    if e.release {
        release_thread(tx, &d.thread, &d.id)?;
    }
    if let Some(by) = e.end_waitpoints
        && known.waitpoints.is_none_or(|n| n > 0)
    {
        end_waitpoints(tx, &d.id, by, now)?;
    }
    if e.refresh_lane {
        refresh_lane(tx, &d.agent, &d.thread)?;
    }
    if e.answer_inbox && known.inbox_pending.is_none_or(|n| n > 0) {
        answer_inbox(tx, &d.thread, Some(&d.agent), now)?;
    }
    Ok(())
}

impl EmbeddedStore {
    /// What follows the commit of a transition with effects `e` on `thread`: the claimers and
    /// the thread's watchers wake as the verdict says.
    pub(super) fn woken(&self, thread: &str, e: Effects) {
        if e.wake_claimers {
            self.signal();
        }
        if e.wake_watchers {
            self.inner.watches.notify(thread);
        }
    }
}

/// Applies the effects of an interrupt of `thread`, which superseded every queued and waiting
/// dispatch of it in one statement (T4): the verdicts of `queued -> superseded` and of
/// `waiting -> superseded`, each applied thread-wide. `waiting` is the thread's holder when it
/// was waiting (superseded now); `active` its claimed holder, whose waitpoints stay until its
/// next holder write supersedes it (T14). Returns the effects, for [`EmbeddedStore::woken`].
pub(super) fn apply_interrupt(
    tx: &Connection,
    thread: &str,
    waiting: Option<&str>,
    active: Option<&str>,
    now: u64,
) -> StoreResult<Effects> {
    let queued = rules::effects(Status::Queued, Status::Superseded);
    let held = rules::effects(Status::Waiting, Status::Superseded);
    if queued.refresh_lane {
        // No queued dispatch of the thread is left: every agent's lane of it goes.
        tx.prepare_cached("DELETE FROM lanes WHERE thread = ?1")
            .map_err(db)?
            .execute(params![thread])
            .map_err(db)?;
    }
    if held.release
        && let Some(holder) = waiting
    {
        release_thread(tx, thread, holder)?;
    }
    let e = queued.or(held);
    if let Some(by) = e.end_waitpoints {
        end_thread_waitpoints(tx, thread, active, by, now)?;
    }
    Ok(e)
}

/// The one way a dispatch is superseded here, whatever decided it (a stale holder write or
/// fence, a stale claim candidate, a reclaim after an interrupt, the control plane): stores the
/// superseded `record` (settled by `token` when a holder's claim ended with it) and applies the
/// effects of its change from `before`.
pub(super) fn store_superseded(
    tx: &Connection,
    before: Status,
    record: &Dispatch,
    token: Option<&str>,
) -> StoreResult<()> {
    let settled = token.map(|token| (token, Settle::Supersede.as_str()));
    rows::store(tx, record, false, settled)?;
    apply(
        tx,
        record,
        rules::effects(before, record.status),
        Known::default(),
        record.updated_at,
    )
}

/// Applies a reclaim verdict (T12, T13, T15), with its effects. Returns the record when it was
/// requeued or dead-lettered.
pub(super) fn store_reclaim(
    tx: &Connection,
    verdict: Reclaim,
    now: u64,
) -> StoreResult<Option<Dispatch>> {
    match verdict {
        Reclaim::Live => Ok(None),
        Reclaim::Superseded(d) => {
            store_superseded(tx, Status::Claimed, &d, None)?;
            Ok(None)
        }
        Reclaim::Requeued(d) | Reclaim::DeadLettered(d) => {
            rows::store(tx, &d, d.status == Status::Queued, None)?;
            let e = rules::effects(Status::Claimed, d.status);
            apply(tx, &d, e, Known::default(), now)?;
            Ok(Some(d))
        }
    }
}

/// W4 of every pending waitpoint of `dispatch`, which reached a terminal status (or was
/// superseded by an interrupt): `settled_by` says why. Returns how many.
pub(super) fn end_waitpoints(
    tx: &Connection,
    dispatch: &str,
    by: &str,
    now: u64,
) -> StoreResult<usize> {
    tx.prepare_cached(
        "UPDATE waitpoints INDEXED BY waitpoints_by_name SET state = 'cancelled', \
         settled_by = ?2, settled_at = ?3 WHERE dispatch = ?1 AND state = 'pending'",
    )
    .map_err(db)?
    .execute(params![dispatch, by, clamp(now)])
    .map_err(db)
}

/// W4 of the pending waitpoints of every dispatch of `thread` but `keep` (an interrupt: the
/// claimed dispatch's are cancelled when its next holder write supersedes it).
fn end_thread_waitpoints(
    tx: &Connection,
    thread: &str,
    keep: Option<&str>,
    by: &str,
    now: u64,
) -> StoreResult<usize> {
    tx.prepare_cached(
        "UPDATE waitpoints INDEXED BY waitpoints_by_thread SET state = 'cancelled', \
         settled_by = ?3, settled_at = ?4 WHERE thread = ?1 AND state = 'pending' \
         AND dispatch IS NOT ?2",
    )
    .map_err(db)?
    .execute(params![thread, keep, by, clamp(now)])
    .map_err(db)
}

/// Stores a thread's inbox watermarks.
pub(super) fn save_inbox(tx: &Connection, thread: &str, marks: InboxMarks) -> StoreResult<()> {
    tx.prepare_cached(
        "UPDATE threads SET inbox_latest = ?2, inbox_pending = ?3, inbox_followed = ?4 \
         WHERE thread = ?1",
    )
    .map_err(db)?
    .execute(params![
        thread,
        clamp(marks.latest),
        clamp(marks.pending),
        clamp(marks.followed)
    ])
    .map_err(db)?;
    Ok(())
}

/// Whether the thread has a dispatch in a live status (queued, claimed or waiting).
pub(super) fn has_live_work(tx: &Connection, thread: &str) -> StoreResult<bool> {
    Ok(tx
        .prepare_cached(
            "SELECT 1 FROM dispatches INDEXED BY dispatches_live \
             WHERE (status = 'queued' OR status = 'claimed' OR status = 'waiting') AND thread = ?1 LIMIT 1",
        )
        .map_err(db)?
        .query_row(params![thread], |_| Ok(()))
        .optional()
        .map_err(db)?
        .is_some())
}

/// M4: when `thread` has pending messages no follow-up covers yet and no live work, enqueues
/// one follow-up dispatch per target (a message's agent, else `default_agent`) and moves
/// `followed` to `latest`. Returns the ids enqueued. Costs one row read (the thread's, often
/// already cached by the statement the caller just ran) when nothing is pending.
pub(super) fn answer_inbox(
    tx: &Connection,
    thread: &str,
    default_agent: Option<&str>,
    now: u64,
) -> StoreResult<Vec<String>> {
    if has_live_work(tx, thread)? {
        return Ok(Vec::new());
    }
    follow_up(tx, thread, default_agent, None, &[], None, now)
}

/// M4's follow-ups for the pending messages of `thread` no follow-up covers yet, whatever live
/// work the thread has: [`answer_inbox`] once the thread has none, and a stopping send behind
/// the run it stopped (its queued and waiting dispatches superseded, the claimed one of an
/// older epoch: the follow-up runs when that one lets the thread go), with the messages a
/// merge `reopened` first.
pub(super) fn follow_up(
    tx: &Connection,
    thread: &str,
    default_agent: Option<&str>,
    stopped: Option<Stopped<'_>>,
    reopened: &[(u64, Option<String>)],
    window: Option<(u64, u64)>,
    now: u64,
) -> StoreResult<Vec<String>> {
    let t = thread_row(tx, thread)?;
    let mut marks = t.inbox;
    if marks.pending == 0 || (marks.latest <= marks.followed && reopened.is_empty()) {
        return Ok(Vec::new());
    }
    let uncovered: Vec<(u64, Option<String>)> = {
        let mut stmt = tx
            .prepare_cached(
                "SELECT seq, agent FROM messages INDEXED BY messages_pending \
                 WHERE thread = ?1 AND state = 'pending' AND seq > ?2 ORDER BY seq",
            )
            .map_err(db)?;
        let rows = stmt
            .query_map(params![thread, clamp(marks.followed)], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .map_err(db)?;
        rows.collect::<Result<_, _>>().map_err(db)?
    };
    let default = default_agent.or(t.last_agent.as_deref());
    let targets = follow_up_targets(
        reopened
            .iter()
            .chain(&uncovered)
            .map(|(seq, agent)| (*seq, agent.as_deref())),
        default,
    );
    let mut ids = Vec::with_capacity(targets.len());
    // One window per (thread, key): only a lone follow-up waits in the inbox's.
    let window = window.filter(|_| targets.len() == 1);
    for (agent, first, last) in targets {
        let id = uuid::Uuid::now_v7().to_string();
        let mut new = follow_up_dispatch(&agent, thread, first, last, stopped);
        new.debounce = window.map(follow_up_window);
        insert_queued(tx, &id, &new, now)?;
        ids.push(id);
    }
    marks.followed = marks.latest;
    save_inbox(tx, thread, marks)?;
    Ok(ids)
}
