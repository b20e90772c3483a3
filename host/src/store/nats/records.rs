//! The records of the NATS backend's stream as the backend reads and writes them: what one
//! message holds once decoded (`keys` encodes and decodes them), and what the view keeps of
//! each. Below the view and the keys, which both speak of them.

use serde::{Deserialize, Serialize};

use crate::store::inbox::{Message, MessageKind, MessageState};
use crate::store::limits::{Bucket, Holder, Pause};
use crate::store::model::Dispatch;
use crate::store::rules::Found;
use crate::store::waitpoints::Waitpoint;

/// A dispatch as stored: the record and the settlement that made it terminal, so a holder
/// repeating its settling call with the same token gets the record back (the contract, docs/contract.md, section 2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    /// The record.
    #[serde(flatten)]
    pub dispatch: Dispatch,
    /// The token and operation that settled it, when a holder did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled: Option<(String, String)>,
    /// Whether the dispatch has waitpoint records: set on the record that ends it, so that
    /// the archiver and a purge know to move or remove them with it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub waitpoints: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Stored {
    /// The record and its settlement, as the store's rules read them.
    pub(crate) fn found(&self) -> Found<'_> {
        Found {
            dispatch: &self.dispatch,
            settled: self
                .settled
                .as_ref()
                .map(|(token, op)| (token.as_str(), op.as_str())),
        }
    }
}

/// What a thread keeps besides its dispatches and entries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadRec {
    /// Bumped by every interrupt.
    pub epoch: u64,
    /// Log entries at or below this are trimmed (the watermark survives a delete).
    #[serde(default)]
    pub trimmed: u64,
    /// The highest inbox message a follow-up dispatch covers (the contract, section 9.1).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub inbox_followed: u64,
    /// The highest inbox message removed from the tree, so that the inbox's `latest` never
    /// moves back when its last messages are purged.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub inbox_archived: u64,
    /// The thread's last agent as last written with the record (the view also learns it from
    /// the claimed records it applies, see [`View::last_agent`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The record of one flow-control scope (`<p>.lim.<scope>`): the holders of its slots and its
/// bucket (see `limits`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LimitRec {
    /// The holders of its slots as last written (dead ones are pruned by the next write).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<Holder>,
    /// Its bucket (missing: full).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<Bucket>,
}

/// What the view keeps of an inbox message: everything its decisions read, not its payload
/// (which one direct get fetches when it is needed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageHead {
    /// The sender's choice.
    pub kind: MessageKind,
    /// The agent the sender addressed.
    pub agent: Option<String>,
    /// Where it is in its life.
    pub state: MessageState,
    /// The record's size in bytes.
    pub size: u64,
    /// The dispatch that acked it.
    pub acked_by: Option<String>,
    /// The log entry its acknowledgement appended.
    pub log_seq: Option<u64>,
}

impl MessageHead {
    /// The head of `message`, whose record takes `size` bytes.
    pub fn of(message: &Message, size: usize) -> MessageHead {
        MessageHead {
            kind: message.kind,
            agent: message.agent.clone(),
            state: message.state,
            size: size as u64,
            acked_by: message.acked_by.clone(),
            log_seq: message.log_seq,
        }
    }
}

/// A record and the stream sequence of the message that holds it. `value` is `None` for a
/// subject whose last message is a tombstone (a purged dispatch).
#[derive(Debug, Clone)]
pub struct Entry<T> {
    /// The stream sequence of the subject's last message.
    pub seq: u64,
    /// The decoded record.
    pub value: Option<T>,
}

/// What one stream message holds, decoded from its subject and payload.
#[derive(Debug, Clone)]
pub enum Record {
    /// A dispatch of a thread, or a tombstone.
    Dispatch(String, String, Option<Box<Stored>>),
    /// A thread record.
    Thread(String, ThreadRec),
    /// A log entry of a thread (its content is not kept in the view).
    Entry(String, u64),
    /// An inbox message of a thread, by sequence (its payload is not kept in the view).
    Message(String, u64, Box<MessageHead>),
    /// A waitpoint of a thread, by id.
    Waitpoint(String, String, Box<Waitpoint>),
    /// The thread of a caller-chosen id.
    Id(String, String),
    /// A record of a dispatch's journal, or a batch of its deltas (outside every tree; the view
    /// keeps nothing of it).
    Journal(String),
    /// The record of a flow-control scope, by its stored name (outside every tree).
    Limit(String, LimitRec),
    /// A pause by its name, or `None` once resumed (outside every tree).
    Pause(String, Option<Pause>),
    /// A schedule's record, by name (outside every tree; the view keeps nothing of it).
    Schedule(String),
}

impl Record {
    pub(super) fn thread(&self) -> Option<&str> {
        match self {
            Record::Dispatch(t, _, _)
            | Record::Thread(t, _)
            | Record::Entry(t, _)
            | Record::Message(t, _, _)
            | Record::Waitpoint(t, _, _) => Some(t),
            Record::Id(..)
            | Record::Journal(_)
            | Record::Limit(..)
            | Record::Pause(..)
            | Record::Schedule(_) => None,
        }
    }

    /// The thread whose tree holds the record.
    pub fn thread_name(&self) -> Option<&str> {
        self.thread()
    }
}
