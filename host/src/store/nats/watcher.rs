//! The watcher of the NATS backend: one ordered push consumer that replays the stream into
//! the view at start and then follows it, and the barrier that waits for it to catch up.

use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::consumer;
use futures_util::StreamExt;

use super::keys::Key;
use super::view::Record;
use super::{Inner, NatsStore};
use crate::store::{StoreError, StoreResult};

impl NatsStore {
    /// Waits until the view has applied everything the stream held when this was called.
    /// An instance that does not follow the stream has no view to wait for: its reads are
    /// made fresh for each operation.
    pub(super) async fn barrier(&self) -> StoreResult<()> {
        if !self.follows() {
            return Ok(());
        }
        let ticket = self.inner.barrier_calls.fetch_add(1, Ordering::SeqCst) + 1;
        let target = {
            let mut last = self.inner.barrier_last.lock().await;
            if last.0 >= ticket {
                // A request sent after this call began already answered it.
                last.1
            } else {
                let serves = self.inner.barrier_calls.load(Ordering::SeqCst);
                let target = self.stream_last_seq().await?;
                *last = (serves, target);
                target
            }
        };
        self.wait_for(target).await
    }

    /// Waits until the view applied stream sequence `target`. It fails once the watcher made
    /// no progress for the request timeout: a host starting on a stream that retains a
    /// million records replays for longer than that, and must not give up while it advances.
    pub(super) async fn wait_for(&self, target: u64) -> StoreResult<()> {
        let mut deadline = tokio::time::Instant::now() + self.inner.timeout;
        let mut seen = self.view()?.pos;
        loop {
            let applied = self.inner.applied.notified();
            tokio::pin!(applied);
            applied.as_mut().enable();
            let pos = self.view()?.pos;
            if pos >= target {
                return Ok(());
            }
            if pos > seen {
                seen = pos;
                deadline = tokio::time::Instant::now() + self.inner.timeout;
            }
            if tokio::time::timeout_at(deadline, applied).await.is_err() {
                self.inner.resync.notify_one();
                let pos = self.view()?.pos;
                let why = self
                    .inner
                    .watch_error
                    .lock()
                    .ok()
                    .and_then(|e| e.clone())
                    .map(|e| format!("; the server refused its consumer: {e}"))
                    .unwrap_or_default();
                return Err(StoreError::Unavailable(format!(
                    "nats: the watcher did not reach stream sequence {target} within {:?} \
                     (it applied up to {pos}){why}",
                    self.inner.timeout
                )));
            }
        }
    }
}

/// What the watcher's next consumer reads.
enum Phase {
    /// Nothing yet: the initial load starts at the stream's last sequence as of now.
    Start,
    /// The initial load: the threads' trees only, up to and including this sequence.
    Load(u64),
    /// Everything, from the view's position on.
    Follow,
}

/// Follows the stream into the view until the store is dropped; restarts its consumer from the
/// last applied sequence whenever it fails.
///
/// It starts with a *load*: a consumer filtered to the threads' trees (`<p>.th.>`) and the
/// flow-control records (`<p>.lim.*`, `<p>.pz.*`) delivers their messages up to the stream's
/// last sequence as of the start, and the server skips the rest (archived records and id records, which a host's view does not hold; see `archive`).
/// So a host's start costs what the trees hold (thread records, live and recently settled
/// dispatch records, log entries not yet trimmed), not what the archive retains. From there it
/// follows every message, so that `pos` (what barriers wait for) reaches the stream's last
/// sequence.
pub(super) async fn watch(weak: Weak<Inner>) {
    let mut restarts = 0u64;
    let mut phase = Phase::Start;
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let start = inner.view.lock().map(|v| v.pos).unwrap_or(0);
        if matches!(phase, Phase::Start) {
            let store = NatsStore {
                inner: inner.clone(),
            };
            match store.stream_last_seq().await {
                Ok(last) if last > start => phase = Phase::Load(last),
                Ok(_) => phase = Phase::Follow,
                Err(e) => {
                    tracing::warn!(error = %e, "nats watcher: cannot read the stream's state");
                    if let Ok(mut slot) = inner.watch_error.lock() {
                        *slot = Some(e.to_string());
                    }
                    drop(store);
                    drop(inner);
                    // A retry pause, not a wait for state.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
        }
        let load = match phase {
            Phase::Load(until) if start >= until => {
                phase = Phase::Follow;
                None
            }
            Phase::Load(until) => Some(until),
            _ => None,
        };
        let js = inner.js.clone();
        let stream = inner.prefix.clone();
        let deliver = inner.client.new_inbox();
        let resync = inner.resync.clone();
        drop(inner);

        let policy = if start == 0 {
            consumer::DeliverPolicy::All
        } else {
            consumer::DeliverPolicy::ByStartSequence {
                start_sequence: start + 1,
            }
        };
        // Named, so that closing the store can delete it (see `NatsStore::close`).
        let name = format!("homing-watch-{}", uuid::Uuid::now_v7().simple());
        let created = async {
            let s = js
                .get_stream_no_info(&stream)
                .await
                .map_err(|e| e.to_string())?;
            let c = s
                .create_consumer(consumer::push::OrderedConfig {
                    deliver_subject: deliver,
                    deliver_policy: policy,
                    name: Some(name.clone()),
                    // The load also takes the flow-control records (scopes and pauses),
                    // which a claim decides on from the view.
                    filter_subjects: match load {
                        Some(_) => vec![
                            Key::trees(&stream),
                            Key::limits(&stream),
                            Key::pauses(&stream),
                        ],
                        None => Vec::new(),
                    },
                    ..Default::default()
                })
                .await
                .map_err(|e| e.to_string())?;
            let pending = c.cached_info().num_pending;
            c.messages()
                .await
                .map(|m| (m, pending))
                .map_err(|e| e.to_string())
        }
        .await;
        if let Some(inner) = weak.upgrade() {
            let (consumer, error) = match &created {
                Ok(_) => (Some(name), None),
                Err(e) => (None, Some(e.clone())),
            };
            if let Ok(mut slot) = inner.watch_error.lock() {
                *slot = error;
            }
            if let Some(consumer) = consumer
                && let Ok(mut slot) = inner.consumer.lock()
            {
                *slot = Some(consumer);
            }
        }
        let mut loaded = false;
        match created {
            Ok((_, 0)) if load.is_some() => loaded = true,
            Ok((mut messages, _)) => loop {
                // A consumer can also stall without failing (seen after a client failed over
                // to another cluster node): a barrier that times out asks for a resync.
                let next = tokio::select! {
                    next = messages.next() => next,
                    () = resync.notified() => {
                        tracing::warn!("nats watcher: behind the stream; resyncing");
                        break;
                    }
                };
                let Some(next) = next else { break };
                {
                    let Some(inner) = weak.upgrade() else { return };
                    match next {
                        Ok(message) => {
                            let (seq, pending, stamp) = match message.info() {
                                Ok(info) => (
                                    info.stream_sequence,
                                    info.pending,
                                    info.published.unix_timestamp_nanos() / 1_000_000,
                                ),
                                Err(_) => continue,
                            };
                            if let Some(until) = load {
                                // Everything of the trees up to `until` was delivered.
                                if seq > until {
                                    loaded = true;
                                    break;
                                }
                                inner.ingest(seq, message.subject.as_str(), &message.payload);
                                if pending == 0 {
                                    loaded = true;
                                    break;
                                }
                                continue;
                            }
                            inner.ingest(seq, message.subject.as_str(), &message.payload);
                            // Each message followed carries the server's time.
                            if let Ok(stamp) = u64::try_from(stamp) {
                                inner.clock.observe_server(stamp, std::time::Instant::now());
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "nats watcher: consumer failed; resyncing");
                            break;
                        }
                    }
                }
            },
            Err(e) => tracing::warn!(error = %e, "nats watcher: cannot create its consumer"),
        }
        if let (true, Some(until)) = (loaded, load) {
            // The view holds every message of the trees up to `until`; what else the stream
            // held up to there is of no interest to it. Follow from there.
            let Some(inner) = weak.upgrade() else { return };
            if let Ok(mut view) = inner.view.lock() {
                view.skip(until);
            }
            inner.applied.notify_waiters();
            phase = Phase::Follow;
            let name = inner.consumer.lock().ok().and_then(|mut n| n.take());
            drop(inner);
            if let Some(name) = name
                && let Ok(s) = js.get_stream_no_info(&stream).await
            {
                let _ = s.delete_consumer(&name).await;
            }
            continue;
        }
        restarts += 1;
        match weak.upgrade() {
            Some(inner) => inner.watcher_restarts.store(restarts, Ordering::Relaxed),
            None => return,
        }
        // Back off before asking a struggling server again (a retry pause, not a wait for state).
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

impl Inner {
    /// Decodes one message of the stream into the view.
    fn ingest(&self, seq: u64, subject: &str, payload: &[u8]) {
        // Archived copies are outside the trees: a host's view does not hold them.
        let decoded = Key::parse(&self.prefix, subject)
            .filter(|key| !matches!(key, Key::Archive(..) | Key::ArchivedWaitpoint(..)))
            .map(|key| key.decode(payload));
        let mut wake = false;
        let mut touched: Option<String> = None;
        if let Ok(mut view) = self.view.lock() {
            match decoded {
                Some(Ok(record)) => {
                    // A dispatch becoming queued, or leaving `claimed` or `waiting` (its thread
                    // is free), or a pause lifted.
                    wake = match &record {
                        Record::Dispatch(_, id, Some(s)) => {
                            s.dispatch.status == crate::store::Status::Queued
                                || view.dispatch(id).ok().flatten().is_some_and(|old| {
                                    matches!(
                                        old.dispatch.status,
                                        crate::store::Status::Claimed
                                            | crate::store::Status::Waiting
                                    )
                                })
                        }
                        // A pause lifted: claims it held back may go.
                        Record::Pause(_, None) => true,
                        _ => false,
                    };
                    if self.watches.open() > 0 {
                        touched = record.thread_name().map(str::to_owned);
                    }
                    view.apply(seq, record);
                }
                Some(Err((key, reason))) => view.mark_corrupt(seq, key, reason),
                None => view.skip(seq),
            }
        }
        self.applied.notify_waiters();
        if let Some(thread) = touched {
            self.watches.notify(&thread);
        }
        if wake {
            self.signal.notify_waiters();
            self.signal.notify_one();
        }
    }
}
