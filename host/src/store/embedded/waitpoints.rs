//! The waitpoints of the embedded backend (the contract, docs/contract.md, section 10).
//!
//! Waitpoints live in `waitpoints`, one row each, unique by (dispatch, name); a dispatch row's
//! `waitpoints` column counts those it created, so a settlement of a dispatch that never made
//! one (nearly all) costs no extra read. A suspend and a completion are transactions on the
//! one writer thread, so they decide against each other: a completion committed before a
//! suspend is seen by it (the suspend resumes at once), one committed after finds the
//! dispatch waiting and resumes it.

use async_trait::async_trait;
use rusqlite::{Connection, Row, params};

use super::effects::{self, Known, store_superseded};
use super::lanes::thread_row;
use super::rows::{self, db};
use super::{EmbeddedStore, MAX_VALUE, TxError};
use crate::store::model::{Dispatch, Fence, Status};
use crate::store::rules::{self, Fenced, WaitpointsSeen, clamp};
use crate::store::waitpoints::{
    self as wp, BY_TIMEOUT, Completion, Created, MAX_TOKEN_DIGESTS, MAX_WAITPOINTS, NewWaitpoint,
    Settlement, Waitpoint, WaitpointFilter, WaitpointPage, WaitpointState, Waitpoints,
};
use crate::store::{StoreError, StoreResult, check_size};

const COLUMNS: &str = "id, dispatch, thread, agent, name, state, token_digests, metadata, \
    timeout_at, result, settled_by, created_at, created_claim, settled_at";

/// [`COLUMNS`] without the result (`NULL` in its place), and the result's length after them.
const LEAN_COLUMNS: &str = "id, dispatch, thread, agent, name, state, token_digests, metadata, \
    timeout_at, NULL, settled_by, created_at, created_claim, settled_at, length(result)";

/// How many columns [`COLUMNS`] names.
const COLUMN_COUNT: usize = 14;

fn corrupt(id: &str, reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        key: format!("waitpoints/{id}"),
        reason: reason.into(),
    }
}

/// Decodes a row selected with [`COLUMNS`].
fn decode(row: &Row<'_>) -> StoreResult<Waitpoint> {
    let id: String = row.get(0).map_err(|e| corrupt("?", e.to_string()))?;
    let field = |e: rusqlite::Error| corrupt(&id, e.to_string());
    let state: String = row.get(5).map_err(field)?;
    let digests: String = row.get(6).map_err(field)?;
    let metadata: String = row.get(7).map_err(field)?;
    Ok(Waitpoint {
        dispatch: row.get(1).map_err(field)?,
        thread: row.get(2).map_err(field)?,
        agent: row.get(3).map_err(field)?,
        name: row.get(4).map_err(field)?,
        state: state.parse().map_err(|e: String| corrupt(&id, e))?,
        token_digests: serde_json::from_str(&digests)
            .map_err(|e| corrupt(&id, format!("token_digests: {e}")))?,
        metadata: serde_json::from_str(&metadata)
            .map_err(|e| corrupt(&id, format!("metadata: {e}")))?,
        timeout_at: row.get(8).map_err(field)?,
        result: row.get(9).map_err(field)?,
        settled_by: row.get(10).map_err(field)?,
        created_at: row.get(11).map_err(field)?,
        created_claim: row.get(12).map_err(field)?,
        settled_at: row.get(13).map_err(field)?,
        id,
    })
}

fn query(tx: &Connection, sql: &str, args: &[&dyn rusqlite::ToSql]) -> StoreResult<Vec<Waitpoint>> {
    let mut stmt = tx.prepare_cached(sql).map_err(db)?;
    let mut rows = stmt.query(args).map_err(db)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(db)? {
        out.push(decode(row)?);
    }
    Ok(out)
}

fn load(tx: &Connection, id: &str) -> StoreResult<Option<Waitpoint>> {
    Ok(query(
        tx,
        &format!("SELECT {COLUMNS} FROM waitpoints WHERE id = ?1"),
        &[&id],
    )?
    .pop())
}

/// What a suspend reads of `dispatch`'s waitpoints (`rules::WaitpointsSeen`), in one
/// statement: whether one is pending, and the latest settlement of the others.
pub(super) fn seen(tx: &Connection, dispatch: &str) -> StoreResult<WaitpointsSeen> {
    tx.prepare_cached(
        "SELECT coalesce(max(state = 'pending'), 0), \
         max(CASE WHEN state <> 'pending' THEN settled_at END) \
         FROM waitpoints INDEXED BY waitpoints_by_name WHERE dispatch = ?1",
    )
    .map_err(db)?
    .query_row(params![dispatch], |row| {
        Ok(WaitpointsSeen {
            pending: row.get::<_, bool>(0)?,
            last_settled: row.get::<_, Option<u64>>(1)?,
        })
    })
    .map_err(db)
}

/// The waitpoints of `dispatch`, oldest first.
fn of_dispatch(tx: &Connection, dispatch: &str) -> StoreResult<Vec<Waitpoint>> {
    let mut out = query(
        tx,
        &format!(
            "SELECT {COLUMNS} FROM waitpoints INDEXED BY waitpoints_by_name WHERE dispatch = ?1"
        ),
        &[&dispatch],
    )?;
    out.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    Ok(out)
}

fn insert(tx: &Connection, w: &Waitpoint) -> StoreResult<()> {
    let digests = serde_json::to_string(&w.token_digests)
        .map_err(|e| StoreError::Invalid(format!("token digests: {e}")))?;
    let metadata = serde_json::to_string(&w.metadata)
        .map_err(|e| StoreError::Invalid(format!("metadata: {e}")))?;
    tx.prepare_cached(&format!(
        "INSERT INTO waitpoints ({COLUMNS}) VALUES \
         (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"
    ))
    .map_err(db)?
    .execute(params![
        w.id,
        w.dispatch,
        w.thread,
        w.agent,
        w.name,
        w.state.as_str(),
        digests,
        metadata,
        clamp(w.timeout_at),
        w.result,
        w.settled_by,
        clamp(w.created_at),
        w.created_claim,
        w.settled_at.map(clamp),
    ])
    .map_err(db)?;
    Ok(())
}

/// Writes a settled waitpoint's state, result and settlement.
fn save_settled(tx: &Connection, w: &Waitpoint) -> StoreResult<()> {
    tx.prepare_cached(
        "UPDATE waitpoints SET state = ?2, result = ?3, settled_by = ?4, settled_at = ?5 \
         WHERE id = ?1",
    )
    .map_err(db)?
    .execute(params![
        w.id,
        w.state.as_str(),
        w.result,
        w.settled_by,
        w.settled_at.map(clamp)
    ])
    .map_err(db)?;
    Ok(())
}

/// T18: when `dispatch` is waiting, queues it again (one more resume) and frees its thread.
/// Returns whether it resumed.
fn resume_if_waiting(tx: &Connection, dispatch: &str, now: u64) -> StoreResult<bool> {
    let Some(row) = rows::load(tx, dispatch)? else {
        return Ok(false);
    };
    let mut d = row.dispatch;
    if d.status != Status::Waiting {
        return Ok(false);
    }
    wp::resume(&mut d, now);
    rows::store(tx, &d, true, None)?;
    let e = rules::effects(Status::Waiting, d.status);
    effects::apply(tx, &d, e, Known::default(), now)?;
    Ok(true)
}

/// Deletes the waitpoints of a purged dispatch.
pub(super) fn delete_waitpoints(tx: &Connection, dispatch: &str) -> StoreResult<()> {
    tx.prepare_cached("DELETE FROM waitpoints INDEXED BY waitpoints_by_name WHERE dispatch = ?1")
        .map_err(db)?
        .execute(params![dispatch])
        .map_err(db)?;
    Ok(())
}

/// What the cross-process poller compares for a thread: its pending waitpoints.
pub(super) fn pending_on_thread(conn: &Connection, thread: &str) -> rusqlite::Result<u64> {
    conn.prepare_cached(
        "SELECT count(*) FROM waitpoints INDEXED BY waitpoints_by_thread \
         WHERE thread = ?1 AND state = 'pending'",
    )?
    .query_row(params![thread], |row| row.get(0))
}

/// A completion or a cancel (W2, W4) of `id` to `state`, applying a timeout that is due first.
fn settle_one(
    tx: &Connection,
    id: &str,
    state: WaitpointState,
    result: Option<Vec<u8>>,
    by: &str,
    now: u64,
) -> StoreResult<(Settlement, bool)> {
    let Some(mut w) = load(tx, id)? else {
        return Err(StoreError::NotFound { id: id.to_owned() });
    };
    let (state, result, by, settled) = match wp::completion(&w, now) {
        Completion::Settled => return Ok((Settlement::Already(w), false)),
        Completion::TimedOut => (WaitpointState::TimedOut, None, BY_TIMEOUT, false),
        Completion::Complete => (state, result, by, true),
    };
    wp::settle(&mut w, state, result, by, now);
    save_settled(tx, &w)?;
    let resumed = resume_if_waiting(tx, &w.dispatch, now)?;
    Ok((
        if settled {
            Settlement::Settled(w)
        } else {
            Settlement::Already(w)
        },
        resumed,
    ))
}

impl EmbeddedStore {
    /// Wakes after a waitpoint write: the thread's watches, and the workers when a dispatch
    /// became claimable.
    fn waitpoint_changed(&self, thread: &str, resumed: bool) {
        if resumed {
            self.signal();
        }
        self.inner.watches.notify(thread);
    }

    /// A waitpoint settlement (W2, W4) and what it woke.
    async fn settle_waitpoint(
        &self,
        id: &str,
        state: WaitpointState,
        result: Option<Vec<u8>>,
        by: &str,
    ) -> StoreResult<Settlement> {
        let (id, by) = (id.to_owned(), by.to_owned());
        let (settlement, resumed) = self
            .write(move |tx, now| Ok(settle_one(tx, &id, state, result, &by, now)?))
            .await?;
        self.waitpoint_changed(&settlement.waitpoint().thread, resumed);
        Ok(settlement)
    }

    /// The fence check of a waitpoint write: the fenced dispatch's record, claimed live, and
    /// how many waitpoints it created (its row's counter).
    pub(super) fn fenced(
        tx: &Connection,
        fence: &Fence,
        now: u64,
    ) -> Result<(Dispatch, u32), TxError> {
        let row = rows::load(tx, &fence.dispatch)?;
        let made = row.as_ref().map_or(0, |row| row.waitpoints);
        let d = row.map(|row| row.dispatch);
        let (thread, epoch) = match &d {
            Some(d) => (d.thread.clone(), thread_row(tx, &d.thread)?.epoch),
            None => (String::new(), 0),
        };
        match rules::check_fence(d.as_ref(), &thread, fence, epoch, now) {
            Fenced::Live => d.map(|d| (d, made)).ok_or_else(|| {
                TxError::Abort(StoreError::NotFound {
                    id: fence.dispatch.clone(),
                })
            }),
            Fenced::Refuse(e) => Err(TxError::Abort(e)),
            Fenced::Supersede {
                record,
                token,
                error,
            } => {
                store_superseded(tx, Status::Claimed, &record, Some(&token))?;
                Err(TxError::Commit(error))
            }
        }
    }
}

#[async_trait]
impl Waitpoints for EmbeddedStore {
    async fn create_waitpoint(&self, fence: &Fence, new: NewWaitpoint) -> StoreResult<Created> {
        new.validate().map_err(StoreError::Invalid)?;
        let fence = fence.clone();
        let created = self
            .write(move |tx, now| {
                let (d, made) = Self::fenced(tx, &fence, now)?;
                let existing = query(
                    tx,
                    &format!(
                        "SELECT {COLUMNS} FROM waitpoints INDEXED BY waitpoints_by_name \
                         WHERE dispatch = ?1 AND name = ?2"
                    ),
                    &[&d.id, &new.name],
                )?
                .pop();
                if let Some(waitpoint) = existing {
                    return Ok(Created {
                        waitpoint,
                        created: false,
                    });
                }
                if made >= MAX_WAITPOINTS {
                    return Err(StoreError::Limit(format!(
                        "waitpoints: dispatch `{}` has created {made} waitpoints (the limit is {MAX_WAITPOINTS})",
                        d.id
                    ))
                    .into());
                }
                let waitpoint = wp::pending_record(&uuid::Uuid::now_v7().to_string(), &d, &new, now);
                insert(tx, &waitpoint)?;
                tx.prepare_cached("UPDATE dispatches SET waitpoints = waitpoints + 1 WHERE id = ?1")
                    .map_err(db)?
                    .execute(params![d.id])
                    .map_err(db)?;
                Ok(Created {
                    waitpoint,
                    created: true,
                })
            })
            .await;
        match &created {
            Ok(c) if c.created => self.waitpoint_changed(&c.waitpoint.thread, false),
            Err(StoreError::StaleEpoch { .. }) => self.signal(),
            _ => {}
        }
        created
    }

    async fn add_token(&self, fence: &Fence, id: &str, digest: &str) -> StoreResult<bool> {
        let (fence, id, digest) = (fence.clone(), id.to_owned(), digest.to_owned());
        self.write(move |tx, now| {
            let (d, _) = Self::fenced(tx, &fence, now)?;
            let Some(mut w) = load(tx, &id)? else {
                return Ok(false);
            };
            if w.dispatch != d.id || !w.is_pending() || w.token_digests.len() >= MAX_TOKEN_DIGESTS {
                return Ok(false);
            }
            w.token_digests.push(digest);
            let digests = serde_json::to_string(&w.token_digests)
                .map_err(|e| StoreError::Invalid(format!("token digests: {e}")))?;
            tx.prepare_cached("UPDATE waitpoints SET token_digests = ?2 WHERE id = ?1")
                .map_err(db)?
                .execute(params![id, digests])
                .map_err(db)?;
            Ok(true)
        })
        .await
    }

    async fn complete_waitpoint(
        &self,
        id: &str,
        result: Vec<u8>,
        settled_by: &str,
    ) -> StoreResult<Settlement> {
        check_size(
            "result",
            &result,
            MAX_VALUE,
            "a waitpoint's result is a stored value",
        )?;
        self.settle_waitpoint(id, WaitpointState::Completed, Some(result), settled_by)
            .await
    }

    async fn cancel_waitpoint(&self, id: &str, settled_by: &str) -> StoreResult<Settlement> {
        self.settle_waitpoint(id, WaitpointState::Cancelled, None, settled_by)
            .await
    }

    async fn time_out_waitpoints(&self, now: u64, limit: usize) -> StoreResult<Vec<Waitpoint>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let (out, resumed) = self
            .write(move |tx, _| {
                let due = query(
                    tx,
                    &format!(
                        "SELECT {COLUMNS} FROM waitpoints INDEXED BY waitpoints_due \
                         WHERE state = 'pending' AND timeout_at < ?1 ORDER BY timeout_at, id LIMIT ?2"
                    ),
                    &[&clamp(now), &limit],
                )?;
                let mut out = Vec::with_capacity(due.len());
                let mut resumed = false;
                for mut w in due {
                    wp::settle(&mut w, WaitpointState::TimedOut, None, BY_TIMEOUT, now);
                    save_settled(tx, &w)?;
                    resumed |= resume_if_waiting(tx, &w.dispatch, now)?;
                    out.push(w);
                }
                Ok((out, resumed))
            })
            .await?;
        if resumed {
            self.signal();
        }
        for w in &out {
            self.inner.watches.notify(&w.thread);
        }
        Ok(out)
    }

    async fn waitpoint(&self, id: &str) -> StoreResult<Option<Waitpoint>> {
        let id = id.to_owned();
        self.read(move |tx| load(tx, &id)).await
    }

    async fn waitpoints_of(&self, dispatch: &str) -> StoreResult<Vec<Waitpoint>> {
        let dispatch = dispatch.to_owned();
        self.read(move |tx| of_dispatch(tx, &dispatch)).await
    }

    async fn read_waitpoints(
        &self,
        filter: &WaitpointFilter,
        max_bytes: usize,
        results: bool,
    ) -> StoreResult<WaitpointPage> {
        let filter = filter.clone();
        self.read(move |tx| {
            let mut clauses: Vec<&str> = Vec::new();
            let mut args: Vec<Box<dyn rusqlite::ToSql>> = Vec::new();
            // The index that matches the filter's leading column.
            let index = if let Some(dispatch) = &filter.dispatch {
                clauses.push("dispatch = ?");
                args.push(Box::new(dispatch.clone()));
                "INDEXED BY waitpoints_by_name"
            } else if filter.thread.is_some() {
                "INDEXED BY waitpoints_by_thread"
            } else if filter.state.is_some() {
                "INDEXED BY waitpoints_by_state"
            } else {
                ""
            };
            if let Some(thread) = &filter.thread {
                clauses.push("thread = ?");
                args.push(Box::new(thread.clone()));
            }
            if let Some(state) = filter.state {
                clauses.push("state = ?");
                args.push(Box::new(state.as_str()));
            }
            if let Some((at, id)) = &filter.after {
                clauses.push("(created_at, id) > (?, ?)");
                args.push(Box::new(clamp(*at)));
                args.push(Box::new(id.clone()));
            }
            let filter_sql = if clauses.is_empty() {
                String::new()
            } else {
                format!("WHERE {}", clauses.join(" AND "))
            };
            // One row past the page says whether more remain.
            let limit = i64::try_from(filter.page().saturating_add(1)).unwrap_or(i64::MAX);
            // The rows without their results (their lengths instead: SQLite answers `length()`
            // of a blob from the record's header); the results of those that fit, by id.
            let sql = format!(
                "SELECT {LEAN_COLUMNS} FROM waitpoints {index} {filter_sql} \
                 ORDER BY created_at, id LIMIT {limit}"
            );
            let args: Vec<&dyn rusqlite::ToSql> = args.iter().map(|a| a.as_ref()).collect();
            let mut page = WaitpointPage::default();
            let mut held = 0usize;
            let mut with_result = Vec::new();
            {
                let mut stmt = tx.prepare_cached(&sql).map_err(db)?;
                let mut rows = stmt.query(&*args).map_err(db)?;
                while let Some(row) = rows.next().map_err(db)? {
                    let w = decode(row)?;
                    let length: Option<u64> = row
                        .get(COLUMN_COUNT)
                        .map_err(|e| corrupt(&w.id, e.to_string()))?;
                    let length = if results {
                        usize::try_from(length.unwrap_or(0)).unwrap_or(usize::MAX)
                    } else {
                        0
                    };
                    let size = w.held().saturating_add(length);
                    if page.waitpoints.len() >= filter.page()
                        || (!page.waitpoints.is_empty() && held.saturating_add(size) > max_bytes)
                    {
                        page.more = true;
                        break;
                    }
                    held = held.saturating_add(size);
                    if results && length > 0 {
                        with_result.push(page.waitpoints.len());
                    }
                    page.waitpoints.push(w);
                }
            }
            if !with_result.is_empty() {
                let mut stmt = tx
                    .prepare_cached("SELECT result FROM waitpoints WHERE id = ?1")
                    .map_err(db)?;
                for at in with_result {
                    let Some(w) = page.waitpoints.get_mut(at) else {
                        continue;
                    };
                    w.result = stmt
                        .query_row(params![w.id], |row| row.get(0))
                        .map_err(db)?;
                }
            }
            Ok(page)
        })
        .await
    }

    fn max_result(&self) -> u64 {
        MAX_VALUE
    }
}
