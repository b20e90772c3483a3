//! What a running host shows of itself: Prometheus metrics (the `metrics` crate, rendered by
//! its Prometheus exporter into the API's `/metrics`), the store's queue as gauges, and
//! OpenTelemetry traces exported over OTLP.
//!
//! Every metric is named here, once, with its help text: `homing_..._total` for counters,
//! `_seconds` for durations (histograms) and ages (gauges). Recording goes through the small
//! functions below, which cost a lookup and an atomic add; until [`install`] is called (by
//! `homing run` when `[api] listen` is set) there is no recorder and they do nothing.
//!
//! - `store`: a [`Store`] whose every operation is timed by backend and operation;
//! - `queue`: the queue depth and the oldest queued dispatch's age, read from the store (by
//!   the sweeper);
//! - `trace`: the tracing layer that exports spans (`homing.dispatch` per attempt, its guest
//!   call, store operations and outbound requests) and the `traceparent` carried through;
//! - `otlp`: the exporter's HTTP client, run on the host's tokio runtime.

mod otlp;
mod queue;
mod store;
pub mod trace;

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub use queue::refresh_queue;
pub use store::instrument;

/// Dispatches settled by this host: `agent`, `outcome` (completed, retrying, dead-lettered, ...).
pub const DISPATCHES_FINISHED: &str = "homing_dispatches_finished_total";
/// From claim to settled, per attempt: `agent`.
pub const DISPATCH_DURATION: &str = "homing_dispatch_duration_seconds";
/// From when a dispatch became claimable (enqueued, or its delay or backoff over) to its
/// claim: `agent`.
pub const QUEUE_WAIT: &str = "homing_dispatch_queue_wait_seconds";
/// Dispatches in the store by `agent` and `status` (refreshed every sweep).
pub const QUEUE_DEPTH: &str = "homing_queue_depth";
/// Age of the oldest queued dispatch: `agent` (0 when none is queued).
pub const QUEUE_OLDEST_AGE: &str = "homing_queue_oldest_age_seconds";
/// Leases renewed while guests ran: `agent`.
pub const LEASE_RENEWALS: &str = "homing_lease_renewals_total";
/// Claims lost while their guest ran (lease ran out, taken over): `agent`.
pub const LEASES_LOST: &str = "homing_leases_lost_total";
/// Expired leases this host's sweeper reclaimed.
pub const RECLAIMS: &str = "homing_reclaims_total";
/// Guest calls that trapped or were cut short: `agent`, `kind` (timeout, interrupted,
/// lease_lost, shutdown, trap).
pub const GUEST_TRAPS: &str = "homing_guest_traps_total";
/// Store operation latency: `backend`, `operation`.
pub const STORE_OPERATION: &str = "homing_store_operation_seconds";
/// Store operations that failed: `backend`, `operation`, `error`.
pub const STORE_ERRORS: &str = "homing_store_errors_total";
/// Fresh guest instance creation: `agent`.
pub const INSTANCE_START: &str = "homing_instance_start_seconds";
/// The host's own time per dispatch beyond the settling store call: `agent`.
pub const HOST_OVERHEAD: &str = "homing_host_overhead_seconds";
/// Restarts of the NATS watcher's consumer.
pub const NATS_WATCHER_RESTARTS: &str = "homing_nats_watcher_restarts_total";
/// Guests' outbound HTTP requests: `agent`, `origin` (the `allowed_outbound_hosts` entry the
/// request matched, `none` when it matched none), `status` (the code's class, `2xx` to `5xx`,
/// `denied` for a request the grants refused, `error` for one that failed or was cut short).
pub const OUTBOUND_REQUESTS: &str = "homing_outbound_requests_total";
/// Guests' outbound HTTP requests, from asked to the end of the response body: `agent`,
/// `origin` (as above).
pub const OUTBOUND_DURATION: &str = "homing_outbound_request_seconds";
/// API requests answered: `route`, `method`, `status`.
pub const API_REQUESTS: &str = "homing_api_requests_total";
/// API requests refused by authentication or role: `reason` (missing, invalid, role).
pub const API_REFUSALS: &str = "homing_api_auth_refusals_total";

/// Dispatches schedules fired: `schedule`, `fire` (`on-time`, `catch-up`, `buffered`).
pub const SCHEDULE_FIRES: &str = "homing_schedule_fires_total";
/// Slots schedules skipped: `schedule`, `reason` (`missed_window`, `coalesced`,
/// `overlap_skip`, `buffer_full`, `paused`, `dst_gap`).
pub const SCHEDULE_SKIPS: &str = "homing_schedule_skips_total";
/// From a schedule tick's due time to its run on this host: `schedule`.
pub const SCHEDULE_LAG: &str = "homing_schedule_tick_lag_seconds";

/// Inbox messages stored by a send: `agent` (the agent addressed, `none` when none).
pub const MESSAGES_SENT: &str = "homing_messages_sent_total";
/// Inbox messages acknowledged by a guest: `agent` (the acking dispatch's).
pub const MESSAGES_ACKED: &str = "homing_messages_acked_total";
/// From a message's send to its first hand-over to a guest on this host: `agent`.
pub const MESSAGE_DELIVERY: &str = "homing_message_delivery_seconds";
/// 1 while an agent's claims are paused (all of them, not one key), else 0: `agent` (read by
/// the sweeper with the queue gauges).
pub const AGENT_PAUSED: &str = "homing_agent_paused";
/// Pending inbox messages in the store (read by the sweeper with the queue gauges).
pub const MESSAGES_PENDING: &str = "homing_messages_pending";
/// Follow-up dispatches the inbox started, counted when a host first claims one: `agent`.
pub const FOLLOW_UPS: &str = "homing_follow_ups_total";
/// Tool calls the host brokered to MCP servers: `agent`, `server` (configured names),
/// `outcome` (`done`, `tool_error`, `replayed`, `needs_approval`, `rejected`, `unknown`,
/// `refused`, `failed`).
pub const MCP_CALLS: &str = "homing_mcp_calls_total";
/// Model calls' durations (OpenTelemetry's `gen_ai.client.operation.duration`): `agent`,
/// `gen_ai_operation_name`, `gen_ai_provider_name`, `gen_ai_request_model`, `error_type`.
pub const GENAI_DURATION: &str = "gen_ai_client_operation_duration_seconds";
/// Model calls' tokens (OpenTelemetry's `gen_ai.client.token.usage`): the duration's labels less
/// `error_type`, and `gen_ai_token_type` (`input`, `output`).
pub const GENAI_TOKENS: &str = "gen_ai_client_token_usage";
/// Buckets of the token histogram (OpenTelemetry's advice: powers of 4 from 1 to 4^13).
const TOKEN_BUCKETS: &[f64] = &[
    1.0,
    4.0,
    16.0,
    64.0,
    256.0,
    1024.0,
    4096.0,
    16384.0,
    65536.0,
    262_144.0,
    1_048_576.0,
    4_194_304.0,
    16_777_216.0,
    67_108_864.0,
];
/// Waitpoints guests created: `agent`.
pub const WAITPOINTS_CREATED: &str = "homing_waitpoints_created_total";
/// Waitpoints that left `pending` through this host (a completion, a cancel, a timeout its
/// sweeper applied): `agent`, `state`.
pub const WAITPOINTS_SETTLED: &str = "homing_waitpoints_settled_total";
/// From a waitpoint's creation to its settlement: `agent`.
pub const WAITPOINT_WAIT: &str = "homing_waitpoint_wait_seconds";
/// Journal entries recorded: `agent`, `kind`.
pub const JOURNAL_RECORDED: &str = "homing_journal_recorded_total";
/// Calls answered from the journal instead of live: `agent`, `kind`.
pub const JOURNAL_REPLAYED: &str = "homing_journal_replayed_total";
/// Runs that diverged from their journal, by the kind of the call where they did: `agent`,
/// `kind`.
pub const JOURNAL_DIVERGENCES: &str = "homing_journal_divergences_total";
/// The live time of each call the journal answered (what replays saved; its sum is the whole
/// saving), in seconds: `agent`.
pub const JOURNAL_SAVED: &str = "homing_journal_saved_seconds";
/// Claims that found work held back by a limit or a pause: `agent`.
pub const CLAIMS_THROTTLED: &str = "homing_claims_throttled_total";
/// Runs parked on an upstream status (`park_on`): `agent`, `status`.
pub const RUNS_PARKED: &str = "homing_runs_parked_total";
/// Seconds outbound requests waited for an origin limit: `agent`, `limit`.
pub const ORIGIN_WAIT: &str = "homing_origin_limit_wait_seconds";
/// Deltas guests streamed (`emit`): `agent`.
pub const STREAM_DELTAS: &str = "homing_stream_deltas_total";
/// Bytes guests streamed: `agent`.
pub const STREAM_BYTES: &str = "homing_stream_bytes_total";
/// Streams of a dispatch's output open to clients on this host.
pub const STREAMS_OPEN: &str = "homing_streams_open";
/// How many deltas a client was behind the newest when one was sent to it.
pub const STREAM_CLIENT_LAG: &str = "homing_stream_client_lag";
/// Clients dropped for falling too far behind a stream.
pub const STREAM_CLIENTS_DROPPED: &str = "homing_stream_clients_dropped_total";

/// Buckets of the stream client lag (deltas).
const LAG_BUCKETS: &[f64] = &[0.0, 1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0];

/// Histogram buckets of every `_seconds` histogram: 50 µs to 5 min.
const BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The exporter as the host configures it.
fn builder() -> anyhow::Result<PrometheusBuilder> {
    Ok(PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(STREAM_CLIENT_LAG.into()), LAG_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(GENAI_TOKENS.into()), TOKEN_BUCKETS)?)
}

/// Installs the process's Prometheus recorder (once; later calls return the same handle) and
/// starts its upkeep, which keeps histogram memory bounded between scrapes.
///
/// # Errors
///
/// When another recorder is installed already.
pub fn install() -> anyhow::Result<PrometheusHandle> {
    if let Some(handle) = HANDLE.get() {
        return Ok(handle.clone());
    }
    let handle = builder()?.install_recorder()?;
    describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    Ok(HANDLE.get_or_init(|| handle).clone())
}

/// Whether a recorder is installed (the queue gauges cost a store read per sweep; without a
/// recorder nobody would see them).
pub fn enabled() -> bool {
    HANDLE.get().is_some()
}

fn describe() {
    describe_counter!(
        DISPATCHES_FINISHED,
        "Dispatches settled by this host, by agent and outcome."
    );
    describe_histogram!(
        DISPATCH_DURATION,
        Unit::Seconds,
        "Claim to settlement, per attempt."
    );
    describe_histogram!(
        QUEUE_WAIT,
        Unit::Seconds,
        "From claimable (enqueue, delay or backoff over) to claim."
    );
    describe_gauge!(
        QUEUE_DEPTH,
        "Live dispatches (queued, claimed) in the store by agent and status."
    );
    describe_gauge!(
        QUEUE_OLDEST_AGE,
        Unit::Seconds,
        "Age of the oldest queued dispatch."
    );
    describe_counter!(
        SCHEDULE_FIRES,
        "Dispatches schedules fired, by schedule and how it fired."
    );
    describe_counter!(
        SCHEDULE_SKIPS,
        "Slots schedules did not fire, by schedule and reason."
    );
    describe_histogram!(
        SCHEDULE_LAG,
        Unit::Seconds,
        "From a schedule tick's due time to its run on this host, by schedule."
    );
    describe_counter!(MESSAGES_SENT, "Inbox messages stored, by addressed agent.");
    describe_counter!(
        MESSAGES_ACKED,
        "Inbox messages acknowledged by guests, by agent."
    );
    describe_histogram!(
        MESSAGE_DELIVERY,
        Unit::Seconds,
        "From a message's send to its first hand-over to a guest on this host."
    );
    describe_gauge!(MESSAGES_PENDING, "Pending inbox messages in the store.");
    describe_gauge!(
        AGENT_PAUSED,
        "1 while an agent's claims are paused by an operator, else 0."
    );
    describe_counter!(
        FOLLOW_UPS,
        "Follow-up dispatches the inbox started, counted at their first claim, by agent."
    );
    describe_counter!(
        MCP_CALLS,
        "Tool calls brokered to MCP servers, by agent, server and outcome."
    );
    describe_counter!(
        WAITPOINTS_CREATED,
        "Waitpoints created by guests, by agent."
    );
    describe_counter!(
        WAITPOINTS_SETTLED,
        "Waitpoints that left pending through this host, by agent and state."
    );
    describe_histogram!(
        WAITPOINT_WAIT,
        Unit::Seconds,
        "From a waitpoint's creation to its settlement, by agent."
    );
    describe_counter!(
        JOURNAL_RECORDED,
        "Journal entries recorded, by agent and kind of call."
    );
    describe_counter!(
        JOURNAL_REPLAYED,
        "Calls answered from the journal instead of live, by agent and kind."
    );
    describe_counter!(
        JOURNAL_DIVERGENCES,
        "Runs that diverged from their journal, by agent and the kind of call where they did."
    );
    describe_histogram!(
        JOURNAL_SAVED,
        Unit::Seconds,
        "The live time of each call the journal answered (what its replay saved), by agent."
    );
    describe_counter!(STREAM_DELTAS, "Deltas guests streamed, by agent.");
    describe_counter!(
        CLAIMS_THROTTLED,
        "Claims that found work held back by a limit or a pause, by agent."
    );
    describe_counter!(
        RUNS_PARKED,
        "Runs parked on an upstream status (park_on), by agent and status."
    );
    describe_histogram!(
        ORIGIN_WAIT,
        Unit::Seconds,
        "Time outbound requests waited for an origin limit, by agent and limit."
    );
    describe_counter!(
        STREAM_BYTES,
        Unit::Bytes,
        "Bytes guests streamed, by agent."
    );
    describe_gauge!(
        STREAMS_OPEN,
        "Streams of a dispatch's output open to clients on this host."
    );
    describe_histogram!(
        STREAM_CLIENT_LAG,
        "How many deltas a client was behind the newest when one was sent to it."
    );
    describe_counter!(
        STREAM_CLIENTS_DROPPED,
        "Stream clients dropped for falling too far behind."
    );
    describe_counter!(LEASE_RENEWALS, "Leases renewed while guests ran.");
    describe_counter!(LEASES_LOST, "Claims lost while their guest ran.");
    describe_counter!(RECLAIMS, "Expired leases reclaimed by this host's sweeper.");
    describe_counter!(
        GUEST_TRAPS,
        "Guest calls that trapped or were cut short, by kind."
    );
    describe_histogram!(STORE_OPERATION, Unit::Seconds, "Store operation latency.");
    describe_counter!(STORE_ERRORS, "Store operations that failed.");
    describe_histogram!(
        INSTANCE_START,
        Unit::Seconds,
        "Fresh guest instance creation."
    );
    describe_histogram!(
        HOST_OVERHEAD,
        Unit::Seconds,
        "The host's own time per dispatch beyond the settling store call."
    );
    describe_counter!(
        NATS_WATCHER_RESTARTS,
        "Restarts of the NATS watcher's consumer."
    );
    describe_counter!(
        OUTBOUND_REQUESTS,
        "Guests' outbound HTTP requests, by agent, origin and status."
    );
    describe_histogram!(
        OUTBOUND_DURATION,
        Unit::Seconds,
        "Guests' outbound HTTP requests, asked to the end of the response."
    );
    describe_counter!(
        API_REQUESTS,
        "API requests answered, by route, method and status."
    );
    describe_histogram!(
        GENAI_DURATION,
        Unit::Seconds,
        "Guests' model calls (origins of [pricing]), asked to the end of the response."
    );
    describe_histogram!(
        GENAI_TOKENS,
        Unit::Count,
        "Tokens of guests' model calls, as the responses report them, by token type."
    );
    describe_counter!(
        API_REFUSALS,
        "API requests refused by authentication or role."
    );
}

/// A dispatch attempt this host settled.
pub fn dispatch_finished(agent: &str, outcome: &'static str, took: Duration) {
    counter!(DISPATCHES_FINISHED, "agent" => agent.to_owned(), "outcome" => outcome).increment(1);
    histogram!(DISPATCH_DURATION, "agent" => agent.to_owned()).record(took.as_secs_f64());
}

/// A dispatch claimed `waited_ms` after it became claimable.
pub fn queue_wait(agent: &str, waited_ms: u64) {
    histogram!(QUEUE_WAIT, "agent" => agent.to_owned()).record(waited_ms as f64 / 1000.0);
}

/// A claim found work held back by a limit or a pause.
pub fn claim_throttled(agent: &str) {
    counter!(CLAIMS_THROTTLED, "agent" => agent.to_owned()).increment(1);
}

/// A run parked on upstream `status`.
pub fn run_parked(agent: &str, status: u16) {
    counter!(RUNS_PARKED, "agent" => agent.to_owned(), "status" => status.to_string()).increment(1);
}

/// An outbound request waited `waited` for origin limit `limit`.
pub fn origin_wait(agent: &str, limit: &str, waited: Duration) {
    histogram!(ORIGIN_WAIT, "agent" => agent.to_owned(), "limit" => limit.to_owned())
        .record(waited.as_secs_f64());
}

/// The host's own time on one dispatch.
pub fn host_overhead(agent: &str, own: Duration) {
    histogram!(HOST_OVERHEAD, "agent" => agent.to_owned()).record(own.as_secs_f64());
}

/// A fresh instance created in `took`.
pub fn instance_start(agent: &str, took: Duration) {
    histogram!(INSTANCE_START, "agent" => agent.to_owned()).record(took.as_secs_f64());
}

/// A guest call that trapped or was cut short.
pub fn guest_trap(agent: &str, kind: &'static str) {
    counter!(GUEST_TRAPS, "agent" => agent.to_owned(), "kind" => kind).increment(1);
}

/// A guest created a waitpoint.
pub fn waitpoint_created(agent: &str) {
    counter!(WAITPOINTS_CREATED, "agent" => agent.to_owned()).increment(1);
}

/// A waitpoint left `pending` through this host: counted by state, its wait recorded.
pub fn waitpoint_settled(w: &crate::store::Waitpoint) {
    counter!(WAITPOINTS_SETTLED, "agent" => w.agent.clone(), "state" => w.state.as_str())
        .increment(1);
    if let Some(at) = w.settled_at {
        histogram!(WAITPOINT_WAIT, "agent" => w.agent.clone())
            .record(at.saturating_sub(w.created_at) as f64 / 1000.0);
    }
}

/// A lease renewed.
pub fn lease_renewed(agent: &str) {
    counter!(LEASE_RENEWALS, "agent" => agent.to_owned()).increment(1);
}

/// A claim lost while its guest ran.
pub fn lease_lost(agent: &str) {
    counter!(LEASES_LOST, "agent" => agent.to_owned()).increment(1);
}

/// A schedule's tick ran `lag_ms` after it was due, firing `fired` (how each fired) and
/// skipping `skipped` (reason, slots).
pub fn schedule_ticked(
    schedule: &str,
    lag_ms: u64,
    fired: &[&'static str],
    skipped: &[(&'static str, u64)],
) {
    histogram!(SCHEDULE_LAG, "schedule" => schedule.to_owned()).record(lag_ms as f64 / 1000.0);
    for fire in fired {
        counter!(SCHEDULE_FIRES, "schedule" => schedule.to_owned(), "fire" => *fire).increment(1);
    }
    for (reason, slots) in skipped {
        counter!(SCHEDULE_SKIPS, "schedule" => schedule.to_owned(), "reason" => *reason)
            .increment(*slots);
    }
}

/// Expired leases reclaimed by a sweep.
pub fn reclaimed(count: usize) {
    counter!(RECLAIMS).increment(count as u64);
}

/// A guest's outbound request ended with `status` (a status code, `denied` or `error`) after
/// `took`. `origin` is the grant it matched (an `allowed_outbound_hosts` entry, or `none`): a
/// guest chooses the hosts it asks for, so the origin it asked for is no label; nor is the
/// code a server answered with, only its class.
pub fn outbound_request(agent: &str, origin: &str, status: String, took: Duration) {
    let status = status_class(&status);
    counter!(OUTBOUND_REQUESTS, "agent" => agent.to_owned(), "origin" => origin.to_owned(), "status" => status)
        .increment(1);
    histogram!(OUTBOUND_DURATION, "agent" => agent.to_owned(), "origin" => origin.to_owned())
        .record(took.as_secs_f64());
}

/// The `status` label of an outbound request: `denied`, `error`, or the class of a code.
fn status_class(status: &str) -> &'static str {
    match status {
        "denied" => "denied",
        "error" => "error",
        code => match code.parse::<u16>().map(|c| c / 100) {
            Ok(1) => "1xx",
            Ok(2) => "2xx",
            Ok(3) => "3xx",
            Ok(4) => "4xx",
            Ok(5) => "5xx",
            _ => "other",
        },
    }
}

/// Reports the store's own count of its watcher's restarts (the store counts them; telemetry
/// only reads the count, so the store needs nothing from telemetry).
pub fn store_feed_restarts(store: &crate::store::Store) {
    if let Some(restarts) = store.mailbox.feed_restarts() {
        counter!(NATS_WATCHER_RESTARTS).absolute(restarts);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString};
    use metrics_exporter_prometheus::PrometheusRecorder;

    use super::*;

    /// The host's exporter, with one sample of every metric as soon as it is described.
    struct Sampled(PrometheusRecorder);

    const META: Metadata<'static> = Metadata::new(module_path!(), metrics::Level::INFO, None);

    impl Recorder for Sampled {
        fn describe_counter(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
            self.0.describe_counter(key.clone(), unit, help);
            self.0
                .register_counter(&Key::from_name(key), &META)
                .increment(1);
        }
        fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
            self.0.describe_gauge(key.clone(), unit, help);
            self.0.register_gauge(&Key::from_name(key), &META).set(1.0);
        }
        fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
            self.0.describe_histogram(key.clone(), unit, help);
            self.0
                .register_histogram(&Key::from_name(key), &META)
                .record(0.5);
        }
        fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
            self.0.register_counter(key, metadata)
        }
        fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
            self.0.register_gauge(key, metadata)
        }
        fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
            self.0.register_histogram(key, metadata)
        }
    }

    /// Every metric the host describes, one sample each, as the host's exporter renders it,
    /// passes Prometheus's own linter (`promtool check metrics`: base units, suffixes, help).
    /// `PROMTOOL`, else `promtool` on `PATH` (`cargo xtask test` installs Debian's
    /// `prometheus` package for it).
    #[test]
    fn every_metric_the_host_describes_passes_promtool() {
        use std::io::Write;
        let recorder = Sampled(builder().unwrap().build_recorder());
        let handle = recorder.0.handle();
        metrics::with_local_recorder(&recorder, describe);
        let scrape = handle.render();
        assert!(scrape.contains(JOURNAL_SAVED), "{scrape}");
        let promtool = std::env::var_os("PROMTOOL")
            .filter(|p| !p.is_empty())
            .map(std::path::PathBuf::from)
            .or_else(|| {
                std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                    .map(|dir| dir.join("promtool"))
                    .find(|p| p.is_file())
            })
            .expect("promtool not found: set PROMTOOL or put it on PATH (`cargo xtask test` installs Debian's prometheus package)");
        let mut child = std::process::Command::new(&promtool)
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(scrape.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool check metrics:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn an_outbound_status_is_a_class() {
        for (status, class) in [
            ("200", "2xx"),
            ("204", "2xx"),
            ("301", "3xx"),
            ("404", "4xx"),
            ("599", "5xx"),
            ("999", "other"),
            ("denied", "denied"),
            ("error", "error"),
        ] {
            assert_eq!(status_class(status), class, "{status}");
        }
    }
}
