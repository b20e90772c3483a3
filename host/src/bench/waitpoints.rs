//! `--only waitpoints`: how fast a completed waitpoint gets its dispatch running again, and
//! what a host holds for dispatches that wait.
//!
//! - Completion to running again: a dispatch waits on a waitpoint (created through its claim,
//!   then suspended); a worker waits for work the way a host's worker does (the store's work
//!   signal, then a claim); the latency is from the start of the completion call to the claim
//!   that hands the dispatch out again. On the embedded store the completion comes through the
//!   same store instance (the host's own API); on NATS through a second instance with its own
//!   connection, standing for another host's API.
//! - Memory: a real `homing run` against a store holding 0, then N, waiting dispatches of its
//!   agent, measured (`VmRSS`) once it has made its first claim of a marker dispatch. A
//!   waiting dispatch should cost the host no instance, task or timer: only what its store
//!   keeps of it (nothing in memory on the embedded store; a small record in a NATS host's
//!   view).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::scale::{Place, resident_mib, spawn_host, timed};
use super::target::Target;
use super::{Figure, figure};
use crate::scratch::ScratchDir;
use crate::store::waitpoints::token_digest;
use crate::store::{Dispatch, Fence, NewDispatch, NewWaitpoint, Status, Store};

const AGENT: &str = "echo";
/// How long a host may take to make its first claim before the scenario fails.
const FIRST_CLAIM_DEADLINE: Duration = Duration::from_secs(300);

/// Makes `dispatch` wait: claim it, create a waitpoint through the claim, suspend. Returns
/// the waitpoint's id.
async fn make_wait(store: &Store, d: &Dispatch) -> anyhow::Result<String> {
    let Some(claimed) = store
        .mailbox
        .claim_dispatch(&d.id, "bench", 600_000)
        .await?
    else {
        bail!("dispatch {} was not claimable", d.id);
    };
    let fence = Fence::of(&claimed).context("a claimed dispatch has a fence")?;
    let new = NewWaitpoint {
        name: "approve".into(),
        timeout_ms: 3_600_000,
        metadata: Default::default(),
        token_digest: token_digest("hwp_bench"),
    };
    let w = store
        .waitpoints
        .create_waitpoint(&fence, new)
        .await?
        .waitpoint;
    let token = claimed.token().unwrap_or_default().to_owned();
    let waiting = store.mailbox.suspend(&d.id, &token, 100).await?;
    if waiting.status != Status::Waiting {
        bail!("dispatch {} is {} after its suspend", d.id, waiting.status);
    }
    Ok(w.id)
}

/// Completion-to-claim latency p50 and p99 over `n` waits, and the host's memory with
/// `waiting` dispatches waiting.
pub(super) async fn waitpoints(
    target: &Target,
    echo: &Path,
    n: usize,
    waiting: u64,
) -> anyhow::Result<Vec<Figure>> {
    let mut figures = resume_latency(target, n).await?;
    figures.extend(memory(target, echo, waiting).await?);
    Ok(figures)
}

async fn resume_latency(target: &Target, n: usize) -> anyhow::Result<Vec<Figure>> {
    let scratch = target.scratch().await?;
    let worker = scratch.store.clone();
    let (completer, across) = match target.second(&scratch).await? {
        Some(other) => (other, "across hosts"),
        None => (worker.clone(), "same host"),
    };
    let signal = worker.mailbox.work_signal();
    let mut latencies = Vec::with_capacity(n);
    for i in 0..n {
        let d = worker
            .mailbox
            .enqueue(NewDispatch::new(AGENT, format!("wait-{i}"), "hello"))
            .await?;
        let id = make_wait(&worker, &d).await?;
        // The worker registers for the signal before it looks, as a host's worker does.
        let claimer = {
            let store = worker.clone();
            let signal = signal.clone();
            tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    let woken = signal.notified();
                    tokio::pin!(woken);
                    woken.as_mut().enable();
                    if let Some(d) = store.mailbox.claim_started(AGENT, "bench", 600_000).await? {
                        return anyhow::Ok((Instant::now(), d));
                    }
                    if Instant::now() > deadline {
                        bail!("the resumed dispatch was not claimed within 30 s");
                    }
                    let _ = tokio::time::timeout(Duration::from_millis(250), woken).await;
                }
            })
        };
        tokio::task::yield_now().await;
        let started = Instant::now();
        completer
            .waitpoints
            .complete_waitpoint(&id, b"{\"approved\": true}".to_vec(), "bench")
            .await?;
        let (at, claimed) = claimer.await.context("the worker stopped")??;
        if claimed.id != d.id || claimed.resumes != 1 {
            bail!(
                "claimed {} (resumes {}), not the resumed {}",
                claimed.id,
                claimed.resumes,
                d.id
            );
        }
        latencies.push(at.saturating_duration_since(started).as_secs_f64() * 1e3);
        let token = claimed.token().unwrap_or_default().to_owned();
        worker.mailbox.ack(&claimed.id, &token).await?;
    }
    drop(completer);
    target.drop_scratch(scratch).await;
    let name = format!(
        "waitpoint completion to running again, {}, {across}",
        target.name()
    );
    latencies.sort_by(|a, b| a.total_cmp(b));
    let p99 = latencies
        .get((latencies.len() * 99 / 100).min(latencies.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0.0);
    let mut p50 = figure(format!("{name} p50"), "ms", latencies.clone());
    p50.samples = latencies.len();
    Ok(vec![
        p50,
        Figure {
            scenario: format!("{name} p99"),
            unit: "ms",
            median: p99,
            min: p99,
            max: p99,
            samples: latencies.len(),
        },
    ])
}

/// The resident memory of a host against a store with 0 and with `waiting` dispatches
/// waiting, and the difference.
async fn memory(target: &Target, echo: &Path, waiting: u64) -> anyhow::Result<Vec<Figure>> {
    let homing = std::env::current_exe().context("finding the homing binary")?;
    let cache = ScratchDir::new("wait-cache").context("a compile cache for the bench")?;
    let mut rss = Vec::new();
    for count in [0, waiting] {
        let dir = ScratchDir::new("waiting").context("a directory for the bench")?;
        let place = Place::new(target, dir.path(), count).await?;
        let store = place.store();
        for i in 0..count {
            let d = store
                .mailbox
                .enqueue(NewDispatch::new(AGENT, format!("waiting-{i}"), "hello"))
                .await?;
            make_wait(&store, &d).await?;
        }
        let marker = store
            .mailbox
            .enqueue(NewDispatch::new(AGENT, "marker", "hello").with_priority(0))
            .await?;
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
        .context("writing the bench config")?;
        timed(&homing, &config, &["config", "check"]).context("checking the bench config")?;
        let log = dir.path().join("host.log");
        let start = Instant::now();
        let mut child = spawn_host(&homing, &config, &log)?;
        loop {
            if let Some(d) = store.mailbox.load(&marker.id).await?
                && d.status.is_terminal()
            {
                break;
            }
            let exited = child.0.try_wait().ok().flatten();
            if exited.is_some() || start.elapsed() > FIRST_CLAIM_DEADLINE {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                bail!("the host never ran its marker dispatch with {count} waiting:\n{log}");
            }
            // Polling the store: the host gives no other sign of its first run.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        rss.push(resident_mib(child.0.id()).unwrap_or(0.0));
        drop(child);
        place.remove().await;
    }
    let label = |what: String| format!("host memory, {}: {what}", target.name());
    let (idle, loaded) = (
        rss.first().copied().unwrap_or(0.0),
        rss.last().copied().unwrap_or(0.0),
    );
    Ok(vec![
        figure(label("nothing waiting".into()), "MiB", vec![idle]),
        figure(
            label(format!("{waiting} dispatches waiting")),
            "MiB",
            vec![loaded],
        ),
        figure(
            label(format!("{waiting} waiting, above idle")),
            "MiB",
            vec![loaded - idle],
        ),
    ])
}
