//! Reads whose cost is set by stored data: each route holds a bounded number of bytes
//! whatever the data, and concurrent readers of large data do not multiply it.
//!
//! Against a real `homing run`, the host's peak resident memory (`VmHWM` in
//! `/proc/PID/status`, as `bounded_input` watches it) is read after one reader of each route,
//! then after rounds of a few, then of many readers at once; it must not grow by more than a
//! stated bound, nor grow with the number of readers. The data are written through the host's
//! store by the test (the SQLite file opened a second time, as `journal_view` and `waitpoints`
//! do): a dispatch of an agent the host does not serve (so only the test claims it) with a
//! journal near the default `journal_max_bytes`, and a dispatch with many waitpoints completed
//! with large results.
//!
//! The store-level reads behind the routes (`Journal::journal_page`, `call_entry`,
//! `Waitpoints::read_waitpoints`) are checked on both backends: pages that end at their byte
//! bound and go on from there, the same entries and totals as a whole load.
//!
//! The helpers are general, for any route: [`peak_kib`], [`rss_kib`], [`Served`] (a host
//! started with a pinned allocator, [`ALLOCATOR`]), [`Readers`] (concurrent GETs with a token
//! or a dashboard session), [`measure`].

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use homing::store::embedded::EmbeddedStore;
use homing::store::journal::{JournalAsk, identity};
use homing::store::nats::{NatsConfig, NatsStore};
use homing::store::waitpoints::{mint_token, token_digest};
use homing::store::{
    CallEntry, CallKind, Fence, NewDispatch, NewStep, NewWaitpoint, Store, SystemClock,
    WaitpointFilter,
};
use reqwest::header;
use serde_json::{Value, json};

use crate::api::{OPERATOR, PRODUCER, READER, TOKENS};
use crate::common::{Env, guest, toml_path};
use crate::hosts::Host;
use crate::natsd::{NatsServer, free_port};
use crate::waitpoints::AGENT;

const MIB: usize = 1 << 20;

/// The peak resident memory of process `pid` (`VmHWM`), in KiB.
pub(crate) fn peak_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

/// The resident memory of process `pid` now (`VmRSS`), in KiB.
pub(crate) fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// The environment a measured host runs with: glibc's malloc keeps what big allocations
/// freed in each of its arenas (up to twice its largest freed mapping, several MiB, per
/// arena) and makes up to eight arenas per core, one per thread that allocates, so the
/// resident memory of a process that reads large values on many threads depends on the
/// machine's cores. Two arenas make the figure the host's own: what it holds at once.
pub(crate) const ALLOCATOR: &[(&str, &str)] = &[("MALLOC_ARENA_MAX", "2")];

/// The config of a test host on the embedded store: the API on `port` with the tokens of
/// [`TOKENS`], a request time long enough for many readers at once; `extra_host` goes in
/// `[host]`, `extra` at the end.
pub(crate) fn host_config(port: u16, extra_host: &str, extra: &str) -> String {
    format!(
        r#"
[host]
lease = "5s"
sweep_interval = "200ms"
shutdown_grace = "2s"
max_payload = "64KiB"
{extra_host}

[api]
listen = "127.0.0.1:{port}"
request_timeout = "60s"
{TOKENS}

[plugins.echo]
path = {echo}
{extra}
"#,
        echo = toml_path(&guest("echo")),
    )
}

/// A running `homing run` with its API (as `api::Api`, whose tokens it has), started with
/// more variables in its environment; killed when dropped.
pub(crate) struct Served {
    pub(crate) env: Env,
    host: Host,
    pub(crate) base: String,
}

impl Served {
    /// Starts a host with the config `config(port)` makes and `vars` in its environment, and
    /// waits until `/readyz` says ready.
    pub(crate) async fn start(config: impl FnOnce(u16) -> String, vars: &[(&str, &str)]) -> Served {
        let port = free_port();
        let env = Env::new(&config(port));
        std::fs::write(env.path().join("operator.token"), format!("{OPERATOR}\n")).unwrap();
        let log = std::fs::File::create(env.path().join("host.log")).unwrap();
        let mut cmd = env.command(&["run"]);
        cmd.env("HOMING_TEST_READER", READER)
            .env("HOMING_TEST_PRODUCER", PRODUCER)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        for (name, value) in vars {
            cmd.env(name, value);
        }
        let served = Served {
            host: Host(cmd.spawn().unwrap()),
            env,
            base: format!("http://127.0.0.1:{port}"),
        };
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = client.get(served.url("/readyz")).send().await
                && r.status() == 200
            {
                return served;
            }
            assert!(
                Instant::now() < deadline,
                "the API did not get ready:\n{}",
                served.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The host's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.host.0.id()
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub(crate) fn path(&self) -> &Path {
        self.env.path()
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.env.path().join("host.log")).unwrap_or_default()
    }
}

/// What one GET answered: its status and the body's length.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) bytes: usize,
}

/// Readers of a host's routes: `/v1` with the reader token, any other path with a dashboard
/// session of it.
#[derive(Clone)]
pub(crate) struct Readers {
    client: reqwest::Client,
    base: String,
    cookie: String,
}

impl Readers {
    /// Readers of the host at `base` (`http://127.0.0.1:PORT`), logged in to its dashboard.
    pub(crate) async fn new(base: &str) -> Readers {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let r = client
            .post(format!("{base}/login"))
            .form(&[("token", READER)])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 303, "the reader token logs in");
        let cookie = r.headers()[header::SET_COOKIE].to_str().unwrap();
        let cookie = cookie.split(';').next().unwrap().to_owned();
        Readers {
            client,
            base: base.to_owned(),
            cookie,
        }
    }

    /// `GET path`: what it answered, and the body.
    pub(crate) async fn get(&self, path: &str) -> (Answer, bytes::Bytes) {
        let request = self.client.get(format!("{}{path}", self.base));
        let request = if path.starts_with("/v1/") {
            request.bearer_auth(READER)
        } else {
            request.header(header::COOKIE, &self.cookie)
        };
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let body = response.bytes().await.unwrap();
        let answer = Answer {
            status,
            bytes: body.len(),
        };
        (answer, body)
    }

    /// `GET path` as JSON, expecting 200.
    pub(crate) async fn json(&self, path: &str) -> Value {
        let (answer, body) = self.get(path).await;
        assert_eq!(
            answer.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&body[..body.len().min(500)])
        );
        serde_json::from_slice(&body).unwrap()
    }

    /// `rounds` rounds of `each` concurrent GETs of every path in `paths` (all of a round at
    /// once): every answer, with its path.
    pub(crate) async fn storm(
        &self,
        paths: &[String],
        each: usize,
        rounds: usize,
    ) -> Vec<(String, Answer)> {
        let mut out = Vec::new();
        for _ in 0..rounds {
            let mut calls = Vec::new();
            for path in paths {
                for _ in 0..each {
                    let (readers, path) = (self.clone(), path.clone());
                    calls.push(tokio::spawn(async move {
                        let (answer, _) = readers.get(&path).await;
                        (path, answer)
                    }));
                }
            }
            for call in calls {
                out.push(call.await.unwrap());
            }
        }
        out
    }
}

/// Storms `paths` ([`Readers::storm`], `each` readers of each at once, `rounds` times) and
/// reads the host's peak memory after (KiB); every answer must be 200.
pub(crate) async fn measure(
    pid: u32,
    readers: &Readers,
    paths: &[String],
    each: usize,
    rounds: usize,
) -> (u64, Vec<(String, Answer)>) {
    let started = Instant::now();
    let answers = readers.storm(paths, each, rounds).await;
    let peak = peak_kib(pid);
    eprintln!(
        "{} readers at once ({each} of each of {} paths), {rounds} rounds in {:?}: peak {peak} KiB \
         after, resident {} KiB",
        each * paths.len(),
        paths.len(),
        started.elapsed(),
        rss_kib(pid)
    );
    let failed: Vec<_> = answers.iter().filter(|(_, a)| a.status != 200).collect();
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    (peak, answers)
}

/// A claimed dispatch of [`AGENT`] on `thread` (its run started when `started`): its fence.
async fn claimed(store: &Store, thread: &str, started: bool) -> Fence {
    let d = store
        .mailbox
        .enqueue(NewDispatch::new(AGENT, thread, b"ask".to_vec()))
        .await
        .unwrap();
    let mut claimed = store
        .mailbox
        .claim_dispatch(&d.id, "test-worker", 600_000)
        .await
        .unwrap()
        .expect("the seeded dispatch is claimable");
    if started {
        let token = claimed.token().unwrap().to_owned();
        claimed = store
            .mailbox
            .record_start(&claimed.id, &token)
            .await
            .unwrap();
    }
    Fence::of(&claimed).unwrap()
}

/// A body of `len` bytes: text (`a`...) when `text`, else bytes that are not UTF-8.
pub(crate) fn body(len: usize, text: bool) -> Vec<u8> {
    if text {
        vec![b'a'; len]
    } else {
        (0..len).map(|i| (i % 251) as u8 | 0x80).collect()
    }
}

/// A dispatch whose journal holds `entries` http entries of `size` bytes of body each (text
/// and binary in turn) and the steps `steps`: its id.
pub(crate) async fn large_journal(
    store: &Store,
    thread: &str,
    entries: u32,
    size: usize,
    steps: &[&str],
) -> String {
    let fence = claimed(store, thread, false).await;
    for pos in 0..entries {
        let entry = CallEntry::new(
            &fence.dispatch,
            pos,
            CallKind::Http,
            identity([format!("call {pos}").as_bytes()]),
            json!({
                "method": "POST",
                "url": "https://api.example/v1/chat",
                "status": 200,
                "headers": [["content-type", "text/plain"]],
            }),
            Some(body(size, pos % 2 == 0)),
            1,
            0,
            1_000,
        );
        store.journal.record(&fence, entry).await.unwrap();
    }
    for key in steps {
        let step = NewStep {
            key: (*key).to_owned(),
            value: b"\"done\"".to_vec(),
            claim: 1,
            attempt: 0,
        };
        store.journal.put_step(&fence, step).await.unwrap();
    }
    fence.dispatch
}

/// A dispatch of [`AGENT`] on `thread` with `count` waitpoints, suspended, then each completed
/// with a result of `size` bytes (text and binary in turn): its id.
pub(crate) async fn large_waitpoints(
    store: &Store,
    thread: &str,
    count: usize,
    size: usize,
) -> String {
    let fence = claimed(store, thread, true).await;
    let mut ids = Vec::new();
    for i in 0..count {
        let created = store
            .waitpoints
            .create_waitpoint(
                &fence,
                NewWaitpoint {
                    name: format!("w{i:03}"),
                    timeout_ms: 3_600_000,
                    metadata: [("i".to_owned(), i.to_string())].into(),
                    token_digest: token_digest(&mint_token().unwrap()),
                },
            )
            .await
            .unwrap();
        ids.push(created.waitpoint.id);
    }
    let suspended = store
        .mailbox
        .suspend(&fence.dispatch, &fence.token, 100)
        .await
        .unwrap();
    assert_eq!(suspended.status.as_str(), "waiting");
    for (i, id) in ids.iter().enumerate() {
        store
            .waitpoints
            .complete_waitpoint(id, body(size, i % 2 == 0), "operator:test")
            .await
            .unwrap();
    }
    fence.dispatch
}

/// The journal list and one entry (`GET /v1/dispatches/{id}/journal[/{pos}]`), the waitpoint
/// list (`GET /v1/waitpoints`, of a dispatch and of every one) and the dashboard's page of
/// each dispatch, over a journal of five 3 MiB bodies (15 MiB, near the default
/// `journal_max_bytes`) and 48 waitpoints with 1 MiB results. Every answer is whole (the
/// entries carry their bodies, the lists stay under the page cap and page on); 4 readers of
/// each path at once, then 16, three rounds each, grow the host's peak memory by less than
/// 64 MiB over one reader of each, and the 16 by less than 32 MiB over the 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_readers_of_a_large_journal_and_waitpoints_keep_memory_flat() {
    let host = Served::start(|port| host_config(port, "", ""), ALLOCATOR).await;
    let pid = host.pid();
    let started_kib = peak_kib(pid);
    let store = EmbeddedStore::open(&host.path().join("homing.db"), Arc::new(SystemClock))
        .unwrap()
        .store();
    let journal = large_journal(&store, "br-journal", 5, 3 * MIB, &["plan", "summary"]).await;
    let waiting = large_waitpoints(&store, "br-waitpoints", 48, MIB).await;
    let readers = Readers::new(&host.base).await;

    // What each route answers, whole.
    let list = readers
        .json(&format!("/v1/dispatches/{journal}/journal?limit=1000"))
        .await;
    let sizes: Vec<u64> = list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["body_size"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, vec![3 * MIB as u64; 5], "{list}");
    assert_eq!(list["steps"].as_array().unwrap().len(), 2, "{list}");
    assert_eq!(list["more_steps"], false, "{list}");
    assert_eq!(list["next_cursor"], Value::Null, "{list}");
    assert!(list["bytes"].as_u64().unwrap() > 15 * MIB as u64, "{list}");
    for pos in 0..2 {
        let entry = readers
            .json(&format!("/v1/dispatches/{journal}/journal/{pos}"))
            .await;
        let text = entry["body"].as_str().unwrap();
        assert_eq!(entry["body_size"], 3 * MIB, "{pos}");
        if pos == 0 {
            assert_eq!(text.len(), 3 * MIB);
            assert!(entry.get("encoding").is_none());
        } else {
            assert_eq!(entry["encoding"], "base64");
            assert_eq!(text.len(), (3 * MIB).div_ceil(3) * 4);
        }
    }
    let mut seen = 0;
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/waitpoints?dispatch={waiting}&limit=1000&cursor={c}"),
            None => format!("/v1/waitpoints?dispatch={waiting}&limit=1000"),
        };
        let (answer, page) = readers.get(&path).await;
        assert_eq!(answer.status, 200);
        assert!(answer.bytes <= 2 * MIB, "{} bytes", answer.bytes);
        let page: Value = serde_json::from_slice(&page).unwrap();
        let rows = page["waitpoints"].as_array().unwrap();
        assert!(!rows.is_empty());
        for row in rows {
            assert_eq!(row["name"], format!("w{seen:03}"));
            assert!(row["result"].is_string() || row["result"]["base64"].is_string());
            seen += 1;
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.replace(':', "%3A")),
            None => break,
        }
    }
    assert_eq!(seen, 48, "every waitpoint once");

    let paths: Vec<String> = vec![
        format!("/v1/dispatches/{journal}/journal?limit=1000"),
        format!("/v1/dispatches/{journal}/journal/0"),
        format!("/v1/dispatches/{journal}/journal/3"),
        format!("/v1/waitpoints?dispatch={waiting}&limit=1000"),
        "/v1/waitpoints?limit=1000".to_owned(),
        format!("/dispatches/{journal}"),
        format!("/dispatches/{waiting}"),
    ];
    for path in &paths {
        let (answer, _) = readers.get(path).await;
        assert_eq!(answer.status, 200, "{path}");
    }
    let single_kib = peak_kib(pid);
    let (few_kib, _) = measure(pid, &readers, &paths, 4, 3).await;
    let (many_kib, answers) = measure(pid, &readers, &paths, 16, 3).await;
    let mib = |kib: u64| kib as f64 / 1024.0;
    eprintln!(
        "host peak memory: {:.1} MiB started, {:.1} MiB after one reader of each path, \
         {:.1} MiB after 4 of each at once, {:.1} MiB after 16 of each: +{:.1} MiB",
        mib(started_kib),
        mib(single_kib),
        mib(few_kib),
        mib(many_kib),
        mib(many_kib.saturating_sub(single_kib))
    );
    for (path, answer) in &answers {
        if path.contains("/journal/") {
            assert!(answer.bytes > 3 * MIB, "{path}: {} bytes", answer.bytes);
        } else if path.starts_with("/v1/") {
            assert!(answer.bytes <= 2 * MIB, "{path}: {} bytes", answer.bytes);
        }
    }
    assert!(
        many_kib.saturating_sub(single_kib) < 64 * 1024,
        "the readers took the host's peak from {single_kib} KiB to {many_kib} KiB"
    );
    assert!(
        many_kib.saturating_sub(few_kib) < 32 * 1024,
        "16 readers of each took the host's peak from {few_kib} KiB (4 of each) to {many_kib} KiB"
    );
    // The host still answers at once.
    let started = Instant::now();
    let (answer, _) = readers.get("/v1/waitpoints?limit=1").await;
    assert_eq!(answer.status, 200);
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// The store-level reads behind the routes on `store`: journal pages by limit and by bytes
/// with the same entries and totals as a whole load, one entry with its body, waitpoint pages
/// by bytes that go on from their last one, without results when asked.
async fn store_reads_are_bounded(store: &Store, body_size: usize, result_size: usize) {
    use homing::store::journal::{CallSummary, SUMMARY_ROOM};

    let keys: Vec<String> = (0..40).map(|i| format!("step-{i:02}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let id = large_journal(store, "br-store", 6, body_size, &keys).await;
    let whole = store.journal.load_journal(&id).await.unwrap();
    let ask =
        |after: Option<u32>, limit: usize, max_bytes: usize, max_step_bytes: usize| JournalAsk {
            after,
            limit,
            max_bytes,
            max_step_bytes,
        };
    let page = |ask: JournalAsk| {
        let id = id.clone();
        async move { store.journal.journal_page(&id, &ask).await.unwrap() }
    };
    let positions = |p: &homing::store::journal::JournalPage| -> Vec<u32> {
        p.calls.iter().map(|c| c.entry.pos).collect()
    };

    // Everything: the whole load's entries without bodies, its steps without values.
    let all = page(ask(None, 1000, usize::MAX, usize::MAX)).await;
    assert_eq!(positions(&all), vec![0, 1, 2, 3, 4, 5]);
    assert!(!all.more && !all.more_steps);
    for (listed, loaded) in all.calls.iter().zip(&whole.calls) {
        assert_eq!(*listed, CallSummary::of(loaded.clone()));
        assert_eq!(listed.body_size, Some(body_size as u64));
        assert_eq!(listed.entry.body, None);
    }
    assert_eq!(all.steps.len(), 40);
    for (listed, loaded) in all.steps.iter().zip(&whole.steps) {
        assert_eq!(listed.key, loaded.key);
        assert_eq!(listed.size, loaded.size);
        assert!(listed.value.is_empty());
    }
    assert_eq!((all.call_count, all.step_count), (6, 40));
    assert_eq!(all.bytes, whole.bytes());

    // Pages by limit, then by bytes (the first entry whatever its size).
    let first = page(ask(None, 4, usize::MAX, 0)).await;
    assert_eq!(positions(&first), vec![0, 1, 2, 3]);
    assert!(first.more);
    assert!(
        first.steps.is_empty() && !first.more_steps,
        "no steps asked"
    );
    assert_eq!(first.bytes, whole.bytes(), "the totals on every page");
    let rest = page(ask(Some(3), 4, usize::MAX, 0)).await;
    assert_eq!(positions(&rest), vec![4, 5]);
    assert!(!rest.more);
    let mut after = None;
    let mut seen = Vec::new();
    loop {
        let one = page(ask(after, 1000, 1, 0)).await;
        assert_eq!(one.calls.len(), 1, "one entry a page");
        seen.extend(positions(&one));
        after = seen.last().copied();
        if !one.more {
            break;
        }
    }
    assert_eq!(seen, vec![0, 1, 2, 3, 4, 5]);
    let two = page(ask(None, 1000, 2 * all.calls[0].held(), 0)).await;
    assert_eq!(positions(&two), vec![0, 1]);
    assert!(two.more);
    let past = page(ask(Some(5), 1000, usize::MAX, 0)).await;
    assert!(past.calls.is_empty() && !past.more);

    // Steps by bytes: the smallest keys that fit.
    let steps = page(ask(Some(5), 1000, usize::MAX, 3 * (SUMMARY_ROOM + 7))).await;
    let listed: Vec<&str> = steps.steps.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(listed, vec!["step-00", "step-01", "step-02"]);
    assert!(steps.more_steps);

    // One entry with its body, one without it.
    for pos in [0, 3] {
        let entry = store.journal.call_entry(&id, pos).await.unwrap().unwrap();
        assert_eq!(entry, whole.calls[pos as usize]);
        let summary = store.journal.call_summary(&id, pos).await.unwrap().unwrap();
        assert_eq!(summary, CallSummary::of(entry));
    }
    assert_eq!(store.journal.call_entry(&id, 6).await.unwrap(), None);
    assert_eq!(store.journal.call_summary(&id, 6).await.unwrap(), None);
    let none = store
        .journal
        .journal_page("no-such-dispatch", &ask(None, 10, usize::MAX, usize::MAX))
        .await
        .unwrap();
    assert!(none.calls.is_empty() && none.steps.is_empty() && none.bytes == 0);

    // Waitpoints: pages of at most two results, each going on from the last.
    let waiting = large_waitpoints(store, "br-store-w", 10, result_size).await;
    let by_dispatch = WaitpointFilter {
        dispatch: Some(waiting.clone()),
        limit: 1000,
        ..WaitpointFilter::default()
    };
    let whole = store
        .waitpoints
        .list_waitpoints(&by_dispatch)
        .await
        .unwrap();
    assert_eq!(whole.len(), 10);
    assert!(
        whole
            .iter()
            .all(|w| w.result.as_ref().map(Vec::len) == Some(result_size))
    );
    let by_thread = WaitpointFilter {
        thread: Some("br-store-w".into()),
        ..by_dispatch.clone()
    };
    let completed = WaitpointFilter {
        state: Some(homing::store::WaitpointState::Completed),
        ..WaitpointFilter::default()
    };
    let budget = 2 * whole[0].held() + whole[0].held() / 2;
    for filter in [&by_dispatch, &by_thread, &completed] {
        let mut filter = filter.clone();
        filter.limit = 1000;
        let mut seen = Vec::new();
        loop {
            let page = store
                .waitpoints
                .read_waitpoints(&filter, budget, true)
                .await
                .unwrap();
            assert_eq!(
                page.waitpoints.len(),
                if page.more { 2 } else { 10 - seen.len() }
            );
            assert!(page.waitpoints.len() <= 2, "{filter:?}");
            seen.extend(page.waitpoints.iter().cloned());
            filter.after = seen.last().map(|w| (w.created_at, w.id.clone()));
            if !page.more {
                break;
            }
        }
        assert_eq!(seen, whole, "{filter:?}");
        // Without results, all in one page.
        filter.after = None;
        let lean = store
            .waitpoints
            .read_waitpoints(&filter, budget, false)
            .await
            .unwrap();
        assert!(!lean.more);
        assert_eq!(lean.waitpoints.len(), 10);
        assert!(lean.waitpoints.iter().all(|w| w.result.is_none()));
        // By limit.
        filter.limit = 3;
        let three = store
            .waitpoints
            .read_waitpoints(&filter, usize::MAX, true)
            .await
            .unwrap();
        assert_eq!(three.waitpoints, whole[..3].to_vec());
        assert!(three.more);
        filter.limit = 10;
        let ten = store
            .waitpoints
            .read_waitpoints(&filter, usize::MAX, true)
            .await
            .unwrap();
        assert_eq!(ten.waitpoints, whole);
        assert!(!ten.more);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_store_reads_journal_and_waitpoint_pages_within_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&dir.path().join("store.db"), Arc::new(SystemClock))
        .unwrap()
        .store();
    store_reads_are_bounded(&store, 3 * MIB, MIB).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nats_store_reads_journal_and_waitpoint_pages_within_their_bytes() {
    let server = NatsServer::start();
    for (prefix, client) in [("brhost", false), ("brclient", true)] {
        let config = NatsConfig {
            urls: vec![server.url()],
            prefix: prefix.into(),
            request_timeout: Duration::from_secs(30),
            ..NatsConfig::default()
        };
        let store = if client {
            NatsStore::open_client(&config, Arc::new(SystemClock)).await
        } else {
            NatsStore::open(&config, Arc::new(SystemClock)).await
        }
        .unwrap();
        // Bodies and results that fit the server's 1 MiB messages.
        store_reads_are_bounded(&store, 200 * 1024, 100 * 1024).await;
    }
}
