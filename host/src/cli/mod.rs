//! The `homing` command line: run the host, enqueue and inspect work, check config, inspect
//! components, and dispatch `homing bench` to [`crate::bench`]. Every command on work reads the
//! store named by the config; read commands print a table for people or JSON with `--json`.
//!
//! - this module: the commands, the entry point, `homing run`, opening the store;
//! - `work`: `homing enqueue`, `homing dispatch ...`, `homing thread ...`, `homing waitpoint ...`;
//! - `agent`: `homing agent pause|resume|status`;
//! - `inspect`: `homing config check`, `homing plugin inspect`;
//! - `new`, `build`: `homing new` and `homing build`, writing and building agents.

mod agent;
mod build;
mod dev;
pub mod exit;
mod inspect;
mod new;
mod schedule;
mod work;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};

// From the API, only what starts the server (and the loaded plugins it is told of): what the
// CLI does with work comes from `crate::work`, as the API's does (`cargo xtask house` checks).
use crate::api::ApiServer;
use crate::bench;
use crate::config::{Config, LogFormat, StoreConfig};
use crate::store::embedded::{EmbeddedOptions, EmbeddedStore};
use crate::store::nats::{NatsConfig, NatsStore};
use crate::store::{ServerClock, Store, SystemClock};
use crate::supervisor::Supervisor;

pub use agent::AgentCommand;
pub use inspect::{ConfigCommand, PluginCommand};
pub use schedule::ScheduleCommand;
pub use work::{DispatchCommand, EnqueueArgs, SendArgs, ThreadCommand, WaitpointCommand};

/// Homing: a host for sandboxed AI-agent plugins.
#[derive(Debug, Parser)]
#[command(name = "homing", version, about)]
pub struct Cli {
    /// The config file.
    #[arg(
        long,
        short,
        global = true,
        env = "HOMING_CONFIG",
        default_value = "homing.toml"
    )]
    pub config: PathBuf,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Runs the host: loads the plugins and serves their dispatches.
    Run {
        /// Exit once no dispatch is queued or claimed.
        #[arg(long)]
        until_idle: bool,
    },
    /// Runs the host for agent authors: builds the config's agents (those `homing build`
    /// builds into `<folder>/build/`), rebuilds one when its sources change and swaps it in
    /// live, printing each dispatch's outcome.
    Dev,
    /// Enqueues a dispatch and prints its id.
    Enqueue(EnqueueArgs),
    /// Lists, shows, cancels and retries dispatches.
    #[command(subcommand)]
    Dispatch(DispatchCommand),
    /// Interrupts threads and reads their logs.
    #[command(subcommand)]
    Thread(ThreadCommand),
    /// Lists, shows, completes and cancels waitpoints (as an operator).
    #[command(subcommand)]
    Waitpoint(WaitpointCommand),
    /// Pauses and resumes an agent's claims, and shows its limits' use.
    #[command(subcommand)]
    Agent(AgentCommand),
    /// Lists, shows, creates, pauses, resumes, triggers, backfills and deletes schedules.
    #[command(subcommand)]
    Schedule(ScheduleCommand),
    /// Checks configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Inspects plugin components.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Writes a new agent into ./NAME: its source, WIT, README and a homing.toml that runs it.
    New {
        /// The agent's name: lowercase letters, digits, `-` and `_`, starting with a letter.
        name: String,
        /// Its language.
        #[arg(long, value_enum)]
        lang: new::Lang,
        /// The world it exports: `handler` (the host calls it once per dispatch) or `agent`
        /// (it claims its own work).
        #[arg(long, value_enum, default_value = "handler")]
        world: new::World,
    },
    /// Builds the agent in DIR into DIR/build/NAME.wasm (Rust, Python or JavaScript),
    /// installing the pinned tools into the user's cache on first use; prints the path.
    Build {
        /// The agent's folder.
        #[arg(default_value = ".")]
        dir: PathBuf,
    },
    /// Measures the store, instance start and end-to-end throughput (median, min, max).
    Bench {
        /// Seconds instead of minutes.
        #[arg(long)]
        quick: bool,
        /// The echo guest to run (default: examples/wasm/echo.wasm, built by `cargo xtask guests`).
        #[arg(long)]
        echo: Option<PathBuf>,
        /// JSON output.
        #[arg(long)]
        json: bool,
        /// Which store backends to measure.
        #[arg(long, value_enum, default_value = "embedded")]
        backend: bench::BenchBackend,
        /// A NATS server to measure against (default: start a local nats-server).
        #[arg(long)]
        nats_url: Option<String>,
        /// Accepted and ignored: request counts now come from the bench's own NATS clients, so
        /// no monitoring endpoint is needed.
        #[arg(long)]
        nats_monitor: Option<String>,
        /// Also measure claim latency with 1,000,000 queued on the embedded store, and (with
        /// `--only scale`) commands and host start at 1,000,000 retained records (minutes).
        #[arg(long)]
        million: bool,
        /// Only these scenario groups (repeatable; default: all but `scale`).
        #[arg(long, value_enum)]
        only: Vec<bench::Scenario>,
        /// Also measure the start of the Python and JavaScript agents next to the echo guest
        /// (compiled once into `.homing/cache`; the first run compiles each for 10-20 s).
        #[arg(long)]
        polyglot: bool,
        /// The http-probe test guest, for `--only outbound` (default: `http_probe.wasm` next to
        /// the echo guest).
        #[arg(long)]
        http_probe: Option<PathBuf>,
    },
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // A host's config says how it logs and where its traces go (a config that does not load
    // is reported by the command itself).
    let host_config = matches!(cli.command, Command::Run { .. })
        .then(|| Config::load(&cli.config).ok())
        .flatten();
    // A benchmark logs only problems: a line per dispatch would be part of what it measures.
    let default = if matches!(cli.command, Command::Bench { .. }) {
        "warn"
    } else {
        "info,wasmtime=warn,cranelift=warn"
    };
    if let Err(e) = init_tracing(default, host_config.as_ref(), runtime.handle()) {
        eprintln!("error: traces: {e:#}");
        return ExitCode::FAILURE;
    }
    let out = runtime.block_on(execute(cli));
    // What the exporter still holds goes out before the process ends.
    crate::telemetry::trace::shutdown();
    match out {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            exit::code(&e).into()
        }
    }
}

/// `HOMING_LOG_FORMAT` (`text` or `json`), else `[host] log_format` of a host's config.
fn log_format(host_config: Option<&Config>) -> LogFormat {
    match std::env::var("HOMING_LOG_FORMAT").ok().as_deref() {
        Some("json") => LogFormat::Json,
        Some("text") => LogFormat::Text,
        _ => host_config.map_or(LogFormat::Text, |c| c.host.log_format),
    }
}

/// Logs to standard error, filtered by `HOMING_LOG` (or `RUST_LOG`, else `default`), and, when
/// a host's config names a collector, exports its spans (which the log output never shows).
fn init_tracing(
    default: &str,
    host_config: Option<&Config>,
    runtime: &tokio::runtime::Handle,
) -> anyhow::Result<()> {
    use tracing_subscriber::filter::{FilterExt, filter_fn};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer, Registry};
    let filter = EnvFilter::try_from_env("HOMING_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new(default));
    // Events only: a line names its plugin, dispatch and attempt itself.
    let events = filter.and(filter_fn(|meta| meta.is_event()));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> =
        vec![match log_format(host_config) {
            LogFormat::Json => fmt
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .with_filter(events)
                .boxed(),
            LogFormat::Text => fmt
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_filter(events)
                .boxed(),
        }];
    if let Some(config) = host_config
        && let Some(traces) = crate::telemetry::trace::layer(config, runtime.clone())?
    {
        layers.push(traces);
    }
    let _ = tracing_subscriber::registry().with(layers).try_init();
    Ok(())
}

/// How a process holds the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A host: follows the shared stream (NATS) to find work across every thread.
    Host,
    /// A short-lived command: reads only what each operation needs, so its cost does not grow
    /// with what the store retains.
    Client,
}

/// Opens the store the config names.
///
/// # Errors
///
/// When the store cannot be opened.
pub async fn open_store(config: &Config, role: Role) -> anyhow::Result<Store> {
    match &config.store {
        StoreConfig::Nats(settings) => {
            let mut nats = NatsConfig::from_settings(settings, |p| config.resolve(p));
            // Settled records expire on the server after the retention, so no host scans
            // the stream for them.
            nats.settled_ttl = Some(config.host.retention);
            // The hosts of one stream share its server's clock, not their own.
            let clock = ServerClock::system();
            let opened = match role {
                Role::Host => NatsStore::open(&nats, clock).await,
                Role::Client => NatsStore::open_client(&nats, clock).await,
            };
            opened.with_context(|| {
                format!(
                    "opening the NATS store `{}` at {}",
                    nats.prefix,
                    crate::config::shown_nats_urls(&nats.urls)
                )
            })
        }
        StoreConfig::Embedded(settings) => {
            let path = config.embedded_path(settings);
            let options = EmbeddedOptions {
                fsync_every_commit: settings.fsync,
            };
            let store = EmbeddedStore::open_with(&path, Arc::new(SystemClock), options)
                .with_context(|| format!("opening the embedded store {}", path.display()))?;
            Ok(store.store())
        }
    }
}

async fn execute(cli: Cli) -> anyhow::Result<()> {
    // Neither reads a config: they make the agent that a config then runs.
    if let Command::New { name, lang, world } = &cli.command {
        return new::run(name, *lang, *world);
    }
    if let Command::Build { dir } = &cli.command {
        return build::run(dir);
    }
    if let Command::Plugin(PluginCommand::Inspect { file, json }) = &cli.command {
        return inspect::inspect(file, *json);
    }
    if let Command::Plugin(PluginCommand::McpTools {
        plugin,
        server,
        json,
    }) = &cli.command
    {
        return inspect::mcp_tools(&cli.config, plugin, server, *json).await;
    }
    if let Command::Bench {
        quick,
        echo,
        json,
        backend,
        nats_url,
        nats_monitor: _,
        million,
        only,
        polyglot,
        http_probe,
    } = &cli.command
    {
        return bench::run(&bench::BenchArgs {
            echo: echo.clone().unwrap_or_else(bench::default_echo),
            quick: *quick,
            json: *json,
            backend: *backend,
            nats_url: nats_url.clone(),
            million: *million,
            only: only.clone(),
            polyglot: *polyglot,
            http_probe: http_probe.clone(),
        })
        .await;
    }
    if let Command::Config(ConfigCommand::Check { file, json }) = &cli.command {
        return inspect::check(file.as_deref().unwrap_or(&cli.config), *json).await;
    }
    let config = Config::load(&cli.config)?;
    // Input is read, and refused, before the store is opened.
    if let Command::Enqueue(args) = &cli.command {
        let new = work::prepare(&config, args)?;
        let store = open_store(&config, Role::Client).await?;
        let out = work::enqueue(&config, &store, new, args).await;
        store.close().await;
        return out;
    }
    if let Command::Dev = &cli.command {
        let mut config = config;
        let projects = dev::projects(&config);
        if projects.is_empty() {
            tracing::warn!(
                "no plugin of {} is built by `homing build` (a path of <folder>/build/<name>.wasm); serving them as they are",
                config.source
            );
        }
        tokio::task::block_in_place(|| dev::build_all(&projects))?;
        config.host.watch = true;
        let store = open_store(&config, Role::Host).await?;
        let _sources = dev::watch_sources(projects)?;
        let out = run(config, store.clone(), false).await;
        store.close().await;
        return out;
    }
    let role = match cli.command {
        Command::Run { .. } => Role::Host,
        _ => Role::Client,
    };
    let store = open_store(&config, role).await?;
    let out = match cli.command {
        Command::Run { until_idle } => run(config, store.clone(), until_idle).await,
        Command::Dispatch(command) => work::dispatch(&config, &store, command).await,
        Command::Thread(command) => work::thread(&config, &store, command).await,
        Command::Waitpoint(command) => work::waitpoint(&config, &store, command).await,
        Command::Agent(command) => agent::run(&config, &store, command).await,
        Command::Schedule(command) => schedule::run(&config, &store, command).await,
        Command::Enqueue(_)
        | Command::Dev
        | Command::Config(_)
        | Command::Plugin(_)
        | Command::Bench { .. }
        | Command::New { .. }
        | Command::Build { .. } => Ok(()),
    };
    // What this process holds on a shared server goes with it (see `Store::close`).
    store.close().await;
    out
}

/// How long the API may finish its requests in flight once the host stopped.
const API_STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// `homing run`: the host, until a signal or (with `until_idle`) until no work is left. With
/// `[api] listen`, the API serves from before the plugins load (so `/livez` answers and
/// `/readyz` says what is loading) until the host has stopped.
async fn run(config: Config, store: Store, until_idle: bool) -> anyhow::Result<()> {
    if let Some(warning) =
        crate::runtime::host::max_payload_warning(config.host.max_payload, &store)
    {
        tracing::warn!("{warning}");
    }
    let backend = match config.store {
        StoreConfig::Embedded(_) => "embedded",
        StoreConfig::Nats(_) => "nats",
    };
    // Store operations are timed (metrics) and traced (spans) when someone can see them.
    let store = if config.api.listen.is_some() || crate::telemetry::trace::enabled() {
        crate::telemetry::instrument(store, backend)
    } else {
        store
    };
    // One live hub: the host's claims stream to it and the API's watchers read from it.
    let live = crate::live::Hub::new(&store, crate::live::LiveSettings::of(&config));
    let api = if config.api.listen.is_some() {
        let metrics = crate::telemetry::install()?;
        let config = Arc::new(config.clone());
        Some(ApiServer::start_with_hub(config, store.clone(), Some(metrics), live.clone()).await?)
    } else {
        None
    };
    // Loading compiles components (seconds for a large one): off the async workers, so the API
    // answers meanwhile.
    let mut supervisor = tokio::task::block_in_place(|| Supervisor::with_hub(config, store, live))?;
    if let Some(api) = &api {
        let on_reload = api.serve_host(supervisor.reloader(), supervisor.fleet());
        supervisor.on_reload(on_reload);
    }
    let report = supervisor.run(until_idle).await;
    if let Some(api) = api {
        api.stop(API_STOP_GRACE).await;
    }
    let report = report?;
    let mut outcomes: Vec<_> = report
        .outcomes
        .into_iter()
        .map(|(outcome, n)| (outcome.as_str(), n))
        .collect();
    outcomes.sort();
    let summary: Vec<String> = outcomes.iter().map(|(k, v)| format!("{k}={v}")).collect();
    tracing::info!(
        "host stopped; this run settled: {}",
        if summary.is_empty() {
            "nothing".into()
        } else {
            summary.join(" ")
        }
    );
    Ok(())
}
