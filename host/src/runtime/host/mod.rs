//! The host side of the WIT imports, one file per interface, and the per-instance state they
//! share.
//!
//! - [`GuestState`] (here): the data of one wasmtime `Store`, one guest instance: WASI, the
//!   resource table the guest's claims live in, its limits, its log budget, and what the epoch
//!   callback reads (the deadline and the current claim's stop request);
//! - [`PluginContext`] (here): what every instance of one plugin shares;
//! - `claim`: the `claim` resource of `mailbox` (reads, fenced writes, settlement);
//! - `mailbox`: `mailbox.enqueue` and the checks every follow-up request passes;
//! - `queue`: the `agent` world's `claim-next`;
//! - `mcp`: `mcp-tools` and `mcp-call` on the claim, through the plugin's MCP broker;
//! - `v0_1`: `homing:agent@0.1.0`, converted to and from the 0.2.0 implementation above;
//! - `log`: the `log` interface and every guest log line, scrubbed of secrets, escaped and
//!   budgeted;
//! - `policy`: the caps of one dispatch, the one cap on guest bytes, and store errors as the
//!   guest sees them.
//!
//! The host adds what the store cannot know: the backoff policy, the enqueue allow-list, and
//! caps on what one dispatch may do (enqueues, log volume, read sizes). The `types` interface
//! has no functions.

mod cheap;
mod claim;
mod journaled;
mod log;
mod mailbox;
mod mcp;
mod policy;
mod queue;
mod v0_1;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_config::WasiConfigVariables;
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::bindings::types;
use super::limits::MemoryLimiter;
use super::outbound::{HttpHooks, Outbound};
/// The host representation of a guest's `claim` resource.
pub use crate::claim::ClaimHandle;
use crate::claim::{ClaimControl, Claimer, StopReason};
use crate::config::PluginConfig;
use crate::config::vars::Resolved;
use crate::store::Store;
pub use cheap::JournalSlot;
pub use claim::dispatch_info;
pub use log::{LogState, LogTag, REDACTED, Secrets, escape_log_text};
pub use policy::{
    MAX_CLAIM_WAIT, MAX_ENQUEUE_DELAY, MAX_ENQUEUES_PER_CLAIM, MAX_LOG_LINE, MAX_LOG_LINES,
    MAX_READ, MAX_STEP_KEY, check_returned_output, guest_error, max_payload_warning,
};

/// Shared by every instance of one plugin.
#[derive(Debug)]
pub struct PluginContext {
    /// The plugin (agent) name.
    pub name: String,
    /// Its config.
    pub config: PluginConfig,
    /// The store.
    pub store: Store,
    /// `claimed_by` for this plugin's claims.
    pub consumer: String,
    /// Lease length of claims.
    pub lease: Duration,
    /// Max attempts of each plugin the guest may enqueue to (target name, default).
    pub targets: Vec<(String, u32)>,
    /// Where each target the guest may enqueue to takes a dispatch's concurrency key from when
    /// the request names none (its `concurrency_key`).
    pub target_keys: std::collections::BTreeMap<String, crate::config::limits::KeySource>,
    /// The debounce of each target's enqueues that ask for none (its `[plugins.x.debounce]`).
    pub target_debounce: std::collections::BTreeMap<String, crate::store::model::Debounce>,
    /// The largest payload a follow-up may carry.
    pub max_payload: u64,
    /// The directory relative grant paths resolve against (the config file's).
    pub config_dir: PathBuf,
    /// Its `variables` and `env`, read from where they come from.
    pub values: Resolved,
    /// The CA files its HTTPS requests trust besides the web roots.
    pub tls_ca: Vec<PathBuf>,
    /// `[host] hosts`: names with fixed addresses.
    pub hosts: std::collections::BTreeMap<String, std::net::IpAddr>,
    /// Set when the host is shutting down.
    pub shutdown: Arc<AtomicBool>,
    /// `[api] public_url`: the base of waitpoint callback URLs.
    pub public_url: Option<String>,
    /// The host's live hub: where its claims stream (`emit`).
    pub live: crate::live::Hub,
    /// The limits its claims honour (`[plugins.x] rate`, `key_concurrency`, `limits`, ...).
    pub limits: crate::store::LimitSet,
    /// The limits its outbound requests honour (`[limits.x]` with `origins`).
    pub origin_limits: Vec<crate::work::flow::OriginLimit>,
    /// The model APIs whose calls it meters (`[pricing."ORIGIN"]`).
    pub models: Vec<crate::config::pricing::ModelOrigin>,
    /// How long a dispatch pinned to a version no claimer here runs is left for the hosts that
    /// run it (`[host] drain_timeout`, else the plugin's timeout).
    pub drain_timeout: Duration,
    /// This context's version, offered alone (set once its component is loaded): what the
    /// claims of its agent-world runs record and are pinned by.
    pub offer: std::sync::OnceLock<crate::store::Offer>,
    /// Set once a newer version replaced this one (or the plugin was removed): its agent-world
    /// runs are told `upgrade` and claim nothing more.
    pub retired: Arc<AtomicBool>,
}

impl PluginContext {
    /// The context of a plugin run outside a supervisor (benchmarks, probes): a 30 s lease, no
    /// enqueue targets, a 1 MiB payload cap, never shutting down.
    pub fn standalone(name: &str, config: PluginConfig, store: Store, config_dir: PathBuf) -> Self {
        PluginContext {
            name: name.to_owned(),
            config,
            consumer: format!("standalone/{name}"),
            lease: Duration::from_secs(30),
            targets: Vec::new(),
            target_keys: Default::default(),
            target_debounce: Default::default(),
            max_payload: 1 << 20,
            config_dir,
            values: Resolved::default(),
            tls_ca: Vec::new(),
            hosts: Default::default(),
            shutdown: Default::default(),
            live: crate::live::Hub::new(&store, crate::live::LiveSettings::default()),
            store,
            public_url: None,
            limits: Default::default(),
            origin_limits: Vec::new(),
            models: Vec::new(),
            drain_timeout: Duration::from_secs(30),
            offer: std::sync::OnceLock::new(),
            retired: Default::default(),
        }
    }

    /// The offer of one version of this plugin: its content hash (`sha256`, hex) in short form
    /// and its label, under its `pin`.
    pub fn offer_of(&self, sha256: &str) -> crate::store::Offer {
        crate::store::Offer {
            versions: vec![crate::store::OfferedVersion {
                version: short_version(sha256),
                label: self.config.version.clone(),
            }],
            pin: self.config.pin == crate::config::Pin::Run,
            foreign_after_ms: crate::store::millis(self.drain_timeout),
        }
    }

    /// This plugin as the claim layer sees it: whose dispatches it claims, as whom, with what
    /// lease and backoff.
    pub fn claimer(&self) -> Claimer<'_> {
        Claimer {
            store: &self.store,
            agent: &self.name,
            consumer: &self.consumer,
            lease: self.lease,
            retry: &self.config.retry,
            limits: &self.limits,
            journal: crate::claim::JournalSettings {
                mode: self.config.journal,
                max_bytes: self.config.journal_max_bytes,
            },
            offer: self.offer.get(),
        }
    }
}

/// How many hex digits of a component's SHA-256 name its version.
pub const SHORT_VERSION: usize = 12;

/// The short form of a content hash: its first [`SHORT_VERSION`] hex digits.
pub fn short_version(sha256: &str) -> String {
    sha256.chars().take(SHORT_VERSION).collect()
}

/// Why a call into the guest was cut short by the epoch callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abort {
    /// The per-dispatch time limit passed.
    Timeout,
    /// The claim must stop (interrupt or lost lease).
    Cancelled(StopReason),
}

/// The data of one wasmtime `Store`: one guest instance.
pub struct GuestState {
    wasi: WasiCtx,
    table: ResourceTable,
    /// The memory cap.
    pub limits: MemoryLimiter,
    /// The plugin this instance belongs to.
    pub plugin: Arc<PluginContext>,
    /// The log tag and budget, shared with stdout/stderr.
    pub log: Arc<Mutex<LogState>>,
    /// The current dispatch's deadline.
    pub deadline: Option<Instant>,
    /// The current claim's control, for the epoch callback.
    pub control: Option<Arc<ClaimControl>>,
    /// Set by the epoch callback when it ends a call.
    pub abort: Option<Abort>,
    /// `agent` world: dispatches this instance may still claim.
    pub claims_left: u32,
    /// `agent` world: a dispatch the host claimed before starting the instance.
    pub first_claim: Option<ClaimHandle>,
    http_ctx: WasiHttpCtx,
    /// The instance's outbound HTTP: grants, caps, and the current claim's deadline.
    pub http: HttpHooks,
    /// What `wasi:config/store` answers.
    pub config_vars: Arc<WasiConfigVariables>,
    /// Under `journal = "run"`: the journal its wall clock and random sources read through.
    pub journal_slot: Option<JournalSlot>,
    /// The plugin's MCP broker (`mcp-tools`, `mcp-call`).
    pub mcp: Arc<crate::runtime::mcp::McpBroker>,
    /// How many calls with each identity each dispatch's run made here (names their approval
    /// waitpoints: the same call twice in a run is approved twice).
    mcp_seen: std::collections::HashMap<String, u32>,
}

impl std::fmt::Debug for GuestState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestState")
            .field("plugin", &self.plugin.name)
            .finish_non_exhaustive()
    }
}

impl WasiView for GuestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for GuestState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http_ctx,
            table: &mut self.table,
            hooks: &mut self.http,
        }
    }
}

impl GuestState {
    /// A fresh state for one instance, with no outbound HTTP and no variables (see
    /// [`GuestState::with_grants`]).
    pub fn new(wasi: WasiCtx, plugin: Arc<PluginContext>, log: Arc<Mutex<LogState>>) -> Self {
        let http = Arc::new(Outbound::deny_all(&plugin.name)).hooks(log.clone());
        GuestState {
            http_ctx: WasiHttpCtx::new(),
            http,
            config_vars: Arc::new(WasiConfigVariables::new()),
            wasi,
            table: ResourceTable::new(),
            limits: MemoryLimiter::new(plugin.config.memory),
            plugin,
            log,
            deadline: None,
            control: None,
            abort: None,
            claims_left: 0,
            first_claim: None,
            journal_slot: None,
            mcp: Arc::default(),
            mcp_seen: Default::default(),
        }
    }

    /// Gives the instance its plugin's outbound grants and variables.
    pub fn with_grants(mut self, http: HttpHooks, config_vars: Arc<WasiConfigVariables>) -> Self {
        self.http = http;
        self.config_vars = config_vars;
        self
    }

    /// Gives the instance its plugin's MCP broker.
    pub fn with_mcp(mut self, mcp: Arc<crate::runtime::mcp::McpBroker>) -> Self {
        self.mcp = mcp;
        self
    }

    /// The resource table (claims live here while the guest holds them).
    pub fn table(&mut self) -> &mut ResourceTable {
        &mut self.table
    }

    /// Starts work on `claim`: sets the deadline, the control the epoch callback reads and the
    /// log tag.
    pub fn begin(&mut self, claim: &ClaimHandle) {
        // Approvals are numbered per run: a new claim counts its calls from the start.
        self.mcp_seen.clear();
        self.deadline = Some(Instant::now() + self.plugin.config.timeout);
        self.control = Some(claim.control().clone());
        self.http.deadline = self.deadline;
        self.http.control = self.control.clone();
        self.http.traceparent = claim.dispatch().metadata.get("traceparent").cloned();
        self.http.journal = claim
            .journal()
            .cloned()
            .filter(|recorder| recorder.journals_calls());
        self.http.usage = Some(claim.usage().clone());
        if let Some(slot) = &self.journal_slot {
            slot.set(self.http.journal.clone());
        }
        if let Ok(mut log) = self.log.lock() {
            log.begin(LogTag {
                dispatch: claim.dispatch().id.clone(),
                attempt: claim.dispatch().attempt,
            });
        }
    }
}

impl types::Host for GuestState {}
