//! Fencing by claim token and thread epoch, interrupts, supersedes, idempotent holder operations,
//! and the fence on log appends (the contract, docs/contract.md, section 2, guarantees 3.3 and
//! 3.7, and section 4).

use std::collections::BTreeSet;

use homing::store::{Fence, REASON_STALE_EPOCH, RunResult, Status, StoreError};

use super::*;

fn expect_lost_claim<T: std::fmt::Debug>(result: StoreResult<T>, id: &str, what: &str) {
    match result {
        Err(StoreError::LostClaim { id: got }) => assert_eq!(got, id, "{what}"),
        other => panic!("{what}: expected LostClaim, got {other:?}"),
    }
}

fn expect_stale_epoch<T: std::fmt::Debug>(
    result: StoreResult<T>,
    id: &str,
    dispatch: u64,
    thread: u64,
    what: &str,
) {
    match result {
        Err(StoreError::StaleEpoch {
            id: got,
            dispatch: d,
            thread: t,
        }) => {
            assert_eq!(got, id, "{what}");
            assert_eq!((d, t), (dispatch, thread), "{what}: epochs");
        }
        other => panic!("{what}: expected StaleEpoch, got {other:?}"),
    }
}

fn expect_not_claimed<T: std::fmt::Debug>(
    result: StoreResult<T>,
    id: &str,
    status: Status,
    what: &str,
) {
    match result {
        Err(StoreError::NotClaimed { id: got, status: s }) => {
            assert_eq!(got, id, "{what}");
            assert_eq!(s, status, "{what}");
        }
        other => panic!("{what}: expected NotClaimed({status}), got {other:?}"),
    }
}

/// Ack with a wrong token is `LostClaim` and the dispatch stays claimed, unchanged.
pub async fn ack_with_wrong_token_is_lost_claim_and_changes_nothing<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    let c = claim_some(&s).await;
    expect_lost_claim(s.mailbox.ack("d1", "forged").await, "d1", "ack");
    assert_eq!(load(&s, "d1").await, c);
    s.mailbox.ack("d1", &tok(&c)).await.unwrap();
}

/// Every holder operation with a wrong token is `LostClaim` and changes nothing.
pub async fn holder_ops_with_wrong_token_are_lost_claim_and_change_nothing<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let m = &s.mailbox;
    put_on(&s, "t", "d1").await;
    let c = claim_some(&s).await;
    let bad = "not-the-token";
    expect_lost_claim(m.ack("d1", bad).await, "d1", "ack");
    expect_lost_claim(m.nack("d1", bad, T0, "e").await, "d1", "nack");
    expect_lost_claim(m.dead_letter("d1", bad, "e").await, "d1", "dead_letter");
    expect_lost_claim(
        m.complete("d1", bad, RunResult::success(vec![1])).await,
        "d1",
        "complete",
    );
    expect_lost_claim(m.record_start("d1", bad).await, "d1", "record_start");
    expect_lost_claim(
        m.record_result("d1", bad, RunResult::success(vec![1]))
            .await,
        "d1",
        "record_result",
    );
    assert!(!m.extend_lease("d1", bad, 99_999).await.unwrap());
    assert_eq!(load(&s, "d1").await, c, "nothing changed");
}

/// A holder write whose dispatch epoch is older than its thread's is `StaleEpoch`, and
/// the record becomes superseded in the same step.
pub async fn ack_with_stale_epoch_supersedes_and_is_rejected<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    let c = claim_some(&s).await;
    s.mailbox.interrupt("t", "new user message").await.unwrap();
    env.advance(7);
    expect_stale_epoch(s.mailbox.ack("d1", &tok(&c)).await, "d1", 0, 1, "ack");
    let d = load(&s, "d1").await;
    assert_eq!(d.status, Status::Superseded);
    assert_eq!(d.last_error.as_deref(), Some(REASON_STALE_EPOCH));
    assert_eq!(d.claim, None);
    assert_eq!(d.completed_at, Some(env.now()));
    assert_shape(&d);
}

/// Every holder write of an interrupted claim is refused with `StaleEpoch` and supersedes
/// the dispatch; a refused record_start leaves no start recorded.
pub async fn every_holder_op_with_stale_epoch_supersedes_and_is_rejected<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let ops = [
        "nack",
        "dead_letter",
        "complete",
        "record_start",
        "record_result",
        "ack",
    ];
    for op in ops {
        let thread = format!("t-{op}");
        let id = format!("d-{op}");
        put_on(&s, &thread, &id).await;
        let c = claim_id(&s, &id).await;
        let t = tok(&c);
        let epoch = s.mailbox.interrupt(&thread, "stop").await.unwrap().epoch;
        assert_eq!(epoch, 1);
        let m = &s.mailbox;
        let result = match op {
            "nack" => m.nack(&id, &t, env.now(), "e").await.map(|_| ()),
            "dead_letter" => m.dead_letter(&id, &t, "e").await.map(|_| ()),
            "complete" => m
                .complete(&id, &t, RunResult::success(vec![]))
                .await
                .map(|_| ()),
            "record_start" => m.record_start(&id, &t).await.map(|_| ()),
            "record_result" => m
                .record_result(&id, &t, RunResult::success(vec![]))
                .await
                .map(|_| ()),
            _ => m.ack(&id, &t).await.map(|_| ()),
        };
        expect_stale_epoch(result, &id, 0, 1, op);
        let d = load(&s, &id).await;
        assert_eq!(d.status, Status::Superseded, "{op}");
        assert_eq!(d.claim, None, "{op}");
        assert_eq!(d.last_error.as_deref(), Some(REASON_STALE_EPOCH), "{op}");
        assert_eq!(d.attempt, 0, "{op}: a stale write is not a failed attempt");
        if op == "record_start" {
            assert_eq!(d.started_at, None);
        }
        assert_shape(&d);
        // Once superseded, the same token gets NotClaimed.
        expect_not_claimed(s.mailbox.ack(&id, &t).await, &id, Status::Superseded, op);
    }
}

/// After an interrupt, extend_lease of the old claim is `false` and supersedes it.
pub async fn extend_lease_after_interrupt_is_false_and_supersedes<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    let c = claim_some(&s).await;
    s.mailbox.interrupt("t", "stop").await.unwrap();
    assert!(
        !s.mailbox
            .extend_lease("d1", &tok(&c), 60_000)
            .await
            .unwrap()
    );
    let d = load(&s, "d1").await;
    assert_eq!(d.status, Status::Superseded);
    assert_eq!(d.claim, None);
    assert_shape(&d);
}

/// A stale holder's refused write frees its thread at once: the next dispatch is claimable
/// without waiting for the (long) lease.
pub async fn stale_epoch_holder_op_frees_the_thread_at_once<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    let c = s
        .mailbox
        .claim(AGENT, WORKER, 3_600_000)
        .await
        .unwrap()
        .unwrap();
    s.mailbox.interrupt("t", "stop").await.unwrap();
    put_on(&s, "t", "d2").await;
    assert_eq!(
        claim(&s).await,
        None,
        "the stale claim still holds the thread"
    );
    assert!(s.mailbox.record_start("d1", &tok(&c)).await.is_err());
    let d2 = claim_some(&s).await;
    assert_eq!(d2.id, "d2");
    assert_eq!(d2.epoch, 1);
}

/// Every settle frees the thread at once, however long the lease was.
pub async fn settling_frees_the_thread_at_once_despite_long_lease<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let day = 86_400_000;
    for op in [
        "ack",
        "nack",
        "dead_letter",
        "complete",
        "supersede_claimed",
    ] {
        let thread = format!("t-{op}");
        put(&s, nd(&thread, &format!("{op}-1")).with_priority(0)).await;
        put(&s, nd(&thread, &format!("{op}-2")).with_priority(1)).await;
        let c = s
            .mailbox
            .claim_dispatch(&format!("{op}-1"), WORKER, day)
            .await
            .unwrap()
            .unwrap();
        let (id, t) = (c.id.clone(), tok(&c));
        let m = &s.mailbox;
        match op {
            "ack" => drop(m.ack(&id, &t).await.unwrap()),
            "nack" => drop(m.nack(&id, &t, env.now() + day, "later").await.unwrap()),
            "dead_letter" => drop(m.dead_letter(&id, &t, "no").await.unwrap()),
            "complete" => drop(
                m.complete(&id, &t, RunResult::success(vec![]))
                    .await
                    .unwrap(),
            ),
            _ => drop(
                m.supersede_claimed(&id, Some(&t), "replaced")
                    .await
                    .unwrap()
                    .unwrap(),
            ),
        }
        let next = s
            .mailbox
            .claim_dispatch(&format!("{op}-2"), WORKER, LEASE)
            .await
            .unwrap();
        assert!(next.is_some(), "{op} did not free the thread");
    }
}

/// Interrupt supersedes every queued dispatch of the thread (delayed ones too),
/// reports them all, records the reason, and touches no other thread.
pub async fn interrupt_supersedes_every_queued_dispatch_of_thread_with_reason<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "q1").await;
    put_on(&s, "t", "q2").await;
    put(&s, nd("t", "q3").with_delay_ms(60_000)).await;
    let other = put_on(&s, "u", "u1").await;
    env.advance(3);
    let report = s.mailbox.interrupt("t", "user pressed stop").await.unwrap();
    assert_eq!(report.epoch, 1);
    assert_eq!(report.active, None);
    let superseded: BTreeSet<String> = report.superseded.iter().cloned().collect();
    assert_eq!(
        superseded,
        ["q1", "q2", "q3"].map(String::from).into_iter().collect()
    );
    assert_eq!(report.superseded.len(), 3, "each reported once");
    for id in ["q1", "q2", "q3"] {
        let d = load(&s, id).await;
        assert_eq!(d.status, Status::Superseded, "{id}");
        assert_eq!(d.last_error.as_deref(), Some("user pressed stop"), "{id}");
        assert_eq!(d.completed_at, Some(T0 + 3));
        assert_shape(&d);
    }
    assert_eq!(all_in(&s, Status::Superseded).await.len(), 3);
    assert_eq!(load(&s, "u1").await, other);
    assert_eq!(s.mailbox.thread_epoch("u").await.unwrap(), 0);
    assert_eq!(claim_some(&s).await.id, "u1");
}

/// Interrupt reports the claimed dispatch as active (still claimed, same claim) and
/// supersedes only the queued one.
pub async fn interrupt_reports_claimed_dispatch_as_active_and_leaves_it_claimed<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "running").await;
    put_on(&s, "t", "waiting").await;
    let c = claim_id(&s, "running").await;
    let report = s.mailbox.interrupt("t", "stop").await.unwrap();
    let active = report.active.expect("the claimed dispatch is reported");
    assert_eq!(active.id, "running");
    assert_eq!(active.status, Status::Claimed);
    assert_eq!(active.claim, c.claim);
    assert_eq!(report.superseded, vec!["waiting".to_owned()]);
    let d = load(&s, "running").await;
    assert_eq!(d.status, Status::Claimed);
    assert_eq!(d.claim, c.claim);
}

/// The epoch is 0 for a thread never interrupted and follows each interrupt (+1).
pub async fn thread_epoch_starts_at_zero_and_follows_interrupts<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    assert_eq!(s.mailbox.thread_epoch("t").await.unwrap(), 0);
    put_on(&s, "t", "d1").await;
    assert_eq!(s.mailbox.thread_epoch("t").await.unwrap(), 0);
    let first = s.mailbox.interrupt("t", "a").await.unwrap();
    assert_eq!(first.epoch, 1);
    assert_eq!(s.mailbox.thread_epoch("t").await.unwrap(), 1);
    let second = s.mailbox.interrupt("t", "b").await.unwrap();
    assert_eq!(second.epoch, 2);
    assert_eq!(env.open().await.mailbox.thread_epoch("t").await.unwrap(), 2);
    assert_eq!(s.mailbox.thread_epoch("other").await.unwrap(), 0);
}

/// Interrupting an idle (or unknown) thread bumps its epoch and touches nothing else.
pub async fn interrupt_of_idle_thread_bumps_epoch_only<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let report = s.mailbox.interrupt("never-seen", "r").await.unwrap();
    assert_eq!(report.epoch, 1);
    assert_eq!(report.active, None);
    assert!(report.superseded.is_empty());
    put_on(&s, "t", "done").await;
    let c = claim_some(&s).await;
    let acked = s.mailbox.ack("done", &tok(&c)).await.unwrap();
    let report = s.mailbox.interrupt("t", "r").await.unwrap();
    assert_eq!(
        (report.epoch, report.active, report.superseded.len()),
        (1, None, 0)
    );
    assert_eq!(
        load(&s, "done").await,
        acked,
        "terminal records never change"
    );
}

/// An enqueue after an interrupt is stamped with the new epoch and is claimable (by
/// queue and by id) and settles normally.
pub async fn enqueue_after_interrupt_stamps_new_epoch_and_is_claimable<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    s.mailbox.interrupt("t", "r").await.unwrap();
    s.mailbox.interrupt("t", "r").await.unwrap();
    let d = put_on(&s, "t", "d1").await;
    assert_eq!(d.epoch, 2);
    let c = claim_some(&s).await;
    assert_eq!(c.epoch, 2);
    s.mailbox.ack("d1", &tok(&c)).await.unwrap();
    put_on(&s, "t", "d2").await;
    let c = claim_id(&s, "d2").await;
    s.mailbox
        .complete("d2", &tok(&c), RunResult::success(vec![]))
        .await
        .unwrap();
}

/// After an interrupt, the interrupted claim keeps the thread blocked (its guest may still run)
/// until it is superseded: Homing keeps at most one claimed dispatch per thread.
pub async fn stale_claimed_dispatch_keeps_thread_blocked_until_superseded<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "old").await;
    claim_some(&s).await;
    s.mailbox.interrupt("t", "r").await.unwrap();
    put_on(&s, "t", "new").await;
    assert_eq!(claim(&s).await, None);
    assert_eq!(
        s.mailbox
            .claim_dispatch("new", WORKER, LEASE)
            .await
            .unwrap(),
        None
    );
    let sup = s
        .mailbox
        .supersede_claimed("old", None, "host stopped the guest")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sup.status, Status::Superseded);
    assert_eq!(claim_some(&s).await.id, "new");
}

/// Supersede_claimed by the holder: superseded, reason recorded, claim cleared,
/// `completed_at = now`.
pub async fn supersede_claimed_by_holder_terminalizes_with_reason<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    let c = claim_some(&s).await;
    env.advance(11);
    let d = s
        .mailbox
        .supersede_claimed("d1", Some(&tok(&c)), "superseded by newer input")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.status, Status::Superseded);
    assert_eq!(d.last_error.as_deref(), Some("superseded by newer input"));
    assert_eq!(d.claim, None);
    assert_eq!(d.completed_at, Some(T0 + 11));
    assert_shape(&d);
    assert_eq!(load(&s, "d1").await, d);
}

/// The control plane supersedes a claimed dispatch without its token.
pub async fn supersede_claimed_by_control_plane_needs_no_token<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let (a, b) = (env.open().await, env.open().await);
    put_on(&a, "t", "d1").await;
    let c = claim_some(&a).await;
    let d = b
        .mailbox
        .supersede_claimed("d1", None, "operator")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.status, Status::Superseded);
    assert_eq!(d.last_error.as_deref(), Some("operator"));
    expect_not_claimed(
        a.mailbox.ack("d1", &tok(&c)).await,
        "d1",
        Status::Superseded,
        "holder ack",
    );
}

/// Supersede_claimed with a wrong token is `LostClaim` and changes nothing.
pub async fn supersede_claimed_with_wrong_token_is_lost_claim_and_changes_nothing<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    let c = claim_some(&s).await;
    expect_lost_claim(
        s.mailbox.supersede_claimed("d1", Some("forged"), "r").await,
        "d1",
        "supersede_claimed",
    );
    assert_eq!(load(&s, "d1").await, c);
}

/// Supersede_claimed of a queued, missing or terminal dispatch is `None` and changes nothing.
pub async fn supersede_claimed_of_queued_missing_or_terminal_dispatch_is_none<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    assert_eq!(
        s.mailbox
            .supersede_claimed("ghost", None, "r")
            .await
            .unwrap(),
        None
    );
    let queued = put_on(&s, "t1", "queued").await;
    assert_eq!(
        s.mailbox
            .supersede_claimed("queued", None, "r")
            .await
            .unwrap(),
        None
    );
    assert_eq!(load(&s, "queued").await, queued);
    put_on(&s, "t2", "acked").await;
    let c = claim_id(&s, "acked").await;
    s.mailbox.ack("acked", &tok(&c)).await.unwrap();
    put_on(&s, "t3", "cancelled").await;
    s.mailbox.cancel("cancelled").await.unwrap();
    put_on(&s, "t4", "dead").await;
    let c = claim_id(&s, "dead").await;
    s.mailbox.dead_letter("dead", &tok(&c), "x").await.unwrap();
    for id in ["acked", "cancelled", "dead"] {
        let before = load(&s, id).await;
        env.advance(1);
        assert_eq!(
            s.mailbox.supersede_claimed(id, None, "r").await.unwrap(),
            None,
            "{id}"
        );
        assert_eq!(load(&s, id).await, before, "{id}");
    }
}

/// A repeated ack with the same token (a retry after a lost reply) succeeds, on any
/// instance, and changes nothing.
pub async fn repeated_ack_with_same_token_succeeds_and_changes_nothing<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let (a, b) = (env.open().await, env.open().await);
    put_on(&a, "t", "d1").await;
    let c = claim_some(&a).await;
    let acked = a.mailbox.ack("d1", &tok(&c)).await.unwrap();
    env.advance(100);
    assert_eq!(a.mailbox.ack("d1", &tok(&c)).await.unwrap(), acked);
    assert_eq!(b.mailbox.ack("d1", &tok(&c)).await.unwrap(), acked);
    assert_eq!(load(&a, "d1").await, acked);
}

/// Nack, dead_letter, complete and supersede_claimed repeated with the same token succeed and
/// change nothing.
pub async fn repeated_settle_ops_are_idempotent_per_token<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let m = &s.mailbox;
    for op in ["nack", "dead_letter", "complete", "supersede_claimed"] {
        let id = format!("d-{op}");
        put_on(&s, &format!("t-{op}"), &id).await;
        let c = claim_id(&s, &id).await;
        let t = tok(&c);
        let retry_at = env.now() + 1_000;
        let first = match op {
            "nack" => m.nack(&id, &t, retry_at, "e").await.unwrap(),
            "dead_letter" => m.dead_letter(&id, &t, "e").await.unwrap(),
            "complete" => m
                .complete(&id, &t, RunResult::success(b"r".to_vec()))
                .await
                .unwrap(),
            _ => m
                .supersede_claimed(&id, Some(&t), "r")
                .await
                .unwrap()
                .unwrap(),
        };
        env.advance(10);
        match op {
            "nack" => assert_eq!(m.nack(&id, &t, retry_at, "e").await.unwrap(), first, "{op}"),
            "dead_letter" => assert_eq!(m.dead_letter(&id, &t, "e").await.unwrap(), first, "{op}"),
            "complete" => assert_eq!(
                m.complete(&id, &t, RunResult::success(b"r".to_vec()))
                    .await
                    .unwrap(),
                first,
                "{op}"
            ),
            _ => {
                let again = m.supersede_claimed(&id, Some(&t), "r").await.unwrap();
                if let Some(d) = again {
                    assert_eq!(d, first, "{op}");
                }
            }
        }
        assert_eq!(
            load(&s, &id).await,
            first,
            "{op}: the repeat changed the record"
        );
    }
}

/// A settled dispatch refuses other operations with its token and anything with
/// another token (`NotClaimed { status }`), and stays as it was.
pub async fn settled_dispatch_refuses_other_ops_and_other_tokens<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let m = &s.mailbox;
    put_on(&s, "t", "d1").await;
    let c = claim_some(&s).await;
    let t = tok(&c);
    let acked = m.ack("d1", &t).await.unwrap();
    let refused = |r: StoreResult<Dispatch>, what: &str| match r {
        Err(StoreError::NotClaimed {
            status: Status::Acked,
            ..
        }) => {}
        other => panic!("{what}: expected a refusal, got {other:?}"),
    };
    refused(m.nack("d1", &t, T0, "e").await, "nack after ack");
    refused(m.dead_letter("d1", &t, "e").await, "dead_letter after ack");
    refused(m.record_start("d1", &t).await, "record_start after ack");
    expect_not_claimed(
        m.ack("d1", "other-token").await,
        "d1",
        Status::Acked,
        "ack, other token",
    );
    expect_not_claimed(
        m.nack("d1", "other-token", T0, "e").await,
        "d1",
        Status::Acked,
        "nack, other token",
    );
    assert!(!m.extend_lease("d1", &t, 1_000).await.unwrap());
    assert_eq!(load(&s, "d1").await, acked);
}

/// After a lease expiry, reclaim and a new claim on another host, the old owner's
/// ack is `LostClaim`; the new owner still holds the claim and can ack.
pub async fn old_owner_loses_after_reclaim_and_new_owner_acks<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let (a, b) = (env.open().await, env.open().await);
    put_on(&a, "t", "d1").await;
    let old = a
        .mailbox
        .claim(AGENT, "host-a", 100)
        .await
        .unwrap()
        .unwrap();
    env.advance(101);
    let reclaimed = b.mailbox.reclaim_expired(env.now(), 10).await.unwrap();
    assert_eq!(reclaimed.len(), 1);
    assert_eq!(
        (reclaimed[0].status, reclaimed[0].attempt),
        (Status::Queued, 1)
    );
    let new = b
        .mailbox
        .claim(AGENT, "host-b", LEASE)
        .await
        .unwrap()
        .unwrap();
    assert_ne!(tok(&new), tok(&old));
    expect_lost_claim(
        a.mailbox.ack("d1", &tok(&old)).await,
        "d1",
        "old owner's ack",
    );
    assert_eq!(load(&a, "d1").await, new);
    let acked = b.mailbox.ack("d1", &tok(&new)).await.unwrap();
    assert_eq!(acked.status, Status::Acked);
}

/// After a reclaim (record queued again), the old token is `NotClaimed { queued }` and
/// changes nothing.
pub async fn old_token_after_reclaim_is_not_claimed<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    let old = s.mailbox.claim(AGENT, WORKER, 100).await.unwrap().unwrap();
    env.advance(101);
    s.mailbox.reclaim_expired(env.now(), 10).await.unwrap();
    let queued = load(&s, "d1").await;
    assert_eq!(queued.status, Status::Queued);
    expect_not_claimed(
        s.mailbox.ack("d1", &tok(&old)).await,
        "d1",
        Status::Queued,
        "ack",
    );
    expect_not_claimed(
        s.mailbox.nack("d1", &tok(&old), T0, "e").await,
        "d1",
        Status::Queued,
        "nack",
    );
    assert!(
        !s.mailbox
            .extend_lease("d1", &tok(&old), 1_000)
            .await
            .unwrap()
    );
    assert_eq!(load(&s, "d1").await, queued);
}

/// Holder checks are token and epoch; a holder whose lease ran out can still settle until
/// maintenance reclaims the claim (one CAS decides), and a later reclaim finds nothing.
pub async fn ack_after_lease_ran_out_but_before_reclaim_settles<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    let c = s.mailbox.claim(AGENT, WORKER, 100).await.unwrap().unwrap();
    env.advance(500);
    let acked = s.mailbox.ack("d1", &tok(&c)).await.unwrap();
    assert_eq!(acked.status, Status::Acked);
    assert!(
        s.mailbox
            .reclaim_expired(env.now(), 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(load(&s, "d1").await, acked);
}

/// Claims a fresh dispatch `id` on `thread` and returns it with its fence.
async fn fenced(s: &Store, thread: &str, id: &str, lease: u64) -> (Dispatch, Fence) {
    put_on(s, thread, id).await;
    let d = s
        .mailbox
        .claim_dispatch(id, WORKER, lease)
        .await
        .unwrap()
        .unwrap();
    let fence = Fence::of(&d).expect("a claimed dispatch has a fence");
    (d, fence)
}

/// A guest's append through its live claim succeeds.
pub async fn append_with_live_fence_succeeds<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let (_, fence) = fenced(&s, "t", "d1", LEASE).await;
    assert_eq!(fence.epoch, 0);
    assert_eq!(s.log.append("t", b"one", Some(&fence)).await.unwrap(), 1);
    assert_eq!(s.log.append("t", b"two", Some(&fence)).await.unwrap(), 2);
    assert_eq!(s.log.latest("t").await.unwrap(), 2);
}

/// An append with a wrong token is `LostClaim` and appends nothing.
pub async fn append_with_wrong_token_is_lost_claim<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let (_, fence) = fenced(&s, "t", "d1", LEASE).await;
    let forged = Fence {
        token: "forged".into(),
        ..fence
    };
    expect_lost_claim(s.log.append("t", b"x", Some(&forged)).await, "d1", "append");
    assert_eq!(s.log.latest("t").await.unwrap(), 0);
    assert!(s.log.read("t", 0, 10).await.unwrap().is_empty());
}

/// After the claim settled, its fence is `NotClaimed` and appends nothing.
pub async fn append_after_settle_is_not_claimed<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let (d, fence) = fenced(&s, "t", "d1", LEASE).await;
    s.log.append("t", b"during", Some(&fence)).await.unwrap();
    s.mailbox.ack("d1", &tok(&d)).await.unwrap();
    expect_not_claimed(
        s.log.append("t", b"after", Some(&fence)).await,
        "d1",
        Status::Acked,
        "append",
    );
    assert_eq!(s.log.latest("t").await.unwrap(), 1);
}

/// After an interrupt, the old claim's append is `StaleEpoch` and appends nothing; the
/// host (no fence) still may append.
pub async fn append_after_interrupt_is_stale_epoch<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let (_, fence) = fenced(&s, "t", "d1", LEASE).await;
    s.mailbox.interrupt("t", "stop").await.unwrap();
    expect_stale_epoch(
        s.log.append("t", b"zombie", Some(&fence)).await,
        "d1",
        0,
        1,
        "append",
    );
    assert_eq!(s.log.latest("t").await.unwrap(), 0);
    assert_eq!(s.log.append("t", b"host note", None).await.unwrap(), 1);
}

/// A fence naming no stored dispatch is `NotFound`.
pub async fn append_with_fence_of_missing_dispatch_is_not_found<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let fence = Fence {
        dispatch: "ghost".into(),
        token: "t".into(),
        epoch: 0,
    };
    match s.log.append("t", b"x", Some(&fence)).await {
        Err(StoreError::NotFound { id }) => assert_eq!(id, "ghost"),
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert_eq!(s.log.latest("t").await.unwrap(), 0);
}

/// An append is refused once the claim is no longer live (`lease_until < now`), even
/// before maintenance reclaims it; at `lease_until == now` the lease is still live.
pub async fn append_with_fence_of_expired_lease_is_rejected<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let (_, fence) = fenced(&s, "t", "d1", 100).await;
    env.advance(100);
    assert_eq!(
        s.log
            .append("t", b"at the boundary", Some(&fence))
            .await
            .unwrap(),
        1
    );
    env.advance(1);
    match s.log.append("t", b"too late", Some(&fence)).await {
        Err(StoreError::LostClaim { id }) | Err(StoreError::NotClaimed { id, .. }) => {
            assert_eq!(id, "d1")
        }
        other => panic!("expected the expired claim to be refused, got {other:?}"),
    }
    assert_eq!(s.log.latest("t").await.unwrap(), 1);
}

/// Append_expected checks the fence too.
pub async fn append_expected_is_fenced_too<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let (_, fence) = fenced(&s, "t", "d1", LEASE).await;
    assert_eq!(
        s.log
            .append_expected("t", b"a", 0, Some(&fence))
            .await
            .unwrap(),
        1
    );
    let forged = Fence {
        token: "forged".into(),
        ..fence.clone()
    };
    expect_lost_claim(
        s.log.append_expected("t", b"b", 1, Some(&forged)).await,
        "d1",
        "append_expected",
    );
    s.mailbox.interrupt("t", "stop").await.unwrap();
    expect_stale_epoch(
        s.log.append_expected("t", b"c", 1, Some(&fence)).await,
        "d1",
        0,
        1,
        "append_expected",
    );
    assert_eq!(s.log.latest("t").await.unwrap(), 1);
}

/// A claim on one thread cannot append to another thread's log.
pub async fn fence_of_another_thread_cannot_append<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let (_, fence) = fenced(&s, "mine", "d1", LEASE).await;
    assert!(
        s.log
            .append("theirs", b"intrusion", Some(&fence))
            .await
            .is_err()
    );
    assert!(
        s.log
            .append_expected("theirs", b"intrusion", 0, Some(&fence))
            .await
            .is_err()
    );
    assert_eq!(s.log.latest("theirs").await.unwrap(), 0);
    assert_eq!(s.log.append("mine", b"ok", Some(&fence)).await.unwrap(), 1);
}

/// After reclaim and a new claim, the old fence is `LostClaim`; the new one appends.
pub async fn append_after_reclaim_and_new_claim_is_lost_claim<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let (a, b) = (env.open().await, env.open().await);
    let (_, old_fence) = fenced(&a, "t", "d1", 100).await;
    a.log.append("t", b"old", Some(&old_fence)).await.unwrap();
    env.advance(101);
    b.mailbox.reclaim_expired(env.now(), 10).await.unwrap();
    let new = claim_some(&b).await;
    let new_fence = Fence::of(&new).unwrap();
    expect_lost_claim(
        a.log.append("t", b"zombie", Some(&old_fence)).await,
        "d1",
        "old fence",
    );
    assert_eq!(
        b.log.append("t", b"new", Some(&new_fence)).await.unwrap(),
        2
    );
    let entries = b.log.read("t", 0, 10).await.unwrap();
    let data: Vec<&[u8]> = entries.iter().map(|e| e.data.as_slice()).collect();
    assert_eq!(data, vec![b"old".as_slice(), b"new".as_slice()]);
}

/// A guest's append with a stale epoch supersedes its dispatch the same way a stale holder
/// write does: the record is superseded and settled by the holder's token (a repeat of the
/// supersede with that token answers with it), the thread is released at once so its next
/// queued dispatch is claimable without waiting for the (long) lease, and a holder of another
/// thread keeps its claim, its lease and its blocked sibling.
pub async fn stale_fenced_append_supersedes_through_the_shared_path<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let (d1, fence) = fenced(&s, "t", "d1", 3_600_000).await;
    let (u1, _) = fenced(&s, "u", "u1", 3_600_000).await;
    put_on(&s, "u", "u2").await;
    s.mailbox.interrupt("t", "stop").await.unwrap();
    put_on(&s, "t", "d2").await;
    assert_eq!(claim(&s).await, None, "d1 and u1 hold both threads");

    expect_stale_epoch(
        s.log.append("t", b"zombie", Some(&fence)).await,
        "d1",
        0,
        1,
        "append",
    );
    assert_eq!(s.log.latest("t").await.unwrap(), 0, "nothing was appended");
    let gone = load(&s, "d1").await;
    assert_eq!(gone.status, Status::Superseded);
    assert_eq!(gone.claim, None);
    assert_eq!(gone.last_error.as_deref(), Some(REASON_STALE_EPOCH));
    assert_shape(&gone);
    assert_eq!(
        s.mailbox
            .supersede_claimed("d1", Some(&tok(&d1)), "again")
            .await
            .unwrap(),
        Some(gone.clone()),
        "the supersede is recorded as settled by the holder's token"
    );

    let d2 = claim_some(&s).await;
    assert_eq!((d2.id.as_str(), d2.epoch), ("d2", 1));
    assert_eq!(claim(&s).await, None, "u1 still holds its thread");
    let still = load(&s, "u1").await;
    assert_eq!(still.status, Status::Claimed);
    assert_eq!(still.claim, u1.claim);
    assert_eq!(load(&s, "u2").await.status, Status::Queued);
    s.mailbox.ack("u1", &tok(&u1)).await.unwrap();
    assert_eq!(claim_some(&s).await.id, "u2");
}
