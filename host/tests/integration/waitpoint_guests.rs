//! Waitpoints end to end, from the guest side: real components built from source (the Rust test
//! guest `waitpoint-sdk-probe`, the Python and JavaScript example agents' `wait-for` tool, the
//! `approval` example) run by a real `homing run`, their waitpoints completed from outside
//! (the API with the waitpoint's own token or an operator's, the CLI) or left to time out.
//!
//! Each guest creates a waitpoint through its SDK's `wait_for` helper, hands the token out to a
//! local notify server, suspends (the dispatch is `waiting`, the run over), is resumed when the
//! waitpoint is completed, and acks reading what was sent. The approval example plans a tool
//! call with the stand-in model and is approved, rejected and left to time out.

use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use serde_json::Value;

use crate::common::{
    Env, Served, guest, polyglot_guest, shared_cache_dir, signal, toml_path, wait_exit,
};
use crate::natsd::free_port;
use crate::outbound_guests::StandIn;

/// The operator token of the test hosts' API (from the environment, as `[api] tokens` reads it).
const OPS_TOKEN: &str = "waitpoint-test-operator-0123456789";

/// `[api]` on `port` with one operator token, the callback URLs' base set to the API itself.
fn api_section(port: u16) -> String {
    format!(
        r#"
[api]
listen = "127.0.0.1:{port}"
public_url = "http://127.0.0.1:{port}"
tokens = [{{ name = "ops", role = "operator", secret = {{ env = "HOMING_TEST_WP_OPERATOR" }} }}]
"#
    )
}

/// A `homing` process started by a test, killed if the test ends first.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `homing args` (`run` or `run --until-idle`) with the operator token and `vars` in its
/// environment, its log in `host.log`.
fn spawn_host(env: &Env, args: &[&str], vars: &[(&str, &str)]) -> Running {
    let log = std::fs::File::create(env.path().join("host.log")).unwrap();
    let mut cmd = env.command(args);
    cmd.env("HOMING_TEST_WP_OPERATOR", OPS_TOKEN);
    for (name, value) in vars {
        cmd.env(name, value);
    }
    Running(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

/// Runs `request` on a runtime of its own: the tests are synchronous, like the CLI they drive.
fn blocking<T>(request: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(request)
}

/// POSTs `body` to `url` (with `bearer` as `Authorization: Bearer`); the status and the text
/// of the answer.
fn post_raw(url: &str, bearer: Option<&str>, body: &str) -> (u16, String) {
    blocking(async {
        let mut request = reqwest::Client::new().post(url).body(body.to_owned());
        if let Some(token) = bearer {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    })
}

/// Polls `/readyz` until the API of the host on `port` answers 200.
fn wait_ready(env: &Env, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let url = format!("http://127.0.0.1:{port}/readyz");
    loop {
        let ready = blocking(async {
            reqwest::get(&url)
                .await
                .is_ok_and(|r| r.status().as_u16() == 200)
        });
        if ready {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the API did not get ready:\n{}",
            env.host_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A local HTTP server standing for whoever a guest hands a waitpoint's token to: it keeps the
/// JSON bodies POSTed to it.
struct Notified {
    served: Served,
    seen: Arc<Mutex<Vec<Value>>>,
}

impl Notified {
    fn start() -> Notified {
        async fn keep(State(seen): State<Arc<Mutex<Vec<Value>>>>, Json(body): Json<Value>) {
            seen.lock().unwrap().push(body);
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let app = axum::Router::new()
            .route("/notify", axum::routing::post(keep))
            .with_state(Arc::clone(&seen));
        Notified {
            served: Served::start(app),
            seen,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/notify", self.served.addr)
    }

    /// The notification for the waitpoint named `name`, waiting for it up to `within`.
    fn wait(&self, env: &Env, name: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let found = self
                .seen
                .lock()
                .unwrap()
                .iter()
                .find(|n| n["name"] == name)
                .cloned();
            if let Some(found) = found {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "no notification for {name} within {within:?}\nhost log:\n{}",
                env.host_log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn all(&self) -> Vec<Value> {
        self.seen.lock().unwrap().clone()
    }
}

/// The waitpoints of dispatch `id`, as the CLI shows them (never their tokens).
fn waitpoints_of(env: &Env, id: &str) -> Vec<Value> {
    serde_json::from_str(&env.ok(&["waitpoint", "list", "--dispatch", id, "--json"])).unwrap()
}

/// Checks what a notify server received for a waitpoint: its id, and a token that the callback
/// URL (under the host's `public_url`) carries.
fn check_notification(notification: &Value, port: u16) -> (String, String, String) {
    let id = notification["waitpoint"].as_str().unwrap().to_owned();
    let token = notification["token"].as_str().unwrap().to_owned();
    let url = notification["callback_url"].as_str().unwrap().to_owned();
    assert!(token.starts_with("hwp_"), "{notification}");
    assert_eq!(
        url,
        format!("http://127.0.0.1:{port}/v1/waitpoints/{id}/complete?token={token}"),
        "{notification}"
    );
    (id, token, url)
}

/// The host's log and the thread log hold no token.
fn assert_no_token_leaked(env: &Env, thread: &str, tokens: &[&str]) {
    let kept = format!(
        "{}\n{}",
        env.host_log(),
        env.ok(&["thread", "log", thread, "--json"])
    );
    for token in tokens {
        assert!(!kept.contains(token), "a waitpoint token leaked: {kept}");
    }
}

// ---------------------------------------------------------------------------------------------
// Rust: the waitpoint-sdk-probe test guest

fn probe_config(port: u16) -> String {
    format!(
        r#"
[host]
lease = "10s"
sweep_interval = "200ms"
{api}
[plugins.probe]
path = {path}
concurrency = 2
timeout = "60s"
max_attempts = 2
allowed_outbound_hosts = ["http://127.0.0.1:*"]
"#,
        api = api_section(port),
        path = toml_path(&guest("waitpoint_sdk_probe")),
    )
}

/// The Rust SDK's `wait_for_with`: the guest hands the token to a notify server and suspends;
/// the dispatch waits without a claim; the token holder completes the waitpoint through its
/// callback URL; the resumed run (no new attempt, one resume) reads what was sent and acks.
/// A second dispatch, completed by an operator with the CLI, resumes the same way; a third
/// waits in place with `await_waitpoint` and is completed while it holds its worker.
#[test]
fn rust_guest_suspends_on_a_waitpoint_and_resumes_with_its_completion() {
    let port = free_port();
    let env = Env::new(&probe_config(port));
    let notified = Notified::start();
    let by_token = env.enqueue(
        "probe",
        "t1",
        &format!("wait approve 60000 {}", notified.url()),
        &[],
    );
    let by_cli = env.enqueue("probe", "t2", "wait review 60000", &[]);
    let in_place = env.enqueue("probe", "t3", "await quick 60000 30000", &[]);
    let _host = spawn_host(&env, &["run"], &[]);
    wait_ready(&env, port);

    // Suspended: waiting, no claim held, one claim so far and no resume yet.
    let d = env.wait_status(&by_token, "waiting", Duration::from_secs(60));
    assert!(
        d["claim"].is_null(),
        "a waiting dispatch holds no claim: {d}"
    );
    assert_eq!(d["attempt"], 0, "{d}");
    let notification = notified.wait(&env, "approve", Duration::from_secs(10));
    let (id, token, url) = check_notification(&notification, port);
    let listed = waitpoints_of(&env, &by_token);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["id"], id.as_str());
    assert_eq!(listed[0]["state"], "pending");
    assert_eq!(listed[0]["metadata"]["probe"], "wait");

    // Whoever holds the token completes it through the callback URL (no other credential).
    let (status, answer) = post_raw(&url, None, "yes");
    assert_eq!(status, 200, "{answer}");
    let d = env.wait_status(&by_token, "acked", Duration::from_secs(60));
    assert_eq!(
        d["result"]["output"], "approve completed by token after 1 resume(s): yes",
        "{d}"
    );
    assert_eq!(d["attempt"], 0, "a resume is not an attempt: {d}");
    assert_eq!(d["resumes"], 1, "{d}");
    assert_eq!(d["claims"], 2, "{d}");
    let log: Vec<Value> =
        serde_json::from_str(&env.ok(&["thread", "log", "t1", "--json"])).unwrap();
    let lines: Vec<&str> = log.iter().map(|e| e["data"].as_str().unwrap()).collect();
    assert_eq!(
        lines,
        [
            format!("waiting on approve ({id})").as_str(),
            "approve completed by token after 1 resume(s): yes"
        ],
        "the token was handed out once, by the run that created the waitpoint"
    );
    // The token completes its waitpoint once: it is settled now.
    let (status, _) = post_raw(&url, None, "again");
    assert_eq!(status, 409);

    // An operator completes the other one with the CLI, without its token.
    env.wait_status(&by_cli, "waiting", Duration::from_secs(60));
    let review = waitpoints_of(&env, &by_cli);
    let review = review[0]["id"].as_str().unwrap();
    env.ok(&["waitpoint", "complete", review, "--payload", "{\"ok\": 1}"]);
    let d = env.wait_status(&by_cli, "acked", Duration::from_secs(60));
    assert_eq!(
        d["result"]["output"], "review completed by cli after 1 resume(s): {\"ok\": 1}",
        "{d}"
    );

    // Waiting in place: the dispatch stays claimed; the completion wakes the wait.
    let deadline = Instant::now() + Duration::from_secs(60);
    let quick = loop {
        let found = waitpoints_of(&env, &in_place);
        if let Some(w) = found.first() {
            break w["id"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "{}", env.host_log());
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(env.show(&in_place)["status"], "claimed");
    env.ok(&["waitpoint", "complete", &quick, "--payload", "now"]);
    let d = env.wait_status(&in_place, "acked", Duration::from_secs(60));
    assert_eq!(
        d["result"]["output"], "quick completed in place: now",
        "{d}"
    );
    assert!(d["resumes"].is_null() || d["resumes"] == 0, "{d}");

    assert_no_token_leaked(&env, "t1", &[&token]);
}

/// A waitpoint nobody answers times out; the resumed run reads `timed-out` and acks. While it
/// waits, `homing run --until-idle` keeps running (waiting is live work) and it stops once the
/// dispatch is settled.
#[test]
fn rust_guest_resumes_when_its_waitpoint_times_out() {
    let port = free_port();
    let env = Env::new(&probe_config(port));
    let id = env.enqueue("probe", "t", "wait late 1500", &[]);
    let mut host = spawn_host(&env, &["run", "--until-idle"], &[]);
    env.wait_status(&id, "waiting", Duration::from_secs(60));
    assert!(
        host.0.try_wait().unwrap().is_none(),
        "--until-idle runs on while a dispatch waits"
    );
    let status = wait_exit(&mut host.0, Duration::from_secs(60));
    assert!(status.success(), "{}", env.host_log());
    let d = env.show(&id);
    assert_eq!(d["status"], "acked", "{d}");
    assert_eq!(
        d["result"]["output"], "late timed-out by timeout after 1 resume(s): ",
        "{d}"
    );
    let w = &waitpoints_of(&env, &id)[0];
    assert_eq!(w["state"], "timed_out", "{w}");
}

// ---------------------------------------------------------------------------------------------
// Python and JavaScript: the example agents' `wait-for` tool

fn polyglot_config(agent: &str, port: u16) -> String {
    format!(
        r#"
[host]
lease = "10s"
sweep_interval = "200ms"
cache_dir = {cache}
{api}
[plugins.agent]
path = {path}
memory = "128MiB"
timeout = "60s"
max_attempts = 2
allowed_outbound_hosts = ["http://127.0.0.1:*"]
"#,
        cache = toml_path(&shared_cache_dir()),
        api = api_section(port),
        path = toml_path(&polyglot_guest(agent)),
    )
}

/// The agent's `wait-for` tool (`wait_for`/`waitFor` in its SDK) hands the token to a notify
/// server and suspends; the token holder completes the waitpoint with `Authorization: Bearer`;
/// the resumed run replies with what was sent and records the turn. A second waitpoint times
/// out, a third is completed by an operator through the API.
fn polyglot_guest_suspends_on_a_waitpoint_and_resumes(agent: &str) {
    let port = free_port();
    let env = Env::new(&polyglot_config(agent, port));
    let notified = Notified::start();
    let by_token = env.enqueue(
        "agent",
        "t1",
        &format!("wait-for approve 60000 {}", notified.url()),
        &[],
    );
    let timed_out = env.enqueue("agent", "t2", "wait-for late 1500", &[]);
    let by_operator = env.enqueue("agent", "t3", "wait-for review 60000", &[]);
    let _host = spawn_host(&env, &["run"], &[]);
    wait_ready(&env, port);

    // Compiling the component on a cache miss takes seconds: the deadlines are generous.
    let d = env.wait_status(&by_token, "waiting", Duration::from_secs(120));
    assert!(d["claim"].is_null(), "{d}");
    let notification = notified.wait(&env, "approve", Duration::from_secs(10));
    let (id, token, _) = check_notification(&notification, port);
    assert_eq!(
        waitpoints_of(&env, &by_token)[0]["metadata"]["asked-by"],
        "agent"
    );
    let complete = format!("http://127.0.0.1:{port}/v1/waitpoints/{id}/complete");
    // Another waitpoint's token does not complete this one.
    let (status, _) = post_raw(&complete, Some("hwp_not-this-waitpoints-token"), "no");
    assert_eq!(status, 401);
    let (status, answer) = post_raw(&complete, Some(&token), "yes please");
    assert_eq!(status, 200, "{answer}");
    let d = env.wait_status(&by_token, "acked", Duration::from_secs(60));
    assert_eq!(
        d["result"]["output"], "approve completed by token after 1 resume(s): yes please",
        "{d}"
    );
    assert_eq!(d["attempt"], 0, "{d}");
    assert_eq!(d["resumes"], 1, "{d}");

    // Timed out: the resumed run reads it.
    let d = env.wait_status(&timed_out, "acked", Duration::from_secs(60));
    assert_eq!(
        d["result"]["output"], "late timed-out after 1 resume(s)",
        "{d}"
    );

    // An operator's token completes any waitpoint.
    env.wait_status(&by_operator, "waiting", Duration::from_secs(60));
    let review = waitpoints_of(&env, &by_operator)[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, answer) = post_raw(
        &format!("http://127.0.0.1:{port}/v1/waitpoints/{review}/complete"),
        Some(OPS_TOKEN),
        "{\"approved\": true}",
    );
    assert_eq!(status, 200, "{answer}");
    let d = env.wait_status(&by_operator, "acked", Duration::from_secs(60));
    assert_eq!(
        d["result"]["output"],
        "review completed by operator:ops after 1 resume(s): {\"approved\": true}",
        "{d}"
    );

    // The suspended run wrote nothing; the resumed one recorded the turn.
    let log: Vec<Value> =
        serde_json::from_str(&env.ok(&["thread", "log", "t1", "--json"])).unwrap();
    let turns: Vec<Value> = log
        .iter()
        .map(|e| serde_json::from_str(e["data"].as_str().unwrap()).unwrap())
        .collect();
    assert_eq!(turns.len(), 2, "{turns:?}");
    assert_eq!(
        turns[1]["content"],
        "approve completed by token after 1 resume(s): yes please"
    );
    assert_eq!(notified.all().len(), 1, "one token handed out");
    assert_no_token_leaked(&env, "t1", &[&token]);
}

#[test]
fn python_guest_suspends_on_a_waitpoint_and_resumes() {
    polyglot_guest_suspends_on_a_waitpoint_and_resumes("python-agent");
}

#[test]
fn js_guest_suspends_on_a_waitpoint_and_resumes() {
    polyglot_guest_suspends_on_a_waitpoint_and_resumes("js-agent");
}

// ---------------------------------------------------------------------------------------------
// The approval example

const MODEL_KEY: &str = "approval-test-key-5d2e";

fn approval_config(port: u16) -> String {
    format!(
        r#"
[host]
lease = "10s"
sweep_interval = "200ms"
{api}
[plugins.approval]
path = {path}
concurrency = 2
timeout = "30s"
max_attempts = 2
allowed_outbound_hosts = ["http://127.0.0.1:*"]

[plugins.approval.variables]
base_url = {{ env = "ASSISTANT_BASE_URL" }}
model = "stand-in"
api_key = {{ env = "ASSISTANT_API_KEY", secret = true }}
notify_url = {{ env = "APPROVAL_NOTIFY_URL", required = false }}
"#,
        api = api_section(port),
        path = toml_path(&guest("approval")),
    )
}

/// The thread log's lines.
fn log_lines(env: &Env, thread: &str) -> Vec<String> {
    let log: Vec<Value> =
        serde_json::from_str(&env.ok(&["thread", "log", thread, "--json"])).unwrap();
    log.iter()
        .map(|e| e["data"].as_str().unwrap().to_owned())
        .collect()
}

/// The approval example against `homing run --until-idle` and the stand-in model: it plans a
/// tool call, asks for approval with the call in the waitpoint's metadata and suspends. One is
/// approved by whoever got its token (the tool runs and the model answers with its result),
/// one is rejected with the CLI (the tool does not run), one is left to time out (it gives
/// up), and one is approved by an operator through the API. The host keeps running while they
/// wait and stops once all are settled; no run asked the model for a plan twice.
#[test]
fn approval_example_is_approved_rejected_and_timed_out() {
    let model = StandIn::start(MODEL_KEY);
    let notified = Notified::start();
    let port = free_port();
    let env = Env::new(&approval_config(port));
    let approved = env.enqueue("approval", "a1", "What is 40 + 2?", &[]);
    let rejected = env.enqueue("approval", "a2", "What is 7 + 5?", &[]);
    let timed_out = env.enqueue(
        "approval",
        "a3",
        "What is 1 + 1?",
        &["--meta", "approval_timeout_ms=2000"],
    );
    let by_operator = env.enqueue("approval", "a4", "What is 2 + 3?", &[]);
    let notify = notified.url();
    let mut host = spawn_host(
        &env,
        &["run", "--until-idle"],
        &[
            ("ASSISTANT_BASE_URL", &model.url),
            ("ASSISTANT_API_KEY", MODEL_KEY),
            ("APPROVAL_NOTIFY_URL", &notify),
        ],
    );
    wait_ready(&env, port);

    // Each waits on `approve-add`, with the planned call in its metadata.
    for id in [&approved, &rejected, &by_operator] {
        env.wait_status(id, "waiting", Duration::from_secs(60));
    }
    let waitpoint = |id: &str| waitpoints_of(&env, id)[0].clone();
    let w = waitpoint(&approved);
    assert_eq!(w["name"], "approve-add", "{w}");
    assert_eq!(w["metadata"]["tool"], "add", "{w}");
    assert_eq!(w["metadata"]["arguments"], "{\"a\": 40, \"b\": 2}", "{w}");
    assert_eq!(w["metadata"]["request"], "What is 40 + 2?", "{w}");

    // Approved with the token the agent sent to its notify URL.
    let sent: Vec<Value> = notified
        .all()
        .into_iter()
        .filter(|n| n["waitpoint"] == w["id"])
        .collect();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["tool"], "add");
    let (_, token, url) = check_notification(&sent[0], port);
    let (status, answer) = post_raw(&url, None, "{\"approved\": true}");
    assert_eq!(status, 200, "{answer}");

    // Rejected by an operator with the CLI, with a reason.
    let r = waitpoint(&rejected);
    env.ok(&[
        "waitpoint",
        "complete",
        r["id"].as_str().unwrap(),
        "--payload",
        "{\"approved\": false, \"reason\": \"not today\"}",
    ]);

    // Approved by an operator through the API.
    let o = waitpoint(&by_operator);
    let (status, answer) = post_raw(
        &format!(
            "http://127.0.0.1:{port}/v1/waitpoints/{}/complete",
            o["id"].as_str().unwrap()
        ),
        Some(OPS_TOKEN),
        "{\"approved\": true}",
    );
    assert_eq!(status, 200, "{answer}");

    // The host stops by itself once the last one (the time-out) is settled.
    let status = wait_exit(&mut host.0, Duration::from_secs(60));
    assert!(status.success(), "{}", env.host_log());

    let out = |id: &str| {
        let d = env.show(id);
        assert_eq!(d["status"], "acked", "{d}");
        assert_eq!(d["attempt"], 0, "{d}");
        assert_eq!(d["resumes"], 1, "{d}");
        d["result"]["output"].as_str().unwrap().to_owned()
    };
    assert_eq!(
        out(&approved),
        "The stand-in model says: the tool answered 42."
    );
    let id = w["id"].as_str().unwrap();
    assert_eq!(
        log_lines(&env, "a1"),
        [
            "request: What is 40 + 2?".to_owned(),
            format!(
                "the model asks to run add {{\"a\": 40, \"b\": 2}}; waiting for a person to approve it (waitpoint {id}, times out in 1h)"
            ),
            "approved by token: ran add {\"a\": 40, \"b\": 2} = 42".to_owned(),
            "answer: The stand-in model says: the tool answered 42.".to_owned(),
        ]
    );

    assert_eq!(
        out(&rejected),
        "I did not run add: a person rejected it (not today)."
    );
    let a2 = log_lines(&env, "a2");
    assert_eq!(a2.len(), 4, "{a2:?}");
    assert_eq!(a2[2], "rejected by cli (not today): add was not run");
    assert!(
        !a2.iter().any(|l| l.contains("ran add")),
        "the tool did not run: {a2:?}"
    );

    assert_eq!(
        out(&timed_out),
        "I gave up on add: nobody approved it in time."
    );
    let a3 = log_lines(&env, "a3");
    assert!(a3[1].ends_with("times out in 2s)"), "{a3:?}");
    assert_eq!(a3[2], "nobody answered within 2s: gave up, add was not run");
    assert_eq!(waitpoint(&timed_out)["state"], "timed_out");

    assert_eq!(
        out(&by_operator),
        "The stand-in model says: the tool answered 5."
    );
    assert_eq!(
        log_lines(&env, "a4")[2],
        "approved by operator:ops: ran add {\"a\": 2, \"b\": 3} = 5"
    );

    assert_no_token_leaked(&env, "a1", &[&token, MODEL_KEY]);
}

/// A guest that stops before its run is settled (SIGTERM while the waitpoint is pending and the
/// dispatch waiting) loses nothing: the next host resumes the dispatch once the waitpoint is
/// completed, and the run finds its plan in the waitpoint instead of asking the model again.
#[test]
fn approval_example_survives_a_restart_while_waiting() {
    let model = StandIn::start(MODEL_KEY);
    let port = free_port();
    let env = Env::new(&approval_config(port));
    let id = env.enqueue("approval", "r1", "What is 20 + 22?", &[]);
    let vars = [
        ("ASSISTANT_BASE_URL", model.url.as_str()),
        ("ASSISTANT_API_KEY", MODEL_KEY),
    ];
    let host = spawn_host(&env, &["run"], &vars);
    env.wait_status(&id, "waiting", Duration::from_secs(60));
    signal(&host.0, "TERM");
    let mut host = host;
    assert!(wait_exit(&mut host.0, Duration::from_secs(30)).success());
    drop(host);

    // Completed while no host runs; the next host resumes it.
    let w = waitpoints_of(&env, &id)[0].clone();
    env.ok(&[
        "waitpoint",
        "complete",
        w["id"].as_str().unwrap(),
        "--payload",
        "{\"approved\": true}",
    ]);
    let _host = spawn_host(&env, &["run"], &vars);
    let d = env.wait_status(&id, "acked", Duration::from_secs(60));
    assert_eq!(
        d["result"]["output"],
        "The stand-in model says: the tool answered 42."
    );
    let lines = log_lines(&env, "r1");
    assert_eq!(
        lines.iter().filter(|l| l.starts_with("request: ")).count(),
        1,
        "{lines:?}"
    );
}
