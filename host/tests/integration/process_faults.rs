//! Process-level faults: real `homing run` processes killed at random points of their lifecycle
//! and restarted, on both backends, and a host stopped with SIGTERM under sustained load.
//!
//! Every dispatch is the sandbox guest's `journal:<ms>` action: it appends `start <id>` to its
//! thread's log through its claim, works, and appends `end <id>`. What a fenced append makes of
//! such a log is in `hosts`: the log of a thread is, in claim order, what each claim of
//! the thread appended, each claim a prefix of `[start X, end X]`. The tests check exactly that
//! shape, and tie every run cut short to a failed attempt the store counted:
//!
//! - `embedded_host_sigkilled_at_random_points_*`: one host on a SQLite file, SIGKILLed during
//!   start-up or after observed progress (plus a random short wait), restarted, several times;
//!   then a last host finishes the work.
//! - `nats_hosts_sigkilled_at_random_points_*`: three hosts on one `nats-server`; each round
//!   SIGKILLs a random one (sometimes again during its restart) and restarts it while the others
//!   keep working.
//! - `nats_host_sigtermed_under_load_*`: two hosts and a producer enqueueing all along; host a
//!   gets SIGTERM while it holds runs longer than its grace: it exits within the grace (plus the
//!   release), having finished or released everything it held, and host b finishes the rest.
//!
//! The end state must be: the store holds exactly the dispatches enqueued, every one `acked` by
//! one completion; each dispatch's `attempt` equals the failed claims the test knows of (claims
//! a killed host still held, seen in the store after it died; claims released at shutdown) plus
//! the failed runs the hosts logged (none expected); each thread's journal is well formed, each
//! dispatch's last run complete, and a dispatch started at most `attempt + 1` times (so a run
//! cut short is always one of its failed attempts). Each host runs under its own id per
//! incarnation, so a dead incarnation's claims are told apart from its successor's.
//!
//! Faults are placed by a seeded random source: the seed is printed, `HOMING_SEED=<n>` replays
//! the same fault schedule (the timing of the processes still varies), and `HOMING_SOAK=1`
//! runs more rounds over more work.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use homing::store::embedded::EmbeddedStore;
use homing::store::{Dispatch, Status, Store, SystemClock};

use crate::common::{Env, Rng, guest, seed, shared_cache_dir, signal, soak, toml_path};
use crate::hosts;
use crate::hosts::{
    AGENT, Host, acked, all, enqueue_journal, fill, finished, host_log, journals, open_nats,
    released, spawn_run,
};
use crate::natsd::NatsServer;

/// How long a journal run works between its two appends (the kill tests).
const WORK_MS: u64 = 10;
/// Threads the kill tests spread their dispatches over.
const THREADS: usize = 20;
/// Workers per host.
const CONCURRENCY: usize = 4;
/// The hosts' `shutdown_grace`.
const GRACE: Duration = Duration::from_secs(2);

/// `HOMING_SEED`, else a fresh one; printed either way so a failure can be replayed.
fn seeded(test: &str) -> Rng {
    let seed = seed();
    eprintln!("{test}: HOMING_SEED={seed}");
    Rng::new(seed)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A host config around a `[store]` section: short leases so a dead host's claims come back
/// quickly, and enough attempts that no amount of killing dead-letters anything.
fn config(store: &str) -> String {
    format!(
        r#"
[host]
lease = "2s"
sweep_interval = "200ms"
shutdown_grace = "{grace}s"
cache_dir = {cache}

{store}

[plugins.sandbox]
path = {path}
concurrency = {CONCURRENCY}
timeout = "60s"
max_attempts = 1000
"#,
        grace = GRACE.as_secs(),
        cache = toml_path(&shared_cache_dir()),
        path = toml_path(&guest(AGENT)),
    )
}

fn embedded_config() -> String {
    config("[store]\nbackend = \"embedded\"\npath = \"store.db\"")
}

fn nats_config(url: &str, prefix: &str) -> String {
    config(&format!(
        "[store]\nbackend = \"nats\"\nurl = \"{url}\"\nprefix = \"{prefix}\"\n\
         request_timeout = \"2s\"\nconnect_timeout = \"60s\""
    ))
}

/// The `claimed_by` of a host's claims.
fn consumer(host: &str) -> String {
    format!("{host}/{AGENT}")
}

/// Waits for a host process to exit, failing after `within`.
async fn exited(host: &mut Host, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = host.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "host process {} did not exit within {within:?}",
            host.id()
        );
        tokio::time::sleep(ms(10)).await;
    }
}

/// Waits until host `name` runs its workers (and listens for SIGTERM: before that, the signal
/// ends the process like any other).
async fn wait_running(env: &Env, name: &str, host: &mut Host) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !host_log(env, name).contains("homing host running") {
        assert!(
            Instant::now() < deadline && host.try_wait().unwrap().is_none(),
            "host {name} did not start: {}",
            host_log(env, name)
        );
        tokio::time::sleep(ms(20)).await;
    }
}

/// SIGKILLs a host and waits until it is gone.
async fn kill(host: &mut Host) {
    host.kill().unwrap();
    exited(host, Duration::from_secs(10)).await;
}

/// The claims of dead host incarnations, as seen in the store after they died. Each is a
/// failed attempt: the reclaim that ends it counts one.
#[derive(Default)]
struct Dead {
    /// By the dead incarnation's `claimed_by`: the dispatches seen claimed by it.
    held: BTreeMap<String, BTreeSet<String>>,
}

impl Dead {
    /// Host `host` is dead: from now on, its claims in the store are claims it died holding.
    fn died(&mut self, host: &str) {
        self.held.entry(consumer(host)).or_default();
    }

    fn observe(&mut self, records: &BTreeMap<String, Dispatch>) {
        for d in records.values() {
            if let Some(held) = d
                .claim
                .as_ref()
                .and_then(|c| self.held.get_mut(&c.claimed_by))
            {
                held.insert(d.id.clone());
            }
        }
    }

    fn held_by(&self, host: &str) -> usize {
        self.held.get(&consumer(host)).map_or(0, BTreeSet::len)
    }

    /// Per dispatch, how many dead incarnations held it.
    fn failed_claims(&self) -> BTreeMap<String, u32> {
        let mut out: BTreeMap<String, u32> = BTreeMap::new();
        for id in self.held.values().flatten() {
            *out.entry(id.clone()).or_default() += 1;
        }
        out
    }
}

/// Polls the store (noting dead hosts' claims) until at least `n` dispatches are acked. Fails
/// after a minute, or when a live host exits.
async fn wait_acked(
    store: &Store,
    n: usize,
    dead: &mut Dead,
    live: &mut [(String, Host)],
    env: &Env,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let records = all(store).await;
        dead.observe(&records);
        if acked(&records) >= n {
            return;
        }
        for (name, host) in live.iter_mut() {
            if let Some(status) = host.try_wait().unwrap() {
                panic!("host {name} exited ({status}): {}", host_log(env, name));
            }
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {n} dispatches acked after a minute",
            acked(&records)
        );
        tokio::time::sleep(ms(40)).await;
    }
}

/// Where the next kill goes, `now` dispatches acked and `rounds_left` kills to come: once
/// between a half and all of its share of the remaining work more is acked, so every such kill
/// follows progress, and work is left for the kills after it however fast the hosts go.
fn kill_target(rng: &mut Rng, n: usize, rounds_left: usize, now: usize) -> usize {
    let share = (n - now) / (rounds_left + 1);
    (now + 1 + share / 2 + rng.below(share as u64 / 2 + 1) as usize).min(n - 1)
}

/// The end state every test here checks (see the module doc).
struct Expected<'a> {
    ids: &'a [String],
    threads: Vec<String>,
    /// Failed claims the test caused and knows of, per dispatch.
    failed: BTreeMap<String, u32>,
    /// Every host's log.
    logs: Vec<String>,
    /// Every host exited cleanly, so every completion has its log line.
    clean: bool,
}

/// What the checked run looked like, for the test's output.
#[derive(Debug)]
struct Summary {
    attempts: u32,
    cut_runs: usize,
    reruns: usize,
}

async fn check(store: &Store, e: Expected<'_>) -> Summary {
    let records = all(store).await;
    let stored: BTreeSet<&String> = records.keys().collect();
    let wanted: BTreeSet<&String> = e.ids.iter().collect();
    assert_eq!(e.ids.len(), wanted.len(), "ids are unique");
    assert_eq!(stored, wanted, "the store holds exactly what was enqueued");
    for d in records.values() {
        assert_eq!(d.status, Status::Acked, "{d:?}");
        assert!(d.claim.is_none(), "{d:?}");
        assert_eq!(
            d.result.as_ref().map(|r| r.output.as_slice()),
            Some(&b"journaled"[..]),
            "{d:?}"
        );
    }

    // The hosts' own account of their runs.
    let mut failed_runs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut completions: BTreeMap<String, usize> = BTreeMap::new();
    for log in &e.logs {
        for (id, outcome) in finished(log) {
            if outcome == "completed" {
                *completions.entry(id).or_default() += 1;
            } else {
                failed_runs.entry(id).or_default().push(outcome);
            }
        }
    }
    if !failed_runs.is_empty() {
        eprintln!("runs the hosts logged as failed: {failed_runs:?}");
    }

    let runs = journals(store, &e.threads).await;
    let journaled: BTreeSet<&String> = runs.keys().collect();
    assert_eq!(journaled, wanted, "every dispatch journaled, nothing else");

    let mut summary = Summary {
        attempts: 0,
        cut_runs: 0,
        reruns: 0,
    };
    for id in e.ids {
        let d = &records[id];
        let done = completions.get(id).copied().unwrap_or(0);
        assert!(done <= 1, "{id} completed {done} times");
        if e.clean {
            assert_eq!(done, 1, "{id}: one completion, logged by its host");
        }
        let logged = failed_runs.get(id).map_or(0, Vec::len) as u32;
        let known = e.failed.get(id).copied().unwrap_or(0);
        let r = &runs[id];
        // A host killed right as it acked can have its ack already on the wire: the test's
        // read after the kill still sees the claim, and the ack lands after it. Then the
        // holder finished the only run there was (nothing ran twice, nothing was lost) and
        // the attempt is one fewer than the claims the test saw held at a death.
        let ack_in_flight = known > 0 && d.attempt + 1 == known + logged && r.starts == 1;
        assert!(
            d.attempt == known + logged || ack_in_flight,
            "{id}: attempts ({}) must be the failed claims: {known} known to the test (killed \
             or released holding it) and {logged} logged by hosts {:?}",
            d.attempt,
            failed_runs.get(id)
        );
        assert_eq!(r.thread, d.thread, "{id} journaled on another thread");
        assert!(r.last_complete, "{id}: its acked run is its last: {r:?}");
        assert!(
            r.starts as u32 <= d.attempt + 1,
            "{id} started {} times with {} failed attempts: a claim ran twice or two overlapped",
            r.starts,
            d.attempt
        );
        assert!(
            r.cut as u32 <= d.attempt,
            "{id}: {r:?}, attempt {}",
            d.attempt
        );
        summary.attempts += d.attempt;
        summary.cut_runs += r.cut;
        summary.reruns += r.starts - 1;
    }
    summary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_host_sigkilled_at_random_points_and_restarted_loses_nothing() {
    let started = Instant::now();
    let mut rng = seeded("embedded kills");
    let (n, rounds) = if soak() { (5000, 100) } else { (300, 6) };
    let env = Env::new(&embedded_config());
    let store = EmbeddedStore::open(&env.path().join("store.db"), Arc::new(SystemClock))
        .expect("open the embedded store")
        .store();
    let ids = fill(&store, n, THREADS, WORK_MS).await;

    let mut dead = Dead::default();
    let mut names = Vec::new();
    let mut incarnation = 0;
    for round in 0..rounds {
        // Sometimes a host is killed during start-up (loading the guest, opening the store,
        // its first claims), then its successor after progress.
        let startup_kill = rng.below(3) == 0;
        for startup in [true, false] {
            if startup && !startup_kill {
                continue;
            }
            let name = format!("emb{incarnation}");
            incarnation += 1;
            names.push(name.clone());
            let mut live = vec![(name.clone(), spawn_run(&env, &name))];
            let point = if startup {
                let wait = rng.below(600);
                tokio::time::sleep(ms(wait)).await;
                format!("{wait} ms after its start")
            } else {
                let now = acked(&all(&store).await);
                let target = kill_target(&mut rng, n, rounds - round, now);
                wait_acked(&store, target, &mut dead, &mut live, &env).await;
                let wait = rng.below(60);
                tokio::time::sleep(ms(wait)).await;
                format!("{wait} ms after {target} acked")
            };
            kill(&mut live[0].1).await;
            dead.died(&name);
            // One host at a time: what is claimed now stays claimed until the next host
            // reclaims it, and only dead hosts can hold it.
            let records = all(&store).await;
            dead.observe(&records);
            for d in records.values() {
                assert!(
                    d.claim
                        .as_ref()
                        .is_none_or(|c| dead.held.contains_key(&c.claimed_by)),
                    "claimed by no dead host: {d:?}"
                );
            }
            let held = dead.held_by(&name);
            assert!(held <= CONCURRENCY, "{name} held {held} claims");
            eprintln!(
                "round {round}: SIGKILLed {name} {point}, holding {held}; {} acked",
                acked(&records)
            );
        }
    }

    let mut last = spawn_run(&env, "final");
    names.push("final".into());
    hosts::wait_all_acked(&store, &ids, Duration::from_secs(120), &|| {
        host_log(&env, "final")
    })
    .await;
    wait_running(&env, "final", &mut last).await;
    signal(&last, "TERM");
    let status = exited(&mut last, Duration::from_secs(30)).await;
    assert!(status.success(), "{}", host_log(&env, "final"));

    let killed: usize = dead.held.values().map(BTreeSet::len).sum();
    assert!(
        killed > 0,
        "no kill caught a claim: the test tested nothing"
    );
    let summary = check(
        &store,
        Expected {
            ids: &ids,
            threads: (0..THREADS).map(|t| format!("t{t}")).collect(),
            failed: dead.failed_claims(),
            logs: names.iter().map(|h| host_log(&env, h)).collect(),
            clean: false,
        },
    )
    .await;
    eprintln!(
        "{incarnation} kills caught {killed} claims; {summary:?}; {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_hosts_sigkilled_at_random_points_and_restarted_lose_nothing() {
    let started = Instant::now();
    let mut rng = seeded("nats kills");
    let (n, rounds) = if soak() { (10_000, 100) } else { (600, 6) };
    let server = NatsServer::start();
    let url = server.url();
    let env = Env::new(&nats_config(&url, "kills"));
    let store = open_nats(std::slice::from_ref(&url), "kills", 1).await;
    let ids = fill(&store, n, THREADS, WORK_MS).await;

    let mut names: Vec<String> = Vec::new();
    let mut generation = [0usize; 3];
    let mut live: Vec<(String, Host)> = (0..3)
        .map(|i| {
            let name = format!("h{i}g0");
            names.push(name.clone());
            let host = spawn_run(&env, &name);
            (name, host)
        })
        .collect();
    let mut dead = Dead::default();
    for round in 0..rounds {
        let now = acked(&all(&store).await);
        let target = kill_target(&mut rng, n, rounds - round, now);
        wait_acked(&store, target, &mut dead, &mut live, &env).await;
        let wait = rng.below(100);
        tokio::time::sleep(ms(wait)).await;
        let i = rng.below(3) as usize;
        // Sometimes the restarted host is killed again while it starts.
        let again = rng.below(3) == 0;
        for restart in 0..=usize::from(again) {
            let (name, host) = &mut live[i];
            kill(host).await;
            dead.died(name);
            dead.observe(&all(&store).await);
            eprintln!(
                "round {round}: SIGKILLed {name} {}, holding {}",
                if restart == 0 {
                    format!("{wait} ms after {target} acked")
                } else {
                    "while it started".into()
                },
                dead.held_by(name)
            );
            generation[i] += 1;
            let next = format!("h{i}g{}", generation[i]);
            names.push(next.clone());
            live[i] = (next.clone(), spawn_run(&env, &next));
            if again && restart == 0 {
                tokio::time::sleep(ms(rng.below(600))).await;
            }
        }
    }

    // The hosts alive now finish the work.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let records = all(&store).await;
        dead.observe(&records);
        if acked(&records) == n {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} acked after two minutes; last hosts' logs:\n{}",
            acked(&records),
            live.iter()
                .map(|(name, _)| host_log(&env, name))
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(ms(100)).await;
    }
    for (name, host) in &mut live {
        wait_running(&env, name, host).await;
        signal(host, "TERM");
    }
    for (name, host) in &mut live {
        let status = exited(host, Duration::from_secs(30)).await;
        assert!(status.success(), "{name}: {}", host_log(&env, name));
    }

    for (host, held) in &dead.held {
        assert!(held.len() <= CONCURRENCY, "{host} held {held:?}");
    }
    let killed: usize = dead.held.values().map(BTreeSet::len).sum();
    assert!(
        killed > 0,
        "no kill caught a claim: the test tested nothing"
    );
    let summary = check(
        &store,
        Expected {
            ids: &ids,
            threads: (0..THREADS).map(|t| format!("t{t}")).collect(),
            failed: dead.failed_claims(),
            logs: names.iter().map(|h| host_log(&env, h)).collect(),
            clean: false,
        },
    )
    .await;
    eprintln!(
        "{} kills caught {killed} claims; {summary:?}; {:?}",
        dead.held.len(),
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_host_sigtermed_under_load_exits_within_its_grace_and_leaves_nothing_claimed() {
    const PRODUCER_THREADS: usize = 16;
    /// Runs longer than the grace: host a cannot finish them once stopped.
    const LONG_MS: u64 = 10_000;
    let started = Instant::now();
    let server = NatsServer::start();
    let url = server.url();
    let env = Env::new(&nats_config(&url, "term"));
    let store = open_nats(std::slice::from_ref(&url), "term", 1).await;

    let long = vec![
        enqueue_journal(&store, "long0", LONG_MS).await,
        enqueue_journal(&store, "long1", LONG_MS).await,
    ];
    // The producer: a short dispatch every 10 ms, round-robin over its threads, until told.
    let stop = Arc::new(AtomicBool::new(false));
    let produced = Arc::new(Mutex::new(Vec::<String>::new()));
    let producer = tokio::spawn({
        let (store, stop, produced) = (store.clone(), stop.clone(), produced.clone());
        async move {
            let mut pace = tokio::time::interval(ms(10));
            let mut k = 0;
            while !stop.load(Ordering::SeqCst) {
                pace.tick().await;
                let id = enqueue_journal(&store, &format!("p{}", k % PRODUCER_THREADS), 20).await;
                produced.lock().unwrap().push(id);
                k += 1;
            }
        }
    });
    let count = || produced.lock().unwrap().len();

    // Host a alone takes the two long runs (and short ones besides).
    let mut a = spawn_run(&env, "host-a");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let records = all(&store).await;
        let mut holds = true;
        for (i, id) in long.iter().enumerate() {
            holds &= records[id]
                .claim
                .as_ref()
                .is_some_and(|c| c.claimed_by == consumer("host-a"))
                && store.log.latest(&format!("long{i}")).await.unwrap() >= 1;
        }
        if holds {
            break;
        }
        assert!(
            Instant::now() < deadline && a.try_wait().unwrap().is_none(),
            "host a never started both long runs: {}",
            host_log(&env, "host-a")
        );
        tokio::time::sleep(ms(20)).await;
    }
    // Host b joins and completes work of its own.
    let mut b = spawn_run(&env, "host-b");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done = finished(&host_log(&env, "host-b"))
            .iter()
            .filter(|(_, outcome)| outcome == "completed")
            .count();
        if done >= 5 {
            break;
        }
        assert!(
            Instant::now() < deadline && b.try_wait().unwrap().is_none(),
            "host b did no work: {}",
            host_log(&env, "host-b")
        );
        tokio::time::sleep(ms(20)).await;
    }
    let held: BTreeSet<String> = all(&store)
        .await
        .values()
        .filter(|d| {
            d.claim
                .as_ref()
                .is_some_and(|c| c.claimed_by == consumer("host-a"))
        })
        .map(|d| d.id.clone())
        .collect();

    signal(&a, "TERM");
    let termed = Instant::now();
    let termed_at = store.now();
    let status = exited(&mut a, GRACE + Duration::from_secs(30)).await;
    let took = termed.elapsed();
    let log_a = host_log(&env, "host-a");
    assert!(status.success(), "host a: {status}\n{log_a}");
    assert!(log_a.contains("SIGTERM received"), "{log_a}");
    // In-flight runs get the grace; what is left then is released at once.
    assert!(
        took < GRACE + Duration::from_secs(3),
        "host a took {took:?} to stop with a grace of {GRACE:?}\n{log_a}"
    );
    let released: Vec<String> = released(&log_a);
    if !released.is_empty() {
        assert!(
            took >= GRACE,
            "released after {took:?}, before the grace ran out"
        );
    }
    // Nothing is left claimed by a: not even until its leases run out.
    let records = all(&store).await;
    let left: Vec<&Dispatch> = records
        .values()
        .filter(|d| {
            d.claim
                .as_ref()
                .is_some_and(|c| c.claimed_by.starts_with("host-a/"))
        })
        .collect();
    assert!(
        left.is_empty(),
        "still claimed by host a: {left:?}\n{log_a}"
    );
    // What a held when stopped, it finished or released; only the long runs could not finish.
    let finished_by_a: BTreeSet<String> = finished(&log_a)
        .into_iter()
        .filter(|(_, outcome)| outcome == "completed")
        .map(|(id, _)| id)
        .collect();
    for id in &held {
        assert!(
            finished_by_a.contains(id) || released.contains(id),
            "{id}: host a held it when stopped and neither finished nor released it\n{log_a}"
        );
    }
    for id in &released {
        assert!(
            long.contains(id),
            "a short run outlasted the grace: {id}\n{log_a}"
        );
        let d = &records[id];
        assert_eq!(d.attempt, 1, "the release counts an attempt: {d:?}");
    }
    // A long run that had more than the grace (and a margin) still to go when a was stopped
    // cannot have finished: it was released.
    for (i, id) in long.iter().enumerate() {
        let began = store.log.read(&format!("long{i}"), 0, 1).await.unwrap()[0].appended_at;
        if termed_at + GRACE.as_millis() as u64 + 1000 < began + LONG_MS {
            assert!(
                released.contains(id),
                "{id} began {} ms before SIGTERM and was not released\n{log_a}",
                termed_at.saturating_sub(began)
            );
        }
    }

    // The producer keeps going a while after a is gone; b takes everything.
    let at_exit = count();
    let deadline = Instant::now() + Duration::from_secs(60);
    while count() < at_exit + 50 {
        assert!(Instant::now() < deadline, "the producer stalled");
        tokio::time::sleep(ms(20)).await;
    }
    stop.store(true, Ordering::SeqCst);
    producer.await.unwrap();
    let mut ids = long.clone();
    ids.extend(produced.lock().unwrap().iter().cloned());
    hosts::wait_all_acked(&store, &ids, Duration::from_secs(120), &|| {
        host_log(&env, "host-b")
    })
    .await;
    signal(&b, "TERM");
    let status = exited(&mut b, Duration::from_secs(30)).await;
    assert!(status.success(), "host b: {}", host_log(&env, "host-b"));

    let mut failed: BTreeMap<String, u32> = BTreeMap::new();
    for id in &released {
        *failed.entry(id.clone()).or_default() += 1;
    }
    let mut threads: Vec<String> = (0..PRODUCER_THREADS).map(|t| format!("p{t}")).collect();
    threads.extend(["long0".to_owned(), "long1".to_owned()]);
    let summary = check(
        &store,
        Expected {
            ids: &ids,
            threads,
            failed,
            logs: vec![log_a, host_log(&env, "host-b")],
            clean: true,
        },
    )
    .await;
    eprintln!(
        "{} enqueued ({at_exit} when host a had stopped, {took:?} after SIGTERM, holding {}, \
         releasing {}); {summary:?}; {:?}",
        ids.len(),
        held.len(),
        released.len(),
        started.elapsed()
    );
}
