//! Waitpoints and the `waiting` status (the contract, docs/contract.md, section 10, T17, T18
//! and guarantee 11): W1 create (idempotent by dispatch and name, fenced), T17 suspend (to
//! waiting, or queued at once when a waitpoint settled during the run), W2 complete (the first
//! wins, also across instances), W3 time out (once, whoever sweeps), W4 cancel (by an
//! operator, an interrupt, or the dispatch ending), and what a waiting dispatch holds: its
//! thread, and nothing else.
//!
//! Time only moves through the [`ManualClock`]; nothing sleeps.

use std::collections::BTreeMap;
use std::time::Duration;

use homing::store::waitpoints::{
    BY_DISPATCH_ENDED, BY_INTERRUPT, BY_TIMEOUT, MAX_WAITPOINTS, token_digest,
};
use homing::store::{
    Created, Fence, NewWaitpoint, RunResult, Settlement, Status, StoreError, Waitpoint,
    WaitpointFilter, WaitpointState,
};
use tokio::task::JoinSet;

use super::*;

/// The resumes the tests allow (the plugin default).
const MAX_RESUMES: u32 = 100;
/// How long a watch may take to fire before the test fails (a bound on failure, not a wait).
const WATCH_DEADLINE: Duration = Duration::from_secs(30);

fn new_wp(name: &str, timeout_ms: u64) -> NewWaitpoint {
    NewWaitpoint {
        name: name.into(),
        timeout_ms,
        metadata: BTreeMap::from([("tool".to_owned(), format!("call for {name}"))]),
        token_digest: token_digest(&format!("hwp_{name}")),
    }
}

fn fence(d: &Dispatch) -> Fence {
    Fence::of(d).unwrap_or_else(|| panic!("dispatch {} is not claimed", d.id))
}

/// Creates waitpoint `name` through claim `d`; it must succeed.
async fn create(store: &Store, d: &Dispatch, name: &str, timeout_ms: u64) -> Created {
    let f = fence(d);
    retry(|| {
        store
            .waitpoints
            .create_waitpoint(&f, new_wp(name, timeout_ms))
    })
    .await
    .unwrap_or_else(|e| panic!("create waitpoint {name}: {e}"))
}

/// Enqueues `id` on `thread`, claims it (recording its start) and creates waitpoint `name`.
pub(super) async fn claimed_with(
    store: &Store,
    thread: &str,
    id: &str,
    name: &str,
) -> (Dispatch, Waitpoint) {
    put_on(store, thread, id).await;
    let d = claim_id(store, id).await;
    let d = store.mailbox.record_start(id, &tok(&d)).await.unwrap();
    let w = create(store, &d, name, 60_000).await.waitpoint;
    (d, w)
}

/// Suspends claim `d`; it must succeed.
pub(super) async fn suspend(store: &Store, d: &Dispatch) -> Dispatch {
    let token = tok(d);
    retry(|| store.mailbox.suspend(&d.id, &token, MAX_RESUMES))
        .await
        .unwrap_or_else(|e| panic!("suspend {}: {e}", d.id))
}

async fn complete(store: &Store, id: &str, result: &[u8]) -> Settlement {
    retry(|| {
        store
            .waitpoints
            .complete_waitpoint(id, result.to_vec(), "token")
    })
    .await
    .unwrap_or_else(|e| panic!("complete {id}: {e}"))
}

async fn wp(store: &Store, id: &str) -> Waitpoint {
    store
        .waitpoints
        .waitpoint(id)
        .await
        .expect("waitpoint")
        .unwrap_or_else(|| panic!("waitpoint {id} is not stored"))
}

/// W1 is idempotent by (dispatch, name): a second create returns the first record
/// unchanged (its timeout and metadata, not the new ones) and stores no second digest.
pub async fn creating_a_waitpoint_twice_by_name_returns_the_first<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    let d = claim_id(&s, "d1").await;
    let first = create(&s, &d, "approve", 60_000).await;
    assert!(first.created);
    let w = &first.waitpoint;
    assert_eq!(
        (w.dispatch.as_str(), w.thread.as_str(), w.agent.as_str()),
        ("d1", "t", AGENT)
    );
    assert_eq!(
        (w.state, w.created_at, w.timeout_at),
        (WaitpointState::Pending, T0, T0 + 60_000)
    );
    assert_eq!(w.token_digests, vec![token_digest("hwp_approve")]);
    assert_eq!(w.created_claim, 1);
    assert_eq!(w.result, None);
    assert!(
        uuid::Uuid::parse_str(&w.id).is_ok_and(|u| u.get_version_num() == 7),
        "{}",
        w.id
    );

    env.advance(5);
    let mut again = new_wp("approve", 5);
    again.metadata.clear();
    again.token_digest = token_digest("hwp_other");
    let f = fence(&d);
    let second = retry(|| s.waitpoints.create_waitpoint(&f, again.clone()))
        .await
        .unwrap();
    assert!(!second.created);
    assert_eq!(second.waitpoint, first.waitpoint, "returned unchanged");
    let other = create(&s, &d, "second", 1_000).await;
    assert!(other.created && other.waitpoint.id != first.waitpoint.id);
    let all = s.waitpoints.waitpoints_of("d1").await.unwrap();
    assert_eq!(
        all.iter().map(|w| w.name.as_str()).collect::<Vec<_>>(),
        ["approve", "second"],
        "oldest first"
    );
    // Another instance, and a restart, read the same.
    let other_host = env.open().await;
    assert_eq!(wp(&other_host, &first.waitpoint.id).await, first.waitpoint);
    drop((s, other_host));
    let reopened = env.open().await;
    assert_eq!(reopened.waitpoints.waitpoints_of("d1").await.unwrap(), all);
}

/// W1 is a holder write: refused after the lease ran out, with another token, after an
/// interrupt (which supersedes the dispatch) and for a dispatch not claimed; bad input is
/// `Invalid`; the 257th waitpoint of a dispatch is `Limit`. Nothing is stored when refused.
pub async fn creating_a_waitpoint_is_fenced_checked_and_capped<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    let d = claim_id(&s, "d1").await;
    for (bad, what) in [
        (new_wp(" ", 1_000), "waitpoint name"),
        (new_wp("x", 0), "waitpoint timeout"),
        (new_wp("x", 30 * 24 * 3_600_000 + 1), "waitpoint timeout"),
        (
            NewWaitpoint {
                metadata: BTreeMap::from([("k".to_owned(), "v".repeat(17 * 1024))]),
                ..new_wp("x", 1_000)
            },
            "metadata",
        ),
    ] {
        match s.waitpoints.create_waitpoint(&fence(&d), bad).await {
            Err(StoreError::Invalid(m)) => assert!(m.starts_with(what), "{what}: {m}"),
            other => panic!("{what}: expected Invalid, got {other:?}"),
        }
    }
    let mut wrong = fence(&d);
    wrong.token = "not-the-token".into();
    assert!(matches!(
        s.waitpoints
            .create_waitpoint(&wrong, new_wp("x", 1_000))
            .await,
        Err(StoreError::LostClaim { .. })
    ));
    let queued = put_on(&s, "u", "q1").await;
    let unclaimed = Fence {
        dispatch: queued.id.clone(),
        token: "t".into(),
        epoch: 0,
    };
    assert!(matches!(
        s.waitpoints
            .create_waitpoint(&unclaimed, new_wp("x", 1_000))
            .await,
        Err(StoreError::NotClaimed { .. })
    ));
    env.advance(LEASE + 1);
    assert!(matches!(
        s.waitpoints
            .create_waitpoint(&fence(&d), new_wp("x", 1_000))
            .await,
        Err(StoreError::LostClaim { .. })
    ));
    assert!(s.waitpoints.waitpoints_of("d1").await.unwrap().is_empty());

    put_on(&s, "t2", "d2").await;
    let d2 = claim_id(&s, "d2").await;
    s.mailbox.interrupt("t2", "newer").await.unwrap();
    assert!(matches!(
        s.waitpoints
            .create_waitpoint(&fence(&d2), new_wp("x", 1_000))
            .await,
        Err(StoreError::StaleEpoch { .. })
    ));
    assert_eq!(load(&s, "d2").await.status, Status::Superseded);
    assert!(s.waitpoints.waitpoints_of("d2").await.unwrap().is_empty());

    put_on(&s, "t3", "d3").await;
    let d3 = claim_id(&s, "d3").await;
    for i in 0..MAX_WAITPOINTS {
        create(&s, &d3, &format!("w{i}"), 60_000).await;
    }
    match s
        .waitpoints
        .create_waitpoint(&fence(&d3), new_wp("one-more", 1_000))
        .await
    {
        Err(StoreError::Limit(m)) => assert!(m.contains("256"), "{m}"),
        other => panic!("expected Limit, got {other:?}"),
    }
    let again = create(&s, &d3, "w7", 60_000).await;
    assert!(!again.created, "an existing name is still found at the cap");
    assert_eq!(
        s.waitpoints.waitpoints_of("d3").await.unwrap().len(),
        MAX_WAITPOINTS as usize
    );
}

/// T17 to waiting: no claim, no start, no result, the attempt unchanged; the thread stays busy
/// (no sibling is claimed, by the queue or by id) and the dispatch itself is claimed by
/// nothing until a waitpoint settles. A repeat of the suspend answers the same record.
pub async fn a_suspended_dispatch_waits_holding_its_thread_and_nothing_else<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let (d, _) = claimed_with(&s, "t", "d1", "approve").await;
    put_on(&s, "t", "sibling").await;
    let token = tok(&d);
    let waiting = suspend(&s, &d).await;
    assert_eq!(waiting.status, Status::Waiting);
    assert_shape(&waiting);
    assert_eq!(
        (waiting.attempt, waiting.resumes, waiting.claims),
        (0, 0, 1)
    );
    assert_eq!(
        retry(|| s.mailbox.suspend("d1", &token, MAX_RESUMES))
            .await
            .unwrap(),
        waiting,
        "a repeat answers the record"
    );
    assert_eq!(load(&s, "d1").await, waiting);
    assert!(
        claim(&s).await.is_none(),
        "the thread is busy while its dispatch waits"
    );
    for id in ["d1", "sibling"] {
        assert!(
            s.mailbox
                .claim_dispatch(id, WORKER, LEASE)
                .await
                .unwrap()
                .is_none(),
            "{id} must not be claimed while d1 waits"
        );
    }
    assert!(
        s.mailbox
            .reclaim_expired(env.now() + 10 * LEASE, 100)
            .await
            .unwrap()
            .is_empty(),
        "a waiting dispatch has no lease to expire"
    );
    assert!(s.mailbox.has_live_work().await.unwrap());
    let counts = s.mailbox.live_counts().await.unwrap();
    assert!(
        counts
            .iter()
            .any(|c| c.status == Status::Waiting && c.count == 1),
        "{counts:?}"
    );
    let listed = all_in(&s, Status::Waiting).await;
    assert_eq!(listed.len(), 1);
    // Another host agrees.
    let other = env.open().await;
    assert!(claim(&other).await.is_none());
    assert_eq!(load(&other, "d1").await.status, Status::Waiting);
    // Writes through the old claim are refused.
    assert!(matches!(
        s.mailbox.ack("d1", &tok(&d)).await,
        Err(StoreError::NotClaimed { .. })
    ));
}

/// T18: a completion queues the waiting dispatch again, available at once, with its id, its
/// attempts and one more resume; the next claim is its next run (one more claim), which reads
/// the result. The completion's answer is `Settled` with the record.
pub async fn a_completion_resumes_the_waiting_dispatch_keeping_its_id_and_attempts<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let (d, w) = claimed_with(&s, "t", "d1", "approve").await;
    suspend(&s, &d).await;
    env.advance(1_000);
    let out = complete(&s, &w.id, br#"{"approved": true}"#).await;
    let Settlement::Settled(done) = out else {
        panic!("expected Settled, got {out:?}");
    };
    assert_eq!(done.state, WaitpointState::Completed);
    assert_eq!(
        done.result.as_deref(),
        Some(br#"{"approved": true}"#.as_slice())
    );
    assert_eq!(
        (done.settled_by.as_deref(), done.settled_at),
        (Some("token"), Some(env.now()))
    );
    let resumed = load(&s, "d1").await;
    assert_eq!(resumed.status, Status::Queued);
    assert_shape(&resumed);
    assert_eq!(
        (resumed.attempt, resumed.resumes, resumed.claims),
        (0, 1, 1)
    );
    assert_eq!(resumed.available_at, env.now());
    let again = claim_some(&s).await;
    assert_eq!(
        (again.id.as_str(), again.claims, again.resumes),
        ("d1", 2, 1)
    );
    let read = s.waitpoints.waitpoints_of("d1").await.unwrap();
    assert_eq!(read, vec![done]);
    // The resumed run acks; its settled waitpoint stays as it was.
    s.mailbox.ack("d1", &tok(&again)).await.unwrap();
    assert_eq!(wp(&s, &w.id).await.state, WaitpointState::Completed);
}

/// A completion that lands between the run's last look and its suspend is not lost: the
/// suspend sees it and queues the dispatch at once (a resume). A waitpoint settled before
/// this run started does not count: with nothing pending, the suspend is `Invalid`.
pub async fn a_completion_before_the_suspend_resumes_at_once<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let (d, w) = claimed_with(&s, "t", "d1", "approve").await;
    let other = env.open().await;
    complete(&other, &w.id, b"early").await;
    let out = suspend(&s, &d).await;
    assert_eq!(
        (out.status, out.resumes, out.attempt),
        (Status::Queued, 1, 0)
    );
    let again = claim_some(&s).await;
    assert_eq!(again.id, "d1");
    env.advance(1);
    let again = s.mailbox.record_start("d1", &tok(&again)).await.unwrap();
    match s.mailbox.suspend("d1", &tok(&again), MAX_RESUMES).await {
        Err(StoreError::Invalid(m)) => assert!(m.contains("no pending waitpoint"), "{m}"),
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert_eq!(
        load(&s, "d1").await.status,
        Status::Claimed,
        "nothing changed"
    );
}

/// A suspend past `max_resumes` is `Limit` naming it, and changes nothing.
pub async fn a_suspend_past_max_resumes_is_limit<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let (d, w) = claimed_with(&s, "t", "d1", "approve").await;
    suspend(&s, &d).await;
    complete(&s, &w.id, b"ok").await;
    let d = claim_some(&s).await;
    create(&s, &d, "second", 60_000).await;
    match s.mailbox.suspend("d1", &tok(&d), 1).await {
        Err(StoreError::Limit(m)) => assert!(m.contains("max_resumes"), "{m}"),
        other => panic!("expected Limit, got {other:?}"),
    }
    assert_eq!(load(&s, "d1").await.status, Status::Claimed);
}

/// Guarantee 11: concurrent completions on several instances have one winner; every other
/// answer is `Already` with the winner's result; the dispatch resumes once.
pub async fn the_first_of_concurrent_completions_wins_on_every_instance<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(3).await;
    let (d, w) = claimed_with(&hosts[0], "t", "d1", "approve").await;
    suspend(&hosts[0], &d).await;
    let mut tasks = JoinSet::new();
    for (i, host) in hosts.iter().enumerate() {
        for j in 0..3 {
            let (host, id) = (host.clone(), w.id.clone());
            tasks.spawn(async move {
                let result = format!("h{i}-{j}").into_bytes();
                retry(|| {
                    host.waitpoints
                        .complete_waitpoint(&id, result.clone(), "token")
                })
                .await
            });
        }
    }
    let mut winners = Vec::new();
    let mut answers = Vec::new();
    while let Some(out) = tasks.join_next().await {
        match out.unwrap().unwrap() {
            Settlement::Settled(w) => winners.push(w),
            Settlement::Already(w) => answers.push(w),
        }
    }
    assert_eq!(winners.len(), 1, "one winner: {winners:?}");
    for a in &answers {
        assert_eq!(
            a.result, winners[0].result,
            "every loser sees the winner's result"
        );
        assert_eq!(a.settled_at, winners[0].settled_at);
    }
    let d = load(&hosts[1], "d1").await;
    assert_eq!((d.status, d.resumes), (Status::Queued, 1), "resumed once");
}

/// W2 after `timeout_at` finds the waitpoint timed out (and resumes its waiting dispatch);
/// W3 by two instances sweeping times each waitpoint out exactly once, earliest first, and
/// leaves those not yet due.
pub async fn timeouts_fire_once_whoever_sweeps_and_beat_a_late_completion<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let hosts = env.open_many(2).await;
    let (d, late) = claimed_with(&hosts[0], "t", "d1", "late").await;
    suspend(&hosts[0], &d).await;
    env.advance(60_001);
    match complete(&hosts[1], &late.id, b"too late").await {
        Settlement::Already(w) => {
            assert_eq!(w.state, WaitpointState::TimedOut);
            assert_eq!(
                (w.settled_by.as_deref(), w.result),
                (Some(BY_TIMEOUT), None)
            );
        }
        other => panic!("expected Already(timed out), got {other:?}"),
    }
    assert_eq!(
        load(&hosts[0], "d1").await.status,
        Status::Queued,
        "the timeout resumed it"
    );

    // Ten waiting dispatches, timeouts 1..=10 s; sweep at 5.5 s on two instances at once.
    let base = env.now();
    for i in 1..=10u64 {
        let thread = format!("w{i}");
        let id = format!("x{i}");
        put_on(&hosts[0], &thread, &id).await;
        let d = claim_id(&hosts[0], &id).await;
        create(&hosts[0], &d, "wait", i * 1_000).await;
        suspend(&hosts[0], &d).await;
    }
    env.set(base + 5_500);
    let now = env.now();
    let (a, b) = tokio::join!(
        retry(|| hosts[0].waitpoints.time_out_waitpoints(now, 100)),
        retry(|| hosts[1].waitpoints.time_out_waitpoints(now, 100)),
    );
    let mut ids: Vec<String> = a
        .unwrap()
        .into_iter()
        .chain(b.unwrap())
        .map(|w| w.dispatch)
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        ["x1", "x2", "x3", "x4", "x5"],
        "each due waitpoint timed out once"
    );
    for i in 1..=10 {
        let d = load(&hosts[1], &format!("x{i}")).await;
        let want = if i <= 5 {
            Status::Queued
        } else {
            Status::Waiting
        };
        assert_eq!(d.status, want, "x{i}");
        let w = &hosts[1].waitpoints.waitpoints_of(&d.id).await.unwrap()[0];
        assert_eq!(w.state == WaitpointState::TimedOut, i <= 5, "x{i}: {w:?}");
        if i <= 5 {
            assert_eq!(w.settled_at, Some(now));
        }
    }
    assert!(
        hosts[0]
            .waitpoints
            .time_out_waitpoints(now, 100)
            .await
            .unwrap()
            .is_empty(),
        "nothing twice"
    );
}

/// W4 by an operator resumes the waiting dispatch (the run reads `cancelled`); a second
/// cancel or a completion after it is `Already`; an unknown id is `NotFound`.
pub async fn an_operator_cancel_resumes_and_settles_once<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let (d, w) = claimed_with(&s, "t", "d1", "approve").await;
    suspend(&s, &d).await;
    let out = retry(|| s.waitpoints.cancel_waitpoint(&w.id, "operator:ops"))
        .await
        .unwrap();
    let Settlement::Settled(c) = out else {
        panic!("expected Settled, got {out:?}");
    };
    assert_eq!(
        (c.state, c.settled_by.as_deref()),
        (WaitpointState::Cancelled, Some("operator:ops"))
    );
    assert_eq!(load(&s, "d1").await.status, Status::Queued);
    assert!(matches!(
        s.waitpoints
            .cancel_waitpoint(&w.id, "operator:ops")
            .await
            .unwrap(),
        Settlement::Already(_)
    ));
    assert!(matches!(
        complete(&s, &w.id, b"x").await,
        Settlement::Already(_)
    ));
    assert!(matches!(
        s.waitpoints
            .complete_waitpoint("no-such-waitpoint", vec![], "token")
            .await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(
        s.waitpoints
            .waitpoint("no-such-waitpoint")
            .await
            .unwrap()
            .is_none()
    );
}

/// An interrupt of a waiting thread supersedes the waiting dispatch (listed), frees the
/// thread for newer work and cancels its waitpoints (`interrupt`); a cancel (T3) of a waiting
/// dispatch does the same with `dispatch-ended`.
pub async fn interrupt_and_cancel_of_a_waiting_dispatch_cancel_its_waitpoints<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let (d, w) = claimed_with(&s, "t", "d1", "approve").await;
    suspend(&s, &d).await;
    let out = s.mailbox.interrupt("t", "a newer message").await.unwrap();
    assert_eq!(out.superseded, vec!["d1".to_owned()]);
    assert!(out.active.is_none());
    let d = load(&s, "d1").await;
    assert_eq!(d.status, Status::Superseded);
    assert_shape(&d);
    let w = wp(&s, &w.id).await;
    assert_eq!(
        (w.state, w.settled_by.as_deref()),
        (WaitpointState::Cancelled, Some(BY_INTERRUPT))
    );
    put_on(&s, "t", "newer").await;
    assert_eq!(claim_some(&s).await.id, "newer", "the thread is free");

    let (d2, w2) = claimed_with(&s, "u", "d2", "approve").await;
    suspend(&s, &d2).await;
    put_on(&s, "u", "after").await;
    let cancelled = s
        .mailbox
        .cancel("d2")
        .await
        .unwrap()
        .expect("a waiting dispatch cancels");
    assert_eq!(cancelled.status, Status::Cancelled);
    let w2 = wp(&s, &w2.id).await;
    assert_eq!(
        (w2.state, w2.settled_by.as_deref()),
        (WaitpointState::Cancelled, Some(BY_DISPATCH_ENDED))
    );
    assert_eq!(claim_some(&s).await.id, "after", "the thread is free");
}

/// Every transition into a terminal status cancels the dispatch's pending waitpoints in the
/// same step (`dispatch-ended`), and leaves settled ones as they are; a nack that requeues
/// keeps them pending for the next run.
pub async fn a_terminal_settlement_cancels_pending_waitpoints<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let (d, pending) = claimed_with(&s, "t", "d1", "pending").await;
    let settled = create(&s, &d, "settled", 60_000).await.waitpoint;
    complete(&s, &settled.id, b"ok").await;
    s.mailbox
        .complete("d1", &tok(&d), RunResult::success(b"done".to_vec()))
        .await
        .unwrap();
    let p = wp(&s, &pending.id).await;
    assert_eq!(
        (p.state, p.settled_by.as_deref()),
        (WaitpointState::Cancelled, Some(BY_DISPATCH_ENDED))
    );
    assert_eq!(wp(&s, &settled.id).await.state, WaitpointState::Completed);

    let (d2, w2) = claimed_with(&s, "t2", "d2", "kept").await;
    s.mailbox
        .nack("d2", &tok(&d2), env.now(), "try again")
        .await
        .unwrap();
    assert_eq!(
        wp(&s, &w2.id).await.state,
        WaitpointState::Pending,
        "a requeued run keeps it"
    );
    let d2 = claim_some(&s).await;
    assert_eq!(d2.id, "d2");
    s.mailbox
        .dead_letter("d2", &tok(&d2), "gave up")
        .await
        .unwrap();
    assert_eq!(wp(&s, &w2.id).await.state, WaitpointState::Cancelled);

    // A lease that runs out on the last attempt dead-letters: its waitpoints go too.
    let new = nd("t3", "d3").with_max_attempts(1);
    put(&s, new).await;
    let d3 = claim_id(&s, "d3").await;
    let w3 = create(&s, &d3, "x", 600_000).await.waitpoint;
    env.advance(LEASE + 1);
    s.mailbox.reclaim_expired(env.now(), 10).await.unwrap();
    assert_eq!(load(&s, "d3").await.status, Status::DeadLetter);
    assert_eq!(wp(&s, &w3.id).await.state, WaitpointState::Cancelled);
}

/// A dispatch reclaimed after creating a waitpoint (its host died before suspending) is run
/// again and finds the same waitpoint by name; a completion in between is kept.
pub async fn a_rerun_after_a_lost_lease_finds_the_same_waitpoint<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let (_, w) = claimed_with(&s, "t", "d1", "approve").await;
    env.advance(LEASE + 1);
    assert_eq!(
        s.mailbox
            .reclaim_expired(env.now(), 10)
            .await
            .unwrap()
            .len(),
        1
    );
    let other = env.open().await;
    let d = claim_some(&other).await;
    assert_eq!((d.id.as_str(), d.attempt, d.claims), ("d1", 1, 2));
    let again = create(&other, &d, "approve", 60_000).await;
    assert!(!again.created);
    assert_eq!(again.waitpoint.id, w.id);
    assert_eq!(again.waitpoint.created_claim, 1);
}

/// Lists page by (created_at, id) and filter by thread, dispatch and state; a purge of the
/// dispatch removes its waitpoints.
pub async fn waitpoints_list_by_filter_and_go_with_their_dispatch<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let (d0, w0) = claimed_with(&s, "t0", "d0", "w0").await;
    let mut ids = vec![w0.id.clone()];
    for i in 1..4 {
        env.advance(1);
        ids.push(create(&s, &d0, &format!("w{i}"), 60_000).await.waitpoint.id);
    }
    env.advance(1);
    let (_, on_other) = claimed_with(&s, "t1", "d1", "w").await;
    ids.push(on_other.id.clone());
    complete(&s, &ids[0], b"ok").await;
    let page = |filter: WaitpointFilter| {
        let s = s.clone();
        async move { s.waitpoints.list_waitpoints(&filter).await.unwrap() }
    };
    let all = page(WaitpointFilter::default()).await;
    assert_eq!(all.iter().map(|w| w.id.clone()).collect::<Vec<_>>(), ids);
    let first2 = page(WaitpointFilter {
        limit: 2,
        ..Default::default()
    })
    .await;
    let rest = page(WaitpointFilter {
        after: first2.last().map(|w| (w.created_at, w.id.clone())),
        ..Default::default()
    })
    .await;
    assert_eq!(first2.len() + rest.len(), 5);
    assert_eq!(rest[0].id, ids[2]);
    let on_t1 = page(WaitpointFilter {
        thread: Some("t1".into()),
        ..Default::default()
    })
    .await;
    assert_eq!(on_t1, vec![on_other]);
    let pending = page(WaitpointFilter {
        state: Some(WaitpointState::Pending),
        ..Default::default()
    })
    .await;
    assert_eq!(pending.len(), 4);
    let of_d0 = page(WaitpointFilter {
        dispatch: Some("d0".into()),
        ..Default::default()
    })
    .await;
    assert_eq!(of_d0.len(), 4);
    let settled = page(WaitpointFilter {
        dispatch: Some("d0".into()),
        state: Some(WaitpointState::Completed),
        ..Default::default()
    })
    .await;
    assert_eq!(
        settled.iter().map(|w| w.id.clone()).collect::<Vec<_>>(),
        [ids[0].clone()]
    );

    // d0 settles and is purged after its retention: its waitpoints go with it.
    s.mailbox.ack("d0", &tok(&d0)).await.unwrap();
    env.advance(1_000);
    if !s.mailbox.expires_settled() {
        s.mailbox.purge_terminal(env.now()).await.unwrap();
        assert!(s.waitpoints.waitpoint(&ids[0]).await.unwrap().is_none());
        assert!(s.waitpoints.waitpoints_of("d0").await.unwrap().is_empty());
    }
}

/// A watch of the thread fires when one of its waitpoints settles on another instance (what
/// `await-waitpoint` waits on).
pub async fn a_watch_fires_when_a_waitpoint_settles_on_another_instance<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let (_, w) = claimed_with(&s, "t", "d1", "approve").await;
    let mut watch = s.inbox.watch("t");
    let other = env.open().await;
    complete(&other, &w.id, b"ok").await;
    tokio::time::timeout(WATCH_DEADLINE, watch.changed())
        .await
        .expect("the watch fires after a settlement on another instance");
    let mut seen = wp(&s, &w.id).await;
    for _ in 0..1_000 {
        if !seen.is_pending() {
            break;
        }
        tokio::task::yield_now().await;
        seen = wp(&s, &w.id).await;
    }
    assert_eq!(seen.state, WaitpointState::Completed);
}
