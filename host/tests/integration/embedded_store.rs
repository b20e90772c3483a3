//! Embedded-backend specifics the generic suite cannot reach: bad stored data, schema versions,
//! files that are not stores, restart durability.

use std::sync::Arc;

use homing::store::embedded::{EmbeddedStore, SCHEMA_VERSION};
use homing::store::{ListFilter, ManualClock, NewDispatch, StoreError};

fn clock() -> Arc<ManualClock> {
    ManualClock::new(1_700_000_000_000)
}

#[tokio::test]
async fn a_row_that_fails_to_decode_is_corrupt_naming_its_key_and_others_stay_usable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let store = EmbeddedStore::open(&path, clock()).unwrap().store();
    let bad = store
        .mailbox
        .enqueue(NewDispatch::new("a", "t1", "x").with_id("bad"))
        .await
        .unwrap();
    let good = store
        .mailbox
        .enqueue(NewDispatch::new("a", "t2", "y").with_id("good"))
        .await
        .unwrap();
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute(
            "UPDATE dispatches SET metadata = 'not json' WHERE id = 'bad'",
            [],
        )
        .unwrap();
    }
    match store.mailbox.load(&bad.id).await {
        Err(StoreError::Corrupt { key, reason }) => {
            assert_eq!(key, "dispatches/bad");
            assert!(reason.contains("metadata"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(
        store.mailbox.load(&good.id).await.unwrap().unwrap().payload,
        b"y"
    );
    let filter = ListFilter {
        thread: Some("t2".into()),
        ..Default::default()
    };
    assert_eq!(store.mailbox.list(&filter).await.unwrap().len(), 1);
    // Holder operations on the corrupt row fail cleanly too.
    let err = store.mailbox.ack("bad", "token").await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
}

#[tokio::test]
async fn a_claim_on_a_thread_with_a_corrupt_head_fails_without_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let store = EmbeddedStore::open(&path, clock()).unwrap().store();
    store
        .mailbox
        .enqueue(NewDispatch::new("a", "t1", "x").with_id("head"))
        .await
        .unwrap();
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute(
            "UPDATE dispatches SET priority = 9999 WHERE id = 'head'",
            [],
        )
        .unwrap();
    }
    let err = store.mailbox.claim("a", "w", 1000).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Corrupt { ref key, .. } if key == "dispatches/head"),
        "{err:?}"
    );
}

#[test]
fn a_file_from_a_newer_schema_is_refused_naming_the_file_and_versions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("future.db");
    drop(EmbeddedStore::open(&path, clock()).unwrap());
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
    }
    let err = EmbeddedStore::open(&path, clock()).unwrap_err();
    match err {
        StoreError::Corrupt { key, reason } => {
            assert_eq!(key, path.display().to_string());
            assert!(
                reason.contains(&format!("schema version {}", SCHEMA_VERSION + 1)),
                "{reason}"
            );
            assert!(reason.contains("upgrade homing"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn a_file_that_is_not_a_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(
        &text,
        "these are not the tables you are looking for, not at all, no",
    )
    .unwrap();
    let err = EmbeddedStore::open(&text, clock()).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");

    let foreign = dir.path().join("foreign.db");
    {
        let conn = rusqlite::Connection::open(&foreign).unwrap();
        conn.execute("CREATE TABLE invoices (id INTEGER)", [])
            .unwrap();
    }
    let err = EmbeddedStore::open(&foreign, clock()).unwrap_err();
    match err {
        StoreError::Corrupt { reason, .. } => {
            assert!(reason.contains("not a Homing store"), "{reason}")
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[tokio::test]
async fn everything_acknowledged_survives_closing_and_reopening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let clock = clock();
    let (claimed_id, token) = {
        let store = EmbeddedStore::open(&path, clock.clone()).unwrap().store();
        store
            .mailbox
            .enqueue(NewDispatch::new("a", "t", "one").with_id("one"))
            .await
            .unwrap();
        store
            .mailbox
            .enqueue(NewDispatch::new("a", "t", "two").with_id("two"))
            .await
            .unwrap();
        let d = store
            .mailbox
            .claim("a", "w", 60_000)
            .await
            .unwrap()
            .unwrap();
        store.log.append("t", b"entry", None).await.unwrap();
        (d.id.clone(), d.token().unwrap().to_owned())
    };
    let store = EmbeddedStore::open(&path, clock.clone()).unwrap().store();
    // The claim, its lease and the thread lock survive: the holder can still settle.
    assert!(
        store
            .mailbox
            .claim("a", "w2", 60_000)
            .await
            .unwrap()
            .is_none(),
        "thread still held"
    );
    store.mailbox.ack(&claimed_id, &token).await.unwrap();
    let next = store
        .mailbox
        .claim("a", "w2", 60_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next.id, "two");
    assert_eq!(store.log.latest("t").await.unwrap(), 1);
}

/// Limits of at most `cap` running dispatches per concurrency key.
fn per_key(cap: u32) -> homing::store::LimitSet {
    homing::store::LimitSet {
        key_concurrency: Some(cap),
        ..homing::store::LimitSet::default()
    }
}

/// A gated claim of agent `x` under `limits`.
fn claim_of_x(limits: &homing::store::LimitSet) -> homing::store::ClaimRequest<'_> {
    homing::store::ClaimRequest {
        agent: "x",
        consumer: "w",
        lease_ms: 30_000,
        start: false,
        limits,
        offer: None,
    }
}

/// A schema 5 file with keyed work queued opens with this one, and the keys it had rotate: the
/// migration gives each key with a lane its turn.
#[tokio::test]
async fn a_schema_5_file_with_keyed_lanes_migrates_and_its_keys_take_turns() {
    use homing::store::embedded::MIGRATIONS;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("five.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        for sql in &MIGRATIONS[..5] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", 5).unwrap();
        for (i, key) in ["a", "a", "b", "b"].iter().enumerate() {
            conn.execute(
                "INSERT INTO dispatches (id, agent, thread, run_id, payload, metadata, priority, \
                 available_at, max_attempts, attempt, epoch, status, ready, created_at, \
                 updated_at, concurrency_key) VALUES (?1, 'x', ?2, ?1, x'', '{}', 128, 0, 5, 0, \
                 0, 'queued', 1, ?3, ?3, ?4)",
                rusqlite::params![format!("d{i}"), format!("t{i}"), i, key],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO threads (thread) VALUES (?1)",
                rusqlite::params![format!("t{i}")],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO lanes (agent, thread, priority, served, created, head, busy, ckey) \
                 VALUES ('x', ?1, 128, 0, ?2, ?3, 0, ?4)",
                rusqlite::params![format!("t{i}"), i, format!("d{i}"), key],
            )
            .unwrap();
        }
    }
    let store = EmbeddedStore::open(&path, clock()).unwrap().store();
    let limits = per_key(10);
    let req = claim_of_x(&limits);
    let mut keys = Vec::new();
    for _ in 0..4 {
        let d = store
            .mailbox
            .claim_gated(&req)
            .await
            .unwrap()
            .dispatch
            .expect("a keyed dispatch");
        keys.push(d.concurrency_key.unwrap_or_default());
    }
    assert_ne!(keys[0], keys[1], "the two keys take turns: {keys:?}");
    assert_ne!(keys[2], keys[3], "the two keys take turns: {keys:?}");
    assert!(
        store
            .mailbox
            .claim_gated(&req)
            .await
            .unwrap()
            .dispatch
            .is_none()
    );
}

/// A schema 6 file opens with this one, and its concurrency keys' slots are their running
/// dispatches: a claim whose lease is alive holds its key's slot with no slot row, and the slot
/// rows the earlier release wrote for key scopes are gone (a stale one no longer counts).
#[tokio::test]
async fn a_schema_6_file_counts_a_keys_slots_from_its_running_dispatches() {
    use homing::store::embedded::MIGRATIONS;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("six.db");
    let now = 1_700_000_000_000_u64;
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        for sql in &MIGRATIONS[..6] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", 6).unwrap();
        // d0 of key a runs (its lease is alive); d1 of key a and d2 of key b wait.
        for (i, (key, status)) in [("a", "claimed"), ("a", "queued"), ("b", "queued")]
            .iter()
            .enumerate()
        {
            let claimed = *status == "claimed";
            conn.execute(
                "INSERT INTO dispatches (id, agent, thread, run_id, payload, metadata, priority, \
                 available_at, max_attempts, attempt, epoch, status, ready, created_at, \
                 updated_at, concurrency_key, claim_token, claimed_by, lease_until, claims) \
                 VALUES (?1, 'x', ?2, ?1, x'', '{}', 128, 0, 5, ?5, 0, ?3, 1, ?4, ?4, ?6, ?7, ?8, \
                 ?9, ?5)",
                rusqlite::params![
                    format!("d{i}"),
                    format!("t{i}"),
                    status,
                    i,
                    u32::from(claimed),
                    key,
                    claimed.then_some("token"),
                    claimed.then_some("w"),
                    claimed.then_some(now + 60_000),
                ],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO threads (thread, holder) VALUES (?1, ?2)",
                rusqlite::params![format!("t{i}"), claimed.then(|| format!("d{i}"))],
            )
            .unwrap();
            if !claimed {
                conn.execute(
                    "INSERT INTO lanes (agent, thread, priority, served, created, head, busy, ckey) \
                     VALUES ('x', ?1, 128, 0, ?2, ?3, 0, ?4)",
                    rusqlite::params![format!("t{i}"), i, format!("d{i}"), key],
                )
                .unwrap();
                conn.execute(
                    "INSERT OR IGNORE INTO key_turns (agent, key, turn) VALUES ('x', ?1, 0)",
                    rusqlite::params![key],
                )
                .unwrap();
            }
        }
        // What the earlier release left: a row of d0's claim, and one of a claim long gone.
        conn.execute(
            "INSERT INTO limit_slots (scope, holder, claims, until) VALUES \
             ('key:x:a', 'd0', 1, 0), ('key:x:b', 'gone', 1, 0)",
            [],
        )
        .unwrap();
    }
    let store = EmbeddedStore::open(&path, clock()).unwrap().store();
    let limits = per_key(1);
    let req = claim_of_x(&limits);
    let first = store.mailbox.claim_gated(&req).await.unwrap();
    assert_eq!(
        first.dispatch.map(|d| d.id).as_deref(),
        Some("d2"),
        "key a's one slot is d0's; key b's is free"
    );
    let second = store.mailbox.claim_gated(&req).await.unwrap();
    assert!(second.dispatch.is_none(), "both keys are at their cap");
    assert_eq!(second.throttled, vec!["d1".to_owned()]);
    let rows: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT count(*) FROM limit_slots", [], |row| row.get(0))
        .unwrap();
    assert_eq!(
        rows, 0,
        "keyed claims write no slot rows, and the old ones went"
    );
}

/// A plugin rate's tokens are taken from its bucket a block at a time (100 ms at the rate):
/// five claims at 100/s write the bucket once, down by ten tokens, not five times; a rate
/// whose block is one token writes it at every claim, and stops at its burst.
#[tokio::test]
async fn claims_take_a_rates_tokens_in_blocks_of_100_ms() {
    use homing::store::limits::{Scope, agent_scope_name};
    use homing::store::{NewDispatch, Rate};
    for (rate, claims, left) in [
        (Rate::new(100, 1_000), 5, 90.0),
        (Rate::new(2, 1_000), 2, 0.0),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rate.db");
        let store = EmbeddedStore::open(&path, clock()).unwrap().store();
        for i in 0..6 {
            store
                .mailbox
                .enqueue(NewDispatch::new("x", format!("t{i}"), "p"))
                .await
                .unwrap();
        }
        let limits = homing::store::LimitSet {
            shared: vec![Scope {
                name: agent_scope_name("x"),
                concurrency: None,
                rate: Some(rate),
            }],
            ..homing::store::LimitSet::default()
        };
        let req = claim_of_x(&limits);
        for n in 0..claims {
            let gated = store.mailbox.claim_gated(&req).await.unwrap();
            assert!(gated.dispatch.is_some(), "claim {n} at {rate:?}");
        }
        let tokens: f64 = rusqlite::Connection::open(&path)
            .unwrap()
            .query_row(
                "SELECT tokens FROM limit_buckets WHERE scope = 'agent:x'",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(tokens, left, "{rate:?} after {claims} claims");
        if left == 0.0 {
            let held = store.mailbox.claim_gated(&req).await.unwrap();
            assert!(held.dispatch.is_none(), "past the burst of {rate:?}");
            assert!(held.retry_at.is_some());
        }
    }
}

/// A file written by the previous release (schema 2) opens with this one: the migration keeps
/// every record and entry, the new counters start at 0, and claims count from there.
#[tokio::test]
async fn a_schema_2_file_migrates_keeping_its_records_and_counting_claims_from_zero() {
    use homing::store::embedded::MIGRATIONS;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        for sql in &MIGRATIONS[..2] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", 2).unwrap();
        conn.execute_batch(
            "INSERT INTO dispatches (id, agent, thread, run_id, payload, metadata, priority, \
             available_at, dedupe_key, max_attempts, attempt, epoch, status, ready, created_at, \
             updated_at) VALUES ('old', 'a', 't', 'old', x'6869', '{\"k\":\"v\"}', 128, 0, 'key', \
             5, 1, 0, 'queued', 1, 1, 1);
             INSERT INTO threads (thread, epoch, holder, served) VALUES ('t', 0, NULL, 0);
             INSERT INTO lanes (agent, thread, priority, served, created, head, busy) \
             VALUES ('a', 't', 128, 0, 1, 'old', 0);
             INSERT INTO log_marks (thread, reserved, latest, trimmed) VALUES ('t', 1, 1, 0);
             INSERT INTO log_entries (thread, seq, data, appended_at) VALUES ('t', 1, x'6869', 1);",
        )
        .unwrap();
    }
    let store = EmbeddedStore::open(&path, clock()).unwrap().store();
    let old = store.mailbox.load("old").await.unwrap().unwrap();
    assert_eq!(
        (old.payload.as_slice(), old.attempt, old.claims, old.resumes),
        (&b"hi"[..], 1, 0, 0)
    );
    assert_eq!(old.metadata.get("k").map(String::as_str), Some("v"));
    let entries = store.log.read("t", 0, 10).await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].data, b"hi");
    // The live dedupe index still holds the key across the migration.
    let dup = store
        .mailbox
        .enqueue(NewDispatch::new("a", "t", "x").with_dedupe_key("key"))
        .await;
    assert!(matches!(dup, Err(StoreError::Duplicate { .. })), "{dup:?}");
    let claimed = store
        .mailbox
        .claim("a", "w", 30_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((claimed.id.as_str(), claimed.claims), ("old", 1));
    let version: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
}

/// Enqueues one dispatch of agent `x` with concurrency key `key` on `thread`.
async fn put_keyed(store: &homing::store::Store, thread: &str, key: &str) {
    store
        .mailbox
        .enqueue(NewDispatch::new("x", thread, "p").with_concurrency_key(key))
        .await
        .unwrap();
}

/// The concurrency key of the next gated claim of agent `x` under `limits` on `store`.
async fn next_key(store: &homing::store::Store, limits: &homing::store::LimitSet) -> String {
    store
        .mailbox
        .claim_gated(&claim_of_x(limits))
        .await
        .unwrap()
        .dispatch
        .expect("a keyed dispatch")
        .concurrency_key
        .unwrap_or_default()
}

/// Waits until the file's `key_turns` row of `key` (agent `x`) says `turn`: the writer keeps
/// turns in memory and writes them at most 100 ms after they moved (at once when it goes idle
/// that long, and when the store closes).
async fn await_turn(path: &std::path::Path, key: &str, turn: u64) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let stored: Option<u64> = conn
            .query_row(
                "SELECT turn FROM key_turns WHERE agent = 'x' AND key = ?1",
                [key],
                |row| row.get(0),
            )
            .ok();
        if stored == Some(turn) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "key {key}'s turn in the file is {stored:?} after 10 s, not {turn}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Two store instances on one file share their rotation through it: each keeps its turns in
/// memory and writes those that moved within 100 ms; an instance whose memory is older than
/// the other's commits reads the turns again. So once the turns are written, a claim by either
/// sees the keys the other served: three claims alternating between them serve the three keys.
#[tokio::test]
async fn two_instances_on_one_file_see_each_others_turns_once_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let clock = clock();
    let a = EmbeddedStore::open(&path, clock.clone()).unwrap().store();
    let b = EmbeddedStore::open(&path, clock).unwrap().store();
    for i in 0..2 {
        for key in ["k1", "k2", "k3"] {
            put_keyed(&a, &format!("{key}-{i}"), key).await;
        }
    }
    let limits = per_key(100);
    assert_eq!(next_key(&b, &limits).await, "k1");
    await_turn(&path, "k1", 1_000).await;
    assert_eq!(next_key(&a, &limits).await, "k2", "a reads b's turns");
    await_turn(&path, "k2", 1_000).await;
    // b read the turns before a's claim: it reads them again.
    assert_eq!(next_key(&b, &limits).await, "k3", "b reads a's turn");
}

/// The turns survive a clean restart: closing the store writes them (its drop waits for it),
/// so a store closed after serving two of three keys serves the third first when it is opened
/// again.
#[tokio::test]
async fn the_rotation_goes_on_where_it_was_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let limits = per_key(100);
    {
        let store = EmbeddedStore::open(&path, clock()).unwrap().store();
        for i in 0..2 {
            for key in ["k1", "k2", "k3"] {
                put_keyed(&store, &format!("{key}-{i}"), key).await;
            }
        }
        assert_eq!(next_key(&store, &limits).await, "k1");
        assert_eq!(next_key(&store, &limits).await, "k2");
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    let turns: Vec<(String, u64)> = conn
        .prepare("SELECT key, turn FROM key_turns WHERE agent = 'x' ORDER BY key")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        turns,
        [
            ("k1".to_owned(), 1_000),
            ("k2".to_owned(), 1_000),
            ("k3".to_owned(), 0)
        ],
        "the turns in the file once the store is closed"
    );
    let store = EmbeddedStore::open(&path, clock()).unwrap().store();
    assert_eq!(next_key(&store, &limits).await, "k3");
    assert_eq!(next_key(&store, &limits).await, "k1");
}

/// An agent with more keys than the writer keeps in memory still rotates them in turn order:
/// here it has ten keys when its turns are first read (and kept), then more keys arrive than
/// are kept, and its claims go on from the table. Every key is claimed once, in key order,
/// before the first key's second dispatch.
#[tokio::test]
async fn keys_past_the_count_kept_in_memory_still_take_turns_in_order() {
    use homing::store::embedded::MIRRORED_KEYS;
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&dir.path().join("store.db"), clock())
        .unwrap()
        .store();
    let keys = MIRRORED_KEYS + 4;
    let key = |i: usize| format!("k{i:05}");
    put_keyed(&store, "first-again", &key(0)).await;
    for i in 0..10 {
        put_keyed(&store, &key(i), &key(i)).await;
    }
    let limits = per_key(10);
    let mut order = vec![next_key(&store, &limits).await];
    for i in 10..keys {
        put_keyed(&store, &key(i), &key(i)).await;
    }
    for _ in 0..keys {
        order.push(next_key(&store, &limits).await);
    }
    let mut expected: Vec<String> = (0..keys).map(key).collect();
    expected.push(key(0));
    assert_eq!(order.len(), expected.len());
    if let Some(n) = (0..order.len()).find(|&n| order[n] != expected[n]) {
        panic!(
            "claim {n} took key {} where the rotation gives {}",
            order[n], expected[n]
        );
    }
}
