//! Decoding and encoding dispatch rows. A row that fails to decode is `Corrupt`, naming the
//! row; it never panics and never hides other rows.

use std::collections::BTreeMap;

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::store::model::{Claim, Dispatch, DispatchRow, RowResult, RunResult, RunStatus, Status};
use crate::store::rules::Found;
use crate::store::rules::window::open_key;
use crate::store::{StoreError, StoreResult};

/// The columns every dispatch query selects, in the order [`decode`] reads them.
pub(super) const COLUMNS: &str = "id, agent, thread, run_id, payload, metadata, priority, available_at, \
    dedupe_key, max_attempts, attempt, epoch, status, claim_token, claimed_by, lease_until, started_at, \
    result_status, result_output, result_error, last_error, created_at, updated_at, completed_at, \
    settled_token, settled_op, claims, resumes, waitpoints, concurrency_key, versions, log_from, window, usage";

/// The columns a list row selects, in the order [`decode_row`] reads them: no payload and no
/// output, only their sizes (`octet_length` reads a value's size from the record's header, not
/// the value).
pub(super) const ROW_COLUMNS: &str = "id, agent, thread, run_id, octet_length(payload), metadata, \
    priority, available_at, dedupe_key, max_attempts, attempt, epoch, status, claimed_by, lease_until, \
    started_at, result_status, octet_length(result_output), result_error, last_error, created_at, \
    updated_at, completed_at, claims, resumes, concurrency_key";

/// A decoded row: the record plus the store's bookkeeping about who settled it.
#[derive(Debug, Clone)]
pub(super) struct StoredRow {
    pub dispatch: Dispatch,
    pub settled_token: Option<String>,
    pub settled_op: Option<String>,
    /// How many waitpoints the dispatch created (so a settlement knows whether to look).
    pub waitpoints: u32,
}

impl StoredRow {
    /// The record and its settlement, as the store's rules read them.
    pub fn found(&self) -> Found<'_> {
        Found {
            dispatch: &self.dispatch,
            settled: self
                .settled_token
                .as_deref()
                .zip(self.settled_op.as_deref()),
        }
    }
}

fn corrupt(id: &str, reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        key: format!("dispatches/{id}"),
        reason: reason.into(),
    }
}

/// Decodes one row selected with [`COLUMNS`].
pub(super) fn decode(row: &Row<'_>) -> StoreResult<StoredRow> {
    let id: String = row
        .get(0)
        .map_err(|e| corrupt("?", format!("id column: {e}")))?;
    let field = |e: rusqlite::Error| corrupt(&id, e.to_string());
    let metadata_text: String = row.get(5).map_err(field)?;
    let metadata: BTreeMap<String, String> =
        serde_json::from_str(&metadata_text).map_err(|e| corrupt(&id, format!("metadata: {e}")))?;
    let status_text: String = row.get(12).map_err(field)?;
    let status: Status = status_text.parse().map_err(|e: String| corrupt(&id, e))?;
    let priority: i64 = row.get(6).map_err(field)?;
    let priority = u8::try_from(priority)
        .map_err(|_| corrupt(&id, format!("priority {priority} out of range")))?;
    let token: Option<String> = row.get(13).map_err(field)?;
    let claimed_by: Option<String> = row.get(14).map_err(field)?;
    let lease_until: Option<u64> = row.get(15).map_err(field)?;
    let claim = match (token, claimed_by, lease_until) {
        (Some(token), Some(claimed_by), Some(lease_until)) => Some(Claim {
            token,
            claimed_by,
            lease_until,
        }),
        (None, None, None) => None,
        _ => return Err(corrupt(&id, "partial claim fields")),
    };
    let result_status: Option<String> = row.get(17).map_err(field)?;
    let result = match result_status {
        None => None,
        Some(text) => Some(RunResult {
            status: RunStatus::parse(&text)
                .ok_or_else(|| corrupt(&id, format!("unknown result status `{text}`")))?,
            output: row
                .get::<_, Option<Vec<u8>>>(18)
                .map_err(field)?
                .unwrap_or_default(),
            error: row.get(19).map_err(field)?,
        }),
    };
    let dispatch = Dispatch {
        agent: row.get(1).map_err(field)?,
        thread: row.get(2).map_err(field)?,
        run_id: row.get(3).map_err(field)?,
        payload: row.get(4).map_err(field)?,
        metadata,
        priority,
        available_at: row.get(7).map_err(field)?,
        dedupe_key: row.get(8).map_err(field)?,
        max_attempts: row.get(9).map_err(field)?,
        attempt: row.get(10).map_err(field)?,
        log_from: row.get(31).map_err(field)?,
        claims: row.get(26).map_err(field)?,
        resumes: row.get(27).map_err(field)?,
        concurrency_key: row.get(29).map_err(field)?,
        versions: match row.get::<_, Option<String>>(30).map_err(field)? {
            None => Vec::new(),
            Some(text) => {
                serde_json::from_str(&text).map_err(|e| corrupt(&id, format!("versions: {e}")))?
            }
        },
        window: match row.get::<_, Option<String>>(32).map_err(field)? {
            None => None,
            Some(text) => Some(
                serde_json::from_str(&text).map_err(|e| corrupt(&id, format!("window: {e}")))?,
            ),
        },
        usage: match row.get::<_, Option<String>>(33).map_err(field)? {
            None => None,
            Some(text) => {
                Some(serde_json::from_str(&text).map_err(|e| corrupt(&id, format!("usage: {e}")))?)
            }
        },
        epoch: row.get(11).map_err(field)?,
        status,
        claim,
        started_at: row.get(16).map_err(field)?,
        result,
        last_error: row.get(20).map_err(field)?,
        created_at: row.get(21).map_err(field)?,
        updated_at: row.get(22).map_err(field)?,
        completed_at: row.get(23).map_err(field)?,
        id: id.clone(),
    };
    dispatch.check_shape().map_err(|e| corrupt(&id, e))?;
    Ok(StoredRow {
        dispatch,
        settled_token: row.get(24).map_err(field)?,
        settled_op: row.get(25).map_err(field)?,
        waitpoints: row.get(28).map_err(field)?,
    })
}

/// Decodes one row selected with [`ROW_COLUMNS`].
fn decode_row(row: &Row<'_>) -> StoreResult<DispatchRow> {
    let id: String = row
        .get(0)
        .map_err(|e| corrupt("?", format!("id column: {e}")))?;
    let field = |e: rusqlite::Error| corrupt(&id, e.to_string());
    let metadata_text: String = row.get(5).map_err(field)?;
    let metadata: BTreeMap<String, String> =
        serde_json::from_str(&metadata_text).map_err(|e| corrupt(&id, format!("metadata: {e}")))?;
    let priority: i64 = row.get(6).map_err(field)?;
    let priority = u8::try_from(priority)
        .map_err(|_| corrupt(&id, format!("priority {priority} out of range")))?;
    let status_text: String = row.get(12).map_err(field)?;
    let status: Status = status_text.parse().map_err(|e: String| corrupt(&id, e))?;
    let claimed_by: Option<String> = row.get(13).map_err(field)?;
    let lease_until: Option<u64> = row.get(14).map_err(field)?;
    if claimed_by.is_some() != lease_until.is_some() {
        return Err(corrupt(&id, "partial claim fields"));
    }
    let result_status: Option<String> = row.get(16).map_err(field)?;
    let result = match result_status {
        None => None,
        Some(text) => Some(RowResult {
            status: RunStatus::parse(&text)
                .ok_or_else(|| corrupt(&id, format!("unknown result status `{text}`")))?,
            output_size: row.get::<_, Option<u64>>(17).map_err(field)?.unwrap_or(0),
            error: row.get(18).map_err(field)?,
        }),
    };
    Ok(DispatchRow {
        agent: row.get(1).map_err(field)?,
        thread: row.get(2).map_err(field)?,
        run_id: row.get(3).map_err(field)?,
        payload_size: row.get::<_, Option<u64>>(4).map_err(field)?.unwrap_or(0),
        metadata,
        priority,
        available_at: row.get(7).map_err(field)?,
        dedupe_key: row.get(8).map_err(field)?,
        max_attempts: row.get(9).map_err(field)?,
        attempt: row.get(10).map_err(field)?,
        claims: row.get(23).map_err(field)?,
        resumes: row.get(24).map_err(field)?,
        concurrency_key: row.get(25).map_err(field)?,
        epoch: row.get(11).map_err(field)?,
        status,
        claimed_by,
        lease_until,
        started_at: row.get(15).map_err(field)?,
        result,
        last_error: row.get(19).map_err(field)?,
        created_at: row.get(20).map_err(field)?,
        updated_at: row.get(21).map_err(field)?,
        completed_at: row.get(22).map_err(field)?,
        id: id.clone(),
    })
}

/// Loads one dispatch row by id.
pub(super) fn load(tx: &Connection, id: &str) -> StoreResult<Option<StoredRow>> {
    let mut stmt = tx
        .prepare_cached(&format!("SELECT {COLUMNS} FROM dispatches WHERE id = ?1"))
        .map_err(db)?;
    let mut rows = stmt.query(params![id]).map_err(db)?;
    match rows.next().map_err(db)? {
        Some(row) => decode(row).map(Some),
        None => Ok(None),
    }
}

/// Writes every mutable field of `d` back to its row (the id, agent, thread and content never
/// change after enqueue). `ready` is the scheduler flag; `settled` the settling token and op.
pub(super) fn store(
    tx: &Connection,
    d: &Dispatch,
    ready: bool,
    settled: Option<(&str, &str)>,
) -> StoreResult<()> {
    d.check_shape().map_err(StoreError::Invalid)?;
    let (token, claimed_by, lease_until) = match &d.claim {
        Some(c) => (
            Some(c.token.as_str()),
            Some(c.claimed_by.as_str()),
            Some(c.lease_until),
        ),
        None => (None, None, None),
    };
    let (result_status, result_output, result_error) = match &d.result {
        Some(r) => (
            Some(r.status.as_str()),
            Some(r.output.as_slice()),
            r.error.as_deref(),
        ),
        None => (None, None, None),
    };
    let mut stmt = tx
        .prepare_cached(
            "UPDATE dispatches SET available_at = ?2, attempt = ?3, epoch = ?4, status = ?5, ready = ?6, \
             claim_token = ?7, claimed_by = ?8, lease_until = ?9, started_at = ?10, result_status = ?11, \
             result_output = ?12, result_error = ?13, last_error = ?14, updated_at = ?15, completed_at = ?16, \
             settled_token = coalesce(?17, settled_token), settled_op = coalesce(?18, settled_op), \
             claims = ?19, resumes = ?20, versions = ?21, log_from = ?22, window_key = ?23, \
             usage = ?24 WHERE id = ?1",
        )
        .map_err(db)?;
    let versions = if d.versions.is_empty() {
        None
    } else {
        Some(
            serde_json::to_string(&d.versions)
                .map_err(|e| StoreError::Invalid(format!("versions: {e}")))?,
        )
    };
    let usage = d
        .usage
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(|e| StoreError::Invalid(format!("usage: {e}")))?;
    stmt.execute(params![
        d.id,
        d.available_at,
        d.attempt,
        d.epoch,
        d.status.as_str(),
        ready,
        token,
        claimed_by,
        lease_until,
        d.started_at,
        result_status,
        result_output,
        result_error,
        d.last_error,
        d.updated_at,
        d.completed_at,
        settled.map(|s| s.0),
        settled.map(|s| s.1),
        d.claims,
        d.resumes,
        versions,
        d.log_from,
        open_key(d),
        usage,
    ])
    .map_err(db)?;
    Ok(())
}

/// The window JSON of `d`, when it has one.
fn window_text(d: &Dispatch) -> StoreResult<Option<String>> {
    d.window
        .as_ref()
        .map(|w| serde_json::to_string(w).map_err(|e| StoreError::Invalid(format!("window: {e}"))))
        .transpose()
}

/// Writes a queued window `d` after an enqueue joined or sealed it: its content (a `last` or
/// `collect` window takes the latest payload and metadata), its window and its due time.
/// `ready` is the scheduler flag.
pub(super) fn store_window(tx: &Connection, d: &Dispatch, ready: bool) -> StoreResult<()> {
    d.check_shape().map_err(StoreError::Invalid)?;
    let metadata = serde_json::to_string(&d.metadata)
        .map_err(|e| StoreError::Invalid(format!("metadata: {e}")))?;
    tx.prepare_cached(
        "UPDATE dispatches SET payload = ?2, metadata = ?3, available_at = ?4, ready = ?5, \
         window = ?6, window_key = ?7, updated_at = ?8 WHERE id = ?1",
    )
    .map_err(db)?
    .execute(params![
        d.id,
        d.payload,
        metadata,
        d.available_at,
        ready,
        window_text(d)?,
        open_key(d),
        d.updated_at,
    ])
    .map_err(db)?;
    Ok(())
}

/// Inserts a freshly enqueued dispatch.
pub(super) fn insert(tx: &Connection, d: &Dispatch, ready: bool) -> StoreResult<()> {
    d.check_shape().map_err(StoreError::Invalid)?;
    let metadata = serde_json::to_string(&d.metadata)
        .map_err(|e| StoreError::Invalid(format!("metadata: {e}")))?;
    let mut stmt = tx
        .prepare_cached(
            "INSERT INTO dispatches (id, agent, thread, run_id, payload, metadata, priority, available_at, \
             dedupe_key, max_attempts, attempt, epoch, status, ready, created_at, updated_at, \
             concurrency_key, window, window_key) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)",
        )
        .map_err(db)?;
    stmt.execute(params![
        d.id,
        d.agent,
        d.thread,
        d.run_id,
        d.payload,
        metadata,
        d.priority,
        d.available_at,
        d.dedupe_key,
        d.max_attempts,
        d.attempt,
        d.epoch,
        d.status.as_str(),
        ready,
        d.created_at,
        d.updated_at,
        d.concurrency_key,
        window_text(d)?,
        open_key(d),
    ])
    .map_err(db)?;
    Ok(())
}

/// Runs a query selecting [`COLUMNS`] and decodes every row.
pub(super) fn query(
    tx: &Connection,
    sql: &str,
    args: &[&dyn rusqlite::ToSql],
) -> StoreResult<Vec<Dispatch>> {
    let mut stmt = tx.prepare_cached(sql).map_err(db)?;
    let mut rows = stmt.query(args).map_err(db)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(db)? {
        out.push(decode(row)?.dispatch);
    }
    Ok(out)
}

/// Runs a query selecting [`ROW_COLUMNS`] and decodes every row.
pub(super) fn query_rows(
    tx: &Connection,
    sql: &str,
    args: &[&dyn rusqlite::ToSql],
) -> StoreResult<Vec<DispatchRow>> {
    let mut stmt = tx.prepare_cached(sql).map_err(db)?;
    let mut rows = stmt.query(args).map_err(db)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(db)? {
        out.push(decode_row(row)?);
    }
    Ok(out)
}

/// A single optional integer.
pub(super) fn scalar_u64(
    tx: &Connection,
    sql: &str,
    args: &[&dyn rusqlite::ToSql],
) -> StoreResult<Option<u64>> {
    let mut stmt = tx.prepare_cached(sql).map_err(db)?;
    stmt.query_row(args, |row| row.get::<_, u64>(0))
        .optional()
        .map_err(db)
}

/// A SQLite failure inside a transaction.
pub(super) fn db(err: rusqlite::Error) -> StoreError {
    super::sql_error("embedded store", err)
}
