//! Maintenance (reclaim, purge), several hosts on one store, and restarts (the contract,
//! docs/contract.md, section 2 and guarantees 3.5, 3.6 and 3.9).

use homing::store::{
    Fence, REASON_EXPIRED_AFTER_INTERRUPT, REASON_LEASE_EXPIRED_AT_MAX, RunResult, Status,
    StoreError,
};

use super::*;

/// Reclaim of an expired lease: queued, available now, attempt + 1, claim and run
/// projection cleared, `last_error` untouched; it is claimable again.
pub async fn reclaim_requeues_expired_lease_with_one_more_attempt<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, nd("t", "d1").with_max_attempts(3)).await;
    let c = s.mailbox.claim(AGENT, WORKER, 100).await.unwrap().unwrap();
    s.mailbox.record_start("d1", &tok(&c)).await.unwrap();
    s.mailbox
        .record_result("d1", &tok(&c), RunResult::success(b"partial".to_vec()))
        .await
        .unwrap();
    env.advance(101);
    let reclaimed = s.mailbox.reclaim_expired(env.now(), 10).await.unwrap();
    assert_eq!(reclaimed.len(), 1);
    let d = &reclaimed[0];
    assert_eq!(d.id, "d1");
    assert_eq!(d.status, Status::Queued);
    assert_eq!(d.attempt, 1);
    assert_eq!(d.available_at, env.now());
    assert_eq!(d.claim, None);
    assert_eq!(d.started_at, None);
    assert_eq!(d.result, None);
    assert_eq!(d.completed_at, None);
    assert_eq!(d.last_error, None);
    assert_shape(d);
    assert_eq!(&load(&s, "d1").await, d);
    let again = claim_some(&s).await;
    assert_eq!((again.id.as_str(), again.attempt), ("d1", 1));
}

/// Reclaim at the attempt cap dead-letters with the fixed reason, no claim and no
/// projection left from the abandoned run.
pub async fn reclaim_at_max_attempts_dead_letters_with_reason<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, nd("t", "d1").with_max_attempts(1)).await;
    let c = s.mailbox.claim(AGENT, WORKER, 100).await.unwrap().unwrap();
    s.mailbox.record_start("d1", &tok(&c)).await.unwrap();
    env.advance(101);
    let reclaimed = s.mailbox.reclaim_expired(env.now(), 10).await.unwrap();
    assert_eq!(reclaimed.len(), 1);
    let d = &reclaimed[0];
    assert_eq!(d.status, Status::DeadLetter);
    assert_eq!(d.attempt, 1);
    assert_eq!(d.last_error.as_deref(), Some(REASON_LEASE_EXPIRED_AT_MAX));
    assert_eq!(d.completed_at, Some(env.now()));
    assert_eq!(d.claim, None);
    assert_eq!(
        d.started_at, None,
        "no projection left from the abandoned start"
    );
    assert_shape(d);
    assert_eq!(&load(&s, "d1").await, d);
    assert_eq!(claim(&s).await, None);
}

/// Reclaim needs `lease_until < now` strictly: not at `now < lease_until`, not at
/// `now == lease_until`, yes one ms later.
pub async fn reclaim_needs_lease_strictly_past<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    let c = s
        .mailbox
        .claim(AGENT, WORKER, 1_000)
        .await
        .unwrap()
        .unwrap();
    let until = c.claim.as_ref().unwrap().lease_until;
    assert_eq!(until, T0 + 1_000);
    env.set(until - 1);
    assert!(
        s.mailbox
            .reclaim_expired(until - 1, 10)
            .await
            .unwrap()
            .is_empty()
    );
    env.set(until);
    assert!(
        s.mailbox
            .reclaim_expired(until, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(load(&s, "d1").await, c);
    env.set(until + 1);
    let reclaimed = s.mailbox.reclaim_expired(until + 1, 10).await.unwrap();
    assert_eq!(reclaimed.len(), 1);
    assert_eq!(
        (reclaimed[0].status, reclaimed[0].attempt),
        (Status::Queued, 1)
    );
}

/// An expired lease of an interrupted thread is superseded by reclaim and not returned.
pub async fn reclaim_supersedes_expired_stale_epoch_claim_without_returning_it<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    s.mailbox.claim(AGENT, WORKER, 100).await.unwrap().unwrap();
    s.mailbox.interrupt("t", "stop").await.unwrap();
    env.advance(101);
    assert!(
        s.mailbox
            .reclaim_expired(env.now(), 10)
            .await
            .unwrap()
            .is_empty()
    );
    let d = load(&s, "d1").await;
    assert_eq!(d.status, Status::Superseded);
    assert_eq!(
        d.last_error.as_deref(),
        Some(REASON_EXPIRED_AFTER_INTERRUPT)
    );
    assert_eq!(d.claim, None);
    assert_shape(&d);
    assert!(
        s.mailbox
            .reclaim_expired(env.now(), 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// Reclaim takes at most `limit` records per call; repeated calls take the rest.
pub async fn reclaim_respects_its_limit<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    for i in 0..5 {
        put_on(&s, &format!("t{i}"), &format!("d{i}")).await;
        s.mailbox.claim(AGENT, WORKER, 100).await.unwrap().unwrap();
    }
    env.advance(101);
    let mut seen = Vec::new();
    for want in [2, 2, 1, 0] {
        let got = s.mailbox.reclaim_expired(env.now(), 2).await.unwrap();
        assert_eq!(got.len(), want);
        seen.extend(got.into_iter().map(|d| d.id));
    }
    seen.sort();
    assert_eq!(seen, vec!["d0", "d1", "d2", "d3", "d4"]);
}

/// Reclaim never touches queued, terminal or live records.
pub async fn reclaim_leaves_queued_terminal_and_live_records_alone<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t1", "queued").await;
    put_on(&s, "t2", "acked").await;
    let c = claim_id(&s, "acked").await;
    s.mailbox.ack("acked", &tok(&c)).await.unwrap();
    put_on(&s, "t3", "cancelled").await;
    s.mailbox.cancel("cancelled").await.unwrap();
    put_on(&s, "t4", "live").await;
    s.mailbox
        .claim_dispatch("live", WORKER, 1_000_000)
        .await
        .unwrap()
        .unwrap();
    let before = all(&s).await;
    env.advance(500_000);
    assert!(
        s.mailbox
            .reclaim_expired(env.now(), 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(all(&s).await, before);
}

/// Homing decision: an expired claim stays the thread's one claimed dispatch, blocking its
/// siblings, until maintenance reclaims it.
pub async fn expired_claim_blocks_its_thread_until_reclaimed<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    env.advance(1);
    put_on(&s, "t", "d2").await;
    s.mailbox.claim(AGENT, WORKER, 100).await.unwrap().unwrap();
    env.advance(1_000);
    assert_eq!(
        claim(&s).await,
        None,
        "the expired claim still blocks the thread"
    );
    assert_eq!(all_in(&s, Status::Claimed).await.len(), 1);
    s.mailbox.reclaim_expired(env.now(), 10).await.unwrap();
    let d = claim_some(&s).await;
    assert_eq!(
        (d.id.as_str(), d.attempt),
        ("d1", 1),
        "the older one goes first again"
    );
}

/// Homing decision: claim_dispatch takes over a thread whose holder's lease ran out, reclaiming
/// the expired holder (one more failed attempt, or dead letter) in the same step.
pub async fn claim_dispatch_takes_over_expired_holder_atomically<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, nd("t1", "old1").with_max_attempts(3)).await;
    put_on(&s, "t1", "new1").await;
    put(&s, nd("t2", "old2").with_max_attempts(1)).await;
    put_on(&s, "t2", "new2").await;
    let c1 = s
        .mailbox
        .claim_dispatch("old1", WORKER, 100)
        .await
        .unwrap()
        .unwrap();
    s.mailbox
        .claim_dispatch("old2", WORKER, 100)
        .await
        .unwrap()
        .unwrap();
    env.advance(101);
    let new1 = claim_id(&s, "new1").await;
    assert_eq!(new1.status, Status::Claimed);
    let old1 = load(&s, "old1").await;
    assert_eq!((old1.status, old1.attempt), (Status::Queued, 1));
    assert_eq!(old1.claim, None);
    assert_eq!(
        all_in(&s, Status::Claimed)
            .await
            .iter()
            .filter(|d| d.thread == "t1")
            .count(),
        1
    );
    assert!(matches!(
        s.mailbox.ack("old1", &tok(&c1)).await,
        Err(StoreError::NotClaimed { .. })
    ));
    claim_id(&s, "new2").await;
    let old2 = load(&s, "old2").await;
    assert_eq!((old2.status, old2.attempt), (Status::DeadLetter, 1));
    assert_eq!(
        old2.last_error.as_deref(),
        Some(REASON_LEASE_EXPIRED_AT_MAX)
    );
}

/// Claim_dispatch never takes over a live holder (`lease_until == now` is live).
pub async fn claim_dispatch_does_not_take_over_live_holder<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "holder").await;
    let sibling = put_on(&s, "t", "sibling").await;
    let c = s
        .mailbox
        .claim_dispatch("holder", WORKER, 100)
        .await
        .unwrap()
        .unwrap();
    env.advance(100);
    assert_eq!(
        s.mailbox
            .claim_dispatch("sibling", WORKER, LEASE)
            .await
            .unwrap(),
        None
    );
    assert_eq!(load(&s, "holder").await, c);
    assert_eq!(load(&s, "sibling").await, sibling);
}

/// Purge deletes terminal records completed strictly before the cut-off and counts
/// them; live records are never purged.
pub async fn purge_removes_terminal_records_completed_before_cutoff<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t1", "acked").await;
    put_on(&s, "t2", "cancelled").await;
    put_on(&s, "t3", "queued").await;
    put_on(&s, "t4", "claimed").await;
    claim_id(&s, "claimed").await;
    env.advance(10);
    let c = claim_id(&s, "acked").await;
    s.mailbox.ack("acked", &tok(&c)).await.unwrap();
    env.advance(10);
    s.mailbox.cancel("cancelled").await.unwrap();
    assert_eq!(
        s.mailbox.purge_terminal(T0 + 10).await.unwrap(),
        0,
        "completed_at == cut-off stays"
    );
    assert_eq!(s.mailbox.purge_terminal(T0 + 11).await.unwrap(), 1);
    assert_eq!(s.mailbox.load("acked").await.unwrap(), None);
    assert!(s.mailbox.load("cancelled").await.unwrap().is_some());
    assert_eq!(s.mailbox.purge_terminal(T0 + 1_000_000).await.unwrap(), 1);
    assert_eq!(s.mailbox.load("cancelled").await.unwrap(), None);
    assert!(s.mailbox.list_terminal(10, 0).await.unwrap().is_empty());
    let mut left: Vec<String> = all(&s).await.into_iter().map(|d| d.id).collect();
    left.sort();
    assert_eq!(left, vec!["claimed", "queued"]);
    assert_eq!(s.mailbox.purge_terminal(u64::MAX).await.unwrap(), 0);
}

/// Purge never forgets a thread's epoch, so fencing survives.
pub async fn purge_keeps_thread_epoch<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    s.mailbox.interrupt("t", "a").await.unwrap();
    s.mailbox.interrupt("t", "b").await.unwrap();
    env.advance(1);
    assert_eq!(s.mailbox.purge_terminal(u64::MAX).await.unwrap(), 1);
    assert!(all(&s).await.is_empty());
    assert_eq!(s.mailbox.thread_epoch("t").await.unwrap(), 2);
    assert_eq!(put_on(&s, "t", "d2").await.epoch, 2);
}

/// A purge on one instance removes the records for every instance.
pub async fn purge_on_one_instance_removes_records_for_all<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let (a, b) = (env.open().await, env.open().await);
    put_on(&a, "t", "d1").await;
    a.mailbox.cancel("d1").await.unwrap();
    env.advance(1);
    assert_eq!(b.mailbox.purge_terminal(env.now()).await.unwrap(), 1);
    assert_eq!(a.mailbox.load("d1").await.unwrap(), None);
    assert!(a.mailbox.list_terminal(10, 0).await.unwrap().is_empty());
}

/// A restart of the store loses nothing acknowledged: records in every state, claims and
/// their tokens, epochs, dedupe keys, log entries and watermarks.
pub async fn restart_loses_nothing_acknowledged<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, nd("t1", "queued").with_dedupe_key("k")).await;
    put(&s, nd("t2", "delayed").with_delay_ms(10_000)).await;
    put_on(&s, "t3", "claimed").await;
    let held = claim_id(&s, "claimed").await;
    put_on(&s, "t4", "acked").await;
    let c = claim_id(&s, "acked").await;
    s.mailbox
        .complete("acked", &tok(&c), RunResult::success(b"kept".to_vec()))
        .await
        .unwrap();
    s.mailbox.interrupt("t5", "r").await.unwrap();
    let fence = Fence::of(&held).unwrap();
    for i in 0..3u8 {
        s.log.append("t3", &[i], Some(&fence)).await.unwrap();
    }
    s.log.trim("t3", 1).await.unwrap();
    s.log.append("gone", b"x", None).await.unwrap();
    s.log.delete("gone").await.unwrap();
    let records = all(&s).await;
    let entries = s.log.read("t3", 0, 100).await.unwrap();
    let marks = s.log.watermarks("t3").await.unwrap();
    let gone_marks = s.log.watermarks("gone").await.unwrap();
    drop(s);

    let r = env.open().await;
    assert_eq!(all(&r).await, records);
    assert_eq!(r.mailbox.thread_epoch("t5").await.unwrap(), 1);
    assert!(matches!(
        r.mailbox
            .enqueue(nd("t1", "dup").with_dedupe_key("k"))
            .await,
        Err(StoreError::Duplicate { .. })
    ));
    assert_eq!(r.log.read("t3", 0, 100).await.unwrap(), entries);
    assert_eq!(r.log.watermarks("t3").await.unwrap(), marks);
    assert_eq!(r.log.watermarks("gone").await.unwrap(), gone_marks);
    assert_eq!(
        r.log
            .append("t3", b"after restart", Some(&fence))
            .await
            .unwrap(),
        4
    );
    assert_eq!(
        r.log.append("gone", b"again", None).await.unwrap(),
        gone_marks.latest + 1
    );
    assert_eq!(
        load(&r, "acked").await.result,
        Some(RunResult::success(b"kept".to_vec()))
    );
    let acked = r.mailbox.ack("claimed", &tok(&held)).await.unwrap();
    assert_eq!(
        acked.status,
        Status::Acked,
        "the claim survived the restart"
    );
}

/// After a restart, leases still run out and are reclaimed, and delays still end, with no
/// operator action.
pub async fn restart_resumes_leases_and_delays<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t1", "leased").await;
    s.mailbox.claim(AGENT, WORKER, 100).await.unwrap().unwrap();
    put(&s, nd("t2", "delayed").with_delay_ms(500)).await;
    drop(s);
    let r = env.open().await;
    env.set(T0 + 200);
    let reclaimed = r.mailbox.reclaim_expired(env.now(), 10).await.unwrap();
    assert_eq!(
        reclaimed.into_iter().map(|d| d.id).collect::<Vec<_>>(),
        vec!["leased"]
    );
    let d = claim_some(&r).await;
    assert_eq!(d.id, "leased");
    r.mailbox.ack("leased", &tok(&d)).await.unwrap();
    assert_eq!(claim(&r).await, None);
    env.set(T0 + 500);
    assert_eq!(claim_some(&r).await.id, "delayed");
}

/// A guest that crashes its host every time still dead-letters after `max_attempts`: each
/// crash (lease expiry found by another host's sweep) counts one attempt.
pub async fn crashing_holder_still_dead_letters_after_max_attempts<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let maintenance = env.open().await;
    put(&maintenance, nd("t", "poison").with_max_attempts(3)).await;
    let mut attempts = Vec::new();
    for _ in 0..3 {
        let host = env.open().await;
        let c = host
            .mailbox
            .claim(AGENT, "doomed-host", 100)
            .await
            .unwrap()
            .expect("claimable again");
        host.mailbox.record_start("poison", &tok(&c)).await.unwrap();
        drop(host); // the host crashes mid-run
        env.advance(101);
        maintenance
            .mailbox
            .reclaim_expired(env.now(), 10)
            .await
            .unwrap();
        attempts.push(load(&maintenance, "poison").await.attempt);
    }
    assert_eq!(attempts, vec![1, 2, 3]);
    let d = load(&maintenance, "poison").await;
    assert_eq!(d.status, Status::DeadLetter);
    assert_eq!(d.last_error.as_deref(), Some(REASON_LEASE_EXPIRED_AT_MAX));
    assert_eq!(claim(&maintenance).await, None);
}

/// A host that crashes holding a lease: another host reclaims after expiry, claims and
/// acks it.
pub async fn crashed_hosts_lease_is_reclaimed_and_claimed_by_another<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let a = env.open().await;
    let b = env.open().await;
    put_on(&a, "t", "d1").await;
    a.mailbox
        .claim(AGENT, "host-a", 100)
        .await
        .unwrap()
        .unwrap();
    drop(a);
    assert_eq!(claim(&b).await, None);
    env.advance(101);
    assert_eq!(
        b.mailbox
            .reclaim_expired(env.now(), 10)
            .await
            .unwrap()
            .len(),
        1
    );
    let d = b
        .mailbox
        .claim(AGENT, "host-b", LEASE)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.claim.as_ref().unwrap().claimed_by, "host-b");
    assert_eq!(
        b.mailbox.ack("d1", &tok(&d)).await.unwrap().status,
        Status::Acked
    );
}

/// A fresh instance on existing data claims the oldest dispatch of a deep thread.
pub async fn fresh_instance_claims_oldest_of_a_deep_thread<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let a = env.open().await;
    for i in 0..500 {
        put_on(&a, "deep", &format!("d{i:03}")).await;
        if i % 50 == 0 {
            env.advance(1);
        }
    }
    drop(a);
    let b = env.open().await;
    let d = claim_some(&b).await;
    assert_eq!(d.id, "d000");
    assert_eq!(claim(&b).await, None);
}

/// Load returns the authoritative record on every instance.
pub async fn load_reads_the_truth_across_instances<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let (a, b) = (env.open().await, env.open().await);
    put_on(&a, "t", "d1").await;
    assert_eq!(load(&b, "d1").await.status, Status::Queued);
    let c = claim_some(&a).await;
    assert_eq!(load(&b, "d1").await, c);
    let acked = b.mailbox.ack("d1", &tok(&c)).await.unwrap();
    assert_eq!(load(&a, "d1").await, acked);
}

/// A dispatch enqueued on one host is claimable on another whose wake-up
/// signal never fired (the signal is only a hint).
pub async fn dispatch_enqueued_elsewhere_is_claimable_without_wakeup<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let (a, b) = (env.open().await, env.open().await);
    put_on(&a, "t1", "d1").await;
    assert_eq!(claim_some(&b).await.id, "d1");
    put_on(&a, "t2", "d2").await;
    assert_eq!(claim_id(&b, "d2").await.id, "d2");
    put(&a, nd("t3", "d3").with_delay_ms(50)).await;
    env.advance(50);
    assert_eq!(claim_some(&b).await.id, "d3");
}

/// An interrupt on one host is seen at once by the others.
pub async fn interrupt_on_one_instance_is_seen_by_all<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let (a, b) = (env.open().await, env.open().await);
    for i in 0..3 {
        put_on(&a, "t", &format!("d{i}")).await;
    }
    let report = b.mailbox.interrupt("t", "stop").await.unwrap();
    assert_eq!(report.superseded.len(), 3);
    assert!(all_in(&a, Status::Queued).await.is_empty());
    assert_eq!(a.mailbox.thread_epoch("t").await.unwrap(), 1);
    assert_eq!(claim(&a).await, None);
}

/// Queued_threads agree on every instance.
pub async fn queued_threads_agree_across_instances<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let (a, b) = (env.open().await, env.open().await);
    put_on(&a, "ta", "d1").await;
    put_on(&b, "tb", "d2").await;
    let want = vec!["ta".to_owned(), "tb".to_owned()];
    assert_eq!(a.mailbox.queued_threads().await.unwrap(), want);
    assert_eq!(b.mailbox.queued_threads().await.unwrap(), want);
}
