//! The commit engine of the NATS backend: every operation decides from the view what to write
//! (a [`Plan`]), and [`NatsStore::run`] commits it as one message or one atomic batch fenced by
//! the expectations of its [`Write`]s, deciding again after a barrier when an expectation
//! failed or the view's answer was a refusal that must be confirmed.

use std::time::Duration;

use async_nats::HeaderMap;
use bytes::Bytes;

use super::NatsStore;
use super::fetch::Read;
pub(super) use super::jetstream::CommitError;
use super::jetstream::stored_seq;
use super::keys::{Key, encode_dispatch, encode_thread, encode_waitpoint};
use super::view::{Record, Stored, ThreadRec, View};
use crate::store::model::Dispatch;
use crate::store::waitpoints::Waitpoint;
use crate::store::{StoreError, StoreResult};

/// What a write expects of the stream before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Expect {
    /// The last sequence of the key's own subject (0: never written).
    Subject(u64),
    /// The last sequence of the key's whole thread tree (0: the thread was never written).
    Thread(u64),
    /// The last sequence of the named thread's tree, for a key outside every tree (a journal
    /// record): fenced by the thread without moving its last sequence.
    Tree(String, u64),
    /// Nothing: a later message of an atomic batch whose first message carries the
    /// expectation for the whole batch.
    None,
}

/// One write (one message).
pub(super) struct Write {
    /// Where it goes.
    pub key: Key,
    /// What the stream must hold before it.
    pub expect: Expect,
    /// What the view holds once it is stored.
    pub record: Record,
    /// The message payload.
    pub payload: Bytes,
}

/// What an operation decided from the view.
pub(super) enum Plan<T> {
    /// The answer, with nothing to write.
    Done(StoreResult<T>),
    /// A refusal read from the view; confirmed after a barrier before it is returned.
    Refuse(StoreResult<T>),
    /// Writes to commit atomically, then the answer (an error answer still commits the
    /// writes: a stale-epoch holder write supersedes the dispatch and fails).
    Write {
        /// The messages, stored all or none.
        writes: Vec<Write>,
        /// What the caller gets once they are stored.
        answer: StoreResult<T>,
        /// Whether the writes may have made work claimable (this instance's workers are
        /// woken at once; other instances' watchers wake theirs).
        wake: bool,
    },
}

/// How many times an operation decides again after a failed expectation.
const MAX_ATTEMPTS: usize = 64;
/// The longest pause before deciding again after a conflict.
const MAX_BACKOFF: Duration = Duration::from_millis(20);

/// A random pause before attempt `attempt + 1` after a conflict: none after the first, then
/// up to 100 µs doubling to [`MAX_BACKOFF`]. Writers that lost a race spread out instead of
/// racing again in lockstep, so a single writer (an operator's interrupt against a thread a
/// guest appends to) is not starved by a busy one.
fn backoff(attempt: usize) -> Option<Duration> {
    if attempt == 0 {
        return None;
    }
    let ceiling = Duration::from_micros(100)
        .saturating_mul(1u32 << attempt.min(16))
        .min(MAX_BACKOFF);
    Some(ceiling.mul_f64(fastrand::f64()))
}

tokio::task_local! {
    /// The highest stream sequence the server acknowledged to the commits made inside a
    /// [`NatsStore::acked_in`] scope (0 while none).
    static ACKED: std::cell::Cell<u64>;
}

/// A test's hold on the moment between a commit's acknowledgement and its own apply
/// ([`View::apply_own`]): in production nothing holds it, and a commit passes with one atomic
/// load. A descheduled task makes the same gap; the hold makes it as long as a test needs
/// (see [`NatsStore::hold_own_applies`]).
#[derive(Debug, Default)]
pub(super) struct OwnHold {
    held: std::sync::atomic::AtomicBool,
    parked: std::sync::atomic::AtomicUsize,
    changed: tokio::sync::Notify,
}

impl OwnHold {
    /// Waits while the hold is on.
    async fn pass(&self) {
        use std::sync::atomic::Ordering;
        if !self.held.load(Ordering::Acquire) {
            return;
        }
        self.parked.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_waiters();
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !self.held.load(Ordering::Acquire) {
                break;
            }
            changed.await;
        }
        self.parked.fetch_sub(1, Ordering::AcqRel);
    }

    pub(super) fn set(&self, held: bool) {
        self.held.store(held, std::sync::atomic::Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Waits until at least `n` commits wait at the hold.
    pub(super) async fn parked(&self, n: usize) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.parked.load(std::sync::atomic::Ordering::Acquire) >= n {
                return;
            }
            changed.await;
        }
    }
}

/// Messages per atomic batch (the server allows 1,000).
pub(super) const MAX_BATCH: usize = 999;

/// Gives the first of `writes` the expectation of `thread`'s tree (the batch's fence).
pub(super) fn fence_first(view: &View, thread: &str, writes: &mut [Write]) {
    if let Some(first) = writes.first_mut() {
        first.expect = Expect::Thread(view.thread_seq(thread));
    }
}

/// A write of a waitpoint record with the expectation given.
pub(super) fn put_waitpoint(expect: Expect, w: &Waitpoint) -> StoreResult<Write> {
    Ok(Write {
        key: Key::Waitpoint(w.thread.clone(), w.id.clone()),
        expect,
        payload: encode_waitpoint(w)?,
        record: Record::Waitpoint(w.thread.clone(), w.id.clone(), Box::new(w.clone())),
    })
}

/// A write of a dispatch record with the expectation given (`Expect::None` for a later message
/// of a batch).
pub(super) fn put_dispatch_expecting(expect: Expect, mut stored: Stored) -> StoreResult<Write> {
    let (thread, id) = (stored.dispatch.thread.clone(), stored.dispatch.id.clone());
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

/// A record no holder settled.
pub(super) fn plain(d: Dispatch) -> Stored {
    Stored {
        dispatch: d,
        settled: None,
        waitpoints: false,
    }
}

/// A record a holder's claim ended with: `token` settled it with `op`.
pub(super) fn settled(d: Dispatch, token: &str, op: crate::store::rules::Settle) -> Stored {
    Stored {
        dispatch: d,
        settled: Some((token.to_owned(), op.as_str().to_owned())),
        waitpoints: false,
    }
}

impl NatsStore {
    /// Stores `writes` atomically, each only if its subject's last sequence is what it expects.
    /// Applies them to the view on success when they were decided on it (`on_view`).
    ///
    /// Writes decided on records read from the server are left for the watcher to deliver:
    /// the view trusts a thread's last sequence only as far as it holds every message of the
    /// thread up to it, and such a write's expectation may name messages the view has not
    /// applied yet. Applied ahead, it would let the view decide on a stale record with a
    /// current fence.
    pub(super) async fn commit(
        &self,
        writes: Vec<Write>,
        on_view: bool,
    ) -> Result<(), CommitError> {
        let n = writes.len();
        if n == 0 {
            return Ok(());
        }
        // Nothing of a batch is sent when one of its records is too large for a message.
        let room = self.inner.room;
        if let Some(w) = writes.iter().find(|w| w.payload.len() as u64 > room.record) {
            return Err(CommitError::Store(StoreError::Invalid(format!(
                "{}: the record would take {} bytes, over the {} bytes one NATS message can \
                 carry (the server's max_payload is {} bytes)",
                w.key.describe(),
                w.payload.len(),
                room.record,
                room.server
            ))));
        }
        let batch = uuid::Uuid::now_v7().simple().to_string();
        let mut last_seq = 0;
        for (i, w) in writes.iter().enumerate() {
            let mut headers = HeaderMap::new();
            match (&w.expect, w.key.thread()) {
                (Expect::Thread(seq), Some(thread)) => {
                    headers.insert("Nats-Expected-Last-Subject-Sequence", seq.to_string());
                    headers.insert(
                        "Nats-Expected-Last-Subject-Sequence-Subject",
                        Key::tree(&self.inner.prefix, thread),
                    );
                }
                (Expect::Tree(thread, seq), _) => {
                    headers.insert("Nats-Expected-Last-Subject-Sequence", seq.to_string());
                    headers.insert(
                        "Nats-Expected-Last-Subject-Sequence-Subject",
                        Key::tree(&self.inner.prefix, thread),
                    );
                }
                (Expect::Thread(seq), None) | (Expect::Subject(seq), _) => {
                    headers.insert("Nats-Expected-Last-Subject-Sequence", seq.to_string());
                }
                (Expect::None, _) => {}
            }
            // A settled record expires on the server after the retention (tombstones, which
            // mark a purge, stay).
            if let (Some(ttl), Record::Dispatch(_, _, Some(stored))) =
                (&self.inner.settled_ttl, &w.record)
                && stored.dispatch.status.is_terminal()
            {
                headers.insert("Nats-TTL", ttl.as_str());
            }
            if n > 1 {
                headers.insert("Nats-Batch-Id", batch.as_str());
                headers.insert("Nats-Batch-Sequence", (i + 1).to_string());
            }
            let subject = w.key.subject(&self.inner.prefix);
            if i + 1 < n {
                self.inner
                    .client
                    .publish_with_headers(subject.clone(), headers, w.payload.clone())
                    .await
                    .map_err(|e| CommitError::Store(self.publish_failed(&subject, e)))?;
                continue;
            }
            if n > 1 {
                headers.insert("Nats-Batch-Commit", "1");
            }
            let reply = self
                .request(subject, w.payload.clone(), headers)
                .await
                .map_err(CommitError::Store)?;
            last_seq = stored_seq(&reply)?;
        }
        // Outside an `acked_in` scope there is nothing to tell.
        let _ = ACKED.try_with(|acked| acked.set(acked.get().max(last_seq)));
        if !self.follows() || !on_view {
            return Ok(());
        }
        // An atomic batch is stored contiguously, ending at the acknowledged sequence.
        let first = last_seq.saturating_sub(n as u64 - 1);
        self.inner.own_hold.pass().await;
        let mut touched = Vec::new();
        let watched = self.inner.watches.open() > 0;
        if let Ok(mut view) = self.inner.view.lock() {
            for (i, w) in writes.into_iter().enumerate() {
                if watched
                    && let Some(thread) = w.key.thread()
                    && !touched.iter().any(|t: &String| t == thread)
                {
                    touched.push(thread.to_owned());
                }
                view.apply_own(first + i as u64, w.record);
            }
        }
        self.inner.applied.notify_waiters();
        for thread in touched {
            self.inner.watches.notify(&thread);
        }
        Ok(())
    }

    /// Runs `op`, and says the highest stream sequence the server acknowledged to the commits
    /// it made (0 when it stored nothing, or stored from another task).
    pub(super) async fn acked_in<T>(op: impl std::future::Future<Output = T>) -> (T, u64) {
        ACKED
            .scope(std::cell::Cell::new(0), async move {
                let out = op.await;
                (out, ACKED.with(std::cell::Cell::get))
            })
            .await
    }

    /// Runs an operation: decide, commit, and decide again on fresh records when an
    /// expectation failed or the answer was a refusal (which is only returned once confirmed
    /// on fresh records).
    ///
    /// A host decides first on its own view, so the hot path reads nothing. Fresh records are
    /// then read from the server for an operation scoped to a thread or a dispatch (the view
    /// holds live work only, and may lack what it decides on), or awaited in the view (a
    /// barrier) for one over every thread. An instance that does not follow the stream reads
    /// what `reads` name for every attempt.
    pub(super) async fn run<T>(
        &self,
        reads: &[Read<'_>],
        decide: impl FnMut(&mut View, u64, bool) -> StoreResult<Plan<T>>,
    ) -> StoreResult<T> {
        self.run_reading(reads, false, decide).await
    }

    /// [`NatsStore::run`], deciding on records read from the server from the first attempt
    /// when `read_first`: for a decision a lean view cannot make, because it rests on a record
    /// being absent (the view no longer holds settled records).
    pub(super) async fn run_reading<T>(
        &self,
        reads: &[Read<'_>],
        read_first: bool,
        mut decide: impl FnMut(&mut View, u64, bool) -> StoreResult<Plan<T>>,
    ) -> StoreResult<T> {
        let scoped = !reads.iter().any(|r| matches!(r, Read::All));
        let mut from_server = !self.follows() || (read_first && scoped);
        let mut fresh = false;
        for attempt in 0..MAX_ATTEMPTS {
            let plan = if from_server {
                let mut view = self.snapshot(reads).await?;
                decide(&mut view, self.now(), true)?
            } else {
                let mut view = self.view()?;
                decide(&mut view, self.now(), fresh)?
            };
            match plan {
                Plan::Done(out) => return out,
                Plan::Refuse(out) if fresh || from_server => return out,
                Plan::Refuse(_) => {}
                Plan::Write {
                    writes,
                    answer,
                    wake,
                } => match self.commit(writes, !from_server).await {
                    Ok(()) => {
                        if wake {
                            self.signal();
                        }
                        return answer;
                    }
                    Err(CommitError::Store(e)) => return Err(e),
                    Err(CommitError::Conflict) => {
                        if let Some(pause) = backoff(attempt) {
                            tokio::time::sleep(pause).await;
                        }
                    }
                },
            }
            if scoped {
                from_server = true;
            } else {
                self.barrier().await?;
                fresh = true;
            }
        }
        Err(contended())
    }
}

fn contended() -> StoreError {
    StoreError::Contention(
        "nats: too many concurrent writers on the same records; retry later".into(),
    )
}
