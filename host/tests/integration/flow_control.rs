//! Flow control end to end: a real `homing run` with the `http-probe` guest calling a stand-in
//! API on the loopback address, which counts the requests it holds at once.
//!
//! What is proven: a concurrency key never has more than `key_concurrency` runs at once while
//! other keys run beside it; an origin limit shared by two plugins never lets more than its
//! `concurrency` requests reach the API at once; a plugin `rate` spaces its claims (no window
//! of one period holds more than the burst plus the rate); a 429 with `Retry-After` parks the
//! run, which completes later with no attempt counted (its `max_attempts` is 1); a pause made
//! by another process (the CLI) holds a running host's claims of that agent, and only those,
//! until it is lifted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use serde_json::{Value, json};

use crate::common::{Env, Served, guest, toml_path};

/// What the stand-in API saw: requests in flight now and at most, overall and per `x-key`, and
/// a journal of every request held. Shared with `flow_hosts`.
#[derive(Clone, Default)]
pub(crate) struct Api {
    pub(crate) inner: Arc<Mutex<Seen>>,
}

#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) now: usize,
    pub(crate) max: usize,
    pub(crate) per_key_now: HashMap<String, usize>,
    pub(crate) per_key_max: HashMap<String, usize>,
    flaky_calls: usize,
    /// Every `/hold` request, once it ended (answered, or dropped when its caller went away).
    pub(crate) held: Vec<Held>,
}

/// One `/hold` request: its `x-key` and `x-host` headers and when it was in flight (wall-clock
/// milliseconds, the clock the store stamps records with).
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) key: String,
    pub(crate) host: String,
    pub(crate) start: u64,
    pub(crate) end: u64,
}

#[derive(serde::Deserialize)]
struct Hold {
    ms: u64,
}

/// Wall-clock milliseconds, as the store stamps records.
pub(crate) fn now_ms() -> u64 {
    homing::store::Clock::now_ms(&homing::store::SystemClock)
}

fn header(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// Counts one request out when dropped: when it is answered, and also when its caller dies
/// mid-request and the server drops the handler (a host SIGKILLed while holding a request).
struct InFlight {
    api: Api,
    held: Held,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut seen = self.api.inner.lock().unwrap();
        seen.now -= 1;
        if let Some(n) = seen.per_key_now.get_mut(&self.held.key) {
            *n -= 1;
        }
        let mut held = self.held.clone();
        held.end = now_ms();
        seen.held.push(held);
    }
}

/// `/hold?ms=N` answers after N ms, counting itself in flight meanwhile.
async fn hold(State(api): State<Api>, Query(q): Query<Hold>, headers: HeaderMap) -> &'static str {
    let key = header(&headers, "x-key");
    let _in_flight = {
        let mut seen = api.inner.lock().unwrap();
        seen.now += 1;
        seen.max = seen.max.max(seen.now);
        let n = seen.per_key_now.entry(key.clone()).or_default();
        *n += 1;
        let n = *n;
        let max = seen.per_key_max.entry(key.clone()).or_default();
        *max = (*max).max(n);
        InFlight {
            api: api.clone(),
            held: Held {
                key,
                host: header(&headers, "x-host"),
                start: now_ms(),
                end: 0,
            },
        }
    };
    tokio::time::sleep(Duration::from_millis(q.ms)).await;
    "held"
}

/// `/flaky` answers 429 with `Retry-After: 2` the first time, then 200.
async fn flaky(State(api): State<Api>) -> (StatusCode, HeaderMap, &'static str) {
    let mut seen = api.inner.lock().unwrap();
    seen.flaky_calls += 1;
    let mut headers = HeaderMap::new();
    if seen.flaky_calls == 1 {
        headers.insert("retry-after", "2".parse().unwrap());
        (StatusCode::TOO_MANY_REQUESTS, headers, "slow down")
    } else {
        (StatusCode::OK, headers, "fine")
    }
}

pub(crate) fn start_api() -> (Api, Served) {
    let api = Api::default();
    let app = Router::new()
        .route("/hold", get(hold))
        .route("/flaky", get(flaky))
        .with_state(api.clone());
    (api, Served::start(app))
}

/// A plugin `name` running the probe, allowed to call `served`, with `extra` keys.
pub(crate) fn plugin(name: &str, served: &Served, extra: &str) -> String {
    format!(
        "[plugins.{name}]\npath = {}\ntimeout = \"30s\"\nallowed_outbound_hosts = [\"http://127.0.0.1:{}\"]\n{extra}\n",
        toml_path(&guest("http_probe")),
        served.addr.port()
    )
}

const HOST: &str = "[host]\nlease = \"5s\"\nsweep_interval = \"200ms\"\n";

/// A probe payload: hold a request for `ms` at the stand-in API, sent with `x-key: key`.
pub(crate) fn hold_payload(served: &Served, ms: u64, key: &str) -> String {
    json!({
        "url": format!("http://127.0.0.1:{}/hold?ms={ms}", served.addr.port()),
        "headers": [["x-key", key]],
    })
    .to_string()
}

fn acked(env: &Env, ids: &[String]) -> Vec<Value> {
    ids.iter()
        .map(|id| {
            let d = env.show(id);
            assert_eq!(d["status"], "acked", "{d}");
            d
        })
        .collect()
}

#[test]
fn a_concurrency_key_never_runs_more_than_its_limit_while_other_keys_run_beside_it() {
    let (api, served) = start_api();
    let env = Env::new(&format!(
        "{HOST}{}",
        plugin(
            "probe",
            &served,
            "concurrency = 6\nconcurrency_key = \"meta:customer\"\nkey_concurrency = 2"
        )
    ));
    let mut ids = Vec::new();
    for i in 0..16 {
        let key = if i % 2 == 0 { "a" } else { "b" };
        let meta = format!("customer={key}");
        ids.push(env.enqueue(
            "probe",
            &format!("t{i}"),
            &hold_payload(&served, 150, key),
            &["--meta", &meta],
        ));
    }
    env.run_until_idle();
    let shown = acked(&env, &ids);
    assert!(
        shown.iter().all(|d| d["concurrency_key"].is_string()),
        "the key came from the metadata: {:?}",
        shown[0]
    );
    let seen = api.inner.lock().unwrap();
    for key in ["a", "b"] {
        let max = seen.per_key_max.get(key).copied().unwrap_or_default();
        assert!(max <= 2, "key {key} had {max} runs at once");
        assert!(max >= 1, "key {key} never ran");
    }
    assert!(
        seen.max > 2,
        "the two keys ran beside each other (at most {} at once)",
        seen.max
    );
}

#[test]
fn an_origin_limit_shared_by_two_plugins_holds_their_requests_at_its_concurrency() {
    let (api, served) = start_api();
    let port = served.addr.port();
    let env = Env::new(&format!(
        "{HOST}{}{}[limits.api]\norigins = [\"http://127.0.0.1:{port}\"]\nconcurrency = 2\nrate = \"1000/s\"\n",
        plugin("one", &served, "concurrency = 4\nlimits = [\"api\"]"),
        plugin("two", &served, "concurrency = 4\nlimits = [\"api\"]"),
    ));
    let mut ids = Vec::new();
    for i in 0..12 {
        let agent = if i % 2 == 0 { "one" } else { "two" };
        ids.push(env.enqueue(
            agent,
            &format!("t{i}"),
            &hold_payload(&served, 120, ""),
            &[],
        ));
    }
    env.run_until_idle();
    acked(&env, &ids);
    let seen = api.inner.lock().unwrap();
    assert!(
        seen.max <= 2,
        "{} requests reached the API at once",
        seen.max
    );
    assert_eq!(seen.max, 2, "the limit's two slots were both used");
}

#[test]
fn a_plugin_rate_spaces_its_claims_across_the_period() {
    let (_api, served) = start_api();
    let env = Env::new(&format!(
        "{HOST}{}",
        plugin(
            "probe",
            &served,
            "concurrency = 4\nrate = \"5/s\"\nburst = 1"
        )
    ));
    let ids: Vec<String> = (0..6)
        .map(|i| env.enqueue("probe", &format!("t{i}"), "{}", &[]))
        .collect();
    env.run_until_idle();
    let mut started: Vec<u64> = acked(&env, &ids)
        .iter()
        .map(|d| d["started_at"].as_u64().unwrap())
        .collect();
    started.sort_unstable();
    // One token every 200 ms, none saved up beyond the burst of 1: each start at least
    // (nearly) 200 ms after the one before it.
    for pair in started.windows(2) {
        assert!(
            pair[1] - pair[0] >= 190,
            "claims {} ms apart: {started:?}",
            pair[1] - pair[0]
        );
    }
}

#[test]
fn a_429_with_retry_after_parks_the_run_and_it_completes_with_no_attempt_counted() {
    let (api, served) = start_api();
    let env = Env::new(&format!(
        "{HOST}{}",
        plugin(
            "probe",
            &served,
            "max_attempts = 1\npark_on = [429, 503]\nmax_park = \"30s\""
        )
    ));
    let payload = json!({
        "url": format!("http://127.0.0.1:{}/flaky", served.addr.port()),
        "fail_on_error": true,
    })
    .to_string();
    let id = env.enqueue("probe", "t", &payload, &[]);
    let log = env.run_until_idle();
    let d = env.show(&id);
    assert_eq!(d["status"], "acked", "{d}\n{log}");
    assert_eq!(d["attempt"], 0, "the park counted no attempt: {d}");
    assert_eq!(d["claims"], 2, "it ran twice: {d}");
    assert_eq!(api.inner.lock().unwrap().flaky_calls, 2);
    assert!(log.contains("parks the run"), "{log}");
    assert!(log.contains("outcome=parked"), "{log}");
    // It waited for the Retry-After before running again.
    let started = d["started_at"].as_u64().unwrap();
    let created = d["created_at"].as_u64().unwrap();
    assert!(
        started - created >= 1_900,
        "ran again {} ms in",
        started - created
    );
}

#[test]
fn a_pause_from_another_process_stops_a_running_hosts_claims_until_resumed() {
    let (_api, served) = start_api();
    let env = Env::new(&format!(
        "{HOST}{}{}",
        plugin("probe", &served, ""),
        plugin("marker", &served, "")
    ));
    let mut host = env.spawn_run();
    let paused = env.ok(&["agent", "pause", "probe", "--reason", "incident 42"]);
    assert!(paused.contains("probe"), "{paused}");
    let held = env.enqueue("probe", "t1", "{}", &[]);
    // The host is claiming: a dispatch of another agent, enqueued after, runs to the end...
    let marker = env.enqueue("marker", "t2", "{}", &[]);
    env.wait_status(&marker, "acked", Duration::from_secs(30));
    // ...while the paused agent's stays queued, with no attempt counted.
    let d = env.show(&held);
    assert_eq!(d["status"], "queued", "{d}");
    assert_eq!(d["attempt"], 0, "{d}");
    let status = env.ok(&["agent", "status", "probe"]);
    assert!(status.contains("incident 42"), "{status}");
    env.ok(&["agent", "resume", "probe"]);
    env.wait_status(&held, "acked", Duration::from_secs(30));
    crate::common::signal(&host, "TERM");
    crate::common::wait_exit(&mut host, Duration::from_secs(30));
}
