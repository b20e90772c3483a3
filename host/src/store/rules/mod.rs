//! The store's decisions, made once for every backend (the contract, docs/contract.md,
//! section 2): what a record looks like after a settlement, a failed attempt or a
//! re-submission ([this module](self)), who may write a claimed dispatch ([`holder`]), how
//! a queued record is taken and an expired one given back ([`claim`]), what follows a
//! change of status besides the record itself ([`effects`]), where a read bounded in bytes
//! ends ([`reads`]), and the fair order of concurrency keys ([`turns`]).
//!
//! Every function here is pure: it takes the stored record and what the backend read beside
//! it (the token and operation that settled the record, the thread's epoch, the time) and
//! returns a verdict or the new record. A backend only turns the verdict into SQL or into a
//! NATS write, so the two cannot decide differently.

mod claim;
mod effects;
mod holder;
pub mod inbox;
pub mod limits;
mod reads;
pub mod schedules;
pub(crate) mod turns;
pub mod waitpoints;
pub mod window;

pub(crate) use claim::{
    Reclaim, Take, due, lease_expired, lease_live, reclaim, stale, superseded, take,
};
#[cfg(test)]
pub(crate) use effects::waitpoints_end;
pub use effects::{BY_DISPATCH_ENDED, BY_INTERRUPT};
pub(crate) use effects::{Effects, effects};
pub(crate) use holder::{
    Fenced, Found, Holder, Settle, SupersedeClaimed, check_fence, check_holder_op,
    supersede_claimed, suspend,
};
pub use holder::{HolderOp, WaitpointsSeen, resume};
pub(crate) use reads::{ByteBudget, log_read, page};
pub use reads::{DEFAULT_PAGE, WALK_PAGE_BYTES};

use crate::store::model::{Dispatch, NewDispatch, Status};
use crate::store::{StoreError, StoreResult};

/// Times are clamped into signed 64-bit integers (SQLite's, and the range JSON readers keep).
pub(crate) fn clamp(ms: u64) -> u64 {
    ms.min(i64::MAX as u64)
}

/// The most of an error text (a nack's or dead-letter's error, a supersede reason) a record
/// keeps as `last_error`; longer texts are cut at a character boundary, with a note saying how
/// much was cut. This bounds what a settlement adds to a record, so a record that fit when it
/// was enqueued still fits a backend's record size after any settlement.
pub const MAX_ERROR_TEXT: usize = 8 * 1024;

/// `text` cut to [`MAX_ERROR_TEXT`] bytes (with the note) when it is longer.
pub(crate) fn error_text(text: &str) -> String {
    if text.len() <= MAX_ERROR_TEXT {
        return text.to_owned();
    }
    let note = format!(" [... {} bytes cut]", text.len());
    let mut out = crate::input::cut_to(text, MAX_ERROR_TEXT.saturating_sub(note.len())).to_owned();
    out.push_str(&note);
    out
}

/// Clears the claim and settles the record into a terminal status.
pub(crate) fn terminate(d: &mut Dispatch, status: Status, now: u64, reason: Option<&str>) {
    d.status = status;
    d.claim = None;
    d.completed_at = Some(now);
    d.updated_at = now;
    if let Some(reason) = reason {
        d.last_error = Some(error_text(reason));
    }
}

/// One failed attempt of a claimed dispatch: back to the queue at `retry_at`, or dead-lettered.
/// Returns the record and whether it is ready now.
pub(crate) fn fail_attempt(
    d: &mut Dispatch,
    now: u64,
    retry_at: u64,
    error: Option<&str>,
    reason_at_max: &str,
) -> bool {
    d.attempt = d.attempt.saturating_add(1).min(d.max_attempts);
    d.claim = None;
    d.updated_at = now;
    if let Some(error) = error {
        d.last_error = Some(error_text(error));
    }
    if d.attempt >= d.max_attempts {
        d.status = Status::DeadLetter;
        d.completed_at = Some(now);
        if error.is_none() {
            d.last_error = Some(reason_at_max.to_owned());
        }
        false
    } else {
        d.status = Status::Queued;
        d.available_at = clamp(retry_at);
        d.started_at = None;
        d.result = None;
        d.completed_at = None;
        d.available_at <= now
    }
}

/// Whether two submissions under one id carry the same content (an idempotent retry).
pub(crate) fn same_content(stored: &Dispatch, new: &NewDispatch) -> bool {
    stored.agent == new.agent
        && stored.thread == new.thread
        && new.run_id.as_ref().is_none_or(|run| *run == stored.run_id)
        && stored.payload == new.payload
        && stored.metadata == new.metadata
        && stored.priority == new.priority
        && stored.dedupe_key == new.dedupe_key
        && stored.concurrency_key == new.concurrency_key
        && stored.max_attempts == new.max_attempts
}

/// The queued record an enqueue stores: `new` under `id`, stamped with the thread's `epoch`.
pub(crate) fn queued_record(id: &str, new: &NewDispatch, epoch: u64, now: u64) -> Dispatch {
    let d = Dispatch {
        run_id: new.run_id.clone().unwrap_or_else(|| id.to_owned()),
        id: id.to_owned(),
        agent: new.agent.clone(),
        thread: new.thread.clone(),
        payload: new.payload.clone(),
        metadata: new.metadata.clone(),
        priority: new.priority,
        available_at: clamp(now.saturating_add(new.delay_ms)),
        dedupe_key: new.dedupe_key.clone(),
        max_attempts: new.max_attempts,
        attempt: new.attempt,
        log_from: None,
        claims: 0,
        resumes: 0,
        concurrency_key: new.concurrency_key.clone(),
        versions: Vec::new(),
        window: None,
        usage: None,
        epoch,
        status: Status::Queued,
        claim: None,
        started_at: None,
        result: None,
        last_error: None,
        created_at: now,
        updated_at: now,
        completed_at: None,
    };
    match &new.debounce {
        Some(spec) => window::opened(d, spec, now),
        None => d,
    }
}

/// What `extend_lease` reports for a holder write's outcome: `false` when the claim is gone
/// (missing, not claimed, another token, a stale epoch), other errors as they are.
pub(crate) fn lease_extended(out: StoreResult<Dispatch>) -> StoreResult<bool> {
    match out {
        Ok(_) => Ok(true),
        Err(
            StoreError::NotFound { .. }
            | StoreError::NotClaimed { .. }
            | StoreError::LostClaim { .. }
            | StoreError::StaleEpoch { .. },
        ) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The `Invalid` error of a value over a backend's limit: names the field, its size, the limit
/// and where the limit comes from.
pub(crate) fn too_large(field: &str, len: usize, limit: u64, why: &str) -> StoreError {
    StoreError::Invalid(format!(
        "{field}: {len} bytes exceeds the store's limit of {limit} bytes ({why})"
    ))
}

/// Refuses `value` when it is longer than `limit`.
pub(crate) fn check_size(field: &str, value: &[u8], limit: u64, why: &str) -> StoreResult<()> {
    if value.len() as u64 > limit {
        return Err(too_large(field, value.len(), limit, why));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_error_texts_are_cut_at_a_char_boundary_with_a_note() {
        assert_eq!(error_text("short"), "short");
        let exact = "e".repeat(MAX_ERROR_TEXT);
        assert_eq!(error_text(&exact), exact);
        let long = "é".repeat(MAX_ERROR_TEXT);
        let cut = error_text(&long);
        assert!(cut.len() <= MAX_ERROR_TEXT, "{}", cut.len());
        assert!(cut.starts_with("éé"));
        assert!(
            cut.ends_with(&format!(" [... {} bytes cut]", long.len())),
            "{cut}"
        );
    }
}
