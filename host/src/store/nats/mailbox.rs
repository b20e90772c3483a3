//! The mailbox operations of the NATS backend. Each decides from the view and writes one
//! message fenced by its thread's tree (see the parent module); every holder, claim and
//! reclaim decision is the store's rules' (`store::rules`), the same the embedded backend
//! applies. Read-only queries are in [`queries`](super::queries).

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Notify;

use super::NatsStore;
use super::commit::{
    Expect, MAX_BATCH, Plan, Write, fence_first, plain, put_dispatch_expecting, put_thread, settled,
};
use super::config::{GROWTH_ROOM, Room};
use super::effects::{Applied, applied, changed, in_batch, superseding};
use super::fetch::Read;
use super::keys::{FRAME_OVERHEAD, Key};
use super::view::{Record, Stored, View};
use crate::store::check_size;
use crate::store::limits::{ClaimRequest, Gated};
use crate::store::model::{
    Dispatch, DispatchRow, Interrupt, ListFilter, NewDispatch, Status, StatusCount,
};
use crate::store::rules::{
    self, Found, Holder, HolderOp, Reclaim, Settle, SupersedeClaimed, Take, WaitpointsSeen,
    lease_live, queued_record, same_content, window,
};
use crate::store::waitpoints;
use crate::store::{Mailbox, REASON_STALE_EPOCH, StoreError, StoreResult};

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

/// The rules' verdict on the holder operation `op` for `id` as the view has it.
fn check_holder_op(
    view: &View,
    id: &str,
    token: &str,
    op: &HolderOp,
    now: u64,
) -> StoreResult<Holder> {
    let (found, thread_epoch) = holder_inputs(view, id)?;
    Ok(rules::check_holder_op(
        found,
        id,
        token,
        op,
        thread_epoch,
        now,
    ))
}

/// The record of `id` and its thread's epoch, as the view has them.
fn holder_inputs<'v>(view: &'v View, id: &str) -> StoreResult<(Option<Found<'v>>, u64)> {
    let stored = view.dispatch(id)?;
    let thread_epoch = match stored {
        Some(s) => view.thread(&s.dispatch.thread)?.epoch,
        None => 0,
    };
    Ok((stored.map(Stored::found), thread_epoch))
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
                .run(&[Read::All], |view, now, _| {
                    if let Some(thread) = held.take() {
                        view.release(&thread);
                    }
                    view.promote(agent, now);
                    // A pick not yet due (the clock stepped back since it was promoted) goes
                    // back to waiting and the next is tried.
                    let d = loop {
                        let Some(pick) = view.pick(agent) else {
                            return Ok(Plan::Done(Ok(Claimed::Nothing)));
                        };
                        let d = pick.dispatch.clone();
                        if rules::due(&d, now) {
                            break d;
                        }
                        view.demote(&d);
                    };
                    let thread_epoch = view.thread(&d.thread)?.epoch;
                    let log = view.latest(&d.thread);
                    match rules::take(d, (thread_epoch, log), consumer, lease_ms, now, start) {
                        Take::Stale(d) => {
                            let Applied { writes, wake } = changed(view, Status::Queued, plain(d))?;
                            Ok(Plan::Write {
                                writes,
                                answer: Ok(Claimed::Again),
                                wake,
                            })
                        }
                        Take::Claimed(d) => {
                            view.reserve(&d.thread);
                            held = Some(d.thread.clone());
                            let Applied { writes, wake } =
                                changed(view, Status::Queued, plain(d.clone()))?;
                            Ok(Plan::Write {
                                writes,
                                answer: Ok(Claimed::Got(Box::new(d))),
                                wake,
                            })
                        }
                    }
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

    /// A holder operation: check the claim as the rules say, apply `op` to a live holder's
    /// record and store it. A settlement that leaves its thread idle with messages no
    /// follow-up covers also enqueues the follow-ups (M4, case b; see `inbox`), in the same
    /// atomic batch.
    async fn holder_write(&self, id: &str, token: &str, op: HolderOp) -> StoreResult<Dispatch> {
        let settles = op.settles();
        // A client reads the thread's messages with the record when the operation settles (a
        // host's view holds them); it reads the whole thread only when they need answering.
        let first = [Read::Dispatch(id), Read::InboxOf(id)];
        let whole = [Read::ThreadOf(id), Read::InboxOf(id)];
        let reads: [&[Read<'_>]; 2] = match settles {
            Some(_) => [&first[..], &whole[..]],
            None => [&first[..1], &first[..1]],
        };
        for reads in reads {
            let out = self
                .run(reads, |view, now, _| {
                    match check_holder_op(view, id, token, &op, now)? {
                        Holder::Repeat(d) => Ok(Plan::Done(Ok(Some(d)))),
                        Holder::Refuse(e) => Ok(Plan::Refuse(Err(e))),
                        Holder::Supersede {
                            record,
                            token,
                            error,
                        } => {
                            let stored = settled(record, &token, Settle::Supersede);
                            let Applied { writes, wake } = changed(view, Status::Claimed, stored)?;
                            Ok(Plan::Write {
                                writes,
                                answer: Err(error),
                                wake,
                            })
                        }
                        Holder::Live(mut d) => {
                            // A suspend is decided with the dispatch's waitpoints, under the
                            // thread's fence: a completion stored first is seen here (and
                            // resumes at once), one stored after finds the dispatch waiting.
                            let seen = if op.reads_waitpoints() {
                                waitpoints::seen(
                                    view.waitpoints_of(&d.thread, &d.id)
                                        .into_iter()
                                        .map(|held| &held.waitpoint),
                                )
                            } else {
                                WaitpointsSeen::default()
                            };
                            if let Err(e) = op.clone().apply(&mut d, now, seen) {
                                return Ok(Plan::Refuse(Err(e)));
                            }
                            let stored = match settles {
                                Some(op) => settled(d.clone(), token, op),
                                None => plain(d.clone()),
                            };
                            let Some(Applied { writes, wake }) =
                                applied(view, Status::Claimed, stored, now)?
                            else {
                                return Ok(Plan::Done(Ok(None)));
                            };
                            Ok(Plan::Write {
                                writes,
                                answer: Ok(Some(d)),
                                wake,
                            })
                        }
                    }
                })
                .await?;
            if let Some(d) = out {
                return Ok(d);
            }
        }
        Err(StoreError::Contention(format!(
            "dispatch {id}: its thread kept changing while it settled"
        )))
    }
}

impl NatsStore {
    /// T13 for one dispatch whose lease expired, with M4 (case b) when it leaves its thread
    /// idle with messages no follow-up covers (see [`NatsStore::holder_write`]).
    async fn reclaim_one(&self, id: &str, now: u64) -> StoreResult<Option<Dispatch>> {
        let first = [Read::Dispatch(id), Read::InboxOf(id)];
        let whole = [Read::ThreadOf(id), Read::InboxOf(id)];
        for reads in [&first[..], &whole[..]] {
            // (the record to report, decided)
            let (back, decided) = self
                .run(reads, |view, _, _| {
                    let Some(stored) = view.dispatch(id)? else {
                        return Ok(Plan::Done(Ok((None, true))));
                    };
                    let thread_epoch = view.thread(&stored.dispatch.thread)?.epoch;
                    let verdict = rules::reclaim(stored.dispatch.clone(), thread_epoch, now);
                    let reported = verdict.reported().cloned();
                    let d = match verdict {
                        Reclaim::Live => return Ok(Plan::Done(Ok((None, true)))),
                        Reclaim::Requeued(d)
                        | Reclaim::DeadLettered(d)
                        | Reclaim::Superseded(d) => d,
                    };
                    let Some(Applied { writes, wake }) =
                        applied(view, Status::Claimed, plain(d), now)?
                    else {
                        return Ok(Plan::Done(Ok((None, false))));
                    };
                    Ok(Plan::Write {
                        writes,
                        answer: Ok((reported, true)),
                        wake,
                    })
                })
                .await?;
            if decided {
                return Ok(back);
            }
        }
        Err(StoreError::Contention(format!(
            "dispatch {id}: its thread kept changing while it was reclaimed"
        )))
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
        // A minted id is new; a chosen one may be stored already, on this thread or another,
        // settled (so not in a host's view) or minted earlier (so without an id record): only
        // a read of the server tells.
        let reads = [Read::Thread(&new.thread), Read::Dispatch(&id)];
        let reads = if chosen { &reads[..] } else { &reads[..1] };
        self.run_reading(reads, chosen, |view, now, _| {
            if let Some(existing) = view.dispatch(&id)? {
                return Ok(Plan::Done(if same_content(&existing.dispatch, &new) {
                    Ok(existing.dispatch.clone())
                } else {
                    Err(StoreError::Duplicate {
                        id: id.clone(),
                        holder: None,
                    })
                }));
            }
            // T25: a debounced enqueue joins its key's open window, found among the thread's
            // live records; the thread's tree fences the join as it fences an enqueue, so a
            // claim that closed the window first makes this decide again.
            if let Some(spec) = &new.debounce
                && let Some(open) = view
                    .live_of(&new.thread)
                    .into_iter()
                    .find(|s| window::is_open(&s.dispatch, &spec.key))
            {
                if let Err(e) = window::check_join(&open.dispatch, &new) {
                    return Ok(Plan::Refuse(Err(e)));
                }
                let d = window::joined(open.dispatch.clone(), &new, now);
                let Applied { writes, wake } = changed(view, Status::Queued, plain(d.clone()))?;
                if writes
                    .first()
                    .is_some_and(|w| fits_with_output(w, &d, &room).is_ok())
                {
                    let due = d.available_at <= now;
                    return Ok(Plan::Write {
                        writes,
                        answer: Ok(d),
                        wake: wake || due,
                    });
                }
                // Full: sealed and due now, and this enqueue opens the next window.
                let full = window::sealed(open.dispatch.clone(), now);
                let Applied { mut writes, .. } = changed(view, Status::Queued, plain(full))?;
                let t = view.thread(&new.thread)?;
                let d = queued_record(&id, &new, t.epoch, now);
                let write = put_dispatch_expecting(Expect::None, plain(d.clone()))?;
                if let Err(e) = fits_with_output(&write, &d, &room) {
                    return Ok(Plan::Done(Err(e)));
                }
                writes.push(write);
                return Ok(Plan::Write {
                    writes,
                    answer: Ok(d),
                    wake: true,
                });
            }
            // The thread's tree fences the write, so the dedupe check and the epoch stamped
            // here are current at commit: no concurrent enqueue or interrupt slips between
            // (neither an enqueue stamped with an epoch an interrupt already moved past, nor two
            // enqueues that both saw a dedupe key free).
            if let Some(key) = &new.dedupe_key
                && let Some(holder) = view
                    .live_of(&new.thread)
                    .into_iter()
                    .find(|s| s.dispatch.dedupe_key.as_ref() == Some(key))
            {
                return Ok(Plan::Refuse(Err(StoreError::Duplicate {
                    id: id.clone(),
                    holder: Some(holder.dispatch.id.clone()),
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
            let write = put_dispatch_expecting(
                Expect::Thread(view.thread_seq(&new.thread)),
                plain(d.clone()),
            )?;
            if let Err(e) = fits_with_output(&write, &d, &room) {
                return Ok(Plan::Done(Err(e)));
            }
            writes.push(write);
            Ok(Plan::Write {
                writes,
                answer: Ok(d),
                wake: true,
            })
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
        // The log's end too: a first claim keeps it (`log_from`).
        self.run(&[Read::ThreadOf(id), Read::LogOf(id)], |view, now, _| {
            let Some(stored) = view
                .dispatch(id)?
                .filter(|s| s.dispatch.status == Status::Queued)
            else {
                return Ok(Plan::Refuse(Ok(None)));
            };
            let d = stored.dispatch.clone();
            let thread_epoch = view.thread(&d.thread)?.epoch;
            if rules::stale(&d, thread_epoch) {
                let d = rules::superseded(d, now, REASON_STALE_EPOCH);
                let Applied { writes, wake } = changed(view, Status::Queued, plain(d))?;
                return Ok(Plan::Write {
                    writes,
                    answer: Ok(None),
                    wake,
                });
            }
            let mut writes = Vec::new();
            if let Some(h) = view.holder(&d.thread) {
                // A waiting dispatch keeps its thread's turn; a live lease its claim.
                if h.dispatch.status == Status::Waiting || lease_live(&h.dispatch, now) {
                    return Ok(Plan::Refuse(Ok(None)));
                }
                // Take over from an expired holder: reclaim it and claim this one in one
                // atomic batch, decided by the first message's expectation.
                let back = match rules::reclaim(h.dispatch.clone(), thread_epoch, now) {
                    Reclaim::Live => return Ok(Plan::Refuse(Ok(None))),
                    Reclaim::Requeued(d) | Reclaim::DeadLettered(d) | Reclaim::Superseded(d) => d,
                };
                // The view holds the thread, whose queued `d` is live: a dead letter's inbox
                // waits for `d`'s run, so the verdict never needs more of the thread.
                let Some(Applied { writes: back, .. }) =
                    applied(view, Status::Claimed, plain(back), now)?
                else {
                    return Ok(Plan::Refuse(Ok(None)));
                };
                writes.extend(back);
            }
            let log = view.latest(&d.thread);
            let d = match rules::take(d, (thread_epoch, log), consumer, lease_ms, now, false) {
                Take::Claimed(d) => d,
                // Not reached: the epoch was checked above.
                Take::Stale(_) => return Ok(Plan::Refuse(Ok(None))),
            };
            // A reclaim took over first: it fences the batch, and claimers wake for it.
            let wake = !writes.is_empty();
            let mut claim = in_batch(view, Status::Queued, plain(d.clone()))?;
            if !wake {
                fence_first(view, &d.thread, &mut claim);
            }
            writes.extend(claim);
            Ok(Plan::Write {
                writes,
                answer: Ok(Some(d)),
                wake,
            })
        })
        .await
    }

    async fn hold(&self, id: &str, token: &str, op: HolderOp) -> StoreResult<Dispatch> {
        let room = self.room();
        op.check_output(room.value, &room.value_why())?;
        let op = match op {
            // A claim under a slot block keeps its lease within the block's; once the block
            // has lapsed, its slots may be another's, and the claim is lost.
            HolderOp::Extend {
                extension_ms,
                until_max,
            } => {
                let Some(block) = self.lease_in_block(id, extension_ms).await else {
                    return Err(StoreError::LostClaim { id: id.to_owned() });
                };
                let until_max = match (until_max, block) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                HolderOp::Extend {
                    extension_ms,
                    until_max,
                }
            }
            op => op,
        };
        self.holder_write(id, token, op).await
    }

    async fn claim_gated(&self, req: &ClaimRequest<'_>) -> StoreResult<Gated> {
        self.claim_gated_inner(req).await
    }

    /// The holder's own write stands in for the claim's barrier: everything stored before
    /// this call has a lower stream sequence than the write, which the server stored after the
    /// call began, so once the watcher has applied the write's sequence the view holds all of
    /// it, and the claim needs no request for the stream's last sequence. The claim sees the
    /// write too (applied to this instance's view when acknowledged). A write that stored
    /// nothing (refused) is followed by a barrier.
    async fn hold_and_claim(
        &self,
        id: &str,
        token: &str,
        op: HolderOp,
        next: &ClaimRequest<'_>,
    ) -> (StoreResult<Dispatch>, StoreResult<Gated>) {
        if !self.follows() {
            let done = self.hold(id, token, op).await;
            return (done, self.claim_gated_inner(next).await);
        }
        let (done, acked) = Self::acked_in(self.hold(id, token, op)).await;
        let caught_up = if acked > 0 {
            self.wait_for(acked).await
        } else {
            self.barrier().await
        };
        let next = match caught_up {
            Ok(()) => self.claim_gated_caught_up(next).await,
            Err(e) => Err(e),
        };
        (done, next)
    }

    async fn cancel(&self, id: &str) -> StoreResult<Option<Dispatch>> {
        self.run(&[Read::Dispatch(id)], |view, now, _| {
            let Some(stored) = view
                .dispatch(id)?
                .filter(|s| s.dispatch.status.can_cancel())
            else {
                return Ok(Plan::Refuse(Ok(None)));
            };
            // A waiting dispatch held its thread: cancelling it frees the thread (and cancels
            // its pending waitpoints, as every end of a dispatch does).
            let before = stored.dispatch.status;
            let mut d = stored.dispatch.clone();
            rules::terminate(&mut d, Status::Cancelled, now, None);
            let record = Stored {
                dispatch: d.clone(),
                ..stored.clone()
            };
            // A cancel answers no inbox: the verdict never needs the whole thread.
            let Some(Applied { writes, wake }) = applied(view, before, record, now)? else {
                return Ok(Plan::Done(Ok(None)));
            };
            Ok(Plan::Write {
                writes,
                answer: Ok(Some(d)),
                wake,
            })
        })
        .await
    }

    async fn interrupt(&self, thread: &str, reason: &str) -> StoreResult<Interrupt> {
        if thread.trim().is_empty() {
            return Err(StoreError::Invalid("thread is blank".into()));
        }
        // One atomic batch: the epoch bump, fenced by the thread's tree, then the waiting and
        // queued dispatches superseded, each after its pending waitpoints cancelled. Past one
        // batch's worth, the rest follow in further batches (the waiting one, which holds the
        // thread, in the first); a claim meanwhile finds their epoch stale and supersedes them
        // instead of running them.
        let mut epoch = 0;
        let mut active = None;
        let mut ids: Vec<String> = Vec::new();
        let mut first = true;
        loop {
            let (more, chunk) = self
                .run(&[Read::Thread(thread)], |view, now, _| {
                    let mut t = view.thread(thread)?;
                    let mut writes = Vec::new();
                    if first {
                        t.epoch += 1;
                        epoch = t.epoch;
                        active = view
                            .holder(thread)
                            .filter(|s| s.dispatch.status == Status::Claimed)
                            .map(|s| s.dispatch.clone());
                        writes.push(put_thread(view, thread, t)?);
                    }
                    let room = MAX_BATCH.saturating_sub(writes.len());
                    let s = superseding(view, thread, epoch, reason, now, room)?;
                    let (more, chunk) = (s.more, s.ids);
                    writes.extend(s.writes);
                    if writes.is_empty() {
                        return Ok(Plan::Done(Ok((false, chunk))));
                    }
                    fence_first(view, thread, &mut writes);
                    Ok(Plan::Write {
                        writes,
                        answer: Ok((more, chunk)),
                        wake: true,
                    })
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
        self.run(&[Read::Dispatch(id)], |view, now, _| {
            let found = view.dispatch(id)?.map(Stored::found);
            Ok(
                match rules::supersede_claimed(found, id, token, reason, now) {
                    SupersedeClaimed::Nothing => Plan::Refuse(Ok(None)),
                    SupersedeClaimed::Repeat(d) => Plan::Done(Ok(Some(d))),
                    SupersedeClaimed::Refuse(e) => Plan::Refuse(Err(e)),
                    SupersedeClaimed::Supersede { record, token } => {
                        let stored = settled(record.clone(), &token, Settle::Supersede);
                        let Applied { writes, wake } = changed(view, Status::Claimed, stored)?;
                        Plan::Write {
                            writes,
                            answer: Ok(Some(record)),
                            wake,
                        }
                    }
                },
            )
        })
        .await
    }

    async fn reclaim_expired(&self, now: u64, limit: usize) -> StoreResult<Vec<Dispatch>> {
        let mut expired: Vec<(u64, String)> = self
            .read_view(&[Read::All], |view| {
                view.claimed()
                    .filter(|s| rules::lease_expired(&s.dispatch, now))
                    .filter_map(|s| {
                        Some((
                            s.dispatch.claim.as_ref()?.lease_until,
                            s.dispatch.id.clone(),
                        ))
                    })
                    .collect()
            })
            .await?;
        expired.sort();
        expired.truncate(limit);
        let mut out = Vec::new();
        for (_, id) in expired {
            out.extend(self.reclaim_one(&id, now).await?);
        }
        // A host's sweep also moves settled records out of the threads' trees (`archive`).
        // It is upkeep: a failure is reported and retried at the next sweep, never the
        // reclaim's.
        if self.follows()
            && let Err(e) = self.archive_settled(now).await
        {
            tracing::warn!(error = %e, "nats: archiving settled records failed");
        }
        // And removes the journals of dispatches no longer stored (`journal`).
        if self.follows()
            && let Err(e) = self.sweep_journals(false).await
        {
            tracing::warn!(error = %e, "nats: removing the journals of removed dispatches failed");
        }
        Ok(out)
    }

    async fn purge_terminal(&self, older_than: u64) -> StoreResult<usize> {
        let purged = self.purge_settled(older_than).await?;
        // The journals of the purged dispatches go with them (`journal`).
        self.sweep_journals(true).await?;
        Ok(purged)
    }

    async fn load(&self, id: &str) -> StoreResult<Option<Dispatch>> {
        self.load_dispatch(id).await
    }

    async fn list(&self, filter: &ListFilter) -> StoreResult<Vec<Dispatch>> {
        self.list_dispatches(filter).await
    }

    async fn list_rows(&self, filter: &ListFilter) -> StoreResult<Vec<DispatchRow>> {
        self.list_dispatches(filter).await
    }

    async fn counts(&self) -> StoreResult<Vec<StatusCount>> {
        self.count_dispatches().await
    }

    async fn live_counts(&self) -> StoreResult<Vec<StatusCount>> {
        self.count_live_dispatches().await
    }

    async fn list_terminal(&self, limit: usize, offset: usize) -> StoreResult<Vec<Dispatch>> {
        self.list_terminal_dispatches(limit, offset).await
    }

    async fn thread_epoch(&self, thread: &str) -> StoreResult<u64> {
        self.epoch_of(thread).await
    }

    async fn queued_threads(&self) -> StoreResult<Vec<String>> {
        self.threads_with_queued_work().await
    }

    async fn has_live_work(&self) -> StoreResult<bool> {
        self.any_live_work().await
    }

    async fn close(&self) {
        NatsStore::close(self).await;
    }

    fn expires_settled(&self) -> bool {
        self.inner.settled_ttl.is_some()
    }

    fn work_signal(&self) -> Arc<Notify> {
        self.work_signal_handle()
    }

    fn max_value(&self) -> u64 {
        self.room().value
    }

    fn feed_restarts(&self) -> Option<u64> {
        Some(self.watcher_restarts())
    }
}
