//! The deltas of a dispatch (the contract, docs/contract.md, section 12): batches persisted
//! unfenced, replaced by (dispatch, claim, first), read after a cursor as the consecutive run
//! of the highest claim stored, seen by every instance, and gone once they expire.
//!
//! Time moves through the [`ManualClock`]; only expiry waits, with a deadline, for the NATS
//! server, which expires batches on its own clock.

use std::time::{Duration, Instant};

use bytes::Bytes;
use homing::store::{Cursor, DeltaBatch, DeltaRead};

use super::*;

/// A batch of `dispatch`'s claim `claim` from `first`, one delta per string, kept an hour.
fn batch(env_now: u64, dispatch: &str, claim: u32, first: u64, chunks: &[&str]) -> DeltaBatch {
    DeltaBatch {
        dispatch: dispatch.into(),
        claim,
        first,
        chunks: chunks
            .iter()
            .map(|c| Bytes::copy_from_slice(c.as_bytes()))
            .collect(),
        expires_at: env_now + 3_600_000,
    }
}

async fn persist(store: &Store, b: DeltaBatch) {
    let shown = format!("{}:{}:{}", b.dispatch, b.claim, b.first);
    store
        .deltas
        .persist(b)
        .await
        .unwrap_or_else(|err| panic!("persist {shown}: {err}"));
}

async fn read(store: &Store, dispatch: &str, claim: u32, seq: u64) -> DeltaRead {
    store
        .deltas
        .read_deltas(dispatch, Cursor::new(claim, seq))
        .await
        .unwrap_or_else(|err| panic!("read_deltas {dispatch} after {claim}:{seq}: {err}"))
}

/// `(claim, first, deltas)` of a read, the deltas as text.
fn shown(r: &DeltaRead) -> (u32, u64, Vec<String>) {
    (
        r.claim,
        r.first,
        r.chunks
            .iter()
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect(),
    )
}

fn texts(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// A read from 0:0 returns every delta of the claim; from the middle of a batch, the rest of
/// it and the batches after; at the end, nothing (from the next sequence); the same on
/// another instance. Binary and empty deltas come back as they were.
pub async fn deltas_read_by_cursor_from_the_start_mid_batch_at_the_end_and_across_batches<
    F: Factory,
>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let now = env.now();
    persist(&s, batch(now, "d1", 1, 1, &["a", "b", "c"])).await;
    persist(&s, batch(now, "d1", 1, 4, &["d"])).await;
    persist(&s, batch(now, "d1", 1, 5, &["e", "f"])).await;
    assert_eq!(
        shown(&read(&s, "d1", 0, 0).await),
        (1, 1, texts(&["a", "b", "c", "d", "e", "f"]))
    );
    assert_eq!(
        shown(&read(&s, "d1", 1, 0).await),
        (1, 1, texts(&["a", "b", "c", "d", "e", "f"]))
    );
    assert_eq!(
        shown(&read(&s, "d1", 1, 2).await),
        (1, 3, texts(&["c", "d", "e", "f"]))
    );
    assert_eq!(
        shown(&read(&s, "d1", 1, 3).await),
        (1, 4, texts(&["d", "e", "f"]))
    );
    assert_eq!(shown(&read(&s, "d1", 1, 5).await), (1, 6, texts(&["f"])));
    assert_eq!(shown(&read(&s, "d1", 1, 6).await), (1, 7, vec![]));
    assert_eq!(shown(&read(&s, "d1", 1, 60).await), (1, 61, vec![]));
    let other = env.open().await;
    assert_eq!(
        shown(&read(&other, "d1", 1, 2).await),
        (1, 3, texts(&["c", "d", "e", "f"]))
    );
    // Binary and empty deltas, and one at the delta size limit.
    let big = Bytes::from(binary(homing::store::deltas::MAX_DELTA, 3));
    persist(
        &s,
        DeltaBatch {
            dispatch: "d2".into(),
            claim: 1,
            first: 1,
            chunks: vec![Bytes::new(), Bytes::from(binary(100, 1)), big.clone()],
            expires_at: now + 3_600_000,
        },
    )
    .await;
    let r = read(&other, "d2", 0, 0).await;
    assert_eq!(
        r.chunks,
        vec![Bytes::new(), Bytes::from(binary(100, 1)), big],
        "deltas round trip byte for byte"
    );
}

/// The highest claim stored wins: its deltas hide every lower claim's; a cursor of a lower
/// claim gets the higher claim's from its first delta; a cursor of a claim higher than any
/// stored gets nothing. A lower claim persisting later (a zombie) changes none of that.
pub async fn a_higher_claims_deltas_hide_the_lower_claims<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let now = env.now();
    persist(&s, batch(now, "d1", 1, 1, &["a1", "b1", "c1"])).await;
    assert_eq!(
        shown(&read(&s, "d1", 1, 1).await),
        (1, 2, texts(&["b1", "c1"]))
    );
    persist(&s, batch(now, "d1", 2, 1, &["a2"])).await;
    assert_eq!(shown(&read(&s, "d1", 0, 0).await), (2, 1, texts(&["a2"])));
    // A watcher of claim 1 part way gets claim 2 from its first delta.
    assert_eq!(shown(&read(&s, "d1", 1, 2).await), (2, 1, texts(&["a2"])));
    assert_eq!(shown(&read(&s, "d1", 2, 0).await), (2, 1, texts(&["a2"])));
    assert_eq!(shown(&read(&s, "d1", 2, 1).await), (2, 2, vec![]));
    // The old holder goes on persisting under its own claim: hidden all the same.
    persist(&s, batch(now, "d1", 1, 4, &["d1"])).await;
    assert_eq!(shown(&read(&s, "d1", 1, 3).await), (2, 1, texts(&["a2"])));
    // A cursor ahead of everything stored (deltas not yet persisted) gets nothing.
    assert_eq!(shown(&read(&s, "d1", 3, 5).await), (2, 6, vec![]));
    let other = env.open().await;
    assert_eq!(
        shown(&read(&other, "d1", 1, 0).await),
        (2, 1, texts(&["a2"]))
    );
    // Claims are kept apart per dispatch.
    persist(&s, batch(now, "d2", 1, 1, &["x"])).await;
    assert_eq!(
        shown(&read(&other, "d2", 0, 0).await),
        (1, 1, texts(&["x"]))
    );
    assert_eq!(
        shown(&read(&other, "d1", 0, 0).await),
        (2, 1, texts(&["a2"]))
    );
}

/// A batch persisted again with the same dispatch, claim and first sequence replaces the
/// earlier one (a flush repeated after an error).
pub async fn a_batch_persisted_again_with_the_same_first_replaces_it<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let now = env.now();
    persist(&s, batch(now, "d1", 1, 1, &["a"])).await;
    persist(&s, batch(now, "d1", 1, 2, &["b"])).await;
    persist(&s, batch(now, "d1", 1, 2, &["b", "c"])).await;
    assert_eq!(
        shown(&read(&s, "d1", 0, 0).await),
        (1, 1, texts(&["a", "b", "c"]))
    );
    persist(&s, batch(now, "d1", 1, 1, &["A"])).await;
    let other = env.open().await;
    assert_eq!(
        shown(&read(&other, "d1", 0, 0).await),
        (1, 1, texts(&["A", "b", "c"]))
    );
}

/// A read stops at the first missing delta: what follows a gap is not handed out until the
/// gap is filled. An empty batch stores nothing.
pub async fn a_gap_stops_the_read<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let now = env.now();
    persist(&s, batch(now, "d1", 1, 1, &["a", "b"])).await;
    persist(&s, batch(now, "d1", 1, 5, &["e"])).await;
    assert_eq!(
        shown(&read(&s, "d1", 0, 0).await),
        (1, 1, texts(&["a", "b"]))
    );
    assert_eq!(shown(&read(&s, "d1", 1, 2).await), (1, 3, vec![]));
    persist(&s, batch(now, "d1", 1, 3, &[])).await;
    assert_eq!(shown(&read(&s, "d1", 1, 2).await), (1, 3, vec![]));
    persist(&s, batch(now, "d1", 1, 3, &["c", "d"])).await;
    assert_eq!(
        shown(&read(&s, "d1", 1, 1).await),
        (1, 2, texts(&["b", "c", "d", "e"]))
    );
    // A gap before the first stored batch of a claim: nothing from 0.
    persist(&s, batch(now, "d2", 1, 3, &["c"])).await;
    let r = read(&s, "d2", 0, 0).await;
    assert!(r.chunks.is_empty(), "{r:?}");
}

/// A dispatch with nothing stored reads as no claim, from the first delta, empty.
pub async fn an_unknown_dispatch_reads_no_deltas<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    persist(&s, batch(env.now(), "other", 1, 1, &["x"])).await;
    for cursor in [(0, 0), (1, 5)] {
        let r = read(&s, "missing", cursor.0, cursor.1).await;
        assert_eq!((r.claim, r.chunks.len()), (0, 0), "{r:?}");
    }
    // Names that are not subject tokens are still one dispatch each.
    persist(&s, batch(env.now(), "a.b *>", 1, 1, &["y"])).await;
    assert_eq!(
        shown(&read(&s, "a.b *>", 0, 0).await),
        (1, 1, texts(&["y"]))
    );
    assert_eq!(read(&s, "a", 0, 0).await.chunks.len(), 0);
}

/// A batch is gone once its expiry passed: the embedded store deletes it in the sweeper's
/// purge (`purge_terminal`), NATS expires it by its TTL on its own clock (polled here, with a
/// deadline). A batch not yet expired stays.
pub async fn deltas_go_when_they_expire<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let now = env.now();
    let mut short = batch(now, "short", 1, 1, &["a"]);
    short.expires_at = now + 1_000;
    persist(&s, short).await;
    persist(&s, batch(now, "long", 1, 1, &["b"])).await;
    assert_eq!(read(&s, "short", 0, 0).await.chunks.len(), 1);
    env.advance(1_001);
    s.mailbox.purge_terminal(env.now()).await.expect("purge");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = read(&s, "short", 0, 0).await;
        if r.chunks.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "an expired batch is still readable 10 s after its expiry: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(shown(&read(&s, "long", 0, 0).await), (1, 1, texts(&["b"])));
}
