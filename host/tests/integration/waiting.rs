//! Waitpoints end to end, host side: a real `homing run` and the `waitpoint-probe` guest built
//! from source, waiting dispatches that hold no worker, completions through the API, a host
//! restarted or killed while dispatches wait, and two NATS hosts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use homing::store::embedded::EmbeddedStore;
use homing::store::{NewDispatch, Status, Store, SystemClock};
use serde_json::Value;

use crate::api::{OPERATOR, PRODUCER, READER, TOKENS};
use crate::common::{Env, guest, signal, toml_path, wait_exit};
use crate::natsd::free_port;

/// A host on the embedded store with the probe (`concurrency` workers), serving the API on
/// `port`.
fn config(lease: &str, concurrency: u32, port: u16) -> String {
    format!(
        r#"
[host]
lease = "{lease}"
sweep_interval = "200ms"

[store]
backend = "embedded"
path = "homing.db"

[api]
listen = "127.0.0.1:{port}"
{TOKENS}

[plugins.probe]
path = {probe}
concurrency = {concurrency}
timeout = "60s"
max_attempts = 3
"#,
        probe = toml_path(&guest("waitpoint_probe")),
    )
}

/// Starts `homing run` with the API tokens in its environment.
fn spawn(env: &Env) -> std::process::Child {
    std::fs::write(env.path().join("operator.token"), format!("{OPERATOR}\n")).unwrap();
    let log = std::fs::File::create(env.path().join("host.log")).unwrap();
    env.command(&["run"])
        .env("HOMING_TEST_READER", READER)
        .env("HOMING_TEST_PRODUCER", PRODUCER)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// The embedded store file of `env`, opened by the test (another process on the file, as the
/// CLI is).
fn open_store(env: &Env) -> Store {
    let clock: homing::store::SharedClock = Arc::new(SystemClock);
    EmbeddedStore::open(&env.path().join("homing.db"), clock)
        .unwrap()
        .store()
}

/// Polls `check` until it holds, or fails after `within` with `what` and the host log.
async fn until(env: &Env, what: &str, within: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "{what} within {within:?}; host log:\n{}",
            env.host_log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn count(store: &Store, status: Status) -> usize {
    store
        .mailbox
        .counts()
        .await
        .unwrap()
        .iter()
        .filter(|c| c.status == status)
        .map(|c| c.count as usize)
        .sum()
}

/// The pending waitpoints' ids, through the API.
async fn pending_ids(client: &reqwest::Client, port: u16) -> Vec<String> {
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("http://127.0.0.1:{port}/v1/waitpoints?state=pending&limit=100");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let page: Value = client
            .get(&url)
            .bearer_auth(READER)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let items = page["waitpoints"].as_array().cloned().unwrap_or_default();
        ids.extend(
            items
                .iter()
                .filter_map(|w| w["id"].as_str().map(str::to_owned)),
        );
        match page["next_cursor"].as_str() {
            Some(c) if !items.is_empty() => cursor = Some(c.to_owned()),
            _ => return ids,
        }
    }
}

/// Completes waitpoint `id` through the API as an operator.
async fn complete(
    client: &reqwest::Client,
    port: u16,
    id: &str,
    body: &str,
) -> reqwest::StatusCode {
    client
        .post(format!(
            "http://127.0.0.1:{port}/v1/waitpoints/{id}/complete"
        ))
        .bearer_auth(OPERATOR)
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
        .status()
}

async fn enqueue_many(store: &Store, payload: &str, threads: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let new = NewDispatch::new(
            "probe",
            format!("{threads}-{i}"),
            payload.as_bytes().to_vec(),
        );
        ids.push(store.mailbox.enqueue(new).await.unwrap().id);
    }
    ids
}

/// 200 dispatches wait on waitpoints while 1,000 others of the same agent, with two workers,
/// all complete: the waiters hold no worker. Then all 200 are completed through the API and
/// resume, read their results and ack, each with one resume and no attempt counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_waiters_block_nothing_and_all_resume_when_completed() {
    let port = free_port();
    let env = Env::new(&config("10s", 2, port));
    let store = open_store(&env);
    let waiters = enqueue_many(&store, "wait 600000", "wait", 200).await;
    let mut host = spawn(&env);
    until(
        &env,
        "200 dispatches waiting",
        Duration::from_secs(120),
        async || count(&store, Status::Waiting).await == 200,
    )
    .await;
    let others = enqueue_many(&store, "echo done", "echo", 1_000).await;
    until(
        &env,
        "the 1,000 others acked",
        Duration::from_secs(120),
        async || count(&store, Status::Acked).await == 1_000,
    )
    .await;
    assert_eq!(count(&store, Status::Waiting).await, 200, "still waiting");
    assert_eq!(others.len(), 1_000);

    let client = reqwest::Client::new();
    let ids = pending_ids(&client, port).await;
    assert_eq!(ids.len(), 200);
    let started = Instant::now();
    for id in &ids {
        assert_eq!(
            complete(&client, port, id, r#"{"approved": true}"#).await,
            200
        );
    }
    until(
        &env,
        "all 200 acked",
        Duration::from_secs(120),
        async || count(&store, Status::Acked).await == 1_200,
    )
    .await;
    println!(
        "200 completions through the API to 200 acks: {:?}",
        started.elapsed()
    );
    for id in &waiters {
        let d = store.mailbox.load(id).await.unwrap().unwrap();
        assert_eq!(
            (d.status, d.resumes, d.attempt, d.claims),
            (Status::Acked, 1, 0, 2),
            "{d:?}"
        );
        let output = d.result.map(|r| r.output).unwrap_or_default();
        assert_eq!(output, br#"completed {"approved": true}"#, "{id}");
    }
    signal(&host, "TERM");
    wait_exit(&mut host, Duration::from_secs(20));
}

/// A host stopped and started again while 50 dispatches wait loses none: completed after the
/// restart, all 50 resume and ack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_restarted_while_fifty_wait_loses_none() {
    let port = free_port();
    let env = Env::new(&config("10s", 4, port));
    let store = open_store(&env);
    let waiters = enqueue_many(&store, "wait 600000", "r", 50).await;
    let mut host = spawn(&env);
    until(&env, "50 waiting", Duration::from_secs(60), async || {
        count(&store, Status::Waiting).await == 50
    })
    .await;
    signal(&host, "TERM");
    wait_exit(&mut host, Duration::from_secs(20));
    let mut host = spawn(&env);
    let client = reqwest::Client::new();
    let mut ids = Vec::new();
    until(
        &env,
        "the restarted API listing 50 waitpoints",
        Duration::from_secs(60),
        async || {
            ids = match client
                .get(format!("http://127.0.0.1:{port}/readyz"))
                .send()
                .await
            {
                Ok(r) if r.status() == 200 => pending_ids(&client, port).await,
                _ => Vec::new(),
            };
            ids.len() == 50
        },
    )
    .await;
    for id in &ids {
        assert_eq!(complete(&client, port, id, "go").await, 200);
    }
    until(&env, "all 50 acked", Duration::from_secs(60), async || {
        count(&store, Status::Acked).await == 50
    })
    .await;
    for id in &waiters {
        let d = store.mailbox.load(id).await.unwrap().unwrap();
        assert_eq!(
            d.result.map(|r| r.output).unwrap_or_default(),
            b"completed go"
        );
    }
    signal(&host, "TERM");
    wait_exit(&mut host, Duration::from_secs(20));
}

/// A host SIGKILLed after its guest created a waitpoint and before it suspended: the dispatch
/// is reclaimed after its lease, and the re-run finds the same waitpoint (one waitpoint, not
/// two) and suspends on it; its completion then finishes the dispatch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_before_suspending_reruns_into_the_same_waitpoint() {
    let port = free_port();
    let env = Env::new(&config("1s", 1, port));
    let store = open_store(&env);
    let id = store
        .mailbox
        .enqueue(NewDispatch::new(
            "probe",
            "k",
            b"wait-then-hang 600000".to_vec(),
        ))
        .await
        .unwrap()
        .id;
    let mut doomed = spawn(&env);
    until(
        &env,
        "the waitpoint created",
        Duration::from_secs(60),
        async || {
            let log = store.log.read("k", 0, 10).await.unwrap();
            log.iter().any(|e| e.data.starts_with(b"created "))
        },
    )
    .await;
    signal(&doomed, "KILL");
    wait_exit(&mut doomed, Duration::from_secs(10));
    let created = store.waitpoints.waitpoints_of(&id).await.unwrap();
    assert_eq!(created.len(), 1);

    let mut host = spawn(&env);
    until(
        &env,
        "the re-run waiting",
        Duration::from_secs(60),
        async || store.mailbox.load(&id).await.unwrap().unwrap().status == Status::Waiting,
    )
    .await;
    let d = store.mailbox.load(&id).await.unwrap().unwrap();
    assert_eq!(
        (d.attempt, d.claims),
        (1, 2),
        "the killed run counts one attempt"
    );
    let again = store.waitpoints.waitpoints_of(&id).await.unwrap();
    assert_eq!(again.len(), 1, "the re-run found the waitpoint it had made");
    assert_eq!(again[0].id, created[0].id);
    let client = reqwest::Client::new();
    until(&env, "the API up", Duration::from_secs(30), async || {
        complete(&client, port, &created[0].id, "yes").await == 200
    })
    .await;
    until(&env, "acked", Duration::from_secs(30), async || {
        store.mailbox.load(&id).await.unwrap().unwrap().status == Status::Acked
    })
    .await;
    signal(&host, "TERM");
    wait_exit(&mut host, Duration::from_secs(20));
}

/// Two hosts on one NATS store: a waitpoint created by a run on host A is completed through
/// host B's API (B does not run the agent); the dispatch resumes on A and acks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waitpoint_made_on_one_nats_host_is_completed_through_another() {
    use crate::hosts::spawn_run;
    use crate::natsd::NatsServer;

    let server = NatsServer::start();
    let store_toml = format!(
        "[store]\nbackend = \"nats\"\nurl = \"{}\"\nprefix = \"wait2\"\nconnect_timeout = \"30s\"\n",
        server.url()
    );
    let port = free_port();
    let a = Env::new(&format!(
        "[host]\nlease = \"10s\"\nsweep_interval = \"200ms\"\n\n{store_toml}\n[plugins.probe]\npath = {}\ntimeout = \"60s\"\n",
        toml_path(&guest("waitpoint_probe"))
    ));
    let b = Env::new(&format!(
        "[host]\nlease = \"10s\"\nsweep_interval = \"200ms\"\n\n{store_toml}\n[api]\nlisten = \"127.0.0.1:{port}\"\n{TOKENS}\n\n[plugins.echo]\npath = {}\n",
        toml_path(&guest("echo"))
    ));
    let _a = spawn_run(&a, "host-a");
    let id = a.enqueue("probe", "t", "wait 600000", &[]);
    let mut host_b = spawn(&b);
    let deadline = Instant::now() + Duration::from_secs(60);
    let waitpoint = loop {
        let entries: Vec<Value> =
            serde_json::from_str(&a.ok(&["thread", "log", "t", "--json"])).unwrap();
        if let Some(w) = entries
            .iter()
            .filter_map(|e| e["data"].as_str())
            .find_map(|d| d.strip_prefix("waiting "))
        {
            break w.to_owned();
        }
        assert!(Instant::now() < deadline, "host A never ran the probe");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    a.wait_status(&id, "waiting", Duration::from_secs(30));
    let client = reqwest::Client::new();
    let started = loop {
        let at = Instant::now();
        if let Ok(r) = client
            .post(format!(
                "http://127.0.0.1:{port}/v1/waitpoints/{waitpoint}/complete"
            ))
            .bearer_auth(OPERATOR)
            .body("from b")
            .send()
            .await
            && r.status() == 200
        {
            break at;
        }
        assert!(Instant::now() < deadline, "host B's API never completed it");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let d = a.wait_status(&id, "acked", Duration::from_secs(30));
    println!(
        "NATS, completed on host B to acked on host A: {:?}",
        started.elapsed()
    );
    assert_eq!(d["result"]["output"], "completed from b", "{d}");
    assert_eq!(
        (d["resumes"].as_u64(), d["attempt"].as_u64()),
        (Some(1), Some(0)),
        "{d}"
    );
    let _ = host_b.kill();
    let _ = host_b.wait();
}
