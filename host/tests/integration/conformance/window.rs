//! Debounce windows (docs/contract.md section 2.2): a debounced enqueue joins the open window
//! of its (thread, key) or opens one; a claim closes it; every item lands in exactly one run.

use std::collections::BTreeSet;

use homing::store::model::{Debounce, Gather};
use homing::store::{NewDispatch, Status, Store, StoreError};

use super::*;

fn debounced(thread: &str, payload: &str, d: &Debounce) -> NewDispatch {
    NewDispatch::new(AGENT, thread, payload.as_bytes().to_vec()).with_debounce(d.clone())
}

fn window(key: &str, quiet_ms: u64, max_wait_ms: u64, payload: Gather, max_items: u32) -> Debounce {
    Debounce {
        payload,
        max_items,
        ..Debounce::new(key, quiet_ms, max_wait_ms)
    }
}

fn items(d: &Dispatch) -> Vec<String> {
    d.window
        .as_ref()
        .map(|w| {
            w.items
                .iter()
                .map(|i| String::from_utf8_lossy(&i.payload).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Enqueues with one key join one dispatch, due a quiet time after the latest and no later
/// than the longest wait after the first; `last` carries the latest payload, `first` the
/// first's. Other keys and other threads have windows of their own.
pub async fn a_debounced_enqueue_joins_the_open_window_due_after_quiet_and_by_max_wait<
    F: Factory,
>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let last = window("k", 1_000, 3_000, Gather::Last, 100);
    let a = put(&s, debounced("t", "one", &last)).await;
    assert_eq!(a.available_at, T0 + 1_000);
    env.advance(900);
    let b = put(&s, debounced("t", "two", &last)).await;
    assert_eq!(b.id, a.id, "joined: answered with the window");
    assert_eq!(b.window.as_ref().map(|w| w.count), Some(2));
    assert_eq!(b.available_at, T0 + 1_900);
    env.advance(900);
    let c = put(&s, debounced("t", "three", &last)).await;
    assert_eq!(c.id, a.id);
    assert_eq!(c.payload, b"three");
    // Another key, and another thread, open windows of their own.
    let first = window("other", 1_000, 3_000, Gather::First, 100);
    let o = put(&s, debounced("t", "x", &first)).await;
    assert_ne!(o.id, a.id);
    let o2 = put(&s, debounced("t", "y", &first)).await;
    assert_eq!(
        (o2.id.as_str(), o2.payload.as_slice()),
        (o.id.as_str(), &b"x"[..])
    );
    let elsewhere = put(&s, debounced("u", "z", &last)).await;
    assert_ne!(elsewhere.id, a.id);
    env.advance(900);
    put(&s, debounced("t", "four", &last)).await;
    assert_eq!(
        load(&s, &a.id).await.available_at,
        T0 + 3_000,
        "the longest wait caps the quiet time"
    );
    env.set(T0 + 2_999);
    // The other two windows are due (T0 + 2,800); this one not yet.
    let mut early = Vec::new();
    while let Some(d) = claim(&s).await {
        s.mailbox.ack(&d.id, &tok(&d)).await.expect("ack");
        early.push(d.id);
    }
    assert_eq!(early.len(), 2);
    assert!(!early.contains(&a.id), "not due before its longest wait");
    env.set(T0 + 3_000);
    let d = claim_some(&s).await;
    assert_eq!(d.id, a.id);
    assert_eq!(d.payload, b"four");
    assert_eq!(d.window.as_ref().map(|w| w.count), Some(4));
    // The claim closed it: the next enqueue opens another window.
    let next = put(&s, debounced("t", "five", &last)).await;
    assert_ne!(next.id, a.id);
    assert_eq!(next.window.as_ref().map(|w| w.count), Some(1));
}

/// `collect` keeps every item in arrival order; a nack queues the window again closed, with the
/// same items, and a later enqueue opens the next window instead of joining a retried run.
pub async fn a_collect_window_keeps_every_item_across_a_retry<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let collect = window("k", 100, 1_000, Gather::Collect, 100);
    let mut id = String::new();
    for n in 0..5 {
        id = put(&s, debounced("t", &format!("item {n}"), &collect))
            .await
            .id;
    }
    env.advance(100);
    let d = claim_some(&s).await;
    assert_eq!(d.id, id);
    let want: Vec<String> = (0..5).map(|n| format!("item {n}")).collect();
    assert_eq!(items(&d), want);
    assert_eq!(d.payload, b"item 4", "the payload is the latest item");
    s.mailbox
        .nack(&d.id, &tok(&d), env.now(), "try again")
        .await
        .expect("nack");
    let next = put(&s, debounced("t", "item 5", &collect)).await;
    assert_ne!(next.id, d.id, "a retried window stays closed");
    env.advance(60_000);
    let again = claim_id(&s, &d.id).await;
    assert_eq!(items(&again), want, "the retry has the same items");
    assert_eq!(items(&load(&s, &next.id).await), vec!["item 5".to_owned()]);
}

/// `max_items` seals a window, due at once; the next enqueue opens another. A window is one
/// agent's: another agent's enqueue with its key is refused naming it, and bad settings are
/// refused naming the field, storing nothing.
pub async fn a_full_window_is_sealed_and_bad_windows_are_refused<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let small = window("k", 1_000, 5_000, Gather::Last, 2);
    let a = put(&s, debounced("t", "one", &small)).await;
    let full = put(&s, debounced("t", "two", &small)).await;
    assert_eq!(full.id, a.id);
    let w = full.window.as_ref().unwrap();
    assert!(w.sealed);
    assert_eq!(full.available_at, T0, "sealed: due at once");
    let b = put(&s, debounced("t", "three", &small)).await;
    assert_ne!(b.id, a.id);
    assert_eq!(claim_some(&s).await.id, a.id);

    let stranger =
        NewDispatch::new("someone-else", "t", b"x".to_vec()).with_debounce(small.clone());
    match s.mailbox.enqueue(stranger).await {
        Err(StoreError::Invalid(m)) => assert!(m.starts_with("debounce.key"), "{m}"),
        other => panic!("expected Invalid, got {other:?}"),
    }
    for (bad, field) in [
        (window("k", 6_000, 5_000, Gather::Last, 2), "debounce.quiet"),
        (
            window("k", 1, 8 * 86_400_000, Gather::Last, 2),
            "debounce.max_wait",
        ),
        (window("k", 1, 5, Gather::Last, 0), "debounce.max_items"),
        (window("", 1, 5, Gather::Last, 2), "debounce.key"),
        (
            window(&"k".repeat(257), 1, 5, Gather::Last, 2),
            "debounce.key",
        ),
    ] {
        match s.mailbox.enqueue(debounced("v", "x", &bad)).await {
            Err(StoreError::Invalid(m)) => assert!(m.starts_with(field), "{m}"),
            other => panic!("expected Invalid naming {field}, got {other:?}"),
        }
    }
    let with_delay = debounced("v", "x", &small).with_delay_ms(5);
    assert!(matches!(
        s.mailbox.enqueue(with_delay).await,
        Err(StoreError::Invalid(_))
    ));
    assert!(
        all(&s).await.iter().all(|d| d.thread != "v"),
        "nothing stored"
    );
}

/// Runs every due window of `store` to its end, returning the items each run had.
async fn drain(store: &Store) -> Vec<Vec<String>> {
    let mut runs = Vec::new();
    while let Some(d) = claim(store).await {
        runs.push(items(&d));
        store.mailbox.ack(&d.id, &tok(&d)).await.expect("ack");
    }
    runs
}

/// Enqueues every `quiet - 1` ms from two hosts for ten `max_wait` periods make a run every
/// `max_wait`: the quiet time never passes, the longest wait ends each window; each item is in
/// exactly one run, in order.
pub async fn steady_enqueues_from_two_hosts_make_a_run_every_max_wait<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(2).await;
    let collect = window("k", 100, 1_000, Gather::Collect, 10_000);
    let mut runs = Vec::new();
    let mut sent = Vec::new();
    let mut n = 0;
    while env.now() < T0 + 10_000 {
        let item = format!("{n:05}");
        put(&hosts[n % 2], debounced("t", &item, &collect)).await;
        sent.push(item);
        n += 1;
        env.advance(99);
        runs.extend(drain(&hosts[n % 2]).await);
    }
    env.advance(1_000);
    runs.extend(drain(&hosts[0]).await);
    assert!(
        (9..=11).contains(&runs.len()),
        "a run every max_wait: {} runs",
        runs.len()
    );
    let got: Vec<String> = runs.concat();
    assert_eq!(got, sent, "each item in exactly one run, in order");
}

/// An enqueue racing its window's claim on another host lands in the claimed run or in the
/// next window: never both, never neither.
pub async fn an_enqueue_racing_its_windows_claim_lands_in_exactly_one_run<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(2).await;
    let collect = window("k", 10, 1_000, Gather::Collect, 10_000);
    let mut sent = BTreeSet::new();
    let mut got = Vec::new();
    for round in 0..20 {
        let first = format!("{round}-a");
        put(&hosts[0], debounced("t", &first, &collect)).await;
        sent.insert(first);
        env.advance(10);
        let racer = format!("{round}-b");
        sent.insert(racer.clone());
        let (claimed, joined) = tokio::join!(
            claim(&hosts[0]),
            hosts[1].mailbox.enqueue(debounced("t", &racer, &collect))
        );
        joined.expect("the racing enqueue is stored");
        if let Some(d) = claimed {
            got.extend(items(&d));
            hosts[0].mailbox.ack(&d.id, &tok(&d)).await.expect("ack");
        }
        env.advance(1_000);
        for run in drain(&hosts[1]).await {
            got.extend(run);
        }
    }
    let unique: BTreeSet<String> = got.iter().cloned().collect();
    assert_eq!(unique.len(), got.len(), "no item in two runs");
    assert_eq!(unique, sent, "no item lost");
    assert!(
        all_in(&hosts[0], Status::Queued).await.is_empty(),
        "every window ran"
    );
}
