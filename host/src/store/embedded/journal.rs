//! The journals of the embedded backend (the contract, docs/contract.md, section 11).
//!
//! Call entries live in `journal`, one row per (dispatch, position); steps in
//! `journal_steps`, one row per (dispatch, key). Every write is one transaction on the writer
//! thread that checks the claim's fence first, so a refused write stores nothing; a journaled
//! append writes the log entry and its journal row in the same transaction.

use async_trait::async_trait;
use rusqlite::{Connection, Row, params};

use super::log::{marks, push_entry};
use super::rows::db;
use super::{EmbeddedStore, MAX_VALUE, MAX_VALUE_WHY};
use crate::store::journal::{
    CallEntry, CallSummary, Cheap, Journal, JournalAsk, JournalData, JournalPage, NewStep, Step,
    check_entry, step_held,
};
use crate::store::model::Fence;
use crate::store::rules::clamp;
use crate::store::{StoreError, StoreResult, check_size};

const CALL_COLUMNS: &str = "dispatch, pos, kind, identity, answer, body, claim, attempt, \
    recorded_at, duration_us, size, cheap";

/// [`CALL_COLUMNS`] as a listing selects them: the body's length instead of the body, no
/// cheap values. SQLite answers `length()` of a blob from the record's header, so no body is
/// read into memory (a body's overflow pages are only walked to reach the columns after it).
const SUMMARY_COLUMNS: &str = "dispatch, pos, kind, identity, answer, length(body), claim, \
    attempt, recorded_at, duration_us, size, NULL";

fn corrupt(key: String, reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        key,
        reason: reason.into(),
    }
}

fn decode_call(row: &Row<'_>) -> StoreResult<CallEntry> {
    decode_row(row, false)
}

/// A row selected with [`SUMMARY_COLUMNS`].
fn decode_summary(row: &Row<'_>) -> StoreResult<CallSummary> {
    let body_size: Option<u64> = row.get(5).map_err(|e| {
        corrupt(
            format!("journal/{}", row.get::<_, String>(0).unwrap_or_default()),
            e.to_string(),
        )
    })?;
    Ok(CallSummary {
        entry: decode_row(row, true)?,
        body_size,
    })
}

/// A row selected with [`CALL_COLUMNS`], or with [`SUMMARY_COLUMNS`] when `summary` (no body).
fn decode_row(row: &Row<'_>, summary: bool) -> StoreResult<CallEntry> {
    let dispatch: String = row
        .get(0)
        .map_err(|e| corrupt("journal/?".into(), e.to_string()))?;
    let pos: u32 = row
        .get(1)
        .map_err(|e| corrupt(format!("journal/{dispatch}"), e.to_string()))?;
    let key = || format!("journal/{dispatch}/{pos}");
    let field = |e: rusqlite::Error| corrupt(key(), e.to_string());
    let kind: String = row.get(2).map_err(field)?;
    let identity: Vec<u8> = row.get(3).map_err(field)?;
    let answer: String = row.get(4).map_err(field)?;
    let cheap: Option<Vec<u8>> = row.get(11).map_err(field)?;
    let cheap = match cheap {
        Some(json) => {
            serde_json::from_slice(&json).map_err(|e| corrupt(key(), format!("cheap: {e}")))?
        }
        None => Cheap::default(),
    };
    Ok(CallEntry {
        cheap,
        kind: kind.parse().map_err(|e: String| corrupt(key(), e))?,
        identity: String::from_utf8(identity).map_err(|e| corrupt(key(), e.to_string()))?,
        answer: serde_json::from_str(&answer)
            .map_err(|e| corrupt(key(), format!("answer: {e}")))?,
        body: if summary {
            None
        } else {
            row.get(5).map_err(field)?
        },
        claim: row.get(6).map_err(field)?,
        attempt: row.get(7).map_err(field)?,
        recorded_at: row.get(8).map_err(field)?,
        duration_us: row.get(9).map_err(field)?,
        size: row.get(10).map_err(field)?,
        dispatch,
        pos,
    })
}

fn decode_step(row: &Row<'_>) -> StoreResult<Step> {
    let dispatch: String = row
        .get(0)
        .map_err(|e| corrupt("journal_steps/?".into(), e.to_string()))?;
    let field = |e: rusqlite::Error| corrupt(format!("journal_steps/{dispatch}"), e.to_string());
    Ok(Step {
        key: row.get(1).map_err(field)?,
        value: row.get(2).map_err(field)?,
        claim: row.get(3).map_err(field)?,
        attempt: row.get(4).map_err(field)?,
        recorded_at: row.get(5).map_err(field)?,
        size: row.get(6).map_err(field)?,
        dispatch,
    })
}

/// Stores `entry` (recorded at `now`) at its position, replacing what was there.
fn save_call(tx: &Connection, entry: &CallEntry, now: u64) -> StoreResult<()> {
    let answer = serde_json::to_string(&entry.answer)
        .map_err(|e| StoreError::Invalid(format!("answer: {e}")))?;
    let cheap = if entry.cheap.is_empty() {
        None
    } else {
        Some(
            serde_json::to_vec(&entry.cheap)
                .map_err(|e| StoreError::Invalid(format!("cheap: {e}")))?,
        )
    };
    tx.prepare_cached(&format!(
        "INSERT OR REPLACE INTO journal ({CALL_COLUMNS}) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
    ))
    .map_err(db)?
    .execute(params![
        entry.dispatch,
        entry.pos,
        entry.kind.as_str(),
        entry.identity.as_bytes(),
        answer,
        entry.body,
        entry.claim,
        entry.attempt,
        clamp(now),
        clamp(entry.duration_us),
        clamp(entry.size),
        cheap,
    ])
    .map_err(db)?;
    Ok(())
}

/// Deletes the journal of a purged dispatch (T16).
pub(super) fn delete_journal(tx: &Connection, dispatch: &str) -> StoreResult<()> {
    for sql in [
        "DELETE FROM journal WHERE dispatch = ?1",
        "DELETE FROM journal_steps WHERE dispatch = ?1",
    ] {
        tx.prepare_cached(sql)
            .map_err(db)?
            .execute(params![dispatch])
            .map_err(db)?;
    }
    Ok(())
}

#[async_trait]
impl Journal for EmbeddedStore {
    async fn load_journal(&self, dispatch: &str) -> StoreResult<JournalData> {
        let dispatch = dispatch.to_owned();
        self.read(move |tx| {
            let mut calls = Vec::new();
            {
                let mut stmt = tx
                    .prepare_cached(&format!(
                        "SELECT {CALL_COLUMNS} FROM journal WHERE dispatch = ?1 ORDER BY pos"
                    ))
                    .map_err(db)?;
                let mut rows = stmt.query(params![dispatch]).map_err(db)?;
                while let Some(row) = rows.next().map_err(db)? {
                    calls.push(decode_call(row)?);
                }
            }
            let mut steps = Vec::new();
            let mut stmt = tx
                .prepare_cached(
                    "SELECT dispatch, key, value, claim, attempt, recorded_at, size \
                     FROM journal_steps WHERE dispatch = ?1 ORDER BY key",
                )
                .map_err(db)?;
            let mut rows = stmt.query(params![dispatch]).map_err(db)?;
            while let Some(row) = rows.next().map_err(db)? {
                steps.push(decode_step(row)?);
            }
            Ok(JournalData { calls, steps })
        })
        .await
    }

    async fn journal_page(&self, dispatch: &str, ask: &JournalAsk) -> StoreResult<JournalPage> {
        let (dispatch, ask) = (dispatch.to_owned(), *ask);
        self.read(move |tx| {
            let mut page = JournalPage::default();
            // One row past the limit says whether more remain.
            let after = ask.after.map_or(-1, i64::from);
            let rows = i64::try_from(ask.limit.saturating_add(1)).unwrap_or(i64::MAX);
            let mut held = 0;
            {
                let mut stmt = tx
                    .prepare_cached(&format!(
                        "SELECT {SUMMARY_COLUMNS} FROM journal \
                         WHERE dispatch = ?1 AND pos > ?2 ORDER BY pos LIMIT ?3"
                    ))
                    .map_err(db)?;
                let mut found = stmt.query(params![dispatch, after, rows]).map_err(db)?;
                while let Some(row) = found.next().map_err(db)? {
                    let call = decode_summary(row)?;
                    let size = call.held();
                    if page.calls.len() >= ask.limit.max(1)
                        || (!page.calls.is_empty() && held + size > ask.max_bytes)
                    {
                        page.more = true;
                        break;
                    }
                    held += size;
                    page.calls.push(call);
                }
            }
            if ask.max_step_bytes > 0 {
                let mut stmt = tx
                    .prepare_cached(
                        "SELECT dispatch, key, X'', claim, attempt, recorded_at, size \
                         FROM journal_steps WHERE dispatch = ?1 ORDER BY key",
                    )
                    .map_err(db)?;
                let mut found = stmt.query(params![dispatch]).map_err(db)?;
                let mut held = 0;
                while let Some(row) = found.next().map_err(db)? {
                    let step = decode_step(row)?;
                    let size = step_held(&step);
                    if !page.steps.is_empty() && held + size > ask.max_step_bytes {
                        page.more_steps = true;
                        break;
                    }
                    held += size;
                    page.steps.push(step);
                }
            }
            let totals = |table: &str| -> StoreResult<(u64, u64)> {
                tx.prepare_cached(&format!(
                    "SELECT count(*), coalesce(sum(size), 0) FROM {table} WHERE dispatch = ?1"
                ))
                .map_err(db)?
                .query_row(params![dispatch], |row| Ok((row.get(0)?, row.get(1)?)))
                .map_err(db)
            };
            let (calls, call_bytes) = totals("journal")?;
            let (steps, step_bytes) = totals("journal_steps")?;
            page.call_count = calls;
            page.step_count = steps;
            page.bytes = call_bytes.saturating_add(step_bytes);
            Ok(page)
        })
        .await
    }

    async fn call_summary(&self, dispatch: &str, pos: u32) -> StoreResult<Option<CallSummary>> {
        let dispatch = dispatch.to_owned();
        self.read(move |tx| {
            let mut stmt = tx
                .prepare_cached(&format!(
                    "SELECT {SUMMARY_COLUMNS} FROM journal WHERE dispatch = ?1 AND pos = ?2"
                ))
                .map_err(db)?;
            let mut found = stmt.query(params![dispatch, pos]).map_err(db)?;
            match found.next().map_err(db)? {
                Some(row) => Ok(Some(decode_summary(row)?)),
                None => Ok(None),
            }
        })
        .await
    }

    async fn call_entry(&self, dispatch: &str, pos: u32) -> StoreResult<Option<CallEntry>> {
        let dispatch = dispatch.to_owned();
        self.read(move |tx| {
            let mut stmt = tx
                .prepare_cached(&format!(
                    "SELECT {CALL_COLUMNS} FROM journal WHERE dispatch = ?1 AND pos = ?2"
                ))
                .map_err(db)?;
            let mut found = stmt.query(params![dispatch, pos]).map_err(db)?;
            match found.next().map_err(db)? {
                Some(row) => Ok(Some(decode_call(row)?)),
                None => Ok(None),
            }
        })
        .await
    }

    async fn record(&self, fence: &Fence, entry: CallEntry) -> StoreResult<()> {
        check_entry(fence, &entry, MAX_VALUE, MAX_VALUE_WHY)?;
        if entry.kind.is_append() {
            return Err(StoreError::Invalid(format!(
                "kind: a `{}` entry is recorded with its append (record_append)",
                entry.kind
            )));
        }
        let fence = fence.clone();
        let out = self
            .write(move |tx, now| {
                EmbeddedStore::fenced(tx, &fence, now)?;
                Ok(save_call(tx, &entry, now)?)
            })
            .await;
        self.after_fenced(&out);
        out
    }

    async fn record_append(
        &self,
        fence: &Fence,
        mut entry: CallEntry,
        data: &[u8],
        expected: Option<u64>,
    ) -> StoreResult<u64> {
        check_entry(fence, &entry, MAX_VALUE, MAX_VALUE_WHY)?;
        check_size("entry", data, MAX_VALUE, MAX_VALUE_WHY)?;
        let (fence, data) = (fence.clone(), data.to_vec());
        let out = self
            .write(move |tx, now| {
                let (d, _) = EmbeddedStore::fenced(tx, &fence, now)?;
                let mut m = marks(tx, &d.thread)?;
                if let Some(expected) = expected
                    && m.latest != expected
                {
                    return Err(StoreError::Conflict { latest: m.latest }.into());
                }
                let seq = push_entry(tx, &d.thread, &mut m, &data, None, now)?;
                entry.answer = serde_json::json!({ "seq": seq });
                entry.size = entry.measure();
                save_call(tx, &entry, now)?;
                Ok((seq, d.thread))
            })
            .await;
        self.after_fenced(&out);
        let (seq, thread) = out?;
        self.inner.watches.notify(&thread);
        Ok(seq)
    }

    async fn drop_calls(&self, fence: &Fence, from: u32) -> StoreResult<()> {
        let fence = fence.clone();
        let out = self
            .write(move |tx, now| {
                EmbeddedStore::fenced(tx, &fence, now)?;
                tx.prepare_cached("DELETE FROM journal WHERE dispatch = ?1 AND pos >= ?2")
                    .map_err(db)?
                    .execute(params![fence.dispatch, from])
                    .map_err(db)?;
                Ok(())
            })
            .await;
        self.after_fenced(&out);
        out
    }

    async fn put_step(&self, fence: &Fence, step: NewStep) -> StoreResult<()> {
        step.validate()?;
        check_size("value", &step.value, MAX_VALUE, MAX_VALUE_WHY)?;
        let fence = fence.clone();
        let out = self
            .write(move |tx, now| {
                let (d, _) = EmbeddedStore::fenced(tx, &fence, now)?;
                let step = step.record(&d.id, now);
                tx.prepare_cached(
                    "INSERT OR REPLACE INTO journal_steps \
                     (dispatch, key, value, claim, attempt, recorded_at, size) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )
                .map_err(db)?
                .execute(params![
                    step.dispatch,
                    step.key,
                    step.value,
                    step.claim,
                    step.attempt,
                    clamp(step.recorded_at),
                    clamp(step.size)
                ])
                .map_err(db)?;
                Ok(())
            })
            .await;
        self.after_fenced(&out);
        out
    }

    fn max_body(&self) -> u64 {
        MAX_VALUE
    }
}

impl EmbeddedStore {
    /// A fenced write that found a stale epoch superseded its dispatch: wake the workers.
    fn after_fenced<T>(&self, out: &StoreResult<T>) {
        if matches!(out, Err(StoreError::StaleEpoch { .. })) {
            self.signal();
        }
    }
}
