//! The NATS JetStream backend: one mailbox and one set of thread logs shared by many hosts.
//!
//! # Layout
//!
//! One stream per deployment, named by the configured `prefix` and holding the subjects
//! `<prefix>.>`, with at most one message per subject (each subject is a key whose last message
//! is its value). Everything mutable about a thread lives under the thread's own subject tree:
//!
//! | subject | value |
//! | --- | --- |
//! | `<p>.th.<thread>.t` | the thread record: epoch, trimmed log watermark |
//! | `<p>.th.<thread>.d.<id>` | a dispatch record (JSON), or an empty tombstone after purge |
//! | `<p>.th.<thread>.e.<seq>` | one thread-log entry |
//! | `<p>.id.<id>` | the thread of a caller-chosen id (admits the id once) |
//!
//! Names are encoded as unpadded URL-safe base64 so that any id, thread or key is one subject
//! token.
//!
//! # One compare-and-set per thread decides
//!
//! Every write is one message carrying `Nats-Expected-Last-Subject-Sequence: S` with
//! `Nats-Expected-Last-Subject-Sequence-Subject: <p>.th.<thread>.>`: it is stored only if the
//! last message anywhere in the thread's tree is still the one the writer decided from. So a
//! write is fenced by *everything* that happened to its thread: the claim of a dispatch is
//! refused if anything in the thread changed since the claimer looked (another claim, an
//! enqueue, an interrupt), and a holder's ack is refused if an interrupt or a reclaim came
//! first. Consequences:
//!
//! - Ownership of a thread is its one dispatch record in state `claimed`; there is no separate
//!   guard record that could disagree with it (seed defects W4, W16). At most one exists because
//!   a claim is decided on a complete view of the thread and fenced by it.
//! - A claim, an ack and a reclaim of one dispatch all name the same sequence; whichever is
//!   stored first wins and the others are refused (guarantee 3).
//! - An enqueue stamps the epoch and checks the dedupe key against the thread as of its fence,
//!   so an interrupt or a competing enqueue cannot slip between (guarantees 7 and 8).
//! - A log entry's sequence is the thread's latest plus one, fenced the same way: no gap, no
//!   out-of-order or torn entry is ever visible (SPEC section 4). A guest's fence (its claim's
//!   token, lease and epoch) is read from the dispatch record the same write is fenced by.
//! - Acks are fenced by the record; JetStream's own message acks play no part.
//!
//! Multi-record changes (an interrupt bumping the epoch and superseding the queued dispatches,
//! a takeover of an expired holder) are one JetStream atomic batch whose first message carries
//! the thread's expectation. Atomic batches on a file stream are synced to disk at every commit
//! (the server's choice), about ten times the cost of a plain publish here, so the hot path
//! (enqueue, claim, record, settle, append) never uses them; a caller-chosen id is the one
//! exception on it (its id record and the dispatch go together).
//!
//! # Finding work without scans
//!
//! Each instance keeps a [`view::View`]: every record of the stream, fed by one ordered push
//! consumer (the watcher) that replays the stream once at start and then follows it, plus this
//! instance's own writes applied as soon as they are acknowledged. The view keeps the claim
//! index (per agent, the open threads ordered by priority then least recently served), so a
//! claim is a lookup in memory and one atomic batch of two messages. The view may lag: its
//! answers are checked by the compare-and-set of the write they lead to, and refusals (nothing
//! to claim, not found, not claimed) are only returned after a *barrier*: a request for the
//! stream's last sequence and a wait until the watcher applied it. A failed expectation
//! also waits for the barrier before deciding again.
//!
//! There are no per-thread arrays (W19) and no key scans (W20): the index is rebuilt by the
//! watcher's replay at start (one streamed pass, no per-key requests) and kept by it since.
//! Wake-ups come from the watcher too: an instance signals its own workers when a record it
//! sees makes work claimable, so there is no re-signal storm between hosts (W22). The watcher restarts
//! from the last sequence it applied when its consumer fails (the stream deleted, the server
//! gone) and counts the restarts ([`NatsStore::watcher_restarts`]).
//!
//! # Round trips per dispatch
//!
//! enqueue: one message; claim and start: a barrier (shared by concurrent claimers of one
//! host) and one message; complete: one message. Lease renewals add one message per third of
//! a lease. `homing bench --backend nats` counts them at the server.
//!
//! # Crash points
//!
//! Every operation is one message or one atomic batch, so a crash (host or server) before the
//! server stored it changes nothing and the caller saw an error; a crash after it leaves the
//! new state complete. A host that dies holding claims leaves them to `reclaim_expired` of any
//! host once the lease ends. An interrupt superseding more than one batch of queued dispatches
//! (999) may stop between batches: the epoch is already bumped, and a queued dispatch of an
//! older epoch is superseded by the first claim that picks it, never run. A trim moves the
//! watermark first and purges entries after; a crash between leaves entries that reads no
//! longer return, purged by the next trim or delete.
//!
//! # Size limits
//!
//! The server refuses a message over its `max_payload` (1 MiB unless configured; headers
//! count). [`Room`] derives Homing's limits from the value the server advertises when the
//! connection is made: one dispatch record holds its payload and its output, so each may take
//! a little under half of a message ([`NatsStore::room`], `value`); a log entry may take nearly
//! a whole message (`entry`). Bytes are stored as they are (dispatch records are framed, see
//! [`keys`]), so the limits are exact. Larger values are refused with `Invalid` naming the
//! field and the limit before anything is sent, and an enqueue keeps room in its record for an
//! output of up to `value` bytes and for what a settlement adds, so a record that was accepted
//! can always be claimed and settled. A message the server or client still finds too large
//! (the server's limit lowered under a running host) is `Invalid` too, never `Unavailable`.
//!
//! # Availability
//!
//! Every request has a timeout; a timeout, a lost connection or a missing JetStream is
//! `Unavailable`. The client reconnects by itself and the watcher resumes from its position,
//! so a host rides out a server restart. Stored data survives per the stream's `replicas`.

pub mod keys;
mod log;
mod mailbox;
pub mod view;

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures_util::StreamExt;
use serde::Deserialize;
use tokio::sync::Notify;

use self::keys::Key;
use self::view::{Record, View};
use crate::store::{SharedClock, Store, StoreError, StoreResult};

/// How a host reaches its NATS cluster (`[store]` with `backend = "nats"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsConfig {
    /// Server URLs; the client picks one and fails over to the others.
    pub urls: Vec<String>,
    /// A `.creds` file (JWT and NKey seed), when the server wants one.
    pub credentials: Option<PathBuf>,
    /// The stream name and the first token of every subject.
    pub prefix: String,
    /// Stream replicas: 1, or 3 on a cluster.
    pub replicas: usize,
    /// How long to wait for a connection at start.
    pub connect_timeout: Duration,
    /// How long any one request may take before it fails with `Unavailable`.
    pub request_timeout: Duration,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            urls: vec!["nats://127.0.0.1:4222".into()],
            credentials: None,
            prefix: "homing".into(),
            replicas: 1,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
        }
    }
}

impl NatsConfig {
    /// Checks the settings a server cannot check for us.
    pub fn validate(&self) -> Result<(), String> {
        if self.urls.is_empty() {
            return Err("url: at least one server URL is needed".into());
        }
        if self.prefix.is_empty()
            || !self
                .prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(format!(
                "prefix `{}`: use letters, digits, `_` and `-` only (it names a stream)",
                self.prefix
            ));
        }
        if !matches!(self.replicas, 1 | 3 | 5) {
            return Err(format!("replicas = {}: use 1, 3 or 5", self.replicas));
        }
        if self.request_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err("timeouts must be above zero".into());
        }
        Ok(())
    }
}

/// Room kept in each message for its NATS headers (expectations, batch ids, the subject filter
/// of a thread's tree): they count against the server's `max_payload`.
const HEADER_ROOM: u64 = 4 * 1024;
/// Room kept in a dispatch record for everything but its payload and output: names, metadata,
/// dedupe key, claim, error texts.
const FIELDS_ROOM: u64 = 64 * 1024;
/// What a record may grow by after its enqueue besides its output: a claim, a settlement's
/// token, an error text of up to [`crate::store::MAX_ERROR_TEXT`] bytes.
const GROWTH_ROOM: u64 = 16 * 1024;
/// What a log entry's message adds to the entry: the append time.
const ENTRY_HEADER: u64 = 8;
/// The smallest server `max_payload` the backend works with.
pub const MIN_SERVER_PAYLOAD: u64 = 256 * 1024;

/// How much one message of the stream can carry, from the server's advertised `max_payload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// The server's `max_payload`: headers and payload of one message.
    pub server: u64,
    /// The largest record (message payload) written: `server` less [`HEADER_ROOM`].
    pub record: u64,
    /// The largest payload, and the largest output, of a dispatch: the two share one record
    /// with its other fields.
    pub value: u64,
    /// The largest log entry.
    pub entry: u64,
}

impl Room {
    /// The room under a server whose `max_payload` is `server` bytes.
    pub fn of(server: u64) -> Room {
        let record = server.saturating_sub(HEADER_ROOM);
        Room {
            server,
            record,
            value: record.saturating_sub(keys::FRAME_OVERHEAD + FIELDS_ROOM) / 2,
            entry: record.saturating_sub(ENTRY_HEADER),
        }
    }

    /// Why `value` is what it is, for error messages.
    pub(crate) fn value_why(&self) -> String {
        format!(
            "a dispatch's payload and output share one NATS message, and the server's \
             max_payload is {} bytes",
            self.server
        )
    }

    /// Why `entry` is what it is, for error messages.
    pub(crate) fn entry_why(&self) -> String {
        format!(
            "one NATS message per entry, and the server's max_payload is {} bytes",
            self.server
        )
    }
}

/// What `homing config check` reports about a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsReport {
    /// The server the client is connected to.
    pub server: String,
    /// The stream's name.
    pub stream: String,
    /// Whether the stream existed before this check.
    pub existed: bool,
    /// Messages in the stream.
    pub messages: u64,
    /// Its replicas.
    pub replicas: usize,
    /// What one message can carry under the server's `max_payload`.
    pub room: Room,
}

/// A handle on the NATS backend; clones share one connection and one view.
#[derive(Clone)]
pub struct NatsStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for NatsStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsStore")
            .field("stream", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

struct Inner {
    client: async_nats::Client,
    js: jetstream::Context,
    /// The stream's name, and the first token of every subject.
    prefix: String,
    timeout: Duration,
    /// What one message can carry (from the server's `max_payload` at connect).
    room: Room,
    clock: SharedClock,
    view: Mutex<View>,
    /// Fired whenever the watcher applied messages (barrier waiters listen).
    applied: Notify,
    /// Fired when work may have become claimable.
    signal: Arc<Notify>,
    watcher_restarts: AtomicU64,
    /// Asks the watcher to recreate its consumer from its position (a barrier timed out).
    resync: Arc<Notify>,
    /// Barrier callers so far, and (under the lock) the highest caller number the last
    /// fetched target serves together with that target: concurrent barriers share a request.
    barrier_calls: AtomicU64,
    barrier_last: tokio::sync::Mutex<(u64, u64)>,
    watcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(mut watcher) = self.watcher.lock()
            && let Some(task) = watcher.take()
        {
            task.abort();
        }
    }
}

/// What a write expects of the stream before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Expect {
    /// The last sequence of the key's own subject (0: never written).
    Subject(u64),
    /// The last sequence of the key's whole thread tree (0: the thread was never written).
    Thread(u64),
    /// Nothing: a later message of an atomic batch whose first message carries the
    /// expectation for the whole batch.
    None,
}

/// One write (one message).
pub(crate) struct Write {
    pub key: Key,
    pub expect: Expect,
    pub record: Record,
    pub payload: Bytes,
}

/// What an operation decided from the view.
pub(crate) enum Plan<T> {
    /// The answer, with nothing to write.
    Done(StoreResult<T>),
    /// A refusal read from the view; confirmed after a barrier before it is returned.
    Refuse(StoreResult<T>),
    /// Writes to commit atomically, then the answer (an error answer still commits the
    /// writes: a stale-epoch holder write supersedes the dispatch and fails).
    Write(Vec<Write>, StoreResult<T>, bool),
}

/// How many times an operation decides again after a failed expectation.
const MAX_ATTEMPTS: usize = 64;
/// Messages per atomic batch (the server allows 1,000).
pub(crate) const MAX_BATCH: usize = 999;

fn unavailable(what: &str, e: impl fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("nats: {what}: {e}"))
}

#[derive(Deserialize)]
struct ApiError {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    err_code: u32,
    #[serde(default)]
    description: String,
}

#[derive(Deserialize)]
struct PubAck {
    #[serde(default)]
    seq: u64,
    #[serde(default)]
    error: Option<ApiError>,
}

#[derive(Deserialize)]
struct InfoState {
    #[serde(default)]
    last_seq: u64,
}

#[derive(Deserialize)]
struct InfoReply {
    #[serde(default)]
    state: Option<InfoState>,
    #[serde(default)]
    error: Option<ApiError>,
}

/// The outcome of a commit that the server refused.
enum CommitError {
    /// An expectation failed: someone wrote first.
    Conflict,
    Store(StoreError),
}

/// The JetStream error code for a failed `Nats-Expected-Last-Subject-Sequence`.
const WRONG_LAST_SEQUENCE: u32 = 10071;

impl NatsStore {
    /// Connects, creates or checks the stream, replays it into the view, and starts following.
    pub async fn connect(config: &NatsConfig, clock: SharedClock) -> StoreResult<NatsStore> {
        config.validate().map_err(StoreError::Invalid)?;
        let client = connect_client(config).await?;
        let room = room_of(&client)?;
        let js = jetstream::ContextBuilder::new()
            .timeout(config.request_timeout)
            .build(client.clone());
        // A cluster electing its leaders answers late for a moment: keep asking until the
        // connect timeout, then report what the server said.
        let deadline = tokio::time::Instant::now() + config.connect_timeout;
        loop {
            match ensure_stream(&js, config).await {
                Ok(()) => break,
                Err(StoreError::Unavailable(e)) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(error = %e, "nats: the stream is not available yet; retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(e),
            }
        }
        let inner = Arc::new(Inner {
            client,
            js,
            prefix: config.prefix.clone(),
            timeout: config.request_timeout,
            room,
            clock,
            view: Mutex::new(View::default()),
            applied: Notify::new(),
            signal: Arc::new(Notify::new()),
            watcher_restarts: AtomicU64::new(0),
            resync: Arc::new(Notify::new()),
            barrier_calls: AtomicU64::new(0),
            barrier_last: tokio::sync::Mutex::new((0, 0)),
            watcher: Mutex::new(None),
        });
        let task = tokio::spawn(watch(Arc::downgrade(&inner)));
        if let Ok(mut slot) = inner.watcher.lock() {
            *slot = Some(task);
        }
        let store = NatsStore { inner };
        // The view must hold the whole stream before the first decision; on a loaded cluster
        // the watcher's consumer may take a few tries to be created.
        loop {
            match store.barrier().await {
                Ok(()) => return Ok(store),
                Err(StoreError::Unavailable(e)) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(error = %e, "nats: the view is not caught up yet; waiting");
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Opens the backend as the host holds it.
    pub async fn open(config: &NatsConfig, clock: SharedClock) -> StoreResult<Store> {
        let store = NatsStore::connect(config, clock.clone()).await?;
        Ok(store.into_store())
    }

    /// Both halves over this instance.
    pub fn into_store(self) -> Store {
        let clock = self.inner.clock.clone();
        let shared = Arc::new(self);
        Store {
            mailbox: shared.clone(),
            log: shared,
            clock,
        }
    }

    /// Connects and reports what exists, creating nothing (`homing config check`).
    pub async fn check(config: &NatsConfig) -> StoreResult<NatsReport> {
        config.validate().map_err(StoreError::Invalid)?;
        let client = connect_client(config).await?;
        let server = client.server_info();
        let room = room_of(&client)?;
        let js = jetstream::ContextBuilder::new()
            .timeout(config.request_timeout)
            .build(client.clone());
        let (existed, messages, replicas) = match js.get_stream(&config.prefix).await {
            Ok(mut s) => {
                let info = s.info().await.map_err(|e| unavailable("stream info", e))?;
                check_config(&info.config, config)?;
                (true, info.state.messages, info.config.num_replicas)
            }
            Err(e) if e.to_string().contains("not found") => (false, 0, config.replicas),
            Err(e) => return Err(unavailable("stream lookup", e)),
        };
        Ok(NatsReport {
            server: format!(
                "{}:{} (nats-server {})",
                server.host, server.port, server.version
            ),
            stream: config.prefix.clone(),
            existed,
            messages,
            replicas,
            room,
        })
    }

    /// Deletes the stream of `config` and everything in it (benchmarks and tests clean up with
    /// it; a host never calls it).
    pub async fn delete_stream(config: &NatsConfig) -> StoreResult<()> {
        let client = connect_client(config).await?;
        let js = jetstream::new(client);
        js.delete_stream(&config.prefix)
            .await
            .map(|_| ())
            .map_err(|e| unavailable("delete stream", e))
    }

    /// How many times the watcher had to restart its consumer.
    pub fn watcher_restarts(&self) -> u64 {
        self.inner.watcher_restarts.load(Ordering::Relaxed)
    }

    pub(crate) fn now(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    /// What one message can carry under the server's `max_payload`, as advertised when this
    /// instance connected.
    pub fn room(&self) -> Room {
        self.inner.room
    }

    /// What this instance's NATS connection has sent and received so far, as the client counts
    /// it (`out_messages` is every request and publish it made). `homing bench` derives its
    /// requests per dispatch from it.
    pub fn client_statistics(&self) -> Arc<async_nats::Statistics> {
        self.inner.client.statistics()
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    pub(crate) fn view(&self) -> StoreResult<MutexGuard<'_, View>> {
        self.inner
            .view
            .lock()
            .map_err(|_| StoreError::Unavailable("nats: the view lock is poisoned".into()))
    }

    pub(crate) fn signal(&self) {
        self.inner.signal.notify_waiters();
        self.inner.signal.notify_one();
    }

    pub(crate) fn work_signal_handle(&self) -> Arc<Notify> {
        self.inner.signal.clone()
    }

    /// Waits until the view has applied everything the stream held when this was called.
    pub(crate) async fn barrier(&self) -> StoreResult<()> {
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

    /// The stream's last sequence, asked of the server.
    async fn stream_last_seq(&self) -> StoreResult<u64> {
        let subject = format!("$JS.API.STREAM.INFO.{}", self.inner.prefix);
        let reply = self
            .request(subject, Bytes::new(), HeaderMap::new())
            .await?;
        let info: InfoReply =
            serde_json::from_slice(&reply).map_err(|e| unavailable("stream info reply", e))?;
        if let Some(error) = info.error {
            return Err(unavailable(
                "stream info",
                format!("{} ({})", error.description, error.code),
            ));
        }
        Ok(info.state.map_or(0, |s| s.last_seq))
    }

    /// Waits until the view applied stream sequence `target`.
    async fn wait_for(&self, target: u64) -> StoreResult<()> {
        let deadline = tokio::time::Instant::now() + self.inner.timeout;
        loop {
            let applied = self.inner.applied.notified();
            tokio::pin!(applied);
            applied.as_mut().enable();
            if self.view()?.pos >= target {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, applied).await.is_err() {
                self.inner.resync.notify_one();
                let pos = self.view()?.pos;
                return Err(StoreError::Unavailable(format!(
                    "nats: the watcher did not reach stream sequence {target} within {:?} \
                     (it applied up to {pos})",
                    self.inner.timeout
                )));
            }
        }
    }

    async fn request(
        &self,
        subject: String,
        payload: Bytes,
        headers: HeaderMap,
    ) -> StoreResult<Bytes> {
        let request = async_nats::Request::new()
            .payload(payload)
            .headers(headers)
            .timeout(Some(self.inner.timeout));
        let shown = subject.clone();
        let fut = self.inner.client.send_request(subject, request);
        match tokio::time::timeout(self.inner.timeout + Duration::from_millis(100), fut).await {
            Ok(Ok(message)) => Ok(message.payload),
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::MaxPayloadExceeded => {
                Err(self.too_big(&shown, e))
            }
            Ok(Err(e)) => Err(unavailable(&format!("request to {shown}"), e)),
            Err(_) => Err(unavailable(&format!("request to {shown}"), "timed out")),
        }
    }

    /// The error of a message the client or server refused as over `max_payload`: retrying
    /// cannot help, so it is `Invalid`, not `Unavailable`.
    fn too_big(&self, subject: &str, e: impl fmt::Display) -> StoreError {
        StoreError::Invalid(format!(
            "nats: the message to {subject} is over the server's max_payload ({e}; {} bytes \
             when this host connected)",
            self.inner.room.server
        ))
    }

    /// Reads a subject's last message straight from the server: its sequence and payload.
    pub(crate) async fn get_last(&self, subject: &str) -> StoreResult<Option<(u64, Bytes)>> {
        let api = format!("$JS.API.DIRECT.GET.{}.{subject}", self.inner.prefix);
        let request = async_nats::Request::new()
            .payload(Bytes::new())
            .timeout(Some(self.inner.timeout));
        let fut = self.inner.client.send_request(api, request);
        let message = match tokio::time::timeout(
            self.inner.timeout + Duration::from_millis(100),
            fut,
        )
        .await
        {
            Ok(Ok(message)) => message,
            Ok(Err(e)) => return Err(unavailable("direct get", e)),
            Err(_) => return Err(unavailable("direct get", "timed out")),
        };
        if let Some(status) = message.status {
            if status.as_u16() == 404 {
                return Ok(None);
            }
            return Err(unavailable(
                "direct get",
                format!(
                    "status {status}: {}",
                    message.description.unwrap_or_default()
                ),
            ));
        }
        let seq = message
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Sequence"))
            .and_then(|v| v.as_str().parse::<u64>().ok())
            .unwrap_or(0);
        Ok(Some((seq, message.payload)))
    }

    /// Purges messages as `body` says (`filter`, `seq`: see the JetStream purge API).
    pub(crate) async fn purge(&self, body: serde_json::Value) -> StoreResult<()> {
        let api = format!("$JS.API.STREAM.PURGE.{}", self.inner.prefix);
        let body = body.to_string();
        let reply = self
            .request(api, Bytes::from(body), HeaderMap::new())
            .await?;
        let parsed: PubAck =
            serde_json::from_slice(&reply).map_err(|e| unavailable("purge reply", e))?;
        if let Some(error) = parsed.error {
            return Err(unavailable("purge", error.description));
        }
        Ok(())
    }

    /// Stores `writes` atomically, each only if its subject's last sequence is what it expects.
    /// Applies them to the view on success.
    async fn commit(&self, writes: Vec<Write>) -> Result<(), CommitError> {
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
                (Expect::Thread(seq), None) | (Expect::Subject(seq), _) => {
                    headers.insert("Nats-Expected-Last-Subject-Sequence", seq.to_string());
                }
                (Expect::None, _) => {}
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
                    .map_err(|e| {
                        CommitError::Store(
                            if e.kind() == async_nats::client::PublishErrorKind::MaxPayloadExceeded
                            {
                                self.too_big(&subject, e)
                            } else {
                                unavailable("publish", e)
                            },
                        )
                    })?;
                continue;
            }
            if n > 1 {
                headers.insert("Nats-Batch-Commit", "1");
            }
            let reply = self
                .request(subject, w.payload.clone(), headers)
                .await
                .map_err(CommitError::Store)?;
            let ack: PubAck = serde_json::from_slice(&reply)
                .map_err(|e| CommitError::Store(unavailable("publish reply", e)))?;
            if let Some(error) = ack.error {
                if error.err_code == WRONG_LAST_SEQUENCE
                    || error.description.contains("wrong last sequence")
                {
                    return Err(CommitError::Conflict);
                }
                return Err(CommitError::Store(StoreError::Unavailable(format!(
                    "nats: publish refused: {} (code {}, {})",
                    error.description, error.code, error.err_code
                ))));
            }
            last_seq = ack.seq;
        }
        // An atomic batch is stored contiguously, ending at the acknowledged sequence.
        let first = last_seq.saturating_sub(n as u64 - 1);
        if let Ok(mut view) = self.inner.view.lock() {
            for (i, w) in writes.into_iter().enumerate() {
                view.apply_own(first + i as u64, w.record);
            }
        }
        self.inner.applied.notify_waiters();
        Ok(())
    }

    /// Runs an operation: decide from the view, commit, and decide again after a barrier when
    /// an expectation failed or the view's answer was a refusal.
    pub(crate) async fn run<T>(
        &self,
        mut decide: impl FnMut(&mut View, u64, bool) -> StoreResult<Plan<T>>,
    ) -> StoreResult<T> {
        let mut fresh = false;
        for _ in 0..MAX_ATTEMPTS {
            let plan = {
                let mut view = self.view()?;
                decide(&mut view, self.now(), fresh)?
            };
            match plan {
                Plan::Done(out) => return out,
                Plan::Refuse(out) if fresh => return out,
                Plan::Refuse(_) => {}
                Plan::Write(writes, out, wake) => match self.commit(writes).await {
                    Ok(()) => {
                        if wake {
                            self.signal();
                        }
                        return out;
                    }
                    Err(CommitError::Store(e)) => return Err(e),
                    Err(CommitError::Conflict) => {}
                },
            }
            self.barrier().await?;
            fresh = true;
        }
        Err(StoreError::Contention(
            "nats: too many concurrent writers on the same records; retry later".into(),
        ))
    }
}

/// The room of the server `client` is connected to, from its advertised `max_payload` (the
/// client's own negotiated value when the server info does not say).
fn room_of(client: &async_nats::Client) -> StoreResult<Room> {
    let advertised = client.server_info().max_payload;
    let server = if advertised > 0 {
        advertised
    } else {
        client.max_payload()
    } as u64;
    if server < MIN_SERVER_PAYLOAD {
        return Err(StoreError::Invalid(format!(
            "the NATS server's max_payload is {server} bytes; Homing needs at least \
             {MIN_SERVER_PAYLOAD} (raise max_payload in the server's configuration)"
        )));
    }
    Ok(Room::of(server))
}

async fn connect_client(config: &NatsConfig) -> StoreResult<async_nats::Client> {
    let mut options = async_nats::ConnectOptions::new()
        .connection_timeout(config.connect_timeout)
        .request_timeout(Some(config.request_timeout))
        .name("homing");
    if let Some(creds) = &config.credentials {
        options = options.credentials_file(creds).await.map_err(|e| {
            StoreError::Invalid(format!("credentials file {}: {e}", creds.display()))
        })?;
    }
    let connect = options.connect(config.urls.clone());
    match tokio::time::timeout(config.connect_timeout + Duration::from_secs(1), connect).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(unavailable(
            &format!("cannot connect to {}", config.urls.join(", ")),
            e,
        )),
        Err(_) => Err(unavailable(
            &format!("cannot connect to {}", config.urls.join(", ")),
            "timed out",
        )),
    }
}

fn stream_config(config: &NatsConfig) -> stream::Config {
    stream::Config {
        name: config.prefix.clone(),
        subjects: vec![format!("{}.>", config.prefix)],
        max_messages_per_subject: 1,
        discard: stream::DiscardPolicy::Old,
        retention: stream::RetentionPolicy::Limits,
        storage: stream::StorageType::File,
        num_replicas: config.replicas,
        allow_direct: true,
        allow_rollup: true,
        allow_message_ttl: true,
        allow_atomic_publish: true,
        ..Default::default()
    }
}

/// Fails when an existing stream was made for another shape of deployment.
fn check_config(found: &stream::Config, config: &NatsConfig) -> StoreResult<()> {
    let want = stream_config(config);
    let mut diffs = Vec::new();
    if found.num_replicas != want.num_replicas {
        diffs.push(format!(
            "replicas {} (configured {})",
            found.num_replicas, want.num_replicas
        ));
    }
    if found.max_messages_per_subject != 1 {
        diffs.push(format!(
            "max_msgs_per_subject {} (need 1)",
            found.max_messages_per_subject
        ));
    }
    if !found.max_age.is_zero() || found.max_messages > 0 || found.max_bytes > 0 {
        diffs.push("a retention limit (max_age, max_msgs or max_bytes) would drop records".into());
    }
    if !found.allow_atomic_publish || !found.allow_direct || !found.allow_message_ttl {
        diffs.push("atomic batches, direct gets and message TTLs must be allowed".into());
    }
    if found.subjects != want.subjects {
        diffs.push(format!(
            "subjects {:?} (need {:?})",
            found.subjects, want.subjects
        ));
    }
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "the NATS stream `{}` exists with other settings: {}; fix the config or the stream",
            config.prefix,
            diffs.join("; ")
        )))
    }
}

async fn ensure_stream(js: &jetstream::Context, config: &NatsConfig) -> StoreResult<()> {
    match js.get_stream(&config.prefix).await {
        Ok(mut s) => {
            let info = s.info().await.map_err(|e| unavailable("stream info", e))?;
            check_config(&info.config, config)
        }
        Err(e) if e.to_string().contains("not found") => {
            match js.create_stream(stream_config(config)).await {
                Ok(_) => Ok(()),
                // Another host created it first: check what it made.
                Err(e) if e.to_string().contains("already in use") => {
                    let mut s = js
                        .get_stream(&config.prefix)
                        .await
                        .map_err(|e| unavailable("stream lookup", e))?;
                    let info = s.info().await.map_err(|e| unavailable("stream info", e))?;
                    check_config(&info.config, config)
                }
                Err(e) => Err(unavailable("create stream", e)),
            }
        }
        Err(e) => Err(unavailable("stream lookup", e)),
    }
}

/// Follows the stream into the view until the store is dropped; restarts its consumer from the
/// last applied sequence whenever it fails.
async fn watch(weak: Weak<Inner>) {
    let mut restarts = 0u64;
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let start = inner.view.lock().map(|v| v.pos).unwrap_or(0);
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
        let created = async {
            let s = js
                .get_stream_no_info(&stream)
                .await
                .map_err(|e| e.to_string())?;
            let c = s
                .create_consumer(consumer::push::OrderedConfig {
                    deliver_subject: deliver,
                    deliver_policy: policy,
                    ..Default::default()
                })
                .await
                .map_err(|e| e.to_string())?;
            c.messages().await.map_err(|e| e.to_string())
        }
        .await;
        match created {
            Ok(mut messages) => loop {
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
                            let seq = match message.info() {
                                Ok(info) => info.stream_sequence,
                                Err(_) => continue,
                            };
                            inner.ingest(seq, message.subject.as_str(), &message.payload);
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
        let decoded = Key::parse(&self.prefix, subject).map(|key| key.decode(payload));
        let mut wake = false;
        if let Ok(mut view) = self.view.lock() {
            match decoded {
                Some(Ok(record)) => {
                    // A dispatch becoming queued, or leaving `claimed` (its thread is free).
                    wake = match &record {
                        Record::Dispatch(_, id, Some(s)) => {
                            s.d.status == crate::store::Status::Queued
                                || view.dispatch(id).ok().flatten().is_some_and(|old| {
                                    old.d.status == crate::store::Status::Claimed
                                })
                        }
                        _ => false,
                    };
                    view.apply(seq, record);
                }
                Some(Err((key, reason))) => view.mark_corrupt(seq, key, reason),
                None => view.skip(seq),
            }
        }
        self.applied.notify_waiters();
        if wake {
            self.signal.notify_waiters();
            self.signal.notify_one();
        }
    }
}
