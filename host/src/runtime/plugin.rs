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

use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use tracing::info;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Engine, Store as WasmStore, UpdateDeadline};
use wasmtime_wasi::sockets::SocketAddrUse;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use super::host::{Abort, GuestState, JournalSlot, LogState, PluginContext, Secrets};
use super::outbound::Outbound;
use super::{Runtime, WasmContext, bindings, cache, output};
use crate::claim::StopReason;
use crate::claim::journal::RandomSource;
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

/// Which version of the `homing:agent` contract a component was built against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contract {
    /// `homing:agent@0.1.x`: served unchanged through the 0.2.0 implementation.
    V0_1,
    /// `homing:agent@0.2.x`: the current contract; `patch` is the highest 0.2 release the
    /// component names (0.2.1 added the MCP broker; 0.2.0 components link to it unchanged).
    V0_2 {
        /// 0 or 1.
        patch: u8,
    },
}

impl Contract {
    /// The package and version, as a component names it.
    pub fn name(self) -> &'static str {
        match self {
            Contract::V0_1 => "homing:agent@0.1.0",
            Contract::V0_2 { patch: 0 } => "homing:agent@0.2.0",
            Contract::V0_2 { .. } => "homing:agent@0.2.1",
        }
    }
}

/// A compiled, linked, pre-instantiated plugin.
pub struct Plugin {
    /// Shared context of its instances.
    pub ctx: Arc<PluginContext>,
    /// Its world.
    pub world: World,
    /// The contract version it was built against.
    pub contract: Contract,
    pub(super) pre: PluginPre,
    outbound: Arc<Outbound>,
    /// Its MCP servers, reached for its guests.
    mcp: Arc<super::mcp::McpBroker>,
    config_vars: Arc<wasmtime_wasi_config::WasiConfigVariables>,
    /// Its secret values, scrubbed from every line its instances log.
    secrets: Arc<Secrets>,
    /// The SHA-256 (hex) of the component bytes this plugin was compiled from.
    pub sha256: String,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.ctx.name)
            .field("world", &self.world)
            .field("contract", &self.contract)
            .finish_non_exhaustive()
    }
}

/// A plugin's pre-instantiated component, by contract and world.
pub(super) enum PluginPre {
    Handler(bindings::v0_2::handler::HandlerPre<GuestState>),
    Agent(bindings::v0_2::agent::AgentPre<GuestState>),
    HandlerV0_1(bindings::v0_1::handler::HandlerPre<GuestState>),
    AgentV0_1(bindings::v0_1::agent::AgentPre<GuestState>),
}

impl Runtime {
    /// Compiles (or loads from cache) and links the plugin at `path`.
    ///
    /// # Errors
    ///
    /// When the file is missing or not a component, exports neither world, or imports something
    /// the host does not provide.
    pub fn load_plugin(&self, ctx: Arc<PluginContext>, path: &Path) -> anyhow::Result<Plugin> {
        let (component, sha256) = cache::load(
            &self.engine,
            path,
            &self.cache_dir,
            &ctx.name,
            self.max_component_size,
        )?;
        let (world, contract, pre) = self.link(&ctx.name, path, &component)?;
        check_journal(&ctx.name, &ctx.config, world)?;
        let outbound = Arc::new(
            Outbound::new(&ctx.name, &ctx.config, &ctx.tls_ca, &ctx.hosts)
                .with_context(|| format!("plugin `{}`", ctx.name))?
                .with_flow(super::outbound::flow::Flow {
                    store: Some(ctx.store.clone()),
                    limits: ctx.origin_limits.clone(),
                    park_on: ctx.config.park_on.clone(),
                    max_park: ctx.config.max_park,
                })
                .with_models(ctx.models.clone()),
        );
        let mcp = Arc::new(super::mcp::McpBroker::new(
            &ctx.name,
            &ctx.config,
            &ctx.values,
            outbound.policy(),
        ));
        let config_vars = Arc::new(
            ctx.values
                .variables
                .iter()
                .map(|(k, v)| (k.as_str(), v.expose()))
                .collect(),
        );
        let secrets = Arc::new(Secrets::new(ctx.values.secrets()));
        // The first load of a context sets its version; a context is loaded once.
        let _ = ctx.offer.set(ctx.offer_of(&sha256));
        info!(
            plugin = %ctx.name,
            world = world.name(),
            contract = contract.name(),
            version = %super::host::short_version(&sha256),
            label = ctx.config.version.as_deref().unwrap_or(""),
            "plugin loaded"
        );
        Ok(Plugin {
            ctx,
            world,
            contract,
            pre,
            outbound,
            mcp,
            config_vars,
            secrets,
            sha256,
        })
    }

    /// Detects `component`'s world and contract version and links it exactly as `homing run`
    /// does: WASI p2, `wasi:http` (outgoing), `wasi:config/store` and that version's world's
    /// `homing:agent` imports.
    /// `homing config check` calls this too, so a component that passes the check starts.
    ///
    /// # Errors
    ///
    /// When the component exports neither world, names no contract version or two, or imports
    /// something the host does not serve (named, with what would provide it).
    pub(super) fn link(
        &self,
        name: &str,
        path: &Path,
        component: &Component,
    ) -> anyhow::Result<(World, Contract, PluginPre)> {
        let world = detect_world(&self.engine, component)
            .with_context(|| format!("plugin `{name}` ({})", path.display()))?;
        let contract = detect_contract(&self.engine, component)
            .with_context(|| format!("plugin `{name}` ({})", path.display()))?;
        let mut linker: Linker<GuestState> = Linker::new(&self.engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        wasmtime_wasi_config::add_to_linker(&mut linker, |s: &mut GuestState| {
            wasmtime_wasi_config::WasiConfig::from(&*s.config_vars)
        })?;
        match (contract, world) {
            (Contract::V0_2 { .. }, World::Handler) => {
                bindings::v0_2::handler::Handler::add_to_linker::<_, HasSelf<GuestState>>(
                    &mut linker,
                    |s| s,
                )?
            }
            (Contract::V0_2 { .. }, World::Agent) => bindings::v0_2::agent::Agent::add_to_linker::<
                _,
                HasSelf<GuestState>,
            >(&mut linker, |s| s)?,
            (Contract::V0_1, World::Handler) => bindings::v0_1::handler::Handler::add_to_linker::<
                _,
                HasSelf<GuestState>,
            >(&mut linker, |s| s)?,
            (Contract::V0_1, World::Agent) => bindings::v0_1::agent::Agent::add_to_linker::<
                _,
                HasSelf<GuestState>,
            >(&mut linker, |s| s)?,
        }
        let linked = match linker.instantiate_pre(component) {
            Ok(linked) => linked,
            Err(e) => {
                let unserved = unserved_imports(&self.engine, component);
                return Err(anyhow::Error::from(e).context(if unserved.is_empty() {
                    format!("plugin `{name}`: cannot link {}", path.display())
                } else {
                    format!(
                        "plugin `{name}`: cannot link {}: it imports {}, which this host does not \
                         serve. The host serves WASI 0.2 (cli, clocks, filesystem, random, \
                         sockets, io), wasi:http/outgoing-handler (grant origins with \
                         `allowed_outbound_hosts`), wasi:config/store (`[plugins.{name}.variables]`) \
                         and homing:agent; rebuild the component without the others",
                        path.display(),
                        unserved.join(", ")
                    )
                }));
            }
        };
        let pre = match (contract, world) {
            (Contract::V0_2 { .. }, World::Handler) => {
                PluginPre::Handler(bindings::v0_2::handler::HandlerPre::new(linked)?)
            }
            (Contract::V0_2 { .. }, World::Agent) => {
                PluginPre::Agent(bindings::v0_2::agent::AgentPre::new(linked)?)
            }
            (Contract::V0_1, World::Handler) => {
                PluginPre::HandlerV0_1(bindings::v0_1::handler::HandlerPre::new(linked)?)
            }
            (Contract::V0_1, World::Agent) => {
                PluginPre::AgentV0_1(bindings::v0_1::agent::AgentPre::new(linked)?)
            }
        };
        Ok((world, contract, pre))
    }

    /// Checks plugin `name` as `homing run` would load it, without running it: the component
    /// compiles (or loads from the cache), exports a world, links, and its TLS files read.
    ///
    /// # Errors
    ///
    /// As [`Runtime::load_plugin`].
    pub fn check_plugin(
        &self,
        name: &str,
        config: &PluginConfig,
        path: &Path,
        tls_ca: &[std::path::PathBuf],
        hosts: &std::collections::BTreeMap<String, std::net::IpAddr>,
    ) -> anyhow::Result<(World, Contract)> {
        let (component, _) = cache::load(
            &self.engine,
            path,
            &self.cache_dir,
            name,
            self.max_component_size,
        )?;
        let (world, contract, _) = self.link(name, path, &component)?;
        check_journal(name, config, world)?;
        let outbound = Outbound::new(name, config, tls_ca, hosts)
            .with_context(|| format!("plugin `{name}`"))?;
        // Warns when a guest's grants reach one of its MCP servers around the broker.
        super::mcp::McpBroker::new(name, config, &Default::default(), outbound.policy());
        Ok((world, contract))
    }

    /// A fresh store for one instance of `plugin`, with its grants and limits.
    ///
    /// # Errors
    ///
    /// When a granted directory cannot be opened or fuel cannot be set.
    pub fn new_store(&self, plugin: &Plugin) -> anyhow::Result<WasmStore<GuestState>> {
        self.new_store_for(plugin, None)
    }

    /// [`Runtime::new_store`] for the run of one dispatch: under `journal = "run"`, the
    /// instance's `wasi:random/insecure-seed` is derived from the dispatch's id (`dispatch`),
    /// so every run of the dispatch reads the same seed (a hash map's keys in Rust's standard
    /// library come from it) and a replay builds the same requests.
    ///
    /// # Errors
    ///
    /// As [`Runtime::new_store`].
    pub fn new_store_for(
        &self,
        plugin: &Plugin,
        dispatch: Option<&str>,
    ) -> anyhow::Result<WasmStore<GuestState>> {
        let config = &plugin.ctx.config;
        let log = Arc::new(Mutex::new(LogState {
            secrets: plugin.secrets.clone(),
            ..LogState::default()
        }));
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
        for (key, value) in &plugin.ctx.values.env {
            wasi.env(key, value.expose());
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
        let policy = plugin.outbound.policy().clone();
        if policy.grants_tcp() {
            // Outbound TCP to the allow-list only, decided by the plugin's network policy (as
            // outbound HTTP is). A connect first binds implicitly to the wildcard address with
            // port 0; that bind is allowed, any explicit bind or listen is not (a guest serves
            // no one).
            wasi.allow_tcp(true);
            wasi.allow_ip_name_lookup(true);
            let plugin_name = plugin.ctx.name.clone();
            wasi.socket_addr_check(move |addr, use_| {
                let policy = policy.clone();
                let plugin_name = plugin_name.clone();
                Box::pin(async move {
                    match use_ {
                        SocketAddrUse::TcpConnect => {
                            let allowed = policy.allows_tcp(addr).await;
                            if !allowed {
                                tracing::warn!(plugin = %plugin_name, %addr, "outbound TCP connect refused: not an address of allowed_hosts");
                            }
                            allowed
                        }
                        SocketAddrUse::TcpBind => addr.ip().is_unspecified() && addr.port() == 0,
                        _ => false,
                    }
                })
            });
        }
        let http = plugin.outbound.hooks(log.clone());
        // Under `journal = "run"` the wall clock and random sources read through the current
        // claim's journal, so a replayed run reads what its earlier run read.
        let journal_slot = (config.journal == crate::config::JournalMode::Run).then(|| {
            let slot = JournalSlot::default();
            wasi.wall_clock(slot.wall_clock());
            wasi.secure_random(slot.random(RandomSource::Secure));
            wasi.insecure_random(slot.random(RandomSource::Insecure));
            if let Some(dispatch) = dispatch {
                wasi.insecure_random_seed(seed_of(dispatch));
            }
            slot
        });
        let mut state = GuestState::new(wasi.build(), plugin.ctx.clone(), log)
            .with_grants(http, plugin.config_vars.clone())
            .with_mcp(plugin.mcp.clone());
        state.journal_slot = journal_slot;
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

/// Refuses `journal = "run"` for an agent-world component: its one instance serves many
/// claims in a loop, so no replay can start a claim's run from its beginning.
fn check_journal(name: &str, config: &PluginConfig, world: World) -> anyhow::Result<()> {
    if config.journal == crate::config::JournalMode::Run && world == World::Agent {
        bail!(
            "plugins.{name}.journal: \"run\" is for handler-world components (one run per \
             dispatch); this one is an agent world, whose instance serves many claims in a loop. \
             Use journal = \"steps\" and memoize with steps"
        );
    }
    Ok(())
}

/// The `wasi:random/insecure-seed` of the runs of `dispatch` under `journal = "run"`: the
/// first 16 bytes of the SHA-256 of its id.
fn seed_of(dispatch: &str) -> u128 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(dispatch.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    u128::from_le_bytes(bytes)
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

/// The contract versions this host serves, for error messages.
const SERVED_CONTRACTS: &str = "homing:agent 0.1.x and 0.2.0 to 0.2.1";

/// The `homing:agent` contract version `component` was built against, from the versions its
/// `homing:agent/...@x.y.z` imports and exports name.
///
/// # Errors
///
/// When it names none, two tracks (0.1 and 0.2 at once), or a track this host does not serve.
pub fn detect_contract(engine: &Engine, component: &Component) -> anyhow::Result<Contract> {
    let ty = component.component_type();
    let names = ty
        .imports(engine)
        .map(|(name, _)| name.to_owned())
        .chain(ty.exports(engine).map(|(name, _)| name.to_owned()));
    let mut versions: Vec<String> = names
        .filter_map(|name| {
            let rest = name.strip_prefix("homing:agent/")?;
            rest.split_once('@').map(|(_, version)| version.to_owned())
        })
        .collect();
    versions.sort();
    versions.dedup();
    contract_of(&versions)
}

/// The contract a component's `homing:agent` versions (sorted, distinct) name.
fn contract_of(versions: &[String]) -> anyhow::Result<Contract> {
    let track = |version: &str| -> Option<Contract> {
        let mut parts = version.split('.');
        let (major, minor) = (parts.next()?, parts.next()?);
        let patch = parts.next()?;
        // A prerelease or build suffix is another track (wasmtime matches only releases).
        if !patch.bytes().all(|b| b.is_ascii_digit()) || parts.next().is_some() {
            return None;
        }
        match (major, minor) {
            ("0", "1") => Some(Contract::V0_1),
            ("0", "2") => match patch {
                "0" => Some(Contract::V0_2 { patch: 0 }),
                "1" => Some(Contract::V0_2 { patch: 1 }),
                _ => None,
            },
            _ => None,
        }
    };
    let Some(first) = versions.first() else {
        bail!(
            "component names no homing:agent interface with a version; build it against              {SERVED_CONTRACTS}"
        );
    };
    let mut contract = None;
    for version in versions {
        let Some(this) = track(version) else {
            bail!(
                "component is built against homing:agent {version}; this host serves                  {SERVED_CONTRACTS}"
            );
        };
        match contract {
            // Patches of one track mix (the latest names the contract).
            Some(Contract::V0_2 { patch: seen }) if matches!(this, Contract::V0_2 { patch } if patch >= seen) => {
                contract = Some(this)
            }
            Some(Contract::V0_2 { .. }) if matches!(this, Contract::V0_2 { .. }) => {}
            Some(seen) if seen != this => bail!(
                "component imports homing:agent at {first} and {version}; build it against one"
            ),
            _ => contract = Some(this),
        }
    }
    contract.ok_or_else(|| anyhow::anyhow!("component names no homing:agent version"))
}

/// The interfaces the host serves, as import-name prefixes.
const SERVED: &[&str] = &[
    "wasi:cli/",
    "wasi:clocks/",
    "wasi:filesystem/",
    "wasi:io/",
    "wasi:random/",
    "wasi:sockets/",
    "wasi:http/types@0.2.",
    "wasi:http/outgoing-handler@0.2.",
    "wasi:config/store@0.2.",
    "homing:agent/",
];

/// The imports of `component` the host does not serve, by name, for the error that explains
/// why linking failed.
fn unserved_imports(engine: &Engine, component: &Component) -> Vec<String> {
    component
        .component_type()
        .imports(engine)
        .filter(|(name, _)| {
            let wasi_02 = !name.starts_with("wasi:") || name.contains("@0.2.");
            !(wasi_02 && SERVED.iter().any(|p| name.starts_with(p)))
        })
        .map(|(name, _)| format!("`{name}`"))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn of(versions: &[&str]) -> Result<Contract, String> {
        let versions: Vec<String> = versions.iter().map(|v| (*v).to_owned()).collect();
        contract_of(&versions).map_err(|e| e.to_string())
    }

    #[test]
    fn a_component_names_one_served_contract() {
        assert_eq!(of(&["0.1.0"]), Ok(Contract::V0_1));
        assert_eq!(of(&["0.2.0"]), Ok(Contract::V0_2 { patch: 0 }));
        assert_eq!(of(&["0.2.0", "0.2.1"]), Ok(Contract::V0_2 { patch: 1 }));
        assert!(of(&["0.2.9"]).unwrap_err().contains("0.2.0 to 0.2.1"));
        let both = of(&["0.1.0", "0.2.0"]).unwrap_err();
        assert!(both.contains("0.1.0 and 0.2.0"), "{both}");
        let later = of(&["0.3.0"]).unwrap_err();
        assert!(
            later.contains("0.3.0") && later.contains("0.1.x and 0.2.0 to 0.2.1"),
            "{later}"
        );
        let major = of(&["1.0.0"]).unwrap_err();
        assert!(major.contains("1.0.0"), "{major}");
        assert!(of(&["0.2.0-rc.1"]).is_err());
        assert!(of(&[]).unwrap_err().contains("no homing:agent"));
    }
}
