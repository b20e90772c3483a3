//! The one closed error enum every backend returns (the contract, docs/contract.md, section 2).
//!
//! Callers branch on the variant, never on the message: a guest told `LostClaim` stops
//! work, one told `Contention` tries again, one told `Invalid` fixes its input.

use super::model::Status;

/// Everything a store operation can refuse or fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// No dispatch with this id is stored.
    #[error("dispatch `{id}` not found")]
    NotFound {
        /// The id asked for.
        id: String,
    },
    /// A holder operation on a dispatch that is not claimed.
    #[error("dispatch `{id}` is {status}, not claimed")]
    NotClaimed {
        /// The dispatch.
        id: String,
        /// Its current status.
        status: Status,
    },
    /// The claim token does not match the current claim: the caller lost it.
    #[error("claim on dispatch `{id}` was lost (token does not match the current claim)")]
    LostClaim {
        /// The dispatch.
        id: String,
    },
    /// The dispatch's epoch is older than its thread's: it was interrupted and is now superseded.
    #[error("dispatch `{id}` is from epoch {dispatch} but its thread is at epoch {thread}")]
    StaleEpoch {
        /// The dispatch.
        id: String,
        /// The dispatch's epoch.
        dispatch: u64,
        /// The thread's epoch.
        thread: u64,
    },
    /// The id is taken by a different dispatch, or the dedupe key by a live one.
    #[error("duplicate dispatch `{id}`{}", holder.as_ref().map(|h| format!(" (dedupe key held by `{h}`)")).unwrap_or_default())]
    Duplicate {
        /// The dispatch submitted.
        id: String,
        /// The live dispatch holding the dedupe key, when that is the reason.
        holder: Option<String>,
    },
    /// The input breaks a rule; the message names the field.
    #[error("invalid input: {0}")]
    Invalid(String),
    /// An optimistic append lost: the log moved on.
    #[error("thread log conflict: latest is {latest}")]
    Conflict {
        /// The log's latest sequence.
        latest: u64,
    },
    /// A message sent under `reject` to a thread a dispatch holds (claimed or waiting); nothing
    /// was stored.
    #[error("thread `{thread}` is busy: dispatch `{holder}` holds it")]
    Busy {
        /// The thread.
        thread: String,
        /// The dispatch holding it.
        holder: String,
    },
    /// A per-thread or per-dispatch cap the store enforces atomically (pending messages per
    /// thread, resumes, waitpoints per dispatch); the message names the cap and its value.
    /// Retrying does not help until something is consumed.
    #[error("limit reached: {0}")]
    Limit(String),
    /// Contention on the backend; retry later.
    #[error("contention: {0}")]
    Contention(String),
    /// The backend cannot be reached or refused the operation.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A stored record failed to decode.
    #[error("corrupt record `{key}`: {reason}")]
    Corrupt {
        /// The key (or row) that failed.
        key: String,
        /// What was wrong with it.
        reason: String,
    },
}

impl StoreError {
    /// Whether retrying the same call later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Contention(_) | StoreError::Unavailable(_))
    }
}

/// The result type of store operations.
pub type StoreResult<T> = Result<T, StoreError>;
