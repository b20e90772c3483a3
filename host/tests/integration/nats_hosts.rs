//! Many hosts on one NATS JetStream store, end to end: real `nats-server` processes, real
//! `homing run` processes, the sandbox guest built from source.
//!
//! The guest's `journal:<ms>` action appends `start <id>` and `end <id>` to its thread's log
//! through its claim (fenced appends). If two claims of one thread ever overlapped, or a zombie
//! holder wrote after losing its claim, the log of that thread would show it: every test checks
//! that each thread's log is a clean sequence of `start X`, `end X` pairs.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Child;
use std::time::{Duration, Instant};

use homing::store::{Status, Store};

use crate::common::{Env, guest, signal, toml_path, wait_exit};
use crate::hosts::{
    all, fill, host_log, journals, open_nats as open, spawn_run, spawn_until_idle, wait_all_acked,
};
use crate::natsd;
use crate::natsd::NatsServer;

fn config(urls: &[String], prefix: &str, replicas: usize, lease: &str, concurrency: u32) -> String {
    let urls: Vec<String> = urls.iter().map(|u| format!("\"{u}\"")).collect();
    format!(
        r#"
[host]
lease = "{lease}"
sweep_interval = "200ms"
shutdown_grace = "2s"

[store]
backend = "nats"
url = [{urls}]
prefix = "{prefix}"
replicas = {replicas}
request_timeout = "2s"
connect_timeout = "60s"

[plugins.sandbox]
path = {path}
concurrency = {concurrency}
timeout = "60s"
max_attempts = 5
"#,
        urls = urls.join(", "),
        path = toml_path(&guest("sandbox")),
    )
}

/// Checks each thread's journal (see `hosts`): well-formed, every dispatch journaled and nothing
/// else; returns how many times each dispatch started.
async fn check_journals(store: &Store, threads: usize, ids: &[String]) -> BTreeMap<String, usize> {
    let threads: Vec<String> = (0..threads).map(|t| format!("t{t}")).collect();
    let runs = journals(store, &threads).await;
    let journaled: BTreeSet<&String> = runs.keys().collect();
    let wanted: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(journaled, wanted, "every dispatch ran and nothing else did");
    for (id, r) in &runs {
        assert!(r.last_complete, "{id}: its last run did not finish: {r:?}");
    }
    runs.into_iter().map(|(id, r)| (id, r.starts)).collect()
}

fn settled(log: &str) -> usize {
    log.lines()
        .rev()
        .filter_map(|line| line.split("completed=").nth(1))
        .filter_map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|n| n.parse().ok())
        })
        .next()
        .unwrap_or(0)
}

/// Polls until at least `n` dispatches are acked, failing if `host` exits or a minute passes.
async fn wait_progress(store: &Store, n: usize, host: &mut Child, env: &Env) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let acked = all(store)
            .await
            .values()
            .filter(|d| d.status == Status::Acked)
            .count();
        if acked >= n {
            return;
        }
        assert!(
            Instant::now() < deadline && host.try_wait().unwrap().is_none(),
            "no progress: {}",
            host_log(env, "host-a")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_share_a_backlog_and_run_each_dispatch_exactly_once() {
    let server = NatsServer::start();
    let urls = vec![server.url()];
    let env = Env::new(&config(&urls, "share", 1, "30s", 4));
    let store = open(&urls, "share", 1).await;
    let ids = fill(&store, 1000, 50, 0).await;

    let mut a = spawn_until_idle(&env, "host-a");
    let mut b = spawn_until_idle(&env, "host-b");
    let status_a = wait_exit(&mut a, Duration::from_secs(120));
    let status_b = wait_exit(&mut b, Duration::from_secs(120));
    let (log_a, log_b) = (host_log(&env, "host-a"), host_log(&env, "host-b"));
    assert!(status_a.success(), "host a failed: {log_a}");
    assert!(status_b.success(), "host b failed: {log_b}");

    wait_all_acked(&store, &ids, Duration::from_secs(10), &|| {
        format!("{log_a}\n{log_b}")
    })
    .await;
    let starts = check_journals(&store, 50, &ids).await;
    assert!(
        starts.values().all(|n| *n == 1),
        "a dispatch ran twice: {:?}",
        starts.iter().filter(|(_, n)| **n > 1).collect::<Vec<_>>()
    );
    let records = all(&store).await;
    assert!(
        records
            .values()
            .all(|d| d.attempt == 0 && d.status == Status::Acked)
    );
    let (na, nb) = (settled(&log_a), settled(&log_b));
    assert_eq!(
        na + nb,
        1000,
        "each dispatch acked by exactly one host\n{log_a}\n{log_b}"
    );
    assert!(na > 0 && nb > 0, "both hosts took work: a={na} b={nb}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_hosts_claims_are_reclaimed_by_the_other_after_the_lease() {
    let server = NatsServer::start();
    let urls = vec![server.url()];
    let env = Env::new(&config(&urls, "crash", 1, "1s", 4));
    let store = open(&urls, "crash", 1).await;
    // Long runs, so host a is surely in the middle of some when it dies.
    let ids = fill(&store, 8, 8, 3000).await;

    let mut a = spawn_run(&env, "host-a");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let claimed = all(&store)
            .await
            .values()
            .filter(|d| d.status == Status::Claimed)
            .count();
        if claimed == 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "host a never claimed 4: {}",
            host_log(&env, "host-a")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held: Vec<String> = all(&store)
        .await
        .values()
        .filter(|d| d.status == Status::Claimed)
        .map(|d| d.id.clone())
        .collect();
    signal(&a, "KILL");
    let _ = wait_exit(&mut a, Duration::from_secs(10));

    let mut b = spawn_until_idle(&env, "host-b");
    let status = wait_exit(&mut b, Duration::from_secs(120));
    let log_b = host_log(&env, "host-b");
    assert!(status.success(), "host b failed: {log_b}");
    wait_all_acked(&store, &ids, Duration::from_secs(10), &|| log_b.clone()).await;
    let records = all(&store).await;
    for id in &held {
        assert_eq!(
            records[id].attempt, 1,
            "the crash counts as an attempt: {id}"
        );
    }
    let starts = check_journals(&store, 8, &ids).await;
    for id in &held {
        assert_eq!(starts[id], 2, "{id} started on a, then again on b");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_killed_and_restarted_under_load_loses_nothing() {
    let mut server = NatsServer::start();
    let urls = vec![server.url()];
    let env = Env::new(&config(&urls, "bounce", 1, "5s", 4));
    let ids = {
        let store = open(&urls, "bounce", 1).await;
        fill(&store, 300, 20, 5).await
    };

    let mut host = spawn_run(&env, "host-a");
    // Kill the server once the host is under way.
    {
        let store = open(&urls, "bounce", 1).await;
        wait_progress(&store, 20, &mut host, &env).await;
    }
    server.kill();
    // The outage lasts long enough for the host's requests to time out (2 s) at least once;
    // the host stays up meanwhile.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        host.try_wait().unwrap().is_none(),
        "the host died with the server: {}",
        host_log(&env, "host-a")
    );
    server.restart();

    let store = open(&urls, "bounce", 1).await;
    wait_all_acked(&store, &ids, Duration::from_secs(120), &|| {
        host_log(&env, "host-a")
    })
    .await;
    signal(&host, "TERM");
    let status = wait_exit(&mut host, Duration::from_secs(30));
    assert!(status.success(), "host exit: {}", host_log(&env, "host-a"));
    check_journals(&store, 20, &ids).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_node_cluster_with_three_replicas_keeps_serving_when_one_node_dies() {
    // This test's own thread only: a global subscriber would log for every test in the process.
    let _log = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_env_filter("homing=debug,async_nats=info")
            .with_test_writer()
            .finish(),
    );
    let mut nodes = NatsServer::cluster3();
    let urls: Vec<String> = nodes.iter().map(NatsServer::url).collect();
    // The host knows only the node that will die: it must fail over to the nodes it learned
    // of from the cluster, and its watcher must resync there.
    let env = Env::new(&config(&urls[..1], "ha", 3, "5s", 4));
    let store = open(&urls, "ha", 3).await;
    let ids = fill(&store, 200, 20, 5).await;
    drop(store);

    let mut host = spawn_run(&env, "host-a");
    let store = open(&urls[1..], "ha", 3).await;
    wait_progress(&store, 20, &mut host, &env).await;
    nodes[0].kill();
    let store = open(&urls[1..], "ha", 3).await;
    wait_all_acked(&store, &ids, Duration::from_secs(120), &|| {
        host_log(&env, "host-a")
    })
    .await;
    signal(&host, "TERM");
    let status = wait_exit(&mut host, Duration::from_secs(30));
    assert!(status.success(), "host exit: {}", host_log(&env, "host-a"));
    check_journals(&store, 20, &ids).await;
}

#[test]
fn config_check_connects_and_reports_the_stream() {
    let server = NatsServer::start();
    let env = Env::new(&config(&[server.url()], "checked", 1, "30s", 1));
    let out = env.ok(&["config", "check"]);
    assert!(out.contains("store: nats (server 127.0.0.1:"), "{out}");
    assert!(out.contains("stream `checked` will be created"), "{out}");
    // Opening creates it; the next check finds it.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = open(&[server.url()], "checked", 1).await;
        fill(&store, 3, 1, 0).await;
    });
    let out = env.ok(&["config", "check"]);
    assert!(out.contains("stream `checked` exists"), "{out}");
    // The same stream with other replicas is refused, naming what differs.
    let env3 = Env::new(&config(&[server.url()], "checked", 3, "30s", 1));
    let err = env3.fails(&["config", "check"]);
    assert!(err.contains("replicas 1 (configured 3)"), "{err}");
}

#[test]
fn a_nats_url_with_credentials_authenticates_and_never_shows_them() {
    // Issue 32: `config check` and connection errors printed `nats://user:password@host`.
    let password = "nats-pw-5d4c3b2a19";
    let server = NatsServer::start_with_user("natsuser", password);
    assert!(server.url().contains(password));
    let shown = |text: &str| {
        assert!(!text.contains(password), "the password is shown:\n{text}");
        assert!(
            !text.contains("natsuser"),
            "the user part is shown:\n{text}"
        );
    };

    // The URL's user part authenticates (the client gets it as credentials, not in the URL).
    let env = Env::new(&config(&[server.url()], "authed", 1, "30s", 1));
    let out = env.ok(&["config", "check"]);
    assert!(out.contains("store: nats (server 127.0.0.1:"), "{out}");
    shown(&out);
    shown(&env.ok(&["config", "check", "--json"]));
    let id = env.enqueue("sandbox", "t", "hello", &[]);
    shown(&env.run_until_idle());
    assert_eq!(env.show(&id)["status"], "acked");

    // A wrong password: refused by the server, and the error shows no user part.
    let wrong = server.url().replace(password, "wrong-pw-0a9b8c7d");
    let env = Env::new(&config(&[wrong], "authed", 1, "30s", 1));
    let err = env.fails(&["config", "check"]);
    assert!(
        err.contains(&format!("nats://127.0.0.1:{}", server.port())),
        "{err}"
    );
    assert!(!err.contains("wrong-pw-0a9b8c7d"), "{err}");
    shown(&err);

    // A closed port: `config check`, a host and a client all fail naming the URL without
    // its user part, a token's too.
    let closed = natsd::free_port();
    for url in [
        format!("nats://natsuser:{password}@127.0.0.1:{closed}"),
        format!("nats://{password}@127.0.0.1:{closed}"),
    ] {
        let env = Env::new(&config(&[url], "closed", 1, "30s", 1));
        for args in [
            &["config", "check"][..],
            &["run", "--until-idle"],
            &["dispatch", "list"],
        ] {
            let err = env.fails(args);
            assert!(
                err.contains(&format!("nats://127.0.0.1:{closed}")),
                "{args:?}: {err}"
            );
            shown(&err);
        }
    }
}

/// How many consumers the server holds on `stream`.
fn consumer_count(url: &str, stream: &str) -> usize {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = async_nats::connect(url).await.unwrap();
        let js = async_nats::jetstream::new(client);
        let mut stream = js.get_stream(stream).await.unwrap();
        stream.info().await.unwrap().state.consumer_count
    })
}

/// Each CLI command follows the stream through a consumer of its own; it deletes that consumer
/// when it is done. Left behind, each lingered on the server for 30 s, and the server takes at
/// most 1,000 per stream: a script of quick `homing enqueue` calls then failed at the 1,001st
/// with a watcher that "applied up to 0".
#[test]
fn cli_commands_leave_no_consumer_behind() {
    let server = NatsServer::start();
    let env = Env::new(&config(&[server.url()], "leftovers", 1, "30s", 1));
    for i in 0..5 {
        env.enqueue("sandbox", &format!("t{i}"), "echo:hi", &[]);
    }
    env.ok(&["dispatch", "list"]);
    env.ok(&["run", "--until-idle"]);
    assert_eq!(
        consumer_count(&server.url(), "leftovers"),
        0,
        "consumers left on the server by finished CLI processes"
    );
}

#[test]
fn a_host_without_a_server_fails_fast_with_a_clear_error() {
    let port = natsd::free_port();
    let text = config(&[format!("nats://127.0.0.1:{port}")], "none", 1, "30s", 1)
        .replace("connect_timeout = \"60s\"", "connect_timeout = \"1s\"");
    let env = Env::new(&text);
    let started = Instant::now();
    let err = env.fails(&["run", "--until-idle"]);
    assert!(err.contains("cannot connect to nats://127.0.0.1:"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "gave up only after {:?}",
        started.elapsed()
    );
}

#[test]
fn bad_nats_settings_are_refused_naming_the_key() {
    for (from, to, says) in [
        (
            "prefix = \"bad\"",
            "prefix = \"a.b\"",
            "[store] prefix `a.b`",
        ),
        (
            "prefix = \"bad\"",
            "prefix = \"_HOMING_LIVE\"",
            "[store] prefix `_HOMING_LIVE`",
        ),
        ("replicas = 1", "replicas = 2", "[store] replicas = 2"),
        ("url = [\"nats://x:1\"]", "url = []", "[store] url"),
    ] {
        let text = config(&["nats://x:1".to_owned()], "bad", 1, "30s", 1).replace(from, to);
        let env = Env::new(&text);
        let err = env.fails(&["config", "check"]);
        assert!(err.contains(says), "{to}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_paused_past_its_lease_has_its_late_writes_refused() {
    let server = NatsServer::start();
    let urls = vec![server.url()];
    let env = Env::new(&config(&urls, "pause", 1, "1s", 1));
    let store = open(&urls, "pause", 1).await;
    // One long run: host a starts it, journals its start, and is frozen mid-run.
    let ids = fill(&store, 1, 1, 2_000).await;
    let id = ids[0].clone();
    let mut a = spawn_run(&env, "host-a");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let started = store.log.latest("t0").await.unwrap() >= 1;
        if started {
            break;
        }
        assert!(
            Instant::now() < deadline && a.try_wait().unwrap().is_none(),
            "host a never started the run: {}",
            host_log(&env, "host-a")
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    signal(&a, "STOP");
    let held = store.mailbox.load(&id).await.unwrap().unwrap();
    assert!(
        held.claim
            .as_ref()
            .unwrap()
            .claimed_by
            .starts_with("host-a/")
    );

    // Host b reclaims the claim once the frozen lease runs out, and finishes the work.
    let mut b = spawn_run(&env, "host-b");
    wait_all_acked(&store, &ids, Duration::from_secs(60), &|| {
        host_log(&env, "host-b")
    })
    .await;
    let done = store.mailbox.load(&id).await.unwrap().unwrap();
    assert_eq!(done.attempt, 1, "the frozen run counts as a failed attempt");

    // Thaw host a: its run wakes up with a lost claim; whatever it writes is refused.
    signal(&a, "CONT");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !host_log(&env, "host-a").contains("dispatch finished") {
        assert!(
            Instant::now() < deadline && a.try_wait().unwrap().is_none(),
            "host a never finished its frozen run: {}",
            host_log(&env, "host-a")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after = store.mailbox.load(&id).await.unwrap().unwrap();
    assert_eq!(after, done, "the second holder's result stands");
    let log: Vec<String> = store
        .log
        .read("t0", 0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e.data).unwrap())
        .collect();
    assert_eq!(
        log,
        vec![
            format!("start {id}"),
            format!("start {id}"),
            format!("end {id}")
        ],
        "the frozen host's late append was refused"
    );
    signal(&a, "TERM");
    signal(&b, "TERM");
    assert!(wait_exit(&mut a, Duration::from_secs(30)).success());
    assert!(wait_exit(&mut b, Duration::from_secs(30)).success());
}
