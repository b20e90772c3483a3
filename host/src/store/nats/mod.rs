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
//! | `<p>.th.<thread>.e.<seq>` | one thread-log entry (with a note when it records a message) |
//! | `<p>.th.<thread>.m.<seq>` | one inbox message (framed: JSON fields, then the payload) |
//! | `<p>.th.<thread>.w.<id>` | one waitpoint (framed: JSON fields, then the result; `waitpoints`) |
//! | `<p>.id.<id>` | the thread of a caller-chosen id (admits the id once) |
//! | `<p>.ar.<thread>.<id>` | a settled dispatch record moved out of its thread's tree (`archive`) |
//! | `<p>.aw.<thread>.<id>` | a waitpoint of a dispatch moved to the archive, moved with it |
//! | `<p>.jn.<dispatch>.c.<pos>` | a journal call entry (framed: JSON fields, then the body; `journal`) |
//! | `<p>.jn.<dispatch>.s.<key>` | a journal step (framed: JSON fields, then the value) |
//! | `<p>.jx.<dispatch>` | the mark of a dispatch with a journal (its thread), for the sweep |
//! | `<p>.dl.<dispatch>.<claim>.<first>` | a batch of streamed deltas, `Nats-TTL` = until its expiry (`deltas`) |
//! | `<p>.lim.<scope>` | a flow-control scope: its slots' holders and its bucket (`limits`) |
//! | `<p>.pz.<agent>` or `<p>.pz.<agent 0x1f key>` | a pause; an empty payload once resumed |
//!
//! Live deltas travel outside the stream, on the core subject `_HOMING_LIVE.<p>.<dispatch>`
//! (never stored; no prefix may start with `_HOMING`, so no deployment's stream captures it).
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
//! - Ownership of a thread is its one dispatch record in state `claimed` or `waiting`; there is
//!   no separate guard record that could disagree with it (and so leave a thread blocked, or
//!   held twice, when the two fell out of step). At most one exists because a claim is decided
//!   on a complete view of the thread and fenced by it.
//! - A suspend and a waitpoint's completion both write the thread's tree, so each is decided
//!   on a tree that holds the other if it came first: an early completion is never lost.
//! - A claim, an ack and a reclaim of one dispatch all name the same sequence; whichever is
//!   stored first wins and the others are refused (guarantee 3).
//! - An enqueue stamps the epoch and checks the dedupe key against the thread as of its fence,
//!   so an interrupt or a competing enqueue cannot slip between (guarantees 7 and 8).
//! - A log entry's sequence is the thread's latest plus one, fenced the same way: no gap, no
//!   out-of-order or torn entry is ever visible (the contract, docs/contract.md, section 4). A
//!   guest's fence (its claim's token, lease and epoch) is read from the dispatch record the
//!   same write is fenced by.
//! - Acks are fenced by the record; JetStream's own message acks play no part.
//!
//! Multi-record changes (an interrupt bumping the epoch and superseding the queued and waiting
//! dispatches, a takeover of an expired holder, the end of a dispatch with pending waitpoints,
//! the resume of a waiting dispatch) are one JetStream atomic batch whose first message
//! carries the thread's expectation. Atomic batches on a file stream are synced to disk at every commit
//! (the server's choice), about ten times the cost of a plain publish here, so the hot path
//! (enqueue, claim, record, settle, append) never uses them; a caller-chosen id is the one
//! exception on it (its id record and the dispatch go together).
//!
//! # Finding work without scans
//!
//! Each instance keeps a [`view::View`]: the records of the threads' trees, fed by one ordered
//! push consumer (the watcher) that loads the trees once at start (`<p>.th.>`: the server skips
//! the archive) and then follows the stream, plus this instance's own writes applied as soon
//! as they are acknowledged. The view keeps the claim
//! index (per agent, the open threads ordered by priority then least recently served), so a
//! claim is a lookup in memory and one atomic batch of two messages. The view may lag: its
//! answers are checked by the compare-and-set of the write they lead to, and refusals (nothing
//! to claim, not found, not claimed) are only returned after a *barrier*: a request for the
//! stream's last sequence and a wait until the watcher applied it. A failed expectation
//! also waits for the barrier before deciding again.
//!
//! There are no per-thread arrays of dispatch ids (which grow with the backlog and are
//! rewritten on every change) and no key scans (whose cost grows with the stream): the index
//! is rebuilt by the watcher's load at start (one streamed pass over the trees, no per-key
//! requests) and kept by it since. Wake-ups come from the watcher too: an instance signals its own workers
//! when a record it sees makes work claimable, so hosts do not wake each other in a storm of
//! re-signals. The watcher restarts from the last sequence it applied when its consumer fails
//! (the stream deleted, the server gone) and counts the restarts
//! ([`NatsStore::watcher_restarts`]).
//!
//! # Modules
//!
//! - `config`: [`NatsConfig`], and [`Room`], what one message can carry.
//! - `jetstream`: the connection and the stream, plain requests, and what the server's
//!   errors mean (by their JetStream error codes).
//! - `commit`: the commit engine: an operation's `Plan` and its writes, committed
//!   with their expectations and decided again after a conflict.
//! - `watcher`: the consumer that keeps the view, and the barrier.
//! - [`view`] and [`keys`]: the projection and the subject and record encoding.
//! - `mailbox`, `queries`, `log`, `inbox`, `waitpoints` and `journal`: the operations. Every
//!   holder, fence, claim and reclaim decision in them is the store's rules' (`store::rules`),
//!   shared with the embedded backend.
//! - `deltas`: streamed deltas, their batches in the stream (unfenced) and the live bus on
//!   core NATS.
//!
//! # Clients read, hosts follow
//!
//! Only a host needs the claim index, and so a view of every thread. A short-lived client
//! (every `homing` command but `run`; [`NatsStore::connect_client`]) has no watcher: each
//! operation reads the records it decides on straight from the server (`fetch`): its thread's
//! fence, thread record and dispatches, or one dispatch found by id, and writes fenced as a
//! host's would. Its cost depends on the thread it touches, never on how many records the
//! stream retains; the conformance suite runs against clients too. A caller-chosen id is
//! found through its id index; a minted id (a UUID v7) by one last-message lookup of
//! `<p>.th.*.d.<id>`, then of `<p>.ar.*.<id>` when it was archived, which the server answers
//! from its subject index (its cost grows with the number of threads, not of records: about
//! 12 ms at 100,000 threads).
//!
//! # What a host's start reads
//!
//! A settled record stays in its thread's tree for [`NatsConfig::archive_after`], then a
//! host's sweep moves it to the archive (`archive`): a copy outside the tree, a fenced
//! rewrite of the thread record so that the record is not the tree's last message (the fence
//! must never move back), and the delete of exactly that message. Reads of dispatch records
//! look in the tree first and in the archive after (`fetch`). So a starting host reads one
//! thread record per thread that ever settled a record, the live and recently settled
//! records, and the log entries not yet trimmed; not the settled records the stream retains.
//!
//! # Round trips per dispatch
//!
//! enqueue: one message; claim and start: a barrier (shared by concurrent claimers of one
//! host) and one message; complete: one message. A worker's completion and its next claim
//! need no barrier: the claim waits for the watcher to apply the completion's own sequence.
//! Lease renewals add one message per third of a lease. `homing bench --backend nats` counts
//! them at the server.
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

mod archive;
mod commit;
mod config;
mod deltas;
mod effects;
mod fetch;
mod inbox;
mod jetstream;
mod journal;
pub mod keys;
mod limits;
mod log;
mod mailbox;
mod queries;
mod records;
mod schedules;
pub mod view;
#[cfg(test)]
mod view_model;
mod waitpoints;
mod watcher;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

pub use self::config::{ARCHIVE_AFTER, MIN_SERVER_PAYLOAD, NatsConfig, Room};
use self::jetstream::{
    check_config, connect_client, ensure_stream, find_stream, room_of, unavailable,
};
use self::view::View;
use crate::store::{SharedClock, Store, StoreError, StoreResult};

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
    js: async_nats::jetstream::Context,
    /// The stream's name, and the first token of every subject.
    prefix: String,
    timeout: Duration,
    /// The `Nats-TTL` header settled records are written with, if any.
    settled_ttl: Option<String>,
    /// The same retention in seconds (archived copies expire with what remains of it).
    retention_secs: Option<u64>,
    /// How long a settled record stays in its tree before it is archived, in milliseconds.
    archive_after_ms: u64,
    /// The stream sequence the archiver's next page of the trees starts at.
    archive_from: AtomicU64,
    /// The stream sequence the journal sweep's next page of marks starts at (`journal`).
    journal_from: AtomicU64,
    /// The dispatches this instance wrote a journal mark for (`journal`; forgotten when it
    /// grows past a bound, which only costs a mark written again).
    journaled: Mutex<std::collections::HashSet<String>>,
    /// What one message can carry (from the server's `max_payload` at connect).
    room: Room,
    clock: SharedClock,
    /// Whether this instance follows the stream into `view` (a host), or reads what each
    /// operation needs straight from the server (a short-lived client; see `fetch`).
    follow: bool,
    /// Whether the stream has more than one replica: then what a decision reads from the
    /// server is read from the stream's leader, or checked against it (see `fetch`).
    replicated: bool,
    view: Mutex<View>,
    /// Fired whenever the watcher applied messages (barrier waiters listen).
    applied: Notify,
    /// Fired when work may have become claimable.
    signal: Arc<Notify>,
    /// The thread watches of this instance (woken by the watcher, and by this instance's
    /// own writes).
    watches: crate::store::inbox::Watches,
    /// The threads a client's watch subscription follows now (see `inbox`).
    subscribed: Mutex<std::collections::HashSet<String>>,
    /// Fired when the instance is dropped: ends a client's watch subscriptions.
    dropped: Arc<Notify>,
    watcher_restarts: AtomicU64,
    /// Asks the watcher to recreate its consumer from its position (a barrier timed out).
    resync: Arc<Notify>,
    /// Barrier callers so far, and (under the lock) the highest caller number the last
    /// fetched target serves together with that target: concurrent barriers share a request.
    barrier_calls: AtomicU64,
    barrier_last: tokio::sync::Mutex<(u64, u64)>,
    watcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The name of the watcher's current consumer, deleted by [`NatsStore::close`].
    consumer: Mutex<Option<String>>,
    /// Why the watcher last failed to create its consumer (cleared when it succeeds), for the
    /// barrier's timeout message.
    watch_error: Mutex<Option<String>>,
    /// The live bus of deltas on this instance's connection (`deltas`).
    live: Arc<deltas::NatsLive>,
    /// Per agent, the round-robin turns of its concurrency keys (`limits`; this instance's
    /// own, as fairness needs no more).
    turns: Mutex<std::collections::HashMap<String, limits::Turns>>,
    /// Per rate-only scope, the tokens this instance took from its shared bucket ahead of its
    /// claims (`limits`).
    blocks: Mutex<std::collections::HashMap<String, crate::store::limits::Block>>,
    /// Per rate-only scope, held while this instance takes a block of its tokens: its claimers
    /// wait for one block instead of racing each other's compare-and-set on the scope record.
    /// One lock a scope, so the blocks of different keys are taken at once.
    refills: Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Per concurrency key's scope, the slot block this instance holds there (`limits`).
    slot_blocks: Mutex<std::collections::HashMap<String, limits::SlotBlock>>,
    /// The holder name of this instance's slot blocks (random: a new instance, a new name).
    block_id: String,
    /// A test's hold on own applies (never held in production; see `commit::OwnHold`).
    own_hold: commit::OwnHold,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.dropped.notify_waiters();
        if let Ok(mut watcher) = self.watcher.lock()
            && let Some(task) = watcher.take()
        {
            task.abort();
        }
    }
}

/// How many times a store asks the server's time when it connects (see `connect_as`).
const CONNECT_STAMPS: usize = 3;

impl NatsStore {
    /// Connects, creates or checks the stream, replays it into the view, and starts following:
    /// the instance a host holds.
    pub async fn connect(config: &NatsConfig, clock: SharedClock) -> StoreResult<NatsStore> {
        NatsStore::connect_as(config, clock, true).await
    }

    /// Connects and creates or checks the stream, without following it: each operation reads
    /// the records it decides on straight from the server, at a cost independent of how much
    /// the stream retains. For short-lived clients (every CLI command but `homing run`).
    pub async fn connect_client(config: &NatsConfig, clock: SharedClock) -> StoreResult<NatsStore> {
        NatsStore::connect_as(config, clock, false).await
    }

    async fn connect_as(
        config: &NatsConfig,
        clock: SharedClock,
        follow: bool,
    ) -> StoreResult<NatsStore> {
        config.validate().map_err(StoreError::Invalid)?;
        let client = connect_client(config).await?;
        let room = room_of(&client)?;
        let js = async_nats::jetstream::ContextBuilder::new()
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
        // The store's clock is the server's (a `ServerClock` follows it; others ignore it):
        // its first stamps before anything reads the time. A stamp is only as good as the
        // answer was quick (the clock runs behind by the time it took to reach this task, and a
        // host running behind writes leases that short), so it asks a few times and the clock
        // keeps the stamp read soonest after the server wrote it.
        for _ in 0..CONNECT_STAMPS {
            if let Some(server_ms) = jetstream::server_time(&js, &config.prefix).await {
                clock.observe_server(server_ms, std::time::Instant::now());
            }
        }
        let inner = Arc::new(Inner {
            client: client.clone(),
            js,
            prefix: config.prefix.clone(),
            timeout: config.request_timeout,
            settled_ttl: config
                .settled_ttl
                .map(|ttl| format!("{}s", ttl.as_secs().max(1))),
            retention_secs: config.settled_ttl.map(|ttl| ttl.as_secs().max(1)),
            archive_after_ms: u64::try_from(config.archive_after.as_millis()).unwrap_or(u64::MAX),
            archive_from: AtomicU64::new(1),
            journal_from: AtomicU64::new(1),
            journaled: Mutex::new(std::collections::HashSet::new()),
            room,
            clock,
            follow,
            replicated: config.replicas > 1,
            view: Mutex::new(View::lean()),
            applied: Notify::new(),
            signal: Arc::new(Notify::new()),
            watches: crate::store::inbox::Watches::default(),
            subscribed: Mutex::new(std::collections::HashSet::new()),
            dropped: Arc::new(Notify::new()),
            watcher_restarts: AtomicU64::new(0),
            resync: Arc::new(Notify::new()),
            barrier_calls: AtomicU64::new(0),
            barrier_last: tokio::sync::Mutex::new((0, 0)),
            watcher: Mutex::new(None),
            consumer: Mutex::new(None),
            watch_error: Mutex::new(None),
            live: Arc::new(deltas::NatsLive::start(
                client.clone(),
                &config.prefix,
                config.request_timeout,
            )),
            turns: Mutex::new(std::collections::HashMap::new()),
            blocks: Mutex::new(std::collections::HashMap::new()),
            refills: Mutex::new(std::collections::HashMap::new()),
            slot_blocks: Mutex::new(std::collections::HashMap::new()),
            block_id: format!("block.{:016x}", fastrand::u64(..)),
            own_hold: commit::OwnHold::default(),
        });
        if !follow {
            return Ok(NatsStore { inner });
        }
        let task = tokio::spawn(watcher::watch(Arc::downgrade(&inner)));
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

    /// Stops following the stream and deletes the watcher's consumer on the server (best
    /// effort, within the request timeout). A consumer left behind lingers on the server for
    /// its inactivity threshold (30 s), and a stream takes at most 1,000 consumers by the
    /// server's default: short-lived processes (each CLI command) that did not close would,
    /// run quickly enough, make the next one unable to follow the stream at all. The store
    /// must not be used after this.
    pub async fn close(&self) {
        if let Ok(mut watcher) = self.inner.watcher.lock()
            && let Some(task) = watcher.take()
        {
            task.abort();
        }
        let name = self
            .inner
            .consumer
            .lock()
            .ok()
            .and_then(|mut name| name.take());
        let Some(name) = name else { return };
        let delete = async {
            let stream = self
                .inner
                .js
                .get_stream_no_info(&self.inner.prefix)
                .await
                .map_err(|e| e.to_string())?;
            stream
                .delete_consumer(&name)
                .await
                .map_err(|e| e.to_string())
        };
        match tokio::time::timeout(self.inner.timeout, delete).await {
            Ok(Ok(_)) => tracing::debug!(consumer = %name, "nats: watcher consumer deleted"),
            Ok(Err(e)) => {
                tracing::debug!(consumer = %name, "nats: cannot delete the watcher consumer: {e}")
            }
            Err(_) => {
                tracing::debug!(consumer = %name, "nats: deleting the watcher consumer timed out")
            }
        }
    }

    /// Opens the backend as a host holds it ([`NatsStore::connect`]).
    pub async fn open(config: &NatsConfig, clock: SharedClock) -> StoreResult<Store> {
        let store = NatsStore::connect(config, clock.clone()).await?;
        Ok(store.into_store())
    }

    /// Opens the backend as a short-lived client holds it ([`NatsStore::connect_client`]).
    pub async fn open_client(config: &NatsConfig, clock: SharedClock) -> StoreResult<Store> {
        let store = NatsStore::connect_client(config, clock).await?;
        Ok(store.into_store())
    }

    /// Whether this instance follows the stream (a host) rather than reading on demand.
    pub fn follows(&self) -> bool {
        self.inner.follow
    }

    /// Both halves over this instance.
    pub fn into_store(self) -> Store {
        let clock = self.inner.clock.clone();
        let shared = Arc::new(self);
        Store {
            mailbox: shared.clone(),
            log: shared.clone(),
            inbox: shared.clone(),
            waitpoints: shared.clone(),
            journal: shared.clone(),
            deltas: shared.clone(),
            limits: shared.clone(),
            schedules: shared,
            clock,
        }
    }

    /// Connects and reports what exists, creating nothing (`homing config check`).
    pub async fn check(config: &NatsConfig) -> StoreResult<NatsReport> {
        config.validate().map_err(StoreError::Invalid)?;
        let client = connect_client(config).await?;
        let server = client.server_info();
        let room = room_of(&client)?;
        let js = async_nats::jetstream::ContextBuilder::new()
            .timeout(config.request_timeout)
            .build(client.clone());
        let (existed, messages, replicas) = match find_stream(&js, config).await? {
            Some(info) => {
                check_config(&info.config, config)?;
                (true, info.state.messages, info.config.num_replicas)
            }
            None => (false, 0, config.replicas),
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
        let js = async_nats::jetstream::new(client);
        js.delete_stream(&config.prefix)
            .await
            .map(|_| ())
            .map_err(|e| unavailable("delete stream", e))
    }

    /// Stores terminal records as they are, bypassing the mailbox's rules and fences, in the
    /// archive (where the archiver leaves settled records): how `homing bench` makes a stream
    /// that retains many records quickly (publishes in flight together, acknowledged before
    /// this returns). Anything but a terminal record is refused.
    pub(crate) async fn retain_for_bench(
        &self,
        records: Vec<crate::store::Dispatch>,
    ) -> StoreResult<()> {
        const IN_FLIGHT: usize = 4096;
        let mut acks = Vec::with_capacity(IN_FLIGHT);
        let mut threads = std::collections::HashSet::new();
        let mut messages = Vec::new();
        for d in records {
            if !d.status.is_terminal() {
                return Err(StoreError::Invalid(format!(
                    "dispatch {} is {}; only terminal records are retained directly",
                    d.id, d.status
                )));
            }
            // What the archiver leaves (see `archive`): the record in the archive, and in
            // its thread's tree the thread record it wrote.
            if threads.insert(d.thread.clone()) {
                let subject = keys::Key::Thread(d.thread.clone()).subject(self.prefix());
                messages.push((subject, keys::encode_thread(&view::ThreadRec::default())?));
            }
            let subject = keys::Key::Archive(d.thread.clone(), d.id.clone()).subject(self.prefix());
            let mut stored = commit::plain(d);
            messages.push((subject, keys::encode_dispatch(&mut stored)?));
        }
        for (subject, payload) in messages {
            let ack = self
                .inner
                .js
                .publish(subject, payload)
                .await
                .map_err(|e| unavailable("publish", e))?;
            acks.push(ack);
            if acks.len() >= IN_FLIGHT {
                for ack in acks.drain(..) {
                    ack.await.map_err(|e| unavailable("publish ack", e))?;
                }
            }
        }
        for ack in acks {
            ack.await.map_err(|e| unavailable("publish ack", e))?;
        }
        Ok(())
    }

    /// How many dispatch records this instance's view holds (a host's: its live work).
    pub fn view_records(&self) -> usize {
        self.inner.view.lock().map_or(0, |v| v.records())
    }

    /// How many waitpoint records this instance's view holds (a host's: those of its live
    /// work).
    pub fn view_waitpoints(&self) -> usize {
        self.inner.view.lock().map_or(0, |v| v.waitpoint_count())
    }

    /// For tests: holds every commit of this instance between the server's acknowledgement and
    /// the write's own apply to the view, until [`NatsStore::release_own_applies`], so that a
    /// test can make the gap a descheduled task makes (the watcher and other hosts go on).
    #[doc(hidden)]
    pub fn hold_own_applies(&self) {
        self.inner.own_hold.set(true);
    }

    /// For tests: waits until at least `n` commits wait at the hold of
    /// [`NatsStore::hold_own_applies`].
    #[doc(hidden)]
    pub async fn own_applies_held(&self, n: usize) {
        self.inner.own_hold.parked(n).await;
    }

    /// For tests: lets the commits held by [`NatsStore::hold_own_applies`] go on.
    #[doc(hidden)]
    pub fn release_own_applies(&self) {
        self.inner.own_hold.set(false);
    }

    /// For tests: waits until the view applied everything the stream held when called.
    #[doc(hidden)]
    pub async fn caught_up(&self) -> StoreResult<()> {
        self.barrier().await
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
}
