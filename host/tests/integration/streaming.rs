//! Streaming end to end: the `stream-probe` test guest (built from source) run by a real
//! `homing run`, its deltas read by real HTTP clients from the API's server-sent events, and
//! by the CLI (`enqueue --wait --stream`, `dispatch watch`).
//!
//! The probe emits `tok1`, `tok2`, ... and, with `pause_after`, waits for an inbox message
//! half-way, so clients can be attached before, during and after its run.

use std::pin::Pin;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use serde_json::{Value, json};

use crate::common::{Env, guest, toml_path};
use crate::natsd::free_port;

const OPS: &str = "stream-test-operator-0123456789";
const READER: &str = "stream-test-reader-0123456789";

/// A `homing` process started by a test, killed if the test ends first.
pub(crate) struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The config of a host serving the probe on `port`, with `host` lines added to `[host]`.
pub(crate) fn config(port: u16, host: &str, store: &str) -> String {
    format!(
        r#"
[host]
lease = "10s"
sweep_interval = "200ms"
{host}
{store}
[api]
listen = "127.0.0.1:{port}"
max_streams_per_token = 200
tokens = [
  {{ name = "ops", role = "operator", secret = {{ env = "HOMING_TEST_STREAM_OPS" }} }},
  {{ name = "reader", role = "reader", secret = {{ env = "HOMING_TEST_STREAM_READER" }} }},
]

[plugins.probe]
path = {path}
concurrency = 4
timeout = "60s"
max_attempts = 2
retry = {{ initial = "300ms", max = "300ms" }}
"#,
        path = toml_path(&guest("stream_probe")),
    )
}

/// Starts `homing run` in `env` with the tokens in its environment.
pub(crate) fn spawn_host(env: &Env, log: &str) -> Running {
    let log = std::fs::File::create(env.path().join(log)).unwrap();
    Running(
        env.command(&["run"])
            .env("HOMING_TEST_STREAM_OPS", OPS)
            .env("HOMING_TEST_STREAM_READER", READER)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

/// A host serving the probe with `host` lines in its `[host]` and the embedded store, its
/// API ready: the port, the scratch directory and the process.
async fn serving(host: &str) -> (u16, Env, Running) {
    let port = free_port();
    let env = Env::new(&config(port, host, ""));
    let running = spawn_host(&env, "host.log");
    wait_ready(port).await;
    (port, env, running)
}

/// Waits until the API on `port` is ready.
pub(crate) async fn wait_ready(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let url = format!("http://127.0.0.1:{port}/readyz");
    loop {
        if reqwest::get(&url)
            .await
            .is_ok_and(|r| r.status().as_u16() == 200)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the API on {port} did not get ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One server-sent event.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Ev {
    pub event: String,
    pub id: Option<String>,
    pub data: String,
}

impl Ev {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or(Value::Null)
    }

    /// A delta's text.
    pub fn text(&self) -> String {
        self.json()["text"].as_str().unwrap_or_default().to_owned()
    }
}

/// A client of an event stream.
pub(crate) struct Client {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    body: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    buf: Vec<u8>,
    pub ended: bool,
}

impl Client {
    /// GETs `url` with `token`, resuming after `last` when given.
    pub async fn get(url: &str, token: Option<&str>, last: Option<&str>) -> Client {
        let mut request = reqwest::Client::new().get(url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(last) = last {
            request = request.header("Last-Event-ID", last);
        }
        Client::of(request.send().await.unwrap())
    }

    pub fn of(response: reqwest::Response) -> Client {
        Client {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: Box::pin(response.bytes_stream()),
            buf: Vec::new(),
            ended: false,
        }
    }

    /// The next event (keep-alive comments skipped); `None` once the server ended the stream.
    pub async fn next(&mut self) -> Option<Ev> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..end + 2).collect();
                let text = String::from_utf8(block).unwrap();
                let mut ev = Ev {
                    event: "message".into(),
                    id: None,
                    data: String::new(),
                };
                let mut any = false;
                for line in text.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        ev.event = v.to_owned();
                        any = true;
                    } else if let Some(v) = line.strip_prefix("id: ") {
                        ev.id = Some(v.to_owned());
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        if !ev.data.is_empty() {
                            ev.data.push('\n');
                        }
                        ev.data.push_str(v);
                        any = true;
                    }
                }
                if any {
                    return Some(ev);
                }
                continue;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(60), self.body.next())
                .await
                .expect("no event within 60 s");
            match chunk {
                Some(Ok(bytes)) => self.buf.extend_from_slice(&bytes),
                Some(Err(e)) => panic!("the stream broke: {e}"),
                None => {
                    self.ended = true;
                    return None;
                }
            }
        }
    }

    /// Events until `n` deltas were read.
    pub async fn deltas(&mut self, n: usize) -> Vec<Ev> {
        let mut out = Vec::new();
        let mut seen = 0;
        while seen < n {
            let ev = self.next().await.expect("the stream ended early");
            if ev.event == "delta" {
                seen += 1;
            }
            out.push(ev);
        }
        out
    }

    /// Every event up to the end of the stream; asserts it ends with `result`.
    pub async fn rest(&mut self) -> Vec<Ev> {
        let mut out = Vec::new();
        while let Some(ev) = self.next().await {
            out.push(ev);
        }
        assert_eq!(
            out.last().map(|e| e.event.as_str()),
            Some("result"),
            "{out:#?}"
        );
        out
    }
}

/// What a client shows after `events`: the text of the current claim's deltas (a reset drops
/// the rest), and the ids of the deltas it took.
pub(crate) fn shown(events: &[Ev]) -> (String, Vec<String>) {
    let (mut text, mut ids) = (String::new(), Vec::new());
    for ev in events {
        match ev.event.as_str() {
            "reset" => {
                text.clear();
                ids.push(ev.id.clone().unwrap_or_default());
            }
            "delta" => {
                text.push_str(&ev.text());
                ids.push(ev.id.clone().unwrap_or_default());
            }
            _ => {}
        }
    }
    (text, ids)
}

/// `tok1tok2...tokN`.
pub(crate) fn toks(from: u32, to: u32) -> String {
    (from..=to).map(|i| format!("tok{i}")).collect()
}

/// Enqueues to the probe through the API; returns the id.
pub(crate) async fn enqueue(port: u16, thread: &str, payload: Value) -> String {
    let response = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/dispatches"))
        .bearer_auth(OPS)
        .json(&json!({"agent": "probe", "thread": thread, "payload": payload.to_string()}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201);
    response.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Sends a message to `thread` (the paused probe goes on).
pub(crate) async fn release(port: u16, thread: &str) {
    let response = reqwest::Client::new()
        .post(format!(
            "http://127.0.0.1:{port}/v1/threads/{thread}/messages"
        ))
        .bearer_auth(OPS)
        .json(&json!({"payload": "go on"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status().as_u16(),
        201,
        "{:?}",
        response.text().await
    );
}

pub(crate) fn stream_url(port: u16, id: &str) -> String {
    format!("http://127.0.0.1:{port}/v1/dispatches/{id}/stream")
}

/// Deltas reach a client connected before the run (through `POST ?stream=true`), one that
/// connects during it, one after it, and one resuming mid-stream with `Last-Event-ID`: all of
/// them, in order, once each, then the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deltas_reach_clients_connected_before_during_and_after_the_run() {
    let (port, _env, _host) = serving("").await;

    let response = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/dispatches?stream=true"))
        .bearer_auth(OPS)
        .json(&json!({"agent": "probe", "thread": "t1",
            "payload": json!({"count": 50, "pause_after": 20}).to_string()}))
        .send()
        .await
        .unwrap();
    let mut before = Client::of(response);
    assert_eq!(before.status, 200);
    let id = before.headers["homing-dispatch-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let first = before.next().await.unwrap();
    assert_eq!(first.event, "status", "{first:?}");
    assert_eq!(first.json()["id"], id.as_str());
    let mut got = vec![first];
    got.extend(before.deltas(20).await);

    let mut during = Client::get(&stream_url(port, &id), Some(READER), None).await;
    assert_eq!(during.status, 200);
    let mut got_during = during.deltas(20).await;
    release(port, "t1").await;
    got.extend(before.rest().await);
    got_during.extend(during.rest().await);

    let mut after = Client::get(&stream_url(port, &id), Some(READER), None).await;
    let got_after = after.rest().await;
    let mut resumed = Client::get(&stream_url(port, &id), Some(READER), Some("1:25")).await;
    let got_resumed = resumed.rest().await;

    let all: Vec<String> = (1..=50).map(|i| format!("1:{i}")).collect();
    for (name, events) in [
        ("before", &got),
        ("during", &got_during),
        ("after", &got_after),
    ] {
        let (text, ids) = shown(events);
        assert_eq!(text, toks(1, 50), "{name}");
        assert_eq!(ids, all, "{name}: every delta once, in order");
        let result = events.last().unwrap().json();
        assert_eq!(result["status"], "acked", "{name}: {result}");
        assert_eq!(
            serde_json::from_str::<Value>(result["output"].as_str().unwrap()).unwrap()["last_seq"],
            50
        );
    }
    let (text, ids) = shown(&got_resumed);
    assert_eq!(text, toks(26, 50));
    assert_eq!(ids, all[25..].to_vec());

    // The result's id is `end`; a client reconnecting after it (as an `EventSource` that was not
    // closed does) is answered 204, which stops it, not the result again.
    assert_eq!(got_after.last().unwrap().id.as_deref(), Some("end"));
    let again = Client::get(&stream_url(port, &id), Some(READER), Some("end")).await;
    assert_eq!(again.status, 204);
    let again = Client::get(
        &format!("{}?after=end", stream_url(port, &id)),
        Some(READER),
        None,
    )
    .await;
    assert_eq!(again.status, 204);

    // The metrics count what was streamed.
    let metrics = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .bearer_auth(OPS)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("homing_stream_deltas_total{agent=\"probe\"} 50"),
        "{metrics}"
    );
    assert!(
        metrics.contains("homing_stream_client_lag_bucket"),
        "{metrics}"
    );
    assert!(metrics.contains("homing_streams_open"), "{metrics}");
}

/// A run that fails after streaming and is retried: its watcher is told `reset` (id `2:0`)
/// before the second claim's deltas, which start again at 1; what it shows at the end is the
/// second run's text alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_run_sends_reset_before_its_new_deltas() {
    let (port, _env, _host) = serving("").await;
    let id = enqueue(
        port,
        "t1",
        json!({"count": 5, "fail_on_attempts": [0], "fail_after": 3}),
    )
    .await;
    let mut client = Client::get(&stream_url(port, &id), Some(READER), None).await;
    let events = client.rest().await;
    let (text, ids) = shown(&events);
    assert_eq!(text, toks(1, 5), "{events:#?}");
    let reset = ids.iter().position(|i| i == "2:0").expect("a reset");
    assert_eq!(
        ids[reset..].to_vec(),
        ["2:0", "2:1", "2:2", "2:3", "2:4", "2:5"],
        "{ids:?}"
    );
    assert!(
        ids[..reset].iter().all(|i| i.starts_with("1:")),
        "the first claim's deltas come first: {ids:?}"
    );
    // A client resuming from inside the first claim is told to reset too.
    let mut late = Client::get(&stream_url(port, &id), Some(READER), Some("1:2")).await;
    let events = late.rest().await;
    let (text, ids) = shown(&events);
    assert_eq!(text, toks(1, 5));
    assert_eq!(ids.first().map(String::as_str), Some("2:0"), "{ids:?}");
}

/// Past `max_stream_bytes` and past `max_emit_rate`, `emit` is refused naming the limit; the
/// run goes on and acks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emit_is_refused_past_the_caps_naming_them() {
    let (port, _env, _host) = serving("max_stream_bytes = \"64KiB\"\nmax_emit_rate = 1000").await;
    // 62 chunks of 1,000 bytes (and 48 bytes each for the host's hold on them) fit in 64 KiB;
    // the 63rd does not.
    let bytes = enqueue(port, "t1", json!({"expect_refusal": true, "size": 1000})).await;
    let rate = enqueue(port, "t2", json!({"expect_refusal": true})).await;
    for (id, at, limit) in [(bytes, 63, "max_stream_bytes"), (rate, 0, "max_emit_rate")] {
        let mut client = Client::get(&stream_url(port, &id), Some(READER), None).await;
        let events = client.rest().await;
        let result = events.last().unwrap().json();
        let output: Value = serde_json::from_str(result["output"].as_str().unwrap()).unwrap();
        assert!(
            output["error"].as_str().unwrap().contains(limit),
            "{output}"
        );
        let refused = output["refused_at"].as_u64().unwrap();
        if at > 0 {
            assert_eq!(refused, at, "{output}");
        } else {
            // A burst of one second's worth, then the rate.
            assert!((1000..=1100).contains(&refused), "{output}");
        }
    }
}

/// 100 clients watch one run: each gets every delta in order and the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_clients_watch_one_run() {
    let (port, _env, _host) = serving("").await;
    let id = enqueue(port, "t1", json!({"count": 200, "pause_after": 1})).await;
    let mut clients = Vec::new();
    for _ in 0..100 {
        let mut c = Client::get(&stream_url(port, &id), Some(READER), None).await;
        assert_eq!(c.status, 200);
        c.deltas(1).await;
        clients.push(c);
    }
    release(port, "t1").await;
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut c| tokio::spawn(async move { c.rest().await }))
        .collect();
    for task in tasks {
        let events = task.await.unwrap();
        let (text, ids) = shown(&events);
        assert_eq!(text, toks(2, 200));
        assert_eq!(ids.len(), 199);
    }
}

/// Clients that read nothing do not make the host keep what they have not read: the host's
/// memory grows by about the run's buffer, not by the buffer per client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_read_nothing_keep_the_hosts_memory_bounded() {
    let (port, _env, host) = serving("max_stream_bytes = \"9MiB\"").await;
    let rss = || {
        let status = std::fs::read_to_string(format!("/proc/{}/status", host.0.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
            .unwrap()
            * 1024
    };
    // Warm up: one run streamed and read, so the first-run allocations are behind us.
    let warm = enqueue(port, "warm", json!({"count": 100, "size": 65536})).await;
    Client::get(&stream_url(port, &warm), Some(READER), None)
        .await
        .rest()
        .await;
    let id = enqueue(
        port,
        "t1",
        json!({"count": 128, "size": 65536, "pause_after": 1}),
    )
    .await;
    let mut idle = Vec::new();
    for _ in 0..20 {
        let mut c = Client::get(&stream_url(port, &id), Some(READER), None).await;
        c.deltas(1).await;
        idle.push(c);
    }
    let before = rss();
    release(port, "t1").await;
    // The run streams 8 MiB while twenty clients read nothing.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let d: Value = reqwest::Client::new()
            .get(format!("http://127.0.0.1:{port}/v1/dispatches/{id}"))
            .bearer_auth(READER)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if d["status"] == "acked" {
            break;
        }
        assert!(Instant::now() < deadline, "{d}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let grown = rss().saturating_sub(before);
    // Unbounded per-client queues would hold 20 x 8 MiB; the run's own buffer is 8 MiB.
    assert!(
        grown < 48 << 20,
        "the host grew by {} MiB with 20 idle clients",
        grown >> 20
    );
    // The idle clients still get everything when they read (resuming where a `dropped` said).
    let mut events = Vec::new();
    let mut client = idle.swap_remove(0);
    loop {
        let mut got = Vec::new();
        while let Some(ev) = client.next().await {
            got.push(ev);
        }
        let last = got.last().cloned().expect("an event");
        events.extend(got);
        match last.event.as_str() {
            "result" => break,
            "dropped" => {
                let at = last.json()["last"].as_str().unwrap().to_owned();
                client = Client::get(&stream_url(port, &id), Some(READER), Some(&at)).await;
            }
            other => panic!("the stream ended with {other}"),
        }
    }
    let (_, ids) = shown(&events);
    let want: Vec<String> = (2..=128).map(|i| format!("1:{i}")).collect();
    assert_eq!(ids, want);
}

/// An unknown dispatch is 404 (with `Last-Event-ID: end` too), a bad `Last-Event-ID` 400, no
/// token 401, and a reader may not
/// enqueue with `?stream=true` (403).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_ids_bad_cursors_and_missing_roles_are_refused() {
    let (port, _env, _host) = serving("").await;
    let c = Client::get(&stream_url(port, "no-such-dispatch"), Some(READER), None).await;
    assert_eq!(c.status, 404);
    let c = Client::get(&stream_url(port, "no-such-dispatch"), None, None).await;
    assert_eq!(c.status, 401);
    let c = Client::get(
        &stream_url(port, "no-such-dispatch"),
        Some(READER),
        Some("end"),
    )
    .await;
    assert_eq!(
        c.status, 404,
        "an unknown dispatch is unknown after its end too"
    );
    let c = Client::get(&stream_url(port, "no-such-dispatch"), None, Some("end")).await;
    assert_eq!(c.status, 401);
    let id = enqueue(port, "t1", json!({"count": 1})).await;
    let c = Client::get(&stream_url(port, &id), Some(READER), Some("seven")).await;
    assert_eq!(c.status, 400);
    let response = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/dispatches?stream=true"))
        .bearer_auth(READER)
        .json(&json!({"agent": "probe", "thread": "t2", "payload": "{}"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 403);
    let response = reqwest::Client::new()
        .post(format!(
            "http://127.0.0.1:{port}/v1/dispatches?stream=maybe"
        ))
        .bearer_auth(OPS)
        .json(&json!({"agent": "probe", "thread": "t2", "payload": "{}"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 400);
}

/// `homing enqueue --wait --stream` prints the deltas as they come, then the result;
/// `homing dispatch watch` prints a finished dispatch's deltas and its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_streams_a_run_and_watches_a_dispatch() {
    let (_port, env, _host) = serving("").await;
    let out = env.ok(&[
        "enqueue",
        "--agent",
        "probe",
        "--thread",
        "t1",
        "--payload",
        r#"{"count": 5, "fail_on_attempts": [0], "fail_after": 2}"#,
        "--wait",
        "--stream",
    ]);
    let lines: Vec<&str> = out.lines().collect();
    // The first run's deltas, the line saying it started again, the second run's, the result
    // (the first two are missed only if the watch began after the retry did).
    let n = lines.len();
    assert!(n == 4 || n == 2, "{out}");
    if n == 4 {
        assert_eq!(lines[0], "tok1tok2", "{out}");
        assert!(lines[1].contains("started again"), "{out}");
    }
    assert_eq!(lines[n - 2], toks(1, 5), "{out}");
    assert!(lines[n - 1].contains("\"last_seq\":5"), "{out}");
    let id = env.ok(&[
        "enqueue",
        "--agent",
        "probe",
        "--thread",
        "t2",
        "--payload",
        r#"{"count": 3}"#,
    ]);
    let id = id.trim();
    env.wait_status(id, "acked", Duration::from_secs(60));
    let out = env.ok(&["dispatch", "watch", id]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], toks(1, 3), "{out}");
    assert!(lines[1].contains("\"last_seq\":3"), "{out}");
    let refused = env.fails(&["dispatch", "watch", "no-such-dispatch"]);
    assert!(refused.contains("no-such-dispatch"), "{refused}");
}

/// On NATS, a client of one host's API watches a run on another host: the deltas come over
/// the live bus (and the stored batches), all of them in order, then the result; a client
/// resuming there after the run gets the rest from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_on_one_nats_host_watches_a_run_on_another() {
    let server = crate::natsd::NatsServer::start();
    let store = format!(
        "[store]\nbackend = \"nats\"\nurl = \"{}\"\nprefix = \"streams\"\nconnect_timeout = \"60s\"\n",
        server.url()
    );
    let (port_a, port_b) = (free_port(), free_port());
    let env_a = Env::new(&config(port_a, "id = \"host-a\"", &store));
    // Host B serves the API only: its one plugin is under another name, so it never claims
    // the probe's dispatches.
    let env_b = Env::new(
        &config(port_b, "id = \"host-b\"", &store).replace("[plugins.probe]", "[plugins.other]"),
    );
    let _a = spawn_host(&env_a, "host.log");
    let _b = spawn_host(&env_b, "host.log");
    wait_ready(port_a).await;
    wait_ready(port_b).await;

    let id = enqueue(port_a, "t1", json!({"count": 50, "pause_after": 20})).await;
    let mut client = Client::get(&stream_url(port_b, &id), Some(READER), None).await;
    assert_eq!(client.status, 200);
    let mut events = client.deltas(20).await;
    release(port_a, "t1").await;
    events.extend(client.rest().await);
    let (text, ids) = shown(&events);
    assert_eq!(text, toks(1, 50), "{}", env_a.host_log());
    assert_eq!(ids, (1..=50).map(|i| format!("1:{i}")).collect::<Vec<_>>());
    assert_eq!(events.last().unwrap().json()["status"], "acked");

    let mut resumed = Client::get(&stream_url(port_b, &id), Some(READER), Some("1:10")).await;
    let (text, _) = shown(&resumed.rest().await);
    assert_eq!(text, toks(11, 50));
}

/// The dashboard's dispatch page shows the output live in Chromium: what the run streamed so
/// far while it waits, the rest as it comes, inserted as text (a delta holding markup shows
/// as the characters it is), then the outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dispatch_page_shows_live_output_in_a_browser() {
    let (port, _env, _host) = serving("").await;
    let id = enqueue(
        port,
        "t1",
        json!({"count": 6, "pause_after": 3, "text": "<b>tok</b>"}),
    )
    .await;
    let base = format!("http://127.0.0.1:{port}");
    let browser = crate::browser::Browser::start(1280, 900).await;
    browser.login(&base, OPS).await;
    browser.goto(&format!("{base}/dispatches/{id}")).await;
    let part: String = (1..=3).map(|i| format!("<b>tok</b>{i}")).collect();
    browser
        .wait_text("#output-text", "the first deltas", |t| t == part)
        .await;
    assert_eq!(browser.count("#output-text b").await, 0, "text, not markup");
    release(port, "t1").await;
    let all: String = (1..=6).map(|i| format!("<b>tok</b>{i}")).collect();
    browser
        .wait_text("#output-text", "every delta", |t| t == all)
        .await;
    browser
        .wait_text("#output-state", "the outcome", |t| t.contains("acked"))
        .await;
    browser.screenshot("live-output").await;
    browser.close().await;
}

/// `GET /v1/threads/{thread}/log/stream?deltas=true` carries the running dispatch's deltas
/// (without ids, so `Last-Event-ID` keeps naming log sequences) among the thread's entries and
/// messages; a bad `deltas` value is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_thread_stream_carries_deltas_when_asked() {
    let (port, _env, _host) = serving("").await;
    let url = format!("http://127.0.0.1:{port}/v1/threads/t1/log/stream");
    let bad = Client::get(&format!("{url}?deltas=maybe"), Some(READER), None).await;
    assert_eq!(bad.status, 400);
    let mut client = Client::get(&format!("{url}?deltas=true"), Some(READER), None).await;
    assert_eq!(client.status, 200);
    let id = enqueue(port, "t1", json!({"count": 4, "pause_after": 2})).await;
    let mut events = client.deltas(2).await;
    release(port, "t1").await;
    events.extend(client.deltas(2).await);
    let deltas: Vec<&Ev> = events.iter().filter(|e| e.event == "delta").collect();
    let texts: Vec<String> = deltas.iter().map(|e| e.text()).collect();
    assert_eq!(texts, ["tok1", "tok2", "tok3", "tok4"], "{events:#?}");
    for d in &deltas {
        assert_eq!(d.id, None, "{d:?}");
        assert_eq!(d.json()["dispatch"], id.as_str());
    }
}
