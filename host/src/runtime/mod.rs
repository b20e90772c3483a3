//! The plugin runtime: one wasmtime engine, plugins compiled once, a fresh instance per dispatch.
//!
//! # Engine
//!
//! [`Runtime::new`] is the one place a wasmtime `Config` is built, so compiled artifacts in the
//! cache always match the engine that loads them. Epoch interruption is always on: a ticker
//! thread bumps the epoch every [`EPOCH_TICK`], and each store's epoch callback checks the
//! dispatch's deadline and its claim's stop flag, then yields to tokio. A guest in a tight loop
//! is thus stopped within a tick of its deadline, and a guest whose claim was lost or whose
//! thread was interrupted is cancelled within a tick of the lease keeper noticing. A tokio
//! timeout around every call covers the other way a call can hang: a host import that waits.
//!
//! The pooling allocator makes a fresh instance per dispatch cheap (memories are reused, reset
//! by madvise, rather than mapped anew). It needs a large virtual address reservation; with
//! `pooling = "auto"` the runtime tries it and falls back to on-demand allocation when the
//! machine refuses, and says which it uses in the log.
//!
//! # Plugins
//!
//! A plugin is compiled once (or loaded from the on-disk cache, see [`cache`]), its world
//! detected from its exports, linked against WASI p2 and the `homing:agent` imports, and
//! pre-instantiated (`InstancePre`). WASI is deny-by-default: no environment, no preopened
//! directories, no network, no inherited stdio; the plugin's config grants each. Guest stdout and
//! stderr become log lines tagged with plugin, dispatch and attempt.

pub mod bindings;
pub mod cache;
pub mod host;
pub mod limits;
mod output;

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use tracing::{info, warn};
use wasmtime::component::{Component, HasSelf, Linker, Resource};
use wasmtime::{
    Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store as WasmStore, UpdateDeadline,
};
use wasmtime_wasi::sockets::SocketAddrUse;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use crate::config::{Config, PluginConfig, Pooling};
use host::{Abort, ClaimHandle, GuestState, LogState, PluginContext};

/// `with_context` for wasmtime's own error type.
pub(crate) trait WasmContext<T> {
    /// Wraps the error with a message, as an `anyhow::Error`.
    fn wasm_context<C: std::fmt::Display + Send + Sync + 'static>(
        self,
        f: impl FnOnce() -> C,
    ) -> anyhow::Result<T>;
}

impl<T> WasmContext<T> for Result<T, wasmtime::Error> {
    fn wasm_context<C: std::fmt::Display + Send + Sync + 'static>(
        self,
        f: impl FnOnce() -> C,
    ) -> anyhow::Result<T> {
        self.map_err(|e| anyhow::Error::from(e).context(f()))
    }
}

/// How often the epoch ticks: the granularity of timeouts and cancellation.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Bytes of each pooled linear memory reset with memset rather than returned to the kernel.
pub const KEEP_RESIDENT: usize = 2 << 20;

/// Slack added to a plugin's timeout for the tokio timeout around a call, so the epoch deadline
/// (which traps cleanly inside the guest) normally fires first.
pub const CALL_TIMEOUT_SLACK: Duration = Duration::from_secs(1);

/// Which world a component implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum World {
    /// Exports `homing:agent/handle`: the host claims and calls `handle`.
    Handler,
    /// Exports `run`: the guest claims through `claim-next`.
    Agent,
}

impl World {
    /// The WIT world name.
    pub fn name(self) -> &'static str {
        match self {
            World::Handler => "handler",
            World::Agent => "agent",
        }
    }
}

/// The engine and what every plugin shares.
pub struct Runtime {
    engine: Engine,
    pooling: bool,
    cache_dir: PathBuf,
    _ticker: EpochTicker,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("pooling", &self.pooling)
            .finish_non_exhaustive()
    }
}

/// Bumps the engine's epoch until dropped.
struct EpochTicker {
    stop: Arc<AtomicBool>,
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A compiled, linked, pre-instantiated plugin.
pub struct Plugin {
    /// Shared context of its instances.
    pub ctx: Arc<PluginContext>,
    /// Its world.
    pub world: World,
    pre: PluginPre,
    net_allow: Arc<Vec<SocketAddr>>,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.ctx.name)
            .field("world", &self.world)
            .finish_non_exhaustive()
    }
}

enum PluginPre {
    Handler(bindings::handler::HandlerPre<GuestState>),
    Agent(bindings::agent::AgentPre<GuestState>),
}

/// A `handler` instance kept by a worker between dispatches (`reuse_instance > 1`).
pub struct WarmInstance {
    store: WasmStore<GuestState>,
    instance: bindings::handler::Handler,
    uses: u32,
}

impl std::fmt::Debug for WarmInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmInstance")
            .field("uses", &self.uses)
            .finish_non_exhaustive()
    }
}

fn failed_to_start(reason: String) -> CallEnd {
    CallEnd::Trapped {
        reason,
        abort: None,
    }
}

/// How a guest call ended.
#[derive(Debug)]
pub enum CallEnd {
    /// `handle` returned `ok(output)` (or `run` returned ok, with no output).
    Returned(Vec<u8>),
    /// The guest returned an error message.
    Failed(String),
    /// The call trapped or was cut short.
    Trapped {
        /// Why, for the dispatch's error text.
        reason: String,
        /// Set when the epoch callback or the memory limiter caused it.
        abort: Option<Abort>,
    },
}

impl Runtime {
    /// Builds the engine for `config`'s plugins.
    ///
    /// # Errors
    ///
    /// When wasmtime refuses the configuration (pooling requested with `on` but unavailable).
    pub fn new(config: &Config) -> anyhow::Result<Runtime> {
        let fuel = config.plugins.values().any(|p| p.fuel.is_some());
        let max_memory = config
            .plugins
            .values()
            .map(|p| p.memory)
            .max()
            .unwrap_or(64 << 20);
        let instances: u32 = config
            .plugins
            .values()
            .map(|p| p.concurrency)
            .sum::<u32>()
            .max(1);
        let (engine, pooling) = match config.host.pooling {
            Pooling::Off => (Engine::new(&engine_config(fuel, None))?, false),
            Pooling::On => (
                Engine::new(&engine_config(fuel, Some((max_memory, instances))))?,
                true,
            ),
            Pooling::Auto => match Engine::new(&engine_config(fuel, Some((max_memory, instances))))
            {
                Ok(engine) => (engine, true),
                Err(e) => {
                    warn!("pooling allocator unavailable ({e:#}); using on-demand allocation");
                    (Engine::new(&engine_config(fuel, None))?, false)
                }
            },
        };
        info!(
            pooling,
            "wasmtime engine ready ({} allocation)",
            if pooling { "pooling" } else { "on-demand" }
        );
        let stop = Arc::new(AtomicBool::new(false));
        let ticker_engine = engine.clone();
        let ticker_stop = stop.clone();
        std::thread::Builder::new()
            .name("homing-epoch".into())
            .spawn(move || {
                while !ticker_stop.load(std::sync::atomic::Ordering::SeqCst) {
                    std::thread::sleep(EPOCH_TICK);
                    ticker_engine.increment_epoch();
                }
            })
            .context("cannot start the epoch ticker thread")?;
        Ok(Runtime {
            engine,
            pooling,
            cache_dir: config.cache_dir(),
            _ticker: EpochTicker { stop },
        })
    }

    /// Whether the pooling allocator is in use.
    pub fn pooling(&self) -> bool {
        self.pooling
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Compiles (or loads from cache) and links the plugin at `path`.
    ///
    /// # Errors
    ///
    /// When the file is missing or not a component, exports neither world, or imports something
    /// the host does not provide.
    pub fn load_plugin(&self, ctx: Arc<PluginContext>, path: &Path) -> anyhow::Result<Plugin> {
        let component = cache::load(&self.engine, path, &self.cache_dir, &ctx.name)?;
        let world = detect_world(&self.engine, &component)
            .with_context(|| format!("plugin `{}` ({})", ctx.name, path.display()))?;
        let mut linker: Linker<GuestState> = Linker::new(&self.engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        match world {
            World::Handler => bindings::handler::Handler::add_to_linker::<_, HasSelf<GuestState>>(
                &mut linker,
                |s| s,
            )?,
            World::Agent => {
                bindings::agent::Agent::add_to_linker::<_, HasSelf<GuestState>>(&mut linker, |s| s)?
            }
        }
        let linked = linker
            .instantiate_pre(&component)
            .wasm_context(|| format!("plugin `{}`: cannot link {}", ctx.name, path.display()))?;
        let pre = match world {
            World::Handler => PluginPre::Handler(bindings::handler::HandlerPre::new(linked)?),
            World::Agent => PluginPre::Agent(bindings::agent::AgentPre::new(linked)?),
        };
        let net_allow = Arc::new(resolve_allowed(&ctx.config)?);
        info!(plugin = %ctx.name, world = world.name(), "plugin loaded");
        Ok(Plugin {
            ctx,
            world,
            pre,
            net_allow,
        })
    }

    /// A fresh store for one instance of `plugin`, with its grants and limits.
    ///
    /// # Errors
    ///
    /// When a granted directory cannot be opened or fuel cannot be set.
    pub fn new_store(&self, plugin: &Plugin) -> anyhow::Result<WasmStore<GuestState>> {
        let config = &plugin.ctx.config;
        let log = Arc::new(Mutex::new(LogState::default()));
        let mut wasi = WasiCtxBuilder::new();
        wasi.stdout(output::GuestOutput::new(
            plugin.ctx.name.clone(),
            "stdout",
            log.clone(),
        ));
        wasi.stderr(output::GuestOutput::new(
            plugin.ctx.name.clone(),
            "stderr",
            log.clone(),
        ));
        for (key, value) in &config.env {
            wasi.env(key, value);
        }
        for dir in &config.dirs {
            let perms = if dir.writable {
                FsPerms::ReadWrite
            } else {
                FsPerms::ReadOnly
            };
            let host_dir = plugin.ctx.config_dir.join(&dir.host);
            wasi.preopened_dir(&host_dir, &dir.guest, perms)
                .wasm_context(|| {
                    format!(
                        "plugin `{}`: cannot open dir {}",
                        plugin.ctx.name,
                        dir.host.display()
                    )
                })?;
        }
        if !plugin.net_allow.is_empty() {
            // Outbound TCP to the allow-list only. A connect first binds implicitly to the
            // wildcard address with port 0; that bind is allowed, any explicit bind or listen
            // is not (a guest serves no one).
            let allow = plugin.net_allow.clone();
            wasi.allow_tcp(true);
            wasi.allow_ip_name_lookup(true);
            wasi.socket_addr_check(move |addr, use_| {
                let allowed = match use_ {
                    SocketAddrUse::TcpConnect => allow.contains(&addr),
                    SocketAddrUse::TcpBind => addr.ip().is_unspecified() && addr.port() == 0,
                    _ => false,
                };
                Box::pin(async move { allowed })
            });
        }
        let state = GuestState::new(wasi.build(), plugin.ctx.clone(), log);
        let mut store = WasmStore::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        if let Some(fuel) = config.fuel {
            store.set_fuel(fuel)?;
        }
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|mut ctx| {
            let data = ctx.data_mut();
            if let Some(control) = &data.control
                && control.must_cancel()
            {
                let reason = control
                    .stop_reason()
                    .unwrap_or(bindings::StopReason::LeaseLost);
                data.abort = Some(Abort::Cancelled(reason));
                return Err(wasmtime::format_err!("cancelled: {reason:?}"));
            }
            if let Some(deadline) = data.deadline
                && std::time::Instant::now() >= deadline
            {
                data.abort = Some(Abort::Timeout);
                return Err(wasmtime::format_err!("timed out"));
            }
            Ok(UpdateDeadline::Yield(1))
        });
        Ok(store)
    }

    /// Creates a fresh store and instance of `plugin` and drops them: the per-dispatch start
    /// cost, for benchmarks and health checks.
    ///
    /// # Errors
    ///
    /// When instantiation fails.
    pub async fn start_instance(&self, plugin: &Plugin) -> anyhow::Result<()> {
        let mut store = self.new_store(plugin)?;
        store.data_mut().deadline = Some(std::time::Instant::now() + plugin.ctx.config.timeout);
        match &plugin.pre {
            PluginPre::Handler(pre) => {
                pre.instantiate_async(&mut store).await?;
            }
            PluginPre::Agent(pre) => {
                pre.instantiate_async(&mut store).await?;
            }
        }
        Ok(())
    }

    /// Runs one dispatch through a `handler` plugin: one `handle` call, on a fresh instance
    /// unless `warm` holds one this worker may reuse (`reuse_instance > 1`). Returns the claim
    /// (with what the guest did) and how the call ended. An instance that trapped or timed out
    /// is never reused: a trap can leave it in any state.
    pub async fn run_handler(
        &self,
        plugin: &Plugin,
        claim: ClaimHandle,
        warm: &mut Option<WarmInstance>,
    ) -> (ClaimHandle, CallEnd) {
        let PluginPre::Handler(pre) = &plugin.pre else {
            return (claim, failed_to_start("plugin is not a handler".into()));
        };
        let reuse = plugin.ctx.config.reuse_instance;
        let (mut store, instance, uses) = match warm.take() {
            Some(w) if w.uses < reuse => (w.store, Some(w.instance), w.uses),
            _ => match self.new_store(plugin) {
                Ok(store) => (store, None, 0),
                Err(e) => return (claim, failed_to_start(format!("{e:#}"))),
            },
        };
        if let Some(fuel) = plugin.ctx.config.fuel
            && let Err(e) = store.set_fuel(fuel)
        {
            return (claim, failed_to_start(format!("{e:#}")));
        }
        store.data_mut().abort = None;
        store.data_mut().begin(&claim);
        let resource = match store.data_mut().table().push(claim) {
            Ok(resource) => resource,
            Err(e) => {
                return (
                    placeholder_claim(),
                    failed_to_start(format!("resource table: {e}")),
                );
            }
        };
        let rep = resource.rep();
        let limit = plugin.ctx.config.timeout + CALL_TIMEOUT_SLACK;
        let call = async {
            let instance = match instance {
                Some(instance) => instance,
                None => pre.instantiate_async(&mut store).await?,
            };
            let out = instance
                .homing_agent_handle()
                .call_handle(&mut store, Resource::new_borrow(rep))
                .await;
            out.map(|out| (out, instance))
        };
        let (end, instance) = match tokio::time::timeout(limit, call).await {
            Ok(Ok((Ok(output), instance))) => (CallEnd::Returned(output), Some(instance)),
            Ok(Ok((Err(message), instance))) => (CallEnd::Failed(message), Some(instance)),
            Ok(Err(trap)) => (trapped(&store, trap), None),
            Err(_) => (
                CallEnd::Trapped {
                    reason: format!("timed out after {limit:?} (waiting in a host call)"),
                    abort: Some(Abort::Timeout),
                },
                None,
            ),
        };
        // The supervisor completes a returned output; one over the cap would be refused by
        // the store there and the attempt would hold its thread until its lease ran out. Fail
        // it now instead, naming the limit, so it is nacked at once.
        let end = match end {
            CallEnd::Returned(output) => {
                match crate::runtime::host::check_returned_output(&plugin.ctx, &output) {
                    Some(reason) => CallEnd::Failed(reason),
                    None => CallEnd::Returned(output),
                }
            }
            end => end,
        };
        let claim = match store.data_mut().table().delete(resource) {
            Ok(claim) => claim,
            Err(_) => placeholder_claim(),
        };
        if let Some(instance) = instance
            && uses + 1 < reuse
        {
            *warm = Some(WarmInstance {
                store,
                instance,
                uses: uses + 1,
            });
        }
        (claim, end)
    }

    /// Runs an `agent` plugin's `run` on a fresh instance that starts with `first` and may claim
    /// up to `budget - 1` more dispatches through `claim-next`.
    pub async fn run_agent(&self, plugin: &Plugin, first: ClaimHandle, budget: u32) -> CallEnd {
        let PluginPre::Agent(pre) = &plugin.pre else {
            return CallEnd::Trapped {
                reason: "plugin is not an agent".into(),
                abort: None,
            };
        };
        let mut store = match self.new_store(plugin) {
            Ok(store) => store,
            Err(e) => {
                return CallEnd::Trapped {
                    reason: format!("{e:#}"),
                    abort: None,
                };
            }
        };
        store.data_mut().begin(&first);
        store.data_mut().first_claim = Some(first);
        store.data_mut().claims_left = budget.saturating_sub(1);
        let limit = (plugin.ctx.config.timeout + CALL_TIMEOUT_SLACK).saturating_mul(budget.max(1));
        let call = async {
            let instance = pre.instantiate_async(&mut store).await?;
            instance.call_run(&mut store).await
        };
        match tokio::time::timeout(limit, call).await {
            Ok(Ok(Ok(()))) => CallEnd::Returned(Vec::new()),
            Ok(Ok(Err(message))) => CallEnd::Failed(message),
            Ok(Err(trap)) => trapped(&store, trap),
            Err(_) => CallEnd::Trapped {
                reason: format!("timed out after {limit:?}"),
                abort: Some(Abort::Timeout),
            },
        }
    }
}

/// Describes a trap, preferring what the epoch callback or the limiter recorded.
fn trapped(store: &WasmStore<GuestState>, trap: wasmtime::Error) -> CallEnd {
    let data = store.data();
    let abort = data.abort;
    let reason = match abort {
        Some(Abort::Timeout) => format!("timed out after {:?}", data.plugin.config.timeout),
        Some(Abort::Cancelled(reason)) => format!("cancelled ({reason:?})"),
        None if data.limits.refused => format!(
            "memory limit of {} bytes reached: {trap:#}",
            data.plugin.config.memory
        ),
        None => format!("guest trapped: {trap:#}"),
    };
    CallEnd::Trapped { reason, abort }
}

/// A stand-in when a claim could not be recovered from the table (never expected): the
/// lease then runs out and maintenance reclaims the dispatch.
fn placeholder_claim() -> ClaimHandle {
    ClaimHandle {
        dispatch: crate::store::Dispatch {
            id: String::new(),
            agent: String::new(),
            thread: String::new(),
            run_id: String::new(),
            payload: Vec::new(),
            metadata: Default::default(),
            priority: 0,
            available_at: 0,
            dedupe_key: None,
            max_attempts: 1,
            attempt: 0,
            epoch: 0,
            status: crate::store::Status::Claimed,
            claim: None,
            started_at: None,
            result: None,
            last_error: None,
            created_at: 0,
            updated_at: 0,
            completed_at: None,
        },
        token: String::new(),
        settled: None,
        control: Default::default(),
        enqueued: 0,
        lease: None,
    }
}

/// The world a component implements, from its exports.
///
/// # Errors
///
/// When it exports neither `homing:agent/handle` nor `run`.
pub fn detect_world(engine: &Engine, component: &Component) -> anyhow::Result<World> {
    let ty = component.component_type();
    let exports: Vec<String> = ty
        .exports(engine)
        .map(|(name, _)| name.to_owned())
        .collect();
    if exports
        .iter()
        .any(|name| name.starts_with("homing:agent/handle@"))
    {
        Ok(World::Handler)
    } else if exports.iter().any(|name| name == "run") {
        Ok(World::Agent)
    } else {
        bail!(
            "component exports neither `homing:agent/handle` (handler world) nor `run` (agent world); it exports: {}",
            if exports.is_empty() {
                "nothing".to_owned()
            } else {
                exports.join(", ")
            }
        )
    }
}

/// The socket addresses a plugin's `allowed_hosts` resolve to.
fn resolve_allowed(config: &PluginConfig) -> anyhow::Result<Vec<SocketAddr>> {
    let mut out = Vec::new();
    for hostport in &config.allowed_hosts {
        let addrs = hostport
            .to_socket_addrs()
            .with_context(|| format!("allowed_hosts: cannot resolve `{hostport}`"))?;
        out.extend(addrs);
    }
    Ok(out)
}

/// The one wasmtime `Config` of the host. `pooling` is `(largest memory cap, instances)`.
fn engine_config(fuel: bool, pooling: Option<(u64, u32)>) -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    config.consume_fuel(fuel);
    if let Some((max_memory, instances)) = pooling {
        let mut pool = PoolingAllocationConfig::default();
        // Room for every worker's instance plus slack for instances being torn down.
        let components = instances.saturating_mul(2).clamp(16, 1_000);
        pool.total_component_instances(components);
        // Interpreted-language guests (Python, JS) carry many core modules per component.
        pool.max_core_instances_per_component(64);
        pool.max_memories_per_component(16);
        pool.max_tables_per_component(64);
        pool.total_core_instances(components.saturating_mul(16));
        pool.total_memories(components.saturating_mul(4));
        pool.total_tables(components.saturating_mul(16));
        pool.max_memory_size(usize::try_from(max_memory).unwrap_or(usize::MAX));
        // Reset small memories and tables with memset instead of madvise: a fresh instance per
        // dispatch otherwise pays a TLB shootdown across cores on every teardown (measured: the
        // largest kernel cost of the tokio workers end to end). Batched decommits do the same
        // for whatever lies beyond.
        pool.linear_memory_keep_resident(KEEP_RESIDENT);
        pool.table_keep_resident(KEEP_RESIDENT / 16);
        pool.decommit_batch_size(16);
        // With the kernel's PAGEMAP_SCAN (Linux 6.7+) the reset touches only the pages the
        // instance dirtied instead of memsetting all of `KEEP_RESIDENT`: the echo guest's
        // fresh-instance start went from 32 µs to 11 µs (its 1 MiB stack is mostly untouched).
        pool.pagemap_scan(wasmtime::Enabled::Auto);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    config
}
