//! The journal of a dispatch (the contract, docs/contract.md, section 11): call entries by
//! position and steps by key, every write fenced like a fenced append (and storing nothing
//! when refused), a journaled append written with its log entry in one step, entries kept
//! across the dispatch's attempts, instances and restarts, and removed with the dispatch.
//!
//! Time only moves through the [`ManualClock`]; nothing sleeps.

use homing::store::journal::identity;
use homing::store::{CallEntry, CallKind, Fence, JournalData, NewStep, StoreError};
use serde_json::json;

use super::*;

fn fence(d: &Dispatch) -> Fence {
    Fence::of(d).unwrap_or_else(|| panic!("dispatch {} is not claimed", d.id))
}

/// An entry of `kind` at `pos` for claim `d` (its answer and identity name the position).
fn entry(d: &Dispatch, pos: u32, kind: CallKind, body: Option<Vec<u8>>) -> CallEntry {
    CallEntry::new(
        &d.id,
        pos,
        kind,
        identity([format!("call {pos}").as_bytes()]),
        json!({ "status": 200, "pos": pos }),
        body,
        d.claims,
        d.attempt,
        1_000 + u64::from(pos),
    )
}

fn step(d: &Dispatch, key: &str, value: &[u8]) -> NewStep {
    NewStep {
        key: key.into(),
        value: value.to_vec(),
        claim: d.claims,
        attempt: d.attempt,
    }
}

async fn record(store: &Store, d: &Dispatch, e: CallEntry) {
    let f = fence(d);
    retry(|| store.journal.record(&f, e.clone()))
        .await
        .unwrap_or_else(|err| panic!("record {} of {}: {err}", e.pos, d.id));
}

async fn put_step(store: &Store, d: &Dispatch, key: &str, value: &[u8]) {
    let f = fence(d);
    retry(|| store.journal.put_step(&f, step(d, key, value)))
        .await
        .unwrap_or_else(|err| panic!("put_step {key} of {}: {err}", d.id));
}

async fn journal(store: &Store, id: &str) -> JournalData {
    store.journal.load_journal(id).await.expect("load_journal")
}

fn positions(j: &JournalData) -> Vec<u32> {
    j.calls.iter().map(|c| c.pos).collect()
}

fn keys(j: &JournalData) -> Vec<&str> {
    j.steps.iter().map(|s| s.key.as_str()).collect()
}

/// Enqueues `id` on `thread` and claims it.
async fn claimed(store: &Store, thread: &str, id: &str) -> Dispatch {
    put_on(store, thread, id).await;
    claim_id(store, id).await
}

/// Entries load in position order with every field as recorded (`recorded_at` the store's
/// clock), steps by key; a write at a position or under a key replaces what was there; other
/// instances and a restart read the same; a dispatch without a journal loads empty.
pub async fn journal_entries_load_in_position_order_with_every_field<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let d = claimed(&s, "t", "d1").await;
    assert_eq!(journal(&s, "d1").await, JournalData::default());

    let body = binary(3_000, 7);
    let mut expected = Vec::new();
    for (pos, kind, body) in [
        (2, CallKind::Enqueue, None),
        (0, CallKind::Http, Some(body.clone())),
        (1, CallKind::LogRead, None),
        (4, CallKind::Http, Some(Vec::new())),
    ] {
        env.advance(10);
        let e = entry(&d, pos, kind, body);
        record(&s, &d, e.clone()).await;
        let mut e = e;
        e.recorded_at = env.now();
        expected.push(e);
    }
    expected.sort_by_key(|e| e.pos);
    env.advance(10);
    put_step(&s, &d, "zeta", b"last").await;
    put_step(&s, &d, "alpha", &binary(100, 3)).await;
    let at = env.now();

    let j = journal(&s, "d1").await;
    assert_eq!(j.calls, expected, "every field, in position order");
    assert_eq!(positions(&j), [0, 1, 2, 4]);
    assert_eq!(keys(&j), ["alpha", "zeta"]);
    let alpha = &j.steps[0];
    assert_eq!(
        (
            alpha.dispatch.as_str(),
            alpha.value.clone(),
            alpha.claim,
            alpha.attempt,
            alpha.recorded_at,
            alpha.size
        ),
        ("d1", binary(100, 3), d.claims, d.attempt, at, 105)
    );
    assert_eq!(
        j.bytes(),
        expected.iter().map(|e| e.size).sum::<u64>() + 8 + 105
    );

    // Replacing at a position and under a key.
    env.advance(10);
    let replaced = CallEntry::new(
        "d1",
        1,
        CallKind::LogLatest,
        identity([&b"other"[..]]),
        json!({ "latest": 9 }),
        None,
        d.claims,
        d.attempt,
        3,
    );
    record(&s, &d, replaced.clone()).await;
    put_step(&s, &d, "zeta", b"again").await;
    let j = journal(&s, "d1").await;
    assert_eq!(positions(&j), [0, 1, 2, 4]);
    let got = &j.calls[1];
    assert_eq!(
        (got.kind, &got.identity, &got.answer, got.recorded_at),
        (
            CallKind::LogLatest,
            &replaced.identity,
            &replaced.answer,
            env.now()
        )
    );
    assert_eq!(j.steps[1].value, b"again");
    assert_eq!(j.steps[1].recorded_at, env.now());

    // Another instance, and a restart, read the same.
    let other = env.open().await;
    assert_eq!(journal(&other, "d1").await, j);
    drop((s, other));
    let reopened = env.open().await;
    assert_eq!(journal(&reopened, "d1").await, j);
    assert_eq!(journal(&reopened, "nope").await, JournalData::default());
}

/// Every journal write through `f` is refused and changes nothing: the journal of `id` and
/// the log of `thread` stay as they were.
async fn assert_every_write_refused(store: &Store, d: &Dispatch, f: &Fence, why: &str) {
    let before = journal(store, &d.id).await;
    let latest = store.log.latest(&d.thread).await.expect("latest");
    let out = retry(|| store.journal.record(f, entry(d, 7, CallKind::Http, None))).await;
    assert!(out.is_err(), "{why}: record stored: {out:?}");
    let out = retry(|| {
        store
            .journal
            .record_append(f, entry(d, 8, CallKind::LogAppend, None), b"data", None)
    })
    .await;
    assert!(out.is_err(), "{why}: record_append stored: {out:?}");
    let out = retry(|| {
        store.journal.record_append(
            f,
            entry(d, 9, CallKind::LogAppendExpected, None),
            b"x",
            Some(latest),
        )
    })
    .await;
    assert!(
        out.is_err(),
        "{why}: record_append (expected) stored: {out:?}"
    );
    let out = retry(|| store.journal.drop_calls(f, 0)).await;
    assert!(out.is_err(), "{why}: drop_calls: {out:?}");
    let out = retry(|| store.journal.put_step(f, step(d, "k", b"v"))).await;
    assert!(out.is_err(), "{why}: put_step: {out:?}");
    assert_eq!(
        journal(store, &d.id).await,
        before,
        "{why}: the journal changed"
    );
    assert_eq!(
        store.log.latest(&d.thread).await.expect("latest"),
        latest,
        "{why}: the log moved"
    );
}

/// Records an entry at 0 and a step through claim `d`, so a refused drop has something to
/// drop.
async fn seed(store: &Store, d: &Dispatch) {
    record(
        store,
        d,
        entry(d, 0, CallKind::Http, Some(b"body".to_vec())),
    )
    .await;
    put_step(store, d, "k", b"first").await;
}

/// A write whose fence no longer holds is refused and stores nothing: after the lease ran
/// out, with a wrong token, after an interrupt of the thread, for a dispatch that is not
/// claimed, and after the dispatch settled.
pub async fn journal_writes_without_a_live_fence_are_refused_and_store_nothing<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;

    // The lease ran out (nobody reclaimed it yet).
    let d = claimed(&s, "lease", "d-lease").await;
    seed(&s, &d).await;
    env.advance(LEASE + 1);
    assert_every_write_refused(&s, &d, &fence(&d), "lease ran out").await;

    // A wrong token.
    let d = claimed(&s, "token", "d-token").await;
    seed(&s, &d).await;
    let mut wrong = fence(&d);
    wrong.token = "not-the-token".into();
    assert_every_write_refused(&s, &d, &wrong, "wrong token").await;
    // The right one still writes.
    record(&s, &d, entry(&d, 1, CallKind::LogRead, None)).await;
    assert_eq!(positions(&journal(&s, "d-token").await), [0, 1]);

    // An interrupt of the thread.
    let d = claimed(&s, "intr", "d-intr").await;
    seed(&s, &d).await;
    s.mailbox.interrupt("intr", "newer").await.unwrap();
    let f = fence(&d);
    match retry(|| s.journal.put_step(&f, step(&d, "k", b"late"))).await {
        Err(StoreError::StaleEpoch { .. }) => {}
        other => panic!("after an interrupt: expected StaleEpoch, got {other:?}"),
    }
    assert_every_write_refused(&s, &d, &fence(&d), "after an interrupt").await;

    // A dispatch that is not claimed (queued), and one that is not stored.
    put_on(&s, "queued", "d-queued").await;
    let queued = load(&s, "d-queued").await;
    let made_up = Fence {
        dispatch: "d-queued".into(),
        token: "made-up".into(),
        epoch: 0,
    };
    assert_every_write_refused(&s, &queued, &made_up, "not claimed").await;
    let mut missing = queued.clone();
    missing.id = "d-missing".into();
    let made_up = Fence {
        dispatch: "d-missing".into(),
        token: "made-up".into(),
        epoch: 0,
    };
    assert_every_write_refused(&s, &missing, &made_up, "not stored").await;

    // A settled dispatch.
    let d = claimed(&s, "acked", "d-acked").await;
    seed(&s, &d).await;
    s.mailbox.ack("d-acked", &tok(&d)).await.unwrap();
    assert_every_write_refused(&s, &d, &fence(&d), "after the ack").await;

    // Another instance refuses the same.
    let other = env.open().await;
    let d = claimed(&other, "token2", "d-token2").await;
    seed(&other, &d).await;
    let mut wrong = fence(&d);
    wrong.token = "not-the-token".into();
    assert_every_write_refused(&s, &d, &wrong, "wrong token on another instance").await;
}

/// The journal outlives an attempt: after a nack and a new claim, the next attempt loads
/// what the first recorded and writes with its own claim, while the first claim's fence is
/// refused. Another instance claiming it sees the same.
pub async fn journal_is_kept_across_a_nack_and_a_new_claim<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let first = claimed(&s, "t", "d1").await;
    record(
        &s,
        &first,
        entry(&first, 0, CallKind::Http, Some(b"one".to_vec())),
    )
    .await;
    record(&s, &first, entry(&first, 1, CallKind::Enqueue, None)).await;
    put_step(&s, &first, "done", b"0").await;
    let recorded = journal(&s, "d1").await;
    s.mailbox
        .nack("d1", &tok(&first), env.now(), "try again")
        .await
        .unwrap();

    let other = env.open().await;
    let second = claim_id(&other, "d1").await;
    assert_eq!(second.attempt, first.attempt + 1);
    assert_ne!(second.claims, first.claims);
    let j = journal(&other, "d1").await;
    assert_eq!(j, recorded, "attempt 1 sees attempt 0's journal");
    assert_eq!(j.calls[0].attempt, first.attempt);

    record(&other, &second, entry(&second, 2, CallKind::LogRead, None)).await;
    assert_every_write_refused(
        &s,
        &first,
        &fence(&first),
        "the first claim after a new one",
    )
    .await;
    let j = journal(&s, "d1").await;
    assert_eq!(positions(&j), [0, 1, 2]);
    assert_eq!(
        (j.calls[2].claim, j.calls[2].attempt),
        (second.claims, second.attempt)
    );
}

/// `drop_calls(from)` removes the entries at positions `>= from` and keeps the rest and the
/// steps; a later write at a dropped position stores again; dropping past the end is a no-op.
pub async fn drop_calls_keeps_the_positions_below_from<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let d = claimed(&s, "t", "d1").await;
    for pos in 0..6 {
        record(
            &s,
            &d,
            entry(&d, pos, CallKind::Http, Some(vec![pos as u8])),
        )
        .await;
    }
    put_step(&s, &d, "k", b"v").await;
    let f = fence(&d);
    retry(|| s.journal.drop_calls(&f, 10)).await.unwrap();
    assert_eq!(positions(&journal(&s, "d1").await), [0, 1, 2, 3, 4, 5]);
    retry(|| s.journal.drop_calls(&f, 2)).await.unwrap();
    let j = journal(&s, "d1").await;
    assert_eq!(positions(&j), [0, 1]);
    assert_eq!(keys(&j), ["k"], "steps stay");
    assert_eq!(j.calls[1].body, Some(vec![1]));
    record(&s, &d, entry(&d, 3, CallKind::LogRead, None)).await;
    assert_eq!(positions(&journal(&s, "d1").await), [0, 1, 3]);
    // Another instance and a restart read the same.
    let other = env.open().await;
    assert_eq!(positions(&journal(&other, "d1").await), [0, 1, 3]);
    retry(|| other.journal.drop_calls(&f, 0)).await.unwrap();
    drop((s, other));
    let reopened = env.open().await;
    let j = journal(&reopened, "d1").await;
    assert!(j.calls.is_empty(), "{j:?}");
    assert_eq!(keys(&j), ["k"]);
}

/// `record_append` appends to the fenced dispatch's thread log and stores the entry with the
/// same sequence as its answer; with `expected` it appends only at that `latest`, and a
/// mismatch is `Conflict` storing nothing.
pub async fn record_append_gives_the_log_entry_and_the_answer_one_sequence<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let d = claimed(&s, "t", "d1").await;
    let f = fence(&d);
    for i in 0..3 {
        let data = format!("before {i}");
        retry(|| s.log.append("t", data.as_bytes(), Some(&f)))
            .await
            .unwrap();
    }
    env.advance(5);
    let seq = retry(|| {
        s.journal.record_append(
            &f,
            entry(&d, 0, CallKind::LogAppend, None),
            b"journaled",
            None,
        )
    })
    .await
    .unwrap();
    assert_eq!(seq, 4);
    let log = s.log.read("t", 3, 10).await.unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(
        (log[0].seq, log[0].data.as_slice(), log[0].appended_at),
        (4, &b"journaled"[..], env.now())
    );
    let j = journal(&s, "d1").await;
    assert_eq!(positions(&j), [0]);
    let e = &j.calls[0];
    assert_eq!(
        (e.kind, &e.answer, e.recorded_at),
        (CallKind::LogAppend, &json!({ "seq": 4 }), env.now())
    );
    assert_eq!(e.size, e.clone().without_body().measure());

    // A mismatched expectation stores nothing.
    match retry(|| {
        s.journal.record_append(
            &f,
            entry(&d, 1, CallKind::LogAppendExpected, None),
            b"no",
            Some(3),
        )
    })
    .await
    {
        Err(StoreError::Conflict { latest }) => assert_eq!(latest, 4),
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert_eq!(s.log.latest("t").await.unwrap(), 4);
    assert_eq!(positions(&journal(&s, "d1").await), [0]);

    // A matching one appends.
    let seq = retry(|| {
        s.journal.record_append(
            &f,
            entry(&d, 1, CallKind::LogAppendExpected, None),
            b"yes",
            Some(4),
        )
    })
    .await
    .unwrap();
    assert_eq!(seq, 5);
    let j = journal(&s, "d1").await;
    assert_eq!(j.calls[1].answer, json!({ "seq": 5 }));
    let other = env.open().await;
    let log = other.log.read("t", 4, 10).await.unwrap();
    assert_eq!(log.iter().map(|e| e.seq).collect::<Vec<_>>(), [5]);
    assert_eq!(log[0].data, b"yes");
    assert_eq!(journal(&other, "d1").await, j);
}

/// `record` refuses an append kind, an entry of another dispatch, and a body over
/// `max_body`; `put_step` a blank key and a value over it. Nothing is stored.
pub async fn invalid_journal_writes_are_refused_and_store_nothing<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let d = claimed(&s, "t", "d1").await;
    let f = fence(&d);
    for kind in [CallKind::LogAppend, CallKind::LogAppendExpected] {
        match s.journal.record(&f, entry(&d, 0, kind, None)).await {
            Err(StoreError::Invalid(_)) => {}
            other => panic!("record of a {kind} entry: expected Invalid, got {other:?}"),
        }
    }
    let mut elsewhere = entry(&d, 0, CallKind::Http, None);
    elsewhere.dispatch = "d2".into();
    assert!(matches!(
        s.journal.record(&f, elsewhere).await,
        Err(StoreError::Invalid(_))
    ));
    let max = s.journal.max_body();
    assert!(max > 0);
    if max < 1 << 30 {
        let over = vec![0u8; max as usize + 1];
        let out = s
            .journal
            .record(&f, entry(&d, 0, CallKind::Http, Some(over.clone())))
            .await;
        assert!(matches!(out, Err(StoreError::Invalid(_))), "{out:?}");
        let out = s.journal.put_step(&f, step(&d, "big", &over)).await;
        assert!(matches!(out, Err(StoreError::Invalid(_))), "{out:?}");
    }
    let out = s.journal.put_step(&f, step(&d, " ", b"v")).await;
    assert!(matches!(out, Err(StoreError::Invalid(_))), "{out:?}");
    assert_eq!(journal(&s, "d1").await, JournalData::default());
    assert_eq!(s.log.latest("t").await.unwrap(), 0);
}

/// A body of `max_body` bytes (when that is small enough to try) is kept whole.
pub async fn a_body_at_max_body_round_trips<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let max = s.journal.max_body();
    if max > 16 << 20 {
        return;
    }
    let d = claimed(&s, "t", "d1").await;
    let body = binary(max as usize, 9);
    record(&s, &d, entry(&d, 0, CallKind::Http, Some(body.clone()))).await;
    let j = journal(&s, "d1").await;
    assert_eq!(j.calls[0].body.as_deref(), Some(body.as_slice()));
}

/// The journal goes with its dispatch: a purge of the settled dispatch removes its entries
/// and steps, and leaves other dispatches' journals alone.
pub async fn journal_goes_with_its_dispatch<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let gone = claimed(&s, "t1", "gone").await;
    seed(&s, &gone).await;
    record(&s, &gone, entry(&gone, 1, CallKind::Enqueue, None)).await;
    let kept = claimed(&s, "t2", "kept").await;
    seed(&s, &kept).await;
    s.mailbox.ack("gone", &tok(&gone)).await.unwrap();
    // Settled and kept until purged.
    assert_eq!(positions(&journal(&s, "gone").await), [0, 1]);
    env.advance(1_000);
    let purged = s.mailbox.purge_terminal(env.now()).await.unwrap();
    assert_eq!(purged, 1);
    assert!(s.mailbox.load("gone").await.unwrap().is_none());
    assert_eq!(journal(&s, "gone").await, JournalData::default());
    let other = env.open().await;
    assert_eq!(journal(&other, "gone").await, JournalData::default());
    let j = journal(&other, "kept").await;
    assert_eq!((positions(&j), keys(&j)), (vec![0], vec!["k"]));
    // The kept dispatch still writes.
    record(&s, &kept, entry(&kept, 1, CallKind::LogRead, None)).await;
    assert_eq!(positions(&journal(&s, "kept").await), [0, 1]);
}
