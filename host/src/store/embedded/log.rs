//! The thread log of the embedded backend.
//!
//! An append reserves the next sequence, writes the entry and moves `latest`, all in one
//! transaction, so `reserved == latest` here: nothing is visible out of order or half-written,
//! and a failed append leaves no trace. The fence of a guest's append is checked against the
//! dispatch row and the thread's epoch in the same transaction, by the store's rules; a stale
//! one supersedes the dispatch the same way a stale holder write does.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::effects::store_superseded;
use super::lanes::thread_row;
use super::rows::{self, db};
use super::{EmbeddedStore, MAX_VALUE, MAX_VALUE_WHY, TxError};
use crate::store::check_size;
use crate::store::model::{EntryNote, Fence, LogEntry, Status, Watermarks};
use crate::store::rules::{self, ByteBudget, Fenced};
use crate::store::{SequenceStore, StoreError, StoreResult};

pub(super) fn marks(tx: &Connection, thread: &str) -> StoreResult<Watermarks> {
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

/// Appends `entry` (with the `note` of the message it records, as JSON) at the log's next
/// sequence and moves the watermarks `m` read in this transaction; returns the sequence.
pub(super) fn push_entry(
    tx: &Connection,
    thread: &str,
    m: &mut Watermarks,
    entry: &[u8],
    note: Option<&str>,
    now: u64,
) -> StoreResult<u64> {
    let seq = m.reserved.max(m.latest) + 1;
    tx.prepare_cached(
        "INSERT INTO log_entries (thread, seq, data, appended_at, note) VALUES (?1, ?2, ?3, ?4, ?5)",
    )
    .map_err(db)?
    .execute(params![thread, seq, entry, now, note])
    .map_err(db)?;
    m.reserved = seq;
    m.latest = seq;
    save_marks(tx, thread, *m)?;
    Ok(seq)
}

/// Checks a guest's fence as the rules say; a stale epoch supersedes the dispatch through the
/// shared supersede path (committed) and fails.
pub(super) fn check_fence(
    tx: &Connection,
    thread: &str,
    fence: &Fence,
    now: u64,
) -> Result<(), TxError> {
    let d = rows::load(tx, &fence.dispatch)?.map(|row| row.dispatch);
    let thread_epoch = match &d {
        Some(d) => thread_row(tx, &d.thread)?.epoch,
        None => 0,
    };
    match rules::check_fence(d.as_ref(), thread, fence, thread_epoch, now) {
        Fenced::Live => Ok(()),
        Fenced::Refuse(e) => Err(TxError::Abort(e)),
        Fenced::Supersede {
            record,
            token,
            error,
        } => {
            store_superseded(tx, Status::Claimed, &record, Some(&token))?;
            Err(TxError::Commit(error))
        }
    }
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
        let thread_name = thread.clone();
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
                Ok(push_entry(tx, thread, &mut m, entry, None, now)?)
            })
            .await;
        if matches!(out, Err(StoreError::StaleEpoch { .. })) {
            self.signal();
        }
        if out.is_ok() {
            self.inner.watches.notify(&thread_name);
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

    async fn read_within(
        &self,
        thread: &str,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> StoreResult<Vec<LogEntry>> {
        let thread = thread.to_owned();

        let limit = i64::try_from(crate::store::rules::log_read(limit)).unwrap_or(i64::MAX);
        let after = after.min(i64::MAX as u64);
        EmbeddedStore::read(self, move |tx| {
let thread = thread.as_str();

            let latest = marks(tx, thread)?.latest;
            let mut stmt = tx
                .prepare_cached(
                    "SELECT seq, data, appended_at, note FROM log_entries WHERE thread = ?1 AND seq > ?2 AND seq <= ?3 \
                     ORDER BY seq LIMIT ?4",
                )
                .map_err(db)?;
            let rows = stmt
                .query_map(params![thread, after, latest, limit], |row| {
                    Ok((
                        LogEntry {
                            seq: row.get(0)?,
                            data: row.get(1)?,
                            appended_at: row.get(2)?,
                            note: None,
                            turn: None,
                        },
                        row.get::<_, Option<String>>(3)?,
                    ))
                })
                .map_err(db)?;
            let corrupt = |seq: u64, reason: String| StoreError::Corrupt {
                key: format!("log_entries/{thread}/{seq}"),
                reason,
            };
            let mut out = Vec::new();
            // Rows are stepped one at a time: past the budget, the rest are never loaded.
            let mut budget = ByteBudget::new(Some(max_bytes));
            for row in rows {
                if !budget.open() {
                    break;
                }
                let (mut entry, note) = row.map_err(|e| corrupt(0, e.to_string()))?;
                budget.take(entry.data.len());
                if let Some(note) = note {
                    serde_json::from_str::<EntryNote>(&note)
                        .map_err(|e| corrupt(entry.seq, format!("note: {e}")))?
                        .set_on(&mut entry);
                }
                out.push(entry);
            }
            Ok(out)
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::store::{Mailbox, ManualClock, NewDispatch, Status};

    /// Reads the thread's holder column and whether its lane is marked busy.
    async fn hold_of(store: &EmbeddedStore, thread: &str) -> (Option<String>, bool) {
        let thread = thread.to_owned();
        store
            .write(move |tx, _| {
                let holder = tx.query_row(
                    "SELECT holder FROM threads WHERE thread = ?1",
                    params![thread],
                    |row| row.get::<_, Option<String>>(0),
                )?;
                let busy = tx.query_row(
                    "SELECT busy FROM lanes WHERE thread = ?1",
                    params![thread],
                    |row| row.get::<_, bool>(0),
                )?;
                Ok((holder, busy))
            })
            .await
            .unwrap()
    }

    /// A stale fence supersedes its dispatch through the shared supersede path: the thread's
    /// hold is released only when this dispatch has it. A scheduling table that names another
    /// holder (a hand-edited file; nothing the store does leads there) keeps its lane busy,
    /// where a blanket `busy = 0` would have freed a thread someone else holds.
    #[tokio::test]
    async fn a_stale_fence_releases_only_its_own_hold() {
        let store = EmbeddedStore::open_in_memory(ManualClock::new(1_000)).unwrap();
        let put = |id: &str| NewDispatch::new("agent", "t", b"p".to_vec()).with_id(id);
        store.enqueue(put("d1")).await.unwrap();
        let d1 = store.claim("agent", "w", 60_000).await.unwrap().unwrap();
        let fence = Fence::of(&d1).unwrap();
        store.interrupt("t", "stop").await.unwrap();
        store.enqueue(put("d2")).await.unwrap();
        assert_eq!(hold_of(&store, "t").await, (Some("d1".into()), true));
        store
            .write(|tx, _| {
                tx.execute("UPDATE threads SET holder = 'other' WHERE thread = 't'", [])?;
                Ok(())
            })
            .await
            .unwrap();

        let refused = store.append("t", b"zombie", Some(&fence)).await;
        assert!(
            matches!(refused, Err(StoreError::StaleEpoch { .. })),
            "{refused:?}"
        );
        assert_eq!(
            store.load("d1").await.unwrap().unwrap().status,
            Status::Superseded
        );
        assert_eq!(hold_of(&store, "t").await, (Some("other".into()), true));
    }

    /// The same path, when the stale dispatch does hold its thread: the hold is released and
    /// the thread's next queued dispatch is claimable at once.
    #[tokio::test]
    async fn a_stale_fence_frees_its_own_thread() {
        let store = EmbeddedStore::open_in_memory(ManualClock::new(1_000)).unwrap();
        let put = |id: &str| NewDispatch::new("agent", "t", b"p".to_vec()).with_id(id);
        store.enqueue(put("d1")).await.unwrap();
        let d1 = store.claim("agent", "w", 60_000).await.unwrap().unwrap();
        let fence = Fence::of(&d1).unwrap();
        store.interrupt("t", "stop").await.unwrap();
        store.enqueue(put("d2")).await.unwrap();
        assert!(store.append("t", b"zombie", Some(&fence)).await.is_err());
        assert_eq!(hold_of(&store, "t").await, (None, false));
        let d2 = store.claim("agent", "w", 60_000).await.unwrap().unwrap();
        assert_eq!((d2.id.as_str(), d2.epoch), ("d2", 1));
    }
}
