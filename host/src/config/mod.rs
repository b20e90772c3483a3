//! `homing.toml`: the one file that configures a host.
//!
//! Three sections: `[host]` (identity, leases, maintenance), `[store]` (which backend and where)
//! and `[plugins.<name>]` (one per agent). Unknown keys and bad values are errors that name the
//! file, the line and the key, because a typo that is silently ignored (a `timout` that leaves
//! a guest unbounded) is worse than a refusal. Durations and sizes are human strings ("30s",
//! "64MiB"). Relative paths are relative to the config file's directory. A few keys can be
//! overridden from the environment (`HOMING_HOST_ID`; `HOMING_STORE_PATH` for an embedded store,
//! `HOMING_NATS_URL` for a NATS one), for scripts and
//! containers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub mod api;
pub mod limits;
pub mod mcp;
pub mod outbound;
pub mod pricing;
pub mod schedules;
mod store;
pub mod telemetry;
mod units;
pub mod vars;

pub use api::ApiConfig;
use limits::Rate;
pub use outbound::{HttpLimits, OutboundHost};
pub use store::{
    Backend, DEFAULT_NATS_URL, EmbeddedSettings, NatsSettings, StoreConfig, UrlCredentials, Urls,
    check_nats, shown_nats_url, shown_nats_urls, split_nats_url,
};
pub use telemetry::TelemetryConfig;
use units::{duration, optional_duration, optional_size, size};
pub use units::{parse_duration, parse_size};

/// A config error, with the file it came from.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {message}")]
pub struct ConfigError {
    /// The config file.
    pub file: String,
    /// What was wrong, with line and key when known.
    pub message: String,
}

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[host]`.
    #[serde(default)]
    pub host: HostConfig,
    /// `[store]`.
    #[serde(default)]
    pub store: StoreConfig,
    /// `[plugins.<name>]`.
    #[serde(default)]
    pub plugins: BTreeMap<String, PluginConfig>,
    /// `[api]`: the HTTP API (off unless `listen` is set).
    #[serde(default)]
    pub api: ApiConfig,
    /// `[telemetry]`: trace export (off unless an OTLP endpoint is set).
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// `[limits.<name>]`: limits shared by the plugins that list them.
    #[serde(default)]
    pub limits: BTreeMap<String, limits::LimitConfig>,
    /// `[schedules.<name>]`: agents that run on a calendar.
    #[serde(default)]
    pub schedules: BTreeMap<String, schedules::ScheduleConfig>,
    /// `[pricing."ORIGIN"]`: model APIs the host reads the calls of (format, provider).
    #[serde(default)]
    pub pricing: BTreeMap<String, pricing::PricingConfig>,
    /// The directory relative paths resolve against (the config file's).
    #[serde(skip)]
    pub base_dir: PathBuf,
    /// Where the config came from.
    #[serde(skip)]
    pub source: String,
}

/// The most messages a thread may have pending when `[host] max_inbox` is not set.
pub const DEFAULT_MAX_INBOX: u64 = 1_000;

/// The most bytes one claim may stream when `[host] max_stream_bytes` is not set.
pub const DEFAULT_MAX_STREAM_BYTES: u64 = 4 << 20;

/// The most deltas per second one claim may stream when `[host] max_emit_rate` is not set.
pub const DEFAULT_MAX_EMIT_RATE: u32 = 100_000;

/// How many versions of a plugin a host keeps loaded when `[host] keep_versions` is not set.
pub const DEFAULT_KEEP_VERSIONS: u32 = 3;

/// The longest `[plugins.x] version` label.
pub const MAX_VERSION_LABEL: usize = 64;

/// How many times a dispatch may come back from waiting when its plugin's `max_resumes` is
/// not set.
pub const DEFAULT_MAX_RESUMES: u32 = 100;

/// `[host]`: this host's identity and its maintenance cadence.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HostConfig {
    /// The host's id in `claimed_by` (default: hostname and process id).
    pub id: Option<String>,
    /// Lease length of a claim; renewed at a third of it while the guest runs.
    #[serde(deserialize_with = "duration")]
    pub lease: Duration,
    /// How often the sweeper reclaims expired leases and purges old records.
    #[serde(deserialize_with = "duration")]
    pub sweep_interval: Duration,
    /// How long terminal dispatches are kept before purge.
    #[serde(deserialize_with = "duration")]
    pub retention: Duration,
    /// On SIGINT/SIGTERM, how long in-flight dispatches may finish before they are released.
    #[serde(deserialize_with = "duration")]
    pub shutdown_grace: Duration,
    /// Where compiled components are cached (default `.homing/cache` next to the config).
    pub cache_dir: Option<PathBuf>,
    /// The pooling allocator: `auto` (use it when the machine allows), `on`, `off`.
    pub pooling: Pooling,
    /// The largest payload a dispatch may carry (enqueued by the CLI or by a guest).
    #[serde(deserialize_with = "size")]
    pub max_payload: u64,
    /// The largest inbox message (default: `max_payload`); clamped to what the store holds.
    #[serde(deserialize_with = "optional_size")]
    pub max_message: Option<u64>,
    /// The most messages a thread may have pending (unacknowledged); a send beyond is refused.
    pub max_inbox: u64,
    /// How long after its run a dispatch's streamed deltas stay readable.
    #[serde(deserialize_with = "duration")]
    pub stream_retention: Duration,
    /// The most bytes one claim may stream (`emit`); past it `emit` is refused.
    #[serde(deserialize_with = "size")]
    pub max_stream_bytes: u64,
    /// The most deltas per second one claim may stream (a burst of one second's worth).
    pub max_emit_rate: u32,
    /// The largest component file a plugin `path` may name; larger ones are refused before
    /// they are read.
    #[serde(deserialize_with = "size")]
    pub max_component_size: u64,
    /// How log lines are written: `text` for people, `json` for log shippers
    /// (`HOMING_LOG_FORMAT` overrides it).
    pub log_format: LogFormat,
    /// Certificate authorities (a PEM file) every plugin's HTTPS requests trust, besides the
    /// built-in web roots: a company proxy's, a local model server's.
    pub tls_ca: Option<PathBuf>,
    /// Fixed addresses for names, used before DNS by outbound requests and the TCP grant
    /// (like `/etc/hosts`, for this host's guests only): `{ "models.internal" = "10.0.0.5" }`.
    /// The address rules still apply: a name pinned to a private address is reachable only
    /// when `allowed_outbound_hosts` names that address.
    pub hosts: BTreeMap<String, std::net::IpAddr>,
    /// After a plugin is reloaded, how long a dispatch still running on the version it replaced
    /// may finish before it is stopped and given back to the queue, counting no attempt; also
    /// how long a dispatch pinned to a version no host runs waits before the newest takes it
    /// (default: the plugin's `timeout`).
    #[serde(deserialize_with = "optional_duration")]
    pub drain_timeout: Option<Duration>,
    /// How many versions of each plugin a host keeps loaded, the newest included, so a dispatch
    /// that started on an older one resumes on it.
    pub keep_versions: u32,
    /// Reload when `homing.toml` or a plugin's component file changes (a debounced watch).
    /// SIGHUP and `POST /v1/agents/{agent}/reload` reload with or without it.
    pub watch: bool,
}

/// `[host] log_format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One line of text per event.
    #[default]
    Text,
    /// One JSON object per event.
    Json,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            id: None,
            lease: Duration::from_secs(30),
            sweep_interval: Duration::from_secs(5),
            retention: Duration::from_secs(7 * 24 * 3600),
            shutdown_grace: Duration::from_secs(10),
            cache_dir: None,
            pooling: Pooling::Auto,
            max_payload: 1 << 20,
            max_message: None,
            max_inbox: DEFAULT_MAX_INBOX,
            stream_retention: Duration::from_secs(3600),
            max_stream_bytes: DEFAULT_MAX_STREAM_BYTES,
            max_emit_rate: DEFAULT_MAX_EMIT_RATE,
            max_component_size: DEFAULT_MAX_COMPONENT_SIZE,
            log_format: LogFormat::Text,
            tls_ca: None,
            hosts: BTreeMap::new(),
            drain_timeout: None,
            keep_versions: DEFAULT_KEEP_VERSIONS,
            watch: true,
        }
    }
}

/// Whether to use wasmtime's pooling allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    /// Use it when the machine allows the address-space reservation.
    #[default]
    Auto,
    /// Require it.
    On,
    /// On-demand allocation.
    Off,
}

/// `[plugins.<name>]`: one agent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    /// The component file (`.wasm`).
    pub path: PathBuf,
    /// How many dispatches of this plugin run at once.
    #[serde(default = "default_concurrency")]
    pub concurrency: u32,
    /// Cap on the guest's total linear memory.
    #[serde(default = "default_memory", deserialize_with = "size")]
    pub memory: u64,
    /// Wall-clock limit per dispatch (guest CPU and host calls alike).
    #[serde(default = "default_timeout", deserialize_with = "duration")]
    pub timeout: Duration,
    /// Optional fuel (instructions, roughly) per dispatch; unlimited when absent.
    #[serde(default)]
    pub fuel: Option<u64>,
    /// Failed attempts before a dispatch dead-letters, for dispatches that name none.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// Backoff between attempts.
    #[serde(default)]
    pub retry: RetryPolicy,
    /// Dispatches one instance may serve before it is replaced (1: a fresh instance each time).
    #[serde(default = "default_reuse")]
    pub reuse_instance: u32,
    /// Environment variables the guest sees (none by default): text, or taken from the
    /// host's environment or a file.
    #[serde(default)]
    pub env: BTreeMap<String, vars::ValueSpec>,
    /// Values the guest reads through `wasi:config/store` (none by default), some secret.
    #[serde(default)]
    pub variables: BTreeMap<String, vars::ValueSpec>,
    /// Host directories the guest may open.
    #[serde(default)]
    pub dirs: Vec<DirGrant>,
    /// Outbound TCP the guest may open, as `host:port` (none by default); checked when the
    /// config is, and read with [`outbound::tcp_grants`].
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Origins the guest may send HTTP requests to through `wasi:http` (none by default).
    #[serde(default)]
    pub allowed_outbound_hosts: Vec<OutboundHost>,
    /// Certificate authorities (a PEM file) trusted for this plugin's HTTPS requests, besides
    /// the built-in web roots and `[host] tls_ca`.
    #[serde(default)]
    pub tls_ca: Option<PathBuf>,
    /// Caps on outbound HTTP requests.
    #[serde(default)]
    pub http: HttpLimits,
    /// Agents this plugin may enqueue follow-up work to.
    #[serde(default)]
    pub enqueue_to: Vec<String>,
    /// How many times one dispatch may come back from waiting on its waitpoints; a suspend
    /// past it is refused (`denied`).
    #[serde(default = "default_max_resumes")]
    pub max_resumes: u32,
    /// What the host keeps of a dispatch's runs so a retry or a resume does not ask again:
    /// `"off"`, `"steps"` (the guest's `step-put` values) or `"run"` (steps, and every
    /// outbound HTTP exchange, log read and append and enqueue, replayed in order).
    #[serde(default)]
    pub journal: JournalMode,
    /// The most one dispatch's journal holds; past it nothing more is recorded for that run.
    #[serde(default = "default_journal_max_bytes", deserialize_with = "size")]
    pub journal_max_bytes: u64,
    /// Where a dispatch's concurrency key comes from when its enqueue names none
    /// (`"meta:<metadata key>"`).
    #[serde(default)]
    pub concurrency_key: Option<limits::KeySource>,
    /// At most this many dispatches with one concurrency key run at once, across every host.
    #[serde(default)]
    pub key_concurrency: Option<u32>,
    /// At most this rate of claims per concurrency key (`"10/min"`).
    #[serde(default, deserialize_with = "limits::rate")]
    pub key_rate: Option<Rate>,
    /// `key_rate`'s burst (default: its count).
    #[serde(default)]
    pub key_burst: Option<u32>,
    /// Turns per key when claims rotate across keys (default 1 each).
    #[serde(default)]
    pub key_weights: BTreeMap<String, u32>,
    /// At most this rate of claims of the plugin, across every host (`"60/min"`).
    #[serde(default, deserialize_with = "limits::rate")]
    pub rate: Option<Rate>,
    /// `rate`'s burst (default: its count).
    #[serde(default)]
    pub burst: Option<u32>,
    /// Named limits (`[limits.<name>]`) this plugin's claims or outbound requests honour.
    #[serde(default)]
    pub limits: Vec<String>,
    /// Outbound response statuses that park the run until the response's `Retry-After`
    /// (capped at `max_park`) instead of failing it: no attempt is counted.
    #[serde(default)]
    pub park_on: Vec<u16>,
    /// The longest a run is parked.
    #[serde(default = "default_max_park", deserialize_with = "duration")]
    pub max_park: Duration,
    /// A label for the component's version (`"2.3.1"`), shown beside its content hash and
    /// recorded with each claim that ran it.
    #[serde(default)]
    pub version: Option<String>,
    /// `"run"`: a dispatch that ran goes back to the version it ran on (while a host keeps it);
    /// `"none"`: every claim takes the newest.
    #[serde(default)]
    pub pin: Pin,
    /// How messages addressed to this agent meet a busy thread (`[plugins.x.inbox]`).
    #[serde(default)]
    pub inbox: PluginInbox,
    /// The debounce of an enqueue to this agent that asks for none (`[plugins.x.debounce]`).
    #[serde(default)]
    pub debounce: Option<PluginDebounce>,
    /// Whether the agent is served as a model on the OpenAI-compatible endpoint
    /// (`[plugins.x.openai]`).
    #[serde(default)]
    pub openai: PluginOpenAi,
    /// Whether the agent is served as a tool at `POST /mcp` (`[plugins.x.mcp_server]`).
    #[serde(default)]
    pub mcp_server: PluginMcpServer,
    /// MCP servers whose tools its guests call through the host (`[plugins.x.mcp.NAME]`).
    #[serde(default)]
    pub mcp: BTreeMap<String, mcp::McpServer>,
}

/// `[plugins.x.mcp_server]`: the agent as a tool of the MCP endpoint (`POST /mcp`, under
/// `[api]`'s tokens). Not served unless `expose` is set. A call's arguments, as JSON, are the
/// dispatch's payload.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PluginMcpServer {
    /// Listed by `tools/list` and callable.
    #[serde(default)]
    pub expose: bool,
    /// What the tool does, for the model that picks tools (default: a line naming the agent).
    #[serde(default)]
    pub description: Option<String>,
    /// The JSON Schema of the tool's arguments (an object schema, as a TOML table; default:
    /// any object).
    #[serde(default)]
    pub input_schema: Option<toml::Value>,
}

/// `[plugins.x.openai]`: the agent as a model of the OpenAI-compatible endpoint
/// (`/openai/v1/chat/completions`, under `[api]`'s tokens). Not served unless `expose` is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PluginOpenAi {
    /// Listed at `/openai/v1/models` and answering as the model named as the agent.
    #[serde(default)]
    pub expose: bool,
}

/// `[plugins.x.inbox]`: what a message addressed to the agent does when its thread is busy,
/// and how long a turn it starts waits for more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PluginInbox {
    /// `"enqueue"`, `"steer"`, `"reject"`, `"interrupt"`, `"rollback"` or `"merge"` (default: as the
    /// message's kind says, a
    /// follow-up waiting for the next turn); a message's own `on_busy` wins, and so does a
    /// message sent as a steer.
    #[serde(default)]
    pub on_busy: Option<BusyPolicy>,
    /// A message that starts a turn on an idle thread waits this long for more messages, each
    /// of which joins the turn and waits this long again (a chat user's quick second and
    /// third messages make one turn). Default: the turn starts at once.
    #[serde(default, deserialize_with = "optional_duration")]
    pub follow_up_quiet: Option<Duration>,
    /// ... but no longer than this after the first (default: ten times `follow_up_quiet`, at
    /// most seven days).
    #[serde(default, deserialize_with = "optional_duration")]
    pub follow_up_max_wait: Option<Duration>,
}

impl PluginInbox {
    /// The follow-up window, in milliseconds (quiet, max wait), when `follow_up_quiet` is set.
    pub fn follow_up_window(&self) -> Option<(u64, u64)> {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let quiet = ms(self.follow_up_quiet?);
        let max_wait = self
            .follow_up_max_wait
            .map_or_else(|| quiet.saturating_mul(10).min(MAX_WINDOW_WAIT_MS), ms);
        Some((quiet, max_wait))
    }
}

/// The longest a debounce window may stay open (`max_wait`): seven days.
pub const MAX_WINDOW_WAIT_MS: u64 = 7 * 24 * 3_600_000;
/// The most items a debounce window may gather (`max_items`).
pub const MAX_WINDOW_ITEMS: u32 = 10_000;
/// The longest debounce key, in bytes.
pub const MAX_WINDOW_KEY: usize = 256;

/// Checks a debounce window's settings (the config's and the store's, which names its fields
/// `debounce.<field>`): a key of 1 to [`MAX_WINDOW_KEY`] bytes, `max_wait` of 1 ms to seven
/// days, `quiet` no longer than it, 1 to [`MAX_WINDOW_ITEMS`] items.
///
/// # Errors
///
/// A sentence starting with `prefix` and the field's name.
pub fn check_window(
    prefix: &str,
    key: &str,
    quiet_ms: u64,
    max_wait_ms: u64,
    max_items: u32,
) -> Result<(), String> {
    if key.is_empty() {
        return Err(format!("{prefix}key is empty"));
    }
    if key.len() > MAX_WINDOW_KEY {
        return Err(format!(
            "{prefix}key: {} bytes; at most {MAX_WINDOW_KEY}",
            key.len()
        ));
    }
    if max_wait_ms == 0 || max_wait_ms > MAX_WINDOW_WAIT_MS {
        return Err(format!(
            "{prefix}max_wait: {max_wait_ms} ms is outside 1 ms to 7 days"
        ));
    }
    if quiet_ms > max_wait_ms {
        return Err(format!(
            "{prefix}quiet: {quiet_ms} ms is longer than max_wait ({max_wait_ms} ms), so the \
             window would never wait for quiet"
        ));
    }
    if max_items == 0 || max_items > MAX_WINDOW_ITEMS {
        return Err(format!(
            "{prefix}max_items: {max_items} is outside 1 to {MAX_WINDOW_ITEMS}"
        ));
    }
    Ok(())
}

/// `[plugins.x.debounce]`: the debounce an enqueue to the agent gets when it asks for none
/// (the API's, the CLI's and a guest's; a schedule's and the inbox's follow-ups are not
/// debounced by it).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginDebounce {
    /// The window's key on its thread (default `"default"`).
    #[serde(default = "default_debounce_key")]
    pub key: String,
    /// Due this long after the latest enqueue ...
    #[serde(deserialize_with = "duration")]
    pub quiet: Duration,
    /// ... and no later than this after the first (at most seven days).
    #[serde(deserialize_with = "duration")]
    pub max_wait: Duration,
    /// `"last"` (default), `"first"` or `"collect"`.
    #[serde(default)]
    pub payload: DebouncePayload,
    /// Sealed and due at once at this many enqueues (default 100).
    #[serde(default = "default_max_items")]
    pub max_items: u32,
}

fn default_debounce_key() -> String {
    "default".to_owned()
}

fn default_max_items() -> u32 {
    100
}

/// `[plugins.x.debounce] payload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DebouncePayload {
    /// The latest enqueue's payload.
    #[default]
    Last,
    /// The first's.
    First,
    /// Every enqueue's, as the claim's items.
    Collect,
}

/// `[plugins.x.inbox] on_busy`: the config's names of the store's policies (the config sits
/// below the store, so it keeps its own; `work::messages` maps them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BusyPolicy {
    /// Wait for the next turn.
    Enqueue,
    /// Go to the live run.
    Steer,
    /// Refuse while a run holds the thread.
    Reject,
    /// Stop the run that holds the thread and start a turn with the message.
    Interrupt,
    /// As `Interrupt`, and mask what the stopped run wrote to the thread log.
    Rollback,
    /// As `Rollback`, and hand the next turn the messages the stopped run had taken.
    Merge,
}

/// `[plugins.x] pin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Pin {
    /// A run stays on the version it started on.
    #[default]
    Run,
    /// Every claim takes the newest version.
    None,
}

impl PluginConfig {
    /// How long a run on a replaced version may finish (`[host] drain_timeout`, else this
    /// plugin's `timeout`).
    pub fn drain_timeout(&self, host: &HostConfig) -> Duration {
        host.drain_timeout.unwrap_or(self.timeout)
    }
}

fn default_max_park() -> Duration {
    limits::DEFAULT_MAX_PARK
}

/// `[plugins.x] journal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum JournalMode {
    /// Nothing is kept: `step-put` stores nothing, every call goes live.
    #[default]
    Off,
    /// The guest's steps are kept.
    Steps,
    /// Steps, and the run's calls, replayed by a later run of the same dispatch.
    Run,
}

impl JournalMode {
    /// Whether steps are kept.
    pub fn keeps_steps(self) -> bool {
        self != JournalMode::Off
    }
}

/// The default `journal_max_bytes`: 16 MiB.
pub const DEFAULT_JOURNAL_MAX_BYTES: u64 = 16 * 1024 * 1024;

fn default_journal_max_bytes() -> u64 {
    DEFAULT_JOURNAL_MAX_BYTES
}

fn default_max_resumes() -> u32 {
    DEFAULT_MAX_RESUMES
}

fn default_concurrency() -> u32 {
    4
}
fn default_memory() -> u64 {
    64 * 1024 * 1024
}
fn default_timeout() -> Duration {
    Duration::from_secs(30)
}
/// The default `[host] max_component_size`: room for the Python and JavaScript agents (whose
/// components carry an interpreter, tens of MiB) several times over.
pub const DEFAULT_MAX_COMPONENT_SIZE: u64 = 256 << 20;

/// Attempts a dispatch gets when neither it nor its plugin names a number.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;

fn default_max_attempts() -> u32 {
    DEFAULT_MAX_ATTEMPTS
}
fn default_reuse() -> u32 {
    1
}

/// A preopened directory.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirGrant {
    /// The directory on the host.
    pub host: PathBuf,
    /// Where the guest sees it.
    pub guest: String,
    /// Whether the guest may write.
    #[serde(default)]
    pub writable: bool,
}

/// Exponential backoff with jitter: `initial * multiplier^attempt`, capped at `max`, spread by
/// up to `jitter` of itself either way.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryPolicy {
    /// The first delay.
    #[serde(deserialize_with = "duration")]
    pub initial: Duration,
    /// The cap.
    #[serde(deserialize_with = "duration")]
    pub max: Duration,
    /// Growth per attempt.
    pub multiplier: f64,
    /// Fraction of random spread (0 to 1).
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(300),
            multiplier: 2.0,
            jitter: 0.2,
        }
    }
}

impl RetryPolicy {
    /// The delay before retry number `attempt + 1` (attempt counts failures so far), taking the
    /// guest's hint as a lower bound but never beyond `max`.
    pub fn delay(&self, attempt: u32, hint: Option<Duration>) -> Duration {
        let base =
            self.initial.as_secs_f64() * self.multiplier.max(1.0).powi(attempt.min(64) as i32);
        let base = base.min(self.max.as_secs_f64());
        let jitter = self.jitter.clamp(0.0, 1.0);
        let spread = if jitter > 0.0 {
            1.0 + jitter * (fastrand::f64() * 2.0 - 1.0)
        } else {
            1.0
        };
        let mut delay = Duration::from_secs_f64((base * spread).max(0.0));
        if let Some(hint) = hint {
            delay = delay.max(hint);
        }
        delay.min(self.max)
    }
}

impl Config {
    /// Reads and checks the file at `path`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the file, and the line and key when the problem is in the text.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let err = |message: String| ConfigError {
            file: path.display().to_string(),
            message,
        };
        let bytes = crate::input::read_file_capped(
            path,
            crate::input::MAX_CONFIG_SIZE,
            "the config file",
            "the config size limit",
        )
        .map_err(|e| err(e.to_string()))?;
        let text = String::from_utf8(bytes).map_err(|e| {
            err(format!(
                "not UTF-8 (at byte {})",
                e.utf8_error().valid_up_to()
            ))
        })?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Config::parse(&text, &path.display().to_string(), &base)
    }

    /// Parses config text; `source` names it in errors and `base_dir` anchors relative paths.
    ///
    /// # Errors
    ///
    /// As [`Config::load`].
    pub fn parse(text: &str, source: &str, base_dir: &Path) -> Result<Config, ConfigError> {
        let err = |message: String| ConfigError {
            file: source.to_owned(),
            message,
        };
        let mut config: Config =
            toml::from_str(text).map_err(|e| err(describe_toml_error(text, &e)))?;
        config.base_dir = if base_dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            base_dir.to_path_buf()
        };
        config.source = source.to_owned();
        if let Ok(id) = std::env::var("HOMING_HOST_ID") {
            config.host.id = Some(id);
        }
        // Each override applies to its own backend only.
        match &mut config.store {
            StoreConfig::Embedded(embedded) => {
                if let Ok(path) = std::env::var("HOMING_STORE_PATH") {
                    embedded.path = Some(PathBuf::from(path));
                }
            }
            StoreConfig::Nats(nats) => {
                if let Ok(url) = std::env::var("HOMING_NATS_URL") {
                    nats.url = Some(Urls::One(url));
                }
            }
        }
        config.check().map_err(err)?;
        config.check_limits().map_err(|(table, key, message)| {
            let line = limits::line_of(text, &table, &key)
                .map(|n| format!("line {n}: "))
                .unwrap_or_default();
            let key = if key.is_empty() {
                format!("[{table}]")
            } else {
                format!("[{table}] {key}")
            };
            err(format!("{line}{key}: {message}"))
        })?;
        schedules::find_lines(text, &mut config.schedules);
        schedules::check(&config.schedules, &config.plugins).map_err(|(table, key, message)| {
            let line = config
                .schedules
                .get(table.trim_start_matches("schedules."))
                .map(|s| s.at_line(&key))
                .unwrap_or_default();
            err(format!("{line}[{table}] {key}: {message}"))
        })?;
        Ok(config)
    }

    fn check(&self) -> Result<(), String> {
        self.api.check()?;
        self.telemetry.check()?;
        pricing::origins(&self.pricing)
            .map_err(|(origin, why)| format!("[pricing.\"{origin}\"] {why}"))?;
        if let StoreConfig::Nats(nats) = &self.store {
            check_nats(
                &nats.urls(),
                &nats.prefix,
                nats.replicas,
                [nats.connect_timeout, nats.request_timeout],
            )
            .map_err(|e| format!("[store] {e}"))?;
        }
        if self.host.lease < Duration::from_millis(100) {
            return Err("[host] lease: must be at least 100ms".into());
        }
        if self.host.sweep_interval.is_zero() {
            return Err("[host] sweep_interval: must be more than 0".into());
        }
        if self.host.max_inbox == 0 {
            return Err("[host] max_inbox: must be at least 1".into());
        }
        if self.host.stream_retention.is_zero() {
            return Err("[host] stream_retention: must be more than 0".into());
        }
        if self.host.max_stream_bytes == 0 {
            return Err("[host] max_stream_bytes: must be at least 1 byte".into());
        }
        if self.host.max_emit_rate == 0 {
            return Err("[host] max_emit_rate: must be at least 1".into());
        }
        if self.host.max_message == Some(0) {
            return Err("[host] max_message: must be at least 1 byte".into());
        }
        if self.api.mcp.call_wait.is_zero() {
            return Err("[api.mcp] call_wait: must be more than 0".into());
        }
        for origin in &self.api.mcp.allowed_origins {
            let shaped = origin
                .strip_prefix("https://")
                .or_else(|| origin.strip_prefix("http://"))
                .is_some_and(|rest| !rest.is_empty() && !rest.contains(['/', '?', '#', ' ']));
            if !shaped {
                return Err(format!(
                    "[api.mcp] allowed_origins: `{}` is not an origin (scheme://host[:port], no path)",
                    origin.escape_debug()
                ));
            }
        }
        if self.host.keep_versions == 0 {
            return Err(
                "[host] keep_versions: must be at least 1 (the version being served)".into(),
            );
        }
        if self.host.drain_timeout.is_some_and(|d| d.is_zero()) {
            return Err("[host] drain_timeout: must be more than 0".into());
        }
        for (name, plugin) in &self.plugins {
            let key = |k: &str| format!("[plugins.{name}] {k}");
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(format!(
                    "[plugins.{name}]: a plugin name may hold only letters, digits, `-` and `_`"
                ));
            }
            if plugin.concurrency == 0 {
                return Err(format!("{}: must be at least 1", key("concurrency")));
            }
            if let Some(schema) = &plugin.mcp_server.input_schema {
                let object = schema
                    .as_table()
                    .and_then(|t| t.get("type"))
                    .and_then(toml::Value::as_str)
                    == Some("object");
                if !object {
                    return Err(format!(
                        "[plugins.{name}.mcp_server] input_schema: must be a JSON Schema of an \
                         object (a table with type = \"object\"): a tool's arguments are an object"
                    ));
                }
            }
            if plugin.mcp_server.expose && name.len() > 128 {
                return Err(format!(
                    "[plugins.{name}.mcp_server] expose: an MCP tool name is at most 128 characters"
                ));
            }
            if let Some(d) = &plugin.debounce {
                let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
                check_window("", &d.key, ms(d.quiet), ms(d.max_wait), d.max_items)
                    .map_err(|e| format!("[plugins.{name}.debounce] {e}"))?;
            }
            if plugin.inbox.follow_up_max_wait.is_some() && plugin.inbox.follow_up_quiet.is_none() {
                return Err(format!(
                    "[plugins.{name}.inbox] follow_up_max_wait: set follow_up_quiet too (without it a \
                     turn starts at once and nothing waits)"
                ));
            }
            if let Some((quiet, max_wait)) = plugin.inbox.follow_up_window() {
                check_window("follow_up_", "follow-up", quiet, max_wait, 1)
                    .map_err(|e| format!("[plugins.{name}.inbox] {e}"))?;
            }
            if let Some(label) = &plugin.version
                && (label.trim().is_empty()
                    || label.len() > MAX_VERSION_LABEL
                    || label.chars().any(char::is_control))
            {
                return Err(format!(
                    "{}: a label of 1 to {MAX_VERSION_LABEL} bytes with no control characters",
                    key("version")
                ));
            }
            if plugin.memory < 64 * 1024 {
                return Err(format!(
                    "{}: must be at least 64KiB (one wasm page)",
                    key("memory")
                ));
            }
            if plugin.timeout.is_zero() {
                return Err(format!("{}: must be more than 0", key("timeout")));
            }
            if plugin.max_attempts == 0 {
                return Err(format!("{}: must be at least 1", key("max_attempts")));
            }
            if plugin.max_resumes == 0 {
                return Err(format!("{}: must be at least 1", key("max_resumes")));
            }
            if plugin.reuse_instance == 0 {
                return Err(format!("{}: must be at least 1", key("reuse_instance")));
            }
            if plugin.journal == JournalMode::Run && plugin.reuse_instance > 1 {
                return Err(format!(
                    "{}: \"run\" needs a fresh instance per dispatch (a replay starts the guest \
                     from the beginning); set reuse_instance = 1 or journal = \"steps\"",
                    key("journal")
                ));
            }
            if plugin.journal_max_bytes == 0 {
                return Err(format!("{}: must be more than 0", key("journal_max_bytes")));
            }
            if !(plugin.retry.multiplier >= 1.0 && plugin.retry.multiplier.is_finite()) {
                return Err(format!(
                    "{}: must be a number of at least 1",
                    key("retry.multiplier")
                ));
            }
            if !(0.0..=1.0).contains(&plugin.retry.jitter) {
                return Err(format!("{}: must be between 0 and 1", key("retry.jitter")));
            }
            for target in &plugin.enqueue_to {
                if !self.plugins.contains_key(target) {
                    return Err(format!(
                        "{}: `{target}` is not a configured plugin",
                        key("enqueue_to")
                    ));
                }
            }
            outbound::tcp_grants(&plugin.allowed_hosts)
                .map_err(|e| format!("{}: {e}", key("allowed_hosts")))?;
            for (var, spec) in &plugin.variables {
                vars::check_variable_name(var).map_err(|e| format!("{}: {e}", key("variables")))?;
                spec.check()
                    .map_err(|e| format!("{} `{var}` {e}", key("variables")))?;
            }
            for (var, spec) in &plugin.env {
                if var.is_empty() || var.contains(['=', '\0']) {
                    return Err(format!("{}: `{var}` is not a variable name", key("env")));
                }
                spec.check()
                    .map_err(|e| format!("{} `{var}` {e}", key("env")))?;
            }
            plugin.http.check().map_err(|e| key(&e))?;
            for (server, config) in &plugin.mcp {
                mcp::check_name(server).map_err(|e| format!("{}: {e}", key("mcp")))?;
                config.check(&format!("[plugins.{name}.mcp.{server}]"))?;
            }
            for dir in &plugin.dirs {
                if !dir.guest.starts_with('/') {
                    return Err(format!(
                        "{}: guest path `{}` must be absolute",
                        key("dirs"),
                        dir.guest
                    ));
                }
            }
        }
        Ok(())
    }

    /// Reads the values of plugin `name`'s `variables` and `env` from where they come from.
    /// `homing run` and `homing config check` call it; the other commands never need them.
    ///
    /// # Errors
    ///
    /// A required value that is not set, naming the plugin, the variable and where it was
    /// looked for; never a value.
    pub fn resolve_values(&self, name: &str) -> Result<vars::Resolved, ConfigError> {
        let err = |message: String| ConfigError {
            file: self.source.clone(),
            message,
        };
        let Some(plugin) = self.plugins.get(name) else {
            return Err(err(format!("[plugins.{name}]: no such plugin")));
        };
        Ok(vars::Resolved {
            variables: vars::resolve_all(
                &plugin.variables,
                &format!("[plugins.{name}.variables]"),
                &self.base_dir,
            )
            .map_err(err)?,
            env: vars::resolve_all(
                &plugin.env,
                &format!("[plugins.{name}.env]"),
                &self.base_dir,
            )
            .map_err(err)?,
            mcp: vars::resolve_all(
                &plugin
                    .mcp
                    .iter()
                    .filter_map(|(server, c)| {
                        Some((server.clone(), c.auth.as_ref()?.credential()?.clone()))
                    })
                    .collect(),
                &format!("[plugins.{name}.mcp] auth of"),
                &self.base_dir,
            )
            .map_err(err)?
            .into_iter()
            .map(|(server, value)| (server, value.into_secret()))
            .collect(),
        })
    }

    /// The CA files plugin `name`'s HTTPS requests trust besides the web roots, resolved.
    pub fn tls_ca_files(&self, name: &str) -> outbound::CaFiles {
        let plugin = self.plugins.get(name).and_then(|p| p.tls_ca.as_ref());
        self.host
            .tls_ca
            .iter()
            .chain(plugin)
            .map(|p| self.resolve(p))
            .collect()
    }

    /// Resolves a path from the file against the config's directory.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.base_dir.join(path)
        }
    }

    /// The embedded store's file, when the store is embedded.
    pub fn store_path(&self) -> Option<PathBuf> {
        match &self.store {
            StoreConfig::Embedded(embedded) => Some(self.embedded_path(embedded)),
            StoreConfig::Nats(_) => None,
        }
    }

    /// The file of an embedded store with `settings` (default `homing.db` next to the config).
    pub fn embedded_path(&self, settings: &EmbeddedSettings) -> PathBuf {
        match &settings.path {
            Some(path) => self.resolve(path),
            None => self.base_dir.join("homing.db"),
        }
    }

    /// The compiled-component cache directory.
    pub fn cache_dir(&self) -> PathBuf {
        match &self.host.cache_dir {
            Some(path) => self.resolve(path),
            None => self.base_dir.join(".homing").join("cache"),
        }
    }

    /// This host's id.
    pub fn host_id(&self) -> String {
        self.host.id.clone().unwrap_or_else(|| {
            // A host name is at most 255 bytes; anything else in the file is not one.
            let name = crate::input::read_file_capped(
                Path::new("/etc/hostname"),
                255,
                "the host name file",
                "the host name limit",
            )
            .ok()
            .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "host".to_owned());
            format!("{name}-{}", std::process::id())
        })
    }
}

/// Turns a toml error into "line N, key K: message".
fn describe_toml_error(text: &str, err: &toml::de::Error) -> String {
    let message = err.message().to_owned();
    let Some(span) = err.span() else {
        return message;
    };
    let mut line = text
        .get(..span.start.min(text.len()))
        .unwrap_or_default()
        .matches('\n')
        .count()
        + 1;
    // An error found while reading a whole table (`[store]`) points at the table; for an
    // unknown key, point at the key's own line within it instead.
    if let Some(key) = message
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split('`').next())
        && let Some(found) = text.lines().enumerate().skip(line - 1).find_map(|(i, l)| {
            let l = l.trim_start();
            (l.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with('=')))
            .then_some(i + 1)
        })
    {
        line = found;
    }
    let snippet = text
        .lines()
        .nth(line - 1)
        .map(str::trim)
        .unwrap_or_default();
    format!("line {line} (`{snippet}`): {message}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, "homing.toml", Path::new("/etc/homing"))
    }

    #[test]
    fn debounce_settings_are_checked_at_load_naming_the_field() {
        let with = |extra: &str| parse(&format!("[plugins.a]\npath = \"a.wasm\"\n{extra}"));
        let ok = with(
            "[plugins.a.debounce]\nquiet = \"2s\"\nmax_wait = \"10s\"\npayload = \"collect\"\n\
             [plugins.a.inbox]\nfollow_up_quiet = \"1s\"\n",
        )
        .unwrap();
        let a = &ok.plugins["a"];
        assert_eq!(a.debounce.as_ref().map(|d| d.key.as_str()), Some("default"));
        assert_eq!(a.inbox.follow_up_window(), Some((1_000, 10_000)));
        for (extra, named) in [
            (
                "[plugins.a.debounce]\nquiet = \"20s\"\nmax_wait = \"10s\"\n",
                "[plugins.a.debounce] quiet",
            ),
            (
                "[plugins.a.debounce]\nquiet = \"1s\"\nmax_wait = \"8d\"\n",
                "[plugins.a.debounce] max_wait",
            ),
            (
                "[plugins.a.debounce]\nquiet = \"1s\"\nmax_wait = \"2s\"\nmax_items = 0\n",
                "[plugins.a.debounce] max_items",
            ),
            (
                "[plugins.a.inbox]\nfollow_up_quiet = \"5s\"\nfollow_up_max_wait = \"1s\"\n",
                "[plugins.a.inbox] follow_up_quiet",
            ),
            (
                "[plugins.a.inbox]\nfollow_up_max_wait = \"1s\"\n",
                "[plugins.a.inbox] follow_up_max_wait",
            ),
        ] {
            let e = with(extra).unwrap_err().to_string();
            assert!(e.contains(named), "{e}");
        }
        let e =
            with("[plugins.a.debounce]\nquiet = \"1s\"\nmax_wait = \"2s\"\npayload = \"all\"\n")
                .unwrap_err()
                .to_string();
        assert!(e.contains("payload"), "{e}");
    }

    #[test]
    fn durations_and_sizes_parse_in_human_units() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(
            parse_duration("7d").unwrap(),
            Duration::from_secs(7 * 86400)
        );
        assert!(parse_duration("5 parsecs").is_err());
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("10MB").unwrap(), 10_000_000);
        assert!(parse_size("12 furlongs").is_err());
    }

    #[test]
    fn unknown_key_names_file_line_and_key() {
        let err = parse("[host]\nlease = \"10s\"\ntimout = \"5s\"\n").unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("homing.toml: line 3"), "{text}");
        assert!(text.contains("timout"), "{text}");
    }

    #[test]
    fn bad_duration_names_line_and_value() {
        let err =
            parse("[plugins.echo]\npath = \"echo.wasm\"\ntimeout = \"forever\"\n").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("line 3"), "{text}");
        assert!(text.contains("forever"), "{text}");
    }

    #[test]
    fn the_journal_keys_parse_and_their_refusals_name_the_key() {
        let config = parse("[plugins.a]\npath = \"a.wasm\"\n").unwrap();
        assert_eq!(config.plugins["a"].journal, JournalMode::Off);
        assert_eq!(
            config.plugins["a"].journal_max_bytes,
            DEFAULT_JOURNAL_MAX_BYTES
        );
        let config = parse(
            "[plugins.a]\npath = \"a.wasm\"\njournal = \"run\"\njournal_max_bytes = \"1MiB\"\n",
        )
        .unwrap();
        assert_eq!(config.plugins["a"].journal, JournalMode::Run);
        assert_eq!(config.plugins["a"].journal_max_bytes, 1 << 20);
        let err = parse("[plugins.a]\npath = \"a.wasm\"\njournal = \"always\"\n").unwrap_err();
        assert!(err.to_string().contains("always"), "{err}");
        let err = parse("[plugins.a]\npath = \"a.wasm\"\njournal = \"run\"\nreuse_instance = 10\n")
            .unwrap_err();
        assert!(
            err.to_string().contains("[plugins.a] journal")
                && err.to_string().contains("reuse_instance"),
            "{err}"
        );
        let err = parse("[plugins.a]\npath = \"a.wasm\"\njournal_max_bytes = 0\n").unwrap_err();
        assert!(err.to_string().contains("journal_max_bytes"), "{err}");
    }

    #[test]
    fn the_version_keys_parse_and_their_refusals_name_the_key() {
        let config = parse("[plugins.a]\npath = \"a.wasm\"\n").unwrap();
        assert_eq!(config.host.keep_versions, DEFAULT_KEEP_VERSIONS);
        assert!(config.host.watch);
        assert_eq!(config.plugins["a"].pin, Pin::Run);
        assert_eq!(
            config.plugins["a"].drain_timeout(&config.host),
            config.plugins["a"].timeout,
            "drain_timeout defaults to the plugin's timeout"
        );
        let config = parse(
            "[host]\ndrain_timeout = \"2m\"\nkeep_versions = 5\nwatch = false\n\
             [plugins.a]\npath = \"a.wasm\"\nversion = \"2.3.1\"\npin = \"none\"\n",
        )
        .unwrap();
        assert_eq!(
            config.plugins["a"].drain_timeout(&config.host),
            Duration::from_secs(120)
        );
        assert_eq!(config.plugins["a"].version.as_deref(), Some("2.3.1"));
        assert_eq!(config.plugins["a"].pin, Pin::None);
        for (text, key) in [
            ("[host]\nkeep_versions = 0\n", "keep_versions"),
            ("[host]\ndrain_timeout = \"0s\"\n", "drain_timeout"),
            ("[host]\ndrain_timeout = \"a while\"\n", "a while"),
            (
                "[plugins.a]\npath = \"a.wasm\"\npin = \"always\"\n",
                "always",
            ),
            (
                "[plugins.a]\npath = \"a.wasm\"\nversion = \" \"\n",
                "[plugins.a] version",
            ),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
        let long = format!(
            "[plugins.a]\npath = \"a.wasm\"\nversion = \"{}\"\n",
            "v".repeat(65)
        );
        assert!(
            parse(&long)
                .unwrap_err()
                .to_string()
                .contains("[plugins.a] version")
        );
    }

    #[test]
    fn enqueue_to_must_name_a_configured_plugin() {
        let err = parse("[plugins.a]\npath = \"a.wasm\"\nenqueue_to = [\"b\"]\n").unwrap_err();
        assert!(
            err.to_string().contains("[plugins.a] enqueue_to: `b`"),
            "{err}"
        );
    }

    #[test]
    fn defaults_and_relative_paths_resolve_against_the_config_dir() {
        let config = parse("[plugins.echo]\npath = \"echo.wasm\"\n").unwrap();
        let echo = &config.plugins["echo"];
        assert_eq!(echo.concurrency, 4);
        assert_eq!(echo.memory, 64 << 20);
        assert_eq!(
            config.resolve(&echo.path),
            PathBuf::from("/etc/homing/echo.wasm")
        );
        assert_eq!(
            config.store_path(),
            Some(PathBuf::from("/etc/homing/homing.db"))
        );
    }

    #[test]
    fn retry_delay_grows_and_is_capped() {
        let policy = RetryPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            multiplier: 2.0,
            jitter: 0.0,
        };
        assert_eq!(policy.delay(0, None), Duration::from_millis(100));
        assert_eq!(policy.delay(2, None), Duration::from_millis(400));
        assert_eq!(policy.delay(10, None), Duration::from_secs(1));
        assert_eq!(
            policy.delay(0, Some(Duration::from_millis(700))),
            Duration::from_millis(700)
        );
        assert_eq!(
            policy.delay(0, Some(Duration::from_secs(60))),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn nats_keys_take_one_url_or_several() {
        let config = parse(
            "[store]\nbackend = \"nats\"\nurl = \"nats://a:4222, nats://b:4222\"\nprefix = \"prod\"\nreplicas = 3\nrequest_timeout = \"750ms\"\ncredentials = \"me.creds\"\n",
        )
        .unwrap();
        let StoreConfig::Nats(nats) = &config.store else {
            panic!("not nats")
        };
        assert_eq!(nats.urls(), vec!["nats://a:4222", "nats://b:4222"]);
        assert_eq!(nats.prefix, "prod");
        assert_eq!(nats.replicas, 3);
        assert_eq!(nats.request_timeout, Duration::from_millis(750));
        assert!(nats.credentials.clone().unwrap().ends_with("me.creds"));
        let config = parse("[store]\nbackend = \"nats\"\nurl = [\"nats://c:1\"]\n").unwrap();
        let StoreConfig::Nats(nats) = &config.store else {
            panic!("not nats")
        };
        assert_eq!(nats.urls(), vec!["nats://c:1"]);
        assert_eq!(nats.prefix, "homing");
        let err = parse("[store]\nbackend = \"nats\"\nprefix = \"\"\n").unwrap_err();
        assert!(err.to_string().contains("[store] prefix"), "{err}");
    }

    #[test]
    fn a_key_of_the_other_backend_is_an_error_naming_line_and_key() {
        let err = parse("[store]\npath = \"a.db\"\nurl = \"nats://a:4222\"\n").unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("homing.toml: line 3"), "{text}");
        assert!(
            text.contains("`url` belongs to backend = \"nats\""),
            "{text}"
        );

        let err = parse("[store]\nbackend = \"nats\"\nprefix = \"p\"\nfsync = true\n").unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("homing.toml: line 4"), "{text}");
        assert!(
            text.contains("`fsync` belongs to backend = \"embedded\""),
            "{text}"
        );

        let err = parse("[store]\nbackend = \"nats\"\nprfix = \"p\"\n").unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("homing.toml: line 3"), "{text}");
        assert!(text.contains("unknown field `prfix`"), "{text}");

        let err = parse("[store]\nbackend = \"postgres\"\n").unwrap_err();
        assert!(err.to_string().contains("backend: must be"), "{err}");
    }

    #[test]
    fn the_store_is_embedded_unless_it_says_otherwise() {
        let config = parse("").unwrap();
        assert_eq!(config.store.backend(), Backend::Embedded);
        assert!(matches!(config.store, StoreConfig::Embedded(_)));
        let config = parse("[store]\nfsync = true\n").unwrap();
        assert!(matches!(
            config.store,
            StoreConfig::Embedded(EmbeddedSettings { fsync: true, .. })
        ));
        let config = parse("[store]\nbackend = \"nats\"\nconnect_timeout = \"2s\"\n").unwrap();
        assert_eq!(config.store_path(), None);
        assert_eq!(
            match &config.store {
                StoreConfig::Nats(nats) => nats.connect_timeout,
                StoreConfig::Embedded(_) => Duration::ZERO,
            },
            Duration::from_secs(2)
        );
    }
}
