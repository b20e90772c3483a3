//! The OpenAI-compatible endpoint as OpenAI's own Python SDK (`openai`, pinned and installed
//! into `.tools/python` by `cargo xtask python-clients` when missing) uses it, against a real
//! `homing run` on the embedded store and on a real `nats-server`. The model behind it is the
//! `assistant` example (a component built from source), which itself calls the stand-in model
//! server with a secret key: the SDK lists the models, has two turns of one conversation (the
//! first plain, the second streamed a token at a time), and is refused with the SDK's own
//! errors for a model that is not exposed, a history that does not end with the user, a
//! reader's token and no token; a run that fails answers 502 that the SDK does not retry (the
//! message is stored once). The conversation is one thread whose log holds both turns, and
//! the stand-in's key is in none of the answers, the log or the host's output.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use crate::api::{Api, OPERATOR, PRODUCER, READER, TOKENS};
use crate::common::{guest, root, target_dir, toml_path};
use crate::natsd::NatsServer;
use crate::outbound_guests::StandIn;

/// The venv's `python` with the `openai` SDK, installed by `cargo xtask python-clients` (once
/// per test process) when missing; fails loudly, never skips, when it cannot be had.
pub(crate) fn python() -> &'static PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let result = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(root())
            .env("CARGO_TARGET_DIR", target_dir().join("xtask"))
            .env_remove("RUSTFLAGS")
            .args(["run", "--quiet", "--package", "xtask", "--", "python-clients"])
            .output()
            .expect("cannot run cargo to install the Python clients");
        let stdout = String::from_utf8_lossy(&result.stdout);
        assert!(
            result.status.success(),
            "`cargo xtask python-clients` failed (it needs python3 with pip and venv):\n{stdout}\n{}",
            String::from_utf8_lossy(&result.stderr)
        );
        let bin = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
        assert!(bin.is_file(), "no python at {}", bin.display());
        bin
    })
}

/// Runs `script` with the venv's `python` and `vars` in its environment; returns what it
/// printed, parsed as JSON, failing with its output and the host's log when it fails.
pub(crate) async fn run_python(api: &Api, script: &str, vars: &[(&str, &str)]) -> Value {
    let mut command = Command::new(tokio::task::spawn_blocking(python).await.unwrap());
    command
        .arg("-c")
        .arg(script)
        .env("BASE", &api.base)
        .envs(vars.iter().copied());
    let ran = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap();
    let printed = String::from_utf8_lossy(&ran.stdout).into_owned();
    assert!(
        ran.status.success(),
        "the SDK script failed:\n{printed}\n{}\nhost log:\n{}",
        String::from_utf8_lossy(&ran.stderr),
        api.log()
    );
    serde_json::from_str(printed.trim())
        .unwrap_or_else(|e| panic!("the script printed no JSON ({e}): {printed}"))
}

const KEY: &str = "stand-in-key-for-the-openai-test-5e21";

fn config(store: &str, port: u16, model_origin: &str) -> String {
    format!(
        r#"
[pricing."{model_origin}"]
format = "openai"

[host]
lease = "10s"
sweep_interval = "200ms"
shutdown_grace = "2s"

{store}
[api]
listen = "127.0.0.1:{port}"
request_timeout = "10s"
max_wait = "60s"
{TOKENS}

[plugins.assistant]
path = {assistant}
timeout = "30s"
max_attempts = 1
allowed_outbound_hosts = ["http://127.0.0.1:*"]

[plugins.assistant.openai]
expose = true

[plugins.assistant.variables]
base_url = {{ env = "ASSISTANT_BASE_URL" }}
model = "stand-in"
api_key = {{ env = "ASSISTANT_API_KEY", secret = true }}

[plugins.broken]
path = {assistant}
timeout = "30s"
max_attempts = 1
allowed_outbound_hosts = ["http://127.0.0.1:*"]

[plugins.broken.openai]
expose = true

[plugins.broken.variables]
base_url = {{ env = "ASSISTANT_BASE_URL" }}
model = "stand-in"
api_key = "a-wrong-key"

[plugins.echo]
path = {echo}
"#,
        assistant = toml_path(&guest("assistant")),
        echo = toml_path(&guest("echo")),
    )
}

/// What the script does with the SDK; it prints one JSON object of what it saw.
const SCRIPT: &str = r#"
import json, os, sys
import openai
from openai import OpenAI

base = os.environ["BASE"] + "/openai/v1"
client = OpenAI(base_url=base, api_key=os.environ["PRODUCER"])
out = {}

out["models"] = sorted(m.id for m in client.models.list())

raw = client.chat.completions.with_raw_response.create(
    model="assistant",
    messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is 40 + 2?"}],
    user="ada",
)
first = raw.parse()
out["first"] = {
    "text": first.choices[0].message.content,
    "role": first.choices[0].message.role,
    "finish": first.choices[0].finish_reason,
    "object": first.object,
    "model": first.model,
    "thread": raw.headers.get("homing-thread"),
    "dispatch": raw.headers.get("homing-dispatch"),
    "usage": first.usage.model_dump() if first.usage else None,
}

stream = client.chat.completions.create(
    model="assistant",
    messages=[{"role": "user", "content": "What is 40 + 2?"}, {"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "And 1 + 2?"}],
    user="ada",
    stream=True,
    stream_options={"include_usage": True},
)
pieces, finishes, usages = [], [], []
for chunk in stream:
    if chunk.usage is not None:
        usages.append(chunk.usage.model_dump())
    for choice in chunk.choices:
        if choice.delta.content:
            pieces.append(choice.delta.content)
        if choice.finish_reason:
            finishes.append(choice.finish_reason)
out["second"] = {"pieces": pieces, "text": "".join(pieces), "finishes": finishes, "usages": usages}

def refused(call):
    try:
        call()
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return {"class": type(e).__name__, "status": e.status_code, "body": body,
                "retry": e.response.headers.get("x-should-retry"),
                "thread": e.response.headers.get("homing-thread")}
    return {"class": "none"}

user = [{"role": "user", "content": "hi"}]
out["not_exposed"] = refused(lambda: client.chat.completions.create(model="echo", messages=user))
out["not_user_last"] = refused(lambda: client.chat.completions.create(
    model="assistant", messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]))
out["reader"] = refused(lambda: OpenAI(base_url=base, api_key=os.environ["READER"], max_retries=0)
    .chat.completions.create(model="assistant", messages=user))
out["no_token"] = refused(lambda: OpenAI(base_url=base, api_key="not-a-token-at-all-0123456789", max_retries=0)
    .models.list())
out["failed"] = refused(lambda: client.chat.completions.create(model="broken", messages=user, user="bob"))
print(json.dumps(out))
"#;

async fn conversation(store: &str) {
    let model = StandIn::start(KEY);
    let store = store.to_owned();
    let url = model.url.clone();
    let origin = url.trim_end_matches("/v1").to_owned();
    let api = Api::start_with_env(
        move |port| config(&store, port, &origin),
        &[
            ("ASSISTANT_BASE_URL", url.as_str()),
            ("ASSISTANT_API_KEY", KEY),
        ],
    )
    .await;
    let seen = run_python(&api, SCRIPT, &[("PRODUCER", PRODUCER), ("READER", READER)]).await;

    assert_eq!(seen["models"], serde_json::json!(["assistant", "broken"]));
    let first = &seen["first"];
    assert!(
        first["text"]
            .as_str()
            .unwrap()
            .contains("the tool answered 42"),
        "{first}"
    );
    assert_eq!(first["role"], "assistant");
    assert_eq!(first["finish"], "stop");
    assert_eq!(first["object"], "chat.completion");
    assert_eq!(first["model"], "assistant");
    assert_eq!(first["thread"], "openai.assistant.ada");
    let dispatch = first["dispatch"].as_str().unwrap();

    let second = &seen["second"];
    let text = second["text"].as_str().unwrap();
    assert!(text.contains("the tool answered 3"), "{second}");
    assert!(
        second["pieces"].as_array().unwrap().len() > 3,
        "the answer came a token at a time: {second}"
    );
    assert_eq!(second["finishes"], serde_json::json!(["stop"]));

    let refusal = |key: &str, class: &str, status: u64| {
        let r = &seen[key];
        assert_eq!(r["class"], class, "{key}: {r}");
        assert_eq!(r["status"], status, "{key}: {r}");
        r.clone()
    };
    let r = refusal("not_exposed", "NotFoundError", 404);
    assert_eq!(r["body"]["code"], "model_not_found", "{r}");
    assert_eq!(r["body"]["param"], "model", "{r}");
    let r = refusal("not_user_last", "BadRequestError", 400);
    assert_eq!(r["body"]["param"], "messages", "{r}");
    assert_eq!(r["body"]["type"], "invalid_request_error", "{r}");
    refusal("reader", "PermissionDeniedError", 403);
    refusal("no_token", "AuthenticationError", 401);
    let r = refusal("failed", "InternalServerError", 502);
    assert_eq!(r["retry"], "false", "{r}");
    assert_eq!(r["thread"], "openai.broken.bob", "{r}");

    // The conversation is one thread: both turns in its log, in order.
    let (status, log) = api.get("/v1/threads/openai.assistant.ada/log").await;
    assert_eq!(status, 200, "{log}");
    let roles: Vec<String> = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| {
            // A message the run acknowledged is the user's turn; the rest are the assistant's.
            if e["message"].is_object() {
                return Some("user".to_owned());
            }
            let data: Value = serde_json::from_str(e["data"].as_str()?).ok()?;
            data["message"]["role"].as_str().map(str::to_owned)
        })
        .collect();
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
            "assistant",
            "tool",
            "assistant"
        ],
        "{log}"
    );
    let (status, shown) = api.get(&format!("/v1/dispatches/{dispatch}")).await;
    assert_eq!(status, 200);
    assert_eq!(shown["thread"], "openai.assistant.ada");
    // The turn's model calls (a tool call, then the answer), metered by the host from the
    // stand-in's streamed usage: on the dispatch, and as the completion's `usage`.
    let usage = &shown["usage"];
    assert_eq!(usage["model_calls"], 2, "{shown}");
    let input = usage["input_tokens"].as_u64().unwrap();
    let output = usage["output_tokens"].as_u64().unwrap();
    assert!(input > 0 && output > 0, "{usage}");
    assert_eq!(first["usage"]["prompt_tokens"], input, "{first}");
    assert_eq!(first["usage"]["completion_tokens"], output, "{first}");
    assert_eq!(first["usage"]["total_tokens"], input + output, "{first}");
    let streamed = second["usages"].as_array().unwrap();
    assert_eq!(streamed.len(), 1, "one usage chunk, last: {second}");
    assert!(
        streamed[0]["prompt_tokens"].as_u64().unwrap() > input,
        "the second turn reads more history: {second}"
    );
    let text = api.env.ok(&["dispatch", "show", dispatch]);
    assert!(
        text.contains(&format!(
            "tokens:       {input} in (0 cached), {output} out, 2 model calls"
        )),
        "{text}"
    );
    // The failed run's message was sent once: the SDK did not retry the 502.
    let (_, messages) = api.get("/v1/threads/openai.broken.bob/messages").await;
    assert_eq!(
        messages["messages"].as_array().unwrap().len(),
        1,
        "{messages}"
    );
    let (_, sent) = api.get("/v1/threads/openai.assistant.ada/messages").await;
    let sent_by: Vec<&str> = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["sent_by"].as_str().unwrap())
        .collect();
    assert_eq!(sent_by, ["openai:producer", "openai:producer"], "{sent}");

    let everything = format!("{seen}\n{log}\n{shown}\n{}", api.log());
    assert!(!everything.contains(KEY), "the stand-in's key leaked");
    let _ = OPERATOR;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_talks_to_an_agent_on_the_embedded_store() {
    conversation("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_talks_to_an_agent_on_nats() {
    let server = NatsServer::start();
    let store = server.store_section("oai");
    conversation(&store).await;
}
