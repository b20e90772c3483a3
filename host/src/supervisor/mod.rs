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

pub mod fleet;
pub mod histogram;
mod outcome;
mod reload;
mod schedules;

use crate::live::{Hub, LiveSettings};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinSet;
use tracing::{Instrument, debug, info, warn};

use crate::claim::{self, ClaimControl, ClaimHandle, Claimer, StopReason};
use crate::config::Config;
use crate::runtime::host::Abort;
use crate::runtime::{CallEnd, HandlerRun, Plugin, Runtime, WarmInstance, World};
use crate::store::{Dispatch, Gated, Status, Store, StoreError, millis};
use crate::telemetry;
pub use fleet::{Fleet, Reloaded, Shared, Slot};
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

/// A claim held by one of this host's workers.
#[derive(Debug, Clone)]
struct Held {
    token: String,
    control: Arc<ClaimControl>,
    /// The plugin and the version (content hash) it runs on.
    plugin: String,
    sha256: String,
    since: std::time::Instant,
}

/// Claims held by this host's workers, for shutdown and for draining replaced versions.
#[derive(Debug, Default)]
struct InFlight {
    claims: Mutex<HashMap<String, Held>>,
}

impl InFlight {
    fn add(&self, claim: &ClaimHandle, plugin: &Plugin) {
        if let Ok(mut claims) = self.claims.lock() {
            claims.insert(
                claim.dispatch().id.clone(),
                Held {
                    token: claim.token().to_owned(),
                    control: claim.control().clone(),
                    plugin: plugin.ctx.name.clone(),
                    sha256: plugin.sha256.clone(),
                    since: std::time::Instant::now(),
                },
            );
        }
    }
    fn remove(&self, id: &str) {
        if let Ok(mut claims) = self.claims.lock() {
            claims.remove(id);
        }
    }
    fn snapshot(&self) -> Vec<(String, Held)> {
        self.claims
            .lock()
            .map(|claims| {
                claims
                    .iter()
                    .map(|(id, held)| (id.clone(), held.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Asks a running host to reload its config and plugins (SIGHUP, the file watch and
/// `POST /v1/agents/{agent}/reload` all come through one).
#[derive(Debug, Clone)]
pub struct Reloader {
    asks: mpsc::Sender<ReloadAsk>,
}

#[derive(Debug)]
struct ReloadAsk {
    /// Only this plugin (its component and terms); `None`: the whole config.
    only: Option<String>,
    /// What asked, for the log.
    why: &'static str,
    reply: Option<oneshot::Sender<Result<Reloaded, String>>>,
}

impl Reloader {
    /// Reloads `only` that plugin (or every plugin and the config's plugin and limit tables)
    /// and says what changed.
    ///
    /// # Errors
    ///
    /// When the config no longer parses (nothing changed), or the host has stopped.
    pub async fn reload(
        &self,
        only: Option<String>,
        why: &'static str,
    ) -> Result<Reloaded, String> {
        let (reply, answer) = oneshot::channel();
        self.asks
            .send(ReloadAsk {
                only,
                why,
                reply: Some(reply),
            })
            .await
            .map_err(|_| "the host has stopped".to_owned())?;
        answer
            .await
            .map_err(|_| "the host stopped before reloading".to_owned())?
    }

    fn ask(&self, why: &'static str) {
        let _ = self.asks.try_send(ReloadAsk {
            only: None,
            why,
            reply: None,
        });
    }
}

/// Called with the fleet and the config in force after every reload (the API refreshes what
/// `/v1/agents` shows and the plugins it accepts work for).
pub type OnReload = Box<dyn Fn(&Fleet, &Config) + Send + Sync>;

/// A running host: plugins, workers and maintenance over one store.
pub struct Supervisor {
    config: Config,
    store: Store,
    runtime: Arc<Runtime>,
    fleet: Arc<Fleet>,
    shared: Shared,
    wake: Arc<Notify>,
    in_flight: Arc<InFlight>,
    report: Arc<Mutex<RunReport>>,
    reloader: Reloader,
    asks: mpsc::Receiver<ReloadAsk>,
    on_reload: Option<OnReload>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("fleet", &self.fleet)
            .finish_non_exhaustive()
    }
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
        let shared = Shared {
            store: store.clone(),
            live,
            shutdown: Arc::new(AtomicBool::new(false)),
        };
        let mut plugins = Vec::new();
        for name in config.plugins.keys() {
            plugins.push(fleet::load(&runtime, &config, name, &shared)?);
        }
        let (tx, asks) = mpsc::channel(16);
        Ok(Supervisor {
            config,
            store,
            runtime,
            fleet: Arc::new(Fleet::of(plugins)),
            shared,
            wake: Arc::new(Notify::new()),
            in_flight: Arc::new(InFlight::default()),
            report: Arc::new(Mutex::new(RunReport::default())),
            reloader: Reloader { asks: tx },
            asks,
            on_reload: None,
        })
    }

    /// The newest version of every plugin served.
    pub fn plugins(&self) -> Vec<Arc<Plugin>> {
        self.fleet.newest()
    }

    /// The plugins served and the versions kept of each.
    pub fn fleet(&self) -> Arc<Fleet> {
        self.fleet.clone()
    }

    /// A handle that asks this host to reload.
    pub fn reloader(&self) -> Reloader {
        self.reloader.clone()
    }

    /// Calls `f` with the fleet after every reload.
    pub fn on_reload(&mut self, f: OnReload) {
        self.on_reload = Some(f);
    }

    fn spawn_workers(&self, workers: &mut JoinSet<()>) {
        for (slot, index) in self.fleet.workers_to_start() {
            workers.spawn(worker(
                slot,
                self.runtime.clone(),
                self.shared.shutdown.clone(),
                self.wake.clone(),
                self.in_flight.clone(),
                self.report.clone(),
                index,
            ));
        }
    }

    /// Runs until SIGINT/SIGTERM, or (with `until_idle`) until no dispatch is queued or claimed.
    /// SIGHUP, a change to a watched file (`[host] watch`) and the reloader reload the plugins
    /// meanwhile.
    ///
    /// # Errors
    ///
    /// When the store fails while checking for idleness.
    pub async fn run(mut self, until_idle: bool) -> anyhow::Result<RunReport> {
        // Listen before any worker can claim: from here on SIGINT/SIGTERM is a graceful stop,
        // never the default action ending the process with claims held.
        let signals = shutdown_signal();
        listen_for_hangup(self.reloader.clone());
        let mut watcher = if self.config.host.watch {
            match reload::Watch::start(&self.config, self.reloader.clone()) {
                Ok(w) => Some(w),
                Err(e) => {
                    warn!(
                        "watching the config and plugin files failed ({e:#}); reload with SIGHUP or the API"
                    );
                    None
                }
            }
        } else {
            None
        };
        reconcile_schedules(&self.store, &self.config)
            .await
            .map_err(|e| anyhow::anyhow!(e))?;
        let mut workers = JoinSet::new();
        self.spawn_workers(&mut workers);
        let ticks = tokio::spawn(schedules::tick_loop(
            self.store.clone(),
            format!("{}/schedules", self.config.host_id()),
            self.config.host.lease,
            self.shared.shutdown.clone(),
            self.wake.clone(),
        ));
        let sweeper = tokio::spawn(sweep_loop(
            self.store.clone(),
            self.config.host.sweep_interval,
            self.config.host.retention,
            self.shared.shutdown.clone(),
            self.config.plugins.keys().cloned().collect(),
        ));
        // The watch is up and the workers run: from here on the API may say it is ready.
        if let Some(f) = &self.on_reload {
            f(&self.fleet, &self.config);
        }
        info!(
            plugins = self.fleet.slots().len(),
            workers = workers.len(),
            "homing host running"
        );
        let store = self.store.clone();
        let stop = wait_for_stop(&store, until_idle, signals);
        tokio::pin!(stop);
        let stop = loop {
            tokio::select! {
                stop = &mut stop => break stop,
                Some(ask) = self.asks.recv() => {
                    let out = self.reload(ask.only.as_deref(), ask.why).await;
                    self.spawn_workers(&mut workers);
                    if let (Some(w), Ok(_)) = (&mut watcher, &out) {
                        w.follow(&self.config);
                    }
                    if let Some(f) = &self.on_reload {
                        f(&self.fleet, &self.config);
                    }
                    if let Some(reply) = ask.reply {
                        let _ = reply.send(out);
                    }
                }
                Some(_) = workers.join_next(), if !workers.is_empty() => {}
            }
        };
        if let Err(e) = &stop {
            warn!("stopping: {e:#}");
        }
        drop(watcher);
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.wake.notify_waiters();
        for (_, held) in self.in_flight.snapshot() {
            held.control.request_stop(StopReason::Shutdown);
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
            for (id, held) in self.in_flight.snapshot() {
                let now = self.store.now();
                match self
                    .store
                    .mailbox
                    .nack(
                        &id,
                        &held.token,
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
        ticks.abort();
        stop?;
        let report = self.report.lock().map(|r| r.clone()).unwrap_or_default();
        Ok(report)
    }

    /// Reloads the config file and the plugins it names (`only`: that one), installs what
    /// loaded, and starts the drain of the versions replaced.
    async fn reload(&mut self, only: Option<&str>, why: &'static str) -> Result<Reloaded, String> {
        let started = std::time::Instant::now();
        let path = std::path::PathBuf::from(&self.config.source);
        let config = match Config::load(&path) {
            Ok(config) => config,
            Err(e) => {
                let why_not = format!("the config no longer loads, so nothing changed: {e}");
                warn!(trigger = why, "reload refused: {why_not}");
                self.fleet.config_failed(Some(why_not.clone()));
                return Err(why_not);
            }
        };
        if let Err(e) = crate::work::schedules::defs_of(&config, self.store.now()) {
            let why_not = format!("the config's schedules are refused, so nothing changed: {e}");
            warn!(trigger = why, "reload refused: {why_not}");
            self.fleet.config_failed(Some(why_not.clone()));
            return Err(why_not);
        }
        self.fleet.config_failed(None);
        if let Some(name) = only
            && !config.plugins.contains_key(name)
            && self.fleet.slot(name).is_none()
        {
            return Err(format!("no plugin `{name}` in {}", config.source));
        }
        for note in reload::restart_only(&self.config, &config) {
            warn!("{note}");
        }
        let (runtime, shared, only_owned) = (
            self.runtime.clone(),
            self.shared.clone(),
            only.map(str::to_owned),
        );
        let cfg = config.clone();
        // Compiling is seconds of CPU for a large component: off the async workers.
        let loaded = tokio::task::spawn_blocking(move || {
            fleet::load_all(&runtime, &cfg, only_owned.as_deref(), &shared)
        })
        .await
        .map_err(|e| format!("loading the plugins failed: {e}"))?;
        let mut checked = Vec::with_capacity(loaded.len());
        for (name, result) in loaded {
            let result = match result {
                Ok(plugin) => match self.runtime.start_instance(&plugin).await {
                    Ok(()) => Ok(plugin),
                    Err(e) => Err(e.context(format!("plugin `{name}` does not instantiate"))),
                },
                Err(e) => Err(e),
            };
            checked.push((name, result));
        }
        let configured = config.plugins.keys().cloned().collect();
        let keep = usize::try_from(config.host.keep_versions).unwrap_or(usize::MAX);
        let out = self.fleet.install(checked, &configured, only, keep);
        for (name, old, new) in &out.swapped {
            info!(plugin = %name, from = %old, to = %new, trigger = why, elapsed_ms = started.elapsed().as_millis() as u64, "plugin swapped to a new version; new claims run it");
            if let Some(slot) = self.fleet.slot(name)
                && let Some(current) = slot.current()
            {
                tokio::spawn(drain_after(
                    slot.clone(),
                    self.in_flight.clone(),
                    current.newest.ctx.drain_timeout,
                ));
            }
        }
        for name in &out.updated {
            debug!(plugin = %name, trigger = why, "plugin terms reloaded; same version");
        }
        for name in &out.added {
            info!(plugin = %name, trigger = why, "plugin added");
        }
        for name in &out.removed {
            info!(plugin = %name, trigger = why, "plugin removed; it claims nothing more and its runs in flight finish");
        }
        for (name, e) in &out.failed {
            warn!(plugin = %name, trigger = why, "reload left the plugin as it was: {e}");
        }
        // The plugin and limit tables in force: all of the new ones on a full reload; on a
        // reload of one plugin, its own table (added or replaced).
        match only {
            None => {
                // The schedules the file declares now: added, changed, and those it no longer
                // declares deleted (their dispatches untouched).
                if let Err(e) = reconcile_schedules(&self.store, &config).await {
                    warn!(trigger = why, "reload left the schedules as they were: {e}");
                }
                self.config.plugins = config.plugins;
                self.config.limits = config.limits;
                self.config.schedules = config.schedules;
            }
            Some(name) => {
                if let Some(p) = config.plugins.get(name) {
                    self.config.plugins.insert(name.to_owned(), p.clone());
                }
            }
        }
        // Workers waiting for work read their terms again.
        self.wake.notify_waiters();
        Ok(out)
    }
}

/// Makes the stored schedules of source `config` those `config` declares.
///
/// # Errors
///
/// A declaration the rules refuse (naming its file, line and key), or the store's.
async fn reconcile_schedules(store: &Store, config: &Config) -> Result<(), String> {
    let defs = crate::work::schedules::defs_of(config, store.now())?;
    let gone = crate::work::schedules::reconcile(store, &defs)
        .await
        .map_err(|e| format!("{}: {e}", config.source))?;
    for name in gone {
        info!(schedule = %name, "schedule removed from the config: deleted; its dispatches stay");
    }
    Ok(())
}

/// After `timeout`, stops the runs of `slot` still going on a version other than its newest
/// that started before the swap; each is given back to the queue without an attempt.
async fn drain_after(slot: Arc<Slot>, in_flight: Arc<InFlight>, timeout: Duration) {
    let swapped = std::time::Instant::now();
    tokio::time::sleep(timeout).await;
    let Some(current) = slot.current() else {
        return;
    };
    for (id, held) in in_flight.snapshot() {
        if held.plugin == slot.name && held.sha256 != current.newest.sha256 && held.since <= swapped
        {
            info!(plugin = %slot.name, dispatch = %id, "drain_timeout passed on a replaced version; stopping the run");
            held.control.request_stop(StopReason::Drained);
        }
    }
}

/// Reloads on SIGHUP, for as long as the process runs.
fn listen_for_hangup(reloader: Reloader) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::hangup()) {
            Ok(mut hangup) => {
                tokio::spawn(async move {
                    while hangup.recv().await.is_some() {
                        info!("SIGHUP received; reloading");
                        reloader.ask("SIGHUP");
                    }
                });
            }
            Err(e) => warn!("cannot listen for SIGHUP: {e}"),
        }
    }
    #[cfg(not(unix))]
    let _ = reloader;
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
                if !live_work(store).await? {
                    info!("no dispatch queued or claimed; stopping (--until-idle)");
                    return Ok(());
                }
            }
        }
    }
}

/// Whether work other than the schedules' ticks is queued, claimed or waiting: a schedule's
/// tick is always queued (for its next fire), and `--until-idle` does not wait for it.
async fn live_work(store: &Store) -> anyhow::Result<bool> {
    if !store
        .mailbox
        .has_live_work()
        .await
        .context("checking for live work")?
    {
        return Ok(false);
    }
    let counts = store
        .mailbox
        .live_counts()
        .await
        .context("checking for live work")?;
    Ok(counts
        .iter()
        .any(|c| c.count > 0 && c.agent != crate::work::schedules::TICK_AGENT))
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
    slot: Arc<Slot>,
    runtime: Arc<Runtime>,
    shutdown: Arc<AtomicBool>,
    wake: Arc<Notify>,
    in_flight: Arc<InFlight>,
    report: Arc<Mutex<RunReport>>,
    index: u32,
) {
    let mut failures: u32 = 0;
    // A kept instance, and the version it is an instance of.
    let mut warm: Option<WarmInstance> = None;
    let mut warm_of = String::new();
    // The claim made with the last completion (one store step for both): run next.
    let mut prefetched: Option<Result<Gated, StoreError>> = None;
    debug!(plugin = %slot.name, worker = index, "worker started");
    while !shutdown.load(Ordering::SeqCst) {
        // Read the terms before each claim: a reload may have changed them.
        let Some(current) = slot.keep_worker(index) else {
            debug!(plugin = %slot.name, worker = index, "worker leaves (removed, or past the concurrency)");
            break;
        };
        let newest = &current.newest;
        let signal = newest.ctx.store.mailbox.work_signal();
        let notified = signal.notified();
        let woken = wake.notified();
        tokio::pin!(notified, woken);
        notified.as_mut().enable();
        woken.as_mut().enable();
        let claimer = crate::claim::Claimer {
            offer: Some(&current.offer),
            ..newest.ctx.claimer()
        };
        // A claim made with the last completion is used when it got a dispatch whose version
        // this worker still runs; otherwise (nothing claimed, or a reload in between dropped
        // the version it recorded) the worker claims now, with its wake-ups armed.
        let gated = match prefetched.take() {
            Some(Ok(g)) if g.dispatch.as_ref().is_some_and(|d| runs_here(&slot, d)) => Ok(g),
            Some(Ok(Gated {
                dispatch: Some(d), ..
            })) => {
                give_back(
                    &newest.ctx.store,
                    &d,
                    "its version was replaced before it ran",
                )
                .await;
                claim::claim_gated(&claimer).await
            }
            _ => claim::claim_gated(&claimer).await,
        };
        // A rate that held work back says when its next token comes: sleep until then (or a
        // signal) rather than the whole idle poll.
        let idle = match &gated {
            Ok(g) => g.retry_at.map_or(IDLE_POLL, |at| {
                Duration::from_millis(at.saturating_sub(newest.ctx.store.now()).max(1))
                    .min(IDLE_POLL)
            }),
            Err(_) => IDLE_POLL,
        };
        match gated.map(|g| g.dispatch) {
            Ok(Some(dispatch)) => {
                failures = 0;
                let claimed = std::time::Instant::now();
                telemetry::queue_wait(
                    &slot.name,
                    dispatch
                        .started_at
                        .unwrap_or(dispatch.updated_at)
                        .saturating_sub(dispatch.available_at),
                );
                // The store recorded the version this claim runs: a kept one it is pinned to,
                // or the newest.
                let plugin = crate::store::versions::pinned(&dispatch)
                    .and_then(|v| slot.version(v))
                    .unwrap_or_else(|| newest.clone());
                if warm_of != plugin.sha256 {
                    warm = None;
                    warm_of.clone_from(&plugin.sha256);
                }
                let claim = claim::hold(&plugin.ctx.claimer(), dispatch);
                in_flight.add(&claim, &plugin);
                let id = claim.dispatch().id.clone();
                let span = claim.span().clone();
                // With no stop asked, the completion claims the next dispatch in the same step.
                let next = (!shutdown.load(Ordering::SeqCst)).then_some(&claimer);
                let (outcome, settling, claimed_next) =
                    run_one(&runtime, &plugin, claim, &mut warm, next)
                        .instrument(span)
                        .await;
                prefetched = claimed_next;
                in_flight.remove(&id);
                if let Ok(mut report) = report.lock() {
                    *report.outcomes.entry(outcome).or_default() += 1;
                    if let Some(settling) = settling {
                        let own = claimed.elapsed().saturating_sub(settling);
                        telemetry::host_overhead(&slot.name, own);
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
                warn!(plugin = %slot.name, "claim failed ({e}); retrying in {backoff:?}");
                tokio::select! {
                    () = &mut woken => {}
                    () = tokio::time::sleep(backoff) => {}
                }
            }
        }
    }
    // Stopped (or leaving) with a dispatch claimed for a next run: back to the queue.
    if let Some(Ok(Gated {
        dispatch: Some(d), ..
    })) = prefetched
        && let Some(current) = slot.current()
    {
        give_back(
            &current.newest.ctx.store,
            &d,
            "the worker stopped before running it",
        )
        .await;
    }
}

/// Whether `d`'s claim runs on a version this worker's slot still keeps.
fn runs_here(slot: &Slot, d: &Dispatch) -> bool {
    crate::store::versions::pinned(d).is_none_or(|v| slot.version(v).is_some())
}

/// Gives a dispatch claimed but not run back to the queue, available now, with no attempt
/// counted (T19); when that fails its lease runs out and the sweeper reclaims it.
async fn give_back(store: &Store, d: &Dispatch, why: &str) {
    let Some(token) = d.token() else { return };
    if let Err(e) = store.mailbox.release(&d.id, token, store.now(), why).await {
        warn!(dispatch = %d.id, "could not give back a claimed dispatch ({e}); its lease will run out");
    }
}

/// Runs one claimed dispatch and settles it. Returns the outcome's name and, for a `handler`
/// plugin (where the host settles), how long settling took.
async fn run_one(
    runtime: &Runtime,
    plugin: &Plugin,
    claim: ClaimHandle,
    warm: &mut Option<WarmInstance>,
    next: Option<&Claimer<'_>>,
) -> (Outcome, Option<Duration>, Option<Result<Gated, StoreError>>) {
    let started = std::time::Instant::now();
    let (id, attempt) = (claim.dispatch().id.clone(), claim.dispatch().attempt);
    let name = plugin.ctx.name.clone();
    let mut settling = None;
    let mut claimed_next = None;
    let outcome = match plugin.world {
        World::Handler => {
            let run = runtime.run_handler(plugin, claim, warm).await;
            let settle_started = std::time::Instant::now();
            let outcome = match run {
                HandlerRun::Finished { claim, end } => {
                    let (outcome, gated) = settle(plugin, *claim, end, next).await;
                    claimed_next = gated;
                    outcome
                }
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
    let version = plugin
        .sha256
        .get(..crate::runtime::host::SHORT_VERSION)
        .unwrap_or(&plugin.sha256);
    info!(
        plugin = %name,
        dispatch = %id,
        attempt,
        version,
        %outcome,
        elapsed_us = started.elapsed().as_micros() as u64,
        "dispatch finished"
    );
    (outcome, settling, claimed_next)
}

/// Settles what the guest left unsettled, by how its call ended (see the module's table).
/// A completion with `next` also makes that claim, in the same store step; its result is
/// returned.
async fn settle(
    plugin: &Plugin,
    mut claim: ClaimHandle,
    end: CallEnd,
    next: Option<&Claimer<'_>>,
) -> (Outcome, Option<Result<Gated, StoreError>>) {
    // Stop renewing: from here on the host settles promptly or not at all.
    claim.stop_renewing();
    if let Some(settled) = claim.settled() {
        return (settled.into(), None);
    }
    let mut claimed_next = None;
    let (store, retry) = (&plugin.ctx.store, &plugin.ctx.config.retry);
    if let CallEnd::Trapped { abort, .. } = &end {
        telemetry::guest_trap(&plugin.ctx.name, trap_kind(abort.as_ref()));
    }
    let result = match end {
        CallEnd::Returned(output) => match next {
            Some(next) => {
                let (done, gated) = claim.complete_and_claim(store, output, next).await;
                claimed_next = Some(gated);
                done.map(|_| Outcome::Completed)
            }
            None => claim
                .complete(store, output)
                .await
                .map(|_| Outcome::Completed),
        },
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
            abort: Some(Abort::Cancelled(StopReason::Drained)),
            ..
        } => claim.drain(store).await.map(|_| Outcome::Drained),
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
        Ok(_) if claim.settled() == Some(crate::claim::Settlement::Parked) => Outcome::Parked,
        Ok(outcome) => outcome,
        Err(StoreError::StaleEpoch { .. }) => Outcome::Superseded,
        Err(e) => {
            warn!(plugin = %plugin.ctx.name, dispatch = %claim.dispatch().id, "could not settle: {e}");
            Outcome::Unsettled
        }
    };
    // A settlement recorded itself on the span; what is left is why nothing was settled.
    if claim.settled().is_none() {
        crate::telemetry::trace::record_outcome(claim.span(), outcome.as_str(), outcome.failed());
    }
    (outcome, claimed_next)
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
        Some(Abort::Cancelled(StopReason::Drained)) => "drained",
    }
}

fn failed_outcome(d: &Dispatch) -> Outcome {
    if d.status == Status::DeadLetter {
        Outcome::DeadLettered
    } else {
        Outcome::Retrying
    }
}
