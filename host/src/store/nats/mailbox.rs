//! The mailbox operations of the NATS backend. Each decides from the view and writes one
//! message fenced by its thread's tree (see the parent module); the decisions mirror the
//! embedded backend's transactions and share its transition rules (`store::rules`).

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Notify;

use super::keys::{FRAME_OVERHEAD, Key, encode_dispatch, encode_thread};
use super::view::{Record, Stored, ThreadRec, View};
use super::{Expect, GROWTH_ROOM, MAX_BATCH, NatsStore, Plan, Room, Write};
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

/// A write of a dispatch record, fenced by its thread's tree.
pub(super) fn put_dispatch(view: &View, stored: Stored) -> StoreResult<Write> {
    let expect = Expect::Thread(view.thread_seq(&stored.d.thread));
    put_dispatch_expecting(expect, stored)
}

fn put_dispatch_expecting(expect: Expect, mut stored: Stored) -> StoreResult<Write> {
    let (thread, id) = (stored.d.thread.clone(), stored.d.id.clone());
    Ok(Write {
        key: Key::Dispatch(thread.clone(), id.clone()),
        expect,
        payload: encode_dispatch(&mut stored)?,
        record: Record::Dispatch(thread, id, Some(Box::new(stored))),
    })
}

/// A write of a thread record, fenced by its tree.
pub(super) fn put_thread(view: &View, thread: &str, rec: ThreadRec) -> StoreResult<Write> {
    Ok(Write {
        key: Key::Thread(thread.to_owned()),
        expect: Expect::Thread(view.thread_seq(thread)),
        payload: encode_thread(&rec)?,
        record: Record::Thread(thread.to_owned(), rec),
    })
}

/// Refuses a queued record whose fields besides the payload leave too little room in its
/// message for an output of up to `room.value` bytes and for what a settlement adds: such a
/// record could be enqueued but never completed.
fn fits_with_output(write: &Write, d: &Dispatch, room: &Room) -> StoreResult<()> {
    let record = write.payload.len() as u64;
    let needed = record
        .saturating_add(room.value)
        .saturating_add(GROWTH_ROOM);
    if needed <= room.record {
        return Ok(());
    }
    let payload = d.payload.len() as u64;
    let fields = record.saturating_sub(payload + FRAME_OVERHEAD);
    let allowed = room
        .record
        .saturating_sub(room.value + GROWTH_ROOM + FRAME_OVERHEAD + payload);
    Err(StoreError::Invalid(format!(
        "metadata: dispatch `{}`: its metadata, names and dedupe key take {fields} bytes of its \
         record; beside a payload of {payload} bytes and room for an output of up to {} bytes, \
         at most {allowed} fit (the NATS server's max_payload is {} bytes)",
        d.id, room.value, room.server
    )))
}

fn plain(d: Dispatch) -> Stored {
    Stored { d, settled: None }
}

/// `d` superseded (claimed or queued) with `reason`.
pub(super) fn superseded(mut d: Dispatch, now: u64, reason: &str) -> Dispatch {
    terminate(&mut d, Status::Superseded, now, Some(reason));
    d.started_at = None;
    d.result = None;
    d
}

/// What a holder check decided.
enum Holder {
    /// The caller holds the live claim.
    Live(Dispatch),
    /// The answer is known without the caller's write (a repeat, a refusal, a supersede).
    Answer(Plan<Dispatch>),
}

/// Checks that `token` holds `id` at a current epoch (SPEC section 2).
fn check_holder(
    view: &View,
    id: &str,
    token: &str,
    settle_op: Option<&str>,
    now: u64,
) -> StoreResult<Holder> {
    let Some(stored) = view.dispatch(id)? else {
        return Ok(Holder::Answer(Plan::Refuse(Err(StoreError::NotFound {
            id: id.to_owned(),
        }))));
    };
    if let (Some(op), Some((settled_token, settled_op))) = (settle_op, &stored.settled)
        && settled_token == token
        && settled_op == op
    {
        return Ok(Holder::Answer(Plan::Done(Ok(stored.d.clone()))));
    }
    let d = &stored.d;
    let Some(claim) = &d.claim else {
        return Ok(Holder::Answer(Plan::Refuse(Err(StoreError::NotClaimed {
            id: id.to_owned(),
            status: d.status,
        }))));
    };
    if claim.token != token {
        return Ok(Holder::Answer(Plan::Refuse(Err(StoreError::LostClaim {
            id: id.to_owned(),
        }))));
    }
    let t = view.thread(&d.thread)?;
    if d.epoch < t.epoch {
        let error = StoreError::StaleEpoch {
            id: id.to_owned(),
            dispatch: d.epoch,
            thread: t.epoch,
        };
        let write = put_dispatch(
            view,
            Stored {
                d: superseded(d.clone(), now, REASON_STALE_EPOCH),
                settled: Some((token.to_owned(), "supersede".to_owned())),
            },
        )?;
        return Ok(Holder::Answer(Plan::Write(vec![write], Err(error), true)));
    }
    Ok(Holder::Live(d.clone()))
}

/// `d` claimed by `consumer` until `now + lease_ms`.
fn claimed(mut d: Dispatch, consumer: &str, lease_ms: u64, now: u64, start: bool) -> Dispatch {
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
    d
}

/// An expired claim given back: requeued or dead-lettered, or superseded when its thread moved
/// on (then `None` is reported).
fn reclaimed(mut d: Dispatch, t: &ThreadRec, now: u64) -> (Dispatch, bool) {
    if d.epoch < t.epoch {
        return (superseded(d, now, REASON_EXPIRED_AFTER_INTERRUPT), false);
    }
    fail_attempt(&mut d, now, now, None, REASON_LEASE_EXPIRED_AT_MAX);
    d.started_at = None;
    d.result = None;
    (d, true)
}

/// What one claim decision came to.
enum Claimed {
    Got(Box<Dispatch>),
    Nothing,
    /// A stale candidate was superseded or an expired holder reclaimed; decide again.
    Again,
}

impl NatsStore {
    async fn claim_inner(
        &self,
        agent: &str,
        consumer: &str,
        lease_ms: u64,
        start: bool,
    ) -> StoreResult<Option<Dispatch>> {
        // The best dispatch may have been enqueued on another host a moment ago.
        self.barrier().await?;
        for _ in 0..64 {
            let mut held: Option<String> = None;
            let out = self
                .run(|view, now, _| {
                    if let Some(thread) = held.take() {
                        view.release(&thread);
                    }
                    view.promote(agent, now);
                    let Some(pick) = view.pick(agent) else {
                        return Ok(Plan::Done(Ok(Claimed::Nothing)));
                    };
                    let d = pick.d.clone();
                    let t = view.thread(&d.thread)?;
                    if d.epoch < t.epoch {
                        let write =
                            put_dispatch(view, plain(superseded(d, now, REASON_STALE_EPOCH)))?;
                        return Ok(Plan::Write(vec![write], Ok(Claimed::Again), false));
                    }
                    view.reserve(&d.thread);
                    held = Some(d.thread.clone());
                    let d = claimed(d, consumer, lease_ms, now, start);
                    let write = put_dispatch(view, plain(d.clone()))?;
                    Ok(Plan::Write(
                        vec![write],
                        Ok(Claimed::Got(Box::new(d))),
                        false,
                    ))
                })
                .await;
            if let Some(thread) = held {
                self.view()?.release(&thread);
            }
            match out? {
                Claimed::Got(d) => return Ok(Some(*d)),
                Claimed::Nothing => return Ok(None),
                Claimed::Again => continue,
            }
        }
        Err(StoreError::Contention(format!(
            "claim for agent `{agent}` kept finding stale dispatches"
        )))
    }

    /// A holder operation: check the claim, apply `f` to the record, store it.
    async fn holder_write(
        &self,
        id: &str,
        token: &str,
        settle_op: Option<&'static str>,
        f: impl Fn(&mut Dispatch, u64) + Send,
    ) -> StoreResult<Dispatch> {
        self.run(|view, now, _| {
            let mut d = match check_holder(view, id, token, settle_op, now)? {
                Holder::Live(d) => d,
                Holder::Answer(plan) => return Ok(plan),
            };
            f(&mut d, now);
            let settled = settle_op.map(|op| (token.to_owned(), op.to_owned()));
            let write = put_dispatch(
                view,
                Stored {
                    d: d.clone(),
                    settled,
                },
            )?;
            Ok(Plan::Write(vec![write], Ok(d), settle_op.is_some()))
        })
        .await
    }
}

#[async_trait]
impl Mailbox for NatsStore {
    async fn enqueue(&self, new: NewDispatch) -> StoreResult<Dispatch> {
        new.validate().map_err(StoreError::Invalid)?;
        let room = self.room();
        check_size("payload", &new.payload, room.value, &room.value_why())?;
        let chosen = new.id.is_some();
        let id = new
            .id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        self.run(|view, now, _| {
            if let Some(existing) = view.dispatch(&id)? {
                return Ok(Plan::Done(if same_content(&existing.d, &new) {
                    Ok(existing.d.clone())
                } else {
                    Err(StoreError::Duplicate {
                        id: id.clone(),
                        holder: None,
                    })
                }));
            }
            // The thread's tree fences the write, so the dedupe check and the epoch stamped
            // here are current at commit: no concurrent enqueue or interrupt slips between
            // (W9 and the dedupe race).
            if let Some(key) = &new.dedupe_key
                && let Some(holder) = view
                    .live_of(&new.thread)
                    .into_iter()
                    .find(|s| s.d.dedupe_key.as_ref() == Some(key))
            {
                return Ok(Plan::Refuse(Err(StoreError::Duplicate {
                    id: id.clone(),
                    holder: Some(holder.d.id.clone()),
                })));
            }
            let t = view.thread(&new.thread)?;
            let d = queued_record(&id, &new, t.epoch, now);
            let mut writes = Vec::new();
            if chosen {
                // A caller-chosen id may be offered on two threads at once: the id index
                // admits it once (a minted UUID v7 needs no such check).
                writes.push(Write {
                    key: Key::Id(id.clone()),
                    expect: Expect::Subject(view.id_seq(&id)),
                    payload: bytes::Bytes::from(new.thread.clone().into_bytes()),
                    record: Record::Id(id.clone(), new.thread.clone()),
                });
            }
            let write = put_dispatch(view, plain(d.clone()))?;
            if let Err(e) = fits_with_output(&write, &d, &room) {
                return Ok(Plan::Done(Err(e)));
            }
            writes.push(write);
            Ok(Plan::Write(writes, Ok(d), true))
        })
        .await
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
        self.run(|view, now, _| {
            let Some(stored) = view.dispatch(id)?.filter(|s| s.d.status == Status::Queued) else {
                return Ok(Plan::Refuse(Ok(None)));
            };
            let d = stored.d.clone();
            let t = view.thread(&d.thread)?;
            if d.epoch < t.epoch {
                let write = put_dispatch(view, plain(superseded(d, now, REASON_STALE_EPOCH)))?;
                return Ok(Plan::Write(vec![write], Ok(None), true));
            }
            let mut writes = Vec::new();
            if let Some(h) = view.holder(&d.thread) {
                let live = h.d.claim.as_ref().is_some_and(|c| c.lease_until >= now);
                if live {
                    return Ok(Plan::Refuse(Ok(None)));
                }
                // Take over from an expired holder: reclaim it and claim this one in one
                // atomic batch, decided by the first message's expectation.
                let (back, _) = reclaimed(h.d.clone(), &t, now);
                writes.push(put_dispatch(view, plain(back))?);
            }
            let d = claimed(d, consumer, lease_ms, now, false);
            let expect = if writes.is_empty() {
                Expect::Thread(view.thread_seq(&d.thread))
            } else {
                Expect::None
            };
            writes.push(put_dispatch_expecting(expect, plain(d.clone()))?);
            let wake = writes.len() > 1;
            Ok(Plan::Write(writes, Ok(Some(d)), wake))
        })
        .await
    }

    async fn extend_lease(&self, id: &str, token: &str, extension_ms: u64) -> StoreResult<bool> {
        let out = self
            .holder_write(id, token, None, |d, now| {
                if let Some(claim) = &mut d.claim {
                    claim.lease_until = clamp(now.saturating_add(extension_ms));
                }
                d.updated_at = now;
            })
            .await;
        lease_extended(out)
    }

    async fn record_start(&self, id: &str, token: &str) -> StoreResult<Dispatch> {
        self.holder_write(id, token, None, |d, now| {
            d.started_at = Some(now);
            d.result = None;
            d.updated_at = now;
        })
        .await
    }

    async fn record_result(
        &self,
        id: &str,
        token: &str,
        result: RunResult,
    ) -> StoreResult<Dispatch> {
        let room = self.room();
        check_size("output", &result.output, room.value, &room.value_why())?;
        self.holder_write(id, token, None, |d, now| {
            d.result = Some(result.clone());
            d.updated_at = now;
        })
        .await
    }

    async fn ack(&self, id: &str, token: &str) -> StoreResult<Dispatch> {
        self.holder_write(id, token, Some("ack"), |d, now| {
            terminate(d, Status::Acked, now, None);
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
        self.holder_write(id, token, Some("nack"), |d, now| {
            fail_attempt(d, now, retry_at, Some(error), REASON_LEASE_EXPIRED_AT_MAX);
        })
        .await
    }

    async fn dead_letter(&self, id: &str, token: &str, error: &str) -> StoreResult<Dispatch> {
        self.holder_write(id, token, Some("dead_letter"), |d, now| {
            terminate(d, Status::DeadLetter, now, Some(error));
        })
        .await
    }

    async fn complete(&self, id: &str, token: &str, result: RunResult) -> StoreResult<Dispatch> {
        let room = self.room();
        check_size("output", &result.output, room.value, &room.value_why())?;
        self.holder_write(id, token, Some("ack"), |d, now| {
            d.result = Some(result.clone());
            terminate(d, Status::Acked, now, None);
        })
        .await
    }

    async fn cancel(&self, id: &str) -> StoreResult<Option<Dispatch>> {
        self.run(|view, now, _| {
            let Some(stored) = view.dispatch(id)?.filter(|s| s.d.status == Status::Queued) else {
                return Ok(Plan::Refuse(Ok(None)));
            };
            let mut d = stored.d.clone();
            terminate(&mut d, Status::Cancelled, now, None);
            let write = put_dispatch(view, plain(d.clone()))?;
            Ok(Plan::Write(vec![write], Ok(Some(d)), false))
        })
        .await
    }

    async fn interrupt(&self, thread: &str, reason: &str) -> StoreResult<Interrupt> {
        if thread.trim().is_empty() {
            return Err(StoreError::Invalid("thread is blank".into()));
        }
        // One atomic batch: the epoch bump, fenced by the thread's tree, then the queued
        // dispatches superseded. Past one batch's worth, the rest follow in further batches;
        // a claim meanwhile finds their epoch stale and supersedes them instead of running them.
        let mut epoch = 0;
        let mut active = None;
        let mut ids: Vec<String> = Vec::new();
        let mut first = true;
        loop {
            let (more, chunk) = self
                .run(|view, now, _| {
                    let mut t = view.thread(thread)?;
                    let mut writes = Vec::new();
                    if first {
                        t.epoch += 1;
                        epoch = t.epoch;
                        active = view.holder(thread).map(|s| s.d.clone());
                        writes.push(put_thread(view, thread, t)?);
                    }
                    let mut queued: Vec<&Stored> = view
                        .live_of(thread)
                        .into_iter()
                        .filter(|s| s.d.status == Status::Queued && s.d.epoch < epoch)
                        .collect();
                    queued.sort_by(|a, b| a.d.id.cmp(&b.d.id));
                    let room = MAX_BATCH.saturating_sub(writes.len());
                    let more = queued.len() > room;
                    let mut chunk = Vec::new();
                    for s in queued.into_iter().take(room) {
                        let d = superseded(s.d.clone(), now, reason);
                        chunk.push(d.id.clone());
                        let expect = if writes.is_empty() {
                            Expect::Thread(view.thread_seq(thread))
                        } else {
                            Expect::None
                        };
                        writes.push(put_dispatch_expecting(expect, plain(d))?);
                    }
                    if writes.is_empty() {
                        return Ok(Plan::Done(Ok((false, chunk))));
                    }
                    Ok(Plan::Write(writes, Ok((more, chunk)), true))
                })
                .await?;
            first = false;
            ids.extend(chunk);
            if !more {
                break;
            }
        }
        ids.sort();
        Ok(Interrupt {
            epoch,
            active,
            superseded: ids,
        })
    }

    async fn supersede_claimed(
        &self,
        id: &str,
        token: Option<&str>,
        reason: &str,
    ) -> StoreResult<Option<Dispatch>> {
        self.run(|view, now, _| {
            let Some(stored) = view.dispatch(id)? else {
                return Ok(Plan::Refuse(Ok(None)));
            };
            if let (Some(token), Some((settled_token, op))) = (token, &stored.settled)
                && settled_token == token
                && op == "supersede"
            {
                return Ok(Plan::Done(Ok(Some(stored.d.clone()))));
            }
            let Some(claim) = &stored.d.claim else {
                return Ok(Plan::Refuse(Ok(None)));
            };
            if let Some(token) = token
                && claim.token != token
            {
                return Ok(Plan::Refuse(Err(StoreError::LostClaim {
                    id: id.to_owned(),
                })));
            }
            let settled = Some((claim.token.clone(), "supersede".to_owned()));
            let d = superseded(stored.d.clone(), now, reason);
            let write = put_dispatch(
                view,
                Stored {
                    d: d.clone(),
                    settled,
                },
            )?;
            Ok(Plan::Write(vec![write], Ok(Some(d)), true))
        })
        .await
    }

    async fn reclaim_expired(&self, now: u64, limit: usize) -> StoreResult<Vec<Dispatch>> {
        self.barrier().await?;
        let mut expired: Vec<(u64, String)> = self
            .view()?
            .claimed()
            .filter_map(|s| {
                let until = s.d.claim.as_ref()?.lease_until;
                (until < now).then(|| (until, s.d.id.clone()))
            })
            .collect();
        expired.sort();
        expired.truncate(limit);
        let mut out = Vec::new();
        for (_, id) in expired {
            let back = self
                .run(|view, _, _| {
                    let Some(stored) = view.dispatch(&id)?.filter(|s| {
                        s.d.status == Status::Claimed
                            && s.d.claim.as_ref().is_some_and(|c| c.lease_until < now)
                    }) else {
                        return Ok(Plan::Done(Ok(None)));
                    };
                    let t = view.thread(&stored.d.thread)?;
                    let (d, requeued) = reclaimed(stored.d.clone(), &t, now);
                    let write = put_dispatch(view, plain(d.clone()))?;
                    Ok(Plan::Write(vec![write], Ok(requeued.then_some(d)), true))
                })
                .await?;
            out.extend(back);
        }
        Ok(out)
    }

    async fn purge_terminal(&self, older_than: u64) -> StoreResult<usize> {
        self.barrier().await?;
        let mut purged = 0;
        loop {
            let n = self
                .run(|view, _, _| {
                    // Terminal records never change again, so each tombstone only needs its
                    // own subject unchanged (another host purging the same record).
                    let doomed: Vec<(u64, Dispatch)> = view
                        .all()
                        .filter(|s| {
                            s.d.status.is_terminal()
                                && s.d.completed_at.is_some_and(|at| at < older_than)
                        })
                        .take(MAX_BATCH)
                        .map(|s| (view.dispatch_seq(&s.d.id), s.d.clone()))
                        .collect();
                    let writes: Vec<Write> = doomed
                        .into_iter()
                        .map(|(seq, d)| Write {
                            key: Key::Dispatch(d.thread.clone(), d.id.clone()),
                            expect: Expect::Subject(seq),
                            payload: bytes::Bytes::new(),
                            record: Record::Dispatch(d.thread, d.id, None),
                        })
                        .collect();
                    if writes.is_empty() {
                        return Ok(Plan::Done(Ok(0)));
                    }
                    let count = writes.len();
                    Ok(Plan::Write(writes, Ok(count), false))
                })
                .await?;
            if n == 0 {
                return Ok(purged);
            }
            purged += n;
        }
    }

    async fn load(&self, id: &str) -> StoreResult<Option<Dispatch>> {
        self.barrier().await?;
        Ok(self.view()?.dispatch(id)?.map(|s| s.d.clone()))
    }

    async fn list(&self, filter: &ListFilter) -> StoreResult<Vec<Dispatch>> {
        self.barrier().await?;
        let limit = if filter.limit == 0 {
            DEFAULT_PAGE
        } else {
            filter.limit
        };
        let view = self.view()?;
        let mut rows: Vec<&Dispatch> = view
            .all()
            .map(|s| &s.d)
            .filter(|d| filter.thread.as_ref().is_none_or(|t| *t == d.thread))
            .filter(|d| filter.agent.as_ref().is_none_or(|a| *a == d.agent))
            .filter(|d| filter.statuses.is_empty() || filter.statuses.contains(&d.status))
            .collect();
        rows.sort_by(|a, b| {
            (a.priority, a.created_at, &a.id).cmp(&(b.priority, b.created_at, &b.id))
        });
        Ok(rows
            .into_iter()
            .skip(filter.offset)
            .take(limit)
            .cloned()
            .collect())
    }

    async fn counts(&self) -> StoreResult<Vec<StatusCount>> {
        self.barrier().await?;
        let view = self.view()?;
        let mut counts: std::collections::BTreeMap<(String, Status), u64> = Default::default();
        for s in view.all() {
            *counts.entry((s.d.agent.clone(), s.d.status)).or_default() += 1;
        }
        Ok(counts
            .into_iter()
            .map(|((agent, status), count)| StatusCount {
                agent,
                status,
                count,
            })
            .collect())
    }

    async fn list_terminal(&self, limit: usize, offset: usize) -> StoreResult<Vec<Dispatch>> {
        self.barrier().await?;
        let limit = if limit == 0 { DEFAULT_PAGE } else { limit };
        let view = self.view()?;
        let mut rows: Vec<&Dispatch> = view
            .all()
            .map(|s| &s.d)
            .filter(|d| d.status.is_terminal() && d.completed_at.is_some())
            .collect();
        rows.sort_by(|a, b| (a.completed_at, &a.id).cmp(&(b.completed_at, &b.id)));
        Ok(rows.into_iter().skip(offset).take(limit).cloned().collect())
    }

    async fn thread_epoch(&self, thread: &str) -> StoreResult<u64> {
        self.barrier().await?;
        Ok(self.view()?.thread(thread)?.epoch)
    }

    async fn queued_threads(&self) -> StoreResult<Vec<String>> {
        self.barrier().await?;
        let view = self.view()?;
        let mut threads: Vec<String> = view
            .all()
            .filter(|s| s.d.status == Status::Queued)
            .map(|s| s.d.thread.clone())
            .collect();
        threads.sort();
        threads.dedup();
        Ok(threads)
    }

    async fn has_live_work(&self) -> StoreResult<bool> {
        self.barrier().await?;
        Ok(self.view()?.has_live())
    }

    fn work_signal(&self) -> Arc<Notify> {
        self.work_signal_handle()
    }

    fn max_value(&self) -> u64 {
        self.room().value
    }
}
