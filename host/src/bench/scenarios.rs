//! The scenarios `homing bench` measures: store operations, fresh-instance start, end-to-end
//! throughput, NATS requests per dispatch, and claim latency as the backlog grows.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};

use super::target::{Target, fill, fill_over};
use super::{Figure, Size, figure};
use crate::config::Config;
use crate::runtime::Runtime;
use crate::runtime::host::PluginContext;
use crate::scratch::ScratchDir;
use crate::store::embedded::EmbeddedStore;
use crate::store::model::{Debounce, Gather};
use crate::store::{NewDispatch, RunResult, SystemClock};

/// Store only: claim and complete every dispatch of a backlog, one caller.
pub(super) async fn store_ops(target: &Target, size: Size) -> anyhow::Result<Figure> {
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

/// A guest whose start the bench measures.
pub(super) struct Guest {
    name: &'static str,
    path: PathBuf,
    /// Its memory cap (the interpreters need more than the default).
    memory: &'static str,
    /// Where compiled artifacts are cached (the interpreters take seconds to compile).
    cache: Option<PathBuf>,
}

impl Guest {
    pub(super) fn echo(path: &Path) -> Guest {
        Guest {
            name: "echo",
            path: path.to_path_buf(),
            memory: "64MiB",
            cache: None,
        }
    }

    /// The Python and JavaScript agents next to `echo` (`cargo xtask polyglot` builds them),
    /// compiled through the cache in `.homing/cache` of the current directory.
    pub(super) fn polyglot(echo: &Path) -> anyhow::Result<Vec<Guest>> {
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
pub(super) async fn instance_start(
    guest: &Guest,
    pooling: &str,
    size: Size,
) -> anyhow::Result<Vec<Figure>> {
    let dir = ScratchDir::new("bench").context("a directory for the bench")?;
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
        let samples = handle_calls(
            &runtime,
            &plugin,
            &store,
            "start-and-call",
            "hello",
            instances,
        )
        .await
        .context("the echo guest's handle call")?;
        figures.push(figure(
            format!("fresh instance start + handle call, echo, pooling {pooling}"),
            "µs",
            samples,
        ));
    }
    Ok(figures)
}

/// Enqueues one dispatch with `payload` to `plugin` on `thread`, claims it, and times `n` calls
/// of a fresh instance + `handle` on that claim (µs each).
///
/// # Errors
///
/// When the store fails or a call does not return.
pub(super) async fn handle_calls(
    runtime: &Runtime,
    plugin: &crate::runtime::Plugin,
    store: &crate::store::Store,
    thread: &str,
    payload: &str,
    n: usize,
) -> anyhow::Result<Vec<f64>> {
    let claimed = claimed_for_calls(plugin, store, thread, payload).await?;
    calls_on(runtime, plugin, store, &claimed, n, None).await
}

/// Enqueues a dispatch of `plugin` on `thread` and claims it (recording its start).
pub(super) async fn claimed_for_calls(
    plugin: &crate::runtime::Plugin,
    store: &crate::store::Store,
    thread: &str,
    payload: &str,
) -> anyhow::Result<crate::store::Dispatch> {
    let agent = plugin.ctx.name.as_str();
    store
        .mailbox
        .enqueue(NewDispatch::new(agent, thread, payload))
        .await?;
    let claimed = store
        .mailbox
        .claim_started(agent, "bench", 600_000)
        .await?
        .context("the dispatch just enqueued could not be claimed")?;
    Ok(claimed)
}

/// `n` handle calls, each on a fresh instance, all on the claim `claimed`; with `journal`, each
/// call's claim is journaled under those settings as claim number `.1` of the dispatch (1:
/// recording, as a first run does; 2 and up: replaying what was recorded).
pub(super) async fn calls_on(
    runtime: &Runtime,
    plugin: &crate::runtime::Plugin,
    store: &crate::store::Store,
    claimed: &crate::store::Dispatch,
    n: usize,
    journal: Option<(crate::claim::JournalSettings, u32)>,
) -> anyhow::Result<Vec<f64>> {
    let agent = plugin.ctx.name.as_str();
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let recorder = journal.and_then(|(settings, number)| {
            crate::claim::Recorder::new(
                store,
                crate::store::Fence::of(claimed)?,
                agent,
                number,
                claimed.attempt,
                settings,
            )
        });
        let claim = crate::runtime::host::ClaimHandle::unguarded(claimed.clone(), recorder);
        let start = Instant::now();
        let run = runtime.run_handler(plugin, claim, &mut None).await;
        samples.push(start.elapsed().as_secs_f64() * 1e6);
        let end = run.end();
        if !matches!(end, crate::runtime::CallEnd::Returned(_)) {
            bail!("the handle call did not return: {end:?}");
        }
    }
    Ok(samples)
}

/// One plain end-to-end run on a fresh store: `size.dispatches` enqueued over 50 threads, then
/// a host with `workers` echo workers until idle. Dispatches per second of the run, and the
/// run's report.
async fn plain_run(
    target: &Target,
    echo: &Path,
    workers: u32,
    size: Size,
) -> anyhow::Result<(f64, crate::supervisor::RunReport)> {
    let scratch = target.scratch().await?;
    fill(&scratch.store, size.dispatches).await?;
    let (elapsed, report) = target.run_host(&scratch, echo, workers).await?;
    target.drop_scratch(scratch).await;
    Ok((size.dispatches as f64 / elapsed.as_secs_f64(), report))
}

/// Enqueue `dispatches` over 50 threads, then run a host with `workers` echo workers until
/// idle; dispatches per second of the run.
/// Also the host's own time per dispatch (see [`RunReport::host_overhead`]), p50 over each
/// run's dispatches, median over the runs.
pub(super) async fn end_to_end(
    target: &Target,
    echo: &Path,
    workers: u32,
    size: Size,
) -> anyhow::Result<Vec<Figure>> {
    let mut samples = Vec::new();
    let mut overhead = Vec::new();
    for _ in 0..size.repeats {
        let (rate, report) = plain_run(target, echo, workers, size).await?;
        samples.push(rate);
        if let Some(p50) = report.host_overhead.quantile(0.5) {
            overhead.push(p50 as f64);
        }
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

/// The keys of [`end_to_end_limited`]: a plugin rate, a per-key concurrency and a per-key
/// rate, each far above what the run reaches, so they cost their checks but never bind; the
/// journal on (each claim gets its recorder; the echo guest records nothing); a version label
/// with runs pinned to their version (each claim records it).
const UNBINDING_LIMITS: &str = "rate = \"100000000/s\"\nkey_concurrency = 1000\n\
    key_rate = \"100000000/s\"\njournal = \"run\"\nversion = \"bench-1\"\npin = \"run\"\n";

/// The end-to-end scenario with the claim path's features configured but not binding: every
/// dispatch carries one of 50 concurrency keys, and the plugin sets [`UNBINDING_LIMITS`]. The
/// inbox, waitpoints and streaming cost nothing until a guest calls them (the echo guest does
/// not). Its cost is the gap to the plain run, so each of its samples is paired with a plain
/// run taken just before it: on a shared machine two rows measured minutes apart differ by
/// more than the features cost, while the two runs of a pair see the same machine. Three
/// figures: the plain runs, the runs with features, and the median of the pairs' gaps (in %,
/// negative when the features cost throughput).
pub(super) async fn end_to_end_limited(
    target: &Target,
    echo: &Path,
    workers: u32,
    size: Size,
) -> anyhow::Result<Vec<Figure>> {
    let (mut plain, mut limited, mut gaps) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..size.pairs {
        let (base, _) = plain_run(target, echo, workers, size).await?;
        let scratch = target.scratch().await?;
        super::target::fill_keyed(&scratch.store, size.dispatches, super::target::THREADS, 50)
            .await?;
        let (elapsed, _) = target
            .run_host_with(&scratch, echo, workers, UNBINDING_LIMITS)
            .await?;
        let with = size.dispatches as f64 / elapsed.as_secs_f64();
        target.drop_scratch(scratch).await;

        plain.push(base);
        limited.push(with);
        gaps.push((with / base - 1.0) * 100.0);
    }
    let name = target.name();
    Ok(vec![
        figure(
            format!("end to end, echo, {name}, {workers} workers, paired with the next row"),
            "dispatches/s",
            plain,
        ),
        figure(
            format!(
                "end to end, echo, limits, keys, journal and version set but not binding, {name}, {workers} workers"
            ),
            "dispatches/s",
            limited,
        ),
        figure(
            format!("with features against plain, paired runs, {name}, {workers} workers"),
            "%",
            gaps,
        ),
    ])
}

/// NATS only: the requests (client messages) per dispatch lifecycle, once for the store
/// operations alone (enqueue, claim and start, complete) and once end to end through a host
/// (which adds its own polling: idle checks, sweeps, the watcher's flow control). Counted by
/// the bench's own NATS client on each scratch store, which every operation, the host run's
/// included, goes through: requests the clients sent, not what the server did with them.
pub(super) async fn requests_per_dispatch(
    target: &Target,
    echo: &Path,
    size: Size,
) -> anyhow::Result<Option<Vec<Figure>>> {
    if !target.is_nats() {
        return Ok(None);
    }
    let n = size.dispatches.max(1_000);
    let scratch = target.scratch().await?;
    let store = scratch.store.clone();
    let before = scratch.requests_sent().unwrap_or(0);
    fill(&store, n).await?;
    let done = run_all(&store).await?;
    let store_ops =
        scratch.requests_sent().unwrap_or(0).saturating_sub(before) as f64 / done.max(1) as f64;
    target.drop_scratch(scratch).await;

    let scratch = target.scratch().await?;
    let before = scratch.requests_sent().unwrap_or(0);
    fill(&scratch.store, n).await?;
    target.run_host(&scratch, echo, 8).await?;
    let host = scratch.requests_sent().unwrap_or(0).saturating_sub(before) as f64 / n as f64;
    target.drop_scratch(scratch).await;

    // Debounced: the same number of enqueues, ten per thread into `collect` windows sealed at
    // ten items, then every window claimed, started and completed: the requests per item.
    let scratch = target.scratch().await?;
    let store = scratch.store.clone();
    let before = scratch.requests_sent().unwrap_or(0);
    let window = Debounce {
        payload: Gather::Collect,
        max_items: 10,
        ..Debounce::new("bench", 60_000, 600_000)
    };
    for i in 0..n {
        let new = NewDispatch::new("echo", format!("w{}", i / 10), b"item".to_vec())
            .with_debounce(window.clone());
        store.mailbox.enqueue(new).await?;
    }
    let windows = run_all(&store).await?;
    let debounced =
        scratch.requests_sent().unwrap_or(0).saturating_sub(before) as f64 / n.max(1) as f64;
    target.drop_scratch(scratch).await;
    Ok(Some(vec![
        figure(
            format!(
                "nats requests per debounced item, store ops ({n} items, {windows} windows of 10)"
            ),
            "requests",
            vec![debounced],
        ),
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

/// Claims, starts and completes every `echo` dispatch of `store`, one caller; how many ran.
async fn run_all(store: &crate::store::Store) -> anyhow::Result<u64> {
    let mut done = 0;
    while let Some(d) = store.mailbox.claim_started("echo", "bench", 30_000).await? {
        let token = d.token().unwrap_or_default().to_owned();
        store
            .mailbox
            .complete(&d.id, &token, RunResult::success("ok"))
            .await?;
        done += 1;
    }
    Ok(done)
}

/// Claim latency with `backlog` dispatches queued over 1,000 threads: `claims` claims, each
/// followed by a complete and a new enqueue so the backlog stays put. p50 and p99 in µs.
pub(super) async fn claim_latency(
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
