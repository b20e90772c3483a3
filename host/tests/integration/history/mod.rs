//! A history checker for the store (issue 5): every operation a test performs is recorded with
//! its inputs, its outcome, the store clock around it and a monotonic timestamp at the start and
//! the end of the call; at the end [`History::check`] classifies every dispatch and checks every
//! thread log.
//!
//! # Classes
//!
//! - **ok**: nothing wrong was seen.
//! - **lost**: an enqueue returned success but the dispatch is missing at the end (or, when the
//!   test drained its work, still live).
//! - **unexpected**: a claim or the final state shows a dispatch no enqueue could have created.
//! - **duplicated**: two claims of one dispatch, or two claims of one thread, were held at the
//!   same instant with the first one's lease not yet run out.
//! - **stale-write**: a holder write (start, result, settle, lease extension, fenced append) was
//!   accepted although its claim was already superseded: the dispatch was claimed again or
//!   reclaimed, the holder had settled it otherwise, the thread was interrupted (guarantee 7),
//!   or, for an append, the lease had run out.
//! - **overwritten**: a terminal state a call returned did not stay terminal (a later claim
//!   took the dispatch, or the final state differs).
//!
//! Thread logs: a watermark read after another observation of it never shows a smaller value
//! (**backwards**); a read never shows an entry while a committed entry below it is missing,
//! never misses an entry committed before the read started, and never shows content other
//! than what was committed at that sequence (**out-of-order**).
//!
//! # Soundness
//!
//! Every verdict is definite: a claim counts as held only between the end of its claim call and
//! the start of the first call that could have ended it (its own settle, a sweep that could
//! have reclaimed it, a takeover once its lease may have run out, ...), and a write counts as
//! stale only when the event that superseded its claim ended before the write started. So a
//! correct store never fails the check, whatever the interleaving; the unit tests at the end of
//! this file feed it bad histories to show each class is caught.

// The recorder and its operations cover the whole store API; the fault tests use a part of it.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use homing::store::{
    Dispatch, Fence, Interrupt, ListCursor, ListFilter, LogEntry, NewDispatch, RunResult, Status,
    Store, StoreError, StoreResult, Watermarks,
};

/// What a holder call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HolderKind {
    /// `record_start`.
    Start,
    /// `record_result`.
    Result,
    /// `ack`.
    Ack,
    /// `nack`.
    Nack,
    /// `dead_letter`.
    DeadLetter,
    /// `complete`.
    Complete,
    /// `extend_lease` by this many milliseconds.
    Extend(u64),
}

impl HolderKind {
    /// Whether a success ends the claim.
    fn settles(self) -> bool {
        matches!(
            self,
            HolderKind::Ack | HolderKind::Nack | HolderKind::DeadLetter | HolderKind::Complete
        )
    }
}

/// One call, with its inputs.
#[derive(Debug, Clone)]
pub enum Op {
    /// `enqueue` of a dispatch with a caller-chosen id.
    Enqueue { id: String, thread: String },
    /// `claim` (or `claim_started`) for an agent.
    Claim { agent: String },
    /// `claim_dispatch` of one id.
    ClaimDispatch { id: String },
    /// A holder call with the claim's token.
    Holder {
        id: String,
        token: String,
        kind: HolderKind,
    },
    /// `supersede_claimed`, by the holder (token) or the control plane (none).
    Supersede { id: String, token: Option<String> },
    /// `cancel`.
    Cancel { id: String },
    /// `interrupt`.
    Interrupt { thread: String },
    /// `reclaim_expired(now, _)`.
    Reclaim { now: u64 },
    /// `append` (fenced when `fence` is set).
    Append {
        thread: String,
        fence: Option<Fence>,
        data: Vec<u8>,
    },
    /// `read(thread, after, limit)`.
    Read {
        thread: String,
        after: u64,
        limit: usize,
    },
    /// `latest`.
    Latest { thread: String },
    /// `watermarks`.
    Marks { thread: String },
    /// `trim` or `delete` (disables the completeness check of reads on that thread).
    Trim { thread: String },
}

/// What a call returned.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Success without a value (`extend_lease` true, trim).
    Done,
    /// A record (enqueue, claims, holder calls, cancel, supersede).
    Record(Box<Dispatch>),
    /// `None` or `false`.
    Nothing,
    /// The records a sweep reclaimed.
    Reclaimed(Vec<Dispatch>),
    /// What an interrupt did.
    Interrupted(Box<Interrupt>),
    /// The sequence an append got, or a `latest`.
    Seq(u64),
    /// The entries a read returned.
    Entries(Vec<LogEntry>),
    /// The watermarks read.
    Marks(Watermarks),
    /// The call failed.
    Failed(StoreError),
}

impl Outcome {
    fn record(&self) -> Option<&Dispatch> {
        match self {
            Outcome::Record(d) => Some(d),
            _ => None,
        }
    }

    fn ok(&self) -> bool {
        !matches!(self, Outcome::Failed(_) | Outcome::Nothing)
    }

    /// A failure that may still have taken effect (a timeout, a lost connection).
    fn ambiguous(&self) -> bool {
        matches!(self, Outcome::Failed(StoreError::Unavailable(_)))
    }
}

/// One recorded call.
#[derive(Debug, Clone)]
pub struct Event {
    /// Who made it (a task, a host).
    pub actor: String,
    /// Monotonic nanoseconds when the call started and when it returned.
    pub start: u64,
    pub end: u64,
    /// The store clock right before and right after the call.
    pub clock_before: u64,
    pub clock_after: u64,
    /// The call.
    pub op: Op,
    /// Its outcome.
    pub outcome: Outcome,
}

/// The classes of [`History::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
/// (Ordered by severity: a dispatch with several findings is counted in the worst class.)
pub enum Class {
    Ok,
    StaleWrite,
    Overwritten,
    Lost,
    Duplicated,
    Unexpected,
}

/// What [`History::check`] found.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// The class of every dispatch seen (the worst one when several apply).
    pub dispatches: BTreeMap<String, Class>,
    /// Thread-log watermarks seen going backwards.
    pub backwards: usize,
    /// Thread-log entries seen out of order, missing or with the wrong content.
    pub out_of_order: usize,
    /// One line per finding.
    pub findings: Vec<String>,
    /// Calls recorded.
    pub events: usize,
}

impl Report {
    /// How many dispatches fell in `class`.
    pub fn count(&self, class: Class) -> usize {
        self.dispatches.values().filter(|c| **c == class).count()
    }

    /// Whether anything other than ok was found.
    pub fn clean(&self) -> bool {
        self.dispatches.values().all(|c| *c == Class::Ok)
            && self.backwards == 0
            && self.out_of_order == 0
    }

    /// Fails the test with the findings unless everything was ok.
    pub fn assert_clean(&self) {
        assert!(self.clean(), "history check failed: {self}");
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} calls, {} dispatches: ok {}, lost {}, unexpected {}, duplicated {}, stale-write {}, \
             overwritten {}; log: backwards {}, out-of-order {}",
            self.events,
            self.dispatches.len(),
            self.count(Class::Ok),
            self.count(Class::Lost),
            self.count(Class::Unexpected),
            self.count(Class::Duplicated),
            self.count(Class::StaleWrite),
            self.count(Class::Overwritten),
            self.backwards,
            self.out_of_order
        )?;
        for line in self.findings.iter().take(30) {
            write!(f, "\n  {line}")?;
        }
        if self.findings.len() > 30 {
            write!(f, "\n  ... {} more", self.findings.len() - 30)?;
        }
        Ok(())
    }
}

/// How the final state is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Live dispatches at the end are fine (the run stopped midway).
    LiveAllowed,
    /// The test drained its work: a dispatch still live at the end counts as lost.
    Drained,
}

/// The recorded calls of one test, shared by its tasks.
#[derive(Debug)]
pub struct History {
    base: Instant,
    events: Mutex<Vec<Event>>,
}

impl Default for History {
    fn default() -> Self {
        History {
            base: Instant::now(),
            events: Mutex::new(Vec::new()),
        }
    }
}

impl History {
    /// An empty history.
    pub fn new() -> Arc<Self> {
        Arc::new(History::default())
    }

    /// Monotonic nanoseconds since the history began.
    pub fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Records a call (tests of the checker build histories by hand with this).
    pub fn push(&self, event: Event) {
        self.events.lock().unwrap().push(event);
    }

    /// The calls recorded so far.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    /// A recorder making calls on `store` as `actor`.
    pub fn recorder(self: &Arc<Self>, store: Store, actor: impl Into<String>) -> Recorder {
        Recorder {
            store,
            history: self.clone(),
            actor: actor.into(),
        }
    }

    /// Checks the history against `final_state` (every dispatch stored at the end).
    pub fn check(&self, final_state: &[Dispatch], expect: Expect) -> Report {
        check(&self.events(), final_state, expect)
    }
}

/// Store calls that record themselves. `Contention` is retried (it changes nothing) and only
/// the last attempt is recorded.
#[derive(Debug, Clone)]
pub struct Recorder {
    /// The store instance called.
    pub store: Store,
    history: Arc<History>,
    /// The name recorded with each call.
    pub actor: String,
}

impl Recorder {
    async fn call<T, Fut, Call, Out>(&self, op: Op, mut call: Call, outcome: Out) -> StoreResult<T>
    where
        Call: FnMut() -> Fut,
        Fut: std::future::Future<Output = StoreResult<T>>,
        Out: FnOnce(&T) -> Outcome,
    {
        let mut tries = 0;
        loop {
            let clock_before = self.store.now();
            let start = self.history.now();
            let result = call().await;
            let end = self.history.now();
            let clock_after = self.store.now();
            if matches!(result, Err(StoreError::Contention(_))) && tries < 10_000 {
                tries += 1;
                tokio::task::yield_now().await;
                continue;
            }
            let outcome = match &result {
                Ok(value) => outcome(value),
                Err(err) => Outcome::Failed(err.clone()),
            };
            self.history.push(Event {
                actor: self.actor.clone(),
                start,
                end,
                clock_before,
                clock_after,
                op,
                outcome,
            });
            return result;
        }
    }

    fn record(d: &Dispatch) -> Outcome {
        Outcome::Record(Box::new(d.clone()))
    }

    fn maybe(d: &Option<Dispatch>) -> Outcome {
        d.as_ref().map_or(Outcome::Nothing, Recorder::record)
    }

    /// `enqueue`. A submission without an id is recorded under the id the store minted (an
    /// ambiguous failure of one cannot be matched to a record later).
    pub async fn enqueue(&self, new: NewDispatch) -> StoreResult<Dispatch> {
        let id = new.id.clone().unwrap_or_default();
        let op = Op::Enqueue {
            id,
            thread: new.thread.clone(),
        };
        let mb = &self.store.mailbox;
        self.call(op, || mb.enqueue(new.clone()), Recorder::record)
            .await
    }

    /// `claim`.
    pub async fn claim(&self, agent: &str, lease: u64) -> StoreResult<Option<Dispatch>> {
        let op = Op::Claim {
            agent: agent.into(),
        };
        let mb = &self.store.mailbox;
        self.call(op, || mb.claim(agent, &self.actor, lease), Recorder::maybe)
            .await
    }

    /// `claim_started`.
    pub async fn claim_started(&self, agent: &str, lease: u64) -> StoreResult<Option<Dispatch>> {
        let op = Op::Claim {
            agent: agent.into(),
        };
        let mb = &self.store.mailbox;
        self.call(
            op,
            || mb.claim_started(agent, &self.actor, lease),
            Recorder::maybe,
        )
        .await
    }

    /// `claim_dispatch`.
    pub async fn claim_dispatch(&self, id: &str, lease: u64) -> StoreResult<Option<Dispatch>> {
        let op = Op::ClaimDispatch { id: id.into() };
        let mb = &self.store.mailbox;
        self.call(
            op,
            || mb.claim_dispatch(id, &self.actor, lease),
            Recorder::maybe,
        )
        .await
    }

    fn holder_op(id: &str, token: &str, kind: HolderKind) -> Op {
        Op::Holder {
            id: id.into(),
            token: token.into(),
            kind,
        }
    }

    /// `record_start`.
    pub async fn start(&self, id: &str, token: &str) -> StoreResult<Dispatch> {
        let mb = &self.store.mailbox;
        let op = Recorder::holder_op(id, token, HolderKind::Start);
        self.call(op, || mb.record_start(id, token), Recorder::record)
            .await
    }

    /// `record_result`.
    pub async fn result(&self, id: &str, token: &str, result: RunResult) -> StoreResult<Dispatch> {
        let mb = &self.store.mailbox;
        let op = Recorder::holder_op(id, token, HolderKind::Result);
        self.call(
            op,
            || mb.record_result(id, token, result.clone()),
            Recorder::record,
        )
        .await
    }

    /// `ack`.
    pub async fn ack(&self, id: &str, token: &str) -> StoreResult<Dispatch> {
        let mb = &self.store.mailbox;
        let op = Recorder::holder_op(id, token, HolderKind::Ack);
        self.call(op, || mb.ack(id, token), Recorder::record).await
    }

    /// `nack`.
    pub async fn nack(
        &self,
        id: &str,
        token: &str,
        retry_at: u64,
        error: &str,
    ) -> StoreResult<Dispatch> {
        let mb = &self.store.mailbox;
        let op = Recorder::holder_op(id, token, HolderKind::Nack);
        self.call(op, || mb.nack(id, token, retry_at, error), Recorder::record)
            .await
    }

    /// `dead_letter`.
    pub async fn dead_letter(&self, id: &str, token: &str, error: &str) -> StoreResult<Dispatch> {
        let mb = &self.store.mailbox;
        let op = Recorder::holder_op(id, token, HolderKind::DeadLetter);
        self.call(op, || mb.dead_letter(id, token, error), Recorder::record)
            .await
    }

    /// `complete`.
    pub async fn complete(
        &self,
        id: &str,
        token: &str,
        result: RunResult,
    ) -> StoreResult<Dispatch> {
        let mb = &self.store.mailbox;
        let op = Recorder::holder_op(id, token, HolderKind::Complete);
        self.call(
            op,
            || mb.complete(id, token, result.clone()),
            Recorder::record,
        )
        .await
    }

    /// `extend_lease`.
    pub async fn extend(&self, id: &str, token: &str, extension: u64) -> StoreResult<bool> {
        let mb = &self.store.mailbox;
        let op = Recorder::holder_op(id, token, HolderKind::Extend(extension));
        self.call(
            op,
            || mb.extend_lease(id, token, extension),
            |ok: &bool| {
                if *ok { Outcome::Done } else { Outcome::Nothing }
            },
        )
        .await
    }

    /// `supersede_claimed`.
    pub async fn supersede(
        &self,
        id: &str,
        token: Option<&str>,
        reason: &str,
    ) -> StoreResult<Option<Dispatch>> {
        let mb = &self.store.mailbox;
        let op = Op::Supersede {
            id: id.into(),
            token: token.map(str::to_owned),
        };
        self.call(
            op,
            || mb.supersede_claimed(id, token, reason),
            Recorder::maybe,
        )
        .await
    }

    /// `cancel`.
    pub async fn cancel(&self, id: &str) -> StoreResult<Option<Dispatch>> {
        let mb = &self.store.mailbox;
        let op = Op::Cancel { id: id.into() };
        self.call(op, || mb.cancel(id), Recorder::maybe).await
    }

    /// `interrupt`.
    pub async fn interrupt(&self, thread: &str) -> StoreResult<Interrupt> {
        let mb = &self.store.mailbox;
        let op = Op::Interrupt {
            thread: thread.into(),
        };
        self.call(
            op,
            || mb.interrupt(thread, "fault test"),
            |i: &Interrupt| Outcome::Interrupted(Box::new(i.clone())),
        )
        .await
    }

    /// `reclaim_expired(now, limit)`.
    pub async fn reclaim(&self, now: u64, limit: usize) -> StoreResult<Vec<Dispatch>> {
        let mb = &self.store.mailbox;
        self.call(
            Op::Reclaim { now },
            || mb.reclaim_expired(now, limit),
            |v: &Vec<Dispatch>| Outcome::Reclaimed(v.clone()),
        )
        .await
    }

    /// `append` (through the claim when `fence` is set).
    pub async fn append(
        &self,
        thread: &str,
        data: &[u8],
        fence: Option<&Fence>,
    ) -> StoreResult<u64> {
        let log = &self.store.log;
        let op = Op::Append {
            thread: thread.into(),
            fence: fence.cloned(),
            data: data.to_vec(),
        };
        self.call(
            op,
            || log.append(thread, data, fence),
            |s: &u64| Outcome::Seq(*s),
        )
        .await
    }

    /// `read`.
    pub async fn read(&self, thread: &str, after: u64, limit: usize) -> StoreResult<Vec<LogEntry>> {
        let log = &self.store.log;
        let op = Op::Read {
            thread: thread.into(),
            after,
            limit,
        };
        self.call(
            op,
            || log.read(thread, after, limit),
            |e: &Vec<LogEntry>| Outcome::Entries(e.clone()),
        )
        .await
    }

    /// `latest`.
    pub async fn latest(&self, thread: &str) -> StoreResult<u64> {
        let log = &self.store.log;
        let op = Op::Latest {
            thread: thread.into(),
        };
        self.call(op, || log.latest(thread), |s: &u64| Outcome::Seq(*s))
            .await
    }

    /// `watermarks`.
    pub async fn marks(&self, thread: &str) -> StoreResult<Watermarks> {
        let log = &self.store.log;
        let op = Op::Marks {
            thread: thread.into(),
        };
        self.call(
            op,
            || log.watermarks(thread),
            |m: &Watermarks| Outcome::Marks(*m),
        )
        .await
    }
}

/// Every dispatch stored, for the final state of a check.
pub async fn snapshot(store: &Store) -> Vec<Dispatch> {
    let mut out = Vec::new();
    loop {
        let page = store
            .mailbox
            .list(&ListFilter {
                limit: 1000,
                after: out.last().map(ListCursor::of),
                ..ListFilter::default()
            })
            .await
            .expect("list every dispatch");
        let n = page.len();
        out.extend(page);
        if n < 1000 {
            return out;
        }
    }
}

/// One claim seen in the history.
#[derive(Debug, Clone)]
struct Held {
    event: usize,
    id: String,
    thread: String,
    token: String,
    epoch: u64,
    lease: u64,
    start: u64,
    end: u64,
    clock_before: u64,
    clock_after: u64,
    /// The start of the first call that could have ended this claim.
    release: u64,
}

struct Checker<'a> {
    events: &'a [Event],
    report: Report,
}

impl Checker<'_> {
    fn flag(&mut self, id: &str, class: Class, why: String) {
        let slot = self.report.dispatches.entry(id.to_owned()).or_insert(class);
        if *slot == Class::Ok || class > *slot {
            *slot = class;
        }
        self.report.findings.push(format!("{class:?} {id}: {why}"));
    }

    fn describe(&self, i: usize) -> String {
        let e = &self.events[i];
        format!(
            "#{i} {} [{}..{}] clock {}..{} {:?} -> {}",
            e.actor,
            e.start,
            e.end,
            e.clock_before,
            e.clock_after,
            e.op,
            short(&e.outcome)
        )
    }
}

fn short(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Record(d) => format!(
            "{} {} attempt {} token {:?}",
            d.id,
            d.status,
            d.attempt,
            d.token()
        ),
        Outcome::Reclaimed(v) => format!(
            "reclaimed {:?}",
            v.iter().map(|d| (&d.id, d.status)).collect::<Vec<_>>()
        ),
        Outcome::Entries(v) => format!("entries {:?}", v.iter().map(|e| e.seq).collect::<Vec<_>>()),
        other => format!("{other:?}"),
    }
}

/// The lease of `held` as known from extensions: (the smallest it can be at `at`, the largest it
/// can be at `at`).
fn lease_bounds(events: &[Event], held: &Held, at: u64) -> (u64, u64) {
    let (mut low, mut high) = (held.lease, held.lease);
    for e in events {
        if let Op::Holder {
            token,
            kind: HolderKind::Extend(ext),
            ..
        } = &e.op
            && *token == held.token
            && e.start > held.start
        {
            if e.end < at && matches!(e.outcome, Outcome::Done) {
                low = low.max(e.clock_before.saturating_add(*ext));
            }
            if e.start < at && (e.outcome.ok() || e.outcome.ambiguous()) {
                high = high.max(e.clock_after.saturating_add(*ext));
            }
        }
    }
    (low, high)
}

/// Checks `events` against the final state.
pub fn check(events: &[Event], final_state: &[Dispatch], expect: Expect) -> Report {
    let mut c = Checker {
        events,
        report: Report {
            events: events.len(),
            ..Report::default()
        },
    };
    let finals: BTreeMap<&str, &Dispatch> =
        final_state.iter().map(|d| (d.id.as_str(), d)).collect();

    // Enqueues: definite (success) and possible (an ambiguous failure).
    let mut enqueued: BTreeMap<String, String> = BTreeMap::new();
    let mut maybe_enqueued: BTreeSet<String> = BTreeSet::new();
    for e in events {
        if let Op::Enqueue { id, .. } = &e.op {
            match &e.outcome {
                Outcome::Record(d) => {
                    enqueued.insert(d.id.clone(), d.thread.clone());
                }
                o if o.ambiguous() => {
                    maybe_enqueued.insert(id.clone());
                }
                _ => {}
            }
        }
    }
    for id in enqueued.keys() {
        c.report.dispatches.insert(id.clone(), Class::Ok);
    }
    let known = |id: &str| enqueued.contains_key(id) || maybe_enqueued.contains(id);

    // Claims.
    let mut helds: Vec<Held> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        if !matches!(e.op, Op::Claim { .. } | Op::ClaimDispatch { .. }) {
            continue;
        }
        let Some(d) = e.outcome.record() else {
            continue;
        };
        let Some(claim) = &d.claim else {
            c.flag(
                &d.id,
                Class::Unexpected,
                format!("a claim returned an unclaimed record: {}", c.describe(i)),
            );
            continue;
        };
        if !known(&d.id) {
            c.flag(
                &d.id,
                Class::Unexpected,
                format!("claimed but never enqueued: {}", c.describe(i)),
            );
        }
        helds.push(Held {
            event: i,
            id: d.id.clone(),
            thread: d.thread.clone(),
            token: claim.token.clone(),
            epoch: d.epoch,
            lease: claim.lease_until,
            start: e.start,
            end: e.end,
            clock_before: e.clock_before,
            clock_after: e.clock_after,
            release: u64::MAX,
        });
    }
    let interrupts: Vec<(usize, &str, u64)> = events
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match (&e.op, &e.outcome) {
            (Op::Interrupt { thread }, Outcome::Interrupted(int)) => {
                Some((i, thread.as_str(), int.epoch))
            }
            (Op::Interrupt { thread }, o) if o.ambiguous() => Some((i, thread.as_str(), 0)),
            _ => None,
        })
        .collect();

    // The end of each claim's definite window: the start of the first call that could end it.
    for slot in &mut helds {
        let held = slot.clone();
        let mut release = u64::MAX;
        for (i, e) in events.iter().enumerate() {
            if e.end < held.start || i == held.event {
                continue;
            }
            let could_end = match (&e.op, &e.outcome) {
                (Op::Holder { token, kind, .. }, outcome) if *token == held.token => {
                    kind.settles() || !outcome.ok()
                }
                (Op::Supersede { id, token }, _) if *id == held.id => {
                    token.is_none() || token.as_deref() == Some(held.token.as_str())
                }
                (Op::Append { fence: Some(f), .. }, o) if f.token == held.token => !o.ok(),
                (Op::Reclaim { now }, outcome) => {
                    let (low, _) = lease_bounds(events, &held, e.start);
                    let returned = match outcome {
                        Outcome::Reclaimed(v) => v.iter().any(|d| d.id == held.id),
                        _ => false,
                    };
                    let interrupted = interrupts
                        .iter()
                        .any(|(j, t, _)| *t == held.thread && events[*j].start < e.end);
                    returned
                        || (*now > low
                            && (interrupted || !matches!(outcome, Outcome::Reclaimed(_))))
                }
                (Op::Claim { .. } | Op::ClaimDispatch { .. }, Outcome::Record(d))
                    if d.id == held.id && d.token() != Some(held.token.as_str()) =>
                {
                    // A takeover: an end only when the lease may have run out.
                    let (low, _) = lease_bounds(events, &held, e.start);
                    e.clock_after > low
                }
                (Op::Claim { .. } | Op::ClaimDispatch { .. }, o) if o.ambiguous() => {
                    let (low, _) = lease_bounds(events, &held, e.start);
                    e.clock_after > low
                }
                _ => false,
            };
            if could_end {
                release = release.min(e.start);
            }
        }
        slot.release = release;
    }

    // Duplicated: two claims of one thread (or one dispatch) definitely held at one instant
    // while the earlier one's lease was live.
    for a in 0..helds.len() {
        for b in 0..helds.len() {
            let (x, y) = (&helds[a], &helds[b]);
            if a == b || x.thread != y.thread || (y.end, b) < (x.end, a) {
                continue;
            }
            let overlap_from = x.end.max(y.end);
            if overlap_from >= x.release.min(y.release) {
                continue;
            }
            let (_, high) = lease_bounds(events, x, y.start);
            if y.clock_before > high {
                continue; // the earlier lease had run out: a takeover, not a duplicate
            }
            let what = if x.id == y.id { "dispatch" } else { "thread" };
            let why = format!(
                "two live claims of one {what}: {} and {}",
                c.describe(x.event),
                c.describe(y.event)
            );
            let (xid, yid) = (x.id.clone(), y.id.clone());
            c.flag(&yid, Class::Duplicated, why.clone());
            if xid != yid {
                c.flag(&xid, Class::Duplicated, why);
            }
        }
    }

    // Stale writes: an accepted holder write whose claim was definitely superseded first.
    let by_token: BTreeMap<&str, &Held> = helds.iter().map(|h| (h.token.as_str(), h)).collect();
    for (i, e) in events.iter().enumerate() {
        let (token, kind, is_append) = match (&e.op, &e.outcome) {
            (Op::Holder { token, kind, .. }, o) if o.ok() => (token.as_str(), Some(*kind), false),
            (Op::Supersede { token: Some(t), .. }, o) if o.ok() => (t.as_str(), None, false),
            (Op::Append { fence: Some(f), .. }, o) if o.ok() => (f.token.as_str(), None, true),
            _ => continue,
        };
        let Some(held) = by_token.get(token).copied() else {
            if let Op::Holder { id, .. } = &e.op {
                c.flag(
                    id,
                    Class::StaleWrite,
                    format!(
                        "a write with a token no claim returned was accepted: {}",
                        c.describe(i)
                    ),
                );
            }
            continue;
        };
        let mut why: Option<String> = None;
        for (j, other) in events.iter().enumerate() {
            if other.end >= e.start || j == i || why.is_some() {
                continue;
            }
            let superseded = match (&other.op, &other.outcome) {
                (Op::Claim { .. } | Op::ClaimDispatch { .. }, Outcome::Record(d)) => {
                    d.id == held.id && d.token() != Some(token) && other.start > held.end
                }
                (Op::Reclaim { .. }, Outcome::Reclaimed(v)) => {
                    other.start > held.end && v.iter().any(|d| d.id == held.id)
                }
                (Op::Supersede { id, .. }, Outcome::Record(_)) => {
                    *id == held.id && other.start > held.end
                }
                (
                    Op::Holder {
                        token: t, kind: k, ..
                    },
                    Outcome::Record(_),
                ) => t == token && k.settles() && Some(*k) != kind,
                (Op::Interrupt { thread }, Outcome::Interrupted(int)) => {
                    *thread == held.thread && int.epoch > held.epoch && other.start > held.start
                        // a repeat of a settle that happened before the interrupt is fine
                        && !kind.is_some_and(|k| {
                            k.settles()
                                && events.iter().any(|s| {
                                    matches!(&s.op, Op::Holder { token: t2, kind: k2, .. } if t2 == token && *k2 == k)
                                        && s.outcome.ok()
                                        && s.end < other.start
                                })
                        })
                }
                _ => false,
            };
            if superseded {
                why = Some(format!("after {}", c.describe(j)));
            }
        }
        if why.is_none() && is_append {
            let (_, high) = lease_bounds(events, held, e.start);
            if e.clock_before > high {
                why = Some(format!("the lease had run out ({high})"));
            }
        }
        if let Some(why) = why {
            let desc = c.describe(i);
            c.flag(
                &held.id.clone(),
                Class::StaleWrite,
                format!("{desc} accepted {why}"),
            );
        }
    }

    // Overwritten: a terminal state a call returned must stay.
    let mut terminal: BTreeMap<String, (Status, usize)> = BTreeMap::new();
    for (i, e) in events.iter().enumerate() {
        let mut note = |d: &Dispatch| {
            if d.status.is_terminal() {
                terminal.entry(d.id.clone()).or_insert((d.status, i));
            }
        };
        match &e.outcome {
            Outcome::Record(d) if !matches!(e.op, Op::Enqueue { .. }) => note(d),
            Outcome::Reclaimed(v) => v.iter().for_each(&mut note),
            Outcome::Interrupted(int) => {
                for id in &int.superseded {
                    terminal
                        .entry(id.clone())
                        .or_insert((Status::Superseded, i));
                }
            }
            _ => {}
        }
    }
    for (id, (status, i)) in &terminal {
        let done = events[*i].end;
        for h in &helds {
            if h.id == *id && h.start > done {
                let why = format!(
                    "{} after it was {status} by {}",
                    c.describe(h.event),
                    c.describe(*i)
                );
                c.flag(id, Class::Overwritten, why);
            }
        }
        match finals.get(id.as_str()) {
            Some(d) if d.status != *status => {
                let why = format!("ends {} after {}", d.status, c.describe(*i));
                c.flag(id, Class::Overwritten, why);
            }
            _ => {}
        }
    }

    // Lost and unexpected against the final state.
    for id in enqueued.keys() {
        match finals.get(id.as_str()) {
            None => c.flag(
                id,
                Class::Lost,
                "acknowledged enqueue, missing at the end".into(),
            ),
            Some(d) if expect == Expect::Drained && !d.status.is_terminal() => {
                c.flag(
                    id,
                    Class::Lost,
                    format!("still {} after the work drained", d.status),
                );
            }
            Some(_) => {}
        }
    }
    for d in final_state {
        if !known(&d.id) {
            c.flag(
                &d.id,
                Class::Unexpected,
                format!("stored ({}) but never enqueued", d.status),
            );
        }
    }

    check_logs(&mut c);
    c.report
}

/// The thread-log checks: watermarks never go back; reads show committed entries in order,
/// completely and with their content.
fn check_logs(c: &mut Checker<'_>) {
    let events = c.events;
    // Per thread: committed appends (seq -> (data, event)), ambiguous append data, trims.
    let mut appends: BTreeMap<&str, BTreeMap<u64, (Vec<u8>, usize)>> = BTreeMap::new();
    let mut ambiguous: BTreeMap<&str, Vec<&[u8]>> = BTreeMap::new();
    let mut trimmed: BTreeSet<&str> = BTreeSet::new();
    // Observations of `latest`: (thread, lower bound, event, exact).
    let mut seen: Vec<(&str, u64, usize, bool)> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        match (&e.op, &e.outcome) {
            (Op::Append { thread, data, .. }, Outcome::Seq(seq)) => {
                if let Some((_, j)) = appends
                    .entry(thread)
                    .or_default()
                    .insert(*seq, (data.clone(), i))
                {
                    c.report.out_of_order += 1;
                    let why = format!(
                        "thread {thread}: sequence {seq} given twice: {} and {}",
                        c.describe(j),
                        c.describe(i)
                    );
                    c.report.findings.push(why);
                }
                seen.push((thread, *seq, i, false));
            }
            (Op::Append { thread, data, .. }, o) if o.ambiguous() => {
                ambiguous.entry(thread).or_default().push(data);
            }
            (Op::Trim { thread }, _) => {
                trimmed.insert(thread);
            }
            (Op::Latest { thread }, Outcome::Seq(seq)) => seen.push((thread, *seq, i, true)),
            (Op::Marks { thread }, Outcome::Marks(m)) => {
                if !(m.reserved >= m.latest && m.latest >= m.trimmed) {
                    c.report.backwards += 1;
                    let why = format!(
                        "thread {thread}: watermarks out of order: {}",
                        c.describe(i)
                    );
                    c.report.findings.push(why);
                }
                seen.push((thread, m.latest, i, true));
            }
            (Op::Read { thread, .. }, Outcome::Entries(v)) => {
                if let Some(last) = v.last() {
                    seen.push((thread, last.seq, i, false));
                }
            }
            _ => {}
        }
    }
    // Watermarks: an exact reading never shows less than anything seen before it began.
    for &(thread, value, i, exact) in &seen {
        if !exact {
            continue;
        }
        if let Some(&(_, before, j, _)) = seen
            .iter()
            .find(|&&(t, v, j, _)| t == thread && v > value && events[j].end < events[i].start)
        {
            c.report.backwards += 1;
            let why = format!(
                "thread {thread}: latest went back from {before} to {value}: {} then {}",
                c.describe(j),
                c.describe(i)
            );
            c.report.findings.push(why);
        }
    }
    // Reads.
    for (i, e) in events.iter().enumerate() {
        let (
            Op::Read {
                thread,
                after,
                limit,
            },
            Outcome::Entries(entries),
        ) = (&e.op, &e.outcome)
        else {
            continue;
        };
        let committed = appends.get(thread.as_str());
        let mut problems: Vec<String> = Vec::new();
        let mut prev = *after;
        for entry in entries {
            if entry.seq <= prev {
                problems.push(format!("entry {} after {prev}", entry.seq));
            }
            prev = entry.seq;
            match committed.and_then(|m| m.get(&entry.seq)) {
                Some((data, _)) if *data != entry.data => {
                    problems.push(format!(
                        "entry {} has content other than committed",
                        entry.seq
                    ));
                }
                Some(_) => {}
                None => {
                    let maybe = ambiguous
                        .get(thread.as_str())
                        .is_some_and(|v| v.contains(&entry.data.as_slice()));
                    if !maybe {
                        problems.push(format!("entry {} was never appended", entry.seq));
                    }
                }
            }
        }
        if !trimmed.contains(thread.as_str())
            && let Some(committed) = committed
        {
            let shown: BTreeSet<u64> = entries.iter().map(|e| e.seq).collect();
            let top = entries.last().map_or(*after, |e| e.seq);
            let full = entries.len() >= *limit;
            for (seq, (_, j)) in committed.range(after + 1..) {
                // Below an entry shown, every committed entry must be shown too (in-order
                // visibility); an entry committed before the read began must be shown unless the
                // page was full.
                let must = *seq < top || (!full && events[*j].end < e.start);
                if must && !shown.contains(seq) {
                    problems.push(format!("committed entry {seq} missing"));
                }
            }
        }
        if !problems.is_empty() {
            c.report.out_of_order += problems.len();
            let why = format!(
                "thread {thread}: {}: {}",
                problems.join(", "),
                c.describe(i)
            );
            c.report.findings.push(why);
        }
    }
}

#[cfg(test)]
mod checker_tests {
    //! The checker must be able to fail: each test feeds it a bad history and expects the class.

    use super::*;
    use homing::store::Claim;

    const T: u64 = 1_000_000;

    fn record(id: &str, thread: &str, status: Status, token: Option<&str>, lease: u64) -> Dispatch {
        Dispatch {
            id: id.into(),
            agent: "agent".into(),
            thread: thread.into(),
            run_id: id.into(),
            payload: Vec::new(),
            metadata: BTreeMap::new(),
            priority: 128,
            available_at: T,
            dedupe_key: None,
            max_attempts: 5,
            attempt: 0,
            claims: u32::from(token.is_some()),
            resumes: 0,
            epoch: 0,
            status,
            claim: token.map(|t| Claim {
                token: t.into(),
                claimed_by: "w".into(),
                lease_until: lease,
            }),
            started_at: None,
            result: None,
            last_error: None,
            created_at: T,
            updated_at: T,
            completed_at: status.is_terminal().then_some(T),
        }
    }

    /// Builds histories with explicit times: each call takes [at, at + 1] and the store clock
    /// reads `clock` throughout.
    #[derive(Default)]
    struct Build {
        events: Vec<Event>,
        clock: u64,
    }

    impl Build {
        fn new() -> Self {
            Build {
                events: Vec::new(),
                clock: T,
            }
        }

        fn at(&mut self, at: u64, op: Op, outcome: Outcome) -> &mut Self {
            self.events.push(Event {
                actor: "test".into(),
                start: at * 10,
                end: at * 10 + 1,
                clock_before: self.clock,
                clock_after: self.clock,
                op,
                outcome,
            });
            self
        }

        fn clock(&mut self, clock: u64) -> &mut Self {
            self.clock = clock;
            self
        }

        fn enqueue(&mut self, at: u64, id: &str, thread: &str) -> &mut Self {
            let d = record(id, thread, Status::Queued, None, 0);
            self.at(
                at,
                Op::Enqueue {
                    id: id.into(),
                    thread: thread.into(),
                },
                Outcome::Record(Box::new(d)),
            )
        }

        fn claim(&mut self, at: u64, id: &str, thread: &str, token: &str, lease: u64) -> &mut Self {
            let d = record(id, thread, Status::Claimed, Some(token), lease);
            self.at(
                at,
                Op::Claim {
                    agent: "agent".into(),
                },
                Outcome::Record(Box::new(d)),
            )
        }

        fn holder(
            &mut self,
            at: u64,
            id: &str,
            thread: &str,
            token: &str,
            kind: HolderKind,
            status: Status,
        ) -> &mut Self {
            let d = record(id, thread, status, None, 0);
            self.at(
                at,
                Op::Holder {
                    id: id.into(),
                    token: token.into(),
                    kind,
                },
                Outcome::Record(Box::new(d)),
            )
        }

        fn ack(&mut self, at: u64, id: &str, thread: &str, token: &str) -> &mut Self {
            self.holder(at, id, thread, token, HolderKind::Ack, Status::Acked)
        }

        fn reclaim(&mut self, at: u64, now: u64, ids: &[(&str, &str)]) -> &mut Self {
            let v = ids
                .iter()
                .map(|(id, thread)| record(id, thread, Status::Queued, None, 0))
                .collect();
            self.at(at, Op::Reclaim { now }, Outcome::Reclaimed(v))
        }

        fn append(
            &mut self,
            at: u64,
            thread: &str,
            data: &str,
            fence: Option<Fence>,
            seq: u64,
        ) -> &mut Self {
            self.at(
                at,
                Op::Append {
                    thread: thread.into(),
                    fence,
                    data: data.as_bytes().to_vec(),
                },
                Outcome::Seq(seq),
            )
        }

        fn read(
            &mut self,
            at: u64,
            thread: &str,
            after: u64,
            entries: &[(u64, &str)],
        ) -> &mut Self {
            let v = entries
                .iter()
                .map(|(seq, data)| LogEntry {
                    seq: *seq,
                    data: data.as_bytes().to_vec(),
                    appended_at: T,
                    note: None,
                })
                .collect();
            self.at(
                at,
                Op::Read {
                    thread: thread.into(),
                    after,
                    limit: 100,
                },
                Outcome::Entries(v),
            )
        }

        fn check(&self, finals: &[Dispatch]) -> Report {
            check(&self.events, finals, Expect::LiveAllowed)
        }
    }

    fn fin(id: &str, thread: &str, status: Status) -> Dispatch {
        record(id, thread, status, None, 0)
    }

    fn fence(id: &str, token: &str) -> Fence {
        Fence {
            dispatch: id.into(),
            token: token.into(),
            epoch: 0,
        }
    }

    #[test]
    fn a_clean_history_is_ok() {
        let mut b = Build::new();
        b.enqueue(1, "d1", "t")
            .claim(2, "d1", "t", "k1", T + 100)
            .append(3, "t", "x", Some(fence("d1", "k1")), 1)
            .ack(4, "d1", "t", "k1")
            .ack(5, "d1", "t", "k1") // an idempotent retry
            .enqueue(6, "d2", "t")
            .claim(7, "d2", "t", "k2", T + 100)
            .read(8, "t", 0, &[(1, "x")]);
        // d2's claim expired and a sweep gave it to another holder: not a duplicate.
        b.clock(T + 200)
            .reclaim(9, T + 200, &[("d2", "t")])
            .claim(10, "d2", "t", "k3", T + 300)
            .append(11, "t", "y", Some(fence("d2", "k3")), 2)
            .ack(12, "d2", "t", "k3")
            .read(13, "t", 0, &[(1, "x"), (2, "y")]);
        let report = b.check(&[fin("d1", "t", Status::Acked), fin("d2", "t", Status::Acked)]);
        report.assert_clean();
        assert_eq!(report.count(Class::Ok), 2);
    }

    #[test]
    fn catches_a_lost_dispatch() {
        let mut b = Build::new();
        b.enqueue(1, "d1", "t").enqueue(2, "d2", "u");
        let report = b.check(&[fin("d2", "u", Status::Queued)]);
        assert_eq!(report.count(Class::Lost), 1, "{report}");
        assert_eq!(report.dispatches["d1"], Class::Lost);
        // Drained: a live dispatch at the end is lost too.
        let drained = check(
            &b.events,
            &[
                fin("d1", "t", Status::Acked),
                fin("d2", "u", Status::Queued),
            ],
            Expect::Drained,
        );
        assert_eq!(drained.dispatches["d2"], Class::Lost, "{drained}");
        assert!(!drained.clean());
    }

    #[test]
    fn catches_an_unexpected_dispatch() {
        let mut b = Build::new();
        b.enqueue(1, "d1", "t").claim(2, "ghost", "t", "k", T + 100);
        let report = b.check(&[
            fin("d1", "t", Status::Queued),
            fin("phantom", "u", Status::Queued),
        ]);
        assert_eq!(report.dispatches["ghost"], Class::Unexpected, "{report}");
        assert_eq!(report.dispatches["phantom"], Class::Unexpected, "{report}");
    }

    #[test]
    fn catches_two_claims_of_one_dispatch() {
        let mut b = Build::new();
        b.enqueue(1, "d1", "t")
            .claim(2, "d1", "t", "k1", T + 100)
            .claim(3, "d1", "t", "k2", T + 100)
            .ack(4, "d1", "t", "k1");
        let report = b.check(&[fin("d1", "t", Status::Acked)]);
        assert_eq!(report.dispatches["d1"], Class::Duplicated, "{report}");
    }

    #[test]
    fn catches_two_live_claims_of_one_thread() {
        let mut b = Build::new();
        b.enqueue(1, "d1", "t")
            .enqueue(2, "d2", "t")
            .claim(3, "d1", "t", "k1", T + 100)
            .claim(4, "d2", "t", "k2", T + 100);
        let report = b.check(&[
            fin("d1", "t", Status::Claimed),
            fin("d2", "t", Status::Claimed),
        ]);
        assert_eq!(report.count(Class::Duplicated), 2, "{report}");
    }

    #[test]
    fn overlapping_claim_calls_that_both_win_are_duplicates() {
        // Concurrent calls: both returned a claim, neither was released.
        let mut b = Build::new();
        b.enqueue(1, "d1", "t");
        let d = record("d1", "t", Status::Claimed, Some("k1"), T + 100);
        let d2 = record("d1", "t", Status::Claimed, Some("k2"), T + 100);
        for (start, end, d) in [(20, 40, d), (25, 35, d2)] {
            b.events.push(Event {
                actor: "x".into(),
                start,
                end,
                clock_before: T,
                clock_after: T,
                op: Op::Claim {
                    agent: "agent".into(),
                },
                outcome: Outcome::Record(Box::new(d)),
            });
        }
        let report = b.check(&[fin("d1", "t", Status::Claimed)]);
        assert_eq!(report.dispatches["d1"], Class::Duplicated, "{report}");
    }

    #[test]
    fn a_claim_released_concurrently_is_not_a_duplicate() {
        // The second claim overlaps the first holder's ack: it may have come after it.
        let mut b = Build::new();
        b.enqueue(1, "d1", "t")
            .enqueue(2, "d2", "t")
            .claim(3, "d1", "t", "k1", T + 100);
        b.events.push(Event {
            actor: "a".into(),
            start: 40,
            end: 60,
            clock_before: T,
            clock_after: T,
            op: Op::Holder {
                id: "d1".into(),
                token: "k1".into(),
                kind: HolderKind::Ack,
            },
            outcome: Outcome::Record(Box::new(fin("d1", "t", Status::Acked))),
        });
        b.events.push(Event {
            actor: "b".into(),
            start: 45,
            end: 55,
            clock_before: T,
            clock_after: T,
            op: Op::Claim {
                agent: "agent".into(),
            },
            outcome: Outcome::Record(Box::new(record(
                "d2",
                "t",
                Status::Claimed,
                Some("k2"),
                T + 100,
            ))),
        });
        b.check(&[
            fin("d1", "t", Status::Acked),
            fin("d2", "t", Status::Claimed),
        ])
        .assert_clean();
    }

    #[test]
    fn catches_a_late_ack_after_a_takeover() {
        // The SIGSTOP case: the lease ran out, a sweep reclaimed, another holder claimed, and the
        // first holder's late ack was accepted.
        let mut b = Build::new();
        b.enqueue(1, "d1", "t").claim(2, "d1", "t", "k1", T + 100);
        b.clock(T + 200)
            .reclaim(3, T + 200, &[("d1", "t")])
            .claim(4, "d1", "t", "k2", T + 300)
            .ack(5, "d1", "t", "k2")
            .ack(6, "d1", "t", "k1");
        let report = b.check(&[fin("d1", "t", Status::Acked)]);
        assert_eq!(report.dispatches["d1"], Class::StaleWrite, "{report}");
    }

    #[test]
    fn catches_a_late_fenced_append() {
        let mut b = Build::new();
        b.enqueue(1, "d1", "t").claim(2, "d1", "t", "k1", T + 100);
        // The lease ran out; no one reclaimed yet, but a fenced append needs a live lease.
        b.clock(T + 101)
            .append(3, "t", "late", Some(fence("d1", "k1")), 1);
        let report = b.check(&[fin("d1", "t", Status::Claimed)]);
        assert_eq!(report.dispatches["d1"], Class::StaleWrite, "{report}");
    }

    #[test]
    fn catches_a_write_after_an_interrupt() {
        let mut b = Build::new();
        b.enqueue(1, "d1", "t")
            .claim(2, "d1", "t", "k1", T + 100)
            .at(
                3,
                Op::Interrupt { thread: "t".into() },
                Outcome::Interrupted(Box::new(Interrupt {
                    epoch: 1,
                    active: None,
                    superseded: Vec::new(),
                })),
            );
        b.holder(4, "d1", "t", "k1", HolderKind::Start, Status::Claimed);
        let report = b.check(&[fin("d1", "t", Status::Superseded)]);
        assert_eq!(report.dispatches["d1"], Class::StaleWrite, "{report}");
    }

    #[test]
    fn catches_a_write_after_settling_otherwise() {
        let mut b = Build::new();
        b.enqueue(1, "d1", "t")
            .claim(2, "d1", "t", "k1", T + 100)
            .holder(3, "d1", "t", "k1", HolderKind::Nack, Status::Queued)
            .ack(4, "d1", "t", "k1");
        let report = b.check(&[fin("d1", "t", Status::Acked)]);
        assert_eq!(report.dispatches["d1"], Class::StaleWrite, "{report}");
    }

    #[test]
    fn catches_an_ack_overwritten_by_a_reclaim() {
        let mut b = Build::new();
        b.enqueue(1, "d1", "t")
            .claim(2, "d1", "t", "k1", T + 100)
            .ack(3, "d1", "t", "k1");
        b.clock(T + 200)
            .reclaim(4, T + 200, &[("d1", "t")])
            .claim(5, "d1", "t", "k2", T + 300);
        let report = b.check(&[fin("d1", "t", Status::Claimed)]);
        assert_eq!(report.dispatches["d1"], Class::Overwritten, "{report}");
    }

    #[test]
    fn catches_a_watermark_going_back() {
        let mut b = Build::new();
        b.append(1, "t", "a", None, 1)
            .append(2, "t", "b", None, 2)
            .at(3, Op::Latest { thread: "t".into() }, Outcome::Seq(1));
        let report = b.check(&[]);
        assert_eq!(report.backwards, 1, "{report}");
        assert!(!report.clean());
    }

    #[test]
    fn catches_an_entry_visible_out_of_order() {
        // Entry 2 visible while committed entry 1 is not (a concurrent append, so only the
        // in-order rule can see it).
        let mut b = Build::new();
        b.events.push(Event {
            actor: "a".into(),
            start: 10,
            end: 100,
            clock_before: T,
            clock_after: T,
            op: Op::Append {
                thread: "t".into(),
                fence: None,
                data: b"a".to_vec(),
            },
            outcome: Outcome::Seq(1),
        });
        b.append(2, "t", "b", None, 2).read(3, "t", 0, &[(2, "b")]);
        let report = b.check(&[]);
        assert_eq!(report.out_of_order, 1, "{report}");
    }

    #[test]
    fn catches_a_missing_or_torn_entry() {
        let mut b = Build::new();
        b.append(1, "t", "a", None, 1)
            .append(2, "t", "b", None, 2)
            .read(3, "t", 0, &[(1, "a")]) // 2 committed before the read: missing
            .read(4, "t", 0, &[(1, "a"), (2, "torn")])
            .read(5, "t", 0, &[(1, "a"), (2, "b"), (3, "ghost")]);
        let report = b.check(&[]);
        assert_eq!(report.out_of_order, 3, "{report}");
    }

    #[test]
    fn catches_a_sequence_given_twice() {
        let mut b = Build::new();
        b.append(1, "t", "a", None, 1).append(2, "t", "b", None, 1);
        assert_eq!(b.check(&[]).out_of_order, 1);
    }
}
