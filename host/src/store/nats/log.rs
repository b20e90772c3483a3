//! The thread log of the NATS backend.
//!
//! Each entry is its own subject `<p>.th.<thread>.e.<seq>` in its thread's tree (payload: the
//! append time as 8 big-endian bytes, then the entry). An append is one message fenced by the
//! thread's tree: the sequence it takes, the fence of a guest's claim (the dispatch record, its
//! lease and epoch) and the thread's epoch are all read from the view, judged by the store's
//! rules, and hold at commit, or the append is decided again. So `reserved == latest`, and nothing is visible out of order or
//! half-written. `trimmed` lives in the thread record, and survives a delete as the tombstone
//! that keeps sequences from being reused.

use async_trait::async_trait;
use futures_util::StreamExt;

use super::NatsStore;
use super::commit::{Expect, Plan, Write, put_thread, settled};
use super::effects::{Applied, changed};
use super::fetch::Read;
use super::keys::{Key, decode_entry, encode_entry};
use super::view::Record;
use crate::store::model::{Fence, LogEntry, Status, Watermarks};
use crate::store::rules::{self, ByteBudget, Fenced, Settle};
use crate::store::{SequenceStore, StoreError, StoreResult, check_size};

/// Entries fetched at once by `read`.
const READ_CONCURRENCY: usize = 32;

impl NatsStore {
    async fn append_inner(
        &self,
        thread: &str,
        entry: &[u8],
        expected: Option<u64>,
        fence: Option<&Fence>,
    ) -> StoreResult<u64> {
        if thread.trim().is_empty() {
            return Err(StoreError::Invalid("thread is blank".into()));
        }
        let room = self.room();
        check_size("entry", entry, room.entry, &room.entry_why())?;
        let reads = match fence {
            Some(fence) => vec![Read::Log(thread), Read::Dispatch(&fence.dispatch)],
            None => vec![Read::Log(thread)],
        };
        self.run(&reads, |view, now, _| {
            if let Some(fence) = fence
                && let Some(plan) = Self::fenced(view, thread, fence, now)?
            {
                return Ok(plan);
            }
            let latest = view.latest(thread);
            if let Some(expected) = expected
                && latest != expected
            {
                return Ok(Plan::Refuse(Err(StoreError::Conflict { latest })));
            }
            let seq = latest + 1;
            let write = Write {
                key: Key::Entry(thread.to_owned(), seq),
                expect: Expect::Thread(view.thread_seq(thread)),
                payload: encode_entry(now, entry, None)?,
                record: Record::Entry(thread.to_owned(), seq),
            };
            Ok(Plan::Write {
                writes: vec![write],
                answer: Ok(seq),
                wake: false,
            })
        })
        .await
    }

    /// The fence check of a fenced write to `thread` (the contract, section 4.4), as a fenced
    /// append makes it: `None` when the holder is live, else the plan that answers.
    pub(super) fn fenced<T>(
        view: &crate::store::nats::view::View,
        thread: &str,
        fence: &Fence,
        now: u64,
    ) -> StoreResult<Option<Plan<T>>> {
        let d = view.dispatch(&fence.dispatch)?.map(|s| &s.dispatch);
        let thread_epoch = match d {
            Some(d) => view.thread(&d.thread)?.epoch,
            None => 0,
        };
        Ok(
            match rules::check_fence(d, thread, fence, thread_epoch, now) {
                Fenced::Live => None,
                // A fence naming another thread stays wrong however far the view gets.
                Fenced::Refuse(e @ StoreError::Invalid(_)) => Some(Plan::Done(Err(e))),
                Fenced::Refuse(e) => Some(Plan::Refuse(Err(e))),
                Fenced::Supersede {
                    record,
                    token,
                    error,
                } => {
                    let stored = settled(*record, &token, Settle::Supersede);
                    let Applied { writes, wake } = changed(view, Status::Claimed, stored)?;
                    Some(Plan::Write {
                        writes,
                        answer: Err(error),
                        wake,
                    })
                }
            },
        )
    }

    /// Drops the stored entries at or below `cut` (the watermark already says they are gone).
    async fn drop_entries(&self, thread: &str, cut: u64) -> StoreResult<()> {
        if cut == 0 {
            return Ok(());
        }
        let subject = Key::Entry(thread.to_owned(), cut).subject(self.prefix());
        let Some((seq, _)) = self.get_last(&subject).await? else {
            // Already dropped (an earlier trim or delete got this far).
            return Ok(());
        };
        // Entries of one thread are stored in sequence order, so everything of this thread
        // below the cut's stream sequence is at or below the cut.
        self.purge(serde_json::json!({
            "filter": Key::entries_of(self.prefix(), thread),
            "seq": seq + 1,
        }))
        .await
    }

    /// The thread's watermarks once the view caught up with the stream.
    async fn marks(&self, thread: &str) -> StoreResult<Watermarks> {
        self.read_view(&[Read::Log(thread)], |view| {
            let latest = view.latest(thread);
            Ok(Watermarks {
                reserved: latest,
                latest,
                trimmed: view.thread(thread)?.trimmed,
            })
        })
        .await?
    }

    async fn cut(&self, thread: &str, up_to: Option<u64>) -> StoreResult<()> {
        let cut = self
            .run(&[Read::Log(thread)], |view, _, _| {
                let mut t = view.thread(thread)?;
                let latest = view.latest(thread);
                let cut = up_to.unwrap_or(latest).min(latest);
                if cut <= t.trimmed {
                    return Ok(Plan::Done(Ok(None)));
                }
                t.trimmed = cut;
                Ok(Plan::Write {
                    writes: vec![put_thread(view, thread, t)?],
                    answer: Ok(Some(cut)),
                    wake: false,
                })
            })
            .await?;
        match cut {
            Some(cut) => self.drop_entries(thread, cut).await,
            None => Ok(()),
        }
    }
}

#[async_trait]
impl SequenceStore for NatsStore {
    async fn append(&self, thread: &str, entry: &[u8], fence: Option<&Fence>) -> StoreResult<u64> {
        self.append_inner(thread, entry, None, fence).await
    }

    async fn append_expected(
        &self,
        thread: &str,
        entry: &[u8],
        expected_latest: u64,
        fence: Option<&Fence>,
    ) -> StoreResult<u64> {
        self.append_inner(thread, entry, Some(expected_latest), fence)
            .await
    }

    async fn read_within(
        &self,
        thread: &str,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> StoreResult<Vec<LogEntry>> {
        let limit = crate::store::rules::log_read(limit);
        let marks = self.marks(thread).await?;
        let first = after.max(marks.trimmed).saturating_add(1);
        if after >= marks.latest || first > marks.latest {
            return Ok(Vec::new());
        }
        let last = marks
            .latest
            .min(first.saturating_add(limit as u64).saturating_sub(1));
        let prefix = self.prefix().to_owned();
        let mut budget = ByteBudget::new(Some(max_bytes));
        let in_flight = budget.in_flight(self.room().entry, READ_CONCURRENCY);
        let mut fetched = futures_util::stream::iter(first..=last)
            .map(|seq| {
                let subject = Key::Entry(thread.to_owned(), seq).subject(&prefix);
                async move {
                    self.get_last(&subject)
                        .await
                        .map(|found| found.map(|(_, payload)| (seq, payload)))
                }
            })
            .buffered(in_flight);
        let mut out = Vec::new();
        while budget.open()
            && let Some(item) = fetched.next().await
        {
            // A missing entry was trimmed after the watermark was read.
            if let Some((seq, payload)) = item? {
                let entry = decode_entry(thread, seq, &payload)?;
                budget.take(entry.data.len());
                out.push(entry);
            }
        }
        Ok(out)
    }

    async fn latest(&self, thread: &str) -> StoreResult<u64> {
        Ok(self.marks(thread).await?.latest)
    }

    async fn watermarks(&self, thread: &str) -> StoreResult<Watermarks> {
        self.marks(thread).await
    }

    async fn trim(&self, thread: &str, up_to: u64) -> StoreResult<()> {
        self.cut(thread, Some(up_to)).await
    }

    async fn delete(&self, thread: &str) -> StoreResult<()> {
        self.cut(thread, None).await
    }

    fn max_entry(&self) -> u64 {
        self.room().entry
    }
}
