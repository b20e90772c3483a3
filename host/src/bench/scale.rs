//! The scale scenario: what a command and a host's start cost as the store retains more
//! records. For each size, a fresh store retains that many records (all terminal but a few
//! queued, ten per thread, as a week of finished work looks), then the bench times real
//! `homing` processes against it, exactly as a user runs them:
//!
//! - `homing enqueue` and `homing dispatch show <a retained id>`, process start included
//!   (p50 over the samples);
//! - `homing run`: from spawning the process to its first claim (the most urgent queued
//!   dispatch leaving `queued`), and its resident memory (`VmRSS`) right then.
//!
//! The goal is flat lines: a command's cost and a host's start independent of what the store
//! retains.
//!
//! On NATS the terminal records are stored where a host's sweep leaves settled records once
//! they are older than `archive_after` (store/nats/archive.rs): in the archive, and one thread
//! record per thread in the thread's tree. A week of finished work looks like that.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::target::Target;
use super::{Figure, figure};
use crate::scratch::ScratchDir;
use crate::store::embedded::EmbeddedStore;
use crate::store::nats::{NatsConfig, NatsStore};
use crate::store::{Dispatch, NewDispatch, RunResult, ServerClock, Status, Store, SystemClock};

/// Retained records per thread.
const PER_THREAD: u64 = 10;
/// Queued dispatches among the retained records.
const QUEUED: u64 = 10;
/// Records handed to the store at once while filling.
const CHUNK: u64 = 20_000;
/// How long a host may take to make its first claim before the scenario fails.
const FIRST_CLAIM_DEADLINE: Duration = Duration::from_secs(600);

/// A store of the scenario: its `[store]` section, and the handle the bench fills it with.
pub(super) enum Place {
    Embedded {
        path: PathBuf,
        store: EmbeddedStore,
    },
    Nats {
        config: NatsConfig,
        store: NatsStore,
    },
}

impl Place {
    pub(super) async fn new(target: &Target, dir: &Path, size: u64) -> anyhow::Result<Place> {
        match target.nats_url() {
            None => {
                let path = dir.join("scale.db");
                let store = EmbeddedStore::open(&path, Arc::new(SystemClock))?;
                Ok(Place::Embedded { path, store })
            }
            Some(url) => {
                let config = NatsConfig {
                    urls: vec![url.to_owned()],
                    prefix: format!("scale{}x{size}", std::process::id()),
                    ..NatsConfig::default()
                };
                let store = NatsStore::connect_client(&config, ServerClock::system())
                    .await
                    .with_context(|| {
                        format!(
                            "opening a NATS store at {}",
                            crate::config::shown_nats_url(url)
                        )
                    })?;
                Ok(Place::Nats { config, store })
            }
        }
    }

    pub(super) fn store(&self) -> Store {
        match self {
            Place::Embedded { store, .. } => store.store(),
            Place::Nats { store, .. } => store.clone().into_store(),
        }
    }

    pub(super) fn toml(&self) -> String {
        match self {
            Place::Embedded { path, .. } => {
                format!("[store]\nbackend = \"embedded\"\npath = {path:?}\n")
            }
            Place::Nats { config, .. } => format!(
                "[store]\nbackend = \"nats\"\nurl = {:?}\nprefix = {:?}\n",
                config.urls.join(","),
                config.prefix
            ),
        }
    }

    async fn retain(&self, records: Vec<Dispatch>) -> anyhow::Result<()> {
        match self {
            Place::Embedded { store, .. } => store.retain_for_bench(records).await?,
            Place::Nats { store, .. } => store.retain_for_bench(records).await?,
        }
        Ok(())
    }

    pub(super) async fn remove(self) {
        if let Place::Nats { config, store } = self {
            store.close().await;
            let _ = NatsStore::delete_stream(&config).await;
        }
    }
}

/// `n` acked records of the echo agent, `PER_THREAD` to a thread, ids minted as an enqueue
/// mints them, completed an hour ago.
fn acked(from: u64, n: u64, now: u64) -> Vec<Dispatch> {
    (from..from + n)
        .map(|i| {
            let new = NewDispatch::new("echo", format!("retained-{}", i / PER_THREAD), "hello");
            let id = uuid::Uuid::now_v7().to_string();
            let then = now.saturating_sub(3_600_000);
            let mut d = crate::store::rules::queued_record(&id, &new, 0, then);
            d.result = Some(RunResult::success("hello"));
            crate::store::rules::terminate(&mut d, Status::Acked, then, None);
            d
        })
        .collect()
}

/// The milliseconds `homing` takes to run `args` against `config` (it must succeed), and
/// what it printed.
pub(super) fn timed(homing: &Path, config: &Path, args: &[&str]) -> anyhow::Result<(f64, String)> {
    let start = Instant::now();
    let out = Command::new(homing)
        .arg("--config")
        .arg(config)
        .args(args)
        .env("HOMING_LOG", "error")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", homing.display()))?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    if !out.status.success() {
        bail!(
            "homing {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok((ms, String::from_utf8_lossy(&out.stdout).into_owned()))
}

/// A process's resident memory in MiB, from `/proc`.
pub(super) fn resident_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Starts `homing run` on `config`, its log in `log`.
pub(super) fn spawn_host(homing: &Path, config: &Path, log: &Path) -> anyhow::Result<Child> {
    let stderr = std::fs::File::create(log).context("creating the host's log")?;
    let child = Command::new(homing)
        .arg("--config")
        .arg(config)
        .arg("run")
        .env("HOMING_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .context("starting homing run")?;
    Ok(Child(child))
}

/// Kills the child when dropped, so a failed measurement leaves no host running.
pub(super) struct Child(pub(super) std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The scale figures of `target` at each retained size, `samples` command runs each.
pub(super) async fn scale(
    target: &Target,
    echo: &Path,
    sizes: &[u64],
    samples: usize,
) -> anyhow::Result<Vec<Figure>> {
    let homing = std::env::current_exe().context("finding the homing binary")?;
    let cache = ScratchDir::new("scale-cache").context("a compile cache for the bench")?;
    let mut figures = Vec::new();
    for &size in sizes {
        let dir = ScratchDir::new("scale").context("a directory for the bench")?;
        let place = Place::new(target, dir.path(), size).await?;
        let store = place.store();
        let now = store.now();
        let terminal = size.saturating_sub(QUEUED);
        let mut done = 0;
        let mut retained_id = None;
        while done < terminal {
            let n = CHUNK.min(terminal - done);
            let records = acked(done, n, now);
            if retained_id.is_none() {
                retained_id = records.get(records.len() / 2).map(|d| d.id.clone());
            }
            place.retain(records).await?;
            done += n;
        }
        let mut first = None;
        for i in 0..QUEUED.min(size) {
            // Chosen ids: the bench polls the first one, and finds it through its id index.
            let new = NewDispatch::new("echo", format!("live-{i}"), "hello")
                .with_priority(0)
                .with_id(format!("scale-live-{i}"));
            let d = store.mailbox.enqueue(new).await?;
            first.get_or_insert(d.id);
        }
        let retained_id = retained_id.unwrap_or_else(|| first.clone().unwrap_or_default());
        let config = dir.path().join("homing.toml");
        std::fs::write(
            &config,
            format!(
                "{}[host]\ncache_dir = {:?}\n[plugins.echo]\npath = {:?}\n",
                place.toml(),
                cache.path(),
                echo
            ),
        )
        .context("writing the scale config")?;
        let label = |what: &str| format!("scale {}, {size} retained: {what}", target.name());

        let mut enqueue = Vec::new();
        let mut show = Vec::new();
        for i in 0..samples {
            let thread = format!("cli-{i}");
            let (ms, _) = timed(
                &homing,
                &config,
                &[
                    "enqueue",
                    "--agent",
                    "echo",
                    "--thread",
                    &thread,
                    "--payload",
                    "hi",
                ],
            )?;
            enqueue.push(ms);
            let (ms, shown) = timed(&homing, &config, &["dispatch", "show", &retained_id])?;
            if !shown.contains(&retained_id) {
                bail!("dispatch show printed no {retained_id}: {shown}");
            }
            show.push(ms);
        }
        figures.push(figure(label("CLI enqueue p50"), "ms", enqueue));
        figures.push(figure(label("CLI dispatch show p50"), "ms", show));

        // What the sweeper reads for the queue gauges (live work), against counting every
        // retained record as it did before; the latter a few times only, as it reads them all.
        let mut live = Vec::new();
        for _ in 0..samples {
            let started = Instant::now();
            store.mailbox.live_counts().await?;
            live.push(started.elapsed().as_secs_f64() * 1e3);
        }
        let mut all = Vec::new();
        for _ in 0..samples.min(3) {
            let started = Instant::now();
            store.mailbox.counts().await?;
            all.push(started.elapsed().as_secs_f64() * 1e3);
        }
        figures.push(figure(
            label("queue gauge read (live counts) p50"),
            "ms",
            live,
        ));
        figures.push(figure(label("count of every status p50"), "ms", all));

        // The host: first claim and memory then. The compile cache is shared across sizes,
        // and the first size's host run fills it before anything is timed.
        if size == sizes[0] {
            let warm = timed(&homing, &config, &["config", "check"]);
            warm.context("checking the scale config")?;
        }
        let Some(first) = first else {
            place.remove().await;
            continue;
        };
        let log = dir.path().join("host.log");
        let start = Instant::now();
        let mut child = spawn_host(&homing, &config, &log)?;
        let claimed = loop {
            if let Some(d) = store.mailbox.load(&first).await?
                && d.status != Status::Queued
            {
                break start.elapsed();
            }
            let exited = child.0.try_wait().ok().flatten();
            if exited.is_some() || start.elapsed() > FIRST_CLAIM_DEADLINE {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                bail!(
                    "the host made no claim within {:?} at {size} retained ({}):\n{log}",
                    start.elapsed(),
                    exited.map_or("still running".into(), |s| s.to_string()),
                );
            }
            // Polling the store: the host gives no other sign of its first claim.
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let rss = resident_mib(child.0.id()).unwrap_or(0.0);
        drop(child);
        figures.push(figure(
            label("host start to first claim"),
            "ms",
            vec![claimed.as_secs_f64() * 1e3],
        ));
        figures.push(figure(label("host resident memory"), "MiB", vec![rss]));
        place.remove().await;
    }
    Ok(figures)
}
