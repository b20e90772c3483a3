//! The live hub: what running claims stream (`emit`), handed to watchers as it comes.
//!
//! One [`Hub`] per host. The first `emit` of a claim opens its [`Live`] stream: every delta
//! of the claim in one buffer (at most `[host] max_stream_bytes`, so nothing is ever evicted),
//! a watch of its newest sequence for the watchers in this process, and a flusher task that
//! persists the deltas in batches (every 100 ms, at 64 KiB, and when the claim ends, before
//! it settles) and, on NATS, publishes each new run of deltas on the live bus for watchers on
//! other hosts. `emit` itself checks the caps, appends and returns: no store call, no lock
//! held across an await, never waiting for a watcher.
//!
//! Watchers read through [`follow::Follower`]: the local buffer when the claim runs here, the
//! live bus when it runs on another host, the stored batches otherwise and to fill gaps.

pub mod follow;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{Notify, watch};
use tracing::warn;

use crate::config::Config;
use crate::store::deltas::{DeltaBatch, LiveBus, MAX_DELTA};
use crate::store::{Store, millis};

/// How long deltas wait in memory before they are persisted.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// How many unpersisted bytes make a batch be persisted at once.
pub const FLUSH_BYTES: u64 = 64 * 1024;
/// What the host holds per delta beyond its bytes (its handle and allocation), counted toward
/// `max_stream_bytes` so the cap bounds the memory a claim's deltas take, however small they
/// are.
pub const DELTA_OVERHEAD: u64 = 48;
/// How long the end of a claim waits for its last batch to be persisted.
const FINISH_WAIT: Duration = Duration::from_secs(5);
/// How many times a batch that failed to persist is tried again once its claim ended.
const FINAL_TRIES: u32 = 3;

/// The limits of streaming (`[host]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveSettings {
    /// `max_stream_bytes`: the bytes one claim may emit.
    pub max_stream_bytes: u64,
    /// `max_emit_rate`: deltas per second one claim may emit (burst: one second's worth).
    pub max_emit_rate: u32,
    /// `stream_retention`: how long after its run a dispatch's deltas stay readable.
    pub retention: Duration,
}

impl Default for LiveSettings {
    fn default() -> Self {
        LiveSettings {
            max_stream_bytes: crate::config::DEFAULT_MAX_STREAM_BYTES,
            max_emit_rate: crate::config::DEFAULT_MAX_EMIT_RATE,
            retention: Duration::from_secs(3600),
        }
    }
}

impl LiveSettings {
    /// The settings of `config`'s `[host]`.
    pub fn of(config: &Config) -> LiveSettings {
        LiveSettings {
            max_stream_bytes: config.host.max_stream_bytes,
            max_emit_rate: config.host.max_emit_rate,
            retention: config.host.stream_retention,
        }
    }
}

/// Why `emit` refused a delta.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmitError {
    /// An empty chunk.
    #[error("chunk: an empty chunk streams nothing")]
    Empty,
    /// A chunk over [`MAX_DELTA`].
    #[error("chunk: {len} bytes is over the 65536-byte limit of one delta")]
    TooLarge {
        /// Its size.
        len: usize,
    },
    /// Past `[host] max_stream_bytes` for this claim.
    #[error(
        "[host] max_stream_bytes: this claim's deltas hold {sent} bytes of its {limit} (each delta counts {DELTA_OVERHEAD} bytes beyond its own size); a {len}-byte chunk does not fit"
    )]
    Bytes {
        /// What the claim's deltas hold so far, overhead included.
        sent: u64,
        /// The chunk's size.
        len: usize,
        /// The limit.
        limit: u64,
    },
    /// Past `[host] max_emit_rate`.
    #[error("[host] max_emit_rate: this claim streams faster than {limit} deltas per second")]
    Rate {
        /// The limit.
        limit: u32,
    },
    /// The claim's stream is closed: it settled, or its host gave it up.
    #[error("the claim has ended; nothing more streams")]
    Closed,
}

/// The host's streams of running claims.
#[derive(Clone)]
pub struct Hub {
    inner: Arc<HubInner>,
}

struct HubInner {
    streams: Mutex<HashMap<String, Arc<Live>>>,
    store: Store,
    bus: Option<Arc<dyn LiveBus>>,
    settings: LiveSettings,
    /// Bumped each time a stream opens, so watchers waiting for one wake.
    opened: watch::Sender<u64>,
}

impl fmt::Debug for Hub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hub")
            .field("streams", &lock(&self.inner.streams).len())
            .field("bus", &self.inner.bus.is_some())
            .field("settings", &self.inner.settings)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Hub {
    /// A hub over `store` (its live bus, when it has one).
    pub fn new(store: &Store, settings: LiveSettings) -> Hub {
        Hub {
            inner: Arc::new(HubInner {
                streams: Mutex::new(HashMap::new()),
                bus: store.deltas.live_bus(),
                store: store.clone(),
                settings,
                opened: watch::channel(0).0,
            }),
        }
    }

    /// Its limits.
    pub fn settings(&self) -> LiveSettings {
        self.inner.settings
    }

    /// The store it persists to and watchers read from.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// The live bus between hosts, if the store has one.
    pub fn bus(&self) -> Option<Arc<dyn LiveBus>> {
        self.inner.bus.clone()
    }

    /// Opens the stream of claim number `claim` of `dispatch` (of `agent`, whose runs last at
    /// most `timeout`), replacing the stream of an earlier claim of it.
    pub fn open(&self, dispatch: &str, agent: &str, claim: u32, timeout: Duration) -> LiveClaim {
        let settings = self.inner.settings;
        let keep_ms = millis(timeout).saturating_add(millis(settings.retention));
        let live = Arc::new(Live {
            dispatch: dispatch.to_owned(),
            claim,
            keep_ms,
            state: Mutex::new(State {
                chunks: Vec::new(),
                bytes: 0,
                flushed: 0,
                flushed_bytes: 0,
                published: 0,
                since: None,
                closed: false,
                tokens: f64::from(settings.max_emit_rate),
                refilled: Instant::now(),
            }),
            head: watch::channel(0).0,
            closing: Notify::new(),
            done: watch::channel(false).0,
            settings,
            deltas: metrics::counter!(crate::telemetry::STREAM_DELTAS, "agent" => agent.to_owned()),
            bytes: metrics::counter!(crate::telemetry::STREAM_BYTES, "agent" => agent.to_owned()),
        });
        lock(&self.inner.streams).insert(dispatch.to_owned(), live.clone());
        self.inner.opened.send_modify(|n| *n += 1);
        tokio::spawn(flush(self.inner.clone(), live.clone()));
        LiveClaim { live }
    }

    /// The stream of `dispatch` when one of its claims streams on this host.
    pub fn get(&self, dispatch: &str) -> Option<Arc<Live>> {
        lock(&self.inner.streams).get(dispatch).cloned()
    }

    /// A watch that changes each time a stream opens on this host.
    pub fn opened(&self) -> watch::Receiver<u64> {
        self.inner.opened.subscribe()
    }

    /// How many claims stream on this host now.
    pub fn open_streams(&self) -> usize {
        lock(&self.inner.streams).len()
    }
}

/// One claim's stream.
pub struct Live {
    /// The dispatch.
    pub dispatch: String,
    /// Its claim number.
    pub claim: u32,
    /// How long its batches are kept after they are written (the plugin's timeout and the
    /// retention).
    keep_ms: u64,
    state: Mutex<State>,
    /// The newest sequence.
    head: watch::Sender<u64>,
    closing: Notify,
    /// Set once the last batch was persisted (or given up on).
    done: watch::Sender<bool>,
    settings: LiveSettings,
    deltas: metrics::Counter,
    bytes: metrics::Counter,
}

impl fmt::Debug for Live {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Live")
            .field("dispatch", &self.dispatch)
            .field("claim", &self.claim)
            .field("head", &*self.head.borrow())
            .finish_non_exhaustive()
    }
}

struct State {
    /// Every delta of the claim: the one with sequence `n` at `n - 1`.
    chunks: Vec<Bytes>,
    bytes: u64,
    /// How many are persisted.
    flushed: usize,
    flushed_bytes: u64,
    /// How many are published on the live bus.
    published: usize,
    /// When the oldest delta not yet persisted was emitted.
    since: Option<Instant>,
    closed: bool,
    /// The emit-rate bucket.
    tokens: f64,
    refilled: Instant,
}

impl Live {
    /// Appends `chunk` and returns its sequence.
    ///
    /// # Errors
    ///
    /// When the chunk is empty or too large, a cap is reached, or the stream is closed.
    pub fn emit(&self, chunk: &[u8]) -> Result<u64, EmitError> {
        if chunk.is_empty() {
            return Err(EmitError::Empty);
        }
        if chunk.len() > MAX_DELTA {
            return Err(EmitError::TooLarge { len: chunk.len() });
        }
        let seq = {
            let mut s = lock(&self.state);
            if s.closed {
                return Err(EmitError::Closed);
            }
            let rate = f64::from(self.settings.max_emit_rate);
            let now = Instant::now();
            s.tokens = (s.tokens + now.duration_since(s.refilled).as_secs_f64() * rate).min(rate);
            s.refilled = now;
            if s.tokens < 1.0 {
                return Err(EmitError::Rate {
                    limit: self.settings.max_emit_rate,
                });
            }
            let limit = self.settings.max_stream_bytes;
            let held = s.bytes + s.chunks.len() as u64 * DELTA_OVERHEAD;
            if held + chunk.len() as u64 + DELTA_OVERHEAD > limit {
                return Err(EmitError::Bytes {
                    sent: held,
                    len: chunk.len(),
                    limit,
                });
            }
            s.tokens -= 1.0;
            s.chunks.push(Bytes::copy_from_slice(chunk));
            s.bytes += chunk.len() as u64;
            s.since.get_or_insert(now);
            s.chunks.len() as u64
        };
        self.head.send_replace(seq);
        self.deltas.increment(1);
        self.bytes.increment(chunk.len() as u64);
        Ok(seq)
    }

    /// The deltas after sequence `after`, at most `max` of them.
    pub fn after(&self, after: u64, max: usize) -> Vec<Bytes> {
        let s = lock(&self.state);
        let from = usize::try_from(after)
            .unwrap_or(usize::MAX)
            .min(s.chunks.len());
        s.chunks[from..].iter().take(max).cloned().collect()
    }

    /// Whether the deltas after sequence `after` hold more than `limit` bytes: counted from
    /// the newest back, stopping at the limit, so a watcher far behind costs no full scan.
    pub fn behind_more_than(&self, after: u64, limit: u64) -> bool {
        let s = lock(&self.state);
        let from = usize::try_from(after)
            .unwrap_or(usize::MAX)
            .min(s.chunks.len());
        let mut held = 0u64;
        s.chunks[from..].iter().rev().any(|c| {
            held += c.len() as u64;
            held > limit
        })
    }

    /// The newest sequence.
    pub fn head(&self) -> u64 {
        *self.head.borrow()
    }

    /// A watch of the newest sequence.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.head.subscribe()
    }

    /// Whether the claim ended (nothing more will be emitted).
    pub fn is_closed(&self) -> bool {
        lock(&self.state).closed
    }

    /// A watch that turns true once the stream's last batch is persisted (or given up on).
    pub fn finished(&self) -> watch::Receiver<bool> {
        self.done.subscribe()
    }

    fn close(&self) {
        lock(&self.state).closed = true;
        self.closing.notify_one();
        // Wake the watchers: the stream ended.
        self.head.send_modify(|_| {});
    }
}

/// A claim's hold on its stream: [`LiveClaim::finish`] (or dropping it) ends the stream.
#[derive(Debug)]
pub struct LiveClaim {
    live: Arc<Live>,
}

impl LiveClaim {
    /// See [`Live::emit`].
    ///
    /// # Errors
    ///
    /// See [`Live::emit`].
    pub fn emit(&self, chunk: &[u8]) -> Result<u64, EmitError> {
        self.live.emit(chunk)
    }

    /// The stream.
    pub fn live(&self) -> &Arc<Live> {
        &self.live
    }

    /// Ends the stream and waits (a few seconds at most) until its last deltas are persisted:
    /// called before the claim settles, so a watcher that sees the settlement finds them all.
    pub async fn finish(&self) {
        self.live.close();
        let mut done = self.live.finished();
        let _ = tokio::time::timeout(FINISH_WAIT, done.wait_for(|d| *d)).await;
    }
}

impl Drop for LiveClaim {
    fn drop(&mut self) {
        self.live.close();
    }
}

/// The flusher of one stream: publishes new deltas on the live bus as they come, persists
/// batches, and once the stream is closed and persisted, removes it from the hub.
async fn flush(hub: Arc<HubInner>, live: Arc<Live>) {
    let mut head = live.watch();
    let mut failures = 0u32;
    loop {
        let (publish, persist, closed, wait) = {
            let mut s = lock(&live.state);
            let len = s.chunks.len();
            let publish = (hub.bus.is_some() && s.published < len).then(|| {
                let first = s.published as u64 + 1;
                let chunks = s.chunks[s.published..].to_vec();
                s.published = len;
                (first, chunks)
            });
            let pending = s.bytes - s.flushed_bytes;
            let due = s.closed
                || pending >= FLUSH_BYTES
                || s.since.is_some_and(|t| t.elapsed() >= FLUSH_EVERY);
            let persist = (due && s.flushed < len).then(|| {
                (
                    s.flushed as u64 + 1,
                    s.chunks[s.flushed..].to_vec(),
                    len,
                    s.bytes,
                )
            });
            let wait = s.since.map(|t| FLUSH_EVERY.saturating_sub(t.elapsed()));
            (publish, persist, s.closed, wait)
        };
        if let (Some(bus), Some((first, chunks))) = (&hub.bus, publish) {
            bus.publish(&DeltaBatch {
                dispatch: live.dispatch.clone(),
                claim: live.claim,
                first,
                chunks,
                expires_at: 0,
            });
        }
        if let Some((first, chunks, upto, bytes)) = persist {
            let batch = DeltaBatch {
                dispatch: live.dispatch.clone(),
                claim: live.claim,
                first,
                chunks,
                expires_at: hub.store.now().saturating_add(live.keep_ms),
            };
            match hub.store.deltas.persist(batch).await {
                Ok(()) => {
                    let mut s = lock(&live.state);
                    s.flushed = upto;
                    s.flushed_bytes = bytes;
                    s.since = (s.chunks.len() > upto).then(Instant::now);
                }
                Err(e) => {
                    failures += 1;
                    warn!(
                        dispatch = %live.dispatch,
                        error = %e,
                        "could not persist streamed deltas; trying again"
                    );
                    if closed && failures >= FINAL_TRIES {
                        break;
                    }
                    tokio::time::sleep(FLUSH_EVERY).await;
                    continue;
                }
            }
            continue;
        }
        if closed {
            break;
        }
        tokio::select! {
            _ = head.changed() => {}
            () = live.closing.notified() => {}
            () = tokio::time::sleep(wait.unwrap_or(Duration::from_secs(3600))) => {}
        }
    }
    {
        let mut streams = lock(&hub.streams);
        if streams
            .get(&live.dispatch)
            .is_some_and(|l| Arc::ptr_eq(l, &live))
        {
            streams.remove(&live.dispatch);
        }
    }
    live.done.send_replace(true);
    // Watchers of the local buffer move to the store now.
    live.head.send_modify(|_| {});
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::sync::Arc;

    use super::follow::{Event, Follower, MAX_LAG_BYTES};
    use super::*;
    use crate::store::deltas::Cursor;
    use crate::store::embedded::EmbeddedStore;
    use crate::store::{NewDispatch, SystemClock};

    async fn claimed(settings: LiveSettings) -> (Hub, String, u32) {
        let store = EmbeddedStore::open_in_memory(Arc::new(SystemClock))
            .unwrap()
            .store();
        store
            .mailbox
            .enqueue(NewDispatch::new("a", "t", Vec::new()))
            .await
            .unwrap();
        let d = store
            .mailbox
            .claim_started("a", "test", 30_000)
            .await
            .unwrap()
            .unwrap();
        (Hub::new(&store, settings), d.id, d.claims)
    }

    #[tokio::test]
    async fn emit_numbers_deltas_and_refuses_past_the_caps() {
        let settings = LiveSettings {
            max_stream_bytes: 10 + 3 * DELTA_OVERHEAD,
            max_emit_rate: 3,
            ..LiveSettings::default()
        };
        let (hub, id, claim) = claimed(settings).await;
        let live = hub.open(&id, "a", claim, Duration::from_secs(1));
        assert_eq!(live.emit(b"abcd"), Ok(1));
        assert_eq!(live.emit(b"efgh"), Ok(2));
        assert!(matches!(live.emit(b"ijk"), Err(EmitError::Bytes { .. })));
        assert_eq!(live.emit(b"i"), Ok(3));
        assert_eq!(live.emit(b"j"), Err(EmitError::Rate { limit: 3 }));
        assert_eq!(live.emit(b""), Err(EmitError::Empty));
        assert!(matches!(
            live.emit(&vec![0; MAX_DELTA + 1]),
            Err(EmitError::TooLarge { .. })
        ));
        live.finish().await;
        assert_eq!(live.emit(b"k"), Err(EmitError::Closed));
        // Finishing persisted everything and left the hub.
        assert!(hub.get(&id).is_none());
        let read = hub
            .store()
            .deltas
            .read_deltas(&id, Cursor::default())
            .await
            .unwrap();
        assert_eq!((read.claim, read.first, read.chunks.len()), (claim, 1, 3));
    }

    #[tokio::test]
    async fn a_follower_gets_every_delta_then_the_result() {
        let (hub, id, claim) = claimed(LiveSettings::default()).await;
        let mut follower = Follower::open(&hub, &id, None).await.unwrap().unwrap();
        assert!(matches!(follower.next().await, Ok(Some(Event::Status(_)))));
        let live = hub.open(&id, "a", claim, Duration::from_secs(1));
        for i in 1..=3u8 {
            live.emit(&[b'0' + i]).unwrap();
        }
        for i in 1..=3u64 {
            match follower.next().await.unwrap() {
                Some(Event::Delta { at, chunk }) => {
                    assert_eq!(at, Cursor::new(claim, i));
                    assert_eq!(chunk.as_ref(), [b'0' + i as u8]);
                }
                other => panic!("{other:?}"),
            }
        }
        live.finish().await;
        let token = hub
            .store()
            .mailbox
            .load(&id)
            .await
            .unwrap()
            .unwrap()
            .token()
            .unwrap()
            .to_owned();
        hub.store()
            .mailbox
            .complete(
                &id,
                &token,
                crate::store::RunResult::success(b"ok".to_vec()),
            )
            .await
            .unwrap();
        loop {
            match follower.next().await.unwrap() {
                Some(Event::Status(_)) => {}
                Some(Event::Result(d)) => {
                    assert_eq!(d.status, crate::store::Status::Acked);
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(follower.next().await.unwrap().is_none());
    }

    /// A follower that caught up with the newest delta and then fell more than
    /// `MAX_LAG_BYTES` behind is dropped, naming where it was; one resuming from there is not.
    #[tokio::test]
    async fn a_follower_that_falls_behind_is_dropped_and_resumes() {
        let (hub, id, claim) = claimed(LiveSettings::default()).await;
        let live = hub.open(&id, "a", claim, Duration::from_secs(1));
        live.emit(b"first").unwrap();
        let mut follower = Follower::open(&hub, &id, None)
            .await
            .unwrap()
            .unwrap()
            .with_patience(Duration::ZERO);
        assert!(matches!(follower.next().await, Ok(Some(Event::Status(_)))));
        assert!(matches!(
            follower.next().await,
            Ok(Some(Event::Delta { .. }))
        ));
        let chunk = vec![b'x'; MAX_DELTA];
        for _ in 0..=(MAX_LAG_BYTES as usize / MAX_DELTA) {
            live.emit(&chunk).unwrap();
        }
        let mut last = None;
        while let Some(event) = follower.next().await.unwrap() {
            if let Event::Dropped { last: at } = event {
                last = Some(at);
            }
        }
        assert_eq!(last, Some(Cursor::new(claim, 1)));
        let mut resumed = Follower::open(&hub, &id, last).await.unwrap().unwrap();
        assert!(matches!(resumed.next().await, Ok(Some(Event::Status(_)))));
        match resumed.next().await.unwrap() {
            Some(Event::Delta { at, .. }) => assert_eq!(at, Cursor::new(claim, 2)),
            other => panic!("{other:?}"),
        }
    }
}
