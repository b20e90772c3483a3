//! The queries of the NATS backend's mailbox, and its purge. Live work a host answers from
//! its view once it caught up with the stream (a barrier); anything else (a settled record, a
//! thread's listing, anything of a client) is read from the server (see `fetch`), and what
//! spans all threads by reading the dispatch subjects page by page, keeping at most a page of
//! rows in memory.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::NatsStore;
use super::commit::{CommitError, Expect, MAX_BATCH, Write};
use super::fetch::Read;
use super::keys::Key;
use super::view::{Record, Stored, View};
use crate::store::StoreResult;
use crate::store::model::{Dispatch, DispatchRow, ListCursor, ListFilter, Status, StatusCount};

/// Where a dispatch record was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Held {
    /// In its thread's tree.
    Tree,
    /// In the archive (`archive`).
    Archive,
}

/// Records one `purge_terminal` call tombstones at most.
const PURGE_PER_CALL: usize = 100_000;

/// What a page of a list holds of each record: the whole record (`list`), or its row
/// (`list_rows`: no payload, no output).
pub(super) trait Listed {
    fn of(d: &Dispatch) -> Self;
}

impl Listed for Dispatch {
    fn of(d: &Dispatch) -> Dispatch {
        d.clone()
    }
}

impl Listed for DispatchRow {
    fn of(d: &Dispatch) -> DispatchRow {
        DispatchRow::of(d)
    }
}

/// The first `limit` rows after the filter's cursor, in list order, holding no more than
/// `limit` rows at any time whatever the input's size.
struct Page<'f, T> {
    filter: &'f ListFilter,
    limit: usize,
    rows: BTreeMap<ListCursor, T>,
}

impl<'f, T: Listed> Page<'f, T> {
    fn new(filter: &'f ListFilter) -> Page<'f, T> {
        let limit = crate::store::rules::page(filter.limit);
        Page {
            filter,
            limit,
            rows: BTreeMap::new(),
        }
    }

    fn offer(&mut self, d: &Dispatch) {
        let f = self.filter;
        if f.thread.as_ref().is_some_and(|t| *t != d.thread)
            || f.agent.as_ref().is_some_and(|a| *a != d.agent)
            || !(f.statuses.is_empty() || f.statuses.contains(&d.status))
        {
            return;
        }
        let key = ListCursor::of(d);
        if f.after.as_ref().is_some_and(|after| key <= *after) {
            return;
        }
        if self.rows.len() >= self.limit
            && self
                .rows
                .last_key_value()
                .is_some_and(|(last, _)| key >= *last)
        {
            return;
        }
        self.rows.insert(key, T::of(d));
        if self.rows.len() > self.limit {
            self.rows.pop_last();
        }
    }

    fn rows(self) -> Vec<T> {
        self.rows.into_values().collect()
    }
}

impl NatsStore {
    /// Answers `f` from the view once it holds what `reads` name: a host's own view after a
    /// barrier, or a client's fresh read of them.
    pub(super) async fn read_view<R>(
        &self,
        reads: &[Read<'_>],
        f: impl FnOnce(&View) -> R,
    ) -> StoreResult<R> {
        if self.follows() {
            self.barrier().await?;
            let view = self.view()?;
            return Ok(f(&view));
        }
        let view = self.snapshot(reads).await?;
        Ok(f(&view))
    }

    /// Every dispatch record of the stream with where it is and its sequence, read from the
    /// server page by page (cross-thread reads: a host's view holds live work only): the
    /// threads' trees first, then the archive, skipping archived copies of ids the trees hold
    /// (the tree's record is the newer; see `fetch`). The ids of the trees are kept while the
    /// archive is read: as many as the trees hold records, which the archiver keeps to live
    /// work and recently settled records.
    async fn each_dispatch(&self, mut each: impl FnMut(Held, u64, &Stored)) -> StoreResult<()> {
        let prefix = self.prefix().to_owned();
        let in_tree = self
            .each_tree_dispatch(|seq, d| each(Held::Tree, seq, d))
            .await?;
        let archives = Key::archives(&prefix);
        self.scan(Some(&archives), |batch| {
            for got in &batch.messages {
                let Some(key @ Key::Archive(..)) = Key::parse(&prefix, &got.subject) else {
                    continue;
                };
                if matches!(&key, Key::Archive(_, id) if in_tree.contains(id)) {
                    continue;
                }
                if let Ok(Record::Dispatch(_, _, Some(stored))) = key.decode(&got.payload)
                    && stored.dispatch.status.is_terminal()
                {
                    each(Held::Archive, got.seq, &stored);
                }
            }
        })
        .await
    }

    /// Every dispatch record in the threads' trees (live work and the records settled within
    /// `archive_after`) with its sequence, read from the server page by page; returns the ids
    /// it saw, tombstones included.
    async fn each_tree_dispatch(
        &self,
        mut each: impl FnMut(u64, &Stored),
    ) -> StoreResult<HashSet<String>> {
        let prefix = self.prefix().to_owned();
        let mut in_tree: HashSet<String> = HashSet::new();
        let trees = format!("{prefix}.th.*.d.*");
        self.scan(Some(&trees), |batch| {
            for got in &batch.messages {
                let Some(key @ Key::Dispatch(..)) = Key::parse(&prefix, &got.subject) else {
                    continue;
                };
                if let Key::Dispatch(_, id) = &key {
                    in_tree.insert(id.clone());
                }
                // Tombstones and damaged records are not listed (a read by id reports the
                // latter).
                if let Ok(Record::Dispatch(_, _, Some(stored))) = key.decode(&got.payload) {
                    each(got.seq, &stored);
                }
            }
        })
        .await?;
        Ok(in_tree)
    }

    pub(super) async fn load_dispatch(&self, id: &str) -> StoreResult<Option<Dispatch>> {
        if self.follows() {
            self.barrier().await?;
            if let Some(s) = self.view()?.dispatch(id)? {
                return Ok(Some(s.dispatch.clone()));
            }
        }
        // Not live (or not followed): read it.
        let view = self.snapshot(&[Read::Dispatch(id)]).await?;
        Ok(view.dispatch(id)?.map(|s| s.dispatch.clone()))
    }

    /// A page of `list` (`T` = [`Dispatch`]) or `list_rows` ([`DispatchRow`]): the page holds
    /// only what `T` keeps of each record read.
    pub(super) async fn list_dispatches<T: Listed>(
        &self,
        filter: &ListFilter,
    ) -> StoreResult<Vec<T>> {
        let mut page = Page::<T>::new(filter);
        match &filter.thread {
            None => {
                self.each_dispatch(|_, _, s| page.offer(&s.dispatch))
                    .await?
            }
            Some(thread) => {
                let view = self.snapshot(&[Read::Thread(thread)]).await?;
                view.all().for_each(|s| page.offer(&s.dispatch));
            }
        }
        Ok(page.rows())
    }

    pub(super) async fn count_dispatches(&self) -> StoreResult<Vec<StatusCount>> {
        let mut counts: BTreeMap<(String, Status), u64> = BTreeMap::new();
        self.each_dispatch(|_, _, s| {
            *counts
                .entry((s.dispatch.agent.clone(), s.dispatch.status))
                .or_default() += 1
        })
        .await?;
        Ok(status_counts(counts))
    }

    /// The live statuses' counts: from a host's view (which holds live work), or from the
    /// threads' trees (never the archive, which holds settled records only).
    pub(super) async fn count_live_dispatches(&self) -> StoreResult<Vec<StatusCount>> {
        let mut counts: BTreeMap<(String, Status), u64> = BTreeMap::new();
        let mut count = |d: &Dispatch| {
            if !d.status.is_terminal() {
                *counts.entry((d.agent.clone(), d.status)).or_default() += 1;
            }
        };
        if self.follows() {
            self.barrier().await?;
            self.view()?.all().for_each(|s| count(&s.dispatch));
        } else {
            self.each_tree_dispatch(|_, s| count(&s.dispatch)).await?;
        }
        Ok(status_counts(counts))
    }

    pub(super) async fn list_terminal_dispatches(
        &self,
        limit: usize,
        offset: usize,
    ) -> StoreResult<Vec<Dispatch>> {
        let limit = crate::store::rules::page(limit);
        let keep = offset.saturating_add(limit);
        // The first `offset + limit` by completion, held in a bounded map while reading.
        let mut rows: BTreeMap<(u64, String), Dispatch> = BTreeMap::new();
        self.each_dispatch(|_, _, s| {
            let d = &s.dispatch;
            let Some(at) = d.completed_at.filter(|_| d.status.is_terminal()) else {
                return;
            };
            let key = (at, d.id.clone());
            if rows.len() >= keep && rows.last_key_value().is_some_and(|(last, _)| key >= *last) {
                return;
            }
            rows.insert(key, d.clone());
            if rows.len() > keep {
                rows.pop_last();
            }
        })
        .await?;
        Ok(rows.into_values().skip(offset).take(limit).collect())
    }

    /// Purges settled records completed before `older_than`, found by reading the dispatch
    /// subjects (records written with a TTL expire by themselves; this serves an explicit
    /// purge): a record in its thread's tree is tombstoned (a write, so the tree's last
    /// sequence only moves forward), an archived copy deleted. The waitpoints of a purged
    /// record go with it, from where its record was: from its tree once the record's tombstone
    /// follows them there, or from the archive. At most `PURGE_PER_CALL` per call, the rest at
    /// the next.
    pub(super) async fn purge_settled(&self, older_than: u64) -> StoreResult<usize> {
        let mut doomed: Vec<(u64, String, String)> = Vec::new();
        let mut archived: Vec<u64> = Vec::new();
        // Per thread, the purged dispatches with waitpoints, by where their record was.
        let mut with_waitpoints: BTreeMap<(Held, String), HashSet<String>> = BTreeMap::new();
        self.each_dispatch(|held, seq, s| {
            let d = &s.dispatch;
            if doomed.len() + archived.len() < PURGE_PER_CALL
                && d.status.is_terminal()
                && d.completed_at.is_some_and(|at| at < older_than)
            {
                match held {
                    Held::Tree => doomed.push((seq, d.thread.clone(), d.id.clone())),
                    Held::Archive => archived.push(seq),
                }
                if s.waitpoints {
                    with_waitpoints
                        .entry((held, d.thread.clone()))
                        .or_default()
                        .insert(d.id.clone());
                }
            }
        })
        .await?;
        let mut purged = 0;
        for seq in archived {
            // Deleted by sequence: a copy archived again since (a newer record) stays.
            if self.delete_seq(seq).await? {
                purged += 1;
            }
        }
        let tombstone = |(seq, thread, id): &(u64, String, String)| Write {
            key: Key::Dispatch(thread.clone(), id.clone()),
            // A settled record never changes again, so its own subject's sequence is the
            // only expectation: another host purging it first is the one conflict.
            expect: Expect::Subject(*seq),
            payload: bytes::Bytes::new(),
            record: Record::Dispatch(thread.clone(), id.clone(), None),
        };
        for chunk in doomed.chunks(MAX_BATCH) {
            match self
                .commit(chunk.iter().map(tombstone).collect(), false)
                .await
            {
                Ok(()) => purged += chunk.len(),
                Err(CommitError::Store(e)) => return Err(e),
                // Some were purged by another host meanwhile: one by one.
                Err(CommitError::Conflict) => {
                    for one in chunk {
                        match self.commit(vec![tombstone(one)], false).await {
                            Ok(()) => purged += 1,
                            Err(CommitError::Conflict) => {}
                            Err(CommitError::Store(e)) => return Err(e),
                        }
                    }
                }
            }
        }
        let prefix = self.prefix().to_owned();
        for ((held, thread), ids) in with_waitpoints {
            let filter = match held {
                Held::Tree => Key::waitpoints_of(&prefix, &thread),
                Held::Archive => Key::archived_waitpoints_of(&prefix, &thread),
            };
            for (subject, (seq, payload)) in self.last_of_each(&filter).await? {
                let Some(key) = Key::parse(&prefix, &subject) else {
                    continue;
                };
                if let Ok(Record::Waitpoint(_, _, w)) = key.decode(&payload)
                    && ids.contains(&w.dispatch)
                {
                    self.delete_seq(seq).await?;
                }
            }
        }
        Ok(purged)
    }

    pub(super) async fn epoch_of(&self, thread: &str) -> StoreResult<u64> {
        self.read_view(&[Read::Log(thread)], |view| Ok(view.thread(thread)?.epoch))
            .await?
    }

    pub(super) async fn threads_with_queued_work(&self) -> StoreResult<Vec<String>> {
        self.read_view(&[Read::All], |view| {
            view.all()
                .filter(|s| s.dispatch.status == Status::Queued)
                .map(|s| s.dispatch.thread.clone())
                .collect::<BTreeSet<String>>()
                .into_iter()
                .collect()
        })
        .await
    }

    pub(super) async fn any_live_work(&self) -> StoreResult<bool> {
        self.read_view(&[Read::All], View::has_live).await
    }
}

/// Count rows from a map ordered by agent, then status.
fn status_counts(counts: BTreeMap<(String, Status), u64>) -> Vec<StatusCount> {
    counts
        .into_iter()
        .map(|((agent, status), count)| StatusCount {
            agent,
            status,
            count,
        })
        .collect()
}
