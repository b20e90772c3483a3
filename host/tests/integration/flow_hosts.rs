//! Flow control across real hosts (issue 29): real `nats-server` processes, several real
//! `homing run` processes on one NATS store (the embedded store for fairness), the `http-probe`
//! guest calling the stand-in API of `flow_control`, which journals every request it holds with
//! the key and the host that sent it (each host's `HOMING_HOST_ID` reaches the probe as the
//! variable `host`, sent as `x-host`).
//!
//! What is proven, with limits kept in the store and not per host:
//!
//! - a plugin `rate` holds across two hosts: no window of their combined claim starts holds
//!   more than the rate over the window plus the burst (and one for rounding);
//! - a concurrency key never has more than `key_concurrency` requests in flight across two
//!   hosts; when one is SIGKILLed holding slots, the other runs only in the slots left until
//!   the dead claims' leases run out, then in all of them, and every dispatch ends acked;
//! - fairness: on the embedded store, ten small keys all finish before a deep key's 500th
//!   completion, though the deep key was enqueued first and could take every worker;
//! - an origin limit shared by three plugins on two hosts holds their requests at its
//!   `concurrency`;
//! - a pause made by another process stops claims of the agent on both hosts while they keep
//!   running other work, and a resume restarts them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use homing::store::embedded::EmbeddedStore;
use homing::store::{Dispatch, NewDispatch, Status, Store, SystemClock};
use serde_json::json;

use crate::common::{Env, Served, signal, wait_exit};
use crate::flow_control::{Held, now_ms, plugin, start_api};
use crate::hosts::{Host, all, finished, host_log, open_nats, spawn_run, wait_all_acked};
use crate::natsd::NatsServer;

/// A config on the NATS server `url` (stream `prefix`): short leases, frequent sweeps.
fn nats_config(url: &str, prefix: &str, plugins: &str) -> String {
    format!(
        "[host]\nlease = \"2s\"\nsweep_interval = \"200ms\"\nshutdown_grace = \"5s\"\n\n\
         [store]\nbackend = \"nats\"\nurl = \"{url}\"\nprefix = \"{prefix}\"\n\
         request_timeout = \"2s\"\nconnect_timeout = \"60s\"\n\n{plugins}"
    )
}

/// The probe plugin `name` (see `flow_control::plugin`) with the variable `host`: the id of the
/// host running it.
fn probe(name: &str, served: &Served, extra: &str) -> String {
    format!(
        "{}[plugins.{name}.variables]\nhost = {{ env = \"HOMING_HOST_ID\", default = \"none\" }}\n\n",
        plugin(name, served, extra)
    )
}

/// A probe payload: hold a request for `ms` at the stand-in API, sent with `x-key: key` and
/// `x-host: <the host running it>`.
fn hold_from_host(served: &Served, ms: u64, key: &str) -> String {
    json!({
        "url": format!("http://127.0.0.1:{}/hold?ms={ms}", served.addr.port()),
        "headers": [["x-key", key], ["x-host", "{config.host}"]],
    })
    .to_string()
}

/// Enqueues one dispatch through the store; returns its id.
async fn enqueue(
    store: &Store,
    agent: &str,
    thread: &str,
    payload: &str,
    key: Option<&str>,
) -> String {
    let mut new = NewDispatch::new(agent, thread, payload.as_bytes().to_vec());
    new.concurrency_key = key.map(str::to_owned);
    store.mailbox.enqueue(new).await.expect("enqueue").id
}

/// Stops a host with SIGTERM and expects a clean exit.
fn stop(mut host: Host, env: &Env, name: &str) {
    signal(&host, "TERM");
    let status = wait_exit(&mut host, Duration::from_secs(30));
    assert!(
        status.success(),
        "{name} exit: {status}\n{}",
        host_log(env, name)
    );
}

/// The most of the sorted times `at` falling in any window `[t, t + window)`.
fn most_in_window(at: &[u64], window: u64) -> usize {
    let mut most = 0;
    let mut first = 0;
    for (last, t) in at.iter().enumerate() {
        while at[first] + window <= *t {
            first += 1;
        }
        most = most.max(last + 1 - first);
    }
    most
}

/// The most of the intervals `[start, end)` open at once.
fn most_at_once(intervals: impl IntoIterator<Item = (u64, u64)>) -> usize {
    let mut events: Vec<(u64, i32)> = Vec::new();
    for (start, end) in intervals {
        if start < end {
            events.push((start, 1));
            events.push((end, -1));
        }
    }
    // At one instant, ends before starts: the intervals are half-open.
    events.sort_unstable();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in events {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

/// Runs a test's async part on a runtime of its own. The tests are plain `#[test]`s because
/// the stand-in API runs on a runtime of its own, which cannot be started or dropped inside
/// another.
fn block_on<F: std::future::Future>(test: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(test)
}

/// The stand-in API's journal of requests with `key`.
fn journal(api: &crate::flow_control::Api, key: &str) -> Vec<Held> {
    let seen = api.inner.lock().expect("the API's lock");
    seen.held.iter().filter(|h| h.key == key).cloned().collect()
}

#[test]
fn a_plugin_rate_holds_within_one_token_across_two_nats_hosts() {
    let (_api, served) = start_api();
    block_on(async {
        const N: usize = 100;
        const PER_S: u64 = 20;
        const BURST: u64 = 1;
        let server = NatsServer::start();
        let env = Env::new(&nats_config(
            &server.url(),
            "rate",
            &plugin(
                "probe",
                &served,
                &format!("concurrency = 4\nrate = \"{PER_S}/s\"\nburst = {BURST}"),
            ),
        ));
        let store = open_nats(&[server.url()], "rate", 1).await;
        let mut ids = Vec::new();
        for i in 0..N {
            ids.push(enqueue(&store, "probe", &format!("t{i}"), "{}", None).await);
        }
        let a = spawn_run(&env, "host-a");
        let b = spawn_run(&env, "host-b");
        let logs = || format!("{}\n{}", host_log(&env, "host-a"), host_log(&env, "host-b"));
        wait_all_acked(&store, &ids, Duration::from_secs(60), &logs).await;
        stop(a, &env, "host-a");
        stop(b, &env, "host-b");

        let records = all(&store).await;
        let mut started: Vec<u64> = ids
            .iter()
            .map(|id| {
                let d = &records[id];
                assert_eq!(d.claims, 1, "claimed once: {d:?}");
                d.started_at.expect("an acked run has its start")
            })
            .collect();
        started.sort_unstable();
        // Exact across hosts: over any window, the claims of both hosts together take at most
        // the tokens refilled in it plus the burst (one more for millisecond rounding). Per-host
        // buckets would allow twice the rate.
        for window in [250, 1_000, 3_000] {
            let allowed = usize::try_from(PER_S * window / 1_000 + BURST + 1).unwrap_or(usize::MAX);
            let most = most_in_window(&started, window);
            eprintln!("rate: at most {most} claims in {window} ms (allowed {allowed})");
            assert!(
                most <= allowed,
                "{most} claims in a window of {window} ms (at most {allowed}): {started:?}"
            );
        }
        let span = started[N - 1] - started[0];
        let least = (N as u64 - BURST) * 1_000 / PER_S;
        assert!(
            span + 1 >= least,
            "{N} claims in {span} ms: faster than the rate"
        );
        let (log_a, log_b) = (host_log(&env, "host-a"), host_log(&env, "host-b"));
        let (na, nb) = (finished(&log_a).len(), finished(&log_b).len());
        assert_eq!(na + nb, N, "each dispatch ran once\n{log_a}\n{log_b}");
        eprintln!("rate: host a ran {na}, host b {nb}");
        assert!(na > 0 && nb > 0, "both hosts claimed: a={na} b={nb}");
    });
}
#[test]
fn a_concurrency_key_holds_across_two_nats_hosts_and_a_killed_hosts_slots_free_at_their_lease() {
    let (api, served) = start_api();
    block_on(async {
        const N: usize = 14;
        const CAP: usize = 2;
        let server = NatsServer::start();
        let env = Env::new(&nats_config(
            &server.url(),
            "keyed",
            &probe(
                "probe",
                &served,
                &format!("concurrency = 4\nkey_concurrency = {CAP}\nmax_attempts = 5"),
            ),
        ));
        let store = open_nats(&[server.url()], "keyed", 1).await;
        let mut ids = Vec::new();
        for i in 0..N {
            let payload = hold_from_host(&served, 800, "k");
            ids.push(enqueue(&store, "probe", &format!("t{i}"), &payload, Some("k")).await);
        }
        // Host a starts alone, so it holds slots when it dies whatever the hosts' start-up
        // times: started together, host b took the key's slots first and, claiming again as
        // each of its runs completed, could keep them until little work was left.
        let mut a = spawn_run(&env, "host-a");

        // Host a holds a slot: one of its claims is live.
        let held_by_a = |records: &std::collections::BTreeMap<String, Dispatch>| -> Vec<Dispatch> {
            records
                .values()
                .filter(|d| d.status == Status::Claimed)
                .filter(|d| {
                    d.claim
                        .as_ref()
                        .is_some_and(|c| c.claimed_by.starts_with("host-a/"))
                })
                .cloned()
                .collect()
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while held_by_a(&all(&store).await).is_empty() {
            assert!(
                Instant::now() < deadline && a.try_wait().expect("try_wait").is_none(),
                "host a never claimed: {}",
                host_log(&env, "host-a")
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let b = spawn_run(&env, "host-b");
        signal(&a, "KILL");
        let _ = wait_exit(&mut a, Duration::from_secs(10));
        let killed = now_ms();
        // What the dead host holds now stays as it is until its leases run out.
        let dead = held_by_a(&all(&store).await);
        assert!(
            !dead.is_empty() && dead.len() <= CAP,
            "host a died holding {} slots (killed at {killed}): {:?}\n{}",
            dead.len(),
            dead.iter()
                .map(|d| (
                    &d.id,
                    d.attempt,
                    d.started_at,
                    d.claim.as_ref().map(|c| c.lease_until)
                ))
                .collect::<Vec<_>>(),
            host_log(&env, "host-a")
        );
        let lease_end = dead
            .iter()
            .filter_map(|d| d.claim.as_ref().map(|c| c.lease_until))
            .min()
            .expect("a dead claim's lease");
        assert!(
            lease_end > killed,
            "the dead claims' leases ran out before the check"
        );

        wait_all_acked(&store, &ids, Duration::from_secs(60), &|| {
            host_log(&env, "host-b")
        })
        .await;
        stop(b, &env, "host-b");

        let records = all(&store).await;
        for d in &dead {
            let done = &records[&d.id];
            assert_eq!(done.status, Status::Acked, "{done:?}");
            assert_eq!(done.attempt, 1, "the dead claim cost one attempt: {done:?}");
            let ran = done.started_at.expect("an acked run has its start");
            let until = d.claim.as_ref().map_or(0, |c| c.lease_until);
            assert!(
                ran > until,
                "rerun at {ran}, before its dead lease ran out at {until}"
            );
        }
        let requests = journal(&api, "k");
        let all_at_once = most_at_once(requests.iter().map(|h| (h.start, h.end)));
        assert!(
            all_at_once <= CAP,
            "{all_at_once} runs of key k at once: {requests:?}"
        );
        let seen_max = api.inner.lock().expect("lock").per_key_max["k"];
        assert!(seen_max <= CAP, "{seen_max} requests of key k at once");
        let on_b: Vec<&Held> = requests.iter().filter(|h| h.host == "host-b").collect();
        assert!(
            requests
                .iter()
                .all(|h| h.host == "host-a" || h.host == "host-b"),
            "every request names its host: {requests:?}"
        );
        // While the dead claims' leases ran, host b had only the slots they left.
        let while_dead = most_at_once(
            on_b.iter()
                .map(|h| (h.start.max(killed), h.end.min(lease_end.saturating_sub(50)))),
        );
        assert!(
            while_dead <= CAP - dead.len(),
            "host b ran {while_dead} at once while host a's {} dead claims held their slots \
             (killed at {killed}, leases until {lease_end}): {on_b:?}",
            dead.len()
        );
        eprintln!(
            "key: host a died holding {} slots; host b ran at most {while_dead} at once until \
             their leases ran out {} ms after the kill",
            dead.len(),
            lease_end - killed
        );
        // Once they ran out, the slots came back: host b ran the key at its full concurrency.
        let after = most_at_once(
            on_b.iter()
                .filter(|h| h.start > lease_end)
                .map(|h| (h.start, h.end)),
        );
        assert_eq!(after, CAP, "host b never used the freed slots: {on_b:?}");
    });
}
#[test]
fn fairness_lets_ten_small_keys_finish_before_a_deep_keys_500th_run() {
    const BIG: usize = 5_000;
    const SMALL_KEYS: usize = 10;
    const SMALL: usize = 10;
    let (_api, served) = start_api();
    // The deep key could take every worker: only the rotation across keys lets the others in.
    let env = Env::new(&format!(
        "[host]\nlease = \"30s\"\nsweep_interval = \"200ms\"\n\n\
         [store]\nbackend = \"embedded\"\npath = \"store.db\"\n\n{}",
        plugin("probe", &served, "concurrency = 4\nkey_concurrency = 4")
    ));
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let store = EmbeddedStore::open(&env.path().join("store.db"), Arc::new(SystemClock))
        .expect("open the embedded store")
        .store();
    let enqueued = Instant::now();
    let (big, small) = rt.block_on(async {
        // The deep key first, over 50 threads; then ten keys of ten, each run on a thread of
        // its own.
        let mut big = Vec::new();
        for i in 0..BIG {
            big.push(
                enqueue(
                    &store,
                    "probe",
                    &format!("big{}", i % 50),
                    "{}",
                    Some("big"),
                )
                .await,
            );
        }
        let mut small = Vec::new();
        for k in 0..SMALL_KEYS {
            for i in 0..SMALL {
                let key = format!("small{k}");
                small.push(enqueue(&store, "probe", &format!("{key}-{i}"), "{}", Some(&key)).await);
            }
        }
        (big, small)
    });
    eprintln!(
        "enqueued {} in {:?}",
        BIG + SMALL_KEYS * SMALL,
        enqueued.elapsed()
    );
    let ran = Instant::now();
    env.run_until_idle();
    eprintln!("ran them in {:?}", ran.elapsed());
    let records = rt.block_on(all(&store));
    let completed = |ids: &[String]| -> Vec<u64> {
        let mut at: Vec<u64> = ids
            .iter()
            .map(|id| {
                let d = &records[id];
                assert_eq!(d.status, Status::Acked, "{d:?}");
                d.completed_at
                    .expect("an acked dispatch has its completion")
            })
            .collect();
        at.sort_unstable();
        at
    };
    let (big_done, small_done) = (completed(&big), completed(&small));
    let last_small = small_done[small_done.len() - 1];
    assert!(
        last_small < big_done[499],
        "the last small key's run completed at {last_small}, the deep key's 500th at {} \
         (its first at {}): the deep key starved the others",
        big_done[499],
        big_done[0]
    );
    let big_before = big_done.iter().filter(|t| **t <= last_small).count();
    eprintln!("the deep key completed {big_before} runs before the small keys were done");
}

#[test]
fn an_origin_limit_holds_across_two_nats_hosts_and_three_plugins() {
    let (api, served) = start_api();
    block_on(async {
        const CAP: usize = 2;
        let server = NatsServer::start();
        let port = served.addr.port();
        let plugins: String = ["one", "two", "three"]
            .iter()
            .map(|name| probe(name, &served, "concurrency = 4\nlimits = [\"api\"]"))
            .collect();
        let env = Env::new(&nats_config(
            &server.url(),
            "origin",
            &format!(
                "{plugins}[limits.api]\norigins = [\"http://127.0.0.1:{port}\"]\nconcurrency = {CAP}\n"
            ),
        ));
        let store = open_nats(&[server.url()], "origin", 1).await;
        let mut ids = Vec::new();
        for i in 0..24 {
            let agent = ["one", "two", "three"][i % 3];
            let payload = hold_from_host(&served, 200, agent);
            ids.push(enqueue(&store, agent, &format!("t{i}"), &payload, None).await);
        }
        let a = spawn_run(&env, "host-a");
        let b = spawn_run(&env, "host-b");
        let logs = || format!("{}\n{}", host_log(&env, "host-a"), host_log(&env, "host-b"));
        wait_all_acked(&store, &ids, Duration::from_secs(60), &logs).await;
        stop(a, &env, "host-a");
        stop(b, &env, "host-b");

        let seen = api.inner.lock().expect("lock");
        let requests = &seen.held;
        assert_eq!(requests.len(), 24, "one request per run: {requests:?}");
        let at_once = most_at_once(requests.iter().map(|h| (h.start, h.end)));
        assert!(
            seen.max <= CAP,
            "{} requests reached the API at once",
            seen.max
        );
        assert!(at_once <= CAP, "{at_once} requests at once: {requests:?}");
        assert_eq!(seen.max, CAP, "the limit's slots were all used");
        for host in ["host-a", "host-b"] {
            assert!(
                requests.iter().any(|h| h.host == host),
                "{host} sent no request: {requests:?}"
            );
        }
        for agent in ["one", "two", "three"] {
            assert_eq!(
                requests.iter().filter(|h| h.key == agent).count(),
                8,
                "plugin {agent}'s requests: {requests:?}"
            );
        }
    });
}
#[test]
fn a_pause_stops_claims_on_every_nats_host_and_a_resume_restarts_them() {
    let (_api, served) = start_api();
    block_on(async {
        const PAUSED: usize = 12;
        let server = NatsServer::start();
        let env = Env::new(&nats_config(
            &server.url(),
            "pause",
            &format!(
                "{}{}",
                probe("probe", &served, "concurrency = 4"),
                probe("marker", &served, "concurrency = 4")
            ),
        ));
        let store = open_nats(&[server.url()], "pause", 1).await;
        let a = spawn_run(&env, "host-a");
        let b = spawn_run(&env, "host-b");
        let logs = || format!("{}\n{}", host_log(&env, "host-a"), host_log(&env, "host-b"));

        // Paused from another process, then work for the paused agent.
        let paused = env.ok(&["agent", "pause", "probe", "--reason", "incident 29"]);
        assert!(paused.contains("probe"), "{paused}");
        let mut held = Vec::new();
        for i in 0..PAUSED {
            let payload = hold_from_host(&served, 300, "probe");
            held.push(enqueue(&store, "probe", &format!("p{i}"), &payload, None).await);
        }
        // Both hosts are claiming: each runs a marker enqueued after the paused agent's work.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut round = 0;
        loop {
            let mut markers = Vec::new();
            for i in 0..4 {
                let payload = hold_from_host(&served, 50, "marker");
                markers.push(
                    enqueue(&store, "marker", &format!("m{round}-{i}"), &payload, None).await,
                );
            }
            wait_all_acked(&store, &markers, Duration::from_secs(30), &logs).await;
            let ran_on = |host: &str| {
                finished(&host_log(&env, host))
                    .iter()
                    .any(|(id, _)| markers.contains(id))
            };
            if ran_on("host-a") && ran_on("host-b") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "both hosts never ran markers: {}",
                logs()
            );
            round += 1;
        }
        // A negative check: five sweep intervals more, and nothing of the paused agent was claimed.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let records = all(&store).await;
        for id in &held {
            let d = &records[id];
            assert_eq!(d.status, Status::Queued, "claimed while paused: {d:?}");
            assert_eq!((d.claims, d.attempt), (0, 0), "{d:?}");
        }

        env.ok(&["agent", "resume", "probe"]);
        wait_all_acked(&store, &held, Duration::from_secs(60), &logs).await;
        stop(a, &env, "host-a");
        stop(b, &env, "host-b");
        for host in ["host-a", "host-b"] {
            let ran = finished(&host_log(&env, host))
                .iter()
                .filter(|(id, _)| held.contains(id))
                .count();
            assert!(ran > 0, "{host} ran none of the resumed agent's work");
        }
    });
}
