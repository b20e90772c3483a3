//! The scheduling tables of the embedded backend (`threads`, `lanes`, `counters`; see the
//! parent module) and the writes that keep them in step with the records: a claim occupies its
//! thread, a settlement or supersede releases it, and every change to what is queued refreshes
//! the thread's lane. The decisions themselves are the store's rules (`store::rules`); these
//! functions only apply them.

use rusqlite::{Connection, OptionalExtension, params};

use super::rows::{self, db};
use crate::store::StoreResult;
use crate::store::inbox::InboxMarks;
use crate::store::model::{Dispatch, NewDispatch};
use crate::store::rules::{clamp, queued_record};

/// Per-thread scheduling state.
#[derive(Debug, Default)]
pub(super) struct ThreadRow {
    pub epoch: u64,
    pub holder: Option<String>,
    pub served: u64,
    /// The inbox watermarks (the contract, section 9.1).
    pub inbox: InboxMarks,
    /// The agent of the dispatch claimed most recently on the thread.
    pub last_agent: Option<String>,
}

pub(super) fn thread_row(tx: &Connection, thread: &str) -> StoreResult<ThreadRow> {
    let mut stmt = tx
        .prepare_cached(
            "SELECT epoch, holder, served, inbox_latest, inbox_pending, inbox_followed, last_agent \
             FROM threads WHERE thread = ?1",
        )
        .map_err(db)?;
    let row = stmt
        .query_row(params![thread], |row| {
            Ok(ThreadRow {
                epoch: row.get(0)?,
                holder: row.get(1)?,
                served: row.get(2)?,
                inbox: InboxMarks {
                    latest: row.get(3)?,
                    pending: row.get(4)?,
                    followed: row.get(5)?,
                },
                last_agent: row.get(6)?,
            })
        })
        .optional()
        .map_err(db)?;
    Ok(row.unwrap_or_default())
}

pub(super) fn ensure_thread(tx: &Connection, thread: &str) -> StoreResult<()> {
    tx.prepare_cached("INSERT INTO threads (thread) VALUES (?1) ON CONFLICT (thread) DO NOTHING")
        .map_err(db)?
        .execute(params![thread])
        .map_err(db)?;
    Ok(())
}

/// Recomputes the lane of (agent, thread): its best ready dispatch, or no lane.
pub(super) fn refresh_lane(tx: &Connection, agent: &str, thread: &str) -> StoreResult<()> {
    refresh_lane_as(tx, agent, thread, None)
}

/// [`refresh_lane`], with the thread's `served` and whether it is held when the caller has
/// just written them (saving the read of the thread's row).
fn refresh_lane_as(
    tx: &Connection,
    agent: &str,
    thread: &str,
    known: Option<(u64, bool)>,
) -> StoreResult<()> {
    let head = tx
        .prepare_cached(
            "SELECT id, priority, created_at, concurrency_key FROM dispatches \
             INDEXED BY dispatches_lane_heads \
             WHERE agent = ?1 AND thread = ?2 \
             AND status = 'queued' AND ready = 1 ORDER BY priority, created_at, id LIMIT 1",
        )
        .map_err(db)?
        .query_row(params![agent, thread], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, u64>(2)?,
                row.get::<_, Option<String>>(3)?,
            ))
        })
        .optional()
        .map_err(db)?;
    match head {
        Some((id, priority, created, key)) => {
            // A key with a lane has a turn (section 13.2, step 4): a new one enters at 0.
            if let Some(key) = key.as_deref().filter(|k| !k.is_empty()) {
                super::turns::enter(tx, agent, key)?;
            }
            let (served, busy) = match known {
                Some(known) => known,
                None => {
                    let t = thread_row(tx, thread)?;
                    (t.served, t.holder.is_some())
                }
            };
            tx.prepare_cached(
                "INSERT INTO lanes (agent, thread, priority, served, created, head, busy, ckey) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT (agent, thread) DO UPDATE SET \
                 priority = excluded.priority, served = excluded.served, created = excluded.created, \
                 head = excluded.head, busy = excluded.busy, ckey = excluded.ckey",
            )
            .map_err(db)?
            .execute(params![
                agent,
                thread,
                priority,
                served,
                created,
                id,
                busy,
                key.unwrap_or_default()
            ])
            .map_err(db)?;
        }
        None => {
            tx.prepare_cached("DELETE FROM lanes WHERE agent = ?1 AND thread = ?2")
                .map_err(db)?
                .execute(params![agent, thread])
                .map_err(db)?;
        }
    }
    Ok(())
}

/// Marks the thread as held by `id` (of `agent`, now its last agent) and moves it to the back
/// of its priority class: the thread's row, and the lanes of the thread's other agents (the
/// caller refreshes `agent`'s own). Returns the thread's new `served`.
fn occupy_thread(tx: &Connection, thread: &str, id: &str, agent: &str) -> StoreResult<u64> {
    let served = tx
        .prepare_cached(
            "INSERT INTO counters (name, value) VALUES ('served', 1) \
             ON CONFLICT (name) DO UPDATE SET value = value + 1 RETURNING value",
        )
        .map_err(db)?
        .query_row([], |row| row.get::<_, u64>(0))
        .map_err(db)?;
    tx.prepare_cached(
        "INSERT INTO threads (thread, holder, served, last_agent) VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT (thread) DO UPDATE SET holder = excluded.holder, served = excluded.served, \
         last_agent = excluded.last_agent",
    )
    .map_err(db)?
    .execute(params![thread, id, served, agent])
    .map_err(db)?;
    tx.prepare_cached("UPDATE lanes SET busy = 1, served = ?2 WHERE thread = ?1 AND agent <> ?3")
        .map_err(db)?
        .execute(params![thread, served, agent])
        .map_err(db)?;
    Ok(served)
}

/// Frees the thread if `id` holds it.
pub(super) fn release_thread(tx: &Connection, thread: &str, id: &str) -> StoreResult<()> {
    let changed = tx
        .prepare_cached("UPDATE threads SET holder = NULL WHERE thread = ?1 AND holder = ?2")
        .map_err(db)?
        .execute(params![thread, id])
        .map_err(db)?;
    if changed > 0 {
        tx.prepare_cached("UPDATE lanes SET busy = 0 WHERE thread = ?1")
            .map_err(db)?
            .execute(params![thread])
            .map_err(db)?;
    }
    Ok(())
}

/// Takes a queued dispatch that is not due after all (the clock stepped back) out of its lane,
/// back to waiting for [`promote_due`].
pub(super) fn demote(tx: &Connection, d: &Dispatch) -> StoreResult<()> {
    tx.prepare_cached("UPDATE dispatches SET ready = 0 WHERE id = ?1")
        .map_err(db)?
        .execute(params![d.id])
        .map_err(db)?;
    refresh_lane(tx, &d.agent, &d.thread)
}

/// Moves delayed dispatches whose time has come into their lanes.
pub(super) fn promote_due(tx: &Connection, now: u64) -> StoreResult<()> {
    let due: Vec<(String, String, String)> = {
        let mut stmt = tx
            .prepare_cached(
                "SELECT id, agent, thread FROM dispatches INDEXED BY dispatches_delayed \
                 WHERE status = 'queued' AND ready = 0 \
                 AND available_at <= ?1 ORDER BY available_at LIMIT 1000",
            )
            .map_err(db)?;
        let rows = stmt
            .query_map(params![clamp(now)], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?))
            })
            .map_err(db)?;
        rows.collect::<Result<_, _>>().map_err(db)?
    };
    for (id, agent, thread) in &due {
        tx.prepare_cached("UPDATE dispatches SET ready = 1 WHERE id = ?1")
            .map_err(db)?
            .execute(params![id])
            .map_err(db)?;
        refresh_lane(tx, agent, thread)?;
    }
    Ok(())
}

/// Stores a freshly claimed record and occupies its thread.
pub(super) fn store_claimed(tx: &Connection, d: &Dispatch) -> StoreResult<()> {
    rows::store(tx, d, false, None)?;
    let served = occupy_thread(tx, &d.thread, &d.id, &d.agent)?;
    refresh_lane_as(tx, &d.agent, &d.thread, Some((served, true)))
}

/// Stores a new queued dispatch stamped with its thread's epoch (T1's write, after its checks)
/// and puts it in its lane when it is due.
pub(super) fn insert_queued(
    tx: &Connection,
    id: &str,
    new: &NewDispatch,
    now: u64,
) -> StoreResult<Dispatch> {
    ensure_thread(tx, &new.thread)?;
    let epoch = thread_row(tx, &new.thread)?.epoch;
    let d = queued_record(id, new, epoch, now);
    let ready = d.available_at <= now;
    rows::insert(tx, &d, ready)?;
    if ready {
        refresh_lane(tx, &d.agent, &d.thread)?;
    }
    Ok(d)
}
