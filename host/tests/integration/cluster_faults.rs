//! The store's promises on a real three-node JetStream cluster under faults (issue 49): a stream
//! with three replicas, three store instances standing for three hosts and a short-lived client,
//! a few thousand dispatches claimed the ways production claims them, while the test kills the
//! stream's leader (SIGKILL) and brings it back, stalls the next leader (SIGSTOP) until another
//! is elected and then lets it go on (SIGCONT), and kills a host holding claims. Everything is
//! recorded into the history checker (`history/`).
//!
//! - Work: dispatches of two agents over many threads. `capped`'s carry a concurrency key (a few
//!   keys, each capped at [`KEY_CAP`] running at once) and are claimed with the gated claim
//!   (`claim_gated` with a [`LimitSet`]) and `complete_and_claim`, as a host's workers do;
//!   `plain`'s are claimed with `claim` and `claim_started`. Each dispatch has a fate fixed by
//!   its number: most complete (in one step, or a result then an ack), some are nacked on their
//!   first attempt and complete on a later one, some are dead-lettered; a few claims are
//!   abandoned as a crashed worker would leave them.
//! - Faults: store calls fail while the cluster elects a leader (timeouts, no leader); workers
//!   retry them. A call that failed that way may still have taken effect: the history records
//!   it as ambiguous (`Unavailable`), and so does every call a killed host had in flight.
//! - A sweeper moves the [`ManualClock`] and reclaims expired leases through a live host: the
//!   killed host's claims come back that way.
//! - The checks: the history checker finds nothing lost, invented, run twice at once, written
//!   stale or overwritten, and no key with more live claims than [`KEY_CAP`] at any instant;
//!   the test adds that no dispatch was settled by two claims, every dispatch ended as its
//!   fate says with its own result, and every claim the killed host held was reclaimed by
//!   another host's sweeper.
//!
//! Nothing sleeps in place of synchronisation: waits poll a condition under a deadline (the
//! short sleeps left pace loops). `HOMING_SEED=<n>` replays a run's random choices (the faults'
//! timing is the machine's).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use homing::store::nats::{NatsConfig, NatsStore};
use homing::store::{
    ClaimRequest, Clock, Dispatch, Gated, LimitSet, ManualClock, NewDispatch, RunResult,
    SharedClock, Status, Store, StoreError, StoreResult,
};
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::common::{Rng, seed};
use crate::history::{self, Event, Expect, History, HolderKind, Op, Outcome};
use crate::natsd::NatsServer;

const T0: u64 = 1_700_000_000_000;
const PREFIX: &str = "clusterfaults";
/// The agent whose dispatches carry concurrency keys and are claimed through the gate.
const CAPPED: &str = "capped";
/// The agent claimed with the plain claims.
const PLAIN: &str = "plain";
/// At most this many `capped` dispatches of one key run at once.
const KEY_CAP: u32 = 2;
const KEYS: usize = 4;
const DISPATCHES: usize = 3000;
const THREADS: usize = 200;
const HOSTS: usize = 3;
const WORKERS: usize = 3;
/// The host the test kills.
const DOOMED: usize = 2;
/// The lease of every claim, in store-clock milliseconds.
const LEASE: u64 = 15_000;
/// How far the sweeper moves the clock per sweep.
const TICK: u64 = 100;
/// High enough that lost leases (stalls, the killed host) never dead-letter a dispatch.
const MAX_ATTEMPTS: u32 = 50;
/// The bound on the whole run (a bound on failure, never a wait).
const RUN_WITHIN: Duration = Duration::from_secs(300);
/// The bound on one wait for the cluster (an election, a node catching up).
const CLUSTER_WITHIN: Duration = Duration::from_secs(60);

/// How a dispatch is meant to end, by its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Completed with [`output`].
    Complete,
    /// Nacked on its first attempt, completed on a later one.
    NackFirst,
    /// Dead-lettered with [`dead_reason`].
    DeadLetter,
}

fn fate(n: usize) -> Fate {
    if n % 23 == 5 {
        Fate::DeadLetter
    } else if n % 7 == 3 {
        Fate::NackFirst
    } else {
        Fate::Complete
    }
}

fn id_of(n: usize) -> String {
    format!("d{n:05}")
}

fn number(id: &str) -> usize {
    id.strip_prefix('d')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a dispatch of this test: {id}"))
}

/// The result a dispatch's own run records.
fn output(id: &str) -> Vec<u8> {
    format!("result of {id}").into_bytes()
}

fn dead_reason(id: &str) -> String {
    format!("dead letter {id}")
}

fn new_dispatch(n: usize) -> NewDispatch {
    let id = id_of(n);
    let thread = format!("t{}", n % THREADS);
    let agent = if n.is_multiple_of(2) { CAPPED } else { PLAIN };
    let mut new = NewDispatch::new(agent, thread, id.clone().into_bytes())
        .with_id(id)
        .with_max_attempts(MAX_ATTEMPTS);
    if agent == CAPPED {
        new = new.with_concurrency_key(format!("k{}", (n / 2) % KEYS));
    }
    new
}

fn limits() -> LimitSet {
    LimitSet {
        key_concurrency: Some(KEY_CAP),
        ..LimitSet::default()
    }
}

/// Errors a call gets while the cluster elects a leader or a node is gone: retried.
fn transient(err: &StoreError) -> bool {
    matches!(err, StoreError::Unavailable(_) | StoreError::Contention(_))
}

/// The refusals a holder gets once its claim is gone.
fn fenced(err: &StoreError) -> bool {
    matches!(
        err,
        StoreError::LostClaim { .. }
            | StoreError::StaleEpoch { .. }
            | StoreError::NotClaimed { .. }
    )
}

fn config(urls: &[String]) -> NatsConfig {
    NatsConfig {
        urls: urls.to_vec(),
        prefix: PREFIX.into(),
        replicas: 3,
        connect_timeout: Duration::from_secs(60),
        request_timeout: Duration::from_secs(3),
        ..NatsConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Recording, with the calls of a killed host kept.

/// A call under way: recorded with an unknown outcome if its host is killed before it returns.
struct Open {
    actor: String,
    ops: Vec<Op>,
    start: u64,
    clock_before: u64,
}

/// The calls under way on one host.
#[derive(Default)]
struct Calls {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Open>>,
}

impl Calls {
    fn begin(&self, open: Open) -> u64 {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        self.open.lock().unwrap().insert(key, open);
        key
    }

    fn end(&self, key: u64) {
        self.open.lock().unwrap().remove(&key);
    }

    /// Records every call still under way as failed with an unknown outcome: its host was
    /// killed, and what it sent may have been stored.
    fn abandon(&self, history: &History, clock: &ManualClock) -> usize {
        let open: Vec<Open> = self.open.lock().unwrap().drain().map(|(_, o)| o).collect();
        let n = open.len();
        for call in open {
            for op in call.ops {
                history.push(Event {
                    actor: call.actor.clone(),
                    start: call.start,
                    end: history.now(),
                    clock_before: call.clock_before,
                    clock_after: clock.now_ms(),
                    op,
                    outcome: Outcome::Failed(StoreError::Unavailable(
                        "the host was killed during the call".into(),
                    )),
                });
            }
        }
        n
    }
}

/// Store calls of one actor on one host, each recorded into the history when it returns (a
/// call made of two, `complete_and_claim`, as its two halves).
#[derive(Clone)]
struct Rec {
    store: Store,
    history: Arc<History>,
    actor: String,
    calls: Arc<Calls>,
}

fn record(d: &Dispatch) -> Outcome {
    Outcome::Record(Box::new(d.clone()))
}

fn maybe(d: Option<&Dispatch>) -> Outcome {
    d.map_or(Outcome::Nothing, record)
}

fn outcome_of<T>(result: &StoreResult<T>, ok: impl FnOnce(&T) -> Outcome) -> Outcome {
    match result {
        Ok(value) => ok(value),
        Err(err) => Outcome::Failed(err.clone()),
    }
}

impl Rec {
    async fn call<T>(
        &self,
        ops: Vec<Op>,
        fut: impl Future<Output = T>,
        outcomes: impl FnOnce(&T) -> Vec<Outcome>,
    ) -> T {
        let clock_before = self.store.now();
        let start = self.history.now();
        let key = self.calls.begin(Open {
            actor: self.actor.clone(),
            ops: ops.clone(),
            start,
            clock_before,
        });
        let out = fut.await;
        // From here to the push nothing awaits: a killed host's task never stops in between.
        let end = self.history.now();
        let clock_after = self.store.now();
        self.calls.end(key);
        for (op, outcome) in ops.into_iter().zip(outcomes(&out)) {
            self.history.push(Event {
                actor: self.actor.clone(),
                start,
                end,
                clock_before,
                clock_after,
                op,
                outcome,
            });
        }
        out
    }

    async fn enqueue(&self, new: NewDispatch) -> StoreResult<Dispatch> {
        let op = Op::Enqueue {
            id: new.id.clone().unwrap_or_default(),
            thread: new.thread.clone(),
        };
        self.call(vec![op], self.store.mailbox.enqueue(new), |r| {
            vec![outcome_of(r, record)]
        })
        .await
    }

    async fn claim(&self, started: bool) -> StoreResult<Option<Dispatch>> {
        let op = Op::Claim {
            agent: PLAIN.into(),
        };
        let mb = &self.store.mailbox;
        let fut = async {
            if started {
                mb.claim_started(PLAIN, &self.actor, LEASE).await
            } else {
                mb.claim(PLAIN, &self.actor, LEASE).await
            }
        };
        self.call(vec![op], fut, |r| {
            vec![outcome_of(r, |d: &Option<Dispatch>| maybe(d.as_ref()))]
        })
        .await
    }

    async fn claim_gated(&self, req: &ClaimRequest<'_>) -> StoreResult<Gated> {
        let op = Op::ClaimGated {
            agent: req.agent.into(),
            limits: req.limits.clone(),
        };
        self.call(vec![op], self.store.mailbox.claim_gated(req), |r| {
            vec![outcome_of(r, |g: &Gated| maybe(g.dispatch.as_ref()))]
        })
        .await
    }

    async fn holder(
        &self,
        kind: HolderKind,
        id: &str,
        token: &str,
        fut: impl Future<Output = StoreResult<Dispatch>>,
    ) -> StoreResult<Dispatch> {
        let op = Op::Holder {
            id: id.into(),
            token: token.into(),
            kind,
        };
        self.call(vec![op], fut, |r| vec![outcome_of(r, record)])
            .await
    }

    async fn complete_and_claim(
        &self,
        id: &str,
        token: &str,
        req: &ClaimRequest<'_>,
    ) -> (StoreResult<Dispatch>, StoreResult<Gated>) {
        let ops = vec![
            Op::Holder {
                id: id.into(),
                token: token.into(),
                kind: HolderKind::Complete,
            },
            Op::ClaimGated {
                agent: req.agent.into(),
                limits: req.limits.clone(),
            },
        ];
        let fut =
            self.store
                .mailbox
                .complete_and_claim(id, token, RunResult::success(output(id)), req);
        self.call(ops, fut, |(done, gated)| {
            vec![
                outcome_of(done, record),
                outcome_of(gated, |g: &Gated| maybe(g.dispatch.as_ref())),
            ]
        })
        .await
    }

    async fn reclaim(&self, now: u64) -> StoreResult<Vec<Dispatch>> {
        let op = Op::Reclaim { now };
        self.call(
            vec![op],
            self.store.mailbox.reclaim_expired(now, 100),
            |r| {
                vec![outcome_of(r, |v: &Vec<Dispatch>| {
                    Outcome::Reclaimed(v.clone())
                })]
            },
        )
        .await
    }
}

// ---------------------------------------------------------------------------------------------
// The run.

/// One host: its store instance (gone once killed) and its calls under way.
struct Host {
    store: Mutex<Option<Store>>,
    calls: Arc<Calls>,
}

/// What every task of a run shares.
struct Run {
    hosts: Vec<Host>,
    history: Arc<History>,
    clock: Arc<ManualClock>,
    stop: AtomicBool,
    deadline: Instant,
    /// Dispatches settled for good (acked or dead-lettered) by a worker's call.
    settled: AtomicUsize,
    /// Set once the doomed host is to die: its workers keep the next claim they get and stop,
    /// as a host that died right after claiming.
    freeze: AtomicBool,
    /// The claims the doomed host's workers were left holding: (id, token).
    frozen: Mutex<Vec<(String, String)>>,
    /// Never notified: what a frozen worker waits on until it is killed.
    never: Notify,
}

impl Run {
    fn rec(&self, h: usize, actor: &str) -> Option<Rec> {
        let store = self.hosts[h].store.lock().unwrap().clone()?;
        Some(Rec {
            store,
            history: self.history.clone(),
            actor: actor.to_owned(),
            calls: self.hosts[h].calls.clone(),
        })
    }

    fn live_hosts(&self) -> Vec<usize> {
        (0..self.hosts.len())
            .filter(|h| self.hosts[*h].store.lock().unwrap().is_some())
            .collect()
    }

    fn check_deadline(&self, what: &str) {
        assert!(
            Instant::now() < self.deadline,
            "{what}: no progress within {RUN_WITHIN:?}"
        );
    }
}

/// Opens a host's instance, retrying while the cluster elects its leaders.
async fn open_host(urls: &[String], clock: &Arc<ManualClock>) -> Store {
    let clock: SharedClock = clock.clone();
    let deadline = Instant::now() + CLUSTER_WITHIN;
    loop {
        match NatsStore::open(&config(urls), clock.clone()).await {
            Ok(store) => return store,
            Err(err) if transient(&err) && Instant::now() < deadline => {
                eprintln!("cluster_faults: opening a host: {err}; again");
            }
            Err(err) => panic!("open a host: {err}"),
        }
    }
}

/// A gated claim request of [`CAPPED`] for `consumer`.
fn gated_request<'a>(consumer: &'a str, limits: &'a LimitSet, start: bool) -> ClaimRequest<'a> {
    ClaimRequest {
        agent: CAPPED,
        consumer,
        lease_ms: LEASE,
        start,
        limits,
        offer: None,
    }
}

/// Calls a holder operation until it gives a definite answer: whether the claim did it (a
/// success, possibly the repeat of a call whose reply was lost) or had lost it.
async fn settle<F, Fut>(
    run: &Run,
    rec: &Rec,
    kind: HolderKind,
    id: &str,
    token: &str,
    call: F,
) -> bool
where
    F: Fn() -> Fut,
    Fut: Future<Output = StoreResult<Dispatch>>,
{
    loop {
        run.check_deadline(&rec.actor);
        match rec.holder(kind, id, token, call()).await {
            Ok(d) => {
                if d.status.is_terminal() {
                    run.settled.fetch_add(1, Ordering::Relaxed);
                }
                return true;
            }
            Err(err) if fenced(&err) => return false,
            Err(err) if transient(&err) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(err) => panic!("{}: {kind:?} {id}: {err}", rec.actor),
        }
    }
}

/// Handles one claimed dispatch as its fate says; returns the next claim a
/// `complete_and_claim` took.
async fn handle(run: &Run, rec: &Rec, d: Dispatch, rng: &mut Rng) -> Option<Dispatch> {
    let id = d.id.clone();
    let token = d
        .token()
        .expect("a claimed dispatch has a token")
        .to_owned();
    let mb = rec.store.mailbox.clone();
    let fate = fate(number(&id));
    if fate == Fate::DeadLetter {
        let reason = dead_reason(&id);
        settle(run, rec, HolderKind::DeadLetter, &id, &token, || {
            mb.dead_letter(&id, &token, &reason)
        })
        .await;
        return None;
    }
    if fate == Fate::NackFirst && d.attempt == 0 {
        let retry_at = run.clock.now_ms() + rng.below(200);
        let error = format!("nack {id}");
        settle(run, rec, HolderKind::Nack, &id, &token, || {
            mb.nack(&id, &token, retry_at, &error)
        })
        .await;
        return None;
    }
    let roll = rng.below(100);
    if roll < 3 {
        // A worker that crashed: its lease runs out and the sweeper gives the dispatch back.
        return None;
    }
    if roll < 45 && d.agent == CAPPED {
        let limits = limits();
        let req = gated_request(&rec.actor, &limits, rng.below(2) == 0);
        let (done, gated) = rec.complete_and_claim(&id, &token, &req).await;
        match done {
            Ok(_) => {
                run.settled.fetch_add(1, Ordering::Relaxed);
            }
            Err(err) if fenced(&err) => {}
            Err(err) if transient(&err) => {
                settle(run, rec, HolderKind::Complete, &id, &token, || {
                    mb.complete(&id, &token, RunResult::success(output(&id)))
                })
                .await;
            }
            Err(err) => panic!("{}: complete_and_claim {id}: {err}", rec.actor),
        }
        return match gated {
            Ok(g) => g.dispatch,
            Err(err) if transient(&err) => None,
            Err(err) => panic!("{}: complete_and_claim's claim: {err}", rec.actor),
        };
    }
    if roll < 75 {
        settle(run, rec, HolderKind::Complete, &id, &token, || {
            mb.complete(&id, &token, RunResult::success(output(&id)))
        })
        .await;
        return None;
    }
    let recorded = settle(run, rec, HolderKind::Result, &id, &token, || {
        mb.record_result(&id, &token, RunResult::success(output(&id)))
    })
    .await;
    if recorded {
        settle(run, rec, HolderKind::Ack, &id, &token, || {
            mb.ack(&id, &token)
        })
        .await;
    }
    None
}

/// One claim of either agent, the ways a host claims; `None` when nothing was claimed (or the
/// cluster did not answer).
async fn claim_one(rec: &Rec, rng: &mut Rng) -> Option<Dispatch> {
    let claimed = if rng.below(5) < 3 {
        let limits = limits();
        let req = gated_request(&rec.actor, &limits, rng.below(2) == 0);
        rec.claim_gated(&req).await.map(|g| g.dispatch)
    } else {
        rec.claim(rng.below(2) == 0).await
    };
    match claimed {
        Ok(d) => d,
        Err(err) if transient(&err) => {
            tokio::time::sleep(Duration::from_millis(20)).await;
            None
        }
        Err(err) => panic!("{}: claim: {err}", rec.actor),
    }
}

async fn worker(run: Arc<Run>, h: usize, w: usize, mut rng: Rng) -> usize {
    let actor = format!("h{h}w{w}");
    let mut handled = 0;
    let mut next: Option<Dispatch> = None;
    while !run.stop.load(Ordering::Relaxed) {
        run.check_deadline(&actor);
        let Some(rec) = run.rec(h, &actor) else {
            return handled;
        };
        let d = match next.take() {
            Some(d) => d,
            None => match claim_one(&rec, &mut rng).await {
                Some(d) => d,
                None => {
                    let signal = rec.store.mailbox.work_signal();
                    let _ =
                        tokio::time::timeout(Duration::from_millis(20), signal.notified()).await;
                    continue;
                }
            },
        };
        if h == DOOMED && run.freeze.load(Ordering::Relaxed) {
            // The host dies holding this claim.
            let token = d.token().unwrap_or_default().to_owned();
            run.frozen.lock().unwrap().push((d.id.clone(), token));
            run.never.notified().await;
        }
        handled += 1;
        next = handle(&run, &rec, d, &mut rng).await;
    }
    handled
}

/// Moves the clock and reclaims expired leases through a live host, round by round.
async fn sweeper(run: Arc<Run>) -> (usize, usize) {
    let (mut sweeps, mut reclaimed) = (0, 0);
    while !run.stop.load(Ordering::Relaxed) {
        run.check_deadline("sweeper");
        run.clock.advance(TICK);
        let live = run.live_hosts();
        let h = live[sweeps % live.len()];
        let Some(rec) = run.rec(h, &format!("sweeper@h{h}")) else {
            continue;
        };
        match rec.reclaim(run.clock.now_ms()).await {
            Ok(v) => reclaimed += v.len(),
            Err(err) if transient(&err) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(err) => panic!("sweeper: {err}"),
        }
        sweeps += 1;
        // The sweep interval (pacing, not synchronisation).
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (sweeps, reclaimed)
}

/// Enqueues dispatches `from, from + step, ...` below [`DISPATCHES`], through the live hosts and
/// `client` in turn, each until it is stored (a retry after a lost reply gets the stored
/// record).
async fn producer(run: Arc<Run>, client: Store, p: usize, from: usize, step: usize) {
    let mut i = 0usize;
    for n in (from..DISPATCHES).step_by(step) {
        i += 1;
        loop {
            run.check_deadline("producer");
            let live = run.live_hosts();
            let rec = if i.is_multiple_of(3) {
                Rec {
                    store: client.clone(),
                    history: run.history.clone(),
                    actor: format!("producer{p}@client"),
                    calls: Arc::new(Calls::default()),
                }
            } else {
                let h = live[i % live.len()];
                match run.rec(h, &format!("producer{p}@h{h}")) {
                    Some(rec) => rec,
                    None => continue,
                }
            };
            match rec.enqueue(new_dispatch(n)).await {
                Ok(d) => {
                    assert_eq!(d.id, id_of(n));
                    break;
                }
                Err(err) if transient(&err) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(err) => panic!("enqueue {}: {err}", id_of(n)),
            }
            i += 1;
        }
    }
}

/// Waits, polling under [`CLUSTER_WITHIN`], until `done` says yes about the stream's place in
/// the cluster as the servers at `urls` tell it; returns what they told last.
async fn await_cluster(
    urls: &[String],
    what: &str,
    done: impl Fn(&homing::natsd::StreamCluster) -> bool,
) -> homing::natsd::StreamCluster {
    let deadline = Instant::now() + CLUSTER_WITHIN;
    loop {
        let last = match homing::natsd::stream_cluster(urls, PREFIX, Duration::from_secs(2)).await {
            Ok(info) if done(&info) => return info,
            Ok(info) => format!("{info:?}"),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            Instant::now() < deadline,
            "the cluster did not get to {what} within {CLUSTER_WITHIN:?}: {last}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until at least `n` dispatches were settled for good.
async fn await_settled(run: &Run, n: usize) {
    while run.settled.load(Ordering::Relaxed) < n {
        run.check_deadline("waiting for settlements");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The node named `name`.
fn node_named(nodes: &[NatsServer], name: &str) -> usize {
    nodes
        .iter()
        .position(|n| n.name() == name)
        .unwrap_or_else(|| panic!("no node is named {name}"))
}

/// The URLs of every node but `but`.
fn urls_but(nodes: &[NatsServer], but: usize) -> Vec<String> {
    nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != but)
        .map(|(_, n)| n.url())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_keeps_every_promise_while_leaders_die_and_stall_and_a_host_dies() {
    let seed = seed();
    eprintln!("cluster_faults seed {seed} (HOMING_SEED={seed} replays the random choices)");
    let began = Instant::now();
    let mut nodes = NatsServer::cluster3();
    let urls: Vec<String> = nodes.iter().map(NatsServer::url).collect();
    let clock = ManualClock::new(T0);
    let history = History::new();
    let mut hosts = Vec::new();
    for _ in 0..HOSTS {
        hosts.push(Host {
            store: Mutex::new(Some(open_host(&urls, &clock).await)),
            calls: Arc::new(Calls::default()),
        });
    }
    let client = {
        let shared: SharedClock = clock.clone();
        NatsStore::open_client(&config(&urls), shared)
            .await
            .expect("open a client")
    };
    let run = Arc::new(Run {
        hosts,
        history: history.clone(),
        clock: clock.clone(),
        stop: AtomicBool::new(false),
        deadline: Instant::now() + RUN_WITHIN,
        settled: AtomicUsize::new(0),
        freeze: AtomicBool::new(false),
        frozen: Mutex::new(Vec::new()),
        never: Notify::new(),
    });

    let mut producers = JoinSet::new();
    for p in 0..2 {
        producers.spawn(producer(run.clone(), client.clone(), p, p, 2));
    }
    let mut workers = JoinSet::new();
    let mut doomed = JoinSet::new();
    for h in 0..HOSTS {
        for w in 0..WORKERS {
            let rng = Rng::new(seed ^ ((h * 100 + w) as u64 + 1000));
            let task = worker(run.clone(), h, w, rng);
            if h == DOOMED {
                doomed.spawn(task);
            } else {
                workers.spawn(task);
            }
        }
    }
    let sweeper = tokio::spawn(sweeper(run.clone()));

    // 1. The stream's leader is SIGKILLed, and comes back once the others went on without it.
    await_settled(&run, DISPATCHES / 10).await;
    let first = await_cluster(&urls, "a stream leader", |c| c.leader.is_some()).await;
    let first = node_named(&nodes, first.leader.as_deref().unwrap_or_default());
    eprintln!(
        "cluster_faults: SIGKILL the stream leader {} at {:?}",
        nodes[first].name(),
        began.elapsed()
    );
    nodes[first].kill();
    let killed = nodes[first].name().to_owned();
    let after_kill = await_cluster(&urls_but(&nodes, first), "a new leader", |c| {
        c.leader.as_ref().is_some_and(|l| *l != killed)
    })
    .await;
    eprintln!(
        "cluster_faults: {} leads at {:?}",
        after_kill.leader.unwrap_or_default(),
        began.elapsed()
    );
    let mark = run.settled.load(Ordering::Relaxed);
    await_settled(&run, mark + DISPATCHES / 10).await;
    nodes[first].restart_async().await;
    await_cluster(&urls, "the restarted node current", |c| {
        c.leader.as_deref() == Some(killed.as_str())
            || c.replicas
                .iter()
                .any(|(n, current)| *n == killed && *current)
    })
    .await;
    eprintln!("cluster_faults: {killed} is back at {:?}", began.elapsed());

    // 2. The (new) leader is SIGSTOPped until another is elected, then continued.
    await_settled(&run, DISPATCHES * 35 / 100).await;
    let second = await_cluster(&urls, "a stream leader", |c| c.leader.is_some()).await;
    let second = node_named(&nodes, second.leader.as_deref().unwrap_or_default());
    let stalled = nodes[second].name().to_owned();
    eprintln!(
        "cluster_faults: SIGSTOP the stream leader {stalled} at {:?}",
        began.elapsed()
    );
    nodes[second].pause();
    let after_stall = await_cluster(&urls_but(&nodes, second), "a leader past the stall", |c| {
        c.leader.as_ref().is_some_and(|l| *l != stalled)
    })
    .await;
    nodes[second].resume();
    eprintln!(
        "cluster_faults: {} leads, SIGCONT {stalled} at {:?}",
        after_stall.leader.unwrap_or_default(),
        began.elapsed()
    );
    await_cluster(&urls, "the stalled node current", |c| {
        c.leader.as_deref() == Some(stalled.as_str())
            || c.replicas
                .iter()
                .any(|(n, current)| *n == stalled && *current)
    })
    .await;

    // 3. A host dies holding claims: its workers keep their next claims, then it is killed.
    await_settled(&run, DISPATCHES * 60 / 100).await;
    run.freeze.store(true, Ordering::Relaxed);
    while run.frozen.lock().unwrap().is_empty() {
        run.check_deadline("waiting for the doomed host to hold a claim");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    doomed.abort_all();
    while doomed.join_next().await.is_some() {}
    let abandoned = run.hosts[DOOMED].calls.abandon(&history, &clock);
    let frozen = run.frozen.lock().unwrap().clone();
    let dead = run.hosts[DOOMED].store.lock().unwrap().take();
    drop(dead);
    let killed_at = history.now();
    eprintln!(
        "cluster_faults: killed host h{DOOMED} holding {} claims ({abandoned} calls under way) \
         at {:?}",
        frozen.len(),
        began.elapsed()
    );

    // Drain: every dispatch enqueued and none live.
    join_all(producers).await;
    let probe = run.rec(0, "probe").expect("host 0 lives").store;
    loop {
        run.check_deadline("draining");
        match probe.mailbox.has_live_work().await {
            Ok(false) => break,
            Ok(true) => {}
            Err(err) if transient(&err) => {}
            Err(err) => panic!("has_live_work: {err}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    run.stop.store(true, Ordering::Relaxed);
    let handled: usize = join_all(workers).await.into_iter().sum();
    let (sweeps, reclaimed) = sweeper.await.unwrap();
    // Every replica caught up, so that the final listing (direct reads) is the whole truth.
    await_cluster(&urls, "every replica current", |c| {
        c.leader.is_some() && c.replicas.len() == 2 && c.replicas.iter().all(|(_, cur)| *cur)
    })
    .await;

    eprintln!("cluster_faults: drained at {:?}", began.elapsed());
    let finals = history::snapshot(&probe).await;
    let events = history.events();
    let report = history.check(&finals, Expect::Drained);
    eprintln!("cluster_faults: checked at {:?}", began.elapsed());
    let mut by_status = BTreeMap::new();
    for d in &finals {
        *by_status.entry(d.status).or_insert(0usize) += 1;
    }
    let ambiguous = events
        .iter()
        .filter(|e| matches!(e.outcome, Outcome::Failed(StoreError::Unavailable(_))))
        .count();
    eprintln!(
        "cluster_faults: {handled} claims handled by the surviving hosts, {sweeps} sweeps \
         reclaiming {reclaimed}, {ambiguous} calls with an unknown outcome, final {by_status:?} \
         after {:?}; {report}",
        began.elapsed()
    );
    report.assert_clean();

    let mut findings = Vec::new();
    findings.extend(settled_twice(&events));
    findings.extend(own_results(&finals));
    findings.extend(reclaimed_by_others(&events, &frozen, killed_at));
    assert!(
        findings.is_empty(),
        "cluster_faults (seed {seed}): {} findings:\n  {}",
        findings.len(),
        findings
            .iter()
            .take(40)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n  ")
    );
    assert!(ambiguous > 0, "no call saw the faults");
    drop(nodes);
}

/// Waits for every task, re-raising the first panic with its own message.
async fn join_all<T: 'static>(mut set: JoinSet<T>) -> Vec<T> {
    let mut out = Vec::new();
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(value) => out.push(value),
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(err) => panic!("task failed: {err}"),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The checks the history checker does not make.

/// No dispatch was ended by two claims: the calls that returned it terminal name one token (a
/// repeat by the same claim is the same settlement), or a sweep ended it and no claim did.
fn settled_twice(events: &[Event]) -> Vec<String> {
    let mut by: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for e in events {
        match (&e.op, &e.outcome) {
            (Op::Holder { token, kind, .. }, Outcome::Record(d))
                if d.status.is_terminal()
                    && matches!(
                        kind,
                        HolderKind::Ack
                            | HolderKind::Nack
                            | HolderKind::DeadLetter
                            | HolderKind::Complete
                    ) =>
            {
                by.entry(d.id.as_str()).or_default().insert(token.clone());
            }
            (Op::Reclaim { .. }, Outcome::Reclaimed(v)) => {
                for d in v.iter().filter(|d| d.status.is_terminal()) {
                    by.entry(d.id.as_str())
                        .or_default()
                        .insert("a sweep".into());
                }
            }
            _ => {}
        }
    }
    by.into_iter()
        .filter(|(_, settlers)| settlers.len() > 1)
        .map(|(id, settlers)| format!("{id} was settled by {settlers:?}"))
        .collect()
}

/// Every dispatch of the run is stored and ended as its fate says, with its own result.
fn own_results(finals: &[Dispatch]) -> Vec<String> {
    let mut findings = Vec::new();
    let by_id: BTreeMap<&str, &Dispatch> = finals.iter().map(|d| (d.id.as_str(), d)).collect();
    if finals.len() != DISPATCHES {
        findings.push(format!(
            "{} dispatches stored, {DISPATCHES} enqueued",
            finals.len()
        ));
    }
    for n in 0..DISPATCHES {
        let id = id_of(n);
        let Some(d) = by_id.get(id.as_str()) else {
            findings.push(format!("{id} is missing"));
            continue;
        };
        let fine = match fate(n) {
            Fate::DeadLetter => {
                d.status == Status::DeadLetter
                    && d.last_error.as_deref() == Some(dead_reason(&id).as_str())
            }
            Fate::Complete | Fate::NackFirst => {
                d.status == Status::Acked
                    && d.result.as_ref().map(|r| r.output.as_slice())
                        == Some(output(&id).as_slice())
            }
        };
        if !fine {
            findings.push(format!(
                "{id} ({:?}) ended {} with result {:?}, error {:?}",
                fate(n),
                d.status,
                d.result
                    .as_ref()
                    .map(|r| String::from_utf8_lossy(&r.output).into_owned()),
                d.last_error
            ));
        }
    }
    findings
}

/// Every claim the killed host held when it died came back through a sweep of another host
/// that began after the death.
fn reclaimed_by_others(
    events: &[Event],
    frozen: &[(String, String)],
    killed_at: u64,
) -> Vec<String> {
    let doomed = format!("@h{DOOMED}");
    frozen
        .iter()
        .filter(|(id, _)| {
            !events.iter().any(|e| {
                e.start > killed_at
                    && e.actor.starts_with("sweeper@")
                    && !e.actor.ends_with(&doomed)
                    && matches!(&e.outcome, Outcome::Reclaimed(v) if v.iter().any(|d| d.id == *id))
            })
        })
        .map(|(id, token)| {
            format!("{id}, claimed by the killed host ({token}), was never reclaimed by another")
        })
        .collect()
}
