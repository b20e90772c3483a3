//! A model of a host's view of the NATS stream, checked by property tests (issue 49).
//!
//! # The model
//!
//! A simulated stream (a `Vec` of records, sequence = index + 1) is written by several hosts:
//! *our* host, whose [`View`] is under test, and other hosts, whose writes our host only
//! learns through its watcher. Each host decides its writes from its own state of one thread:
//! our host from the view under test (through its accessors: `live_of`, `holder`,
//! `waitpoints_of`, `pending_after`, `thread`, `thread_seq`, and `promote` + `pick` for a
//! claim), another host from the server's state of the thread some messages ago (lag 0 most of
//! the time). The writes are those of the NATS backend, in its shapes: enqueue; claim (a stale
//! epoch supersedes instead); ack, dead-letter or nack of a claimed dispatch; create a waitpoint;
//! suspend; complete or time out a waitpoint (with the resume of a waiting dispatch in the same
//! batch); cancel; interrupt (the thread record's epoch bumped, then the queued and waiting
//! dispatches superseded, one batch); a thread record rewrite (a trim); send an inbox message,
//! acknowledge one (a log entry and the message, one batch), discard some. A write that ends a
//! dispatch with waitpoints is a batch whose pending waitpoints are cancelled *before* the
//! dispatch record, as `effects::applied` writes it. A write (or batch) names the last
//! sequence of its thread's tree as its host knew it, and the stream accepts it only when that
//! is the tree's real last sequence (the server's `Nats-Expected-Last-Subject-Sequence` on
//! `<p>.th.<thread>.>`); a batch is stored contiguously.
//!
//! Our host's accepted writes wait in a queue of publish replies; a reply step applies one of
//! them, whole, through [`View::apply_own`], in any order and at any later step, so possibly
//! after the watcher went past them (what a descheduled task does between the server's answer
//! and taking the view's lock). A watcher step applies the next messages of the stream through
//! [`View::apply`], in order. Time moves by steps of its own.
//!
//! # The invariant
//!
//! After every step, **the view holds for each thread the server's state of that thread as of
//! the view's fence for it**. The fence of thread `T` is the last sequence of `T`'s tree the
//! watcher applied (`pos` and below) or, if higher, the highest sequence of our own writes of
//! `T` applied since; every message of `T` between the two is one of those own writes (the
//! fence of each write guarantees it, and the model checks it). So the reference is the fold of
//! the stream up to `pos` plus our applied own writes above it, per thread, projected as a
//! lean view holds it: the live dispatches only (queued, claimed, waiting), the thread record,
//! the pending inbox messages and the inbox and log watermarks, the waitpoints of live
//! dispatches (without their results). It is compared through the view's accessors:
//! `thread_seq`, `thread`, `live_of`, `dispatch`, `dispatch_seq`, `holder`, `last_agent`,
//! `message`, `inbox_marks`, `latest`, `waitpoints_of`, `waitpoint`, `records`, `has_live`,
//! `waitpoint_count`, `claimed`, `pending_waitpoints`, and `pick` after `promote` (which must
//! give the best due dispatch of a thread that holds none, of the best priority there is; the
//! order between threads of one priority is the view's fairness and is not modelled).
//!
//! On failure the test prints the shrunk case replayed as a trace: every step, what was
//! decided and whether the stream took it, and the first difference found. Over all cases it
//! also asserts that the runs did what makes the model worth running (late own applies after
//! other hosts wrote the thread, batches, refused fences, waitpoints, messages: `COVERAGE`),
//! so the model cannot go on passing by doing nothing of interest. `PROPTEST_RNG_SEED` fixes
//! the cases' seed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};

use super::view::{MessageHead, Record, Stored, ThreadRec, View};
use crate::store::inbox::{InboxMarks, Message, MessageKind, MessageState};
use crate::store::model::{NewDispatch, Status};
use crate::store::rules::{self, HolderOp, Settle, Take};
use crate::store::waitpoints::{self as wp, BY_TIMEOUT, NewWaitpoint, Waitpoint, WaitpointState};

const THREADS: [&str; 3] = ["t0", "t1", "t2"];
const AGENTS: [&str; 2] = ["a0", "a1"];
/// Cases per run (about 3 s in a release build on two cores).
const CASES: u32 = 2_048;
/// The most steps of one case.
const MAX_STEPS: usize = 200;
const LEASE_MS: u64 = 60_000;
const MAX_RESUMES: u32 = 3;

/// How a holder settles its claim.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    Ack,
    DeadLetter,
    /// Back to the queue after this many milliseconds (or dead-lettered at the last attempt).
    Nack(u16),
}

/// What a host decides to write on one thread.
#[derive(Debug, Clone)]
enum Op {
    Enqueue {
        agent: usize,
        priority: u8,
        delay: u16,
        max_attempts: u32,
    },
    /// Our host: `promote` and `pick` (any thread); another host: the best due dispatch of the
    /// step's thread.
    Claim {
        agent: usize,
    },
    /// The thread's claimed dispatch settles.
    Settle(Outcome),
    /// The thread's claimed dispatch creates a waitpoint.
    Wait,
    /// The thread's claimed dispatch suspends.
    Suspend,
    /// A pending waitpoint of the thread completes (or times out, when set).
    Complete(Index, bool),
    /// A queued or waiting dispatch of the thread is cancelled.
    Cancel(Index),
    Interrupt,
    /// The thread record is written again (a trim; the archiver's rewrite is the same write).
    Trim,
    Send {
        agent: Option<usize>,
    },
    /// The thread's claimed dispatch acknowledges a pending message.
    AckMessage(Index),
    /// The pending messages up to one are discarded.
    Discard(Index),
}

impl Op {
    /// The kind of an accepted write of this op, for the coverage counts.
    fn name(&self, ours: bool) -> &'static str {
        match (self, ours) {
            (Op::Enqueue { .. }, true) => "ours: enqueue",
            (Op::Enqueue { .. }, false) => "other: enqueue",
            (Op::Claim { .. }, true) => "ours: claim (pick)",
            (Op::Claim { .. }, false) => "other: claim",
            (Op::Settle(_), true) => "ours: settle",
            (Op::Settle(_), false) => "other: settle",
            (Op::Wait, _) => "either: create a waitpoint",
            (Op::Suspend, _) => "either: suspend",
            (Op::Complete(..), _) => "either: settle a waitpoint",
            (Op::Cancel(_), _) => "either: cancel",
            (Op::Interrupt, true) => "ours: interrupt",
            (Op::Interrupt, false) => "other: interrupt",
            (Op::Trim, true) => "ours: thread record rewrite",
            (Op::Trim, false) => "other: thread record rewrite",
            (Op::Send { .. }, _) => "either: send a message",
            (Op::AckMessage(_), _) => "either: ack a message",
            (Op::Discard(_), _) => "either: discard messages",
        }
    }
}

/// Who decides.
#[derive(Debug, Clone, Copy)]
enum Host {
    /// Our host, on the view under test.
    Ours,
    /// Another host, on the server's state as it was this many messages ago.
    Other(u8),
}

#[derive(Debug, Clone)]
enum Step {
    /// A host decides a write on one thread and offers it to the stream.
    Decide { host: Host, thread: usize, op: Op },
    /// The watcher applies up to this many next messages of the stream.
    Watch(u8),
    /// The reply to one of our accepted writes arrives: its records are applied as own.
    Reply(Index),
    /// Time passes (milliseconds).
    Tick(u16),
}

/// One message of the stream.
#[derive(Debug)]
struct Msg {
    seq: u64,
    thread: usize,
    record: Record,
    /// Written by our host.
    own: bool,
}

/// One of our accepted writes whose reply has not been applied yet.
#[derive(Debug)]
struct Reply {
    first: u64,
    thread: usize,
    records: Vec<Record>,
}

/// What a host knows of one thread when it decides.
#[derive(Debug, Default)]
struct Snap {
    /// The last sequence of the thread's tree (what its write expects).
    fence: u64,
    rec: ThreadRec,
    /// The live dispatches, by id.
    live: Vec<Stored>,
    /// The waitpoints of the live dispatches.
    waitpoints: Vec<Waitpoint>,
    /// The pending messages, oldest first.
    pending: Vec<(u64, MessageHead)>,
    /// The inbox's latest sequence.
    latest_msg: u64,
    /// The log's latest entry.
    latest_log: u64,
}

impl Snap {
    /// What our host knows: its view's.
    fn of_view(view: &View, thread: &str) -> Snap {
        let live: Vec<Stored> = view.live_of(thread).into_iter().cloned().collect();
        let waitpoints = live
            .iter()
            .flat_map(|s| view.waitpoints_of(thread, &s.dispatch.id))
            .map(|h| h.waitpoint.clone())
            .collect();
        Snap {
            fence: view.thread_seq(thread),
            rec: view.thread(thread).unwrap_or_default(),
            live,
            waitpoints,
            pending: view
                .pending_after(thread, 0)
                .into_iter()
                .map(|(n, h)| (n, h.clone()))
                .collect(),
            latest_msg: view.inbox_marks(thread).latest,
            latest_log: view.latest(thread),
        }
    }

    fn holder(&self) -> Option<&Stored> {
        self.live
            .iter()
            .find(|s| matches!(s.dispatch.status, Status::Claimed | Status::Waiting))
    }

    fn claimed(&self) -> Option<&Stored> {
        self.holder()
            .filter(|s| s.dispatch.status == Status::Claimed)
    }
}

/// The server's state of one thread: the fold of its tree's messages up to some sequence.
#[derive(Debug, Default)]
struct Fold {
    /// The last sequence folded (the thread's fence as of the fold).
    last: u64,
    rec: ThreadRec,
    dispatches: BTreeMap<String, (u64, Option<Stored>)>,
    waitpoints: BTreeMap<String, (u64, Waitpoint)>,
    messages: BTreeMap<u64, (u64, MessageHead)>,
    entries: u64,
    /// The agent of the last record of a dispatch that was ever claimed.
    last_agent: Option<String>,
}

impl Fold {
    fn of<'a>(msgs: impl IntoIterator<Item = &'a Msg>) -> Fold {
        let mut f = Fold::default();
        for m in msgs {
            f.last = m.seq;
            match &m.record {
                Record::Dispatch(_, id, value) => {
                    if let Some(s) = value
                        && (s.dispatch.claims > 0 || s.dispatch.status == Status::Claimed)
                    {
                        f.last_agent = Some(s.dispatch.agent.clone());
                    }
                    f.dispatches
                        .insert(id.clone(), (m.seq, value.as_deref().cloned()));
                }
                Record::Thread(_, rec) => f.rec = rec.clone(),
                Record::Entry(_, n) => f.entries = f.entries.max(*n),
                Record::Message(_, n, head) => {
                    f.messages.insert(*n, (m.seq, (**head).clone()));
                }
                Record::Waitpoint(_, id, w) => {
                    f.waitpoints.insert(id.clone(), (m.seq, (**w).clone()));
                }
                _ => {}
            }
        }
        f
    }

    /// The live dispatches, by id, with their record's sequence.
    fn live(&self) -> impl Iterator<Item = (u64, &Stored)> {
        self.dispatches.values().filter_map(|(seq, value)| {
            value
                .as_ref()
                .filter(|s| !s.dispatch.status.is_terminal())
                .map(|s| (*seq, s))
        })
    }

    fn live_record(&self, id: &str) -> Option<(u64, &Stored)> {
        let (seq, value) = self.dispatches.get(id)?;
        value
            .as_ref()
            .filter(|s| !s.dispatch.status.is_terminal())
            .map(|s| (*seq, s))
    }

    fn holder(&self) -> Option<&Stored> {
        self.live()
            .map(|(_, s)| s)
            .find(|s| matches!(s.dispatch.status, Status::Claimed | Status::Waiting))
    }

    /// The waitpoints a lean view holds: those of live dispatches.
    fn held_waitpoints(&self) -> impl Iterator<Item = (&String, &(u64, Waitpoint))> {
        self.waitpoints
            .iter()
            .filter(|(_, (_, w))| self.live_record(&w.dispatch).is_some())
    }

    fn pending(&self) -> impl Iterator<Item = (u64, &MessageHead)> {
        self.messages
            .iter()
            .filter(|(_, (_, h))| h.state == MessageState::Pending)
            .map(|(n, (_, h))| (*n, h))
    }

    fn marks(&self) -> InboxMarks {
        InboxMarks {
            latest: self
                .messages
                .keys()
                .next_back()
                .copied()
                .unwrap_or(0)
                .max(self.rec.inbox_archived),
            pending: self.pending().count() as u64,
            followed: self.rec.inbox_followed,
        }
    }

    fn latest_log(&self) -> u64 {
        self.entries.max(self.rec.trimmed)
    }

    /// What another host knows of the thread, deciding on this state.
    fn snap(&self) -> Snap {
        Snap {
            fence: self.last,
            rec: self.rec.clone(),
            live: self.live().map(|(_, s)| s.clone()).collect(),
            waitpoints: self
                .held_waitpoints()
                .map(|(_, (_, w))| w.clone())
                .collect(),
            pending: self.pending().map(|(n, h)| (n, h.clone())).collect(),
            latest_msg: self.marks().latest,
            latest_log: self.latest_log(),
        }
    }
}

fn dispatch_record(stored: Stored) -> Record {
    let d = &stored.dispatch;
    Record::Dispatch(d.thread.clone(), d.id.clone(), Some(Box::new(stored)))
}

fn waitpoint_record(w: Waitpoint) -> Record {
    Record::Waitpoint(w.thread.clone(), w.id.clone(), Box::new(w))
}

fn plain(dispatch: crate::store::model::Dispatch) -> Stored {
    Stored {
        dispatch,
        settled: None,
        waitpoints: false,
    }
}

/// The records that store `stored`: when it ends a dispatch that has waitpoints, its pending
/// ones cancelled first, and the record marked (what `effects::applied` writes).
fn ended(snap: &Snap, mut stored: Stored) -> Vec<Record> {
    let (id, status, at) = (
        stored.dispatch.id.clone(),
        stored.dispatch.status,
        stored.dispatch.updated_at,
    );
    let mut records = Vec::new();
    let mine: Vec<&Waitpoint> = snap
        .waitpoints
        .iter()
        .filter(|w| w.dispatch == id)
        .collect();
    if let Some(by) = rules::waitpoints_end(status)
        && !mine.is_empty()
    {
        for w in mine.into_iter().filter(|w| w.is_pending()) {
            let mut w = w.clone();
            wp::settle(&mut w, WaitpointState::Cancelled, None, by, at);
            records.push(waitpoint_record(w));
        }
        stored.waitpoints = true;
    }
    records.push(dispatch_record(stored));
    records
}

/// A short description of a record, for the trace.
fn show(r: &Record) -> String {
    match r {
        Record::Dispatch(_, id, Some(s)) => {
            let d = &s.dispatch;
            format!(
                "{id} {}(agent {}, epoch {}, attempt {}/{}, claims {}, resumes {})",
                d.status, d.agent, d.epoch, d.attempt, d.max_attempts, d.claims, d.resumes
            )
        }
        Record::Dispatch(_, id, None) => format!("{id} tombstone"),
        Record::Thread(_, rec) => format!(
            "thread record(epoch {}, trimmed {}, followed {})",
            rec.epoch, rec.trimmed, rec.inbox_followed
        ),
        Record::Entry(_, n) => format!("log entry {n}"),
        Record::Message(_, n, h) => format!("message {n} {}", h.state),
        Record::Waitpoint(_, id, w) => format!("waitpoint {id} of {} {}", w.dispatch, w.state),
        other => format!("{other:?}"),
    }
}

fn brief(s: &Stored) -> String {
    let d = &s.dispatch;
    format!(
        "{} {} (epoch {}, attempt {}, claims {}, resumes {})",
        d.id, d.status, d.epoch, d.attempt, d.claims, d.resumes
    )
}

/// The stream, our host's view and its pending replies.
#[derive(Debug)]
struct Model {
    view: View,
    stream: Vec<Msg>,
    /// The last sequence of each thread's tree.
    last: [u64; THREADS.len()],
    /// How many messages the watcher applied.
    watched: usize,
    replies: Vec<Reply>,
    /// Per stream message: one of ours whose reply was applied.
    replied: Vec<bool>,
    /// Per thread: the highest sequence of our own writes applied.
    own_fence: [u64; THREADS.len()],
    now: u64,
    /// Every dispatch id minted, with its thread.
    dispatches: Vec<(String, usize)>,
    /// Every waitpoint id minted, with its thread.
    waitpoints: Vec<(String, usize)>,
    trace: Option<String>,
    /// What happened, by kind (the coverage the test asserts over all cases).
    seen: Seen,
}

/// Counts of what the cases did, by kind.
type Seen = BTreeMap<&'static str, u64>;

impl Model {
    fn new(trace: bool) -> Model {
        Model {
            view: View::lean(),
            stream: Vec::new(),
            last: [0; THREADS.len()],
            watched: 0,
            replies: Vec::new(),
            replied: Vec::new(),
            own_fence: [0; THREADS.len()],
            now: 1_000,
            dispatches: Vec::new(),
            waitpoints: Vec::new(),
            trace: trace.then(String::new),
            seen: Seen::new(),
        }
    }

    fn count(&mut self, kind: &'static str) {
        *self.seen.entry(kind).or_default() += 1;
    }

    fn note(&mut self, line: impl FnOnce() -> String) {
        if let Some(trace) = &mut self.trace {
            let _ = writeln!(trace, "    {}", line());
        }
    }

    fn step(&mut self, step: &Step) {
        match step {
            Step::Decide { host, thread, op } => self.decide(*host, *thread, op),
            Step::Watch(n) => {
                let from = self.watched;
                for _ in 0..*n {
                    let Some(m) = self.stream.get(self.watched) else {
                        break;
                    };
                    self.view.apply(m.seq, m.record.clone());
                    self.watched += 1;
                }
                let to = self.watched;
                self.note(|| format!("watcher applies {}..={to} (pos {to})", from + 1));
            }
            Step::Reply(i) => {
                if self.replies.is_empty() {
                    self.note(|| "no reply pending".into());
                    return;
                }
                let reply = self.replies.remove(i.index(self.replies.len()));
                let n = reply.records.len() as u64;
                let pos = self.view.pos;
                let last = reply.first + n - 1;
                if last <= pos
                    && self.stream[last as usize..pos as usize]
                        .iter()
                        .any(|m| m.thread == reply.thread)
                {
                    self.count("own apply passed by the watcher after others wrote the thread");
                }
                self.count(if last <= pos {
                    "own apply after the watcher passed it"
                } else if reply.first <= pos {
                    "own apply of a batch the watcher is inside"
                } else {
                    "own apply ahead of the watcher"
                });
                self.note(|| {
                    format!(
                        "own apply of {}..={} ({}) with pos {pos}{}",
                        reply.first,
                        reply.first + n - 1,
                        THREADS[reply.thread],
                        if reply.first + n - 1 <= pos {
                            ": the watcher passed it"
                        } else {
                            ""
                        }
                    )
                });
                for (i, record) in reply.records.into_iter().enumerate() {
                    let seq = reply.first + i as u64;
                    self.view.apply_own(seq, record);
                    self.replied[seq as usize - 1] = true;
                }
                let fence = &mut self.own_fence[reply.thread];
                *fence = (*fence).max(reply.first + n - 1);
            }
            Step::Tick(ms) => {
                self.now += u64::from(*ms);
                let now = self.now;
                self.note(|| format!("now {now}"));
            }
        }
    }

    /// A host decides on its state of a thread and offers the write to the stream.
    fn decide(&mut self, host: Host, thread: usize, op: &Op) {
        let (thread, snap, picked) = match (host, op) {
            (Host::Ours, Op::Claim { agent }) => {
                self.view.promote(AGENTS[*agent], self.now);
                let Some(s) = self.view.pick(AGENTS[*agent]) else {
                    self.note(|| format!("ours: claim {}: nothing to pick", AGENTS[*agent]));
                    return;
                };
                let (id, name) = (s.dispatch.id.clone(), s.dispatch.thread.clone());
                let Some(t) = THREADS.iter().position(|t| *t == name) else {
                    return;
                };
                (t, Snap::of_view(&self.view, THREADS[t]), Some(id))
            }
            (Host::Ours, _) => (thread, Snap::of_view(&self.view, THREADS[thread]), None),
            (Host::Other(lag), _) => {
                let cut = self.stream.len().saturating_sub(usize::from(lag));
                let fold = Fold::of(self.stream[..cut].iter().filter(|m| m.thread == thread));
                (thread, fold.snap(), None)
            }
        };
        let who = match host {
            Host::Ours => "ours".to_owned(),
            Host::Other(lag) => format!("other (lag {lag})"),
        };
        let Some(records) = self.plan(op, thread, &snap, picked.as_deref()) else {
            self.count("decision with nothing to do");
            self.note(|| format!("{who} on {}: {op:?}: nothing to do", THREADS[thread]));
            return;
        };
        let what: Vec<String> = records.iter().map(show).collect();
        if snap.fence != self.last[thread] {
            self.count(if matches!(host, Host::Ours) {
                "write of ours refused by its fence"
            } else {
                "write of another host refused by its fence"
            });
            let last = self.last[thread];
            self.note(|| {
                format!(
                    "{who} on {}: {op:?} expects {}, the tree is at {last}: refused [{}]",
                    THREADS[thread],
                    snap.fence,
                    what.join(", ")
                )
            });
            return;
        }
        let own = matches!(host, Host::Ours);
        self.count(op.name(own));
        if records.len() > 1 {
            self.count("batch stored");
        }
        let first = self.stream.len() as u64 + 1;
        for (i, record) in records.iter().enumerate() {
            self.stream.push(Msg {
                seq: first + i as u64,
                thread,
                record: record.clone(),
                own,
            });
            self.replied.push(false);
        }
        let end = self.stream.len() as u64;
        self.last[thread] = end;
        if own {
            self.replies.push(Reply {
                first,
                thread,
                records,
            });
        }
        self.note(|| {
            format!(
                "{who} on {}: {op:?} expects {}: stored at {first}..={end} [{}]",
                THREADS[thread],
                snap.fence,
                what.join(", ")
            )
        });
    }

    fn mint(&mut self, kind: char, thread: usize) -> String {
        let id = format!("{kind}{}", self.dispatches.len() + self.waitpoints.len());
        if kind == 'd' {
            self.dispatches.push((id.clone(), thread));
        } else {
            self.waitpoints.push((id.clone(), thread));
        }
        id
    }

    /// The records a host writes for `op` on its state of the thread, if the op applies.
    fn plan(
        &mut self,
        op: &Op,
        t: usize,
        snap: &Snap,
        picked: Option<&str>,
    ) -> Option<Vec<Record>> {
        let thread = THREADS[t];
        let now = self.now;
        match op {
            Op::Enqueue {
                agent,
                priority,
                delay,
                max_attempts,
            } => {
                let id = self.mint('d', t);
                let new = NewDispatch::new(AGENTS[*agent], thread, b"p".to_vec())
                    .with_priority(*priority)
                    .with_delay_ms(u64::from(*delay))
                    .with_max_attempts(*max_attempts);
                let d = rules::queued_record(&id, &new, snap.rec.epoch, now);
                Some(vec![dispatch_record(plain(d))])
            }
            Op::Claim { agent } => {
                if snap.holder().is_some() {
                    return None;
                }
                let s = match picked {
                    Some(id) => snap.live.iter().find(|s| s.dispatch.id == id)?,
                    None => snap
                        .live
                        .iter()
                        .filter(|s| {
                            s.dispatch.status == Status::Queued
                                && s.dispatch.agent == AGENTS[*agent]
                                && rules::due(&s.dispatch, now)
                        })
                        .min_by_key(|s| {
                            (s.dispatch.priority, s.dispatch.created_at, &s.dispatch.id)
                        })?,
                };
                match rules::take(
                    s.dispatch.clone(),
                    (snap.rec.epoch, 0),
                    "worker",
                    LEASE_MS,
                    now,
                    true,
                ) {
                    Take::Claimed(d) => Some(vec![dispatch_record(plain(d))]),
                    Take::Stale(d) => Some(ended(snap, plain(d))),
                }
            }
            Op::Settle(outcome) => {
                let s = snap.claimed()?;
                let token = s.dispatch.claim.as_ref()?.token.clone();
                let op = match outcome {
                    Outcome::Ack => HolderOp::Ack,
                    Outcome::DeadLetter => HolderOp::DeadLetter {
                        error: "gave up".into(),
                    },
                    Outcome::Nack(delay) => HolderOp::Nack {
                        retry_at: now + u64::from(*delay),
                        error: "failed".into(),
                    },
                };
                let settles = op.settles()?;
                let mut d = s.dispatch.clone();
                op.apply(&mut d, now, Default::default()).ok()?;
                let stored = Stored {
                    dispatch: d,
                    settled: Some((token, settles.as_str().to_owned())),
                    waitpoints: false,
                };
                Some(ended(snap, stored))
            }
            Op::Wait => {
                let d = snap.claimed()?.dispatch.clone();
                let id = self.mint('w', t);
                let new = NewWaitpoint {
                    name: id.clone(),
                    timeout_ms: 1_000,
                    metadata: BTreeMap::new(),
                    token_digest: wp::token_digest("hwp_model"),
                };
                Some(vec![waitpoint_record(wp::pending_record(
                    &id, &d, &new, now,
                ))])
            }
            Op::Suspend => {
                let s = snap.claimed()?;
                let token = s.dispatch.claim.as_ref()?.token.clone();
                let mine: Vec<Waitpoint> = snap
                    .waitpoints
                    .iter()
                    .filter(|w| w.dispatch == s.dispatch.id)
                    .cloned()
                    .collect();
                let d = wp::suspended(s.dispatch.clone(), &mine, MAX_RESUMES, now).ok()?;
                let stored = Stored {
                    dispatch: d,
                    settled: Some((token, Settle::Suspend.as_str().to_owned())),
                    waitpoints: false,
                };
                Some(ended(snap, stored))
            }
            Op::Complete(i, timed_out) => {
                let pending: Vec<&Waitpoint> =
                    snap.waitpoints.iter().filter(|w| w.is_pending()).collect();
                if pending.is_empty() {
                    return None;
                }
                let mut w = pending[i.index(pending.len())].clone();
                if *timed_out {
                    wp::settle(&mut w, WaitpointState::TimedOut, None, BY_TIMEOUT, now);
                } else {
                    wp::settle(
                        &mut w,
                        WaitpointState::Completed,
                        Some(b"ok".to_vec()),
                        "api",
                        now,
                    );
                }
                let dispatch = w.dispatch.clone();
                let mut records = vec![waitpoint_record(w)];
                if let Some(s) = snap
                    .live
                    .iter()
                    .find(|s| s.dispatch.id == dispatch && s.dispatch.status == Status::Waiting)
                {
                    let mut d = s.dispatch.clone();
                    wp::resume(&mut d, now);
                    records.push(dispatch_record(Stored {
                        dispatch: d,
                        ..s.clone()
                    }));
                }
                Some(records)
            }
            Op::Cancel(i) => {
                let candidates: Vec<&Stored> = snap
                    .live
                    .iter()
                    .filter(|s| matches!(s.dispatch.status, Status::Queued | Status::Waiting))
                    .collect();
                if candidates.is_empty() {
                    return None;
                }
                let s = candidates[i.index(candidates.len())];
                let mut d = s.dispatch.clone();
                rules::terminate(&mut d, Status::Cancelled, now, None);
                Some(ended(
                    snap,
                    Stored {
                        dispatch: d,
                        ..s.clone()
                    },
                ))
            }
            Op::Interrupt => {
                let mut rec = snap.rec.clone();
                rec.epoch += 1;
                let epoch = rec.epoch;
                let mut records = vec![Record::Thread(thread.to_owned(), rec)];
                let mut doomed: Vec<&Stored> = snap
                    .live
                    .iter()
                    .filter(|s| {
                        matches!(s.dispatch.status, Status::Queued | Status::Waiting)
                            && rules::stale(&s.dispatch, epoch)
                    })
                    .collect();
                doomed.sort_by_key(|s| (s.dispatch.status != Status::Waiting, &s.dispatch.id));
                for s in doomed {
                    let d = rules::superseded(s.dispatch.clone(), now, "interrupted");
                    records.extend(ended(
                        snap,
                        Stored {
                            dispatch: d,
                            ..s.clone()
                        },
                    ));
                }
                Some(records)
            }
            Op::Trim => {
                let mut rec = snap.rec.clone();
                rec.trimmed = snap.latest_log;
                rec.inbox_followed = snap.latest_msg;
                Some(vec![Record::Thread(thread.to_owned(), rec)])
            }
            Op::Send { agent } => {
                let n = snap.latest_msg + 1;
                let message = Message {
                    thread: thread.to_owned(),
                    seq: n,
                    kind: MessageKind::Steer,
                    payload: b"m".to_vec(),
                    metadata: BTreeMap::new(),
                    agent: agent.map(|a| AGENTS[a].to_owned()),
                    sent_by: "model".into(),
                    sent_at: now,
                    state: MessageState::Pending,
                    settled_at: None,
                    acked_by: None,
                    log_seq: None,
                    applied: None,
                };
                let head = MessageHead::of(&message, 64);
                Some(vec![Record::Message(thread.to_owned(), n, Box::new(head))])
            }
            Op::AckMessage(i) => {
                let holder = snap.claimed()?.dispatch.id.clone();
                if snap.pending.is_empty() {
                    return None;
                }
                let (n, head) = &snap.pending[i.index(snap.pending.len())];
                let entry = snap.latest_log + 1;
                let mut head = head.clone();
                head.state = MessageState::Acked;
                head.acked_by = Some(holder);
                head.log_seq = Some(entry);
                Some(vec![
                    Record::Entry(thread.to_owned(), entry),
                    Record::Message(thread.to_owned(), *n, Box::new(head)),
                ])
            }
            Op::Discard(i) => {
                if snap.pending.is_empty() {
                    return None;
                }
                let through = snap.pending[i.index(snap.pending.len())].0;
                Some(
                    snap.pending
                        .iter()
                        .filter(|(n, _)| *n <= through)
                        .map(|(n, h)| {
                            let mut h = h.clone();
                            h.state = MessageState::Discarded;
                            Record::Message(thread.to_owned(), *n, Box::new(h))
                        })
                        .collect(),
                )
            }
        }
    }

    /// Compares the view with the reference: per thread, the fold of its tree up to the fence
    /// the view should have for it.
    fn check(&mut self) -> Result<(), String> {
        if self.view.pos != self.watched as u64 {
            return Err(format!(
                "pos is {}, the watcher applied {}",
                self.view.pos, self.watched
            ));
        }
        let mut folds = Vec::with_capacity(THREADS.len());
        for (t, name) in THREADS.iter().enumerate() {
            let seen = self.stream[..self.watched]
                .iter()
                .rev()
                .find(|m| m.thread == t)
                .map_or(0, |m| m.seq);
            let fence = seen.max(self.own_fence[t]);
            // The model's own consequence of the fences: above what the watcher applied, the
            // thread's tree up to the fence holds only our own writes, all applied.
            for m in &self.stream[seen as usize..fence as usize] {
                if m.thread == t && !(m.own && self.replied[m.seq as usize - 1]) {
                    return Err(format!(
                        "model: {name}: message {} ({}) between the watcher's {seen} and the \
                         fence {fence} is not an applied own write",
                        m.seq,
                        show(&m.record)
                    ));
                }
            }
            let fold = Fold::of(
                self.stream[..fence as usize]
                    .iter()
                    .filter(|m| m.thread == t),
            );
            self.check_thread(t, fence, &fold)
                .map_err(|e| format!("{name} (fence {fence}, pos {}): {e}", self.view.pos))?;
            folds.push(fold);
        }
        self.check_totals(&folds)?;
        self.check_pick(&folds)
    }

    fn check_thread(&self, t: usize, fence: u64, fold: &Fold) -> Result<(), String> {
        let name = THREADS[t];
        let view = &self.view;
        if view.thread_seq(name) != fence {
            return Err(format!("thread_seq is {}", view.thread_seq(name)));
        }
        let rec = view.thread(name).map_err(|e| e.to_string())?;
        if rec != fold.rec {
            return Err(format!(
                "thread record is {rec:?}, the server's is {:?}",
                fold.rec
            ));
        }
        let got: Vec<String> = view.live_of(name).into_iter().map(brief).collect();
        let want: Vec<String> = fold.live().map(|(_, s)| brief(s)).collect();
        if got != want {
            return Err(format!("live_of is {got:?}, the server's live {want:?}"));
        }
        for (id, _) in self.dispatches.iter().filter(|(_, th)| *th == t) {
            let got = view.dispatch(id).map_err(|e| e.to_string())?;
            let want = fold.live_record(id);
            if got != want.map(|(_, s)| s) {
                return Err(format!(
                    "dispatch({id}) is {:?}, the server's {:?} (a lean view holds live ones)",
                    got.map(brief),
                    fold.dispatches
                        .get(id)
                        .map(|(seq, s)| (seq, s.as_ref().map(brief)))
                ));
            }
            if let Some((seq, _)) = want
                && view.dispatch_seq(id) != seq
            {
                return Err(format!(
                    "dispatch_seq({id}) is {}, its record is at {seq}",
                    view.dispatch_seq(id)
                ));
            }
            let got: Vec<(String, u64, Waitpoint, bool)> = view
                .waitpoints_of(name, id)
                .into_iter()
                .map(|h| (h.waitpoint.id.clone(), h.seq, h.waitpoint.clone(), h.whole))
                .collect();
            let mut want: Vec<(String, u64, Waitpoint, bool)> = fold
                .held_waitpoints()
                .filter(|(_, (_, w))| w.dispatch == *id)
                .map(|(wid, (seq, w))| {
                    let whole = w.result.is_none();
                    let mut w = w.clone();
                    w.result = None;
                    (wid.clone(), *seq, w, whole)
                })
                .collect();
            want.sort_by(|a, b| (a.2.created_at, &a.0).cmp(&(b.2.created_at, &b.0)));
            if got != want {
                let ids = |v: &[(String, u64, Waitpoint, bool)]| -> Vec<String> {
                    v.iter()
                        .map(|(id, seq, w, _)| format!("{id}@{seq} {}", w.state))
                        .collect()
                };
                return Err(format!(
                    "waitpoints_of({id}) is {:?}, the server's {:?}",
                    ids(&got),
                    ids(&want)
                ));
            }
        }
        for (id, _) in self.waitpoints.iter().filter(|(_, th)| *th == t) {
            let got = view
                .waitpoint(id)
                .map_err(|e| e.to_string())?
                .map(|h| h.seq);
            let want = fold
                .held_waitpoints()
                .find(|(w, _)| *w == id)
                .map(|(_, (seq, _))| *seq);
            if got != want {
                return Err(format!(
                    "waitpoint({id}) is at {got:?}, the server's held one at {want:?}"
                ));
            }
        }
        let want = fold.last_agent.clone().or_else(|| fold.rec.agent.clone());
        if view.last_agent(name) != want {
            return Err(format!(
                "last_agent is {:?}, the server's {want:?}",
                view.last_agent(name)
            ));
        }
        let got = view.holder(name).map(brief);
        let want = fold.holder().map(brief);
        if got != want {
            return Err(format!("holder is {got:?}, the server's {want:?}"));
        }
        let latest = fold.marks().latest;
        for n in 1..=latest + 1 {
            let got = view.message(name, n);
            let want = fold
                .messages
                .get(&n)
                .map(|(_, h)| h)
                .filter(|h| h.state == MessageState::Pending);
            if got != want {
                return Err(format!(
                    "message({n}) is {:?}, the server's {:?} (a lean view holds pending ones)",
                    got.map(|h| h.state),
                    fold.messages.get(&n).map(|(seq, h)| (seq, h.state))
                ));
            }
        }
        if view.inbox_marks(name) != fold.marks() {
            return Err(format!(
                "inbox_marks are {:?}, the server's {:?}",
                view.inbox_marks(name),
                fold.marks()
            ));
        }
        if view.latest(name) != fold.latest_log() {
            return Err(format!(
                "latest is {}, the server's {}",
                view.latest(name),
                fold.latest_log()
            ));
        }
        Ok(())
    }

    fn check_totals(&self, folds: &[Fold]) -> Result<(), String> {
        let live: usize = folds.iter().map(|f| f.live().count()).sum();
        if self.view.has_live() != (live > 0) {
            return Err(format!(
                "has_live() is {}, {live} are live",
                self.view.has_live()
            ));
        }
        if self.view.records() != live {
            return Err(format!(
                "the view holds {} dispatch records, {live} are live",
                self.view.records()
            ));
        }
        let held: usize = folds.iter().map(|f| f.held_waitpoints().count()).sum();
        if self.view.waitpoint_count() != held {
            return Err(format!(
                "the view holds {} waitpoints, {held} belong to live dispatches",
                self.view.waitpoint_count()
            ));
        }
        let got: BTreeSet<&str> = self
            .view
            .claimed()
            .map(|s| s.dispatch.id.as_str())
            .collect();
        let want: BTreeSet<&str> = folds
            .iter()
            .flat_map(|f| f.live())
            .filter(|(_, s)| s.dispatch.status == Status::Claimed)
            .map(|(_, s)| s.dispatch.id.as_str())
            .collect();
        if got != want {
            return Err(format!("claimed() is {got:?}, the server's {want:?}"));
        }
        let got: BTreeSet<&str> = self
            .view
            .pending_waitpoints()
            .map(|w| w.id.as_str())
            .collect();
        let want: BTreeSet<&str> = folds
            .iter()
            .flat_map(|f| f.held_waitpoints())
            .filter(|(_, (_, w))| w.is_pending())
            .map(|(id, _)| id.as_str())
            .collect();
        if got != want {
            return Err(format!(
                "pending_waitpoints() is {got:?}, the server's {want:?}"
            ));
        }
        Ok(())
    }

    /// `pick` after `promote`: the best due dispatch of a thread that holds none, of the best
    /// priority among those; none when there is none.
    fn check_pick(&mut self, folds: &[Fold]) -> Result<(), String> {
        for agent in AGENTS {
            let heads: Vec<&Stored> = folds
                .iter()
                .filter(|f| f.holder().is_none())
                .filter_map(|f| {
                    f.live()
                        .map(|(_, s)| s)
                        .filter(|s| {
                            s.dispatch.status == Status::Queued
                                && s.dispatch.agent == agent
                                && rules::due(&s.dispatch, self.now)
                        })
                        .min_by_key(|s| {
                            (s.dispatch.priority, s.dispatch.created_at, &s.dispatch.id)
                        })
                })
                .collect();
            let best = heads.iter().map(|s| s.dispatch.priority).min();
            self.view.promote(agent, self.now);
            let got = self.view.pick(agent);
            let ok = match got {
                None => heads.is_empty(),
                Some(s) => heads.contains(&s) && Some(s.dispatch.priority) == best,
            };
            if !ok {
                return Err(format!(
                    "pick({agent}) is {:?}, the heads of the free threads are {:?}",
                    got.map(brief),
                    heads.iter().map(|s| brief(s)).collect::<Vec<_>>()
                ));
            }
        }
        Ok(())
    }
}

/// Runs `steps`, checking the view after each, and adds what they did to `seen`; with
/// `trace`, the error carries the trace.
fn run(steps: &[Step], trace: bool, seen: &mut Seen) -> Result<(), String> {
    let mut model = Model::new(trace);
    let out = run_on(&mut model, steps);
    for (kind, n) in std::mem::take(&mut model.seen) {
        *seen.entry(kind).or_default() += n;
    }
    out
}

fn run_on(model: &mut Model, steps: &[Step]) -> Result<(), String> {
    for (i, step) in steps.iter().enumerate() {
        if let Some(trace) = &mut model.trace {
            let _ = writeln!(trace, "{i:>3}: {step:?}");
        }
        model.step(step);
        if let Err(e) = model.check() {
            let trace = model.trace.take().unwrap_or_default();
            return Err(format!("after step {i}: {e}\n{trace}"));
        }
    }
    Ok(())
}

fn op() -> impl Strategy<Value = Op> {
    let outcome = prop_oneof![
        2 => Just(Outcome::Ack),
        1 => Just(Outcome::DeadLetter),
        2 => prop_oneof![Just(0u16), Just(40u16)].prop_map(Outcome::Nack),
    ];
    prop_oneof![
        3 => (
            0..AGENTS.len(),
            0u8..2,
            prop_oneof![3 => Just(0u16), 1 => Just(40u16)],
            1u32..4,
        )
            .prop_map(|(agent, priority, delay, max_attempts)| Op::Enqueue {
                agent,
                priority,
                delay,
                max_attempts,
            }),
        4 => (0..AGENTS.len()).prop_map(|agent| Op::Claim { agent }),
        3 => outcome.prop_map(Op::Settle),
        2 => Just(Op::Wait),
        2 => Just(Op::Suspend),
        2 => (any::<Index>(), any::<bool>()).prop_map(|(i, t)| Op::Complete(i, t)),
        1 => any::<Index>().prop_map(Op::Cancel),
        1 => Just(Op::Interrupt),
        1 => Just(Op::Trim),
        2 => proptest::option::of(0..AGENTS.len()).prop_map(|agent| Op::Send { agent }),
        2 => any::<Index>().prop_map(Op::AckMessage),
        1 => any::<Index>().prop_map(Op::Discard),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let host = prop_oneof![
        4 => Just(Host::Ours),
        3 => Just(Host::Other(0)),
        1 => (1u8..4).prop_map(Host::Other),
    ];
    prop_oneof![
        6 => (host, 0..THREADS.len(), op())
            .prop_map(|(host, thread, op)| Step::Decide { host, thread, op }),
        4 => (1u8..4).prop_map(Step::Watch),
        3 => any::<Index>().prop_map(Step::Reply),
        1 => (1u16..60).prop_map(Step::Tick),
    ]
}

/// What every run of the test must have done at least once, so that the model cannot pass by
/// doing nothing of interest.
const COVERAGE: [&str; 15] = [
    "own apply ahead of the watcher",
    "own apply after the watcher passed it",
    "own apply passed by the watcher after others wrote the thread",
    "own apply of a batch the watcher is inside",
    "batch stored",
    "write of ours refused by its fence",
    "ours: claim (pick)",
    "ours: settle",
    "other: settle",
    "ours: thread record rewrite",
    "other: interrupt",
    "either: suspend",
    "either: settle a waitpoint",
    "either: ack a message",
    "either: discard messages",
];

#[test]
fn the_view_holds_each_threads_server_state_as_of_its_fence() {
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        max_shrink_iters: 20_000,
        ..Config::default()
    });
    let steps = proptest::collection::vec(step(), 1..MAX_STEPS);
    let seen = std::cell::RefCell::new(Seen::new());
    let out = runner.run(&steps, |steps| {
        run(&steps, false, &mut seen.borrow_mut()).map_err(TestCaseError::fail)
    });
    match out {
        Ok(()) => {}
        Err(TestError::Fail(_, steps)) => {
            let trace = run(&steps, true, &mut Seen::new())
                .err()
                .unwrap_or_else(|| {
                    "the shrunk case passes when replayed (nondeterminism in the model)".into()
                });
            panic!(
                "the view left the server's state ({} steps after shrinking):\n{trace}",
                steps.len()
            );
        }
        Err(e) => panic!("{e}"),
    }
    let seen = seen.into_inner();
    eprintln!("{CASES} cases (and shrinking), what they did: {seen:#?}");
    for kind in COVERAGE {
        assert!(
            seen.get(kind).is_some_and(|n| *n > 0),
            "no case did `{kind}`: the model lost its coverage ({seen:#?})"
        );
    }
}
