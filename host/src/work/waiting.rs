//! Waiting in place for a waitpoint to leave `pending`: what a guest's `await-waitpoint`
//! does (long waits suspend instead, holding nothing).

use std::future::Future;
use std::time::Instant;

use crate::store::{Store, StoreError, Waitpoint};

/// Waitpoint `id` of `dispatch` (on `thread`) once it left `pending`, or as it is when `until`
/// passed or `stop` resolved first. The thread's watch is registered before the first read,
/// so a settlement in between is never waited past.
///
/// # Errors
///
/// `Invalid` when `id` is not a waitpoint of `dispatch`; when the store fails.
pub async fn wait_settled(
    store: &Store,
    thread: &str,
    dispatch: &str,
    id: &str,
    until: Instant,
    stop: impl Future<Output = ()>,
) -> Result<Waitpoint, StoreError> {
    let mut watch = store.inbox.watch(thread);
    tokio::pin!(stop);
    loop {
        let w = store
            .waitpoints
            .waitpoint(id)
            .await?
            .filter(|w| w.dispatch == dispatch)
            .ok_or_else(|| {
                StoreError::Invalid(format!(
                    "id: `{}` is not a waitpoint of dispatch `{dispatch}`",
                    id.escape_debug()
                ))
            })?;
        if !w.is_pending() || Instant::now() >= until {
            return Ok(w.public());
        }
        tokio::select! {
            () = watch.changed() => {}
            () = &mut stop => return Ok(w.public()),
            () = tokio::time::sleep_until(until.into()) => {}
        }
    }
}
