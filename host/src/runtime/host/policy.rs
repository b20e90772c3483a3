//! What the host allows a guest, beyond what the store enforces: the caps of one dispatch, the
//! one cap on guest bytes, and how a store refusal reads to a guest.
//!
//! # One cap on guest bytes
//!
//! Every byte string a guest hands the host to store (an enqueued payload, an output through
//! `record-result` or `complete` or returned by `handle`, a thread-log entry) is held to one
//! cap, [`PluginContext::payload_cap`]: `[host] max_payload`, or what the store can hold when
//! that is less (a NATS server's `max_payload` bounds its backend). Over it the guest is told
//! `invalid`, naming the field and the cap, on every backend alike; an oversized output
//! returned by `handle` fails the attempt with that message ([`check_returned_output`]).

use std::time::Duration;

use super::PluginContext;
use crate::runtime::bindings::GuestError;
use crate::store::{Store, StoreError};

/// At most this many follow-up dispatches per claim; an enqueue storm gets `denied` after it.
pub const MAX_ENQUEUES_PER_CLAIM: u32 = 1_000;
/// At most this many log lines (WIT log plus stdout/stderr) per dispatch; the rest are counted
/// and dropped, so a log flood cannot drown the host's log.
pub const MAX_LOG_LINES: u32 = 10_000;
/// Longest log line kept; longer ones are cut.
pub const MAX_LOG_LINE: usize = 4 * 1024;
/// Most thread-log entries one `read-log` returns.
pub const MAX_READ: u32 = 1_000;
/// Longest delay a guest may ask for on a follow-up dispatch.
pub const MAX_ENQUEUE_DELAY: Duration = Duration::from_secs(30 * 24 * 3600);
/// Longest key of a memoized step (`step-get`, `step-put`), in bytes: the store's limit.
pub use crate::store::journal::MAX_STEP_KEY;
/// How long one `claim-next` may wait for work, whatever the guest asks.
pub const MAX_CLAIM_WAIT: Duration = Duration::from_secs(5);

impl PluginContext {
    /// The cap on every byte string a guest hands the host to store (see the module): the
    /// host's `max_payload`, or what the store holds when that is less.
    pub fn payload_cap(&self) -> u64 {
        self.max_payload.min(self.store.max_value())
    }

    /// Refuses `len` bytes of `field` over [`PluginContext::payload_cap`], naming the field,
    /// the size and the cap.
    ///
    /// # Errors
    ///
    /// The message a guest is told (as `invalid`) when `len` is over the cap.
    pub fn check_payload(&self, field: &str, len: usize) -> Result<(), String> {
        let cap = self.payload_cap();
        if len as u64 <= cap {
            return Ok(());
        }
        Err(if cap < self.max_payload {
            format!(
                "{field}: {len} bytes exceeds the host's max_payload of {cap} bytes (what the \
                 store can hold; [host] max_payload is {})",
                self.max_payload
            )
        } else {
            format!("{field}: {len} bytes exceeds the host's max_payload of {cap} bytes")
        })
    }
}

/// The failure of an attempt whose handler returned an output over the cap: `None` when the
/// output fits. The supervisor settles a returned output with `complete`; an output the store
/// must refuse is turned into this failure first, so the attempt is nacked at once with a
/// message naming the limit instead of holding its thread until the lease runs out.
pub fn check_returned_output(plugin: &PluginContext, output: &[u8]) -> Option<String> {
    let cap = plugin.payload_cap();
    (output.len() as u64 > cap).then(|| {
        if cap < plugin.max_payload {
            format!(
                "output of {} bytes exceeds max_payload {cap} (what the store can hold; \
                 [host] max_payload is {})",
                output.len(),
                plugin.max_payload
            )
        } else {
            format!("output of {} bytes exceeds max_payload {cap}", output.len())
        }
    })
}

/// A warning for an operator whose `[host] max_payload` is more than `store` can hold (the
/// host then caps guest bytes at what the store holds): `None` when it fits.
pub fn max_payload_warning(max_payload: u64, store: &Store) -> Option<String> {
    let holds = store.max_value();
    (max_payload > holds).then(|| {
        format!(
            "[host] max_payload is {max_payload} bytes but the store holds at most {holds} bytes \
             per payload, output or log entry; guest values are capped at {holds} bytes (lower \
             max_payload to silence this, or raise the NATS server's max_payload)"
        )
    })
}

/// Maps a store refusal onto the closed WIT error.
pub fn guest_error(err: StoreError) -> GuestError {
    match err {
        StoreError::NotFound { .. }
        | StoreError::NotClaimed { .. }
        | StoreError::LostClaim { .. } => GuestError::LostClaim(err.to_string()),
        StoreError::StaleEpoch { .. } => GuestError::Interrupted(err.to_string()),
        StoreError::Duplicate { id, holder } => GuestError::Duplicate(holder.unwrap_or(id)),
        StoreError::Invalid(message) => GuestError::Invalid(message),
        StoreError::Conflict { latest } => GuestError::Conflict(latest),
        StoreError::Limit(message) => GuestError::Denied(message),
        StoreError::Busy { .. } => GuestError::Denied(err.to_string()),
        StoreError::Contention(message) => GuestError::Contention(message),
        StoreError::Unavailable(message) => GuestError::Unavailable(message),
        StoreError::Corrupt { .. } => GuestError::Internal(err.to_string()),
    }
}
