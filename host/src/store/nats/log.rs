//! The thread log of the NATS backend.
//!
//! Each entry is its own subject `<p>.e.<thread>.<seq>` (payload: the append time as 8
//! big-endian bytes, then the entry). An append is one atomic batch of the thread record, with
//! its `latest` moved on, and the entry, so `reserved == latest` and nothing is visible out of
//! order or half-written. A guest's fence is checked against the thread record's holder (a copy
//! of the claim written with it) and epoch, which the same batch names by sequence.

use async_trait::async_trait;
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::StreamExt;

use super::keys::Key;
use super::mailbox::{put_thread, supersede_writes};
use super::view::Record;
use super::{NatsStore, Plan, Write};
use crate::store::model::{Fence, LogEntry, Watermarks};
use crate::store::{REASON_STALE_EPOCH, SequenceStore, StoreError, StoreResult};

/// The page size of `read` when the caller gives 0.
const DEFAULT_READ: usize = 1000;
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
        // Unfenced writers (the host, the CLI) may not have this thread in view yet.
        if fence.is_none() {
            self.thread_record(thread).await?;
        }
        self.run(|view, now, _| {
            let (tseq, mut t) = view.thread(thread)?;
            if let Some(fence) = fence {
                let (dseq, stored) = view.dispatch(&fence.dispatch)?;
                let Some(stored) = stored else {
                    return Ok(Plan::Refuse(Err(StoreError::NotFound {
                        id: fence.dispatch.clone(),
                    })));
                };
                let d = &stored.d;
                if d.claim.is_none() {
                    return Ok(Plan::Refuse(Err(StoreError::NotClaimed {
                        id: d.id.clone(),
                        status: d.status,
                    })));
                }
                if d.thread != thread {
                    return Ok(Plan::Done(Err(StoreError::Invalid(format!(
                        "dispatch `{}` belongs to thread `{}`, not `{thread}`",
                        d.id, d.thread
                    )))));
                }
                // A fenced append needs a live lease: the thread record's copy of the claim.
                let holds = t.holder.as_ref().is_some_and(|h| {
                    h.id == fence.dispatch && h.token == fence.token && h.lease_until >= now
                });
                if !holds || d.epoch != fence.epoch {
                    return Ok(Plan::Refuse(Err(StoreError::LostClaim {
                        id: d.id.clone(),
                    })));
                }
                if d.epoch < t.epoch {
                    let error = StoreError::StaleEpoch {
                        id: d.id.clone(),
                        dispatch: d.epoch,
                        thread: t.epoch,
                    };
                    let settled = Some((fence.token.clone(), "supersede".to_owned()));
                    let (writes, _) =
                        supersede_writes(view, dseq, d.clone(), now, REASON_STALE_EPOCH, settled)?;
                    return Ok(Plan::Write(writes, Err(error), true));
                }
            }
            if let Some(expected) = expected
                && t.latest != expected
            {
                return Ok(Plan::Refuse(Err(StoreError::Conflict { latest: t.latest })));
            }
            let seq = t.latest + 1;
            t.latest = seq;
            let mut payload = BytesMut::with_capacity(8 + entry.len());
            payload.put_u64(now);
            payload.put_slice(entry);
            let writes = vec![
                put_thread(thread, tseq, t)?,
                Write {
                    key: Key::Entry(thread.to_owned(), seq),
                    expect: 0,
                    payload: payload.freeze(),
                    record: Record::LogEntry,
                },
            ];
            Ok(Plan::Write(writes, Ok(seq), false))
        })
        .await
    }

    /// The thread record as the server holds it now (applied to the view).
    pub(super) async fn thread_record(&self, thread: &str) -> StoreResult<super::view::ThreadRec> {
        let key = Key::Thread(thread.to_owned());
        if let Some((seq, payload)) = self.get_last(&key.subject(self.prefix())).await? {
            match key.decode(&payload) {
                Ok(record) => self.view()?.apply(seq, record),
                Err((key, reason)) => return Err(StoreError::Corrupt { key, reason }),
            }
        }
        Ok(self.view()?.thread(thread)?.1)
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
        self.purge_below(&Key::entries_of(self.prefix(), thread), seq + 1)
            .await
    }

    async fn purge_below(&self, filter: &str, below: u64) -> StoreResult<()> {
        self.purge(serde_json::json!({ "filter": filter, "seq": below }))
            .await
    }

    fn decode_entry(&self, thread: &str, seq: u64, payload: &Bytes) -> StoreResult<LogEntry> {
        if payload.len() < 8 {
            return Err(StoreError::Corrupt {
                key: format!("log/{thread}/{seq}"),
                reason: format!("entry of {} bytes has no header", payload.len()),
            });
        }
        let mut at = [0u8; 8];
        at.copy_from_slice(&payload[..8]);
        Ok(LogEntry {
            seq,
            data: payload[8..].to_vec(),
            appended_at: u64::from_be_bytes(at),
        })
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

    async fn read(&self, thread: &str, after: u64, limit: usize) -> StoreResult<Vec<LogEntry>> {
        let limit = if limit == 0 { DEFAULT_READ } else { limit };
        let t = self.thread_record(thread).await?;
        let first = after.max(t.trimmed).saturating_add(1);
        if after >= t.latest || first > t.latest {
            return Ok(Vec::new());
        }
        let last = t
            .latest
            .min(first.saturating_add(limit as u64).saturating_sub(1));
        let prefix = self.prefix().to_owned();
        let fetched: Vec<StoreResult<Option<(u64, Bytes)>>> =
            futures_util::stream::iter(first..=last)
                .map(|seq| {
                    let subject = Key::Entry(thread.to_owned(), seq).subject(&prefix);
                    async move {
                        self.get_last(&subject)
                            .await
                            .map(|found| found.map(|(_, payload)| (seq, payload)))
                    }
                })
                .buffered(READ_CONCURRENCY)
                .collect()
                .await;
        let mut out = Vec::with_capacity(fetched.len());
        for item in fetched {
            // A missing entry was trimmed after the watermark was read.
            if let Some((seq, payload)) = item? {
                out.push(self.decode_entry(thread, seq, &payload)?);
            }
        }
        Ok(out)
    }

    async fn latest(&self, thread: &str) -> StoreResult<u64> {
        Ok(self.thread_record(thread).await?.latest)
    }

    async fn watermarks(&self, thread: &str) -> StoreResult<Watermarks> {
        let t = self.thread_record(thread).await?;
        Ok(Watermarks {
            reserved: t.latest,
            latest: t.latest,
            trimmed: t.trimmed,
        })
    }

    async fn trim(&self, thread: &str, up_to: u64) -> StoreResult<()> {
        self.thread_record(thread).await?;
        let cut = self
            .run(|view, _, _| {
                let (tseq, mut t) = view.thread(thread)?;
                let cut = up_to.min(t.latest);
                if cut <= t.trimmed {
                    return Ok(Plan::Done(Ok(None)));
                }
                t.trimmed = cut;
                Ok(Plan::Write(
                    vec![put_thread(thread, tseq, t)?],
                    Ok(Some(cut)),
                    false,
                ))
            })
            .await?;
        match cut {
            Some(cut) => self.drop_entries(thread, cut).await,
            None => Ok(()),
        }
    }

    async fn delete(&self, thread: &str) -> StoreResult<()> {
        self.thread_record(thread).await?;
        let cut = self
            .run(|view, _, _| {
                let (tseq, mut t) = view.thread(thread)?;
                if t.latest == 0 || t.trimmed == t.latest {
                    return Ok(Plan::Done(Ok(t.latest)));
                }
                t.trimmed = t.latest;
                let cut = t.latest;
                Ok(Plan::Write(
                    vec![put_thread(thread, tseq, t)?],
                    Ok(cut),
                    false,
                ))
            })
            .await?;
        self.drop_entries(thread, cut).await
    }
}
