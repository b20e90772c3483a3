//! Guest fuzzing: the `fuzzer` (handler world) and `fuzzer-agent` (agent world) test guests
//! make random sequences of WIT calls with random and extreme arguments against a real
//! `homing run`, on the embedded store and on NATS JetStream (a real `nats-server`).
//!
//! Each dispatch's payload is `<seed>:<steps>`; each attempt logs a `FUZZSUM` line with what
//! it did and every outcome that broke the contract (see `tests/guests/fuzzer/src/fuzz.rs`).
//! The test then checks, against the store:
//!
//! - the host never panicked and exits cleanly on SIGTERM; it stayed up throughout;
//! - no call answered `internal`, and every outcome was one the contract allows (calls after
//!   settling: `lost-claim`, or `ok` for a repeat of the same settlement); a value over
//!   `max_payload` (an output, a log entry, a follow-up's payload, up to 1.5 MB) is `invalid`
//!   on both backends, before and after settling, never `unavailable`, and an oversized error
//!   text is kept cut, so its nack or dead-letter succeeds;
//! - every fuzzed dispatch ended terminal, as its last attempt's settlement says, with one
//!   summary per attempt and the result the guest recorded (a repeat `complete` changes
//!   nothing);
//! - each thread log is `1..=latest` without gaps, holds exactly the entries the guest was told
//!   it appended, and none appended at or after the call that settled its attempt;
//! - follow-ups carry the host's `enqueued-by` and `parent`, exactly as many as were accepted,
//!   capped in attempts and payload, and end acked unless delayed into the future;
//! - another plugin (`bystander`) in the same host keeps working, during the fuzz and after.
//!
//! `HOMING_SEED=<n>` replays a run (the seed base is printed); `HOMING_SOAK=1` runs ten times as
//! many dispatches with longer call sequences.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use homing::store::embedded::EmbeddedStore;
use homing::store::nats::{NatsConfig, NatsStore};
use homing::store::{Dispatch, NewDispatch, Status, Store, SystemClock};
use serde_json::Value;

use crate::common::{Env, guest, signal, toml_path, wait_exit};
use crate::hosts::all;
use crate::natsd::NatsServer;

const HANDLER: &str = "fuzzer";
const AGENT: &str = "fuzzer-agent";
const SINK: &str = "sink";
const BYSTANDER: &str = "bystander";
/// `[host] max_payload` ("4KiB", the guest's `MAX_PAYLOAD`).
const MAX_PAYLOAD: usize = 4096;
/// The sink's `max_attempts`: the cap of every follow-up's attempts.
const SINK_MAX_ATTEMPTS: u32 = 2;
/// A follow-up queued further out than this is a delayed one, not one left behind.
const DELAYED_MS: u64 = 5 * 60 * 1000;

/// How much to fuzz.
struct Scale {
    handler: usize,
    agent: usize,
    max_steps: u64,
    within: Duration,
}

fn scale() -> Scale {
    if std::env::var_os("HOMING_SOAK").is_some() {
        Scale {
            handler: 2_000,
            agent: 400,
            max_steps: 120,
            within: Duration::from_secs(1_800),
        }
    } else {
        Scale {
            handler: 400,
            agent: 80,
            max_steps: 50,
            within: Duration::from_secs(240),
        }
    }
}

/// The seed base: `HOMING_SEED`, else from the clock.
fn seed_base() -> u64 {
    if let Ok(text) = std::env::var("HOMING_SEED") {
        return text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("HOMING_SEED={text} is not a u64"));
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    splitmix(nanos ^ u64::from(std::process::id()))
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a 64, as the guest hashes outputs.
fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn config(store: &str) -> String {
    let plugin = |name: &str, wasm: &str, extra: &str| {
        format!(
            r#"
[plugins.{name}]
path = {path}
concurrency = 4
timeout = "60s"
memory = "96MiB"
max_attempts = 3
enqueue_to = ["{SINK}"]
{extra}
[plugins.{name}.retry]
initial = "10ms"
max = "50ms"
"#,
            path = toml_path(&guest(wasm)),
        )
    };
    format!(
        r#"
[host]
lease = "10s"
sweep_interval = "200ms"
shutdown_grace = "2s"
max_payload = "4KiB"
{store}
{handler}
{agent}
[plugins.{SINK}]
path = {echo}
concurrency = 2
max_attempts = {SINK_MAX_ATTEMPTS}

[plugins.{BYSTANDER}]
path = {echo}
concurrency = 1
"#,
        handler = plugin(HANDLER, "fuzzer", ""),
        agent = plugin(AGENT, "fuzzer_agent", "reuse_instance = 4"),
        echo = toml_path(&guest("echo")),
    )
}

/// A `homing run` killed when the test ends, passed or not.
struct Host(Child);

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn host_log(env: &Env) -> String {
    std::fs::read_to_string(env.path().join("host.log")).unwrap_or_default()
}

/// The last lines of the host log, for failure messages.
fn log_tail(env: &Env) -> String {
    let log = host_log(env);
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The thread name of primary dispatch `i`: plain, or odd (unicode, subject wildcards,
/// quotes, a backslash; names are printable, enqueue refuses control characters).
fn thread_name(i: usize) -> String {
    match i % 10 {
        3 => format!("fz-{i}-ü.*>~ 🙂"),
        7 => format!("fz-{i} %00 \\ \"quote\""),
        _ => format!("fz-{i}"),
    }
}

/// One attempt's summary, as logged.
#[derive(Debug, Clone)]
struct Summary {
    raw: String,
    v: Value,
}

impl Summary {
    fn id(&self) -> &str {
        self.v["id"].as_str().unwrap_or_default()
    }
    fn attempt(&self) -> u64 {
        self.v["attempt"].as_u64().unwrap_or(u64::MAX)
    }
    fn end(&self) -> &str {
        self.v["end"].as_str().unwrap_or_default()
    }
    fn num(&self, key: &str) -> u64 {
        self.v[key].as_u64().unwrap_or(0)
    }
    /// The call index that settled the attempt, if the guest settled it.
    fn settled_at(&self) -> Option<u64> {
        self.v["settle"]["at"].as_u64()
    }
    fn replay(&self) -> String {
        format!(
            "{} dispatch {} attempt {} (payload {}:{})",
            self.v["world"],
            self.id(),
            self.attempt(),
            self.v["seed"],
            self.v["steps"]
        )
    }
}

/// The JSON value after each `marker` in the log, with its raw text.
fn marked(log: &str, marker: &str) -> Vec<Summary> {
    let mut out = Vec::new();
    let needle = format!("{marker} ");
    let mut rest = log;
    while let Some(at) = rest.find(&needle) {
        rest = &rest[at + needle.len()..];
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        match stream.next() {
            Some(Ok(v)) => {
                let raw = rest[..stream.byte_offset()].to_owned();
                out.push(Summary { raw, v });
            }
            other => panic!(
                "a {marker} line does not parse ({other:?}): {}",
                &rest[..rest.len().min(300)]
            ),
        }
    }
    out
}

/// The attempts of each dispatch whose summary is in the log so far (the log may end in a
/// line being written: what does not parse yet is skipped).
fn reported_attempts(log: &str) -> BTreeMap<String, BTreeSet<u64>> {
    let mut out: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for line in log.lines() {
        let Some(at) = line.find("FUZZSUM ") else {
            continue;
        };
        let rest = &line[at + "FUZZSUM ".len()..];
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        if let Some(Ok(v)) = stream.next()
            && let (Some(id), Some(attempt)) = (v["id"].as_str(), v["attempt"].as_u64())
        {
            out.entry(id.to_owned()).or_default().insert(attempt);
        }
    }
    out
}

enum Backend {
    Embedded,
    Nats(NatsServer),
}

impl Backend {
    fn name(&self) -> &'static str {
        match self {
            Backend::Embedded => "embedded",
            Backend::Nats(_) => "nats",
        }
    }

    fn store_section(&self) -> String {
        match self {
            Backend::Embedded => String::new(),
            Backend::Nats(server) => format!(
                "[store]\nbackend = \"nats\"\nurl = \"{}\"\nprefix = \"fuzz\"\nrequest_timeout = \"5s\"\nconnect_timeout = \"30s\"\n",
                server.url()
            ),
        }
    }

    async fn open(&self, env: &Env) -> Store {
        match self {
            Backend::Embedded => {
                EmbeddedStore::open(&env.path().join("homing.db"), Arc::new(SystemClock))
                    .expect("open the embedded store")
                    .store()
            }
            Backend::Nats(server) => {
                let config = NatsConfig {
                    urls: vec![server.url()],
                    prefix: "fuzz".into(),
                    connect_timeout: Duration::from_secs(30),
                    ..NatsConfig::default()
                };
                NatsStore::open(&config, Arc::new(SystemClock))
                    .await
                    .expect("open the NATS store")
            }
        }
    }
}

/// What the test enqueued as one fuzzed dispatch.
struct Primary {
    agent: &'static str,
    thread: String,
    payload: String,
}

async fn fuzz(backend: Backend) {
    let started = Instant::now();
    let scale = scale();
    let base = seed_base();
    let name = backend.name();
    println!(
        "fuzz[{name}]: seed base {base} (replay with HOMING_SEED={base}); {} handler and {} agent dispatches, up to {} calls each",
        scale.handler, scale.agent, scale.max_steps
    );
    let env = Env::new(&config(&backend.store_section()));
    let store = backend.open(&env).await;

    // The fuzzed dispatches, each on a thread of its own.
    let mut primaries: BTreeMap<String, Primary> = BTreeMap::new();
    for i in 0..scale.handler + scale.agent {
        let seed = splitmix(base.wrapping_add(i as u64));
        let steps = splitmix(seed) % (scale.max_steps + 1);
        let agent = if i < scale.handler { HANDLER } else { AGENT };
        let thread = thread_name(i);
        let payload = format!("{seed}:{steps}");
        let d = store
            .mailbox
            .enqueue(
                NewDispatch::new(agent, thread.clone(), payload.clone())
                    .with_priority((seed >> 8) as u8)
                    .with_max_attempts(1 + (seed >> 16) as u32 % 3),
            )
            .await
            .expect("enqueue a fuzzed dispatch");
        primaries.insert(
            d.id,
            Primary {
                agent,
                thread,
                payload,
            },
        );
    }
    // Ordinary work for another plugin, served alongside.
    let mut bystanders = Vec::new();
    for k in 0..5 {
        let payload = format!("bystander {k}");
        let d = store
            .mailbox
            .enqueue(NewDispatch::new(
                BYSTANDER,
                format!("by-{k}"),
                payload.clone(),
            ))
            .await
            .expect("enqueue a bystander");
        bystanders.push((d.id, payload));
    }

    let log_file = std::fs::File::create(env.path().join("host.log")).unwrap();
    let mut host = Host(
        env.command(&["run"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("start homing run"),
    );

    // Wait until every fuzzed dispatch is terminal and every follow-up is terminal or delayed.
    let deadline = Instant::now() + scale.within;
    let mut dispatches;
    loop {
        if let Some(status) = host.0.try_wait().unwrap() {
            panic!(
                "fuzz[{name}] seed {base}: the host exited during the run: {status}\n{}",
                log_tail(&env)
            );
        }
        dispatches = all(&store).await;
        let now = store.now();
        let pending: Vec<&Dispatch> = dispatches
            .values()
            .filter(|d| {
                !d.status.is_terminal()
                    && (primaries.contains_key(&d.id)
                        || d.agent == BYSTANDER
                        || d.status == Status::Claimed
                        || d.available_at <= now + DELAYED_MS)
            })
            .collect();
        if pending.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "fuzz[{name}] seed {base}: {} dispatches still live after {:?}, e.g. {:?}\n{}",
            pending.len(),
            scale.within,
            pending
                .iter()
                .take(3)
                .map(|d| (&d.id, &d.agent, d.status, d.attempt))
                .collect::<Vec<_>>(),
            log_tail(&env)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every attempt's guest has logged its summary, its last act (an agent instance may still
    // hold settled claims while it waits in `claim-next`): only then may the host stop.
    loop {
        let reported = reported_attempts(&host_log(&env));
        let missing: Vec<&String> = primaries
            .keys()
            .filter(|id| {
                let d = &dispatches[*id];
                let want = (d.attempt + 1).min(d.max_attempts) as usize;
                reported.get(id.as_str()).map_or(0, BTreeSet::len) < want
            })
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "fuzz[{name}] seed {base}: no summary of every attempt of {} dispatches, e.g. {:?}\n{}",
            missing.len(),
            missing.iter().take(3).collect::<Vec<_>>(),
            log_tail(&env)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fuzzed_in = started.elapsed();

    // Another plugin of the same host still works normally after the fuzzing.
    let after = store
        .mailbox
        .enqueue(NewDispatch::new(BYSTANDER, "by-after", "after the fuzz"))
        .await
        .expect("enqueue the last bystander");
    bystanders.push((after.id, "after the fuzz".to_owned()));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let done = all(&store).await;
        if bystanders
            .iter()
            .all(|(id, _)| done.get(id).is_some_and(|d| d.status.is_terminal()))
        {
            dispatches = done;
            break;
        }
        assert!(
            Instant::now() < deadline,
            "fuzz[{name}] seed {base}: the bystander after the fuzz did not finish\n{}",
            log_tail(&env)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    signal(&host.0, "TERM");
    let status = wait_exit(&mut host.0, Duration::from_secs(30));
    let log = host_log(&env);
    assert!(
        status.success(),
        "fuzz[{name}] seed {base}: the host exited with {status}\n{}",
        log_tail(&env)
    );
    assert!(
        !log.contains("panicked"),
        "fuzz[{name}] seed {base}: a panic in the host log:\n{}",
        log.lines()
            .filter(|l| l.contains("panicked"))
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    );

    let mut failures: Vec<String> = Vec::new();
    for (id, payload) in &bystanders {
        let d = &dispatches[id];
        let output = d.result.as_ref().map(|r| r.output.clone());
        if d.status != Status::Acked || output.as_deref() != Some(payload.as_bytes()) {
            failures.push(format!(
                "bystander {id}: {} with output {output:?}, want acked with {payload:?}",
                d.status
            ));
        }
    }

    let summaries = marked(&log, "FUZZSUM");
    let runs = marked(&log, "FUZZRUN");
    check(
        &store,
        &primaries,
        &dispatches,
        &summaries,
        &runs,
        &mut failures,
    )
    .await;

    // What was exercised, for the record.
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    for s in summaries.iter().chain(runs.iter()) {
        if let Some(outcomes) = s.v["outcomes"].as_object() {
            for (k, v) in outcomes {
                *totals.entry(k.clone()).or_default() += v.as_u64().unwrap_or(0);
            }
        }
    }
    let calls: u64 = totals.values().sum();
    let followups = dispatches.values().filter(|d| d.agent == SINK).count();
    println!(
        "fuzz[{name}]: {} dispatches, {} attempts, {calls} calls, {followups} follow-ups; fuzzed in {:.1?}, {:.1?} in all",
        primaries.len(),
        summaries.len(),
        fuzzed_in,
        started.elapsed()
    );
    println!("fuzz[{name}]: outcomes {totals:?}");
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| (l.contains(" WARN ") || l.contains(" ERROR ")) && !l.contains(" guest:"))
        .collect();
    println!(
        "fuzz[{name}]: {} host warnings/errors, e.g. {:#?}",
        warnings.len(),
        warnings.iter().take(5).collect::<Vec<_>>()
    );

    assert!(
        failures.is_empty(),
        "fuzz[{name}] seed base {base} (replay with HOMING_SEED={base}): {} failures:\n{}",
        failures.len(),
        failures
            .iter()
            .take(30)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Every check of the summaries against the store; failures are collected, not thrown.
async fn check(
    store: &Store,
    primaries: &BTreeMap<String, Primary>,
    dispatches: &BTreeMap<String, Dispatch>,
    summaries: &[Summary],
    runs: &[Summary],
    failures: &mut Vec<String>,
) {
    // The guest's own checks: every outcome allowed, never `internal`.
    for s in summaries {
        let internal: u64 = s.v["outcomes"]
            .as_object()
            .map(|o| {
                o.iter()
                    .filter(|(k, _)| k.ends_with(":internal"))
                    .map(|(_, v)| v.as_u64().unwrap_or(0))
                    .sum()
            })
            .unwrap_or(0);
        if s.num("nviol") > 0 || internal > 0 {
            failures.push(format!(
                "{}: {} violations ({internal} internal): {}",
                s.replay(),
                s.num("nviol"),
                s.v["violations"]
            ));
        }
    }
    for r in runs {
        if r.v["violations"].as_array().is_some_and(|v| !v.is_empty()) {
            failures.push(format!("an agent run: {}", r.v["violations"]));
        }
    }

    // One summary per attempt, attempts 0..=last, and the end the last one promised.
    let mut by_id: BTreeMap<&str, Vec<&Summary>> = BTreeMap::new();
    for s in summaries {
        by_id.entry(s.id()).or_default().push(s);
    }
    for (id, primary) in primaries {
        let d = &dispatches[id];
        let Some(attempts) = by_id.get_mut(id.as_str()) else {
            failures.push(format!(
                "{} dispatch {id} (payload {}): no summary at all; it is {} after {} attempts: {:?}",
                primary.agent, primary.payload, d.status, d.attempt, d.last_error
            ));
            continue;
        };
        attempts.sort_by_key(|s| s.attempt());
        let numbers: Vec<u64> = attempts.iter().map(|s| s.attempt()).collect();
        let want: Vec<u64> = (0..numbers.len() as u64).collect();
        if numbers != want {
            failures.push(format!(
                "{} dispatch {id} (payload {}): attempts {numbers:?} reported, want {want:?}",
                primary.agent, primary.payload
            ));
            continue;
        }
        let last = attempts[attempts.len() - 1];
        let max = u64::from(d.max_attempts);
        let (status, attempt) = match last.end() {
            "ack" | "ret-ok" => (Status::Acked, last.attempt()),
            "dead" => (Status::DeadLetter, last.attempt()),
            "nack" | "ret-err" | "dropped" | "forgot" => (Status::DeadLetter, max),
            other => {
                failures.push(format!("{}: unknown end {other}", last.replay()));
                continue;
            }
        };
        if d.status != status || u64::from(d.attempt) != attempt {
            failures.push(format!(
                "{}: ended {} so the dispatch should be {status} at attempt {attempt}, but it is {} at attempt {} ({:?})",
                last.replay(),
                last.end(),
                d.status,
                d.attempt,
                d.last_error
            ));
            continue;
        }
        if d.thread != primary.thread || d.payload != primary.payload.as_bytes() {
            failures.push(format!(
                "dispatch {id}: thread or payload changed: {:?}",
                d.thread
            ));
        }
        // The result: the returned summary, or what the guest recorded before settling.
        let output = d.result.as_ref().map(|r| r.output.as_slice());
        match (last.end(), &last.v["result"]) {
            ("ret-ok", _) if output != Some(last.raw.as_bytes()) => {
                failures.push(format!(
                    "{}: the result is not the summary returned",
                    last.replay()
                ));
            }
            ("ack" | "dead", Value::Null) if output.is_some() => {
                failures.push(format!(
                    "{}: a result is recorded, the guest recorded none",
                    last.replay()
                ));
            }
            ("ack" | "dead", Value::String(hash)) if hash != "?" => {
                let got = output.map(|o| format!("{:016x}", fnv(o)));
                if got.as_deref() != Some(hash.as_str()) {
                    failures.push(format!(
                        "{}: the result hashes to {got:?}, the guest recorded {hash}",
                        last.replay()
                    ));
                }
            }
            _ => {}
        }
    }
    for s in summaries {
        if !primaries.contains_key(s.id()) {
            failures.push(format!("{}: not a dispatch the test enqueued", s.replay()));
        }
    }

    // Thread logs: gapless, only the guest's acknowledged entries, none after settling.
    for (id, primary) in primaries {
        let Some(attempts) = by_id.get(id.as_str()) else {
            continue;
        };
        let thread = &primary.thread;
        let mut entries = Vec::new();
        let mut after = 0;
        loop {
            let page = store.log.read(thread, after, 1000).await.expect("read log");
            let Some(last) = page.last() else { break };
            after = last.seq;
            entries.extend(page);
        }
        let latest = store.log.latest(thread).await.expect("latest");
        let seqs: Vec<u64> = entries.iter().map(|e| e.seq).collect();
        if seqs != (1..=latest).collect::<Vec<u64>>() {
            failures.push(format!(
                "thread {thread:?}: sequences are not 1..={latest}: {:?}",
                &seqs[..seqs.len().min(20)]
            ));
        }
        let mut empty = 0u64;
        let mut found: BTreeMap<u64, u64> = BTreeMap::new();
        for e in &entries {
            if e.data.is_empty() {
                empty += 1;
                continue;
            }
            let header: Vec<&[u8]> = e.data.splitn(5, |b| *b == b'|').collect();
            let parsed = match header.as_slice() {
                [b"fz", who, attempt, call, _] => std::str::from_utf8(attempt)
                    .ok()
                    .and_then(|a| a.parse::<u64>().ok())
                    .zip(
                        std::str::from_utf8(call)
                            .ok()
                            .and_then(|c| c.parse::<u64>().ok()),
                    )
                    .filter(|_| *who == id.as_bytes()),
                _ => None,
            };
            let Some((attempt, call)) = parsed else {
                failures.push(format!(
                    "thread {thread:?}: entry {} was not appended by this thread's holder: {:?}",
                    e.seq,
                    String::from_utf8_lossy(&e.data[..e.data.len().min(80)])
                ));
                continue;
            };
            *found.entry(attempt).or_default() += 1;
            match attempts.iter().find(|s| s.attempt() == attempt) {
                None => failures.push(format!(
                    "thread {thread:?}: entry {} from attempt {attempt}, which never reported",
                    e.seq
                )),
                Some(s) => {
                    if s.settled_at().is_some_and(|at| call >= at) {
                        failures.push(format!(
                            "{}: entry {} appended by call {call}, at or after settling at call {:?}",
                            s.replay(),
                            e.seq,
                            s.settled_at()
                        ));
                    }
                }
            }
        }
        for s in attempts {
            let got = found.get(&s.attempt()).copied().unwrap_or(0);
            let (ok, slack) = (s.num("appends"), s.num("amb_appends"));
            if got < ok || got > ok + slack {
                failures.push(format!(
                    "{}: {got} entries in the log, the guest was told {ok} appends succeeded (+{slack} ambiguous)",
                    s.replay()
                ));
            }
        }
        let want_empty: u64 = attempts.iter().map(|s| s.num("empty")).sum();
        let slack: u64 = attempts.iter().map(|s| s.num("amb_appends")).sum();
        if empty < want_empty || empty > want_empty + slack {
            failures.push(format!(
                "thread {thread:?}: {empty} empty entries, the guest appended {want_empty}"
            ));
        }
    }

    // Follow-ups: stamped by the host, capped, as many as were accepted, served.
    let mut children: BTreeMap<&str, u64> = BTreeMap::new();
    let now = store.now();
    for d in dispatches.values().filter(|d| d.agent == SINK) {
        let by = d.metadata.get("enqueued-by").map(String::as_str);
        if by != Some(HANDLER) && by != Some(AGENT) {
            failures.push(format!("follow-up {}: enqueued-by is {by:?}", d.id));
        }
        if let Some(parent) = d.metadata.get("parent")
            && primaries.contains_key(parent)
        {
            *children.entry(parent.as_str()).or_default() += 1;
        }
        if d.max_attempts == 0 || d.max_attempts > SINK_MAX_ATTEMPTS {
            failures.push(format!(
                "follow-up {}: max_attempts {} outside 1..={SINK_MAX_ATTEMPTS}",
                d.id, d.max_attempts
            ));
        }
        if d.payload.len() > MAX_PAYLOAD || d.thread.trim().is_empty() || d.thread.len() > 256 {
            failures.push(format!(
                "follow-up {}: payload of {} bytes on thread {:?} got past the caps",
                d.id,
                d.payload.len(),
                d.thread
            ));
        }
        let delayed = d.status == Status::Queued && d.available_at > now + DELAYED_MS;
        if d.status != Status::Acked && !delayed {
            failures.push(format!(
                "follow-up {}: {} ({:?}), want acked (or queued far ahead)",
                d.id, d.status, d.last_error
            ));
        }
        if delayed && d.available_at > now + 31 * 24 * 3600 * 1000 {
            failures.push(format!(
                "follow-up {}: available only at {}, past the 30-day cap",
                d.id, d.available_at
            ));
        }
    }
    for (id, attempts) in &by_id {
        let ok: u64 = attempts.iter().map(|s| s.num("cenq")).sum();
        let slack: u64 = attempts.iter().map(|s| s.num("amb_cenq")).sum();
        let got = children.get(id).copied().unwrap_or(0);
        if got < ok || got > ok + slack {
            failures.push(format!(
                "dispatch {id}: {got} follow-ups name it as parent, {ok} claim.enqueue calls succeeded (+{slack} ambiguous)"
            ));
        }
    }
    let agents: BTreeSet<&str> = dispatches.values().map(|d| d.agent.as_str()).collect();
    for agent in agents {
        if ![HANDLER, AGENT, SINK, BYSTANDER].contains(&agent) {
            failures.push(format!("a dispatch for agent {agent:?} exists"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzzed_guests_on_the_embedded_store_break_no_rule() {
    fuzz(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzzed_guests_on_nats_break_no_rule() {
    fuzz(Backend::Nats(NatsServer::start())).await;
}

/// Regression tests for what the fuzzer found, calling the host side of the imports directly.
mod found {
    use std::sync::{Arc, Mutex};

    use homing::claim::StopReason;
    use homing::config::PluginConfig;
    use homing::runtime::bindings::mailbox::HostClaim;
    use homing::runtime::bindings::{EnqueueRequest, GuestError};
    use homing::runtime::host::{ClaimHandle, GuestState, LogState, PluginContext};
    use homing::store::embedded::EmbeddedStore;
    use homing::store::{ListFilter, ManualClock, NewDispatch, Store};
    use wasmtime::component::Resource;
    use wasmtime_wasi::WasiCtxBuilder;

    /// A plugin `agent` that may enqueue to `helper`, one instance, and one claim it holds.
    async fn holding_a_claim() -> (Store, GuestState, u32) {
        let store = EmbeddedStore::open_in_memory(ManualClock::new(1_000_000))
            .unwrap()
            .store();
        let config: PluginConfig =
            toml::from_str("path = \"agent.wasm\"\nenqueue_to = [\"helper\"]\n").unwrap();
        let ctx = Arc::new(PluginContext {
            name: "agent".into(),
            targets: vec![("helper".into(), 3)],
            target_keys: Default::default(),
            target_debounce: Default::default(),
            config,
            store: store.clone(),
            consumer: "test-host/agent".into(),
            lease: std::time::Duration::from_secs(30),
            max_payload: 1024,
            config_dir: ".".into(),
            values: Default::default(),
            tls_ca: Vec::new(),
            hosts: Default::default(),
            shutdown: Default::default(),
            public_url: None,
            live: homing::live::Hub::new(&store, Default::default()),
            limits: Default::default(),
            origin_limits: Vec::new(),
            models: Vec::new(),
            drain_timeout: std::time::Duration::from_secs(30),
            offer: Default::default(),
            retired: Default::default(),
        });
        let mut guest = GuestState::new(
            WasiCtxBuilder::new().build(),
            ctx.clone(),
            Arc::new(Mutex::new(LogState::default())),
        );
        store
            .mailbox
            .enqueue(NewDispatch::new("agent", "t", "payload"))
            .await
            .unwrap();
        let claim: ClaimHandle = homing::claim::claim_for(&ctx.claimer())
            .await
            .unwrap()
            .unwrap();
        let rep = guest.table().push(claim).unwrap().rep();
        (store, guest, rep)
    }

    fn borrow(rep: u32) -> Resource<ClaimHandle> {
        Resource::new_borrow(rep)
    }

    fn follow_up() -> EnqueueRequest {
        EnqueueRequest {
            agent: "helper".into(),
            thread: None,
            payload: b"x".to_vec(),
            metadata: vec![],
            priority: None,
            delay_ms: None,
            dedupe_key: None,
            max_attempts: None,
            concurrency_key: None,
            debounce: None,
        }
    }

    async fn helpers(store: &Store) -> usize {
        store
            .mailbox
            .list(&ListFilter {
                agent: Some("helper".into()),
                ..ListFilter::default()
            })
            .await
            .unwrap()
            .len()
    }

    /// Found by the fuzzer (every seed): `claim.enqueue` after the guest settled the claim
    /// (complete, ack, nack or dead-letter) still enqueued the follow-up.
    #[tokio::test]
    async fn a_settled_claim_enqueues_nothing() {
        for settle in ["complete", "ack", "nack", "dead-letter"] {
            let (store, mut guest, rep) = holding_a_claim().await;
            let before = HostClaim::enqueue(&mut guest, borrow(rep), follow_up())
                .await
                .unwrap();
            assert!(before.is_ok(), "{settle}: {before:?}");
            let settled = match settle {
                "complete" => guest.complete(borrow(rep), b"done".to_vec()).await,
                "ack" => guest.ack(borrow(rep)).await,
                "nack" => guest.nack(borrow(rep), "again".into(), None).await,
                _ => guest.dead_letter(borrow(rep), "give up".into()).await,
            };
            settled.unwrap().unwrap();
            let after = HostClaim::enqueue(&mut guest, borrow(rep), follow_up())
                .await
                .unwrap();
            assert!(
                matches!(after, Err(GuestError::LostClaim(_))),
                "{settle}: {after:?}"
            );
            assert_eq!(
                helpers(&store).await,
                1,
                "{settle}: only the first follow-up"
            );
        }
    }

    /// The same fence when the host asked the guest to stop: lease lost, thread interrupted.
    #[tokio::test]
    async fn a_claim_told_to_stop_enqueues_nothing() {
        for (reason, lost) in [
            (StopReason::LeaseLost, true),
            (StopReason::Interrupted, false),
        ] {
            let (store, mut guest, rep) = holding_a_claim().await;
            guest
                .table()
                .get(&borrow(rep))
                .unwrap()
                .control()
                .request_stop(reason);
            let out = HostClaim::enqueue(&mut guest, borrow(rep), follow_up())
                .await
                .unwrap();
            match out {
                Err(GuestError::LostClaim(_)) if lost => {}
                Err(GuestError::Interrupted(_)) if !lost => {}
                other => panic!("{reason:?}: {other:?}"),
            }
            assert_eq!(helpers(&store).await, 0, "{reason:?}");
        }
    }

    /// Found by the fuzzer (every seed): `read-log` with `limit` 0 returned one entry.
    #[tokio::test]
    async fn read_log_returns_at_most_limit_entries_and_none_for_zero() {
        let (_store, mut guest, rep) = holding_a_claim().await;
        for entry in ["one", "two", "three"] {
            guest
                .append(borrow(rep), entry.as_bytes().to_vec())
                .await
                .unwrap()
                .unwrap();
        }
        for (after, limit, want) in [
            (0, 0, 0),
            (0, 1, 1),
            (0, 2, 2),
            (1, 0, 0),
            (0, u32::MAX, 3),
            (u64::MAX, 5, 0),
        ] {
            let got = guest
                .read_log(borrow(rep), after, limit)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(got.len(), want, "read-log after {after} limit {limit}");
        }
    }
}
