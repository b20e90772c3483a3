//! The mailbox operations of the embedded backend; each is one transaction (see the parent
//! module for the schema and [`lanes`](super::lanes) for the scheduling tables). Every holder,
//! claim and reclaim decision is the store's rules' (`store::rules`); this file reads what they
//! need and writes what they decide.

use std::sync::Arc;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::Notify;

use super::claim::{claim_picked, next_lane};
use super::effects::{self, Known, apply_interrupt, store_reclaim, store_superseded};
use super::lanes::{
    ensure_thread, insert_queued, promote_due, release_thread, store_claimed, thread_row,
};
use super::rows::{self, COLUMNS, ROW_COLUMNS, db};
use super::writer::in_savepoint;
use super::{EmbeddedStore, MAX_VALUE, MAX_VALUE_WHY, TxError};
use crate::store::check_size;
use crate::store::limits::{ClaimRequest, Gated};
use crate::store::model::{
    Dispatch, DispatchRow, Interrupt, ListFilter, NewDispatch, Status, StatusCount,
};
use crate::store::rules::{
    self, Effects, Holder, HolderOp, SupersedeClaimed, Take, WaitpointsSeen, clamp, lease_live,
    same_content,
};
use crate::store::{Mailbox, StoreError, StoreResult};

impl EmbeddedStore {
    /// `claim`, also recording the start when `start` is set.
    async fn claim_inner(
        &self,
        agent: &str,
        consumer: &str,
        lease_ms: u64,
        start: bool,
    ) -> StoreResult<Option<Dispatch>> {
        let agent = agent.to_owned();
        let consumer = consumer.to_owned();
        self.write(move |tx, now| {
            promote_due(tx, now)?;
            let mut pick = |tx: &Connection| next_lane(tx, &agent);
            Ok(
                claim_picked(tx, &agent, &consumer, lease_ms, start, now, None, &mut pick)?
                    .map(|(d, _)| d),
            )
        })
        .await
    }

    /// A holder operation: check the claim as the rules say, apply `op` to a live holder's
    /// record, store it and keep the thread's scheduling state in step.
    async fn holder_write(&self, id: &str, token: &str, op: HolderOp) -> StoreResult<Dispatch> {
        let (id, token) = (id.to_owned(), token.to_owned());
        let out = self
            .write(move |tx, now| holder_tx(tx, now, &id, &token, op))
            .await;
        self.after_holder(out)
    }

    /// What follows a holder write once it is committed: the wakes of its effects (and the
    /// claimers' after a stale epoch).
    fn after_holder(&self, out: StoreResult<(Dispatch, Effects)>) -> StoreResult<Dispatch> {
        match out {
            Ok((d, e)) => {
                self.woken(&d.thread, e);
                Ok(d)
            }
            Err(e) => {
                if matches!(e, StoreError::StaleEpoch { .. }) {
                    self.signal();
                }
                Err(e)
            }
        }
    }
}

/// A holder operation in the write transaction: checks the claim as the rules say, applies
/// `op` to a live holder's record, stores it and keeps the thread's scheduling state in step.
/// Returns the record and the effects of its change.
fn holder_tx(
    tx: &Connection,
    now: u64,
    id: &str,
    token: &str,
    op: HolderOp,
) -> Result<(Dispatch, Effects), TxError> {
    let settles = op.settles();
    let row = rows::load(tx, id)?;
    let t = match &row {
        Some(row) => thread_row(tx, &row.dispatch.thread)?,
        None => Default::default(),
    };
    let made = row.as_ref().map_or(0, |row| row.waitpoints);
    let found = row.as_ref().map(rows::StoredRow::found);
    match rules::check_holder_op(found, id, token, &op, t.epoch, now) {
        Holder::Repeat(d) => Ok((d, Effects::NONE)),
        Holder::Refuse(e) => Err(TxError::Abort(e)),
        Holder::Supersede {
            record,
            token,
            error,
        } => {
            store_superseded(tx, Status::Claimed, &record, Some(&token))?;
            Err(TxError::Commit(error))
        }
        Holder::Live(mut d) => {
            // A suspend is decided with the dispatch's waitpoints (none when it made none).
            let seen = if op.reads_waitpoints() && made > 0 {
                super::waitpoints::seen(tx, &d.id)?
            } else {
                WaitpointsSeen::default()
            };
            let ready = op.apply(&mut d, now, seen).map_err(TxError::Abort)?;
            let settled = settles.map(|op| (token, op.as_str()));
            rows::store(tx, &d, ready, settled)?;
            // The row's waitpoint counter and the thread row's inbox marks, read above (this
            // write changes neither), spare the effects' statements when there is nothing to
            // end or answer.
            let e = rules::effects(Status::Claimed, d.status);
            let known = Known {
                waitpoints: Some(made),
                inbox_pending: Some(t.inbox.pending),
            };
            effects::apply(tx, &d, e, known, now)?;
            Ok((d, e))
        }
    }
}

#[async_trait]
impl Mailbox for EmbeddedStore {
    async fn enqueue(&self, new: NewDispatch) -> StoreResult<Dispatch> {
        new.validate().map_err(StoreError::Invalid)?;
        check_size("payload", &new.payload, MAX_VALUE, MAX_VALUE_WHY)?;
        let id = new
            .id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let out = self
            .write(move |tx, now| {
                if let Some(existing) = rows::load(tx, &id)? {
                    return if same_content(&existing.dispatch, &new) {
                        Ok((existing.dispatch, false))
                    } else {
                        Err(StoreError::Duplicate { id, holder: None }.into())
                    };
                }
                if let Some(spec) = &new.debounce
                    && let Some(open) = super::window::open_window(tx, &new.thread, &spec.key)?
                {
                    return Ok((super::window::join(tx, open, &id, &new, now)?, true));
                }
                if let Some(key) = &new.dedupe_key {
                    let holder: Option<String> = tx
                        .prepare_cached(
                            "SELECT id FROM dispatches INDEXED BY dispatches_live_dedupe \
                             WHERE thread = ?1 AND dedupe_key = ?2 \
                         AND (status = 'queued' OR status = 'claimed' OR status = 'waiting') LIMIT 1",
                        )
                        .map_err(db)?
                        .query_row(params![new.thread, key], |row| row.get(0))
                        .optional()
                        .map_err(db)?;
                    if let Some(holder) = holder {
                        return Err(StoreError::Duplicate {
                            id,
                            holder: Some(holder),
                        }
                        .into());
                    }
                }
                Ok((insert_queued(tx, &id, &new, now)?, true))
            })
            .await?;
        if out.1 {
            self.signal();
            self.inner.watches.notify(&out.0.thread);
        }
        Ok(out.0)
    }

    async fn claim(
        &self,
        agent: &str,
        consumer: &str,
        lease_ms: u64,
    ) -> StoreResult<Option<Dispatch>> {
        self.claim_inner(agent, consumer, lease_ms, false).await
    }

    async fn claim_started(
        &self,
        agent: &str,
        consumer: &str,
        lease_ms: u64,
    ) -> StoreResult<Option<Dispatch>> {
        self.claim_inner(agent, consumer, lease_ms, true).await
    }

    async fn claim_dispatch(
        &self,
        id: &str,
        consumer: &str,
        lease_ms: u64,
    ) -> StoreResult<Option<Dispatch>> {
        let id = id.to_owned();
        let consumer = consumer.to_owned();

        let out = self
            .write(move |tx, now| {
                let id = id.as_str();
                let consumer = consumer.as_str();

                let Some(row) = rows::load(tx, id)? else {
                    return Ok((None, false));
                };
                let d = row.dispatch;
                if d.status != Status::Queued {
                    return Ok((None, false));
                }
                let t = thread_row(tx, &d.thread)?;
                if rules::stale(&d, t.epoch) {
                    let d = rules::superseded(d, now, crate::store::REASON_STALE_EPOCH);
                    store_superseded(tx, Status::Queued, &d, None)?;
                    return Ok((None, true));
                }
                let mut reclaimed = false;
                if let Some(holder) = &t.holder {
                    match rows::load(tx, holder)?.map(|row| row.dispatch) {
                        // A waiting dispatch keeps its thread's turn.
                        Some(h) if h.status == Status::Waiting => return Ok((None, false)),
                        Some(h) if h.status == Status::Claimed => {
                            if lease_live(&h, now) {
                                return Ok((None, false));
                            }
                            store_reclaim(tx, rules::reclaim(h, t.epoch, now), now)?;
                            reclaimed = true;
                        }
                        // The holder column points at a settled record: free the thread.
                        _ => release_thread(tx, &d.thread, holder)?,
                    }
                }
                // Re-read: reclaiming the old holder may have changed this record's lane.
                let Some(row) = rows::load(tx, id)? else {
                    return Ok((None, reclaimed));
                };
                let log = super::claim::log_from(tx, &row.dispatch)?;
                match rules::take(row.dispatch, (t.epoch, log), consumer, lease_ms, now, false) {
                    Take::Claimed(d) => {
                        store_claimed(tx, &d)?;
                        Ok((Some(d), reclaimed))
                    }
                    Take::Stale(d) => {
                        store_superseded(tx, Status::Queued, &d, None)?;
                        Ok((None, true))
                    }
                }
            })
            .await?;
        if out.1 {
            self.signal();
        }
        Ok(out.0)
    }

    async fn hold(&self, id: &str, token: &str, op: HolderOp) -> StoreResult<Dispatch> {
        op.check_output(MAX_VALUE, MAX_VALUE_WHY)?;
        self.holder_write(id, token, op).await
    }

    async fn claim_gated(&self, req: &ClaimRequest<'_>) -> StoreResult<Gated> {
        self.claim_gated_inner(req).await
    }

    /// One writer operation for both: the holder's write and the claim each run in a
    /// savepoint of their own inside it, so either may fail alone, and both commit together.
    async fn hold_and_claim(
        &self,
        id: &str,
        token: &str,
        op: HolderOp,
        next: &ClaimRequest<'_>,
    ) -> (StoreResult<Dispatch>, StoreResult<Gated>) {
        if let Err(e) = op.check_output(MAX_VALUE, MAX_VALUE_WHY) {
            return (Err(e), self.claim_gated_inner(next).await);
        }
        let (id, token) = (id.to_owned(), token.to_owned());
        let claim = super::limits::OwnedClaim::of(next);
        let out = self
            .write(move |tx, now| {
                let done = in_savepoint(tx, |tx| holder_tx(tx, now, &id, &token, op))?;
                let next = in_savepoint(tx, |tx| claim.run(tx, now))?;
                Ok((done, next))
            })
            .await;
        match out {
            Ok((done, next)) => (self.after_holder(done), next),
            Err(e) => (Err(e.clone()), Err(e)),
        }
    }

    async fn cancel(&self, id: &str) -> StoreResult<Option<Dispatch>> {
        let id = id.to_owned();

        let out = self
            .write(move |tx, now| {
                let id = id.as_str();

                let Some(row) = rows::load(tx, id)? else {
                    return Ok(None);
                };
                let mut d = row.dispatch;
                let before = d.status;
                if !before.can_cancel() {
                    return Ok(None);
                }
                rules::terminate(&mut d, Status::Cancelled, now, None);
                rows::store(tx, &d, false, None)?;
                // A waiting dispatch held its thread: the thread's other lanes may run now.
                let e = rules::effects(before, d.status);
                let known = Known {
                    waitpoints: Some(row.waitpoints),
                    inbox_pending: None,
                };
                effects::apply(tx, &d, e, known, now)?;
                Ok(Some((d, e)))
            })
            .await?;
        Ok(out.map(|(d, e)| {
            // Claimers wake whatever the dispatch was (as a cancel always did): a cancelled
            // queued one may have been its lane's head, and the next head one a gated claim
            // can take.
            self.woken(
                &d.thread,
                Effects {
                    wake_claimers: true,
                    ..e
                },
            );
            d
        }))
    }

    async fn interrupt(&self, thread: &str, reason: &str) -> StoreResult<Interrupt> {
        let thread_name = thread.to_owned();
        let thread = thread.to_owned();
        let reason = reason.to_owned();
        let out = self
            .write(move |tx, now| {
                ensure_thread(tx, &thread)?;
                Ok(interrupt_in(tx, &thread, &reason, now)?)
            })
            .await?;
        self.woken(&thread_name, out.1);
        Ok(out.0)
    }

    async fn supersede_claimed(
        &self,
        id: &str,
        token: Option<&str>,
        reason: &str,
    ) -> StoreResult<Option<Dispatch>> {
        let id = id.to_owned();
        let token = token.map(str::to_owned);
        let reason = reason.to_owned();

        let out = self
            .write(move |tx, now| {
                let id = id.as_str();
                let token = token.as_deref();
                let reason = reason.as_str();

                let row = rows::load(tx, id)?;
                let found = row.as_ref().map(rows::StoredRow::found);
                match rules::supersede_claimed(found, id, token, reason, now) {
                    SupersedeClaimed::Nothing => Ok(None),
                    SupersedeClaimed::Repeat(d) => Ok(Some(d)),
                    SupersedeClaimed::Refuse(e) => Err(e.into()),
                    SupersedeClaimed::Supersede { record, token } => {
                        store_superseded(tx, Status::Claimed, &record, Some(&token))?;
                        Ok(Some(record))
                    }
                }
            })
            .await?;
        if out.is_some() {
            self.signal();
        }
        Ok(out)
    }

    async fn reclaim_expired(&self, now: u64, limit: usize) -> StoreResult<Vec<Dispatch>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let out = self
            .write(move |tx, _| {
                // The index finds the candidates; the rules decide each one (and leave a
                // record alone whose lease turns out live).
                let expired = rows::query(
                    tx,
                    &format!(
                        "SELECT {COLUMNS} FROM dispatches INDEXED BY dispatches_leases \
                     WHERE status = 'claimed' AND lease_until < ?1 \
                     ORDER BY lease_until, id LIMIT ?2"
                    ),
                    &[&clamp(now), &limit],
                )?;
                let mut out = Vec::new();
                for d in expired {
                    let thread_epoch = thread_row(tx, &d.thread)?.epoch;
                    if let Some(d) = store_reclaim(tx, rules::reclaim(d, thread_epoch, now), now)? {
                        out.push(d);
                    }
                }
                Ok(out)
            })
            .await?;
        if !out.is_empty() {
            self.signal();
        }
        Ok(out)
    }

    async fn purge_terminal(&self, older_than: u64) -> StoreResult<usize> {
        self.write(move |tx, now| {
            // Streamed deltas go when they expire, whatever became of their dispatch.
            super::deltas::delete_expired(tx, now)?;
            super::limits::forget_idle_keys(tx)?;
            // A purged dispatch takes its waitpoints and its journal with it (T16).
            let purged: Vec<(String, u32)> = {
                let mut stmt = tx
                    .prepare_cached(
                        "DELETE FROM dispatches INDEXED BY dispatches_completed \
                         WHERE completed_at IS NOT NULL AND completed_at < ?1 \
                         AND status IN ('acked', 'cancelled', 'superseded', 'dead_letter') \
                         RETURNING id, waitpoints",
                    )
                    .map_err(db)?;
                let rows = stmt
                    .query_map(params![clamp(older_than)], |row| {
                        Ok((row.get(0)?, row.get(1)?))
                    })
                    .map_err(db)?;
                rows.collect::<Result<_, _>>().map_err(db)?
            };
            for (id, made) in &purged {
                if *made > 0 {
                    super::waitpoints::delete_waitpoints(tx, id)?;
                }
                super::journal::delete_journal(tx, id)?;
            }
            Ok(purged.len())
        })
        .await
    }

    async fn load(&self, id: &str) -> StoreResult<Option<Dispatch>> {
        let id = id.to_owned();

        self.read(move |tx| {
            let id = id.as_str();
            Ok(rows::load(tx, id)?.map(|row| row.dispatch))
        })
        .await
    }

    async fn list(&self, filter: &ListFilter) -> StoreResult<Vec<Dispatch>> {
        let filter = filter.clone();
        self.read(move |tx| {
            let (sql, args) = list_query(&filter, COLUMNS);
            let args: Vec<&dyn rusqlite::ToSql> = args.iter().map(|a| a.as_ref()).collect();
            rows::query(tx, &sql, &args)
        })
        .await
    }

    async fn list_rows(&self, filter: &ListFilter) -> StoreResult<Vec<DispatchRow>> {
        let filter = filter.clone();
        self.read(move |tx| {
            let (sql, args) = list_query(&filter, ROW_COLUMNS);
            let args: Vec<&dyn rusqlite::ToSql> = args.iter().map(|a| a.as_ref()).collect();
            rows::query_rows(tx, &sql, &args)
        })
        .await
    }

    async fn counts(&self) -> StoreResult<Vec<StatusCount>> {
        self.read(|tx| count_rows(tx, "")).await
    }

    async fn live_counts(&self) -> StoreResult<Vec<StatusCount>> {
        // Through the `dispatches_live` partial index: as many rows as there is live work.
        self.read(|tx| {
            count_rows(
                tx,
                "WHERE (status = 'queued' OR status = 'claimed' OR status = 'waiting')",
            )
        })
        .await
    }

    async fn list_terminal(&self, limit: usize, offset: usize) -> StoreResult<Vec<Dispatch>> {
        let limit = i64::try_from(rules::page(limit)).unwrap_or(i64::MAX);
        let offset = i64::try_from(offset).unwrap_or(i64::MAX);
        self.read(move |tx| {
            rows::query(
                tx,
                &format!(
                    "SELECT {COLUMNS} FROM dispatches WHERE completed_at IS NOT NULL \
                     AND status IN ('acked', 'cancelled', 'superseded', 'dead_letter') \
                     ORDER BY completed_at, id LIMIT ?1 OFFSET ?2"
                ),
                &[&limit, &offset],
            )
        })
        .await
    }

    async fn thread_epoch(&self, thread: &str) -> StoreResult<u64> {
        let thread = thread.to_owned();

        self.read(move |tx| {
            let thread = thread.as_str();
            Ok(thread_row(tx, thread)?.epoch)
        })
        .await
    }

    async fn queued_threads(&self) -> StoreResult<Vec<String>> {
        self.read(move |tx| {
            let mut stmt = tx
                .prepare_cached(
                    "SELECT DISTINCT thread FROM dispatches INDEXED BY dispatches_live \
                     WHERE (status = 'queued' OR status = 'claimed' OR status = 'waiting') AND status = 'queued' ORDER BY thread",
                )
                .map_err(db)?;
            let rows = stmt
                .query_map([], |row| row.get::<_, String>(0))
                .map_err(db)?;
            rows.collect::<Result<_, _>>().map_err(db)
        })
        .await
    }

    async fn has_live_work(&self) -> StoreResult<bool> {
        self.read(move |tx| {

            Ok(rows::scalar_u64(
                tx,
                "SELECT 1 FROM dispatches INDEXED BY dispatches_live WHERE (status = 'queued' OR status = 'claimed' OR status = 'waiting') LIMIT 1",
                &[],
            )?
            .is_some())
        }).await
    }

    fn work_signal(&self) -> Arc<Notify> {
        self.inner.signal.clone()
    }

    fn max_value(&self) -> u64 {
        MAX_VALUE
    }
}

/// T4 for a whole thread, inside the caller's transaction: bumps the epoch, supersedes the
/// queued and waiting dispatches with `reason` (cancelling the waiting one's waitpoints) and
/// reports the claimed one (still claimed; its next holder write is fenced). The thread's row
/// must exist. Returns what happened and the effects to wake with.
pub(super) fn interrupt_in(
    tx: &Connection,
    thread: &str,
    reason: &str,
    now: u64,
) -> StoreResult<(Interrupt, Effects)> {
    let epoch = tx
        .prepare_cached("UPDATE threads SET epoch = epoch + 1 WHERE thread = ?1 RETURNING epoch")
        .map_err(db)?
        .query_row(params![thread], |row| row.get::<_, u64>(0))
        .map_err(db)?;
    let mut superseded: Vec<String> = {
        let mut stmt = tx
            .prepare_cached(
                "UPDATE dispatches SET status = 'superseded', ready = 0, window_key = NULL, last_error = ?2, \
                 completed_at = ?3, updated_at = ?3 WHERE thread = ?1 \
                 AND status IN ('queued', 'waiting') RETURNING id",
            )
            .map_err(db)?;
        let ids = stmt
            .query_map(params![thread, reason, now], |row| row.get::<_, String>(0))
            .map_err(db)?;
        ids.collect::<Result<_, _>>().map_err(db)?
    };
    let holder = thread_row(tx, thread)?.holder;
    let active = match &holder {
        Some(holder) => rows::load(tx, holder)?
            .map(|row| row.dispatch)
            .filter(|d| d.status == Status::Claimed),
        None => None,
    };
    // A holder that is not claimed was waiting, and is superseded now.
    let waiting = holder.filter(|_| active.is_none());
    let e = apply_interrupt(
        tx,
        thread,
        waiting.as_deref(),
        active.as_ref().map(|d| d.id.as_str()),
        now,
    )?;
    superseded.sort();
    Ok((
        Interrupt {
            epoch,
            active,
            superseded,
        },
        e,
    ))
}

/// The statement of a `list` page selecting `columns`, and its arguments. One statement per
/// shape of filter, so that SQLite walks the index that matches it in list order and stops
/// after a page (keyset paging: no OFFSET to skip).
fn list_query(filter: &ListFilter, columns: &str) -> (String, Vec<Box<dyn rusqlite::ToSql>>) {
    let limit = rules::page(filter.limit);
    let mut clauses: Vec<String> = Vec::new();
    let mut args: Vec<Box<dyn rusqlite::ToSql>> = Vec::new();
    if let Some(thread) = &filter.thread {
        clauses.push("thread = ?".into());
        args.push(Box::new(thread.clone()));
    }
    if let Some(agent) = &filter.agent {
        clauses.push("agent = ?".into());
        args.push(Box::new(agent.clone()));
    }
    if !filter.statuses.is_empty() {
        let marks = vec!["?"; filter.statuses.len()].join(", ");
        clauses.push(format!("status IN ({marks})"));
        for status in &filter.statuses {
            args.push(Box::new(status.as_str()));
        }
    }
    if let Some(after) = &filter.after {
        clauses.push("(priority, created_at, id) > (?, ?, ?)".into());
        args.push(Box::new(i64::from(after.priority)));
        args.push(Box::new(
            i64::try_from(after.created_at).unwrap_or(i64::MAX),
        ));
        args.push(Box::new(after.id.clone()));
    }
    let filter = if clauses.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", clauses.join(" AND "))
    };
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let sql = format!(
        "SELECT {columns} FROM dispatches {filter} \
         ORDER BY priority, created_at, id LIMIT {limit}"
    );
    (sql, args)
}

/// Dispatches by agent and status among the rows `filter` (a `WHERE` clause, or nothing)
/// selects.
fn count_rows(tx: &Connection, filter: &str) -> StoreResult<Vec<StatusCount>> {
    let mut stmt = tx
        .prepare_cached(&format!(
            "SELECT agent, status, count(*) FROM dispatches {filter} \
             GROUP BY agent, status ORDER BY agent, status"
        ))
        .map_err(db)?;
    let mut rows = stmt.query([]).map_err(db)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(db)? {
        let agent: String = row.get(0).map_err(db)?;
        let status: String = row.get(1).map_err(db)?;
        let status = status.parse().map_err(|reason| StoreError::Corrupt {
            key: format!("dispatches of agent {agent}"),
            reason,
        })?;
        out.push(StatusCount {
            agent,
            status,
            count: row.get(2).map_err(db)?,
        });
    }
    Ok(out)
}
