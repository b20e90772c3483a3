//! Deltas: what a running claim streamed (`emit`), kept so watchers on any host, and watchers
//! that reconnect, can catch up (the contract, docs/contract.md, section 12).
//!
//! Live delivery does not go through the store: the host that runs a claim keeps its deltas
//! in memory and hands them to its own watchers at once (the live hub, a layer above the store), and
//! on NATS publishes them on a core subject ([`LiveBus`]) for watchers on other hosts. What
//! the store keeps are **batches**: runs of consecutive deltas of one claim that the running
//! host persists every 100 ms, at 64 KiB and before the claim settles. Deltas are advisory:
//! batches are not fenced, and deltas not yet persisted when a host dies are lost; the durable
//! record of a run stays its result and its thread log.
//!
//! A watcher's position is a [`Cursor`]: the claim number (the dispatch's `claims` when it
//! was claimed) and the sequence of the last delta it has, within that claim (the first delta
//! of a claim is 1). A later claim (a retry, a resume) starts again at 1; readers order claims
//! by number, so a higher claim means "drop what the earlier one streamed".

use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::BoxStream;

use super::{StoreError, StoreResult};

/// The largest delta (bytes).
pub const MAX_DELTA: usize = 64 * 1024;

/// A watcher's position in a dispatch's deltas: `claim:seq` on the wire.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cursor {
    /// The claim number (0: none seen yet).
    pub claim: u32,
    /// The last delta had, within the claim (0: none).
    pub seq: u64,
}

impl Cursor {
    /// `claim:seq`.
    pub fn new(claim: u32, seq: u64) -> Cursor {
        Cursor { claim, seq }
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.claim, self.seq)
    }
}

impl FromStr for Cursor {
    type Err = String;

    fn from_str(s: &str) -> Result<Cursor, String> {
        let bad = || {
            format!(
                "`{}` is not a stream position (`claim:seq`)",
                s.escape_debug()
            )
        };
        let (claim, seq) = s.trim().split_once(':').ok_or_else(bad)?;
        Ok(Cursor {
            claim: claim.parse().map_err(|_| bad())?,
            seq: seq.parse().map_err(|_| bad())?,
        })
    }
}

/// Consecutive deltas of one claim, as persisted or published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaBatch {
    /// The dispatch that streamed them.
    pub dispatch: String,
    /// Its claim number.
    pub claim: u32,
    /// The sequence of the first delta.
    pub first: u64,
    /// The deltas, in order.
    pub chunks: Vec<Bytes>,
    /// When the store may forget the batch (Unix ms).
    pub expires_at: u64,
}

impl DeltaBatch {
    /// The sequence of the last delta (`first - 1` when empty).
    pub fn last(&self) -> u64 {
        (self.first + self.chunks.len() as u64).saturating_sub(1)
    }
}

/// What [`Deltas::read_deltas`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeltaRead {
    /// The highest claim with stored deltas (0: none).
    pub claim: u32,
    /// The sequence of the first of `chunks`.
    pub first: u64,
    /// The consecutive deltas of `claim` after the cursor (all of them when `claim` is higher
    /// than the cursor's), up to the first missing one.
    pub chunks: Vec<Bytes>,
}

/// The stored batches of deltas.
#[async_trait]
pub trait Deltas: Send + Sync + fmt::Debug + 'static {
    /// Stores `batch`, replacing a batch with the same dispatch, claim and first sequence. Not
    /// fenced: a zombie's deltas are stored under its own (lower) claim number.
    async fn persist(&self, batch: DeltaBatch) -> StoreResult<()>;

    /// The deltas of the highest claim of `dispatch` stored, after `after` when that is the
    /// same claim (from its first delta when the stored claim is higher). Empty when nothing
    /// is stored, or only deltas of claims lower than the cursor's.
    async fn read_deltas(&self, dispatch: &str, after: Cursor) -> StoreResult<DeltaRead>;

    /// Where deltas travel live between hosts (`None`: one host only, the embedded store).
    fn live_bus(&self) -> Option<std::sync::Arc<dyn LiveBus>>;
}

/// Live deltas between hosts, never stored (NATS core subjects).
#[async_trait]
pub trait LiveBus: Send + Sync + fmt::Debug + 'static {
    /// Publishes `batch` to the dispatch's watchers on other hosts; best effort, never waits
    /// for them.
    fn publish(&self, batch: &DeltaBatch);

    /// The batches published for `dispatch` from now on.
    ///
    /// # Errors
    ///
    /// `Unavailable` when the subscription cannot be made.
    async fn subscribe(&self, dispatch: &str) -> StoreResult<BoxStream<'static, DeltaBatch>>;
}

/// The deltas of a batch as one byte string: each a `u32` little-endian length and its bytes.
pub fn encode_chunks(chunks: &[Bytes]) -> Vec<u8> {
    let mut out = Vec::with_capacity(chunks.iter().map(|c| c.len() + 4).sum());
    for c in chunks {
        // A delta is at most MAX_DELTA bytes, so its length fits a u32.
        out.extend_from_slice(&(c.len() as u32).to_le_bytes());
        out.extend_from_slice(c);
    }
    out
}

/// The deltas of [`encode_chunks`]'s output.
///
/// # Errors
///
/// `Corrupt` (naming `key`) when the bytes are not a sequence of framed deltas.
pub fn decode_chunks(key: &str, bytes: &Bytes) -> StoreResult<Vec<Bytes>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let len = bytes
            .get(at..at + 4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(u32::from_le_bytes)
            .ok_or_else(|| corrupt(key, "a delta's length is cut short"))?
            as usize;
        at += 4;
        if len > MAX_DELTA || at + len > bytes.len() {
            return Err(corrupt(key, "a delta runs past the end of its batch"));
        }
        out.push(bytes.slice(at..at + len));
        at += len;
    }
    Ok(out)
}

/// A batch as one message of the live bus: claim (`u32`), first (`u64`), then the deltas as
/// [`encode_chunks`] writes them, all little-endian.
pub fn encode_live(batch: &DeltaBatch) -> Vec<u8> {
    let mut out = Vec::with_capacity(12);
    out.extend_from_slice(&batch.claim.to_le_bytes());
    out.extend_from_slice(&batch.first.to_le_bytes());
    out.extend_from_slice(&encode_chunks(&batch.chunks));
    out
}

/// The batch of [`encode_live`]'s output (`dispatch` as given, no expiry).
///
/// # Errors
///
/// `Corrupt` when the bytes are not such a message.
pub fn decode_live(dispatch: &str, bytes: &Bytes) -> StoreResult<DeltaBatch> {
    let key = format!("live/{dispatch}");
    let head = |range: std::ops::Range<usize>| {
        bytes
            .get(range)
            .ok_or_else(|| corrupt(&key, "the live message is cut short"))
    };
    let claim = u32::from_le_bytes(head(0..4)?.try_into().map_err(|_| corrupt(&key, "claim"))?);
    let first = u64::from_le_bytes(
        head(4..12)?
            .try_into()
            .map_err(|_| corrupt(&key, "first"))?,
    );
    Ok(DeltaBatch {
        dispatch: dispatch.to_owned(),
        claim,
        first,
        chunks: decode_chunks(&key, &bytes.slice(12..))?,
        expires_at: 0,
    })
}

/// The deltas after `after` among `batches` of one claim (sorted by first sequence): the
/// consecutive run that starts right after the cursor (or at the claim's first delta when the
/// claim is higher than the cursor's), up to the first gap.
pub fn after_cursor(claim: u32, batches: &[(u64, Vec<Bytes>)], after: Cursor) -> DeltaRead {
    let from = if claim > after.claim { 0 } else { after.seq };
    let mut read = DeltaRead {
        claim,
        first: from + 1,
        chunks: Vec::new(),
    };
    if claim < after.claim {
        return read;
    }
    let mut next = from + 1;
    for (first, chunks) in batches {
        let last = first + chunks.len() as u64; // one past
        if last <= next {
            continue;
        }
        if *first > next {
            break;
        }
        let skip = (next - first) as usize;
        read.chunks.extend(chunks.iter().skip(skip).cloned());
        next = last;
    }
    read
}

fn corrupt(key: &str, reason: &str) -> StoreError {
    StoreError::Corrupt {
        key: key.to_owned(),
        reason: reason.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn chunks_round_trip_and_refuse_truncation() {
        let chunks = vec![b("he"), b(""), b("llo")];
        let bytes = Bytes::from(encode_chunks(&chunks));
        assert_eq!(decode_chunks("k", &bytes).unwrap(), chunks);
        assert!(decode_chunks("k", &bytes.slice(..bytes.len() - 1)).is_err());
        assert!(decode_chunks("k", &bytes.slice(..2)).is_err());
    }

    #[test]
    fn live_messages_round_trip() {
        let batch = DeltaBatch {
            dispatch: "d".into(),
            claim: 3,
            first: 7,
            chunks: vec![b("a"), b("bc")],
            expires_at: 0,
        };
        let bytes = Bytes::from(encode_live(&batch));
        assert_eq!(decode_live("d", &bytes).unwrap(), batch);
        assert!(decode_live("d", &bytes.slice(..5)).is_err());
        assert_eq!(batch.last(), 8);
    }

    #[test]
    fn cursors_parse_and_print() {
        let c: Cursor = "2:15".parse().unwrap();
        assert_eq!(c, Cursor::new(2, 15));
        assert_eq!(c.to_string(), "2:15");
        for bad in ["", "2", "x:1", "1:-1", "1:2:3"] {
            assert!(bad.parse::<Cursor>().is_err(), "{bad}");
        }
    }

    #[test]
    fn after_cursor_takes_the_consecutive_run() {
        let batches = vec![
            (1, vec![b("a"), b("b")]),
            (3, vec![b("c")]),
            (5, vec![b("e")]), // 4 is missing
        ];
        let r = after_cursor(1, &batches, Cursor::new(1, 1));
        assert_eq!((r.first, r.chunks), (2, vec![b("b"), b("c")]));
        let r = after_cursor(2, &batches, Cursor::new(1, 1));
        assert_eq!((r.claim, r.first, r.chunks.len()), (2, 1, 3));
        let r = after_cursor(1, &batches, Cursor::new(2, 0));
        assert!(r.chunks.is_empty());
        let r = after_cursor(1, &batches, Cursor::new(1, 3));
        assert!(r.chunks.is_empty(), "4 is missing, so 5 is not handed out");
    }
}
