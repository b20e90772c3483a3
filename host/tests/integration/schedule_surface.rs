//! Schedules as a user meets them, against a real `homing run` on each backend: a schedule of
//! the TOML firing and shown by the API, the CLI and the metrics; one created, triggered,
//! paused, shown and deleted through the API, with the refusals (no token, a reader, unknown
//! fields, a file payload, a bad zone or cron, an unknown agent, a bad name, a name taken);
//! `homing config check` and `homing run` refusing a bad `[schedules]` table with its line and
//! key; the dashboard's page (a reason escaped, buttons for operators only, a CSRF token
//! required); and a reload that no longer declares a schedule deleting it while its
//! dispatches stay.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use reqwest::header;

use crate::api::{Api, OPERATOR, READER, TOKENS};
use crate::common::{Env, guest, signal, toml_path};
use crate::dashboard::{raw_client, session};
use crate::natsd::NatsServer;

fn config(port: u16, store: &str, schedules: &str) -> String {
    format!(
        r#"
[host]
lease = "5s"
sweep_interval = "200ms"
shutdown_grace = "2s"

{store}

[api]
listen = "127.0.0.1:{port}"
request_timeout = "10s"
max_body = "64KiB"
{TOKENS}

[plugins.echo]
path = {echo}

{schedules}
"#,
        echo = toml_path(&guest("echo")),
    )
}

const BEAT: &str = r#"
[schedules.beat]
agent = "echo"
every = "1s"
payload = "beat"
"#;

/// Polls `GET path` until `ok` holds of its answer, for at most 60 s.
async fn until(api: &Api, path: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, v) = api.get(path).await;
        if status == 200 && ok(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: {v}\n{}", api.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn fired(v: &Value) -> usize {
    v["outcomes"].as_array().map_or(0, |o| {
        o.iter().filter(|o| o["dispatch"].is_string()).count()
    })
}

async fn surface(store: &str) {
    let api = Api::start_with(|port| config(port, store, BEAT), |_| {}).await;

    // The TOML's schedule fires every second; its dispatches run.
    let beat = until(&api, "/v1/schedules/beat", "two fires", |v| fired(v) >= 2).await;
    assert_eq!(beat["source"], "config", "{beat}");
    assert_eq!(beat["next"].as_array().map(Vec::len), Some(5), "{beat}");
    let first = beat["outcomes"]
        .as_array()
        .and_then(|o| o.iter().find_map(|o| o["dispatch"].as_str()))
        .unwrap()
        .to_owned();
    assert!(first.starts_with("sched:beat:"), "{first}");
    let d = api.wait_terminal(&first).await;
    assert_eq!(d["status"], "acked", "{d}");
    assert_eq!(d["metadata"]["schedule"], "beat", "{d}");
    assert_eq!(d["thread"], "beat", "{d}");
    let metrics = api.metrics().await;
    assert!(
        metrics
            .iter()
            .any(|(k, v)| k.starts_with("homing_schedule_fires_total{")
                && k.contains("beat")
                && *v >= 1.0),
        "{metrics:?}"
    );
    let (status, list) = api.get("/v1/schedules").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["schedules"][0]["def"]["name"], "beat", "{list}");

    // The CLI sees the same.
    let shown: Value =
        serde_json::from_str(&api.env.ok(&["schedule", "show", "beat", "--json"])).unwrap();
    assert_eq!(shown["def"]["agent"], "echo");
    assert!(api.env.ok(&["schedule", "list"]).contains("beat"));

    // Refusals: nothing is created by any of them.
    let good = json!({ "name": "hourly", "agent": "echo", "cron": "0 * * * *", "timezone": "Europe/Paris", "payload": "p" });
    let (status, reply) = api
        .call_as(
            reqwest::Method::POST,
            "/v1/schedules",
            None,
            Some(good.clone()),
        )
        .await;
    assert_eq!(status, 401, "{reply}");
    let (status, reply) = api.post("/v1/schedules", READER, good.clone()).await;
    assert_eq!(status, 403, "{reply}");
    for (body, field) in [
        (
            json!({ "name": "x", "agent": "echo", "cronn": "0 * * * *" }),
            "cronn",
        ),
        (
            json!({ "name": "x", "agent": "echo", "cron": "0 * * * *", "payload_file": "/etc/passwd" }),
            "payload_file",
        ),
        (
            json!({ "name": "x", "agent": "echo", "cron": "0 * * * *", "timezone": "Mars/Base" }),
            "timezone",
        ),
        (
            json!({ "name": "x", "agent": "echo", "cron": "61 * * * *" }),
            "cron",
        ),
        (
            json!({ "name": "x", "agent": "nope", "cron": "0 * * * *" }),
            "agent",
        ),
        (
            json!({ "name": "a/b", "agent": "echo", "cron": "0 * * * *" }),
            "name",
        ),
        (
            json!({ "name": "x", "agent": "echo", "every": "1h", "jitter": "2h" }),
            "jitter",
        ),
    ] {
        let (status, reply) = api.post("/v1/schedules", OPERATOR, body.clone()).await;
        assert_eq!(status, 400, "{body} -> {reply}");
        assert_eq!(reply["field"], field, "{body} -> {reply}");
    }
    let (status, reply) = api.get("/v1/schedules/x").await;
    assert_eq!(status, 404, "{reply}");

    // Created, triggered, paused, shown, deleted.
    let (status, created) = api.post("/v1/schedules", OPERATOR, good.clone()).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["source"], "api");
    assert!(
        created["next"][0]["local"].as_str().unwrap().contains("CE"),
        "{created}"
    );
    let (status, reply) = api.post("/v1/schedules", OPERATOR, good.clone()).await;
    assert_eq!(status, 409, "{reply}");
    let (status, trig) = api
        .post("/v1/schedules/hourly/trigger", OPERATOR, json!({}))
        .await;
    assert_eq!(status, 200, "{trig}");
    let id = trig["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("sched:hourly:"), "{trig}");
    let d = api.wait_terminal(&id).await;
    assert_eq!(d["metadata"]["fire"], "manual", "{d}");
    assert_eq!(trig["outcome"], "fired", "{trig}");
    let (status, reply) = api
        .post(
            "/v1/schedules/hourly/trigger",
            OPERATOR,
            json!({ "overlap": "sometimes" }),
        )
        .await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["field"], "overlap", "{reply}");
    // A backfill under `allow` fires every slot of the span and says so slot by slot.
    let (status, filled) = api
        .post(
            "/v1/schedules/hourly/backfill",
            OPERATOR,
            json!({ "from": "2026-01-01T00:00:00Z", "to": "2026-01-01T02:00:00Z", "overlap": "allow" }),
        )
        .await;
    assert_eq!(status, 200, "{filled}");
    assert_eq!(
        filled["slots"].as_array().map(Vec::len),
        Some(3),
        "{filled}"
    );
    assert!(
        filled["slots"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["outcome"] == "fired" && m["id"].is_string()),
        "{filled}"
    );
    // The tick agent is no agent a caller can enqueue to.
    let (status, reply) = api
        .post(
            "/v1/dispatches",
            OPERATOR,
            json!({ "agent": "homing.schedule", "thread": "t", "payload": "p" }),
        )
        .await;
    assert!(matches!(status, 400 | 404), "{status} {reply}");
    assert_eq!(reply["field"], "agent", "{reply}");
    let err = api.env.fails(&[
        "enqueue",
        "--agent",
        "homing.schedule",
        "--thread",
        "t",
        "--payload",
        "p",
    ]);
    assert!(err.contains("homing.schedule"), "{err}");
    let (status, paused) = api
        .post(
            "/v1/schedules/hourly/pause",
            OPERATOR,
            json!({ "reason": "quiet <b>hours</b>" }),
        )
        .await;
    assert_eq!(status, 200, "{paused}");
    let (_, shown) = api.get("/v1/schedules/hourly").await;
    assert_eq!(shown["paused"]["reason"], "quiet <b>hours</b>", "{shown}");
    assert_eq!(shown["next"], json!([]), "{shown}");
    dashboard(&api).await;
    let (status, reply) = api
        .post(
            "/v1/schedules/hourly/resume",
            OPERATOR,
            json!({ "catch_up": "yes" }),
        )
        .await;
    assert_eq!(status, 400, "{reply}");
    let (status, reply) = api
        .post("/v1/schedules/hourly/resume", OPERATOR, json!({}))
        .await;
    assert_eq!(status, 200, "{reply}");
    let (status, reply) = api
        .post(
            "/v1/schedules/hourly/backfill",
            OPERATOR,
            json!({ "from": "2026-01-01T00:00:00Z", "to": "not a time" }),
        )
        .await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["field"], "to", "{reply}");
    let (status, reply) = api
        .call_as(
            reqwest::Method::DELETE,
            "/v1/schedules/hourly",
            Some(READER),
            None,
        )
        .await;
    assert_eq!(status, 403, "{reply}");
    let (status, reply) = api
        .call_as(
            reqwest::Method::DELETE,
            "/v1/schedules/hourly",
            Some(OPERATOR),
            None,
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let (status, _) = api.get("/v1/schedules/hourly").await;
    assert_eq!(status, 404);
    // The triggered dispatch stays.
    let (status, _) = api.get(&format!("/v1/dispatches/{id}")).await;
    assert_eq!(status, 200);

    // A reload that no longer declares `beat` deletes it; its dispatches stay.
    std::fs::write(
        api.env.config(),
        config(
            api.base
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap(),
            store,
            "",
        ),
    )
    .unwrap();
    signal(api.host(), "HUP");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, _) = api.get("/v1/schedules/beat").await;
        if status == 404 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "beat was not deleted\n{}",
            api.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, d) = api.get(&format!("/v1/dispatches/{first}")).await;
    assert_eq!(status, 200, "{d}");
}

/// The dashboard's schedules page: the pause's reason escaped, the next fires of `beat`; a
/// reader sees no button and is refused a post; an operator resumes `hourly` with its CSRF
/// token (and is refused without it).
async fn dashboard(api: &Api) {
    let client = raw_client();
    let (reader, reader_csrf) = session(api, &client, READER).await;
    let body = client
        .get(api.url("/schedules"))
        .header(header::COOKIE, &reader)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(body.contains("quiet &lt;b&gt;hours&lt;/b&gt;"), "{body}");
    assert!(!body.contains("quiet <b>hours</b>"), "{body}");
    assert!(body.contains("data-schedule=\"beat\""), "{body}");
    assert!(body.contains("sched:beat:"), "{body}");
    assert!(!body.contains("/schedules/hourly/resume"), "{body}");
    let r = client
        .post(api.url("/schedules/hourly/resume"))
        .header(header::COOKIE, &reader)
        .form(&[("csrf", reader_csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let (operator, csrf) = session(api, &client, OPERATOR).await;
    let body = client
        .get(api.url("/schedules"))
        .header(header::COOKIE, &operator)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        body.contains("action=\"/schedules/hourly/resume\""),
        "{body}"
    );
    assert!(
        body.contains("action=\"/schedules/beat/trigger\""),
        "{body}"
    );
    let r = client
        .post(api.url("/schedules/hourly/resume"))
        .header(header::COOKIE, &operator)
        .form(&[("csrf", "0".repeat(64))])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = client
        .post(api.url("/schedules/hourly/resume"))
        .header(header::COOKIE, &operator)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let (_, shown) = api.get("/v1/schedules/hourly").await;
    assert_eq!(shown["paused"], Value::Null, "{shown}");
    // Paused again for the rest of the test.
    let (status, _) = api
        .post("/v1/schedules/hourly/pause", OPERATOR, json!({}))
        .await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_through_the_toml_the_api_and_the_cli_on_the_embedded_store() {
    surface("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_through_the_toml_the_api_and_the_cli_on_nats() {
    let server = NatsServer::start();
    let store = server.store_section("sched");
    surface(&store).await;
}

/// `homing config check` and `homing run` refuse a bad `[schedules]` table with the file, the
/// line and the key; nothing runs.
#[test]
fn a_bad_schedule_is_refused_with_its_line_and_key() {
    let base = format!(
        "[plugins.echo]\npath = {}\n\n[schedules.nightly]\nagent = \"echo\"\n",
        toml_path(&guest("echo"))
    );
    for (extra, line, says) in [
        (
            "cron = \"0 25 * * *\"\n",
            6,
            "[schedules.nightly] cron: `0 25 * * *`: the hour field `25`: 25 is out of 0-23",
        ),
        (
            "cron = \"0 1 * * *\"\ntimezone = \"Atlantis/Capital\"\n",
            7,
            "[schedules.nightly] timezone: unknown time zone `Atlantis/Capital`",
        ),
        (
            "every = \"1h\"\njitter = \"1h\"\n",
            7,
            "[schedules.nightly] jitter:",
        ),
        (
            "cron = \"0 1 * * *\"\nat = \"2030-01-01T00:00:00Z\"\n",
            6,
            "set exactly one of cron, every and at",
        ),
        ("cron = \"0 0 30 2 *\"\n", 4, "no fire time after now"),
    ] {
        let env = Env::new(&format!("{base}{extra}"));
        let err = env.fails(&["config", "check"]);
        assert!(err.contains(&format!("line {line}: ")), "{extra}: {err}");
        assert!(err.contains(says), "{extra}: {err}");
        let err = env.fails(&["run", "--until-idle"]);
        assert!(err.contains(says), "{extra}: {err}");
    }
    let env = Env::new(&base.replace("agent = \"echo\"", "agent = \"ghost\"\ncron = \"@daily\""));
    let err = env.fails(&["config", "check"]);
    assert!(
        err.contains("line 5: [schedules.nightly] agent: `ghost` is not a plugin"),
        "{err}"
    );
}

/// Three `homing run` hosts on one NATS store share a schedule firing every second; one host
/// is SIGKILLed (its tick, if it held one, is reclaimed after the lease) and another started:
/// every second from the first fire to the last handled fired exactly once, none skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_fire_every_slot_once_while_one_is_killed() {
    use crate::hosts::{open_nats, spawn_run};
    use homing::store::schedules::{dispatch_id, fire_label};

    let server = NatsServer::start();
    let toml = format!(
        r#"
[host]
lease = "3s"
sweep_interval = "200ms"
shutdown_grace = "2s"

[store]
backend = "nats"
url = "{url}"
prefix = "sk"
request_timeout = "2s"
connect_timeout = "10s"

[plugins.echo]
path = {echo}
concurrency = 2

[schedules.second]
agent = "echo"
every = "1s"
thread = "per-fire"
overlap = "allow"
payload = "s"
"#,
        url = server.url(),
        echo = toml_path(&guest("echo")),
    );
    let env = Env::new(&toml);
    let mut a = spawn_run(&env, "host-a");
    let _b = spawn_run(&env, "host-b");
    let _c = spawn_run(&env, "host-c");
    let store = open_nats(&[server.url()], "sk", 1).await;
    let fires = |n: usize| {
        let store = store.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(90);
            loop {
                let s = store
                    .schedules
                    .schedule("second")
                    .await
                    .unwrap()
                    .map(|s| s.schedule);
                if let Some(s) = &s
                    && s.outcomes.iter().filter(|o| o.dispatch.is_some()).count() >= n
                {
                    return s.clone();
                }
                assert!(Instant::now() < deadline, "fewer than {n} fires: {s:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let early = fires(5).await;
    signal(&a.0, "KILL");
    let _ = a.0.wait();
    let _d = spawn_run(&env, "host-d");
    // Past the killed host's lease and beyond: twenty more seconds of slots.
    let first = early
        .outcomes
        .iter()
        .find(|o| o.dispatch.is_some())
        .map(|o| o.fire)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let last = loop {
        let s = store
            .schedules
            .schedule("second")
            .await
            .unwrap()
            .unwrap()
            .schedule;
        if s.watermark >= first + 25_000 {
            assert!(
                s.outcomes.iter().all(|o| o.skipped.is_none()),
                "a slot was skipped: {:?}",
                s.outcomes
            );
            break s.watermark;
        }
        assert!(
            Instant::now() < deadline,
            "the schedule stalled at {}",
            fire_label(s.watermark)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Every second from the first fire to the watermark has its dispatch, once.
    let mut fire = first;
    while fire <= last {
        let id = dispatch_id("second", fire);
        let d = store.mailbox.load(&id).await.unwrap();
        assert!(d.is_some(), "slot {} did not fire", fire_label(fire));
        fire += 1_000;
    }
}
