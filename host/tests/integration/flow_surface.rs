//! Flow control as an operator and a producer meet it, against a real `homing run` on the
//! embedded store: pausing and resuming an agent through the API (and its refusals: no token,
//! a reader's, an unknown agent, bad JSON, a reason over 1 KiB), `GET /v1/agents` showing the
//! pause, its reason and each limit's use, `homing agent pause|resume|status`, concurrency keys
//! given at enqueue (the CLI's `--concurrency-key`, the API's `concurrency_key`) or taken from
//! the metadata a plugin's `concurrency_key = "meta:customer"` names, shown by `dispatch show`
//! and the API, a key over 128 bytes refused naming it, and the dashboard's agents page
//! showing a pause's reason escaped, with its Pause and Resume buttons for an operator only.

use std::time::{Duration, Instant};

use reqwest::header;
use serde_json::{Value, json};

use crate::api::{Api, OPERATOR, PRODUCER, READER, TOKENS};
use crate::common::{guest, toml_path};
use crate::dashboard::{raw_client, session};

fn config(port: u16) -> String {
    format!(
        r#"
[host]
lease = "5s"
sweep_interval = "200ms"
shutdown_grace = "2s"

[api]
listen = "127.0.0.1:{port}"
request_timeout = "10s"
max_body = "64KiB"
{TOKENS}

[limits.gpu]
concurrency = 2

[plugins.echo]
path = {echo}
rate = "60/min"
limits = ["gpu"]
concurrency_key = "meta:customer"
key_concurrency = 1
"#,
        echo = toml_path(&guest("echo")),
    )
}

async fn start() -> Api {
    Api::start_with(config, |_| {}).await
}

/// A POST of `body` (raw bytes) with `token`: the status and the JSON answer.
async fn post_raw(api: &Api, path: &str, token: Option<&str>, body: Vec<u8>) -> (u16, Value) {
    let mut request = raw_client()
        .post(api.url(path))
        .header(header::CONTENT_TYPE, "application/json")
        .body(body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value)
}

fn agent<'a>(agents: &'a Value, name: &str) -> &'a Value {
    agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == name)
        .unwrap_or_else(|| panic!("no agent {name} in {agents}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_resume_through_the_api_and_their_refusals() {
    let api = start().await;

    // The limits of the agent, with their use, before anything is paused.
    let (status, agents) = api.get("/v1/agents").await;
    assert_eq!(status, 200, "{agents}");
    let echo = agent(&agents, "echo");
    assert_eq!(echo["paused"], false, "{echo}");
    assert_eq!(echo["pause_reason"], Value::Null);
    assert_eq!(echo["paused_keys"], json!([]));
    let scopes = echo["limits"]["scopes"].as_array().unwrap();
    let own = scopes.iter().find(|s| s["name"] == "agent:echo").unwrap();
    assert_eq!(own["rate"], "60/min", "{own}");
    assert_eq!(own["applies_to"], "claims");
    assert!(own["tokens"].as_f64().is_some(), "{own}");
    let gpu = scopes.iter().find(|s| s["name"] == "limit:gpu").unwrap();
    assert_eq!(gpu["concurrency"], 2, "{gpu}");
    assert_eq!(gpu["running"], 0, "{gpu}");
    assert_eq!(echo["limits"]["concurrency_key"], "meta:customer");
    assert_eq!(echo["limits"]["key_concurrency"], 1);

    // Refusals first: none of them pauses anything.
    let reason = json!({ "reason": "provider outage" });
    let body = serde_json::to_vec(&reason).unwrap();
    let (status, reply) = post_raw(&api, "/v1/agents/echo/pause", None, body.clone()).await;
    assert_eq!(status, 401, "{reply}");
    let (status, reply) = post_raw(&api, "/v1/agents/echo/pause", Some(READER), body.clone()).await;
    assert_eq!(status, 403, "{reply}");
    let (status, reply) =
        post_raw(&api, "/v1/agents/echo/pause", Some(PRODUCER), body.clone()).await;
    assert_eq!(status, 403, "{reply}");
    let (status, reply) = api
        .post("/v1/agents/nope/pause", OPERATOR, reason.clone())
        .await;
    assert_eq!(status, 404, "{reply}");
    assert!(reply["error"].as_str().unwrap().contains("nope"), "{reply}");
    let (status, reply) = post_raw(
        &api,
        "/v1/agents/echo/pause",
        Some(OPERATOR),
        b"{\"reason\": ".to_vec(),
    )
    .await;
    assert_eq!(status, 400, "{reply}");
    let (status, reply) = api
        .post(
            "/v1/agents/echo/pause",
            OPERATOR,
            json!({ "reason": "x".repeat(1025) }),
        )
        .await;
    assert_eq!(status, 413, "{reply}");
    assert_eq!(reply["field"], "reason", "{reply}");
    let (status, reply) = api
        .post(
            "/v1/agents/echo/pause",
            OPERATOR,
            json!({ "reason": "line\nforged" }),
        )
        .await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["field"], "reason", "{reply}");
    let (status, reply) = api
        .post("/v1/agents/echo/pause", OPERATOR, json!({ "why": "typo" }))
        .await;
    assert_eq!(status, 400, "{reply}");
    let (status, reply) = api
        .post(
            "/v1/agents/echo/pause",
            OPERATOR,
            json!({ "key": "k".repeat(129) }),
        )
        .await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["field"], "key", "{reply}");
    // A body over [api] max_body is refused before it is read.
    let (status, _) = post_raw(
        &api,
        "/v1/agents/echo/pause",
        Some(OPERATOR),
        vec![b' '; 128 << 10],
    )
    .await;
    assert_eq!(status, 413);
    let (_, agents) = api.get("/v1/agents").await;
    assert_eq!(agent(&agents, "echo")["paused"], false, "{agents}");

    // The pause, shown with its reason; a key's pause beside it.
    let (status, reply) = api
        .post("/v1/agents/echo/pause", OPERATOR, reason.clone())
        .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["reason"], "provider outage");
    let (status, reply) = api
        .post(
            "/v1/agents/echo/pause",
            OPERATOR,
            json!({ "key": "c1", "reason": "noisy" }),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let (_, agents) = api.get("/v1/agents").await;
    let echo = agent(&agents, "echo");
    assert_eq!(echo["paused"], true, "{echo}");
    assert_eq!(echo["pause_reason"], "provider outage");
    assert_eq!(echo["paused_keys"][0]["key"], "c1", "{echo}");
    assert_eq!(echo["paused_keys"][0]["reason"], "noisy");

    // The gauge follows, read by the sweeper.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let metrics = api.metrics().await;
        if crate::api::sample(&metrics, "homing_agent_paused", &[("agent", "echo")]) == 1.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the gauge never showed the pause"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Resume: the reader may not; the operator may, and a second resume lifts nothing.
    let (status, _) = post_raw(&api, "/v1/agents/echo/resume", Some(READER), b"{}".to_vec()).await;
    assert_eq!(status, 403);
    let (status, reply) = api
        .post("/v1/agents/nope/resume", OPERATOR, json!({}))
        .await;
    assert_eq!(status, 404, "{reply}");
    let (status, reply) = api
        .post("/v1/agents/echo/resume", OPERATOR, json!({}))
        .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["resumed"], true);
    let (status, reply) = api
        .post("/v1/agents/echo/resume", OPERATOR, json!({}))
        .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["resumed"], false);
    let (status, reply) = api
        .post("/v1/agents/echo/resume", OPERATOR, json!({ "key": "c1" }))
        .await;
    assert_eq!((status, &reply["resumed"]), (200, &json!(true)), "{reply}");
    let (_, agents) = api.get("/v1/agents").await;
    let echo = agent(&agents, "echo");
    assert_eq!(echo["paused"], false, "{echo}");
    assert_eq!(echo["paused_keys"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_keys_at_enqueue_and_the_cli_agent_commands() {
    let api = start().await;
    let env = &api.env;

    // The CLI's flag, shown by `dispatch show` (text and JSON) and the API.
    let id = env.enqueue(
        "echo",
        "t-cli",
        "x",
        &["--delay", "1h", "--concurrency-key", "acme"],
    );
    assert_eq!(env.show(&id)["concurrency_key"], "acme");
    let shown = env.ok(&["dispatch", "show", &id]);
    assert!(shown.contains("concurrency key: acme"), "{shown}");
    let (_, d) = api.get(&format!("/v1/dispatches/{id}")).await;
    assert_eq!(d["concurrency_key"], "acme", "{d}");
    // From the metadata the plugin names, when none is given.
    let id = env.enqueue(
        "echo",
        "t-meta",
        "x",
        &["--delay", "1h", "--meta", "customer=c9"],
    );
    assert_eq!(env.show(&id)["concurrency_key"], "c9");
    // Over 128 bytes: refused naming the flag, exit 2.
    let long = "k".repeat(129);
    let out = env.homing(&[
        "enqueue",
        "--agent",
        "echo",
        "--thread",
        "t",
        "--payload",
        "x",
        "--concurrency-key",
        &long,
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--concurrency-key"), "{stderr}");

    // The API's field, and from metadata; the list shows the key too.
    let id = api
        .enqueue(json!({ "agent": "echo", "thread": "t-api", "payload": "x", "delay": "1h", "concurrency_key": "globex" }))
        .await;
    let (_, d) = api.get(&format!("/v1/dispatches/{id}")).await;
    assert_eq!(d["concurrency_key"], "globex", "{d}");
    let id = api
        .enqueue(json!({ "agent": "echo", "thread": "t-api-meta", "payload": "x", "delay": "1h", "metadata": { "customer": "initech" } }))
        .await;
    let (_, d) = api.get(&format!("/v1/dispatches/{id}")).await;
    assert_eq!(d["concurrency_key"], "initech", "{d}");
    let (_, list) = api.get("/v1/dispatches?agent=echo").await;
    let row = list["dispatches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == id.as_str())
        .unwrap();
    assert_eq!(row["concurrency_key"], "initech", "{row}");
    let (status, reply) = api
        .post(
            "/v1/dispatches",
            PRODUCER,
            json!({ "agent": "echo", "thread": "t", "payload": "x", "concurrency_key": long }),
        )
        .await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["field"], "concurrency_key", "{reply}");

    // `homing agent ...` against the same store.
    let status = env.ok(&["agent", "status", "echo"]);
    assert!(status.contains("paused:       no"), "{status}");
    assert!(status.contains("limit:gpu"), "{status}");
    assert!(status.contains("parked:       0"), "{status}");
    let paused = env.ok(&["agent", "pause", "echo", "--reason", "maintenance"]);
    assert!(paused.contains("paused agent echo"), "{paused}");
    let status = env.ok(&["agent", "status", "echo"]);
    assert!(
        status.contains("paused:       yes: maintenance"),
        "{status}"
    );
    let json: Value =
        serde_json::from_str(&env.ok(&["agent", "status", "echo", "--json"])).unwrap();
    assert_eq!(json["paused"], true, "{json}");
    assert_eq!(json["pause_reason"], "maintenance");
    assert_eq!(json["parked"], 0);
    // The API sees what the CLI did.
    let (_, agents) = api.get("/v1/agents").await;
    assert_eq!(agent(&agents, "echo")["pause_reason"], "maintenance");
    env.ok(&["agent", "pause", "echo", "--key", "c9"]);
    let status = env.ok(&["agent", "status", "echo"]);
    assert!(status.contains("paused key:   c9"), "{status}");
    assert!(
        env.ok(&["agent", "resume", "echo"])
            .contains("resumed agent echo")
    );
    assert!(
        env.ok(&["agent", "resume", "echo"])
            .contains("was not paused")
    );
    env.ok(&["agent", "resume", "echo", "--key", "c9"]);
    let status = env.ok(&["agent", "status", "echo"]);
    assert!(status.contains("paused:       no"), "{status}");

    // Refusals: an unknown agent (exit 3, named), a bad reason (exit 2).
    let out = env.homing(&["agent", "pause", "nope"]);
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no agent `nope`") && stderr.contains("echo"),
        "{stderr}"
    );
    let out = env.homing(&["agent", "status", "nope"]);
    assert_eq!(out.status.code(), Some(3));
    let out = env.homing(&["agent", "resume", "nope"]);
    assert_eq!(out.status.code(), Some(3));
    let out = env.homing(&["agent", "pause", "echo", "--reason", &"r".repeat(1025)]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--reason"), "{stderr}");
    let out = env.homing(&["agent", "pause", "echo", "--reason", "a\u{1b}[2Jb"]);
    assert_eq!(out.status.code(), Some(2));
    let status = env.ok(&["agent", "status", "echo"]);
    assert!(status.contains("paused:       no"), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_a_pause_escaped_and_pauses_for_operators_only() {
    let api = start().await;
    let client = raw_client();
    let (status, reply) = api
        .post(
            "/v1/agents/echo/pause",
            OPERATOR,
            json!({ "reason": "<b>bold</b> & <script>alert(1)</script>" }),
        )
        .await;
    assert_eq!(status, 200, "{reply}");

    let (reader, reader_csrf) = session(&api, &client, READER).await;
    let page = client
        .get(api.url("/agents"))
        .header(header::COOKIE, &reader)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let body = page.text().await.unwrap();
    assert!(
        body.contains("&lt;b&gt;bold&lt;/b&gt; &amp; &lt;script&gt;alert(1)&lt;/script&gt;"),
        "{body}"
    );
    assert!(!body.contains("<b>bold</b>") && !body.contains("<script>alert"));
    assert!(body.contains("data-paused=\"true\""), "{body}");
    // A reader sees no buttons, and a reader's post is refused.
    assert!(!body.contains("/agents/echo/resume"), "{body}");
    let r = client
        .post(api.url("/agents/echo/resume"))
        .header(header::COOKIE, &reader)
        .form(&[("csrf", reader_csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);

    let (operator, csrf) = session(&api, &client, OPERATOR).await;
    let page = client
        .get(api.url("/agents"))
        .header(header::COOKIE, &operator)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("action=\"/agents/echo/resume\""), "{page}");
    // Without the CSRF token, or without a session: refused, still paused.
    let r = client
        .post(api.url("/agents/echo/resume"))
        .header(header::COOKIE, &operator)
        .form(&[("csrf", "0".repeat(64))])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = client
        .post(api.url("/agents/echo/resume"))
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let (_, agents) = api.get("/v1/agents").await;
    assert_eq!(agent(&agents, "echo")["paused"], true);

    // Resume, then pause again with a reason, from the page's forms.
    let r = client
        .post(api.url("/agents/echo/resume"))
        .header(header::COOKIE, &operator)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let (_, agents) = api.get("/v1/agents").await;
    assert_eq!(agent(&agents, "echo")["paused"], false);
    let r = client
        .post(api.url("/agents/echo/pause"))
        .header(header::COOKIE, &operator)
        .form(&[("csrf", csrf.as_str()), ("reason", "from the page")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let location = r.headers()[header::LOCATION].to_str().unwrap().to_owned();
    assert!(location.starts_with("/agents?notice=paused"), "{location}");
    let (_, agents) = api.get("/v1/agents").await;
    assert_eq!(agent(&agents, "echo")["pause_reason"], "from the page");
    // A reason over 1 KiB goes back with a notice and pauses nothing new.
    let long = "r".repeat(1025);
    let r = client
        .post(api.url("/agents/echo/pause"))
        .header(header::COOKIE, &operator)
        .form(&[("csrf", csrf.as_str()), ("reason", long.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let location = r.headers()[header::LOCATION].to_str().unwrap().to_owned();
    assert!(location.contains("pause-refused"), "{location}");
    let (_, agents) = api.get("/v1/agents").await;
    assert_eq!(agent(&agents, "echo")["pause_reason"], "from the page");
    // An unknown agent: 404.
    let r = client
        .post(api.url("/agents/nope/pause"))
        .header(header::COOKIE, &operator)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}
