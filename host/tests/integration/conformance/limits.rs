//! Flow control (the contract, docs/contract.md, section 13): concurrency slots per key and per
//! named limit, token buckets, pauses, round robin across keys, T19 `release`, and the slots
//! and buckets the outbound HTTP client takes one request at a time. Caps and rates hold
//! exactly across instances (hosts); a claim held back holds nothing and counts no attempt.
//!
//! Time only moves through the [`ManualClock`]; nothing sleeps. Operations that report
//! `Contention` are retried (the contract's "retry later").

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use homing::store::limits::{Scope, agent_scope_name, named_scope_name};
use homing::store::{ClaimRequest, Gated, LimitSet, Rate, StoreError};
use tokio::task::JoinSet;

use super::*;

/// How long a polling loop may go without finishing before the test fails (a bound on failure,
/// never a wait).
const PATIENCE: Duration = Duration::from_secs(120);

/// A gated claim of `agent` under `limits` as [`WORKER`] with [`LEASE`].
async fn gated_as(store: &Store, agent: &str, limits: &LimitSet) -> Gated {
    let req = ClaimRequest {
        agent,
        consumer: WORKER,
        lease_ms: LEASE,
        start: false,
        limits,
        offer: None,
    };
    retry(|| store.mailbox.claim_gated(&req))
        .await
        .expect("claim_gated")
}

/// A gated claim of [`AGENT`].
async fn gated(store: &Store, limits: &LimitSet) -> Gated {
    gated_as(store, AGENT, limits).await
}

/// The id a gated claim took (`None` when it took nothing).
async fn gated_id(store: &Store, limits: &LimitSet) -> Option<String> {
    gated(store, limits).await.dispatch.map(|d| d.id)
}

/// A dispatch of [`AGENT`] on `thread` with concurrency key `key`.
fn keyed(thread: &str, id: &str, key: &str) -> NewDispatch {
    nd(thread, id).with_concurrency_key(key)
}

/// Per-key limits: `cap` running per key.
fn per_key(cap: u32) -> LimitSet {
    LimitSet {
        key_concurrency: Some(cap),
        ..LimitSet::default()
    }
}

/// Acks a claimed dispatch.
async fn ack(store: &Store, d: &Dispatch) {
    let t = tok(d);
    retry(|| store.mailbox.ack(&d.id, &t)).await.expect("ack");
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

pub async fn a_key_cap_is_never_exceeded_by_claimers_on_several_instances<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(3).await;
    let total = 18usize;
    for i in 0..total {
        let key = if i % 3 == 0 { "other" } else { "hot" };
        put(
            &hosts[i % 3],
            keyed(&format!("t{i:02}"), &format!("d{i:02}"), key),
        )
        .await;
    }
    let limits = Arc::new(per_key(2));
    let running: Arc<std::sync::Mutex<HashMap<String, usize>>> = Arc::default();
    let peak: Arc<std::sync::Mutex<HashMap<String, usize>>> = Arc::default();
    let acked = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for w in 0..6usize {
        let host = hosts[w % 3].clone();
        let (limits, running, peak, acked) =
            (limits.clone(), running.clone(), peak.clone(), acked.clone());
        set.spawn(async move {
            let deadline = Instant::now() + PATIENCE;
            while acked.load(Ordering::SeqCst) < total {
                assert!(Instant::now() < deadline, "claimers made no progress");
                let Some(d) = gated(&host, &limits).await.dispatch else {
                    tokio::task::yield_now().await;
                    continue;
                };
                let key = d.concurrency_key.clone().expect("a keyed dispatch");
                {
                    let mut r = running.lock().unwrap();
                    let n = r.entry(key.clone()).or_default();
                    *n += 1;
                    assert!(*n <= 2, "{n} running with key {key}");
                    let mut p = peak.lock().unwrap();
                    let top = p.entry(key.clone()).or_default();
                    *top = (*top).max(*n);
                }
                tokio::task::yield_now().await;
                *running.lock().unwrap().entry(key).or_default() -= 1;
                ack(&host, &d).await;
                acked.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    join_all(set).await;
    assert_eq!(all_in(&hosts[0], Status::Acked).await.len(), total);
    assert!(peak.lock().unwrap().values().all(|n| *n <= 2));
}

pub async fn a_slot_frees_on_ack_and_on_lease_expiry_and_a_waiting_dispatch_holds_none<
    F: Factory,
>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let store = env.open().await;
    for (t, id) in [("ta", "a"), ("tb", "b"), ("tc", "c")] {
        put(&store, keyed(t, id, "k")).await;
    }
    let limits = per_key(1);
    let first = gated(&store, &limits).await.dispatch.expect("a claim");
    assert_eq!(first.id, "a");
    let held = gated(&store, &limits).await;
    assert_eq!(held.dispatch, None, "the key's one slot is taken");
    assert_eq!(held.retry_at, None, "a full slot wakes claimers, no timer");
    // `throttled` names dispatches held back (a backend may name one per key).
    let throttled: BTreeSet<String> = held.throttled.into_iter().collect();
    assert!(
        !throttled.is_empty() && throttled.is_subset(&BTreeSet::from(["b".into(), "c".into()])),
        "{throttled:?}"
    );
    for id in ["b", "c"] {
        let waiting = load(&store, id).await;
        assert_eq!(waiting.status, Status::Queued);
        assert_eq!((waiting.attempt, waiting.claims), (0, 0), "{id}");
    }
    // An ack frees the slot.
    ack(&store, &first).await;
    let second = gated(&store, &limits).await.dispatch.expect("a claim");
    assert_eq!(second.id, "b");
    assert_eq!(gated_id(&store, &limits).await, None);
    // A holder that never settles frees it when its lease runs out: no release, no reclaim.
    env.advance(LEASE + 1);
    assert_eq!(gated_id(&store, &limits).await.as_deref(), Some("c"));
    assert_eq!(load(&store, "b").await.status, Status::Claimed);
    // Another instance (another host) agrees.
    let other = env.open().await;
    put(&other, keyed("td", "d", "k")).await;
    assert_eq!(gated_id(&other, &limits).await, None, "c holds the slot");
}

pub async fn a_rate_admits_its_burst_then_says_when_the_next_token_comes<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let store = env.open().await;
    for i in 0..5 {
        put_on(&store, &format!("t{i}"), &format!("d{i}")).await;
    }
    let limits = LimitSet {
        shared: vec![Scope {
            name: agent_scope_name(AGENT),
            concurrency: None,
            rate: Some(Rate::new(2, 1_000).with_burst(2)),
        }],
        ..LimitSet::default()
    };
    assert!(gated(&store, &limits).await.dispatch.is_some());
    assert!(gated(&store, &limits).await.dispatch.is_some());
    let empty = gated(&store, &limits).await;
    assert_eq!(empty.dispatch, None);
    assert_eq!(empty.retry_at, Some(env.now() + 500));
    let queued = all_in(&store, Status::Queued).await;
    assert_eq!(queued.len(), 3);
    assert!(queued.iter().all(|d| d.attempt == 0 && d.claims == 0));
    env.advance(499);
    assert_eq!(gated(&store, &limits).await.dispatch, None);
    env.advance(1);
    assert!(gated(&store, &limits).await.dispatch.is_some());
    let again = gated(&store, &limits).await;
    assert_eq!(again.dispatch, None);
    assert_eq!(again.retry_at, Some(env.now() + 500));
}

pub async fn a_rate_is_exact_across_two_instances<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(2).await;
    for i in 0..20 {
        put(
            &hosts[i % 2],
            keyed(&format!("t{i:02}"), &format!("d{i:02}"), "k"),
        )
        .await;
    }
    let limits = Arc::new(LimitSet {
        key_rate: Some(Rate::new(5, 10_000)),
        ..LimitSet::default()
    });
    let claimed = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for w in 0..8usize {
        let host = hosts[w % 2].clone();
        let (limits, claimed) = (limits.clone(), claimed.clone());
        set.spawn(async move {
            loop {
                let g = gated(&host, &limits).await;
                if g.dispatch.is_some() {
                    claimed.fetch_add(1, Ordering::SeqCst);
                    continue;
                }
                assert!(g.retry_at.is_some(), "held back by the rate: {g:?}");
                return;
            }
        });
    }
    join_all(set).await;
    assert_eq!(claimed.load(Ordering::SeqCst), 5, "the burst, exactly");
    // One token every 2 s.
    env.advance(2_000);
    assert!(gated(&hosts[1], &limits).await.dispatch.is_some());
    assert_eq!(gated(&hosts[0], &limits).await.dispatch, None);
    assert_eq!(all_in(&hosts[0], Status::Claimed).await.len(), 6);
}

pub async fn a_named_limit_is_shared_by_two_agents<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let store = env.open().await;
    for agent in ["a1", "a2"] {
        for i in 0..2 {
            let id = format!("{agent}-{i}");
            put(
                &store,
                NewDispatch::new(agent, format!("t-{id}"), Vec::new()).with_id(&id),
            )
            .await;
        }
    }
    let limits = LimitSet {
        shared: vec![Scope {
            name: named_scope_name("db"),
            concurrency: Some(2),
            rate: None,
        }],
        ..LimitSet::default()
    };
    let one = gated_as(&store, "a1", &limits).await.dispatch.expect("a1");
    let two = gated_as(&store, "a2", &limits).await.dispatch.expect("a2");
    assert_eq!(gated_as(&store, "a1", &limits).await.dispatch, None);
    let other = env.open().await;
    assert_eq!(gated_as(&other, "a2", &limits).await.dispatch, None);
    ack(&store, &one).await;
    let three = gated_as(&other, "a2", &limits).await.dispatch.expect("a2");
    assert_eq!(three.agent, "a2");
    assert_ne!(three.id, two.id);
    assert_eq!(gated_as(&store, "a1", &limits).await.dispatch, None);
}

pub async fn a_pause_of_an_agent_or_of_one_key_holds_back_only_what_it_names<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let store = env.open().await;
    let other = env.open().await;
    put(&store, keyed("tx", "x", "k1")).await;
    put(&store, keyed("ty", "y", "k2")).await;
    put_on(&store, "tz", "z").await;
    let none = LimitSet::default();
    let p = store
        .limits
        .pause(AGENT, Some("k1"), "upstream down")
        .await
        .expect("pause");
    assert_eq!(
        (p.key.as_deref(), p.reason.as_str()),
        (Some("k1"), "upstream down")
    );
    assert_eq!(other.limits.pauses().await.expect("pauses"), vec![p]);
    let mut got = BTreeSet::new();
    for _ in 0..2 {
        got.insert(gated_id(&other, &none).await.expect("an unpaused dispatch"));
    }
    assert_eq!(got, BTreeSet::from(["y".into(), "z".into()]));
    let held = gated(&other, &none).await;
    assert_eq!(held.dispatch, None);
    assert!(held.throttled.iter().all(|id| id == "x"), "{held:?}");
    assert_eq!(load(&store, "x").await.attempt, 0);
    assert!(
        store
            .limits
            .resume(AGENT, Some("k1"))
            .await
            .expect("resume")
    );
    assert!(
        !store
            .limits
            .resume(AGENT, Some("k1"))
            .await
            .expect("resume")
    );
    assert_eq!(gated_id(&other, &none).await.as_deref(), Some("x"));
    // The whole agent.
    put_on(&store, "tw", "w").await;
    store.limits.pause(AGENT, None, "").await.expect("pause");
    assert_eq!(gated_id(&other, &none).await, None);
    assert_eq!(
        gated_as(&other, "another", &none).await.dispatch,
        None,
        "nothing queued for another agent, and no error"
    );
    assert!(other.limits.resume(AGENT, None).await.expect("resume"));
    assert!(other.limits.pauses().await.expect("pauses").is_empty());
    assert_eq!(gated_id(&store, &none).await.as_deref(), Some("w"));
}

/// Claims from every claimer of `hosts` under `limits` until each is held back by a rate;
/// how many were claimed.
async fn claim_until_held(hosts: &[Store], limits: &Arc<LimitSet>) -> usize {
    let claimed = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for w in 0..8usize {
        let host = hosts[w % hosts.len()].clone();
        let (limits, claimed) = (limits.clone(), claimed.clone());
        set.spawn(async move {
            loop {
                let g = gated(&host, &limits).await;
                if g.dispatch.is_some() {
                    claimed.fetch_add(1, Ordering::SeqCst);
                    continue;
                }
                assert!(g.retry_at.is_some(), "held back by the rate: {g:?}");
                return;
            }
        });
    }
    join_all(set).await;
    claimed.load(Ordering::SeqCst)
}

pub async fn a_plugin_rate_never_exceeds_its_bucket_across_two_instances<F: Factory>(factory: &F) {
    // 100/s with a burst of 10: a backend may take its tokens in blocks (NATS takes 100 ms
    // worth, here the whole burst), but never more than the bucket holds.
    let env = Env::new(factory).await;
    let hosts = env.open_many(2).await;
    for i in 0..40 {
        put_on(&hosts[i % 2], &format!("t{i:02}"), &format!("d{i:02}")).await;
    }
    let limits = Arc::new(LimitSet {
        shared: vec![Scope {
            name: agent_scope_name(AGENT),
            concurrency: None,
            rate: Some(Rate::new(100, 1_000).with_burst(10)),
        }],
        ..LimitSet::default()
    });
    assert_eq!(
        claim_until_held(&hosts, &limits).await,
        10,
        "the burst, exactly"
    );
    // 50 ms refill 5 tokens, whichever host takes them.
    env.advance(50);
    assert_eq!(
        claim_until_held(&hosts, &limits).await,
        5,
        "the refill, exactly"
    );
    // A long quiet spell refills the bucket to its burst, no more.
    env.advance(60_000);
    assert_eq!(
        claim_until_held(&hosts, &limits).await,
        10,
        "the burst again"
    );
    assert_eq!(all_in(&hosts[0], Status::Claimed).await.len(), 25);
}

pub async fn every_small_key_is_served_before_the_big_keys_tenth_claim<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let store = env.open().await;
    for i in 0..50 {
        put(
            &store,
            keyed(&format!("big{i:02}"), &format!("big-{i:02}"), "big"),
        )
        .await;
    }
    for k in 0..5 {
        for i in 0..2 {
            let key = format!("small{k}");
            put(
                &store,
                keyed(&format!("{key}-{i}"), &format!("{key}-{i}"), &key),
            )
            .await;
        }
    }
    let limits = LimitSet {
        key_concurrency: Some(1_000),
        key_rate: Some(Rate::new(1_000, 1_000)),
        ..LimitSet::default()
    };
    let mut big = 0;
    let mut small = 0;
    while small < 10 {
        let d = gated(&store, &limits)
            .await
            .dispatch
            .expect("something claimable");
        if d.concurrency_key.as_deref() == Some("big") {
            big += 1;
            assert!(
                big < 10,
                "the big key's claim {big} came before every small key's"
            );
        } else {
            small += 1;
        }
    }
}

/// Keys and dispatches without a key (the key `""`) take turns: in every four claims each of
/// the three keys and the unkeyed dispatches get one.
pub async fn keys_and_unkeyed_dispatches_take_turns<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let store = env.open().await;
    for i in 0..4 {
        for key in ["a", "b", "c"] {
            put(
                &store,
                keyed(&format!("{key}{i}"), &format!("{key}-{i}"), key),
            )
            .await;
        }
        put(&store, nd(&format!("none{i}"), &format!("none-{i}"))).await;
    }
    let limits = per_key(1_000);
    let mut order = Vec::new();
    for _ in 0..16 {
        let d = gated(&store, &limits)
            .await
            .dispatch
            .expect("something claimable");
        order.push(d.concurrency_key.clone().unwrap_or_default());
        ack(&store, &d).await;
    }
    for (round, window) in order.chunks(4).enumerate() {
        let groups: BTreeSet<&str> = window.iter().map(String::as_str).collect();
        assert_eq!(
            groups,
            BTreeSet::from(["", "a", "b", "c"]),
            "round {round} of the claims ({order:?})"
        );
    }
}

/// A key that runs out of work and gets more keeps its place in the rotation: it does not come
/// back ahead of a key with a deep backlog each time (which would starve that key).
pub async fn a_key_that_goes_idle_and_returns_does_not_starve_a_deep_key<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let store = env.open().await;
    for i in 0..20 {
        put(
            &store,
            keyed(&format!("deep{i:02}"), &format!("deep-{i:02}"), "deep"),
        )
        .await;
    }
    put(&store, keyed("brief", "brief-0", "brief")).await;
    let limits = per_key(1_000);
    let mut deep = 0;
    for n in 0..20 {
        let d = gated(&store, &limits)
            .await
            .dispatch
            .expect("something claimable");
        ack(&store, &d).await;
        if d.concurrency_key.as_deref() == Some("deep") {
            deep += 1;
        } else {
            // The brief key is idle now; its next dispatch comes at once.
            put(&store, keyed("brief", &format!("brief-{}", n + 1), "brief")).await;
        }
    }
    assert!(
        deep >= 9,
        "the deep key got {deep} of 20 claims against a key that kept coming back"
    );
}

pub async fn release_requeues_without_an_attempt_honouring_available_at<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let store = env.open().await;
    put(&store, keyed("ta", "a", "k")).await;
    put(&store, keyed("tb", "b", "k")).await;
    let limits = per_key(1);
    let a = gated(&store, &limits).await.dispatch.expect("a");
    assert_eq!(a.id, "a");
    let token = tok(&a);
    let at = env.now() + 5_000;
    let back = retry(|| {
        store
            .mailbox
            .release(&a.id, &token, at, "upstream said 429")
    })
    .await
    .expect("release");
    assert_shape(&back);
    assert_eq!(back.status, Status::Queued);
    assert_eq!((back.attempt, back.claims), (0, 1));
    assert_eq!(back.available_at, env.now() + 5_000);
    assert!(
        back.last_error
            .as_deref()
            .is_some_and(|e| e.contains("upstream said 429")),
        "{back:?}"
    );
    // Its slot went with its claim.
    assert_eq!(gated_id(&store, &limits).await.as_deref(), Some("b"));
    let b = load(&store, "b").await;
    ack(&store, &b).await;
    assert_eq!(gated_id(&store, &limits).await, None, "a is not due yet");
    env.advance(5_000);
    let again = gated(&store, &limits).await.dispatch.expect("a again");
    assert_eq!(
        (again.id.as_str(), again.attempt, again.claims),
        ("a", 0, 2)
    );
}

pub async fn tokens_and_request_slots_are_exact_across_two_instances<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(2).await;
    let rate = Rate::new(3, 60_000);
    let mut set = JoinSet::new();
    for w in 0..10usize {
        let host = hosts[w % 2].clone();
        set.spawn(async move { retry(|| host.limits.take_token("http:api", &rate)).await });
    }
    let taken = join_all(set)
        .await
        .into_iter()
        .map(|r| r.expect("take_token"))
        .filter(Option::is_none)
        .count();
    assert_eq!(taken, 3);
    assert_eq!(
        retry(|| hosts[0].limits.take_token("http:api", &rate))
            .await
            .expect("take_token"),
        Some(env.now() + 20_000)
    );
    let until = env.now() + 60_000;
    let mut set = JoinSet::new();
    for w in 0..10usize {
        let host = hosts[w % 2].clone();
        set.spawn(async move {
            let holder = format!("req-{w}");
            let got = retry(|| host.limits.acquire_slot("http:slots", 2, &holder, until))
                .await
                .expect("acquire_slot");
            (holder, got)
        });
    }
    let winners: Vec<String> = join_all(set)
        .await
        .into_iter()
        .filter(|(_, got)| *got)
        .map(|(h, _)| h)
        .collect();
    assert_eq!(winners.len(), 2, "{winners:?}");
    let usage = retry(|| hosts[1].limits.usage("http:slots", None))
        .await
        .expect("usage");
    assert_eq!((usage.running, usage.tokens), (2, None));
    retry(|| hosts[1].limits.release_slot("http:slots", &winners[0]))
        .await
        .expect("release_slot");
    assert!(
        retry(|| hosts[0].limits.acquire_slot("http:slots", 2, "late", until))
            .await
            .expect("acquire_slot")
    );
    assert!(
        !retry(|| hosts[1]
            .limits
            .acquire_slot("http:slots", 2, "later", until))
        .await
        .expect("acquire_slot")
    );
    // A request slot ends at its expiry, released or not.
    env.advance(60_000);
    let usage = retry(|| hosts[0].limits.usage("http:slots", None))
        .await
        .expect("usage");
    assert_eq!(usage.running, 0);
    let usage = retry(|| hosts[0].limits.usage("http:api", Some(&rate)))
        .await
        .expect("usage");
    let tokens = usage.tokens.expect("a level");
    assert!(
        (tokens - 3.0).abs() < 1e-9,
        "refilled to the burst: {tokens}"
    );
}

pub async fn a_concurrency_key_over_128_bytes_is_invalid_at_enqueue<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let store = env.open().await;
    match store
        .mailbox
        .enqueue(keyed("t", "long", &"k".repeat(129)))
        .await
    {
        Err(StoreError::Invalid(message)) => assert!(
            message.contains("concurrency_key") && message.contains("128"),
            "the refusal must name concurrency_key and the limit: {message}"
        ),
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert!(all(&store).await.is_empty());
    let at_limit = put(&store, keyed("t", "ok", &"k".repeat(128))).await;
    assert_eq!(at_limit.concurrency_key.map(|k| k.len()), Some(128));
}

/// Enqueues `n` dispatches with key `key` on `n` threads (`t00`, `d00`, ...).
async fn put_keyed(host: &Store, n: usize, key: &str) {
    for i in 0..n {
        put(host, keyed(&format!("t{i:02}"), &format!("d{i:02}"), key)).await;
    }
}

/// Claims `limits` on `host` until it takes nothing; what it took.
async fn claim_all(host: &Store, limits: &LimitSet) -> Vec<Dispatch> {
    let mut taken = Vec::new();
    while let Some(d) = gated(host, limits).await.dispatch {
        taken.push(d);
        assert!(taken.len() <= 1_000, "claims never stopped");
    }
    taken
}

/// A key with a large cap (a NATS host then takes its slots in blocks, section 13.2): two
/// instances claiming in turn never hold more than the cap between them, and get all of it;
/// a slot freed by an ack goes to one more claim, not two.
pub async fn a_large_key_cap_holds_exactly_across_two_instances<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(2).await;
    put_keyed(&hosts[0], 48, "k").await;
    let limits = per_key(32);
    let mut held: Vec<Vec<Dispatch>> = vec![Vec::new(), Vec::new()];
    let mut idle = [false, false];
    let mut turn = 0;
    while !(idle[0] && idle[1]) {
        match gated(&hosts[turn], &limits).await.dispatch {
            Some(d) => held[turn].push(d),
            None => idle[turn] = true,
        }
        assert!(held[0].len() + held[1].len() <= 32, "past the cap");
        turn = 1 - turn;
    }
    assert_eq!(held[0].len() + held[1].len(), 32, "the whole cap was taken");
    ack(&hosts[0], &held[0][0]).await;
    let more =
        claim_all(&hosts[0], &limits).await.len() + claim_all(&hosts[1], &limits).await.len();
    assert_eq!(more, 1, "one slot was freed");
}

/// A claim that keeps extending its lease keeps it, however long it runs: on NATS a claim
/// taken under a slot block extends only as far as the block holds, and the block is held
/// longer as the lease is extended.
pub async fn a_lease_extended_again_and_again_under_a_large_key_cap_stays_alive<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let store = env.open().await;
    put(&store, keyed("t", "d", "k")).await;
    let limits = per_key(64);
    let d = gated(&store, &limits).await.dispatch.expect("a claim");
    let t = tok(&d);
    for round in 0..12 {
        env.advance(LEASE / 2);
        assert!(
            retry(|| store.mailbox.extend_lease("d", &t, LEASE))
                .await
                .expect("extend_lease"),
            "round {round}: the claim was lost"
        );
        let lease = load(&store, "d").await.claim.expect("claimed").lease_until;
        assert!(
            lease + 1_000 >= env.now() + LEASE,
            "round {round}: the lease was cut short: {} ms left",
            lease.saturating_sub(env.now())
        );
    }
    // The key still counts the claim: the two instances together take the rest of the cap,
    // no more (the first may keep a few of them in its block for its own claims).
    let other = env.open().await;
    for i in 0..70 {
        put(&other, keyed(&format!("o{i:02}"), &format!("o{i:02}"), "k")).await;
    }
    let theirs = claim_all(&other, &limits).await.len();
    let ours = claim_all(&store, &limits).await.len();
    assert_eq!(
        theirs + ours,
        63,
        "{theirs} + {ours} more claims beside the live one"
    );
}

/// An instance that holds a large key's whole cap and stops (a killed host) gives every slot
/// back by the time its claims' leases and its slot blocks have run out (three leases), and
/// never more than the cap in the meantime.
pub async fn a_stopped_instances_slots_of_a_large_key_free_within_three_leases<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(2).await;
    put_keyed(&hosts[0], 64, "k").await;
    let limits = per_key(32);
    assert_eq!(claim_all(&hosts[0], &limits).await.len(), 32);
    assert_eq!(
        claim_all(&hosts[1], &limits).await.len(),
        0,
        "the cap is held"
    );
    env.advance(LEASE + 1);
    let after_lease = claim_all(&hosts[1], &limits).await.len();
    assert!(
        (16..=32).contains(&after_lease),
        "after a lease: {after_lease} claims (a block may hold at most half the cap longer)"
    );
    env.advance(2 * LEASE);
    let late = claim_all(&hosts[1], &limits).await.len();
    assert_eq!(
        after_lease + late,
        32,
        "within three leases every slot is free"
    );
}

/// A claim whose lease ran out is not revived by an extension (issue 49, item 3): the slot of
/// its key may already be another claim's, and reviving it would run the key over its cap. The
/// expired claim was never reclaimed; a small cap and one of slot blocks on NATS.
pub async fn an_expired_claim_is_not_revived_once_its_key_slot_was_taken<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let store = env.open().await;
    for cap in [1u32, 32] {
        let key = format!("k{cap}");
        let limits = per_key(cap);
        for i in 0..=cap {
            let id = format!("{key}-{i:02}");
            put(&store, keyed(&id, &id, &key)).await;
        }
        let first = gated(&store, &limits).await.dispatch.expect("a claim");
        env.advance(LEASE / 2);
        let mut others = Vec::new();
        for _ in 1..cap {
            others.push(gated(&store, &limits).await.dispatch.expect("a claim"));
        }
        assert_eq!(
            gated_id(&store, &limits).await,
            None,
            "cap {cap}: the key is full"
        );
        env.advance(LEASE / 2 + 1);
        // `first`'s lease ran out: its slot is free, and the last dispatch takes it.
        let last = gated(&store, &limits)
            .await
            .dispatch
            .expect("the expired claim's slot is free");
        let first_token = tok(&first);
        assert!(
            !retry(|| store.mailbox.extend_lease(&first.id, &first_token, LEASE))
                .await
                .expect("extend_lease"),
            "cap {cap}: an expired claim was extended"
        );
        let d = load(&store, &first.id).await;
        assert!(
            d.claim.as_ref().is_none_or(|c| c.lease_until < env.now()),
            "cap {cap}: the expired lease was moved: {d:?}"
        );
        // The claims whose leases still run extend as before.
        for d in others.iter().chain([&last]) {
            let t = tok(d);
            assert!(
                retry(|| store.mailbox.extend_lease(&d.id, &t, LEASE))
                    .await
                    .expect("extend_lease"),
                "cap {cap}: a live claim could not extend"
            );
        }
    }
}

/// The lease boundary is one everywhere: a lease still runs at its last millisecond
/// (`lease_until == now`), when it extends and counts against its key's cap, and has run out one
/// millisecond later, when it neither extends nor holds its slot.
pub async fn a_lease_runs_at_its_last_millisecond_and_not_after<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let store = env.open().await;
    for (t, id) in [("ta", "a"), ("tb", "b")] {
        put(&store, keyed(t, id, "k")).await;
    }
    let limits = per_key(1);
    let a = gated(&store, &limits).await.dispatch.expect("a claim");
    let until = a.claim.as_ref().expect("claimed").lease_until;
    let a_token = tok(&a);
    env.set(until);
    assert_eq!(
        gated_id(&store, &limits).await,
        None,
        "a still holds the slot"
    );
    assert!(
        retry(|| store.mailbox.extend_lease("a", &a_token, 10))
            .await
            .expect("extend_lease"),
        "a lease extends at its last millisecond"
    );
    env.set(until + 11);
    assert_eq!(gated_id(&store, &limits).await.as_deref(), Some("b"));
    assert!(
        !retry(|| store.mailbox.extend_lease("a", &a_token, LEASE))
            .await
            .expect("extend_lease"),
        "an expired lease does not extend"
    );
}
