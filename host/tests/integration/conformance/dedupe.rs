//! Dedupe keys: at most one non-terminal dispatch per (thread, key) (the contract,
//! docs/contract.md, sections 1, 2 and guarantee 3.8).

use homing::store::{RunResult, Status, StoreError};

use super::*;

fn keyed(thread: &str, id: &str, key: &str) -> homing::store::NewDispatch {
    nd(thread, id).with_dedupe_key(key)
}

/// Asserts that enqueuing `id` with `key` on `thread` is refused as a duplicate held by `holder`.
async fn assert_held(s: &Store, thread: &str, id: &str, key: &str, holder: &str) {
    match s.mailbox.enqueue(keyed(thread, id, key)).await {
        Err(StoreError::Duplicate { id: got, holder: h }) => {
            assert_eq!(got, id);
            assert_eq!(h.as_deref(), Some(holder), "the live holder is named");
        }
        other => panic!("expected Duplicate held by {holder}, got {other:?}"),
    }
    assert_eq!(
        s.mailbox.load(id).await.unwrap(),
        None,
        "a refused enqueue stores nothing"
    );
}

/// Asserts that `key` on `thread` is free: a new dispatch with it is admitted.
async fn assert_free(s: &Store, thread: &str, id: &str, key: &str) {
    match s.mailbox.enqueue(keyed(thread, id, key)).await {
        Ok(d) => assert_eq!(d.status, Status::Queued),
        Err(err) => panic!("key {key} should be free on {thread}: {err}"),
    }
}

/// A second enqueue with a live dispatch's key on the same thread is
/// `Duplicate { holder }`, queued or claimed.
pub async fn dedupe_key_held_by_live_dispatch_is_duplicate_with_holder<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, keyed("t", "first", "k")).await;
    assert_held(&s, "t", "second", "k", "first").await;
    let c = claim_some(&s).await;
    assert_held(&s, "t", "third", "k", "first").await;
    assert_free(&s, "t", "other-key", "k2").await;
    s.mailbox.ack("first", &tok(&c)).await.unwrap();
}

/// The key is scoped per thread.
pub async fn dedupe_key_is_scoped_per_thread<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, keyed("t1", "a", "k")).await;
    assert_free(&s, "t2", "b", "k").await;
    assert_held(&s, "t1", "c", "k", "a").await;
    assert_held(&s, "t2", "d", "k", "b").await;
}

/// A nack that requeues and a reclaim that requeues keep the key held (still live).
pub async fn dedupe_key_stays_held_across_nack_and_lease_reclaim<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, keyed("t", "holder", "k").with_max_attempts(5)).await;
    let c = claim_some(&s).await;
    s.mailbox
        .nack("holder", &tok(&c), env.now(), "retry")
        .await
        .unwrap();
    assert_held(&s, "t", "x1", "k", "holder").await;
    s.mailbox.claim(AGENT, WORKER, 100).await.unwrap().unwrap();
    env.advance(101);
    assert_eq!(
        s.mailbox
            .reclaim_expired(env.now(), 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(load(&s, "holder").await.status, Status::Queued);
    assert_held(&s, "t", "x2", "k", "holder").await;
}

/// Ack, complete and dead_letter release the key at once.
pub async fn dedupe_key_is_free_after_ack_complete_and_dead_letter<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    for (i, op) in ["ack", "complete", "dead_letter"].into_iter().enumerate() {
        let thread = format!("t{i}");
        let id = format!("{op}-holder");
        put(&s, keyed(&thread, &id, "k")).await;
        let c = claim_id(&s, &id).await;
        let t = tok(&c);
        match op {
            "ack" => drop(s.mailbox.ack(&id, &t).await.unwrap()),
            "complete" => drop(
                s.mailbox
                    .complete(&id, &t, RunResult::success(vec![]))
                    .await
                    .unwrap(),
            ),
            _ => drop(s.mailbox.dead_letter(&id, &t, "x").await.unwrap()),
        }
        assert_free(&s, &thread, &format!("{op}-next"), "k").await;
    }
}

/// The key is free once its holder is cancelled.
pub async fn dedupe_key_is_free_after_cancel<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, keyed("t", "a", "k")).await;
    s.mailbox.cancel("a").await.unwrap().unwrap();
    assert_free(&s, "t", "b", "k").await;
    assert_held(&s, "t", "c", "k", "b").await;
}

/// Holders superseded by an interrupt release their keys; the next enqueue is claimable.
pub async fn dedupe_key_is_free_after_interrupt_supersedes_holder<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, keyed("t", "old", "k")).await;
    s.mailbox.interrupt("t", "r").await.unwrap();
    assert_free(&s, "t", "new", "k").await;
    let c = claim_some(&s).await;
    assert_eq!(c.id, "new");
    assert_eq!(c.epoch, 1);
}

/// Dead-lettering by exhausted attempts (nack or lease expiry) releases the key.
pub async fn dedupe_key_is_free_after_attempts_are_exhausted<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, keyed("t1", "n", "k").with_max_attempts(1)).await;
    let c = claim_id(&s, "n").await;
    assert_eq!(
        s.mailbox
            .nack("n", &tok(&c), env.now(), "x")
            .await
            .unwrap()
            .status,
        Status::DeadLetter
    );
    assert_free(&s, "t1", "n2", "k").await;
    put(&s, keyed("t2", "r", "k").with_max_attempts(1)).await;
    s.mailbox
        .claim_dispatch("r", WORKER, 100)
        .await
        .unwrap()
        .unwrap();
    env.advance(101);
    s.mailbox.reclaim_expired(env.now(), 100).await.unwrap();
    assert_eq!(load(&s, "r").await.status, Status::DeadLetter);
    assert_free(&s, "t2", "r2", "k").await;
}

/// An interrupted but still claimed holder keeps its key until it is superseded (here by its
/// own refused write).
pub async fn dedupe_key_of_stale_claimed_holder_stays_held_until_superseded<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, keyed("t", "running", "k")).await;
    let c = claim_some(&s).await;
    let report = s.mailbox.interrupt("t", "r").await.unwrap();
    assert!(report.superseded.is_empty());
    assert_eq!(report.active.map(|d| d.id), Some("running".to_owned()));
    assert_held(&s, "t", "next", "k", "running").await;
    assert!(matches!(
        s.mailbox.ack("running", &tok(&c)).await,
        Err(StoreError::StaleEpoch { .. })
    ));
    assert_free(&s, "t", "next", "k").await;
}

/// Supersede_claimed releases the key.
pub async fn dedupe_key_is_free_after_supersede_claimed<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, keyed("t", "a", "k")).await;
    claim_some(&s).await;
    s.mailbox
        .supersede_claimed("a", None, "stop")
        .await
        .unwrap()
        .unwrap();
    assert_free(&s, "t", "b", "k").await;
}

/// No wall-clock grace period decides dedupe: a live holder keeps the key however
/// much time passes, and a terminal one frees it at the same instant.
pub async fn dedupe_decisions_use_no_wall_clock_grace<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, keyed("t", "holder", "k").with_delay_ms(1)).await;
    env.advance(30 * 86_400_000);
    assert_held(&s, "t", "later", "k", "holder").await;
    s.mailbox.cancel("holder").await.unwrap().unwrap();
    assert_free(&s, "t", "immediately", "k").await;
    assert_held(&s, "t", "again", "k", "immediately").await;
}

/// Late or repeated operations of an old holder never release a newer holder's key.
pub async fn late_ops_of_old_holder_do_not_release_newer_holders_key<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, keyed("t", "old", "k")).await;
    let c = claim_some(&s).await;
    s.mailbox.ack("old", &tok(&c)).await.unwrap();
    put(&s, keyed("t", "new", "k")).await;
    // The old holder's retries and stray control operations.
    let _ = s.mailbox.ack("old", &tok(&c)).await;
    let _ = s.mailbox.dead_letter("old", &tok(&c), "late").await;
    let _ = s.mailbox.cancel("old").await;
    let _ = s.mailbox.supersede_claimed("old", None, "late").await;
    assert_held(&s, "t", "third", "k", "new").await;
}

/// Re-submitting the holder itself (same id, same content) is an idempotent retry,
/// not a duplicate of itself.
pub async fn idempotent_resubmit_of_key_holder_is_not_duplicate<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let first = put(&s, keyed("t", "a", "k")).await;
    assert_eq!(
        s.mailbox.enqueue(keyed("t", "a", "k")).await.unwrap(),
        first
    );
    assert_eq!(all(&s).await.len(), 1);
}

/// Purge removes terminal records with their side records; the key stays free and is
/// enforced again for the next holder.
pub async fn purge_removes_dedupe_side_records_and_key_stays_enforced<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    for round in 0..3 {
        let id = format!("h{round}");
        put(&s, keyed("t", &id, "k")).await;
        assert_held(&s, "t", &format!("dup{round}"), "k", &id).await;
        s.mailbox.cancel(&id).await.unwrap().unwrap();
        env.advance(10);
        assert_eq!(s.mailbox.purge_terminal(env.now()).await.unwrap(), 1);
        assert_eq!(s.mailbox.load(&id).await.unwrap(), None);
    }
    put(&s, keyed("t", "last", "k")).await;
    assert_held(&s, "t", "dup-last", "k", "last").await;
}
