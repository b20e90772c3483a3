//! Delta batches on NATS (the contract, docs/contract.md, section 12).
//!
//! # Batches
//!
//! | subject | value |
//! | --- | --- |
//! | `<p>.dl.<dispatch>.<claim>.<first>` | a batch of deltas ([`encode_chunks`]), `Nats-TTL` = what remains until its `expires_at` |
//!
//! One subject per batch, outside every thread tree: the watcher (`<p>.th.>`), the archiver
//! (`<p>.th.*.d.*`), the journal sweep (`<p>.jx.*`) and a client's reads never match it, and a
//! scan of the whole stream skips it (its record is kept by no view). The stream keeps one
//! message per subject, so a batch persisted again with the same first sequence replaces the
//! earlier one. A batch is a plain publish with no expectation (deltas are not fenced),
//! acknowledged by the server before `persist` returns; the server forgets it when its TTL
//! runs out, whatever became of its dispatch.
//!
//! `read_deltas` is one `multi_last` over `<p>.dl.<dispatch>.>` (paged when a dispatch has more
//! batches than one answer holds): the claim and first sequence come from each subject, the
//! batches of the highest claim are kept, in order of their first sequence.
//!
//! # Live
//!
//! Live deltas travel on core NATS, never stored, on `_HOMING_LIVE.<p>.<dispatch>`
//! ([`Key::live`]; no stream captures it, as no prefix may start with `_HOMING`). A publish
//! hands the message to a queue of this instance that one task drains into the connection in
//! order, so the emitting side never waits for the server; when the queue is full (the
//! connection is stalled), the batch is dropped for live watchers, who fill the gap from the
//! store after the next flush.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;

use super::NatsStore;
use super::commit::CommitError;
use super::jetstream::{stored_seq, unavailable};
use super::keys::Key;
use crate::store::StoreResult;
use crate::store::deltas::{
    Cursor, DeltaBatch, DeltaRead, Deltas, LiveBus, after_cursor, decode_chunks, decode_live,
    encode_chunks, encode_live,
};

/// Live batches an instance queues for publication before it drops new ones.
const LIVE_QUEUE: usize = 1024;

/// The `Nats-TTL` of a batch written at `now` that expires at `expires_at` (whole seconds,
/// rounded up, at least one).
fn ttl(expires_at: u64, now: u64) -> String {
    format!("{}s", expires_at.saturating_sub(now).div_ceil(1000).max(1))
}

#[async_trait]
impl Deltas for NatsStore {
    async fn persist(&self, batch: DeltaBatch) -> StoreResult<()> {
        if batch.chunks.is_empty() {
            return Ok(());
        }
        let subject =
            Key::Delta(batch.dispatch.clone(), batch.claim, batch.first).subject(self.prefix());
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-TTL", ttl(batch.expires_at, self.now()));
        let payload = Bytes::from(encode_chunks(&batch.chunks));
        let reply = self.request(subject, payload, headers).await?;
        match stored_seq(&reply) {
            Ok(_) => Ok(()),
            Err(CommitError::Store(e)) => Err(e),
            // No expectation was sent, so no expectation can fail.
            Err(CommitError::Conflict) => Err(unavailable(
                "publish of a delta batch",
                "refused as a conflict without an expectation",
            )),
        }
    }

    async fn read_deltas(&self, dispatch: &str, after: Cursor) -> StoreResult<DeltaRead> {
        let prefix = self.prefix().to_owned();
        let found = self
            .last_of_each(&Key::deltas_of(&prefix, dispatch))
            .await?;
        let mut claim = 0u32;
        let mut batches: Vec<(u64, Bytes)> = Vec::new();
        for (subject, (_, payload)) in found {
            let Some(Key::Delta(d, c, first)) = Key::parse(&prefix, &subject) else {
                continue;
            };
            if d != dispatch || c < claim {
                continue;
            }
            if c > claim {
                claim = c;
                batches.clear();
            }
            batches.push((first, payload));
        }
        if batches.is_empty() {
            return Ok(DeltaRead::default());
        }
        batches.sort_unstable_by_key(|(first, _)| *first);
        let mut decoded = Vec::with_capacity(batches.len());
        for (first, payload) in batches {
            let key = Key::Delta(dispatch.to_owned(), claim, first).describe();
            decoded.push((first, decode_chunks(&key, &payload)?));
        }
        Ok(after_cursor(claim, &decoded, after))
    }

    fn live_bus(&self) -> Option<Arc<dyn LiveBus>> {
        Some(self.inner.live.clone())
    }
}

/// The live bus of one instance: core NATS subjects on its connection (see the module).
pub(super) struct NatsLive {
    client: async_nats::Client,
    prefix: String,
    timeout: std::time::Duration,
    /// The queue the publishing task drains.
    queue: tokio::sync::mpsc::Sender<(String, Bytes)>,
}

impl std::fmt::Debug for NatsLive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsLive")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl NatsLive {
    /// The bus of `client`, with its publishing task (on the current runtime; it ends when
    /// the bus is dropped).
    pub(super) fn start(
        client: async_nats::Client,
        prefix: &str,
        timeout: std::time::Duration,
    ) -> NatsLive {
        let (queue, mut queued) = tokio::sync::mpsc::channel::<(String, Bytes)>(LIVE_QUEUE);
        let publisher = client.clone();
        tokio::spawn(async move {
            while let Some((subject, payload)) = queued.recv().await {
                if let Err(e) = publisher.publish(subject, payload).await {
                    tracing::debug!(error = %e, "nats: a live delta batch was not published");
                }
            }
        });
        NatsLive {
            client,
            prefix: prefix.to_owned(),
            timeout,
            queue,
        }
    }
}

#[async_trait]
impl LiveBus for NatsLive {
    fn publish(&self, batch: &DeltaBatch) {
        let subject = Key::live(&self.prefix, &batch.dispatch);
        let payload = Bytes::from(encode_live(batch));
        if let Err(e) = self.queue.try_send((subject, payload)) {
            tracing::debug!(
                dispatch = %batch.dispatch,
                "nats: a live delta batch was dropped ({e})"
            );
        }
    }

    async fn subscribe(&self, dispatch: &str) -> StoreResult<BoxStream<'static, DeltaBatch>> {
        let subject = Key::live(&self.prefix, dispatch);
        let subscriber = self
            .client
            .subscribe(subject)
            .await
            .map_err(|e| unavailable("live subscribe", e))?;
        // The server has the subscription once it answered a ping sent after it: from then
        // on, every batch published reaches it.
        match tokio::time::timeout(self.timeout, self.client.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(unavailable("live subscribe", e)),
            Err(_) => return Err(unavailable("live subscribe", "timed out")),
        }
        let dispatch = dispatch.to_owned();
        Ok(subscriber
            .filter_map(move |message| {
                let batch = match decode_live(&dispatch, &message.payload) {
                    Ok(batch) => Some(batch),
                    Err(e) => {
                        tracing::debug!(dispatch = %dispatch, "nats: a live message skipped: {e}");
                        None
                    }
                };
                std::future::ready(batch)
            })
            .boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds_and_never_reach_zero() {
        assert_eq!(ttl(10_000, 0), "10s");
        assert_eq!(ttl(10_001, 0), "11s");
        assert_eq!(ttl(5, 10), "1s");
        assert_eq!(ttl(0, 0), "1s");
    }
}
