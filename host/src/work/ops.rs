//! Cancel (with the reason a dispatch cannot be cancelled) and retry, as the API, the CLI and
//! the dashboard offer them.

use crate::config::Config;
use crate::store::{Dispatch, NewDispatch, Status, Store, StoreError};

/// Why an operation on one dispatch did not happen.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// No dispatch with this id.
    #[error("no dispatch `{0}`")]
    NotFound(String),
    /// The dispatch is in a state the operation does not apply to.
    #[error("dispatch `{id}` is {status}; {hint}")]
    WrongState {
        /// The dispatch.
        id: String,
        /// Its status.
        status: Status,
        /// What the operation needs.
        hint: &'static str,
    },
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Cancels a queued or waiting dispatch (a waiting one's pending waitpoints are cancelled with it).
///
/// # Errors
///
/// [`OpError::NotFound`], [`OpError::WrongState`] when it is neither queued nor waiting, or the store's error.
pub async fn cancel(store: &Store, id: &str) -> Result<Dispatch, OpError> {
    if let Some(d) = store.mailbox.cancel(id).await? {
        return Ok(d);
    }
    match store.mailbox.load(id).await? {
        Some(d) => Err(OpError::WrongState {
            id: id.to_owned(),
            status: d.status,
            hint: "only queued or waiting dispatches can be cancelled (interrupt its thread to stop a running one)",
        }),
        None => Err(OpError::NotFound(id.to_owned())),
    }
}

/// Re-enqueues a dead-lettered or cancelled dispatch as a new one (same agent, thread,
/// payload, priority, metadata, dedupe key and concurrency key, with `retry-of` naming the original).
///
/// # Errors
///
/// [`OpError::NotFound`], [`OpError::WrongState`] for any other status, or the store's error.
pub async fn retry(config: &Config, store: &Store, id: &str) -> Result<Dispatch, OpError> {
    let Some(d) = store.mailbox.load(id).await? else {
        return Err(OpError::NotFound(id.to_owned()));
    };
    if !matches!(d.status, Status::DeadLetter | Status::Cancelled) {
        return Err(OpError::WrongState {
            id: id.to_owned(),
            status: d.status,
            hint: "only dead-lettered or cancelled dispatches can be retried",
        });
    }
    let mut new =
        NewDispatch::new(&d.agent, &d.thread, d.payload.clone()).with_priority(d.priority);
    new.metadata = d.metadata.clone();
    new.metadata.insert("retry-of".into(), d.id.clone());
    new.max_attempts = config
        .plugins
        .get(&d.agent)
        .map(|p| p.max_attempts)
        .unwrap_or(d.max_attempts);
    new.dedupe_key = d.dedupe_key.clone();
    new.concurrency_key = d.concurrency_key.clone();
    Ok(store.mailbox.enqueue(new).await?)
}
