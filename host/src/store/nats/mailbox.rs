//! The mailbox operations of the NATS backend. Each decides from the view and commits one
//! atomic batch (see the parent module); the decision functions mirror the embedded backend's
//! transactions and share its transition rules (`store::rules`).

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Notify;

use super::keys::{Key, encode_dispatch, encode_thread};
use super::view::{HolderRec, Record, Stored, ThreadRec, View};
use super::{MAX_BATCH, NatsStore, Plan, Write};
use crate::store::model::{
    Claim, Dispatch, Interrupt, ListFilter, NewDispatch, RunResult, Status, StatusCount,
};
use crate::store::rules::{clamp, fail_attempt, same_content, terminate};
use crate::store::{
    Mailbox, REASON_EXPIRED_AFTER_INTERRUPT, REASON_LEASE_EXPIRED_AT_MAX, REASON_STALE_EPOCH,
    StoreError, StoreResult,
};

/// The page size of `list` and `list_terminal` when the caller gives 0.
const DEFAULT_PAGE: usize = 100;

pub(super) fn put_dispatch(seq: u64, stored: Stored) -> StoreResult<Write> {
    Ok(Write {
        key: Key::Dispatch(stored.d.id.clone()),
        expect: seq,
        payload: encode_dispatch(&stored)?,
        record: Record::Dispatch(stored.d.id.clone(), Some(Box::new(stored))),
    })
}

pub(super) fn put_thread(thread: &str, seq: u64, rec: ThreadRec) -> StoreResult<Write> {
    Ok(Write {
        key: Key::Thread(thread.to_owned()),
        expect: seq,
        payload: encode_thread(&rec)?,
        record: Record::Thread(thread.to_owned(), rec),
    })
}

fn plain(d: Dispatch) -> Stored {
    Stored { d, settled: None }
}

/// The thread record without `id` as its holder (unchanged when another holds it).
fn released(mut t: ThreadRec, id: &str) -> ThreadRec {
    if t.holder.as_ref().is_some_and(|h| h.id == id) {
        t.holder = None;
    }
    t
}

/// Supersedes `d` (claimed or queued): the writes, and the superseded record.
pub(super) fn supersede_writes(
    view: &View,
    dseq: u64,
    mut d: Dispatch,
    now: u64,
    reason: &str,
    settled: Option<(String, String)>,
) -> StoreResult<(Vec<Write>, Dispatch)> {
    let was_claimed = d.status == Status::Claimed;
    terminate(&mut d, Status::Superseded, now, Some(reason));
    d.started_at = None;
    d.result = None;
    let mut writes = vec![put_dispatch(
        dseq,
        Stored {
            d: d.clone(),
            settled,
        },
    )?];
    if was_claimed {
        let (tseq, t) = view.thread(&d.thread)?;
        if t.holder.as_ref().is_some_and(|h| h.id == d.id) {
            writes.push(put_thread(&d.thread, tseq, released(t, &d.id))?);
        }
    }
    Ok((writes, d))
}

/// What a holder check decided.
enum Holder {
    /// The caller holds the live claim: the record and its sequence.
    Live(u64, Dispatch),
    /// The answer is known without a write of the caller's (a repeat, a refusal, a supersede).
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
    let (dseq, stored) = view.dispatch(id)?;
    let Some(stored) = stored else {
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
    let (_, t) = view.thread(&d.thread)?;
    if d.epoch < t.epoch {
        let error = StoreError::StaleEpoch {
            id: id.to_owned(),
            dispatch: d.epoch,
            thread: t.epoch,
        };
        let (writes, _) = supersede_writes(
            view,
            dseq,
            d.clone(),
            now,
            REASON_STALE_EPOCH,
            Some((token.to_owned(), "supersede".to_owned())),
        )?;
        return Ok(Holder::Answer(Plan::Write(writes, Err(error), true)));
    }
    Ok(Holder::Live(dseq, d.clone()))
}

/// Claims `d` for `consumer` and occupies its thread: the two writes and the claimed record.
fn take(
    view: &View,
    dseq: u64,
    mut d: Dispatch,
    consumer: &str,
    lease_ms: u64,
    now: u64,
    start: bool,
) -> StoreResult<(Vec<Write>, Dispatch)> {
    let (tseq, mut t) = view.thread(&d.thread)?;
    let claim = Claim {
        token: uuid::Uuid::now_v7().to_string(),
        claimed_by: consumer.to_owned(),
        lease_until: clamp(now.saturating_add(lease_ms)),
    };
    t.holder = Some(HolderRec {
        id: d.id.clone(),
        token: claim.token.clone(),
        lease_until: claim.lease_until,
    });
    t.served = view.pos + 1;
    d.status = Status::Claimed;
    if start {
        d.started_at = Some(now);
    }
    d.claim = Some(claim);
    d.updated_at = now;
    let writes = vec![
        put_dispatch(dseq, plain(d.clone()))?,
        put_thread(&d.thread, tseq, t)?,
    ];
    Ok((writes, d))
}

/// Reclaims one expired claim: the writes, and the record when it was requeued or
/// dead-lettered (`None` when superseded because its thread moved on). `t` is the thread record
/// the caller will write (its holder is cleared here).
fn reclaim_one(
    dseq: u64,
    mut d: Dispatch,
    t: &mut ThreadRec,
    now: u64,
) -> StoreResult<(Write, Option<Dispatch>)> {
    if t.holder.as_ref().is_some_and(|h| h.id == d.id) {
        t.holder = None;
    }
    if d.epoch < t.epoch {
        terminate(
            &mut d,
            Status::Superseded,
            now,
            Some(REASON_EXPIRED_AFTER_INTERRUPT),
        );
        d.started_at = None;
        d.result = None;
        return Ok((put_dispatch(dseq, plain(d))?, None));
    }
    fail_attempt(&mut d, now, now, None, REASON_LEASE_EXPIRED_AT_MAX);
    d.started_at = None;
    d.result = None;
    Ok((put_dispatch(dseq, plain(d.clone()))?, Some(d)))
}

/// What one claim decision came to.
enum Claimed {
    Got(Box<Dispatch>),
    Nothing,
    /// A stale candidate was superseded; pick again.
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
                    let (dseq, _) = view.dispatch(&d.id)?;
                    let (_, t) = view.thread(&d.thread)?;
                    if d.epoch < t.epoch {
                        let (writes, _) =
                            supersede_writes(view, dseq, d, now, REASON_STALE_EPOCH, None)?;
                        return Ok(Plan::Write(writes, Ok(Claimed::Again), false));
                    }
                    view.reserve(&d.thread);
                    held = Some(d.thread.clone());
                    let (writes, claimed) = take(view, dseq, d, consumer, lease_ms, now, start)?;
                    Ok(Plan::Write(
                        writes,
                        Ok(Claimed::Got(Box::new(claimed))),
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

    /// A holder operation: check the claim, apply `f` to the record (and the thread record when
    /// `f` returns one), store both.
    async fn holder_write(
        &self,
        id: &str,
        token: &str,
        settle_op: Option<&'static str>,
        f: impl Fn(&mut Dispatch, &mut ThreadRec, u64) -> bool + Send,
    ) -> StoreResult<Dispatch> {
        self.run(|view, now, _| {
            let (dseq, mut d) = match check_holder(view, id, token, settle_op, now)? {
                Holder::Live(seq, d) => (seq, d),
                Holder::Answer(plan) => return Ok(plan),
            };
            let (tseq, mut t) = view.thread(&d.thread)?;
            let touch_thread = f(&mut d, &mut t, now);
            let settled = settle_op.map(|op| (token.to_owned(), op.to_owned()));
            let mut writes = vec![put_dispatch(
                dseq,
                Stored {
                    d: d.clone(),
                    settled,
                },
            )?];
            if touch_thread {
                writes.push(put_thread(&d.thread, tseq, t)?);
            }
            Ok(Plan::Write(writes, Ok(d), settle_op.is_some()))
        })
        .await
    }

    async fn interrupt_chunk(
        &self,
        thread: &str,
        reason: &str,
        bump: bool,
        epoch_seen: &mut u64,
    ) -> StoreResult<(Option<Dispatch>, Vec<String>, bool)> {
        self.run(|view, now, _| {
            let (tseq, mut t) = view.thread(thread)?;
            let mut writes = Vec::new();
            let mut active = None;
            if bump {
                t.epoch += 1;
                *epoch_seen = t.epoch;
                // Rewrite the claimed dispatch in the same batch: a holder write racing this
                // interrupt then fails its expectation and finds the new epoch.
                if let Some(h) = &t.holder {
                    let (hseq, stored) = view.dispatch(&h.id)?;
                    if let Some(stored) = stored.filter(|s| s.d.status == Status::Claimed) {
                        let mut s = stored.clone();
                        s.d.updated_at = now;
                        active = Some(s.d.clone());
                        writes.push(put_dispatch(hseq, s)?);
                    }
                }
                writes.push(put_thread(thread, tseq, t.clone())?);
            }
            let mut queued: Vec<&Stored> = view
                .queued_of(thread)
                .into_iter()
                .filter(|s| s.d.epoch < *epoch_seen)
                .collect();
            queued.sort_by(|a, b| a.d.id.cmp(&b.d.id));
            let room = MAX_BATCH.saturating_sub(writes.len());
            let more = queued.len() > room;
            let mut ids = Vec::new();
            for s in queued.into_iter().take(room) {
                let (seq, _) = view.dispatch(&s.d.id)?;
                let mut d = s.d.clone();
                terminate(&mut d, Status::Superseded, now, Some(reason));
                ids.push(d.id.clone());
                writes.push(put_dispatch(seq, plain(d))?);
            }
            if writes.is_empty() {
                return Ok(Plan::Done(Ok((active, ids, more))));
            }
            Ok(Plan::Write(writes, Ok((active, ids, more)), true))
        })
        .await
    }
}

#[async_trait]
impl Mailbox for NatsStore {
    async fn enqueue(&self, new: NewDispatch) -> StoreResult<Dispatch> {
        new.validate().map_err(StoreError::Invalid)?;
        let id = new
            .id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        self.run(|view, now, _| {
            let (dseq, existing) = view.dispatch(&id)?;
            if let Some(existing) = existing {
                return Ok(Plan::Done(if same_content(&existing.d, &new) {
                    Ok(existing.d.clone())
                } else {
                    Err(StoreError::Duplicate {
                        id: id.clone(),
                        holder: None,
                    })
                }));
            }
            let mut writes = Vec::new();
            if let Some(key) = &new.dedupe_key {
                let (kseq, holder) = view.dedupe(&new.thread, key);
                let live = holder
                    .and_then(|h| view.dispatch(h).ok())
                    .and_then(|(_, s)| s)
                    .filter(|s| !s.d.status.is_terminal());
                if let Some(holder) = live {
                    return Ok(Plan::Refuse(Err(StoreError::Duplicate {
                        id: id.clone(),
                        holder: Some(holder.d.id.clone()),
                    })));
                }
                writes.push(Write {
                    key: Key::Dedupe(new.thread.clone(), key.clone()),
                    expect: kseq,
                    payload: bytes::Bytes::from(id.clone().into_bytes()),
                    record: Record::Dedupe(new.thread.clone(), key.clone(), Some(id.clone())),
                });
            }
            // The thread record is rewritten unchanged: naming its sequence makes the epoch
            // stamped here current at commit, so an interrupt cannot slip between (W9).
            let (tseq, t) = view.thread(&new.thread)?;
            writes.push(put_thread(&new.thread, tseq, t.clone())?);
            let available_at = clamp(now.saturating_add(new.delay_ms));
            let d = Dispatch {
                run_id: new.run_id.clone().unwrap_or_else(|| id.clone()),
                id: id.clone(),
                agent: new.agent.clone(),
                thread: new.thread.clone(),
                payload: new.payload.clone(),
                metadata: new.metadata.clone(),
                priority: new.priority,
                available_at,
                dedupe_key: new.dedupe_key.clone(),
                max_attempts: new.max_attempts,
                attempt: new.attempt,
                epoch: t.epoch,
                status: Status::Queued,
                claim: None,
                started_at: None,
                result: None,
                last_error: None,
                created_at: now,
                updated_at: now,
                completed_at: None,
            };
            writes.push(put_dispatch(dseq, plain(d.clone()))?);
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
            let (dseq, stored) = view.dispatch(id)?;
            let Some(stored) = stored.filter(|s| s.d.status == Status::Queued) else {
                return Ok(Plan::Refuse(Ok(None)));
            };
            let d = stored.d.clone();
            let (tseq, mut t) = view.thread(&d.thread)?;
            if d.epoch < t.epoch {
                let (writes, _) = supersede_writes(view, dseq, d, now, REASON_STALE_EPOCH, None)?;
                return Ok(Plan::Write(writes, Ok(None), true));
            }
            let mut writes = Vec::new();
            if let Some(h) = t.holder.clone() {
                let (hseq, holder) = view.dispatch(&h.id)?;
                match holder.filter(|s| s.d.status == Status::Claimed) {
                    Some(hs) => {
                        let live = hs.d.claim.as_ref().is_some_and(|c| c.lease_until >= now);
                        if live {
                            return Ok(Plan::Refuse(Ok(None)));
                        }
                        let (w, _) = reclaim_one(hseq, hs.d.clone(), &mut t, now)?;
                        writes.push(w);
                    }
                    // The holder settled without freeing the thread record: free it.
                    None => t.holder = None,
                }
            }
            let claim = Claim {
                token: uuid::Uuid::now_v7().to_string(),
                claimed_by: consumer.to_owned(),
                lease_until: clamp(now.saturating_add(lease_ms)),
            };
            t.holder = Some(HolderRec {
                id: d.id.clone(),
                token: claim.token.clone(),
                lease_until: claim.lease_until,
            });
            t.served = view.pos + 1;
            let mut d = d;
            d.status = Status::Claimed;
            d.claim = Some(claim);
            d.updated_at = now;
            writes.push(put_dispatch(dseq, plain(d.clone()))?);
            writes.push(put_thread(&d.thread, tseq, t)?);
            let wake = writes.len() > 2;
            Ok(Plan::Write(writes, Ok(Some(d)), wake))
        })
        .await
    }

    async fn extend_lease(&self, id: &str, token: &str, extension_ms: u64) -> StoreResult<bool> {
        let out = self
            .holder_write(id, token, None, |d, t, now| {
                let until = clamp(now.saturating_add(extension_ms));
                if let Some(claim) = &mut d.claim {
                    claim.lease_until = until;
                }
                if let Some(h) = t.holder.as_mut().filter(|h| h.id == d.id) {
                    h.lease_until = until;
                }
                d.updated_at = now;
                true
            })
            .await;
        match out {
            Ok(_) => Ok(true),
            Err(
                StoreError::NotFound { .. }
                | StoreError::NotClaimed { .. }
                | StoreError::LostClaim { .. }
                | StoreError::StaleEpoch { .. },
            ) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn record_start(&self, id: &str, token: &str) -> StoreResult<Dispatch> {
        self.holder_write(id, token, None, |d, _, now| {
            d.started_at = Some(now);
            d.result = None;
            d.updated_at = now;
            false
        })
        .await
    }

    async fn record_result(
        &self,
        id: &str,
        token: &str,
        result: RunResult,
    ) -> StoreResult<Dispatch> {
        self.holder_write(id, token, None, |d, _, now| {
            d.result = Some(result.clone());
            d.updated_at = now;
            false
        })
        .await
    }

    async fn ack(&self, id: &str, token: &str) -> StoreResult<Dispatch> {
        self.holder_write(id, token, Some("ack"), |d, t, now| {
            terminate(d, Status::Acked, now, None);
            *t = released(t.clone(), &d.id);
            true
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
        self.holder_write(id, token, Some("nack"), |d, t, now| {
            fail_attempt(d, now, retry_at, Some(error), REASON_LEASE_EXPIRED_AT_MAX);
            *t = released(t.clone(), &d.id);
            true
        })
        .await
    }

    async fn dead_letter(&self, id: &str, token: &str, error: &str) -> StoreResult<Dispatch> {
        self.holder_write(id, token, Some("dead_letter"), |d, t, now| {
            terminate(d, Status::DeadLetter, now, Some(error));
            *t = released(t.clone(), &d.id);
            true
        })
        .await
    }

    async fn complete(&self, id: &str, token: &str, result: RunResult) -> StoreResult<Dispatch> {
        self.holder_write(id, token, Some("ack"), |d, t, now| {
            d.result = Some(result.clone());
            terminate(d, Status::Acked, now, None);
            *t = released(t.clone(), &d.id);
            true
        })
        .await
    }

    async fn cancel(&self, id: &str) -> StoreResult<Option<Dispatch>> {
        self.run(|view, now, _| {
            let (dseq, stored) = view.dispatch(id)?;
            let Some(stored) = stored.filter(|s| s.d.status == Status::Queued) else {
                return Ok(Plan::Refuse(Ok(None)));
            };
            let mut d = stored.d.clone();
            terminate(&mut d, Status::Cancelled, now, None);
            Ok(Plan::Write(
                vec![put_dispatch(dseq, plain(d.clone()))?],
                Ok(Some(d)),
                false,
            ))
        })
        .await
    }

    async fn interrupt(&self, thread: &str, reason: &str) -> StoreResult<Interrupt> {
        if thread.trim().is_empty() {
            return Err(StoreError::Invalid("thread is blank".into()));
        }
        let mut epoch = 0;
        let (active, mut superseded, mut more) = self
            .interrupt_chunk(thread, reason, true, &mut epoch)
            .await?;
        while more {
            let (_, ids, again) = self
                .interrupt_chunk(thread, reason, false, &mut epoch)
                .await?;
            superseded.extend(ids);
            more = again;
        }
        superseded.sort();
        Ok(Interrupt {
            epoch,
            active,
            superseded,
        })
    }

    async fn supersede_claimed(
        &self,
        id: &str,
        token: Option<&str>,
        reason: &str,
    ) -> StoreResult<Option<Dispatch>> {
        self.run(|view, now, _| {
            let (dseq, stored) = view.dispatch(id)?;
            let Some(stored) = stored else {
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
            let (writes, d) = supersede_writes(view, dseq, stored.d.clone(), now, reason, settled)?;
            Ok(Plan::Write(writes, Ok(Some(d)), true))
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
            let reclaimed = self
                .run(|view, _, _| {
                    let (dseq, stored) = view.dispatch(&id)?;
                    let Some(stored) = stored.filter(|s| {
                        s.d.status == Status::Claimed
                            && s.d.claim.as_ref().is_some_and(|c| c.lease_until < now)
                    }) else {
                        return Ok(Plan::Done(Ok(None)));
                    };
                    let (tseq, mut t) = view.thread(&stored.d.thread)?;
                    let holder_was = t.holder.clone();
                    let (w, back) = reclaim_one(dseq, stored.d.clone(), &mut t, now)?;
                    let mut writes = vec![w];
                    if t.holder != holder_was {
                        writes.push(put_thread(&stored.d.thread, tseq, t)?);
                    }
                    Ok(Plan::Write(writes, Ok(back), true))
                })
                .await?;
            out.extend(reclaimed);
        }
        Ok(out)
    }

    async fn purge_terminal(&self, older_than: u64) -> StoreResult<usize> {
        self.barrier().await?;
        let mut purged = 0;
        loop {
            let n = self
                .run(|view, _, _| {
                    let mut writes = Vec::new();
                    let mut count = 0;
                    let doomed: Vec<Dispatch> = view
                        .all()
                        .filter(|s| {
                            s.d.status.is_terminal()
                                && s.d.completed_at.is_some_and(|at| at < older_than)
                        })
                        .map(|s| s.d.clone())
                        .take(MAX_BATCH / 2)
                        .collect();
                    for d in doomed {
                        let (seq, _) = view.dispatch(&d.id)?;
                        if let Some((kseq, key)) = view.dedupe_of(&d) {
                            writes.push(Write {
                                key: Key::Dedupe(d.thread.clone(), key.clone()),
                                expect: kseq,
                                payload: bytes::Bytes::new(),
                                record: Record::Dedupe(d.thread.clone(), key, None),
                            });
                        }
                        writes.push(Write {
                            key: Key::Dispatch(d.id.clone()),
                            expect: seq,
                            payload: bytes::Bytes::new(),
                            record: Record::Dispatch(d.id.clone(), None),
                        });
                        count += 1;
                    }
                    if writes.is_empty() {
                        return Ok(Plan::Done(Ok(0)));
                    }
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
        let key = Key::Dispatch(id.to_owned());
        let Some((seq, payload)) = self.get_last(&key.subject(self.prefix())).await? else {
            return Ok(None);
        };
        match key.decode(&payload) {
            Ok(record) => {
                let out = match &record {
                    Record::Dispatch(_, stored) => stored.as_ref().map(|s| s.d.clone()),
                    _ => None,
                };
                self.view()?.apply(seq, record);
                Ok(out)
            }
            Err((key, reason)) => Err(StoreError::Corrupt { key, reason }),
        }
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
        Ok(self.thread_record(thread).await?.epoch)
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
}
