//! Waiting for a dispatch to finish: the API's long poll (`GET /v1/dispatches/{id}?wait=`) and
//! `homing enqueue --wait`.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::OpError;
use crate::store::{Dispatch, Store};

/// The first poll interval; it doubles up to [`POLL_MAX`]. The store's work signal (fired
/// when this process settles a dispatch) wakes a wait sooner.
const POLL_FIRST: Duration = Duration::from_millis(5);
/// The longest between two reads of the dispatch.
const POLL_MAX: Duration = Duration::from_millis(250);

/// Reads dispatch `id` until it is terminal, `within` has passed, or `stop` (when given) turns
/// true, and returns it as last read: the caller tells a finished dispatch from one still
/// live by its status.
///
/// # Errors
///
/// [`OpError::NotFound`] when there is no such dispatch (or it is gone before it finished), or
/// the store's error.
pub async fn until_terminal(
    store: &Store,
    id: &str,
    within: Duration,
    mut stop: Option<watch::Receiver<bool>>,
) -> Result<Dispatch, OpError> {
    let deadline = Instant::now() + within;
    let signal = store.mailbox.work_signal();
    let mut poll = POLL_FIRST;
    loop {
        let notified = signal.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let Some(d) = store.mailbox.load(id).await? else {
            return Err(OpError::NotFound(id.to_owned()));
        };
        let now = Instant::now();
        let stopping = stop.as_ref().is_some_and(|s| *s.borrow());
        if d.status.is_terminal() || now >= deadline || stopping {
            return Ok(d);
        }
        let stopped = async {
            let changed = match stop.as_mut() {
                Some(s) => s.changed().await.is_ok(),
                None => false,
            };
            // No stop, or its sender gone (nothing more will come): wait on the rest.
            if !changed {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = &mut notified => {}
            () = tokio::time::sleep(poll.min(deadline - now)) => {}
            () = stopped => {}
        }
        poll = (poll * 2).min(POLL_MAX);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use super::*;
    use crate::store::embedded::EmbeddedStore;
    use crate::store::{NewDispatch, Status, SystemClock};

    fn store() -> Store {
        EmbeddedStore::open_in_memory(Arc::new(SystemClock))
            .unwrap()
            .store()
    }

    /// A store holding one queued dispatch, and its id.
    async fn one_queued() -> (Store, String) {
        let store = store();
        let d = store
            .mailbox
            .enqueue(NewDispatch::new("echo", "t1", Vec::new()))
            .await
            .unwrap();
        (store, d.id)
    }

    #[tokio::test]
    async fn a_live_dispatch_is_returned_as_it_is_when_the_time_is_up() {
        let (store, id) = one_queued().await;
        let read = until_terminal(&store, &id, Duration::from_millis(30), None)
            .await
            .unwrap();
        assert_eq!(read.status, Status::Queued);
    }

    #[tokio::test]
    async fn a_wait_ends_when_it_finishes_or_is_stopped() {
        let (store, id) = one_queued().await;
        let (stop, stopped) = watch::channel(false);
        let waiting = {
            let store = store.clone();
            let id = id.clone();
            tokio::spawn(async move {
                until_terminal(&store, &id, Duration::from_secs(60), Some(stopped)).await
            })
        };
        stop.send(true).unwrap();
        let read = waiting.await.unwrap().unwrap();
        assert_eq!(read.status, Status::Queued);
        store.mailbox.cancel(&id).await.unwrap();
        let read = until_terminal(&store, &id, Duration::from_secs(60), None)
            .await
            .unwrap();
        assert_eq!(read.status, Status::Cancelled);
    }

    #[tokio::test]
    async fn no_such_dispatch_is_not_found() {
        let e = until_terminal(&store(), "nope", Duration::ZERO, None)
            .await
            .unwrap_err();
        assert!(matches!(e, OpError::NotFound(id) if id == "nope"));
    }
}
