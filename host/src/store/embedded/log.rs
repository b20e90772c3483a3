//! The thread log of the embedded backend.
//!
//! An append reserves the next sequence, writes the entry and moves `latest`, all in one
//! transaction, so `reserved == latest` here: nothing is visible out of order or half-written,
//! and a failed append leaves no trace. The fence of a guest's append is checked against the
//! dispatch row and the thread's epoch in the same transaction.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::rows::{self, db};
use super::{EmbeddedStore, MAX_VALUE, MAX_VALUE_WHY, TxError};
use crate::store::check_size;
use crate::store::model::{Fence, LogEntry, Status, Watermarks};
use crate::store::{REASON_STALE_EPOCH, SequenceStore, StoreError, StoreResult};

/// The page size of `read` when the caller gives 0.
const DEFAULT_READ: usize = 1000;

fn marks(tx: &Connection, thread: &str) -> StoreResult<Watermarks> {
    let row = tx
        .prepare_cached("SELECT reserved, latest, trimmed FROM log_marks WHERE thread = ?1")
        .map_err(db)?
        .query_row(params![thread], |row| {
            Ok(Watermarks {
                reserved: row.get(0)?,
                latest: row.get(1)?,
                trimmed: row.get(2)?,
            })
        })
        .optional()
        .map_err(db)?;
    let marks = row.unwrap_or_default();
    if !(marks.reserved >= marks.latest && marks.latest >= marks.trimmed) {
        return Err(StoreError::Corrupt {
            key: format!("log_marks/{thread}"),
            reason: format!(
                "watermarks out of order (reserved {}, latest {}, trimmed {})",
                marks.reserved, marks.latest, marks.trimmed
            ),
        });
    }
    Ok(marks)
}

fn save_marks(tx: &Connection, thread: &str, m: Watermarks) -> StoreResult<()> {
    tx.prepare_cached(
        "INSERT INTO log_marks (thread, reserved, latest, trimmed) VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT (thread) DO UPDATE SET reserved = excluded.reserved, latest = excluded.latest, \
         trimmed = excluded.trimmed",
    )
    .map_err(db)?
    .execute(params![thread, m.reserved, m.latest, m.trimmed])
    .map_err(db)?;
    Ok(())
}

/// Checks a guest's fence: the dispatch is claimed by this token, on this thread, at a
/// current epoch. A stale epoch supersedes the dispatch (committed) and fails.
fn check_fence(tx: &Connection, thread: &str, fence: &Fence, now: u64) -> Result<(), TxError> {
    let Some(row) = rows::load(tx, &fence.dispatch)? else {
        return Err(StoreError::NotFound {
            id: fence.dispatch.clone(),
        }
        .into());
    };
    let d = row.dispatch;
    let Some(claim) = &d.claim else {
        return Err(StoreError::NotClaimed {
            id: d.id.clone(),
            status: d.status,
        }
        .into());
    };
    // A fenced append needs a live lease (`lease_until >= now`): once it runs out, another
    // holder may be one reclaim away, and the log must not take the old holder's writes.
    if claim.token != fence.token || d.epoch != fence.epoch || claim.lease_until < now {
        return Err(StoreError::LostClaim { id: d.id.clone() }.into());
    }
    if d.thread != thread {
        return Err(StoreError::Invalid(format!(
            "dispatch `{}` belongs to thread `{}`, not `{thread}`",
            d.id, d.thread
        ))
        .into());
    }
    let thread_epoch: u64 = tx
        .prepare_cached("SELECT epoch FROM threads WHERE thread = ?1")
        .map_err(db)?
        .query_row(params![thread], |row| row.get(0))
        .optional()
        .map_err(db)?
        .unwrap_or(0);
    if d.epoch < thread_epoch {
        let (id, epoch, token) = (d.id.clone(), d.epoch, claim.token.clone());
        let mut d = d;
        d.status = Status::Superseded;
        d.claim = None;
        d.started_at = None;
        d.result = None;
        d.completed_at = Some(now);
        d.updated_at = now;
        d.last_error = Some(REASON_STALE_EPOCH.to_owned());
        rows::store(tx, &d, false, Some((&token, "supersede")))?;
        tx.prepare_cached("UPDATE threads SET holder = NULL WHERE thread = ?1 AND holder = ?2")
            .map_err(db)?
            .execute(params![thread, id])
            .map_err(db)?;
        tx.prepare_cached("UPDATE lanes SET busy = 0 WHERE thread = ?1")
            .map_err(db)?
            .execute(params![thread])
            .map_err(db)?;
        return Err(TxError::Commit(StoreError::StaleEpoch {
            id,
            dispatch: epoch,
            thread: thread_epoch,
        }));
    }
    Ok(())
}

impl EmbeddedStore {
    async fn append_inner(
        &self,
        thread: &str,
        entry: &[u8],
        expected: Option<u64>,
        fence: Option<&Fence>,
    ) -> StoreResult<u64> {
        if thread.trim().is_empty() {
            return Err(StoreError::Invalid("thread is blank".into()));
        }
        check_size("entry", entry, MAX_VALUE, MAX_VALUE_WHY)?;
        let thread = thread.to_owned();
        let entry = entry.to_vec();
        let fence = fence.cloned();

        let out = self
            .write(move |tx, now| {
                let thread = thread.as_str();
                let entry = entry.as_slice();
                let fence = fence.as_ref();

                if let Some(fence) = fence {
                    check_fence(tx, thread, fence, now)?;
                }
                let mut m = marks(tx, thread)?;
                if let Some(expected) = expected
                    && m.latest != expected
                {
                    return Err(StoreError::Conflict { latest: m.latest }.into());
                }
                let seq = m.reserved.max(m.latest) + 1;
                tx.prepare_cached(
                "INSERT INTO log_entries (thread, seq, data, appended_at) VALUES (?1, ?2, ?3, ?4)",
            )
            .map_err(db)?
            .execute(params![thread, seq, entry, now])
            .map_err(db)?;
                m.reserved = seq;
                m.latest = seq;
                save_marks(tx, thread, m)?;
                Ok(seq)
            })
            .await;
        if matches!(out, Err(StoreError::StaleEpoch { .. })) {
            self.signal();
        }
        out
    }
}

#[async_trait]
impl SequenceStore for EmbeddedStore {
    async fn append(&self, thread: &str, entry: &[u8], fence: Option<&Fence>) -> StoreResult<u64> {
        self.append_inner(thread, entry, None, fence).await
    }

    async fn append_expected(
        &self,
        thread: &str,
        entry: &[u8],
        expected_latest: u64,
        fence: Option<&Fence>,
    ) -> StoreResult<u64> {
        self.append_inner(thread, entry, Some(expected_latest), fence)
            .await
    }

    async fn read(&self, thread: &str, after: u64, limit: usize) -> StoreResult<Vec<LogEntry>> {
        let thread = thread.to_owned();

        let limit =
            i64::try_from(if limit == 0 { DEFAULT_READ } else { limit }).unwrap_or(i64::MAX);
        let after = after.min(i64::MAX as u64);
        EmbeddedStore::read(self, move |tx| {
let thread = thread.as_str();

            let latest = marks(tx, thread)?.latest;
            let mut stmt = tx
                .prepare_cached(
                    "SELECT seq, data, appended_at FROM log_entries WHERE thread = ?1 AND seq > ?2 AND seq <= ?3 \
                     ORDER BY seq LIMIT ?4",
                )
                .map_err(db)?;
            let rows = stmt
                .query_map(params![thread, after, latest, limit], |row| {
                    Ok(LogEntry {
                        seq: row.get(0)?,
                        data: row.get(1)?,
                        appended_at: row.get(2)?,
                    })
                })
                .map_err(db)?;
            rows.collect::<Result<_, _>>()
                .map_err(|e| StoreError::Corrupt {
                    key: format!("log_entries/{thread}"),
                    reason: e.to_string(),
                })
        }).await
    }

    async fn latest(&self, thread: &str) -> StoreResult<u64> {
        let thread = thread.to_owned();

        EmbeddedStore::read(self, move |tx| {
            let thread = thread.as_str();
            Ok(marks(tx, thread)?.latest)
        })
        .await
    }

    async fn watermarks(&self, thread: &str) -> StoreResult<Watermarks> {
        let thread = thread.to_owned();

        EmbeddedStore::read(self, move |tx| {
            let thread = thread.as_str();
            marks(tx, thread)
        })
        .await
    }

    async fn trim(&self, thread: &str, up_to: u64) -> StoreResult<()> {
        let thread = thread.to_owned();

        self.write(move |tx, _| {
            let thread = thread.as_str();

            let mut m = marks(tx, thread)?;
            let cut = up_to.min(m.latest);
            if cut <= m.trimmed {
                return Ok(());
            }
            tx.prepare_cached("DELETE FROM log_entries WHERE thread = ?1 AND seq <= ?2")
                .map_err(db)?
                .execute(params![thread, cut])
                .map_err(db)?;
            m.trimmed = cut;
            save_marks(tx, thread, m)?;
            Ok(())
        })
        .await
    }

    async fn delete(&self, thread: &str) -> StoreResult<()> {
        let thread = thread.to_owned();

        self.write(move |tx, _| {
            let thread = thread.as_str();

            let mut m = marks(tx, thread)?;
            tx.prepare_cached("DELETE FROM log_entries WHERE thread = ?1")
                .map_err(db)?
                .execute(params![thread])
                .map_err(db)?;
            if m.latest > 0 {
                m.trimmed = m.latest;
                save_marks(tx, thread, m)?;
            }
            Ok(())
        })
        .await
    }

    fn max_entry(&self) -> u64 {
        MAX_VALUE
    }
}
