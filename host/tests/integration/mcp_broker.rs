//! MCP tools brokered by the host (`mcp-tools`, `mcp-call`, `homing:agent@0.2.1`), against an
//! MCP server built with the official MCP Python SDK (`mcp_test_server.py`, stateful sessions,
//! event-stream answers, a bearer it checks), on the embedded store and on a real
//! `nats-server`, with real `homing run` processes and the `mcp-probe` guest built from source.
//!
//! One scenario per store:
//! - the allowed tools are listed with their approval flags; calls answer (a result, a tool
//!   error); every refusal names what was wrong and sends nothing (an unknown server, a tool
//!   outside the allow-list, arguments that are not an object or fail the schema, a changed
//!   pin), and an answer over `max_result` is refused;
//! - a journaled retry calls no tool twice;
//! - approvals: approved from the CLI (the call runs once), rejected (with the person's
//!   reason, nothing runs), timed out (nothing runs), and approved while the host is SIGKILLed
//!   (the next host runs the call once);
//! - a host SIGKILLed while a non-idempotent call is in flight: the retry is told `unknown`
//!   and the tool does not run again;
//! - OAuth client credentials: a token asked for once and reused;
//! - the server's bearer and the OAuth client's secret are in no log line, result, journal or
//!   waitpoint.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{Env, guest, root, toml_path};
use crate::natsd::NatsServer;
use crate::openai_endpoint::python;

/// The bearer the server wants: searched for everywhere afterwards.
const TOKEN: &str = "mcp-bearer-7f3a9c1e5d";

/// The official-SDK server on a free loopback port.
struct Server {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let port_file = dir.path().join("port");
        let child = Command::new(python())
            .arg(root().join("host/tests/integration/mcp_test_server.py"))
            .arg(&port_file)
            .arg(TOKEN)
            .stdin(Stdio::null())
            .spawn()
            .expect("cannot start the MCP test server");
        let deadline = Instant::now() + Duration::from_secs(60);
        let port = loop {
            if let Ok(text) = std::fs::read_to_string(&port_file)
                && let Ok(port) = text.trim().parse()
            {
                break port;
            }
            assert!(
                Instant::now() < deadline,
                "the MCP test server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        Server {
            child,
            port,
            _dir: dir,
        }
    }

    /// How often each tool ran, and the refused requests.
    async fn calls(&self) -> Value {
        reqwest::get(format!("http://127.0.0.1:{}/calls", self.port))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Changes the `add` tool's description.
    async fn mutate(&self) {
        let answer = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{}/mutate", self.port))
            .send()
            .await
            .unwrap();
        assert!(answer.status().is_success());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn config(port: u16, store: &str) -> String {
    let url = format!("http://127.0.0.1:{port}/mcp");
    format!(
        r#"
[host]
lease = "2s"
sweep_interval = "200ms"
shutdown_grace = "5s"
hosts = {{ "mcp.test" = "127.0.0.2" }}

[plugins.ops]
path = {probe}
journal = "run"
max_attempts = 5
timeout = "20s"
[plugins.ops.retry]
initial = "10ms"
max = "50ms"

[plugins.ops.mcp.records]
url = "{url}"
auth = {{ bearer = {{ env = "MCP_TOKEN", secret = true }} }}
tools = ["add", "send_email", "delete_*", "big", "fail", "slow"]
approval_for = {{ "send_email" = "never", "slow" = "never" }}
max_result = "64KiB"

[plugins.ops.mcp.quick]
url = "{url}"
auth = {{ bearer = {{ env = "MCP_TOKEN", secret = true }} }}
tools = ["delete_record"]
approval_timeout = "1s"

[plugins.ops.mcp.pinned]
url = "{url}"
auth = {{ bearer = {{ env = "MCP_TOKEN", secret = true }} }}
tools = ["add"]
pin = "sha256:{zeros}"

[plugins.ops.mcp.named]
url = "http://mcp.test:{port}/mcp"
tools = ["add"]

[plugins.ops.mcp.oauthed]
url = "{url}"
tools = ["add", "echo_tokens"]
[plugins.ops.mcp.oauthed.auth.oauth]
token_url = "http://127.0.0.1:{port}/token"
client_id = "homing"
client_secret = {{ env = "MCP_CLIENT_SECRET", secret = true }}
scope = "tools"
{store}"#,
        probe = toml_path(&guest("mcp_probe")),
        zeros = "0".repeat(64),
    )
}

/// `homing args` with the server's credentials in the environment.
fn homing(env: &Env, args: &[&str]) -> Command {
    let mut cmd = env.command(args);
    cmd.env("MCP_TOKEN", TOKEN)
        .env("MCP_CLIENT_SECRET", format!("{TOKEN}-client"));
    cmd
}

fn spawn_host(env: &Env, log: &str) -> Child {
    let log = std::fs::File::create(env.path().join(log)).unwrap();
    homing(env, &["run"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

fn kill(host: &mut Child) {
    host.kill().unwrap();
    host.wait().unwrap();
}

fn enqueue(env: &Env, thread: &str, cmd: Value) -> String {
    env.enqueue("ops", thread, &cmd.to_string(), &[])
}

/// The dispatch's output, parsed, once it is acked.
fn output(env: &Env, id: &str) -> Value {
    let d = env.wait_status(id, "acked", Duration::from_secs(30));
    serde_json::from_str(d["result"]["output"].as_str().unwrap_or("null")).unwrap()
}

fn error_of(out: &Value) -> String {
    out["error"].as_str().unwrap_or_default().to_owned()
}

/// The pending approval waitpoint of dispatch `id`.
fn approval(env: &Env, id: &str) -> Value {
    env.wait_status(id, "waiting", Duration::from_secs(30));
    let list: Value =
        serde_json::from_str(&env.ok(&["waitpoint", "list", "--dispatch", id, "--json"])).unwrap();
    let w = list
        .as_array()
        .and_then(|l| l.iter().find(|w| w["state"] == "pending"))
        .cloned()
        .unwrap_or_else(|| panic!("no pending waitpoint for {id}: {list}"));
    assert_eq!(w["metadata"]["kind"], "mcp-approval", "{w}");
    w
}

async fn wait_calls(server: &Server, tool: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let calls = server.calls().await;
        if calls[tool].as_u64() == Some(n) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{tool} never ran {n} times: {calls}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn scenario(store: &str) {
    let server = Server::start();
    let env = Env::new(&config(server.port, store));
    let mut host = spawn_host(&env, "host.log");

    // The allowed tools, with what the rules make of them.
    let tools = output(
        &env,
        &enqueue(&env, "t", json!({"op": "tools", "server": "records"})),
    );
    let names: Vec<&str> = tools
        .as_array()
        .unwrap_or_else(|| {
            panic!(
                "{tools}\n{}",
                std::fs::read_to_string(env.path().join("host.log")).unwrap_or_default()
            )
        })
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["add", "big", "delete_record", "fail", "send_email", "slow"],
        "{tools}"
    );
    let flag = |name: &str| {
        tools
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap()["needs_approval"]
            .as_bool()
            .unwrap()
    };
    assert!(flag("delete_record") && !flag("add") && !flag("send_email") && !flag("big"));

    // Calls: a result, a tool error.
    let call = |tool: &str, args: Value| json!({"op": "call", "server": "records", "tool": tool, "args": args});
    let added = output(
        &env,
        &enqueue(&env, "t", call("add", json!({"a": 2, "b": 3}))),
    );
    assert_eq!(
        (
            &added["outcome"],
            &added["text"],
            &added["structured"]["result"]
        ),
        (&json!("done"), &json!("5"), &json!(5)),
        "{added}"
    );
    let failed = output(&env, &enqueue(&env, "t", call("fail", json!({}))));
    assert_eq!(failed["is_error"], true, "{failed}");
    assert!(
        failed["text"]
            .as_str()
            .unwrap()
            .contains("failed on purpose"),
        "{failed}"
    );

    // Refusals: named, nothing sent.
    let refused = |cmd: Value| error_of(&output(&env, &enqueue(&env, "t", cmd)));
    let e = refused(json!({"op": "call", "server": "nope", "tool": "add", "args": {}}));
    assert!(
        e.starts_with("Invalid") && e.contains("`nope`") && e.contains("records"),
        "{e}"
    );
    let e = refused(json!({"op": "call", "server": "pinned", "tool": "send_email", "args": {}}));
    assert!(
        e.starts_with("Denied") && e.contains("not in [plugins.ops.mcp.pinned] tools"),
        "{e}"
    );
    let e = refused(json!({"op": "raw", "server": "records", "tool": "add", "arguments": "[1]"}));
    assert!(e.starts_with("Invalid") && e.contains("JSON object"), "{e}");
    let e = refused(call("add", json!({"a": "two", "b": 3})));
    assert!(
        e.starts_with("Invalid") && e.contains("`a` must be of type integer"),
        "{e}"
    );
    let e = refused(call("add", json!({"b": 3})));
    assert!(e.contains("`a` is required"), "{e}");
    let e =
        refused(json!({"op": "call", "server": "pinned", "tool": "add", "args": {"a": 1, "b": 1}}));
    assert!(
        e.starts_with("Denied") && e.contains("digest is sha256:") && e.contains("not the pin"),
        "{e}"
    );
    let e = refused(json!({"op": "forge", "name": "mcp/records/delete_record/x#1"}));
    assert!(
        e.starts_with("Invalid") && e.contains("MCP approvals"),
        "{e}"
    );
    let e = refused(call("big", json!({"n": 100_000})));
    assert!(e.starts_with("Denied") && e.contains("max_result"), "{e}");
    let calls = server.calls().await;
    assert_eq!(
        (calls["add"].as_u64(), calls["refused"].as_u64()),
        (Some(1), Some(0)),
        "{calls}"
    );

    // OAuth client credentials: the host asks the token endpoint once and reuses the token.
    let oauthed =
        json!({"op": "call", "server": "oauthed", "tool": "add", "args": {"a": 1, "b": 1}});
    for _ in 0..2 {
        let out = output(&env, &enqueue(&env, "t", oauthed.clone()));
        assert_eq!(out["text"], "2", "{out}");
    }
    assert_eq!(server.calls().await["tokens"], 1);
    // A server that echoes its access token back: the guest gets it scrubbed.
    let echoed = output(
        &env,
        &enqueue(
            &env,
            "t",
            json!({"op": "call", "server": "oauthed", "tool": "echo_tokens", "args": {}}),
        ),
    );
    let text = echoed["text"].as_str().unwrap_or_default();
    assert!(
        text.starts_with("tokens: ") && text.contains("[redacted]") && !text.contains("issued-"),
        "{echoed}"
    );

    // The servers' origins are the broker's grant, not the guest's: its own request to the
    // server is refused.
    let direct = output(
        &env,
        &enqueue(
            &env,
            "t",
            json!({"op": "get", "url": format!("http://127.0.0.1:{}/calls", server.port)}),
        ),
    );
    assert!(
        direct["error"]
            .as_str()
            .unwrap_or_default()
            .contains("Denied"),
        "{direct}"
    );
    // The address rule still holds for the broker: a name (pinned to 127.0.0.2 by [host]
    // hosts) does not reach a private address no grant names.
    let named = output(
        &env,
        &enqueue(
            &env,
            "t",
            json!({"op": "call", "server": "named", "tool": "add", "args": {"a": 1, "b": 2}}),
        ),
    );
    assert!(
        named["error"]
            .as_str()
            .unwrap_or_default()
            .contains("not public"),
        "{named}"
    );

    // A journaled retry calls no tool twice.
    let mut retried = call(
        "send_email",
        json!({"to": "a@example.com", "subject": "hi"}),
    );
    retried["fail_first"] = json!(true);
    let id = enqueue(&env, "t", retried);
    let sent = output(&env, &id);
    assert_eq!(sent["text"], "sent to a@example.com", "{sent}");
    assert_eq!(
        env.show(&id)["attempt"],
        1,
        "the first attempt failed after the call"
    );
    assert_eq!(server.calls().await["send_email"], 1);
    let journal = env.ok(&["dispatch", "show", &id, "--journal"]);
    assert!(
        journal.contains("homing/mcp/records/send_email/") && journal.contains("(done)"),
        "{journal}"
    );

    // Approved from the CLI: the call runs once.
    let delete = |id: &str| call("delete_record", json!({"id": id}));
    let a = enqueue(&env, "t", delete("1"));
    let w = approval(&env, &a);
    assert_eq!(
        server.calls().await["delete_record"],
        0,
        "nothing runs before approval"
    );
    assert_eq!(w["metadata"]["tool"], "delete_record");
    env.ok(&[
        "waitpoint",
        "complete",
        w["id"].as_str().unwrap(),
        "--payload",
        r#"{"approved": true}"#,
    ]);
    assert_eq!(output(&env, &a)["text"], "deleted 1");
    assert_eq!(server.calls().await["delete_record"], 1);

    // Rejected: the person's reason reaches the guest; nothing runs.
    let r = enqueue(&env, "t", delete("2"));
    let w = approval(&env, &r);
    env.ok(&[
        "waitpoint",
        "complete",
        w["id"].as_str().unwrap(),
        "--payload",
        r#"{"approved": false, "reason": "not today"}"#,
    ]);
    let rejected = output(&env, &r);
    assert_eq!(rejected["outcome"], "rejected", "{rejected}");
    assert!(
        rejected["why"].as_str().unwrap().contains("not today"),
        "{rejected}"
    );

    // Timed out: nothing runs.
    let q = enqueue(
        &env,
        "t",
        json!({"op": "call", "server": "quick", "tool": "delete_record", "args": {"id": "3"}}),
    );
    let timed_out = output(&env, &q);
    assert_eq!(timed_out["outcome"], "rejected", "{timed_out}");
    assert!(
        timed_out["why"]
            .as_str()
            .unwrap()
            .contains("no one approved"),
        "{timed_out}"
    );
    assert_eq!(server.calls().await["delete_record"], 1);

    // Approved while the host is SIGKILLed: the next host runs the call, once.
    let k = enqueue(&env, "t", delete("4"));
    let w = approval(&env, &k);
    kill(&mut host);
    env.ok(&[
        "waitpoint",
        "complete",
        w["id"].as_str().unwrap(),
        "--payload",
        r#"{"approved": true}"#,
    ]);
    let mut host = spawn_host(&env, "host2.log");
    assert_eq!(output(&env, &k)["text"], "deleted 4");
    assert_eq!(server.calls().await["delete_record"], 2);

    // SIGKILLed while a non-idempotent call is in flight: the retry is told it is unknown.
    let s = enqueue(&env, "t", call("slow", json!({"ms": 4000})));
    wait_calls(&server, "slow", 1).await;
    kill(&mut host);
    let mut host = spawn_host(&env, "host3.log");
    let unknown = output(&env, &s);
    assert_eq!(unknown["outcome"], "unknown", "{unknown}");
    assert!(
        unknown["why"].as_str().unwrap().contains("not idempotent"),
        "{unknown}"
    );
    assert_eq!(
        server.calls().await["slow"],
        1,
        "the call was not sent again"
    );

    // The same, when the retry diverges from its journal before the call (a log read that
    // differs on every run): the intent is still found, the call is not sent again.
    let mut diverging = call("slow", json!({"ms": 4001}));
    diverging["diverge"] = json!(true);
    let s = enqueue(&env, "t", diverging);
    wait_calls(&server, "slow", 2).await;
    kill(&mut host);
    let mut host = spawn_host(&env, "host4.log");
    let unknown = output(&env, &s);
    assert_eq!(unknown["outcome"], "unknown", "{unknown}");
    assert_eq!(
        server.calls().await["slow"],
        2,
        "a diverged run did not send the call again"
    );

    // The digest to pin, as the CLI prints it; a changed definition changes it.
    let listed = |server_name: &str| -> Value {
        let out = homing(&env, &["plugin", "mcp-tools", "ops", server_name, "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let before = listed("pinned");
    assert_eq!(before["pinned"], false, "{before}");
    assert_eq!(before["tools"][0]["name"], "add", "{before}");
    let table = homing(&env, &["plugin", "mcp-tools", "ops", "records"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(
        table.contains("delete_record\tapproval") && table.contains("digest sha256:"),
        "{table}"
    );
    server.mutate().await;
    let after = listed("pinned");
    assert_ne!(before["digest"], after["digest"], "{after}");
    // Every call of this scenario carried the bearer: the server refused none.
    assert_eq!(server.calls().await["refused"], 0);

    kill(&mut host);
    // The bearer is in no log line, result, journal or waitpoint.
    let mut seen = String::new();
    for log in ["host.log", "host2.log", "host3.log", "host4.log"] {
        seen.push_str(&std::fs::read_to_string(env.path().join(log)).unwrap_or_default());
    }
    for d in env.list() {
        let id = d["id"].as_str().unwrap().to_owned();
        seen.push_str(&d.to_string());
        seen.push_str(&env.ok(&["dispatch", "show", &id, "--journal", "--json"]));
    }
    seen.push_str(&env.ok(&["waitpoint", "list", "--json"]));
    assert!(seen.contains("mcp-approval") && seen.contains("delete_record"));
    assert!(!seen.contains(TOKEN), "the bearer leaked");
}

#[tokio::test(flavor = "multi_thread")]
async fn brokered_mcp_calls_on_the_embedded_store() {
    scenario("").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn brokered_mcp_calls_on_nats() {
    let nats = NatsServer::start();
    scenario(&nats.store_section("mcpb")).await;
}

/// The Python and JavaScript SDKs' helpers, through the example agents' `mcp` tool: a call
/// answered, and one that waits for approval, suspends and runs once approved.
#[tokio::test(flavor = "multi_thread")]
async fn python_and_js_agents_call_mcp_tools_through_the_host() {
    let server = Server::start();
    let port = server.port;
    let mut text = format!(
        "[host]\nlease = \"10s\"\nsweep_interval = \"200ms\"\nshutdown_grace = \"5s\"\ncache_dir = {}\n",
        toml_path(&crate::common::shared_cache_dir())
    );
    for agent in ["python-agent", "js-agent"] {
        text.push_str(&format!(
            r#"
[plugins.{agent}]
path = {path}
memory = "128MiB"
timeout = "60s"
[plugins.{agent}.mcp.records]
url = "http://127.0.0.1:{port}/mcp"
auth = {{ bearer = {{ env = "MCP_TOKEN", secret = true }} }}
tools = ["add", "delete_record"]
"#,
            path = toml_path(&crate::common::polyglot_guest(agent)),
        ));
    }
    let env = Env::new(&text);
    let mut host = spawn_host(&env, "host.log");
    for (n, agent) in ["python-agent", "js-agent"].into_iter().enumerate() {
        let reply = |id: &str| {
            let d = env.wait_status(id, "acked", Duration::from_secs(60));
            d["result"]["output"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        let add = env.enqueue(agent, agent, r#"mcp records add {"a": 40, "b": 2}"#, &[]);
        assert_eq!(reply(&add), "mcp done: 42", "{agent}");
        let refused = env.enqueue(agent, agent, "mcp records send_email {}", &[]);
        assert!(reply(&refused).starts_with("mcp refused:"), "{agent}");
        let delete = env.enqueue(
            agent,
            agent,
            r#"mcp records delete_record {"id": "9"}"#,
            &[],
        );
        let w = approval(&env, &delete);
        env.ok(&[
            "waitpoint",
            "complete",
            w["id"].as_str().unwrap(),
            "--payload",
            r#"{"approved": true}"#,
        ]);
        assert_eq!(reply(&delete), "mcp done: deleted 9", "{agent}");
        assert_eq!(
            server.calls().await["delete_record"],
            n as u64 + 1,
            "{agent}"
        );
    }
    kill(&mut host);
}

#[test]
fn a_server_the_guest_can_reach_too_is_warned_of() {
    let text = config(1, "").replace(
        "[plugins.ops.retry]",
        "allowed_outbound_hosts = [\"http://127.0.0.1:1\"]\n[plugins.ops.retry]",
    );
    let env = Env::new(&text);
    let out = homing(&env, &["config", "check"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("[plugins.ops.mcp.records] url") && err.contains("around the broker"),
        "{err}"
    );
    let _: PathBuf = env.config();
}

/// The `assistant` example with `mcp_server` set: the model (the stand-in) is offered the MCP
/// server's tools as the host lists them, asks for `add`, and the assistant calls it through
/// the host (which holds the bearer); the model's answer quotes the server's result. The
/// server was called once; neither key is in the host's log.
#[test]
fn the_assistant_example_calls_a_tool_over_mcp() {
    const MODEL_KEY: &str = "stand-in-key-for-the-mcp-test-5be1";
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = Server::start();
    let model = crate::outbound_guests::StandIn::start(MODEL_KEY);
    let model_port = model
        .url
        .trim_start_matches("http://127.0.0.1:")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let env = Env::new(&format!(
        r#"
[host]
lease = "10s"
sweep_interval = "200ms"

[plugins.assistant]
path = {assistant}
timeout = "30s"
max_attempts = 1
journal = "run"
allowed_outbound_hosts = ["http://127.0.0.1:{model_port}"]

[plugins.assistant.variables]
base_url = "{base}"
model = "stand-in"
api_key = {{ env = "ASSISTANT_API_KEY", secret = true }}
mcp_server = "records"

[plugins.assistant.mcp.records]
url = "http://127.0.0.1:{port}/mcp"
auth = {{ bearer = {{ env = "MCP_TOKEN", secret = true }} }}
tools = ["add"]
"#,
        assistant = toml_path(&guest("assistant")),
        base = model.url,
        port = server.port,
    ));
    let id = env.enqueue("assistant", "t", "What is 40 + 2?", &[]);
    let log = crate::outbound_guests::run_until_idle_with(
        &env,
        &[("ASSISTANT_API_KEY", MODEL_KEY), ("MCP_TOKEN", TOKEN)],
    );
    let d = env.show(&id);
    assert_eq!(d["status"], "acked", "{d}\n{log}");
    assert_eq!(
        d["result"]["output"], "The stand-in model says: the tool answered 42.",
        "{d}"
    );
    assert_eq!(runtime.block_on(server.calls())["add"], 1);
    assert!(!log.contains(TOKEN) && !log.contains(MODEL_KEY));
}
