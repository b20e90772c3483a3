//! Settlement: the writes that end a claim, and when a failed attempt is retried.
//!
//! A claim is settled once, by the guest through its imports or, for what the guest left
//! unsettled, by the supervisor. Both go through the methods here, so the store sees the same
//! writes whoever settles, and a successful settlement is recorded on the handle (later
//! writes through it are refused) and stops the lease guard. A refused settlement changes
//! nothing on the handle: the store's error says why (a lost claim, an interrupted thread).
//!
//! A nack is turned into a retry time here, with [`retry_at`]: the plugin's backoff for the
//! attempt, never sooner than the guest asked.

use std::time::Duration;

use tracing::Instrument;

use super::{ClaimHandle, Claimer, Park};
use crate::config::RetryPolicy;
use crate::store::{Dispatch, Gated, HolderOp, RunResult, Store, StoreError};

/// How a claim was settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// ack or complete.
    Acked,
    /// nack (requeued or dead-lettered by the store).
    Nacked,
    /// dead-letter.
    DeadLettered,
    /// superseded: its thread was interrupted while it ran.
    Superseded,
    /// suspended to wait on its waitpoints (waiting, or queued again at once).
    Suspended,
    /// parked: an upstream status (`park_on`) gave it back to the queue without an attempt.
    Parked,
    /// drained: it outlived `drain_timeout` on a replaced version and went back to the queue
    /// without an attempt.
    Drained,
}

impl Settlement {
    /// Its name, as logs and spans give it.
    pub fn as_str(self) -> &'static str {
        match self {
            Settlement::Acked => "acked",
            Settlement::Nacked => "nacked",
            Settlement::DeadLettered => "dead-lettered",
            Settlement::Superseded => "superseded",
            Settlement::Suspended => "suspended",
            Settlement::Parked => "parked",
            Settlement::Drained => "drained",
        }
    }
}

/// The store time at which a failed attempt number `attempt` is retried: now plus the
/// backoff `retry` gives it, at least `asked` (the guest's hint) but never beyond the policy's
/// maximum.
pub fn retry_at(store: &Store, retry: &RetryPolicy, attempt: u32, asked: Option<Duration>) -> u64 {
    store.after(retry.delay(attempt, asked))
}

impl ClaimHandle {
    /// Completes the dispatch: records `output` as its result and acks it.
    ///
    /// # Errors
    ///
    /// When the store refuses the write (the claim is no longer held) or fails.
    pub async fn complete(
        &mut self,
        store: &Store,
        output: Vec<u8>,
    ) -> Result<Dispatch, StoreError> {
        self.end_stream().await;
        let out = store
            .mailbox
            .hold(
                &self.dispatch.id,
                &self.token,
                self.metered(HolderOp::Complete(RunResult::success(output))),
            )
            .instrument(self.span.clone())
            .await;
        self.settled_by(Settlement::Acked, out)
    }

    /// [`complete`](Self::complete), and the worker's next claim in the same store step (one
    /// write on the embedded store instead of two). The claim's result is returned whatever
    /// became of the completion; it is not counted as throttled here (a worker claims again
    /// when it got nothing, and that claim is).
    pub async fn complete_and_claim(
        &mut self,
        store: &Store,
        output: Vec<u8>,
        next: &Claimer<'_>,
    ) -> (Result<Dispatch, StoreError>, Result<Gated, StoreError>) {
        self.end_stream().await;
        let (done, gated) = store
            .mailbox
            .hold_and_claim(
                &self.dispatch.id,
                &self.token,
                self.metered(HolderOp::Complete(RunResult::success(output))),
                &next.request(),
            )
            .instrument(self.span.clone())
            .await;
        (self.settled_by(Settlement::Acked, done), gated)
    }

    /// Acks the dispatch (its result, if any, was recorded before).
    ///
    /// # Errors
    ///
    /// When the store refuses the write or fails.
    pub async fn ack(&mut self, store: &Store) -> Result<Dispatch, StoreError> {
        self.end_stream().await;
        let out = store
            .mailbox
            .hold(&self.dispatch.id, &self.token, self.metered(HolderOp::Ack))
            .instrument(self.span.clone())
            .await;
        self.settled_by(Settlement::Acked, out)
    }

    /// Fails the attempt with `error`: the store requeues the dispatch at [`retry_at`], or
    /// dead-letters it when this was its last attempt.
    ///
    /// # Errors
    ///
    /// When the store refuses the write or fails.
    pub async fn nack(
        &mut self,
        store: &Store,
        retry: &RetryPolicy,
        error: &str,
        asked: Option<Duration>,
    ) -> Result<Dispatch, StoreError> {
        if let Some(park) = self.control.parked() {
            return self.park(store, park).await;
        }
        let at = retry_at(store, retry, self.dispatch.attempt, asked);
        self.end_stream().await;
        let out = store
            .mailbox
            .hold(
                &self.dispatch.id,
                &self.token,
                self.metered(HolderOp::Nack {
                    retry_at: at,
                    error: error.to_owned(),
                }),
            )
            .instrument(self.span.clone())
            .await;
        self.settled_by(Settlement::Nacked, out)
    }

    /// Dead-letters the dispatch with `error`, whatever attempts it has left.
    ///
    /// # Errors
    ///
    /// When the store refuses the write or fails.
    pub async fn dead_letter(
        &mut self,
        store: &Store,
        error: &str,
    ) -> Result<Dispatch, StoreError> {
        if let Some(park) = self.control.parked() {
            return self.park(store, park).await;
        }
        self.end_stream().await;
        let out = store
            .mailbox
            .hold(
                &self.dispatch.id,
                &self.token,
                self.metered(HolderOp::DeadLetter {
                    error: error.to_owned(),
                }),
            )
            .instrument(self.span.clone())
            .await;
        self.settled_by(Settlement::DeadLettered, out)
    }

    /// Records the start of the run (T6), through this claim.
    ///
    /// # Errors
    ///
    /// When the store refuses the write or fails.
    pub async fn record_start(&self, store: &Store) -> Result<Dispatch, StoreError> {
        store
            .mailbox
            .record_start(&self.dispatch.id, &self.token)
            .instrument(self.span.clone())
            .await
    }

    /// Records what the run produced (T7), through this claim; it stays claimed.
    ///
    /// # Errors
    ///
    /// When the store refuses the write or fails.
    pub async fn record_result(
        &self,
        store: &Store,
        result: RunResult,
    ) -> Result<Dispatch, StoreError> {
        store
            .mailbox
            .record_result(&self.dispatch.id, &self.token, result)
            .instrument(self.span.clone())
            .await
    }

    /// Supersedes the dispatch, whose thread was interrupted while it ran, with `reason`
    /// (`None`: it had already ended).
    ///
    /// # Errors
    ///
    /// When the store refuses the write or fails.
    pub async fn supersede(
        &mut self,
        store: &Store,
        reason: &str,
    ) -> Result<Option<Dispatch>, StoreError> {
        self.end_stream().await;
        let out = store
            .mailbox
            .supersede_claimed(&self.dispatch.id, Some(&self.token), reason)
            .instrument(self.span.clone())
            .await;
        self.settled_by(Settlement::Superseded, out)
    }

    /// Suspends the dispatch to wait on its waitpoints (T17): the store makes it `waiting`,
    /// or queues it again at once when one of them left `pending` during this run. Either way
    /// the claim ends here: no lease, no instance, no worker is kept for it.
    ///
    /// # Errors
    ///
    /// `Limit` past `max_resumes`, `Invalid` with nothing to wait on, or a holder refusal.
    pub async fn suspend(
        &mut self,
        store: &Store,
        max_resumes: u32,
    ) -> Result<Dispatch, StoreError> {
        self.end_stream().await;
        let out = store
            .mailbox
            .hold(
                &self.dispatch.id,
                &self.token,
                self.metered(HolderOp::Suspend { max_resumes }),
            )
            .instrument(self.span.clone())
            .await;
        self.settled_by(Settlement::Suspended, out)
    }

    /// Gives the dispatch back to the queue until `park.until` without counting an attempt
    /// (T19): what a failure becomes once an upstream status parked the run.
    ///
    /// # Errors
    ///
    /// When the store refuses the write or fails.
    pub async fn park(&mut self, store: &Store, park: Park) -> Result<Dispatch, StoreError> {
        self.end_stream().await;
        let reason = format!(
            "parked: an upstream answered {}; runs again in {} ms without counting an attempt",
            park.status,
            park.until.saturating_sub(store.now())
        );
        let out = store
            .mailbox
            .hold(
                &self.dispatch.id,
                &self.token,
                self.metered(HolderOp::Release {
                    available_at: park.until,
                    reason,
                }),
            )
            .instrument(self.span.clone())
            .await;
        if out.is_ok() {
            crate::telemetry::run_parked(&self.dispatch.agent, park.status);
        }
        self.settled_by(Settlement::Parked, out)
    }

    /// Gives the dispatch back to the queue, available at once and counting no attempt: its run
    /// outlived `drain_timeout` on a version a reload replaced. The next claim runs it on the
    /// version it is pinned to while a host keeps that version, else on the newest.
    ///
    /// # Errors
    ///
    /// When the store refuses the write or fails.
    pub async fn drain(&mut self, store: &Store) -> Result<Dispatch, StoreError> {
        self.end_stream().await;
        let reason = "drained: the run outlived drain_timeout on a replaced version; \
                      runs again without counting an attempt";
        let out = store
            .mailbox
            .hold(
                &self.dispatch.id,
                &self.token,
                self.metered(HolderOp::Release {
                    available_at: store.now(),
                    reason: reason.to_owned(),
                }),
            )
            .instrument(self.span.clone())
            .await;
        self.settled_by(Settlement::Drained, out)
    }

    /// `op` carrying the tokens this claim's run metered, so the settling write adds them to
    /// the record's `usage` (no write of its own).
    fn metered(&self, op: HolderOp) -> HolderOp {
        op.metered(self.usage_now())
    }

    /// Ends what this claim streamed, its last deltas persisted, before the claim settles: a
    /// watcher that sees the settlement finds every delta in the store.
    async fn end_stream(&self) {
        if let Some(live) = &self.live {
            live.finish().await;
        }
    }

    /// Records a successful settlement (on the handle and its span) and stops renewing the
    /// lease.
    fn settled_by<T>(
        &mut self,
        how: Settlement,
        out: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if out.is_ok() {
            self.settled = Some(how);
            self.stop_renewing();
            let failed = matches!(how, Settlement::Nacked | Settlement::DeadLettered);
            crate::telemetry::trace::record_outcome(&self.span, how.as_str(), failed);
            let usage = self.usage_now();
            if usage.calls > 0 {
                crate::telemetry::trace::record_usage(&self.span, &usage);
                tracing::info!(
                    agent = %self.dispatch.agent,
                    dispatch = %self.dispatch.id,
                    attempt = self.dispatch.attempt,
                    model_calls = usage.calls,
                    input_tokens = usage.input_tokens,
                    output_tokens = usage.output_tokens,
                    cached_tokens = usage.cached_tokens,
                    "model usage of the attempt"
                );
            }
        }
        out
    }
}
