//! The HTTP API end to end: a real `homing run` with `[api] listen`, on the embedded store and
//! on a real `nats-server`, called with a real HTTP client (reqwest) over loopback. Every route
//! and every error status; tokens missing, wrong and of too small a role, refused and logged
//! without the token; a public `listen` without tokens refusing to start; `?wait` returning as
//! the dispatch completes; the SSE stream in order; `/metrics` counting the work done; 1,000
//! concurrent enqueues from many clients, each acked exactly once; `/readyz` following the
//! NATS server down and up.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::common::{Env, guest, promtool_check, toml_path};
use crate::hosts::Host;
use crate::natsd::{NatsServer, free_port};

pub(crate) const READER: &str = "reader-secret-0123456789abcdef";
pub(crate) const PRODUCER: &str = "producer-secret-0123456789abcdef";
pub(crate) const OPERATOR: &str = "operator-secret-0123456789abcdef";

/// Which store a test host runs on.
enum Backend {
    Embedded,
    Nats(NatsServer),
}

impl Backend {
    fn nats() -> Backend {
        Backend::Nats(NatsServer::start())
    }

    fn store_section(&self) -> String {
        match self {
            Backend::Embedded => String::new(),
            Backend::Nats(server) => format!(
                "[store]\nbackend = \"nats\"\nurl = \"{}\"\nprefix = \"api\"\nrequest_timeout = \"1s\"\nconnect_timeout = \"10s\"\n",
                server.url()
            ),
        }
    }
}

/// The `[api] tokens` of a test host: `reader` and `producer` from the environment [`spawn`]
/// sets, `operator` from the file [`Api::start_with`] writes.
pub(crate) const TOKENS: &str = r#"tokens = [
  { name = "reader", role = "reader", secret = { env = "HOMING_TEST_READER" } },
  { name = "producer", role = "producer", secret = { env = "HOMING_TEST_PRODUCER" } },
  { name = "operator", role = "operator", secret = { file = "operator.token" } },
]"#;

fn config(backend: &Backend, port: u16) -> String {
    format!(
        r#"
[host]
lease = "5s"
sweep_interval = "200ms"
shutdown_grace = "2s"
max_payload = "64KiB"
max_inbox = 4

{store}
[api]
listen = "127.0.0.1:{port}"
request_timeout = "10s"
max_wait = "30s"
{TOKENS}

[plugins.echo]
path = {echo}
concurrency = 4

[plugins.sandbox]
path = {sandbox}
concurrency = 8
max_attempts = 1
timeout = "60s"
memory = "16MiB"
"#,
        store = backend.store_section(),
        echo = toml_path(&guest("echo")),
        sandbox = toml_path(&guest("sandbox")),
    )
}

/// A running `homing run` with its API, and a client.
pub(crate) struct Api {
    pub(crate) env: Env,
    /// Killed when the test ends.
    _host: Host,
    pub(crate) base: String,
    client: reqwest::Client,
}

impl Api {
    /// Starts a host on `backend` and waits until `/readyz` says ready.
    async fn start(backend: &Backend) -> Api {
        Api::start_with(|port| config(backend, port), |_| {}).await
    }

    /// Starts a host with the config `config(port)` makes (tokens as in [`config`]), after
    /// `prepare` has seen its directory, and waits until `/readyz` says ready.
    pub(crate) async fn start_with(
        config: impl FnOnce(u16) -> String,
        prepare: impl FnOnce(&std::path::Path),
    ) -> Api {
        Api::start_full(config, prepare, &[]).await
    }

    /// [`Api::start_with`] with these variables in the host's environment.
    pub(crate) async fn start_with_env(
        config: impl FnOnce(u16) -> String,
        vars: &[(&str, &str)],
    ) -> Api {
        Api::start_full(config, |_| {}, vars).await
    }

    async fn start_full(
        config: impl FnOnce(u16) -> String,
        prepare: impl FnOnce(&std::path::Path),
        vars: &[(&str, &str)],
    ) -> Api {
        let port = free_port();
        let env = Env::new(&config(port));
        prepare(env.path());
        std::fs::write(env.path().join("operator.token"), format!("{OPERATOR}\n")).unwrap();
        let host = spawn(&env, vars);
        let api = Api {
            env,
            _host: host,
            base: format!("http://127.0.0.1:{port}"),
            client: client(),
        };
        api.wait_ready().await;
        api
    }

    /// The host's process.
    pub(crate) fn host(&self) -> &std::process::Child {
        &self._host.0
    }

    /// The host's process id.
    pub(crate) fn pid(&self) -> u32 {
        self._host.0.id()
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.env.path().join("host.log")).unwrap_or_default()
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = self.client.get(self.url("/readyz")).send().await
                && r.status() == 200
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the API did not get ready:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self.client.request(method, self.url(path));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("{path}: not JSON ({status}): {text}"));
        (status, value)
    }

    pub(crate) async fn get(&self, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, Some(READER), None)
            .await
    }

    pub(crate) async fn post(&self, path: &str, token: &str, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::POST, path, Some(token), Some(body))
            .await
    }

    /// A call of `method` with `token` (none: unauthenticated) and an optional body.
    pub(crate) async fn call_as(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        self.call(method, path, token, body).await
    }

    /// Enqueues and returns the id, expecting 201.
    pub(crate) async fn enqueue(&self, body: Value) -> String {
        let (status, reply) = self.post("/v1/dispatches", PRODUCER, body.clone()).await;
        assert_eq!(status, 201, "{body} -> {reply}");
        reply["id"].as_str().unwrap().to_owned()
    }

    /// Long-polls a dispatch until it is terminal.
    pub(crate) async fn wait_terminal(&self, id: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (status, d) = self.get(&format!("/v1/dispatches/{id}?wait=20s")).await;
            assert_eq!(status, 200, "{d}\n{}", self.log());
            if d["terminal"] == true {
                return d;
            }
            assert!(
                Instant::now() < deadline,
                "{id} not terminal: {d}\n{}",
                self.log()
            );
        }
    }

    /// The metrics page, as `name{labels}` → value.
    pub(crate) async fn metrics(&self) -> BTreeMap<String, f64> {
        parse_metrics(&self.scrape().await)
    }

    /// The metrics page as it is served.
    pub(crate) async fn scrape(&self) -> String {
        let response = self
            .client
            .get(self.url("/metrics"))
            .bearer_auth(READER)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        response.text().await.unwrap()
    }
}

fn spawn(env: &Env, vars: &[(&str, &str)]) -> Host {
    let log = std::fs::File::create(env.path().join("host.log")).unwrap();
    env.command(&["run"])
        .envs(vars.iter().copied())
        .env("HOMING_TEST_READER", READER)
        .env("HOMING_TEST_PRODUCER", PRODUCER)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map(Host)
        .unwrap()
}

/// Parses the Prometheus text format: every sample line as `name{labels}` → value (labels as
/// printed, sorted by the exporter's order).
pub(crate) fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (key, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line}"));
        out.insert(key.to_owned(), value);
    }
    out
}

/// The sample of `name` whose labels include every `k="v"` of `labels`.
pub(crate) fn sample(metrics: &BTreeMap<String, f64>, name: &str, labels: &[(&str, &str)]) -> f64 {
    metrics
        .iter()
        .filter(|(key, _)| {
            key.split('{').next() == Some(name)
                && labels
                    .iter()
                    .all(|(k, v)| key.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|(_, v)| *v)
        .sum()
}

async fn every_route_and_status(backend: Backend) {
    let api = Api::start(&backend).await;
    use reqwest::Method;

    // Enqueue, then wait for the result.
    let id = api
        .enqueue(json!({ "agent": "echo", "thread": "t1", "payload": "hello", "metadata": { "k": "v" } }))
        .await;
    let d = api.wait_terminal(&id).await;
    assert_eq!(d["status"], "acked", "{d}");
    assert_eq!(d["result"]["output"], "hello");
    assert_eq!(d["metadata"]["k"], "v");
    assert!(
        d.get("claim").is_none() && !d.to_string().contains("token"),
        "{d}"
    );
    // Binary payloads go in and come out as base64.
    let bin = api
        .enqueue(json!({ "agent": "echo", "thread": "t1", "payload_base64": "/wBB" }))
        .await;
    let d = api.wait_terminal(&bin).await;
    assert_eq!(d["result"]["output"]["base64"], "/wBB", "{d}");

    // A `traceparent` header is kept in the dispatch (the host continues that trace); a
    // malformed one is dropped rather than stored.
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut traced = Vec::new();
    for (header, kept) in [(parent, Some(parent)), ("00-not-a-trace", None)] {
        let response = api
            .client
            .post(api.url("/v1/dispatches"))
            .bearer_auth(PRODUCER)
            .header("traceparent", header)
            .json(&json!({ "agent": "echo", "thread": "t1", "payload": "traced" }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 201);
        let reply: Value = response.json().await.unwrap();
        let id = reply["id"].as_str().unwrap().to_owned();
        let d = api.wait_terminal(&id).await;
        assert_eq!(d["metadata"]["traceparent"].as_str(), kept, "{d}");
        traced.push(id);
    }

    // 409: an id taken by different content names the holder; a held dedupe key names its holder.
    let (status, body) = api
        .post(
            "/v1/dispatches",
            PRODUCER,
            json!({ "agent": "echo", "thread": "t1", "payload": "other", "id": id }),
        )
        .await;
    assert_eq!(
        (status, body["id"].as_str()),
        (409, Some(id.as_str())),
        "{body}"
    );
    let held = api
        .enqueue(json!({ "agent": "echo", "thread": "t2", "payload": "later", "delay": "1h", "dedupe_key": "k1" }))
        .await;
    let (status, body) = api
        .post(
            "/v1/dispatches",
            PRODUCER,
            json!({ "agent": "echo", "thread": "t2", "payload": "again", "dedupe_key": "k1" }),
        )
        .await;
    assert_eq!(
        (status, body["id"].as_str()),
        (409, Some(held.as_str())),
        "{body}"
    );

    // A debounced enqueue joins its window: the same id, and the window says how many.
    let window = json!({ "key": "burst", "quiet": "1h", "max_wait": "2h", "payload": "collect" });
    let opened = api
        .enqueue(json!({ "agent": "echo", "thread": "t3", "payload": "a", "debounce": window }))
        .await;
    let (status, body) = api
        .post(
            "/v1/dispatches",
            PRODUCER,
            json!({ "agent": "echo", "thread": "t3", "payload": "b", "debounce": window }),
        )
        .await;
    assert_eq!(
        (
            status,
            body["id"].as_str(),
            body["window"]["count"].as_u64()
        ),
        (201, Some(opened.as_str()), Some(2)),
        "{body}"
    );
    let (_, shown) = api.get(&format!("/v1/dispatches/{opened}")).await;
    assert_eq!(shown["window"]["items"][1]["payload"], "b", "{shown}");
    // Cancelled, so the lists below see it as settled.
    let (status, _) = api
        .post(
            &format!("/v1/dispatches/{opened}/cancel"),
            OPERATOR,
            json!({}),
        )
        .await;
    assert_eq!(status, 200);
    for (debounce, field) in [
        (
            json!({ "key": "k", "quiet": "3s", "max_wait": "1s" }),
            "debounce.quiet",
        ),
        (json!({ "key": "k", "quiet": "1s" }), "debounce.max_wait"),
        (
            json!({ "key": "k", "quiet": "1s", "max_wait": "2s", "payload": "all" }),
            "debounce.payload",
        ),
        (
            json!({ "key": "k", "quiet": "1s", "max_wait": "2s", "max_items": 0 }),
            "debounce.max_items",
        ),
        (
            json!({ "key": "k", "quiet": "1s", "max_wait": "2s", "extra": 1 }),
            "debounce.extra",
        ),
        (json!("soon"), "debounce"),
    ] {
        let (status, body) = api
            .post(
                "/v1/dispatches",
                PRODUCER,
                json!({ "agent": "echo", "thread": "t4", "debounce": debounce }),
            )
            .await;
        assert_eq!(
            (status, body["field"].as_str()),
            (400, Some(field)),
            "{body}"
        );
    }

    // 404 for an unknown agent; 413 over max_payload and over the body cap; 400 naming the field.
    let (status, body) = api
        .post(
            "/v1/dispatches",
            PRODUCER,
            json!({ "agent": "nobody", "thread": "t" }),
        )
        .await;
    assert_eq!(
        (status, body["field"].as_str()),
        (404, Some("agent")),
        "{body}"
    );
    let big = "x".repeat(64 * 1024 + 1);
    let (status, body) = api
        .post(
            "/v1/dispatches",
            PRODUCER,
            json!({ "agent": "echo", "thread": "t", "payload": big }),
        )
        .await;
    assert_eq!(
        (status, body["field"].as_str()),
        (413, Some("payload")),
        "{body}"
    );
    let huge = "x".repeat(400 * 1024);
    let (status, body) = api
        .post(
            "/v1/dispatches",
            PRODUCER,
            json!({ "agent": "echo", "thread": "t", "payload": huge }),
        )
        .await;
    assert_eq!(
        (status, body["field"].as_str()),
        (413, Some("body")),
        "{body}"
    );
    for (bad, field) in [
        (json!({ "thread": "t" }), "agent"),
        (json!({ "agent": "echo", "thread": 5 }), "thread"),
        (
            json!({ "agent": "echo", "thread": "t", "priority": 300 }),
            "priority",
        ),
        (
            json!({ "agent": "echo", "thread": "t", "delay": "soon" }),
            "delay",
        ),
        (
            json!({ "agent": "echo", "thread": "t", "max_attempts": 0 }),
            "max_attempts",
        ),
        (
            json!({ "agent": "echo", "thread": "t", "payload_base64": "@@" }),
            "payload_base64",
        ),
        (
            json!({ "agent": "echo", "thread": "t", "metadata": { "a": 1 } }),
            "metadata",
        ),
        (
            json!({ "agent": "echo", "thread": "t", "colour": "red" }),
            "colour",
        ),
        (json!({ "agent": "echo", "thread": " " }), "thread"),
        (json!(["not", "an", "object"]), "body"),
    ] {
        let (status, body) = api.post("/v1/dispatches", PRODUCER, bad.clone()).await;
        assert_eq!(
            (status, body["field"].as_str()),
            (400, Some(field)),
            "{bad} -> {body}"
        );
        assert!(
            !body["error"].as_str().unwrap().contains("at src/"),
            "{body}"
        );
    }
    let response = api
        .client
        .post(api.url("/v1/dispatches"))
        .bearer_auth(PRODUCER)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);

    // GET: 404 for a missing id, 400 for a bad wait or an unknown parameter.
    assert_eq!(api.get("/v1/dispatches/nope").await.0, 404);
    let (status, body) = api.get(&format!("/v1/dispatches/{id}?wait=forever")).await;
    assert_eq!(
        (status, body["field"].as_str()),
        (400, Some("wait")),
        "{body}"
    );
    let (status, body) = api.get(&format!("/v1/dispatches/{id}?wait=5m")).await;
    assert_eq!(
        (status, body["field"].as_str()),
        (400, Some("wait")),
        "{body}"
    );
    let (status, body) = api.get(&format!("/v1/dispatches/{id}?colour=red")).await;
    assert_eq!(
        (status, body["field"].as_str()),
        (400, Some("colour")),
        "{body}"
    );

    // The list, paged, and filtered.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/dispatches?agent=echo&limit=1&cursor={}", urlencode(c)),
            None => "/v1/dispatches?agent=echo&limit=1".to_owned(),
        };
        let (status, page) = api.get(&path).await;
        assert_eq!(status, 200, "{page}");
        for d in page["dispatches"].as_array().unwrap() {
            seen.push(d["id"].as_str().unwrap().to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    let mut expected = vec![id.clone(), bin.clone(), held.clone(), opened.clone()];
    expected.extend(traced);
    expected.sort();
    seen.sort();
    assert_eq!(seen, expected);
    let (_, page) = api.get("/v1/dispatches?status=queued").await;
    let queued: Vec<&str> = page["dispatches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(queued, vec![held.as_str()]);
    for bad in [
        "status=done",
        "limit=0",
        "limit=5000",
        "cursor=zzz",
        "colour=red",
    ] {
        let (status, body) = api.get(&format!("/v1/dispatches?{bad}")).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body["field"].is_string(), "{body}");
    }

    // Cancel: 200 for a queued one, 409 once it is not queued, 404 for none.
    let (status, body) = api
        .post(
            &format!("/v1/dispatches/{held}/cancel"),
            OPERATOR,
            json!({}),
        )
        .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("cancelled")),
        "{body}"
    );
    let (status, body) = api
        .post(
            &format!("/v1/dispatches/{held}/cancel"),
            OPERATOR,
            json!({}),
        )
        .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (409, Some("cancelled")),
        "{body}"
    );
    assert_eq!(
        api.post("/v1/dispatches/nope/cancel", OPERATOR, json!({}))
            .await
            .0,
        404
    );

    // Retry: 201 for a cancelled or dead-lettered one, 409 for an acked one, 404 for none.
    let (status, body) = api
        .post(&format!("/v1/dispatches/{held}/retry"), OPERATOR, json!({}))
        .await;
    assert_eq!(status, 201, "{body}");
    let retried = body["id"].as_str().unwrap().to_owned();
    let (_, d) = api.get(&format!("/v1/dispatches/{retried}")).await;
    assert_eq!(d["metadata"]["retry-of"], held.as_str());
    let (status, body) = api
        .post(&format!("/v1/dispatches/{id}/retry"), OPERATOR, json!({}))
        .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (409, Some("acked")),
        "{body}"
    );
    assert_eq!(
        api.post("/v1/dispatches/nope/retry", OPERATOR, json!({}))
            .await
            .0,
        404
    );
    let dead = api
        .enqueue(json!({ "agent": "sandbox", "thread": "d1", "payload": "panic" }))
        .await;
    let d = api.wait_terminal(&dead).await;
    assert_eq!(d["status"], "dead_letter", "{d}");
    assert!(d["last_error"].is_string(), "{d}");
    let (status, _) = api
        .post(&format!("/v1/dispatches/{dead}/retry"), OPERATOR, json!({}))
        .await;
    assert_eq!(status, 201);

    // The thread log, paged; interrupt.
    let journaled = api
        .enqueue(json!({ "agent": "sandbox", "thread": "j1", "payload": "journal:0" }))
        .await;
    api.wait_terminal(&journaled).await;
    let (status, log) = api.get("/v1/threads/j1/log").await;
    assert_eq!(status, 200, "{log}");
    assert_eq!(log["latest"], 2);
    assert_eq!(log["entries"][0]["data"], format!("start {journaled}"));
    assert_eq!(log["entries"][1]["seq"], 2);
    let (_, page) = api.get("/v1/threads/j1/log?after=1&limit=1").await;
    assert_eq!(page["entries"].as_array().unwrap().len(), 1);
    assert_eq!(page["entries"][0]["data"], format!("end {journaled}"));
    assert_eq!(api.get("/v1/threads/j1/log?after=x").await.0, 400);
    let later = api
        .enqueue(json!({ "agent": "echo", "thread": "i1", "payload": "x", "delay": "1h" }))
        .await;
    let (status, body) = api
        .post(
            "/v1/threads/i1/interrupt",
            OPERATOR,
            json!({ "reason": "stop it" }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["epoch"], 1);
    assert_eq!(body["superseded"], json!([later]));
    let (_, d) = api.get(&format!("/v1/dispatches/{later}")).await;
    assert_eq!(d["status"], "superseded");
    let (status, body) = api
        .post("/v1/threads/i1/interrupt", OPERATOR, json!({ "reason": 7 }))
        .await;
    assert_eq!(
        (status, body["field"].as_str()),
        (400, Some("reason")),
        "{body}"
    );

    // Agents and the OpenAPI description.
    let (status, agents) = api.get("/v1/agents").await;
    assert_eq!(status, 200);
    let echo = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "echo")
        .unwrap();
    assert_eq!(echo["world"], "handler");
    assert_eq!(echo["limits"]["concurrency"], 4);
    assert!(echo["queue"]["acked"].as_u64().unwrap() >= 2, "{echo}");
    let (status, spec) = api.get("/v1/openapi.json").await;
    assert_eq!(status, 200);
    assert!(spec["paths"]["/v1/dispatches/{id}"].is_object());

    // Unknown routes are 404 in JSON; health answers without a token (metrics need one).
    assert_eq!(api.get("/v1/nothing").await.0, 404);
    assert_eq!(api.call(Method::GET, "/livez", None, None).await.0, 200);
    assert_eq!(api.call(Method::GET, "/readyz", None, None).await.0, 200);

    // Auth: no token, a wrong one, one of too small a role; refused, and logged without it.
    let wrong = "wrong-secret-0123456789abcdef-x";
    for (method, path, token, expected) in [
        (Method::GET, "/v1/agents".to_owned(), None, 401),
        (Method::GET, "/v1/agents".to_owned(), Some(wrong), 401),
        (Method::GET, "/metrics".to_owned(), None, 401),
        (Method::GET, "/metrics".to_owned(), Some(wrong), 401),
        (Method::POST, "/v1/dispatches".to_owned(), Some(READER), 403),
        (
            Method::POST,
            format!("/v1/dispatches/{id}/cancel"),
            Some(PRODUCER),
            403,
        ),
        (
            Method::POST,
            format!("/v1/dispatches/{id}/retry"),
            Some(READER),
            403,
        ),
        (
            Method::POST,
            "/v1/threads/t/interrupt".to_owned(),
            Some(PRODUCER),
            403,
        ),
    ] {
        let body = (method == Method::POST).then(|| json!({ "agent": "echo", "thread": "t" }));
        let (status, reply) = api.call(method.clone(), &path, token, body).await;
        assert_eq!(status, expected, "{method} {path} with {token:?}: {reply}");
    }
    let response = api
        .client
        .get(api.url("/v1/agents"))
        .header("authorization", format!("Basic {READER}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401, "only bearer tokens");
    let log = api.log();
    assert!(
        log.matches("API request refused").count() >= 7,
        "each refusal is logged:\n{log}"
    );
    for secret in [READER, PRODUCER, OPERATOR, wrong] {
        assert!(!log.contains(secret), "a token reached the log:\n{log}");
    }
    drop(api);
}

/// Percent-encodes a cursor for a query string.
fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_and_status_on_the_embedded_store() {
    every_route_and_status(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_and_status_on_nats() {
    every_route_and_status(Backend::nats()).await;
}

/// `?wait` returns when the dispatch completes, not at the end of the wait; the SSE stream
/// delivers the thread's entries in order, old and new.
async fn wait_and_stream(backend: Backend) {
    let api = Api::start(&backend).await;
    let id = api
        .enqueue(json!({ "agent": "sandbox", "thread": "w", "payload": "journal:1500" }))
        .await;
    let started = Instant::now();
    let (status, d) = api.get(&format!("/v1/dispatches/{id}?wait=25s")).await;
    let took = started.elapsed();
    assert_eq!((status, d["status"].as_str()), (200, Some("acked")), "{d}");
    assert!(
        took >= Duration::from_millis(1000) && took < Duration::from_secs(15),
        "returned after {took:?}"
    );
    // A wait that runs out returns the dispatch as it is.
    let later = api
        .enqueue(json!({ "agent": "echo", "thread": "w2", "payload": "x", "delay": "1h" }))
        .await;
    let started = Instant::now();
    let (_, d) = api.get(&format!("/v1/dispatches/{later}?wait=300ms")).await;
    assert_eq!(d["status"], "queued");
    assert!(started.elapsed() >= Duration::from_millis(300));

    // The stream: the two entries already there, then those of three more runs, in order.
    let response = api
        .client
        .get(api.url("/v1/threads/w/log/stream"))
        .bearer_auth(READER)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut ids = vec![id];
    for _ in 0..3 {
        ids.push(
            api.enqueue(json!({ "agent": "sandbox", "thread": "w", "payload": "journal:0" }))
                .await,
        );
    }
    let mut expected = Vec::new();
    for id in &ids {
        expected.push(format!("start {id}"));
        expected.push(format!("end {id}"));
    }
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let mut events: Vec<(u64, String)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while events.len() < expected.len() {
        let chunk = tokio::time::timeout_at(deadline.into(), body.next())
            .await
            .unwrap_or_else(|_| panic!("stream stalled after {events:?}\n{}", api.log()))
            .unwrap()
            .unwrap();
        buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            let mut id = None;
            let mut data = None;
            let mut kind = None;
            for line in event.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = Some(v.trim().parse::<u64>().unwrap());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data = Some(serde_json::from_str::<Value>(v.trim()).unwrap());
                } else if let Some(v) = line.strip_prefix("event:") {
                    kind = Some(v.trim().to_owned());
                }
            }
            if kind.as_deref() == Some("entry") {
                let data = data.unwrap();
                assert_eq!(Some(data["seq"].as_u64().unwrap()), id);
                events.push((id.unwrap(), data["data"].as_str().unwrap().to_owned()));
            }
        }
    }
    let seqs: Vec<u64> = events.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, (1..=expected.len() as u64).collect::<Vec<_>>());
    let texts: Vec<String> = events.into_iter().map(|(_, t)| t).collect();
    assert_eq!(texts, expected);

    // Resuming with Last-Event-ID starts after it.
    let response = api
        .client
        .get(api.url("/v1/threads/w/log/stream"))
        .bearer_auth(READER)
        .header("last-event-id", "7")
        .send()
        .await
        .unwrap();
    let mut body = response.bytes_stream();
    let mut text = String::new();
    while !text.contains("\n\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), body.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(text.contains("id: 8") || text.contains("id:8"), "{text}");
}

/// The inbox routes: every refusal names what was wrong and stores nothing; a send shows on
/// the thread's stream; a follow-up to an idle thread starts a dispatch of the agent named.
async fn inbox_routes(backend: Backend) {
    let api = Api::start(&backend).await;
    let send = |body: Value, token: &'static str| {
        let api = &api;
        async move { api.post("/v1/threads/m/messages", token, body).await }
    };
    let (status, _) = send(json!({ "payload": "hi" }), READER).await;
    assert_eq!(status, 403, "a reader may not send");
    let (status, body) = send(json!({ "payload": "", "kind": "steer" }), PRODUCER).await;
    assert_eq!(
        (status, body["field"].as_str()),
        (400, Some("payload")),
        "{body}"
    );
    let (status, body) = send(json!({ "payload": "hi", "agent": "nobody" }), PRODUCER).await;
    assert_eq!(
        (status, body["field"].as_str()),
        (404, Some("agent")),
        "{body}"
    );
    let (status, body) = send(json!({ "payload": "hi", "kind": "shout" }), PRODUCER).await;
    assert_eq!(
        (status, body["field"].as_str()),
        (400, Some("kind")),
        "{body}"
    );
    let (status, body) = send(json!({ "payload": "hi" }), PRODUCER).await;
    assert_eq!(
        (status, body["field"].as_str()),
        (400, Some("agent")),
        "a follow-up to a thread that never ran an agent must name one: {body}"
    );
    let big = "x".repeat(65 * 1024);
    let (status, body) = send(json!({ "payload": big, "kind": "steer" }), PRODUCER).await;
    assert_eq!(
        (status, body["field"].as_str()),
        (413, Some("payload")),
        "{body}"
    );
    let (status, list) = api.get("/v1/threads/m/messages").await;
    assert_eq!(status, 200);
    assert_eq!(list["messages"], json!([]), "nothing was stored: {list}");

    // The stream shows a message as it is sent.
    let response = api
        .client
        .get(api.url("/v1/threads/m/log/stream"))
        .bearer_auth(READER)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (status, body) = send(
        json!({ "payload": "first", "kind": "steer", "metadata": { "k": "v" } }),
        PRODUCER,
    )
    .await;
    assert_eq!((status, body["seq"].as_u64()), (201, Some(1)), "{body}");
    assert_eq!(
        body["follow_ups"],
        json!([]),
        "a steer to an idle thread starts nothing"
    );
    let mut stream = response.bytes_stream();
    let mut text = String::new();
    while !text.contains("event: message") && !text.contains("event:message") {
        let chunk = tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .unwrap_or_else(|_| panic!("no message event: {text}"))
            .unwrap()
            .unwrap();
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(text.contains("\"first\""), "{text}");

    // A follow-up naming the agent starts a dispatch at once; echo ignores its inbox, so the
    // messages stay pending (and covered: the run's end starts nothing more).
    let (status, body) = send(json!({ "payload": "second", "agent": "echo" }), PRODUCER).await;
    assert_eq!(status, 201, "{body}");
    let follow_up = body["follow_ups"][0].as_str().unwrap().to_owned();
    let d = api.wait_terminal(&follow_up).await;
    assert_eq!(
        (d["agent"].as_str(), d["status"].as_str()),
        (Some("echo"), Some("acked")),
        "{d}"
    );
    assert_eq!(d["metadata"]["messages"], "1-2", "{d}");
    let (_, list) = api.get("/v1/threads/m/messages?state=pending").await;
    assert_eq!(list["messages"].as_array().unwrap().len(), 2, "{list}");
    assert_eq!(
        list["inbox"],
        json!({ "latest": 2, "pending": 2, "followed": 2 })
    );
    assert_eq!(list["messages"][0]["metadata"]["k"], "v");
    assert_eq!(list["messages"][0]["sent_by"], "api:producer");
    let (status, _) = api.get("/v1/threads/m/messages?state=lost").await;
    assert_eq!(status, 400);
    // The metrics count the sends (by the agent addressed) and the follow-up this host ran.
    let m = api.metrics().await;
    assert_eq!(
        sample(&m, "homing_messages_sent_total", &[("agent", "none")]),
        1.0
    );
    assert_eq!(
        sample(&m, "homing_messages_sent_total", &[("agent", "echo")]),
        1.0
    );
    assert_eq!(
        sample(&m, "homing_follow_ups_total", &[("agent", "echo")]),
        1.0
    );

    // `[host] max_inbox = 4`: the fifth pending message is refused with 429 naming the limit.
    for text in ["3", "4"] {
        let (status, _) = send(json!({ "payload": text, "kind": "steer" }), PRODUCER).await;
        assert_eq!(status, 201);
    }
    let (status, body) = send(json!({ "payload": "5", "kind": "steer" }), PRODUCER).await;
    assert_eq!(
        (status, body["limit"].as_str()),
        (429, Some("max_inbox")),
        "{body}"
    );

    // Discarding is an operator's.
    let path = "/v1/threads/m/messages/discard";
    let (status, _) = api.post(path, PRODUCER, json!({ "through": 2 })).await;
    assert_eq!(status, 403);
    let (status, body) = api.post(path, OPERATOR, json!({ "through": 2 })).await;
    assert_eq!(
        (status, body["discarded"].as_u64()),
        (200, Some(2)),
        "{body}"
    );
    let (_, list) = api.get("/v1/threads/m/messages?state=discarded").await;
    assert_eq!(list["messages"].as_array().unwrap().len(), 2, "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_routes_on_the_embedded_store() {
    inbox_routes(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_routes_on_nats() {
    inbox_routes(Backend::nats()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_and_stream_on_the_embedded_store() {
    wait_and_stream(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_and_stream_on_nats() {
    wait_and_stream(Backend::nats()).await;
}

/// 1,000 enqueues from 20 clients at once: every one accepted with its own id, every one run
/// exactly once (the sandbox journals each run in its thread's log), and `/metrics` counting
/// exactly that work.
async fn concurrent_enqueues(backend: Backend) {
    const CLIENTS: usize = 20;
    const EACH: usize = 50;
    const THREADS: usize = 50;
    let api = Api::start(&backend).await;
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..CLIENTS {
        let url = api.url("/v1/dispatches");
        tasks.spawn(async move {
            let client = client();
            let mut ids = Vec::new();
            for i in 0..EACH {
                let n = c * EACH + i;
                let response = client
                    .post(&url)
                    .bearer_auth(PRODUCER)
                    .json(&json!({ "agent": "sandbox", "thread": format!("c{}", n % THREADS), "payload": "journal:0" }))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 201);
                let body: Value = response.json().await.unwrap();
                ids.push(body["id"].as_str().unwrap().to_owned());
            }
            ids
        });
    }
    let mut ids = BTreeSet::new();
    while let Some(batch) = tasks.join_next().await {
        ids.extend(batch.unwrap());
    }
    assert_eq!(ids.len(), CLIENTS * EACH, "every enqueue got its own id");

    // Wait until the store holds them all acked.
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let (_, agents) = api.get("/v1/agents").await;
        let sandbox = agents["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == "sandbox")
            .unwrap()
            .clone();
        if sandbox["queue"]["acked"] == CLIENTS * EACH {
            assert_eq!(sandbox["queue"]["dead_letter"], 0, "{sandbox}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not all acked: {sandbox}\n{}",
            api.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Each ran exactly once: one `start`/`end` pair per dispatch in its thread's journal.
    let mut starts: BTreeMap<String, usize> = BTreeMap::new();
    for t in 0..THREADS {
        let mut after = 0;
        loop {
            let (_, page) = api
                .get(&format!("/v1/threads/c{t}/log?after={after}&limit=1000"))
                .await;
            let entries = page["entries"].as_array().unwrap();
            if entries.is_empty() {
                break;
            }
            for pair in entries.chunks(2) {
                let start = pair[0]["data"].as_str().unwrap();
                let id = start.strip_prefix("start ").unwrap();
                assert_eq!(
                    pair.get(1).map(|e| e["data"].clone()),
                    Some(json!(format!("end {id}")))
                );
                *starts.entry(id.to_owned()).or_default() += 1;
            }
            after = entries.last().unwrap()["seq"].as_u64().unwrap();
        }
    }
    assert_eq!(starts.keys().cloned().collect::<BTreeSet<_>>(), ids);
    assert!(starts.values().all(|n| *n == 1), "a dispatch ran twice");
    for id in ids.iter().take(20) {
        let (_, d) = api.get(&format!("/v1/dispatches/{id}")).await;
        assert_eq!(
            (d["status"].as_str(), d["attempts"].as_u64()),
            (Some("acked"), Some(0))
        );
    }

    // The counters equal the work done, and Prometheus's linter takes the page as it is.
    let total = (CLIENTS * EACH) as f64;
    let scrape = api.scrape().await;
    promtool_check(&scrape);
    let m = parse_metrics(&scrape);
    assert_eq!(
        sample(
            &m,
            "homing_dispatches_finished_total",
            &[("agent", "sandbox"), ("outcome", "completed")]
        ),
        total
    );
    assert_eq!(
        sample(
            &m,
            "homing_dispatches_finished_total",
            &[("agent", "sandbox")]
        ),
        total,
        "nothing retried"
    );
    assert_eq!(
        sample(
            &m,
            "homing_dispatch_duration_seconds_count",
            &[("agent", "sandbox")]
        ),
        total
    );
    assert_eq!(
        sample(
            &m,
            "homing_dispatch_queue_wait_seconds_count",
            &[("agent", "sandbox")]
        ),
        total
    );
    assert_eq!(
        sample(
            &m,
            "homing_instance_start_seconds_count",
            &[("agent", "sandbox")]
        ),
        total
    );
    assert_eq!(
        sample(
            &m,
            "homing_api_requests_total",
            &[
                ("route", "/v1/dispatches"),
                ("method", "POST"),
                ("status", "201")
            ]
        ),
        total
    );
    assert!(
        sample(
            &m,
            "homing_store_operation_seconds_count",
            &[("operation", "enqueue")]
        ) >= total
    );
    assert_eq!(sample(&m, "homing_guest_traps_total", &[]), 0.0);
    // The queue gauges follow the store's live work (refreshed by the sweeper): with all of
    // the above acked and three more delayed for an hour, three are queued and none claimed.
    // Settled work has no gauge (the finished counter above counts it).
    for i in 0..3 {
        api.enqueue(json!({ "agent": "sandbox", "thread": format!("later-{i}"), "payload": "x", "delay": "1h" }))
            .await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = api.metrics().await;
        let depth = |status: &str| {
            sample(
                &m,
                "homing_queue_depth",
                &[("agent", "sandbox"), ("status", status)],
            )
        };
        let (queued, claimed) = (depth("queued"), depth("claimed"));
        if queued == 3.0 && claimed == 0.0 {
            assert!(
                !m.keys()
                    .any(|k| k.starts_with("homing_queue_depth{") && k.contains("acked")),
                "settled statuses have no gauge: {m:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "queue gauges: queued {queued}, claimed {claimed}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_enqueues_are_each_acked_once_on_the_embedded_store() {
    concurrent_enqueues(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_enqueues_are_each_acked_once_on_nats() {
    concurrent_enqueues(Backend::nats()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_while_the_nats_server_is_down() {
    let mut backend = Backend::nats();
    let api = Api::start(&backend).await;
    let Backend::Nats(server) = &mut backend else {
        unreachable!()
    };
    server.kill();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = api.call(reqwest::Method::GET, "/readyz", None, None).await;
        if status == 503 {
            assert!(
                body["not_ready"][0].as_str().unwrap().starts_with("store"),
                "{body}"
            );
            assert!(
                !body.to_string().contains("nats://"),
                "no store internals: {body}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still ready with the server down: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        api.call(reqwest::Method::GET, "/livez", None, None).await.0,
        200
    );
    server.restart();
    api.wait_ready().await;
    // And it works again. Right after a restart the host's view of the stream may still be
    // resyncing: a request can get 503 (with Retry-After) for a moment, never a wrong answer.
    let deadline = Instant::now() + Duration::from_secs(30);
    let id = loop {
        let (status, body) = api
            .post(
                "/v1/dispatches",
                PRODUCER,
                json!({ "agent": "echo", "thread": "back", "payload": "again", "id": "back-1" }),
            )
            .await;
        match status {
            201 => break body["id"].as_str().unwrap().to_owned(),
            503 => assert!(Instant::now() < deadline, "{body}\n{}", api.log()),
            _ => panic!("{status}: {body}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    loop {
        let (status, d) = api.get(&format!("/v1/dispatches/{id}?wait=5s")).await;
        if status == 200 && d["status"] == "acked" {
            break;
        }
        assert!(
            (status == 200 || status == 503) && Instant::now() < deadline,
            "{status}: {d}\n{}",
            api.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn a_public_listen_without_tokens_refuses_to_start() {
    let env = Env::new(&format!(
        "[api]\nlisten = \"0.0.0.0:{}\"\n[plugins.echo]\npath = {}\n",
        free_port(),
        toml_path(&guest("echo"))
    ));
    let out = env.command(&["run"]).stdin(Stdio::null()).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is not a loopback address and [api] tokens is empty"),
        "{err}"
    );
    // A token whose secret is missing refuses to start too, naming the variable only.
    let env = Env::new(&format!(
        "[api]\nlisten = \"127.0.0.1:{}\"\ntokens = [{{ name = \"w\", role = \"reader\", secret = {{ env = \"HOMING_TEST_NO_SUCH_SECRET\" }} }}]\n[plugins.echo]\npath = {}\n",
        free_port(),
        toml_path(&guest("echo"))
    ));
    let out = env.command(&["run"]).stdin(Stdio::null()).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("HOMING_TEST_NO_SUCH_SECRET is not set"),
        "{err}"
    );
}

/// The CLI beside the API: `enqueue --wait`, `thread log --follow`, and exit codes that tell
/// "not found", "invalid input", "store unavailable" and a failed dispatch apart.
#[test]
fn cli_waits_follows_and_exits_with_distinct_codes() {
    use std::io::{BufRead, BufReader};
    let env = Env::new(&format!(
        "[host]\nsweep_interval = \"200ms\"\n[plugins.echo]\npath = {}\n[plugins.sandbox]\npath = {}\nmax_attempts = 1\nmemory = \"16MiB\"\n",
        toml_path(&guest("echo")),
        toml_path(&guest("sandbox"))
    ));
    let _host = crate::hosts::spawn_run(&env, "cli-host");
    let code = |args: &[&str]| env.homing(args).status.code();

    let out = env.homing(&[
        "enqueue",
        "--agent",
        "echo",
        "--thread",
        "w",
        "--payload",
        "hi",
        "--wait",
        "--timeout",
        "60s",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hi");
    let out = env.homing(&[
        "enqueue",
        "--agent",
        "sandbox",
        "--thread",
        "w2",
        "--payload",
        "panic",
        "--wait",
    ]);
    assert_eq!(
        out.status.code(),
        Some(5),
        "dead-lettered: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("dead_letter"));
    let started = Instant::now();
    assert_eq!(
        code(&[
            "enqueue",
            "--agent",
            "echo",
            "--thread",
            "w3",
            "--payload",
            "x",
            "--delay",
            "1h",
            "--wait",
            "--timeout",
            "300ms"
        ]),
        Some(6)
    );
    assert!(started.elapsed() < Duration::from_secs(20));

    assert_eq!(code(&["dispatch", "show", "no-such-id"]), Some(3));
    assert_eq!(code(&["dispatch", "cancel", "no-such-id"]), Some(3));
    assert_eq!(
        code(&[
            "enqueue",
            "--agent",
            "nobody",
            "--thread",
            "t",
            "--payload",
            "x"
        ]),
        Some(3)
    );
    assert_eq!(
        code(&[
            "enqueue",
            "--agent",
            "echo",
            "--thread",
            "t",
            "--payload",
            "x",
            "--delay",
            "soon"
        ]),
        Some(2)
    );
    assert_eq!(code(&["dispatch", "list", "--status", "done"]), Some(2));

    // --follow prints what is there, then what comes, until SIGTERM.
    let mut follow = env
        .command(&["thread", "log", "f", "--follow"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map(Host)
        .unwrap();
    let stdout = follow.0.stdout.take().unwrap();
    let mut ids = Vec::new();
    for _ in 0..2 {
        ids.push(env.enqueue("sandbox", "f", "journal:0", &[]));
    }
    let mut lines = BufReader::new(stdout).lines();
    let mut seen = Vec::new();
    while seen.len() < 4 {
        seen.push(lines.next().unwrap().unwrap());
    }
    let expected: Vec<String> = ids
        .iter()
        .flat_map(|id| [format!("start {id}"), format!("end {id}")])
        .enumerate()
        .map(|(i, text)| format!("{:>6}  {text}", i + 1))
        .collect();
    assert_eq!(seen, expected);
    crate::common::signal(&follow, "TERM");
    let status = crate::common::wait_exit(&mut follow, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));

    // A bad config is invalid input; an unreachable store is "unavailable".
    let bad = Env::new("[host]\nlease = \"soon\"\n");
    assert_eq!(bad.homing(&["dispatch", "list"]).status.code(), Some(2));
    let down = Env::new(&format!(
        "[store]\nbackend = \"nats\"\nurl = \"nats://127.0.0.1:{}\"\nconnect_timeout = \"500ms\"\n",
        free_port()
    ));
    let out = down.homing(&["dispatch", "list"]);
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `[host] log_format = "json"` (and `HOMING_LOG_FORMAT`) writes one JSON object per line.
#[test]
fn json_logs_are_one_object_per_line() {
    let env = Env::new(&format!(
        "[host]\nlog_format = \"json\"\n[plugins.echo]\npath = {}\n",
        toml_path(&guest("echo"))
    ));
    env.enqueue("echo", "j", "hello", &[]);
    let log = env.run_until_idle();
    let lines: Vec<Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["message"] == "dispatch finished" && l["outcome"] == "completed"),
        "{log}"
    );
    // The environment variable wins over the config.
    env.enqueue("echo", "j", "again", &[]);
    let out = env
        .command(&["run", "--until-idle"])
        .env("HOMING_LOG_FORMAT", "text")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !text.trim_start().starts_with('{'),
        "{text}"
    );
}

/// An HTTP client that drops idle connections before the server does (it closes an idle
/// keep-alive connection after 10 s): reusing one the server is closing fails the request.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_idle_timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}
