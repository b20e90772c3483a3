//! `homing bench`: repeatable measurements of the stores, instance start and end-to-end
//! throughput with the echo guest, reported as the median over repeated runs with min and max.
//!
//! Each sample runs on a fresh store (a new file in a temporary directory, or a new stream under
//! its own prefix on NATS), so samples do not see each other's data. `--quick` takes seconds
//! (for a smoke check); the default takes a few minutes.
//!
//! `--backend nats` measures the NATS backend: against `--nats-url` when given, otherwise
//! against a `nats-server` the bench starts with [`crate::natsd`] (on a free port; stopped
//! afterwards). Requests per dispatch count the messages the bench's own NATS clients sent
//! (each scratch store has one client, which its host run uses too): requests the clients sent,
//! whatever the server did with them.
//!
//! - `scenarios`: what is measured;
//! - `scale`: commands and a host's start against stores retaining 1k to 1M records (only
//!   with `--only scale`: it takes minutes);
//! - `target`: fresh stores per sample and host runs on them;
//! - `outbound` and `journal`: one outbound request through the http-probe guest, live, and
//!   journaled (recorded, then replayed) (only with `--only outbound`, `--only journal`);
//! - `mcp`: one MCP tool call brokered through the mcp-probe guest against the host making it
//!   directly (only with `--only mcp`);
//! - `stream`: what a claim streams, to a client of the API: latency and deltas per second
//!   (only with `--only stream`).

mod api;
mod journal;
mod mcp;
mod messages;
mod outbound;
mod scale;
mod scenarios;
mod stream;
mod target;
mod waitpoints;

use std::path::PathBuf;

use anyhow::Context;
use serde::Serialize;

use crate::natsd::NatsServer;
use scenarios::{
    Guest, claim_latency, end_to_end, end_to_end_limited, instance_start, requests_per_dispatch,
    store_ops,
};
use target::Target;

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
    /// Pairs of runs (plain, then with features) of the with-features row: a gap of a few
    /// percent needs more samples than a throughput figure.
    pairs: usize,
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
    /// CLI commands and a host's start as the store retains more records (1k and 100k, with
    /// `--million` also 1M; run only when named).
    Scale,
    /// The HTTP API: enqueue throughput and enqueue-to-result latency.
    Api,
    /// One outbound HTTP request through a guest against the host making it directly (run
    /// only when named: it needs the http-probe test guest).
    Outbound,
    /// Inbox messages: send to delivery to a waiting claim, p50 and p99.
    Messages,
    /// Waitpoints: completion to running again, p50 and p99; a host's memory with many
    /// dispatches waiting (run only when named: it starts host processes).
    Waitpoints,
    /// The journal: what recording adds to an outbound request, and what a replayed one costs
    /// (run only when named: it needs the http-probe test guest).
    Journal,
    /// Streaming: emit-to-client latency p50/p99 and deltas per second to one client (run
    /// only when named).
    Stream,
    /// One MCP tool call brokered through a guest against the host making it directly (run
    /// only when named: it needs the mcp-probe test guest, found beside the http-probe one).
    Mcp,
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
    /// Also measure claim latency with 1,000,000 queued (embedded; takes minutes), and the
    /// scale scenario at 1,000,000 retained records.
    pub million: bool,
    /// Only these scenario groups (all when empty).
    pub only: Vec<Scenario>,
    /// Also measure the start of the Python and JavaScript agents found next to the echo guest.
    pub polyglot: bool,
    /// The http-probe guest (`--only outbound`).
    pub http_probe: Option<PathBuf>,
}

impl BenchArgs {
    fn wants(&self, scenario: Scenario) -> bool {
        if matches!(
            scenario,
            Scenario::Scale
                | Scenario::Outbound
                | Scenario::Waitpoints
                | Scenario::Journal
                | Scenario::Stream
                | Scenario::Mcp
        ) {
            return self.only.contains(&scenario);
        }
        self.only.is_empty() || self.only.contains(&scenario)
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
            pairs: 3,
        }
    } else {
        Size {
            dispatches: 2_000,
            repeats: 5,
            instances: 2_000,
            backlogs: &[1_000, 100_000],
            claims: 500,
            pairs: 9,
        }
    };
    let mut figures = Vec::new();
    let probe = args.http_probe.clone().unwrap_or_else(|| {
        echo.parent()
            .unwrap_or(std::path::Path::new("."))
            .join("http_probe.wasm")
    });
    let samples = if args.quick { 200 } else { 2_000 };
    if args.wants(Scenario::Outbound) {
        figures.extend(outbound::outbound(&probe, samples).await?);
    }
    if args.wants(Scenario::Journal) {
        figures.extend(journal::journal(&probe, samples).await?);
    }
    if args.wants(Scenario::Mcp) {
        let mcp_probe = probe
            .parent()
            .unwrap_or(std::path::Path::new("."))
            .join("mcp_probe.wasm");
        figures.extend(mcp::mcp(&mcp_probe, samples).await?);
    }
    let mut targets = Vec::new();
    let mut _local = None;
    if matches!(args.backend, BenchBackend::Embedded | BenchBackend::All) {
        targets.push(Target::Embedded);
    }
    if matches!(args.backend, BenchBackend::Nats | BenchBackend::All) {
        let url = match &args.nats_url {
            Some(url) => url.clone(),
            None => {
                let server = NatsServer::start()
                    .await
                    .context("starting a local nats-server for the bench (or pass --nats-url)")?;
                let url = server.url();
                _local = Some(server);
                url
            }
        };
        targets.push(Target::new_nats(url));
    }

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
            figures.extend(end_to_end_limited(target, echo, 8, size).await?);
        }
        if args.wants(Scenario::Latency) {
            let mut backlogs = size.backlogs.to_vec();
            if args.million && !target.is_nats() {
                backlogs.push(1_000_000);
            }
            for backlog in backlogs {
                figures.extend(claim_latency(target, backlog, size.claims).await?);
            }
        }
        if args.wants(Scenario::Scale) {
            let (mut sizes, samples) = if args.quick {
                (vec![1_000, 10_000], 5)
            } else {
                (vec![1_000, 100_000], 20)
            };
            if args.million {
                sizes.push(1_000_000);
            }
            figures.extend(scale::scale(target, echo, &sizes, samples).await?);
        }
        if args.wants(Scenario::Api) {
            figures.extend(api::api(target, echo, size).await?);
        }
        if args.wants(Scenario::Messages) {
            let n = if args.quick { 100 } else { 1_000 };
            figures.extend(messages::messages(target, n).await?);
        }
        if args.wants(Scenario::Waitpoints) {
            let (n, waiting) = if args.quick {
                (50, 2_000)
            } else {
                (300, 10_000)
            };
            figures.extend(waitpoints::waitpoints(target, echo, n, waiting).await?);
        }
        if args.wants(Scenario::Stream) {
            let (n, burst, repeats) = if args.quick {
                (500, 20_000, 3)
            } else {
                (2_000, 100_000, 5)
            };
            figures.extend(stream::stream(target, n, burst, repeats).await?);
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
