//! Versions and live reload end to end: a real `homing run` whose component file is replaced
//! while it serves.
//!
//! The two behaviours: the `waitpoint-probe` guest answers the payload `echo <text>` with
//! `<text>`, the `echo` example answers it with the whole payload. A third version with the
//! probe's behaviour is the probe's bytes with a custom section appended (another content hash).
//!
//! What is proven: under a steady load a swap loses nothing, runs every dispatch once, switches
//! behaviour at one point and records the version each claim ran; a broken component or one of
//! the wrong world leaves the old version serving and says why; a run in flight finishes on its
//! version, or past `drain_timeout` is stopped and rerun without an attempt; a waiting dispatch
//! resumes on the version it started on; a config edit raises the concurrency, adds a plugin
//! and removes one; SIGHUP and the API reload (and the API's refusals).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::api::{Api, OPERATOR, READER, TOKENS};
use crate::common::guest;
use crate::flow_control::now_ms;

fn config(port: u16, host: &str, plugins: &str) -> String {
    format!(
        r#"
[host]
lease = "5s"
sweep_interval = "200ms"
shutdown_grace = "2s"
{host}

[api]
listen = "127.0.0.1:{port}"
request_timeout = "30s"
max_wait = "30s"
{TOKENS}

{plugins}
"#
    )
}

const AGENT: &str = "[plugins.agent]\npath = \"agent.wasm\"\nconcurrency = 4\ntimeout = \"30s\"\n";

/// Replaces `to` with `from`'s bytes as a build tool does: written beside it, renamed over it.
fn replace(from: &Path, to: &Path) {
    let tmp = to.with_extension("wasm.partial");
    std::fs::copy(from, &tmp).unwrap();
    std::fs::rename(&tmp, to).unwrap();
}

/// `path`'s bytes with a custom section appended: the same behaviour, another version.
fn variant(path: &Path, out: &Path, tag: &str) {
    let mut bytes = std::fs::read(path).unwrap();
    let name = b"homing-test-variant";
    let mut section = vec![u8::try_from(name.len()).unwrap()];
    section.extend_from_slice(name);
    section.extend_from_slice(tag.as_bytes());
    bytes.push(0);
    // LEB128 of the section size (under 128 bytes here).
    assert!(section.len() < 128);
    bytes.push(u8::try_from(section.len()).unwrap());
    bytes.extend_from_slice(&section);
    std::fs::write(out, bytes).unwrap();
}

fn sha_short(path: &Path) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(std::fs::read(path).unwrap());
    digest
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()[..12]
        .to_owned()
}

async fn agents(api: &Api) -> Value {
    let (status, body) = api.get("/v1/agents").await;
    assert_eq!(status, 200, "{body}");
    body
}

fn agent<'a>(agents: &'a Value, name: &str) -> &'a Value {
    agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == name)
        .unwrap_or_else(|| panic!("no agent {name} in {agents}"))
}

/// Polls `/v1/agents` until `agent`'s version is `version`.
async fn wait_version(api: &Api, name: &str, version: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let all = agents(api).await;
        if agent(&all, name)["version"] == version {
            return all;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never reached version {version}: {all}\n{}",
            api.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `/v1/agents` until `agent` shows a reload error.
async fn wait_reload_error(api: &Api, name: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let all = agents(api).await;
        if let Some(e) = agent(&all, name)["reload_error"].as_str() {
            return e.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "{name} never showed a reload error: {all}\n{}",
            api.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn versions(d: &Value) -> Vec<String> {
    d["versions"]
        .as_array()
        .unwrap_or_else(|| panic!("no versions in {d}"))
        .iter()
        .map(|v| v["version"].as_str().unwrap().to_owned())
        .collect()
}

async fn start(host: &str, plugins: &str, component: &Path) -> Api {
    let (host, plugins) = (host.to_owned(), plugins.to_owned());
    let component = component.to_path_buf();
    Api::start_with(
        move |port| config(port, &host, &plugins),
        move |dir| {
            std::fs::copy(&component, dir.join("agent.wasm")).unwrap();
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_under_steady_load_runs_every_dispatch_once_and_switches_at_one_point() {
    let (old, new) = (guest("waitpoint_probe"), guest("echo"));
    let (old_v, new_v) = (sha_short(&old), sha_short(&new));
    let api = start("", AGENT, &old).await;
    assert_eq!(agent(&agents(&api).await, "agent")["version"], old_v);
    let file = api.env.path().join("agent.wasm");
    let total = 1_200;
    let mut ids = Vec::with_capacity(total);
    let mut swapped_at = None;
    for i in 0..total {
        ids.push(
            api.enqueue(json!({
                "agent": "agent",
                "thread": format!("t{}", i % 50),
                "payload": format!("echo n{i}"),
            }))
            .await,
        );
        if i == total / 3 {
            swapped_at = Some(now_ms());
            replace(&new, &file);
        }
    }
    let swapped_at = swapped_at.unwrap();
    wait_version(&api, "agent", &new_v).await;
    let mut old_starts = Vec::new();
    let mut new_starts = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let d = api.wait_terminal(id).await;
        assert_eq!(d["status"], "acked", "{d}");
        assert_eq!(d["attempts"], 0, "no attempt was counted: {d}");
        assert_eq!(d["claims"], 1, "claimed exactly once: {d}");
        let ran = versions(&d);
        assert_eq!(ran.len(), 1, "{d}");
        let started = d["started_at"].as_u64().unwrap();
        let output = d["result"]["output"].as_str().unwrap();
        if ran[0] == old_v {
            assert_eq!(output, format!("n{i}"), "the old version's behaviour: {d}");
            old_starts.push(started);
        } else {
            assert_eq!(ran[0], new_v, "{d}");
            assert_eq!(
                output,
                format!("echo n{i}"),
                "the new version's behaviour: {d}"
            );
            new_starts.push(started);
        }
    }
    assert!(!old_starts.is_empty() && !new_starts.is_empty());
    let first_new = *new_starts.iter().min().unwrap();
    let last_old = *old_starts.iter().max().unwrap();
    // One switch: no claim took the old version after the new one started serving, beyond the
    // claims already being taken when it was installed (a worker reads its terms per claim).
    let late_old = old_starts.iter().filter(|s| **s > first_new).count();
    assert!(
        late_old <= 4,
        "{late_old} claims ran the old version after the first claim of the new one \
         (last old at {last_old}, first new at {first_new})"
    );
    eprintln!(
        "swap: {} ms from the file replaced to the first claim on the new version; {} old, {} new",
        first_new.saturating_sub(swapped_at),
        old_starts.len(),
        new_starts.len()
    );
    let log = api.log();
    assert!(log.contains("plugin swapped to a new version"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_component_or_one_of_the_wrong_world_leaves_the_old_version_serving() {
    let old = guest("waitpoint_probe");
    let old_v = sha_short(&old);
    let api = start("", AGENT, &old).await;
    let file = api.env.path().join("agent.wasm");

    std::fs::write(
        api.env.path().join("broken.wasm"),
        b"\0asm this is not a component",
    )
    .unwrap();
    replace(&api.env.path().join("broken.wasm"), &file);
    let error = wait_reload_error(&api, "agent").await;
    assert!(
        error.contains("agent"),
        "the error names the plugin: {error}"
    );
    let all = agents(&api).await;
    assert_eq!(agent(&all, "agent")["version"], old_v, "{all}");
    let id = api
        .enqueue(json!({"agent": "agent", "thread": "t", "payload": "echo still"}))
        .await;
    let d = api.wait_terminal(&id).await;
    assert_eq!(
        d["result"]["output"], "still",
        "the old version serves: {d}"
    );
    assert_eq!(versions(&d), vec![old_v.clone()]);
    // `homing config check` says the same of the file.
    let check = api.env.homing(&["config", "check"]);
    assert!(
        !check.status.success(),
        "config check passed a broken component"
    );

    // A component of the other world: refused the same way, through the API this time.
    replace(&guest("wrong-world"), &file);
    let (status, reply) = api
        .post("/v1/agents/agent/reload", OPERATOR, json!({}))
        .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["swapped"], false, "{reply}");
    assert!(reply["error"].is_string(), "{reply}");
    assert_eq!(reply["version"], old_v, "{reply}");
    let id = api
        .enqueue(json!({"agent": "agent", "thread": "t", "payload": "echo again"}))
        .await;
    assert_eq!(api.wait_terminal(&id).await["result"]["output"], "again");
}

/// The flow tests' stand-in API, started and dropped off the test's runtime (it runs its own).
struct StandIn(Option<crate::common::Served>);

impl StandIn {
    fn start() -> StandIn {
        let (_, served) = std::thread::spawn(crate::flow_control::start_api)
            .join()
            .unwrap();
        StandIn(Some(served))
    }

    fn served(&self) -> &crate::common::Served {
        self.0.as_ref().unwrap()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        if let Some(served) = self.0.take() {
            std::thread::spawn(move || drop(served));
        }
    }
}

/// Starts a host whose `agent` runs the `http-probe` guest, allowed to call `served`.
async fn start_probe(host: &str, served: &crate::common::Served) -> Api {
    let plugins = format!(
        "{AGENT}allowed_outbound_hosts = [\"http://127.0.0.1:{}\"]\n",
        served.addr.port()
    );
    start(host, &plugins, &guest("http_probe")).await
}

/// Polls until `id` is claimed.
async fn wait_claimed(api: &Api, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, d) = api.get(&format!("/v1/dispatches/{id}")).await;
        if d["status"] == "claimed" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "never claimed: {d}\n{}",
            api.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_in_flight_when_its_version_is_replaced_finishes_on_it() {
    let stand_in = StandIn::start();
    let served = stand_in.served();
    let api = start_probe("", served).await;
    let old_v = sha_short(&guest("http_probe"));
    let id = api
        .enqueue(json!({"agent": "agent", "thread": "long", "payload": crate::flow_control::hold_payload(served, 1_500, "k")}))
        .await;
    wait_claimed(&api, &id).await;
    replace(&guest("echo"), &api.env.path().join("agent.wasm"));
    wait_version(&api, "agent", &sha_short(&guest("echo"))).await;
    let d = api.wait_terminal(&id).await;
    assert_eq!(d["status"], "acked", "{d}");
    assert_eq!(d["claims"], 1, "{d}");
    assert_eq!(versions(&d), vec![old_v]);
    let output: Value = serde_json::from_str(d["result"]["output"].as_str().unwrap()).unwrap();
    assert_eq!(
        output["status"], 200,
        "the probe's answer, not the echo's: {d}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_drain_timeout_a_run_on_a_replaced_version_is_stopped_and_rerun_without_an_attempt() {
    let stand_in = StandIn::start();
    let served = stand_in.served();
    let api = start_probe("drain_timeout = \"1s\"", served).await;
    let old_v = sha_short(&guest("http_probe"));
    // A request held 4 s: it outlives the drain timeout, is stopped, given back, and run again
    // on the version it started on (the host keeps it), where it completes.
    let id = api
        .enqueue(json!({"agent": "agent", "thread": "long", "max_attempts": 1, "payload": crate::flow_control::hold_payload(served, 4_000, "k")}))
        .await;
    wait_claimed(&api, &id).await;
    replace(&guest("echo"), &api.env.path().join("agent.wasm"));
    wait_version(&api, "agent", &sha_short(&guest("echo"))).await;
    let d = api.wait_terminal(&id).await;
    assert_eq!(d["status"], "acked", "{d}\n{}", api.log());
    assert_eq!(d["attempts"], 0, "the drain counted no attempt: {d}");
    assert_eq!(d["claims"], 2, "{d}");
    assert_eq!(
        versions(&d),
        vec![old_v.clone(), old_v.clone()],
        "both claims ran the version it started on: {d}"
    );
    let output: Value = serde_json::from_str(d["result"]["output"].as_str().unwrap()).unwrap();
    assert_eq!(output["status"], 200, "{d}");
    let log = api.log();
    assert!(log.contains("drain_timeout passed"), "{log}");
    assert!(log.contains("outcome=drained"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_dispatch_resumes_on_its_version_while_new_ones_take_the_newest() {
    let old = guest("waitpoint_probe");
    let dir = tempfile::tempdir().unwrap();
    let newer = dir.path().join("newer.wasm");
    variant(&old, &newer, "v2");
    let (old_v, new_v) = (sha_short(&old), sha_short(&newer));
    assert_ne!(old_v, new_v);
    let api = start("", AGENT, &old).await;
    let file = api.env.path().join("agent.wasm");
    let waiting = api
        .enqueue(json!({"agent": "agent", "thread": "w", "payload": "wait 60000"}))
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let waitpoint = loop {
        let (_, page) = api.get(&format!("/v1/waitpoints?dispatch={waiting}")).await;
        if let Some(w) = page["waitpoints"].as_array().and_then(|w| w.first()) {
            break w["id"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "no waitpoint: {page}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    replace(&newer, &file);
    wait_version(&api, "agent", &new_v).await;
    let fresh = api
        .enqueue(json!({"agent": "agent", "thread": "f", "payload": "echo fresh"}))
        .await;
    assert_eq!(
        versions(&api.wait_terminal(&fresh).await),
        vec![new_v.clone()]
    );
    let (status, reply) = api
        .post(
            &format!("/v1/waitpoints/{waitpoint}/complete"),
            OPERATOR,
            json!({"approved": true}),
        )
        .await;
    assert!(status < 300, "{reply}");
    let d = api.wait_terminal(&waiting).await;
    assert_eq!(d["status"], "acked", "{d}");
    assert_eq!(
        versions(&d),
        vec![old_v.clone(), old_v.clone()],
        "resumed on the version it started on: {d}"
    );
    let all = agents(&api).await;
    let kept: Vec<&str> = agent(&all, "agent")["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_str().unwrap())
        .collect();
    assert_eq!(kept, vec![new_v.as_str(), old_v.as_str()], "{all}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_edit_raises_concurrency_adds_a_plugin_and_removes_one() {
    let probe = guest("waitpoint_probe");
    let plugins = "[plugins.agent]\npath = \"agent.wasm\"\nconcurrency = 1\n\n\
                   [plugins.gone]\npath = \"agent.wasm\"\n";
    let api = start("", plugins, &probe).await;
    let edited = api.env.config();
    let text = std::fs::read_to_string(&edited).unwrap();
    let text = text
        .replace("concurrency = 1", "concurrency = 3")
        .replace("[plugins.gone]", "[plugins.added]");
    let tmp = edited.with_extension("toml.new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &edited).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let all = agents(&api).await;
        let names: Vec<&str> = all["agents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["removed"] != true && a["loaded"] == true)
            .map(|a| a["name"].as_str().unwrap())
            .collect();
        if names.contains(&"added") && !names.contains(&"gone") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the edit never applied: {all}\n{}",
            api.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Three hanging runs of `agent` at once: only possible with the raised concurrency.
    let mut hung = Vec::new();
    for i in 0..3 {
        hung.push(
            api.enqueue(json!({"agent": "agent", "thread": format!("h{i}"), "payload": "wait-then-hang 60000"}))
                .await,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut claimed = 0;
        for id in &hung {
            let (_, d) = api.get(&format!("/v1/dispatches/{id}")).await;
            claimed += usize::from(d["status"] == "claimed");
        }
        if claimed == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{claimed} of 3 ran at once\n{}",
            api.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let added = api
        .enqueue(json!({"agent": "added", "thread": "a", "payload": "echo newplugin"}))
        .await;
    assert_eq!(
        api.wait_terminal(&added).await["result"]["output"],
        "newplugin"
    );
    // The removed plugin is gone from the config the API enqueues by, and its slot says so.
    let (status, reply) = api
        .post(
            "/v1/dispatches",
            crate::api::PRODUCER,
            json!({"agent": "gone", "thread": "g", "payload": "echo nobody"}),
        )
        .await;
    assert_eq!(status, 404, "{reply}");
    assert_eq!(agent(&agents(&api).await, "gone")["removed"], true);
    assert!(api.log().contains("plugin removed"), "{}", api.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_and_the_api_reload_without_a_watch_and_the_api_refuses_what_it_must() {
    let old = guest("waitpoint_probe");
    let dir = tempfile::tempdir().unwrap();
    let (v2, v3) = (dir.path().join("v2.wasm"), dir.path().join("v3.wasm"));
    variant(&old, &v2, "v2");
    variant(&old, &v3, "v3");
    let api = start("watch = false", AGENT, &old).await;
    let file = api.env.path().join("agent.wasm");
    replace(&v2, &file);
    // No watch: nothing changes until asked.
    signal_pid(api.pid(), "HUP");
    wait_version(&api, "agent", &sha_short(&v2)).await;

    replace(&v3, &file);
    let (status, reply) = api.post("/v1/agents/agent/reload", READER, json!({})).await;
    assert_eq!(status, 403, "a reader may not reload: {reply}");
    let (status, reply) = api
        .post("/v1/agents/nobody/reload", OPERATOR, json!({}))
        .await;
    assert_eq!(status, 404, "{reply}");
    let (status, reply) = api
        .post("/v1/agents/agent/reload", OPERATOR, json!({"surprise": 1}))
        .await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(
        agent(&agents(&api).await, "agent")["version"],
        sha_short(&v2),
        "refused reloads changed nothing"
    );
    let (status, reply) = api
        .post("/v1/agents/agent/reload", OPERATOR, json!({}))
        .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["swapped"], true, "{reply}");
    assert_eq!(reply["version"], sha_short(&v3), "{reply}");

    // A config that no longer parses changes nothing and says why.
    let config = api.env.config();
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}\n[plugins.agent\n")).unwrap();
    let (status, reply) = api
        .post("/v1/agents/agent/reload", OPERATOR, json!({}))
        .await;
    assert_eq!(status, 422, "{reply}");
    let all = agents(&api).await;
    assert!(all["config_error"].is_string(), "{all}");
    assert_eq!(agent(&all, "agent")["version"], sha_short(&v3), "{all}");
}

fn signal_pid(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// A host config on the NATS server `url` with `agent` on `agent.wasm` and `host` keys.
fn nats_host(url: &str, host: &str) -> String {
    format!(
        "[host]\nlease = \"5s\"\nsweep_interval = \"200ms\"\nshutdown_grace = \"2s\"\n{host}\n\n\
         [store]\nbackend = \"nats\"\nurl = \"{url}\"\nprefix = \"versions\"\n\
         request_timeout = \"2s\"\nconnect_timeout = \"60s\"\n\n{AGENT}"
    )
}

/// Polls the store until dispatch `id` is in `status`.
async fn store_wait(
    store: &homing::store::Store,
    id: &str,
    status: &str,
) -> homing::store::Dispatch {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(d) = store.mailbox.load(id).await.unwrap()
            && d.status.as_str() == status
        {
            return d;
        }
        assert!(Instant::now() < deadline, "{id} never reached {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Completes the one waitpoint of dispatch `id`.
async fn complete(store: &homing::store::Store, id: &str) -> u64 {
    let w = store.waitpoints.waitpoints_of(id).await.unwrap();
    let w = w.first().expect("a waitpoint");
    store
        .waitpoints
        .complete_waitpoint(&w.id, b"yes".to_vec(), "operator:test")
        .await
        .unwrap();
    now_ms()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_two_nats_hosts_a_pinned_dispatch_waits_for_the_host_that_runs_its_version() {
    use crate::common::{Env, wait_exit};
    use crate::hosts::{host_log, open_nats, spawn_run};
    let server = crate::natsd::NatsServer::start();
    let old = guest("waitpoint_probe");
    let dir = tempfile::tempdir().unwrap();
    let newer = dir.path().join("newer.wasm");
    variant(&old, &newer, "v2");
    let (old_v, new_v) = (sha_short(&old), sha_short(&newer));
    // Host a keeps only its newest version and leaves a dispatch pinned elsewhere for 3 s;
    // host b keeps three.
    let env_a = Env::new(&nats_host(
        &server.url(),
        "keep_versions = 1\ndrain_timeout = \"3s\"",
    ));
    let env_b = Env::new(&nats_host(&server.url(), ""));
    for env in [&env_a, &env_b] {
        std::fs::copy(&old, env.path().join("agent.wasm")).unwrap();
    }
    let store = open_nats(&[server.url()], "versions", 1).await;
    let a = spawn_run(&env_a, "host-a");
    let mut b = spawn_run(&env_b, "host-b");
    let mut waiting = Vec::new();
    for thread in ["w1", "w2"] {
        let new = homing::store::NewDispatch::new("agent", thread, b"wait 60000".to_vec());
        waiting.push(store.mailbox.enqueue(new).await.unwrap().id);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(host_log(&env_a, "host-a").contains("homing host running")
        && host_log(&env_b, "host-b").contains("homing host running"))
    {
        assert!(Instant::now() < deadline, "{}", host_log(&env_a, "host-a"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for id in &waiting {
        let d = store_wait(&store, id, "waiting").await;
        assert_eq!(
            d.versions.last().map(|v| v.version.clone()),
            Some(old_v.clone())
        );
    }
    // Host a moves to the new version and drops the old one; host b still runs it.
    replace(&newer, &env_a.path().join("agent.wasm"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !host_log(&env_a, "host-a").contains("plugin swapped") {
        assert!(Instant::now() < deadline, "{}", host_log(&env_a, "host-a"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The first resumes on host b, the one host that runs its version.
    complete(&store, &waiting[0]).await;
    let d = store_wait(&store, &waiting[0], "acked").await;
    let ran: Vec<&str> = d.versions.iter().map(|v| v.version.as_str()).collect();
    assert_eq!(ran, vec![old_v.as_str(), old_v.as_str()], "{d:?}");
    // Either host may have run the first claim (it suspended); the resumed one ran on b.
    let completed_on = |log: &str| {
        crate::hosts::finished(log)
            .iter()
            .any(|(id, outcome)| id == &waiting[0] && outcome == "completed")
    };
    assert!(
        completed_on(&host_log(&env_b, "host-b")),
        "host b ran the resumed claim:\n{}",
        host_log(&env_b, "host-b")
    );
    assert!(
        !completed_on(&host_log(&env_a, "host-a")),
        "host a does not run the old version"
    );
    // With host b gone, the second is left for its version until drain_timeout has passed since
    // it became available; then host a takes it on its newest, and the pin moves.
    signal(&b, "TERM");
    wait_exit(&mut b.0, Duration::from_secs(30));
    let completed = complete(&store, &waiting[1]).await;
    let d = store_wait(&store, &waiting[1], "acked").await;
    let ran: Vec<&str> = d.versions.iter().map(|v| v.version.as_str()).collect();
    assert_eq!(ran, vec![old_v.as_str(), new_v.as_str()], "{d:?}");
    let second = d.started_at.unwrap_or_default();
    assert!(
        second >= completed + 2_500,
        "taken {} ms after it became available, before drain_timeout",
        second.saturating_sub(completed)
    );
    assert_eq!(d.attempt, 0);
    drop(a);
    store.close().await;
}

fn signal(host: &crate::hosts::Host, name: &str) {
    crate::common::signal(&host.0, name);
}
