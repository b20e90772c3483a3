//! `--only journal`: what journaling adds to a guest's outbound request, and what a replayed
//! request costs.
//!
//! The `http-probe` test guest (fresh instance + `handle`) makes one GET to a server in this
//! process, under `journal = "off"`, then `"run"` on a first claim (the exchange is recorded:
//! the request body read whole, its digest, the response body kept, one store write at its
//! end), then `"run"` on a later claim of the same dispatch (the exchange is answered from the
//! journal: the journal read once, no connection). A call making no request is the baseline
//! of each figure's difference.

use std::path::Path;

use super::outbound::Probe;
use super::{Figure, figure};
use crate::claim::JournalSettings;
use crate::config::{DEFAULT_JOURNAL_MAX_BYTES, JournalMode};

/// Measures `samples` calls each way.
pub(super) async fn journal(probe: &Path, samples: usize) -> anyhow::Result<Vec<Figure>> {
    let mut probe = Probe::start(probe).await?;
    let one = serde_json::json!({ "url": probe.url() }).to_string();
    let run = JournalSettings {
        mode: JournalMode::Run,
        max_bytes: DEFAULT_JOURNAL_MAX_BYTES,
    };
    let none = figure(
        "http-probe fresh instance + call, no request".into(),
        "µs",
        probe.calls("none", "{}", samples, None).await?,
    );
    let live = figure(
        "http-probe call, 1 request, journal off".into(),
        "µs",
        probe.calls("live", &one, samples, None).await?,
    );
    let recorded = figure(
        "http-probe call, 1 request, journal run (recorded)".into(),
        "µs",
        probe
            .calls("recorded", &one, samples, Some((run, 1)))
            .await?,
    );
    // The same thread's dispatch again as its second claim: the entry the first recorded
    // answers every call.
    let replayed = figure(
        "http-probe call, 1 request, journal run (replayed)".into(),
        "µs",
        probe
            .calls("recorded", &one, samples, Some((run, 2)))
            .await?,
    );
    let added = figure(
        "journaled request: added over a live one (recorded - live)".into(),
        "µs",
        vec![recorded.median - live.median],
    );
    let replay = figure(
        "replayed request (replayed - no request)".into(),
        "µs",
        vec![replayed.median - none.median],
    );
    let request = figure(
        "live request (live - no request)".into(),
        "µs",
        vec![live.median - none.median],
    );
    probe.stop();
    Ok(vec![none, live, recorded, replayed, request, added, replay])
}
