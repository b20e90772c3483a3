//! The waitpoints of the NATS backend (the contract, docs/contract.md, section 10).
//!
//! Each waitpoint is its own record `<p>.th.<thread>.w.<id>` in its dispatch's thread tree
//! (framed like a message record: its fields as JSON, then its result; see `keys`), so every
//! waitpoint write is fenced by the thread's tree like every other write of the thread, and a
//! suspend and a completion decide against each other: whichever is stored second was decided
//! on a tree that held the first. Each operation is one message or one atomic batch:
//!
//! - create (W1), `add_token`: `w.<id>`, fenced exactly like a fenced append;
//! - suspend (T17): `d.<id>`, a holder write;
//! - complete, time out, cancel (W2 to W4): `w.<id>`; with the resume of a waiting dispatch
//!   (T18), a batch of `w.<id>` and `d.<id>`;
//! - a write that ends a dispatch with pending waitpoints: its cancelled `w.*` and then its
//!   `d.<id>` (`effects::applied`), in the same batch as the rest of that write.
//!
//! A host's view keeps the waitpoints of live dispatches (records without their results) and
//! the pending ones ordered by timeout, so a suspend, a settlement that ends a dispatch, an
//! interrupt or a sweep decides without reading the server; the reads that answer with a
//! result read the record. A client reads its thread's waitpoints with the thread record
//! (`fetch`), and a waitpoint by id through `<p>.th.*.w.<id>`, then `<p>.aw.*.<id>`.
//!
//! The archiver moves the waitpoints of an archived dispatch to `<p>.aw.<thread>.<id>` with
//! it, and a purge removes them with it (`archive`, `queries`).

use std::collections::{BTreeMap, HashSet};

use async_trait::async_trait;

use super::NatsStore;
use super::commit::{Expect, Plan, Write, put_waitpoint};
use super::effects::in_batch;
use super::fetch::Read;
use super::keys::{Key, decode_waitpoint_of};
use super::view::{Stored, View};
use crate::store::model::{Dispatch, Fence, Status};
use crate::store::waitpoints::{
    self as wp, BY_TIMEOUT, Completion, Created, MAX_TOKEN_DIGESTS, MAX_WAITPOINTS, NewWaitpoint,
    Settlement, Waitpoint, WaitpointFilter, WaitpointPage, WaitpointState, Waitpoints,
};
use crate::store::{StoreError, StoreResult, check_size};

/// The plan for a decision that needs a waitpoint's whole record where a lean view holds it
/// without its result: decide again on the records read from the server (every waitpoint
/// operation reads scoped records, so its next attempt reads them; the answer is never
/// returned).
fn read_whole<T>() -> Plan<T> {
    Plan::Refuse(Err(StoreError::Unavailable(
        "nats: a waitpoint's result is not in the view".into(),
    )))
}

/// The writes of a settled waitpoint `w`, fenced by its thread's tree, and T18 when its
/// dispatch is waiting (the dispatch's record in the same batch). Returns whether it resumed.
fn settle_writes(view: &View, w: &Waitpoint, now: u64) -> StoreResult<(Vec<Write>, bool)> {
    let mut writes = vec![put_waitpoint(
        Expect::Thread(view.thread_seq(&w.thread)),
        w,
    )?];
    let resumed = match view.dispatch(&w.dispatch)? {
        Some(stored) if stored.dispatch.status == Status::Waiting => {
            let mut d = stored.dispatch.clone();
            wp::resume(&mut d, now);
            let resumed = Stored {
                dispatch: d,
                ..stored.clone()
            };
            writes.extend(in_batch(view, Status::Waiting, resumed)?);
            true
        }
        _ => false,
    };
    Ok((writes, resumed))
}

/// The waitpoint records of `entries` (subject → last message), tree or archive alike; a
/// damaged record is left out (a read by id reports it).
fn decode_all(
    prefix: &str,
    entries: std::collections::HashMap<String, (u64, bytes::Bytes)>,
) -> Vec<Waitpoint> {
    entries
        .into_iter()
        .filter_map(|(subject, (_, payload))| {
            let key = Key::parse(prefix, &subject)?;
            decode_waitpoint_of(&key, &payload).ok()
        })
        .collect()
}

/// The first `limit` waitpoints offered that the filter admits, by `(created_at, id)`, and no
/// more of them than fit `max_bytes` as [`Waitpoint::held`] counts them (the first whatever
/// its size); without their results unless `results`. It holds the page and the waitpoint
/// offered.
struct Page<'f> {
    filter: &'f WaitpointFilter,
    max_bytes: usize,
    results: bool,
    rows: BTreeMap<(u64, String), (Waitpoint, usize)>,
    held: usize,
    /// The lowest key left out for the page's bounds: nothing at or past it is kept.
    ceiling: Option<(u64, String)>,
}

impl<'f> Page<'f> {
    fn new(filter: &'f WaitpointFilter, max_bytes: usize, results: bool) -> Page<'f> {
        Page {
            filter,
            max_bytes,
            results,
            rows: BTreeMap::new(),
            held: 0,
            ceiling: None,
        }
    }

    fn offer(&mut self, mut w: Waitpoint) {
        if !self.filter.admits(&w) {
            return;
        }
        let key = (w.created_at, w.id.clone());
        if self.ceiling.as_ref().is_some_and(|c| key >= *c) {
            return;
        }
        if !self.results {
            w.result = None;
        }
        let size = w.held();
        self.held = self.held.saturating_add(size);
        if let Some((_, old)) = self.rows.insert(key, (w, size)) {
            self.held -= old;
        }
        let limit = self.filter.page();
        while self.rows.len() > limit || (self.rows.len() > 1 && self.held > self.max_bytes) {
            let Some((dropped, (_, size))) = self.rows.pop_last() else {
                break;
            };
            self.held -= size;
            if self.ceiling.as_ref().is_none_or(|c| dropped < *c) {
                self.ceiling = Some(dropped);
            }
        }
    }

    fn finish(self) -> WaitpointPage {
        WaitpointPage {
            more: self.ceiling.is_some(),
            waitpoints: self.rows.into_values().map(|(w, _)| w).collect(),
        }
    }
}

impl NatsStore {
    /// A completion or an operator's cancel (W2, W4) of `id` to `state`, applying a timeout
    /// that is due first.
    async fn settle_waitpoint(
        &self,
        id: &str,
        state: WaitpointState,
        result: Option<Vec<u8>>,
        by: &str,
    ) -> StoreResult<Settlement> {
        self.run(&[Read::Waitpoint(id)], |view, now, _| {
            let Some(held) = view.waitpoint(id)? else {
                return Ok(Plan::Refuse(Err(StoreError::NotFound {
                    id: id.to_owned(),
                })));
            };
            if !held.whole {
                return Ok(read_whole());
            }
            let mut w = held.waitpoint.clone();
            let (state, result, by, settled) = match wp::completion(&w, now) {
                Completion::Settled => return Ok(Plan::Done(Ok(Settlement::Already(w)))),
                Completion::TimedOut => (WaitpointState::TimedOut, None, BY_TIMEOUT, false),
                Completion::Complete => (state, result.clone(), by, true),
            };
            wp::settle(&mut w, state, result, by, now);
            let (writes, resumed) = settle_writes(view, &w, now)?;
            Ok(Plan::Write {
                writes,
                answer: Ok(if settled {
                    Settlement::Settled(w)
                } else {
                    Settlement::Already(w)
                }),
                wake: resumed,
            })
        })
        .await
    }

    /// W3 of one waitpoint, if it is still pending and due at `now`.
    async fn time_out_one(&self, id: &str, now: u64) -> StoreResult<Option<Waitpoint>> {
        self.run(&[Read::Waitpoint(id)], |view, _, _| {
            let Some(held) = view.waitpoint(id)? else {
                return Ok(Plan::Done(Ok(None)));
            };
            // A pending record is whole (only a result is ever left out).
            if !held.waitpoint.is_pending() || held.waitpoint.timeout_at >= now {
                return Ok(Plan::Done(Ok(None)));
            }
            let mut w = held.waitpoint.clone();
            wp::settle(&mut w, WaitpointState::TimedOut, None, BY_TIMEOUT, now);
            let (writes, resumed) = settle_writes(view, &w, now)?;
            Ok(Plan::Write {
                writes,
                answer: Ok(Some(w)),
                wake: resumed,
            })
        })
        .await
    }

    /// Waitpoint `id` as stored now: in its thread's tree, else in the archive.
    async fn fetch_waitpoint(&self, id: &str) -> StoreResult<Option<Waitpoint>> {
        // The store mints every waitpoint id.
        if uuid::Uuid::try_parse(id).is_err() {
            return Ok(None);
        }
        let prefix = self.prefix().to_owned();
        for filter in Key::waitpoint_anywhere(&prefix, id) {
            if let Some(got) = self.get_last_matching(&filter).await?
                && let Some(key) = Key::parse(&prefix, &got.subject)
            {
                return decode_waitpoint_of(&key, &got.payload).map(Some);
            }
        }
        Ok(None)
    }

    /// Every waitpoint of `thread` as stored now: its tree's, then the archive's that the tree
    /// does not hold (a waitpoint being archived is in both for a moment).
    async fn thread_waitpoints(&self, thread: &str) -> StoreResult<Vec<Waitpoint>> {
        let prefix = self.prefix().to_owned();
        let mut out = decode_all(
            &prefix,
            self.last_of_each(&Key::waitpoints_of(&prefix, thread))
                .await?,
        );
        let in_tree: HashSet<String> = out.iter().map(|w| w.id.clone()).collect();
        let archived = decode_all(
            &prefix,
            self.last_of_each(&Key::archived_waitpoints_of(&prefix, thread))
                .await?,
        );
        out.extend(archived.into_iter().filter(|w| !in_tree.contains(&w.id)));
        Ok(out)
    }

    /// Every waitpoint under `tree` (a filter of thread trees' waitpoint subjects), then
    /// those under `archive` (the archive's, of the same threads) that the trees do not hold,
    /// read a page of records at a time (`each_record`): `each` sees each one once, and a
    /// damaged record is left out (a read by id reports it).
    async fn each_waitpoint_under(
        &self,
        tree: &str,
        archive: &str,
        mut each: impl FnMut(Waitpoint),
    ) -> StoreResult<()> {
        let prefix = self.prefix().to_owned();
        let mut in_tree: HashSet<String> = HashSet::new();
        self.each_record(tree, |subject, payload| {
            let Some(key) = Key::parse(&prefix, subject) else {
                return Ok(());
            };
            if let Key::Waitpoint(_, id) = &key {
                in_tree.insert(id.clone());
            }
            if let Ok(w) = decode_waitpoint_of(&key, payload) {
                each(w);
            }
            Ok(())
        })
        .await?;
        self.each_record(archive, |subject, payload| {
            let Some(key) = Key::parse(&prefix, subject) else {
                return Ok(());
            };
            if matches!(&key, Key::ArchivedWaitpoint(_, id) if in_tree.contains(id)) {
                return Ok(());
            }
            if let Ok(w) = decode_waitpoint_of(&key, payload) {
                each(w);
            }
            Ok(())
        })
        .await
    }

    /// The thread of dispatch `id` as stored (tree or archive), if any.
    async fn dispatch_thread(&self, id: &str) -> StoreResult<Option<String>> {
        let mut scratch = View::default();
        self.thread_of(id, &mut scratch).await
    }

    /// The fenced dispatch's record as the view has it, once the fence holds: `Err(plan)` is
    /// the fence's answer (a refusal, or the supersede of a stale holder).
    pub(super) fn fenced_record<T>(
        view: &View,
        fence: &Fence,
        now: u64,
    ) -> StoreResult<Result<Dispatch, Plan<T>>> {
        let thread = match view.dispatch(&fence.dispatch)? {
            Some(s) => s.dispatch.thread.clone(),
            None => String::new(),
        };
        if let Some(plan) = Self::fenced(view, &thread, fence, now)? {
            return Ok(Err(plan));
        }
        match view.dispatch(&fence.dispatch)? {
            Some(s) => Ok(Ok(s.dispatch.clone())),
            // Not reached: the fence found the record.
            None => Ok(Err(Plan::Refuse(Err(StoreError::NotFound {
                id: fence.dispatch.clone(),
            })))),
        }
    }
}

#[async_trait]
impl Waitpoints for NatsStore {
    async fn create_waitpoint(&self, fence: &Fence, new: NewWaitpoint) -> StoreResult<Created> {
        new.validate().map_err(StoreError::Invalid)?;
        self.run(&[Read::Dispatch(&fence.dispatch)], |view, now, _| {
            let d = match Self::fenced_record(view, fence, now)? {
                Ok(d) => d,
                Err(plan) => return Ok(plan),
            };
            let mine = view.waitpoints_of(&d.thread, &d.id);
            if let Some(held) = mine.iter().find(|h| h.waitpoint.name == new.name) {
                if !held.whole {
                    return Ok(read_whole());
                }
                return Ok(Plan::Done(Ok(Created {
                    waitpoint: held.waitpoint.clone(),
                    created: false,
                })));
            }
            // The view holds every waitpoint of a live dispatch: the count is exact, and the
            // write below is fenced by it.
            let made = mine.len();
            if made >= MAX_WAITPOINTS as usize {
                return Ok(Plan::Done(Err(StoreError::Limit(format!(
                    "waitpoints: dispatch `{}` has created {made} waitpoints (the limit is {MAX_WAITPOINTS})",
                    d.id
                )))));
            }
            let waitpoint = wp::pending_record(&uuid::Uuid::now_v7().to_string(), &d, &new, now);
            Ok(Plan::Write {
                writes: vec![put_waitpoint(
                    Expect::Thread(view.thread_seq(&d.thread)),
                    &waitpoint,
                )?],
                answer: Ok(Created {
                    waitpoint,
                    created: true,
                }),
                wake: false,
            })
        })
        .await
    }

    async fn add_token(&self, fence: &Fence, id: &str, digest: &str) -> StoreResult<bool> {
        self.run(&[Read::Dispatch(&fence.dispatch)], |view, now, _| {
            let d = match Self::fenced_record(view, fence, now)? {
                Ok(d) => d,
                Err(plan) => return Ok(plan),
            };
            // The view holds every waitpoint of the fenced dispatch's thread.
            let Some(held) = view.waitpoint(id)? else {
                return Ok(Plan::Refuse(Ok(false)));
            };
            let w = &held.waitpoint;
            if w.dispatch != d.id || !w.is_pending() || w.token_digests.len() >= MAX_TOKEN_DIGESTS {
                return Ok(Plan::Done(Ok(false)));
            }
            let mut w = w.clone();
            w.token_digests.push(digest.to_owned());
            Ok(Plan::Write {
                writes: vec![put_waitpoint(
                    Expect::Thread(view.thread_seq(&w.thread)),
                    &w,
                )?],
                answer: Ok(true),
                wake: false,
            })
        })
        .await
    }

    async fn complete_waitpoint(
        &self,
        id: &str,
        result: Vec<u8>,
        settled_by: &str,
    ) -> StoreResult<Settlement> {
        let room = self.room();
        check_size("result", &result, room.value, &room.value_why())?;
        self.settle_waitpoint(id, WaitpointState::Completed, Some(result), settled_by)
            .await
    }

    async fn cancel_waitpoint(&self, id: &str, settled_by: &str) -> StoreResult<Settlement> {
        self.settle_waitpoint(id, WaitpointState::Cancelled, None, settled_by)
            .await
    }

    async fn time_out_waitpoints(&self, now: u64, limit: usize) -> StoreResult<Vec<Waitpoint>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let due: Vec<String> = if self.follows() {
            self.barrier().await?;
            self.view()?.due_before(now, limit)
        } else {
            let mut due: Vec<(u64, String)> = Vec::new();
            let prefix = self.prefix().to_owned();
            for w in decode_all(
                &prefix,
                self.last_of_each(&Key::all_waitpoints(&prefix)).await?,
            ) {
                if w.is_pending() && w.timeout_at < now {
                    due.push((w.timeout_at, w.id));
                }
            }
            due.sort();
            due.truncate(limit);
            due.into_iter().map(|(_, id)| id).collect()
        };
        // Each on its own, fenced by its thread: of several sweepers, one times each out.
        let mut out = Vec::new();
        for id in due {
            out.extend(self.time_out_one(&id, now).await?);
        }
        Ok(out)
    }

    async fn waitpoint(&self, id: &str) -> StoreResult<Option<Waitpoint>> {
        if self.follows() {
            self.barrier().await?;
            let view = self.view()?;
            if let Some(held) = view.waitpoint(id)?.filter(|h| h.whole) {
                return Ok(Some(held.waitpoint.clone()));
            }
        }
        self.fetch_waitpoint(id).await
    }

    async fn waitpoints_of(&self, dispatch: &str) -> StoreResult<Vec<Waitpoint>> {
        let mut thread = None;
        if self.follows() {
            self.barrier().await?;
            let view = self.view()?;
            if let Some(s) = view.dispatch(dispatch)? {
                let d = &s.dispatch;
                let held = view.waitpoints_of(&d.thread, &d.id);
                // A live dispatch's waitpoints are all in the view; without results, whole.
                if held.iter().all(|h| h.whole) {
                    return Ok(held.into_iter().map(|h| h.waitpoint.clone()).collect());
                }
                thread = Some(d.thread.clone());
            }
        }
        let thread = match thread {
            Some(t) => t,
            None => match self.dispatch_thread(dispatch).await? {
                Some(t) => t,
                None => return Ok(Vec::new()),
            },
        };
        let mut out: Vec<Waitpoint> = self
            .thread_waitpoints(&thread)
            .await?
            .into_iter()
            .filter(|w| w.dispatch == dispatch)
            .collect();
        out.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(out)
    }

    async fn read_waitpoints(
        &self,
        filter: &WaitpointFilter,
        max_bytes: usize,
        results: bool,
    ) -> StoreResult<WaitpointPage> {
        let prefix = self.prefix().to_owned();
        let mut page = Page::new(filter, max_bytes, results);
        let mut thread = filter.thread.clone();
        if let Some(dispatch) = &filter.dispatch {
            let mut found = None;
            if self.follows() {
                self.barrier().await?;
                let view = self.view()?;
                if let Some(s) = view.dispatch(dispatch)? {
                    let d = &s.dispatch;
                    let held = view.waitpoints_of(&d.thread, &d.id);
                    // A live dispatch's waitpoints are all in the view; without results, whole.
                    if held.iter().all(|h| h.whole) {
                        for h in held {
                            page.offer(h.waitpoint.clone());
                        }
                        return Ok(page.finish());
                    }
                    found = Some(d.thread.clone());
                }
            }
            let of_dispatch = match found {
                Some(t) => Some(t),
                None => self.dispatch_thread(dispatch).await?,
            };
            match (&thread, of_dispatch) {
                (_, None) => return Ok(page.finish()),
                // Another thread's dispatch: the filter admits none.
                (Some(t), Some(of)) if *t != of => return Ok(page.finish()),
                (_, Some(of)) => thread = Some(of),
            }
        }
        if let Some(thread) = &thread {
            self.each_waitpoint_under(
                &Key::waitpoints_of(&prefix, thread),
                &Key::archived_waitpoints_of(&prefix, thread),
                |w| page.offer(w),
            )
            .await?;
        } else if self.follows() && filter.state == Some(WaitpointState::Pending) {
            // A host's view holds every pending waitpoint, whole.
            self.barrier().await?;
            self.view()?
                .pending_waitpoints()
                .for_each(|w| page.offer(w.clone()));
        } else {
            self.each_waitpoint_under(
                &Key::all_waitpoints(&prefix),
                &Key::all_archived_waitpoints(&prefix),
                |w| page.offer(w),
            )
            .await?;
        }
        Ok(page.finish())
    }

    fn max_result(&self) -> u64 {
        self.room().value
    }
}
