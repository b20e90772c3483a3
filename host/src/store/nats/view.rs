//! The local projection of the mailbox: every record of the stream as last seen by this
//! instance's watcher (or written by this instance), and the claim index built from them.
//!
//! The view may lag the server. It is trusted only for what a compare-and-set then confirms:
//! every write names the stream sequence of each record it replaces, so a decision taken on a
//! stale view fails at the server and is retried after the view caught up. Refusals read from
//! the view (not found, not claimed, nothing to claim) are confirmed the same way: the caller
//! waits for the view to reach the stream's last sequence and decides again.

use std::collections::{BTreeSet, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::store::model::{Dispatch, Status};
use crate::store::{StoreError, StoreResult};

/// A dispatch as stored: the record and the settlement that made it terminal, so a holder
/// repeating its settling call with the same token gets the record back (SPEC section 2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    /// The record.
    #[serde(flatten)]
    pub d: Dispatch,
    /// The token and operation that settled it, when a holder did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled: Option<(String, String)>,
}

/// The holder of a thread: a copy of its dispatch's claim, written in the same atomic batch as
/// the dispatch record, so the two never disagree. Fenced appends are checked against it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderRec {
    /// The claimed dispatch.
    pub id: String,
    /// Its claim token.
    pub token: String,
    /// Its lease.
    pub lease_until: u64,
}

/// Everything per thread that one compare-and-set must decide: its epoch, its holder, its
/// place in the fairness order and its log watermarks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadRec {
    /// Bumped by every interrupt.
    pub epoch: u64,
    /// The live claim on the thread, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<HolderRec>,
    /// The stream position when the thread was last served (fairness across threads).
    #[serde(default)]
    pub served: u64,
    /// Highest sequence of the thread log (reserved and visible are one here).
    #[serde(default)]
    pub latest: u64,
    /// Log entries at or below this are trimmed.
    #[serde(default)]
    pub trimmed: u64,
}

/// A record and the stream sequence of the message that holds it. `value` is `None` for a
/// subject whose last message is a tombstone (a purged dispatch).
#[derive(Debug, Clone)]
pub struct Entry<T> {
    /// The stream sequence of the subject's last message (what a compare-and-set names).
    pub seq: u64,
    /// The decoded record.
    pub value: Option<T>,
}

/// What one stream message holds, decoded from its subject and payload.
#[derive(Debug, Clone)]
pub enum Record {
    /// `d.<id>`: a dispatch, or a tombstone.
    Dispatch(String, Option<Box<Stored>>),
    /// `t.<thread>`: a thread record.
    Thread(String, ThreadRec),
    /// `k.<thread>.<key>`: the dispatch holding a dedupe key, or a tombstone.
    Dedupe(String, String, Option<String>),
    /// `e.<thread>.<seq>`: a log entry (not kept in the view).
    LogEntry,
}

/// The ordering key of a ready dispatch inside its thread: priority, then age, then id.
type Rank = (u8, u64, String);

/// One agent's claim index.
#[derive(Debug, Default)]
struct Lanes {
    /// Ready (available) queued dispatches per thread, best first.
    ready: HashMap<String, BTreeSet<Rank>>,
    /// Threads that can be served now: (best priority, served, best age, thread).
    open: BTreeSet<(u8, u64, u64, String)>,
    /// The key each thread has in `open`.
    open_key: HashMap<String, (u8, u64, u64)>,
    /// Queued dispatches not yet available: (available_at, id).
    delayed: BTreeSet<(u64, String)>,
}

/// The projection.
#[derive(Debug, Default)]
pub struct View {
    /// The highest stream sequence applied.
    pub pos: u64,
    dispatches: HashMap<String, Entry<Stored>>,
    threads: HashMap<String, Entry<ThreadRec>>,
    dedupe: HashMap<(String, String), Entry<String>>,
    corrupt: HashMap<String, String>,
    lanes: HashMap<String, Lanes>,
    /// Ids of claimed dispatches (for reclaim).
    claimed: HashSet<String>,
    /// How many dispatches are queued or claimed.
    live: usize,
    /// Threads a local claim is deciding on right now; other local claims skip them.
    reserved: HashSet<String>,
}

impl View {
    /// Applies one message. Older sequences than the one held for the key are ignored, so the
    /// watcher can deliver what this instance already applied from its own write.
    pub fn apply(&mut self, seq: u64, record: Record) {
        self.pos = self.pos.max(seq);
        match record {
            Record::Dispatch(id, value) => self.apply_dispatch(id, seq, value),
            Record::Thread(name, value) => {
                if self.threads.get(&name).is_some_and(|e| e.seq >= seq) {
                    return;
                }
                self.threads.insert(
                    name.clone(),
                    Entry {
                        seq,
                        value: Some(value),
                    },
                );
                self.refresh_thread(&name);
            }
            Record::Dedupe(thread, key, value) => {
                let k = (thread, key);
                if self.dedupe.get(&k).is_some_and(|e| e.seq >= seq) {
                    return;
                }
                self.dedupe.insert(k, Entry { seq, value });
            }
            Record::LogEntry => {}
        }
    }

    /// Records that a key's last message could not be decoded.
    pub fn mark_corrupt(&mut self, seq: u64, key: String, reason: String) {
        self.pos = self.pos.max(seq);
        self.corrupt.insert(key, reason);
    }

    fn apply_dispatch(&mut self, id: String, seq: u64, value: Option<Box<Stored>>) {
        let value = value.map(|b| *b);
        if self.dispatches.get(&id).is_some_and(|e| e.seq >= seq) {
            return;
        }
        self.corrupt.remove(&format!("dispatches/{id}"));
        let old = self.dispatches.insert(
            id.clone(),
            Entry {
                seq,
                value: value.clone(),
            },
        );
        if let Some(old) = old.and_then(|e| e.value) {
            self.unindex(&old.d);
        }
        if let Some(new) = value {
            self.index(&new.d);
        }
    }

    fn index(&mut self, d: &Dispatch) {
        match d.status {
            Status::Queued => {
                self.live += 1;
                let lanes = self.lanes.entry(d.agent.clone()).or_default();
                // Everything goes through `delayed`; `promote` moves it when due. A dispatch
                // available at once is promoted on the next claim, which runs `promote` first.
                lanes.delayed.insert((d.available_at, d.id.clone()));
            }
            Status::Claimed => {
                self.live += 1;
                self.claimed.insert(d.id.clone());
            }
            _ => {}
        }
    }

    fn unindex(&mut self, d: &Dispatch) {
        match d.status {
            Status::Queued => {
                self.live = self.live.saturating_sub(1);
                if let Some(lanes) = self.lanes.get_mut(&d.agent) {
                    lanes.delayed.remove(&(d.available_at, d.id.clone()));
                    let mut emptied = false;
                    if let Some(set) = lanes.ready.get_mut(&d.thread) {
                        set.remove(&(d.priority, d.created_at, d.id.clone()));
                        emptied = set.is_empty();
                    }
                    if emptied {
                        lanes.ready.remove(&d.thread);
                    }
                }
                self.refresh_lane(&d.agent, &d.thread);
            }
            Status::Claimed => {
                self.live = self.live.saturating_sub(1);
                self.claimed.remove(&d.id);
            }
            _ => {}
        }
    }

    /// Moves every delayed dispatch of `agent` whose time has come into its thread's lane.
    pub fn promote(&mut self, agent: &str, now: u64) {
        let Some(lanes) = self.lanes.get_mut(agent) else {
            return;
        };
        let mut due = Vec::new();
        while let Some(first) = lanes.delayed.first() {
            if first.0 > now {
                break;
            }
            if let Some(item) = lanes.delayed.pop_first() {
                due.push(item.1);
            }
        }
        let mut touched = Vec::new();
        for id in due {
            let Some(d) = self.dispatches.get(&id).and_then(|e| e.value.as_ref()) else {
                continue;
            };
            let d = &d.d;
            if d.status != Status::Queued {
                continue;
            }
            if let Some(lanes) = self.lanes.get_mut(agent) {
                lanes.ready.entry(d.thread.clone()).or_default().insert((
                    d.priority,
                    d.created_at,
                    d.id.clone(),
                ));
            }
            touched.push(d.thread.clone());
        }
        for thread in touched {
            self.refresh_lane(agent, &thread);
        }
    }

    /// Recomputes whether the lane of (agent, thread) is open, and its place.
    fn refresh_lane(&mut self, agent: &str, thread: &str) {
        let held = self
            .threads
            .get(thread)
            .and_then(|e| e.value.as_ref())
            .is_some_and(|t| t.holder.is_some());
        let served = self
            .threads
            .get(thread)
            .and_then(|e| e.value.as_ref())
            .map_or(0, |t| t.served);
        let Some(lanes) = self.lanes.get_mut(agent) else {
            return;
        };
        if let Some(key) = lanes.open_key.remove(thread) {
            lanes.open.remove(&(key.0, key.1, key.2, thread.to_owned()));
        }
        if held {
            return;
        }
        if let Some(best) = lanes.ready.get(thread).and_then(|set| set.first()) {
            let key = (best.0, served, best.1);
            lanes.open.insert((key.0, key.1, key.2, thread.to_owned()));
            lanes.open_key.insert(thread.to_owned(), key);
        }
    }

    fn refresh_thread(&mut self, thread: &str) {
        let agents: Vec<String> = self
            .lanes
            .iter()
            .filter(|(_, lanes)| lanes.ready.contains_key(thread))
            .map(|(agent, _)| agent.clone())
            .collect();
        for agent in agents {
            self.refresh_lane(&agent, thread);
        }
    }

    /// The best dispatch of `agent` on a thread that is neither held nor reserved by another
    /// local claim: the open lanes in order of priority, then least recently served.
    pub fn pick(&self, agent: &str) -> Option<&Stored> {
        let lanes = self.lanes.get(agent)?;
        for (_, _, _, thread) in &lanes.open {
            if self.reserved.contains(thread) {
                continue;
            }
            let best = lanes.ready.get(thread)?.first()?;
            return self.dispatches.get(&best.2)?.value.as_ref();
        }
        None
    }

    /// Keeps other local claims off `thread` until [`View::release`].
    pub fn reserve(&mut self, thread: &str) -> bool {
        self.reserved.insert(thread.to_owned())
    }

    /// Ends a reservation.
    pub fn release(&mut self, thread: &str) {
        self.reserved.remove(thread);
    }

    /// The dispatch and the sequence of its last message (0 when never written).
    pub fn dispatch(&self, id: &str) -> StoreResult<(u64, Option<&Stored>)> {
        if let Some(reason) = self.corrupt.get(&format!("dispatches/{id}")) {
            return Err(StoreError::Corrupt {
                key: format!("dispatches/{id}"),
                reason: reason.clone(),
            });
        }
        Ok(match self.dispatches.get(id) {
            Some(e) => (e.seq, e.value.as_ref()),
            None => (0, None),
        })
    }

    /// The thread record (a default one for a thread never written) and its sequence.
    pub fn thread(&self, thread: &str) -> StoreResult<(u64, ThreadRec)> {
        if let Some(reason) = self.corrupt.get(&format!("threads/{thread}")) {
            return Err(StoreError::Corrupt {
                key: format!("threads/{thread}"),
                reason: reason.clone(),
            });
        }
        Ok(match self.threads.get(thread) {
            Some(e) => (e.seq, e.value.clone().unwrap_or_default()),
            None => (0, ThreadRec::default()),
        })
    }

    /// The holder of a dedupe key and the sequence of its record.
    pub fn dedupe(&self, thread: &str, key: &str) -> (u64, Option<&str>) {
        match self.dedupe.get(&(thread.to_owned(), key.to_owned())) {
            Some(e) => (e.seq, e.value.as_deref()),
            None => (0, None),
        }
    }

    /// Every stored dispatch (for reads and maintenance; not on the claim path).
    pub fn all(&self) -> impl Iterator<Item = &Stored> {
        self.dispatches.values().filter_map(|e| e.value.as_ref())
    }

    /// The claimed dispatches.
    pub fn claimed(&self) -> impl Iterator<Item = &Stored> {
        self.claimed.iter().filter_map(|id| {
            self.dispatches
                .get(id)
                .and_then(|e| e.value.as_ref())
                .filter(|s| s.d.status == Status::Claimed)
        })
    }

    /// Queued dispatches of one thread.
    pub fn queued_of(&self, thread: &str) -> Vec<&Stored> {
        self.all()
            .filter(|s| s.d.thread == thread && s.d.status == Status::Queued)
            .collect()
    }

    /// Whether any dispatch is queued or claimed.
    pub fn has_live(&self) -> bool {
        self.live > 0
    }

    /// The dedupe records pointing at `id` (to drop with it on purge).
    pub fn dedupe_of(&self, d: &Dispatch) -> Option<(u64, String)> {
        let key = d.dedupe_key.as_ref()?;
        let (seq, holder) = self.dedupe(&d.thread, key);
        (holder == Some(d.id.as_str())).then(|| (seq, key.clone()))
    }
}
