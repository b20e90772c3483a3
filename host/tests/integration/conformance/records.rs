//! The dispatch record: statuses, shape rules, what survives storage (the contract,
//! docs/contract.md, section 1).

use std::str::FromStr;

use homing::store::{
    DEFAULT_MAX_ATTEMPTS, DEFAULT_PRIORITY, Dispatch, Interrupt, NewDispatch, RunResult, RunStatus,
    Status,
};

use super::*;

/// Exactly acked, cancelled, superseded and dead_letter are terminal.
pub async fn status_terminality_matches_spec<F: Factory>(_factory: &F) {
    for status in Status::ALL {
        let terminal = matches!(
            status,
            Status::Acked | Status::Cancelled | Status::Superseded | Status::DeadLetter
        );
        assert_eq!(status.is_terminal(), terminal, "{status}");
    }
    assert!(!Status::Queued.is_terminal());
    assert!(!Status::Claimed.is_terminal());
    assert!(!Status::Waiting.is_terminal());
}

/// Every status value survives its text and JSON forms.
pub async fn status_names_round_trip_through_text_and_json<F: Factory>(_factory: &F) {
    let names = [
        "queued",
        "claimed",
        "waiting",
        "acked",
        "cancelled",
        "superseded",
        "dead_letter",
    ];
    for (status, name) in Status::ALL.into_iter().zip(names) {
        assert_eq!(status.as_str(), name);
        assert_eq!(Status::from_str(name).unwrap(), status);
        let json = serde_json::to_string(&status).unwrap();
        assert_eq!(json, format!("\"{name}\""));
        assert_eq!(serde_json::from_str::<Status>(&json).unwrap(), status);
    }
    assert!(Status::from_str("bogus").is_err());
}

/// A claimed dispatch with a recorded result survives JSON with every field.
pub async fn dispatch_json_round_trip_preserves_every_field<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put(
        &s,
        nd("t", "d1")
            .with_priority(7)
            .with_dedupe_key("k")
            .with_run_id("run-1")
            .with_metadata("a", "b")
            .with_max_attempts(3),
    )
    .await;
    let claimed = claim_some(&s).await;
    s.mailbox
        .record_start(&claimed.id, &tok(&claimed))
        .await
        .unwrap();
    let recorded = s
        .mailbox
        .record_result(
            &claimed.id,
            &tok(&claimed),
            RunResult::success(vec![0xff, 0x00, 0x41]),
        )
        .await
        .unwrap();
    assert_eq!(
        recorded.status,
        Status::Claimed,
        "record_result keeps the dispatch claimed"
    );
    let json = serde_json::to_string(&recorded).unwrap();
    let back: Dispatch = serde_json::from_str(&json).unwrap();
    assert_eq!(back, recorded);
    let acked = s.mailbox.ack(&claimed.id, &tok(&claimed)).await.unwrap();
    let back: Dispatch = serde_json::from_str(&serde_json::to_string(&acked).unwrap()).unwrap();
    assert_eq!(back, acked);
}

/// Run results and interrupt reports survive JSON.
pub async fn run_result_and_interrupt_json_round_trip<F: Factory>(factory: &F) {
    for result in [
        RunResult::success(b"out".to_vec()),
        RunResult::failure("boom"),
        RunResult::success(vec![0xde, 0xad]),
    ] {
        let back: RunResult =
            serde_json::from_str(&serde_json::to_string(&result).unwrap()).unwrap();
        assert_eq!(back, result);
    }
    assert_eq!(
        RunStatus::parse(RunStatus::Failed.as_str()),
        Some(RunStatus::Failed)
    );
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "q1").await;
    put_on(&s, "t", "q2").await;
    let active = claim_some(&s).await;
    let report = s.mailbox.interrupt("t", "stop").await.unwrap();
    assert_eq!(
        report.active.as_ref().map(|d| d.id.as_str()),
        Some(active.id.as_str())
    );
    let back: Interrupt = serde_json::from_str(&serde_json::to_string(&report).unwrap()).unwrap();
    assert_eq!(back, report);
}

/// Through the store: what a producer submits is what is stored, and `load` equals what `enqueue`
/// returned.
pub async fn stored_dispatch_preserves_submitted_fields<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let payload: Vec<u8> = (0..=255u8).collect();
    let new = NewDispatch::new("agent-x", "thread-x", payload.clone())
        .with_id("d-fields")
        .with_run_id("run-x")
        .with_priority(3)
        .with_delay_ms(250)
        .with_dedupe_key("key-x")
        .with_max_attempts(4)
        .with_metadata("origin", "test")
        .with_metadata("k2", "v2");
    let new = NewDispatch { attempt: 1, ..new };
    let d = put(&s, new).await;
    assert_eq!(d.id, "d-fields");
    assert_eq!(d.agent, "agent-x");
    assert_eq!(d.thread, "thread-x");
    assert_eq!(d.run_id, "run-x");
    assert_eq!(d.payload, payload);
    assert_eq!(d.metadata.get("origin").map(String::as_str), Some("test"));
    assert_eq!(d.metadata.len(), 2);
    assert_eq!(d.priority, 3);
    assert_eq!(d.available_at, T0 + 250);
    assert_eq!(d.dedupe_key.as_deref(), Some("key-x"));
    assert_eq!(d.max_attempts, 4);
    assert_eq!(d.attempt, 1);
    assert_eq!(d.epoch, 0);
    assert_eq!(d.status, Status::Queued);
    assert_eq!(d.claim, None);
    assert_eq!(d.started_at, None);
    assert_eq!(d.result, None);
    assert_eq!(d.last_error, None);
    assert_eq!(d.created_at, T0);
    assert_eq!(d.completed_at, None);
    assert_shape(&d);
    assert_eq!(load(&s, "d-fields").await, d);
    // Defaults.
    let plain = put_on(&s, "thread-y", "d-plain").await;
    assert_eq!(plain.priority, DEFAULT_PRIORITY);
    assert_eq!(plain.max_attempts, DEFAULT_MAX_ATTEMPTS);
    assert_eq!(plain.available_at, T0);
    assert_eq!(plain.attempt, 0);
}

/// The host mints a UUID v7 when the submitter gives no id; `run_id` defaults to `id`.
pub async fn enqueue_mints_uuid_v7_and_run_id_defaults_to_id<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let d = put(&s, NewDispatch::new(AGENT, "t", b"x".to_vec())).await;
    let uuid = uuid::Uuid::parse_str(&d.id).expect("minted id is a UUID");
    assert_eq!(
        uuid.get_version_num(),
        7,
        "minted id is a UUID v7: {}",
        d.id
    );
    assert_eq!(d.run_id, d.id);
    let named = put_on(&s, "t", "named").await;
    assert_eq!(named.run_id, "named");
    assert_eq!(load(&s, &d.id).await, d);
}

/// Builds one dispatch in each of the six statuses; returns their ids by status.
async fn one_of_each_status(s: &Store) -> Vec<(Status, String)> {
    put_on(s, "t-queued", "s-queued").await;
    put_on(s, "t-claimed", "s-claimed").await;
    claim_id(s, "s-claimed").await;
    put_on(s, "t-acked", "s-acked").await;
    let c = claim_id(s, "s-acked").await;
    s.mailbox
        .complete("s-acked", &tok(&c), RunResult::success(b"done".to_vec()))
        .await
        .unwrap();
    put_on(s, "t-cancelled", "s-cancelled").await;
    s.mailbox.cancel("s-cancelled").await.unwrap().unwrap();
    put_on(s, "t-superseded", "s-superseded").await;
    s.mailbox.interrupt("t-superseded", "why").await.unwrap();
    put_on(s, "t-dead", "s-dead").await;
    let c = claim_id(s, "s-dead").await;
    s.mailbox
        .dead_letter("s-dead", &tok(&c), "gave up")
        .await
        .unwrap();
    put_on(s, "t-waiting", "s-waiting").await;
    let c = claim_id(s, "s-waiting").await;
    let new = homing::store::NewWaitpoint {
        name: "approve".into(),
        timeout_ms: 60_000,
        metadata: Default::default(),
        token_digest: homing::store::waitpoints::token_digest("hwp_test"),
    };
    let fence = homing::store::Fence::of(&c).unwrap();
    s.waitpoints.create_waitpoint(&fence, new).await.unwrap();
    s.mailbox.suspend("s-waiting", &tok(&c), 100).await.unwrap();
    vec![
        (Status::Queued, "s-queued".into()),
        (Status::Claimed, "s-claimed".into()),
        (Status::Waiting, "s-waiting".into()),
        (Status::Acked, "s-acked".into()),
        (Status::Cancelled, "s-cancelled".into()),
        (Status::Superseded, "s-superseded".into()),
        (Status::DeadLetter, "s-dead".into()),
    ]
}

/// A record in every status reads back identically from another instance and after a
/// restart.
pub async fn every_status_survives_reload_and_restart<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let ids = one_of_each_status(&s).await;
    let mut before = Vec::new();
    for (status, id) in &ids {
        let d = load(&s, id).await;
        assert_eq!(d.status, *status, "{id}");
        assert_shape(&d);
        before.push(d);
    }
    let other = env.open().await;
    for d in &before {
        assert_eq!(&load(&other, &d.id).await, d);
    }
    drop(s);
    drop(other);
    let reopened = env.open().await;
    for d in &before {
        assert_eq!(&load(&reopened, &d.id).await, d, "after restart");
    }
}

/// Claim fields are present exactly while claimed; every terminal transition clears them
/// and stamps `completed_at`.
pub async fn claim_fields_present_exactly_when_claimed<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let ids = one_of_each_status(&s).await;
    for (status, id) in ids {
        let d = load(&s, &id).await;
        assert_shape(&d);
        assert_eq!(d.claim.is_some(), status == Status::Claimed, "{d:#?}");
        assert_eq!(d.completed_at.is_some(), status.is_terminal(), "{d:#?}");
        if let Some(claim) = &d.claim {
            assert!(!claim.token.is_empty());
            assert_eq!(claim.claimed_by, WORKER);
        }
    }
    // More terminal paths: nack at max, reclaim at max, supersede_claimed.
    put(&s, nd("t2", "n1").with_max_attempts(1)).await;
    let c = claim_id(&s, "n1").await;
    let d = s
        .mailbox
        .nack("n1", &tok(&c), env.now(), "fail")
        .await
        .unwrap();
    assert_eq!(d.status, Status::DeadLetter);
    assert_shape(&d);
    put(&s, nd("t3", "r1").with_max_attempts(1)).await;
    claim_id(&s, "r1").await;
    env.advance(LEASE + 1);
    s.mailbox.reclaim_expired(env.now(), 100).await.unwrap();
    let d = load(&s, "r1").await;
    assert_eq!(d.status, Status::DeadLetter);
    assert_shape(&d);
    put_on(&s, "t4", "x1").await;
    let c = claim_id(&s, "x1").await;
    let d = s
        .mailbox
        .supersede_claimed("x1", Some(&tok(&c)), "replaced")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.status, Status::Superseded);
    assert_shape(&d);
    for d in all(&s).await {
        assert_shape(&d);
    }
}

/// The store reads time from its clock, never from the caller or the wall clock:
/// `created_at`, `updated_at`, `available_at`, `lease_until`, `completed_at`.
pub async fn store_stamps_times_from_its_clock<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    env.set(5_000_000);
    let d = put(&s, nd("t", "d1").with_delay_ms(100)).await;
    assert_eq!(d.created_at, 5_000_000);
    assert_eq!(d.updated_at, 5_000_000);
    assert_eq!(d.available_at, 5_000_100);
    env.set(5_000_100);
    let c = s.mailbox.claim(AGENT, WORKER, 700).await.unwrap().unwrap();
    assert_eq!(c.claim.as_ref().unwrap().lease_until, 5_000_800);
    assert_eq!(c.updated_at, 5_000_100);
    env.set(5_000_200);
    let started = s.mailbox.record_start("d1", &tok(&c)).await.unwrap();
    assert_eq!(started.started_at, Some(5_000_200));
    env.set(5_000_300);
    let acked = s.mailbox.ack("d1", &tok(&c)).await.unwrap();
    assert_eq!(acked.completed_at, Some(5_000_300));
    assert_eq!(acked.updated_at, 5_000_300);
}

/// Every claim adds one to `claims` (a first run, a retry after a nack, a reclaim after a lost
/// lease, a claim by id); nothing else changes it, and it survives reopening the store. A
/// record that was never claimed carries neither counter in its serialized form.
pub async fn claims_count_every_claim_and_survive_reopening<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let queued = put(&s, nd("t", "d1")).await;
    assert_eq!((queued.claims, queued.resumes), (0, 0));
    let json = serde_json::to_string(&queued).unwrap();
    assert!(
        !json.contains("\"claims\"") && !json.contains("\"resumes\""),
        "zero counters are left out: {json}"
    );

    let first = claim_some(&s).await;
    assert_eq!(first.claims, 1, "the first claim is claim 1");
    s.mailbox
        .record_start(&first.id, &tok(&first))
        .await
        .unwrap();
    assert_eq!(
        load(&s, "d1").await.claims,
        1,
        "holder writes keep the count"
    );
    s.mailbox
        .nack("d1", &tok(&first), env.now(), "once more")
        .await
        .unwrap();
    let requeued = load(&s, "d1").await;
    assert_eq!((requeued.claims, requeued.attempt), (1, 1), "{requeued:?}");

    let second = claim_some(&s).await;
    assert_eq!((second.claims, second.attempt), (2, 1));
    // The lease runs out: the reclaim counts an attempt, not a claim; the next claim does.
    env.advance(LEASE + 1_000);
    retry(|| s.mailbox.reclaim_expired(env.now(), 100))
        .await
        .unwrap();
    let reclaimed = load(&s, "d1").await;
    assert_eq!(
        (reclaimed.status, reclaimed.claims, reclaimed.attempt),
        (Status::Queued, 2, 2),
        "{reclaimed:?}"
    );
    let third = claim_id(&s, "d1").await;
    assert_eq!(third.claims, 3, "a claim by id counts too");
    s.mailbox.ack("d1", &tok(&third)).await.unwrap();

    let again = env.open().await;
    let acked = load(&again, "d1").await;
    assert_eq!(
        (acked.status, acked.claims, acked.resumes, acked.attempt),
        (Status::Acked, 3, 0, 2),
        "{acked:?}"
    );
}

/// A settling holder write adds the usage it carries to the record's (no write of its own);
/// a repeat of the settlement after a lost reply adds nothing again; a refused write adds
/// nothing; the sum survives reopening. Issue 54: token counts per dispatch.
pub async fn settling_writes_add_their_usage_once_and_it_survives_reopening<F: Factory>(
    factory: &F,
) {
    use homing::store::HolderOp;
    use homing::store::model::Usage;
    let env = Env::new(factory).await;
    let s = env.open().await;
    let queued = put(&s, nd("t", "d1")).await;
    assert_eq!(queued.usage, None);
    let json = serde_json::to_string(&queued).unwrap();
    assert!(!json.contains("\"usage\""), "none is left out: {json}");
    let used = |input, output, cached| Usage {
        input_tokens: input,
        output_tokens: output,
        cached_tokens: cached,
        calls: 1,
    };

    let first = claim_some(&s).await;
    let nack = || HolderOp::Nack {
        retry_at: env.now(),
        error: "once more".into(),
    };
    let nacked = s
        .mailbox
        .hold("d1", &tok(&first), nack().metered(used(100, 20, 30)))
        .await
        .unwrap();
    assert_eq!(nacked.usage, Some(used(100, 20, 30)));
    // The same settlement again (its reply was lost): answered as stored, nothing added.
    let again = s
        .mailbox
        .hold("d1", &tok(&first), nack().metered(used(100, 20, 30)))
        .await
        .unwrap();
    assert_eq!(again.usage, Some(used(100, 20, 30)));
    // A write with a token that no longer holds it: refused, nothing added.
    assert!(
        s.mailbox
            .hold("d1", &tok(&first), HolderOp::Ack.metered(used(5, 5, 0)))
            .await
            .is_err()
    );

    let second = claim_some(&s).await;
    let done = s
        .mailbox
        .hold(
            "d1",
            &tok(&second),
            HolderOp::Complete(RunResult::success(b"ok".to_vec())).metered(used(7, 3, 0)),
        )
        .await
        .unwrap();
    let sum = Usage {
        input_tokens: 107,
        output_tokens: 23,
        cached_tokens: 30,
        calls: 2,
    };
    assert_eq!((done.status, done.usage), (Status::Acked, Some(sum)));
    drop(s);
    let reopened = env.open().await;
    assert_eq!(load(&reopened, "d1").await.usage, Some(sum));
    // Nothing metered: the operation as it is, no usage written.
    assert_eq!(HolderOp::Ack.metered(Usage::default()), HolderOp::Ack);
}
