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

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::model::{Fence, bytes_as_text, check_metadata, check_name};
/// A message's kind and the note its log entry carries are the log's records as much as the
/// inbox's: they live with the records (`model`).
pub use super::model::{MessageKind, MessageNote};
use super::{StoreError, StoreResult};

/// The most messages a thread may have pending when the host names no limit (a setting's
/// default, so it lives with the config).
pub use crate::config::DEFAULT_MAX_INBOX;

/// The room a log entry keeps for the note of the message it records: a message's payload may
/// take a log entry's room less this.
pub const NOTE_ROOM: u64 = 16 * 1024;

/// The most bytes a message's metadata takes, keys and values together.
pub const MAX_MESSAGE_METADATA: usize = 16 * 1024;

/// The page size of [`Inbox::messages`] when the caller gives 0.
pub const DEFAULT_MESSAGE_PAGE: usize = 100;

/// Where a message is in its life. It leaves `pending` once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageState {
    /// Not acknowledged yet: handed to every claim of the thread until one acks it.
    Pending,
    /// Acknowledged by a holder; its log entry records it.
    Acked,
    /// Dropped by an operator before anyone acknowledged it.
    Discarded,
}

impl MessageState {
    /// The stable name used in storage, the CLI and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageState::Pending => "pending",
            MessageState::Acked => "acked",
            MessageState::Discarded => "discarded",
        }
    }
}

impl fmt::Display for MessageState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for MessageState {
    type Err = String;

    fn from_str(s: &str) -> Result<MessageState, String> {
        match s {
            "pending" => Ok(MessageState::Pending),
            "acked" => Ok(MessageState::Acked),
            "discarded" => Ok(MessageState::Discarded),
            other => Err(format!(
                "unknown message state `{}` (expected pending, acked or discarded)",
                other.escape_debug()
            )),
        }
    }
}

/// What a sender submits: a message before the store stamps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewMessage {
    /// Its kind.
    pub kind: MessageKind,
    /// The sender's bytes; not empty.
    pub payload: Vec<u8>,
    /// The sender's annotations.
    pub metadata: BTreeMap<String, String>,
    /// The agent the sender addressed: routes the follow-up dispatch that answers it.
    pub agent: Option<String>,
    /// Who sent it, as the host recorded it (`api:<token name>`, `cli`, `dashboard:<name>`).
    pub sent_by: String,
}

impl NewMessage {
    /// A message of `kind` carrying `payload`, sent by `sent_by`, addressing no agent.
    pub fn new(kind: MessageKind, payload: impl Into<Vec<u8>>, sent_by: impl Into<String>) -> Self {
        NewMessage {
            kind,
            payload: payload.into(),
            metadata: BTreeMap::new(),
            agent: None,
            sent_by: sent_by.into(),
        }
    }

    /// Addresses `agent`.
    pub fn to_agent(mut self, agent: impl Into<String>) -> Self {
        self.agent = Some(agent.into());
        self
    }

    /// Adds one metadata entry.
    pub fn with_metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// Checks what a send requires (section 7 of the contract), with the payload at most
    /// `max_payload` bytes.
    ///
    /// # Errors
    ///
    /// `Invalid` naming the field.
    pub fn validate(&self, thread: &str, max_payload: u64) -> StoreResult<()> {
        let invalid = StoreError::Invalid;
        check_name("thread", thread).map_err(invalid)?;
        if self.payload.is_empty() {
            return Err(invalid("payload: a message must not be empty".into()));
        }
        if self.payload.len() as u64 > max_payload {
            return Err(invalid(format!(
                "payload: {} bytes exceeds the limit of {max_payload} bytes for a message",
                self.payload.len()
            )));
        }
        if let Some(agent) = &self.agent {
            check_name("agent", agent).map_err(invalid)?;
        }
        check_name("sent_by", &self.sent_by).map_err(invalid)?;
        check_metadata(&self.metadata, MAX_MESSAGE_METADATA).map_err(invalid)
    }
}

/// A stored message (section 9.1 of the contract).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// The thread it was sent to.
    pub thread: String,
    /// From 1 per thread, one more per send, never reused.
    pub seq: u64,
    /// The sender's choice.
    pub kind: MessageKind,
    /// The sender's bytes (never empty).
    #[serde(with = "bytes_as_text")]
    pub payload: Vec<u8>,
    /// The sender's annotations.
    pub metadata: BTreeMap<String, String>,
    /// The agent the sender addressed.
    pub agent: Option<String>,
    /// Who sent it.
    pub sent_by: String,
    /// When it was stored (store clock).
    pub sent_at: u64,
    /// Where it is in its life.
    pub state: MessageState,
    /// When it was acked or discarded.
    pub settled_at: Option<u64>,
    /// The dispatch that acked it.
    pub acked_by: Option<String>,
    /// The log entry its acknowledgement appended.
    pub log_seq: Option<u64>,
}

impl Message {
    /// The note the log entry recording this message carries.
    pub fn note(&self) -> MessageNote {
        MessageNote {
            seq: self.seq,
            kind: self.kind,
            metadata: self.metadata.clone(),
            sent_at: self.sent_at,
            sent_by: self.sent_by.clone(),
        }
    }
}

/// A thread's inbox watermarks: all start at 0 and survive restarts; `latest` and `followed`
/// never decrease.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxMarks {
    /// The highest sequence sent.
    pub latest: u64,
    /// How many messages are pending.
    pub pending: u64,
    /// The highest sequence a follow-up dispatch covers.
    pub followed: u64,
}

/// What a send stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// The message as stored.
    pub message: Message,
    /// The follow-up dispatches the send enqueued (M4, case a), by id.
    pub follow_ups: Vec<String>,
}

/// Which messages [`Inbox::messages`] returns: of one state (all when `None`), with a sequence
/// above `after`, oldest first, at most `limit` (0: [`DEFAULT_MESSAGE_PAGE`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageFilter {
    /// Only this state.
    pub state: Option<MessageState>,
    /// Only sequences above this.
    pub after: u64,
    /// Page size.
    pub limit: usize,
    /// With a budget: the page ends after the message that brings the payloads read to it or
    /// more (one is read whenever there is one), so a reader holds at most its budget and one
    /// message, however large they are.
    pub max_bytes: Option<usize>,
}

/// Metadata keys of a follow-up dispatch (M4): who enqueued it and which messages it answers.
pub const FOLLOW_UP_BY: (&str, &str) = ("enqueued-by", "inbox");
/// The metadata key naming the range of messages a follow-up answers (`first-last`).
pub const FOLLOW_UP_MESSAGES: &str = "messages";

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

/// The follow-up dispatches M4 enqueues for `pending` (the thread's pending messages with a
/// sequence above its `followed` watermark, oldest first): one per distinct target, the
/// message's agent or else `default_agent`, each with the range of sequences it answers.
/// Targets come in the order of their first message. Messages with no target (no agent and no
/// default) are left out: the caller refuses or skips them.
pub fn follow_up_targets<'a>(
    pending: impl IntoIterator<Item = (u64, Option<&'a str>)>,
    default_agent: Option<&'a str>,
) -> Vec<(String, u64, u64)> {
    let mut out: Vec<(String, u64, u64)> = Vec::new();
    for (seq, agent) in pending {
        let Some(target) = agent.or(default_agent) else {
            continue;
        };
        match out.iter_mut().find(|(name, _, _)| name == target) {
            Some((_, first, last)) => {
                *first = (*first).min(seq);
                *last = (*last).max(seq);
            }
            None => out.push((target.to_owned(), seq, seq)),
        }
    }
    out
}

/// The dispatch that answers messages `first..=last` of `thread` for `agent` (M4).
pub fn follow_up_dispatch(
    agent: &str,
    thread: &str,
    first: u64,
    last: u64,
) -> super::model::NewDispatch {
    super::model::NewDispatch::new(agent, thread, Vec::new())
        .with_metadata(FOLLOW_UP_BY.0, FOLLOW_UP_BY.1)
        .with_metadata(FOLLOW_UP_MESSAGES, format!("{first}-{last}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn kinds_and_states_parse_their_names() {
        assert_eq!("steer".parse(), Ok(MessageKind::Steer));
        assert_eq!("follow-up".parse(), Ok(MessageKind::FollowUp));
        assert_eq!("follow_up".parse(), Ok(MessageKind::FollowUp));
        assert!("later".parse::<MessageKind>().is_err());
        for state in [
            MessageState::Pending,
            MessageState::Acked,
            MessageState::Discarded,
        ] {
            assert_eq!(state.as_str().parse(), Ok(state));
        }
    }

    #[test]
    fn a_message_is_checked_before_anything_is_stored() {
        let ok = NewMessage::new(MessageKind::Steer, b"hi".to_vec(), "cli");
        assert!(ok.validate("t", 10).is_ok());
        let empty = NewMessage::new(MessageKind::Steer, Vec::new(), "cli");
        assert!(
            matches!(empty.validate("t", 10), Err(StoreError::Invalid(m)) if m.contains("payload"))
        );
        let big = NewMessage::new(MessageKind::Steer, vec![1; 11], "cli");
        assert!(
            matches!(big.validate("t", 10), Err(StoreError::Invalid(m)) if m.contains("10 bytes"))
        );
        assert!(ok.validate(" ", 10).is_err());
        let fat = ok
            .clone()
            .with_metadata("k", "v".repeat(MAX_MESSAGE_METADATA));
        assert!(
            matches!(fat.validate("t", 10), Err(StoreError::Invalid(m)) if m.contains("metadata"))
        );
    }

    #[test]
    fn follow_ups_group_messages_by_target() {
        let got = follow_up_targets(
            [(3, None), (4, Some("b")), (5, None), (6, Some("b"))],
            Some("a"),
        );
        assert_eq!(got, vec![("a".into(), 3, 5), ("b".into(), 4, 6)]);
        assert!(follow_up_targets([(1, None)], None).is_empty());
    }

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
