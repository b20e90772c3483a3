//! Journaled runs end to end (issue 27): the test guest `journal-probe` run by a real
//! `homing run` against a stand-in model on the loopback address that counts what it is asked.
//!
//! - a run that made three model calls, appending each answer to its thread log, then trapped
//!   is retried: the retry repeats none of the calls and appends nothing twice, and its output
//!   is what the first run would have returned;
//! - a retry that changes its prompt diverges at that call (the log line names the position),
//!   and goes to the model from there on;
//! - a follow-up the failing run enqueued is not enqueued again;
//! - the API key the guest sends is in no byte of the store file, nor in the journal's API
//!   output;
//! - past `journal_max_bytes` nothing more is recorded and the retry goes live;
//! - the clock and random values a run read are replayed with it;
//! - steps memoize across a retry (and run every time with the journal off);
//! - on NATS, a host SIGKILLed mid-run leaves its journal to the host that takes the dispatch
//!   over, which asks the model only what the dead host had not been answered.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use serde_json::{Value, json};

use crate::common::{Env, Served, guest, toml_path};
use crate::outbound_guests::run_until_idle_with;

/// The API key the guest sends (from a secret variable).
const API_KEY: &str = "sk-journal-test-8f3a2c91d4e7";

/// A stand-in model: answers each request with a reply naming the turn, the prompt and how
/// many earlier messages it was sent, and counts the requests.
struct Model {
    served: Served,
    seen: Arc<Mutex<Vec<Value>>>,
    count: Arc<AtomicU32>,
}

#[derive(Clone)]
struct ModelState {
    seen: Arc<Mutex<Vec<Value>>>,
    count: Arc<AtomicU32>,
    /// The turn whose first request is answered only after a minute (a host dies meanwhile).
    hang: Option<u64>,
    hung: Arc<std::sync::atomic::AtomicBool>,
}

async fn answer(State(state): State<ModelState>, body: Bytes) -> String {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    state.seen.lock().unwrap().push(request.clone());
    state.count.fetch_add(1, Ordering::SeqCst);
    if state.hang.is_some()
        && request["turn"].as_u64() == state.hang
        && !state.hung.swap(true, Ordering::SeqCst)
    {
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    }
    let reply = format!(
        "turn {} to `{}` after {} messages",
        request["turn"],
        request["prompt"].as_str().unwrap_or_default(),
        request["history"].as_array().map_or(0, Vec::len)
    );
    reply
}

impl Model {
    fn start() -> Model {
        Model::start_hanging(None)
    }

    /// A model that answers the first request of turn `hang` only after a minute.
    fn start_hanging(hang: Option<u64>) -> Model {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let count = Arc::new(AtomicU32::new(0));
        let app = axum::Router::new().fallback(answer).with_state(ModelState {
            seen: seen.clone(),
            count: count.clone(),
            hang,
            hung: Default::default(),
        });
        Model {
            served: Served::start(app),
            seen,
            count,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/v1/chat", self.served.addr)
    }

    fn requests(&self) -> u32 {
        self.count.load(Ordering::SeqCst)
    }

    /// The prompts of the requests, in order.
    fn prompts(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|r| {
                format!(
                    "{}: {}",
                    r["turn"],
                    r["prompt"].as_str().unwrap_or_default()
                )
            })
            .collect()
    }
}

/// A scratch directory running `journal-probe` as plugin `agent` with `journal` and
/// `extra` plugin keys, and an `other` plugin it may enqueue to.
fn env_with(model: &Model, journal: &str, extra: &str) -> Env {
    env_on(
        model,
        journal,
        extra,
        "",
        r#"{ env = "JOURNAL_TEST_KEY", secret = true }"#,
    )
}

/// [`env_with`] on the store `store` (a `[store]` table, or empty for the embedded store),
/// with `api_key` given as `key` (a variable's value spec).
fn env_on(model: &Model, journal: &str, extra: &str, store: &str, key: &str) -> Env {
    Env::new(&format!(
        r#"[host]
lease = "2s"
sweep_interval = "200ms"
{store}
[plugins.agent]
path = {path}
timeout = "20s"
max_attempts = 3
journal = "{journal}"
enqueue_to = ["other"]
allowed_outbound_hosts = ["http://127.0.0.1:{port}"]
{extra}
[plugins.agent.retry]
initial = "10ms"
max = "10ms"
[plugins.agent.variables]
api_key = {key}
[plugins.other]
path = {echo}
"#,
        path = toml_path(&guest("journal_probe")),
        echo = toml_path(&guest("echo")),
        port = model.served.addr.port(),
    ))
}

fn run(env: &Env) -> String {
    run_until_idle_with(env, &[("JOURNAL_TEST_KEY", API_KEY)])
}

/// The acked dispatch's output, as JSON.
fn output(env: &Env, id: &str) -> Value {
    let d = env.show(id);
    assert_eq!(d["status"], "acked", "{d}");
    let text = d["result"]["output"].as_str().unwrap().to_owned();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("output {text:?}: {e}"))
}

/// The thread's log entries, as text.
fn log_of(env: &Env, thread: &str) -> Vec<String> {
    let text = env.ok(&["thread", "log", thread, "--json"]);
    let entries: Vec<Value> = serde_json::from_str(&text).unwrap();
    entries
        .iter()
        .map(|e| e["data"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn a_retried_run_repeats_no_model_call_and_appends_nothing_twice() {
    let model = Model::start();
    let env = env_with(&model, "run", "");
    let payload = json!({"url": model.url(), "prompt": "plan a trip", "fail_on_attempts": [0],
        "enqueue_to": "other"});
    let id = env.enqueue("agent", "chat-1", &payload.to_string(), &[]);
    let log = run(&env);

    // Attempt 0 made the three calls and trapped; attempt 1 made none of them again.
    assert_eq!(model.requests(), 3, "the model was asked again:\n{log}");
    let d = env.show(&id);
    assert_eq!(d["attempt"], 1, "{d}");
    let out = output(&env, &id);
    let answers: Vec<&str> = out["answers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        answers,
        [
            "turn 0 to `plan a trip` after 0 messages",
            "turn 1 to `plan a trip` after 1 messages",
            "turn 2 to `plan a trip` after 2 messages",
        ],
        "the replayed run saw the conversation its first run had"
    );
    assert_eq!(out["log"], 3, "nothing appended twice: {out}");
    assert_eq!(log_of(&env, "chat-1"), answers);
    // The follow-up the failing run enqueued was not enqueued again.
    let followups: Vec<Value> = env
        .list()
        .into_iter()
        .filter(|d| d["agent"] == "other")
        .collect();
    assert_eq!(followups.len(), 1, "enqueued once: {followups:?}");
    assert!(
        log.contains("outbound request answered from the journal"),
        "{log}"
    );
    // The timeline: three exchanges, each recorded by attempt 0, and no key.
    let journal = env.ok(&["dispatch", "show", &id, "--journal"]);
    assert_eq!(
        journal.matches("POST http://127.0.0.1").count(),
        3,
        "{journal}"
    );
    assert!(!journal.contains(API_KEY), "{journal}");
    let shown = env.ok(&["dispatch", "show", &id, "--json", "--journal"]);
    assert!(!shown.contains(API_KEY), "{shown}");

    // The API key is in no byte the store keeps.
    for entry in std::fs::read_dir(env.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            let bytes = std::fs::read(&path).unwrap();
            assert!(
                !bytes
                    .windows(API_KEY.len())
                    .any(|w| w == API_KEY.as_bytes()),
                "the API key is stored in {}",
                path.display()
            );
        }
    }
}

#[test]
fn a_replayed_run_reads_the_clock_and_random_values_its_first_run_read() {
    let model = Model::start();
    let env = env_with(&model, "run", "");
    let payload = json!({"url": model.url(), "prompt": "s", "fail_on_attempts": [0],
        "stamp": true});
    let id = env.enqueue("agent", "chat-4", &payload.to_string(), &[]);
    let log = run(&env);
    // Each request carried a time and a random number read just before it: the retry sent
    // the same ones, so every request was answered from the journal.
    assert_eq!(model.requests(), 3, "{log}");
    let stamps: Vec<Value> = model
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|r| r["stamp"].clone())
        .collect();
    assert!(
        stamps
            .iter()
            .all(|s| s["now"].as_u64().is_some_and(|n| n > 0)),
        "{stamps:?}"
    );
    assert_eq!(env.show(&id)["attempt"], 1);
    assert_eq!(output(&env, &id)["answers"].as_array().unwrap().len(), 3);
}

#[test]
fn a_retry_that_changes_its_prompt_diverges_there_and_goes_live() {
    let model = Model::start();
    let env = env_with(&model, "run", "");
    let payload = json!({"url": model.url(), "prompt": "p", "fail_on_attempts": [0],
        "vary_from": 1});
    let id = env.enqueue("agent", "chat-2", &payload.to_string(), &[]);
    let log = run(&env);
    // Turn 0 replayed; turn 1 asked something else (position 4: read, http, append, read,
    // then this http), so turns 1 and 2 went to the model again.
    assert_eq!(
        model.prompts(),
        [
            "0: p",
            "1: p (attempt 0)",
            "2: p (attempt 0)",
            "1: p (attempt 1)",
            "2: p (attempt 1)",
        ],
        "{log}"
    );
    let line = log
        .lines()
        .find(|l| l.contains("the run diverged from its earlier run"))
        .unwrap_or_else(|| panic!("no divergence line:\n{log}"));
    assert!(
        line.contains("position=4") && line.contains("kind=http"),
        "{line}"
    );
    let out = output(&env, &id);
    assert_eq!(out["answers"][0], "turn 0 to `p` after 0 messages", "{out}");
    assert_eq!(
        out["answers"][1], "turn 1 to `p (attempt 1)` after 1 messages",
        "the live part of the retry read the log as the replay left it: {out}"
    );
}

#[test]
fn past_journal_max_bytes_nothing_more_is_recorded_and_the_retry_goes_live() {
    let model = Model::start();
    // Room for a log read's entry, not for a model exchange.
    let env = env_with(&model, "run", "journal_max_bytes = 200");
    let payload = json!({"url": model.url(), "prompt": "q", "fail_on_attempts": [0]});
    let id = env.enqueue("agent", "chat-3", &payload.to_string(), &[]);
    let log = run(&env);
    assert!(
        log.contains("reached journal_max_bytes"),
        "no warning about the cap:\n{log}"
    );
    assert_eq!(
        model.requests(),
        6,
        "every call of the retry went live:\n{log}"
    );
    assert_eq!(env.show(&id)["status"], "acked");
}

#[test]
fn steps_are_memoized_across_a_retry_and_run_every_time_with_the_journal_off() {
    for (journal, expected) in [("steps", 2), ("off", 4)] {
        let model = Model::start();
        let env = env_with(&model, journal, "");
        let payload = json!({"url": model.url(), "calls": 0, "steps": 2, "prompt": "m",
            "fail_on_attempts": [0]});
        let id = env.enqueue("agent", "chat-5", &payload.to_string(), &[]);
        let log = run(&env);
        assert_eq!(
            model.requests(),
            expected,
            "journal = {journal}: the steps' model calls\n{log}"
        );
        let out = output(&env, &id);
        assert_eq!(
            out["answers"],
            json!([
                "turn 0 to `m` after 0 messages",
                "turn 1 to `m` after 0 messages"
            ]),
            "journal = {journal}: the second step under the same name is its own (plan#2)"
        );
    }
}

#[test]
fn a_host_killed_mid_run_on_nats_leaves_its_journal_to_the_next_host() {
    use crate::hosts::spawn_run;
    use crate::natsd::NatsServer;

    let server = NatsServer::start();
    // Turn 2's first request hangs: host A is killed while it waits for it.
    let model = Model::start_hanging(Some(2));
    let store = format!(
        "[store]\nbackend = \"nats\"\nurl = \"{}\"\nprefix = \"journal1\"\nconnect_timeout = \"30s\"\n",
        server.url()
    );
    let env = env_on(&model, "run", "", &store, &format!("{API_KEY:?}"));
    let payload = json!({"url": model.url(), "prompt": "k"});
    let id = env.enqueue("agent", "chat-6", &payload.to_string(), &[]);
    let mut a = spawn_run(&env, "host-a");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while model.requests() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "host A never reached turn 2:\n{}",
            crate::hosts::host_log(&env, "host-a")
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    a.0.kill().unwrap();
    a.0.wait().unwrap();
    // Host B reclaims the dispatch once A's lease ran out, and replays turns 0 and 1.
    let _b = spawn_run(&env, "host-b");
    let d = env.wait_status(&id, "acked", std::time::Duration::from_secs(120));
    assert_eq!(d["attempt"], 1, "{d}");
    assert_eq!(
        model.prompts(),
        ["0: k", "1: k", "2: k", "2: k"],
        "only turn 2 was asked again:\n{}",
        crate::hosts::host_log(&env, "host-b")
    );
    let out = output(&env, &id);
    assert_eq!(out["log"], 3, "nothing appended twice: {out}");
    assert!(
        crate::hosts::host_log(&env, "host-b")
            .contains("outbound request answered from the journal")
    );
}
