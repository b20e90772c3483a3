//! The embedded backend: SQLite in one file (WAL mode), for one machine and no setup.
//!
//! # Transactions
//!
//! Every operation is one SQLite transaction. Writers open it with `BEGIN IMMEDIATE`, so the
//! write lock is taken before the first read and a decision made on what was read cannot be
//! invalidated by another connection before commit. That single rule gives the guarantees of
//! the contract (docs/contract.md, section 3) on
//! this backend: a claim, a holder write, an interrupt or an append either sees the state it
//! checks and commits its change, or changes nothing. Several processes (the host and the
//! CLI, or several store instances standing for several hosts in tests) share one file
//! safely; SQLite's busy handler serialises their writers (and a writer that waits longer
//! than [`BUSY_TIMEOUT`] gets `Contention`).
//!
//! No SQLite call runs on an async worker: writes run on the store's writer thread (see
//! [`writer`]), reads on tokio's blocking threads over a few read connections of their own
//! (WAL readers wait for no writer and for each other only when all are busy), so a slow read
//! holds up nothing else the process does.
//!
//! # Schema
//!
//! - `dispatches`: one row per dispatch (the record of the contract, section 1) plus scheduler bookkeeping: `ready`
//!   (queued and past `available_at` when last looked at) and the token and kind of the
//!   operation that settled it (`settled_token`, `settled_op`), which makes a repeated holder
//!   operation after a lost reply succeed without changing anything.
//! - `threads`: per thread, the epoch, the id of the one claimed dispatch (`holder`), and
//!   `served`, the claim counter value at the thread's last claim (for fairness).
//! - `lanes`: per (agent, thread) with ready work, the thread's best ready dispatch (its head),
//!   its priority, whether the thread is busy, and `served`. A claim is one indexed lookup in
//!   `lanes` (`agent, busy, priority, served`): the cost of a claim does not grow with the
//!   backlog, and a deep thread cannot starve others, because every claim moves the thread to
//!   the back of its priority class.
//! - `log_marks` and `log_entries`: the thread log and its watermarks.
//!
//! Delayed dispatches (`ready = 0`) are promoted into their lane by the first claim at or after
//! their `available_at`, through a partial index on `available_at`: a claim with nothing due
//! pays one index probe.
//!
//! The schema version lives in SQLite's `user_version`. Migrations are applied in order at
//! open, in one transaction; a file written by a newer schema is refused with an error naming
//! the file and both versions, before anything is written.
//!
//! # Durability
//!
//! WAL mode with `synchronous = NORMAL`: a committed transaction survives a crash of the
//! process (the host, or the machine's power only up to the last WAL checkpoint). Checkpoints,
//! the only writes that fsync in this mode, run every [`CHECKPOINT_INTERVAL`] on a thread and
//! connection of their own, so no operation waits for one. Set
//! `synchronous = FULL` through [`EmbeddedOptions::fsync_every_commit`] to survive power loss
//! at the cost of an fsync per operation.

mod claim;
mod deltas;
mod effects;
mod inbox;
mod journal;
mod lanes;
mod limits;
mod log;
mod mailbox;
mod rows;
mod schedules;
mod turns;
mod waitpoints;
mod window;
mod writer;

pub use turns::MIRRORED_KEYS;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, TransactionBehavior};
use tokio::sync::Notify;

use super::inbox::Watches;
use super::{Dispatch, SharedClock, Store, StoreError, StoreResult};

/// How long a writer waits for another connection's write lock before `Contention`.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest payload, run output or log entry this backend stores (256 MiB): SQLite keeps a
/// value and a row under 1,000,000,000 bytes (`SQLITE_MAX_LENGTH`), and one dispatch row holds
/// both a payload and an output. Larger values are refused with `Invalid`.
pub const MAX_VALUE: u64 = 256 * 1024 * 1024;

/// Why [`MAX_VALUE`] is what it is, for error messages.
pub(crate) const MAX_VALUE_WHY: &str =
    "the embedded store's cap, well below SQLite's limit of 1,000,000,000 bytes per row";

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = 11;

/// Migrations, index `i` moves the schema from version `i` to `i + 1`. Public so a test can
/// write a file as an earlier release did (the first `n` of them) and open it with this one.
pub const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE dispatches (
    id            TEXT PRIMARY KEY NOT NULL,
    agent         TEXT NOT NULL,
    thread        TEXT NOT NULL,
    run_id        TEXT NOT NULL,
    payload       BLOB NOT NULL,
    metadata      TEXT NOT NULL,
    priority      INTEGER NOT NULL,
    available_at  INTEGER NOT NULL,
    dedupe_key    TEXT,
    max_attempts  INTEGER NOT NULL,
    attempt       INTEGER NOT NULL,
    epoch         INTEGER NOT NULL,
    status        TEXT NOT NULL,
    ready         INTEGER NOT NULL DEFAULT 0,
    claim_token   TEXT,
    claimed_by    TEXT,
    lease_until   INTEGER,
    started_at    INTEGER,
    result_status TEXT,
    result_output BLOB,
    result_error  TEXT,
    last_error    TEXT,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    completed_at  INTEGER,
    settled_token TEXT,
    settled_op    TEXT
);
CREATE UNIQUE INDEX dispatches_live_dedupe ON dispatches (thread, dedupe_key)
    WHERE dedupe_key IS NOT NULL AND status IN ('queued', 'claimed');
CREATE INDEX dispatches_by_thread ON dispatches (thread, priority, created_at, id);
CREATE INDEX dispatches_by_agent ON dispatches (agent, status, priority, created_at, id);
CREATE INDEX dispatches_lane_heads ON dispatches (agent, thread, priority, created_at, id)
    WHERE status = 'queued' AND ready = 1;
CREATE INDEX dispatches_delayed ON dispatches (available_at) WHERE status = 'queued' AND ready = 0;
CREATE INDEX dispatches_leases ON dispatches (lease_until) WHERE status = 'claimed';
CREATE INDEX dispatches_completed ON dispatches (completed_at, id) WHERE completed_at IS NOT NULL;
CREATE INDEX dispatches_live ON dispatches (status, thread) WHERE status IN ('queued', 'claimed');

CREATE TABLE threads (
    thread TEXT PRIMARY KEY NOT NULL,
    epoch  INTEGER NOT NULL DEFAULT 0,
    holder TEXT,
    served INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

CREATE TABLE lanes (
    agent    TEXT NOT NULL,
    thread   TEXT NOT NULL,
    priority INTEGER NOT NULL,
    served   INTEGER NOT NULL,
    created  INTEGER NOT NULL,
    head     TEXT NOT NULL,
    busy     INTEGER NOT NULL,
    PRIMARY KEY (agent, thread)
) WITHOUT ROWID;
CREATE INDEX lanes_pick ON lanes (agent, busy, priority, served, created);
CREATE INDEX lanes_by_thread ON lanes (thread);

CREATE TABLE counters (
    name  TEXT PRIMARY KEY NOT NULL,
    value INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE log_marks (
    thread   TEXT PRIMARY KEY NOT NULL,
    reserved INTEGER NOT NULL,
    latest   INTEGER NOT NULL,
    trimmed  INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE log_entries (
    thread      TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    data        BLOB NOT NULL,
    appended_at INTEGER NOT NULL,
    PRIMARY KEY (thread, seq)
) WITHOUT ROWID;
"#,
    // Version 2: `list` pages by cursor in its order (priority, created_at, id) across all
    // threads, and within one status, without sorting the table.
    r#"
CREATE INDEX dispatches_order ON dispatches (priority, created_at, id);
CREATE INDEX dispatches_by_status ON dispatches (status, priority, created_at, id);
"#,
    // Version 3, for `homing:agent@0.2.0`: run counters on dispatches; the `waiting` status in
    // the live indexes; the inbox watermarks and the last agent on threads; message notes on
    // log entries; and the tables of messages, waitpoints, journals and streamed output
    // (docs/contract.md sections 9 to 12). One migration for the four features.
    r#"
ALTER TABLE dispatches ADD COLUMN claims     INTEGER NOT NULL DEFAULT 0;
ALTER TABLE dispatches ADD COLUMN resumes    INTEGER NOT NULL DEFAULT 0;
ALTER TABLE dispatches ADD COLUMN waitpoints INTEGER NOT NULL DEFAULT 0;
DROP INDEX dispatches_live_dedupe;
CREATE UNIQUE INDEX dispatches_live_dedupe ON dispatches (thread, dedupe_key)
    WHERE dedupe_key IS NOT NULL AND status IN ('queued', 'claimed', 'waiting');
DROP INDEX dispatches_live;
CREATE INDEX dispatches_live ON dispatches (status, thread)
    WHERE status IN ('queued', 'claimed', 'waiting');

ALTER TABLE threads ADD COLUMN inbox_latest   INTEGER NOT NULL DEFAULT 0;
ALTER TABLE threads ADD COLUMN inbox_pending  INTEGER NOT NULL DEFAULT 0;
ALTER TABLE threads ADD COLUMN inbox_followed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE threads ADD COLUMN last_agent     TEXT;

ALTER TABLE log_entries ADD COLUMN note TEXT;

CREATE TABLE messages (
    thread     TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    agent      TEXT,
    payload    BLOB NOT NULL,
    metadata   TEXT NOT NULL,
    sent_by    TEXT NOT NULL,
    sent_at    INTEGER NOT NULL,
    state      TEXT NOT NULL,
    settled_at INTEGER,
    acked_by   TEXT,
    log_seq    INTEGER,
    PRIMARY KEY (thread, seq)
);
CREATE INDEX messages_pending ON messages (thread, seq) WHERE state = 'pending';
CREATE INDEX messages_settled ON messages (settled_at) WHERE settled_at IS NOT NULL;

CREATE TABLE waitpoints (
    id            TEXT PRIMARY KEY NOT NULL,
    dispatch      TEXT NOT NULL,
    thread        TEXT NOT NULL,
    agent         TEXT NOT NULL,
    name          TEXT NOT NULL,
    state         TEXT NOT NULL,
    token_digests TEXT NOT NULL,
    metadata      TEXT NOT NULL,
    timeout_at    INTEGER NOT NULL,
    result        BLOB,
    settled_by    TEXT,
    created_at    INTEGER NOT NULL,
    created_claim INTEGER NOT NULL,
    settled_at    INTEGER
);
CREATE UNIQUE INDEX waitpoints_by_name ON waitpoints (dispatch, name);
CREATE INDEX waitpoints_due ON waitpoints (timeout_at) WHERE state = 'pending';
CREATE INDEX waitpoints_by_thread ON waitpoints (thread, created_at, id);
CREATE INDEX waitpoints_by_state ON waitpoints (state, created_at, id);

CREATE TABLE journal (
    dispatch    TEXT NOT NULL,
    pos         INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    identity    BLOB NOT NULL,
    cheap       BLOB,
    answer      TEXT NOT NULL,
    body        BLOB,
    claim       INTEGER NOT NULL,
    attempt     INTEGER NOT NULL,
    recorded_at INTEGER NOT NULL,
    duration_us INTEGER NOT NULL,
    size        INTEGER NOT NULL,
    PRIMARY KEY (dispatch, pos)
);
CREATE TABLE journal_steps (
    dispatch    TEXT NOT NULL,
    key         TEXT NOT NULL,
    value       BLOB NOT NULL,
    claim       INTEGER NOT NULL,
    attempt     INTEGER NOT NULL,
    recorded_at INTEGER NOT NULL,
    size        INTEGER NOT NULL,
    PRIMARY KEY (dispatch, key)
);

CREATE TABLE deltas (
    dispatch   TEXT NOT NULL,
    claim      INTEGER NOT NULL,
    first      INTEGER NOT NULL,
    chunks     BLOB NOT NULL,
    count      INTEGER NOT NULL,
    written_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (dispatch, claim, first)
);
CREATE INDEX deltas_expiry ON deltas (expires_at);
"#,
    r#"
ALTER TABLE dispatches ADD COLUMN concurrency_key TEXT;
ALTER TABLE lanes ADD COLUMN ckey TEXT NOT NULL DEFAULT '';
DROP INDEX dispatches_lane_heads;
CREATE INDEX dispatches_lane_heads ON dispatches (agent, thread, priority, created_at, id, concurrency_key)
    WHERE status = 'queued' AND ready = 1;
CREATE INDEX lanes_by_key ON lanes (agent, busy, priority, ckey, served, created);

CREATE TABLE limit_slots (
    scope  TEXT NOT NULL,
    holder TEXT NOT NULL,
    claims INTEGER NOT NULL,
    until  INTEGER NOT NULL,
    PRIMARY KEY (scope, holder)
) WITHOUT ROWID;

CREATE TABLE limit_buckets (
    scope  TEXT PRIMARY KEY,
    tokens REAL NOT NULL,
    at     INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE key_turns (
    agent TEXT NOT NULL,
    key   TEXT NOT NULL,
    turn  INTEGER NOT NULL,
    PRIMARY KEY (agent, key)
) WITHOUT ROWID;

CREATE TABLE pauses (
    agent  TEXT NOT NULL,
    key    TEXT NOT NULL,
    reason TEXT NOT NULL,
    at     INTEGER NOT NULL,
    PRIMARY KEY (agent, key)
) WITHOUT ROWID;
"#,
    // Version 5: the version of its plugin each claim of a dispatch ran (docs/contract.md
    // section 14), as JSON; NULL until a versioned claim ran it.
    r#"
ALTER TABLE dispatches ADD COLUMN versions TEXT;
"#,
    // Version 6: the keyed rotation reads the keys in turn order instead of grouping every
    // free lane by key: `key_turns` gets that order as an index and a row for every key with
    // a lane (at turn 0, below any floor, until its first claim), and `lanes_by_key` leads
    // with the key, so a key's best free lane (and whether it has any lane) is one probe.
    // The two partial indexes over live statuses say so with `=` and `OR`: SQLite evaluates an
    // `IN` list in an index's condition through a temporary table it builds on every write of
    // the row (four per update: a quarter of the cost of storing a dispatch). Queries that use
    // them repeat the condition word for word (and name the index, so a query SQLite could not
    // run on it fails instead of scanning).
    r#"
DROP INDEX dispatches_live_dedupe;
CREATE UNIQUE INDEX dispatches_live_dedupe ON dispatches (thread, dedupe_key)
    WHERE dedupe_key IS NOT NULL AND (status = 'queued' OR status = 'claimed' OR status = 'waiting');
DROP INDEX dispatches_live;
CREATE INDEX dispatches_live ON dispatches (status, thread)
    WHERE (status = 'queued' OR status = 'claimed' OR status = 'waiting');
CREATE INDEX key_turns_order ON key_turns (agent, turn, key);
INSERT OR IGNORE INTO key_turns (agent, key, turn)
    SELECT DISTINCT agent, ckey, 0 FROM lanes WHERE ckey <> '';
DROP INDEX lanes_by_key;
CREATE INDEX lanes_by_key ON lanes (agent, ckey, busy, priority, served, created);
"#,
    // Version 7: the slots of a concurrency key's scope are its running dispatches, read from
    // their records through this index (only keyed claims enter it), so a keyed claim writes
    // no slot row; the rows earlier versions wrote for key scopes go.
    r#"
CREATE INDEX dispatches_claimed_keys ON dispatches (agent, concurrency_key, lease_until)
    WHERE status = 'claimed' AND concurrency_key IS NOT NULL;
DELETE FROM limit_slots WHERE scope LIKE 'key:%';
"#,
    // Version 8: schedules (docs/contract.md section 16), one JSON record each, written under a
    // compare-and-set of its revision.
    r#"
CREATE TABLE schedules (
    name     TEXT PRIMARY KEY,
    record   TEXT NOT NULL,
    revision INTEGER NOT NULL
) WITHOUT ROWID;
"#,
    // Version 9: where the thread log stood when a dispatch was first claimed (docs/contract.md
    // section 9.6: what a `rollback` message masks); NULL until its first claim.
    r#"
ALTER TABLE dispatches ADD COLUMN log_from INTEGER;
"#,
    // Version 10: debounce windows (docs/contract.md section 2.2): the window as JSON, and its
    // key while it is open, which this index finds and keeps to one per (thread, key).
    r#"
ALTER TABLE dispatches ADD COLUMN window TEXT;
ALTER TABLE dispatches ADD COLUMN window_key TEXT;
CREATE UNIQUE INDEX dispatches_open_window ON dispatches (thread, window_key)
    WHERE window_key IS NOT NULL;
-- The turn policy that took effect when a message met a busy thread (docs/contract.md 9.6).
ALTER TABLE messages ADD COLUMN applied TEXT;
"#,
    // Version 11: the tokens a dispatch's metered model calls used (docs/contract.md, section
    // 2), as JSON; NULL until a settling write carries some.
    r#"
ALTER TABLE dispatches ADD COLUMN usage TEXT;
"#,
];

/// Options of the embedded backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EmbeddedOptions {
    /// `synchronous = FULL`: fsync every commit (survives power loss, slower).
    pub fsync_every_commit: bool,
}

/// The SQLite-backed mailbox and thread log. Cheap to clone; clones share one writer thread.
#[derive(Debug, Clone)]
pub struct EmbeddedStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// The queue of the writer thread, which owns the write connection (group commit).
    writer: writer::Writer,
    /// Connections for reads (file stores): WAL readers never wait for the writer. Reads run
    /// on tokio's blocking threads, never on the async workers, so a long read (a page of a
    /// list, a burst of them) holds up no other task. An in-memory store has none; its reads
    /// queue on the writer.
    readers: Vec<Mutex<Connection>>,
    /// Where the next read that finds every reader busy waits.
    next_reader: AtomicUsize,
    clock: SharedClock,
    signal: Arc<Notify>,
    /// Who waits for which thread to change ([`crate::store::Inbox::watch`]).
    watches: Watches,
    location: String,
}

/// How many read connections a file store keeps: reads on different connections run side by
/// side (WAL readers do not wait for each other or for the writer).
const READERS: usize = 4;

impl Inner {
    /// Runs `op` in a read transaction on a free reader (or waits for one): only ever on a
    /// blocking thread.
    fn read_now<T>(&self, op: impl FnOnce(&Connection) -> StoreResult<T>) -> StoreResult<T> {
        // A poisoned lock means a panic while holding it; the connection itself is still
        // consistent (SQLite rolled back the open transaction), so keep using it.
        let free = self.readers.iter().find_map(|r| match r.try_lock() {
            Ok(conn) => Some(conn),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        });
        let mut conn = match free {
            Some(conn) => conn,
            None => {
                let at = self.next_reader.fetch_add(1, Ordering::Relaxed) % READERS;
                let Some(reader) = self.readers.get(at).or(self.readers.first()) else {
                    return Err(StoreError::Unavailable(format!(
                        "{}: the store has no read connection",
                        self.location
                    )));
                };
                reader
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
            }
        };
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Deferred)
            .map_err(|e| sql_error(&self.location, e))?;
        let value = op(&tx)?;
        tx.commit().map_err(|e| sql_error(&self.location, e))?;
        Ok(value)
    }
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

impl EmbeddedStore {
    /// Opens (creating if needed) the store in the file at `path`.
    ///
    /// # Errors
    ///
    /// `Unavailable` when the file cannot be opened or migrated; `Corrupt` naming the file when
    /// it is not a Homing store or was written by a newer schema version.
    pub fn open(path: &Path, clock: SharedClock) -> StoreResult<Self> {
        Self::open_with(path, clock, EmbeddedOptions::default())
    }

    /// Opens the store at `path` with explicit options.
    ///
    /// # Errors
    ///
    /// As [`EmbeddedStore::open`].
    pub fn open_with(
        path: &Path,
        clock: SharedClock,
        options: EmbeddedOptions,
    ) -> StoreResult<Self> {
        if let Some(parent) = path.parent()
            && !parent.as_os_str().is_empty()
            && !parent.exists()
        {
            std::fs::create_dir_all(parent).map_err(|e| {
                StoreError::Unavailable(format!(
                    "cannot create directory {}: {e}",
                    parent.display()
                ))
            })?;
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI;
        let location = path.display().to_string();
        let open = || {
            Connection::open_with_flags(path, flags).map_err(|e| {
                StoreError::Unavailable(format!("cannot open {}: {e}", path.display()))
            })
        };
        // Two processes opening a new file at once (a host starting, a CLI command beside it)
        // can meet in SQLite's lock escalation while the first sets WAL mode and migrates,
        // where SQLite answers "locked" at once instead of waiting (its deadlock rule, which
        // bypasses the busy timeout). That is transient: try again, up to the busy timeout.
        let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
        let conn = loop {
            let mut conn = open()?;
            match Self::prepare_writer(&mut conn, &location, options) {
                Ok(()) => break conn,
                Err(StoreError::Contention(_)) if std::time::Instant::now() < deadline => {
                    drop(conn);
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        };
        let mut readers = Vec::with_capacity(READERS);
        for _ in 0..READERS {
            let reader = open()?;
            Self::configure(&reader, &location, true, options)?;
            readers.push(reader);
        }
        let store = Self::from_connections(conn, readers, clock, location)?;
        start_checkpointer(path, Arc::downgrade(&store.inner))?;
        inbox::start_change_poller(path, Arc::downgrade(&store.inner))?;
        Ok(store)
    }

    /// A private in-memory store (tests, benchmarks). Clones share it; nothing survives a drop.
    ///
    /// # Errors
    ///
    /// `Unavailable` when SQLite cannot allocate the database.
    pub fn open_in_memory(clock: SharedClock) -> StoreResult<Self> {
        let mut conn = Connection::open_in_memory()
            .map_err(|e| StoreError::Unavailable(format!("cannot open in-memory store: {e}")))?;
        let location = ":memory:".to_owned();
        Self::configure(&conn, &location, false, EmbeddedOptions::default())?;
        migrate(&mut conn, &location)?;
        Self::from_connections(conn, Vec::new(), clock, location)
    }

    /// Configures the write connection of a file store and brings its schema up to date.
    fn prepare_writer(
        conn: &mut Connection,
        location: &str,
        options: EmbeddedOptions,
    ) -> StoreResult<()> {
        Self::configure(conn, location, true, options)?;
        // Checkpoints (copying the WAL back into the database, with an fsync) run on a
        // thread of their own, so no operation pays for one on its write path.
        conn.pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(|e| sql_error(location, e))?;
        migrate(conn, location)
    }

    fn configure(
        conn: &Connection,
        location: &str,
        file: bool,
        options: EmbeddedOptions,
    ) -> StoreResult<()> {
        let fail = |e: rusqlite::Error| {
            StoreError::Unavailable(format!("cannot configure {location}: {e}"))
        };
        conn.busy_timeout(BUSY_TIMEOUT).map_err(fail)?;
        if file {
            let mode: String = conn
                .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
                .map_err(|e| not_a_store(location, e))?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(StoreError::Unavailable(format!(
                    "{location}: SQLite refused WAL mode (journal mode is {mode})"
                )));
            }
        }
        let sync = if options.fsync_every_commit {
            "FULL"
        } else {
            "NORMAL"
        };
        // `temp_store = MEMORY`: each operation of a group commit runs in a savepoint, whose
        // journal of the pages it changes spilled to a temporary file past 64 KiB; a profile
        // of the end-to-end run found those writes at 6% of the writer thread's time.
        conn.execute_batch(&format!(
            "PRAGMA synchronous = {sync}; PRAGMA foreign_keys = OFF; PRAGMA temp_store = MEMORY;"
        ))
        .map_err(fail)?;
        conn.set_prepared_statement_cache_capacity(128);
        // The bundled SQLite is built with STAT4, which re-prepares a statement whenever a bound
        // value might change its plan: on the hot paths that was a quarter of all CPU time. The
        // plans here are fixed by design (INDEXED BY on the hot queries), so ask for stability.
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
            true,
        )
        .map_err(fail)?;
        Ok(())
    }

    fn from_connections(
        conn: Connection,
        readers: Vec<Connection>,
        clock: SharedClock,
        location: String,
    ) -> StoreResult<Self> {
        let writer = writer::Writer::start(conn, clock.clone(), location.clone())?;
        Ok(EmbeddedStore {
            inner: Arc::new(Inner {
                writer,
                readers: readers.into_iter().map(Mutex::new).collect(),
                next_reader: AtomicUsize::new(0),
                clock,
                signal: Arc::new(Notify::new()),
                watches: Watches::default(),
                location,
            }),
        })
    }

    /// This store as the host holds it.
    pub fn store(&self) -> Store {
        Store {
            mailbox: Arc::new(self.clone()),
            log: Arc::new(self.clone()),
            inbox: Arc::new(self.clone()),
            waitpoints: Arc::new(self.clone()),
            journal: Arc::new(self.clone()),
            deltas: Arc::new(self.clone()),
            limits: Arc::new(self.clone()),
            schedules: Arc::new(self.clone()),
            clock: self.inner.clock.clone(),
        }
    }

    /// Where the data lives (a file path, or `:memory:`).
    pub fn location(&self) -> &str {
        &self.inner.location
    }

    /// Runs `op` as one atomic operation on the writer thread (batched with concurrent ones,
    /// see [`writer`]). `Err(Commit(e))` keeps the changes made so far and returns `e` (a holder
    /// write that found a stale epoch supersedes the dispatch and still fails).
    async fn write<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Connection, u64) -> Result<T, TxError> + Send + 'static,
    ) -> StoreResult<T> {
        let reply = self.inner.writer.submit(op)?;
        reply
            .await
            .map_err(|_| StoreError::Unavailable("the store's writer thread has stopped".into()))?
    }

    /// Stores terminal records as they are, bypassing the mailbox's rules: how `homing bench`
    /// makes a store that retains many records quickly. Queued work must go through
    /// `enqueue` (it also needs its lane); anything else is refused.
    pub(crate) async fn retain_for_bench(&self, records: Vec<Dispatch>) -> StoreResult<()> {
        if let Some(d) = records.iter().find(|d| !d.status.is_terminal()) {
            return Err(StoreError::Invalid(format!(
                "dispatch {} is {}; only terminal records are retained directly",
                d.id, d.status
            )));
        }
        self.write(move |tx, _| {
            for d in &records {
                rows::insert(tx, d, false).map_err(TxError::Abort)?;
                rows::store(tx, d, false, None).map_err(TxError::Abort)?;
            }
            Ok(())
        })
        .await
    }

    /// Runs a read on a consistent snapshot, on a blocking thread (see [`Inner::readers`]).
    async fn read<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        if self.inner.readers.is_empty() {
            return self
                .write(move |conn, _| op(conn).map_err(TxError::Abort))
                .await;
        }
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || inner.read_now(op))
            .await
            .map_err(|_| StoreError::Unavailable("a store read stopped before it ended".into()))?
    }

    fn signal(&self) {
        self.inner.signal.notify_waiters();
    }
}

/// A connection of its own to the file at `path` for a background thread (the checkpointer,
/// the change poller), and the file's name for messages.
fn side_connection(path: &Path) -> StoreResult<(Connection, String)> {
    let location = path.display().to_string();
    let conn = Connection::open(path)
        .map_err(|e| StoreError::Unavailable(format!("cannot open {location}: {e}")))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| sql_error(&location, e))?;
    Ok((conn, location))
}

/// How often the background checkpointer copies the WAL into the database file.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(250);

/// Runs passive WAL checkpoints on a connection of its own until the store is dropped. A
/// passive checkpoint never blocks writers; it copies what no reader still needs.
fn start_checkpointer(path: &Path, store: std::sync::Weak<Inner>) -> StoreResult<()> {
    let (conn, location) = side_connection(path)?;
    std::thread::Builder::new()
        .name("homing-checkpoint".into())
        .spawn(move || {
            loop {
                std::thread::sleep(CHECKPOINT_INTERVAL);
                if store.strong_count() == 0 {
                    break;
                }
                if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                    tracing::warn!(store = %location, "WAL checkpoint failed: {e}");
                }
            }
            // A last full pass so a cleanly closed store leaves a small WAL.
            let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
        })
        .map_err(|e| StoreError::Unavailable(format!("cannot start the checkpoint thread: {e}")))?;
    Ok(())
}

/// How a write transaction ends when it fails.
#[derive(Debug)]
enum TxError {
    /// Roll back and return the error.
    Abort(StoreError),
    /// Commit what was written, then return the error.
    Commit(StoreError),
}

impl From<StoreError> for TxError {
    fn from(err: StoreError) -> Self {
        TxError::Abort(err)
    }
}

impl From<rusqlite::Error> for TxError {
    fn from(err: rusqlite::Error) -> Self {
        TxError::Abort(sql_error("embedded store", err))
    }
}

/// Maps a SQLite failure onto the closed error enum.
fn sql_error(location: &str, err: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode;
    match err.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            StoreError::Contention(format!("{location}: {err}"))
        }
        // A value or row over SQLite's limits: retrying cannot help.
        Some(ErrorCode::TooBig) => StoreError::Invalid(format!(
            "{location}: the record is too large for the embedded store: {err}"
        )),
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => StoreError::Corrupt {
            key: location.to_owned(),
            reason: err.to_string(),
        },
        _ => StoreError::Unavailable(format!("{location}: {err}")),
    }
}

fn not_a_store(location: &str, err: rusqlite::Error) -> StoreError {
    match err.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => StoreError::Corrupt {
            key: location.to_owned(),
            reason: "not a SQLite database (is this a Homing store file?)".to_owned(),
        },
        _ => sql_error(location, err),
    }
}

fn migrate(conn: &mut Connection, location: &str) -> StoreResult<()> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| not_a_store(location, e))?;
    let version: i64 = tx
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(|e| not_a_store(location, e))?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::Corrupt {
            key: location.to_owned(),
            reason: format!(
                "written by store schema version {version}, newer than the {SCHEMA_VERSION} this homing understands; \
                 upgrade homing to open it"
            ),
        });
    }
    if version == 0 {
        // A fresh file has no tables; anything else at version 0 is not ours.
        let tables: i64 = tx
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
                [],
                |row| row.get(0),
            )
            .map_err(|e| not_a_store(location, e))?;
        if tables > 0 {
            return Err(StoreError::Corrupt {
                key: location.to_owned(),
                reason: "a SQLite database that is not a Homing store (it has tables but no Homing schema version)"
                    .to_owned(),
            });
        }
    }
    let start = usize::try_from(version).unwrap_or(0);
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(start) {
        tx.execute_batch(sql).map_err(|e| sql_error(location, e))?;
        tx.pragma_update(None, "user_version", index + 1)
            .map_err(|e| sql_error(location, e))?;
    }
    tx.commit().map_err(|e| sql_error(location, e))
}

/// Where `homing` keeps the store by default, relative to the config file's directory.
pub fn default_path(config_dir: &Path) -> PathBuf {
    config_dir.join("homing.db")
}
