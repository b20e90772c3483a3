//! The supervisor: workers that claim and run dispatches, the sweeper, and shutdown.
//!
//! Per plugin, `concurrency` workers loop: claim the best available dispatch routed to the
//! plugin (through the claim layer, which keeps its lease alive while it runs), run it on a
//! fresh instance, settle what the guest left unsettled. Between claims a worker waits on the
//! store's work signal, and re-checks at least every [`IDLE_POLL`], because signals are hints
//! (another process, such as `homing enqueue`, writes the same store without signalling this
//! one; delayed dispatches become available without any write).
//!
//! How a call ends decides the settlement when the guest did not settle itself:
//!
//! | the call | the host does |
//! | --- | --- |
//! | `handle` returned `ok(output)` | complete (record the output and ack) |
//! | `handle` returned `err(message)` | nack with the plugin's backoff; dead-letter at max attempts |
//! | trap, timeout, memory limit | nack with backoff and the reason as the error |
//! | cancelled: thread interrupted | supersede (the store would refuse any other write) |
//! | cancelled: lease lost | nothing: the claim belongs to someone else now |
//!
//! The sweeper, every `sweep_interval`, reclaims expired leases (the work of dead hosts),
//! purges terminal records older than the retention, and fires the work signal so queued work
//! whose wake-up was lost gets claimed.
//!
//! Shutdown (SIGINT, SIGTERM, or the `until_idle` condition): workers stop claiming; in-flight
//! guests are told through `stop-requested` and get `shutdown_grace` to finish; whatever is still
//! held after that is nacked (its lease would otherwise block its thread until it runs out).

pub mod histogram;
mod outcome;

use crate::live::{Hub, LiveSettings};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tracing::{Instrument, debug, info, warn};

use crate::claim::{self, ClaimControl, ClaimHandle, StopReason};
use crate::config::Config;
use crate::runtime::host::{Abort, PluginContext};
use crate::runtime::{CallEnd, HandlerRun, Plugin, Runtime, WarmInstance, World};
use crate::store::{Dispatch, Status, Store, StoreError, millis};
use crate::telemetry;
pub use histogram::Histogram;
pub use outcome::Outcome;

/// The longest a worker waits between claim attempts when no signal arrives.
pub const IDLE_POLL: Duration = Duration::from_millis(250);
/// How often `until_idle` checks whether any dispatch is still live.
pub const IDLE_CHECK: Duration = Duration::from_millis(50);
/// Expired leases reclaimed per sweep.
pub const RECLAIM_BATCH: usize = 1_000;

/// What a `homing run` did.
#[derive(Debug, Default, Clone)]
pub struct RunReport {
    /// Dispatches this host settled, by outcome.
    pub outcomes: HashMap<Outcome, u64>,
    /// The host's own time per `handler` dispatch, in µs: from the claim returned by the store
    /// to the dispatch's bookkeeping done, less the settling store call. Instance creation,
    /// the guest's call and the host's bookkeeping; for a guest that calls the store itself
    /// (appends, enqueues), those calls too.
    pub host_overhead: Histogram,
}

/// Claims held by this host's workers, for shutdown.
#[derive(Debug, Default)]
struct InFlight {
    claims: Mutex<HashMap<String, (String, Arc<ClaimControl>)>>,
}

impl InFlight {
    fn add(&self, claim: &ClaimHandle) {
        if let Ok(mut claims) = self.claims.lock() {
            claims.insert(
                claim.dispatch.id.clone(),
                (claim.token.clone(), claim.control.clone()),
            );
        }
    }
    fn remove(&self, id: &str) {
        if let Ok(mut claims) = self.claims.lock() {
            claims.remove(id);
        }
    }
    fn snapshot(&self) -> Vec<(String, String, Arc<ClaimControl>)> {
        self.claims
            .lock()
            .map(|claims| {
                claims
                    .iter()
                    .map(|(id, (t, c))| (id.clone(), t.clone(), c.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A running host: plugins, workers and maintenance over one store.
#[derive(Debug)]
pub struct Supervisor {
    config: Config,
    store: Store,
    runtime: Arc<Runtime>,
    plugins: Vec<Arc<Plugin>>,
    shutdown: Arc<AtomicBool>,
    wake: Arc<Notify>,
    in_flight: Arc<InFlight>,
    report: Arc<Mutex<RunReport>>,
}

impl Supervisor {
    /// Builds the engine and loads every plugin of `config`.
    ///
    /// # Errors
    ///
    /// When a plugin cannot be loaded (the error names it).
    pub fn new(config: Config, store: Store) -> anyhow::Result<Supervisor> {
        let live = Hub::new(&store, LiveSettings::of(&config));
        Supervisor::with_hub(config, store, live)
    }

    /// [`Supervisor::new`] with the live hub its claims stream to (shared with the API that
    /// serves their watchers).
    ///
    /// # Errors
    ///
    /// When a plugin cannot be loaded (the error names it).
    pub fn with_hub(config: Config, store: Store, live: Hub) -> anyhow::Result<Supervisor> {
        let runtime = Arc::new(Runtime::new(&config)?);
        let shutdown = Arc::new(AtomicBool::new(false));
        let host_id = config.host_id();
        let mut plugins = Vec::new();
        for (name, plugin_config) in &config.plugins {
            let targets = plugin_config
                .enqueue_to
                .iter()
                .filter_map(|t| config.plugins.get(t).map(|p| (t.clone(), p.max_attempts)))
                .collect();
            let target_keys = plugin_config
                .enqueue_to
                .iter()
                .filter_map(|t| Some((t.clone(), config.key_source(t)?.clone())))
                .collect();
            let ctx = Arc::new(PluginContext {
                name: name.clone(),
                config: plugin_config.clone(),
                store: store.clone(),
                consumer: format!("{host_id}/{name}"),
                lease: config.host.lease,
                targets,
                target_keys,
                config_dir: config.base_dir.clone(),
                values: config.resolve_values(name)?,
                tls_ca: config.tls_ca_files(name),
                hosts: config.host.hosts.clone(),
                max_payload: config.host.max_payload,
                shutdown: shutdown.clone(),
                public_url: config.api.public_url.clone(),
                live: live.clone(),
                limits: crate::work::flow::limit_set(&config, name),
                origin_limits: crate::work::flow::origin_limits(&config, name),
            });
            let path = config.resolve(&plugin_config.path);
            let plugin = runtime.load_plugin(ctx, &path)?;
            plugins.push(Arc::new(plugin));
        }
        Ok(Supervisor {
            config,
            store,
            runtime,
            plugins,
            shutdown,
            wake: Arc::new(Notify::new()),
            in_flight: Arc::new(InFlight::default()),
            report: Arc::new(Mutex::new(RunReport::default())),
        })
    }

    /// The loaded plugins.
    pub fn plugins(&self) -> &[Arc<Plugin>] {
        &self.plugins
    }

    /// Runs until SIGINT/SIGTERM, or (with `until_idle`) until no dispatch is queued or claimed.
    ///
    /// # Errors
    ///
    /// When the store fails while checking for idleness.
    pub async fn run(self, until_idle: bool) -> anyhow::Result<RunReport> {
        // Listen before any worker can claim: from here on SIGINT/SIGTERM is a graceful stop,
        // never the default action ending the process with claims held.
        let signals = shutdown_signal();
        let mut workers = JoinSet::new();
        for plugin in &self.plugins {
            for index in 0..plugin.ctx.config.concurrency {
                workers.spawn(worker(
                    plugin.clone(),
                    self.runtime.clone(),
                    self.shutdown.clone(),
                    self.wake.clone(),
                    self.in_flight.clone(),
                    self.report.clone(),
                    index,
                ));
            }
        }
        let sweeper = tokio::spawn(sweep_loop(
            self.store.clone(),
            self.config.host.sweep_interval,
            self.config.host.retention,
            self.shutdown.clone(),
            self.config.plugins.keys().cloned().collect(),
        ));
        info!(
            plugins = self.plugins.len(),
            workers = workers.len(),
            "homing host running"
        );
        let stop = wait_for_stop(&self.store, until_idle, signals).await;
        if let Err(e) = &stop {
            warn!("stopping: {e:#}");
        }
        self.shutdown.store(true, Ordering::SeqCst);
        self.wake.notify_waiters();
        for (_, _, control) in self.in_flight.snapshot() {
            control.request_stop(StopReason::Shutdown);
        }
        let grace = self.config.host.shutdown_grace;
        let drained = tokio::time::timeout(grace, async {
            while workers.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            warn!("shutdown grace of {grace:?} passed; releasing unfinished dispatches");
            workers.abort_all();
            while workers.join_next().await.is_some() {}
            for (id, token, _) in self.in_flight.snapshot() {
                let now = self.store.now();
                match self
                    .store
                    .mailbox
                    .nack(
                        &id,
                        &token,
                        now,
                        "host shut down before the dispatch finished",
                    )
                    .await
                {
                    Ok(d) => info!(dispatch = %id, status = %d.status, "released at shutdown"),
                    Err(e) => warn!(dispatch = %id, "could not release at shutdown: {e}"),
                }
            }
        }
        sweeper.abort();
        stop?;
        let report = self.report.lock().map(|r| r.clone()).unwrap_or_default();
        Ok(report)
    }
}

async fn wait_for_stop(
    store: &Store,
    until_idle: bool,
    signals: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    tokio::pin!(signals);
    if !until_idle {
        signals.await;
        return Ok(());
    }
    loop {
        tokio::select! {
            () = &mut signals => return Ok(()),
            () = tokio::time::sleep(IDLE_CHECK) => {
                if !store.mailbox.has_live_work().await.context("checking for live work")? {
                    info!("no dispatch queued or claimed; stopping (--until-idle)");
                    return Ok(());
                }
            }
        }
    }
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is called, not when the
/// future is first polled: a signal arriving in between is caught, not left to end the process.
fn shutdown_signal() -> impl Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let listening = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        );
        async move {
            match listening {
                (Ok(mut term), Ok(mut interrupt)) => {
                    tokio::select! {
                        _ = interrupt.recv() => info!("SIGINT received; shutting down"),
                        _ = term.recv() => info!("SIGTERM received; shutting down"),
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

async fn sweep_loop(
    store: Store,
    interval: Duration,
    retention: Duration,
    shutdown: Arc<AtomicBool>,
    agents: Vec<String>,
) {
    let retention_ms = millis(retention);
    let gauges = telemetry::enabled();
    while !shutdown.load(Ordering::SeqCst) {
        if gauges && let Err(e) = telemetry::refresh_queue(&store, &agents).await {
            warn!("reading the queue for its gauges failed: {e}");
        }
        tokio::time::sleep(interval).await;
        let now = store.now();
        match store.mailbox.reclaim_expired(now, RECLAIM_BATCH).await {
            Ok(reclaimed) if !reclaimed.is_empty() => {
                telemetry::reclaimed(reclaimed.len());
                info!(count = reclaimed.len(), "reclaimed expired leases");
            }
            Ok(_) => {}
            Err(e) => warn!("reclaim failed: {e}"),
        }
        // Waitpoints past their timeout: each times out once whichever host's sweeper gets
        // there first; a dispatch waiting on one is queued again.
        match store
            .waitpoints
            .time_out_waitpoints(now, RECLAIM_BATCH)
            .await
        {
            Ok(timed_out) => {
                for w in &timed_out {
                    telemetry::waitpoint_settled(w);
                }
                if !timed_out.is_empty() {
                    info!(count = timed_out.len(), "timed out waitpoints");
                }
            }
            Err(e) => warn!("timing out waitpoints failed: {e}"),
        }
        if !store.mailbox.expires_settled() {
            match store
                .mailbox
                .purge_terminal(now.saturating_sub(retention_ms))
                .await
            {
                Ok(purged) if purged > 0 => {
                    info!(purged, "purged terminal dispatches past retention")
                }
                Ok(_) => {}
                Err(e) => warn!("purge failed: {e}"),
            }
        }
        // Acknowledged and discarded inbox messages go after the same retention (their log
        // entries stay until the log is trimmed); pending ones are never purged.
        match store
            .inbox
            .purge_messages(now.saturating_sub(retention_ms))
            .await
        {
            Ok(purged) if purged > 0 => info!(purged, "purged settled messages past retention"),
            Ok(_) => {}
            Err(e) => warn!("purging settled messages failed: {e}"),
        }
        // Re-signal: queued work whose wake-up was lost is claimed now.
        store.mailbox.work_signal().notify_waiters();
    }
}

async fn worker(
    plugin: Arc<Plugin>,
    runtime: Arc<Runtime>,
    shutdown: Arc<AtomicBool>,
    wake: Arc<Notify>,
    in_flight: Arc<InFlight>,
    report: Arc<Mutex<RunReport>>,
    index: u32,
) {
    let signal = plugin.ctx.store.mailbox.work_signal();
    let mut failures: u32 = 0;
    let mut warm = None;
    debug!(plugin = %plugin.ctx.name, worker = index, "worker started");
    while !shutdown.load(Ordering::SeqCst) {
        let notified = signal.notified();
        let woken = wake.notified();
        tokio::pin!(notified, woken);
        notified.as_mut().enable();
        woken.as_mut().enable();
        let claimer = plugin.ctx.claimer();
        let gated = claim::claim_gated(&claimer).await;
        // A rate that held work back says when its next token comes: sleep until then (or a
        // signal) rather than the whole idle poll.
        let idle = match &gated {
            Ok(g) => g.retry_at.map_or(IDLE_POLL, |at| {
                Duration::from_millis(at.saturating_sub(plugin.ctx.store.now()).max(1))
                    .min(IDLE_POLL)
            }),
            Err(_) => IDLE_POLL,
        };
        match gated.map(|g| g.dispatch) {
            Ok(Some(dispatch)) => {
                failures = 0;
                let claimed = std::time::Instant::now();
                telemetry::queue_wait(
                    &plugin.ctx.name,
                    dispatch
                        .started_at
                        .unwrap_or(dispatch.updated_at)
                        .saturating_sub(dispatch.available_at),
                );
                let claim = claim::hold(&claimer, dispatch);
                in_flight.add(&claim);
                let id = claim.dispatch.id.clone();
                let span = claim.span.clone();
                let (outcome, settling) = run_one(&runtime, &plugin, claim, &mut warm)
                    .instrument(span)
                    .await;
                in_flight.remove(&id);
                if let Ok(mut report) = report.lock() {
                    *report.outcomes.entry(outcome).or_default() += 1;
                    if let Some(settling) = settling {
                        let own = claimed.elapsed().saturating_sub(settling);
                        telemetry::host_overhead(&plugin.ctx.name, own);
                        report
                            .host_overhead
                            .record(u64::try_from(own.as_micros()).unwrap_or(u64::MAX));
                    }
                }
            }
            Ok(None) => {
                tokio::select! {
                    () = &mut notified => {}
                    () = &mut woken => {}
                    () = tokio::time::sleep(idle) => {}
                }
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                let backoff = Duration::from_millis(50u64.saturating_mul(1 << failures.min(6)));
                warn!(plugin = %plugin.ctx.name, "claim failed ({e}); retrying in {backoff:?}");
                tokio::select! {
                    () = &mut woken => {}
                    () = tokio::time::sleep(backoff) => {}
                }
            }
        }
    }
}

/// Runs one claimed dispatch and settles it. Returns the outcome's name and, for a `handler`
/// plugin (where the host settles), how long settling took.
async fn run_one(
    runtime: &Runtime,
    plugin: &Plugin,
    claim: ClaimHandle,
    warm: &mut Option<WarmInstance>,
) -> (Outcome, Option<Duration>) {
    let started = std::time::Instant::now();
    let (id, attempt) = (claim.dispatch.id.clone(), claim.dispatch.attempt);
    let name = plugin.ctx.name.clone();
    let mut settling = None;
    let outcome = match plugin.world {
        World::Handler => {
            let run = runtime.run_handler(plugin, claim, warm).await;
            let settle_started = std::time::Instant::now();
            let outcome = match run {
                HandlerRun::Finished { claim, end } => settle(plugin, *claim, end).await,
                HandlerRun::ClaimLost { .. } => {
                    crate::telemetry::trace::record_outcome(
                        &tracing::Span::current(),
                        Outcome::Lost.as_str(),
                        Outcome::Lost.failed(),
                    );
                    warn!(plugin = %name, dispatch = %id, "the claim could not be taken back from the instance; its lease will run out and the sweeper reclaims it");
                    Outcome::Lost
                }
            };
            settling = Some(settle_started.elapsed());
            outcome
        }
        World::Agent => {
            let budget = plugin.ctx.config.reuse_instance;
            match runtime.run_agent(plugin, claim, budget).await {
                CallEnd::Returned(_) => Outcome::RunReturned,
                CallEnd::Failed(message) => {
                    warn!(plugin = %name, "agent run returned an error: {message}");
                    Outcome::RunFailed
                }
                CallEnd::Trapped { reason, abort } => {
                    telemetry::guest_trap(&name, trap_kind(abort.as_ref()));
                    // Claims the guest still held were dropped with the store: unsettled ones
                    // run out their lease and are reclaimed; the one being worked on is nacked
                    // by the drop handler when the guest dropped it cleanly.
                    warn!(plugin = %name, "agent run trapped: {reason}");
                    Outcome::RunTrapped
                }
            }
        }
    };
    telemetry::dispatch_finished(&name, outcome.as_str(), started.elapsed());
    info!(
        plugin = %name,
        dispatch = %id,
        attempt,
        %outcome,
        elapsed_us = started.elapsed().as_micros() as u64,
        "dispatch finished"
    );
    (outcome, settling)
}

/// Settles what the guest left unsettled, by how its call ended (see the module's table).
async fn settle(plugin: &Plugin, mut claim: ClaimHandle, end: CallEnd) -> Outcome {
    // Stop renewing: from here on the host settles promptly or not at all.
    claim.stop_renewing();
    if let Some(settled) = claim.settled {
        return settled.into();
    }
    let (store, retry) = (&plugin.ctx.store, &plugin.ctx.config.retry);
    if let CallEnd::Trapped { abort, .. } = &end {
        telemetry::guest_trap(&plugin.ctx.name, trap_kind(abort.as_ref()));
    }
    let result = match end {
        CallEnd::Returned(output) => claim
            .complete(store, output)
            .await
            .map(|_| Outcome::Completed),
        CallEnd::Failed(message) => claim
            .nack(store, retry, &message, None)
            .await
            .map(|d| failed_outcome(&d)),
        CallEnd::Trapped {
            abort: Some(Abort::Cancelled(StopReason::Interrupted)),
            ..
        } => claim
            .supersede(store, "thread interrupted while running")
            .await
            .map(|_| Outcome::Superseded),
        CallEnd::Trapped {
            abort: Some(Abort::Cancelled(_)),
            ..
        } => Ok(Outcome::LeaseLost),
        CallEnd::Trapped { reason, .. } => claim
            .nack(store, retry, &reason, None)
            .await
            .map(|d| failed_outcome(&d)),
    };
    let outcome = match result {
        Ok(_) if claim.settled == Some(crate::claim::Settlement::Parked) => Outcome::Parked,
        Ok(outcome) => outcome,
        Err(StoreError::StaleEpoch { .. }) => Outcome::Superseded,
        Err(e) => {
            warn!(plugin = %plugin.ctx.name, dispatch = %claim.dispatch.id, "could not settle: {e}");
            Outcome::Unsettled
        }
    };
    // A settlement recorded itself on the span; what is left is why nothing was settled.
    if claim.settled.is_none() {
        crate::telemetry::trace::record_outcome(&claim.span, outcome.as_str(), outcome.failed());
    }
    outcome
}

/// The `kind` label of a trapped or cut-short call.
fn trap_kind(abort: Option<&Abort>) -> &'static str {
    match abort {
        None => "trap",
        Some(Abort::Timeout) => "timeout",
        Some(Abort::Cancelled(StopReason::Interrupted)) => "interrupted",
        Some(Abort::Cancelled(StopReason::LeaseLost)) => "lease_lost",
        Some(Abort::Cancelled(StopReason::Shutdown)) => "shutdown",
        Some(Abort::Cancelled(StopReason::Deadline)) => "deadline",
    }
}

fn failed_outcome(d: &Dispatch) -> Outcome {
    if d.status == Status::DeadLetter {
        Outcome::DeadLettered
    } else {
        Outcome::Retrying
    }
}
