//! The local projection of the mailbox: the records of the threads' trees as last seen by this
//! instance's watcher (or written by this instance), and the claim index built from them. A
//! view read for one operation (`fetch`) may also hold archived records (see
//! [`View::apply_archived`]).
//!
//! The view may lag the server. It is trusted only for what a compare-and-set then confirms:
//! every write names the last stream sequence of its thread's subject tree as the view knows
//! it, so a decision taken on a stale view fails at the server and is retried after the view
//! caught up. Refusals read from the view (not found, not claimed) are confirmed the same way:
//! the caller waits for the view to reach the stream's last sequence and decides again.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::keys::Key;
pub use super::records::{Entry, LimitRec, MessageHead, Record, Stored, ThreadRec};
use crate::store::inbox::{InboxMarks, MessageState};
use crate::store::limits::Pause;
use crate::store::model::{Dispatch, Status};
use crate::store::waitpoints::Waitpoint;
use crate::store::{StoreError, StoreResult};

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
    /// Queued dispatches not yet promoted into `ready`: (available_at, id).
    delayed: BTreeSet<(u64, String)>,
}

/// Per thread: the last sequence of its tree and what is derived from its records.
#[derive(Debug, Default)]
struct ThreadState {
    /// The last stream sequence of any message of the thread's tree (what a write names).
    seq: u64,
    record: ThreadRec,
    /// The stream sequence of the message that holds `record` (0: never written): an older
    /// thread record arriving late (this instance's own write, applied after the watcher
    /// delivered a newer one) must not take the epoch back.
    record_seq: u64,
    /// The claimed dispatch, if any.
    held: Option<String>,
    /// The stream sequence of the thread's last claim (fairness across threads).
    served: u64,
    /// The highest log entry ever seen.
    latest: u64,
    /// Queued or claimed dispatches.
    live: BTreeSet<String>,
    /// The highest inbox message sequence seen.
    messages_latest: u64,
    /// Inbox messages by sequence, with the stream sequence of their record: the pending ones
    /// (a lean view drops the others; a view read for one operation keeps them all).
    messages: BTreeMap<u64, (u64, MessageHead)>,
    /// The agent of the record claimed most recently, with the stream sequence it was seen at.
    last_agent: Option<(u64, String)>,
    /// The ids of the thread's waitpoints the view holds.
    waitpoints: BTreeSet<String>,
}

/// What the view keeps of a waitpoint record.
#[derive(Debug, Clone)]
pub struct HeldWaitpoint {
    /// The stream sequence of its record.
    pub seq: u64,
    /// The record; a lean view drops its result (see `whole`).
    pub waitpoint: Waitpoint,
    /// Whether `waitpoint` is the record as stored: false when a lean view dropped its result.
    pub whole: bool,
}

/// The projection.
///
/// A host's view is *lean* ([`View::lean`]): it holds live work only, so its memory follows
/// the queued, claimed and waiting dispatches and their waitpoints (without results), and a
/// small state per thread (its fence, epoch, log watermark, pending messages), not the records
/// the stream retains. A record that settles leaves it, and is
/// read from the server when asked for (a refusal decided on a lean view is confirmed on a fresh read, see
/// `commit`). A settled record's key keeps its sequence (a marker) until the watcher has
/// applied the stream up to it, so that an older message of that record, still on its way,
/// cannot bring it back. A view read for one operation (`fetch`) keeps everything it reads.
#[derive(Debug, Default)]
pub struct View {
    /// The stream sequence up to which the watcher applied every message (this instance's own
    /// writes applied ahead of it do not count).
    pub pos: u64,
    /// Whether settled records and idle threads leave the view.
    lean: bool,
    /// Settled records' sequences, until `pos` passes them (lean views).
    markers: HashMap<String, u64>,
    /// The same, by sequence.
    marker_order: BTreeSet<(u64, String)>,
    /// Settled messages' record sequences, until `pos` passes them (lean views), by stream
    /// sequence: (stream sequence, thread, message sequence).
    message_markers: BTreeSet<(u64, String, u64)>,
    /// Threads whose every dispatch record a view read for one operation holds (a lean view
    /// holds every live dispatch of every thread).
    whole: HashSet<String>,
    dispatches: HashMap<String, Entry<Stored>>,
    /// Ids in `dispatches` read from the archive: a record of the tree replaces them whatever
    /// the sequences (see [`View::apply_archived`]).
    archived: HashSet<String>,
    threads: HashMap<String, ThreadState>,
    ids: HashMap<String, Entry<String>>,
    corrupt: HashMap<String, String>,
    lanes: HashMap<String, Lanes>,
    /// Ids of claimed dispatches (for reclaim).
    claimed: HashSet<String>,
    /// How many dispatches are queued, claimed or waiting.
    live: usize,
    /// Waitpoint records by id: in a lean view, those of the trees but the ones whose dispatch
    /// ended (see [`View::apply_waitpoint`]); in a view read for one operation, everything read.
    waitpoints: HashMap<String, HeldWaitpoint>,
    /// Ids in `waitpoints` read from the archive (a record of the tree replaces them).
    archived_waitpoints: HashSet<String>,
    /// The pending waitpoints, by (timeout, id): what a sweep times out.
    due: BTreeSet<(u64, String)>,
    /// Dropped waitpoints' record sequences, until `pos` passes them (lean views).
    waitpoint_markers: HashMap<String, u64>,
    /// The same, by sequence.
    waitpoint_marker_order: BTreeSet<(u64, String)>,
    /// Threads a local claim is deciding on right now; other local claims skip them.
    reserved: HashSet<String>,
    /// Flow-control scope records by stored name (every one the stream holds).
    limits: HashMap<String, Entry<LimitRec>>,
    /// Pause records by name (`None` once resumed).
    pauses: HashMap<String, Entry<Pause>>,
    /// How many pauses are in force per agent (so a claim of an agent with none looks no
    /// further).
    paused_agents: HashMap<String, usize>,
}

impl View {
    /// A view holding live work only (a host's; see the type).
    pub fn lean() -> View {
        View {
            lean: true,
            ..View::default()
        }
    }

    /// How many dispatch records the view holds.
    pub fn records(&self) -> usize {
        self.dispatches.len()
    }

    /// How many waitpoint records the view holds.
    pub fn waitpoint_count(&self) -> usize {
        self.waitpoints.len()
    }

    /// How many threads the view holds.
    pub fn thread_count(&self) -> usize {
        self.threads.len()
    }

    /// Applies one message the watcher delivered (in stream order) and moves `pos` to it. A
    /// record older than the one held for its key is ignored, so the watcher can deliver what
    /// this instance already applied from its own write.
    pub fn apply(&mut self, seq: u64, record: Record) {
        self.apply_record(seq, record);
        self.advance(seq);
    }

    /// Moves `pos` to `seq` and forgets the markers it passed.
    fn advance(&mut self, seq: u64) {
        self.pos = self.pos.max(seq);
        while let Some((at, _)) = self.marker_order.first()
            && *at <= self.pos
        {
            if let Some((_, id)) = self.marker_order.pop_first() {
                self.markers.remove(&id);
            }
        }
        while self
            .message_markers
            .first()
            .is_some_and(|(at, _, _)| *at <= self.pos)
        {
            self.message_markers.pop_first();
        }
        while let Some((at, _)) = self.waitpoint_marker_order.first()
            && *at <= self.pos
        {
            if let Some((_, id)) = self.waitpoint_marker_order.pop_first() {
                self.waitpoint_markers.remove(&id);
            }
        }
    }

    fn apply_record(&mut self, seq: u64, record: Record) {
        #[cfg(debug_assertions)]
        let checked = record.thread().map(str::to_owned);
        self.apply_record_unchecked(seq, record);
        #[cfg(debug_assertions)]
        if let Some(thread) = checked {
            self.check_thread(&thread);
        }
    }

    /// Debug builds: the cheap consequences of the view's invariant (docs/contract.md, section
    /// 15.1) for `thread` in a lean view: nothing it holds of the thread comes from a message
    /// past the thread's fence.
    #[cfg(debug_assertions)]
    fn check_thread(&self, thread: &str) {
        let Some(state) = self.threads.get(thread) else {
            return;
        };
        if !self.lean {
            return;
        }
        debug_assert!(
            state.record_seq <= state.seq,
            "thread {thread}: record past fence"
        );
        for id in &state.live {
            let seq = self.dispatches.get(id).map_or(0, |e| e.seq);
            debug_assert!(
                seq <= state.seq,
                "thread {thread}: dispatch {id} past fence"
            );
            debug_assert!(
                self.markers.get(id).is_none_or(|at| *at < seq),
                "thread {thread}: live dispatch {id} older than its settled marker"
            );
        }
    }

    fn apply_record_unchecked(&mut self, seq: u64, record: Record) {
        if let Some(thread) = record.thread() {
            let state = self.threads.entry(thread.to_owned()).or_default();
            state.seq = state.seq.max(seq);
        }
        match record {
            Record::Dispatch(thread, id, value) => {
                self.apply_dispatch(&thread, id, seq, value.map(|b| *b))
            }
            Record::Thread(name, value) => {
                if let Some(state) = self.threads.get_mut(&name)
                    && state.record_seq < seq
                {
                    state.record = value;
                    state.record_seq = seq;
                }
            }
            Record::Entry(thread, n) => {
                if let Some(state) = self.threads.get_mut(&thread) {
                    state.latest = state.latest.max(n);
                }
            }
            Record::Message(thread, n, head) => self.apply_message_head(seq, thread, n, *head),
            Record::Waitpoint(thread, id, w) => self.apply_waitpoint(seq, thread, id, *w),
            // A host finds chosen ids on the server when it needs them (an enqueue's write of
            // the id record expects it absent, and reads it after a conflict).
            Record::Journal(_) | Record::Schedule(_) => {}
            Record::Limit(scope, rec) => {
                if self.limits.get(&scope).is_some_and(|e| e.seq >= seq) {
                    return;
                }
                self.corrupt.remove(&format!("limits/{scope}"));
                self.limits.insert(
                    scope,
                    Entry {
                        seq,
                        value: Some(rec),
                    },
                );
            }
            Record::Pause(name, value) => self.apply_pause(seq, name, value),
            Record::Id(..) if self.lean => {}
            Record::Id(id, thread) => {
                if self.ids.get(&id).is_some_and(|e| e.seq >= seq) {
                    return;
                }
                self.ids.insert(
                    id,
                    Entry {
                        seq,
                        value: Some(thread),
                    },
                );
            }
        }
    }

    fn apply_pause(&mut self, seq: u64, name: String, value: Option<Pause>) {
        if self.pauses.get(&name).is_some_and(|e| e.seq >= seq) {
            return;
        }
        if let Some(agent) = value.as_ref().map(|p| p.agent.clone()) {
            *self.paused_agents.entry(agent).or_default() += 1;
        }
        let old = self.pauses.insert(name, Entry { seq, value });
        if let Some(agent) = old.and_then(|e| e.value).map(|p| p.agent)
            && let Some(n) = self.paused_agents.get_mut(&agent)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.paused_agents.remove(&agent);
            }
        }
    }

    fn apply_message_head(&mut self, seq: u64, thread: String, n: u64, head: MessageHead) {
        let marked = self
            .message_markers
            .range((seq, String::new(), 0)..)
            .any(|(_, t, m)| *t == thread && *m == n);
        let Some(state) = self.threads.get_mut(&thread) else {
            return;
        };
        state.messages_latest = state.messages_latest.max(n);
        if marked || state.messages.get(&n).is_some_and(|(at, _)| *at >= seq) {
            return;
        }
        if self.lean && head.state != MessageState::Pending {
            // It leaves the view; its marker keeps an older message of it, still on its way,
            // from bringing it back.
            state.messages.remove(&n);
            if seq > self.pos {
                self.message_markers.insert((seq, thread, n));
            }
            return;
        }
        state.messages.insert(n, (seq, head));
    }

    /// Applies a waitpoint record of a thread's tree.
    ///
    /// A lean view keeps every waitpoint of the trees except those of dispatches that ended:
    /// the record that ends a dispatch drops its waitpoints ([`View::drop_waitpoints`]). Every
    /// write of a waitpoint comes before the record that ends its dispatch in the stream (the
    /// batch that ends it writes the waitpoints it cancels first, and nothing writes the
    /// waitpoint of an ended dispatch), so one dropped never comes back, and a host loading the
    /// trees keeps exactly the waitpoints of live dispatches. The view drops a result (a lean
    /// view never holds one; the operations that answer with it read the record).
    fn apply_waitpoint(&mut self, seq: u64, thread: String, id: String, mut w: Waitpoint) {
        if self.waitpoint_markers.get(&id).is_some_and(|at| *at >= seq) {
            return;
        }
        let archived = self.archived_waitpoints.remove(&id);
        if !archived && self.waitpoints.get(&id).is_some_and(|h| h.seq >= seq) {
            return;
        }
        self.corrupt.remove(&format!("waitpoints/{id}"));
        self.forget_waitpoint(&id);
        let whole = !self.lean || w.result.is_none();
        if self.lean {
            w.result = None;
        }
        if w.is_pending() {
            self.due.insert((w.timeout_at, id.clone()));
        }
        if let Some(state) = self.threads.get_mut(&thread) {
            state.waitpoints.insert(id.clone());
        }
        self.waitpoints.insert(
            id,
            HeldWaitpoint {
                seq,
                waitpoint: w,
                whole,
            },
        );
    }

    /// Takes waitpoint `id` out of the view's indexes; returns what was held.
    fn forget_waitpoint(&mut self, id: &str) -> Option<HeldWaitpoint> {
        let old = self.waitpoints.remove(id)?;
        let w = &old.waitpoint;
        self.due.remove(&(w.timeout_at, id.to_owned()));
        if let Some(state) = self.threads.get_mut(&w.thread) {
            state.waitpoints.remove(id);
        }
        Some(old)
    }

    /// Drops the waitpoints of `dispatch` (of `thread`), which ended (lean views): each keeps
    /// a marker until the watcher passed its record.
    fn drop_waitpoints(&mut self, thread: &str, dispatch: &str) {
        let ids: Vec<String> = match self.threads.get(thread) {
            Some(state) => state
                .waitpoints
                .iter()
                .filter(|id| {
                    self.waitpoints
                        .get(*id)
                        .is_some_and(|h| h.waitpoint.dispatch == dispatch)
                })
                .cloned()
                .collect(),
            None => return,
        };
        for id in ids {
            let Some(old) = self.forget_waitpoint(&id) else {
                continue;
            };
            if old.seq > self.pos {
                if let Some(at) = self.waitpoint_markers.insert(id.clone(), old.seq) {
                    self.waitpoint_marker_order.remove(&(at, id.clone()));
                }
                self.waitpoint_marker_order.insert((old.seq, id));
            }
        }
    }

    /// Applies this instance's own write as soon as the server acknowledged it, ahead of the
    /// watcher. It does not move `pos`: messages of other hosts below `seq` may not be applied
    /// yet, and `pos` is what barriers wait for and where a restarted watcher resumes.
    ///
    /// A write the view already reflects is not applied: one the watcher delivered (`seq` at
    /// or below `pos`), or one of a thread's tree whose fence is at or past `seq` (the watcher
    /// or a later own write of the thread got there first). Between the server's answer and
    /// this call the watcher may have applied the write and what other hosts wrote after it,
    /// and a lean view then no longer holds a record that settled, nor a marker for it once
    /// `pos` passed: applied now, the old record would come back under a current fence
    /// (docs/contract.md, "What a host's view holds").
    pub fn apply_own(&mut self, seq: u64, record: Record) {
        if seq <= self.pos
            || record
                .thread()
                .is_some_and(|thread| self.thread_seq(thread) >= seq)
        {
            return;
        }
        self.apply_record(seq, record);
    }

    /// Decodes one stream message and applies it (a message of no interest only moves `pos`).
    /// An archived copy goes through [`View::apply_archived`].
    pub fn apply_message(&mut self, prefix: &str, seq: u64, subject: &str, payload: &[u8]) {
        let key = Key::parse(prefix, subject);
        if let Some(Key::ArchivedWaitpoint(_, id)) = &key {
            if self.waitpoints.contains_key(id) {
                return;
            }
            match key.map(|key| key.decode(payload)) {
                Some(Ok(Record::Waitpoint(_, id, w))) => self.apply_archived_waitpoint(seq, id, *w),
                Some(Err((key, reason))) => {
                    self.corrupt.insert(key, reason);
                }
                _ => {}
            }
            return;
        }
        if let Some(Key::Archive(_, id)) = &key {
            if self.dispatches.contains_key(id) {
                return;
            }
            match key.map(|key| key.decode(payload)) {
                Some(Ok(Record::Dispatch(_, id, Some(stored)))) => {
                    self.apply_archived(seq, id, *stored)
                }
                Some(Err((key, reason))) => {
                    self.corrupt.insert(key, reason);
                }
                _ => {}
            }
            return;
        }
        match key.map(|key| key.decode(payload)) {
            Some(Ok(record)) => self.apply(seq, record),
            Some(Err((key, reason))) => self.mark_corrupt(seq, key, reason),
            None => self.skip(seq),
        }
    }

    /// Applies a settled record read from the archive, unless the view holds a record of the
    /// tree for its id: a record in the tree is always the newer (the archiver copies a record
    /// out before it deletes it from the tree, and any later version is written to the tree),
    /// whatever the archived copy's sequence. It neither moves `pos` nor the thread's fence
    /// (the archive is outside the tree), nor enters the claim index: only settled records are
    /// archived, and anything else found there is ignored.
    pub fn apply_archived(&mut self, seq: u64, id: String, stored: Stored) {
        if self.dispatches.contains_key(&id) || !stored.dispatch.status.is_terminal() {
            return;
        }
        self.corrupt.remove(&format!("dispatches/{id}"));
        self.archived.insert(id.clone());
        self.dispatches.insert(
            id,
            Entry {
                seq,
                value: Some(stored),
            },
        );
    }

    /// Applies a waitpoint read from the archive, unless the view holds a record of the tree
    /// for it (the same rule as [`View::apply_archived`]). It moves neither `pos` nor the
    /// thread's fence, and is never pending (only waitpoints of ended dispatches are archived).
    pub fn apply_archived_waitpoint(&mut self, seq: u64, id: String, w: Waitpoint) {
        if self.waitpoints.contains_key(&id) || w.is_pending() {
            return;
        }
        self.corrupt.remove(&format!("waitpoints/{id}"));
        self.archived_waitpoints.insert(id.clone());
        self.waitpoints.insert(
            id,
            HeldWaitpoint {
                seq,
                waitpoint: w,
                whole: true,
            },
        );
    }

    /// Sets the last sequence of a thread's tree as read from the server (the fence of the
    /// next write; see `fetch`).
    pub fn set_thread_seq(&mut self, thread: &str, seq: u64) {
        self.threads.entry(thread.to_owned()).or_default().seq = seq;
    }

    /// Records that a key's last message could not be decoded.
    pub fn mark_corrupt(&mut self, seq: u64, key: String, reason: String) {
        self.corrupt.insert(key, reason);
        self.advance(seq);
    }

    /// Moves the view's position on (a message of no interest).
    pub fn skip(&mut self, seq: u64) {
        self.advance(seq);
    }

    fn apply_dispatch(&mut self, thread: &str, id: String, seq: u64, value: Option<Stored>) {
        let archived = self.archived.remove(&id);
        if (!archived && self.dispatches.get(&id).is_some_and(|e| e.seq >= seq))
            || self.markers.get(&id).is_some_and(|at| *at >= seq)
        {
            return;
        }
        self.corrupt.remove(&format!("dispatches/{id}"));
        let settled = value
            .as_ref()
            .is_none_or(|s| s.dispatch.status.is_terminal());
        if self.lean && settled {
            // It leaves the view; its marker stays until the watcher passed it. Its waitpoints,
            // all settled by the write that ended it, leave with it.
            let old = self.dispatches.remove(&id).and_then(|e| e.value);
            self.drop_waitpoints(thread, &id);
            if let Some(old) = old {
                self.unindex(&old.dispatch);
            }
            if let Some(new) = &value {
                self.index(&new.dispatch, seq);
            }
            if seq > self.pos {
                if let Some(at) = self.markers.insert(id.clone(), seq) {
                    self.marker_order.remove(&(at, id.clone()));
                }
                self.marker_order.insert((seq, id));
            }
            return;
        }
        let old = self.dispatches.insert(
            id.clone(),
            Entry {
                seq,
                value: value.clone(),
            },
        );
        if let Some(old) = old.and_then(|e| e.value) {
            self.unindex(&old.dispatch);
        }
        if let Some(new) = value {
            self.index(&new.dispatch, seq);
        }
    }

    fn index(&mut self, d: &Dispatch, seq: u64) {
        let state = self.threads.entry(d.thread.clone()).or_default();
        // A record a holder settled (or gave back) also says when its thread was last served:
        // its claim's own message is gone from the stream once the record moved on, so a view
        // read from the stream later (a restarted host, a client) learns it only from this.
        let settled = matches!(
            d.status,
            Status::Acked | Status::DeadLetter | Status::Waiting
        ) || (d.status == Status::Queued && (d.attempt > 0 || d.resumes > 0));
        let bumped = settled && seq > state.served;
        if bumped {
            state.served = seq;
        }
        // The last agent: the agent of the record claimed most recently (a record's message
        // moves on with its claim, so the latest one of a claimed record says it).
        if (d.claims > 0 || d.status == Status::Claimed)
            && state.last_agent.as_ref().is_none_or(|(at, _)| *at < seq)
        {
            state.last_agent = Some((seq, d.agent.clone()));
        }
        match d.status {
            Status::Queued => {
                self.live += 1;
                state.live.insert(d.id.clone());
                let lanes = self.lanes.entry(d.agent.clone()).or_default();
                // Everything waits in `delayed` until `promote` (run by every claim) finds it
                // due, so an available dispatch is in its lane by the time anyone looks.
                lanes.delayed.insert((d.available_at, d.id.clone()));
            }
            Status::Claimed => {
                self.live += 1;
                state.live.insert(d.id.clone());
                state.held = Some(d.id.clone());
                state.served = seq;
                self.claimed.insert(d.id.clone());
                self.refresh_thread(&d.thread);
            }
            // A waiting dispatch keeps its thread busy, holding no claim.
            Status::Waiting => {
                self.live += 1;
                state.live.insert(d.id.clone());
                state.held = Some(d.id.clone());
                self.refresh_thread(&d.thread);
            }
            _ if bumped => self.refresh_thread(&d.thread),
            _ => {}
        }
    }

    fn unindex(&mut self, d: &Dispatch) {
        match d.status {
            Status::Queued => {
                self.live = self.live.saturating_sub(1);
                if let Some(state) = self.threads.get_mut(&d.thread) {
                    state.live.remove(&d.id);
                }
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
            Status::Claimed | Status::Waiting => {
                self.live = self.live.saturating_sub(1);
                self.claimed.remove(&d.id);
                if let Some(state) = self.threads.get_mut(&d.thread) {
                    state.live.remove(&d.id);
                    if state.held.as_deref() == Some(d.id.as_str()) {
                        state.held = None;
                    }
                }
                self.refresh_thread(&d.thread);
            }
            _ => {}
        }
    }

    /// Takes the queued `d` out of its thread's lane, back among the delayed (it was promoted,
    /// but the clock has since stepped back before its `available_at`).
    pub fn demote(&mut self, d: &Dispatch) {
        let Some(lanes) = self.lanes.get_mut(&d.agent) else {
            return;
        };
        let mut emptied = false;
        if let Some(set) = lanes.ready.get_mut(&d.thread) {
            set.remove(&(d.priority, d.created_at, d.id.clone()));
            emptied = set.is_empty();
        }
        if emptied {
            lanes.ready.remove(&d.thread);
        }
        lanes.delayed.insert((d.available_at, d.id.clone()));
        self.refresh_lane(&d.agent, &d.thread);
    }

    /// Moves every delayed dispatch of `agent` whose time has come into its thread's lane.
    pub fn promote(&mut self, agent: &str, now: u64) {
        let Some(lanes) = self.lanes.get_mut(agent) else {
            return;
        };
        let mut due = Vec::new();
        while lanes.delayed.first().is_some_and(|first| first.0 <= now) {
            if let Some(item) = lanes.delayed.pop_first() {
                due.push(item.1);
            }
        }
        let mut touched = Vec::new();
        for id in due {
            let Some(stored) = self.dispatches.get(&id).and_then(|e| e.value.as_ref()) else {
                continue;
            };
            let d = &stored.dispatch;
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
        let (held, served) = self
            .threads
            .get(thread)
            .map_or((false, 0), |s| (s.held.is_some(), s.served));
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

    /// The head of every open lane of `agent` that no other local claim reserved, in the order
    /// [`View::pick`] would take them.
    pub fn heads(&self, agent: &str) -> impl Iterator<Item = &Stored> {
        self.lanes.get(agent).into_iter().flat_map(move |lanes| {
            lanes
                .open
                .iter()
                .filter(|(_, _, _, thread)| !self.reserved.contains(thread))
                .filter_map(move |(_, _, _, thread)| {
                    let best = lanes.ready.get(thread)?.first()?;
                    self.dispatches.get(&best.2)?.value.as_ref()
                })
        })
    }

    /// The record of a flow-control scope and the sequence of its last message (0: never
    /// written).
    pub fn limit(&self, scope: &str) -> StoreResult<(Option<&LimitRec>, u64)> {
        let name = format!("limits/{scope}");
        if let Some(reason) = self.corrupt.get(&name) {
            return Err(StoreError::Corrupt {
                key: name,
                reason: reason.clone(),
            });
        }
        Ok(self
            .limits
            .get(scope)
            .map_or((None, 0), |e| (e.value.as_ref(), e.seq)))
    }

    /// Whether any pause of `agent` (of the agent or of one of its keys) is in force.
    pub fn has_pauses(&self, agent: &str) -> bool {
        self.paused_agents.contains_key(agent)
    }

    /// The pauses of `agent` in force.
    pub fn pauses_of(&self, agent: &str) -> Vec<Pause> {
        if !self.has_pauses(agent) {
            return Vec::new();
        }
        self.pauses
            .values()
            .filter_map(|e| e.value.as_ref())
            .filter(|p| p.agent == agent)
            .cloned()
            .collect()
    }

    /// Every pause in force.
    pub fn all_pauses(&self) -> Vec<Pause> {
        self.pauses
            .values()
            .filter_map(|e| e.value.as_ref())
            .cloned()
            .collect()
    }

    /// The pause of `name` and the sequence of its last message (0: never written).
    pub fn pause(&self, name: &str) -> (Option<&Pause>, u64) {
        self.pauses
            .get(name)
            .map_or((None, 0), |e| (e.value.as_ref(), e.seq))
    }

    /// Keeps other local claims off `thread` until [`View::release`].
    pub fn reserve(&mut self, thread: &str) {
        self.reserved.insert(thread.to_owned());
    }

    /// Ends a reservation.
    pub fn release(&mut self, thread: &str) {
        self.reserved.remove(thread);
    }

    /// The dispatch, if stored.
    pub fn dispatch(&self, id: &str) -> StoreResult<Option<&Stored>> {
        if let Some(reason) = self.corrupt.get(&format!("dispatches/{id}")) {
            return Err(StoreError::Corrupt {
                key: format!("dispatches/{id}"),
                reason: reason.clone(),
            });
        }
        Ok(self.dispatches.get(id).and_then(|e| e.value.as_ref()))
    }

    /// The sequence of a dispatch record's last message (0 when never written).
    pub fn dispatch_seq(&self, id: &str) -> u64 {
        self.dispatches.get(id).map_or(0, |e| e.seq)
    }

    /// The sequence of the id-index record of a caller-chosen id (0 when absent).
    pub fn id_seq(&self, id: &str) -> u64 {
        self.ids.get(id).map_or(0, |e| e.seq)
    }

    /// The thread record (a default one for a thread never written).
    pub fn thread(&self, thread: &str) -> StoreResult<ThreadRec> {
        if let Some(reason) = self.corrupt.get(&format!("threads/{thread}")) {
            return Err(StoreError::Corrupt {
                key: format!("threads/{thread}"),
                reason: reason.clone(),
            });
        }
        Ok(self
            .threads
            .get(thread)
            .map(|s| s.record.clone())
            .unwrap_or_default())
    }

    /// The last stream sequence of the thread's tree (0 for a thread never written).
    pub fn thread_seq(&self, thread: &str) -> u64 {
        self.threads.get(thread).map_or(0, |s| s.seq)
    }

    /// The dispatch that holds a thread: its claimed or its waiting dispatch.
    pub fn holder(&self, thread: &str) -> Option<&Stored> {
        let id = self.threads.get(thread)?.held.as_ref()?;
        self.dispatches.get(id)?.value.as_ref()
    }

    /// The visible log watermark of a thread.
    pub fn latest(&self, thread: &str) -> u64 {
        self.threads
            .get(thread)
            .map_or(0, |s| s.latest.max(s.record.trimmed))
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
                .filter(|s| s.dispatch.status == Status::Claimed)
        })
    }

    /// The queued, claimed or waiting dispatches of one thread.
    pub fn live_of(&self, thread: &str) -> Vec<&Stored> {
        let Some(state) = self.threads.get(thread) else {
            return Vec::new();
        };
        state
            .live
            .iter()
            .filter_map(|id| self.dispatches.get(id).and_then(|e| e.value.as_ref()))
            .collect()
    }

    /// The thread's last agent: of the record claimed most recently that the view applied,
    /// else as the thread record says.
    pub fn last_agent(&self, thread: &str) -> Option<String> {
        let state = self.threads.get(thread)?;
        state
            .last_agent
            .as_ref()
            .map(|(_, agent)| agent.clone())
            .or_else(|| state.record.agent.clone())
    }

    /// The thread's inbox watermarks.
    pub fn inbox_marks(&self, thread: &str) -> InboxMarks {
        let Some(state) = self.threads.get(thread) else {
            return InboxMarks::default();
        };
        InboxMarks {
            latest: state.messages_latest.max(state.record.inbox_archived),
            pending: state
                .messages
                .values()
                .filter(|(_, h)| h.state == MessageState::Pending)
                .count() as u64,
            followed: state.record.inbox_followed,
        }
    }

    /// Up to `limit` sequences of the thread's messages above `after`, in `state` when given,
    /// oldest first.
    pub fn message_seqs(
        &self,
        thread: &str,
        after: u64,
        state: Option<MessageState>,
        limit: usize,
    ) -> Vec<u64> {
        let Some(thread) = self.threads.get(thread) else {
            return Vec::new();
        };
        thread
            .messages
            .range(after.saturating_add(1)..)
            .filter(|(_, (_, head))| state.is_none_or(|s| s == head.state))
            .map(|(seq, _)| *seq)
            .take(limit)
            .collect()
    }

    /// The pending messages of the thread with a sequence above `after`, oldest first.
    pub fn pending_after(&self, thread: &str, after: u64) -> Vec<(u64, &MessageHead)> {
        let Some(state) = self.threads.get(thread) else {
            return Vec::new();
        };
        state
            .messages
            .range(after.saturating_add(1)..)
            .filter(|(_, (_, h))| h.state == MessageState::Pending)
            .map(|(n, (_, h))| (*n, h))
            .collect()
    }

    /// Whether the thread has a pending message above `after` (without collecting them).
    pub fn has_pending_after(&self, thread: &str, after: u64) -> bool {
        self.threads.get(thread).is_some_and(|state| {
            state
                .messages
                .range(after.saturating_add(1)..)
                .any(|(_, (_, h))| h.state == MessageState::Pending)
        })
    }

    /// The head of message `n` of the thread, if the view holds it (a lean view holds pending
    /// messages only).
    pub fn message(&self, thread: &str, n: u64) -> Option<&MessageHead> {
        self.threads.get(thread)?.messages.get(&n).map(|(_, h)| h)
    }

    /// The stream sequence of the record of message `n` the view holds.
    pub fn message_at(&self, thread: &str, n: u64) -> Option<u64> {
        self.threads
            .get(thread)?
            .messages
            .get(&n)
            .map(|(at, _)| *at)
    }

    /// Pending messages across every thread.
    pub fn pending_total(&self) -> u64 {
        self.threads
            .values()
            .map(|s| {
                s.messages
                    .values()
                    .filter(|(_, h)| h.state == MessageState::Pending)
                    .count() as u64
            })
            .sum()
    }

    /// Records that every dispatch record of `thread` was read into this view.
    pub fn mark_whole(&mut self, thread: &str) {
        self.whole.insert(thread.to_owned());
    }

    /// Whether the view holds every live dispatch of `thread` (a lean view always does).
    pub fn knows_live(&self, thread: &str) -> bool {
        self.lean || self.whole.contains(thread)
    }

    /// Whether any dispatch is queued, claimed or waiting.
    pub fn has_live(&self) -> bool {
        self.live > 0
    }

    /// Waitpoint `id`, if the view holds it.
    pub fn waitpoint(&self, id: &str) -> StoreResult<Option<&HeldWaitpoint>> {
        if let Some(reason) = self.corrupt.get(&format!("waitpoints/{id}")) {
            return Err(StoreError::Corrupt {
                key: format!("waitpoints/{id}"),
                reason: reason.clone(),
            });
        }
        Ok(self.waitpoints.get(id))
    }

    /// The waitpoints of `dispatch` (of `thread`) the view holds, oldest first: every one of
    /// a live dispatch (a view read for one operation holds those of the threads it read).
    pub fn waitpoints_of(&self, thread: &str, dispatch: &str) -> Vec<&HeldWaitpoint> {
        let Some(state) = self.threads.get(thread) else {
            return Vec::new();
        };
        let mut out: Vec<&HeldWaitpoint> = state
            .waitpoints
            .iter()
            .filter_map(|id| self.waitpoints.get(id))
            .filter(|h| h.waitpoint.dispatch == dispatch)
            .collect();
        out.sort_by(|a, b| {
            (a.waitpoint.created_at, &a.waitpoint.id)
                .cmp(&(b.waitpoint.created_at, &b.waitpoint.id))
        });
        out
    }

    /// Whether the view holds a waitpoint of `dispatch` (of `thread`).
    pub fn has_waitpoints(&self, thread: &str, dispatch: &str) -> bool {
        self.threads.get(thread).is_some_and(|state| {
            state.waitpoints.iter().any(|id| {
                self.waitpoints
                    .get(id)
                    .is_some_and(|h| h.waitpoint.dispatch == dispatch)
            })
        })
    }

    /// The pending waitpoints whose timeout is before `now`, earliest first, at most `limit`.
    pub fn due_before(&self, now: u64, limit: usize) -> Vec<String> {
        self.due
            .iter()
            .take_while(|(at, _)| *at < now)
            .take(limit)
            .map(|(_, id)| id.clone())
            .collect()
    }

    /// Every pending waitpoint the view holds (a lean view holds all of them).
    pub fn pending_waitpoints(&self) -> impl Iterator<Item = &Waitpoint> {
        self.due
            .iter()
            .filter_map(|(_, id)| self.waitpoints.get(id))
            .map(|h| &h.waitpoint)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::store::model::NewDispatch;
    use crate::store::rules::{HolderOp, Take, queued_record, take};

    fn queued(id: &str) -> Dispatch {
        let new = NewDispatch::new("agent", "t", b"p".to_vec());
        queued_record(id, &new, 0, 1_000)
    }

    fn record(d: &Dispatch) -> Record {
        Record::Dispatch(
            d.thread.clone(),
            d.id.clone(),
            Some(Box::new(Stored {
                dispatch: d.clone(),
                settled: None,
                waitpoints: false,
            })),
        )
    }

    fn claimed(d: &Dispatch) -> Dispatch {
        let Take::Claimed(d) = take(d.clone(), (d.epoch, 0), "w", 30_000, 1_000, true) else {
            panic!("a current record is taken");
        };
        d
    }

    fn settled(d: &Dispatch, op: HolderOp) -> Dispatch {
        let mut d = d.clone();
        op.apply(&mut d, 1_000, Default::default()).unwrap();
        d
    }

    /// Issue 49 (1): this host nacks a dispatch at sequence 2; before its publish reply is
    /// applied, its watcher delivers the nack, another host's claim (3) and dead letter (4).
    /// The late own apply of the nack must not bring the dead-lettered dispatch back.
    #[test]
    fn a_late_own_write_the_watcher_passed_does_not_bring_a_settled_dispatch_back() {
        let mut view = View::lean();
        let d = queued("d1");
        view.apply(1, record(&d));
        let nacked = settled(
            &claimed(&d),
            HolderOp::Nack {
                retry_at: 0,
                error: "again".into(),
            },
        );
        assert_eq!(nacked.status, Status::Queued);
        view.apply(2, record(&nacked));
        let theirs = claimed(&nacked);
        view.apply(3, record(&theirs));
        let dead = settled(
            &theirs,
            HolderOp::DeadLetter {
                error: "give up".into(),
            },
        );
        view.apply(4, record(&dead));
        assert!(
            view.dispatch("d1").unwrap().is_none(),
            "settled: out of the lean view"
        );

        view.apply_own(2, record(&nacked));

        assert!(
            view.dispatch("d1").unwrap().is_none(),
            "the dead letter stays settled"
        );
        view.promote("agent", u64::MAX);
        assert!(view.pick("agent").is_none(), "nothing to claim");
        assert!(!view.has_live());
        assert_eq!(view.thread_seq("t"), 4);
    }

    /// The same when the watcher has not reached the own write's sequence as a whole but the
    /// thread's tree is past it (a later own write of the thread was applied first).
    #[test]
    fn an_own_write_older_than_its_threads_fence_is_not_applied() {
        let mut view = View::lean();
        let d = queued("d1");
        view.apply(1, record(&d));
        let mine = claimed(&d);
        view.apply_own(3, record(&mine));
        let acked = settled(&mine, HolderOp::Ack);
        view.apply_own(4, record(&acked));
        view.apply_own(3, record(&mine));
        assert!(view.dispatch("d1").unwrap().is_none());
        assert!(view.holder("t").is_none());
    }

    /// Issue 49 (2): a late own thread record must not take an interrupt's epoch back.
    #[test]
    fn a_late_thread_record_does_not_take_the_epoch_back() {
        let mut view = View::lean();
        let mine = ThreadRec {
            trimmed: 5,
            ..ThreadRec::default()
        };
        let interrupted = ThreadRec {
            epoch: 1,
            trimmed: 5,
            ..ThreadRec::default()
        };
        view.apply(1, Record::Thread("t".into(), mine.clone()));
        view.apply(2, Record::Thread("t".into(), interrupted.clone()));
        view.apply_own(1, Record::Thread("t".into(), mine.clone()));
        assert_eq!(view.thread("t").unwrap().epoch, 1);

        // Also when the older record comes ahead of the watcher (pos below both).
        let mut view = View::lean();
        view.apply_own(2, Record::Thread("t".into(), interrupted));
        view.apply(1, Record::Thread("t".into(), mine));
        assert_eq!(view.thread("t").unwrap().epoch, 1);
    }

    /// An own write ahead of the watcher is applied, and the watcher's delivery of it later
    /// changes nothing.
    #[test]
    fn an_own_write_ahead_of_the_watcher_is_applied_once() {
        let mut view = View::lean();
        let d = queued("d1");
        view.apply(1, record(&d));
        let mine = claimed(&d);
        view.apply_own(2, record(&mine));
        assert_eq!(view.holder("t").map(|s| s.dispatch.id.as_str()), Some("d1"));
        view.apply(2, record(&mine));
        assert_eq!(view.holder("t").map(|s| s.dispatch.id.as_str()), Some("d1"));
        assert_eq!(view.pos, 2);
        assert_eq!(view.thread_seq("t"), 2);
    }
}
