//! Debounce windows on the embedded backend (docs/contract.md section 17): the open window of
//! a (thread, key) is the one row whose `window_key` is set (a unique partial index keeps it to
//! one), and a join rewrites that row in the enqueue's transaction.

use rusqlite::Connection;

use super::lanes::{insert_queued, refresh_lane};
use super::rows::{self, COLUMNS};
use super::{MAX_VALUE, TxError};
use crate::store::StoreResult;
use crate::store::model::{Dispatch, Gather, NewDispatch};
use crate::store::rules::window::{check_join, joined, sealed};

/// The open window of (`thread`, `key`), if any.
pub(super) fn open_window(
    tx: &Connection,
    thread: &str,
    key: &str,
) -> StoreResult<Option<Dispatch>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM dispatches INDEXED BY dispatches_open_window \
         WHERE thread = ?1 AND window_key = ?2"
    );
    Ok(rows::query(tx, &sql, &[&thread, &key])?.into_iter().next())
}

/// Writes the queued window `d` after a join or a seal and refreshes its lane.
pub(super) fn store(tx: &Connection, d: &Dispatch, now: u64) -> StoreResult<()> {
    rows::store_window(tx, d, d.available_at <= now)?;
    refresh_lane(tx, &d.agent, &d.thread)
}

/// T25: `new` joins `open`, the open window of its (thread, key), inside the enqueue's
/// transaction. When a `collect` window's items would pass [`MAX_VALUE`] with it, the window
/// is sealed (due now) and `new` opens the next one under `id`, in the same step. Returns
/// the window that holds `new`.
pub(super) fn join(
    tx: &Connection,
    open: Dispatch,
    id: &str,
    new: &NewDispatch,
    now: u64,
) -> Result<Dispatch, TxError> {
    check_join(&open, new).map_err(TxError::Abort)?;
    let room_left = open.window.as_ref().is_none_or(|w| {
        w.payload != Gather::Collect
            || w.bytes().saturating_add(new.payload.len() as u64) <= MAX_VALUE
    });
    if room_left {
        let d = joined(open, new, now);
        store(tx, &d, now)?;
        return Ok(d);
    }
    store(tx, &sealed(open, now), now)?;
    Ok(insert_queued(tx, id, new, now)?)
}

/// The inbox's open follow-up window of `thread`, widened to message `seq` (M4 with
/// `follow_up_quiet`): `true` when there was one.
pub(super) fn join_message(tx: &Connection, thread: &str, seq: u64, now: u64) -> StoreResult<bool> {
    let Some(open) = open_window(tx, thread, crate::store::model::window::FOLLOW_UP_WINDOW)? else {
        return Ok(false);
    };
    let d = crate::store::rules::window::joined_by_message(open, seq, now);
    store(tx, &d, now)?;
    Ok(true)
}
