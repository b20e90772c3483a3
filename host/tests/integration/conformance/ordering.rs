//! Claim order and availability (the contract, docs/contract.md, guarantees 3.4 and 3.5).

use std::collections::BTreeMap;

use super::*;

/// Claims and acks until nothing is left; returns the claimed ids in order.
async fn drain(s: &Store) -> Vec<String> {
    let mut order = Vec::new();
    while let Some(d) = claim(s).await {
        s.mailbox.ack(&d.id, &tok(&d)).await.unwrap();
        order.push(d.id);
    }
    order
}

/// Nothing is claimed before `available_at`; at exactly `available_at` it is.
pub async fn claim_skips_dispatch_until_its_available_at<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, nd("t", "delayed").with_delay_ms(1_000)).await;
    assert_eq!(claim(&s).await, None);
    env.advance(999);
    assert_eq!(claim(&s).await, None, "one ms early");
    env.advance(1);
    assert_eq!(claim_some(&s).await.id, "delayed");
}

/// A lower priority number wins over an older dispatch.
pub async fn lower_priority_number_wins_over_older_dispatch<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, nd("t", "old").with_priority(100)).await;
    env.advance(50);
    put(&s, nd("t", "urgent").with_priority(10)).await;
    assert_eq!(drain(&s).await, vec!["urgent", "old"]);
}

/// Same priority is claimed strictly oldest `created_at` first.
pub async fn same_priority_is_claimed_oldest_first<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    // Ids in reverse order so that only created_at can explain the result.
    for i in (0..5).rev() {
        put_on(&s, "t", &format!("d{i}")).await;
        env.advance(1);
    }
    assert_eq!(drain(&s).await, vec!["d4", "d3", "d2", "d1", "d0"]);
}

/// Same priority and same `created_at`: lowest id first.
pub async fn same_priority_and_age_is_claimed_lowest_id_first<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    for id in ["m", "z", "a", "k"] {
        put_on(&s, "t", id).await;
    }
    assert_eq!(drain(&s).await, vec!["a", "k", "m", "z"]);
}

/// Priorities 200, 10, 128 are claimed as 10, 128, 200.
pub async fn three_priorities_are_claimed_in_order<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, nd("t", "p200").with_priority(200)).await;
    put(&s, nd("t", "p10").with_priority(10)).await;
    put(&s, nd("t", "p128").with_priority(128)).await;
    assert_eq!(drain(&s).await, vec!["p10", "p128", "p200"]);
}

/// While one dispatch of a thread is claimed, no other of that thread is; after
/// the ack the next (FIFO) one is claimable.
pub async fn busy_thread_blocks_its_other_dispatches_until_ack<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "first").await;
    env.advance(1);
    put_on(&s, "t", "second").await;
    let first = claim_some(&s).await;
    assert_eq!(first.id, "first");
    assert_eq!(claim(&s).await, None);
    s.mailbox.ack("first", &tok(&first)).await.unwrap();
    assert_eq!(claim_some(&s).await.id, "second");
}

/// Claims on two threads succeed independently, with distinct tokens.
pub async fn claims_on_different_threads_are_independent<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t1", "a").await;
    put_on(&s, "t2", "b").await;
    put_on(&s, "t3", "c").await;
    let a = claim_some(&s).await;
    let b = claim_some(&s).await;
    let c = claim_id(&s, "c").await;
    let mut threads = vec![a.thread.clone(), b.thread.clone(), c.thread.clone()];
    threads.sort();
    assert_eq!(threads, vec!["t1", "t2", "t3"]);
    assert_ne!(tok(&a), tok(&b));
    assert_ne!(tok(&b), tok(&c));
    assert_ne!(tok(&a), tok(&c));
}

/// Claim_dispatch of a sibling on a busy thread is `None`.
pub async fn claim_dispatch_of_sibling_on_busy_thread_is_none<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "a").await;
    let sibling = put_on(&s, "t", "b").await;
    let a = claim_id(&s, "a").await;
    assert_eq!(
        s.mailbox.claim_dispatch("b", WORKER, LEASE).await.unwrap(),
        None
    );
    assert_eq!(load(&s, "b").await, sibling);
    s.mailbox.ack("a", &tok(&a)).await.unwrap();
    assert_eq!(claim_id(&s, "b").await.id, "b");
}

/// Across threads, the most urgent available dispatch goes first.
pub async fn claim_prefers_most_urgent_dispatch_across_threads<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, nd("t-a", "old-10").with_priority(10)).await;
    env.advance(10);
    put(&s, nd("t-b", "new-5").with_priority(5)).await;
    put(&s, nd("t-c", "new-200").with_priority(200)).await;
    assert_eq!(claim_some(&s).await.id, "new-5");
    assert_eq!(claim_some(&s).await.id, "old-10");
    assert_eq!(claim_some(&s).await.id, "new-200");
}

/// A delayed urgent dispatch does not hide an available sibling of its thread.
pub async fn delayed_urgent_dispatch_does_not_block_available_sibling<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(
        &s,
        nd("t", "urgent-later")
            .with_priority(0)
            .with_delay_ms(1_000),
    )
    .await;
    put(&s, nd("t", "now").with_priority(200)).await;
    let d = claim_some(&s).await;
    assert_eq!(d.id, "now");
    s.mailbox.ack("now", &tok(&d)).await.unwrap();
    assert_eq!(claim(&s).await, None);
    env.advance(1_000);
    assert_eq!(claim_some(&s).await.id, "urgent-later");
}

/// Homing's choice among equal priorities, the least recently served thread first: a
/// lone dispatch behind a thread with 1,000 queued dispatches waits at most one claim.
pub async fn fairness_lone_dispatch_waits_at_most_one_claim_behind_a_thousand<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    for i in 0..1_000 {
        put_on(&s, "hot", &format!("h{i:04}")).await;
    }
    env.advance(1);
    put_on(&s, "cold", "lone").await;
    let mut position = None;
    for n in 1..=10 {
        let d = claim_some(&s).await;
        s.mailbox.ack(&d.id, &tok(&d)).await.unwrap();
        if d.id == "lone" {
            position = Some(n);
            break;
        }
        assert_eq!(d.thread, "hot");
    }
    let position = position.expect("the lone dispatch was not claimed within 10 claims");
    assert!(
        position <= 2,
        "the lone dispatch waited {} claims",
        position - 1
    );
    // It is not a one-off: after serving the hot thread a while, a new lone dispatch is served
    // before the hot thread's next one again.
    for _ in 0..5 {
        let d = claim_some(&s).await;
        assert_eq!(d.thread, "hot");
        s.mailbox.ack(&d.id, &tok(&d)).await.unwrap();
    }
    put_on(&s, "cold", "lone-2").await;
    let d = claim_some(&s).await;
    assert_eq!(
        d.id, "lone-2",
        "the hot thread was served last, the cold one never"
    );
}

/// With several busy threads, a lone dispatch waits at most one claim per competing thread.
pub async fn fairness_lone_dispatch_waits_at_most_one_claim_per_competing_thread<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let competing = 4;
    for t in 0..competing {
        for i in 0..50 {
            put_on(&s, &format!("hot{t}"), &format!("h{t}-{i:02}")).await;
        }
    }
    env.advance(1);
    put_on(&s, "cold", "lone").await;
    let mut waited = 0;
    loop {
        let d = claim_some(&s).await;
        s.mailbox.ack(&d.id, &tok(&d)).await.unwrap();
        if d.id == "lone" {
            break;
        }
        waited += 1;
        assert!(
            waited <= competing,
            "the lone dispatch waited more than {competing} claims"
        );
    }
}

/// Busy threads of equal priority are served in turn: every window of as many claims as
/// threads serves each thread once.
pub async fn busy_threads_of_equal_priority_are_served_round_robin<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let threads = ["ta", "tb", "tc"];
    for t in threads {
        for i in 0..6 {
            put_on(&s, t, &format!("{t}-{i}")).await;
        }
    }
    let mut served = Vec::new();
    for _ in 0..18 {
        let d = claim_some(&s).await;
        s.mailbox.ack(&d.id, &tok(&d)).await.unwrap();
        served.push(d.thread);
    }
    for window in served.chunks(3) {
        let mut w = window.to_vec();
        w.sort();
        assert_eq!(w, threads, "unfair service order: {served:?}");
    }
    let mut per_thread: BTreeMap<&str, usize> = BTreeMap::new();
    for t in &served {
        *per_thread.entry(t.as_str()).or_default() += 1;
    }
    assert!(per_thread.values().all(|&n| n == 6));
}

/// Fairness only orders threads whose best dispatch has the same priority;
/// a more urgent thread is always served first.
pub async fn priority_outranks_fairness<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    for i in 0..5 {
        put(&s, nd("urgent", &format!("u{i}")).with_priority(0)).await;
    }
    put(&s, nd("calm", "c0").with_priority(128)).await;
    let order = drain(&s).await;
    assert_eq!(order, vec!["u0", "u1", "u2", "u3", "u4", "c0"]);
}

/// Claim follows the authoritative priority order whichever instance enqueued what.
pub async fn claim_follows_priority_across_instances<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let (a, b) = (env.open().await, env.open().await);
    put(&a, nd("t", "low").with_priority(200)).await;
    env.advance(1);
    put(&b, nd("t", "high").with_priority(1)).await;
    assert_eq!(claim_some(&a).await.id, "high");
}

/// A clock that steps back (NTP, an operator) releases nothing early: a dispatch enqueued at
/// T0+5000 is not claimable at T0+1000, on the instance that enqueued it and on a fresh one,
/// and is claimable again once the clock passes T0+5000.
pub async fn clock_stepping_back_releases_nothing_before_its_available_at<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    env.clock.set(T0 + 5_000);
    put(&s, nd("t", "d1")).await;
    env.clock.set(T0 + 1_000);
    assert_eq!(claim(&s).await, None, "claimed before its available_at");
    let other = env.open().await;
    assert_eq!(
        claim(&other).await,
        None,
        "another instance claimed it early"
    );
    env.clock.set(T0 + 5_000);
    assert_eq!(claim_some(&s).await.id, "d1");
}

/// A dispatch once found due and then passed over (its thread was busy) is re-checked at the
/// next claim: after the clock steps back before its `available_at`, it waits.
pub async fn clock_stepping_back_holds_a_dispatch_already_found_due<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    env.clock.set(T0 + 5_000);
    put(&s, nd("t", "e1").with_priority(0)).await;
    put(&s, nd("t", "e2").with_priority(1)).await;
    let e1 = claim_some(&s).await;
    assert_eq!(e1.id, "e1");
    s.mailbox.ack(&e1.id, &tok(&e1)).await.unwrap();
    env.clock.set(T0 + 1_000);
    assert_eq!(claim(&s).await, None, "e2 claimed before its available_at");
    // A dispatch that is due keeps being served meanwhile.
    put(&s, nd("u", "now")).await;
    assert_eq!(claim_some(&s).await.id, "now");
    env.clock.set(T0 + 5_000);
    assert_eq!(claim_some(&s).await.id, "e2");
}
