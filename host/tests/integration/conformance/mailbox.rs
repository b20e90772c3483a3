//! The mailbox transitions one at a time (the contract, docs/contract.md, section 2).

use std::collections::BTreeMap;
use std::time::Duration;

use homing::store::{
    DispatchRow, ListCursor, ListFilter, NewDispatch, RunResult, Status, StatusCount, StoreError,
};

use super::*;

/// An enqueued dispatch is listed for its thread as queued.
pub async fn enqueued_dispatch_is_listed_for_its_thread_as_queued<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let d = put_on(&s, "t1", "d1").await;
    put_on(&s, "t2", "other").await;
    let listed = s
        .mailbox
        .list(&ListFilter {
            thread: Some("t1".into()),
            ..ListFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(listed, vec![d.clone()]);
    assert_eq!(listed[0].status, Status::Queued);
    assert_eq!(load(&s, "d1").await, d);
}

/// Claim hands out the queued dispatch as claimed, with a fresh token, the consumer and
/// `lease_until = now + lease`.
pub async fn claim_returns_dispatch_claimed_with_token_consumer_and_lease<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    env.advance(10);
    let d = s
        .mailbox
        .claim(AGENT, "host-a/worker-3", 1_234)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.id, "d1");
    assert_eq!(d.status, Status::Claimed);
    let claim = d.claim.clone().unwrap();
    assert!(!claim.token.is_empty());
    assert_eq!(claim.claimed_by, "host-a/worker-3");
    assert_eq!(claim.lease_until, T0 + 10 + 1_234);
    assert_eq!(d.attempt, 0);
    assert_shape(&d);
    assert_eq!(load(&s, "d1").await, d, "claim returns the stored record");
}

/// `claim_started` is `claim` plus `record_start` in one step: the same dispatch, claimed, with
/// `started_at` set; `None` when nothing is available.
pub async fn claim_started_claims_and_records_the_start_in_one_step<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    assert_eq!(
        s.mailbox.claim_started(AGENT, WORKER, LEASE).await.unwrap(),
        None
    );
    put_on(&s, "t", "d1").await;
    env.advance(7);
    let d = s
        .mailbox
        .claim_started(AGENT, WORKER, LEASE)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.id, "d1");
    assert_eq!(d.status, Status::Claimed);
    assert_eq!(d.started_at, Some(T0 + 7));
    assert_eq!(d.claim.as_ref().unwrap().lease_until, T0 + 7 + LEASE);
    assert_shape(&d);
    assert_eq!(
        load(&s, "d1").await,
        d,
        "what is returned is what is stored"
    );
    assert_eq!(claim(&s).await, None, "the thread is held");
}

/// Nothing available is `None`, not an error.
pub async fn claim_with_nothing_available_is_none<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    assert_eq!(claim(&s).await, None);
    put_on(&s, "t", "d1").await;
    assert_eq!(
        s.mailbox
            .claim("no-such-agent", WORKER, LEASE)
            .await
            .unwrap(),
        None
    );
    claim_some(&s).await;
    assert_eq!(claim(&s).await, None);
}

/// `claim(agent, ...)` takes only that agent's dispatches.
pub async fn claim_only_takes_dispatches_of_its_agent<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(
        &s,
        NewDispatch::new("other", "t1", b"x".to_vec())
            .with_id("o1")
            .with_priority(0),
    )
    .await;
    put_on(&s, "t2", "a1").await;
    let d = claim_some(&s).await;
    assert_eq!(d.id, "a1");
    assert_eq!(claim(&s).await, None);
    let o = s
        .mailbox
        .claim("other", WORKER, LEASE)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(o.id, "o1");
    assert_eq!(o.agent, "other");
}

/// Ack settles as acked, clears the claim and stamps `completed_at`.
pub async fn ack_settles_as_acked_and_clears_claim_fields<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    let c = claim_some(&s).await;
    env.advance(5);
    let acked = s.mailbox.ack("d1", &tok(&c)).await.unwrap();
    assert_eq!(acked.status, Status::Acked);
    assert_eq!(acked.claim, None);
    assert_eq!(acked.completed_at, Some(T0 + 5));
    assert_eq!(acked.attempt, 0);
    assert_shape(&acked);
    assert_eq!(load(&s, "d1").await, acked);
}

/// `attempt` counts failed attempts only; claim, claim_dispatch and ack never touch it.
pub async fn claim_and_ack_do_not_count_attempts<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, nd("t", "d1").with_max_attempts(3)).await;
    let c = claim_some(&s).await;
    assert_eq!(c.attempt, 0);
    let n = s
        .mailbox
        .nack("d1", &tok(&c), env.now(), "e")
        .await
        .unwrap();
    assert_eq!(n.attempt, 1);
    let c = claim_id(&s, "d1").await;
    assert_eq!(c.attempt, 1);
    let a = s.mailbox.ack("d1", &tok(&c)).await.unwrap();
    assert_eq!(a.attempt, 1);
}

/// Nack with attempts left: queued at `retry_at`, attempt + 1, error recorded, claim and
/// run projection dropped, no `completed_at`.
pub async fn nack_with_attempts_left_requeues_at_retry_at_without_projection<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, nd("t", "d1").with_max_attempts(3)).await;
    let c = claim_some(&s).await;
    let t = tok(&c);
    s.mailbox.record_start("d1", &t).await.unwrap();
    s.mailbox
        .record_result("d1", &t, RunResult::failure("bad"))
        .await
        .unwrap();
    let retry_at = env.now() + 5_000;
    let n = s
        .mailbox
        .nack("d1", &t, retry_at, "transient failure")
        .await
        .unwrap();
    assert_eq!(n.status, Status::Queued);
    assert_eq!(n.attempt, 1);
    assert_eq!(n.available_at, retry_at);
    assert_eq!(n.last_error.as_deref(), Some("transient failure"));
    assert_eq!(n.claim, None);
    assert_eq!(n.started_at, None);
    assert_eq!(n.result, None);
    assert_eq!(n.completed_at, None);
    assert_shape(&n);
    assert_eq!(load(&s, "d1").await, n);
}

/// With max 2, the first nack requeues and the second dead-letters with attempt 2.
pub async fn nack_at_max_attempts_dead_letters<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, nd("t", "d1").with_max_attempts(2)).await;
    let c = claim_some(&s).await;
    let first = s
        .mailbox
        .nack("d1", &tok(&c), env.now(), "one")
        .await
        .unwrap();
    assert_eq!((first.status, first.attempt), (Status::Queued, 1));
    let c = claim_some(&s).await;
    env.advance(3);
    let second = s
        .mailbox
        .nack("d1", &tok(&c), env.now(), "two")
        .await
        .unwrap();
    assert_eq!(second.status, Status::DeadLetter);
    assert_eq!(second.attempt, 2);
    assert_eq!(second.claim, None);
    assert_eq!(second.completed_at, Some(env.now()));
    assert_eq!(second.last_error.as_deref(), Some("two"));
    assert_shape(&second);
    assert_eq!(claim(&s).await, None);
}

/// A nack with `retry_at <= now` is claimable again at once.
pub async fn nack_with_past_retry_at_is_claimable_at_once<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    env.advance(1_000);
    let c = claim_some(&s).await;
    s.mailbox
        .nack("d1", &tok(&c), T0, "retry now")
        .await
        .unwrap();
    let again = claim_some(&s).await;
    assert_eq!(again.id, "d1");
    assert_ne!(tok(&again), tok(&c), "a new claim gets a new token");
}

/// A future `retry_at` hides the dispatch from `claim` until exactly then, while
/// `claim_dispatch` still takes it.
pub async fn nack_with_future_retry_at_blocks_claim_until_then_but_not_claim_dispatch<
    F: Factory,
>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let (a, b) = (env.open().await, env.open().await);
    put_on(&a, "t", "d1").await;
    put_on(&a, "t2", "d2").await;
    let c = claim_id(&a, "d1").await;
    let retry_at = T0 + 2_000;
    a.mailbox
        .nack("d1", &tok(&c), retry_at, "later")
        .await
        .unwrap();
    let c2 = claim_id(&a, "d2").await;
    a.mailbox
        .nack("d2", &tok(&c2), retry_at, "later")
        .await
        .unwrap();
    env.set(retry_at - 1);
    assert_eq!(claim(&b).await, None, "nothing before retry_at");
    let by_id = claim_id(&b, "d2").await;
    assert_eq!(by_id.id, "d2", "claim_dispatch ignores available_at");
    env.set(retry_at);
    let d = claim_some(&b).await;
    assert_eq!(d.id, "d1", "claimable at retry_at");
}

/// Dead_letter settles with the reason and leaves the attempt count alone.
pub async fn dead_letter_settles_with_reason_and_keeps_attempt<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, nd("t", "d1").with_max_attempts(4)).await;
    let c = claim_some(&s).await;
    s.mailbox
        .nack("d1", &tok(&c), env.now(), "first")
        .await
        .unwrap();
    let c = claim_some(&s).await;
    env.advance(9);
    let d = s
        .mailbox
        .dead_letter("d1", &tok(&c), "poison input")
        .await
        .unwrap();
    assert_eq!(d.status, Status::DeadLetter);
    assert_eq!(d.attempt, 1);
    assert_eq!(d.last_error.as_deref(), Some("poison input"));
    assert_eq!(d.completed_at, Some(env.now()));
    assert_eq!(d.claim, None);
    assert_shape(&d);
    assert_eq!(load(&s, "d1").await, d);
}

/// Complete = record_result + ack in one step.
pub async fn complete_records_result_and_acks_in_one_step<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    let c = claim_some(&s).await;
    let result = RunResult::success(b"the answer".to_vec());
    let d = s
        .mailbox
        .complete("d1", &tok(&c), result.clone())
        .await
        .unwrap();
    assert_eq!(d.status, Status::Acked);
    assert_eq!(d.result, Some(result));
    assert_eq!(d.claim, None);
    assert!(d.completed_at.is_some());
    assert_eq!(load(&s, "d1").await, d);
}

/// Start and result are recorded while claimed and the acked record keeps them.
pub async fn record_start_and_result_keep_dispatch_claimed_and_survive_ack<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    let c = claim_some(&s).await;
    let t = tok(&c);
    env.advance(1);
    let started = s.mailbox.record_start("d1", &t).await.unwrap();
    assert_eq!(started.status, Status::Claimed);
    assert_eq!(started.started_at, Some(T0 + 1));
    assert_eq!(started.result, None);
    assert_eq!(started.completed_at, None);
    assert_eq!(started.claim, c.claim, "record_start keeps the claim");
    env.advance(1);
    let result = RunResult::success(b"out".to_vec());
    let recorded = s
        .mailbox
        .record_result("d1", &t, result.clone())
        .await
        .unwrap();
    assert_eq!(recorded.status, Status::Claimed);
    assert_eq!(recorded.result, Some(result.clone()));
    assert_eq!(recorded.started_at, Some(T0 + 1));
    assert_eq!(
        recorded.completed_at, None,
        "still claimed: no completed_at"
    );
    assert_shape(&recorded);
    assert_eq!(load(&s, "d1").await, recorded);
    let acked = s.mailbox.ack("d1", &t).await.unwrap();
    assert_eq!(acked.result, Some(result));
    assert_eq!(acked.started_at, Some(T0 + 1));
}

/// Holder operations on a missing dispatch are `NotFound` (extend_lease: `false`).
pub async fn holder_ops_on_missing_dispatch_are_not_found<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let m = &s.mailbox;
    let nf = |r: Result<_, StoreError>| match r {
        Err(StoreError::NotFound { id }) => assert_eq!(id, "ghost"),
        other => panic!("expected NotFound, got {other:?}"),
    };
    nf(m.ack("ghost", "tok").await);
    nf(m.nack("ghost", "tok", T0, "e").await);
    nf(m.dead_letter("ghost", "tok", "e").await);
    nf(m.complete("ghost", "tok", RunResult::success(vec![])).await);
    nf(m.record_start("ghost", "tok").await);
    nf(m.record_result("ghost", "tok", RunResult::success(vec![]))
        .await);
    assert!(!m.extend_lease("ghost", "tok", 10).await.unwrap());
    assert_eq!(m.load("ghost").await.unwrap(), None);
}

/// Holder operations on a queued dispatch are `NotClaimed { status: queued }` and change
/// nothing.
pub async fn holder_ops_on_queued_dispatch_are_not_claimed_and_change_nothing<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let m = &s.mailbox;
    let before = put_on(&s, "t", "d1").await;
    let nc = |r: Result<_, StoreError>| match r {
        Err(StoreError::NotClaimed { id, status }) => {
            assert_eq!(id, "d1");
            assert_eq!(status, Status::Queued);
        }
        other => panic!("expected NotClaimed, got {other:?}"),
    };
    nc(m.ack("d1", "tok").await);
    nc(m.nack("d1", "tok", T0, "e").await);
    nc(m.dead_letter("d1", "tok", "e").await);
    nc(m.complete("d1", "tok", RunResult::success(vec![])).await);
    nc(m.record_start("d1", "tok").await);
    nc(m.record_result("d1", "tok", RunResult::success(vec![]))
        .await);
    assert!(!m.extend_lease("d1", "tok", 10).await.unwrap());
    assert_eq!(load(&s, "d1").await, before);
}

/// Cancel of a queued dispatch returns it cancelled, with no claim and `completed_at`.
pub async fn cancel_of_queued_dispatch_returns_it_cancelled<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    env.advance(4);
    let d = s.mailbox.cancel("d1").await.unwrap().unwrap();
    assert_eq!(d.status, Status::Cancelled);
    assert_eq!(d.claim, None);
    assert_eq!(d.completed_at, Some(T0 + 4));
    assert_shape(&d);
    assert_eq!(load(&s, "d1").await, d);
    assert_eq!(claim(&s).await, None);
}

/// Cancel of a claimed dispatch is `None` and leaves it claimed.
pub async fn cancel_of_claimed_dispatch_is_none_and_leaves_it_claimed<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    let c = claim_some(&s).await;
    assert_eq!(s.mailbox.cancel("d1").await.unwrap(), None);
    assert_eq!(load(&s, "d1").await, c);
    s.mailbox.ack("d1", &tok(&c)).await.unwrap();
}

/// Cancel is `None` for a missing or terminal dispatch, which stays as it was.
pub async fn cancel_of_missing_or_terminal_dispatch_is_none<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    assert_eq!(s.mailbox.cancel("ghost").await.unwrap(), None);
    put_on(&s, "t", "d1").await;
    let c = claim_some(&s).await;
    let acked = s.mailbox.ack("d1", &tok(&c)).await.unwrap();
    assert_eq!(s.mailbox.cancel("d1").await.unwrap(), None);
    assert_eq!(load(&s, "d1").await, acked);
    put_on(&s, "t", "d2").await;
    let cancelled = s.mailbox.cancel("d2").await.unwrap().unwrap();
    env.advance(1);
    assert_eq!(s.mailbox.cancel("d2").await.unwrap(), None);
    assert_eq!(
        load(&s, "d2").await,
        cancelled,
        "cancel twice changes nothing"
    );
}

/// Claim_dispatch by id returns it claimed with a token.
pub async fn claim_dispatch_claims_by_id<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, nd("t1", "d1").with_priority(0)).await;
    put(&s, nd("t2", "d2").with_priority(255)).await;
    let d = s
        .mailbox
        .claim_dispatch("d2", "by-id", 500)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.id, "d2");
    assert_eq!(d.status, Status::Claimed);
    assert_eq!(d.claim.as_ref().unwrap().claimed_by, "by-id");
    assert_eq!(d.claim.as_ref().unwrap().lease_until, T0 + 500);
    assert_eq!(load(&s, "d1").await.status, Status::Queued);
    assert_eq!(
        s.mailbox.claim_dispatch("d2", "again", 500).await.unwrap(),
        None,
        "not queued any more"
    );
}

/// Claim_dispatch ignores a far-future `available_at`; claim still respects it.
pub async fn claim_dispatch_ignores_available_at_but_claim_respects_it<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, nd("t", "later").with_delay_ms(86_400_000)).await;
    assert_eq!(claim(&s).await, None);
    let d = claim_id(&s, "later").await;
    assert_eq!(d.status, Status::Claimed);
}

/// Claim_dispatch of a cancelled or missing dispatch is `None`.
pub async fn claim_dispatch_of_cancelled_or_missing_dispatch_is_none<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    let cancelled = s.mailbox.cancel("d1").await.unwrap().unwrap();
    assert_eq!(
        s.mailbox.claim_dispatch("d1", WORKER, LEASE).await.unwrap(),
        None
    );
    assert_eq!(load(&s, "d1").await, cancelled);
    assert_eq!(
        s.mailbox
            .claim_dispatch("ghost", WORKER, LEASE)
            .await
            .unwrap(),
        None
    );
}

/// Extend_lease with the right token sets `lease_until = now + extension` (not additive). The
/// lease must still run: an expired one is not extended (section 15.2 of the contract; the
/// conformance tests of limits pin that).
pub async fn extend_lease_sets_lease_to_now_plus_extension<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    let c = s
        .mailbox
        .claim(AGENT, WORKER, 10_000)
        .await
        .unwrap()
        .unwrap();
    env.advance(5_000);
    assert!(
        s.mailbox
            .extend_lease("d1", &tok(&c), 60_000)
            .await
            .unwrap()
    );
    let d = load(&s, "d1").await;
    assert_eq!(d.claim.as_ref().unwrap().lease_until, T0 + 65_000);
    assert_eq!(d.claim.as_ref().unwrap().token, tok(&c), "same claim");
    assert_eq!(d.status, Status::Claimed);
    assert!(s.mailbox.extend_lease("d1", &tok(&c), 1_000).await.unwrap());
    assert_eq!(
        load(&s, "d1").await.claim.unwrap().lease_until,
        T0 + 6_000,
        "may shorten too"
    );
}

/// Extend_lease with a wrong token is `false` and leaves the lease alone.
pub async fn extend_lease_with_wrong_token_is_false_and_changes_nothing<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    let c = claim_some(&s).await;
    env.advance(100);
    assert!(
        !s.mailbox
            .extend_lease("d1", "not-the-token", 60_000)
            .await
            .unwrap()
    );
    assert_eq!(load(&s, "d1").await, c);
}

/// Extend_lease of a missing, queued or settled dispatch is `false`.
pub async fn extend_lease_of_missing_or_unclaimed_dispatch_is_false<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    assert!(!s.mailbox.extend_lease("ghost", "t", 10).await.unwrap());
    put_on(&s, "t", "d1").await;
    let c = claim_some(&s).await;
    let acked = s.mailbox.ack("d1", &tok(&c)).await.unwrap();
    assert!(!s.mailbox.extend_lease("d1", &tok(&c), 10).await.unwrap());
    assert_eq!(load(&s, "d1").await, acked);
}

/// Has_live_work is true exactly while something is queued or claimed.
pub async fn has_live_work_tracks_queued_and_claimed<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    assert!(!s.mailbox.has_live_work().await.unwrap());
    put(&s, nd("t", "d1").with_delay_ms(1_000)).await;
    assert!(
        s.mailbox.has_live_work().await.unwrap(),
        "a delayed queued dispatch is live work"
    );
    let c = claim_id(&s, "d1").await;
    assert!(s.mailbox.has_live_work().await.unwrap());
    s.mailbox.ack("d1", &tok(&c)).await.unwrap();
    assert!(!s.mailbox.has_live_work().await.unwrap());
    put_on(&s, "t", "d2").await;
    s.mailbox.cancel("d2").await.unwrap();
    assert!(!s.mailbox.has_live_work().await.unwrap());
}

/// Queued_threads lists exactly the threads holding queued work, sorted.
pub async fn queued_threads_lists_exactly_threads_with_queued_work<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    assert!(s.mailbox.queued_threads().await.unwrap().is_empty());
    put_on(&s, "zeta", "z1").await;
    put_on(&s, "alpha", "a1").await;
    put(&s, nd("mid", "m1").with_delay_ms(10_000)).await;
    put_on(&s, "busy", "b1").await;
    put_on(&s, "gone", "g1").await;
    claim_id(&s, "b1").await;
    s.mailbox.cancel("g1").await.unwrap();
    assert_eq!(
        s.mailbox.queued_threads().await.unwrap(),
        vec!["alpha", "mid", "zeta"]
    );
}

fn counts_map(rows: Vec<StatusCount>) -> BTreeMap<(String, Status), u64> {
    let mut map = BTreeMap::new();
    for row in rows {
        assert!(row.count > 0, "zero rows are omitted: {row:?}");
        assert!(
            map.insert((row.agent.clone(), row.status), row.count)
                .is_none(),
            "one row per pair"
        );
    }
    map
}

/// Counts by agent and status follow claim, ack and cancel; zero rows are omitted.
pub async fn counts_track_statuses_per_agent_without_zero_rows<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    assert!(s.mailbox.counts().await.unwrap().is_empty());
    assert!(s.mailbox.live_counts().await.unwrap().is_empty());
    for i in 0..4 {
        put_on(&s, &format!("t{i}"), &format!("d{i}")).await;
    }
    put(&s, NewDispatch::new("b", "tb", b"x".to_vec()).with_id("b1")).await;
    let c = claim_id(&s, "d0").await;
    s.mailbox.ack("d0", &tok(&c)).await.unwrap();
    claim_id(&s, "d1").await;
    s.mailbox.cancel("d2").await.unwrap();
    let got = counts_map(s.mailbox.counts().await.unwrap());
    let want: BTreeMap<(String, Status), u64> = [
        ((AGENT.to_owned(), Status::Acked), 1),
        ((AGENT.to_owned(), Status::Claimed), 1),
        ((AGENT.to_owned(), Status::Cancelled), 1),
        ((AGENT.to_owned(), Status::Queued), 1),
        (("b".to_owned(), Status::Queued), 1),
    ]
    .into_iter()
    .collect();
    assert_eq!(got, want);
    // The live statuses only.
    let live = counts_map(s.mailbox.live_counts().await.unwrap());
    let want_live: BTreeMap<(String, Status), u64> = want
        .into_iter()
        .filter(|((_, status), _)| !status.is_terminal())
        .collect();
    assert_eq!(live, want_live);
}

/// `list_rows` lists what `list` lists, in the same order, page by page, each row the record
/// without its payload and output (their sizes) and without its claim token: queued, claimed,
/// completed with an output, and failed records alike.
pub async fn list_rows_are_the_list_without_payloads<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    for i in 0..5 {
        put(
            &s,
            nd(&format!("t{i}"), &format!("d{i}"))
                .with_metadata("k", format!("v{i}"))
                .with_priority(100 + (i % 2) as u8),
        )
        .await;
        env.advance(1);
    }
    put(
        &s,
        NewDispatch::new(AGENT, "t9", vec![7u8; 3000]).with_id("bin"),
    )
    .await;
    let done = claim(&s).await.unwrap();
    s.mailbox
        .complete(
            &done.id,
            done.token().unwrap(),
            RunResult::success(vec![1u8; 1234]),
        )
        .await
        .unwrap();
    let failed = claim(&s).await.unwrap();
    s.mailbox
        .complete(
            &failed.id,
            failed.token().unwrap(),
            RunResult::failure("no"),
        )
        .await
        .unwrap();
    let held = claim(&s).await.unwrap();
    assert!(held.claim.is_some());
    for filter in [
        ListFilter::default(),
        ListFilter {
            statuses: vec![Status::Acked],
            ..ListFilter::default()
        },
        ListFilter {
            thread: Some("t9".into()),
            ..ListFilter::default()
        },
        ListFilter {
            agent: Some(AGENT.into()),
            limit: 2,
            after: Some(ListCursor {
                priority: 100,
                created_at: 0,
                id: String::new(),
            }),
            ..ListFilter::default()
        },
    ] {
        let whole = s.mailbox.list(&filter).await.unwrap();
        let rows = s.mailbox.list_rows(&filter).await.unwrap();
        let want: Vec<DispatchRow> = whole.iter().map(DispatchRow::of).collect();
        assert_eq!(rows, want, "{filter:?}");
    }
    let rows = s.mailbox.list_rows(&ListFilter::default()).await.unwrap();
    let bin = rows.iter().find(|r| r.id == "bin").unwrap();
    assert_eq!(bin.payload_size, 3000);
    let done = rows.iter().find(|r| r.id == done.id).unwrap();
    assert_eq!(done.result.as_ref().map(|r| r.output_size), Some(1234));
    let row = rows.iter().find(|r| r.id == held.id).unwrap();
    assert_eq!(row.claimed_by.as_deref(), Some(WORKER));
    assert_eq!(row.cursor(), ListCursor::of(&held));
}

/// List filters by thread, agent and statuses and pages with limit and a cursor: a page
/// starts after the previous page's last row, so a row removed between pages shifts nothing.
pub async fn list_filters_by_thread_agent_status_and_pages<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    for i in 0..6 {
        put_on(&s, "t1", &format!("a{i}")).await;
        env.advance(1);
    }
    put(
        &s,
        NewDispatch::new("other", "t1", b"x".to_vec()).with_id("o1"),
    )
    .await;
    put_on(&s, "t2", "b1").await;
    s.mailbox.cancel("a5").await.unwrap();
    let ids = |v: Vec<Dispatch>| v.into_iter().map(|d| d.id).collect::<Vec<_>>();
    let list = |filter: ListFilter| {
        let s = s.clone();
        async move { s.mailbox.list(&filter).await.unwrap() }
    };
    let t1 = ListFilter {
        thread: Some("t1".into()),
        ..ListFilter::default()
    };
    assert_eq!(
        ids(list(t1.clone()).await),
        vec!["a0", "a1", "a2", "a3", "a4", "a5", "o1"]
    );
    let by_agent = ListFilter {
        agent: Some("other".into()),
        ..ListFilter::default()
    };
    assert_eq!(ids(list(by_agent).await), vec!["o1"]);
    let queued_t1_agent = ListFilter {
        thread: Some("t1".into()),
        agent: Some(AGENT.into()),
        statuses: vec![Status::Queued],
        ..ListFilter::default()
    };
    assert_eq!(
        ids(list(queued_t1_agent.clone()).await),
        vec!["a0", "a1", "a2", "a3", "a4"]
    );
    let first = ListFilter {
        limit: 2,
        ..queued_t1_agent.clone()
    };
    let page = list(first).await;
    assert_eq!(ids(page.clone()), vec!["a0", "a1"]);
    let after = page.last().map(ListCursor::of);
    // A row of the first page leaving the filter does not move the second page.
    s.mailbox.cancel("a0").await.unwrap();
    let second = ListFilter {
        limit: 2,
        after: after.clone(),
        ..queued_t1_agent.clone()
    };
    assert_eq!(ids(list(second).await), vec!["a2", "a3"]);
    let cursor: ListCursor = after.as_ref().unwrap().to_string().parse().unwrap();
    assert_eq!(Some(cursor), after);
    let past_end = ListFilter {
        limit: 2,
        after: Some(ListCursor {
            priority: u8::MAX,
            created_at: u64::MAX,
            id: "~".into(),
        }),
        ..queued_t1_agent
    };
    assert!(list(past_end).await.is_empty());
    // Across all threads, pages in list order too.
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = list(ListFilter {
            limit: 3,
            after: after.clone(),
            ..ListFilter::default()
        })
        .await;
        after = page.last().map(ListCursor::of);
        let n = page.len();
        seen.extend(ids(page));
        if n < 3 {
            break;
        }
    }
    let everything = ids(list(ListFilter {
        limit: 1000,
        ..ListFilter::default()
    })
    .await);
    assert_eq!(seen, everything);
    assert_eq!(everything.len(), 8);
    let two_statuses = ListFilter {
        statuses: vec![Status::Cancelled, Status::Queued],
        thread: Some("t2".into()),
        ..ListFilter::default()
    };
    assert_eq!(ids(list(two_statuses).await), vec!["b1"]);
    // limit 0 means the default page of 100.
    for i in 0..105 {
        put_on(&s, "many", &format!("m{i:03}")).await;
    }
    let many = ListFilter {
        thread: Some("many".into()),
        ..ListFilter::default()
    };
    assert_eq!(list(many).await.len(), 100);
}

/// List orders by priority, then `created_at`, then id.
pub async fn list_orders_by_priority_then_created_at_then_id<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(&s, nd("t", "late-urgent").with_priority(1)).await;
    put(&s, nd("t", "c").with_priority(50)).await;
    put(&s, nd("t", "b").with_priority(50)).await;
    env.advance(10);
    put(&s, nd("t", "a-later").with_priority(50)).await;
    put(&s, nd("t", "urgent").with_priority(0)).await;
    let ids: Vec<String> = all(&s).await.into_iter().map(|d| d.id).collect();
    assert_eq!(ids, vec!["urgent", "late-urgent", "b", "c", "a-later"]);
}

/// List_terminal returns terminal records of every thread, oldest completion first, paged.
pub async fn list_terminal_returns_oldest_completion_first_and_pages<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t1", "c1").await;
    put_on(&s, "t2", "s1").await;
    put_on(&s, "t3", "a1").await;
    put_on(&s, "t4", "live").await;
    env.advance(10);
    s.mailbox.cancel("c1").await.unwrap();
    env.advance(10);
    s.mailbox.interrupt("t2", "stop").await.unwrap();
    env.advance(10);
    let c = claim_id(&s, "a1").await;
    s.mailbox.ack("a1", &tok(&c)).await.unwrap();
    let ids = |v: Vec<Dispatch>| v.into_iter().map(|d| d.id).collect::<Vec<_>>();
    assert_eq!(
        ids(s.mailbox.list_terminal(10, 0).await.unwrap()),
        vec!["c1", "s1", "a1"]
    );
    assert_eq!(
        ids(s.mailbox.list_terminal(2, 0).await.unwrap()),
        vec!["c1", "s1"]
    );
    assert_eq!(
        ids(s.mailbox.list_terminal(2, 2).await.unwrap()),
        vec!["a1"]
    );
    assert!(s.mailbox.list_terminal(2, 3).await.unwrap().is_empty());
    for d in s.mailbox.list_terminal(10, 0).await.unwrap() {
        assert!(d.status.is_terminal());
    }
}

/// The work signal fires on enqueue, on settle and on reclaim (a hint, but a
/// prompt one).
pub async fn work_signal_fires_on_enqueue_settle_and_reclaim<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let signal = s.mailbox.work_signal();
    async fn fired(signal: &tokio::sync::Notify, what: &str, op: impl Future<Output = ()>) {
        let notified = signal.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        op.await;
        assert!(
            tokio::time::timeout(Duration::from_secs(10), notified)
                .await
                .is_ok(),
            "work signal did not fire on {what}"
        );
    }
    fired(&signal, "enqueue", async {
        put_on(&s, "t", "d1").await;
    })
    .await;
    let c = claim_some(&s).await;
    put_on(&s, "t", "d2").await;
    fired(&signal, "ack", async {
        s.mailbox.ack("d1", &tok(&c)).await.unwrap();
    })
    .await;
    let c = claim_some(&s).await;
    assert_eq!(c.id, "d2");
    env.advance(LEASE + 1);
    fired(&signal, "reclaim", async {
        assert_eq!(
            s.mailbox
                .reclaim_expired(env.now(), 10)
                .await
                .unwrap()
                .len(),
            1
        );
    })
    .await;
}

fn expect_invalid(result: StoreResult<Dispatch>, what: &str) {
    match result {
        Err(StoreError::Invalid(_)) => {}
        other => panic!("{what}: expected Invalid, got {other:?}"),
    }
}

/// `attempt >= max_attempts` is refused at admission (`Invalid`) and stores nothing.
pub async fn enqueue_with_attempt_at_or_above_max_attempts_is_invalid<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    for (attempt, max) in [(3, 3), (4, 3), (1, 1), (u32::MAX, 5)] {
        let new = NewDispatch {
            attempt,
            ..nd("t", "bad").with_max_attempts(max)
        };
        expect_invalid(
            s.mailbox.enqueue(new).await,
            &format!("attempt {attempt} max {max}"),
        );
    }
    assert_eq!(s.mailbox.load("bad").await.unwrap(), None);
    assert!(all(&s).await.is_empty());
}

/// `max_attempts == 0` is `Invalid`.
pub async fn enqueue_with_zero_max_attempts_is_invalid<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    expect_invalid(
        s.mailbox
            .enqueue(nd("t", "zero").with_max_attempts(0))
            .await,
        "max 0",
    );
    assert!(all(&s).await.is_empty());
}

/// Blank, oversized or non-printable names, an empty dedupe key and metadata over its cap
/// are `Invalid`; nothing is stored.
pub async fn enqueue_with_blank_or_oversized_fields_is_invalid<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let long = "x".repeat(homing::store::model::MAX_NAME_LEN + 1);
    let cases = vec![
        ("blank agent", NewDispatch::new(" ", "t", vec![])),
        ("blank thread", NewDispatch::new(AGENT, "", vec![])),
        (
            "blank id",
            NewDispatch::new(AGENT, "t", vec![]).with_id("  "),
        ),
        (
            "long id",
            NewDispatch::new(AGENT, "t", vec![]).with_id(long.clone()),
        ),
        ("long agent", NewDispatch::new(long.clone(), "t", vec![])),
        ("long thread", NewDispatch::new(AGENT, long.clone(), vec![])),
        (
            "empty dedupe key",
            NewDispatch::new(AGENT, "t", vec![]).with_dedupe_key(""),
        ),
        (
            "blank run id",
            NewDispatch::new(AGENT, "t", vec![]).with_run_id(" "),
        ),
        ("newline in thread", NewDispatch::new(AGENT, "t\nx", vec![])),
        (
            "ESC in id",
            NewDispatch::new(AGENT, "t", vec![]).with_id("\u{1b}[2J"),
        ),
        (
            "bidi override in agent",
            NewDispatch::new("\u{202e}agent", "t", vec![]),
        ),
        (
            "control in metadata key",
            NewDispatch::new(AGENT, "t", vec![]).with_metadata("k\r", "v"),
        ),
        (
            "control in dedupe key",
            NewDispatch::new(AGENT, "t", vec![]).with_dedupe_key("k\u{7f}"),
        ),
        (
            "long dedupe key",
            NewDispatch::new(AGENT, "t", vec![]).with_dedupe_key(long.clone()),
        ),
        (
            "metadata over its cap",
            NewDispatch::new(AGENT, "t", vec![])
                .with_metadata("notes", "m".repeat(homing::store::model::MAX_METADATA)),
        ),
    ];
    for (what, new) in cases {
        expect_invalid(s.mailbox.enqueue(new).await, what);
    }
    assert!(all(&s).await.is_empty());
}

/// A re-submission that already used attempts dead-letters exactly at `max_attempts`; the
/// count never overflows it (nack or lease expiry) and nothing panics.
pub async fn resubmission_with_attempts_used_dead_letters_at_max_without_overflow<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let new = NewDispatch {
        attempt: 2,
        ..nd("t", "d1").with_max_attempts(3)
    };
    assert_eq!(put(&s, new).await.attempt, 2);
    let c = claim_some(&s).await;
    let d = s
        .mailbox
        .nack("d1", &tok(&c), env.now(), "last")
        .await
        .unwrap();
    assert_eq!((d.status, d.attempt), (Status::DeadLetter, 3));
    let new = NewDispatch {
        attempt: 2,
        ..nd("t2", "d2").with_max_attempts(3)
    };
    put(&s, new).await;
    claim_id(&s, "d2").await;
    env.advance(LEASE + 1);
    s.mailbox.reclaim_expired(env.now(), 10).await.unwrap();
    let d = load(&s, "d2").await;
    assert_eq!((d.status, d.attempt), (Status::DeadLetter, 3));
    assert_shape(&d);
}

/// The same id with different content is `Duplicate` (no holder) and the stored record is
/// untouched.
pub async fn enqueue_same_id_different_content_is_duplicate<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let original = put_on(&s, "t", "d1").await;
    let variants = vec![
        NewDispatch::new(AGENT, "t", b"other payload".to_vec()).with_id("d1"),
        nd("t", "d1").with_priority(1),
        nd("t-other", "d1"),
        NewDispatch::new("other-agent", "t", b"payload of d1".to_vec()).with_id("d1"),
        nd("t", "d1").with_metadata("k", "v"),
    ];
    for new in variants {
        match s.mailbox.enqueue(new.clone()).await {
            Err(StoreError::Duplicate { id, holder }) => {
                assert_eq!(id, "d1");
                assert_eq!(holder, None, "an id clash names no dedupe holder");
            }
            other => panic!("expected Duplicate for {new:?}, got {other:?}"),
        }
    }
    assert_eq!(load(&s, "d1").await, original);
    assert_eq!(all(&s).await.len(), 1);
}

/// A settled dispatch's id, minted by the store, offered again as a chosen id: a duplicate
/// with other content (on its thread or another), the stored record with the same content;
/// the settled record and its result are never overwritten.
pub async fn chosen_id_equal_to_a_settled_minted_id_is_a_duplicate<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let new = NewDispatch::new(AGENT, "t", b"first".to_vec());
    let minted = put(&s, new.clone()).await;
    let c = claim_some(&s).await;
    let done = s
        .mailbox
        .complete(&c.id, &tok(&c), RunResult::success("result"))
        .await
        .unwrap();
    for thread in ["t", "t-other"] {
        let again = NewDispatch::new(AGENT, thread, b"second".to_vec()).with_id(&minted.id);
        match s.mailbox.enqueue(again).await {
            Err(StoreError::Duplicate { id, .. }) => assert_eq!(id, minted.id),
            other => panic!("expected Duplicate on {thread}, got {other:?}"),
        }
    }
    let same = new.with_id(&minted.id);
    assert_eq!(s.mailbox.enqueue(same).await.unwrap(), done);
    assert_eq!(load(&s, &minted.id).await, done);
    assert_eq!(all(&s).await.len(), 1);
}

/// Re-submitting the same content under the same id (a retry after a lost reply) returns the
/// stored record and stores nothing new.
pub async fn enqueue_same_id_same_content_returns_existing_record<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let new = nd("t", "d1").with_priority(9).with_metadata("a", "1");
    let original = put(&s, new.clone()).await;
    let again = s.mailbox.enqueue(new.clone()).await.unwrap();
    assert_eq!(again, original);
    let other = env.open().await;
    assert_eq!(
        other.mailbox.enqueue(new).await.unwrap(),
        original,
        "also from another host"
    );
    assert_eq!(all(&s).await.len(), 1);
}

/// Re-enqueuing the id of a claimed dispatch never resets it to queued (no double
/// execution): the record and its claim are unchanged, whatever the call returns.
pub async fn reenqueue_of_claimed_dispatch_never_resets_it<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let new = nd("t", "d1");
    put(&s, new.clone()).await;
    let claimed = claim_some(&s).await;
    match s.mailbox.enqueue(new.clone()).await {
        Ok(d) => assert_eq!(
            d, claimed,
            "an idempotent retry returns the stored (claimed) record"
        ),
        Err(StoreError::Duplicate { .. }) => {}
        Err(other) => panic!("unexpected error {other}"),
    }
    env.advance(1_000);
    let _ = s.mailbox.enqueue(new.clone()).await;
    let _ = s.mailbox.enqueue(new.with_priority(1)).await;
    assert_eq!(load(&s, "d1").await, claimed);
    assert_eq!(claim(&s).await, None);
    s.mailbox.ack("d1", &tok(&claimed)).await.unwrap();
}

/// Re-enqueuing the id of a settled dispatch returns the stored record and never requeues it.
pub async fn reenqueue_of_terminal_dispatch_never_requeues_it<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let new = nd("t", "d1");
    put(&s, new.clone()).await;
    let c = claim_some(&s).await;
    let acked = s.mailbox.ack("d1", &tok(&c)).await.unwrap();
    let again = s.mailbox.enqueue(new.clone()).await.unwrap();
    assert_eq!(again, acked, "same content: the existing (acked) record");
    assert_eq!(load(&s, "d1").await, acked);
    assert_eq!(claim(&s).await, None, "nothing was requeued");
    assert!(matches!(
        s.mailbox.enqueue(new.with_priority(3)).await,
        Err(StoreError::Duplicate { .. })
    ));
}

/// Without an id each enqueue is a new dispatch.
pub async fn enqueue_without_id_creates_distinct_dispatches<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let new = NewDispatch::new(AGENT, "t", b"same".to_vec());
    let a = put(&s, new.clone()).await;
    let b = put(&s, new).await;
    assert_ne!(a.id, b.id);
    assert_eq!(all(&s).await.len(), 2);
}

/// The thread is the serialization key whatever the agent: a claim of one agent blocks
/// another agent's dispatch on the same thread.
pub async fn busy_thread_blocks_claims_of_other_agents_on_it<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "shared", "a1").await;
    put(
        &s,
        NewDispatch::new("b", "shared", b"x".to_vec()).with_id("b1"),
    )
    .await;
    let a = claim_some(&s).await;
    assert_eq!(s.mailbox.claim("b", WORKER, LEASE).await.unwrap(), None);
    assert_eq!(
        s.mailbox.claim_dispatch("b1", WORKER, LEASE).await.unwrap(),
        None
    );
    s.mailbox.ack("a1", &tok(&a)).await.unwrap();
    let b = s.mailbox.claim("b", WORKER, LEASE).await.unwrap().unwrap();
    assert_eq!(b.id, "b1");
}

/// No operation panics on any input: extreme times, leases, pages and odd names either
/// work or are refused with an error, and the stored records keep their shape.
pub async fn no_operation_panics_on_extreme_inputs<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let m = &s.mailbox;
    let odd = "it's \"odd\"; DROP TABLE dispatches; -- %_ \u{1F600} \\ \u{e9}";
    let d = put(
        &s,
        NewDispatch::new(odd, odd, vec![0u8; 3])
            .with_id(odd)
            .with_dedupe_key(odd)
            .with_metadata(odd, odd),
    )
    .await;
    assert_eq!(load(&s, odd).await, d);
    let far = m.enqueue(nd("t-far", "far").with_delay_ms(u64::MAX)).await;
    if let Ok(far) = &far {
        assert!(far.available_at >= T0, "the delay must not wrap around");
        assert_eq!(claim(&s).await.map(|c| c.id).as_deref(), None, "never due");
    }
    let c = m.claim(odd, WORKER, u64::MAX).await.unwrap().unwrap();
    assert!(
        c.claim.as_ref().unwrap().lease_until >= T0,
        "the lease must not wrap around"
    );
    let _ = m.extend_lease(odd, &tok(&c), u64::MAX).await.unwrap();
    let n = m.nack(odd, &tok(&c), u64::MAX, odd).await.unwrap();
    assert_eq!(n.status, Status::Queued);
    assert_shape(&n);
    let _ = m.reclaim_expired(u64::MAX, usize::MAX).await.unwrap();
    let _ = m.reclaim_expired(0, 0).await.unwrap();
    let _ = m.list_terminal(usize::MAX, usize::MAX).await;
    let _ = m
        .list(&ListFilter {
            limit: usize::MAX,
            after: Some(ListCursor {
                priority: 0,
                created_at: u64::MAX,
                id: odd.into(),
            }),
            ..ListFilter::default()
        })
        .await;
    let _ = m.purge_terminal(u64::MAX).await.unwrap();
    let _ = m.interrupt(odd, odd).await.unwrap();
    assert!(m.load("").await.unwrap().is_none());
    assert!(!m.extend_lease("", "", 0).await.unwrap());
    let log = &s.log;
    assert_eq!(log.append(odd, odd.as_bytes(), None).await.unwrap(), 1);
    assert!(
        log.read(odd, u64::MAX, usize::MAX)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(log.read(odd, 0, usize::MAX).await.unwrap().len(), 1);
    assert!(matches!(
        log.append_expected(odd, b"x", u64::MAX, None).await,
        Err(StoreError::Conflict { latest: 1 })
    ));
    log.trim(odd, u64::MAX).await.unwrap();
    log.delete(odd).await.unwrap();
    assert_eq!(log.append(odd, b"again", None).await.unwrap(), 2);
    for d in all(&s).await {
        assert_shape(&d);
    }
}

/// A payload or an output over the backend's own limit is refused with `Invalid`
/// naming the field, the size and the limit (never `Unavailable`: retrying cannot help), and
/// changes nothing.
pub async fn values_over_the_backends_limit_are_invalid_naming_it<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let limit = s.mailbox.max_value();
    assert!(
        limit >= 64 * 1024,
        "a backend holds at least 64 KiB: {limit}"
    );
    let over = usize::try_from(limit + 1).unwrap();
    let refused = s
        .mailbox
        .enqueue(NewDispatch::new(AGENT, "t", vec![0u8; over]).with_id("big"))
        .await;
    expect_too_large(refused, "payload", over, limit);
    assert!(all(&s).await.is_empty(), "a refused enqueue stores nothing");

    put_on(&s, "t", "d1").await;
    let c = claim_some(&s).await;
    let token = tok(&c);
    let recorded = s
        .mailbox
        .record_result("d1", &token, RunResult::success(vec![0u8; over]))
        .await;
    expect_too_large(recorded, "output", over, limit);
    let completed = s
        .mailbox
        .complete("d1", &token, RunResult::success(vec![0u8; over]))
        .await;
    expect_too_large(completed, "output", over, limit);
    let d = load(&s, "d1").await;
    assert_eq!(d.status, Status::Claimed, "still held: {d:?}");
    assert!(d.result.is_none(), "nothing recorded: {d:?}");
    // The holder can still settle it within the limit.
    let done = s
        .mailbox
        .complete("d1", &token, RunResult::success(b"fits".to_vec()))
        .await
        .unwrap();
    assert_eq!(done.status, Status::Acked);
}

/// Binary (not UTF-8) payloads and outputs at the backend's limit (or 1 MiB, whichever is
/// less) are stored and read back byte for byte, also by another instance.
pub async fn binary_values_at_the_backends_limit_round_trip<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let n = usize::try_from(s.mailbox.max_value().min(1 << 20)).unwrap();
    let (payload, output) = (binary(n, 3), binary(n, 5));
    assert!(std::str::from_utf8(&payload).is_err() && std::str::from_utf8(&output).is_err());
    let d = put(
        &s,
        NewDispatch::new(AGENT, "t", payload.clone())
            .with_id("edge")
            .with_metadata("k", "v"),
    )
    .await;
    assert!(d.payload == payload, "enqueue returns the payload as given");
    let c = claim_some(&s).await;
    assert!(c.payload == payload, "the claim carries the payload");
    let recorded = s
        .mailbox
        .record_result("edge", &tok(&c), RunResult::success(output.clone()))
        .await
        .unwrap();
    assert!(recorded.result.as_ref().unwrap().output == output);
    let done = s
        .mailbox
        .complete("edge", &tok(&c), RunResult::success(output.clone()))
        .await
        .unwrap();
    assert_eq!(done.status, Status::Acked);
    for store in [&s, &env.open().await] {
        let d = load(store, "edge").await;
        assert_eq!(d.status, Status::Acked);
        assert!(
            d.payload == payload,
            "payload of {n} bytes differs after storage"
        );
        assert!(
            d.result.as_ref().unwrap().output == output,
            "output of {n} bytes differs after storage"
        );
        assert_eq!(d.metadata.get("k").map(String::as_str), Some("v"));
    }
}

/// An error text longer than `MAX_ERROR_TEXT` is kept cut to it, with a note of how long it
/// was: a settlement never makes a record outgrow its backend.
pub async fn long_error_texts_are_kept_cut_to_the_error_text_limit<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let limit = homing::store::MAX_ERROR_TEXT;
    let long = format!("why: {}", "é".repeat(limit));
    put(&s, nd("t", "d1").with_max_attempts(3)).await;
    let c = claim_some(&s).await;
    let d = s
        .mailbox
        .nack("d1", &tok(&c), env.now(), &long)
        .await
        .unwrap();
    let kept = d.last_error.clone().unwrap();
    assert!(kept.len() <= limit, "{} bytes kept", kept.len());
    assert!(kept.starts_with("why: éé"), "{kept}");
    assert!(
        kept.ends_with(&format!("[... {} bytes cut]", long.len())),
        "{kept}"
    );
    assert_eq!(
        load(&s, "d1").await.last_error.as_deref(),
        Some(kept.as_str())
    );
    let c = claim_some(&s).await;
    let d = s.mailbox.dead_letter("d1", &tok(&c), &long).await.unwrap();
    assert_eq!(d.last_error.as_deref(), Some(kept.as_str()));
    let short = "a short reason";
    put(&s, nd("t", "d2")).await;
    let c = claim_some(&s).await;
    let d = s.mailbox.dead_letter("d2", &tok(&c), short).await.unwrap();
    assert_eq!(
        d.last_error.as_deref(),
        Some(short),
        "short texts are kept whole"
    );
}
