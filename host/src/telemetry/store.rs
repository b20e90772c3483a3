//! A store whose every operation is timed into `homing_store_operation_seconds` by backend and
//! operation, and whose failures are counted by error kind. It wraps the store's two halves and
//! forwards each call unchanged (including the backends' own `claim_started`). Under an
//! attempt's span, each operation is a `homing.store` span too.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use metrics::{counter, histogram};
use tokio::sync::Notify;
use tracing::Instrument;

use super::{STORE_ERRORS, STORE_OPERATION};
use crate::store::{
    Dispatch, DispatchRow, Fence, HolderOp, Interrupt, ListFilter, LogEntry, Mailbox, NewDispatch,
    SequenceStore, StatusCount, Store, StoreError, StoreResult, Watermarks,
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
        // The inbox is not on any hot path; its operations are counted where they are used.
        inbox: store.inbox,
        waitpoints: store.waitpoints,
        journal: store.journal,
        deltas: store.deltas,
        limits: store.limits,
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
        let (name, both) = match &op {
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
