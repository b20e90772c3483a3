//! Journaled runs (issue 27) from the Python and JavaScript example agents
//! (`examples/python-agent`, `examples/js-agent`), whose model calls go through their SDKs'
//! HTTP clients (Python `http.request`, JavaScript `fetch`) over `wasi:http`; `journal_runs`
//! has the same for a Rust guest.
//!
//! Each agent's `research 3 <url> fail-first` makes three model calls in sequence against a
//! stand-in model on the loopback address that counts what it is asked, reading its thread log
//! before each call and appending each answer to it, then fails attempt 0. Under
//! `journal = "run"` the retry is answered from the journal: the model is asked three times in
//! all, the retry's reply is what the first run got, and the log holds every entry once. With
//! `journal = "off"` the same retry asks the model three more times and appends three more
//! entries: the journal is what saves them.
//!
//! Their `memo 2 <url> fail-first` makes the same calls through the SDKs' step helpers
//! (`claim.step("ask", ...)`, keyed `ask`, `ask#2`) and fails attempt 0 after them. Under
//! `journal = "steps"` the host keeps each step's result, so the retry gets both answers back
//! and the model is asked twice in all; with `journal = "off"` nothing is kept and the retry
//! asks twice more.
//!
//! One function per behaviour, run once per language (as in `polyglot`).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use serde_json::Value;

use crate::common::{Env, Served, polyglot_guest, shared_cache_dir, toml_path};

const PYTHON: &str = "python-agent";
const JS: &str = "js-agent";

/// A stand-in model: answers each request with text naming the turn and the history count it
/// was sent and how many requests it has had (so no two answers are alike), and keeps the
/// request bodies.
struct Model {
    served: Served,
    seen: Arc<Mutex<Vec<Value>>>,
    count: Arc<AtomicU32>,
}

#[derive(Clone)]
struct ModelState {
    seen: Arc<Mutex<Vec<Value>>>,
    count: Arc<AtomicU32>,
}

async fn answer(State(state): State<ModelState>, body: Bytes) -> String {
    let nth = state.count.fetch_add(1, Ordering::SeqCst) + 1;
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let reply = answer_text(&request["turn"], &request["history"], nth);
    state.seen.lock().unwrap().push(request);
    reply
}

/// The model's answer to its `nth` request (counting from 1), with these `turn` and `history`
/// fields.
fn answer_text(turn: &Value, history: &Value, nth: u32) -> String {
    format!("answer {turn} after {history} entries (request {nth})")
}

impl Model {
    fn start() -> Model {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let count = Arc::new(AtomicU32::new(0));
        let app = axum::Router::new().fallback(answer).with_state(ModelState {
            seen: seen.clone(),
            count: count.clone(),
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

    /// The `(turn, history)` of each request, in order.
    fn asked(&self) -> Vec<(u64, u64)> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["turn"].as_u64().unwrap_or(u64::MAX),
                    r["history"].as_u64().unwrap_or(u64::MAX),
                )
            })
            .collect()
    }
}

/// A host running `agent` as plugin `agent` with `journal`, allowed to reach `model`, retried
/// after 10 ms.
fn env_for(agent: &str, journal: &str, model: &Model) -> Env {
    Env::new(&format!(
        r#"
[host]
lease = "10s"
sweep_interval = "200ms"
cache_dir = {cache}

[plugins.agent]
path = {path}
memory = "128MiB"
timeout = "20s"
max_attempts = 3
journal = "{journal}"
allowed_outbound_hosts = ["http://127.0.0.1:{port}"]

[plugins.agent.retry]
initial = "10ms"
max = "10ms"
"#,
        cache = toml_path(&shared_cache_dir()),
        path = toml_path(&polyglot_guest(agent)),
        port = model.served.addr.port(),
    ))
}

/// The acked dispatch `id`, after `attempts` failed attempts; returns its output.
fn acked_after(env: &Env, id: &str, attempts: u64, log: &str) -> String {
    let d = env.show(id);
    assert_eq!(d["status"], "acked", "{d}\n{log}");
    assert_eq!(d["attempt"], attempts, "{d}\n{log}");
    d["result"]["output"].as_str().unwrap().to_owned()
}

/// The thread log as (role, content) pairs, read back through the CLI.
fn turns(env: &Env, thread: &str) -> Vec<(String, String)> {
    let log: Vec<Value> =
        serde_json::from_str(&env.ok(&["thread", "log", thread, "--json"])).unwrap();
    log.iter()
        .map(|entry| {
            let turn: Value = serde_json::from_str(entry["data"].as_str().unwrap())
                .unwrap_or_else(|e| panic!("log entry is not JSON ({e}): {entry}"));
            (
                turn["role"].as_str().unwrap().to_owned(),
                turn["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The answers to turns 0, 1, ... sent with these history counts, as the model's requests
/// `first`, `first + 1`, ...
fn answers(first: u32, histories: &[u64]) -> Vec<String> {
    (0..)
        .zip(histories)
        .map(|(turn, history)| answer_text(&turn.into(), &(*history).into(), first + turn))
        .collect()
}

fn a_retried_research_repeats_no_model_call_and_appends_nothing_twice(agent: &str) {
    let model = Model::start();
    let env = env_for(agent, "run", &model);
    let message = format!("research 3 {} fail-first", model.url());
    let id = env.enqueue("agent", "chat", &message, &[]);
    let log = env.run_until_idle();

    // Attempt 0 made the three calls and failed; attempt 1 made none of them again.
    assert_eq!(model.requests(), 3, "the model was asked again:\n{log}");
    assert_eq!(model.asked(), [(0, 0), (1, 1), (2, 2)], "{log}");
    let out = acked_after(&env, &id, 1, &log);
    let expected = answers(1, &[0, 1, 2]);
    assert_eq!(
        out,
        expected.join(" | "),
        "the retry replied with what the first run got"
    );
    assert!(
        log.contains("outbound request answered from the journal"),
        "{log}"
    );

    // The three answers once each, then the turn the retry recorded.
    let mut want: Vec<(String, String)> = expected
        .into_iter()
        .map(|answer| ("tool".to_owned(), answer))
        .collect();
    want.push(("user".into(), message));
    want.push(("agent".into(), out));
    assert_eq!(turns(&env, "chat"), want, "nothing appended twice");
}

#[test]
fn python_agent_retried_research_repeats_no_model_call_and_appends_nothing_twice() {
    a_retried_research_repeats_no_model_call_and_appends_nothing_twice(PYTHON);
}

#[test]
fn js_agent_retried_research_repeats_no_model_call_and_appends_nothing_twice() {
    a_retried_research_repeats_no_model_call_and_appends_nothing_twice(JS);
}

fn without_the_journal_the_retry_asks_the_model_again(agent: &str) {
    let model = Model::start();
    let env = env_for(agent, "off", &model);
    let message = format!("research 3 {} fail-first", model.url());
    let id = env.enqueue("agent", "chat", &message, &[]);
    let log = env.run_until_idle();

    // The retry went to the model again, with the first run's three answers in its log.
    assert_eq!(model.requests(), 6, "{log}");
    assert_eq!(
        model.asked(),
        [(0, 0), (1, 1), (2, 2), (0, 3), (1, 4), (2, 5)],
        "{log}"
    );
    let out = acked_after(&env, &id, 1, &log);
    assert_eq!(out, answers(4, &[3, 4, 5]).join(" | "));
    let log = turns(&env, "chat");
    assert_eq!(
        log.iter().filter(|(role, _)| role == "tool").count(),
        6,
        "every answer appended again: {log:?}"
    );
    assert_eq!(log.len(), 8, "{log:?}");
}

#[test]
fn python_agent_without_the_journal_the_retry_asks_the_model_again() {
    without_the_journal_the_retry_asks_the_model_again(PYTHON);
}

#[test]
fn js_agent_without_the_journal_the_retry_asks_the_model_again() {
    without_the_journal_the_retry_asks_the_model_again(JS);
}

fn a_retried_memo_gets_its_steps_back_without_asking_again(agent: &str) {
    let model = Model::start();
    let env = env_for(agent, "steps", &model);
    let message = format!("memo 2 {} fail-first", model.url());
    let id = env.enqueue("agent", "chat", &message, &[]);
    let log = env.run_until_idle();

    // Attempt 0 asked twice and failed; attempt 1 read both steps back.
    assert_eq!(model.requests(), 2, "a step ran again:\n{log}");
    assert_eq!(model.asked(), [(0, 0), (1, 0)], "{log}");
    let out = acked_after(&env, &id, 1, &log);
    assert_eq!(
        out,
        answers(1, &[0, 0]).join(" | "),
        "the retry replied with what the first run's steps kept"
    );
    // Only the retry's turn is in the log: the failed attempt appended nothing.
    assert_eq!(
        turns(&env, "chat"),
        [("user".to_owned(), message), ("agent".to_owned(), out)]
    );
}

#[test]
fn python_agent_retried_memo_gets_its_steps_back_without_asking_again() {
    a_retried_memo_gets_its_steps_back_without_asking_again(PYTHON);
}

#[test]
fn js_agent_retried_memo_gets_its_steps_back_without_asking_again() {
    a_retried_memo_gets_its_steps_back_without_asking_again(JS);
}

fn without_the_journal_a_retried_memo_runs_its_steps_again(agent: &str) {
    let model = Model::start();
    let env = env_for(agent, "off", &model);
    let message = format!("memo 2 {} fail-first", model.url());
    let id = env.enqueue("agent", "chat", &message, &[]);
    let log = env.run_until_idle();

    // Nothing was kept: the retry asked the model both times again.
    assert_eq!(model.requests(), 4, "{log}");
    assert_eq!(model.asked(), [(0, 0), (1, 0), (0, 0), (1, 0)], "{log}");
    let out = acked_after(&env, &id, 1, &log);
    assert_eq!(
        out,
        answers(3, &[0, 0]).join(" | "),
        "the retry replied with its own answers"
    );
}

#[test]
fn python_agent_without_the_journal_a_retried_memo_runs_its_steps_again() {
    without_the_journal_a_retried_memo_runs_its_steps_again(PYTHON);
}

#[test]
fn js_agent_without_the_journal_a_retried_memo_runs_its_steps_again() {
    without_the_journal_a_retried_memo_runs_its_steps_again(JS);
}
