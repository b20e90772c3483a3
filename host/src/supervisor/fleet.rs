//! The plugins a host serves and the versions of each it keeps: what live reload swaps.
//!
//! Each plugin name has a [`Slot`]: its loaded versions, newest first, at most `[host]
//! keep_versions` of them (a version is a component's content hash; a config-only change
//! replaces the newest in place, same version, new terms). Workers read their slot before every
//! claim: the newest version's context gives the claim's terms (limits, lease, concurrency), the
//! slot's [`Offer`] lists every kept version, and the store answers which one the claim runs
//! (docs/contract.md section 14). A reload builds the new plugins off the async workers and
//! installs them only when every one of them loaded: a component that fails to compile, link or
//! instantiate leaves its old version serving and the reason on its slot.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use anyhow::Context;

use crate::config::Config;
use crate::live::Hub;
use crate::runtime::host::{PluginContext, SHORT_VERSION, short_version};
use crate::runtime::{Plugin, Runtime};
use crate::store::{Offer, OfferedVersion, Store};

/// One plugin name and the versions of it this host keeps.
#[derive(Debug)]
pub struct Slot {
    /// The plugin's name.
    pub name: String,
    state: RwLock<SlotState>,
    /// Worker indexes running (a worker leaves, under this lock, when its index is past the
    /// concurrency or the plugin was removed).
    alive: Mutex<HashSet<u32>>,
}

#[derive(Debug)]
struct SlotState {
    /// Newest first.
    versions: Vec<Arc<Plugin>>,
    offer: Arc<Offer>,
    removed: bool,
    /// Why the last reload of this plugin left it as it was.
    error: Option<String>,
    /// When the newest version was installed.
    since: Instant,
}

/// What a worker claims with: the newest version (whose context sets the terms) and the offer
/// of every kept version.
#[derive(Debug, Clone)]
pub struct Current {
    /// The newest version.
    pub newest: Arc<Plugin>,
    /// Every kept version, newest first, under the newest's `pin`.
    pub offer: Arc<Offer>,
}

/// A slot as `/v1/agents` and the logs describe it.
#[derive(Debug, Clone)]
pub struct SlotView {
    /// The versions kept, newest first.
    pub versions: Vec<Arc<Plugin>>,
    /// Why the last reload left the plugin as it was.
    pub error: Option<String>,
    /// Removed by a reload: draining, claiming nothing.
    pub removed: bool,
}

impl Slot {
    fn new(plugin: Plugin) -> Slot {
        let plugin = Arc::new(plugin);
        Slot {
            name: plugin.ctx.name.clone(),
            state: RwLock::new(SlotState {
                offer: Arc::new(offer_of(std::slice::from_ref(&plugin))),
                versions: vec![plugin],
                removed: false,
                error: None,
                since: Instant::now(),
            }),
            alive: Mutex::new(HashSet::new()),
        }
    }

    /// The terms of the next claim, or `None` once the plugin was removed.
    pub fn current(&self) -> Option<Current> {
        let state = self.state.read().ok()?;
        if state.removed {
            return None;
        }
        Some(Current {
            newest: state.versions.first()?.clone(),
            offer: state.offer.clone(),
        })
    }

    /// The kept version whose short hash is `version`.
    pub fn version(&self, version: &str) -> Option<Arc<Plugin>> {
        let state = self.state.read().ok()?;
        // Compared on the hash's prefix: no short form is built on the claim path.
        state
            .versions
            .iter()
            .find(|p| p.sha256.get(..SHORT_VERSION) == Some(version))
            .cloned()
    }

    /// What the slot holds now.
    pub fn view(&self) -> SlotView {
        match self.state.read() {
            Ok(state) => SlotView {
                versions: state.versions.clone(),
                error: state.error.clone(),
                removed: state.removed,
            },
            Err(_) => SlotView {
                versions: Vec::new(),
                error: Some("the slot's lock was poisoned".into()),
                removed: false,
            },
        }
    }

    /// When the newest version was installed.
    pub fn since(&self) -> Option<Instant> {
        self.state.read().ok().map(|s| s.since)
    }

    /// Installs `plugin` as the newest version, keeping at most `keep` versions. Returns the
    /// newest it replaced when that was another version (a config-only change returns `None`).
    fn install(&self, plugin: Plugin, keep: usize) -> Option<Arc<Plugin>> {
        let Ok(mut state) = self.state.write() else {
            return None;
        };
        let plugin = Arc::new(plugin);
        let before = state.versions.first().cloned();
        let replaced = before.filter(|b| b.sha256 != plugin.sha256);
        state.versions.retain(|p| p.sha256 != plugin.sha256);
        state.versions.insert(0, plugin);
        state.versions.truncate(keep.max(1));
        state.offer = Arc::new(offer_of(&state.versions));
        state.removed = false;
        state.error = None;
        if replaced.is_some() {
            state.since = Instant::now();
        }
        // Agent-world runs on older versions are told `upgrade` and claim nothing more.
        for old in state.versions.iter().skip(1) {
            old.ctx.retired.store(true, Ordering::SeqCst);
        }
        if let Some(r) = &replaced {
            r.ctx.retired.store(true, Ordering::SeqCst);
        }
        replaced
    }

    fn fail(&self, error: String) {
        if let Ok(mut state) = self.state.write() {
            state.error = Some(error);
        }
    }

    fn remove(&self) {
        if let Ok(mut state) = self.state.write() {
            state.removed = true;
            for p in &state.versions {
                p.ctx.retired.store(true, Ordering::SeqCst);
            }
        }
    }

    /// The terms of worker `index`'s next claim, or `None` when it leaves (the plugin was
    /// removed, or `index` is past the concurrency). A worker that leaves is taken off the
    /// running set in the same step, so a reload that raises the concurrency again starts it
    /// anew.
    pub fn keep_worker(&self, index: u32) -> Option<Current> {
        let mut alive = self.alive.lock().ok()?;
        let current = self
            .current()
            .filter(|c| index < c.newest.ctx.config.concurrency);
        if current.is_none() {
            alive.remove(&index);
        }
        current
    }

    /// The worker indexes to start: those below the newest version's concurrency not running.
    fn workers_to_start(&self) -> Vec<u32> {
        let Some(current) = self.current() else {
            return Vec::new();
        };
        let Ok(mut alive) = self.alive.lock() else {
            return Vec::new();
        };
        (0..current.newest.ctx.config.concurrency)
            .filter(|i| alive.insert(*i))
            .collect()
    }
}

/// The offer of `versions` (newest first) under the newest's terms.
fn offer_of(versions: &[Arc<Plugin>]) -> Offer {
    let Some(newest) = versions.first() else {
        return Offer {
            versions: Vec::new(),
            pin: false,
            foreign_after_ms: 0,
        };
    };
    let mut offer = newest.ctx.offer_of(&newest.sha256);
    offer.versions = versions
        .iter()
        .map(|p| OfferedVersion {
            version: short_version(&p.sha256),
            label: p.ctx.config.version.clone(),
        })
        .collect();
    offer
}

/// What a host shares with every plugin context it builds.
#[derive(Debug, Clone)]
pub struct Shared {
    /// The store.
    pub store: Store,
    /// The live hub claims stream to.
    pub live: Hub,
    /// Set when the host is shutting down.
    pub shutdown: Arc<AtomicBool>,
}

/// Builds the context of plugin `name` of `config`.
///
/// # Errors
///
/// When the plugin's variables or secrets cannot be read.
pub fn context(config: &Config, name: &str, shared: &Shared) -> anyhow::Result<PluginContext> {
    let plugin_config = config
        .plugins
        .get(name)
        .with_context(|| format!("plugin `{name}` is not configured"))?;
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
    let target_debounce = plugin_config
        .enqueue_to
        .iter()
        .filter_map(|t| Some((t.clone(), crate::work::configured_debounce(config, t)?)))
        .collect();
    Ok(PluginContext {
        name: name.to_owned(),
        config: plugin_config.clone(),
        store: shared.store.clone(),
        consumer: format!("{}/{name}", config.host_id()),
        lease: config.host.lease,
        targets,
        target_keys,
        target_debounce,
        config_dir: config.base_dir.clone(),
        values: config.resolve_values(name)?,
        tls_ca: config.tls_ca_files(name),
        hosts: config.host.hosts.clone(),
        max_payload: config.host.max_payload,
        shutdown: shared.shutdown.clone(),
        public_url: config.api.public_url.clone(),
        live: shared.live.clone(),
        limits: crate::work::flow::limit_set(config, name),
        origin_limits: crate::work::flow::origin_limits(config, name),
        // Checked when the file was read: a table that does not parse meters nothing here.
        models: crate::config::pricing::origins(&config.pricing).unwrap_or_default(),
        drain_timeout: plugin_config.drain_timeout(&config.host),
        offer: std::sync::OnceLock::new(),
        retired: Arc::new(AtomicBool::new(false)),
    })
}

/// Loads plugin `name` of `config`: compiled (or read from the compiled cache), linked and
/// pre-instantiated.
///
/// # Errors
///
/// When any of those fails; the error names the plugin and the step.
pub fn load(
    runtime: &Runtime,
    config: &Config,
    name: &str,
    shared: &Shared,
) -> anyhow::Result<Plugin> {
    let ctx = Arc::new(context(config, name, shared)?);
    let path = config.resolve(&ctx.config.path);
    runtime.load_plugin(ctx, &path)
}

/// Every plugin a host serves, by name.
#[derive(Debug, Default)]
pub struct Fleet {
    slots: RwLock<BTreeMap<String, Arc<Slot>>>,
    /// Why the last reload found the config unreadable (nothing changed then).
    config_error: Mutex<Option<String>>,
}

/// What one reload did, per plugin.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// Plugins now on a new version (name, old short hash, new short hash).
    pub swapped: Vec<(String, String, String)>,
    /// Plugins whose terms changed but not their component.
    pub updated: Vec<String>,
    /// Plugins added.
    pub added: Vec<String>,
    /// Plugins removed (they drain).
    pub removed: Vec<String>,
    /// Plugins left as they were, and why.
    pub failed: Vec<(String, String)>,
}

impl Fleet {
    /// The fleet of `plugins`.
    pub fn of(plugins: Vec<Plugin>) -> Fleet {
        Fleet {
            slots: RwLock::new(
                plugins
                    .into_iter()
                    .map(|p| (p.ctx.name.clone(), Arc::new(Slot::new(p))))
                    .collect(),
            ),
            config_error: Mutex::new(None),
        }
    }

    /// Records why the last reload could not read the config (`None`: it could).
    pub fn config_failed(&self, error: Option<String>) {
        if let Ok(mut held) = self.config_error.lock() {
            *held = error;
        }
    }

    /// Why the last reload could not read the config, if it could not.
    pub fn config_error(&self) -> Option<String> {
        self.config_error.lock().ok().and_then(|e| e.clone())
    }

    /// Every slot, by name.
    pub fn slots(&self) -> Vec<Arc<Slot>> {
        self.slots
            .read()
            .map(|s| s.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The slot of `name`.
    pub fn slot(&self, name: &str) -> Option<Arc<Slot>> {
        self.slots.read().ok()?.get(name).cloned()
    }

    /// The newest version of every plugin still served.
    pub fn newest(&self) -> Vec<Arc<Plugin>> {
        self.slots()
            .iter()
            .filter_map(|s| s.current().map(|c| c.newest))
            .collect()
    }

    /// The worker indexes each slot should start (those not running).
    pub fn workers_to_start(&self) -> Vec<(Arc<Slot>, u32)> {
        self.slots()
            .into_iter()
            .flat_map(|slot| {
                slot.workers_to_start()
                    .into_iter()
                    .map(move |i| (slot.clone(), i))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Installs what `loaded` holds for each plugin of the new config (`only`: just that one):
    /// a loaded plugin becomes its slot's newest, a failure leaves the slot as it was with the
    /// reason, a plugin no longer configured is removed (it drains).
    pub fn install(
        &self,
        loaded: Vec<(String, anyhow::Result<Plugin>)>,
        configured: &HashSet<String>,
        only: Option<&str>,
        keep: usize,
    ) -> Reloaded {
        let mut out = Reloaded::default();
        let Ok(mut slots) = self.slots.write() else {
            return out;
        };
        for (name, result) in loaded {
            match (result, slots.get(&name)) {
                (Ok(plugin), Some(slot)) => {
                    let new = short_version(&plugin.sha256);
                    match slot.install(plugin, keep) {
                        Some(old) => {
                            out.swapped
                                .push((name.clone(), short_version(&old.sha256), new));
                        }
                        None => out.updated.push(name.clone()),
                    }
                }
                (Ok(plugin), None) => {
                    slots.insert(name.clone(), Arc::new(Slot::new(plugin)));
                    out.added.push(name.clone());
                }
                (Err(e), Some(slot)) => {
                    let why = format!("{e:#}");
                    slot.fail(why.clone());
                    out.failed.push((name.clone(), why));
                }
                (Err(e), None) => out.failed.push((name.clone(), format!("{e:#}"))),
            }
        }
        if only.is_none() {
            for (name, slot) in slots.iter() {
                if !configured.contains(name) && slot.current().is_some() {
                    slot.remove();
                    out.removed.push(name.clone());
                }
            }
        }
        out
    }
}

/// Loads the plugins of `config` a reload concerns (`only`: just that one), each independently.
pub fn load_all(
    runtime: &Runtime,
    config: &Config,
    only: Option<&str>,
    shared: &Shared,
) -> Vec<(String, anyhow::Result<Plugin>)> {
    config
        .plugins
        .keys()
        .filter(|name| only.is_none_or(|o| o == name.as_str()))
        .map(|name| (name.clone(), load(runtime, config, name, shared)))
        .collect()
}

/// The files a reload watches: the config file and every plugin's component.
pub fn watched_files(config: &Config) -> Vec<std::path::PathBuf> {
    let mut files = vec![Path::new(&config.source).to_path_buf()];
    files.extend(config.plugins.values().map(|p| config.resolve(&p.path)));
    files
}
