//! The inbox of the NATS backend (the contract, docs/contract.md, section 9).
//!
//! Each message is its own record `<p>.th.<thread>.m.<seq>` in its thread's tree (framed like
//! a dispatch record: its fields as JSON, then the payload; see `keys`), so every inbox write
//! is fenced by the thread's tree like every other write of the thread, and the watcher
//! delivers messages with everything else. The watermarks are derived, not counted: `latest`
//! is the highest message sequence the tree holds (or the thread record's `inbox_archived`,
//! once purged messages left the tree), `pending` the pending records, and `followed` lives on
//! the thread record. So each operation is one message or one atomic batch:
//!
//! - send (M1): `m.<seq>`; with a follow-up (M4, case a) an atomic batch of `m.<seq>`, each
//!   follow-up `d.<id>` and the thread record (`inbox_followed`);
//! - acknowledge (M2): an atomic batch of `e.<log seq>` (the entry, with the message's note)
//!   and the acked `m.<seq>`, fenced exactly like a fenced append;
//! - discard (M3): atomic batches of up to [`MAX_BATCH`] `m.*` records;
//! - a settlement that leaves the thread idle with messages no follow-up covers (M4, case b):
//!   see [`answer_inbox`], used by the mailbox's holder writes and reclaims.
//!
//! A host's view keeps the pending messages' heads (not their payloads) and each thread's last
//! agent; a message's payload, which never changes, is read with one direct get when an
//! operation writes the message again. A client reads the thread's message records with its
//! thread record when an operation decides on them (`fetch`).
//!
//! Purging settled messages deletes them from the tree, after a fenced rewrite of the thread
//! record (which also raises `inbox_archived` to the highest sequence purged, so `latest`
//! never moves back) so that none of them is the tree's last message: the same three steps the
//! archiver takes for dispatch records (see `archive`).
//!
//! Watches: a host's watcher wakes a thread's watches whenever it applies a record of the
//! thread's tree, and this instance's own writes wake them at once. A client (no watcher)
//! subscribes on core NATS to the thread's tree subjects while a watch is open: every write of
//! the tree is published there, so the subscription is a hint of exactly the right scope.

use std::collections::{BTreeMap, HashMap};
use std::sync::Weak;

use async_trait::async_trait;
use futures_util::StreamExt;
use serde_json::json;

use super::commit::{Expect, MAX_BATCH, Plan, Write, fence_first, plain, put_thread};
use super::effects::{follow_up_writes, in_batch, superseding};
use super::fetch::{PAGE, Read};
use super::keys::{Key, decode_message, encode_entry, encode_message};
use super::view::{MessageHead, Record};
use super::{Inner, NatsStore};
use crate::store::inbox::{
    Inbox, InboxMarks, Message, MessageFilter, MessageKind, MessageState, NOTE_ROOM, NewMessage,
    OnBusy, Sent, ThreadWatch,
};
use crate::store::model::window::FOLLOW_UP_WINDOW;
use crate::store::model::{EntryNote, Status, TurnEvent};
use crate::store::rules::inbox::{
    Stopped, follow_up_dispatch, follow_up_targets, follow_up_window, merge_agent,
    reopened as reopened_message, send_verdict, turn_mark,
};
use crate::store::rules::{self, ByteBudget, queued_record, window};
use crate::store::{Fence, StoreError, StoreResult};

/// Settled messages purged per call at most; the rest go at the next.
const PURGE_PER_CALL: usize = 100_000;
/// The most message records a bounded page reads at once.
const READ_CONCURRENCY: usize = 16;

/// A write of a message record with the expectation given.
fn put_message(expect: Expect, message: &Message) -> StoreResult<Write> {
    let payload = encode_message(message)?;
    let head = MessageHead::of(message, payload.len());
    Ok(Write {
        key: Key::Message(message.thread.clone(), message.seq),
        expect,
        payload,
        record: Record::Message(message.thread.clone(), message.seq, Box::new(head)),
    })
}

/// What an acknowledgement decided.
enum Acked {
    /// The entry's sequence.
    At(u64),
    /// The message's content must be read again (it was sent after it was read).
    Again,
}

/// The answer to an acknowledgement of a message that is no longer pending.
fn settled_answer(
    thread: &str,
    seq: u64,
    fence: &Fence,
    state: MessageState,
    acked_by: Option<&str>,
    log_seq: Option<u64>,
) -> StoreResult<Acked> {
    match state {
        MessageState::Acked => match (acked_by, log_seq) {
            (Some(by), Some(log_seq)) if by == fence.dispatch => Ok(Acked::At(log_seq)),
            (by, _) => Err(StoreError::Duplicate {
                id: fence.dispatch.clone(),
                holder: Some(by.unwrap_or_default().to_owned()),
            }),
        },
        MessageState::Discarded => Err(StoreError::Invalid(format!(
            "seq: message {seq} of thread `{}` was discarded",
            thread.escape_debug()
        ))),
        // Not reached: callers pass settled states.
        MessageState::Pending => Ok(Acked::Again),
    }
}

fn no_message(thread: &str, seq: u64) -> StoreError {
    StoreError::Invalid(format!(
        "seq: thread `{}` has no message {seq}",
        thread.escape_debug()
    ))
}

impl NatsStore {
    /// Message `seq` of `thread` as stored now (one direct get).
    async fn fetch_message(&self, thread: &str, seq: u64) -> StoreResult<Option<Message>> {
        Ok(self.fetch_message_at(thread, seq).await?.map(|(_, m)| m))
    }

    /// [`NatsStore::fetch_message`] with the record's stream sequence.
    async fn fetch_message_at(
        &self,
        thread: &str,
        seq: u64,
    ) -> StoreResult<Option<(u64, Message)>> {
        let key = Key::Message(thread.to_owned(), seq);
        match self.get_last(&key.subject(self.prefix())).await? {
            Some((at, payload)) => Ok(Some((at, decode_message(&key, &payload)?))),
            None => Ok(None),
        }
    }

    /// The last message of each subject matching `filter`, with its stream sequence: one
    /// `multi_last` request, or pages of every message when it matches more subjects than one
    /// such request answers.
    pub(super) async fn last_of_each(
        &self,
        filter: &str,
    ) -> StoreResult<HashMap<String, (u64, bytes::Bytes)>> {
        let mut out: HashMap<String, (u64, bytes::Bytes)> = HashMap::new();
        let mut keep = |seq: u64, subject: &str, payload: &bytes::Bytes| {
            if out.get(subject).is_none_or(|(at, _)| *at < seq) {
                out.insert(subject.to_owned(), (seq, payload.clone()));
            }
        };
        let batch = self
            .get_batch(json!({ "multi_last": [filter], "batch": PAGE }))
            .await?;
        if !batch.too_many && batch.pending == 0 {
            for got in &batch.messages {
                keep(got.seq, &got.subject, &got.payload);
            }
            return Ok(out);
        }
        self.scan(Some(filter), |batch| {
            for got in &batch.messages {
                keep(got.seq, &got.subject, &got.payload);
            }
        })
        .await?;
        Ok(out)
    }

    /// Every message record of `thread`, by sequence.
    async fn fetch_messages(&self, thread: &str) -> StoreResult<BTreeMap<u64, Message>> {
        let prefix = self.prefix().to_owned();
        let mut out = BTreeMap::new();
        for (subject, (_, payload)) in self
            .last_of_each(&Key::messages_of(&prefix, thread))
            .await?
        {
            let Some(key @ Key::Message(..)) = Key::parse(&prefix, &subject) else {
                continue;
            };
            let message = decode_message(&key, &payload)?;
            out.insert(message.seq, message);
        }
        Ok(out)
    }

    /// A client's watch: a core NATS subscription on the thread's tree, one per thread and
    /// kept while a watch of the thread is open, that wakes the thread's watches on every
    /// message published there. A new subscription wakes them once as soon as the server has
    /// it, so that a change made before it took effect is seen by the waiter's next read.
    fn watch_from_client(&self, thread: &str) -> ThreadWatch {
        // Registered first: a subscription ending now sees it and stays (see below).
        let watch = self.inner.watches.watch(thread);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return watch;
        };
        {
            let Ok(mut subscribed) = self.inner.subscribed.lock() else {
                return watch;
            };
            if !subscribed.insert(thread.to_owned()) {
                return watch;
            }
        }
        let weak: Weak<Inner> = std::sync::Arc::downgrade(&self.inner);
        let subject = Key::tree(self.prefix(), thread);
        let thread = thread.to_owned();
        let client = self.inner.client.clone();
        let dropped = self.inner.dropped.clone();
        runtime.spawn(async move {
            let subscription = async {
                let subscription = client.subscribe(subject).await.ok()?;
                client.flush().await.ok()?;
                Some(subscription)
            };
            let mut subscription = tokio::select! {
                s = subscription => s,
                () = dropped.notified() => None,
            };
            // Ends the subscription unless a watch of the thread is still open; decided under
            // the lock a new watch takes to find a subscription.
            let end = |weak: &Weak<Inner>| {
                let Some(inner) = weak.upgrade() else {
                    return true;
                };
                let Ok(mut subscribed) = inner.subscribed.lock() else {
                    return true;
                };
                if inner.watches.threads().contains(&thread) {
                    return false;
                }
                subscribed.remove(&thread);
                true
            };
            let Some(sub) = subscription.as_mut() else {
                if let Some(inner) = weak.upgrade()
                    && let Ok(mut subscribed) = inner.subscribed.lock()
                {
                    subscribed.remove(&thread);
                }
                return;
            };
            if let Some(inner) = weak.upgrade() {
                inner.watches.notify(&thread);
            }
            loop {
                let gone = dropped.notified();
                tokio::pin!(gone);
                gone.as_mut().enable();
                if weak.strong_count() == 0 {
                    return;
                }
                let next = tokio::select! {
                    next = sub.next() => next,
                    () = gone => None,
                };
                if next.is_none() {
                    if let Some(inner) = weak.upgrade()
                        && let Ok(mut subscribed) = inner.subscribed.lock()
                    {
                        subscribed.remove(&thread);
                    }
                    return;
                }
                if let Some(inner) = weak.upgrade() {
                    inner.watches.notify(&thread);
                }
                if end(&weak) {
                    return;
                }
            }
        });
        watch
    }
}

/// The most messages a merge reopens: they share the atomic batch with the mark, the message,
/// the follow-ups and the superseded work.
const MAX_REOPENED: usize = MAX_BATCH - 32;

impl NatsStore {
    /// One decision of [`Inbox::send`]: `None` when a merge's messages (`acked`, read at a tree
    /// sequence) are not current with the view it decides on.
    async fn send_once(
        &self,
        thread: &str,
        new: &NewMessage,
        max_pending: u64,
        reads: &[Read<'_>],
        acked: Option<&(u64, BTreeMap<u64, Message>)>,
    ) -> StoreResult<Option<Sent>> {
        self.run(reads, |view, now, _| {
            let marks = view.inbox_marks(thread);
            if marks.pending >= max_pending {
                return Ok(Plan::Refuse(Err(StoreError::Limit(format!(
                    "max_inbox: thread `{}` already has {} pending messages (the limit is {max_pending})",
                    thread.escape_debug(),
                    marks.pending
                )))));
            }
            // Under a policy, what holds the thread decides the kind (or refuses) and whether
            // the send stops it; the write is fenced by the thread's tree, so the holder read
            // here is the server's.
            let mut t = view.thread(thread)?;
            let holder = view.holder(thread).map(|s| &s.dispatch);
            let busy = holder.map(|d| d.id.clone());
            let verdict = match send_verdict(
                thread,
                new.kind,
                new.on_busy,
                holder.map(|d| (d.id.as_str(), !rules::stale(d, t.epoch))),
            ) {
                Ok(verdict) => verdict,
                Err(e) => return Ok(Plan::Refuse(Err(e))),
            };
            let kind = verdict.kind;
            let stop = verdict.stop.zip(holder);
            // A merge (M5): the messages the stopped run acknowledged, read from the server at
            // the view's tree sequence, else decided again on fresh reads.
            let mut reopened: Vec<Message> = Vec::new();
            if let Some((TurnEvent::Merged, holder)) = stop {
                if let Err(e) = merge_agent(new.agent.as_deref(), holder) {
                    return Ok(Plan::Refuse(Err(e)));
                }
                let Some((_, records)) = acked.filter(|(at, _)| *at == view.thread_seq(thread))
                else {
                    return Ok(Plan::Refuse(Ok(None)));
                };
                reopened = records
                    .values()
                    .filter(|m| {
                        m.state == MessageState::Acked
                            && m.acked_by.as_deref() == Some(holder.id.as_str())
                    })
                    .map(|m| reopened_message(m.clone()))
                    .collect();
                if reopened.len() > MAX_REOPENED {
                    return Ok(Plan::Refuse(Err(StoreError::Limit(format!(
                        "merge: the stopped run of thread `{}` acknowledged {} messages; one \
                         atomic batch reopens at most {MAX_REOPENED} (send it with `rollback`)",
                        thread.escape_debug(),
                        reopened.len()
                    )))));
                }
            }
            let interrupting = stop.map(|(_, d)| d.id.as_str());
            let starts_follow_up = kind == MessageKind::FollowUp
                && (interrupting.is_some() || view.live_of(thread).is_empty());
            let last_agent = view.last_agent(thread);
            if starts_follow_up && new.agent.is_none() && last_agent.is_none() {
                return Ok(Plan::Refuse(Err(StoreError::Invalid(format!(
                    "agent: thread `{}` has never run an agent; name the agent to answer this message",
                    thread.escape_debug()
                )))));
            }
            let seq = marks.latest + 1;
            let message = Message {
                thread: thread.to_owned(),
                seq,
                kind,
                payload: new.payload.clone(),
                metadata: new.metadata.clone(),
                agent: new.agent.clone(),
                sent_by: new.sent_by.clone(),
                sent_at: now,
                state: MessageState::Pending,
                settled_at: None,
                acked_by: None,
                log_seq: None,
                applied: verdict.applied(busy.is_some()),
            };
            // The follow-ups' targets, decided before the batch is filled: one write each.
            let default = new.agent.as_deref().or(last_agent.as_deref());
            let targets = if starts_follow_up {
                let mut uncovered: Vec<(u64, Option<&str>)> = reopened
                    .iter()
                    .map(|m| (m.seq, m.agent.as_deref()))
                    .collect();
                uncovered.extend(
                    view.pending_after(thread, t.inbox_followed)
                        .into_iter()
                        .map(|(n, h)| (n, h.agent.as_deref())),
                );
                uncovered.push((seq, new.agent.as_deref()));
                follow_up_targets(uncovered, default)
            } else {
                Vec::new()
            };
            let mut writes = Vec::new();
            let mut interrupted = None;
            if let Some((event, holder)) = stop {
                // T4 for the whole thread and the turn's end in its log, in this batch; the
                // follow-up below waits for the stopped run to let the thread go.
                t.epoch += 1;
                let reason = format!("interrupted by message {seq} of its thread");
                // Room is left for the mark, the message, the thread, the reopened messages and
                // one follow-up per target; what does not fit is superseded later (its epoch
                // is stale from this batch on, so no claim runs it).
                let room = MAX_BATCH.saturating_sub(3 + reopened.len() + targets.len());
                writes.extend(superseding(view, thread, t.epoch, &reason, now, room)?.writes);
                let at = view.latest(thread) + 1;
                let turn = EntryNote::Turn {
                    turn: turn_mark(event, holder, seq, at),
                };
                writes.push(Write {
                    key: Key::Entry(thread.to_owned(), at),
                    expect: Expect::None,
                    payload: encode_entry(now, b"", Some(&turn))?,
                    record: Record::Entry(thread.to_owned(), at),
                });
                interrupted = Some((holder.id.clone(), at));
            }
            for m in &reopened {
                writes.push(put_message(Expect::None, m)?);
            }
            writes.push(put_message(Expect::None, &message)?);
            let mut follow_ups = Vec::new();
            if starts_follow_up {
                let mut records = Vec::new();
                // One window per (thread, key): only a lone follow-up of an idle thread waits
                // in the inbox's.
                let window = new
                    .follow_up_window
                    .filter(|_| targets.len() == 1 && interrupting.is_none())
                    .map(follow_up_window);
                for (agent, first, last) in targets {
                    let id = uuid::Uuid::now_v7().to_string();
                    let stopped = stop.map(|(event, dispatch)| Stopped {
                        dispatch,
                        merge: event == TurnEvent::Merged,
                    });
                    let mut new = follow_up_dispatch(&agent, thread, first, last, stopped);
                    new.debounce = window.clone();
                    follow_ups.push(id.clone());
                    records.push(queued_record(&id, &new, t.epoch, now));
                }
                t.inbox_followed = seq;
                writes.extend(follow_up_writes(thread, records, t)?);
            } else if interrupting.is_some() {
                writes.push(put_thread(view, thread, t)?);
            } else if kind == MessageKind::FollowUp
                && let Some(open) = view
                    .live_of(thread)
                    .into_iter()
                    .find(|s| window::is_open(&s.dispatch, FOLLOW_UP_WINDOW))
            {
                // A follow-up still waiting in its inbox window takes this message too, and
                // waits a quiet time more.
                let d = window::joined_by_message(open.dispatch.clone(), seq, now);
                writes.extend(in_batch(view, Status::Queued, plain(d))?);
                // It is covered by that follow-up now, so a run that leaves it pending does
                // not start a second one for it.
                t.inbox_followed = seq;
                writes.extend(follow_up_writes(thread, Vec::new(), t)?);
            }
            fence_first(view, thread, &mut writes);
            let wake = !follow_ups.is_empty() || interrupting.is_some();
            Ok(Plan::Write {
                writes,
                answer: Ok(Some(Sent {
                    message,
                    follow_ups,
                    applied: verdict.applied(busy.is_some()),
                    busy,
                    interrupted,
                    reopened: reopened.iter().map(|m| m.seq).collect(),
                })),
                wake,
            })
        })
        .await
    }
}

#[async_trait]
impl Inbox for NatsStore {
    async fn send(&self, thread: &str, new: NewMessage, max_pending: u64) -> StoreResult<Sent> {
        new.validate(thread, self.max_message())
            .map_err(StoreError::Invalid)?;
        // An interrupt may append the turn's mark: then the decision reads the log's end too.
        let interrupts = new.on_busy.is_some_and(OnBusy::stops);
        let reads = [Read::Thread(thread), Read::Inbox(thread), Read::Log(thread)];
        let reads = if interrupts { &reads[..] } else { &reads[..2] };
        let merges = new.on_busy == Some(OnBusy::Merge);
        for _ in 0..8 {
            // A merge reopens the messages the stopped run acknowledged, which have left a
            // host's view (it keeps pending ones): they are read from the server first, with the
            // tree's sequence they are current at, and the decision goes ahead only on a view at
            // that sequence (the batch is fenced by it).
            let acked = if merges {
                let at = self.tree_seq(thread).await?;
                Some((at, self.fetch_messages(thread).await?))
            } else {
                None
            };
            if let Some(sent) = self
                .send_once(thread, &new, max_pending, reads, acked.as_ref())
                .await?
            {
                return Ok(sent);
            }
        }
        Err(StoreError::Contention(format!(
            "thread `{}` kept changing while a merge read its messages; retry later",
            thread.escape_debug()
        )))
    }

    async fn ack_message(&self, thread: &str, seq: u64, fence: &Fence) -> StoreResult<u64> {
        let reads = [
            Read::Log(thread),
            Read::Dispatch(&fence.dispatch),
            Read::Inbox(thread),
        ];
        for _ in 0..8 {
            // Everything of a message but its state is written once, at send: the content read
            // here is the one the decision below writes, whatever the view's age. Its state is
            // decided on the view (fenced by the thread's tree), or, when it is settled here
            // already, answered from this record: a settled message never changes again.
            let fetched = self.fetch_message_at(thread, seq).await?;
            // A merge can return a settled message to pending (M5): a settled record read
            // before the view's newer record of it is no answer; read it again.
            let fetched_at = fetched.as_ref().map(|(at, _)| *at);
            let fetched = fetched.map(|(_, m)| m);
            let out = self
                .run(&reads, |view, now, _| {
                    if let Some(plan) = Self::fenced(view, thread, fence, now)? {
                        return Ok(match plan {
                            Plan::Done(r) => Plan::Done(r.map(Acked::At)),
                            Plan::Refuse(r) => Plan::Refuse(r.map(Acked::At)),
                            Plan::Write {
                                writes,
                                answer,
                                wake,
                            } => Plan::Write {
                                writes,
                                answer: answer.map(Acked::At),
                                wake,
                            },
                        });
                    }
                    let head = view.message(thread, seq);
                    if let Some(h) = head.filter(|h| h.state != MessageState::Pending) {
                        return Ok(Plan::Done(settled_answer(
                            thread,
                            seq,
                            fence,
                            h.state,
                            h.acked_by.as_deref(),
                            h.log_seq,
                        )));
                    }
                    if let Some(m) = fetched
                        .as_ref()
                        .filter(|m| m.state != MessageState::Pending)
                    {
                        if view
                            .message_at(thread, seq)
                            .zip(fetched_at)
                            .is_some_and(|(held, read)| held > read)
                        {
                            return Ok(Plan::Done(Ok(Acked::Again)));
                        }
                        return Ok(Plan::Done(settled_answer(
                            thread,
                            seq,
                            fence,
                            m.state,
                            m.acked_by.as_deref(),
                            m.log_seq,
                        )));
                    }
                    let message = match (head, &fetched) {
                        (Some(_), Some(m)) => m,
                        // Sent after it was read: read it again.
                        (Some(_), None) => return Ok(Plan::Done(Ok(Acked::Again))),
                        // Pending on the server but not in this view yet: decide again on
                        // fresh records.
                        (None, Some(_)) => return Ok(Plan::Refuse(Ok(Acked::Again))),
                        (None, None) => return Ok(Plan::Refuse(Err(no_message(thread, seq)))),
                    };
                    let log_seq = view.latest(thread) + 1;
                    let entry = Write {
                        key: Key::Entry(thread.to_owned(), log_seq),
                        expect: Expect::Thread(view.thread_seq(thread)),
                        payload: encode_entry(
                            now,
                            &message.payload,
                            Some(&EntryNote::Message(message.note())),
                        )?,
                        record: Record::Entry(thread.to_owned(), log_seq),
                    };
                    let mut acked = message.clone();
                    acked.state = MessageState::Acked;
                    acked.settled_at = Some(now);
                    acked.acked_by = Some(fence.dispatch.clone());
                    acked.log_seq = Some(log_seq);
                    Ok(Plan::Write {
                        writes: vec![entry, put_message(Expect::None, &acked)?],
                        answer: Ok(Acked::At(log_seq)),
                        wake: false,
                    })
                })
                .await?;
            match out {
                Acked::At(log_seq) => return Ok(log_seq),
                Acked::Again => continue,
            }
        }
        Err(StoreError::Contention(format!(
            "message {seq} of thread `{}` kept changing while it was acknowledged",
            thread.escape_debug()
        )))
    }

    async fn discard_messages(&self, thread: &str, through: u64) -> StoreResult<usize> {
        let mut total = 0usize;
        let mut rounds = 0usize;
        loop {
            rounds += 1;
            if rounds > 64 + through.min(1 << 20) as usize / MAX_BATCH {
                return Err(StoreError::Contention(format!(
                    "the inbox of thread `{}` kept changing while it was discarded",
                    thread.escape_debug()
                )));
            }
            // The messages' content (written once, at send) for the records written again.
            let contents = self.fetch_messages(thread).await?;
            // (discarded now, more to do, read again)
            let (n, more, again) = self
                .run(&[Read::Inbox(thread)], |view, now, _| {
                    let doomed: Vec<u64> = view
                        .pending_after(thread, 0)
                        .into_iter()
                        .map(|(n, _)| n)
                        .take_while(|n| *n <= through)
                        .collect();
                    if doomed.is_empty() {
                        return Ok(Plan::Refuse(Ok((0, false, false))));
                    }
                    let more = doomed.len() > MAX_BATCH;
                    let mut writes = Vec::new();
                    for n in doomed.into_iter().take(MAX_BATCH) {
                        let Some(m) = contents.get(&n) else {
                            return Ok(Plan::Done(Ok((0, true, true))));
                        };
                        let mut m = m.clone();
                        m.state = MessageState::Discarded;
                        m.settled_at = Some(now);
                        let expect = if writes.is_empty() {
                            Expect::Thread(view.thread_seq(thread))
                        } else {
                            Expect::None
                        };
                        writes.push(put_message(expect, &m)?);
                    }
                    let n = writes.len();
                    Ok(Plan::Write {
                        writes,
                        answer: Ok((n, more, false)),
                        wake: false,
                    })
                })
                .await?;
            total += n;
            if !more && !again {
                return Ok(total);
            }
        }
    }

    async fn message(&self, thread: &str, seq: u64) -> StoreResult<Option<Message>> {
        self.fetch_message(thread, seq).await
    }

    async fn messages(&self, thread: &str, filter: &MessageFilter) -> StoreResult<Vec<Message>> {
        let limit = crate::store::rules::page(filter.limit);
        let Some(budget) = filter.max_bytes else {
            return Ok(self
                .fetch_messages(thread)
                .await?
                .into_values()
                .filter(|m| m.seq > filter.after && filter.state.is_none_or(|s| s == m.state))
                .take(limit)
                .collect());
        };
        // With a budget: the sequences to read (the pending ones from the view's message heads,
        // which every view keeps; for another state every sequence the thread still holds),
        // then the records one by one (a few in flight) until the page is full or the budget
        // spent. A record whose state moved on since the view was read is left out, as a later
        // read would.
        let seqs: Vec<u64> = self
            .read_view(&[Read::Inbox(thread)], |view| {
                if filter.state == Some(MessageState::Pending) {
                    return Ok(view.message_seqs(thread, filter.after, filter.state, limit));
                }
                let floor = view.thread(thread)?.inbox_archived.max(filter.after);
                Ok((floor.saturating_add(1)..=view.inbox_marks(thread).latest).collect())
            })
            .await??;
        let mut budget = ByteBudget::new(Some(budget));
        let in_flight = budget.in_flight(self.room().record, READ_CONCURRENCY);
        let mut fetched = futures_util::stream::iter(seqs)
            .map(|seq| self.fetch_message(thread, seq))
            .buffered(in_flight);
        let mut out = Vec::new();
        while budget.open()
            && out.len() < limit
            && let Some(found) = fetched.next().await
        {
            if let Some(m) = found?.filter(|m| filter.state.is_none_or(|s| s == m.state)) {
                budget.take(m.payload.len());
                out.push(m);
            }
        }
        Ok(out)
    }

    async fn inbox(&self, thread: &str) -> StoreResult<InboxMarks> {
        self.read_view(&[Read::Inbox(thread)], |view| view.inbox_marks(thread))
            .await
    }

    async fn purge_messages(&self, older_than: u64) -> StoreResult<usize> {
        let prefix = self.prefix().to_owned();
        // Per thread: the highest sequence purged and the stream sequences of the records.
        let mut doomed: BTreeMap<String, (u64, Vec<u64>)> = BTreeMap::new();
        let mut count = 0usize;
        for (subject, (at, payload)) in self.last_of_each(&Key::all_messages(&prefix)).await? {
            if count >= PURGE_PER_CALL {
                break;
            }
            let Some(key @ Key::Message(..)) = Key::parse(&prefix, &subject) else {
                continue;
            };
            // A damaged record stays where it is.
            let Ok(m) = decode_message(&key, &payload) else {
                continue;
            };
            if m.state == MessageState::Pending || m.settled_at.is_none_or(|s| s >= older_than) {
                continue;
            }
            let entry = doomed.entry(m.thread).or_default();
            entry.0 = entry.0.max(m.seq);
            entry.1.push(at);
            count += 1;
        }
        let mut purged = 0;
        for (thread, (highest, seqs)) in doomed {
            // A fenced write after the records, so that none of them is the tree's last
            // message when it is deleted (see `archive`), which also keeps `latest`.
            self.run(&[Read::Inbox(&thread)], |view, _, _| {
                let mut rec = view.thread(&thread)?;
                rec.inbox_archived = rec.inbox_archived.max(highest);
                Ok(Plan::Write {
                    writes: vec![super::commit::put_thread(view, &thread, rec)?],
                    answer: Ok(()),
                    wake: false,
                })
            })
            .await?;
            for seq in seqs {
                if self.delete_seq(seq).await? {
                    purged += 1;
                }
            }
        }
        Ok(purged)
    }

    async fn pending_total(&self) -> StoreResult<u64> {
        if self.follows() {
            self.barrier().await?;
            return Ok(self.view()?.pending_total());
        }
        let prefix = self.prefix().to_owned();
        let mut total = 0;
        for (subject, (_, payload)) in self.last_of_each(&Key::all_messages(&prefix)).await? {
            if let Some(key @ Key::Message(..)) = Key::parse(&prefix, &subject)
                && let Ok(Record::Message(_, _, head)) = key.decode(&payload)
                && head.state == MessageState::Pending
            {
                total += 1;
            }
        }
        Ok(total)
    }

    fn watch(&self, thread: &str) -> ThreadWatch {
        if self.follows() {
            self.inner.watches.watch(thread)
        } else {
            self.watch_from_client(thread)
        }
    }

    fn max_message(&self) -> u64 {
        self.room().entry.saturating_sub(NOTE_ROOM)
    }
}
