//! The read-only queries of the NATS backend's mailbox: each waits for the view to catch up
//! with the stream (a barrier), then answers from it.

use super::NatsStore;
use crate::store::StoreResult;
use crate::store::model::{Dispatch, ListFilter, Status, StatusCount};

/// The page size of `list` and `list_terminal` when the caller gives 0.
const DEFAULT_PAGE: usize = 100;

impl NatsStore {
    pub(super) async fn load_dispatch(&self, id: &str) -> StoreResult<Option<Dispatch>> {
        self.barrier().await?;
        Ok(self.view()?.dispatch(id)?.map(|s| s.d.clone()))
    }

    pub(super) async fn list_dispatches(&self, filter: &ListFilter) -> StoreResult<Vec<Dispatch>> {
        self.barrier().await?;
        let limit = if filter.limit == 0 {
            DEFAULT_PAGE
        } else {
            filter.limit
        };
        let view = self.view()?;
        let mut rows: Vec<&Dispatch> = view
            .all()
            .map(|s| &s.d)
            .filter(|d| filter.thread.as_ref().is_none_or(|t| *t == d.thread))
            .filter(|d| filter.agent.as_ref().is_none_or(|a| *a == d.agent))
            .filter(|d| filter.statuses.is_empty() || filter.statuses.contains(&d.status))
            .collect();
        rows.sort_by(|a, b| {
            (a.priority, a.created_at, &a.id).cmp(&(b.priority, b.created_at, &b.id))
        });
        Ok(rows
            .into_iter()
            .skip(filter.offset)
            .take(limit)
            .cloned()
            .collect())
    }

    pub(super) async fn count_dispatches(&self) -> StoreResult<Vec<StatusCount>> {
        self.barrier().await?;
        let view = self.view()?;
        let mut counts: std::collections::BTreeMap<(String, Status), u64> = Default::default();
        for s in view.all() {
            *counts.entry((s.d.agent.clone(), s.d.status)).or_default() += 1;
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
        self.barrier().await?;
        let limit = if limit == 0 { DEFAULT_PAGE } else { limit };
        let view = self.view()?;
        let mut rows: Vec<&Dispatch> = view
            .all()
            .map(|s| &s.d)
            .filter(|d| d.status.is_terminal() && d.completed_at.is_some())
            .collect();
        rows.sort_by(|a, b| (a.completed_at, &a.id).cmp(&(b.completed_at, &b.id)));
        Ok(rows.into_iter().skip(offset).take(limit).cloned().collect())
    }

    pub(super) async fn epoch_of(&self, thread: &str) -> StoreResult<u64> {
        self.barrier().await?;
        Ok(self.view()?.thread(thread)?.epoch)
    }

    pub(super) async fn threads_with_queued_work(&self) -> StoreResult<Vec<String>> {
        self.barrier().await?;
        let view = self.view()?;
        let mut threads: Vec<String> = view
            .all()
            .filter(|s| s.d.status == Status::Queued)
            .map(|s| s.d.thread.clone())
            .collect();
        threads.sort();
        threads.dedup();
        Ok(threads)
    }

    pub(super) async fn any_live_work(&self) -> StoreResult<bool> {
        self.barrier().await?;
        Ok(self.view()?.has_live())
    }
}
