//! The `homing` command line: run the host, enqueue and inspect work, check config, inspect
//! components. Every command reads the store named by the config; read commands print a table
//! for people or JSON with `--json`.

mod bench;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use serde_json::json;

use crate::config::{Config, StoreConfig, parse_duration};
use crate::runtime::{Runtime, WasmContext, detect_world};
use crate::store::embedded::{EmbeddedOptions, EmbeddedStore};
use crate::store::nats::NatsStore;
use crate::store::{Dispatch, ListFilter, NewDispatch, Status, Store, SystemClock};
use crate::supervisor::Supervisor;

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
    /// Enqueues a dispatch and prints its id.
    Enqueue(EnqueueArgs),
    /// Lists, shows, cancels and retries dispatches.
    #[command(subcommand)]
    Dispatch(DispatchCommand),
    /// Interrupts threads and reads their logs.
    #[command(subcommand)]
    Thread(ThreadCommand),
    /// Checks configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Inspects plugin components.
    #[command(subcommand)]
    Plugin(PluginCommand),
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
        /// That server's monitoring endpoint, `http://host:port` (for request counts).
        #[arg(long)]
        nats_monitor: Option<String>,
        /// Also measure claim latency with 1,000,000 queued on the embedded store (minutes).
        #[arg(long)]
        million: bool,
        /// Only these scenario groups (repeatable; default: all).
        #[arg(long, value_enum)]
        only: Vec<bench::Scenario>,
        /// Also measure the start of the Python and JavaScript agents next to the echo guest
        /// (compiled once into `.homing/cache`; the first run compiles each for 10-20 s).
        #[arg(long)]
        polyglot: bool,
    },
}

/// `homing enqueue`.
#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// The agent (plugin) to route to.
    #[arg(long)]
    pub agent: String,
    /// The thread.
    #[arg(long)]
    pub thread: String,
    /// The payload text (else `--payload-file`, else standard input).
    #[arg(long, conflicts_with = "payload_file")]
    pub payload: Option<String>,
    /// A file holding the payload.
    #[arg(long)]
    pub payload_file: Option<PathBuf>,
    /// 0 most urgent, 255 least.
    #[arg(long, default_value_t = crate::store::DEFAULT_PRIORITY)]
    pub priority: u8,
    /// Delay before it may be claimed ("30s", "5m").
    #[arg(long)]
    pub delay: Option<String>,
    /// At most one live dispatch per (thread, key).
    #[arg(long)]
    pub dedupe_key: Option<String>,
    /// Failed attempts before it dead-letters (default: the plugin's `max_attempts`).
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// The dispatch id (default: a new UUID v7).
    #[arg(long)]
    pub id: Option<String>,
    /// Metadata entries as key=value.
    #[arg(long = "meta", value_name = "KEY=VALUE")]
    pub metadata: Vec<String>,
    /// Print the stored record as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `homing dispatch ...`.
#[derive(Debug, Subcommand)]
pub enum DispatchCommand {
    /// Lists dispatches by priority, then age.
    List {
        /// Only this agent.
        #[arg(long)]
        agent: Option<String>,
        /// Only this thread.
        #[arg(long)]
        thread: Option<String>,
        /// Only this status (queued, claimed, acked, cancelled, superseded, dead_letter).
        #[arg(long)]
        status: Option<Status>,
        /// Page size.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// How many dispatches each agent has in each status.
    Counts {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Shows one dispatch.
    Show {
        /// The id.
        id: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Cancels a queued dispatch.
    Cancel {
        /// The id.
        id: String,
    },
    /// Re-enqueues a dead-lettered (or cancelled) dispatch as a new one.
    Retry {
        /// The id.
        id: String,
    },
}

/// `homing thread ...`.
#[derive(Debug, Subcommand)]
pub enum ThreadCommand {
    /// Interrupts a thread: supersedes its queued work and stops its running dispatch.
    Interrupt {
        /// The thread.
        thread: String,
        /// Why (recorded on superseded dispatches).
        #[arg(long, default_value = "interrupted by operator")]
        reason: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Prints a thread's log.
    Log {
        /// The thread.
        thread: String,
        /// Only entries after this sequence.
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Most entries.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

/// `homing config ...`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Checks a config file and compiles each plugin.
    Check {
        /// The file (default: `--config`).
        file: Option<PathBuf>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

/// `homing plugin ...`.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Shows a component's world, imports and exports.
    Inspect {
        /// The `.wasm` file.
        file: PathBuf,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // A benchmark logs only problems: a line per dispatch would be part of what it measures.
    init_tracing(if matches!(cli.command, Command::Bench { .. }) {
        "warn"
    } else {
        "info,wasmtime=warn,cranelift=warn"
    });
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
    match runtime.block_on(execute(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(default: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("HOMING_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Opens the store the config names.
///
/// # Errors
///
/// When the store cannot be opened.
pub async fn open_store(config: &Config) -> anyhow::Result<Store> {
    match &config.store {
        StoreConfig::Nats(settings) => {
            let nats = config.nats_config(settings);
            NatsStore::open(&nats, Arc::new(SystemClock))
                .await
                .with_context(|| {
                    format!(
                        "opening the NATS store `{}` at {}",
                        nats.prefix,
                        nats.urls.join(", ")
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
    if let Command::Plugin(PluginCommand::Inspect { file, json }) = &cli.command {
        return inspect(file, *json);
    }
    if let Command::Bench {
        quick,
        echo,
        json,
        backend,
        nats_url,
        nats_monitor,
        million,
        only,
        polyglot,
    } = &cli.command
    {
        return bench::run(&bench::BenchArgs {
            echo: echo.clone().unwrap_or_else(bench::default_echo),
            quick: *quick,
            json: *json,
            backend: *backend,
            nats_url: nats_url.clone(),
            nats_monitor: nats_monitor.clone(),
            million: *million,
            only: only.clone(),
            polyglot: *polyglot,
        })
        .await;
    }
    if let Command::Config(ConfigCommand::Check { file, json }) = &cli.command {
        return check(file.as_deref().unwrap_or(&cli.config), *json).await;
    }
    let config = Config::load(&cli.config)?;
    let store = open_store(&config).await?;
    match cli.command {
        Command::Run { until_idle } => {
            if let Some(warning) =
                crate::runtime::host::max_payload_warning(config.host.max_payload, &store)
            {
                tracing::warn!("{warning}");
            }
            let supervisor = Supervisor::new(config, store)?;
            let report = supervisor.run(until_idle).await?;
            let mut outcomes: Vec<_> = report.outcomes.into_iter().collect();
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
        Command::Enqueue(args) => enqueue(&config, &store, args).await,
        Command::Dispatch(command) => dispatch(&config, &store, command).await,
        Command::Thread(command) => thread(&store, command).await,
        Command::Config(_) | Command::Plugin(_) | Command::Bench { .. } => Ok(()),
    }
}

async fn enqueue(config: &Config, store: &Store, args: EnqueueArgs) -> anyhow::Result<()> {
    let payload = match (&args.payload, &args.payload_file) {
        (Some(text), _) => text.clone().into_bytes(),
        (None, Some(file)) => {
            std::fs::read(file).with_context(|| format!("--payload-file {}", file.display()))?
        }
        (None, None) => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("reading the payload from standard input")?;
            buf
        }
    };
    let mut new = NewDispatch::new(&args.agent, &args.thread, payload).with_priority(args.priority);
    new.id = args.id;
    new.dedupe_key = args.dedupe_key;
    new.max_attempts = args
        .max_attempts
        .or_else(|| config.plugins.get(&args.agent).map(|p| p.max_attempts))
        .unwrap_or(crate::store::DEFAULT_MAX_ATTEMPTS);
    if let Some(delay) = &args.delay {
        let delay = parse_duration(delay).map_err(|e| anyhow::anyhow!("--delay: {e}"))?;
        new.delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
    }
    for entry in &args.metadata {
        let Some((key, value)) = entry.split_once('=') else {
            bail!("--meta `{entry}`: expected KEY=VALUE");
        };
        new.metadata.insert(key.to_owned(), value.to_owned());
    }
    if !config.plugins.contains_key(&args.agent) {
        bail!(
            "--agent `{}` is not a plugin in {} (configured: {})",
            args.agent,
            config.source,
            config
                .plugins
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if new.payload.len() as u64 > config.host.max_payload {
        bail!(
            "the payload is {} bytes, over [host] max_payload of {} bytes in {}",
            new.payload.len(),
            config.host.max_payload,
            config.source
        );
    }
    let dispatch = store.mailbox.enqueue(new).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&dispatch)?);
    } else {
        println!("{}", dispatch.id);
    }
    Ok(())
}

async fn dispatch(config: &Config, store: &Store, command: DispatchCommand) -> anyhow::Result<()> {
    match command {
        DispatchCommand::List {
            agent,
            thread,
            status,
            limit,
            json,
        } => {
            let filter = ListFilter {
                thread,
                agent,
                statuses: status.into_iter().collect(),
                limit,
                offset: 0,
            };
            let rows = store.mailbox.list(&filter).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                print_table(&rows);
            }
        }
        DispatchCommand::Counts { json } => {
            let counts = store.mailbox.counts().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&counts)?);
            } else {
                println!("{:<20}  {:<11}  {:>10}", "AGENT", "STATUS", "COUNT");
                for row in counts {
                    println!("{:<20}  {:<11}  {:>10}", row.agent, row.status, row.count);
                }
            }
        }
        DispatchCommand::Show { id, json } => {
            let Some(d) = store.mailbox.load(&id).await? else {
                bail!("no dispatch `{id}`");
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&d)?);
            } else {
                print_dispatch(&d);
            }
        }
        DispatchCommand::Cancel { id } => match store.mailbox.cancel(&id).await? {
            Some(d) => println!("{} cancelled", d.id),
            None => match store.mailbox.load(&id).await? {
                Some(d) => bail!(
                    "dispatch `{id}` is {}; only queued dispatches can be cancelled (interrupt its thread to stop a running one)",
                    d.status
                ),
                None => bail!("no dispatch `{id}`"),
            },
        },
        DispatchCommand::Retry { id } => {
            let Some(d) = store.mailbox.load(&id).await? else {
                bail!("no dispatch `{id}`");
            };
            if !matches!(d.status, Status::DeadLetter | Status::Cancelled) {
                bail!(
                    "dispatch `{id}` is {}; only dead-lettered or cancelled dispatches can be retried",
                    d.status
                );
            }
            let mut new =
                NewDispatch::new(&d.agent, &d.thread, d.payload.clone()).with_priority(d.priority);
            new.metadata = d.metadata.clone();
            new.metadata.insert("retry-of".into(), d.id.clone());
            new.max_attempts = config
                .plugins
                .get(&d.agent)
                .map(|p| p.max_attempts)
                .unwrap_or(d.max_attempts);
            new.dedupe_key = d.dedupe_key.clone();
            let retried = store.mailbox.enqueue(new).await?;
            println!("{}", retried.id);
        }
    }
    Ok(())
}

async fn thread(store: &Store, command: ThreadCommand) -> anyhow::Result<()> {
    match command {
        ThreadCommand::Interrupt {
            thread,
            reason,
            json,
        } => {
            let interrupt = store.mailbox.interrupt(&thread, &reason).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&interrupt)?);
            } else {
                println!("thread {thread} is now at epoch {}", interrupt.epoch);
                println!(
                    "superseded {} queued dispatch(es)",
                    interrupt.superseded.len()
                );
                if let Some(active) = &interrupt.active {
                    println!(
                        "running dispatch {} is being stopped (its host checks every 250ms)",
                        active.id
                    );
                }
            }
        }
        ThreadCommand::Log {
            thread,
            after,
            limit,
            json,
        } => {
            let entries = store.log.read(&thread, after, limit).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&entries)?);
            } else {
                for entry in entries {
                    println!("{:>6}  {}", entry.seq, printable(&entry.data));
                }
            }
        }
    }
    Ok(())
}

async fn check(file: &Path, json: bool) -> anyhow::Result<()> {
    let config = Config::load(file)?;
    let runtime = Runtime::new(&config)?;
    let mut plugins = BTreeMap::new();
    for (name, plugin) in &config.plugins {
        let path = config.resolve(&plugin.path);
        let component =
            crate::runtime::cache::load(runtime.engine(), &path, &config.cache_dir(), name)?;
        let world = detect_world(runtime.engine(), &component)
            .with_context(|| format!("plugin `{name}` ({})", path.display()))?;
        plugins.insert(name.clone(), world.name());
    }
    let store = match &config.store {
        StoreConfig::Embedded(settings) => {
            format!("embedded ({})", config.embedded_path(settings).display())
        }
        StoreConfig::Nats(settings) => {
            let nats = config.nats_config(settings);
            let report = NatsStore::check(&nats)
                .await
                .with_context(|| format!("checking the NATS store at {}", nats.urls.join(", ")))?;
            let mut line = format!(
                "nats (server {}, stream `{}` {}, {} messages, {} replica(s), max_payload {} \
                 bytes: payloads and outputs up to {} bytes, log entries up to {} bytes)",
                report.server,
                report.stream,
                if report.existed {
                    "exists"
                } else {
                    "will be created"
                },
                report.messages,
                report.replicas,
                report.room.server,
                report.room.value,
                report.room.entry
            );
            let holds = report.room.value.min(report.room.entry);
            if config.host.max_payload > holds {
                line.push_str(&format!(
                    "; warning: [host] max_payload is {} bytes, more than the server holds: \
                     guest values are capped at {holds} bytes",
                    config.host.max_payload
                ));
            }
            line
        }
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"file": file.display().to_string(), "store": store, "plugins": plugins, "pooling": runtime.pooling()})
            )?
        );
    } else {
        println!("{}: ok", file.display());
        println!("store: {store}");
        for (name, world) in plugins {
            println!("plugin {name}: {world} world");
        }
    }
    Ok(())
}

fn inspect(file: &Path, json: bool) -> anyhow::Result<()> {
    let engine = wasmtime::Engine::default();
    let component = wasmtime::component::Component::from_file(&engine, file)
        .wasm_context(|| format!("{} is not a loadable component", file.display()))?;
    let ty = component.component_type();
    let imports: Vec<String> = ty
        .imports(&engine)
        .map(|(name, _)| name.to_owned())
        .collect();
    let exports: Vec<String> = ty
        .exports(&engine)
        .map(|(name, _)| name.to_owned())
        .collect();
    let world = detect_world(&engine, &component).map(|w| w.name()).ok();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"file": file.display().to_string(), "world": world, "imports": imports, "exports": exports})
            )?
        );
    } else {
        println!(
            "{}: {}",
            file.display(),
            world
                .map(|w| format!("{w} world"))
                .unwrap_or_else(|| "not a Homing agent".into())
        );
        println!("imports:");
        for name in imports {
            println!("  {name}");
        }
        println!("exports:");
        for name in exports {
            println!("  {name}");
        }
    }
    Ok(())
}

/// Bytes for a terminal: text with its control characters escaped (a stored value cannot move
/// the cursor or forge lines), anything else as its length and leading hex.
fn printable(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => crate::runtime::host::escape_log_text(text).into_owned(),
        Err(_) => format!(
            "<{} bytes, hex {}>",
            bytes.len(),
            bytes
                .iter()
                .take(32)
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        ),
    }
}

fn print_table(rows: &[Dispatch]) {
    println!(
        "{:<36}  {:<12}  {:<20}  {:<11}  {:>3}  {:>7}  RESULT",
        "ID", "AGENT", "THREAD", "STATUS", "PRI", "ATTEMPT"
    );
    for d in rows {
        let result = match (&d.result, &d.last_error) {
            (Some(r), _) if r.error.is_none() => printable(&r.output),
            (Some(r), _) => r.error.clone().unwrap_or_default(),
            (None, Some(e)) => e.clone(),
            (None, None) => String::new(),
        };
        let mut result: String = result.chars().take(60).collect();
        if result.contains('\n') {
            result = result.replace('\n', " ");
        }
        println!(
            "{:<36}  {:<12}  {:<20}  {:<11}  {:>3}  {:>3}/{:<3}  {}",
            d.id, d.agent, d.thread, d.status, d.priority, d.attempt, d.max_attempts, result
        );
    }
}

fn print_dispatch(d: &Dispatch) {
    println!("id:           {}", d.id);
    println!("agent:        {}", d.agent);
    println!("thread:       {}", d.thread);
    println!("run id:       {}", d.run_id);
    println!("status:       {}", d.status);
    println!("priority:     {}", d.priority);
    println!("attempt:      {}/{}", d.attempt, d.max_attempts);
    println!("epoch:        {}", d.epoch);
    println!("payload:      {}", printable(&d.payload));
    for (k, v) in &d.metadata {
        println!("meta:         {k}={v}");
    }
    if let Some(claim) = &d.claim {
        println!(
            "claimed by:   {} (lease until {})",
            claim.claimed_by, claim.lease_until
        );
    }
    if let Some(result) = &d.result {
        println!(
            "result:       {:?} {}",
            result.status,
            printable(&result.output)
        );
        if let Some(error) = &result.error {
            println!("result error: {error}");
        }
    }
    if let Some(error) = &d.last_error {
        println!("last error:   {error}");
    }
    println!("created at:   {}", d.created_at);
    if let Some(at) = d.completed_at {
        println!("completed at: {at}");
    }
}
