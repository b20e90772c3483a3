//! The schedules' records in the embedded store: one row each, the record as JSON, with a
//! revision that every write moves on by one (the compare-and-set of `put_schedule`).

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::rows::db;
use super::{EmbeddedStore, TxError};
use crate::store::rules;
use crate::store::rules::ByteBudget;
use crate::store::schedules::{Schedule, Schedules, Stored};
use crate::store::{StoreError, StoreResult};

/// The row of `name`, decoded.
fn load(tx: &Connection, name: &str) -> StoreResult<Option<Stored>> {
    let row: Option<(String, u64)> = tx
        .prepare_cached("SELECT record, revision FROM schedules WHERE name = ?1")
        .map_err(db)?
        .query_row(params![name], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()
        .map_err(db)?;
    row.map(|(record, revision)| decode(name, &record, revision))
        .transpose()
}

fn decode(name: &str, record: &str, revision: u64) -> StoreResult<Stored> {
    let schedule: Schedule = serde_json::from_str(record).map_err(|e| StoreError::Corrupt {
        key: format!("schedules/{name}"),
        reason: e.to_string(),
    })?;
    Ok(Stored { schedule, revision })
}

/// The revision stored for `name` (0: none).
fn revision(tx: &Connection, name: &str) -> StoreResult<u64> {
    Ok(tx
        .prepare_cached("SELECT revision FROM schedules WHERE name = ?1")
        .map_err(db)?
        .query_row(params![name], |row| row.get(0))
        .optional()
        .map_err(db)?
        .unwrap_or(0))
}

/// The error of a write that expected revision `expect` of `name` and found `found`.
fn moved(name: &str, expect: u64, found: u64) -> StoreError {
    StoreError::Contention(format!(
        "schedule `{name}` is at revision {found}, not {expect}: read it again"
    ))
}

#[async_trait]
impl Schedules for EmbeddedStore {
    async fn schedule(&self, name: &str) -> StoreResult<Option<Stored>> {
        let name = name.to_owned();
        self.read(move |tx| load(tx, &name)).await
    }

    async fn schedules(
        &self,
        after: Option<&str>,
        limit: usize,
        max_bytes: Option<usize>,
    ) -> StoreResult<Vec<Stored>> {
        let after = after.unwrap_or("").to_owned();
        let limit = i64::try_from(rules::page(limit)).unwrap_or(i64::MAX);
        self.read(move |tx| {
            let mut stmt = tx
                .prepare_cached(
                    "SELECT name, record, revision FROM schedules WHERE name > ?1 \
                     ORDER BY name LIMIT ?2",
                )
                .map_err(db)?;
            let rows = stmt
                .query_map(params![after, limit], |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, u64>(2)?,
                    ))
                })
                .map_err(db)?;
            // Rows are read one at a time: the page stops at its byte budget.
            let mut budget = ByteBudget::new(max_bytes);
            let mut page = Vec::new();
            for row in rows {
                if !budget.open() {
                    break;
                }
                let (name, record, revision) = row.map_err(db)?;
                budget.take(record.len());
                page.push(decode(&name, &record, revision)?);
            }
            Ok(page)
        })
        .await
    }

    async fn put_schedule(&self, schedule: &Schedule, expect: u64) -> StoreResult<u64> {
        let name = schedule.def.name.clone();
        let record = serde_json::to_string(schedule)
            .map_err(|e| StoreError::Invalid(format!("schedule `{name}`: cannot encode: {e}")))?;
        self.write(move |tx, _| {
            let found = revision(tx, &name).map_err(TxError::Abort)?;
            if found != expect {
                return Err(TxError::Abort(moved(&name, expect, found)));
            }
            let next = found + 1;
            tx.prepare_cached(
                "INSERT INTO schedules (name, record, revision) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (name) DO UPDATE SET record = excluded.record, \
                 revision = excluded.revision",
            )
            .map_err(db)
            .map_err(TxError::Abort)?
            .execute(params![name, record, next])
            .map_err(db)
            .map_err(TxError::Abort)?;
            Ok(next)
        })
        .await
    }

    async fn delete_schedule(&self, name: &str, expect: Option<u64>) -> StoreResult<bool> {
        let name = name.to_owned();
        self.write(move |tx, _| {
            let found = revision(tx, &name).map_err(TxError::Abort)?;
            if found == 0 {
                return Ok(false);
            }
            if let Some(expect) = expect
                && expect != found
            {
                return Err(TxError::Abort(moved(&name, expect, found)));
            }
            tx.prepare_cached("DELETE FROM schedules WHERE name = ?1")
                .map_err(db)
                .map_err(TxError::Abort)?
                .execute(params![name])
                .map_err(db)
                .map_err(TxError::Abort)?;
            Ok(true)
        })
        .await
    }
}
