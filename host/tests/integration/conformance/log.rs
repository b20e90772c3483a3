//! The sequence store, one writer at a time (the contract, docs/contract.md, section 4).

use homing::store::{Fence, LogEntry, StoreError, Watermarks};

use super::*;

fn seqs(entries: &[LogEntry]) -> Vec<u64> {
    entries.iter().map(|e| e.seq).collect()
}

fn marks(reserved: u64, latest: u64, trimmed: u64) -> Watermarks {
    Watermarks {
        reserved,
        latest,
        trimmed,
    }
}

/// A read within a byte budget ends after the entry that brings the data read to it, reads
/// one entry when the first alone passes it, and otherwise reads as `read` does.
pub async fn a_read_within_a_budget_ends_at_the_entry_that_reaches_it<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    for i in 1..=6u8 {
        s.log.append("t", &[i; 100], None).await.unwrap();
    }
    let within = |after, limit, budget| {
        let s = s.clone();
        async move { seqs(&s.log.read_within("t", after, limit, budget).await.unwrap()) }
    };
    assert_eq!(within(0, 10, 250).await, vec![1, 2, 3]);
    assert_eq!(within(0, 10, 200).await, vec![1, 2]);
    assert_eq!(
        within(2, 10, 1).await,
        vec![3],
        "one, though it alone passes"
    );
    assert_eq!(within(4, 10, usize::MAX).await, vec![5, 6]);
    assert_eq!(
        within(0, 2, 10_000).await,
        vec![1, 2],
        "the limit still holds"
    );
    assert!(within(6, 10, 1).await.is_empty());
    assert_eq!(
        seqs(&s.log.read("t", 0, 10).await.unwrap()),
        vec![1, 2, 3, 4, 5, 6]
    );
}

/// Append assigns 1, then 2, and read returns both with their content.
pub async fn append_assigns_one_then_two<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    assert_eq!(s.log.append("t", b"first", None).await.unwrap(), 1);
    assert_eq!(s.log.append("t", b"second", None).await.unwrap(), 2);
    let entries = s.log.read("t", 0, 10).await.unwrap();
    assert_eq!(seqs(&entries), vec![1, 2]);
    assert_eq!(entries[0].data, b"first");
    assert_eq!(entries[1].data, b"second");
    assert_eq!(s.log.latest("t").await.unwrap(), 2);
    assert_eq!(s.log.watermarks("t").await.unwrap(), marks(2, 2, 0));
}

/// Every thread has its own sequence.
pub async fn sequences_are_per_thread<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    assert_eq!(s.log.append("a", b"a1", None).await.unwrap(), 1);
    assert_eq!(s.log.append("a", b"a2", None).await.unwrap(), 2);
    assert_eq!(s.log.append("b", b"b1", None).await.unwrap(), 1);
    assert_eq!(s.log.append("a", b"a3", None).await.unwrap(), 3);
    assert_eq!(seqs(&s.log.read("b", 0, 10).await.unwrap()), vec![1]);
    assert_eq!(s.log.latest("a").await.unwrap(), 3);
}

/// Read returns the entries after the cursor, ascending, at most `limit`.
pub async fn read_returns_entries_after_cursor_in_order_with_limit<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    for i in 1..=10u8 {
        s.log.append("t", &[i], None).await.unwrap();
    }
    assert_eq!(seqs(&s.log.read("t", 0, 3).await.unwrap()), vec![1, 2, 3]);
    assert_eq!(seqs(&s.log.read("t", 3, 3).await.unwrap()), vec![4, 5, 6]);
    assert_eq!(seqs(&s.log.read("t", 8, 100).await.unwrap()), vec![9, 10]);
    assert!(s.log.read("t", 10, 100).await.unwrap().is_empty());
    assert!(s.log.read("t", 1_000, 100).await.unwrap().is_empty());
    for entry in s.log.read("t", 0, 100).await.unwrap() {
        assert_eq!(entry.data, vec![u8::try_from(entry.seq).unwrap()]);
    }
}

/// An unknown thread reads empty, with latest 0 and zero watermarks.
pub async fn unknown_thread_log_is_empty_with_zero_watermarks<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    assert!(s.log.read("nobody", 0, 10).await.unwrap().is_empty());
    assert_eq!(s.log.latest("nobody").await.unwrap(), 0);
    assert_eq!(
        s.log.watermarks("nobody").await.unwrap(),
        Watermarks::default()
    );
}

/// `appended_at` comes from the store's clock.
pub async fn appended_at_comes_from_the_clock<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    s.log.append("t", b"a", None).await.unwrap();
    env.advance(42);
    s.log.append("t", b"b", None).await.unwrap();
    let entries = s.log.read("t", 0, 10).await.unwrap();
    assert_eq!(entries[0].appended_at, T0);
    assert_eq!(entries[1].appended_at, T0 + 42);
}

/// Append_expected appends when the latest matches (0 for an empty log).
pub async fn append_expected_appends_when_latest_matches<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    assert_eq!(s.log.append_expected("t", b"a", 0, None).await.unwrap(), 1);
    assert_eq!(s.log.append_expected("t", b"b", 1, None).await.unwrap(), 2);
    s.log.append("t", b"c", None).await.unwrap();
    assert_eq!(s.log.append_expected("t", b"d", 3, None).await.unwrap(), 4);
}

/// Append_expected with a stale expectation is `Conflict { latest }` and appends nothing.
pub async fn append_expected_conflict_reports_latest_and_appends_nothing<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    s.log.append("t", b"a", None).await.unwrap();
    s.log.append("t", b"b", None).await.unwrap();
    for expected in [0, 1, 3, 99] {
        match s.log.append_expected("t", b"x", expected, None).await {
            Err(StoreError::Conflict { latest }) => assert_eq!(latest, 2),
            other => panic!("expected Conflict for {expected}, got {other:?}"),
        }
    }
    assert_eq!(s.log.latest("t").await.unwrap(), 2);
    assert_eq!(seqs(&s.log.read("t", 0, 10).await.unwrap()), vec![1, 2]);
    let next = s.log.append_expected("t", b"c", 2, None).await.unwrap();
    assert!(next > 2);
    assert_eq!(s.log.latest("t").await.unwrap(), next);
}

/// Trim drops entries at or below `up_to`, clamped to the latest; appends continue.
pub async fn trim_drops_entries_at_or_below_and_is_clamped_to_latest<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    for i in 0..5u8 {
        s.log.append("t", &[i], None).await.unwrap();
    }
    s.log.trim("t", 2).await.unwrap();
    assert_eq!(seqs(&s.log.read("t", 0, 10).await.unwrap()), vec![3, 4, 5]);
    assert_eq!(s.log.watermarks("t").await.unwrap(), marks(5, 5, 2));
    s.log.trim("t", 100).await.unwrap();
    assert!(s.log.read("t", 0, 10).await.unwrap().is_empty());
    assert_eq!(
        s.log.watermarks("t").await.unwrap(),
        marks(5, 5, 5),
        "clamped to latest"
    );
    assert_eq!(s.log.append("t", b"next", None).await.unwrap(), 6);
    assert_eq!(seqs(&s.log.read("t", 0, 10).await.unwrap()), vec![6]);
    s.log.trim("empty-thread", 10).await.unwrap();
    assert_eq!(
        s.log.watermarks("empty-thread").await.unwrap(),
        Watermarks::default()
    );
}

/// A lower trim after a higher one never moves a watermark back.
pub async fn trim_never_moves_watermarks_back<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    for i in 0..4u8 {
        s.log.append("t", &[i], None).await.unwrap();
    }
    s.log.trim("t", 3).await.unwrap();
    s.log.trim("t", 1).await.unwrap();
    s.log.trim("t", 0).await.unwrap();
    assert_eq!(s.log.watermarks("t").await.unwrap(), marks(4, 4, 3));
    assert_eq!(seqs(&s.log.read("t", 0, 10).await.unwrap()), vec![4]);
}

/// Delete drops every entry; the watermark survives as a tombstone and the next
/// append continues above it (sequences are never reused).
pub async fn delete_keeps_watermark_and_sequences_are_never_reused<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    for i in 0..3u8 {
        s.log.append("t", &[i], None).await.unwrap();
    }
    s.log.delete("t").await.unwrap();
    assert!(s.log.read("t", 0, 10).await.unwrap().is_empty());
    let w = s.log.watermarks("t").await.unwrap();
    assert_eq!(w.latest, 3, "the watermark survives");
    assert_eq!(
        w.trimmed, w.latest,
        "everything at or below the watermark is gone"
    );
    assert!(w.reserved >= w.latest);
    assert_eq!(s.log.latest("t").await.unwrap(), 3);
    let next = s.log.append("t", b"reborn", None).await.unwrap();
    assert_eq!(next, 4);
    let entries = s.log.read("t", 0, 10).await.unwrap();
    assert_eq!(seqs(&entries), vec![4]);
    assert_eq!(entries[0].data, b"reborn");
    s.log.delete("t").await.unwrap();
    s.log.delete("t").await.unwrap();
    assert_eq!(s.log.append("t", b"again", None).await.unwrap(), 5);
    s.log.delete("never-written").await.unwrap();
    assert_eq!(s.log.append("never-written", b"x", None).await.unwrap(), 1);
}

/// A deleted thread reads nothing from any instance, old cursors included.
pub async fn deleted_thread_reads_nothing_on_any_instance<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let (a, b) = (env.open().await, env.open().await);
    for i in 0..3u8 {
        a.log.append("t", &[i], None).await.unwrap();
    }
    assert_eq!(b.log.read("t", 0, 10).await.unwrap().len(), 3);
    b.log.delete("t").await.unwrap();
    for s in [&a, &b] {
        assert!(s.log.read("t", 0, 10).await.unwrap().is_empty());
        assert!(s.log.read("t", 1, 10).await.unwrap().is_empty());
    }
}

/// The delete tombstone survives a restart.
pub async fn delete_tombstone_survives_restart<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    for i in 0..7u8 {
        s.log.append("t", &[i], None).await.unwrap();
    }
    s.log.delete("t").await.unwrap();
    drop(s);
    let r = env.open().await;
    assert!(r.log.read("t", 0, 10).await.unwrap().is_empty());
    assert_eq!(r.log.latest("t").await.unwrap(), 7);
    assert_eq!(r.log.append("t", b"x", None).await.unwrap(), 8);
}

/// Entries and watermarks survive a restart and the sequence continues.
pub async fn log_survives_restart_and_continues_sequence<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    for i in 0..5u8 {
        s.log.append("t", &[i, i], None).await.unwrap();
    }
    s.log.trim("t", 2).await.unwrap();
    let entries = s.log.read("t", 0, 10).await.unwrap();
    let w = s.log.watermarks("t").await.unwrap();
    drop(s);
    let r = env.open().await;
    assert_eq!(r.log.read("t", 0, 10).await.unwrap(), entries);
    assert_eq!(r.log.watermarks("t").await.unwrap(), w);
    assert_eq!(r.log.append("t", b"more", None).await.unwrap(), 6);
}

/// An ~800 KiB entry round-trips byte for byte.
pub async fn large_entry_round_trips<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let big: Vec<u8> = (0..800 * 1024)
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let seq = s.log.append("t", &big, None).await.unwrap();
    let entries = s.log.read("t", 0, 1).await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].seq, seq);
    assert!(entries[0].data == big, "content differs");
}

/// An append on one host is visible at once on another.
pub async fn append_on_one_instance_is_visible_on_another<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let (a, b) = (env.open().await, env.open().await);
    assert_eq!(a.log.append("t", b"from a", None).await.unwrap(), 1);
    assert_eq!(b.log.latest("t").await.unwrap(), 1);
    assert_eq!(b.log.append("t", b"from b", None).await.unwrap(), 2);
    let entries = a.log.read("t", 0, 10).await.unwrap();
    assert_eq!(
        entries.iter().map(|e| e.data.clone()).collect::<Vec<_>>(),
        vec![b"from a".to_vec(), b"from b".to_vec()]
    );
}

/// A refused append leaves earlier entries and the visible watermark intact, and
/// never makes anything half-written visible.
pub async fn failed_append_leaves_earlier_entries_intact<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    s.log.append("t", b"kept-1", None).await.unwrap();
    s.log.append("t", b"kept-2", None).await.unwrap();
    let before = s.log.read("t", 0, 10).await.unwrap();
    let bogus = Fence {
        dispatch: "ghost".into(),
        token: "x".into(),
        epoch: 0,
    };
    assert!(s.log.append("t", b"refused", Some(&bogus)).await.is_err());
    assert!(
        s.log
            .append_expected("t", b"refused", 0, None)
            .await
            .is_err()
    );
    assert_eq!(s.log.read("t", 0, 10).await.unwrap(), before);
    assert_eq!(s.log.latest("t").await.unwrap(), 2);
    let w = s.log.watermarks("t").await.unwrap();
    assert!(w.reserved >= 2 && w.latest == 2);
    let next = s.log.append("t", b"after", None).await.unwrap();
    assert!(next > 2);
    let entries = s.log.read("t", 0, 10).await.unwrap();
    assert_eq!(entries.len(), 3);
    assert_eq!(entries[2].data, b"after");
}

/// An entry over the backend's limit is refused with `Invalid` naming the entry, its
/// size and the limit, and appends nothing; a binary entry at the limit (or 2 MiB, whichever is
/// less) reads back byte for byte on any instance.
pub async fn entries_over_the_backends_limit_are_invalid_and_at_it_round_trip<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let limit = s.log.max_entry();
    let over = usize::try_from(limit + 1).unwrap();
    expect_too_large(
        s.log.append("t", &vec![0u8; over], None).await,
        "entry",
        over,
        limit,
    );
    expect_too_large(
        s.log.append_expected("t", &vec![0u8; over], 0, None).await,
        "entry",
        over,
        limit,
    );
    assert_eq!(s.log.watermarks("t").await.unwrap(), marks(0, 0, 0));

    let n = usize::try_from(limit.min(2 << 20)).unwrap();
    let entry = binary(n, 11);
    assert_eq!(s.log.append("t", &entry, None).await.unwrap(), 1);
    for store in [&s, &env.open().await] {
        let read = store.log.read("t", 0, 10).await.unwrap();
        assert_eq!(seqs(&read), vec![1]);
        assert!(
            read[0].data == entry,
            "entry of {n} bytes differs after storage"
        );
    }
}
