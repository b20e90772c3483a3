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
//!   or, for an append or a message's acknowledgement (fenced alike, M2) or a lease extension
//!   (an expired lease is never extended, section 2.2 of the contract), the lease had run out.
//!   A dispatch the store enqueued itself (an inbox follow-up, M4: an id a send returned, or a
//!   record with metadata `enqueued-by=inbox` on a thread that was sent a message) is expected,
//!   not unexpected, and is judged like an enqueued one.
//! - **overwritten**: a terminal state a call returned did not stay terminal (a later claim
//!   took the dispatch, or the final state differs).
//!
//! Thread logs: a watermark read after another observation of it never shows a smaller value
//! (**backwards**); a read never shows an entry while a committed entry below it is missing,
//! never misses an entry committed before the read started, and never shows content other
//! than what was committed at that sequence (**out-of-order**); an append or acknowledgement
//! that returned before another began got the lower sequence (**out-of-order**, or
//! **ack-order** when an acknowledgement is involved). A message's acknowledgement commits the
//! entry at the sequence it returned, holding the message's payload and a note with its
//! sequence (**ack-order** otherwise); its repeats by the same dispatch commit nothing new.
//!
//! Inbox messages (section 9 of the contract):
//!
//! - **message lost**: a send returned a sequence, and a read of the messages that began after
//!   it does not show it (below the page's end; a read of pending ones may miss it only if an
//!   acknowledgement or discard of it may have been accepted), shows other content, shows it
//!   pending after an acknowledgement of it returned, or discarded with no discard that could
//!   have done it; or a read shows a message no send could have stored.
//! - **acked twice**: two dispatches' acknowledgements of one message both succeeded; one
//!   dispatch's returned two log sequences; reads of the log show two entries naming one message,
//!   or an entry naming it other than the one its acknowledgement returned; a message read as
//!   acked names a dispatch that never acknowledged it or another log entry.
//!
//! Concurrency keys (guarantee 14), from the gated claims (`claim_gated`, and the claim half of
//! `complete_and_claim`) under per-key limits:
//!
//! - **over cap**: at some instant more claims of one key were live than its cap. A claim is
//!   live while it is `claimed` under its token with a lease that runs (`now <= lease_until`),
//!   reclaimed or not: from the moment its lease runs out its slot is free with no write, so a
//!   lapsed claim stops counting at once, and a lapsed claim that is extended afterwards (a
//!   revival, which the store must refuse) counts again from the extension on.
//! - **over rate**: in some window of the store clock one key was claimed more often than its
//!   burst plus its refill allow (widened by the 100 ms a token block may be kept).
//!
//! The message checks judge reads: a run checks that nothing was lost by reading every
//! thread's messages and log at the end. `purge_messages` is not recorded (a purged message
//! would count as lost).
//!
//! # Soundness
//!
//! Every verdict is definite: a claim counts as held only between the end of its claim call and
//! the start of the first call that could have ended it (its own settle, a sweep that could
//! have reclaimed it, a takeover once its lease may have run out, ...), and a write counts as
//! stale only when the event that superseded its claim ended before the write started. A claim
//! counts toward its key's cap only while, besides, a clock reading taken after that instant
//! was at most a lease the claim surely had then; a claim counts toward a rate window only when
//! its whole call lies in it. So a
//! correct store never fails the check, whatever the interleaving; the unit tests at the end of
//! this file feed it bad histories to show each class is caught.

// The recorder and its operations cover the whole store API; the fault tests use a part of it.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use homing::store::inbox::{DEFAULT_MESSAGE_PAGE, FOLLOW_UP_BY};
use homing::store::limits::BLOCK_MS;
use homing::store::{
    ClaimRequest, Dispatch, Fence, Gated, Interrupt, LimitSet, ListCursor, ListFilter, LogEntry,
    Message, MessageFilter, MessageState, NewDispatch, NewMessage, Rate, RunResult, Sent, Status,
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
    /// `claim_gated` under `limits` (alone, or the claim of a `complete_and_claim`, recorded as
    /// two calls with the same times: its completion, then this claim).
    ClaimGated { agent: String, limits: LimitSet },
    /// `load` of one id.
    Load { id: String },
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
    /// `send` of a message with this payload.
    Send { thread: String, payload: Vec<u8> },
    /// `ack_message` of message `seq` through a claim's fence.
    AckMessage {
        thread: String,
        seq: u64,
        fence: Fence,
    },
    /// `discard_messages(thread, through)`.
    Discard { thread: String, through: u64 },
    /// `messages(thread, filter)`, with the page size the store applied.
    Messages {
        thread: String,
        state: Option<MessageState>,
        after: u64,
        limit: usize,
    },
}

impl Op {
    /// Whether the call claims (a plain, a gated or a by-id claim).
    fn claims(&self) -> bool {
        matches!(
            self,
            Op::Claim { .. } | Op::ClaimDispatch { .. } | Op::ClaimGated { .. }
        )
    }
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
    /// What a send stored.
    Sent(Box<Sent>),
    /// The messages a read returned.
    Messages(Vec<Message>),
    /// How many messages a discard settled.
    Count(usize),
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
    /// Inbox messages a send stored that a read missed, showed with other content or in a
    /// state no call explains (an acknowledgement lost, a discard no one made, one never sent).
    pub messages_lost: usize,
    /// Inbox messages acknowledged by two dispatches, recorded in the log twice or at another
    /// entry than their acknowledgement returned.
    pub acked_twice: usize,
    /// Log entries out of real-time order (an acknowledgement or append that returned before
    /// another began got the higher sequence), and message entries without the message's
    /// payload or note.
    pub ack_order: usize,
    /// Times a concurrency key was held by more live claims than its cap (each stretch of
    /// time over the cap counts once).
    pub over_cap: usize,
    /// Windows of the store clock in which a concurrency key was claimed more often than its
    /// rate allows.
    pub over_rate: usize,
    /// Per capped concurrency key: the most claims seen live at one instant, and the cap.
    pub key_peaks: BTreeMap<String, (usize, u32)>,
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
            && self.messages_lost == 0
            && self.acked_twice == 0
            && self.ack_order == 0
            && self.over_cap == 0
            && self.over_rate == 0
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
             overwritten {}; log: backwards {}, out-of-order {}; messages: lost {}, acked twice \
             {}, out of acknowledgement order {}; keys: over cap {}, over rate {}",
            self.events,
            self.dispatches.len(),
            self.count(Class::Ok),
            self.count(Class::Lost),
            self.count(Class::Unexpected),
            self.count(Class::Duplicated),
            self.count(Class::StaleWrite),
            self.count(Class::Overwritten),
            self.backwards,
            self.out_of_order,
            self.messages_lost,
            self.acked_twice,
            self.ack_order,
            self.over_cap,
            self.over_rate
        )?;
        if !self.key_peaks.is_empty() {
            let peaks: Vec<String> = self
                .key_peaks
                .iter()
                .map(|(key, (peak, cap))| format!("{key} {peak}/{cap}"))
                .collect();
            write!(f, " (most live at once: {})", peaks.join(", "))?;
        }
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

    /// Writes every call recorded so far to `path`, one a line (`#index actor [start..end]
    /// clock before..after op -> outcome`, in full), for a failed check to be looked into.
    pub fn dump(&self, path: &std::path::Path) -> std::io::Result<()> {
        use std::io::Write;
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        for (i, e) in self.events().iter().enumerate() {
            writeln!(
                out,
                "#{i} {} [{}..{}] clock {}..{} {:?} -> {:?}",
                e.actor, e.start, e.end, e.clock_before, e.clock_after, e.op, e.outcome
            )?;
        }
        out.flush()
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

/// When a call ran: monotonic nanoseconds and the store clock around it.
#[derive(Debug, Clone, Copy)]
struct Stamp {
    start: u64,
    end: u64,
    clock_before: u64,
    clock_after: u64,
}

impl Recorder {
    /// Runs `call` once, with the times around it.
    async fn timed<T>(&self, call: impl std::future::Future<Output = T>) -> (T, Stamp) {
        let clock_before = self.store.now();
        let start = self.history.now();
        let result = call.await;
        let end = self.history.now();
        let clock_after = self.store.now();
        let stamp = Stamp {
            start,
            end,
            clock_before,
            clock_after,
        };
        (result, stamp)
    }

    /// Records one call that ran at `stamp`.
    fn push<T>(
        &self,
        stamp: Stamp,
        op: Op,
        result: &StoreResult<T>,
        outcome: impl FnOnce(&T) -> Outcome,
    ) {
        let outcome = match result {
            Ok(value) => outcome(value),
            Err(err) => Outcome::Failed(err.clone()),
        };
        self.history.push(Event {
            actor: self.actor.clone(),
            start: stamp.start,
            end: stamp.end,
            clock_before: stamp.clock_before,
            clock_after: stamp.clock_after,
            op,
            outcome,
        });
    }

    async fn call<T, Fut, Call, Out>(&self, op: Op, mut call: Call, outcome: Out) -> StoreResult<T>
    where
        Call: FnMut() -> Fut,
        Fut: std::future::Future<Output = StoreResult<T>>,
        Out: FnOnce(&T) -> Outcome,
    {
        let mut tries = 0;
        loop {
            let (result, stamp) = self.timed(call()).await;
            if contended(&result) && tries < 10_000 {
                tries += 1;
                tokio::task::yield_now().await;
                continue;
            }
            self.push(stamp, op, &result, outcome);
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

    /// `claim_gated(req)`.
    pub async fn claim_gated(&self, req: &ClaimRequest<'_>) -> StoreResult<Gated> {
        let op = Op::ClaimGated {
            agent: req.agent.into(),
            limits: req.limits.clone(),
        };
        let mb = &self.store.mailbox;
        self.call(
            op,
            || mb.claim_gated(req),
            |g: &Gated| Recorder::maybe(&g.dispatch),
        )
        .await
    }

    /// `complete_and_claim`: recorded as two calls with this call's times, the completion and
    /// then the claim. A half that reports `Contention` (which changes nothing) is retried on
    /// its own, as its own call.
    pub async fn complete_and_claim(
        &self,
        id: &str,
        token: &str,
        result: RunResult,
        next: &ClaimRequest<'_>,
    ) -> (StoreResult<Dispatch>, StoreResult<Gated>) {
        let mb = &self.store.mailbox;
        let ((done, claimed), stamp) = self
            .timed(mb.complete_and_claim(id, token, result.clone(), next))
            .await;
        let done = if contended(&done) {
            None
        } else {
            let op = Recorder::holder_op(id, token, HolderKind::Complete);
            self.push(stamp, op, &done, Recorder::record);
            Some(done)
        };
        let claimed = if contended(&claimed) {
            None
        } else {
            let op = Op::ClaimGated {
                agent: next.agent.into(),
                limits: next.limits.clone(),
            };
            self.push(stamp, op, &claimed, |g: &Gated| {
                Recorder::maybe(&g.dispatch)
            });
            Some(claimed)
        };
        let done = match done {
            Some(done) => done,
            None => self.complete(id, token, result).await,
        };
        let claimed = match claimed {
            Some(claimed) => claimed,
            None => self.claim_gated(next).await,
        };
        (done, claimed)
    }

    /// `load`.
    pub async fn load(&self, id: &str) -> StoreResult<Option<Dispatch>> {
        let op = Op::Load { id: id.into() };
        let mb = &self.store.mailbox;
        self.call(op, || mb.load(id), Recorder::maybe).await
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
    /// `send` (an inbox message).
    pub async fn send(&self, thread: &str, new: NewMessage, max_pending: u64) -> StoreResult<Sent> {
        let inbox = &self.store.inbox;
        let op = Op::Send {
            thread: thread.into(),
            payload: new.payload.clone(),
        };
        self.call(
            op,
            || inbox.send(thread, new.clone(), max_pending),
            |s: &Sent| Outcome::Sent(Box::new(s.clone())),
        )
        .await
    }

    /// `ack_message` through the claim `fence`.
    pub async fn ack_message(&self, thread: &str, seq: u64, fence: &Fence) -> StoreResult<u64> {
        let inbox = &self.store.inbox;
        let op = Op::AckMessage {
            thread: thread.into(),
            seq,
            fence: fence.clone(),
        };
        self.call(
            op,
            || inbox.ack_message(thread, seq, fence),
            |s: &u64| Outcome::Seq(*s),
        )
        .await
    }

    /// `discard_messages`.
    pub async fn discard(&self, thread: &str, through: u64) -> StoreResult<usize> {
        let inbox = &self.store.inbox;
        let op = Op::Discard {
            thread: thread.into(),
            through,
        };
        self.call(
            op,
            || inbox.discard_messages(thread, through),
            |n: &usize| Outcome::Count(*n),
        )
        .await
    }

    /// `messages`.
    pub async fn messages(
        &self,
        thread: &str,
        filter: &MessageFilter,
    ) -> StoreResult<Vec<Message>> {
        let inbox = &self.store.inbox;
        let op = Op::Messages {
            thread: thread.into(),
            state: filter.state,
            after: filter.after,
            limit: if filter.limit == 0 {
                DEFAULT_MESSAGE_PAGE
            } else {
                filter.limit
            },
        };
        self.call(
            op,
            || inbox.messages(thread, filter),
            |v: &Vec<Message>| Outcome::Messages(v.clone()),
        )
        .await
    }

    /// Every message of `thread`, a page of `page` at a time (each page recorded).
    pub async fn all_messages(&self, thread: &str, page: usize) -> StoreResult<Vec<Message>> {
        let mut out: Vec<Message> = Vec::new();
        loop {
            let filter = MessageFilter {
                state: None,
                after: out.last().map_or(0, |m| m.seq),
                limit: page,
                max_bytes: None,
            };
            let got = self.messages(thread, &filter).await?;
            let n = got.len();
            out.extend(got);
            if n < page {
                return Ok(out);
            }
        }
    }
}

/// Whether a call reported `Contention`, which changes nothing and is retried.
fn contended<T>(result: &StoreResult<T>) -> bool {
    matches!(result, Err(StoreError::Contention(_)))
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
        Outcome::Sent(s) => format!("message {} follow-ups {:?}", s.message.seq, s.follow_ups),
        Outcome::Messages(v) => format!(
            "messages {:?}",
            v.iter()
                .map(|m| format!("{} {} {:?}", m.seq, m.state, m.acked_by))
                .collect::<Vec<_>>()
        ),
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
    // Follow-up dispatches the store enqueues itself for pending messages (M4): the ids a send
    // returned, and records with the follow-up metadata on a thread that was sent a message.
    let sent_threads: BTreeSet<&str> = events
        .iter()
        .filter_map(|e| match &e.op {
            Op::Send { thread, .. } => Some(thread.as_str()),
            _ => None,
        })
        .collect();
    let is_follow_up = |d: &Dispatch| {
        d.metadata.get(FOLLOW_UP_BY.0).map(String::as_str) == Some(FOLLOW_UP_BY.1)
            && sent_threads.contains(d.thread.as_str())
    };
    for e in events {
        if let (Op::Send { thread, .. }, Outcome::Sent(sent)) = (&e.op, &e.outcome) {
            for id in &sent.follow_ups {
                enqueued.insert(id.clone(), thread.clone());
            }
        }
        let mut note = |d: &Dispatch| {
            if is_follow_up(d) {
                enqueued
                    .entry(d.id.clone())
                    .or_insert_with(|| d.thread.clone());
            }
        };
        match &e.outcome {
            Outcome::Record(d) => note(d),
            Outcome::Reclaimed(v) => v.iter().for_each(note),
            _ => {}
        }
    }
    for d in final_state {
        if is_follow_up(d) {
            enqueued
                .entry(d.id.clone())
                .or_insert_with(|| d.thread.clone());
        }
    }
    for id in enqueued.keys() {
        c.report.dispatches.insert(id.clone(), Class::Ok);
    }
    let known = |d: &Dispatch| {
        enqueued.contains_key(&d.id) || maybe_enqueued.contains(&d.id) || is_follow_up(d)
    };

    // Claims.
    let mut helds: Vec<Held> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        if !e.op.claims() {
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
        if !known(d) {
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
            // A call that began after the earliest end found so far changes nothing: skipped
            // before its (costly) lease bounds are worked out.
            if e.end < held.start || i == held.event || e.start >= release {
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
                (Op::AckMessage { fence, .. }, o) if fence.token == held.token => !o.ok(),
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
                (op, Outcome::Record(d))
                    if op.claims() && d.id == held.id && d.token() != Some(held.token.as_str()) =>
                {
                    // A takeover: an end only when the lease may have run out.
                    let (low, _) = lease_bounds(events, &held, e.start);
                    e.clock_after > low
                }
                (op, o) if op.claims() && o.ambiguous() => {
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
            // An acknowledgement is fenced exactly as an append is (M2).
            (Op::AckMessage { fence, .. }, o) if o.ok() => (fence.token.as_str(), None, true),
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
                (op, Outcome::Record(d)) if op.claims() => {
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
        // An extension, like a fenced write, needs a live lease: an expired one is never
        // extended, reclaimed or not (the contract, section 2.2).
        let needs_lease = is_append || matches!(kind, Some(HolderKind::Extend(_)));
        if why.is_none() && needs_lease {
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
        if !known(d) {
            c.flag(
                &d.id,
                Class::Unexpected,
                format!("stored ({}) but never enqueued", d.status),
            );
        }
    }

    check_keys(&mut c, &helds);
    check_logs(&mut c);
    check_messages(&mut c);
    c.report
}

/// The smallest key cap a NATS host may serve from slot blocks (the contract, section 13.2):
/// there an extension of a claim under a block may be cut short to end with the block.
const SLOT_BLOCKS_FROM: u32 = 16;

/// The store clock as the calls saw it. It never goes back, so until the end of a call whose
/// reading right after it was at most `v`, the clock was at most `v`.
struct ClockBound {
    /// (a reading after a call, the latest end of a call read at or below it), by reading.
    by_reading: Vec<(u64, u64)>,
}

impl ClockBound {
    fn new(events: &[Event]) -> ClockBound {
        let mut by_reading: Vec<(u64, u64)> =
            events.iter().map(|e| (e.clock_after, e.end)).collect();
        by_reading.sort_unstable();
        let mut latest = 0;
        for r in &mut by_reading {
            latest = latest.max(r.1);
            r.1 = latest;
        }
        ClockBound { by_reading }
    }

    /// The latest monotonic time at which the clock was surely at most `value`.
    fn at_most(&self, value: u64) -> Option<u64> {
        let n = self.by_reading.partition_point(|r| r.0 <= value);
        n.checked_sub(1).map(|i| self.by_reading[i].1)
    }
}

/// One stretch of monotonic time `[from, to)` in which a claim was surely live, and the call
/// that showed its lease running then (its claim, an extension or a load).
#[derive(Debug, Clone, Copy)]
struct Live {
    from: u64,
    to: u64,
    shown_by: usize,
    /// The lease it showed.
    lease: u64,
}

/// When `held` was surely a live claim as guarantee 14 counts them: `claimed` under its token
/// with a lease that runs (`now <= lease_until`, section 15.2 of the contract), whether or not
/// anyone reclaimed it after it ran out.
///
/// It is live from the end of its claim call until the start of the first call that may have
/// ended it otherwise than by its lease (its holder's settlement or any refused holder call, a
/// refused fenced write, a supersede, a reclaim that returned it or failed, another claim of its
/// dispatch), and within that only while the clock had surely not passed its lease. So a
/// lease that ran out stops counting at once (its slot is free then, with no write); and a
/// lease extended after it ran out counts again from the extension on, for a revived claim
/// holds its key's slot once more.
///
/// The lease is known from the claim's record, from each accepted extension (`now +
/// extension`, `now` at least the clock before the call; with a cap of [`SLOT_BLOCKS_FROM`] or
/// more a NATS slot block may cut an extension short, so only `now + 1` is sure) and from each
/// load that showed the claim, each from the end of its call until the start of the next
/// accepted extension that may have come after it (an extension sets the lease, and may
/// shorten it).
///
/// `strict` judges a lease run out already at its last millisecond (`now == lease_until`), to
/// tell findings that hang on that boundary alone.
fn live_windows(
    events: &[Event],
    held: &Held,
    cap: u32,
    clock: &ClockBound,
    strict: bool,
) -> Vec<Live> {
    let token = held.token.as_str();
    let mut end = u64::MAX;
    let mut extended: Vec<usize> = Vec::new();
    // (the call, when the lease it showed may have been read, that lease).
    let mut known: Vec<(usize, u64, u64)> = vec![(held.event, held.end, held.lease)];
    for (i, e) in events.iter().enumerate() {
        if i == held.event || e.end <= held.end {
            continue;
        }
        let ends = match (&e.op, &e.outcome) {
            (Op::Holder { token: t, kind, .. }, o) if t == token => {
                if let (HolderKind::Extend(ext), Outcome::Done) = (kind, o) {
                    extended.push(i);
                    let granted = if cap >= SLOT_BLOCKS_FROM { 1 } else { *ext };
                    known.push((i, e.start, e.clock_before.saturating_add(granted)));
                }
                kind.settles() || !o.ok()
            }
            (Op::Supersede { id, .. }, _) => *id == held.id,
            (Op::Append { fence: Some(f), .. } | Op::AckMessage { fence: f, .. }, o) => {
                f.token == token && !o.ok()
            }
            (Op::Reclaim { .. }, Outcome::Reclaimed(v)) => v.iter().any(|d| d.id == held.id),
            (Op::Reclaim { .. }, _) => true,
            (op, Outcome::Record(d)) if op.claims() => d.id == held.id && d.token() != Some(token),
            (op, o) if op.claims() => o.ambiguous(),
            (Op::Load { .. }, Outcome::Record(d)) => {
                if d.id == held.id
                    && d.status == Status::Claimed
                    && let Some(claim) = d.claim.as_ref().filter(|c| c.token == token)
                {
                    known.push((i, e.start, claim.lease_until));
                }
                false
            }
            _ => false,
        };
        if ends {
            end = end.min(e.start);
        }
    }
    let mut out = Vec::new();
    for (i, read_from, lease) in known {
        // Until another extension may have set the lease after this reading.
        let until = extended
            .iter()
            .filter(|&&x| x != i && events[x].end > read_from)
            .map(|&x| events[x].start)
            .min()
            .unwrap_or(u64::MAX);
        let sure = if strict {
            lease.checked_sub(1)
        } else {
            Some(lease)
        };
        let Some(lapse) = sure.and_then(|l| clock.at_most(l)) else {
            continue;
        };
        let (from, to) = (events[i].end, until.min(end).min(lapse.saturating_add(1)));
        if from < to {
            out.push(Live {
                from,
                to,
                shown_by: i,
                lease,
            });
        }
    }
    out
}

/// The claims of one key live at one instant: per claim (its index), the windows that show it.
type LiveSet = BTreeMap<usize, Vec<Live>>;

/// Sweeps the live windows of one key's `claims`: the most live at one instant, and each time
/// more than `cap` became live (the instant and who).
fn over_cap(
    events: &[Event],
    claims: &[&Held],
    cap: u32,
    clock: &ClockBound,
    strict: bool,
) -> (usize, Vec<(u64, LiveSet)>) {
    // (time, +1 from / -1 to, claim, window): ends before starts at one instant.
    let mut points: Vec<(u64, i8, usize, Live)> = Vec::new();
    for (n, h) in claims.iter().enumerate() {
        for w in live_windows(events, h, cap, clock, strict) {
            points.push((w.from, 1, n, w));
            points.push((w.to, -1, n, w));
        }
    }
    points.sort_unstable_by_key(|p| (p.0, p.1, p.2));
    let mut live = LiveSet::new();
    let (mut peak, mut over, mut excursions) = (0usize, false, Vec::new());
    for (at, delta, n, w) in points {
        let shown = live.entry(n).or_default();
        if delta > 0 {
            shown.push(w);
        } else if let Some(p) = shown.iter().position(|s| s.shown_by == w.shown_by) {
            shown.swap_remove(p);
        }
        if shown.is_empty() {
            live.remove(&n);
        }
        peak = peak.max(live.len());
        let now_over = live.len() > cap as usize;
        if now_over && !over {
            excursions.push((at, live.clone()));
        }
        over = now_over;
    }
    (peak, excursions)
}

/// Guarantee 14 for concurrency keys, judged from the gated claims (`claim_gated`, and the
/// claim of `complete_and_claim`) under per-key limits: at no instant are more claims of one
/// key surely live than its cap (**over cap**), and in no window `[a, b]` of the store clock
/// did more claims of one key surely take effect than its burst plus its refill over
/// `b - a + BLOCK_MS` (a claim may spend a token its host took in a block up to `BLOCK_MS`
/// before) (**over rate**). One rate per key is assumed.
fn check_keys(c: &mut Checker<'_>, helds: &[Held]) {
    let events = c.events;
    let clock = ClockBound::new(events);
    let mut capped: BTreeMap<&str, (u32, Vec<&Held>)> = BTreeMap::new();
    let mut rated: BTreeMap<&str, (Rate, Vec<usize>)> = BTreeMap::new();
    for h in helds {
        let e = &events[h.event];
        let (Op::ClaimGated { limits, .. }, Outcome::Record(d)) = (&e.op, &e.outcome) else {
            continue;
        };
        let Some(key) = d.concurrency_key.as_deref() else {
            continue;
        };
        if let Some(cap) = limits.key_concurrency {
            let slot = capped.entry(key).or_insert((cap, Vec::new()));
            slot.0 = slot.0.max(cap);
            slot.1.push(h);
        }
        if let Some(rate) = limits.key_rate {
            rated
                .entry(key)
                .or_insert((rate, Vec::new()))
                .1
                .push(h.event);
        }
    }
    for (key, (cap, claims)) in &capped {
        let (peak, excursions) = over_cap(events, claims, *cap, &clock, false);
        let boundary =
            !excursions.is_empty() && over_cap(events, claims, *cap, &clock, true).1.is_empty();
        for (at, live) in excursions {
            c.report.over_cap += 1;
            let holders: Vec<String> = live
                .iter()
                .map(|(n, shown)| {
                    let claim = claims[*n].event;
                    let mut line = c.describe(claim);
                    for s in shown {
                        if s.shown_by != claim {
                            line.push_str(&format!(", live by {}", c.describe(s.shown_by)));
                        }
                        line.push_str(&format!(" (lease {})", s.lease));
                    }
                    line
                })
                .collect();
            let note = if boundary {
                " (only with a lease at its last millisecond, `now == lease_until`)"
            } else {
                ""
            };
            c.report.findings.push(format!(
                "key {key}: {} live claims over its cap of {cap} at {at}{note}: {}",
                live.len(),
                holders.join(" | ")
            ));
        }
        c.report.key_peaks.insert((*key).to_owned(), (peak, *cap));
    }
    for (key, (rate, claims)) in &rated {
        let mut by_start: Vec<(u64, u64, usize)> = claims
            .iter()
            .map(|&i| (events[i].clock_before, events[i].clock_after, i))
            .collect();
        by_start.sort_unstable();
        let per_token = rate.ms_per_token();
        let burst = f64::from(rate.burst.max(1));
        'key: for i in 0..by_start.len() {
            let a = by_start[i].0;
            let mut ends: Vec<(u64, usize)> =
                by_start[i..].iter().map(|&(_, b, ev)| (b, ev)).collect();
            ends.sort_unstable();
            for (j, &(b, _)) in ends.iter().enumerate() {
                let allowed = burst + (b - a + BLOCK_MS) as f64 / per_token;
                if (j + 1) as f64 > allowed + 1e-9 {
                    c.report.over_rate += 1;
                    let calls: Vec<String> =
                        ends[..=j].iter().map(|&(_, ev)| c.describe(ev)).collect();
                    c.report.findings.push(format!(
                        "key {key}: {} claims within clock {a}..{b}, rate {rate} allows {allowed:.1}: {}",
                        j + 1,
                        calls.join(" | ")
                    ));
                    break 'key;
                }
            }
        }
    }
}

/// A log entry a call committed: its content when known, the message its note names (set for
/// an entry an acknowledgement wrote) and the call.
struct Committed {
    data: Option<Vec<u8>>,
    note: Option<u64>,
    event: usize,
}

/// What an ambiguous write may have committed: its data when known, the message it names.
type MaybeEntry<'a> = (Option<&'a [u8]>, Option<u64>);

/// A write in real time: (thread, seq, not before, before, by an acknowledgement, event).
type TimedWrite<'a> = (&'a str, u64, u64, u64, bool, usize);

/// The payload of each message, by (thread, seq): what its send stored, or, when the send was
/// ambiguous, what a read of the message showed.
fn payloads(events: &[Event]) -> BTreeMap<(&str, u64), &[u8]> {
    let mut out: BTreeMap<(&str, u64), &[u8]> = BTreeMap::new();
    for e in events {
        if let (Op::Send { thread, payload }, Outcome::Sent(s)) = (&e.op, &e.outcome) {
            out.entry((thread.as_str(), s.message.seq))
                .or_insert(payload.as_slice());
        }
    }
    for e in events {
        if let (Op::Messages { thread, .. }, Outcome::Messages(v)) = (&e.op, &e.outcome) {
            for m in v {
                out.entry((thread.as_str(), m.seq))
                    .or_insert(m.payload.as_slice());
            }
        }
    }
    out
}

/// The acknowledgements of one message by one dispatch: a first one and its repeats (through
/// any claim of that dispatch), which all answer one log entry.
#[derive(Debug)]
struct AckGroup<'a> {
    thread: &'a str,
    seq: u64,
    dispatch: &'a str,
    /// The log sequences the successful calls returned, with their events.
    returned: Vec<(u64, usize)>,
    /// The earliest start of a call that may have taken effect (a success or an ambiguous
    /// failure): the entry was not committed before it.
    first_start: u64,
    /// The earliest end of a success: the entry was committed before it.
    first_end: Option<u64>,
}

/// Every acknowledgement that may have taken effect, by (thread, message, dispatch).
fn ack_groups(events: &[Event]) -> BTreeMap<(&str, u64, &str), AckGroup<'_>> {
    let mut out: BTreeMap<(&str, u64, &str), AckGroup<'_>> = BTreeMap::new();
    for (i, e) in events.iter().enumerate() {
        let Op::AckMessage { thread, seq, fence } = &e.op else {
            continue;
        };
        if !(e.outcome.ok() || e.outcome.ambiguous()) {
            continue;
        }
        let g = out
            .entry((thread.as_str(), *seq, fence.dispatch.as_str()))
            .or_insert_with(|| AckGroup {
                thread,
                seq: *seq,
                dispatch: &fence.dispatch,
                returned: Vec::new(),
                first_start: u64::MAX,
                first_end: None,
            });
        g.first_start = g.first_start.min(e.start);
        if let Outcome::Seq(log_seq) = e.outcome {
            g.returned.push((log_seq, i));
            g.first_end = Some(g.first_end.map_or(e.end, |end| end.min(e.end)));
        }
    }
    out
}

/// The thread-log checks: watermarks never go back; reads show committed entries (appended, or
/// written by a message's acknowledgement) in order, completely and with their content; a
/// write that returned before another began has the lower sequence.
fn check_logs(c: &mut Checker<'_>) {
    let events = c.events;
    let payloads = payloads(events);
    // Per thread: committed entries, what ambiguous writes may have committed (data when known,
    // the message named), trims.
    let mut appends: BTreeMap<&str, BTreeMap<u64, Committed>> = BTreeMap::new();
    let mut ambiguous: BTreeMap<&str, Vec<MaybeEntry<'_>>> = BTreeMap::new();
    let mut trimmed: BTreeSet<&str> = BTreeSet::new();
    // Observations of `latest`: (thread, lower bound, event, exact).
    let mut seen: Vec<(&str, u64, usize, bool)> = Vec::new();
    let mut commits: Vec<TimedWrite<'_>> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let commit = match (&e.op, &e.outcome) {
            (Op::Append { thread, data, .. }, Outcome::Seq(seq)) => {
                commits.push((thread, *seq, e.start, e.end, false, i));
                Some((
                    thread,
                    *seq,
                    Committed {
                        data: Some(data.clone()),
                        note: None,
                        event: i,
                    },
                ))
            }
            (Op::AckMessage { thread, seq: m, .. }, Outcome::Seq(seq)) => {
                seen.push((thread, *seq, i, false));
                // A repeat answers the entry the first acknowledgement committed.
                let repeat = appends
                    .get(thread.as_str())
                    .and_then(|t| t.get(seq))
                    .is_some_and(|k| k.note == Some(*m));
                (!repeat).then(|| {
                    (
                        thread,
                        *seq,
                        Committed {
                            data: payloads.get(&(thread.as_str(), *m)).map(|p| p.to_vec()),
                            note: Some(*m),
                            event: i,
                        },
                    )
                })
            }
            (Op::Append { thread, data, .. }, o) if o.ambiguous() => {
                ambiguous
                    .entry(thread)
                    .or_default()
                    .push((Some(data.as_slice()), None));
                None
            }
            (Op::AckMessage { thread, seq: m, .. }, o) if o.ambiguous() => {
                let data = payloads.get(&(thread.as_str(), *m)).copied();
                ambiguous.entry(thread).or_default().push((data, Some(*m)));
                None
            }
            (Op::Trim { thread }, _) => {
                trimmed.insert(thread);
                None
            }
            (Op::Latest { thread }, Outcome::Seq(seq)) => {
                seen.push((thread, *seq, i, true));
                None
            }
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
                None
            }
            (Op::Read { thread, .. }, Outcome::Entries(v)) => {
                if let Some(last) = v.last() {
                    seen.push((thread, last.seq, i, false));
                }
                None
            }
            _ => None,
        };
        let Some((thread, seq, committed)) = commit else {
            continue;
        };
        if committed.note.is_none() {
            seen.push((thread, seq, i, false));
        }
        if let Some(k) = appends.entry(thread).or_default().insert(seq, committed) {
            c.report.out_of_order += 1;
            let why = format!(
                "thread {thread}: sequence {seq} given twice: {} and {}",
                c.describe(k.event),
                c.describe(i)
            );
            c.report.findings.push(why);
        }
    }
    // Each acknowledgement's entry is committed once, after its first attempt began and before
    // its first success returned.
    for g in ack_groups(events).values() {
        if let (Some(&(seq, i)), Some(end)) = (g.returned.first(), g.first_end) {
            commits.push((g.thread, seq, g.first_start, end, true, i));
        }
    }
    // Real-time order: a write that returned before another began got the lower sequence.
    let mut by_thread: BTreeMap<&str, Vec<TimedWrite<'_>>> = BTreeMap::new();
    for commit in commits {
        by_thread.entry(commit.0).or_default().push(commit);
    }
    for writes in by_thread.values() {
        for &(thread, sx, _, ex, ax, ix) in writes {
            for &(_, sy, by, _, ay, iy) in writes {
                if ex >= by || sx <= sy {
                    continue;
                }
                let why = format!(
                    "thread {thread}: entry {sx} was committed by {} which returned before {} \
                     began, which committed entry {sy}",
                    c.describe(ix),
                    c.describe(iy)
                );
                if ax || ay {
                    c.report.ack_order += 1;
                } else {
                    c.report.out_of_order += 1;
                }
                c.report.findings.push(why);
            }
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
        let mut ack_problems: Vec<String> = Vec::new();
        let mut prev = *after;
        for entry in entries {
            if entry.seq <= prev {
                problems.push(format!("entry {} after {prev}", entry.seq));
            }
            prev = entry.seq;
            let note = entry.note.as_ref().map(|n| n.seq);
            match committed.and_then(|m| m.get(&entry.seq)) {
                Some(k) => {
                    let data_differs = k.data.as_ref().is_some_and(|d| *d != entry.data);
                    if data_differs || k.note != note {
                        let why = format!(
                            "entry {} has content other than committed (note {note:?}, \
                             committed {:?})",
                            entry.seq, k.note
                        );
                        if k.note.is_some() {
                            ack_problems.push(why);
                        } else {
                            problems.push(why);
                        }
                    }
                }
                None => {
                    let maybe = ambiguous.get(thread.as_str()).is_some_and(|v| {
                        v.iter().any(|(data, n)| {
                            *n == note && (n.is_some() || *data == Some(entry.data.as_slice()))
                        })
                    });
                    if !maybe {
                        problems.push(format!("entry {} was never appended", entry.seq));
                    } else if let Some(m) = note
                        && payloads
                            .get(&(thread.as_str(), m))
                            .is_some_and(|p| *p != entry.data.as_slice())
                    {
                        ack_problems.push(format!(
                            "entry {} names message {m} but holds other data than its payload",
                            entry.seq
                        ));
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
            for (seq, k) in committed.range(after + 1..) {
                // Below an entry shown, every committed entry must be shown too (in-order
                // visibility); an entry committed before the read began must be shown unless the
                // page was full.
                let must = *seq < top || (!full && events[k.event].end < e.start);
                if must && !shown.contains(seq) {
                    problems.push(format!("committed entry {seq} missing"));
                }
            }
        }
        c.report.out_of_order += problems.len();
        c.report.ack_order += ack_problems.len();
        problems.extend(ack_problems);
        if !problems.is_empty() {
            let why = format!(
                "thread {thread}: {}: {}",
                problems.join(", "),
                c.describe(i)
            );
            c.report.findings.push(why);
        }
    }
}

/// The inbox checks: every message a send stored is kept with its payload (pending, acked or
/// discarded, never back to pending); at most one dispatch acknowledges it, and the log names
/// it in one entry, the one its acknowledgement returned.
fn check_messages(c: &mut Checker<'_>) {
    let events = c.events;
    let groups = ack_groups(events);
    let mut lost: Vec<String> = Vec::new();
    let mut twice: Vec<String> = Vec::new();
    // Sends: definite ((thread, seq) -> (payload, event)) and ambiguous (payloads per thread).
    let mut sent: BTreeMap<(&str, u64), (&[u8], usize)> = BTreeMap::new();
    let mut maybe_sent: BTreeMap<&str, Vec<&[u8]>> = BTreeMap::new();
    for (i, e) in events.iter().enumerate() {
        match (&e.op, &e.outcome) {
            (Op::Send { thread, payload }, Outcome::Sent(s)) => {
                let key = (thread.as_str(), s.message.seq);
                if let Some(&(_, j)) = sent.get(&key) {
                    lost.push(format!(
                        "thread {thread}: message {} given twice: {} and {}",
                        s.message.seq,
                        c.describe(j),
                        c.describe(i)
                    ));
                } else {
                    sent.insert(key, (payload, i));
                }
            }
            (Op::Send { thread, payload }, o) if o.ambiguous() => {
                maybe_sent.entry(thread).or_default().push(payload);
            }
            _ => {}
        }
    }
    // Successful acknowledgements, per message and dispatch.
    let mut acked: BTreeMap<(&str, u64), BTreeMap<&str, &AckGroup<'_>>> = BTreeMap::new();
    for g in groups.values() {
        let returned: BTreeSet<u64> = g.returned.iter().map(|r| r.0).collect();
        if returned.len() > 1 {
            let calls: Vec<String> = g.returned.iter().map(|r| c.describe(r.1)).collect();
            twice.push(format!(
                "thread {}: dispatch {} acked message {} at log entries {returned:?}: {}",
                g.thread,
                g.dispatch,
                g.seq,
                calls.join(" and ")
            ));
        }
        if !returned.is_empty() {
            acked
                .entry((g.thread, g.seq))
                .or_default()
                .insert(g.dispatch, g);
        }
    }
    for ((thread, seq), by) in &acked {
        if by.len() > 1 {
            let calls: Vec<String> = by.values().map(|g| c.describe(g.returned[0].1)).collect();
            twice.push(format!(
                "thread {thread}: message {seq} acked by {} dispatches: {}",
                by.len(),
                calls.join(" and ")
            ));
        }
    }
    // The log: the entries naming each message, as reads showed them.
    let mut named: BTreeMap<(&str, u64), BTreeMap<u64, usize>> = BTreeMap::new();
    for (i, e) in events.iter().enumerate() {
        if let (Op::Read { thread, .. }, Outcome::Entries(v)) = (&e.op, &e.outcome) {
            for entry in v {
                if let Some(n) = &entry.note {
                    named
                        .entry((thread.as_str(), n.seq))
                        .or_default()
                        .entry(entry.seq)
                        .or_insert(i);
                }
            }
        }
    }
    for ((thread, m), entries) in &named {
        if entries.len() > 1 {
            twice.push(format!(
                "thread {thread}: log entries {:?} all name message {m}",
                entries.keys().collect::<Vec<_>>()
            ));
        }
        let Some(by) = acked.get(&(*thread, *m)) else {
            continue;
        };
        let returned: BTreeSet<u64> = by
            .values()
            .flat_map(|g| g.returned.iter().map(|r| r.0))
            .collect();
        for (seq, i) in entries {
            if !returned.contains(seq) {
                twice.push(format!(
                    "thread {thread}: log entry {seq} names message {m}, whose acknowledgement \
                     returned {returned:?}: {}",
                    c.describe(*i)
                ));
            }
        }
    }
    // Whether message `seq` may have left `pending` by a call that began before `before`.
    let may_settle = |thread: &str, seq: u64, before: u64| {
        events.iter().any(|e| {
            let settles = match &e.op {
                Op::AckMessage {
                    thread: t, seq: s, ..
                } => t == thread && *s == seq,
                Op::Discard { thread: t, through } => t == thread && *through >= seq,
                _ => false,
            };
            settles && e.start < before && (e.outcome.ok() || e.outcome.ambiguous())
        })
    };
    // Reads of messages.
    for (i, e) in events.iter().enumerate() {
        let (
            Op::Messages {
                thread,
                state,
                after,
                limit,
            },
            Outcome::Messages(shown),
        ) = (&e.op, &e.outcome)
        else {
            continue;
        };
        let mut problems: Vec<String> = Vec::new();
        let mut ack_problems: Vec<String> = Vec::new();
        for m in shown {
            match sent.get(&(thread.as_str(), m.seq)) {
                Some((payload, _)) if *payload != m.payload.as_slice() => {
                    problems.push(format!("message {} has other content than sent", m.seq));
                }
                Some(_) => {}
                None => {
                    let maybe = maybe_sent
                        .get(thread.as_str())
                        .is_some_and(|v| v.contains(&m.payload.as_slice()));
                    if !maybe {
                        problems.push(format!("message {} was never sent", m.seq));
                    }
                }
            }
            let by = acked.get(&(thread.as_str(), m.seq));
            let acked_before = by
                .and_then(|by| by.values().filter_map(|g| g.first_end).min())
                .is_some_and(|end| end < e.start);
            match m.state {
                MessageState::Pending if acked_before => {
                    problems.push(format!(
                        "message {} pending after its acknowledgement returned",
                        m.seq
                    ));
                }
                MessageState::Pending => {}
                MessageState::Acked => {
                    let holder = m.acked_by.as_deref().unwrap_or_default();
                    match groups.get(&(thread.as_str(), m.seq, holder)) {
                        None => ack_problems.push(format!(
                            "message {} acked by `{holder}`, which never acknowledged it",
                            m.seq
                        )),
                        Some(g) if !g.returned.is_empty() => {
                            if !g.returned.iter().any(|r| Some(r.0) == m.log_seq) {
                                ack_problems.push(format!(
                                    "message {} recorded at log entry {:?}, its acknowledgement \
                                     returned {:?}",
                                    m.seq,
                                    m.log_seq,
                                    g.returned.iter().map(|r| r.0).collect::<Vec<_>>()
                                ));
                            }
                        }
                        Some(_) => {}
                    }
                    if let Some(by) = by
                        && let Some(other) = by.keys().find(|d| **d != holder)
                    {
                        ack_problems.push(format!(
                            "message {} recorded as acked by `{holder}`, but `{other}`'s \
                             acknowledgement of it succeeded",
                            m.seq
                        ));
                    }
                }
                MessageState::Discarded => {
                    if acked_before || !may_settle(thread, m.seq, e.end) {
                        problems.push(format!(
                            "message {} discarded, but no discard of it could have been \
                             accepted",
                            m.seq
                        ));
                    }
                }
            }
        }
        // Completeness: a message whose send returned before the read began is shown, unless
        // the page was full below it (or, in a read of pending messages, it may have left
        // `pending`).
        let on_page: BTreeSet<u64> = shown.iter().map(|m| m.seq).collect();
        let top = shown.last().map_or(*after, |m| m.seq);
        let full = shown.len() >= *limit;
        for (&(_, seq), &(_, j)) in
            sent.range((thread.as_str(), after.saturating_add(1))..=(thread.as_str(), u64::MAX))
        {
            if on_page.contains(&seq) || events[j].end >= e.start || (full && seq > top) {
                continue;
            }
            let must = match state {
                None => true,
                Some(MessageState::Pending) => !may_settle(thread, seq, e.end),
                Some(_) => false,
            };
            if must {
                problems.push(format!("message {seq} missing"));
            }
        }
        c.report.messages_lost += problems.len();
        c.report.acked_twice += ack_problems.len();
        problems.extend(ack_problems);
        if !problems.is_empty() {
            let why = format!(
                "thread {thread}: {}: {}",
                problems.join(", "),
                c.describe(i)
            );
            c.report.findings.push(why);
        }
    }
    c.report.messages_lost += lost.len();
    c.report.acked_twice += twice.len();
    c.report.findings.extend(lost);
    c.report.findings.extend(twice);
}

#[cfg(test)]
mod checker_tests {
    //! The checker must be able to fail: each test feeds it a bad history and expects the class.

    use super::*;
    use homing::store::{Claim, MessageKind};

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
            log_from: None,
            claims: u32::from(token.is_some()),
            resumes: 0,
            concurrency_key: None,
            versions: Vec::new(),
            window: None,
            usage: None,
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

    /// A message a read shows: (seq, payload, acked by and log entry).
    type Shown<'a> = (u64, &'a str, Option<(&'a str, u64)>);

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
                    turn: None,
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

        fn send(&mut self, at: u64, thread: &str, payload: &str, seq: u64) -> &mut Self {
            self.send_with(at, thread, payload, seq, &[])
        }

        fn send_with(
            &mut self,
            at: u64,
            thread: &str,
            payload: &str,
            seq: u64,
            follow_ups: &[&str],
        ) -> &mut Self {
            let sent = Sent {
                message: message(thread, seq, payload, MessageState::Pending, None),
                follow_ups: follow_ups.iter().map(|s| (*s).to_owned()).collect(),
                busy: None,
                interrupted: None,
                applied: None,
                reopened: Vec::new(),
            };
            self.at(
                at,
                Op::Send {
                    thread: thread.into(),
                    payload: payload.as_bytes().to_vec(),
                },
                Outcome::Sent(Box::new(sent)),
            )
        }

        fn ack_message(
            &mut self,
            at: u64,
            thread: &str,
            seq: u64,
            fence: Fence,
            outcome: Outcome,
        ) -> &mut Self {
            self.at(
                at,
                Op::AckMessage {
                    thread: thread.into(),
                    seq,
                    fence,
                },
                outcome,
            )
        }

        /// A read of every message of `thread`: (seq, payload, acked by and log entry).
        fn messages(&mut self, at: u64, thread: &str, shown: &[Shown<'_>]) -> &mut Self {
            let v = shown
                .iter()
                .map(|(seq, payload, acked)| {
                    let state = if acked.is_some() {
                        MessageState::Acked
                    } else {
                        MessageState::Pending
                    };
                    message(thread, *seq, payload, state, *acked)
                })
                .collect();
            self.at(
                at,
                Op::Messages {
                    thread: thread.into(),
                    state: None,
                    after: 0,
                    limit: 100,
                },
                Outcome::Messages(v),
            )
        }

        /// A read of the log whose entries may name a message: (seq, data, message).
        fn read_noted(
            &mut self,
            at: u64,
            thread: &str,
            entries: &[(u64, &str, Option<u64>)],
        ) -> &mut Self {
            let v = entries
                .iter()
                .map(|(seq, data, note)| LogEntry {
                    seq: *seq,
                    data: data.as_bytes().to_vec(),
                    appended_at: T,
                    note: note.map(|m| message(thread, m, data, MessageState::Acked, None).note()),
                    turn: None,
                })
                .collect();
            self.at(
                at,
                Op::Read {
                    thread: thread.into(),
                    after: 0,
                    limit: 100,
                },
                Outcome::Entries(v),
            )
        }

        /// A gated claim of `id` (on a thread of that name) with concurrency key `key`.
        fn gated(
            &mut self,
            at: u64,
            id: &str,
            token: &str,
            lease: u64,
            key: &str,
            limits: &LimitSet,
        ) -> &mut Self {
            let mut d = record(id, id, Status::Claimed, Some(token), lease);
            d.concurrency_key = Some(key.into());
            self.at(
                at,
                Op::ClaimGated {
                    agent: "agent".into(),
                    limits: limits.clone(),
                },
                Outcome::Record(Box::new(d)),
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

    fn message(
        thread: &str,
        seq: u64,
        payload: &str,
        state: MessageState,
        acked: Option<(&str, u64)>,
    ) -> Message {
        Message {
            thread: thread.into(),
            seq,
            kind: MessageKind::Steer,
            payload: payload.as_bytes().to_vec(),
            metadata: BTreeMap::new(),
            agent: None,
            sent_by: "test".into(),
            sent_at: T,
            state,
            settled_at: acked.map(|_| T),
            acked_by: acked.map(|(by, _)| by.to_owned()),
            log_seq: acked.map(|(_, seq)| seq),
            applied: None,
        }
    }

    fn follow_up(id: &str, thread: &str, status: Status, token: Option<&str>) -> Dispatch {
        let mut d = record(id, thread, status, token, T + 100);
        d.metadata
            .insert(FOLLOW_UP_BY.0.into(), FOLLOW_UP_BY.1.into());
        d
    }

    #[test]
    fn a_clean_inbox_history_is_ok() {
        let mut b = Build::new();
        b.enqueue(1, "d1", "t")
            .send(2, "t", "hello", 1)
            .claim(3, "d1", "t", "k1", T + 100)
            .ack_message(4, "t", 1, fence("d1", "k1"), Outcome::Seq(1))
            .ack_message(5, "t", 1, fence("d1", "k1"), Outcome::Seq(1)) // a repeat
            .append(6, "t", "x", Some(fence("d1", "k1")), 2)
            .ack(7, "d1", "t", "k1")
            // Sent to the idle thread: the store enqueues a follow-up that acks it.
            .send_with(8, "t", "again", 2, &["f1"]);
        b.at(
            9,
            Op::Claim {
                agent: "agent".into(),
            },
            Outcome::Record(Box::new(follow_up("f1", "t", Status::Claimed, Some("k2")))),
        )
        .ack_message(10, "t", 2, fence("f1", "k2"), Outcome::Seq(3))
        // Another dispatch may not ack message 1 again: refused, fine.
        .ack_message(
            11,
            "t",
            1,
            fence("f1", "k2"),
            Outcome::Failed(StoreError::Duplicate {
                id: "f1".into(),
                holder: Some("d1".into()),
            }),
        )
        .ack(12, "f1", "t", "k2")
        .send(13, "t", "later", 3)
        .messages(
            14,
            "t",
            &[
                (1, "hello", Some(("d1", 1))),
                (2, "again", Some(("f1", 3))),
                (3, "later", None),
            ],
        )
        .read_noted(
            15,
            "t",
            &[(1, "hello", Some(1)), (2, "x", None), (3, "again", Some(2))],
        );
        // f2 answers message 3: enqueued by the store when f1 settled, seen only at the end.
        let report = b.check(&[
            fin("d1", "t", Status::Acked),
            follow_up("f1", "t", Status::Acked, None),
            follow_up("f2", "t", Status::Queued, None),
        ]);
        report.assert_clean();
        assert_eq!(report.count(Class::Ok), 3, "{report}");
    }

    #[test]
    fn catches_a_lost_message() {
        // Message 2 missing from a read that began after its send returned.
        let mut b = Build::new();
        b.send(1, "t", "a", 1)
            .send(2, "t", "b", 2)
            .messages(3, "t", &[(1, "a", None)]);
        let report = b.check(&[]);
        assert_eq!(report.messages_lost, 1, "{report}");
        assert!(!report.clean());
        // Other content, a message never sent, two sends given one sequence.
        let mut b = Build::new();
        b.send(1, "t", "a", 1).send(2, "t", "b", 1).messages(
            3,
            "t",
            &[(1, "a", None), (2, "forged", None)],
        );
        assert_eq!(b.check(&[]).messages_lost, 2, "{}", b.check(&[]));
        let mut b = Build::new();
        b.send(1, "t", "a", 1)
            .messages(2, "t", &[(1, "torn", None)]);
        assert_eq!(b.check(&[]).messages_lost, 1);
        // Back to pending after an acknowledgement returned.
        let mut b = Build::new();
        b.enqueue(1, "d1", "t")
            .send(2, "t", "a", 1)
            .claim(3, "d1", "t", "k1", T + 100)
            .ack_message(4, "t", 1, fence("d1", "k1"), Outcome::Seq(1))
            .messages(5, "t", &[(1, "a", None)]);
        let report = b.check(&[fin("d1", "t", Status::Claimed)]);
        assert_eq!(report.messages_lost, 1, "{report}");
        // A read of pending messages may miss one whose acknowledgement ran concurrently, but
        // not one no call could have settled.
        let mut b = Build::new();
        b.send(1, "t", "a", 1).send(2, "t", "b", 2).at(
            3,
            Op::Messages {
                thread: "t".into(),
                state: Some(MessageState::Pending),
                after: 0,
                limit: 100,
            },
            Outcome::Messages(vec![message("t", 2, "b", MessageState::Pending, None)]),
        );
        assert_eq!(b.check(&[]).messages_lost, 1);
        // A full page says nothing of what lies above it.
        let mut b = Build::new();
        b.send(1, "t", "a", 1).send(2, "t", "b", 2).at(
            3,
            Op::Messages {
                thread: "t".into(),
                state: None,
                after: 0,
                limit: 1,
            },
            Outcome::Messages(vec![message("t", 1, "a", MessageState::Pending, None)]),
        );
        b.check(&[]).assert_clean();
    }

    #[test]
    fn catches_a_message_acked_twice() {
        // Two dispatches' acknowledgements of one message both succeeded, and the log shows
        // two entries naming it.
        let mut b = Build::new();
        b.enqueue(1, "d1", "t")
            .enqueue(2, "d2", "t")
            .send(3, "t", "a", 1)
            .claim(4, "d1", "t", "k1", T + 100)
            .ack_message(5, "t", 1, fence("d1", "k1"), Outcome::Seq(1))
            .ack(6, "d1", "t", "k1")
            .claim(7, "d2", "t", "k2", T + 100)
            .ack_message(8, "t", 1, fence("d2", "k2"), Outcome::Seq(2))
            .ack(9, "d2", "t", "k2")
            .read_noted(10, "t", &[(1, "a", Some(1)), (2, "a", Some(1))]);
        let report = b.check(&[fin("d1", "t", Status::Acked), fin("d2", "t", Status::Acked)]);
        assert_eq!(report.acked_twice, 2, "{report}");
        assert!(!report.clean());
        // A repeat by the same dispatch answering another entry.
        let mut b = Build::new();
        b.enqueue(1, "d1", "t")
            .send(2, "t", "a", 1)
            .claim(3, "d1", "t", "k1", T + 100)
            .ack_message(4, "t", 1, fence("d1", "k1"), Outcome::Seq(1))
            .ack_message(5, "t", 1, fence("d1", "k1"), Outcome::Seq(2));
        let report = b.check(&[fin("d1", "t", Status::Claimed)]);
        assert_eq!(report.acked_twice, 1, "{report}");
        // The message record names a dispatch that never acknowledged it, and another entry.
        let mut b = Build::new();
        b.enqueue(1, "d1", "t")
            .send(2, "t", "a", 1)
            .claim(3, "d1", "t", "k1", T + 100)
            .ack_message(4, "t", 1, fence("d1", "k1"), Outcome::Seq(1))
            .messages(5, "t", &[(1, "a", Some(("d9", 1)))]);
        let report = b.check(&[fin("d1", "t", Status::Claimed)]);
        assert_eq!(report.acked_twice, 2, "{report}");
        let mut b = Build::new();
        b.enqueue(1, "d1", "t")
            .send(2, "t", "a", 1)
            .claim(3, "d1", "t", "k1", T + 100)
            .ack_message(4, "t", 1, fence("d1", "k1"), Outcome::Seq(1))
            .messages(5, "t", &[(1, "a", Some(("d1", 7)))]);
        let report = b.check(&[fin("d1", "t", Status::Claimed)]);
        assert_eq!(report.acked_twice, 1, "{report}");
    }

    #[test]
    fn catches_acknowledgements_out_of_order() {
        // The first acknowledgement returned before the second began, yet got the later entry.
        let mut b = Build::new();
        b.enqueue(1, "d1", "t")
            .send(2, "t", "a", 1)
            .send(3, "t", "b", 2)
            .claim(4, "d1", "t", "k1", T + 100)
            .ack_message(5, "t", 1, fence("d1", "k1"), Outcome::Seq(2))
            .ack_message(6, "t", 2, fence("d1", "k1"), Outcome::Seq(1));
        let report = b.check(&[fin("d1", "t", Status::Claimed)]);
        assert_eq!(report.ack_order, 1, "{report}");
        assert!(!report.clean());
        // Concurrent acknowledgements may commit in either order.
        let mut b = Build::new();
        b.enqueue(1, "d1", "t")
            .send(2, "t", "a", 1)
            .send(3, "t", "b", 2)
            .claim(4, "d1", "t", "k1", T + 100);
        for (start, end, m, seq) in [(50, 70, 1, 2), (55, 65, 2, 1)] {
            b.events.push(Event {
                actor: format!("w{m}"),
                start,
                end,
                clock_before: T,
                clock_after: T,
                op: Op::AckMessage {
                    thread: "t".into(),
                    seq: m,
                    fence: fence("d1", "k1"),
                },
                outcome: Outcome::Seq(seq),
            });
        }
        b.check(&[fin("d1", "t", Status::Claimed)]).assert_clean();
        // An append that returned first with the later entry counts too.
        let mut b = Build::new();
        b.enqueue(1, "d1", "t")
            .send(2, "t", "a", 1)
            .claim(3, "d1", "t", "k1", T + 100)
            .append(4, "t", "x", Some(fence("d1", "k1")), 2)
            .ack_message(5, "t", 1, fence("d1", "k1"), Outcome::Seq(1));
        assert_eq!(b.check(&[fin("d1", "t", Status::Claimed)]).ack_order, 1);
        // The entry an acknowledgement returned without the message's payload or note.
        let mut b = Build::new();
        b.enqueue(1, "d1", "t")
            .send(2, "t", "a", 1)
            .send(3, "t", "b", 2)
            .claim(4, "d1", "t", "k1", T + 100)
            .ack_message(5, "t", 1, fence("d1", "k1"), Outcome::Seq(1))
            .ack_message(6, "t", 2, fence("d1", "k1"), Outcome::Seq(2))
            .read_noted(7, "t", &[(1, "torn", Some(1)), (2, "b", None)]);
        let report = b.check(&[fin("d1", "t", Status::Claimed)]);
        assert_eq!(report.ack_order, 2, "{report}");
    }

    #[test]
    fn catches_a_late_message_acknowledgement() {
        // The lease ran out: a fenced acknowledgement must be refused, like an append.
        let mut b = Build::new();
        b.enqueue(1, "d1", "t")
            .send(2, "t", "a", 1)
            .claim(3, "d1", "t", "k1", T + 100);
        b.clock(T + 101)
            .ack_message(4, "t", 1, fence("d1", "k1"), Outcome::Seq(1));
        let report = b.check(&[fin("d1", "t", Status::Claimed)]);
        assert_eq!(report.dispatches["d1"], Class::StaleWrite, "{report}");
        // After a takeover by a reclaim and a new claim.
        let mut b = Build::new();
        b.enqueue(1, "d1", "t")
            .send(2, "t", "a", 1)
            .claim(3, "d1", "t", "k1", T + 100);
        b.clock(T + 200)
            .reclaim(4, T + 200, &[("d1", "t")])
            .claim(5, "d1", "t", "k2", T + 300)
            .clock(T + 50) // whatever the clock says, the claim is gone
            .ack_message(6, "t", 1, fence("d1", "k1"), Outcome::Seq(1));
        let report = b.check(&[fin("d1", "t", Status::Claimed)]);
        assert_eq!(report.dispatches["d1"], Class::StaleWrite, "{report}");
        // After the holder settled the dispatch.
        let mut b = Build::new();
        b.enqueue(1, "d1", "t")
            .send(2, "t", "a", 1)
            .claim(3, "d1", "t", "k1", T + 100)
            .ack(4, "d1", "t", "k1")
            .ack_message(5, "t", 1, fence("d1", "k1"), Outcome::Seq(1));
        let report = b.check(&[fin("d1", "t", Status::Acked)]);
        assert_eq!(report.dispatches["d1"], Class::StaleWrite, "{report}");
    }

    #[test]
    fn follow_ups_are_expected_only_where_messages_were_sent() {
        // Follow-up metadata on a thread no one sent a message to: invented.
        let mut b = Build::new();
        b.send(1, "t", "a", 1);
        let report = b.check(&[follow_up("f9", "u", Status::Queued, None)]);
        assert_eq!(report.dispatches["f9"], Class::Unexpected, "{report}");
        // A follow-up a send returned, missing at the end: lost.
        let mut b = Build::new();
        b.send_with(1, "t", "a", 1, &["f1"]);
        let report = b.check(&[]);
        assert_eq!(report.dispatches["f1"], Class::Lost, "{report}");
        // Drained: one still live at the end is lost too.
        let drained = check(
            &b.events,
            &[follow_up("f1", "t", Status::Queued, None)],
            Expect::Drained,
        );
        assert_eq!(drained.dispatches["f1"], Class::Lost, "{drained}");
    }

    /// Per-key limits: a cap, a rate.
    fn per_key(cap: Option<u32>, rate: Option<Rate>) -> LimitSet {
        LimitSet {
            key_concurrency: cap,
            key_rate: rate,
            ..LimitSet::default()
        }
    }

    /// `n` dispatches `d0`..: each on a thread of its own named after it, enqueued at 1.
    fn enqueued(b: &mut Build, n: usize) -> Vec<Dispatch> {
        (0..n)
            .map(|i| {
                let id = format!("d{i}");
                b.enqueue(1, &id, &id);
                fin(&id, &id, Status::Claimed)
            })
            .collect()
    }

    #[test]
    fn a_key_within_its_cap_is_clean_and_a_lapsed_claim_frees_its_slot() {
        let limits = per_key(Some(1), None);
        let mut b = Build::new();
        let mut finals = enqueued(&mut b, 4);
        b.gated(2, "d0", "k0", T + 100, "k", &limits)
            .ack(3, "d0", "d0", "k0")
            .gated(4, "d1", "k1", T + 100, "k", &limits)
            .ack(5, "d1", "d1", "k1");
        // d2's lease runs out unreclaimed: its slot is free, d3 takes it, and d2's late ack is
        // still its own (section 2.2).
        b.gated(6, "d2", "k2", T + 100, "k", &limits);
        b.clock(T + 101)
            .gated(7, "d3", "k3", T + 301, "k", &limits)
            .ack(8, "d2", "d2", "k2")
            .ack(9, "d3", "d3", "k3");
        for d in &mut finals {
            d.status = Status::Acked;
        }
        let report = b.check(&finals);
        report.assert_clean();
        assert_eq!(report.key_peaks["k"], (1, 1), "{report}");
    }

    #[test]
    fn catches_a_key_over_its_cap() {
        let mut b = Build::new();
        let finals = enqueued(&mut b, 3);
        let limits = per_key(Some(2), None);
        b.gated(2, "d0", "k0", T + 100, "k", &limits)
            .gated(3, "d1", "k1", T + 100, "k", &limits);
        b.check(&finals).assert_clean();
        b.gated(4, "d2", "k2", T + 100, "k", &limits);
        let report = b.check(&finals);
        assert_eq!(report.over_cap, 1, "{report}");
        assert_eq!(report.key_peaks["k"], (3, 2), "{report}");
        assert!(!report.clean());
        // Other keys are counted apart.
        let mut b = Build::new();
        let finals = enqueued(&mut b, 3);
        b.gated(2, "d0", "k0", T + 100, "k", &limits)
            .gated(3, "d1", "k1", T + 100, "k", &limits)
            .gated(4, "d2", "k2", T + 100, "j", &limits);
        b.check(&finals).assert_clean();
    }

    #[test]
    fn a_lease_holds_its_slot_through_its_last_millisecond() {
        // A lease runs while `now <= lease_until`: another claim of the key at that very
        // millisecond is one too many, and the finding says it hangs on the boundary.
        let limits = per_key(Some(1), None);
        let mut b = Build::new();
        let finals = enqueued(&mut b, 2);
        b.gated(2, "d0", "k0", T + 100, "k", &limits);
        b.clock(T + 100).gated(3, "d1", "k1", T + 300, "k", &limits);
        let report = b.check(&finals);
        assert_eq!(report.over_cap, 1, "{report}");
        assert!(report.findings[0].contains("last millisecond"), "{report}");
        // One millisecond later the slot is free.
        let mut b = Build::new();
        let finals = enqueued(&mut b, 2);
        b.gated(2, "d0", "k0", T + 100, "k", &limits);
        b.clock(T + 101).gated(3, "d1", "k1", T + 301, "k", &limits);
        b.check(&finals).assert_clean();
    }

    /// d0's lease runs out, `others` claims of its key take the slots, then d0's extension is
    /// accepted (its call ran while the clock moved from T + 101 to T + 150), optionally
    /// followed by a load showing d0's lease at `shown`.
    fn revival(cap: u32, others: usize, shown: Option<u64>) -> Report {
        let limits = per_key(Some(cap), None);
        let mut b = Build::new();
        let finals = enqueued(&mut b, others + 1);
        b.gated(2, "d0", "k0", T + 100, "k", &limits);
        b.clock(T + 101);
        for i in 1..=others {
            b.gated(3, &format!("d{i}"), &format!("k{i}"), T + 400, "k", &limits);
        }
        b.events.push(Event {
            actor: "late".into(),
            start: 40,
            end: 41,
            clock_before: T + 101,
            clock_after: T + 150,
            op: Op::Holder {
                id: "d0".into(),
                token: "k0".into(),
                kind: HolderKind::Extend(200),
            },
            outcome: Outcome::Done,
        });
        b.clock(T + 150);
        if let Some(lease) = shown {
            b.at(
                5,
                Op::Load { id: "d0".into() },
                Outcome::Record(Box::new(record(
                    "d0",
                    "d0",
                    Status::Claimed,
                    Some("k0"),
                    lease,
                ))),
            );
        }
        b.read(6, "elsewhere", 0, &[]);
        b.check(&finals)
    }

    #[test]
    fn catches_a_claim_revived_after_its_slot_was_taken() {
        // The extension makes d0 live again next to d1: two claims of a key capped at one.
        let report = revival(1, 1, None);
        assert_eq!(report.over_cap, 1, "{report}");
        // An expired lease is never extended: the extension itself is a stale write.
        assert_eq!(report.dispatches["d0"], Class::StaleWrite, "{report}");
    }

    #[test]
    fn a_slot_block_extension_counts_only_as_far_as_the_lease_read_back() {
        // With a cap of 16 a NATS slot block may cut an extension short: only `now + 1` is sure,
        // and the clock is past that when the call returns.
        let report = revival(16, 16, None);
        assert_eq!(report.over_cap, 0, "{report}");
        assert_eq!(report.key_peaks["k"], (16, 16), "{report}");
        // A load of d0 that shows the lease the extension gave counts it again.
        let report = revival(16, 16, Some(T + 301));
        assert_eq!(report.over_cap, 1, "{report}");
        // A lease shown as already run out does not.
        let report = revival(16, 16, Some(T + 120));
        assert_eq!(report.over_cap, 0, "{report}");
    }

    #[test]
    fn catches_a_key_over_its_rate() {
        let limits = per_key(None, Some(Rate::new(1, 1_000)));
        // A token a second: one each second, and a block's 100 ms, is fine.
        let mut b = Build::new();
        let finals = enqueued(&mut b, 3);
        for (i, clock) in [T, T + 1_000, T + 2_000].into_iter().enumerate() {
            b.clock(clock).gated(
                2 + i as u64,
                &format!("d{i}"),
                &format!("k{i}"),
                clock + 100,
                "k",
                &limits,
            );
        }
        b.check(&finals).assert_clean();
        // Two within half a second are not.
        let mut b = Build::new();
        let finals = enqueued(&mut b, 2);
        b.gated(2, "d0", "k0", T + 100, "k", &limits)
            .clock(T + 500)
            .gated(3, "d1", "k1", T + 600, "k", &limits);
        let report = b.check(&finals);
        assert_eq!(report.over_rate, 1, "{report}");
        assert!(!report.clean());
        // Unkeyed claims and other keys are not counted with it.
        let mut b = Build::new();
        let finals = enqueued(&mut b, 2);
        b.gated(2, "d0", "k0", T + 100, "k", &limits)
            .gated(3, "d1", "k1", T + 100, "j", &limits);
        b.check(&finals).assert_clean();
    }
}
