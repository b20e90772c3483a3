//! Outbound HTTP and variables from real guests (issue 13, the guest side): the Rust test guest
//! `http-probe`, the Python and JavaScript example agents and the `assistant` example, each run
//! by a real `homing run` against a local HTTP server on the loopback address.
//!
//! - GET and POST with headers and bodies round trip from Rust, Python and JavaScript;
//! - a request to an origin not in `allowed_outbound_hosts` is denied (`HTTP-request-denied`)
//!   and never reaches the server;
//! - variables (plain, and from the environment as secrets) reach the guest over `wasi:config`;
//! - the assistant runs one tool round trip against the stand-in model server
//!   (`examples/assistant/stand_in_model.py`), and its API key appears nowhere in what the host
//!   stores or logs.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::IntoResponse;
use serde_json::{Value, json};

use crate::common::{Env, Served, guest, polyglot_guest, root, shared_cache_dir, toml_path};

/// A request the echo server saw.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: String,
}

/// A local HTTP server on 127.0.0.1 that answers every request with what it received, as JSON
/// (`{"method", "path", "headers": {name: value}, "body"}`), the header `x-reply: got-<the
/// request's x-probe or x-agent header>`, and status 200 (or `N` for a path `/status/N`).
pub(crate) struct EchoServer {
    served: Served,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn echo(
    State(seen): State<Arc<Mutex<Vec<Seen>>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> impl IntoResponse {
    let pairs: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let request = Seen {
        method: method.to_string(),
        path: uri.path().to_owned(),
        headers: pairs.clone(),
        body: String::from_utf8_lossy(&body).into_owned(),
    };
    seen.lock().unwrap().push(request.clone());
    let tag = headers
        .get("x-probe")
        .or_else(|| headers.get("x-agent"))
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let status = uri
        .path()
        .strip_prefix("/status/")
        .and_then(|code| code.parse::<u16>().ok())
        .and_then(|code| StatusCode::from_u16(code).ok())
        .unwrap_or(StatusCode::OK);
    let reply = json!({
        "method": request.method,
        "path": request.path,
        "headers": pairs
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect::<serde_json::Map<String, Value>>(),
        "body": request.body,
    });
    (
        status,
        [
            ("x-reply", format!("got-{tag}")),
            ("content-type", "application/json".to_owned()),
        ],
        reply.to_string(),
    )
}

impl EchoServer {
    pub(crate) fn start() -> EchoServer {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let app = axum::Router::new()
            .fallback(echo)
            .with_state(Arc::clone(&seen));
        EchoServer {
            served: Served::start(app),
            seen,
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.served.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// The value of header `name` in a request the server saw.
fn header<'a>(seen: &'a Seen, name: &str) -> Option<&'a str> {
    seen.headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// `homing run --until-idle` with extra environment variables (the variables' `env` sources).
pub(crate) fn run_until_idle_with(env: &Env, vars: &[(&str, &str)]) -> String {
    let mut cmd = env.command(&["run", "--until-idle"]);
    for (name, value) in vars {
        cmd.env(name, value);
    }
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "homing run failed: {}\n{log}",
        out.status
    );
    log
}

/// The output of an acked dispatch, as text.
pub(crate) fn output(env: &Env, id: &str) -> String {
    let d = env.show(id);
    assert_eq!(d["status"], "acked", "{d}");
    d["result"]["output"].as_str().unwrap().to_owned()
}

// ---------------------------------------------------------------------------------------------
// Rust: the http-probe test guest

/// A host with `http-probe` as plugin `probe`; `plugin_keys` go into its table.
pub(crate) fn probe_config(plugin_keys: &str, variables: &str) -> String {
    format!(
        r#"
[host]
lease = "10s"
sweep_interval = "200ms"

[plugins.probe]
path = {path}
timeout = "20s"
max_attempts = 1
{plugin_keys}

[plugins.probe.variables]
{variables}
"#,
        path = toml_path(&guest("http_probe")),
    )
}

#[test]
fn rust_guest_gets_and_posts_with_headers_and_bodies() {
    let server = EchoServer::start();
    let env = Env::new(&probe_config(
        r#"allowed_outbound_hosts = ["http://127.0.0.1:*"]"#,
        r#"greeting = "hello"
token = { env = "PROBE_TEST_TOKEN", secret = true }"#,
    ));
    let get = env.enqueue(
        "probe",
        "t1",
        &json!({
            "method": "GET",
            "url": server.url("/items?id=7"),
            "headers": [["x-probe", "get-1"], ["accept", "application/json"]],
            "config_keys": ["greeting", "token", "missing"],
        })
        .to_string(),
        &[],
    );
    let big_body = "x".repeat(10_000); // more than two 4096-byte chunks
    let post = env.enqueue(
        "probe",
        "t2",
        &json!({
            "method": "POST",
            "url": server.url("/submit"),
            "headers": [["x-probe", "post-1"], ["content-type", "text/plain"]],
            "body": big_body,
        })
        .to_string(),
        &[],
    );
    let teapot = env.enqueue(
        "probe",
        "t3",
        &json!({"method": "PUT", "url": server.url("/status/418"), "body": "tea"}).to_string(),
        &[],
    );
    run_until_idle_with(&env, &[("PROBE_TEST_TOKEN", "s3cret-token")]);

    let got: Value = serde_json::from_str(&output(&env, &get)).unwrap();
    assert_eq!(got["status"], 200, "{got}");
    assert!(
        got["headers"]
            .as_array()
            .unwrap()
            .contains(&json!(["x-reply", "got-get-1"])),
        "response headers reach the guest: {got}"
    );
    let echoed: Value = serde_json::from_str(got["body"].as_str().unwrap()).unwrap();
    assert_eq!(echoed["method"], "GET");
    assert_eq!(echoed["path"], "/items");
    assert_eq!(echoed["headers"]["accept"], "application/json");
    assert_eq!(
        got["config"],
        json!({"greeting": "hello", "token": "s3cret-token", "missing": null}),
        "plain and environment variables reach the guest; unknown keys are none"
    );

    let posted: Value = serde_json::from_str(&output(&env, &post)).unwrap();
    assert_eq!(posted["status"], 200);
    let echoed: Value = serde_json::from_str(posted["body"].as_str().unwrap()).unwrap();
    assert_eq!(echoed["method"], "POST");
    assert_eq!(echoed["body"], big_body.as_str(), "the whole body arrived");
    assert_eq!(echoed["headers"]["content-type"], "text/plain");
    assert_eq!(echoed["headers"]["content-length"], "10000");

    let put: Value = serde_json::from_str(&output(&env, &teapot)).unwrap();
    assert_eq!(
        put["status"], 418,
        "a non-2xx status is a response, not an error"
    );

    let seen = server.seen();
    assert_eq!(seen.len(), 3, "{seen:?}");
    let first = seen.iter().find(|s| s.path == "/items").unwrap();
    assert_eq!(header(first, "x-probe"), Some("get-1"));
}

#[test]
fn rust_guest_makes_requests_in_sequence() {
    let server = EchoServer::start();
    let env = Env::new(&probe_config(
        r#"allowed_outbound_hosts = ["http://127.0.0.1:*"]"#,
        "",
    ));
    let id = env.enqueue(
        "probe",
        "t1",
        &json!({"url": server.url("/n"), "repeat": 25}).to_string(),
        &[],
    );
    env.run_until_idle();
    let report: Value = serde_json::from_str(&output(&env, &id)).unwrap();
    assert_eq!(report["requests"], 25);
    assert_eq!(server.seen().len(), 25);
}

#[test]
fn requests_to_origins_not_allowed_are_denied_and_never_sent() {
    let server = EchoServer::start();
    for keys in [
        "",
        r#"allowed_outbound_hosts = ["https://api.example.com"]"#,
    ] {
        let env = Env::new(&probe_config(keys, ""));
        let id = env.enqueue(
            "probe",
            "t1",
            &json!({"url": server.url("/nope")}).to_string(),
            &[],
        );
        env.run_until_idle();
        let d = env.show(&id);
        assert_eq!(d["status"], "dead_letter", "{keys}: {d}");
        let error = d["last_error"].as_str().unwrap_or_default();
        assert!(
            error.contains("HTTP-request-denied"),
            "{keys}: the error names the wasi:http code: {error}"
        );
    }
    assert!(server.seen().is_empty(), "{:?}", server.seen());
}

#[test]
fn a_response_over_the_guests_cap_fails_the_request() {
    let server = EchoServer::start();
    let env = Env::new(&probe_config(
        r#"allowed_outbound_hosts = ["http://127.0.0.1:*"]"#,
        "",
    ));
    let id = env.enqueue(
        "probe",
        "t1",
        &json!({"method": "POST", "url": server.url("/big"), "body": "y".repeat(4000),
                "max_response_bytes": 1000})
        .to_string(),
        &[],
    );
    env.run_until_idle();
    let d = env.show(&id);
    assert_eq!(d["status"], "dead_letter", "{d}");
    assert!(
        d["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("larger than 1000 bytes"),
        "{d}"
    );
}

// ---------------------------------------------------------------------------------------------
// Python and JavaScript: the example agents' `http` and `config` tools

/// A host with a Python or JavaScript example agent as plugin `agent`.
fn polyglot_config(agent: &str, plugin_keys: &str) -> String {
    format!(
        r#"
[host]
lease = "10s"
sweep_interval = "200ms"
cache_dir = {cache}

[plugins.agent]
path = {path}
memory = "128MiB"
timeout = "20s"
max_attempts = 2
{plugin_keys}

[plugins.agent.variables]
greeting = "hello from homing.toml"
api_key = {{ env = "POLYGLOT_TEST_KEY", secret = true }}
"#,
        cache = toml_path(&shared_cache_dir()),
        path = toml_path(&polyglot_guest(agent)),
    )
}

fn polyglot_gets_posts_and_reads_variables(agent: &str) {
    let server = EchoServer::start();
    let env = Env::new(&polyglot_config(
        agent,
        r#"allowed_outbound_hosts = ["http://127.0.0.1:*"]"#,
    ));
    let get = env.enqueue(
        "agent",
        "t1",
        &format!("http GET {}", server.url("/hello?x=1")),
        &[],
    );
    let post = env.enqueue(
        "agent",
        "t2",
        &format!("http POST {} a body with spaces", server.url("/post")),
        &[],
    );
    let greeting = env.enqueue("agent", "t3", "config greeting", &[]);
    let secret = env.enqueue("agent", "t4", "config api_key", &[]);
    let unset = env.enqueue("agent", "t5", "config nothing_here", &[]);
    run_until_idle_with(&env, &[("POLYGLOT_TEST_KEY", "polyglot-s3cret")]);

    let got: Value = serde_json::from_str(&output(&env, &get)).unwrap();
    assert_eq!(got["status"], 200, "{agent}: {got}");
    // The plugin is named `agent`: the tools send `x-agent: agent`, the server answers with it.
    assert_eq!(got["x-reply"], "got-agent", "{agent}: {got}");
    let echoed: Value = serde_json::from_str(got["body"].as_str().unwrap()).unwrap();
    assert_eq!(echoed["method"], "GET");
    assert_eq!(echoed["path"], "/hello");

    let posted: Value = serde_json::from_str(&output(&env, &post)).unwrap();
    assert_eq!(posted["status"], 200, "{agent}: {posted}");
    let echoed: Value = serde_json::from_str(posted["body"].as_str().unwrap()).unwrap();
    assert_eq!(echoed["method"], "POST");
    assert_eq!(echoed["body"], "a body with spaces");
    assert_eq!(echoed["headers"]["content-type"], "text/plain");

    let seen = server.seen();
    assert_eq!(seen.len(), 2, "{agent}: {seen:?}");
    for request in &seen {
        assert_eq!(
            header(request, "x-agent"),
            Some("agent"),
            "{agent}: {request:?}"
        );
    }

    assert_eq!(output(&env, &greeting), "hello from homing.toml");
    let hidden = output(&env, &secret);
    assert_eq!(
        hidden, "api_key is set (15 characters, not shown)",
        "{agent}"
    );
    assert!(output(&env, &unset).contains("nothing_here is not set"));
}

fn polyglot_requests_without_a_grant_are_denied(agent: &str) {
    let server = EchoServer::start();
    let env = Env::new(&polyglot_config(agent, ""));
    let id = env.enqueue(
        "agent",
        "t1",
        &format!("http GET {}", server.url("/denied")),
        &[],
    );
    run_until_idle_with(&env, &[("POLYGLOT_TEST_KEY", "polyglot-s3cret")]);
    let reply = output(&env, &id);
    assert!(
        reply.starts_with("tool http failed"),
        "{agent}: the tool reports the failure: {reply}"
    );
    if agent == "python-agent" {
        assert!(reply.contains("HTTP-request-denied"), "{reply}");
    }
    assert!(server.seen().is_empty(), "{agent}: {:?}", server.seen());
}

#[test]
fn python_agent_gets_posts_and_reads_variables() {
    polyglot_gets_posts_and_reads_variables("python-agent");
}

#[test]
fn js_agent_gets_posts_and_reads_variables() {
    polyglot_gets_posts_and_reads_variables("js-agent");
}

#[test]
fn python_agent_requests_without_a_grant_are_denied() {
    polyglot_requests_without_a_grant_are_denied("python-agent");
}

#[test]
fn js_agent_requests_without_a_grant_are_denied() {
    polyglot_requests_without_a_grant_are_denied("js-agent");
}

// ---------------------------------------------------------------------------------------------
// The assistant example against the stand-in model server

/// The stand-in model server (`examples/assistant/stand_in_model.py`), killed when dropped.
pub(crate) struct StandIn {
    child: Child,
    pub(crate) url: String,
}

impl StandIn {
    pub(crate) fn start(api_key: &str) -> StandIn {
        let mut child = Command::new("python3")
            .arg(root().join("examples/assistant/stand_in_model.py"))
            .args(["--api-key", api_key])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 is needed for the stand-in model server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line.trim().to_owned();
        assert!(url.starts_with("http://127.0.0.1:"), "{url:?}");
        StandIn { child, url }
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn assistant_config() -> String {
    format!(
        r#"
[host]
lease = "10s"
sweep_interval = "200ms"

[plugins.assistant]
path = {path}
timeout = "30s"
max_attempts = 1
allowed_outbound_hosts = ["http://127.0.0.1:*"]

[plugins.assistant.variables]
base_url = {{ env = "ASSISTANT_BASE_URL" }}
model = "stand-in"
api_key = {{ env = "ASSISTANT_API_KEY", secret = true }}
"#,
        path = toml_path(&guest("assistant")),
    )
}

#[test]
fn assistant_runs_a_tool_round_trip_and_keeps_the_conversation() {
    const KEY: &str = "assistant-test-key-8c1f";
    let model = StandIn::start(KEY);
    let env = Env::new(&assistant_config());
    let first = env.enqueue("assistant", "chat", "What is 40 + 2?", &[]);
    let log = run_until_idle_with(
        &env,
        &[
            ("ASSISTANT_BASE_URL", &model.url),
            ("ASSISTANT_API_KEY", KEY),
        ],
    );
    let answer = output(&env, &first);
    assert!(
        answer.contains("the tool answered 42"),
        "the final answer quotes the tool's result: {answer}"
    );
    // It asked the model to stream and emitted each token as it came: what it streamed is
    // the final answer, a token at a time (the last model call's deltas).
    let watched = env.ok(&["dispatch", "watch", &first, "--timeout", "30s"]);
    let streamed = watched.lines().next().unwrap_or_default();
    assert_eq!(streamed, answer, "{watched}");

    let entries: Vec<Value> =
        serde_json::from_str(&env.ok(&["thread", "log", "chat", "--json"])).unwrap();
    let messages: Vec<Value> = entries
        .iter()
        .map(|e| {
            serde_json::from_str::<Value>(e["data"].as_str().unwrap()).unwrap()["message"].clone()
        })
        .collect();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["user", "assistant", "tool", "assistant"],
        "{messages:?}"
    );
    assert_eq!(messages[1]["tool_calls"][0]["function"]["name"], "add");
    assert_eq!(messages[2]["content"], "42");

    // A second question on the thread carries the conversation so far.
    let second = env.enqueue("assistant", "chat", "And 1 + 2?", &[]);
    run_until_idle_with(
        &env,
        &[
            ("ASSISTANT_BASE_URL", &model.url),
            ("ASSISTANT_API_KEY", KEY),
        ],
    );
    assert!(output(&env, &second).contains("the tool answered 3"));

    // The key is in none of what the host keeps or logs.
    let stored = format!(
        "{}\n{}\n{}\n{log}\n{}",
        env.show(&first),
        env.show(&second),
        env.ok(&["thread", "log", "chat", "--json"]),
        env.host_log()
    );
    assert!(!stored.contains(KEY), "the API key leaked: {stored}");
}

#[test]
fn assistant_with_a_wrong_key_fails_without_revealing_it() {
    let model = StandIn::start("the-right-key");
    let env = Env::new(&assistant_config());
    let id = env.enqueue("assistant", "chat", "What is 1 + 1?", &[]);
    let log = run_until_idle_with(
        &env,
        &[
            ("ASSISTANT_BASE_URL", &model.url),
            ("ASSISTANT_API_KEY", "a-wrong-key-5d2e"),
        ],
    );
    let d = env.show(&id);
    assert_eq!(d["status"], "dead_letter", "{d}");
    assert!(
        d["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("HTTP 401"),
        "{d}"
    );
    assert!(!format!("{d}{log}").contains("a-wrong-key-5d2e"));
}

/// A run stopped between the model's reply asking for two tools and their results (an
/// `interrupt` message) leaves the conversation with two calls no result will ever answer, and
/// the stand-in model, like OpenAI, refuses such a history with a 400. The turn the interrupting
/// message starts reads the log, takes the message as the user's turn, answers the two calls as
/// unfinished (`homing_guest::history`) and goes on; nothing of the stopped run lands after the
/// turn's mark.
#[test]
fn a_turn_after_an_interrupt_answers_the_tool_calls_the_stopped_run_left() {
    use homing::store::embedded::EmbeddedStore;
    use homing::store::{Fence, NewDispatch, StoreError, SystemClock};

    const KEY: &str = "assistant-test-key-51aa";
    let model = StandIn::start(KEY);
    let env = Env::new(&assistant_config());
    let store = EmbeddedStore::open(&env.path().join("homing.db"), Arc::new(SystemClock))
        .unwrap()
        .store();
    let rt = tokio::runtime::Runtime::new().unwrap();

    // The run that will be stopped: claimed by a host of its own, it has asked the model and
    // logged the reply with two tool calls, and runs the first tool when the message comes.
    let stopped = rt.block_on(async {
        let mut new = NewDispatch::new("assistant", "chat", b"What is 40 + 2, and 1 + 1?".to_vec());
        new.id = Some("stopped-run".into());
        store.mailbox.enqueue(new).await.unwrap();
        let d = store
            .mailbox
            .claim_dispatch("stopped-run", "another-host/assistant", 60_000)
            .await
            .unwrap()
            .unwrap();
        let fence = Fence::of(&d).unwrap();
        let call = |id: &str, a: u32, b: u32| {
            json!({"id": id, "type": "function",
                   "function": {"name": "add", "arguments": json!({"a": a, "b": b}).to_string()}})
        };
        for message in [
            json!({"role": "user", "content": "What is 40 + 2, and 1 + 1?"}),
            json!({"role": "assistant", "content": null,
                   "tool_calls": [call("call_a", 40, 2), call("call_b", 1, 1)]}),
        ] {
            let entry = json!({"dispatch": "stopped-run", "message": message}).to_string();
            store
                .log
                .append("chat", entry.as_bytes(), Some(&fence))
                .await
                .unwrap();
        }
        fence
    });

    let sent: Value = serde_json::from_str(&env.ok(&[
        "thread",
        "send",
        "chat",
        "--agent",
        "assistant",
        "--on-busy",
        "interrupt",
        "--payload",
        "Never mind: what is 2 + 3?",
        "--json",
    ]))
    .unwrap();
    assert_eq!(sent["interrupted"]["dispatch"], "stopped-run", "{sent}");
    let next = sent["follow_ups"][0].as_str().unwrap().to_owned();
    // The stopped run's next write (its first tool's result) is refused, and lets the thread go.
    rt.block_on(async {
        let late = json!({"dispatch": "stopped-run",
                          "message": {"role": "tool", "tool_call_id": "call_a", "content": "42"}});
        match store
            .log
            .append("chat", late.to_string().as_bytes(), Some(&stopped))
            .await
        {
            Err(StoreError::StaleEpoch { .. }) => {}
            other => panic!("the stopped run's write: {other:?}"),
        }
    });

    let log = run_until_idle_with(
        &env,
        &[
            ("ASSISTANT_BASE_URL", &model.url),
            ("ASSISTANT_API_KEY", KEY),
        ],
    );
    let answer = output(&env, &next);
    assert!(answer.contains("the tool answered 5"), "{answer}\n{log}");
    assert!(
        log.contains("2 tool call(s) of a stopped run answered as unfinished"),
        "{log}"
    );
    assert_eq!(env.show("stopped-run")["status"], "superseded");

    let entries: Vec<Value> =
        serde_json::from_str(&env.ok(&["thread", "log", "chat", "--json"])).unwrap();
    let mark = entries
        .iter()
        .position(|e| e["turn"]["event"] == "interrupted")
        .unwrap_or_else(|| panic!("a turn mark: {entries:?}"));
    assert_eq!(
        mark, 2,
        "the mark follows the stopped run's two entries: {entries:?}"
    );
    assert_eq!(entries[mark + 1]["data"], "Never mind: what is 2 + 3?");
    let after: Vec<String> = entries[mark + 2..]
        .iter()
        .map(|e| {
            serde_json::from_str::<Value>(e["data"].as_str().unwrap()).unwrap()["dispatch"]
                .to_string()
        })
        .collect();
    assert!(
        !after.is_empty() && after.iter().all(|d| d.contains(&next)),
        "only the new turn writes after the mark: {entries:?}"
    );
}
