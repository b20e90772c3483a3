//! Where the scenarios run: fresh stores on a backend, filled with echo dispatches, and a host
//! run on them until idle.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::config::Config;
use crate::scratch::ScratchDir;
use crate::store::embedded::EmbeddedStore;
use crate::store::nats::{NatsConfig, NatsStore};
use crate::store::{NewDispatch, ServerClock, Store, SystemClock};
use crate::supervisor::{RunReport, Supervisor};

/// Threads the end-to-end workload spreads its dispatches over.
pub(super) const THREADS: u64 = 50;

/// Where a scenario gets fresh stores.
#[derive(Debug)]
pub(super) enum Target {
    /// A new SQLite file per store.
    Embedded,
    /// A new stream per store, each under its own prefix, on the server at `url`.
    Nats { url: String, next: AtomicU64 },
}

/// A NATS scratch store's stream and its client's counters.
#[derive(Debug)]
struct NatsScratch {
    config: NatsConfig,
    statistics: Arc<async_nats::Statistics>,
}

/// A fresh store and what keeps it alive.
#[derive(Debug)]
pub(super) struct Scratch {
    pub(super) store: Store,
    pub(super) dir: ScratchDir,
    nats: Option<NatsScratch>,
}

impl Scratch {
    /// The requests (messages) this store's NATS client has sent so far; `None` on the
    /// embedded store. Everything the bench does on the store, a host run included, goes
    /// through that one client.
    pub(super) fn requests_sent(&self) -> Option<u64> {
        self.nats
            .as_ref()
            .map(|n| n.statistics.out_messages.load(Ordering::Relaxed))
    }
}

impl Target {
    pub(super) fn new_nats(url: String) -> Target {
        Target::Nats {
            url,
            next: AtomicU64::new(0),
        }
    }

    pub(super) fn name(&self) -> &'static str {
        match self {
            Target::Embedded => "embedded",
            Target::Nats { .. } => "nats",
        }
    }

    pub(super) fn is_nats(&self) -> bool {
        matches!(self, Target::Nats { .. })
    }

    /// The NATS server's URL (`None` for the embedded target).
    pub(super) fn nats_url(&self) -> Option<&str> {
        match self {
            Target::Nats { url, .. } => Some(url),
            Target::Embedded => None,
        }
    }

    pub(super) async fn scratch(&self) -> anyhow::Result<Scratch> {
        let dir = ScratchDir::new("bench").context("a directory for the bench")?;
        match self {
            Target::Embedded => Ok(Scratch {
                store: EmbeddedStore::open(&dir.path().join("bench.db"), Arc::new(SystemClock))?
                    .store(),
                dir,
                nats: None,
            }),
            Target::Nats { url, next } => {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let config = NatsConfig {
                    urls: vec![url.clone()],
                    prefix: format!("bench{}x{n}", std::process::id()),
                    ..NatsConfig::default()
                };
                let store = NatsStore::connect(&config, ServerClock::system())
                    .await
                    .with_context(|| {
                        format!(
                            "opening a NATS store at {}",
                            crate::config::shown_nats_url(url)
                        )
                    })?;
                let statistics = store.client_statistics();
                Ok(Scratch {
                    store: store.into_store(),
                    dir,
                    nats: Some(NatsScratch { config, statistics }),
                })
            }
        }
    }

    /// The `[store]` section of a host config on `scratch`'s store.
    fn store_toml(&self, scratch: &Scratch) -> String {
        match &scratch.nats {
            Some(nats) => format!(
                "[store]\nbackend = \"nats\"\nurl = {:?}\nprefix = {:?}\n",
                nats.config.urls.join(","),
                nats.config.prefix
            ),
            None => String::new(),
        }
    }

    /// Another instance on `scratch`'s data, standing for another host: on NATS a second
    /// connection with its own watcher; `None` on the embedded store, whose hosts are one
    /// process.
    pub(super) async fn second(&self, scratch: &Scratch) -> anyhow::Result<Option<Store>> {
        match &scratch.nats {
            Some(nats) => Ok(Some(
                NatsStore::connect(&nats.config, ServerClock::system())
                    .await
                    .context("a second NATS store instance")?
                    .into_store(),
            )),
            None => Ok(None),
        }
    }

    pub(super) async fn drop_scratch(&self, scratch: Scratch) {
        if let Some(nats) = &scratch.nats {
            let _ = NatsStore::delete_stream(&nats.config).await;
        }
    }

    /// Runs a host with `workers` echo workers on `scratch` until idle; how long it took from
    /// the start of the run to the last completion. The run itself ends up to one idle check
    /// (50 ms) later; that wait is the stop condition, not work, and would otherwise round
    /// every sample up to it.
    pub(super) async fn run_host(
        &self,
        scratch: &Scratch,
        echo: &Path,
        workers: u32,
    ) -> anyhow::Result<(Duration, RunReport)> {
        self.run_host_with(scratch, echo, workers, "").await
    }

    /// [`Target::run_host`] with `plugin` keys added to the echo plugin's table.
    pub(super) async fn run_host_with(
        &self,
        scratch: &Scratch,
        echo: &Path,
        workers: u32,
        plugin: &str,
    ) -> anyhow::Result<(Duration, RunReport)> {
        let config = bench_config(
            scratch.dir.path(),
            echo,
            "auto",
            workers,
            &self.store_toml(scratch),
            plugin,
        )?;
        let supervisor = Supervisor::new(config, scratch.store.clone())?;
        let started_ms = scratch.store.now();
        let start = Instant::now();
        let report = supervisor.run(true).await?;
        let elapsed = start.elapsed();
        if scratch.store.mailbox.has_live_work().await? {
            bail!("the end-to-end run stopped with work left");
        }
        let busy = match last_completion(&scratch.store).await? {
            Some(last) => Duration::from_millis(last.saturating_sub(started_ms).max(1)),
            None => elapsed,
        };
        Ok((busy.min(elapsed), report))
    }
}

fn bench_config(
    dir: &Path,
    echo: &Path,
    pooling: &str,
    workers: u32,
    store: &str,
    plugin: &str,
) -> anyhow::Result<Config> {
    let text = format!(
        "[host]\npooling = \"{pooling}\"\nsweep_interval = \"1s\"\n{store}[plugins.echo]\npath = {:?}\nconcurrency = {workers}\n{plugin}\n",
        echo.display().to_string()
    );
    Ok(Config::parse(&text, "homing bench", dir)?)
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

/// Enqueues `n` echo dispatches over the end-to-end workload's 50 threads.
pub(super) async fn fill(store: &Store, n: u64) -> anyhow::Result<()> {
    fill_over(store, n, THREADS).await
}

/// Enqueues `n` echo dispatches over `threads` threads, from up to 16 tasks at once (each task
/// keeps to its own threads, so producers do not contend).
pub(super) async fn fill_over(store: &Store, n: u64, threads: u64) -> anyhow::Result<()> {
    fill_keyed(store, n, threads, 0).await
}

/// [`fill_over`], each dispatch with one of `keys` concurrency keys (none when 0).
pub(super) async fn fill_keyed(
    store: &Store,
    n: u64,
    threads: u64,
    keys: u64,
) -> anyhow::Result<()> {
    let tasks = threads.clamp(1, 16);
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let store = store.clone();
        set.spawn(async move {
            let mut i = task;
            while i < n {
                let mut new = NewDispatch::new("echo", format!("thread-{}", i % threads), "hello");
                if keys > 0 {
                    new = new.with_concurrency_key(format!("key-{}", i % keys));
                }
                store.mailbox.enqueue(new).await?;
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
