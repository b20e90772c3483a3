//! Debounce windows (the contract, docs/contract.md, section 17): a queued dispatch that later
//! enqueues with its key join instead of adding work, due a quiet time after the last of them
//! and no later than a longest wait after the first.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{bytes_as_text, check_text};

pub use crate::config::{MAX_WINDOW_ITEMS, MAX_WINDOW_KEY, MAX_WINDOW_WAIT_MS};
/// The window key of the inbox's follow-up window (`[plugins.x.inbox] follow_up_quiet`).
pub const FOLLOW_UP_WINDOW: &str = "follow-up";

/// What a window's dispatch carries of the enqueues that joined it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Gather {
    /// The payload and metadata of the latest enqueue.
    #[default]
    Last,
    /// The payload and metadata of the first enqueue; later ones only move the due time.
    First,
    /// Every enqueue's payload and metadata, in arrival order (the dispatch's `items`); the
    /// dispatch's own payload and metadata are the latest's.
    Collect,
    /// The inbox's follow-up window: messages join it, and its claim is handed them all.
    Inbox,
}

impl Gather {
    /// The name used in the config, the API and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Gather::Last => "last",
            Gather::First => "first",
            Gather::Collect => "collect",
            Gather::Inbox => "inbox",
        }
    }
}

impl std::str::FromStr for Gather {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "last" => Ok(Gather::Last),
            "first" => Ok(Gather::First),
            "collect" => Ok(Gather::Collect),
            other => Err(format!(
                "unknown debounce payload `{}` (expected last, first or collect)",
                other.escape_debug()
            )),
        }
    }
}

/// An enqueue's debounce: join the open window of (thread, `key`), or open one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Debounce {
    /// The window's key on its thread: at most one open window per (thread, key).
    pub key: String,
    /// The window is due this long after its latest enqueue.
    pub quiet_ms: u64,
    /// ... and no later than this long after its first.
    pub max_wait_ms: u64,
    /// What its dispatch carries.
    pub payload: Gather,
    /// The enqueues after which it is sealed and due at once.
    pub max_items: u32,
}

impl Debounce {
    /// A window keyed `key` that gathers the latest payload, due `quiet_ms` after the last
    /// enqueue and at most `max_wait_ms` after the first, of at most 100 items.
    pub fn new(key: impl Into<String>, quiet_ms: u64, max_wait_ms: u64) -> Self {
        Debounce {
            key: key.into(),
            quiet_ms,
            max_wait_ms,
            payload: Gather::Last,
            max_items: 100,
        }
    }

    /// Checks the settings, naming the field that is wrong.
    ///
    /// # Errors
    ///
    /// A sentence starting with the field's name.
    pub fn validate(&self) -> Result<(), String> {
        crate::config::check_window(
            "debounce.",
            &self.key,
            self.quiet_ms,
            self.max_wait_ms,
            self.max_items,
        )?;
        check_text("debounce.key", &self.key)?;
        if self.payload == Gather::Inbox {
            return Err(
                "debounce.payload: `inbox` is the inbox's own window; use last, first or collect"
                    .into(),
            );
        }
        Ok(())
    }
}

/// One enqueue a `collect` window gathered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    /// Its payload.
    #[serde(with = "bytes_as_text")]
    pub payload: Vec<u8>,
    /// Its metadata.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// When the store took it.
    pub enqueued_at: u64,
}

/// A dispatch's debounce window: what joined it and when it is due.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    /// Its key on the thread.
    pub key: String,
    /// What the dispatch carries.
    pub payload: Gather,
    /// Due this long after the latest enqueue ...
    pub quiet_ms: u64,
    /// ... and no later than this long after the first.
    pub max_wait_ms: u64,
    /// Sealed (and due at once) at this many items.
    pub max_items: u32,
    /// When the first enqueue arrived.
    pub first_at: u64,
    /// When the latest arrived.
    pub last_at: u64,
    /// How many enqueues it holds (one for the one that opened it).
    pub count: u32,
    /// No more may join: full, or closed to make room.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sealed: bool,
    /// Every enqueue, oldest first, for a `collect` window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<Item>,
}

impl Window {
    /// The time the window is due: a quiet time after its latest enqueue, at most its longest
    /// wait after its first; at once when sealed.
    pub fn due(&self) -> u64 {
        if self.sealed {
            return self.last_at;
        }
        self.last_at
            .saturating_add(self.quiet_ms)
            .min(self.first_at.saturating_add(self.max_wait_ms))
    }

    /// The bytes its items hold (payloads and metadata).
    pub fn bytes(&self) -> u64 {
        self.items
            .iter()
            .map(|i| {
                i.payload.len() as u64
                    + i.metadata
                        .iter()
                        .map(|(k, v)| (k.len() + v.len()) as u64)
                        .sum::<u64>()
            })
            .sum()
    }
}
