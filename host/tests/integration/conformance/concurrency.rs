//! The guarantees of the contract (docs/contract.md) section 3 under concurrency: many tokio
//! tasks hammering the same threads through several store instances (standing for several
//! hosts) on one store.
//!
//! Operations that report `Contention` are retried (the contract's "retry later"); every other
//! outcome is checked. Time only moves through the manual clock.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use homing::store::{Fence, LimitSet, RunResult, Status, StoreError};
use tokio::sync::{Barrier, Mutex};
use tokio::task::JoinSet;

use super::*;

/// How many instances ("hosts") the concurrent tests open on one store.
const HOSTS: usize = 3;
/// How long a polling loop may go without finishing before the test fails (a bound on failure,
/// never a wait: every loop proceeds as soon as its condition holds).
const PATIENCE: Duration = Duration::from_secs(120);

/// A failure bound for polling loops, so a broken backend fails instead of hanging.
struct Deadline(Instant, &'static str);

impl Deadline {
    fn new(what: &'static str) -> Self {
        Deadline(Instant::now() + PATIENCE, what)
    }

    fn check(&self) {
        assert!(
            Instant::now() < self.0,
            "{}: no progress within {PATIENCE:?}",
            self.1
        );
    }
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

/// A small deterministic hash to pick actions without a random source.
fn mix(text: &str, n: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes().chain(n.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Errors a holder may legitimately get when it raced someone (lease reclaimed, thread
/// interrupted, already settled).
fn is_fenced(err: &StoreError) -> bool {
    matches!(
        err,
        StoreError::LostClaim { .. }
            | StoreError::StaleEpoch { .. }
            | StoreError::NotClaimed { .. }
    )
}

/// Under concurrent producers, workers (ack, nack, complete, dead-letter, crash), cancels,
/// interrupts and sweeps on three hosts, every admitted dispatch ends in exactly one terminal
/// state: none lost, none invented, and every successful settle is final.
pub async fn no_dispatch_lost_or_invented_under_concurrent_chaos<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(HOSTS).await;
    let clock = env.clock.clone();
    let admitted = Arc::new(Mutex::new(BTreeSet::new()));
    let settled: Arc<Mutex<BTreeMap<String, Status>>> = Arc::new(Mutex::new(BTreeMap::new()));
    let producers_done = Arc::new(AtomicBool::new(false));
    let mut producers = JoinSet::new();
    for p in 0..4usize {
        let host = hosts[p % HOSTS].clone();
        let (admitted, settled) = (admitted.clone(), settled.clone());
        producers.spawn(async move {
            for i in 0..30usize {
                let id = format!("p{p}-{i:02}");
                let mut new = nd(&format!("t{}", (p * 7 + i) % 5), &id).with_max_attempts(3);
                if i % 4 == 0 {
                    new = new.with_dedupe_key(format!("k{}", i % 3));
                }
                match retry(|| host.mailbox.enqueue(new.clone())).await {
                    Ok(d) => {
                        assert_eq!(d.id, id);
                        assert_eq!(d.status, Status::Queued);
                        admitted.lock().await.insert(id.clone());
                    }
                    Err(StoreError::Duplicate {
                        holder: Some(_), ..
                    }) => {}
                    Err(err) => panic!("enqueue {id}: {err}"),
                }
                if i % 10 == 9 {
                    let victim = format!("p{p}-{:02}", i - 1);
                    if let Some(d) = retry(|| host.mailbox.cancel(&victim)).await.unwrap() {
                        assert_eq!(d.status, Status::Cancelled);
                        settled.lock().await.insert(victim, Status::Cancelled);
                    }
                }
                tokio::task::yield_now().await;
            }
        });
    }
    let mut workers = JoinSet::new();
    for w in 0..6usize {
        let host = hosts[w % HOSTS].clone();
        let settled = settled.clone();
        let done = producers_done.clone();
        let clock = clock.clone();
        workers.spawn(async move {
            let name = format!("worker-{w}");
            let deadline = Deadline::new("worker loop");
            loop {
                deadline.check();
                let claimed = retry(|| host.mailbox.claim(AGENT, &name, LEASE))
                    .await
                    .unwrap();
                let Some(d) = claimed else {
                    if done.load(Ordering::SeqCst)
                        && !retry(|| host.mailbox.has_live_work()).await.unwrap()
                    {
                        return;
                    }
                    tokio::task::yield_now().await;
                    continue;
                };
                assert_shape(&d);
                let t = tok(&d);
                let now = homing::store::Clock::now_ms(&*clock);
                let outcome = match mix(&d.id, u64::from(d.attempt)) % 6 {
                    0 | 1 => retry(|| host.mailbox.ack(&d.id, &t)).await,
                    2 => retry(|| host.mailbox.nack(&d.id, &t, now, "flaky")).await,
                    3 => {
                        retry(|| {
                            host.mailbox
                                .complete(&d.id, &t, RunResult::success(b"ok".to_vec()))
                        })
                        .await
                    }
                    4 => retry(|| host.mailbox.dead_letter(&d.id, &t, "poison")).await,
                    _ => continue, // the guest crashed the host: the claim is abandoned
                };
                match outcome {
                    Ok(rec) => {
                        assert_shape(&rec);
                        if rec.status.is_terminal() {
                            settled.lock().await.insert(rec.id.clone(), rec.status);
                        }
                    }
                    Err(err) if is_fenced(&err) => {}
                    Err(err) => panic!("settle {}: {err}", d.id),
                }
            }
        });
    }
    let control = {
        let host = hosts[2].clone();
        tokio::spawn(async move {
            for round in 0..3 {
                for _ in 0..20 {
                    tokio::task::yield_now().await;
                }
                let thread = format!("t{round}");
                retry(|| host.mailbox.interrupt(&thread, "chaos"))
                    .await
                    .unwrap();
            }
        })
    };
    let maintenance = {
        let host = hosts[1].clone();
        let done = producers_done.clone();
        let clock = clock.clone();
        tokio::spawn(async move {
            let deadline = Deadline::new("worker loop");
            loop {
                deadline.check();
                clock.advance(LEASE + 1);
                let now = homing::store::Clock::now_ms(&*clock);
                for d in retry(|| host.mailbox.reclaim_expired(now, 1_000))
                    .await
                    .unwrap()
                {
                    assert!(matches!(d.status, Status::Queued | Status::DeadLetter));
                    assert_shape(&d);
                }
                if done.load(Ordering::SeqCst)
                    && !retry(|| host.mailbox.has_live_work()).await.unwrap()
                {
                    return;
                }
                for _ in 0..10 {
                    tokio::task::yield_now().await;
                }
            }
        })
    };
    join_all(producers).await;
    producers_done.store(true, Ordering::SeqCst);
    control.await.unwrap();
    join_all(workers).await;
    maintenance.await.unwrap();

    let records = all(&hosts[0]).await;
    let stored: BTreeSet<String> = records.iter().map(|d| d.id.clone()).collect();
    let admitted = admitted.lock().await.clone();
    assert_eq!(stored, admitted, "lost or invented dispatches");
    assert_eq!(records.len(), admitted.len(), "one record per dispatch");
    for d in &records {
        assert_shape(d);
        assert!(d.status.is_terminal(), "left live after drain: {d:#?}");
    }
    let by_id: HashMap<&str, &Dispatch> = records.iter().map(|d| (d.id.as_str(), d)).collect();
    let settled = settled.lock().await.clone();
    for (id, status) in &settled {
        assert_eq!(
            by_id[id.as_str()].status,
            *status,
            "{id}: a successful settle was overwritten"
        );
    }
    // No transition was invented either: acked and cancelled records are exactly those whose
    // ack/complete/cancel succeeded, and only interrupted threads have superseded work.
    for d in &records {
        match d.status {
            Status::Acked | Status::Cancelled => assert_eq!(
                settled.get(&d.id),
                Some(&d.status),
                "{}: {} without a successful operation",
                d.id,
                d.status
            ),
            Status::Superseded => assert!(
                ["t0", "t1", "t2"].contains(&d.thread.as_str()),
                "{} superseded on a thread never interrupted",
                d.id
            ),
            _ => {}
        }
    }
    let counted: u64 = hosts[1]
        .mailbox
        .counts()
        .await
        .unwrap()
        .iter()
        .map(|c| c.count)
        .sum();
    assert_eq!(counted, admitted.len() as u64);
}

/// Sixteen workers on three hosts draining four threads: never two live claims on one
/// thread (checked by the workers and by a concurrent observer), and each dispatch is claimed
/// exactly once.
pub async fn at_most_one_claim_per_thread_across_hosts<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(HOSTS).await;
    let total = 60usize;
    for i in 0..total {
        put_on(
            &hosts[i % HOSTS],
            &format!("t{}", i % 4),
            &format!("d{i:02}"),
        )
        .await;
    }
    let holders: Arc<std::sync::Mutex<HashMap<String, String>>> = Arc::default();
    let claims: Arc<std::sync::Mutex<BTreeMap<String, usize>>> = Arc::default();
    let acked = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for w in 0..16usize {
        let host = hosts[w % HOSTS].clone();
        let (holders, claims, acked) = (holders.clone(), claims.clone(), acked.clone());
        set.spawn(async move {
            let deadline = Deadline::new("worker loop");
            loop {
                deadline.check();
                if acked.load(Ordering::SeqCst) == total {
                    return;
                }
                let Some(d) = retry(|| host.mailbox.claim(AGENT, "w", LEASE))
                    .await
                    .unwrap()
                else {
                    tokio::task::yield_now().await;
                    continue;
                };
                {
                    let mut h = holders.lock().unwrap();
                    if let Some(other) = h.insert(d.thread.clone(), d.id.clone()) {
                        panic!("two live claims on {}: {other} and {}", d.thread, d.id);
                    }
                    *claims.lock().unwrap().entry(d.id.clone()).or_default() += 1;
                }
                tokio::task::yield_now().await;
                holders.lock().unwrap().remove(&d.thread);
                let t = tok(&d);
                let acked_rec = retry(|| host.mailbox.ack(&d.id, &t)).await.unwrap();
                assert_eq!(acked_rec.status, Status::Acked);
                acked.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    let observer = {
        let host = hosts[1].clone();
        let acked = acked.clone();
        tokio::spawn(async move {
            let mut snapshots = 0usize;
            while acked.load(Ordering::SeqCst) < total {
                let filter = homing::store::ListFilter {
                    statuses: vec![Status::Claimed],
                    limit: 10_000,
                    ..Default::default()
                };
                let claimed = retry(|| host.mailbox.list(&filter)).await.unwrap();
                let mut threads = BTreeSet::new();
                for d in &claimed {
                    assert!(
                        threads.insert(d.thread.clone()),
                        "two claimed dispatches on {}",
                        d.thread
                    );
                }
                snapshots += 1;
                tokio::task::yield_now().await;
            }
            snapshots
        })
    };
    join_all(set).await;
    assert!(observer.await.unwrap() > 0);
    let claims = claims.lock().unwrap().clone();
    assert_eq!(claims.len(), total);
    assert!(
        claims.values().all(|&n| n == 1),
        "a dispatch was claimed twice: {claims:?}"
    );
    assert_eq!(all_in(&hosts[0], Status::Acked).await.len(), total);
}

/// Many concurrent claimers of one dispatch (by id or by queue, on three hosts):
/// exactly one wins.
pub async fn concurrent_claims_of_one_dispatch_have_one_winner<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(HOSTS).await;
    for round in 0..6usize {
        let id = format!("d{round}");
        put_on(&hosts[0], &format!("t{round}"), &id).await;
        let contenders = 24usize;
        let barrier = Arc::new(Barrier::new(contenders));
        let mut set = JoinSet::new();
        for c in 0..contenders {
            let host = hosts[c % HOSTS].clone();
            let (barrier, id) = (barrier.clone(), id.clone());
            set.spawn(async move {
                barrier.wait().await;
                let consumer = format!("c{c}");
                if (c + round) % 2 == 0 {
                    retry(|| host.mailbox.claim_dispatch(&id, &consumer, LEASE))
                        .await
                        .unwrap()
                } else {
                    retry(|| host.mailbox.claim(AGENT, &consumer, LEASE))
                        .await
                        .unwrap()
                }
            });
        }
        let winners: Vec<Dispatch> = join_all(set).await.into_iter().flatten().collect();
        assert_eq!(winners.len(), 1, "round {round}: {} winners", winners.len());
        assert_eq!(winners[0].id, id);
        assert!(!tok(&winners[0]).is_empty());
        assert_eq!(load(&hosts[2], &id).await, winners[0]);
        hosts[1].mailbox.ack(&id, &tok(&winners[0])).await.unwrap();
    }
}

/// A worker's completion and its next claim in one step (`complete_and_claim`) see every
/// dispatch stored before the call, whichever host stored it: here another host enqueues
/// just before each completion, and each next claim must take what it enqueued (nothing else
/// is queued by then).
pub async fn complete_and_claim_sees_what_another_host_stored_before_it<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(2).await;
    let (worker, other) = (&hosts[0], &hosts[1]);
    let limits = LimitSet::default();
    let next = next_claim(&limits);
    put_on(other, "t0", "d0").await;
    let mut held = claim_some(worker).await;
    for i in 1..=40 {
        let id = format!("d{i}");
        put_on(other, &format!("t{i}"), &id).await;
        let (done, claimed) = worker
            .mailbox
            .complete_and_claim(&held.id, &tok(&held), RunResult::success("ok"), &next)
            .await;
        assert_eq!(done.expect("complete").status, Status::Acked);
        let claimed = claimed.expect("the next claim").dispatch;
        held = claimed.unwrap_or_else(|| {
            panic!("the claim after completion {i} found nothing; {id} was stored before it")
        });
        assert_eq!(held.id, id);
    }
}

/// Concurrent claims of different dispatches of one thread: exactly one wins.
pub async fn concurrent_claims_of_sibling_dispatches_have_one_winner<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(HOSTS).await;
    for round in 0..5usize {
        let thread = format!("t{round}");
        let siblings = 8usize;
        for i in 0..siblings {
            put_on(&hosts[i % HOSTS], &thread, &format!("r{round}-{i}")).await;
        }
        let barrier = Arc::new(Barrier::new(siblings));
        let mut set = JoinSet::new();
        for i in 0..siblings {
            let host = hosts[(i + round) % HOSTS].clone();
            let barrier = barrier.clone();
            let id = format!("r{round}-{i}");
            set.spawn(async move {
                barrier.wait().await;
                retry(|| host.mailbox.claim_dispatch(&id, "w", LEASE))
                    .await
                    .unwrap()
            });
        }
        let winners: Vec<Dispatch> = join_all(set).await.into_iter().flatten().collect();
        assert_eq!(winners.len(), 1, "round {round}");
        let claimed = all_in(&hosts[0], Status::Claimed).await;
        assert_eq!(claimed.len(), 1);
        let winner = &winners[0];
        hosts[0]
            .mailbox
            .ack(&winner.id, &tok(winner))
            .await
            .unwrap();
        // Drain the rest so the next round starts clean.
        for i in 0..siblings {
            let _ = hosts[0]
                .mailbox
                .cancel(&format!("r{round}-{i}"))
                .await
                .unwrap();
        }
    }
}

/// A reclaim sweep racing the holders' acks: for every dispatch exactly one wins, an
/// acknowledged ack is never overwritten, and a reclaimed dispatch's ack is refused.
pub async fn reclaim_racing_ack_never_overwrites_the_ack<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(HOSTS).await;
    let n = 40usize;
    let mut claimed = Vec::new();
    for i in 0..n {
        let host = &hosts[i % HOSTS];
        put(
            host,
            nd(&format!("t{i}"), &format!("d{i:02}")).with_max_attempts(3),
        )
        .await;
        claimed.push(
            host.mailbox
                .claim_dispatch(&format!("d{i:02}"), "w", 100)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    env.advance(101);
    let now = env.now();
    let mut acks = JoinSet::new();
    for (i, d) in claimed.into_iter().enumerate() {
        let host = hosts[i % HOSTS].clone();
        acks.spawn(async move {
            let t = tok(&d);
            let result = retry(|| host.mailbox.ack(&d.id, &t)).await;
            (d.id, result)
        });
    }
    let mut sweeps = JoinSet::new();
    for host in &hosts {
        let host = host.clone();
        sweeps.spawn(async move {
            let mut got = Vec::new();
            for _ in 0..5 {
                got.extend(
                    retry(|| host.mailbox.reclaim_expired(now, 1_000))
                        .await
                        .unwrap(),
                );
                tokio::task::yield_now().await;
            }
            got
        });
    }
    let acks = join_all(acks).await;
    let reclaimed: Vec<Dispatch> = join_all(sweeps).await.into_iter().flatten().collect();
    let mut reclaimed_ids = BTreeSet::new();
    for d in &reclaimed {
        assert!(
            reclaimed_ids.insert(d.id.clone()),
            "{} reclaimed twice",
            d.id
        );
        assert_eq!((d.status, d.attempt), (Status::Queued, 1));
    }
    for (id, result) in acks {
        let stored = load(&hosts[0], &id).await;
        match result {
            Ok(acked) => {
                assert_eq!(acked.status, Status::Acked);
                assert_eq!(stored, acked, "{id}: the ack was overwritten");
                assert!(!reclaimed_ids.contains(&id), "{id}: acked and reclaimed");
            }
            Err(StoreError::NotClaimed { status, .. }) => {
                assert_eq!(status, Status::Queued);
                assert!(
                    reclaimed_ids.contains(&id),
                    "{id}: ack refused but not reclaimed"
                );
                assert_eq!((stored.status, stored.attempt), (Status::Queued, 1));
            }
            Err(err) => panic!("{id}: unexpected {err}"),
        }
    }
}

/// Concurrent reclaim sweeps on three hosts transition each expired claim exactly once;
/// later sweeps return nothing.
pub async fn concurrent_reclaim_sweeps_transition_once<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(HOSTS).await;
    let n = 30usize;
    for i in 0..n {
        let max = if i % 2 == 0 { 1 } else { 3 };
        put(
            &hosts[0],
            nd(&format!("t{i}"), &format!("d{i:02}")).with_max_attempts(max),
        )
        .await;
        hosts[0]
            .mailbox
            .claim_dispatch(&format!("d{i:02}"), "w", 100)
            .await
            .unwrap()
            .unwrap();
    }
    env.advance(101);
    let now = env.now();
    let barrier = Arc::new(Barrier::new(6));
    let mut sweeps = JoinSet::new();
    for s in 0..6usize {
        let host = hosts[s % HOSTS].clone();
        let barrier = barrier.clone();
        sweeps.spawn(async move {
            barrier.wait().await;
            retry(|| host.mailbox.reclaim_expired(now, 1_000))
                .await
                .unwrap()
        });
    }
    let all_returned: Vec<Dispatch> = join_all(sweeps).await.into_iter().flatten().collect();
    let ids: BTreeSet<String> = all_returned.iter().map(|d| d.id.clone()).collect();
    assert_eq!(
        all_returned.len(),
        n,
        "each expired claim is transitioned exactly once"
    );
    assert_eq!(ids.len(), n);
    for d in all_records_sorted(&hosts[1]).await {
        assert_eq!(d.attempt, 1, "{}", d.id);
        let want = if d.max_attempts == 1 {
            Status::DeadLetter
        } else {
            Status::Queued
        };
        assert_eq!(d.status, want, "{}", d.id);
    }
    assert!(
        hosts[2]
            .mailbox
            .reclaim_expired(now, 1_000)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn all_records_sorted(s: &Store) -> Vec<Dispatch> {
    let mut records = all(s).await;
    records.sort_by(|a, b| a.id.cmp(&b.id));
    records
}

/// Zombie holders (an old token after reclaim and re-claim) hammering every holder write and
/// the log while the new holder works: every zombie write is refused, and the record and the log
/// end exactly as the new holder left them.
pub async fn stale_holders_racing_a_new_holder_change_nothing<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(HOSTS).await;
    put(&hosts[0], nd("t", "d1").with_max_attempts(3)).await;
    let old = hosts[0]
        .mailbox
        .claim_dispatch("d1", "old", 100)
        .await
        .unwrap()
        .unwrap();
    env.advance(101);
    hosts[1]
        .mailbox
        .reclaim_expired(env.now(), 10)
        .await
        .unwrap();
    let new = hosts[1]
        .mailbox
        .claim_dispatch("d1", "new", LEASE)
        .await
        .unwrap()
        .unwrap();
    let (old_token, old_fence) = (tok(&old), Fence::of(&old).unwrap());
    let new_fence = Fence::of(&new).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut zombies = JoinSet::new();
    for z in 0..12usize {
        let host = hosts[z % HOSTS].clone();
        let (t, fence, stop) = (old_token.clone(), old_fence.clone(), stop.clone());
        zombies.spawn(async move {
            let mut refused = 0usize;
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) || i < 8 {
                let m = &host.mailbox;
                let refused_now = match (z as u64 + i) % 8 {
                    0 => retry(|| m.ack("d1", &t)).await.is_err(),
                    1 => retry(|| m.nack("d1", &t, 0, "zombie")).await.is_err(),
                    2 => retry(|| m.dead_letter("d1", &t, "zombie")).await.is_err(),
                    3 => retry(|| m.complete("d1", &t, RunResult::failure("zombie")))
                        .await
                        .is_err(),
                    4 => retry(|| m.record_start("d1", &t)).await.is_err(),
                    5 => !retry(|| m.extend_lease("d1", &t, 1_000_000)).await.unwrap(),
                    6 => matches!(
                        retry(|| m.supersede_claimed("d1", Some(&t), "zombie")).await,
                        Err(_) | Ok(None)
                    ),
                    _ => retry(|| host.log.append("t", b"zombie", Some(&fence)))
                        .await
                        .is_err(),
                };
                assert!(
                    refused_now,
                    "a zombie write was accepted (op {})",
                    (z as u64 + i) % 8
                );
                refused += 1;
                i += 1;
                tokio::task::yield_now().await;
            }
            refused
        });
    }
    let holder = hosts[2].clone();
    holder.mailbox.record_start("d1", &tok(&new)).await.unwrap();
    for i in 0..10u8 {
        let data = [b'n', i];
        retry(|| holder.log.append("t", &data, Some(&new_fence)))
            .await
            .unwrap();
        tokio::task::yield_now().await;
    }
    let result = RunResult::success(b"new holder".to_vec());
    let new_token = tok(&new);
    let acked = retry(|| holder.mailbox.complete("d1", &new_token, result.clone()))
        .await
        .unwrap();
    stop.store(true, Ordering::SeqCst);
    let refused: usize = join_all(zombies).await.into_iter().sum();
    assert!(refused >= 12 * 8);
    let stored = load(&hosts[0], "d1").await;
    assert_eq!(stored, acked);
    assert_eq!(stored.result, Some(result));
    assert_eq!(stored.attempt, 1);
    let entries = hosts[0].log.read("t", 0, 100).await.unwrap();
    assert_eq!(entries.len(), 10);
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(
            e.data,
            vec![b'n', i as u8],
            "only the live holder's writes are in the log"
        );
    }
}

/// Eight workers on three hosts draining one thread claim in priority-then-age order (the
/// thread's claims are serialized, so the order they observe is the claim order).
pub async fn claims_within_a_thread_follow_priority_then_age_under_concurrency<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(HOSTS).await;
    let mut expected = Vec::new();
    for i in 0..60usize {
        let priority = [128u8, 0, 50][(i * 7) % 3];
        let id = format!("d{:02}", (i * 37) % 60);
        let d = put(&hosts[i % HOSTS], nd("t", &id).with_priority(priority)).await;
        expected.push((d.priority, d.created_at, d.id));
        if i % 5 == 4 {
            env.advance(1);
        }
    }
    expected.sort();
    let expected: Vec<String> = expected.into_iter().map(|(_, _, id)| id).collect();
    let order: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let mut set = JoinSet::new();
    for w in 0..8usize {
        let host = hosts[w % HOSTS].clone();
        let order = order.clone();
        set.spawn(async move {
            let deadline = Deadline::new("worker loop");
            loop {
                deadline.check();
                if order.lock().unwrap().len() == 60 {
                    return;
                }
                match retry(|| host.mailbox.claim(AGENT, "w", LEASE))
                    .await
                    .unwrap()
                {
                    Some(d) => {
                        order.lock().unwrap().push(d.id.clone());
                        let t = tok(&d);
                        retry(|| host.mailbox.ack(&d.id, &t)).await.unwrap();
                    }
                    None => tokio::task::yield_now().await,
                }
            }
        });
    }
    join_all(set).await;
    assert_eq!(*order.lock().unwrap(), expected);
}

/// While the clock moves forward in steps and eight workers on three hosts claim as fast as
/// they can, nothing is claimed before its `available_at`, and everything is claimed once due.
pub async fn nothing_is_claimed_before_available_at_while_clock_moves<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(HOSTS).await;
    let total = 40usize;
    for i in 0..total {
        let delay = ((i * 13) % 21) as u64 * 10;
        put(
            &hosts[i % HOSTS],
            nd(&format!("t{}", i % 8), &format!("d{i:02}")).with_delay_ms(delay),
        )
        .await;
    }
    let done = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for w in 0..8usize {
        let host = hosts[w % HOSTS].clone();
        let done = done.clone();
        set.spawn(async move {
            let deadline = Deadline::new("worker loop");
            loop {
                deadline.check();
                if done.load(Ordering::SeqCst) == total {
                    return;
                }
                match retry(|| host.mailbox.claim(AGENT, "w", LEASE))
                    .await
                    .unwrap()
                {
                    Some(d) => {
                        let claimed_at = d.claim.as_ref().unwrap().lease_until - LEASE;
                        assert!(
                            d.available_at <= claimed_at,
                            "{} claimed at {claimed_at} before available_at {}",
                            d.id,
                            d.available_at
                        );
                        let t = tok(&d);
                        retry(|| host.mailbox.ack(&d.id, &t)).await.unwrap();
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                    None => tokio::task::yield_now().await,
                }
            }
        });
    }
    for _ in 0..50 {
        env.advance(5);
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }
    join_all(set).await;
    assert_eq!(all_in(&hosts[0], Status::Acked).await.len(), total);
}

/// Attempts never decrease and terminal states never change, observed continuously while
/// workers nack or crash and sweeps reclaim on three hosts; every dispatch dead-letters at
/// exactly `max_attempts`.
pub async fn attempts_never_decrease_under_concurrent_nack_and_reclaim<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(HOSTS).await;
    let n = 10usize;
    for i in 0..n {
        put(
            &hosts[0],
            nd(&format!("t{i}"), &format!("d{i}")).with_max_attempts(5),
        )
        .await;
    }
    let finished = Arc::new(AtomicBool::new(false));
    let clock = env.clock.clone();
    let mut set = JoinSet::new();
    for w in 0..6usize {
        let host = hosts[w % HOSTS].clone();
        let (finished, clock) = (finished.clone(), clock.clone());
        set.spawn(async move {
            let mut round = 0u64;
            while !finished.load(Ordering::SeqCst) {
                round += 1;
                let claimed = retry(|| host.mailbox.claim(AGENT, "w", LEASE))
                    .await
                    .unwrap();
                // One claim in three crashes its host: the sweep reclaims it.
                if let Some(d) = claimed.filter(|d| !mix(&d.id, round).is_multiple_of(3)) {
                    let now = homing::store::Clock::now_ms(&*clock);
                    let t = tok(&d);
                    match retry(|| host.mailbox.nack(&d.id, &t, now, "again")).await {
                        Ok(_) => {}
                        Err(err) if is_fenced(&err) => {}
                        Err(err) => panic!("nack: {err}"),
                    }
                }
                tokio::task::yield_now().await;
            }
        });
    }
    {
        let host = hosts[1].clone();
        let (finished, clock) = (finished.clone(), clock.clone());
        set.spawn(async move {
            while !finished.load(Ordering::SeqCst) {
                clock.advance(LEASE + 1);
                let now = homing::store::Clock::now_ms(&*clock);
                retry(|| host.mailbox.reclaim_expired(now, 100))
                    .await
                    .unwrap();
                for _ in 0..5 {
                    tokio::task::yield_now().await;
                }
            }
        });
    }
    let watcher = hosts[2].clone();
    let mut last: HashMap<String, (u32, Status)> = HashMap::new();
    let deadline = Deadline::new("watching attempts");
    loop {
        deadline.check();
        let records = all(&watcher).await;
        for d in &records {
            assert_shape(d);
            if let Some((attempt, status)) = last.get(&d.id) {
                assert!(
                    d.attempt >= *attempt,
                    "{}: attempt went from {attempt} to {}",
                    d.id,
                    d.attempt
                );
                if status.is_terminal() {
                    assert_eq!(d.status, *status, "{}: terminal state changed", d.id);
                }
            }
            last.insert(d.id.clone(), (d.attempt, d.status));
        }
        if records.iter().all(|d| d.status.is_terminal()) {
            break;
        }
        tokio::task::yield_now().await;
    }
    finished.store(true, Ordering::SeqCst);
    join_all(set).await;
    for d in all(&watcher).await {
        assert_eq!((d.status, d.attempt), (Status::DeadLetter, 5), "{}", d.id);
    }
}

/// Once `interrupt(thread)` has returned, no write of the older epoch lands: appends racing
/// the interrupt from three hosts stop at the watermark read right after it, and the old claim can
/// no longer start or ack.
pub async fn no_older_epoch_append_start_or_ack_after_interrupt_returns<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(HOSTS).await;
    put_on(&hosts[0], "t", "d1").await;
    let claimed = claim_some(&hosts[0]).await;
    let fence = Fence::of(&claimed).unwrap();
    let mut appenders = JoinSet::new();
    for a in 0..8usize {
        let host = hosts[a % HOSTS].clone();
        let fence = fence.clone();
        appenders.spawn(async move {
            let mut mine = Vec::new();
            let deadline = Deadline::new("appender");
            let mut i = 0u64;
            loop {
                deadline.check();
                i += 1;
                let data = format!("a{a}-{i}");
                match retry(|| host.log.append("t", data.as_bytes(), Some(&fence))).await {
                    Ok(seq) => mine.push(seq),
                    Err(err) if is_fenced(&err) => return mine,
                    Err(err) => panic!("append: {err}"),
                }
            }
        });
    }
    let deadline = Deadline::new("waiting for appends");
    while hosts[1].log.latest("t").await.unwrap() < 10 {
        deadline.check();
        tokio::task::yield_now().await;
    }
    let report = retry(|| hosts[2].mailbox.interrupt("t", "user interrupted"))
        .await
        .unwrap();
    assert_eq!(report.active.map(|d| d.id), Some("d1".to_owned()));
    let watermark = hosts[1].log.latest("t").await.unwrap();
    let appended: Vec<u64> = join_all(appenders).await.into_iter().flatten().collect();
    assert_eq!(
        hosts[0].log.latest("t").await.unwrap(),
        watermark,
        "an old-epoch append landed after the interrupt"
    );
    assert!(appended.iter().all(|&seq| seq <= watermark));
    let t = tok(&claimed);
    assert!(
        hosts[0].mailbox.record_start("d1", &t).await.is_err(),
        "started after the interrupt"
    );
    assert!(
        hosts[1].mailbox.ack("d1", &t).await.is_err(),
        "acked after the interrupt"
    );
    assert!(
        hosts[2]
            .log
            .append("t", b"late", Some(&fence))
            .await
            .is_err()
    );
    assert_eq!(load(&hosts[0], "d1").await.status, Status::Superseded);
}

/// Enqueues racing an interrupt: every enqueue that returned the old epoch was superseded by
/// that interrupt and reported by it; every one that returned the new epoch is queued.
pub async fn enqueue_racing_interrupt_leaves_no_stale_queued_dispatch<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(HOSTS).await;
    let count = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for p in 0..12usize {
        let host = hosts[p % HOSTS].clone();
        let count = count.clone();
        set.spawn(async move {
            let mut mine = Vec::new();
            for i in 0..20usize {
                let d = retry(|| host.mailbox.enqueue(nd("t", &format!("p{p}-{i}"))))
                    .await
                    .unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                mine.push((d.id, d.epoch));
                tokio::task::yield_now().await;
            }
            mine
        });
    }
    let deadline = Deadline::new("waiting for enqueues");
    while count.load(Ordering::SeqCst) < 30 {
        deadline.check();
        tokio::task::yield_now().await;
    }
    let report = retry(|| hosts[0].mailbox.interrupt("t", "racing"))
        .await
        .unwrap();
    assert_eq!(report.epoch, 1);
    let enqueued: Vec<(String, u64)> = join_all(set).await.into_iter().flatten().collect();
    let old: BTreeSet<String> = enqueued
        .iter()
        .filter(|(_, e)| *e == 0)
        .map(|(id, _)| id.clone())
        .collect();
    let superseded: BTreeSet<String> = report.superseded.iter().cloned().collect();
    assert!(old.len() >= 30);
    assert_eq!(
        superseded, old,
        "the interrupt reports exactly the older-epoch dispatches"
    );
    for (id, epoch) in &enqueued {
        let d = load(&hosts[1], id).await;
        match epoch {
            0 => assert_eq!(d.status, Status::Superseded, "{id}"),
            1 => assert_eq!(d.status, Status::Queued, "{id}"),
            other => panic!("{id}: epoch {other}"),
        }
    }
    assert!(
        all_in(&hosts[2], Status::Queued)
            .await
            .iter()
            .all(|d| d.epoch == 1)
    );
}

/// Enqueues, from `contenders` tasks on all hosts at once, dispatches `prefix-i` with one key.
async fn race_for_key(
    hosts: &[Store],
    thread: &str,
    prefix: &str,
    key: &str,
    contenders: usize,
) -> Vec<StoreResult<Dispatch>> {
    let barrier = Arc::new(Barrier::new(contenders));
    let mut set = JoinSet::new();
    for c in 0..contenders {
        let host = hosts[c % hosts.len()].clone();
        let barrier = barrier.clone();
        let new = nd(thread, &format!("{prefix}-{c}")).with_dedupe_key(key);
        set.spawn(async move {
            barrier.wait().await;
            retry(|| host.mailbox.enqueue(new.clone())).await
        });
    }
    join_all(set).await
}

/// Checks that exactly one of `results` won and every other names it as holder; returns it.
fn one_admitted(results: Vec<StoreResult<Dispatch>>) -> Dispatch {
    let mut winners = Vec::new();
    let mut holders = Vec::new();
    for result in results {
        match result {
            Ok(d) => winners.push(d),
            Err(StoreError::Duplicate {
                holder: Some(h), ..
            }) => holders.push(h),
            Err(err) => panic!("unexpected {err}"),
        }
    }
    assert_eq!(winners.len(), 1, "{} admitted", winners.len());
    let winner = winners.remove(0);
    assert!(
        holders.iter().all(|h| *h == winner.id),
        "losers must name the winner {}: {holders:?}",
        winner.id
    );
    winner
}

/// 32 concurrent enqueues of one (thread, key) from three hosts admit one.
pub async fn concurrent_enqueues_with_one_dedupe_key_admit_one<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(HOSTS).await;
    let winner = one_admitted(race_for_key(&hosts, "t", "c", "k", 32).await);
    let stored = all(&hosts[0]).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].id, winner.id);
}

/// The key is free again as soon as its holder is terminal (whatever way), round after round
/// of concurrent contenders.
pub async fn dedupe_key_is_reusable_round_after_round_under_concurrency<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(HOSTS).await;
    for round in 0..8usize {
        let winner = one_admitted(race_for_key(&hosts, "t", &format!("r{round}"), "k", 16).await);
        let host = &hosts[round % HOSTS];
        match round % 4 {
            0 => {
                let c = claim_id(host, &winner.id).await;
                host.mailbox.ack(&winner.id, &tok(&c)).await.unwrap();
            }
            1 => drop(host.mailbox.cancel(&winner.id).await.unwrap().unwrap()),
            2 => {
                let c = claim_id(host, &winner.id).await;
                host.mailbox
                    .dead_letter(&winner.id, &tok(&c), "x")
                    .await
                    .unwrap();
            }
            _ => drop(host.mailbox.interrupt("t", "next round").await.unwrap()),
        }
        assert!(load(host, &winner.id).await.status.is_terminal());
    }
    assert_eq!(all(&hosts[0]).await.len(), 8);
}

/// 64 concurrent enqueues on one thread from three hosts all land; a fresh instance claims
/// all 64, one at a time.
pub async fn concurrent_enqueues_on_one_thread_all_land<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(HOSTS).await;
    let mut set = JoinSet::new();
    for i in 0..64usize {
        let host = hosts[i % HOSTS].clone();
        set.spawn(async move {
            retry(|| host.mailbox.enqueue(nd("hot", &format!("d{i:02}"))))
                .await
                .unwrap()
        });
    }
    assert_eq!(join_all(set).await.len(), 64);
    drop(hosts);
    let fresh = env.open().await;
    let mut seen = BTreeSet::new();
    while let Some(d) = claim(&fresh).await {
        assert_eq!(claim(&fresh).await, None, "one claim per thread");
        fresh.mailbox.ack(&d.id, &tok(&d)).await.unwrap();
        assert!(seen.insert(d.id));
    }
    assert_eq!(seen.len(), 64);
}

/// Concurrent enqueues with distinct dedupe keys on one thread all persist.
pub async fn concurrent_enqueues_with_distinct_keys_all_persist<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(HOSTS).await;
    let barrier = Arc::new(Barrier::new(24));
    let mut set = JoinSet::new();
    for i in 0..24usize {
        let host = hosts[i % HOSTS].clone();
        let barrier = barrier.clone();
        set.spawn(async move {
            barrier.wait().await;
            retry(|| {
                host.mailbox
                    .enqueue(nd("t", &format!("d{i}")).with_dedupe_key(format!("k{i}")))
            })
            .await
            .unwrap()
        });
    }
    join_all(set).await;
    assert_eq!(all(&hosts[0]).await.len(), 24);
}

/// Twelve appenders on three hosts get unique sequences; concurrent readers
/// never see an entry before all committed entries below it (no gaps below what they see), and
/// never a torn or foreign content.
pub async fn log_concurrent_appenders_get_unique_sequences_and_readers_see_no_gaps<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(HOSTS).await;
    let writers_done = Arc::new(AtomicBool::new(false));
    let mut writers = JoinSet::new();
    for w in 0..12usize {
        let host = hosts[w % HOSTS].clone();
        writers.spawn(async move {
            let mut mine = Vec::new();
            for i in 0..25usize {
                let data = format!("writer {w} entry {i} ")
                    .repeat(1 + (i % 5))
                    .into_bytes();
                let seq = retry(|| host.log.append("t", &data, None)).await.unwrap();
                mine.push((seq, data));
            }
            mine
        });
    }
    let mut readers = JoinSet::new();
    for r in 0..3usize {
        let host = hosts[r % HOSTS].clone();
        let done = writers_done.clone();
        readers.spawn(async move {
            let mut snapshots = Vec::new();
            loop {
                let finished = done.load(Ordering::SeqCst);
                let latest = retry(|| host.log.latest("t")).await.unwrap();
                let entries = retry(|| host.log.read("t", 0, 100_000)).await.unwrap();
                assert!(
                    entries.windows(2).all(|w| w[0].seq < w[1].seq),
                    "read out of order"
                );
                let max = entries.last().map_or(0, |e| e.seq);
                assert!(max >= latest, "read saw less than latest {latest}");
                snapshots.push(entries);
                if finished {
                    return snapshots;
                }
                tokio::task::yield_now().await;
            }
        });
    }
    let committed: BTreeMap<u64, Vec<u8>> = {
        let mut map = BTreeMap::new();
        for (seq, data) in join_all(writers).await.into_iter().flatten() {
            assert!(
                map.insert(seq, data).is_none(),
                "sequence {seq} handed out twice"
            );
        }
        map
    };
    writers_done.store(true, Ordering::SeqCst);
    assert_eq!(committed.len(), 300);
    let snapshots: Vec<Vec<homing::store::LogEntry>> =
        join_all(readers).await.into_iter().flatten().collect();
    for entries in &snapshots {
        let max = entries.last().map_or(0, |e| e.seq);
        let seen: BTreeSet<u64> = entries.iter().map(|e| e.seq).collect();
        for seq in committed.range(..=max).map(|(seq, _)| *seq) {
            assert!(
                seen.contains(&seq),
                "entry {seq} missing below visible {max}"
            );
        }
        for e in entries {
            assert_eq!(
                committed.get(&e.seq),
                Some(&e.data),
                "entry {} is not what was committed",
                e.seq
            );
        }
    }
    let last = snapshots.last().expect("at least one snapshot");
    assert_eq!(last.len(), 300, "the final read sees everything");
    let final_read = hosts[0].log.read("t", 0, 100_000).await.unwrap();
    let final_map: BTreeMap<u64, Vec<u8>> =
        final_read.into_iter().map(|e| (e.seq, e.data)).collect();
    assert_eq!(final_map, committed);
    assert_eq!(
        hosts[1].log.latest("t").await.unwrap(),
        *committed.keys().last().unwrap()
    );
}

/// Concurrent append_expected calls with the same expectation admit exactly one; the others
/// get `Conflict` naming the new latest.
pub async fn concurrent_append_expected_with_same_expectation_admits_one<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(HOSTS).await;
    for round in 0..8usize {
        let expected = hosts[0].log.latest("t").await.unwrap();
        let barrier = Arc::new(Barrier::new(12));
        let mut set = JoinSet::new();
        for c in 0..12usize {
            let host = hosts[c % HOSTS].clone();
            let barrier = barrier.clone();
            set.spawn(async move {
                barrier.wait().await;
                let data = format!("round {round} contender {c}").into_bytes();
                retry(|| host.log.append_expected("t", &data, expected, None)).await
            });
        }
        let results = join_all(set).await;
        let winners: Vec<u64> = results
            .iter()
            .filter_map(|r| r.as_ref().ok().copied())
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        for r in &results {
            match r {
                Ok(_) => {}
                Err(StoreError::Conflict { latest }) => assert_eq!(*latest, winners[0]),
                Err(err) => panic!("unexpected {err}"),
            }
        }
        assert_eq!(hosts[1].log.latest("t").await.unwrap(), winners[0]);
    }
    assert_eq!(hosts[2].log.read("t", 0, 100).await.unwrap().len(), 8);
}

/// With appenders, a trimmer and a delete running on three hosts, observers always see
/// `reserved >= latest >= trimmed`, each watermark monotonic.
pub async fn log_watermarks_stay_ordered_and_monotonic_under_concurrency<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(HOSTS).await;
    let done = Arc::new(AtomicBool::new(false));
    let mut writers = JoinSet::new();
    for w in 0..6usize {
        let host = hosts[w % HOSTS].clone();
        writers.spawn(async move {
            for i in 0..30usize {
                let data = format!("{w}/{i}");
                retry(|| host.log.append("t", data.as_bytes(), None))
                    .await
                    .unwrap();
            }
        });
    }
    {
        let host = hosts[1].clone();
        writers.spawn(async move {
            for i in 0..40usize {
                let latest = retry(|| host.log.latest("t")).await.unwrap();
                retry(|| host.log.trim("t", latest.saturating_sub(5)))
                    .await
                    .unwrap();
                if i == 20 {
                    retry(|| host.log.delete("t")).await.unwrap();
                }
                tokio::task::yield_now().await;
            }
        });
    }
    let mut observers = JoinSet::new();
    for o in 0..2usize {
        let host = hosts[(o + 2) % HOSTS].clone();
        let done = done.clone();
        observers.spawn(async move {
            let mut prev = homing::store::Watermarks::default();
            let mut observations = 0usize;
            loop {
                let finished = done.load(Ordering::SeqCst);
                let w = retry(|| host.log.watermarks("t")).await.unwrap();
                assert!(
                    w.reserved >= w.latest && w.latest >= w.trimmed,
                    "disordered {w:?}"
                );
                assert!(
                    w.reserved >= prev.reserved
                        && w.latest >= prev.latest
                        && w.trimmed >= prev.trimmed,
                    "a watermark moved back: {prev:?} -> {w:?}"
                );
                let entries = retry(|| host.log.read("t", 0, 100_000)).await.unwrap();
                if let Some(first) = entries.first() {
                    assert!(
                        first.seq > w.trimmed,
                        "read an entry at or below an observed trim"
                    );
                }
                prev = w;
                observations += 1;
                if finished {
                    return observations;
                }
                tokio::task::yield_now().await;
            }
        });
    }
    join_all(writers).await;
    done.store(true, Ordering::SeqCst);
    assert!(join_all(observers).await.into_iter().all(|n| n > 0));
    let w = hosts[0].log.watermarks("t").await.unwrap();
    assert!(w.latest >= 180, "every append is counted: {w:?}");
    assert!(w.reserved >= w.latest && w.latest >= w.trimmed);
}

/// Instances opened while other hosts enqueue see every dispatch (no startup rebuild drops
/// one).
pub async fn instance_opened_during_enqueues_sees_every_dispatch<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(2).await;
    let mut set = JoinSet::new();
    for p in 0..4usize {
        let host = hosts[p % 2].clone();
        set.spawn(async move {
            for i in 0..25usize {
                retry(|| {
                    host.mailbox
                        .enqueue(nd(&format!("t{}", i % 3), &format!("p{p}-{i}")))
                })
                .await
                .unwrap();
                tokio::task::yield_now().await;
            }
        });
    }
    let mut late = Vec::new();
    for _ in 0..3 {
        late.push(env.open().await);
        tokio::task::yield_now().await;
    }
    join_all(set).await;
    for s in &late {
        assert_eq!(all(s).await.len(), 100);
        let mut threads = s.mailbox.queued_threads().await.unwrap();
        threads.sort();
        assert_eq!(threads, vec!["t0", "t1", "t2"]);
    }
}
