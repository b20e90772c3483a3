//! Property tests: random operation sequences against a small in-memory model of the contract
//! (the dispatch state machine with Homing's decisions, and the log watermarks), compared after
//! every step.
//!
//! Where the contract leaves an outcome open (which of several equally urgent threads a claim
//! serves; what a repeated holder operation returns once the record moved on), the model
//! accepts each allowed outcome but always requires that nothing else changed.

use std::collections::{BTreeMap, BTreeSet};

use homing::store::{
    Dispatch, ListFilter, NewDispatch, REASON_EXPIRED_AFTER_INTERRUPT, REASON_LEASE_EXPIRED_AT_MAX,
    REASON_STALE_EPOCH, RunResult, Status, StoreError,
};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::*;

const THREADS: [&str; 3] = ["t0", "t1", "t2"];
const AGENTS: [&str; 2] = ["a0", "a1"];

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: 32,
        failure_persistence: None,
        max_shrink_iters: 256,
        max_shrink_time: 60_000,
        ..Config::default()
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("build a tokio runtime")
}

/// Which token a holder operation presents.
#[derive(Debug, Clone, Copy)]
enum Tok {
    /// The last token the store handed out for the dispatch (current, or stale after a settle).
    Latest,
    /// A token the store never handed out.
    Bogus,
}

#[derive(Debug, Clone)]
enum Op {
    Enqueue {
        thread: usize,
        agent: usize,
        priority: u8,
        delay: u64,
        max_attempts: u32,
        key: Option<u8>,
    },
    EnqueueInvalid {
        zero_max: bool,
    },
    Resubmit(Index),
    Claim {
        agent: usize,
        lease: u64,
    },
    ClaimDispatch(Index, u64),
    Extend(Index, Tok, u64),
    RecordStart(Index, Tok),
    Ack(Index, Tok),
    Nack(Index, Tok, u64),
    DeadLetter(Index, Tok),
    Complete(Index, Tok),
    Cancel(Index),
    Interrupt(usize),
    Supersede(Index, Option<Tok>),
    Reclaim,
    Advance(u64),
}

fn tok_strategy() -> impl Strategy<Value = Tok> {
    prop_oneof![4 => Just(Tok::Latest), 1 => Just(Tok::Bogus)]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3usize, 0..2usize, prop::sample::select(vec![0u8, 5, 128]), prop::sample::select(vec![0u64, 0, 30]), 1..4u32, prop::option::weighted(0.4, 0..2u8))
            .prop_map(|(thread, agent, priority, delay, max_attempts, key)| Op::Enqueue { thread, agent, priority, delay, max_attempts, key }),
        1 => any::<bool>().prop_map(|zero_max| Op::EnqueueInvalid { zero_max }),
        1 => any::<Index>().prop_map(Op::Resubmit),
        6 => (0..2usize, prop::sample::select(vec![20u64, 100])).prop_map(|(agent, lease)| Op::Claim { agent, lease }),
        2 => (any::<Index>(), prop::sample::select(vec![20u64, 100])).prop_map(|(i, l)| Op::ClaimDispatch(i, l)),
        1 => (any::<Index>(), tok_strategy(), prop::sample::select(vec![10u64, 200])).prop_map(|(i, t, e)| Op::Extend(i, t, e)),
        1 => (any::<Index>(), tok_strategy()).prop_map(|(i, t)| Op::RecordStart(i, t)),
        3 => (any::<Index>(), tok_strategy()).prop_map(|(i, t)| Op::Ack(i, t)),
        3 => (any::<Index>(), tok_strategy(), prop::sample::select(vec![0u64, 40])).prop_map(|(i, t, r)| Op::Nack(i, t, r)),
        1 => (any::<Index>(), tok_strategy()).prop_map(|(i, t)| Op::DeadLetter(i, t)),
        1 => (any::<Index>(), tok_strategy()).prop_map(|(i, t)| Op::Complete(i, t)),
        1 => any::<Index>().prop_map(Op::Cancel),
        1 => (0..3usize).prop_map(Op::Interrupt),
        1 => (any::<Index>(), prop::option::of(tok_strategy())).prop_map(|(i, t)| Op::Supersede(i, t)),
        2 => Just(Op::Reclaim),
        3 => prop::sample::select(vec![1u64, 10, 50, 150]).prop_map(Op::Advance),
    ]
}

/// The model of one dispatch.
#[derive(Debug, Clone)]
struct M {
    new: NewDispatch,
    id: String,
    agent: String,
    thread: String,
    priority: u8,
    created_at: u64,
    available_at: u64,
    key: Option<String>,
    max: u32,
    attempt: u32,
    epoch: u64,
    status: Status,
    token: Option<String>,
    lease_until: Option<u64>,
    last_token: Option<String>,
    /// The settle (op, token) that produced the current state, while nothing else changed it.
    settle: Option<(&'static str, String)>,
    /// Every settle (op, token) that ever succeeded.
    history: Vec<(&'static str, String)>,
    /// `None` when the contract leaves the value open.
    last_error: Option<Option<String>>,
    completed_at: Option<u64>,
    started: Option<bool>,
    has_result: Option<bool>,
}

#[derive(Debug, Default)]
struct Model {
    now: u64,
    ds: BTreeMap<String, M>,
    epochs: BTreeMap<String, u64>,
    next: usize,
}

/// What the model expects from a holder operation.
enum Check {
    /// The checks pass; the operation applies.
    Proceed,
    /// Refused with this error, nothing changes.
    Refused(StoreError),
    /// The token's claim is stale by epoch: refused with StaleEpoch and superseded.
    Stale(StoreError),
    /// The repeat of the settle that produced the current state: success, nothing changes.
    Idempotent,
    /// A repeat of an earlier settle after the record moved on: success or a refusal, nothing
    /// changes.
    Either,
}

impl Model {
    fn epoch(&self, thread: &str) -> u64 {
        self.epochs.get(thread).copied().unwrap_or(0)
    }

    fn pick(&self, index: &Index) -> Option<String> {
        if self.ds.is_empty() {
            return None;
        }
        self.ds.keys().nth(index.index(self.ds.len())).cloned()
    }

    fn token_for(&self, id: &str, tok: Tok) -> String {
        match tok {
            Tok::Latest => self.ds[id]
                .last_token
                .clone()
                .unwrap_or_else(|| "never-claimed".into()),
            Tok::Bogus => "bogus-token".into(),
        }
    }

    fn claimed_on(&self, thread: &str) -> Option<String> {
        self.ds
            .values()
            .find(|d| d.thread == thread && d.status == Status::Claimed)
            .map(|d| d.id.clone())
    }

    fn holder_check(&self, id: &str, token: &str, op: &'static str) -> Check {
        let d = &self.ds[id];
        let repeat = (op, token.to_owned());
        // complete is record_result + ack: a backend may count either as a repeat of the other.
        let sibling = match op {
            "ack" => Some(("complete", token.to_owned())),
            "complete" => Some(("ack", token.to_owned())),
            _ => None,
        };
        let repeated_sibling = sibling.is_some_and(|s| d.history.contains(&s));
        if d.status != Status::Claimed {
            if d.settle.as_ref() == Some(&repeat) {
                Check::Idempotent
            } else if d.history.contains(&repeat) || repeated_sibling {
                Check::Either
            } else {
                Check::Refused(StoreError::NotClaimed {
                    id: id.into(),
                    status: d.status,
                })
            }
        } else if d.token.as_deref() != Some(token) {
            if d.history.contains(&repeat) {
                Check::Either
            } else {
                Check::Refused(StoreError::LostClaim { id: id.into() })
            }
        } else if d.epoch < self.epoch(&d.thread) {
            Check::Stale(StoreError::StaleEpoch {
                id: id.into(),
                dispatch: d.epoch,
                thread: self.epoch(&d.thread),
            })
        } else {
            Check::Proceed
        }
    }

    fn terminate(&mut self, id: &str, status: Status, last_error: Option<Option<String>>) {
        let now = self.now;
        let d = self.ds.get_mut(id).unwrap();
        d.status = status;
        d.token = None;
        d.lease_until = None;
        d.completed_at = Some(now);
        d.settle = None;
        if last_error.is_some() {
            d.last_error = last_error;
        }
        d.started = None;
        d.has_result = None;
    }

    fn supersede_stale(&mut self, id: &str, reason: &str) {
        self.terminate(id, Status::Superseded, Some(Some(reason.into())));
    }

    fn settled(&mut self, id: &str, op: &'static str, token: &str) {
        let d = self.ds.get_mut(id).unwrap();
        d.settle = Some((op, token.into()));
        d.history.push((op, token.into()));
    }

    fn requeue(&mut self, id: &str, available_at: u64) {
        let d = self.ds.get_mut(id).unwrap();
        d.status = Status::Queued;
        d.token = None;
        d.lease_until = None;
        d.available_at = available_at;
        d.started = Some(false);
        d.has_result = Some(false);
        d.completed_at = None;
    }

    /// One failed attempt by lease expiry (reclaim or takeover); returns whether it is reported.
    fn expire(&mut self, id: &str) -> bool {
        let (epoch, thread) = {
            let d = &self.ds[id];
            (d.epoch, d.thread.clone())
        };
        if epoch < self.epoch(&thread) {
            self.supersede_stale(id, REASON_EXPIRED_AFTER_INTERRUPT);
            return false;
        }
        let now = self.now;
        let exhausted = {
            let d = self.ds.get_mut(id).unwrap();
            d.attempt += 1;
            d.attempt >= d.max
        };
        if exhausted {
            self.terminate(
                id,
                Status::DeadLetter,
                Some(Some(REASON_LEASE_EXPIRED_AT_MAX.into())),
            );
        } else {
            self.requeue(id, now);
        }
        true
    }

    fn claim(&mut self, id: &str, got: &Dispatch, lease: u64) -> Result<(), TestCaseError> {
        let claim = got
            .claim
            .clone()
            .ok_or_else(|| TestCaseError::fail("claimed without claim"))?;
        prop_assert_eq!(claim.lease_until, self.now + lease);
        let d = self.ds.get_mut(id).unwrap();
        prop_assert!(
            !d.history.iter().any(|(_, t)| *t == claim.token)
                && d.last_token.as_deref() != Some(claim.token.as_str()),
            "a claim token was reused"
        );
        d.status = Status::Claimed;
        d.token = Some(claim.token.clone());
        d.last_token = Some(claim.token);
        d.lease_until = Some(claim.lease_until);
        d.settle = None;
        d.started = Some(false);
        d.has_result = Some(false);
        Ok(())
    }

    /// The dispatches `claim(agent)` may hand out: the best available of its agent on each thread
    /// without a claimed dispatch, keeping only the most urgent priority.
    fn claimable(&self, agent: &str) -> BTreeSet<String> {
        let mut best: BTreeMap<&str, &M> = BTreeMap::new();
        for d in self.ds.values() {
            if d.agent != agent || d.status != Status::Queued || d.available_at > self.now {
                continue;
            }
            if self.claimed_on(&d.thread).is_some() {
                continue;
            }
            let better = match best.get(d.thread.as_str()) {
                None => true,
                Some(b) => (d.priority, d.created_at, &d.id) < (b.priority, b.created_at, &b.id),
            };
            if better {
                best.insert(&d.thread, d);
            }
        }
        let Some(top) = best.values().map(|d| d.priority).min() else {
            return BTreeSet::new();
        };
        best.values()
            .filter(|d| d.priority == top)
            .map(|d| d.id.clone())
            .collect()
    }
}

/// Checks a holder operation's result against the model's expectation; applies `proceed` when the
/// checks pass. Returns the `Check` for the caller's bookkeeping.
fn stale_superseded_by(model: &mut Model, id: &str) {
    if let Some(token) = model.ds[id].last_token.clone() {
        model
            .ds
            .get_mut(id)
            .unwrap()
            .history
            .push(("supersede", token));
    }
}

fn expect_holder<T: std::fmt::Debug>(
    model: &mut Model,
    id: &str,
    check: Check,
    result: &StoreResult<T>,
    what: &str,
) -> Result<bool, TestCaseError> {
    match check {
        Check::Proceed => {
            prop_assert!(
                result.is_ok(),
                "{what} on {id}: expected success, got {result:?}"
            );
            Ok(true)
        }
        Check::Refused(want) => {
            match result {
                Err(got) => prop_assert_eq!(got, &want, "{} on {}", what, id),
                Ok(v) => prop_assert!(false, "{what} on {id}: expected {want:?}, got Ok({v:?})"),
            }
            Ok(false)
        }
        Check::Stale(want) => {
            match result {
                Err(got) => prop_assert_eq!(got, &want, "{} on {}", what, id),
                Ok(v) => prop_assert!(false, "{what} on {id}: expected {want:?}, got Ok({v:?})"),
            }
            model.supersede_stale(id, REASON_STALE_EPOCH);
            // A backend may remember the refused holder as the superseding one: a later
            // supersede_claimed with this token may then count as a repeat.
            stale_superseded_by(model, id);
            Ok(false)
        }
        Check::Idempotent => {
            prop_assert!(
                result.is_ok(),
                "{what} on {id}: a repeated settle must succeed, got {result:?}"
            );
            Ok(false)
        }
        Check::Either => {
            if let Err(err) = result {
                prop_assert!(
                    matches!(
                        err,
                        StoreError::NotClaimed { .. } | StoreError::LostClaim { .. }
                    ),
                    "{what} on {id}: unexpected {err:?}"
                );
            }
            Ok(false)
        }
    }
}

async fn apply(s: &Store, env_now: u64, model: &mut Model, op: &Op) -> Result<(), TestCaseError> {
    model.now = env_now;
    let m = &s.mailbox;
    match op {
        Op::Enqueue {
            thread,
            agent,
            priority,
            delay,
            max_attempts,
            key,
        } => {
            let id = format!("d{:03}", model.next);
            model.next += 1;
            let mut new =
                NewDispatch::new(AGENTS[*agent], THREADS[*thread], id.clone().into_bytes())
                    .with_id(id.clone())
                    .with_priority(*priority)
                    .with_delay_ms(*delay)
                    .with_max_attempts(*max_attempts);
            if let Some(k) = key {
                new = new.with_dedupe_key(format!("k{k}"));
            }
            let holder = new.dedupe_key.as_ref().and_then(|k| {
                model
                    .ds
                    .values()
                    .find(|d| {
                        d.thread == new.thread
                            && d.key.as_ref() == Some(k)
                            && !d.status.is_terminal()
                    })
                    .map(|d| d.id.clone())
            });
            let result = m.enqueue(new.clone()).await;
            if let Some(holder) = holder {
                prop_assert_eq!(
                    result.err(),
                    Some(StoreError::Duplicate {
                        id: id.clone(),
                        holder: Some(holder)
                    })
                );
                return Ok(());
            }
            let d = result.map_err(|e| TestCaseError::fail(format!("enqueue {id}: {e}")))?;
            prop_assert_eq!(d.status, Status::Queued);
            prop_assert_eq!(d.epoch, model.epoch(&new.thread));
            prop_assert_eq!(d.available_at, model.now + delay);
            model.ds.insert(
                id.clone(),
                M {
                    id,
                    agent: new.agent.clone(),
                    thread: new.thread.clone(),
                    priority: *priority,
                    created_at: model.now,
                    available_at: model.now + delay,
                    key: new.dedupe_key.clone(),
                    max: *max_attempts,
                    attempt: 0,
                    epoch: d.epoch,
                    status: Status::Queued,
                    token: None,
                    lease_until: None,
                    last_token: None,
                    settle: None,
                    history: Vec::new(),
                    last_error: Some(None),
                    completed_at: None,
                    started: Some(false),
                    has_result: Some(false),
                    new,
                },
            );
        }
        Op::EnqueueInvalid { zero_max } => {
            let id = format!("bad{:03}", model.next);
            model.next += 1;
            let new = if *zero_max {
                nd("t0", &id).with_max_attempts(0)
            } else {
                NewDispatch {
                    attempt: 2,
                    ..nd("t0", &id).with_max_attempts(2)
                }
            };
            let result = m.enqueue(new).await;
            prop_assert!(
                matches!(result, Err(StoreError::Invalid(_))),
                "{:?}",
                result
            );
        }
        Op::Resubmit(i) => {
            let Some(id) = model.pick(i) else {
                return Ok(());
            };
            let result = m.enqueue(model.ds[&id].new.clone()).await;
            match result {
                Ok(d) => {
                    prop_assert_eq!(&d.id, &id);
                    prop_assert_eq!(
                        d.status,
                        model.ds[&id].status,
                        "resubmit returns the stored record"
                    );
                }
                Err(StoreError::Duplicate { .. }) => {}
                Err(err) => prop_assert!(false, "resubmit of {id}: {err:?}"),
            }
        }
        Op::Claim { agent, lease } => {
            let allowed = model.claimable(AGENTS[*agent]);
            let got = m
                .claim(AGENTS[*agent], "prop", *lease)
                .await
                .map_err(|e| TestCaseError::fail(format!("claim: {e}")))?;
            match got {
                None => prop_assert!(
                    allowed.is_empty(),
                    "claim returned nothing; claimable: {allowed:?}"
                ),
                Some(d) => {
                    prop_assert!(
                        allowed.contains(&d.id),
                        "claimed {} but only {:?} were allowed",
                        d.id,
                        allowed
                    );
                    model.claim(&d.id, &d, *lease)?;
                }
            }
        }
        Op::ClaimDispatch(i, lease) => {
            let Some(id) = model.pick(i) else {
                return Ok(());
            };
            let d = &model.ds[&id];
            let expect = if d.status != Status::Queued {
                None
            } else {
                match model.claimed_on(&d.thread) {
                    Some(holder) if model.ds[&holder].lease_until.unwrap_or(0) >= model.now => None,
                    Some(holder) => Some(Some(holder)),
                    None => Some(None),
                }
            };
            let got = m
                .claim_dispatch(&id, "prop", *lease)
                .await
                .map_err(|e| TestCaseError::fail(format!("claim_dispatch: {e}")))?;
            match (expect, got) {
                (None, None) => {}
                (Some(takeover), Some(d)) => {
                    prop_assert_eq!(&d.id, &id);
                    if let Some(holder) = takeover {
                        model.expire(&holder);
                    }
                    model.claim(&id, &d, *lease)?;
                }
                (expect, got) => prop_assert!(
                    false,
                    "claim_dispatch({id}): expected {expect:?}, got {got:?}"
                ),
            }
        }
        Op::Extend(i, tok, ext) => {
            let Some(id) = model.pick(i) else {
                return Ok(());
            };
            let token = model.token_for(&id, *tok);
            let d = &model.ds[&id];
            let live = d.status == Status::Claimed && d.token.as_deref() == Some(token.as_str());
            let stale = live && d.epoch < model.epoch(&d.thread);
            // An expired lease is not extended (the contract, section 15.2); the epoch is
            // checked first.
            let expired = d.lease_until.is_none_or(|until| until < model.now);
            let got = m
                .extend_lease(&id, &token, *ext)
                .await
                .map_err(|e| TestCaseError::fail(format!("extend_lease: {e}")))?;
            prop_assert_eq!(got, live && !stale && !expired, "extend_lease({})", id);
            if stale {
                model.supersede_stale(&id, REASON_STALE_EPOCH);
                stale_superseded_by(model, &id);
            } else if live && !expired {
                model.ds.get_mut(&id).unwrap().lease_until = Some(model.now + ext);
            }
        }
        Op::RecordStart(i, tok) => {
            let Some(id) = model.pick(i) else {
                return Ok(());
            };
            let token = model.token_for(&id, *tok);
            let check = model.holder_check(&id, &token, "record_start");
            let result = m.record_start(&id, &token).await;
            if expect_holder(model, &id, check, &result, "record_start")? {
                model.ds.get_mut(&id).unwrap().started = Some(true);
            }
        }
        Op::Ack(i, tok) | Op::DeadLetter(i, tok) | Op::Complete(i, tok) => {
            let Some(id) = model.pick(i) else {
                return Ok(());
            };
            let token = model.token_for(&id, *tok);
            let (name, status) = match op {
                Op::Ack(..) => ("ack", Status::Acked),
                Op::DeadLetter(..) => ("dead_letter", Status::DeadLetter),
                _ => ("complete", Status::Acked),
            };
            let check = model.holder_check(&id, &token, name);
            let result = match op {
                Op::Ack(..) => m.ack(&id, &token).await,
                Op::DeadLetter(..) => m.dead_letter(&id, &token, "given up").await,
                _ => {
                    m.complete(&id, &token, RunResult::success(b"done".to_vec()))
                        .await
                }
            };
            if expect_holder(model, &id, check, &result, name)? {
                let had_result = model.ds[&id].has_result;
                let last_error = if name == "dead_letter" {
                    Some(Some("given up".to_owned()))
                } else {
                    None
                };
                model.terminate(&id, status, last_error);
                let d = model.ds.get_mut(&id).unwrap();
                d.has_result = match name {
                    "complete" => Some(true),
                    "ack" => had_result,
                    _ => None,
                };
                model.settled(&id, name, &token);
            }
        }
        Op::Nack(i, tok, retry) => {
            let Some(id) = model.pick(i) else {
                return Ok(());
            };
            let token = model.token_for(&id, *tok);
            let check = model.holder_check(&id, &token, "nack");
            let retry_at = model.now + retry;
            let result = m.nack(&id, &token, retry_at, "failed attempt").await;
            if expect_holder(model, &id, check, &result, "nack")? {
                let exhausted = {
                    let d = model.ds.get_mut(&id).unwrap();
                    d.attempt += 1;
                    d.last_error = Some(Some("failed attempt".into()));
                    d.attempt >= d.max
                };
                if exhausted {
                    model.terminate(&id, Status::DeadLetter, None);
                } else {
                    model.requeue(&id, retry_at);
                }
                model.settled(&id, "nack", &token);
            }
        }
        Op::Cancel(i) => {
            let Some(id) = model.pick(i) else {
                return Ok(());
            };
            let queued = model.ds[&id].status == Status::Queued;
            let got = m
                .cancel(&id)
                .await
                .map_err(|e| TestCaseError::fail(format!("cancel: {e}")))?;
            prop_assert_eq!(got.is_some(), queued, "cancel({})", id);
            if queued {
                model.terminate(&id, Status::Cancelled, None);
                model.ds.get_mut(&id).unwrap().last_error = None;
            }
        }
        Op::Interrupt(t) => {
            let thread = THREADS[*t];
            let epoch = model.epoch(thread) + 1;
            let active = model.claimed_on(thread);
            let queued: BTreeSet<String> = model
                .ds
                .values()
                .filter(|d| d.thread == thread && d.status == Status::Queued)
                .map(|d| d.id.clone())
                .collect();
            let report = m
                .interrupt(thread, "interrupted")
                .await
                .map_err(|e| TestCaseError::fail(format!("interrupt: {e}")))?;
            prop_assert_eq!(report.epoch, epoch);
            prop_assert_eq!(report.active.map(|d| d.id), active);
            let got: BTreeSet<String> = report.superseded.iter().cloned().collect();
            prop_assert_eq!(report.superseded.len(), got.len());
            prop_assert_eq!(&got, &queued);
            model.epochs.insert(thread.into(), epoch);
            for id in queued {
                model.terminate(&id, Status::Superseded, Some(Some("interrupted".into())));
            }
        }
        Op::Supersede(i, tok) => {
            let Some(id) = model.pick(i) else {
                return Ok(());
            };
            let token = tok.map(|t| model.token_for(&id, t));
            let d = model.ds[&id].clone();
            let result = m.supersede_claimed(&id, token.as_deref(), "replaced").await;
            let repeat = token
                .as_ref()
                .is_some_and(|t| d.history.contains(&("supersede", t.clone())));
            if d.status != Status::Claimed {
                match &result {
                    Ok(None) => {}
                    Ok(Some(r)) if repeat => prop_assert_eq!(r.status, d.status),
                    other => prop_assert!(
                        false,
                        "supersede_claimed({id}) of {:?}: {other:?}",
                        d.status
                    ),
                }
            } else if token.is_some() && token != d.token {
                match &result {
                    Err(StoreError::LostClaim { .. }) => {}
                    Ok(None) if repeat => {}
                    other => prop_assert!(false, "supersede_claimed({id}) wrong token: {other:?}"),
                }
            } else if d.epoch < model.epoch(&d.thread) {
                prop_assert!(
                    matches!(&result, Ok(Some(_)) | Err(StoreError::StaleEpoch { .. })),
                    "supersede_claimed({id}) stale: {result:?}"
                );
                model.terminate(&id, Status::Superseded, None);
                model.ds.get_mut(&id).unwrap().last_error = None;
                match (&result, &token) {
                    (Ok(Some(_)), Some(t)) => model.settled(&id, "supersede", t),
                    _ => stale_superseded_by(model, &id),
                }
            } else {
                prop_assert!(
                    matches!(&result, Ok(Some(_))),
                    "supersede_claimed({id}): {result:?}"
                );
                model.terminate(&id, Status::Superseded, Some(Some("replaced".into())));
                match &token {
                    Some(t) => model.settled(&id, "supersede", t),
                    // A control-plane supersede may be remembered under the holder's token, so
                    // the holder's own supersede later counts as a repeat (changing nothing).
                    None => stale_superseded_by(model, &id),
                }
            }
        }
        Op::Reclaim => {
            let expired: Vec<String> = model
                .ds
                .values()
                .filter(|d| {
                    d.status == Status::Claimed && d.lease_until.unwrap_or(u64::MAX) < model.now
                })
                .map(|d| d.id.clone())
                .collect();
            let got = m
                .reclaim_expired(model.now, 1_000)
                .await
                .map_err(|e| TestCaseError::fail(format!("reclaim: {e}")))?;
            let mut reported = BTreeSet::new();
            for id in expired {
                if model.expire(&id) {
                    reported.insert(id);
                }
            }
            let got_ids: BTreeSet<String> = got.iter().map(|d| d.id.clone()).collect();
            prop_assert_eq!(got.len(), got_ids.len());
            prop_assert_eq!(got_ids, reported);
        }
        Op::Advance(_) => {}
    }
    Ok(())
}

async fn compare(s: &Store, model: &Model) -> Result<(), TestCaseError> {
    let stored = s
        .mailbox
        .list(&ListFilter {
            limit: 100_000,
            ..ListFilter::default()
        })
        .await
        .map_err(|e| TestCaseError::fail(format!("list: {e}")))?;
    prop_assert_eq!(stored.len(), model.ds.len());
    for d in &stored {
        let Some(md) = model.ds.get(&d.id) else {
            return Err(TestCaseError::fail(format!("invented dispatch {}", d.id)));
        };
        prop_assert!(d.check_shape().is_ok(), "{:?}", d.check_shape());
        let id = &d.id;
        prop_assert_eq!(d.status, md.status, "status of {}", id);
        prop_assert_eq!(d.attempt, md.attempt, "attempt of {}", id);
        prop_assert_eq!(d.epoch, md.epoch, "epoch of {}", id);
        prop_assert_eq!(d.max_attempts, md.max, "max_attempts of {}", id);
        prop_assert_eq!(d.priority, md.priority, "priority of {}", id);
        prop_assert_eq!(&d.thread, &md.thread);
        prop_assert_eq!(&d.agent, &md.agent);
        prop_assert_eq!(d.created_at, md.created_at, "created_at of {}", id);
        prop_assert_eq!(d.token(), md.token.as_deref(), "token of {}", id);
        prop_assert_eq!(
            d.claim.as_ref().map(|c| c.lease_until),
            md.lease_until,
            "lease of {}",
            id
        );
        if !d.status.is_terminal() {
            prop_assert_eq!(d.available_at, md.available_at, "available_at of {}", id);
        }
        prop_assert_eq!(d.completed_at, md.completed_at, "completed_at of {}", id);
        if let Some(last_error) = &md.last_error {
            prop_assert_eq!(&d.last_error, last_error, "last_error of {}", id);
        }
        if let Some(started) = md.started {
            prop_assert_eq!(d.started_at.is_some(), started, "started_at of {}", id);
        }
        if let Some(has_result) = md.has_result {
            prop_assert_eq!(d.result.is_some(), has_result, "result of {}", id);
        }
    }
    for thread in THREADS {
        let epoch = s
            .mailbox
            .thread_epoch(thread)
            .await
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(epoch, model.epoch(thread), "epoch of {}", thread);
    }
    let mut want_counts: BTreeMap<(String, Status), u64> = BTreeMap::new();
    for d in model.ds.values() {
        *want_counts.entry((d.agent.clone(), d.status)).or_default() += 1;
    }
    let got_counts: BTreeMap<(String, Status), u64> = s
        .mailbox
        .counts()
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?
        .into_iter()
        .map(|c| ((c.agent, c.status), c.count))
        .collect();
    prop_assert_eq!(got_counts, want_counts);
    let want_threads: Vec<String> = model
        .ds
        .values()
        .filter(|d| d.status == Status::Queued)
        .map(|d| d.thread.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    prop_assert_eq!(
        s.mailbox
            .queued_threads()
            .await
            .map_err(|e| TestCaseError::fail(e.to_string()))?,
        want_threads
    );
    let live = model.ds.values().any(|d| !d.status.is_terminal());
    prop_assert_eq!(
        s.mailbox
            .has_live_work()
            .await
            .map_err(|e| TestCaseError::fail(e.to_string()))?,
        live
    );
    Ok(())
}

async fn run_mailbox_case<F: Factory>(factory: &F, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let mut model = Model {
        now: env.now(),
        ..Model::default()
    };
    for (step, op) in ops.iter().enumerate() {
        if let Op::Advance(ms) = op {
            env.advance(*ms);
        }
        apply(&s, env.now(), &mut model, op)
            .await
            .map_err(|e| TestCaseError::fail(format!("step {step} {op:?}: {e}")))?;
        compare(&s, &model)
            .await
            .map_err(|e| TestCaseError::fail(format!("after step {step} {op:?}: {e}")))?;
    }
    Ok(())
}

/// Random sequences of
/// enqueue, claim, claim_dispatch, extend, start, ack, nack, dead_letter, complete, cancel,
/// interrupt, supersede and reclaim, with clock advances, keep the backend equal to the model.
pub fn mailbox_follows_the_spec_model<F: Factory>(factory: &F) {
    let mut runner = runner();
    let strategy = prop::collection::vec(op_strategy(), 1..45);
    let outcome = runner.run(&strategy, |ops| {
        runtime().block_on(run_mailbox_case(factory, ops))
    });
    if let Err(err) = outcome {
        panic!("{err}");
    }
}

#[derive(Debug, Clone)]
enum LogOp {
    Append(usize, u8),
    AppendExpected(usize, i8),
    Trim(usize, u8),
    Delete(usize),
    Read(usize, u8, u8),
    Reopen,
    Advance,
}

fn log_op_strategy() -> impl Strategy<Value = LogOp> {
    prop_oneof![
        8 => (0..2usize, any::<u8>()).prop_map(|(t, n)| LogOp::Append(t, n)),
        3 => (0..2usize, -1..=1i8).prop_map(|(t, d)| LogOp::AppendExpected(t, d)),
        2 => (0..2usize, 0..6u8).prop_map(|(t, b)| LogOp::Trim(t, b)),
        1 => (0..2usize).prop_map(LogOp::Delete),
        2 => (0..2usize, 0..12u8, 1..6u8).prop_map(|(t, a, l)| LogOp::Read(t, a, l)),
        1 => Just(LogOp::Reopen),
        1 => Just(LogOp::Advance),
    ]
}

#[derive(Debug, Default, Clone)]
struct LogModel {
    entries: BTreeMap<u64, (Vec<u8>, u64)>,
    latest: u64,
    trimmed: u64,
    reserved_seen: u64,
    gap_possible: bool,
}

async fn run_log_case<F: Factory>(factory: &F, ops: Vec<LogOp>) -> Result<(), TestCaseError> {
    let env = Env::new(factory).await;
    let mut s = env.open().await;
    let threads = ["l0", "l1"];
    let mut models = [LogModel::default(), LogModel::default()];
    let fail = |e: StoreError| TestCaseError::fail(e.to_string());
    for (step, op) in ops.iter().enumerate() {
        let ctx = format!("step {step} {op:?}");
        match op {
            LogOp::Append(t, n) => {
                let data = vec![*n; usize::from(*n % 7) + 1];
                let seq = s.log.append(threads[*t], &data, None).await.map_err(fail)?;
                let m = &mut models[*t];
                if m.gap_possible {
                    prop_assert!(seq > m.latest.max(m.reserved_seen), "{}: seq {}", ctx, seq);
                } else {
                    prop_assert_eq!(seq, m.latest + 1, "{}", ctx);
                }
                m.entries.insert(seq, (data, env.now()));
                m.latest = seq;
                m.reserved_seen = m.reserved_seen.max(seq);
                m.gap_possible = false;
            }
            LogOp::AppendExpected(t, delta) => {
                let m = &mut models[*t];
                let expected = match delta {
                    -1 => m.latest.saturating_sub(1),
                    0 => m.latest,
                    _ => m.latest + 1,
                };
                let data = vec![0xee, *delta as u8];
                let result = s
                    .log
                    .append_expected(threads[*t], &data, expected, None)
                    .await;
                if expected == m.latest {
                    let seq = result.map_err(fail)?;
                    if m.gap_possible {
                        prop_assert!(seq > m.latest.max(m.reserved_seen), "{}", ctx);
                    } else {
                        prop_assert_eq!(seq, m.latest + 1, "{}", ctx);
                    }
                    m.entries.insert(seq, (data, env.now()));
                    m.latest = seq;
                    m.reserved_seen = m.reserved_seen.max(seq);
                    m.gap_possible = false;
                } else {
                    prop_assert_eq!(
                        result.err(),
                        Some(StoreError::Conflict { latest: m.latest }),
                        "{}",
                        ctx
                    );
                    m.gap_possible = true;
                }
            }
            LogOp::Trim(t, back) => {
                let m = &mut models[*t];
                let up_to = m.latest.saturating_sub(u64::from(*back)) + u64::from(*back == 5) * 10;
                s.log.trim(threads[*t], up_to).await.map_err(fail)?;
                m.trimmed = m.trimmed.max(up_to.min(m.latest));
                let cut = m.trimmed;
                m.entries.retain(|seq, _| *seq > cut);
            }
            LogOp::Delete(t) => {
                s.log.delete(threads[*t]).await.map_err(fail)?;
                let w = s.log.watermarks(threads[*t]).await.map_err(fail)?;
                let m = &mut models[*t];
                prop_assert!(w.latest >= m.latest, "{}: delete moved latest back", ctx);
                prop_assert_eq!(w.trimmed, w.latest, "{}", ctx);
                m.entries.clear();
                m.latest = w.latest;
                m.trimmed = w.latest;
                m.gap_possible = w.reserved != w.latest;
            }
            LogOp::Read(t, after, limit) => {
                let got = s
                    .log
                    .read(threads[*t], u64::from(*after), usize::from(*limit))
                    .await
                    .map_err(fail)?;
                let want: Vec<(u64, Vec<u8>, u64)> = models[*t]
                    .entries
                    .range(u64::from(*after) + 1..)
                    .take(usize::from(*limit))
                    .map(|(seq, (data, at))| (*seq, data.clone(), *at))
                    .collect();
                let got: Vec<(u64, Vec<u8>, u64)> = got
                    .into_iter()
                    .map(|e| (e.seq, e.data, e.appended_at))
                    .collect();
                prop_assert_eq!(got, want, "{}", ctx);
            }
            LogOp::Reopen => {
                drop(s);
                s = env.open().await;
            }
            LogOp::Advance => env.advance(3),
        }
        for (t, thread) in threads.iter().enumerate() {
            let m = &mut models[t];
            let w = s.log.watermarks(thread).await.map_err(fail)?;
            prop_assert_eq!(w.latest, m.latest, "{}: latest of {}", ctx, thread);
            prop_assert_eq!(w.trimmed, m.trimmed, "{}: trimmed of {}", ctx, thread);
            prop_assert!(
                w.reserved >= w.latest,
                "{}: reserved below latest {:?}",
                ctx,
                w
            );
            prop_assert!(
                w.reserved >= m.reserved_seen,
                "{}: reserved moved back {:?}",
                ctx,
                w
            );
            m.reserved_seen = w.reserved;
            if w.reserved != w.latest {
                m.gap_possible = true;
            }
            prop_assert_eq!(s.log.latest(thread).await.map_err(fail)?, m.latest);
            let all_entries = s.log.read(thread, 0, 100_000).await.map_err(fail)?;
            let got: Vec<(u64, Vec<u8>)> =
                all_entries.into_iter().map(|e| (e.seq, e.data)).collect();
            let want: Vec<(u64, Vec<u8>)> = m
                .entries
                .iter()
                .map(|(seq, (data, _))| (*seq, data.clone()))
                .collect();
            prop_assert_eq!(got, want, "{}: entries of {}", ctx, thread);
        }
    }
    Ok(())
}

/// Random appends, optimistic appends, trims, deletes, reads and restarts keep
/// `reserved >= latest >= trimmed`, all monotonic, sequences never reused, reads equal to the
/// model.
pub fn log_watermarks_follow_the_model<F: Factory>(factory: &F) {
    let mut runner = runner();
    let strategy = prop::collection::vec(log_op_strategy(), 1..60);
    let outcome = runner.run(&strategy, |ops| {
        runtime().block_on(run_log_case(factory, ops))
    });
    if let Err(err) = outcome {
        panic!("{err}");
    }
}
