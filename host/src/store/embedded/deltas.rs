//! Delta batches of the embedded backend (the contract, docs/contract.md, section 12): one row
//! per batch in `deltas`, keyed by (dispatch, claim, first), its deltas framed in one blob.
//! Expired rows go with the sweeper's purge.

use async_trait::async_trait;
use bytes::Bytes;
use rusqlite::params;

use super::EmbeddedStore;
use super::rows::db;
use crate::store::StoreResult;
use crate::store::deltas::{
    Cursor, DeltaBatch, DeltaRead, Deltas, LiveBus, after_cursor, decode_chunks, encode_chunks,
};
use crate::store::rules::clamp;

/// Deletes the batches whose expiry passed (the sweeper's purge).
pub(super) fn delete_expired(tx: &rusqlite::Connection, now: u64) -> StoreResult<usize> {
    tx.prepare_cached("DELETE FROM deltas WHERE expires_at < ?1")
        .map_err(db)?
        .execute(params![clamp(now)])
        .map_err(db)
}

#[async_trait]
impl Deltas for EmbeddedStore {
    async fn persist(&self, batch: DeltaBatch) -> StoreResult<()> {
        if batch.chunks.is_empty() {
            return Ok(());
        }
        self.write(move |tx, now| {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO deltas \
                 (dispatch, claim, first, chunks, count, written_at, expires_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )
            .map_err(db)?
            .execute(params![
                batch.dispatch,
                batch.claim,
                clamp(batch.first),
                encode_chunks(&batch.chunks),
                batch.chunks.len() as i64,
                clamp(now),
                clamp(batch.expires_at)
            ])
            .map_err(db)?;
            Ok(())
        })
        .await
    }

    async fn read_deltas(&self, dispatch: &str, after: Cursor) -> StoreResult<DeltaRead> {
        let dispatch = dispatch.to_owned();
        self.read(move |tx| {
            let claim: Option<u32> = tx
                .prepare_cached("SELECT MAX(claim) FROM deltas WHERE dispatch = ?1")
                .map_err(db)?
                .query_row(params![dispatch], |row| row.get(0))
                .map_err(db)?;
            let Some(claim) = claim else {
                return Ok(DeltaRead::default());
            };
            let from = if claim > after.claim { 0 } else { after.seq };
            let mut stmt = tx
                .prepare_cached(
                    "SELECT first, chunks FROM deltas \
                     WHERE dispatch = ?1 AND claim = ?2 AND first + count > ?3 ORDER BY first",
                )
                .map_err(db)?;
            let mut rows = stmt
                .query(params![dispatch, claim, clamp(from)])
                .map_err(db)?;
            let mut batches = Vec::new();
            while let Some(row) = rows.next().map_err(db)? {
                let first: u64 = row.get(0).map_err(db)?;
                let chunks: Vec<u8> = row.get(1).map_err(db)?;
                let key = format!("deltas/{dispatch}/{claim}/{first}");
                batches.push((first, decode_chunks(&key, &Bytes::from(chunks))?));
            }
            Ok(after_cursor(claim, &batches, after))
        })
        .await
    }

    fn live_bus(&self) -> Option<std::sync::Arc<dyn LiveBus>> {
        None
    }
}
