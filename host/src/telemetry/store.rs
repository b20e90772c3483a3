//! A store whose every operation is timed into `homing_store_operation_seconds` by backend and
//! operation, and whose failures are counted by error kind. It wraps all seven of the store's
//! traits (the mailbox, the log, the inbox, the waitpoints, the journal, the deltas and the
//! limits) and forwards each call unchanged, provided methods included (the backends' own
//! `claim_started` and `call_summary`). Under an attempt's span, each operation is a
//! `homing.store` span too.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use metrics::{counter, histogram};
use tokio::sync::Notify;
use tracing::Instrument;

use super::{STORE_ERRORS, STORE_OPERATION};
use crate::store::journal::{CallSummary, JournalAsk, JournalPage};
use crate::store::limits::Usage;
use crate::store::schedules::{Schedule, Schedules, Stored as StoredSchedule};
use crate::store::waitpoints::WaitpointPage;
use crate::store::{
    CallEntry, Created, Cursor, DeltaBatch, DeltaRead, Deltas, Dispatch, DispatchRow, Fence,
    HolderOp, Inbox, InboxMarks, Interrupt, Journal, JournalData, Limits, ListFilter, LiveBus,
    LogEntry, Mailbox, Message, MessageFilter, NewDispatch, NewMessage, NewStep, NewWaitpoint,
    Pause, Rate, Sent, SequenceStore, Settlement, StatusCount, Store, StoreError, StoreResult,
    ThreadWatch, Waitpoint, WaitpointFilter, Waitpoints, Watermarks,
};

/// `store` with every operation timed under `backend` (`embedded`, `nats`).
pub fn instrument(store: Store, backend: &'static str) -> Store {
    Store {
        mailbox: Arc::new(TimedMailbox {
            inner: store.mailbox,
            backend,
        }),
        log: Arc::new(TimedLog {
            inner: store.log,
            backend,
        }),
        inbox: Arc::new(TimedInbox {
            inner: store.inbox,
            backend,
        }),
        waitpoints: Arc::new(TimedWaitpoints {
            inner: store.waitpoints,
            backend,
        }),
        journal: Arc::new(TimedJournal {
            inner: store.journal,
            backend,
        }),
        deltas: Arc::new(TimedDeltas {
            inner: store.deltas,
            backend,
        }),
        limits: Arc::new(TimedLimits {
            inner: store.limits,
            backend,
        }),
        schedules: Arc::new(TimedSchedules {
            inner: store.schedules,
            backend,
        }),
        clock: store.clock,
    }
}

fn kind(e: &StoreError) -> &'static str {
    match e {
        StoreError::NotFound { .. } => "not_found",
        StoreError::NotClaimed { .. } => "not_claimed",
        StoreError::LostClaim { .. } => "lost_claim",
        StoreError::StaleEpoch { .. } => "stale_epoch",
        StoreError::Duplicate { .. } => "duplicate",
        StoreError::Invalid(_) => "invalid",
        StoreError::Conflict { .. } => "conflict",
        StoreError::Busy { .. } => "busy",
        StoreError::Limit(_) => "limit",
        StoreError::Contention(_) => "contention",
        StoreError::Unavailable(_) => "unavailable",
        StoreError::Corrupt { .. } => "corrupt",
    }
}

async fn timed<T>(
    backend: &'static str,
    operation: &'static str,
    call: impl Future<Output = StoreResult<T>>,
) -> StoreResult<T> {
    let started = Instant::now();
    // A child span only under an attempt's span: the sweeper's and the API's reads would
    // otherwise each start a trace of their own. With traces off, not even the lookup.
    let out = if !super::trace::enabled() || tracing::Span::current().is_none() {
        call.await
    } else {
        let span = tracing::info_span!(
            target: super::trace::TARGET,
            "homing.store",
            homing.backend = backend,
            homing.operation = operation,
        );
        call.instrument(span).await
    };
    histogram!(STORE_OPERATION, "backend" => backend, "operation" => operation)
        .record(started.elapsed().as_secs_f64());
    count_error(backend, operation, &out);
    out
}

fn count_error<T>(backend: &'static str, operation: &'static str, out: &StoreResult<T>) {
    if let Err(e) = out {
        counter!(STORE_ERRORS, "backend" => backend, "operation" => operation, "error" => kind(e))
            .increment(1);
    }
}

#[derive(Debug)]
struct TimedMailbox {
    inner: Arc<dyn Mailbox>,
    backend: &'static str,
}

#[async_trait]
impl Mailbox for TimedMailbox {
    async fn enqueue(&self, new: NewDispatch) -> StoreResult<Dispatch> {
        timed(self.backend, "enqueue", self.inner.enqueue(new)).await
    }
    async fn claim(
        &self,
        agent: &str,
        consumer: &str,
        lease_ms: u64,
    ) -> StoreResult<Option<Dispatch>> {
        timed(
            self.backend,
            "claim",
            self.inner.claim(agent, consumer, lease_ms),
        )
        .await
    }
    async fn claim_started(
        &self,
        agent: &str,
        consumer: &str,
        lease_ms: u64,
    ) -> StoreResult<Option<Dispatch>> {
        timed(
            self.backend,
            "claim_started",
            self.inner.claim_started(agent, consumer, lease_ms),
        )
        .await
    }
    async fn claim_dispatch(
        &self,
        id: &str,
        consumer: &str,
        lease_ms: u64,
    ) -> StoreResult<Option<Dispatch>> {
        timed(
            self.backend,
            "claim_dispatch",
            self.inner.claim_dispatch(id, consumer, lease_ms),
        )
        .await
    }
    async fn hold(&self, id: &str, token: &str, op: HolderOp) -> StoreResult<Dispatch> {
        timed(self.backend, op.name(), self.inner.hold(id, token, op)).await
    }
    async fn claim_gated(
        &self,
        req: &crate::store::ClaimRequest<'_>,
    ) -> StoreResult<crate::store::Gated> {
        timed(self.backend, "claim_gated", self.inner.claim_gated(req)).await
    }
    async fn hold_and_claim(
        &self,
        id: &str,
        token: &str,
        op: HolderOp,
        next: &crate::store::ClaimRequest<'_>,
    ) -> (StoreResult<Dispatch>, StoreResult<crate::store::Gated>) {
        let (name, both) = match op.unmetered() {
            HolderOp::Complete(_) => ("complete_and_claim", op.name()),
            _ => ("hold_and_claim", op.name()),
        };
        let call = async { Ok(self.inner.hold_and_claim(id, token, op, next).await) };
        match timed(self.backend, name, call).await {
            Ok((done, next)) => {
                count_error(self.backend, both, &done);
                count_error(self.backend, "claim_gated", &next);
                (done, next)
            }
            // `call` never fails: the two results are inside it.
            Err(e) => (Err(e.clone()), Err(e)),
        }
    }
    async fn cancel(&self, id: &str) -> StoreResult<Option<Dispatch>> {
        timed(self.backend, "cancel", self.inner.cancel(id)).await
    }
    async fn interrupt(&self, thread: &str, reason: &str) -> StoreResult<Interrupt> {
        timed(
            self.backend,
            "interrupt",
            self.inner.interrupt(thread, reason),
        )
        .await
    }
    async fn supersede_claimed(
        &self,
        id: &str,
        token: Option<&str>,
        reason: &str,
    ) -> StoreResult<Option<Dispatch>> {
        timed(
            self.backend,
            "supersede_claimed",
            self.inner.supersede_claimed(id, token, reason),
        )
        .await
    }
    async fn reclaim_expired(&self, now: u64, limit: usize) -> StoreResult<Vec<Dispatch>> {
        timed(
            self.backend,
            "reclaim_expired",
            self.inner.reclaim_expired(now, limit),
        )
        .await
    }
    async fn purge_terminal(&self, older_than: u64) -> StoreResult<usize> {
        timed(
            self.backend,
            "purge_terminal",
            self.inner.purge_terminal(older_than),
        )
        .await
    }
    async fn load(&self, id: &str) -> StoreResult<Option<Dispatch>> {
        timed(self.backend, "load", self.inner.load(id)).await
    }
    async fn list(&self, filter: &ListFilter) -> StoreResult<Vec<Dispatch>> {
        timed(self.backend, "list", self.inner.list(filter)).await
    }
    async fn list_rows(&self, filter: &ListFilter) -> StoreResult<Vec<DispatchRow>> {
        timed(self.backend, "list_rows", self.inner.list_rows(filter)).await
    }
    async fn counts(&self) -> StoreResult<Vec<StatusCount>> {
        timed(self.backend, "counts", self.inner.counts()).await
    }

    async fn live_counts(&self) -> StoreResult<Vec<StatusCount>> {
        timed(self.backend, "live_counts", self.inner.live_counts()).await
    }
    async fn list_terminal(&self, limit: usize, offset: usize) -> StoreResult<Vec<Dispatch>> {
        timed(
            self.backend,
            "list_terminal",
            self.inner.list_terminal(limit, offset),
        )
        .await
    }
    async fn thread_epoch(&self, thread: &str) -> StoreResult<u64> {
        timed(
            self.backend,
            "thread_epoch",
            self.inner.thread_epoch(thread),
        )
        .await
    }
    async fn queued_threads(&self) -> StoreResult<Vec<String>> {
        timed(self.backend, "queued_threads", self.inner.queued_threads()).await
    }
    async fn has_live_work(&self) -> StoreResult<bool> {
        timed(self.backend, "has_live_work", self.inner.has_live_work()).await
    }
    fn work_signal(&self) -> Arc<Notify> {
        self.inner.work_signal()
    }
    async fn close(&self) {
        self.inner.close().await;
    }
    fn max_value(&self) -> u64 {
        self.inner.max_value()
    }
    fn feed_restarts(&self) -> Option<u64> {
        self.inner.feed_restarts()
    }
    fn expires_settled(&self) -> bool {
        self.inner.expires_settled()
    }
}

#[derive(Debug)]
struct TimedLog {
    inner: Arc<dyn SequenceStore>,
    backend: &'static str,
}

#[async_trait]
impl SequenceStore for TimedLog {
    async fn append(&self, thread: &str, entry: &[u8], fence: Option<&Fence>) -> StoreResult<u64> {
        timed(
            self.backend,
            "append",
            self.inner.append(thread, entry, fence),
        )
        .await
    }
    async fn append_expected(
        &self,
        thread: &str,
        entry: &[u8],
        expected_latest: u64,
        fence: Option<&Fence>,
    ) -> StoreResult<u64> {
        timed(
            self.backend,
            "append_expected",
            self.inner
                .append_expected(thread, entry, expected_latest, fence),
        )
        .await
    }
    async fn read_within(
        &self,
        thread: &str,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> StoreResult<Vec<LogEntry>> {
        timed(
            self.backend,
            "read",
            self.inner.read_within(thread, after, limit, max_bytes),
        )
        .await
    }
    async fn latest(&self, thread: &str) -> StoreResult<u64> {
        timed(self.backend, "latest", self.inner.latest(thread)).await
    }
    async fn watermarks(&self, thread: &str) -> StoreResult<Watermarks> {
        timed(self.backend, "watermarks", self.inner.watermarks(thread)).await
    }
    async fn trim(&self, thread: &str, up_to: u64) -> StoreResult<()> {
        timed(self.backend, "trim", self.inner.trim(thread, up_to)).await
    }
    async fn delete(&self, thread: &str) -> StoreResult<()> {
        timed(self.backend, "delete", self.inner.delete(thread)).await
    }
    fn max_entry(&self) -> u64 {
        self.inner.max_entry()
    }
}

#[derive(Debug)]
struct TimedInbox {
    inner: Arc<dyn Inbox>,
    backend: &'static str,
}

#[async_trait]
impl Inbox for TimedInbox {
    async fn send(&self, thread: &str, new: NewMessage, max_pending: u64) -> StoreResult<Sent> {
        timed(
            self.backend,
            "send",
            self.inner.send(thread, new, max_pending),
        )
        .await
    }
    async fn ack_message(&self, thread: &str, seq: u64, fence: &Fence) -> StoreResult<u64> {
        timed(
            self.backend,
            "ack_message",
            self.inner.ack_message(thread, seq, fence),
        )
        .await
    }
    async fn discard_messages(&self, thread: &str, through: u64) -> StoreResult<usize> {
        timed(
            self.backend,
            "discard_messages",
            self.inner.discard_messages(thread, through),
        )
        .await
    }
    async fn message(&self, thread: &str, seq: u64) -> StoreResult<Option<Message>> {
        timed(self.backend, "message", self.inner.message(thread, seq)).await
    }
    async fn messages(&self, thread: &str, filter: &MessageFilter) -> StoreResult<Vec<Message>> {
        timed(
            self.backend,
            "messages",
            self.inner.messages(thread, filter),
        )
        .await
    }
    async fn inbox(&self, thread: &str) -> StoreResult<InboxMarks> {
        timed(self.backend, "inbox", self.inner.inbox(thread)).await
    }
    async fn purge_messages(&self, older_than: u64) -> StoreResult<usize> {
        timed(
            self.backend,
            "purge_messages",
            self.inner.purge_messages(older_than),
        )
        .await
    }
    async fn pending_total(&self) -> StoreResult<u64> {
        timed(self.backend, "pending_total", self.inner.pending_total()).await
    }
    fn watch(&self, thread: &str) -> ThreadWatch {
        self.inner.watch(thread)
    }
    fn max_message(&self) -> u64 {
        self.inner.max_message()
    }
}

#[derive(Debug)]
struct TimedWaitpoints {
    inner: Arc<dyn Waitpoints>,
    backend: &'static str,
}

#[async_trait]
impl Waitpoints for TimedWaitpoints {
    async fn create_waitpoint(&self, fence: &Fence, new: NewWaitpoint) -> StoreResult<Created> {
        timed(
            self.backend,
            "create_waitpoint",
            self.inner.create_waitpoint(fence, new),
        )
        .await
    }
    async fn add_token(&self, fence: &Fence, id: &str, digest: &str) -> StoreResult<bool> {
        timed(
            self.backend,
            "add_token",
            self.inner.add_token(fence, id, digest),
        )
        .await
    }
    async fn complete_waitpoint(
        &self,
        id: &str,
        result: Vec<u8>,
        settled_by: &str,
    ) -> StoreResult<Settlement> {
        timed(
            self.backend,
            "complete_waitpoint",
            self.inner.complete_waitpoint(id, result, settled_by),
        )
        .await
    }
    async fn cancel_waitpoint(&self, id: &str, settled_by: &str) -> StoreResult<Settlement> {
        timed(
            self.backend,
            "cancel_waitpoint",
            self.inner.cancel_waitpoint(id, settled_by),
        )
        .await
    }
    async fn time_out_waitpoints(&self, now: u64, limit: usize) -> StoreResult<Vec<Waitpoint>> {
        timed(
            self.backend,
            "time_out_waitpoints",
            self.inner.time_out_waitpoints(now, limit),
        )
        .await
    }
    async fn waitpoint(&self, id: &str) -> StoreResult<Option<Waitpoint>> {
        timed(self.backend, "waitpoint", self.inner.waitpoint(id)).await
    }
    async fn waitpoints_of(&self, dispatch: &str) -> StoreResult<Vec<Waitpoint>> {
        timed(
            self.backend,
            "waitpoints_of",
            self.inner.waitpoints_of(dispatch),
        )
        .await
    }
    async fn list_waitpoints(&self, filter: &WaitpointFilter) -> StoreResult<Vec<Waitpoint>> {
        timed(
            self.backend,
            "list_waitpoints",
            self.inner.list_waitpoints(filter),
        )
        .await
    }
    async fn read_waitpoints(
        &self,
        filter: &WaitpointFilter,
        max_bytes: usize,
        results: bool,
    ) -> StoreResult<WaitpointPage> {
        timed(
            self.backend,
            "read_waitpoints",
            self.inner.read_waitpoints(filter, max_bytes, results),
        )
        .await
    }
    fn max_result(&self) -> u64 {
        self.inner.max_result()
    }
}

#[derive(Debug)]
struct TimedJournal {
    inner: Arc<dyn Journal>,
    backend: &'static str,
}

#[async_trait]
impl Journal for TimedJournal {
    async fn load_journal(&self, dispatch: &str) -> StoreResult<JournalData> {
        timed(
            self.backend,
            "load_journal",
            self.inner.load_journal(dispatch),
        )
        .await
    }
    async fn journal_page(&self, dispatch: &str, ask: &JournalAsk) -> StoreResult<JournalPage> {
        timed(
            self.backend,
            "journal_page",
            self.inner.journal_page(dispatch, ask),
        )
        .await
    }
    async fn call_summary(&self, dispatch: &str, pos: u32) -> StoreResult<Option<CallSummary>> {
        timed(
            self.backend,
            "call_summary",
            self.inner.call_summary(dispatch, pos),
        )
        .await
    }
    async fn call_entry(&self, dispatch: &str, pos: u32) -> StoreResult<Option<CallEntry>> {
        timed(
            self.backend,
            "call_entry",
            self.inner.call_entry(dispatch, pos),
        )
        .await
    }
    async fn record(&self, fence: &Fence, entry: CallEntry) -> StoreResult<()> {
        timed(self.backend, "record", self.inner.record(fence, entry)).await
    }
    async fn record_append(
        &self,
        fence: &Fence,
        entry: CallEntry,
        data: &[u8],
        expected: Option<u64>,
    ) -> StoreResult<u64> {
        timed(
            self.backend,
            "record_append",
            self.inner.record_append(fence, entry, data, expected),
        )
        .await
    }
    async fn drop_calls(&self, fence: &Fence, from: u32) -> StoreResult<()> {
        timed(
            self.backend,
            "drop_calls",
            self.inner.drop_calls(fence, from),
        )
        .await
    }
    async fn put_step(&self, fence: &Fence, step: NewStep) -> StoreResult<()> {
        timed(self.backend, "put_step", self.inner.put_step(fence, step)).await
    }
    fn max_body(&self) -> u64 {
        self.inner.max_body()
    }
}

#[derive(Debug)]
struct TimedDeltas {
    inner: Arc<dyn Deltas>,
    backend: &'static str,
}

#[async_trait]
impl Deltas for TimedDeltas {
    async fn persist(&self, batch: DeltaBatch) -> StoreResult<()> {
        timed(self.backend, "persist", self.inner.persist(batch)).await
    }
    async fn read_deltas(&self, dispatch: &str, after: Cursor) -> StoreResult<DeltaRead> {
        timed(
            self.backend,
            "read_deltas",
            self.inner.read_deltas(dispatch, after),
        )
        .await
    }
    // The live bus is not the store: its batches are never stored, and it is handed on as is.
    fn live_bus(&self) -> Option<Arc<dyn LiveBus>> {
        self.inner.live_bus()
    }
}

#[derive(Debug)]
struct TimedLimits {
    inner: Arc<dyn Limits>,
    backend: &'static str,
}

#[async_trait]
impl Limits for TimedLimits {
    async fn take_token(&self, scope: &str, rate: &Rate) -> StoreResult<Option<u64>> {
        timed(
            self.backend,
            "take_token",
            self.inner.take_token(scope, rate),
        )
        .await
    }
    async fn acquire_slot(
        &self,
        scope: &str,
        cap: u32,
        holder: &str,
        until: u64,
    ) -> StoreResult<bool> {
        timed(
            self.backend,
            "acquire_slot",
            self.inner.acquire_slot(scope, cap, holder, until),
        )
        .await
    }
    async fn release_slot(&self, scope: &str, holder: &str) -> StoreResult<()> {
        timed(
            self.backend,
            "release_slot",
            self.inner.release_slot(scope, holder),
        )
        .await
    }
    async fn pause(&self, agent: &str, key: Option<&str>, reason: &str) -> StoreResult<Pause> {
        timed(self.backend, "pause", self.inner.pause(agent, key, reason)).await
    }
    async fn resume(&self, agent: &str, key: Option<&str>) -> StoreResult<bool> {
        timed(self.backend, "resume", self.inner.resume(agent, key)).await
    }
    async fn pauses(&self) -> StoreResult<Vec<Pause>> {
        timed(self.backend, "pauses", self.inner.pauses()).await
    }
    async fn usage(&self, scope: &str, rate: Option<&Rate>) -> StoreResult<Usage> {
        timed(self.backend, "usage", self.inner.usage(scope, rate)).await
    }
}

#[derive(Debug)]
struct TimedSchedules {
    inner: Arc<dyn Schedules>,
    backend: &'static str,
}

#[async_trait]
impl Schedules for TimedSchedules {
    async fn schedule(&self, name: &str) -> StoreResult<Option<StoredSchedule>> {
        timed(self.backend, "schedule", self.inner.schedule(name)).await
    }
    async fn schedules(
        &self,
        after: Option<&str>,
        limit: usize,
        max_bytes: Option<usize>,
    ) -> StoreResult<Vec<StoredSchedule>> {
        timed(
            self.backend,
            "schedules",
            self.inner.schedules(after, limit, max_bytes),
        )
        .await
    }
    async fn put_schedule(&self, schedule: &Schedule, expect: u64) -> StoreResult<u64> {
        timed(
            self.backend,
            "put_schedule",
            self.inner.put_schedule(schedule, expect),
        )
        .await
    }
    async fn delete_schedule(&self, name: &str, expect: Option<u64>) -> StoreResult<bool> {
        timed(
            self.backend,
            "delete_schedule",
            self.inner.delete_schedule(name, expect),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::store::ManualClock;
    use crate::store::embedded::EmbeddedStore;

    /// One operation of each of the inbox, the waitpoints, the journal, the deltas and the
    /// limits lands in `homing_store_operation_seconds`, under its backend and its name.
    #[tokio::test]
    async fn every_trait_of_the_store_is_timed() {
        let recorder = crate::telemetry::builder().unwrap().build_recorder();
        let handle = recorder.handle();
        let _local = metrics::set_default_local_recorder(&recorder);
        let store = EmbeddedStore::open_in_memory(ManualClock::new(1_000)).unwrap();
        let store = instrument(store.store(), "embedded");
        store.inbox.pending_total().await.unwrap();
        store.waitpoints.waitpoints_of("d").await.unwrap();
        store.journal.load_journal("d").await.unwrap();
        store
            .deltas
            .read_deltas("d", Cursor::default())
            .await
            .unwrap();
        store.limits.pauses().await.unwrap();
        let scrape = handle.render();
        for operation in [
            "pending_total",
            "waitpoints_of",
            "load_journal",
            "read_deltas",
            "pauses",
        ] {
            let label = format!("operation=\"{operation}\"");
            assert!(
                scrape.lines().any(|line| {
                    line.starts_with(&format!("{STORE_OPERATION}_count{{"))
                        && line.contains("backend=\"embedded\"")
                        && line.contains(&label)
                        && line.ends_with(" 1")
                }),
                "{operation} not timed:\n{scrape}"
            );
        }
    }
}
