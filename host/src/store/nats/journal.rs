//! The journals of the NATS backend (the contract, docs/contract.md, section 11).
//!
//! # Layout
//!
//! A journal lives outside every thread tree, so that the watcher's load and a host's view
//! never read it:
//!
//! | subject | value |
//! | --- | --- |
//! | `<p>.jn.<dispatch>.c.<pos>` | a call entry (framed: the format byte, a `u32` length, the fields as JSON, then the body); empty once dropped |
//! | `<p>.jn.<dispatch>.s.<key>` | a step (framed the same way: the fields, then the value) |
//! | `<p>.jx.<dispatch>` | the mark of a dispatch that has a journal: its thread's name |
//!
//! Names are encoded as every other subject token (`keys`). One subject per position or key,
//! and the stream keeps one message per subject, so a write at a position replaces what was
//! there.
//!
//! # Fencing
//!
//! Every write is decided like a fenced append (the claim's token, lease and epoch read from
//! the dispatch record, `rules::check_fence`) and sent as one message, or one atomic batch,
//! whose first message carries `Nats-Expected-Last-Subject-Sequence` with
//! `Nats-Expected-Last-Subject-Sequence-Subject` = the dispatch's thread tree: it is stored
//! only if nothing happened to the thread since the decision (a reclaim, a claim, an
//! interrupt, a settlement all write the tree), and, being outside the tree, it does not move
//! the tree's last sequence, so the thread's other writers are not disturbed by it.
//! `record_append` is one atomic batch of the `e.<seq>` log entry (fenced by the tree as
//! any append) and the call entry.
//!
//! # Dropping entries
//!
//! The generations of the design (docs/design/agent-0.2.0.md, 8.5) are not used: `drop_calls`
//! reads which positions hold an entry and overwrites those at or above `from` with empty
//! messages, in fenced atomic batches (highest positions first, so a batch refused part way
//! leaves a shorter journal, never one with a hole in the middle). A loaded journal skips
//! empty messages. So a stale holder can never drop a newer holder's entries: its tombstones
//! are fenced like its writes.
//!
//! # Removal
//!
//! The first journal write of a dispatch on an instance adds its mark `<p>.jx.<dispatch>` to
//! the same atomic batch (an instance remembers which dispatches it marked). A sweep reads
//! marks page by page and, for each dispatch no longer stored (its tree record gone or a
//! tombstone, and no archived copy: purged by `purge_terminal`, or expired by its TTL),
//! purges the dispatch's journal subjects up to the stream sequence read before the check (a
//! dispatch of the same id enqueued again later keeps what it writes after), then deletes
//! the mark at the sequence read. A host's sweep (`reclaim_expired`) handles one page per
//! call; `purge_terminal` sweeps every mark after it purged. So a journal goes within a sweep
//! of its dispatch, whichever way the dispatch went, and nothing is added to the records of
//! the hot path or to the archiver.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use bytes::{BufMut, Bytes, BytesMut};
use serde_json::json;

use super::NatsStore;
use super::commit::{Expect, MAX_BATCH, Plan, Write};
use super::fetch::{PAGE, PAGE_BYTES, Read};
use super::keys::Key;
use super::keys::encode_entry;
use super::view::{Record, View};
use crate::store::journal::{
    CallEntry, CallPicker, CallSummary, Journal, JournalAsk, JournalData, JournalPage, NewStep,
    Step, check_entry, step_held,
};
use crate::store::model::{Dispatch, Fence};
use crate::store::{StoreError, StoreResult, check_size};

/// Room kept in a call entry's message for its fields (kind, identity, answer, numbers).
const FIELDS_ROOM: u64 = 64 * 1024;
/// What the frame adds: the format byte and the fields' length.
const FRAME: u64 = 5;
/// The format byte of a record whose fields are not followed by bytes (a call entry without
/// a body).
const BARE: u8 = 1;
/// The format byte of a record whose fields are followed by its bytes (a body, a value).
const WITH_BYTES: u8 = 2;
/// How many marked dispatches an instance remembers before it forgets them all.
const MAX_REMEMBERED: usize = 65_536;
/// Bytes per page of a listing's read of a journal's records (the server stops a page at
/// this size, or after its first message when that is larger): what a listing holds of the
/// records at a time, beside the page it keeps.
const LIST_READ_BYTES: usize = 1 << 20;
/// Messages per page of a listing's read.
const LIST_READ_PAGE: usize = 256;

fn corrupt(key: &Key, reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        key: key.describe(),
        reason: reason.into(),
    }
}

/// Frames `fields` (JSON) and `bytes` (see the module).
fn frame(fields: &[u8], bytes: Option<&[u8]>, what: &str) -> StoreResult<Bytes> {
    let n = u32::try_from(fields.len())
        .map_err(|_| StoreError::Invalid(format!("{what}: its fields are too large")))?;
    let rest = bytes.unwrap_or_default();
    let mut out = BytesMut::with_capacity(FRAME as usize + fields.len() + rest.len());
    out.put_u8(if bytes.is_some() { WITH_BYTES } else { BARE });
    out.put_u32(n);
    out.put_slice(fields);
    out.put_slice(rest);
    Ok(out.freeze())
}

/// The fields of a framed record and its bytes (`None` for a bare one).
fn unframe(bytes: &[u8]) -> Result<(&[u8], Option<&[u8]>), String> {
    let format = *bytes.first().ok_or("empty record")?;
    if format != BARE && format != WITH_BYTES {
        return Err(format!("unknown record format (first byte {format:#04x})"));
    }
    let len = bytes
        .get(1..5)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .ok_or("record truncated before its fields' length")?;
    let end = usize::try_from(u32::from_be_bytes(len))
        .ok()
        .and_then(|n| n.checked_add(5))
        .ok_or("fields' length out of range")?;
    let fields = bytes
        .get(5..end)
        .ok_or("record truncated inside its fields")?;
    let rest = bytes.get(end..).unwrap_or_default();
    if format == BARE {
        if !rest.is_empty() {
            return Err(format!("{} stray bytes after a bare record", rest.len()));
        }
        return Ok((fields, None));
    }
    Ok((fields, Some(rest)))
}

/// The payload of call entry `head` (its body left out) with `body`.
fn encode_call(head: &CallEntry, body: Option<&[u8]>) -> StoreResult<Bytes> {
    let what = format!("journal entry {} of dispatch {}", head.pos, head.dispatch);
    let fields = serde_json::to_vec(head)
        .map_err(|e| StoreError::Invalid(format!("{what}: cannot encode: {e}")))?;
    frame(&fields, body, &what)
}

/// Decodes the fields of the call entry of `key` (a [`Key::JournalCall`]), checking they are
/// that entry's, and finds its body without copying it.
fn decode_head<'a>(key: &Key, bytes: &'a [u8]) -> StoreResult<(CallEntry, Option<&'a [u8]>)> {
    let (fields, body) = unframe(bytes).map_err(|e| corrupt(key, e))?;
    let entry: CallEntry =
        serde_json::from_slice(fields).map_err(|e| corrupt(key, e.to_string()))?;
    if let Key::JournalCall(dispatch, pos) = key
        && (entry.dispatch != *dispatch || entry.pos != *pos)
    {
        return Err(corrupt(
            key,
            format!(
                "the record holds entry {} of `{}`",
                entry.pos, entry.dispatch
            ),
        ));
    }
    Ok((entry, body))
}

/// Decodes the call entry of `key` (a [`Key::JournalCall`]).
fn decode_call(key: &Key, bytes: &[u8]) -> StoreResult<CallEntry> {
    let (mut entry, body) = decode_head(key, bytes)?;
    entry.body = body.map(<[u8]>::to_vec);
    Ok(entry)
}

/// Decodes the call entry of `key` (a [`Key::JournalCall`]) without copying its body: the
/// body's size instead.
fn decode_summary(key: &Key, bytes: &[u8]) -> StoreResult<CallSummary> {
    let (mut entry, body) = decode_head(key, bytes)?;
    entry.body = None;
    entry.cheap = Default::default();
    Ok(CallSummary {
        entry,
        body_size: body.map(|b| b.len() as u64),
    })
}

/// Decodes the step of `key` without copying its value (left empty).
fn decode_step_head(key: &Key, bytes: &[u8]) -> StoreResult<Step> {
    let (fields, _) = unframe(bytes).map_err(|e| corrupt(key, e))?;
    let step: Step = serde_json::from_slice(fields).map_err(|e| corrupt(key, e.to_string()))?;
    if let Key::JournalStep(dispatch, name) = key
        && (step.dispatch != *dispatch || step.key != *name)
    {
        return Err(corrupt(
            key,
            format!(
                "the record holds step `{}` of `{}`",
                step.key, step.dispatch
            ),
        ));
    }
    Ok(step)
}

/// The payload of a step.
fn encode_step(step: &Step) -> StoreResult<Bytes> {
    let what = format!("journal step of dispatch {}", step.dispatch);
    let head = Step {
        dispatch: step.dispatch.clone(),
        key: step.key.clone(),
        value: Vec::new(),
        claim: step.claim,
        attempt: step.attempt,
        recorded_at: step.recorded_at,
        size: step.size,
    };
    let fields = serde_json::to_vec(&head)
        .map_err(|e| StoreError::Invalid(format!("{what}: cannot encode: {e}")))?;
    frame(&fields, Some(&step.value), &what)
}

/// Decodes the step of `key` (a [`Key::JournalStep`]).
fn decode_step(key: &Key, bytes: &[u8]) -> StoreResult<Step> {
    let (fields, value) = unframe(bytes).map_err(|e| corrupt(key, e))?;
    let mut step: Step = serde_json::from_slice(fields).map_err(|e| corrupt(key, e.to_string()))?;
    if let Key::JournalStep(dispatch, name) = key
        && (step.dispatch != *dispatch || step.key != *name)
    {
        return Err(corrupt(
            key,
            format!(
                "the record holds step `{}` of `{}`",
                step.key, step.dispatch
            ),
        ));
    }
    step.value = value.unwrap_or_default().to_vec();
    Ok(step)
}

/// A write of a journal record (the expectation is given by [`NatsStore::journal_write`]).
fn journal_record(key: Key, dispatch: &str, payload: Bytes) -> Write {
    Write {
        key,
        expect: Expect::None,
        payload,
        record: Record::Journal(dispatch.to_owned()),
    }
}

impl NatsStore {
    /// Why [`Journal::max_body`] is what it is, for error messages.
    fn body_why(&self) -> String {
        format!(
            "one NATS message per journal record, and the server's max_payload is {} bytes",
            self.room().server
        )
    }

    /// Whether this instance already wrote the mark of `dispatch`.
    fn marked(&self, dispatch: &str) -> bool {
        self.inner
            .journaled
            .lock()
            .is_ok_and(|set| set.contains(dispatch))
    }

    fn remember_mark(&self, dispatch: &str) {
        if let Ok(mut set) = self.inner.journaled.lock() {
            if set.len() >= MAX_REMEMBERED {
                set.clear();
            }
            set.insert(dispatch.to_owned());
        }
    }

    /// The thread of dispatch `id`: from a host's view, else as stored.
    async fn journal_thread(&self, id: &str) -> StoreResult<Option<String>> {
        if self.follows()
            && let Some(s) = self.view()?.dispatch(id)?
        {
            return Ok(Some(s.dispatch.thread.clone()));
        }
        let mut scratch = View::default();
        self.thread_of(id, &mut scratch).await
    }

    /// A journal write of the fenced dispatch: once the fence holds, `build` decides the
    /// writes; the first is given the thread tree's expectation (unless it carries one of its
    /// own), and the dispatch's mark is added when this instance has not written it yet.
    /// `log` names the thread whose log the decision reads (a journaled append).
    async fn journal_write<T>(
        &self,
        fence: &Fence,
        log: Option<&str>,
        mut build: impl FnMut(&View, &Dispatch, u64) -> StoreResult<Plan<T>>,
    ) -> StoreResult<T> {
        let marked = self.marked(&fence.dispatch);
        let mut reads = vec![Read::Dispatch(&fence.dispatch)];
        if let Some(thread) = log {
            reads.push(Read::Log(thread));
        }
        let mut wrote = false;
        let out = self
            .run(&reads, |view, now, _| {
                wrote = false;
                let d = match Self::fenced_record(view, fence, now)? {
                    Ok(d) => d,
                    Err(plan) => return Ok(plan),
                };
                Ok(match build(view, &d, now)? {
                    Plan::Write {
                        mut writes,
                        answer,
                        wake,
                    } => {
                        if let Some(first) = writes.first_mut()
                            && first.expect == Expect::None
                        {
                            first.expect =
                                Expect::Tree(d.thread.clone(), view.thread_seq(&d.thread));
                        }
                        if !marked && !writes.is_empty() {
                            writes.push(journal_record(
                                Key::JournalMark(d.id.clone()),
                                &d.id,
                                Bytes::from(d.thread.clone().into_bytes()),
                            ));
                        }
                        wrote = true;
                        Plan::Write {
                            writes,
                            answer,
                            wake,
                        }
                    }
                    other => other,
                })
            })
            .await;
        if out.is_ok() && wrote && !marked {
            self.remember_mark(&fence.dispatch);
        }
        out
    }

    /// Removes the journals of dispatches no longer stored (see the module): among the next
    /// page of marks, or among every mark when `all`. Returns how many journals went.
    pub async fn sweep_journals(&self, all: bool) -> StoreResult<usize> {
        let prefix = self.prefix().to_owned();
        let filter = Key::journal_marks(&prefix);
        // Whatever a dispatch found gone wrote is at or below this sequence.
        let upto = self.stream_last_seq().await?;
        let mut marks: Vec<(u64, String, Bytes)> = Vec::new();
        if all {
            self.scan(Some(&filter), |batch| {
                marks.extend(
                    batch
                        .messages
                        .iter()
                        .map(|m| (m.seq, m.subject.clone(), m.payload.clone())),
                );
            })
            .await?;
        } else {
            let from = self.inner.journal_from.load(Ordering::Relaxed).max(1);
            let batch = self
                .get_batch(json!({
                    "seq": from,
                    "batch": PAGE,
                    "max_bytes": PAGE_BYTES,
                    "next_by_subj": filter,
                }))
                .await?;
            let next = match batch.messages.last() {
                Some(last) if batch.pending > 0 => last.seq + 1,
                _ => 1,
            };
            self.inner.journal_from.store(next, Ordering::Relaxed);
            marks.extend(
                batch
                    .messages
                    .into_iter()
                    .map(|m| (m.seq, m.subject, m.payload)),
            );
        }
        let mut removed = 0;
        for (seq, subject, payload) in marks {
            let Some(Key::JournalMark(dispatch)) = Key::parse(&prefix, &subject) else {
                continue;
            };
            // A damaged mark names no thread to look in: it stays, and so does its journal.
            let Ok(thread) = String::from_utf8(payload.to_vec()) else {
                continue;
            };
            if seq > upto || self.dispatch_stored(&thread, &dispatch).await? {
                continue;
            }
            self.purge(json!({
                "filter": Key::journal_of(&prefix, &dispatch),
                "seq": upto + 1,
            }))
            .await?;
            self.delete_seq(seq).await?;
            removed += 1;
        }
        Ok(removed)
    }

    /// Whether dispatch `id` of `thread` is stored: a record in its tree (a tombstone is a
    /// purged record), else an archived copy. The archiver copies before it deletes, so a
    /// record moving to the archive is found in one place or the other.
    async fn dispatch_stored(&self, thread: &str, id: &str) -> StoreResult<bool> {
        let prefix = self.prefix();
        let tree = Key::Dispatch(thread.to_owned(), id.to_owned()).subject(prefix);
        if let Some((_, payload)) = self.get_last(&tree).await? {
            return Ok(!payload.is_empty());
        }
        let archived = Key::Archive(thread.to_owned(), id.to_owned()).subject(prefix);
        Ok(self
            .get_last(&archived)
            .await?
            .is_some_and(|(_, payload)| !payload.is_empty()))
    }

    /// Every message under `filter` as stored now, in stream order, read a page of at most
    /// [`LIST_READ_BYTES`] at a time (the stream keeps one message per subject): `each` sees
    /// each one's subject and payload, and the page is dropped before the next is read.
    pub(super) async fn each_record(
        &self,
        filter: &str,
        mut each: impl FnMut(&str, &[u8]) -> StoreResult<()>,
    ) -> StoreResult<()> {
        let mut from = 1u64;
        loop {
            let batch = self
                .get_batch(json!({
                    "seq": from,
                    "batch": LIST_READ_PAGE,
                    "max_bytes": LIST_READ_BYTES,
                    "next_by_subj": filter,
                }))
                .await?;
            let Some(last) = batch.messages.last().map(|m| m.seq) else {
                return Ok(());
            };
            for got in &batch.messages {
                each(&got.subject, &got.payload)?;
            }
            if batch.pending == 0 {
                return Ok(());
            }
            from = last + 1;
        }
    }

    /// The positions of `dispatch` holding an entry, as stored now.
    async fn held_positions(&self, dispatch: &str) -> StoreResult<Vec<u32>> {
        let prefix = self.prefix().to_owned();
        let found: HashMap<String, (u64, Bytes)> = self
            .last_of_each(&Key::journal_calls_of(&prefix, dispatch))
            .await?;
        Ok(found
            .into_iter()
            .filter_map(
                |(subject, (_, payload))| match Key::parse(&prefix, &subject) {
                    Some(Key::JournalCall(_, pos)) if !payload.is_empty() => Some(pos),
                    _ => None,
                },
            )
            .collect())
    }
}

#[async_trait]
impl Journal for NatsStore {
    async fn load_journal(&self, dispatch: &str) -> StoreResult<JournalData> {
        let prefix = self.prefix().to_owned();
        let mut calls = Vec::new();
        for (subject, (_, payload)) in self
            .last_of_each(&Key::journal_calls_of(&prefix, dispatch))
            .await?
        {
            // Dropped.
            if payload.is_empty() {
                continue;
            }
            if let Some(key @ Key::JournalCall(..)) = Key::parse(&prefix, &subject) {
                calls.push(decode_call(&key, &payload)?);
            }
        }
        calls.sort_by_key(|c| c.pos);
        let mut steps = Vec::new();
        for (subject, (_, payload)) in self
            .last_of_each(&Key::journal_steps_of(&prefix, dispatch))
            .await?
        {
            if let Some(key @ Key::JournalStep(..)) = Key::parse(&prefix, &subject) {
                steps.push(decode_step(&key, &payload)?);
            }
        }
        steps.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(JournalData { calls, steps })
    }

    async fn journal_page(&self, dispatch: &str, ask: &JournalAsk) -> StoreResult<JournalPage> {
        let prefix = self.prefix().to_owned();
        let mut page = JournalPage::default();
        let mut calls = CallPicker::new(*ask);
        self.each_record(
            &Key::journal_calls_of(&prefix, dispatch),
            |subject, payload| {
                // Dropped.
                if payload.is_empty() {
                    return Ok(());
                }
                if let Some(key @ Key::JournalCall(..)) = Key::parse(&prefix, subject) {
                    let call = decode_summary(&key, payload)?;
                    page.call_count += 1;
                    page.bytes = page.bytes.saturating_add(call.entry.size);
                    calls.offer(call);
                }
                Ok(())
            },
        )
        .await?;
        (page.calls, page.more) = calls.finish();
        // Steps by key: those that fit, the smallest keys kept.
        let mut steps: std::collections::BTreeMap<String, Step> = std::collections::BTreeMap::new();
        let mut held = 0;
        let mut ceiling: Option<String> = None;
        self.each_record(
            &Key::journal_steps_of(&prefix, dispatch),
            |subject, payload| {
                let Some(key @ Key::JournalStep(..)) = Key::parse(&prefix, subject) else {
                    return Ok(());
                };
                let step = decode_step_head(&key, payload)?;
                page.step_count += 1;
                page.bytes = page.bytes.saturating_add(step.size);
                if ask.max_step_bytes == 0 || ceiling.as_ref().is_some_and(|c| step.key >= *c) {
                    return Ok(());
                }
                held += step_held(&step);
                if let Some(old) = steps.insert(step.key.clone(), step) {
                    held -= step_held(&old);
                }
                while steps.len() > 1 && held > ask.max_step_bytes {
                    let Some((key, dropped)) = steps.pop_last() else {
                        break;
                    };
                    held -= step_held(&dropped);
                    if ceiling.as_ref().is_none_or(|c| key < *c) {
                        ceiling = Some(key);
                    }
                }
                Ok(())
            },
        )
        .await?;
        page.more_steps = ceiling.is_some();
        page.steps = steps.into_values().collect();
        Ok(page)
    }

    async fn call_summary(&self, dispatch: &str, pos: u32) -> StoreResult<Option<CallSummary>> {
        let key = Key::JournalCall(dispatch.to_owned(), pos);
        match self.get_last(&key.subject(self.prefix())).await? {
            Some((_, payload)) if !payload.is_empty() => Ok(Some(decode_summary(&key, &payload)?)),
            _ => Ok(None),
        }
    }

    async fn call_entry(&self, dispatch: &str, pos: u32) -> StoreResult<Option<CallEntry>> {
        let key = Key::JournalCall(dispatch.to_owned(), pos);
        match self.get_last(&key.subject(self.prefix())).await? {
            Some((_, payload)) if !payload.is_empty() => Ok(Some(decode_call(&key, &payload)?)),
            _ => Ok(None),
        }
    }

    async fn record(&self, fence: &Fence, mut entry: CallEntry) -> StoreResult<()> {
        check_entry(fence, &entry, self.max_body(), &self.body_why())?;
        if entry.kind.is_append() {
            return Err(StoreError::Invalid(format!(
                "kind: a `{}` entry is recorded with its append (record_append)",
                entry.kind
            )));
        }
        let body = entry.body.take();
        let head = entry;
        self.journal_write(fence, None, |_, d, now| {
            let mut head = head.clone();
            head.recorded_at = now;
            let payload = encode_call(&head, body.as_deref())?;
            Ok(Plan::Write {
                writes: vec![journal_record(
                    Key::JournalCall(d.id.clone(), head.pos),
                    &d.id,
                    payload,
                )],
                answer: Ok(()),
                wake: false,
            })
        })
        .await
    }

    async fn record_append(
        &self,
        fence: &Fence,
        mut entry: CallEntry,
        data: &[u8],
        expected: Option<u64>,
    ) -> StoreResult<u64> {
        check_entry(fence, &entry, self.max_body(), &self.body_why())?;
        let room = self.room();
        check_size("entry", data, room.entry, &room.entry_why())?;
        let thread = self.journal_thread(&fence.dispatch).await?;
        let body = entry.body.take();
        let head = entry;
        self.journal_write(fence, thread.as_deref(), |view, d, now| {
            let latest = view.latest(&d.thread);
            if let Some(expected) = expected
                && latest != expected
            {
                return Ok(Plan::Refuse(Err(StoreError::Conflict { latest })));
            }
            let seq = latest + 1;
            let mut head = head.clone();
            head.recorded_at = now;
            head.answer = json!({ "seq": seq });
            head.body = body.clone();
            head.size = head.measure();
            let body = head.body.take();
            let append = Write {
                key: Key::Entry(d.thread.clone(), seq),
                expect: Expect::Thread(view.thread_seq(&d.thread)),
                payload: encode_entry(now, data, None)?,
                record: Record::Entry(d.thread.clone(), seq),
            };
            let call = journal_record(
                Key::JournalCall(d.id.clone(), head.pos),
                &d.id,
                encode_call(&head, body.as_deref())?,
            );
            Ok(Plan::Write {
                writes: vec![append, call],
                answer: Ok(seq),
                wake: false,
            })
        })
        .await
    }

    async fn drop_calls(&self, fence: &Fence, from: u32) -> StoreResult<()> {
        let mut held: Vec<u32> = self
            .held_positions(&fence.dispatch)
            .await?
            .into_iter()
            .filter(|pos| *pos >= from)
            .collect();
        // Highest first: a batch refused part way leaves a shorter journal.
        held.sort_unstable_by(|a, b| b.cmp(a));
        if held.is_empty() {
            // Nothing to drop: the answer is still the fence's.
            return self
                .journal_write(fence, None, |_, _, _| Ok(Plan::Done(Ok(()))))
                .await;
        }
        // Room in each batch for the mark.
        for chunk in held.chunks(MAX_BATCH - 1) {
            self.journal_write(fence, None, |_, d, _| {
                Ok(Plan::Write {
                    writes: chunk
                        .iter()
                        .map(|pos| {
                            journal_record(
                                Key::JournalCall(d.id.clone(), *pos),
                                &d.id,
                                Bytes::new(),
                            )
                        })
                        .collect(),
                    answer: Ok(()),
                    wake: false,
                })
            })
            .await?;
        }
        Ok(())
    }

    async fn put_step(&self, fence: &Fence, step: NewStep) -> StoreResult<()> {
        step.validate()?;
        check_size("value", &step.value, self.max_body(), &self.body_why())?;
        self.journal_write(fence, None, |_, d, now| {
            let step = step.clone().record(&d.id, now);
            Ok(Plan::Write {
                writes: vec![journal_record(
                    Key::JournalStep(d.id.clone(), step.key.clone()),
                    &d.id,
                    encode_step(&step)?,
                )],
                answer: Ok(()),
                wake: false,
            })
        })
        .await
    }

    fn max_body(&self) -> u64 {
        self.room().record.saturating_sub(FRAME + FIELDS_ROOM)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::journal::{CallKind, identity};

    #[test]
    fn call_entries_and_steps_round_trip_and_damage_is_corrupt() {
        let mut entry = CallEntry::new(
            "d1",
            3,
            CallKind::Http,
            identity([&b"GET"[..]]),
            json!({"status": 200}),
            Some(vec![0, 255, b'{', 7]),
            2,
            1,
            9,
        );
        entry.recorded_at = 5;
        let key = Key::JournalCall("d1".into(), 3);
        let mut head = entry.clone();
        let body = head.body.take();
        let bytes = encode_call(&head, body.as_deref()).unwrap_or_default();
        assert_eq!(decode_call(&key, &bytes).ok(), Some(entry.clone()));
        let bare = encode_call(&head, None).unwrap_or_default();
        assert_eq!(
            decode_call(&key, &bare).ok().map(|e| e.body),
            Some(None),
            "no body stays none"
        );
        assert!(decode_call(&Key::JournalCall("d1".into(), 4), &bytes).is_err());
        for cut in 0..bytes.len() - 4 {
            assert!(decode_call(&key, &bytes[..cut]).is_err(), "cut at {cut}");
        }
        let step = NewStep {
            key: "k.1".into(),
            value: vec![1, 0, 2],
            claim: 1,
            attempt: 0,
        }
        .record("d1", 7);
        let key = Key::JournalStep("d1".into(), "k.1".into());
        let bytes = encode_step(&step).unwrap_or_default();
        assert_eq!(decode_step(&key, &bytes).ok(), Some(step));
        assert!(decode_step(&Key::JournalStep("d1".into(), "k".into()), &bytes).is_err());
    }
}
