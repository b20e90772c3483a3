//! Real `homing` host processes for the multi-process tests (`nats_hosts`,
//! `process_faults`), and what they leave in a store: spawning hosts and reading their logs,
//! listing a store, waiting for work to be acked, and reading the journals the sandbox guest's
//! `journal:<ms>` action writes.
//!
//! # What a journal can look like
//!
//! A `journal:<ms>` run appends `start <id>` to its thread's log, works, and appends `end <id>`,
//! both through its claim (fenced appends). A fenced append is refused unless the claim is the
//! thread's live claim (token current, lease not run out, epoch current), and a thread has at
//! most one live claim at a time, so a thread's log is the concatenation, in claim order, of
//! what each of its claims appended; each claim appended a prefix of `[start X, end X]` for its
//! own dispatch `X` (nothing, `start X`, or both). Hence a well-formed log: every `end X`
//! directly follows a `start X`; a `start` directly after a `start X` means the claim that wrote
//! `start X` ended without its second append (its host died, its lease was lost, or it was
//! released at shutdown), which counts a failed attempt of `X`. A dispatch's acked claim is its
//! last claim and wrote both entries, so its last run in the log is complete. [`journals`]
//! checks the shape and counts, per dispatch, its runs and the runs cut short; tests compare the
//! counts with the attempts the store recorded.

use std::collections::BTreeMap;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use homing::store::nats::{NatsConfig, NatsStore};
use homing::store::{Dispatch, ListCursor, ListFilter, NewDispatch, Status, Store, SystemClock};

use crate::common::Env;

/// The test guest every host here runs.
pub const AGENT: &str = "sandbox";

/// A `homing` process killed when the test ends, passed or not.
pub struct Host(pub Child);

impl std::ops::Deref for Host {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Host {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `homing <args>` as host `host` (its `HOMING_HOST_ID`), logging to `<host>.log` in the
/// scratch dir.
pub fn spawn(env: &Env, host: &str, args: &[&str]) -> Host {
    let log = std::fs::File::create(env.path().join(format!("{host}.log"))).unwrap();
    env.command(args)
        .env("HOMING_HOST_ID", host)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map(Host)
        .unwrap()
}

/// `homing run --until-idle` as host `host`.
pub fn spawn_until_idle(env: &Env, host: &str) -> Host {
    spawn(env, host, &["run", "--until-idle"])
}

/// `homing run` as host `host`.
pub fn spawn_run(env: &Env, host: &str) -> Host {
    spawn(env, host, &["run"])
}

/// The log of host `host` so far.
pub fn host_log(env: &Env, host: &str) -> String {
    std::fs::read_to_string(env.path().join(format!("{host}.log"))).unwrap_or_default()
}

/// Opens a NATS store instance; a cluster still electing leaders (or a loaded machine) may
/// answer late, so this keeps trying for a minute.
pub async fn open_nats(urls: &[String], prefix: &str, replicas: usize) -> Store {
    let config = NatsConfig {
        urls: urls.to_vec(),
        prefix: prefix.into(),
        replicas,
        connect_timeout: Duration::from_secs(60),
        ..NatsConfig::default()
    };
    NatsStore::open(&config, Arc::new(SystemClock))
        .await
        .expect("open the NATS store")
}

/// Enqueues one `journal:<work_ms>` dispatch for the sandbox on `thread`; returns its id.
pub async fn enqueue_journal(store: &Store, thread: &str, work_ms: u64) -> String {
    store
        .mailbox
        .enqueue(NewDispatch::new(
            AGENT,
            thread,
            format!("journal:{work_ms}").into_bytes(),
        ))
        .await
        .expect("enqueue")
        .id
}

/// Enqueues `n` journal dispatches over threads `t0`..`t<threads>`; returns their ids.
pub async fn fill(store: &Store, n: usize, threads: usize, work_ms: u64) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        ids.push(enqueue_journal(store, &format!("t{}", i % threads), work_ms).await);
    }
    ids
}

/// Every dispatch of the store, by id.
pub async fn all(store: &Store) -> BTreeMap<String, Dispatch> {
    let mut out = BTreeMap::new();
    let mut after = None;
    loop {
        let page = store
            .mailbox
            .list(&ListFilter {
                limit: 1000,
                after,
                ..ListFilter::default()
            })
            .await
            .expect("list");
        if page.is_empty() {
            return out;
        }
        after = page.last().map(ListCursor::of);
        for d in page {
            out.insert(d.id.clone(), d);
        }
    }
}

/// How many dispatches of a listing are acked.
pub fn acked(records: &BTreeMap<String, Dispatch>) -> usize {
    records
        .values()
        .filter(|d| d.status == Status::Acked)
        .count()
}

/// Polls until every dispatch of `ids` is acked, or fails after `within`.
pub async fn wait_all_acked(
    store: &Store,
    ids: &[String],
    within: Duration,
    logs: &dyn Fn() -> String,
) {
    let deadline = Instant::now() + within;
    loop {
        let now = all(store).await;
        let pending: Vec<&String> = ids
            .iter()
            .filter(|id| now.get(*id).is_none_or(|d| d.status != Status::Acked))
            .collect();
        if pending.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} dispatches not acked within {within:?} (first: {:?})\nlogs:\n{}",
            pending.len(),
            now.get(pending[0]),
            logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What one dispatch left in its thread's journal.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Runs {
    /// The thread whose log holds them.
    pub thread: String,
    /// `start` entries: one per claim whose run got as far as its first append.
    pub starts: usize,
    /// Runs cut short: a `start` not followed by its `end`.
    pub cut: usize,
    /// Whether the dispatch's last run in the log wrote its `end`.
    pub last_complete: bool,
}

/// Reads the journals of `threads` and checks their shape (see the module doc): sequences
/// 1, 2, 3, ... without gaps, only `start X` and `end X` entries, every `end X` directly after
/// a `start X`. Returns what each dispatch left, by id.
pub async fn journals(store: &Store, threads: &[String]) -> BTreeMap<String, Runs> {
    let mut runs: BTreeMap<String, Runs> = BTreeMap::new();
    for thread in threads {
        let entries = store
            .log
            .read(thread, 0, 1_000_000)
            .await
            .expect("read log");
        let latest = store.log.latest(thread).await.expect("latest");
        assert_eq!(
            entries.last().map_or(0, |e| e.seq),
            latest,
            "{thread}: the last entry read is not the visible watermark"
        );
        let mut open: Option<String> = None;
        for (i, e) in entries.into_iter().enumerate() {
            assert_eq!(
                e.seq,
                i as u64 + 1,
                "{thread}: sequences must be 1, 2, 3, ..."
            );
            let text = String::from_utf8(e.data).unwrap();
            let Some((what, id)) = text.split_once(' ') else {
                panic!("{thread}: unexpected entry `{text}`");
            };
            match what {
                "start" => {
                    if let Some(cut) = open.take() {
                        runs.get_mut(&cut).unwrap().cut += 1;
                    }
                    let r = runs.entry(id.to_owned()).or_insert_with(|| Runs {
                        thread: thread.clone(),
                        ..Runs::default()
                    });
                    assert_eq!(&r.thread, thread, "{id} journaled on two threads");
                    r.starts += 1;
                    r.last_complete = false;
                    open = Some(id.to_owned());
                }
                "end" if open.as_deref() == Some(id) => {
                    runs.get_mut(id).unwrap().last_complete = true;
                    open = None;
                }
                _ => panic!(
                    "{thread}: entry {} `{text}` after open run {open:?}: two holders \
                     overlapped, or a holder wrote after losing its claim",
                    e.seq
                ),
            }
        }
        if let Some(cut) = open {
            runs.get_mut(&cut).unwrap().cut += 1;
        }
    }
    runs
}

/// The value of `name=` in a log line (quotes removed).
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let at = line.find(&format!(" {name}="))? + name.len() + 2;
    let value = line[at..].split_whitespace().next()?;
    Some(value.trim_matches('"'))
}

/// `(dispatch, outcome)` of every "dispatch finished" line of a host log.
pub fn finished(log: &str) -> Vec<(String, String)> {
    log.lines()
        .filter(|line| line.contains("dispatch finished"))
        .filter_map(|line| {
            Some((
                field(line, "dispatch")?.into(),
                field(line, "outcome")?.into(),
            ))
        })
        .collect()
}

/// The dispatches a host released (nacked) at shutdown, after its grace ran out.
pub fn released(log: &str) -> Vec<String> {
    log.lines()
        .filter(|line| line.contains("released at shutdown"))
        .filter_map(|line| field(line, "dispatch").map(str::to_owned))
        .collect()
}
