//! The store: a durable mailbox of dispatches and a per-thread sequence store (the thread log).
//!
//! # The model
//!
//! A *dispatch* is one unit of agent work, routed to an agent (a plugin) and a *thread* (the
//! serialization key, typically one conversation). Producers [`Mailbox::enqueue`] dispatches;
//! workers [`Mailbox::claim`] the best available one for their agent and become its *holder*:
//! they get a claim token and a lease. The holder records the start and result of its run and
//! settles the dispatch (ack, nack for a retry, dead-letter). The host renews leases while a
//! guest runs; its maintenance reclaims leases that ran out (a dead host's work) and purges
//! terminal records after their retention.
//!
//! Each thread has an *epoch*. [`Mailbox::interrupt`] bumps it, supersedes the thread's queued
//! work and reports the claimed dispatch so the host can stop its guest. Every holder write
//! carries the claim token and is checked against the dispatch's epoch, atomically with the
//! write: a zombie holder (lease lost, thread interrupted) cannot change anything.
//!
//! The [`SequenceStore`] keeps, per thread, an append-only log of opaque entries with
//! sequence numbers and the watermarks `reserved >= latest >= trimmed`. Appends a guest makes
//! go through its claim: they carry a [`Fence`] and are refused once the claim is lost or the
//! thread's epoch moved on, so the log of a conversation only ever holds writes of its live
//! holder.
//!
//! # The guarantees
//!
//! The contract (docs/contract.md, section 3) states them; every backend honours it and the
//! conformance suite (`host/tests/conformance/`) asserts it against each backend:
//!
//! 1. An enqueue that returned success ends in exactly one terminal state or is still live.
//! 2. At most one live claim per thread at any instant; at most one holder per dispatch.
//! 3. Writes with a stale token or epoch are refused and change nothing; a reclaim racing an
//!    ack never overwrites the ack.
//! 4. Within a thread claims follow priority then age; across threads, work is shared fairly.
//! 5. Nothing is claimed before `available_at`; expired leases and lost wake-ups are repaired
//!    within one sweep interval.
//! 6. Attempts never decrease; reaching `max_attempts` dead-letters.
//! 7. After `interrupt(thread)` returns, no older-epoch dispatch starts, acks or appends.
//! 8. Two concurrent enqueues with one (thread, dedupe key) admit one.
//! 9. A restart loses nothing acknowledged to a caller.
//!
//! Where the contract leaves room, Homing decides (and the suite pins it):
//!
//! - A claim is exclusive per thread *and* at most one dispatch of a thread is ever in the
//!   `claimed` state: a thread whose holder's lease ran out stays blocked until maintenance
//!   reclaims it (within one sweep interval) or `claim_dispatch` takes it over, which reclaims
//!   the expired holder in the same atomic step.
//! - Fairness across threads: the queue serves, among threads whose best available dispatch
//!   has the same priority, the thread served least recently; so a thread with a deep backlog
//!   delays a lone dispatch on another thread by at most one claim per competing thread.
//! - Holder operations are idempotent per token: repeating the operation that settled a
//!   dispatch, with the same token, returns the record unchanged (a retry after a lost reply).
//! - A holder whose lease has run out may still settle or record (ack, nack, record-result)
//!   until someone reclaims the dispatch: until then no one else can hold it, because the
//!   thread stays blocked. Thread-log appends are stricter: a fenced append needs a live lease
//!   (`lease_until >= now`), because the log is shared by every later holder of the thread.
//!   Nor can it extend the lease: from the moment it ran out, its concurrency key's slot may
//!   be another claim's (docs/contract.md, section 15.2).
//! - Time comes from the store's [`Clock`]; only maintenance takes an explicit `now`.
//! - Every backend has a size limit of its own ([`Mailbox::max_value`],
//!   [`SequenceStore::max_entry`]): a payload, an output or a log entry above it is refused with
//!   `Invalid` naming the field and the limit, never with `Unavailable` (retrying cannot help). A
//!   record that was accepted never outgrows its backend: error texts are kept up to
//!   [`MAX_ERROR_TEXT`] bytes, and room for an output of up to `max_value` bytes is kept when
//!   a dispatch is enqueued.
//!
//! # Backends
//!
//! - [`embedded`]: SQLite in one file (WAL mode) for one machine, or in memory for tests.
//! - [`nats`]: NATS JetStream for many hosts.
//!
//! Both decide the same way because neither decides on its own: who may write a claimed
//! dispatch, whether a fence holds, how a queued record is taken and an expired one given back,
//! and what a settlement or a supersede makes of a record are the pure functions of `rules`;
//! a backend reads what they need and stores what they return.

pub mod clock;
pub mod deltas;
pub mod embedded;
pub mod error;
pub mod inbox;
pub mod journal;
pub mod limits;
pub mod model;
pub mod nats;
pub(crate) mod rules;
pub mod schedules;
pub mod versions;
pub mod waitpoints;

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Notify;

pub use clock::{Clock, ManualClock, ServerClock, SharedClock, SystemClock, millis};
pub use deltas::{Cursor, DeltaBatch, DeltaRead, Deltas, LiveBus};
pub use error::{StoreError, StoreResult};
pub use inbox::{
    Inbox, InboxMarks, Message, MessageFilter, MessageKind, MessageNote, MessageState, NewMessage,
    OnBusy, Sent, ThreadWatch,
};
pub use journal::{CallEntry, CallKind, Journal, JournalData, NewStep, Step};
pub use limits::{ClaimRequest, Gated, LimitSet, Limits, Pause, Rate};
pub use model::{
    Claim, DEFAULT_MAX_ATTEMPTS, DEFAULT_PRIORITY, Dispatch, DispatchRow, Fence, Interrupt,
    ListCursor, ListFilter, LogEntry, LogRange, NewDispatch, RowResult, RunResult, RunStatus,
    Status, StatusCount, TurnEvent, TurnMark, Watermarks, unmasked,
};
pub use rules::{HolderOp, MAX_ERROR_TEXT};
pub use versions::{Choice, Offer, OfferedVersion, VersionRun};
pub use waitpoints::{
    Created, NewWaitpoint, Settlement, Waitpoint, WaitpointFilter, WaitpointState, Waitpoints,
};

/// The `last_error` recorded when a lease runs out on a dispatch's last attempt.
pub const REASON_LEASE_EXPIRED_AT_MAX: &str = "lease expired; max attempts reached";
/// The `last_error` recorded when a holder write finds its dispatch's epoch stale.
pub const REASON_STALE_EPOCH: &str = "superseded: its thread was interrupted (newer epoch)";
/// The `last_error` recorded when a lease of an interrupted thread's dispatch runs out.
pub const REASON_EXPIRED_AFTER_INTERRUPT: &str =
    "superseded: lease expired after its thread was interrupted";

/// The durable mailbox of dispatches (the contract, docs/contract.md, sections 1 to 3).
///
/// Every method is atomic with respect to every other call on any instance of the same
/// backend. None panics on any input or stored state.
#[async_trait]
pub trait Mailbox: Send + Sync + Debug + 'static {
    /// Stores a new queued dispatch, stamped with its thread's current epoch.
    ///
    /// # Errors
    ///
    /// `Invalid` for a submission that breaks a rule; `Duplicate` when the id is stored with
    /// different content or the dedupe key is held by a live dispatch. Re-submitting the same
    /// content under the same id returns the stored record.
    async fn enqueue(&self, new: NewDispatch) -> StoreResult<Dispatch>;

    /// Claims the best available queued dispatch of `agent` on a thread with no live claim.
    /// `None` when nothing is available.
    async fn claim(
        &self,
        agent: &str,
        consumer: &str,
        lease_ms: u64,
    ) -> StoreResult<Option<Dispatch>>;

    /// `claim` and `record_start` in one step: what a host does right before it runs a guest.
    /// Backends override it to save a round trip.
    async fn claim_started(
        &self,
        agent: &str,
        consumer: &str,
        lease_ms: u64,
    ) -> StoreResult<Option<Dispatch>> {
        let Some(claimed) = self.claim(agent, consumer, lease_ms).await? else {
            return Ok(None);
        };
        let token = claimed.token().unwrap_or_default().to_owned();
        self.record_start(&claimed.id, &token).await.map(Some)
    }

    /// Claims the best available dispatch of `req.agent` that every limit in `req.limits` and
    /// every pause admits, taking its tokens and slots in the same atomic step (the contract,
    /// section 13). Dispatches held back stay queued and count no attempt.
    async fn claim_gated(&self, req: &ClaimRequest<'_>) -> StoreResult<Gated>;

    /// Claims one dispatch by id, ignoring `available_at`. `None` when it is not queued or its
    /// thread is held by a live claim.
    async fn claim_dispatch(
        &self,
        id: &str,
        consumer: &str,
        lease_ms: u64,
    ) -> StoreResult<Option<Dispatch>>;

    /// The one write of a claim's holder: `op` applied to dispatch `id` while `token` names
    /// its live claim (the contract, T5 to T9, T17 and T19). Every holder operation of both
    /// backends goes through here; the methods below are shorthands for it.
    ///
    /// # Errors
    ///
    /// `NotFound`, `NotClaimed` or `LostClaim` when the claim is gone (an extension also
    /// once its lease has run out), `StaleEpoch` when the thread moved on (which supersedes
    /// the dispatch), `Invalid` for an output past [`Mailbox::max_value`]. A settlement
    /// repeated by the holder that made it returns the stored record.
    async fn hold(&self, id: &str, token: &str, op: HolderOp) -> StoreResult<Dispatch>;

    /// [`Mailbox::hold`], then `claim_gated(next)`: what a worker does between two runs. The
    /// two are independent (a refused write still claims, a failed claim leaves the write in
    /// place); backends override it to do both in one step.
    async fn hold_and_claim(
        &self,
        id: &str,
        token: &str,
        op: HolderOp,
        next: &ClaimRequest<'_>,
    ) -> (StoreResult<Dispatch>, StoreResult<Gated>) {
        let done = self.hold(id, token, op).await;
        (done, self.claim_gated(next).await)
    }

    /// Moves the lease to `now + extension_ms`. `Ok(false)` when the claim is gone (wrong token,
    /// not claimed, missing, lease run out, stale epoch, which also supersedes the dispatch).
    async fn extend_lease(&self, id: &str, token: &str, extension_ms: u64) -> StoreResult<bool> {
        rules::lease_extended(self.hold(id, token, HolderOp::extend(extension_ms)).await)
    }

    /// Records that the holder started its run.
    async fn record_start(&self, id: &str, token: &str) -> StoreResult<Dispatch> {
        self.hold(id, token, HolderOp::Start).await
    }

    /// Records what the run produced; the dispatch stays claimed.
    async fn record_result(
        &self,
        id: &str,
        token: &str,
        result: RunResult,
    ) -> StoreResult<Dispatch> {
        self.hold(id, token, HolderOp::Result(result)).await
    }

    /// Settles the dispatch as delivered (keeps the recorded result).
    async fn ack(&self, id: &str, token: &str) -> StoreResult<Dispatch> {
        self.hold(id, token, HolderOp::Ack).await
    }

    /// Gives the dispatch back for a retry at `retry_at` (one more failed attempt), or
    /// dead-letters it when that was the last attempt.
    async fn nack(
        &self,
        id: &str,
        token: &str,
        retry_at: u64,
        error: &str,
    ) -> StoreResult<Dispatch> {
        let error = error.to_owned();
        self.hold(id, token, HolderOp::Nack { retry_at, error })
            .await
    }

    /// Gives up on the dispatch.
    async fn dead_letter(&self, id: &str, token: &str, error: &str) -> StoreResult<Dispatch> {
        let error = error.to_owned();
        self.hold(id, token, HolderOp::DeadLetter { error }).await
    }

    /// `record_result` and `ack` in one step.
    async fn complete(&self, id: &str, token: &str, result: RunResult) -> StoreResult<Dispatch> {
        self.hold(id, token, HolderOp::Complete(result)).await
    }

    /// T19: gives a claimed dispatch back to the queue at `available_at` without counting an
    /// attempt (a run parked on a rate limit upstream, or released on an upgrade), recording
    /// `reason` as its `last_error`.
    async fn release(
        &self,
        id: &str,
        token: &str,
        available_at: u64,
        reason: &str,
    ) -> StoreResult<Dispatch> {
        let reason = reason.to_owned();
        self.hold(
            id,
            token,
            HolderOp::Release {
                available_at,
                reason,
            },
        )
        .await
    }

    /// T17: the holder suspends its claimed dispatch: `waiting` when it has a pending
    /// waitpoint, `queued` at once (a resume) when one of its waitpoints left `pending`
    /// since the run started. A settling holder operation (the repeat rule applies).
    ///
    /// # Errors
    ///
    /// `Limit` past `max_resumes`; `Invalid` when it has no pending waitpoint and none left
    /// `pending` during this run; the holder refusals.
    async fn suspend(&self, id: &str, token: &str, max_resumes: u32) -> StoreResult<Dispatch> {
        self.hold(id, token, HolderOp::Suspend { max_resumes })
            .await
    }

    /// `complete`, then `claim_gated(next)`, as [`Mailbox::hold_and_claim`].
    async fn complete_and_claim(
        &self,
        id: &str,
        token: &str,
        result: RunResult,
        next: &ClaimRequest<'_>,
    ) -> (StoreResult<Dispatch>, StoreResult<Gated>) {
        self.hold_and_claim(id, token, HolderOp::Complete(result), next)
            .await
    }

    /// Cancels a queued or waiting dispatch (a waiting one frees its thread; its pending
    /// waitpoints are cancelled). `None` when it is missing or neither.
    async fn cancel(&self, id: &str) -> StoreResult<Option<Dispatch>>;

    /// Bumps the thread's epoch, supersedes its queued and waiting dispatches with `reason`
    /// (cancelling the waiting one's waitpoints), and reports the claimed one (still claimed; its next holder write is fenced).
    async fn interrupt(&self, thread: &str, reason: &str) -> StoreResult<Interrupt>;

    /// Supersedes a claimed dispatch: by its holder (`token` given and matching) or by the control
    /// plane (`token` `None`). `None` when it is missing or not claimed.
    async fn supersede_claimed(
        &self,
        id: &str,
        token: Option<&str>,
        reason: &str,
    ) -> StoreResult<Option<Dispatch>>;

    /// Reclaims up to `limit` claims whose lease ended strictly before `now`: one more failed
    /// attempt, then queued (available at once) or dead-lettered. Stale-epoch ones are superseded
    /// and not returned.
    async fn reclaim_expired(&self, now: u64, limit: usize) -> StoreResult<Vec<Dispatch>>;

    /// Deletes terminal dispatches completed before `older_than`. Returns how many.
    async fn purge_terminal(&self, older_than: u64) -> StoreResult<usize>;

    /// Whether settled records expire by themselves after the host's retention (NATS with a
    /// per-message TTL): the sweeper then leaves `purge_terminal` alone.
    fn expires_settled(&self) -> bool {
        false
    }

    /// The current record, if stored.
    async fn load(&self, id: &str) -> StoreResult<Option<Dispatch>>;

    /// Dispatches matching `filter`, ordered by priority, then `created_at`, then id.
    async fn list(&self, filter: &ListFilter) -> StoreResult<Vec<Dispatch>>;

    /// [`Mailbox::list`] as rows: the same dispatches in the same order, without their
    /// payloads and outputs (given by size). What every list a reader asks for (the API's,
    /// the dashboard's) reads: a backend reads no payload or output for it where it can, and
    /// holds no more than a page of rows.
    async fn list_rows(&self, filter: &ListFilter) -> StoreResult<Vec<DispatchRow>>;

    /// How many dispatches each agent has in each status (zero rows omitted).
    async fn counts(&self) -> StoreResult<Vec<StatusCount>>;

    /// [`Mailbox::counts`] of the live statuses only (queued, claimed, waiting), at a cost bounded
    /// by live work rather than by what the store retains: what the sweeper reads for the
    /// queue gauges on every sweep.
    async fn live_counts(&self) -> StoreResult<Vec<StatusCount>>;

    /// Terminal dispatches, oldest completion first.
    async fn list_terminal(&self, limit: usize, offset: usize) -> StoreResult<Vec<Dispatch>>;

    /// The thread's current epoch (0 for a thread never interrupted).
    async fn thread_epoch(&self, thread: &str) -> StoreResult<u64>;

    /// Threads with at least one queued dispatch, sorted.
    async fn queued_threads(&self) -> StoreResult<Vec<String>>;

    /// Whether any dispatch is queued, claimed or waiting (for `homing run --until-idle`).
    async fn has_live_work(&self) -> StoreResult<bool>;

    /// A signal fired when work may have become claimable (enqueue, settle, reclaim). Workers
    /// wait on it between claims; it is a hint, never the only way work is found.
    fn work_signal(&self) -> Arc<Notify>;

    /// Releases what this instance holds on a shared server (NATS: its watcher's consumer)
    /// before the process goes away; the instance must not be used afterwards. Nothing to do
    /// for a backend that holds nothing there.
    async fn close(&self) {}

    /// The largest payload, and the largest run output, a dispatch of this backend may carry
    /// (bytes; one record holds both). `enqueue`, `record_result` and `complete` refuse larger
    /// ones with `Invalid` naming the field and this limit.
    fn max_value(&self) -> u64;

    /// How many times this instance had to restart its feed of the server's changes (NATS: the
    /// watcher's consumer); `None` for a backend that has no such feed. Telemetry reports it.
    fn feed_restarts(&self) -> Option<u64> {
        None
    }
}

/// The per-thread sequence store (the contract, docs/contract.md, section 4).
#[async_trait]
pub trait SequenceStore: Send + Sync + Debug + 'static {
    /// Appends `entry` and returns its sequence. With a fence, refused atomically when the claim
    /// is no longer live (`LostClaim`, `NotClaimed`) or the thread moved on (`StaleEpoch`).
    async fn append(&self, thread: &str, entry: &[u8], fence: Option<&Fence>) -> StoreResult<u64>;

    /// Appends only if the visible watermark equals `expected_latest`, else `Conflict { latest }`.
    async fn append_expected(
        &self,
        thread: &str,
        entry: &[u8],
        expected_latest: u64,
        fence: Option<&Fence>,
    ) -> StoreResult<u64>;

    /// Up to `limit` visible entries with sequence greater than `after`, ascending.
    async fn read(&self, thread: &str, after: u64, limit: usize) -> StoreResult<Vec<LogEntry>> {
        self.read_within(thread, after, limit, usize::MAX).await
    }

    /// As [`read`](Self::read), ending after the entry that brings the data read to
    /// `max_bytes` or more: a reader holds at most its budget and one entry, however large the
    /// entries (one is read whenever there is one).
    async fn read_within(
        &self,
        thread: &str,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> StoreResult<Vec<LogEntry>>;

    /// The visible watermark (0 for an empty thread).
    async fn latest(&self, thread: &str) -> StoreResult<u64>;

    /// All three watermarks.
    async fn watermarks(&self, thread: &str) -> StoreResult<Watermarks>;

    /// Drops entries at or below `up_to` (clamped to `latest`); never moves a watermark back.
    async fn trim(&self, thread: &str, up_to: u64) -> StoreResult<()>;

    /// Drops every entry; the watermarks stay as a tombstone so sequences are never reused.
    async fn delete(&self, thread: &str) -> StoreResult<()>;

    /// The largest entry an append takes (bytes); larger ones are refused with `Invalid` naming
    /// this limit.
    fn max_entry(&self) -> u64;
}

/// The size checks of every value a backend stores are the rules'.
pub(crate) use rules::check_size;

/// A backend's parts (the mailbox, the thread logs and the features' records) and the clock they
/// read, as the host holds them.
#[derive(Debug, Clone)]
pub struct Store {
    /// The mailbox of dispatches.
    pub mailbox: Arc<dyn Mailbox>,
    /// The thread logs.
    pub log: Arc<dyn SequenceStore>,
    /// The threads' inboxes.
    pub inbox: Arc<dyn Inbox>,
    /// The dispatches' waitpoints.
    pub waitpoints: Arc<dyn Waitpoints>,
    /// The dispatches' journals.
    pub journal: Arc<dyn Journal>,
    /// The dispatches' streamed deltas.
    pub deltas: Arc<dyn Deltas>,
    /// Pauses, and the slots and buckets of outbound requests.
    pub limits: Arc<dyn Limits>,
    /// The schedules' records.
    pub schedules: Arc<dyn schedules::Schedules>,
    /// The clock both read.
    pub clock: SharedClock,
}

impl Store {
    /// The current time of the store's clock.
    pub fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Releases what this store holds on a shared server ([`Mailbox::close`]); call it once,
    /// when the process is done with the store.
    pub async fn close(&self) {
        self.mailbox.close().await;
    }

    /// The store time `after` from now (saturating).
    pub fn after(&self, after: std::time::Duration) -> u64 {
        self.now().saturating_add(millis(after))
    }

    /// The largest value this store holds in every place a guest can put bytes: a payload, an
    /// output, a log entry (the least of [`Mailbox::max_value`] and
    /// [`SequenceStore::max_entry`]).
    pub fn max_value(&self) -> u64 {
        self.mailbox.max_value().min(self.log.max_entry())
    }
}
