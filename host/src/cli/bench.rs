//! `homing bench`: repeatable measurements of the embedded store, instance start and end-to-end
//! throughput with the echo guest, reported as the median over repeated runs with min and max.
//!
//! Each sample runs on a fresh store file in a temporary directory, so samples do not see each
//! other's data. `--quick` takes seconds (for a smoke check); the default takes about a minute.
//! The NATS scenarios come with the NATS backend.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use serde::Serialize;

use crate::config::Config;
use crate::runtime::Runtime;
use crate::runtime::host::PluginContext;
use crate::store::embedded::EmbeddedStore;
use crate::store::{NewDispatch, RunResult, Store, SystemClock};
use crate::supervisor::Supervisor;

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
}

/// Runs every scenario and prints the figures.
///
/// # Errors
///
/// When the echo guest is missing or a scenario fails.
pub async fn run(echo: &Path, quick: bool, json: bool) -> anyhow::Result<()> {
    let echo = &std::fs::canonicalize(echo).with_context(|| {
        format!(
            "the echo guest {} is missing; build it with `cargo xtask guests` (or pass --echo)",
            echo.display()
        )
    })?;
    let size = if quick {
        Size {
            dispatches: 300,
            repeats: 3,
            instances: 200,
        }
    } else {
        Size {
            dispatches: 2_000,
            repeats: 5,
            instances: 2_000,
        }
    };
    let mut figures = Vec::new();
    figures.push(store_ops(size).await?);
    for pooling in ["on", "off"] {
        figures.push(instance_start(echo, pooling, size).await?);
    }
    for workers in [1, 4, 16] {
        figures.push(end_to_end(echo, workers, size).await?);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&figures)?);
    } else {
        println!(
            "{:<40}  {:>12}  {:>12}  {:>12}  UNIT (n)",
            "SCENARIO", "MEDIAN", "MIN", "MAX"
        );
        for f in &figures {
            println!(
                "{:<40}  {:>12.1}  {:>12.1}  {:>12.1}  {} ({})",
                f.scenario, f.median, f.min, f.max, f.unit, f.samples
            );
        }
    }
    Ok(())
}

fn scratch_store(dir: &Path) -> anyhow::Result<Store> {
    Ok(EmbeddedStore::open(&dir.join("bench.db"), Arc::new(SystemClock))?.store())
}

async fn fill(store: &Store, n: u64) -> anyhow::Result<()> {
    for i in 0..n {
        store
            .mailbox
            .enqueue(NewDispatch::new(
                "echo",
                format!("thread-{}", i % THREADS),
                "hello",
            ))
            .await?;
    }
    Ok(())
}

/// Store only: claim and complete every dispatch of a backlog, one caller.
async fn store_ops(size: Size) -> anyhow::Result<Figure> {
    let mut samples = Vec::new();
    for _ in 0..size.repeats {
        let dir = tempfile::tempdir()?;
        let store = scratch_store(dir.path())?;
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
    }
    Ok(figure(
        "embedded store: claim+complete, 1 caller".into(),
        "ops/s",
        samples,
    ))
}

fn bench_config(dir: &Path, echo: &Path, pooling: &str, workers: u32) -> anyhow::Result<Config> {
    let text = format!(
        "[host]\npooling = \"{pooling}\"\nsweep_interval = \"1s\"\n[plugins.echo]\npath = {:?}\nconcurrency = {workers}\n",
        echo.display().to_string()
    );
    Ok(Config::parse(&text, "homing bench", dir)?)
}

/// Fresh store plus instantiation of the echo guest, one at a time.
async fn instance_start(echo: &Path, pooling: &str, size: Size) -> anyhow::Result<Figure> {
    let dir = tempfile::tempdir()?;
    let config = bench_config(dir.path(), echo, pooling, 4)?;
    let runtime = Runtime::new(&config)?;
    let plugin_config = config
        .plugins
        .get("echo")
        .context("the bench config has an echo plugin")?
        .clone();
    let ctx = Arc::new(PluginContext::standalone(
        "echo",
        plugin_config,
        EmbeddedStore::open_in_memory(Arc::new(SystemClock))?.store(),
        dir.path().to_path_buf(),
    ));
    let plugin = runtime.load_plugin(ctx, echo)?;
    let mut samples = Vec::with_capacity(size.instances);
    for _ in 0..size.instances {
        let start = Instant::now();
        runtime.start_instance(&plugin).await?;
        samples.push(start.elapsed().as_secs_f64() * 1e6);
    }
    Ok(figure(
        format!("fresh instance start, echo, pooling {pooling}"),
        "µs",
        samples,
    ))
}

/// Enqueue `dispatches` over 50 threads, then run a host with `workers` echo workers until
/// idle; dispatches per second of the run.
async fn end_to_end(echo: &Path, workers: u32, size: Size) -> anyhow::Result<Figure> {
    let mut samples = Vec::new();
    for _ in 0..size.repeats {
        let dir = tempfile::tempdir()?;
        let store = scratch_store(dir.path())?;
        fill(&store, size.dispatches).await?;
        let supervisor = Supervisor::new(
            bench_config(dir.path(), echo, "auto", workers)?,
            store.clone(),
        )?;
        let start = Instant::now();
        supervisor.run(true).await?;
        let elapsed = start.elapsed();
        if store.mailbox.has_live_work().await? {
            bail!("the end-to-end run stopped with work left");
        }
        samples.push(size.dispatches as f64 / elapsed.as_secs_f64());
    }
    Ok(figure(
        format!("end to end, echo, embedded, {workers} workers"),
        "dispatches/s",
        samples,
    ))
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
