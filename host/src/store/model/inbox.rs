//! The inbox's records (the contract, docs/contract.md, section 9): a message as sent and as
//! stored, its state, a thread's watermarks and what a read of them asks for. The inbox's
//! trait and its watches are `store::inbox`'s; what a settlement makes of pending messages
//! (M4) is the rules'.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{MessageKind, MessageNote, bytes_as_text, check_metadata, check_name};

/// The room a log entry keeps for the note of the message it records: a message's payload may
/// take a log entry's room less this.
pub const NOTE_ROOM: u64 = 16 * 1024;

/// The most bytes a message's metadata takes, keys and values together.
pub const MAX_MESSAGE_METADATA: usize = 16 * 1024;

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

/// What a send does when its thread is busy (a claimed or waiting dispatch holds it); on an
/// idle thread every policy starts a turn, as a follow-up does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBusy {
    /// Waits for the next turn: stored as a follow-up, answered once the run ends.
    Enqueue,
    /// Goes to the live run: stored as a steer.
    Steer,
    /// Refused while the thread is busy, naming what holds it; nothing is stored.
    Reject,
    /// Stops the run that holds the thread (its epoch moves on, so its writes are fenced), marks
    /// the turn's end in the log and answers the message with a follow-up once the thread is
    /// free. A run already stopped this way is not stopped again: the message joins the turn
    /// that follows it.
    Interrupt,
    /// As `Interrupt`, and the entries the stopped dispatch's runs wrote to the log are masked
    /// by the turn's mark ([`TurnMark::masked`](super::TurnMark)): the next turn reads the
    /// log as it was before that dispatch ran. Nothing is deleted.
    Rollback,
    /// As `Rollback`, and the messages the stopped dispatch acknowledged return to pending, so
    /// the next turn is handed them before the new one, in order; the follow-up for the
    /// stopped dispatch's agent carries its payload.
    Merge,
}

impl OnBusy {
    /// Whether the policy stops the run that holds a busy thread.
    pub fn stops(self) -> bool {
        matches!(self, OnBusy::Interrupt | OnBusy::Rollback | OnBusy::Merge)
    }
}

impl OnBusy {
    /// Its stable name (the config's, the API's, the CLI's).
    pub fn as_str(self) -> &'static str {
        match self {
            OnBusy::Enqueue => "enqueue",
            OnBusy::Steer => "steer",
            OnBusy::Reject => "reject",
            OnBusy::Interrupt => "interrupt",
            OnBusy::Rollback => "rollback",
            OnBusy::Merge => "merge",
        }
    }
}

impl fmt::Display for OnBusy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OnBusy {
    type Err = String;

    fn from_str(s: &str) -> Result<OnBusy, String> {
        match s {
            "enqueue" => Ok(OnBusy::Enqueue),
            "steer" => Ok(OnBusy::Steer),
            "reject" => Ok(OnBusy::Reject),
            "interrupt" => Ok(OnBusy::Interrupt),
            "rollback" => Ok(OnBusy::Rollback),
            "merge" => Ok(OnBusy::Merge),
            other => Err(format!(
                "unknown policy `{}` (expected enqueue, steer, reject, interrupt, rollback or merge)",
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
    /// What to do when the thread is busy; with a policy, the store decides the kind (`kind`
    /// is then ignored). `None`: the kind as given.
    pub on_busy: Option<OnBusy>,
    /// When the message starts a turn on an idle thread, the follow-up waits this quiet time
    /// (`.0`, in milliseconds) for more messages to join it, at most `.1` from the first
    /// (`[plugins.x.inbox] follow_up_quiet` and `follow_up_max_wait`). `None`: it is due at
    /// once.
    pub follow_up_window: Option<(u64, u64)>,
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
            on_busy: None,
            follow_up_window: None,
        }
    }

    /// A turn this message starts waits `quiet_ms` for more messages, at most `max_wait_ms`.
    pub fn follow_up_window(mut self, quiet_ms: u64, max_wait_ms: u64) -> Self {
        self.follow_up_window = Some((quiet_ms, max_wait_ms));
        self
    }

    /// Sends under `policy` when the thread is busy.
    pub fn on_busy(mut self, policy: OnBusy) -> Self {
        self.on_busy = Some(policy);
        self
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
    /// The message naming the field (the store's `Invalid`).
    pub fn validate(&self, thread: &str, max_payload: u64) -> Result<(), String> {
        check_name("thread", thread)?;
        if self.payload.is_empty() {
            return Err("payload: a message must not be empty".into());
        }
        if self.payload.len() as u64 > max_payload {
            return Err(format!(
                "payload: {} bytes exceeds the limit of {max_payload} bytes for a message",
                self.payload.len()
            ));
        }
        if let Some(agent) = &self.agent {
            check_name("agent", agent)?;
        }
        check_name("sent_by", &self.sent_by)?;
        check_metadata(&self.metadata, MAX_MESSAGE_METADATA)
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
    /// The policy that took effect when it was sent to a busy thread (none on an idle one),
    /// as the send's answer said. Serialized only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<OnBusy>,
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
    /// The dispatch that held the thread when the message was stored (claimed or waiting),
    /// if one did.
    pub busy: Option<String>,
    /// The dispatch this send interrupted (`interrupt` on a busy thread whose run was not
    /// interrupted already), and the log entry that marks its turn's end.
    pub interrupted: Option<(String, u64)>,
    /// What the send did to a busy thread, as the policy that took effect: `Enqueue` (the
    /// message waits for the next turn; also an `Interrupt` or `Rollback` that found the run
    /// stopped already), `Steer`, `Interrupt` or `Rollback`. `None` when the thread was idle
    /// (every policy then starts a turn, as a follow-up does).
    pub applied: Option<OnBusy>,
    /// The messages a `merge` returned to pending (the stopped dispatch had acknowledged
    /// them), oldest first.
    pub reopened: Vec<u64>,
}

/// Which messages a read of an inbox returns: of one state (all when `None`), with a sequence
/// above `after`, oldest first, at most `limit` (0: the default page, `rules::DEFAULT_PAGE`).
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
        assert!(matches!(empty.validate("t", 10), Err(m) if m.contains("payload")));
        let big = NewMessage::new(MessageKind::Steer, vec![1; 11], "cli");
        assert!(matches!(big.validate("t", 10), Err(m) if m.contains("10 bytes")));
        assert!(ok.validate(" ", 10).is_err());
        let fat = ok
            .clone()
            .with_metadata("k", "v".repeat(MAX_MESSAGE_METADATA));
        assert!(matches!(fat.validate("t", 10), Err(m) if m.contains("metadata")));
    }
}
