//! The read-only queries of the NATS backend's mailbox. A host answers from its view once it
//! caught up with the stream (a barrier); a client reads what the query names from the server
//! (see `fetch`), and lists across all threads by reading the dispatch subjects page by page,
//! keeping only one page of rows in memory.

use std::collections::{BTreeMap, BTreeSet};

use super::NatsStore;
use super::fetch::Read;
use super::keys::Key;
use super::view::{Record, View};
use crate::store::StoreResult;
use crate::store::model::{Dispatch, ListCursor, ListFilter, Status, StatusCount};

/// The page size of `list` and `list_terminal` when the caller gives 0.
const DEFAULT_PAGE: usize = 100;

/// The first `limit` rows after the filter's cursor, in list order, holding no more than
/// `limit` rows at any time whatever the input's size.
struct Page<'f> {
    filter: &'f ListFilter,
    limit: usize,
    rows: BTreeMap<ListCursor, Dispatch>,
}

impl<'f> Page<'f> {
    fn new(filter: &'f ListFilter) -> Page<'f> {
        let limit = if filter.limit == 0 {
            DEFAULT_PAGE
        } else {
            filter.limit
        };
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
        self.rows.insert(key, d.clone());
        if self.rows.len() > self.limit {
            self.rows.pop_last();
        }
    }

    fn rows(self) -> Vec<Dispatch> {
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

    /// Every dispatch record of the stream, page by page (a client's cross-thread reads).
    async fn each_dispatch(&self, mut each: impl FnMut(&Dispatch)) -> StoreResult<()> {
        let prefix = self.prefix().to_owned();
        let filter = format!("{prefix}.th.*.d.*");
        self.scan(Some(&filter), |batch| {
            for got in &batch.messages {
                let Some(key @ Key::Dispatch(..)) = Key::parse(&prefix, &got.subject) else {
                    continue;
                };
                // Tombstones and damaged records are not listed (a read by id reports the
                // latter).
                if let Ok(Record::Dispatch(_, _, Some(stored))) = key.decode(&got.payload) {
                    each(&stored.d);
                }
            }
        })
        .await
    }

    pub(super) async fn load_dispatch(&self, id: &str) -> StoreResult<Option<Dispatch>> {
        self.read_view(&[Read::Dispatch(id)], |view| {
            Ok(view.dispatch(id)?.map(|s| s.d.clone()))
        })
        .await?
    }

    pub(super) async fn list_dispatches(&self, filter: &ListFilter) -> StoreResult<Vec<Dispatch>> {
        let mut page = Page::new(filter);
        match &filter.thread {
            None if !self.follows() => self.each_dispatch(|d| page.offer(d)).await?,
            None => {
                self.read_view(&[], |view| view.all().for_each(|s| page.offer(&s.d)))
                    .await?
            }
            Some(thread) => {
                self.read_view(&[Read::Thread(thread)], |view| {
                    view.all().for_each(|s| page.offer(&s.d))
                })
                .await?
            }
        }
        Ok(page.rows())
    }

    pub(super) async fn count_dispatches(&self) -> StoreResult<Vec<StatusCount>> {
        let mut counts: BTreeMap<(String, Status), u64> = BTreeMap::new();
        let mut count = |d: &Dispatch| *counts.entry((d.agent.clone(), d.status)).or_default() += 1;
        if self.follows() {
            self.read_view(&[], |view| view.all().for_each(|s| count(&s.d)))
                .await?;
        } else {
            self.each_dispatch(count).await?;
        }
        Ok(counts
            .into_iter()
            .map(|((agent, status), count)| StatusCount {
                agent,
                status,
                count,
            })
            .collect())
    }

    pub(super) async fn list_terminal_dispatches(
        &self,
        limit: usize,
        offset: usize,
    ) -> StoreResult<Vec<Dispatch>> {
        let limit = if limit == 0 { DEFAULT_PAGE } else { limit };
        self.read_view(&[Read::All], |view| {
            let mut rows: Vec<&Dispatch> = view
                .all()
                .map(|s| &s.d)
                .filter(|d| d.status.is_terminal() && d.completed_at.is_some())
                .collect();
            rows.sort_by(|a, b| (a.completed_at, &a.id).cmp(&(b.completed_at, &b.id)));
            rows.into_iter().skip(offset).take(limit).cloned().collect()
        })
        .await
    }

    pub(super) async fn epoch_of(&self, thread: &str) -> StoreResult<u64> {
        self.read_view(&[Read::Log(thread)], |view| Ok(view.thread(thread)?.epoch))
            .await?
    }

    pub(super) async fn threads_with_queued_work(&self) -> StoreResult<Vec<String>> {
        self.read_view(&[Read::All], |view| {
            view.all()
                .filter(|s| s.d.status == Status::Queued)
                .map(|s| s.d.thread.clone())
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
