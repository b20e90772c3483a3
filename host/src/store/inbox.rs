//! The inbox of a thread (the contract, docs/contract.md, section 9): messages sent into a
//! thread while its agent runs, delivered to whichever claim holds the thread and appended to
//! its log, in the same atomic step, when a holder acknowledges them.
//!
//! A message is stored before its sender gets its sequence (M1), stays pending until exactly
//! one holder acknowledges it (M2) or an operator discards it (M3), and is never lost: one
//! still pending when the thread's last live work settles is answered by a follow-up dispatch
//! (M4), at most one per message (the `followed` watermark).
//!
//! Waiting for a thread to change (a guest's `next-message`, `homing thread send --wait`) goes
//! through [`Inbox::watch`]: a hint that fires after anything of the thread may have changed,
//! registered before the waiter reads so a change in between is never missed.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use tokio::sync::watch;

use super::StoreResult;
use super::model::Fence;
/// The inbox's records live with the store's others (`model::inbox`); a message's kind and the
/// note its log entry carries are the log's records as much as the inbox's.
pub use super::model::inbox::{
    InboxMarks, MAX_MESSAGE_METADATA, Message, MessageFilter, MessageState, NOTE_ROOM, NewMessage,
    OnBusy, Sent,
};
pub use super::model::{MessageKind, MessageNote};
/// The page of [`Inbox::messages`] when the filter asks for 0 (every listing's).
pub use super::rules::DEFAULT_PAGE as DEFAULT_MESSAGE_PAGE;
/// The follow-up rule (M4) is the rules'.
pub use super::rules::inbox::{FOLLOW_UP_BY, FOLLOW_UP_INTERRUPTED, FOLLOW_UP_MESSAGES};

/// The most messages a thread may have pending when the host names no limit (a setting's
/// default, so it lives with the config).
pub use crate::config::DEFAULT_MAX_INBOX;

/// The inbox of every thread (the contract, docs/contract.md, section 9).
///
/// Every method is atomic with respect to every other call on any instance of the same
/// backend. None panics on any input or stored state.
#[async_trait]
pub trait Inbox: Send + Sync + fmt::Debug + 'static {
    /// M1: stores `new` as the thread's next message and, for a `follow_up` sent to a thread
    /// with no live work, enqueues the follow-up dispatches that answer the pending messages
    /// (M4, case a), all in one atomic step.
    ///
    /// # Errors
    ///
    /// `Invalid` for a bad thread or message (naming the field), or a follow-up to a thread
    /// that never ran an agent and names none; `Limit` when the thread already has
    /// `max_pending` pending messages. A refused send stores nothing.
    async fn send(&self, thread: &str, new: NewMessage, max_pending: u64) -> StoreResult<Sent>;

    /// M2: acknowledges message `seq` of `thread` through the claim `fence`: marks it acked
    /// and appends it to the thread log (data: its payload; note: the rest) in one atomic
    /// step; returns the entry's sequence. A repeat by the same dispatch returns the same
    /// sequence and changes nothing.
    ///
    /// # Errors
    ///
    /// The fence's refusals, as a fenced append's (`LostClaim`, `NotClaimed`, `StaleEpoch`);
    /// `Invalid` when there is no such message or it was discarded; `Duplicate` (holder: the
    /// acking dispatch) when another dispatch acked it.
    async fn ack_message(&self, thread: &str, seq: u64, fence: &Fence) -> StoreResult<u64>;

    /// M3: discards every pending message of `thread` with a sequence at or below `through`;
    /// returns how many.
    async fn discard_messages(&self, thread: &str, through: u64) -> StoreResult<usize>;

    /// One message, if stored.
    async fn message(&self, thread: &str, seq: u64) -> StoreResult<Option<Message>>;

    /// A page of the thread's messages, oldest first.
    async fn messages(&self, thread: &str, filter: &MessageFilter) -> StoreResult<Vec<Message>>;

    /// The thread's inbox watermarks.
    async fn inbox(&self, thread: &str) -> StoreResult<InboxMarks>;

    /// Removes acked and discarded messages settled before `older_than`; never a pending one.
    /// Returns how many.
    async fn purge_messages(&self, older_than: u64) -> StoreResult<usize>;

    /// Pending messages across every thread (for the `homing_messages_pending` gauge).
    async fn pending_total(&self) -> StoreResult<u64>;

    /// A watch of `thread`: fires after anything of the thread may have changed (a message
    /// sent, acked or discarded, a dispatch written, an entry appended). A hint: the waiter
    /// reads again after it fires. Create it before the read it guards.
    fn watch(&self, thread: &str) -> ThreadWatch;

    /// The largest message payload this backend takes.
    fn max_message(&self) -> u64;
}

/// A registration for changes to one thread ([`Inbox::watch`]).
#[derive(Debug)]
pub struct ThreadWatch {
    rx: watch::Receiver<u64>,
    _count: WatchCount,
}

impl ThreadWatch {
    /// Resolves once the thread may have changed since the watch was made or last fired.
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            // The registry went away with its store: nothing will ever fire.
            std::future::pending::<()>().await;
        }
    }
}

/// Keeps [`Watches::open`] counting a live watch.
#[derive(Debug)]
struct WatchCount(std::sync::Arc<AtomicUsize>);

impl Drop for WatchCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The watches of one store instance, by thread: what a backend notifies after a write.
/// With no watch open, a notification costs one atomic load.
#[derive(Debug, Default)]
pub struct Watches {
    senders: Mutex<HashMap<String, watch::Sender<u64>>>,
    open: std::sync::Arc<AtomicUsize>,
}

impl Watches {
    /// A new registration for `thread`.
    pub fn watch(&self, thread: &str) -> ThreadWatch {
        let mut senders = self
            .senders
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Drop registrations nobody holds any more, so the map stays as small as the waits.
        if senders.len() > 64 {
            senders.retain(|_, tx| tx.receiver_count() > 0);
        }
        let rx = senders
            .entry(thread.to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        self.open.fetch_add(1, Ordering::SeqCst);
        ThreadWatch {
            rx,
            _count: WatchCount(self.open.clone()),
        }
    }

    /// How many watches are open.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// The threads with a watch open.
    pub fn threads(&self) -> Vec<String> {
        let senders = self
            .senders
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        senders
            .iter()
            .filter(|(_, tx)| tx.receiver_count() > 0)
            .map(|(thread, _)| thread.clone())
            .collect()
    }

    /// Wakes the watches of `thread`.
    pub fn notify(&self, thread: &str) {
        if self.open() == 0 {
            return;
        }
        let mut senders = self
            .senders
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(tx) = senders.get(thread) {
            if tx.receiver_count() == 0 {
                senders.remove(thread);
            } else {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[tokio::test]
    async fn a_watch_made_before_a_change_sees_it() {
        let watches = Watches::default();
        watches.notify("t");
        let mut w = watches.watch("t");
        assert_eq!(watches.open(), 1);
        watches.notify("other");
        watches.notify("t");
        tokio::time::timeout(std::time::Duration::from_secs(5), w.changed())
            .await
            .expect("the notification reaches the watch");
        drop(w);
        assert_eq!(watches.open(), 0);
    }
}
