//! Plugins: a component compiled once, its world detected from its exports, linked against
//! WASI p2 and the `homing:agent` imports, and pre-instantiated; and the fresh store each of
//! its instances runs in, with the plugin's grants and limits.
//!
//! A plugin is compiled once (or loaded from the on-disk cache, see [`cache`](super::cache)).
//! WASI is deny-by-default: no environment, no preopened directories, no network, no inherited
//! stdio; the plugin's config grants each. Guest stdout and stderr become log lines tagged with
//! plugin, dispatch and attempt.
//!
//! Each store's epoch callback, run on every tick of the engine's epoch, ends the guest's call
//! when its claim must stop (an interrupt or a lost lease: every write would be refused) or
//! its deadline passed, and records why in [`GuestState::abort`]; otherwise it yields to tokio.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use tracing::info;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Engine, Store as WasmStore, UpdateDeadline};
use wasmtime_wasi::sockets::SocketAddrUse;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use super::host::{Abort, GuestState, LogState, PluginContext};
use super::{Runtime, WasmContext, bindings, cache, output};
use crate::claim::StopReason;
use crate::config::PluginConfig;

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

/// A compiled, linked, pre-instantiated plugin.
pub struct Plugin {
    /// Shared context of its instances.
    pub ctx: Arc<PluginContext>,
    /// Its world.
    pub world: World,
    pub(super) pre: PluginPre,
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

/// A plugin's pre-instantiated component, by world.
pub(super) enum PluginPre {
    Handler(bindings::handler::HandlerPre<GuestState>),
    Agent(bindings::agent::AgentPre<GuestState>),
}

impl Runtime {
    /// Compiles (or loads from cache) and links the plugin at `path`.
    ///
    /// # Errors
    ///
    /// When the file is missing or not a component, exports neither world, or imports something
    /// the host does not provide.
    pub fn load_plugin(&self, ctx: Arc<PluginContext>, path: &Path) -> anyhow::Result<Plugin> {
        let component = cache::load(
            &self.engine,
            path,
            &self.cache_dir,
            &ctx.name,
            self.max_component_size,
        )?;
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
                let reason = control.stop_reason().unwrap_or(StopReason::LeaseLost);
                data.abort = Some(Abort::Cancelled(reason));
                return Err(wasmtime::format_err!(
                    "cancelled: {:?}",
                    bindings::StopReason::from(reason)
                ));
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
