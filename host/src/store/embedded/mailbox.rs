//! The mailbox operations of the embedded backend; each is one transaction (see the parent
//! module for the schema and the scheduling tables).

use std::sync::Arc;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::Notify;

use super::rows::{self, COLUMNS, Row_, db};
use super::{EmbeddedStore, MAX_VALUE, MAX_VALUE_WHY, TxError};
use crate::store::check_size;
use crate::store::model::{
    Claim, Dispatch, Interrupt, ListFilter, NewDispatch, RunResult, Status, StatusCount,
};
use crate::store::rules::{
    clamp, fail_attempt, lease_extended, queued_record, same_content, terminate,
};
use crate::store::{
    Mailbox, REASON_EXPIRED_AFTER_INTERRUPT, REASON_LEASE_EXPIRED_AT_MAX, REASON_STALE_EPOCH,
    StoreError, StoreResult,
};

/// The page size of `list` and `list_terminal` when the caller gives 0.
const DEFAULT_PAGE: usize = 100;

/// Per-thread scheduling state.
struct ThreadRow {
    epoch: u64,
    holder: Option<String>,
    served: u64,
}

fn thread_row(tx: &Connection, thread: &str) -> StoreResult<ThreadRow> {
    let mut stmt = tx
        .prepare_cached("SELECT epoch, holder, served FROM threads WHERE thread = ?1")
        .map_err(db)?;
    let row = stmt
        .query_row(params![thread], |row| {
            Ok(ThreadRow {
                epoch: row.get(0)?,
                holder: row.get(1)?,
                served: row.get(2)?,
            })
        })
        .optional()
        .map_err(db)?;
    Ok(row.unwrap_or(ThreadRow {
        epoch: 0,
        holder: None,
        served: 0,
    }))
}

fn ensure_thread(tx: &Connection, thread: &str) -> StoreResult<()> {
    tx.prepare_cached("INSERT INTO threads (thread) VALUES (?1) ON CONFLICT (thread) DO NOTHING")
        .map_err(db)?
        .execute(params![thread])
        .map_err(db)?;
    Ok(())
}

/// Recomputes the lane of (agent, thread): its best ready dispatch, or no lane.
fn refresh_lane(tx: &Connection, agent: &str, thread: &str) -> StoreResult<()> {
    let head = tx
        .prepare_cached(
            "SELECT id, priority, created_at FROM dispatches INDEXED BY dispatches_lane_heads \
             WHERE agent = ?1 AND thread = ?2 \
             AND status = 'queued' AND ready = 1 ORDER BY priority, created_at, id LIMIT 1",
        )
        .map_err(db)?
        .query_row(params![agent, thread], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, u64>(2)?,
            ))
        })
        .optional()
        .map_err(db)?;
    match head {
        Some((id, priority, created)) => {
            let t = thread_row(tx, thread)?;
            tx.prepare_cached(
                "INSERT INTO lanes (agent, thread, priority, served, created, head, busy) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (agent, thread) DO UPDATE SET \
                 priority = excluded.priority, served = excluded.served, created = excluded.created, \
                 head = excluded.head, busy = excluded.busy",
            )
            .map_err(db)?
            .execute(params![agent, thread, priority, t.served, created, id, t.holder.is_some()])
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

/// Marks the thread as held by `id` and moves it to the back of its priority class.
fn occupy_thread(tx: &Connection, thread: &str, id: &str) -> StoreResult<()> {
    let served = tx
        .prepare_cached(
            "INSERT INTO counters (name, value) VALUES ('served', 1) \
             ON CONFLICT (name) DO UPDATE SET value = value + 1 RETURNING value",
        )
        .map_err(db)?
        .query_row([], |row| row.get::<_, u64>(0))
        .map_err(db)?;
    ensure_thread(tx, thread)?;
    tx.prepare_cached("UPDATE threads SET holder = ?2, served = ?3 WHERE thread = ?1")
        .map_err(db)?
        .execute(params![thread, id, served])
        .map_err(db)?;
    tx.prepare_cached("UPDATE lanes SET busy = 1, served = ?2 WHERE thread = ?1")
        .map_err(db)?
        .execute(params![thread, served])
        .map_err(db)?;
    Ok(())
}

/// Frees the thread if `id` holds it.
fn release_thread(tx: &Connection, thread: &str, id: &str) -> StoreResult<()> {
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

/// Moves delayed dispatches whose time has come into their lanes.
fn promote_due(tx: &Connection, now: u64) -> StoreResult<()> {
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

/// Supersedes a claimed dispatch whose epoch is stale and frees its thread.
fn supersede(
    tx: &Connection,
    mut d: Dispatch,
    now: u64,
    reason: &str,
    settled: Option<(&str, &str)>,
) -> StoreResult<Dispatch> {
    let was_claimed = d.status == Status::Claimed;
    let was_queued = d.status == Status::Queued;
    terminate(&mut d, Status::Superseded, now, Some(reason));
    d.started_at = None;
    d.result = None;
    rows::store(tx, &d, false, settled)?;
    if was_claimed {
        release_thread(tx, &d.thread, &d.id)?;
    }
    if was_queued {
        refresh_lane(tx, &d.agent, &d.thread)?;
    }
    Ok(d)
}

/// What a holder check found.
enum Holder {
    /// The caller holds the live claim.
    Live(Dispatch),
    /// The same token already settled the dispatch with the same operation.
    Repeat(Dispatch),
}

/// Checks, inside the transaction, that `token` holds `id` at a current epoch (SPEC section 2).
/// A stale epoch supersedes the dispatch and fails with `StaleEpoch`, committing the supersede.
fn check_holder(
    tx: &Connection,
    id: &str,
    token: &str,
    settle_op: Option<&str>,
    now: u64,
) -> Result<Holder, TxError> {
    let Some(Row_ {
        dispatch,
        settled_token,
        settled_op,
    }) = rows::load(tx, id)?
    else {
        return Err(StoreError::NotFound { id: id.to_owned() }.into());
    };
    if let Some(op) = settle_op
        && settled_token.as_deref() == Some(token)
        && settled_op.as_deref() == Some(op)
    {
        return Ok(Holder::Repeat(dispatch));
    }
    let Some(claim) = &dispatch.claim else {
        return Err(StoreError::NotClaimed {
            id: id.to_owned(),
            status: dispatch.status,
        }
        .into());
    };
    if claim.token != token {
        return Err(StoreError::LostClaim { id: id.to_owned() }.into());
    }
    let thread_epoch = thread_row(tx, &dispatch.thread)?.epoch;
    if dispatch.epoch < thread_epoch {
        let dispatch_epoch = dispatch.epoch;
        supersede(
            tx,
            dispatch,
            now,
            REASON_STALE_EPOCH,
            Some((token, "supersede")),
        )?;
        return Err(TxError::Commit(StoreError::StaleEpoch {
            id: id.to_owned(),
            dispatch: dispatch_epoch,
            thread: thread_epoch,
        }));
    }
    Ok(Holder::Live(dispatch))
}

/// Claims `d` for `consumer` until `now + lease_ms` and occupies its thread.
fn take(
    tx: &Connection,
    mut d: Dispatch,
    consumer: &str,
    lease_ms: u64,
    now: u64,
    start: bool,
) -> StoreResult<Dispatch> {
    d.status = Status::Claimed;
    if start {
        d.started_at = Some(now);
    }
    d.claim = Some(Claim {
        token: uuid::Uuid::now_v7().to_string(),
        claimed_by: consumer.to_owned(),
        lease_until: clamp(now.saturating_add(lease_ms)),
    });
    d.updated_at = now;
    rows::store(tx, &d, false, None)?;
    occupy_thread(tx, &d.thread, &d.id)?;
    refresh_lane(tx, &d.agent, &d.thread)?;
    Ok(d)
}

/// Reclaims one expired claim (T12/T13), or supersedes it when its thread moved on.
/// Returns the record when it was requeued or dead-lettered.
fn reclaim_one(tx: &Connection, mut d: Dispatch, now: u64) -> StoreResult<Option<Dispatch>> {
    let thread_epoch = thread_row(tx, &d.thread)?.epoch;
    if d.epoch < thread_epoch {
        supersede(tx, d, now, REASON_EXPIRED_AFTER_INTERRUPT, None)?;
        return Ok(None);
    }
    let ready = fail_attempt(&mut d, now, now, None, REASON_LEASE_EXPIRED_AT_MAX);
    // The abandoned run's projection goes with its lease, whether requeued or dead-lettered.
    d.started_at = None;
    d.result = None;
    rows::store(tx, &d, ready, None)?;
    release_thread(tx, &d.thread, &d.id)?;
    refresh_lane(tx, &d.agent, &d.thread)?;
    Ok(Some(d))
}

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
            let agent = agent.as_str();
            let consumer = consumer.as_str();

            promote_due(tx, now)?;
            // A lane whose head turns out unusable is repaired and the pick repeated; the bound
            // only guards against a store that keeps handing back the same broken lane.
            for _ in 0..64 {
                let pick: Option<(String, String)> = tx
                    .prepare_cached(
                        "SELECT thread, head FROM lanes WHERE agent = ?1 AND busy = 0 \
                         ORDER BY priority, served, created LIMIT 1",
                    )
                    .map_err(db)?
                    .query_row(params![agent], |row| Ok((row.get(0)?, row.get(1)?)))
                    .optional()
                    .map_err(db)?;
                let Some((thread, head)) = pick else {
                    return Ok(None);
                };
                let t = thread_row(tx, &thread)?;
                let candidate = rows::load(tx, &head)?.map(|row| row.dispatch);
                match candidate {
                    Some(d) if d.status == Status::Queued && t.holder.is_none() => {
                        if d.epoch < t.epoch {
                            supersede(tx, d, now, REASON_STALE_EPOCH, None)?;
                            continue;
                        }
                        return Ok(Some(take(tx, d, consumer, lease_ms, now, start)?));
                    }
                    _ => {
                        // The lane disagrees with the records (it cannot, short of a bug or a
                        // hand-edited file): rebuild it from them and pick again.
                        tx.prepare_cached("UPDATE lanes SET busy = ?2 WHERE thread = ?1")
                            .map_err(db)?
                            .execute(params![thread, t.holder.is_some()])
                            .map_err(db)?;
                        refresh_lane(tx, agent, &thread)?;
                    }
                }
            }
            Err(StoreError::Contention(format!(
                "claim for agent `{agent}` found no consistent lane"
            ))
            .into())
        })
        .await
    }

    /// A holder operation: check the claim, apply `f`, store the result.
    async fn holder_write(
        &self,
        id: &str,
        token: &str,
        settle_op: Option<&'static str>,
        f: impl FnOnce(&Connection, Dispatch, u64, &str) -> StoreResult<Dispatch> + Send + 'static,
    ) -> StoreResult<Dispatch> {
        let (id, token) = (id.to_owned(), token.to_owned());
        let out = self
            .write(
                move |tx, now| match check_holder(tx, &id, &token, settle_op, now)? {
                    Holder::Repeat(d) => Ok((d, false)),
                    Holder::Live(d) => Ok((f(tx, d, now, &token)?, settle_op.is_some())),
                },
            )
            .await;
        match out {
            Ok((d, settled)) => {
                if settled {
                    self.signal();
                }
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
                if let Some(key) = &new.dedupe_key {
                    let holder: Option<String> = tx
                        .prepare_cached(
                            "SELECT id FROM dispatches WHERE thread = ?1 AND dedupe_key = ?2 \
                         AND status IN ('queued', 'claimed') LIMIT 1",
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
                ensure_thread(tx, &new.thread)?;
                let epoch = thread_row(tx, &new.thread)?.epoch;
                let d = queued_record(&id, &new, epoch, now);
                let available_at = d.available_at;
                let ready = available_at <= now;
                rows::insert(tx, &d, ready)?;
                if ready {
                    refresh_lane(tx, &d.agent, &d.thread)?;
                }
                Ok((d, true))
            })
            .await?;
        if out.1 {
            self.signal();
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
                if d.epoch < t.epoch {
                    supersede(tx, d, now, REASON_STALE_EPOCH, None)?;
                    return Ok((None, true));
                }
                let mut reclaimed = false;
                if let Some(holder) = &t.holder {
                    match rows::load(tx, holder)?.map(|row| row.dispatch) {
                        Some(h) if h.status == Status::Claimed => {
                            let live = h.claim.as_ref().is_some_and(|c| c.lease_until >= now);
                            if live {
                                return Ok((None, false));
                            }
                            reclaim_one(tx, h, now)?;
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
                Ok((
                    Some(take(tx, row.dispatch, consumer, lease_ms, now, false)?),
                    reclaimed,
                ))
            })
            .await?;
        if out.1 {
            self.signal();
        }
        Ok(out.0)
    }

    async fn extend_lease(&self, id: &str, token: &str, extension_ms: u64) -> StoreResult<bool> {
        let out = self
            .holder_write(id, token, None, move |tx, mut d, now, _| {
                if let Some(claim) = &mut d.claim {
                    claim.lease_until = clamp(now.saturating_add(extension_ms));
                }
                d.updated_at = now;
                rows::store(tx, &d, false, None)?;
                Ok(d)
            })
            .await;
        lease_extended(out)
    }

    async fn record_start(&self, id: &str, token: &str) -> StoreResult<Dispatch> {
        self.holder_write(id, token, None, move |tx, mut d, now, _| {
            d.started_at = Some(now);
            d.result = None;
            d.updated_at = now;
            rows::store(tx, &d, false, None)?;
            Ok(d)
        })
        .await
    }

    async fn record_result(
        &self,
        id: &str,
        token: &str,
        result: RunResult,
    ) -> StoreResult<Dispatch> {
        check_size("output", &result.output, MAX_VALUE, MAX_VALUE_WHY)?;
        self.holder_write(id, token, None, move |tx, mut d, now, _| {
            d.result = Some(result);
            d.updated_at = now;
            rows::store(tx, &d, false, None)?;
            Ok(d)
        })
        .await
    }

    async fn ack(&self, id: &str, token: &str) -> StoreResult<Dispatch> {
        self.holder_write(id, token, Some("ack"), move |tx, mut d, now, token| {
            terminate(&mut d, Status::Acked, now, None);
            rows::store(tx, &d, false, Some((token, "ack")))?;
            release_thread(tx, &d.thread, &d.id)?;
            Ok(d)
        })
        .await
    }

    async fn nack(
        &self,
        id: &str,
        token: &str,
        retry_at: u64,
        error: &str,
    ) -> StoreResult<Dispatch> {
        let error = error.to_owned();
        self.holder_write(id, token, Some("nack"), move |tx, mut d, now, token| {
            let ready = fail_attempt(
                &mut d,
                now,
                retry_at,
                Some(error.as_str()),
                REASON_LEASE_EXPIRED_AT_MAX,
            );
            rows::store(tx, &d, ready, Some((token, "nack")))?;
            release_thread(tx, &d.thread, &d.id)?;
            refresh_lane(tx, &d.agent, &d.thread)?;
            Ok(d)
        })
        .await
    }

    async fn dead_letter(&self, id: &str, token: &str, error: &str) -> StoreResult<Dispatch> {
        let error = error.to_owned();
        self.holder_write(
            id,
            token,
            Some("dead_letter"),
            move |tx, mut d, now, token| {
                terminate(&mut d, Status::DeadLetter, now, Some(error.as_str()));
                rows::store(tx, &d, false, Some((token, "dead_letter")))?;
                release_thread(tx, &d.thread, &d.id)?;
                Ok(d)
            },
        )
        .await
    }

    async fn complete(&self, id: &str, token: &str, result: RunResult) -> StoreResult<Dispatch> {
        check_size("output", &result.output, MAX_VALUE, MAX_VALUE_WHY)?;
        self.holder_write(id, token, Some("ack"), move |tx, mut d, now, token| {
            d.result = Some(result);
            terminate(&mut d, Status::Acked, now, None);
            rows::store(tx, &d, false, Some((token, "ack")))?;
            release_thread(tx, &d.thread, &d.id)?;
            Ok(d)
        })
        .await
    }

    async fn cancel(&self, id: &str) -> StoreResult<Option<Dispatch>> {
        let id = id.to_owned();

        self.write(move |tx, now| {
            let id = id.as_str();

            let Some(row) = rows::load(tx, id)? else {
                return Ok(None);
            };
            let mut d = row.dispatch;
            if d.status != Status::Queued {
                return Ok(None);
            }
            terminate(&mut d, Status::Cancelled, now, None);
            rows::store(tx, &d, false, None)?;
            refresh_lane(tx, &d.agent, &d.thread)?;
            Ok(Some(d))
        })
        .await
    }

    async fn interrupt(&self, thread: &str, reason: &str) -> StoreResult<Interrupt> {
        let thread = thread.to_owned();
        let reason = reason.to_owned();

        let out = self.write(move |tx, now| {
let thread = thread.as_str();
let reason = reason.as_str();

            ensure_thread(tx, thread)?;
            let epoch = tx
                .prepare_cached("UPDATE threads SET epoch = epoch + 1 WHERE thread = ?1 RETURNING epoch")
                .map_err(db)?
                .query_row(params![thread], |row| row.get::<_, u64>(0))
                .map_err(db)?;
            let superseded: Vec<String> = {
                let mut stmt = tx
                    .prepare_cached(
                        "UPDATE dispatches SET status = 'superseded', ready = 0, last_error = ?2, \
                         completed_at = ?3, updated_at = ?3 WHERE thread = ?1 AND status = 'queued' RETURNING id",
                    )
                    .map_err(db)?;
                let ids = stmt
                    .query_map(params![thread, reason, now], |row| row.get::<_, String>(0))
                    .map_err(db)?;
                ids.collect::<Result<_, _>>().map_err(db)?
            };
            tx.prepare_cached("DELETE FROM lanes WHERE thread = ?1")
                .map_err(db)?
                .execute(params![thread])
                .map_err(db)?;
            let active = match thread_row(tx, thread)?.holder {
                Some(holder) => rows::load(tx, &holder)?
                    .map(|row| row.dispatch)
                    .filter(|d| d.status == Status::Claimed),
                None => None,
            };
            let mut superseded = superseded;
            superseded.sort();
            Ok(Interrupt {
                epoch,
                active,
                superseded,
            })
        }).await?;
        self.signal();
        Ok(out)
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

                let Some(row) = rows::load(tx, id)? else {
                    return Ok(None);
                };
                if let Some(token) = token
                    && row.settled_token.as_deref() == Some(token)
                    && row.settled_op.as_deref() == Some("supersede")
                {
                    return Ok(Some(row.dispatch));
                }
                let d = row.dispatch;
                let Some(claim) = &d.claim else {
                    return Ok(None);
                };
                if let Some(token) = token
                    && claim.token != token
                {
                    return Err(StoreError::LostClaim { id: id.to_owned() }.into());
                }
                let settled_token = claim.token.clone();
                Ok(Some(supersede(
                    tx,
                    d,
                    now,
                    reason,
                    Some((&settled_token, "supersede")),
                )?))
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
                    if let Some(d) = reclaim_one(tx, d, now)? {
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
        self.write(move |tx, _| {
            let purged = tx
                .prepare_cached(
                    "DELETE FROM dispatches INDEXED BY dispatches_completed \
                     WHERE completed_at IS NOT NULL AND completed_at < ?1 \
                     AND status IN ('acked', 'cancelled', 'superseded', 'dead_letter')",
                )
                .map_err(db)?
                .execute(params![clamp(older_than)])
                .map_err(db)?;
            Ok(purged)
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

        let limit = if filter.limit == 0 {
            DEFAULT_PAGE
        } else {
            filter.limit
        };
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let offset = i64::try_from(filter.offset).unwrap_or(i64::MAX);
        let statuses: Vec<&str> = filter.statuses.iter().map(|s| s.as_str()).collect();
        let statuses_json = serde_json::to_string(&statuses).unwrap_or_else(|_| "[]".into());
        self.read(move |tx| {
let filter = &filter;

            rows::query(
                tx,
                &format!(
                    "SELECT {COLUMNS} FROM dispatches WHERE (?1 IS NULL OR thread = ?1) AND (?2 IS NULL OR agent = ?2) \
                     AND (?3 = '[]' OR status IN (SELECT value FROM json_each(?3))) \
                     ORDER BY priority, created_at, id LIMIT ?4 OFFSET ?5"
                ),
                &[&filter.thread, &filter.agent, &statuses_json, &limit, &offset],
            )
        }).await
    }

    async fn counts(&self) -> StoreResult<Vec<StatusCount>> {
        self.read(move |tx| {

            let mut stmt = tx
                .prepare_cached("SELECT agent, status, count(*) FROM dispatches GROUP BY agent, status ORDER BY agent, status")
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
        }).await
    }

    async fn list_terminal(&self, limit: usize, offset: usize) -> StoreResult<Vec<Dispatch>> {
        let limit =
            i64::try_from(if limit == 0 { DEFAULT_PAGE } else { limit }).unwrap_or(i64::MAX);
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
                     WHERE status IN ('queued', 'claimed') AND status = 'queued' ORDER BY thread",
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
                "SELECT 1 FROM dispatches INDEXED BY dispatches_live WHERE status IN ('queued', 'claimed') LIMIT 1",
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
