//! The claim layer: a claimed dispatch as the host holds it while a guest works on it.
//!
//! A claim is taken from the store with [`claim_for`] (or its two halves, [`claim_next`] and
//! [`hold`]) and held as a [`ClaimHandle`]: the dispatch as claimed, its token (which never
//! crosses into a guest), how it was settled, the [`ClaimControl`] through which the host asks
//! its guest to stop, and the [`LeaseGuard`] that renews its lease until the claim is settled
//! or dropped. Settling ([`ClaimHandle::complete`], [`ClaimHandle::nack`] and the rest) goes
//! through the handle whoever does it, the guest or the supervisor, and a nack's retry time is
//! computed in one place, [`retry_at`].
//!
//! This layer sits on the store and the config: it knows nothing of wasm, the WIT or workers.
//! What it needs of a plugin (store, agent name, consumer, lease, backoff) it is given as a
//! [`Claimer`].

mod control;
pub mod journal;
mod lease;
mod settle;

use std::sync::Arc;
use std::time::Duration;

use crate::config::RetryPolicy;
use crate::store::inbox::FOLLOW_UP_BY;
use crate::store::{
    ClaimRequest, Dispatch, Fence, Gated, LimitSet, Offer, Store, StoreError, millis,
};
pub use control::{ClaimControl, Park, StopReason};
pub use journal::{JournalSettings, Recorder, Turn};
pub use lease::{INTERRUPT_POLL, LeaseGuard};
pub use settle::{Settlement, retry_at};

/// Who claims, and on what terms: what the claim layer needs of a plugin.
#[derive(Debug, Clone, Copy)]
pub struct Claimer<'a> {
    /// The store claims come from.
    pub store: &'a Store,
    /// The agent whose dispatches are claimed.
    pub agent: &'a str,
    /// `claimed_by` of the claims.
    pub consumer: &'a str,
    /// Lease length of the claims.
    pub lease: Duration,
    /// The backoff of a failed attempt.
    pub retry: &'a RetryPolicy,
    /// The limits its claims honour.
    pub limits: &'a LimitSet,
    /// What its claims journal.
    pub journal: JournalSettings,
    /// The versions its claims may run (recorded on each claim; pinned dispatches of versions
    /// not offered are passed over).
    pub offer: Option<&'a Offer>,
}

/// A claimed dispatch as the host holds it (as a guest's `claim` resource, or in a worker).
#[derive(Debug)]
pub struct ClaimHandle {
    /// The dispatch as claimed.
    dispatch: Dispatch,
    /// Its claim token.
    token: String,
    /// Set once it is settled.
    settled: Option<Settlement>,
    /// Stop requests for this claim.
    control: Arc<ClaimControl>,
    /// Follow-ups enqueued through this claim.
    enqueued: u32,
    /// The highest inbox sequence handed to the guest through this claim (`next-message`).
    handed: u64,
    /// The waitpoints this claim handed a completion token for (one per waitpoint and claim).
    tokens: Vec<String>,
    /// Keeps the lease alive until dropped.
    lease: Option<LeaseGuard>,
    /// The attempt's `homing.dispatch` span: open while the claim is held.
    span: tracing::Span,
    /// The journal of this claim's run (`None` with `journal = "off"`).
    journal: Option<Arc<Recorder>>,
    /// Set once a `step-put` that stored nothing (`journal = "off"`) was logged.
    warned_steps: bool,
    /// What this claim streamed (`emit`), once it streamed something.
    live: Option<crate::live::LiveClaim>,
    /// The tokens of the model calls its run made, as the host metered them.
    usage: Arc<std::sync::Mutex<crate::store::model::Usage>>,
}

impl ClaimHandle {
    /// A claim of `dispatch` held without a lease guard, a span or a stop request of its own:
    /// what a benchmark runs a guest on.
    pub fn unguarded(dispatch: Dispatch, journal: Option<Arc<Recorder>>) -> ClaimHandle {
        ClaimHandle {
            token: dispatch.token().unwrap_or_default().to_owned(),
            dispatch,
            settled: None,
            control: Arc::default(),
            enqueued: 0,
            handed: 0,
            tokens: Vec::new(),
            lease: None,
            span: tracing::Span::none(),
            journal,
            warned_steps: false,
            live: None,
            usage: Arc::default(),
        }
    }

    /// The dispatch as claimed.
    pub fn dispatch(&self) -> &Dispatch {
        &self.dispatch
    }

    /// Its claim token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// How it was settled, once it is.
    pub fn settled(&self) -> Option<Settlement> {
        self.settled
    }

    /// Its stop requests.
    pub fn control(&self) -> &Arc<ClaimControl> {
        &self.control
    }

    /// The attempt's `homing.dispatch` span.
    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// Where its run's metered model calls add their tokens.
    pub fn usage(&self) -> &Arc<std::sync::Mutex<crate::store::model::Usage>> {
        &self.usage
    }

    /// The tokens its run's metered model calls used so far.
    pub fn usage_now(&self) -> crate::store::model::Usage {
        self.usage.lock().map(|u| *u).unwrap_or_default()
    }

    /// The journal of its run (`None` with `journal = "off"`).
    pub fn journal(&self) -> Option<&Arc<Recorder>> {
        self.journal.as_ref()
    }

    /// How many follow-ups were enqueued through it.
    pub fn enqueued(&self) -> u32 {
        self.enqueued
    }

    /// Counts one more follow-up enqueued through it.
    pub fn count_enqueued(&mut self) {
        self.enqueued = self.enqueued.saturating_add(1);
    }

    /// The highest inbox sequence handed to its guest (`next-message`).
    pub fn handed(&self) -> u64 {
        self.handed
    }

    /// Notes that the inbox was handed through `seq` (never moves back).
    pub fn hand_through(&mut self, seq: u64) {
        self.handed = self.handed.max(seq);
    }

    /// The waitpoints it handed a completion token for.
    pub fn tokens(&self) -> &[String] {
        &self.tokens
    }

    /// Notes that it handed a completion token for waitpoint `id`.
    pub fn gave_token(&mut self, id: String) {
        self.tokens.push(id);
    }

    /// True the first time only: whether to log that a `step-put` stored nothing.
    pub fn warn_steps_once(&mut self) -> bool {
        !std::mem::replace(&mut self.warned_steps, true)
    }

    /// What it streamed, opened with `open` the first time.
    pub fn live_or(
        &mut self,
        open: impl FnOnce(&Dispatch) -> crate::live::LiveClaim,
    ) -> &mut crate::live::LiveClaim {
        let dispatch = &self.dispatch;
        self.live.get_or_insert_with(|| open(dispatch))
    }

    /// The fence of this claim's thread-log writes.
    pub fn fence(&self) -> Fence {
        Fence {
            dispatch: self.dispatch.id.clone(),
            token: self.token.clone(),
            epoch: self.dispatch.epoch,
        }
    }

    /// Stops renewing the lease: from here on the claim is settled promptly or not at all.
    pub fn stop_renewing(&mut self) {
        self.lease = None;
    }
}

/// Claims the next dispatch for `claimer`, recording its start in the same step, and holds it
/// with its lease guard running.
///
/// # Errors
///
/// When the store fails (not when nothing is available: that is `Ok(None)`).
pub async fn claim_for(claimer: &Claimer<'_>) -> Result<Option<ClaimHandle>, StoreError> {
    Ok(claim_next(claimer)
        .await?
        .map(|dispatch| hold(claimer, dispatch)))
}

/// The store half of [`claim_for`]: claims the next dispatch and records its start.
///
/// # Errors
///
/// When the store fails.
pub async fn claim_next(claimer: &Claimer<'_>) -> Result<Option<Dispatch>, StoreError> {
    Ok(claim_gated(claimer).await?.dispatch)
}

/// [`claim_next`], also saying when nothing was claimed because a limit held work back (and
/// until when, for a rate).
///
/// # Errors
///
/// When the store fails.
pub async fn claim_gated(claimer: &Claimer<'_>) -> Result<Gated, StoreError> {
    let gated = claimer
        .store
        .mailbox
        .claim_gated(&claimer.request())
        .await?;
    Ok(claimer.noted(gated))
}

impl Claimer<'_> {
    /// The store request of a claim (its start recorded in the same step).
    pub fn request(&self) -> ClaimRequest<'_> {
        ClaimRequest {
            agent: self.agent,
            consumer: self.consumer,
            lease_ms: millis(self.lease),
            start: true,
            limits: self.limits,
            offer: self.offer,
        }
    }

    /// `gated`, counted as throttled when a limit or pause held work back.
    fn noted(&self, gated: Gated) -> Gated {
        if gated.dispatch.is_none() && (gated.retry_at.is_some() || !gated.throttled.is_empty()) {
            crate::telemetry::claim_throttled(self.agent);
        }
        gated
    }
}

/// The host half of [`claim_for`]: holds a claimed dispatch and starts its lease guard.
pub fn hold(claimer: &Claimer<'_>, dispatch: Dispatch) -> ClaimHandle {
    let token = dispatch.token().unwrap_or_default().to_owned();
    let control = Arc::new(ClaimControl::default());
    let lease = LeaseGuard::start(
        claimer.store.clone(),
        &dispatch,
        token.clone(),
        claimer.lease,
        control.clone(),
    );
    let span = crate::telemetry::trace::dispatch_span(claimer.agent, &dispatch);
    let journal = Fence::of(&dispatch).and_then(|fence| {
        Recorder::new(
            claimer.store,
            fence,
            claimer.agent,
            dispatch.claims,
            dispatch.attempt,
            claimer.journal,
        )
    });
    if dispatch.claims == 1
        && dispatch.metadata.get(FOLLOW_UP_BY.0).map(String::as_str) == Some(FOLLOW_UP_BY.1)
    {
        metrics::counter!(crate::telemetry::FOLLOW_UPS, "agent" => claimer.agent.to_owned())
            .increment(1);
    }
    ClaimHandle {
        dispatch,
        token,
        settled: None,
        control,
        enqueued: 0,
        handed: 0,
        tokens: Vec::new(),
        lease: Some(lease),
        span,
        journal,
        warned_steps: false,
        live: None,
        usage: Arc::default(),
    }
}
