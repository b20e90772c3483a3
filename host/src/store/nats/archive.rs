//! The archive of the NATS backend: settled dispatch records move out of their threads' trees,
//! so that a starting host, which reads the trees (see `watcher`), does not read what the
//! stream retains.
//!
//! A settled record never changes again (a retry enqueues a new dispatch; a purge writes a
//! tombstone). Some time after it settled ([`NatsConfig::archive_after`]), a host's sweep
//! (`reclaim_expired`) moves it, a page of the trees' dispatch subjects per sweep:
//!
//! 1. It copies the record to `<p>.ar.<thread>.<id>`, outside the tree, with what remains of
//!    the retention as its `Nats-TTL`. The copy expects the record's own subject in the tree
//!    to still end at the sequence read, so a record tombstoned or moved by another host
//!    meanwhile is neither copied again nor brought back after a purge.
//! 2. It rewrites the thread record, fenced by the tree like any write. The tree's last
//!    sequence is every writer's fence: deleting the tree's last message would move it back to
//!    an earlier value, and a writer that decided on the tree as it was then would succeed
//!    (an ABA). After this write, no record being archived is the tree's last message.
//! 3. It deletes the tree's message at the sequence read, and only that one (never a newer
//!    message of the subject).
//!
//! A record that says its dispatch has waitpoints (`Stored::waitpoints`, set by the write that
//! ended it) takes them along: one read of the thread's waitpoint subjects finds them, each is
//! copied to `<p>.aw.<thread>.<id>` (expecting its own subject in the tree as read, with the
//! same TTL) before the record is, and deleted from the tree (after step 2) before the record
//! is. A crash in between leaves the record in its tree, and the next pass moves what is left.
//!
//! A crash between steps leaves a record in both places; readers prefer the tree's (see
//! `fetch`), and the next pass finishes the move. Several hosts archiving one thread at once
//! copy the same bytes, and the second delete finds nothing.
//!
//! [`NatsConfig::archive_after`]: super::NatsConfig::archive_after

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;

use async_nats::HeaderMap;
use bytes::Bytes;
use serde_json::json;

use super::NatsStore;
use super::commit::{CommitError, Plan, put_thread};
use super::fetch::{PAGE, PAGE_BYTES, Read};
use super::jetstream::stored_seq;
use super::keys::Key;
use super::view::Record;
use crate::store::StoreResult;

/// A settled record of a tree, to be archived.
struct Settled {
    /// The stream sequence of its message in the tree.
    seq: u64,
    id: String,
    completed_at: Option<u64>,
    /// The message as read (copied byte for byte).
    payload: Bytes,
    /// Whether the record says its dispatch has waitpoints.
    waitpoints: bool,
}

/// A waitpoint of a thread's tree, as read for the archiver.
struct TreeWaitpoint {
    seq: u64,
    id: String,
    payload: Bytes,
}

impl NatsStore {
    /// Archives the settled records, among the next page of the trees' dispatch subjects, that
    /// settled at least [`NatsConfig::archive_after`] before `now` (see the module); returns
    /// how many left their trees. Each call reads one page, from where the previous one
    /// stopped, starting over after the last.
    ///
    /// [`NatsConfig::archive_after`]: super::NatsConfig::archive_after
    pub async fn archive_settled(&self, now: u64) -> StoreResult<usize> {
        let prefix = self.prefix().to_owned();
        let from = self.inner.archive_from.load(Ordering::Relaxed).max(1);
        let batch = self
            .get_batch(json!({
                "seq": from,
                "batch": PAGE,
                "max_bytes": PAGE_BYTES,
                "next_by_subj": format!("{prefix}.th.*.d.*"),
            }))
            .await?;
        let next = match batch.messages.last() {
            Some(last) if batch.pending > 0 => last.seq + 1,
            _ => 1,
        };
        self.inner.archive_from.store(next, Ordering::Relaxed);
        let grace = self.inner.archive_after_ms;
        let mut by_thread: BTreeMap<String, Vec<Settled>> = BTreeMap::new();
        for got in batch.messages {
            let Some(key @ Key::Dispatch(..)) = Key::parse(&prefix, &got.subject) else {
                continue;
            };
            // Tombstones and damaged records stay where they are.
            let Ok(Record::Dispatch(thread, id, Some(stored))) = key.decode(&got.payload) else {
                continue;
            };
            let d = &stored.dispatch;
            if !d.status.is_terminal() || d.completed_at.unwrap_or(0).saturating_add(grace) > now {
                continue;
            }
            by_thread.entry(thread).or_default().push(Settled {
                seq: got.seq,
                id,
                completed_at: d.completed_at,
                waitpoints: stored.waitpoints,
                payload: got.payload,
            });
        }
        let mut archived = 0;
        for (thread, records) in by_thread {
            archived += self.archive_thread(&thread, records, now).await?;
        }
        Ok(archived)
    }

    /// Moves settled records of one thread to the archive (see the module).
    async fn archive_thread(
        &self,
        thread: &str,
        records: Vec<Settled>,
        now: u64,
    ) -> StoreResult<usize> {
        let prefix = self.prefix().to_owned();
        let mut waitpoints = if records.iter().any(|r| r.waitpoints) {
            self.tree_waitpoints(thread).await?
        } else {
            HashMap::new()
        };
        // Per record moved: its sequence, and its waitpoints' sequences in the tree.
        let mut copied: Vec<(u64, Vec<u64>)> = Vec::new();
        for r in records {
            let ttl = self.inner.retention_secs.map(|retention| {
                let age = r.completed_at.map_or(0, |at| now.saturating_sub(at) / 1000);
                format!("{}s", retention.saturating_sub(age).max(1))
            });
            let mut moved = Vec::new();
            for w in waitpoints.remove(&r.id).unwrap_or_default() {
                let own = Key::Waitpoint(thread.to_owned(), w.id.clone()).subject(&prefix);
                let to = Key::ArchivedWaitpoint(thread.to_owned(), w.id).subject(&prefix);
                // A waitpoint of an ended dispatch never changes; one that left the tree was
                // moved by another host.
                if self
                    .copy_out(&own, w.seq, to, w.payload, ttl.as_deref())
                    .await?
                {
                    moved.push(w.seq);
                }
            }
            let own = Key::Dispatch(thread.to_owned(), r.id.clone()).subject(&prefix);
            let to = Key::Archive(thread.to_owned(), r.id.clone()).subject(&prefix);
            // Not copied: the record changed or left the tree since it was read.
            if self
                .copy_out(&own, r.seq, to, r.payload, ttl.as_deref())
                .await?
            {
                copied.push((r.seq, moved));
            }
        }
        if copied.is_empty() {
            return Ok(0);
        }
        // A fenced write after the records, so that none of them is the tree's last message.
        self.run(&[Read::Thread(thread)], |view, _, _| {
            let mut rec = view.thread(thread)?;
            // The last agent outlives the claimed records that said it.
            if let Some(agent) = view.last_agent(thread) {
                rec.agent = Some(agent);
            }
            Ok(Plan::Write {
                writes: vec![put_thread(view, thread, rec)?],
                answer: Ok(()),
                wake: false,
            })
        })
        .await?;
        let mut deleted = 0;
        for (seq, moved) in copied {
            // The waitpoints first: a record still in its tree is moved again by the next pass.
            for w in moved {
                self.delete_seq(w).await?;
            }
            if self.delete_seq(seq).await? {
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    /// Copies the message at `seq` of the tree subject `own` to `to` (outside the tree), only
    /// if `own` still ends at `seq`, with `ttl` as its `Nats-TTL`. Returns whether it copied.
    async fn copy_out(
        &self,
        own: &str,
        seq: u64,
        to: String,
        payload: Bytes,
        ttl: Option<&str>,
    ) -> StoreResult<bool> {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Expected-Last-Subject-Sequence", seq.to_string());
        headers.insert("Nats-Expected-Last-Subject-Sequence-Subject", own);
        if let Some(ttl) = ttl {
            headers.insert("Nats-TTL", ttl);
        }
        let reply = self.request(to, payload, headers).await?;
        match stored_seq(&reply) {
            Ok(_) => Ok(true),
            Err(CommitError::Conflict) => Ok(false),
            Err(CommitError::Store(e)) => Err(e),
        }
    }

    /// The waitpoints of `thread`'s tree by dispatch, as stored now (a damaged record stays
    /// where it is).
    async fn tree_waitpoints(
        &self,
        thread: &str,
    ) -> StoreResult<HashMap<String, Vec<TreeWaitpoint>>> {
        let prefix = self.prefix().to_owned();
        let mut out: HashMap<String, Vec<TreeWaitpoint>> = HashMap::new();
        for (subject, (seq, payload)) in self
            .last_of_each(&Key::waitpoints_of(&prefix, thread))
            .await?
        {
            let Some(key @ Key::Waitpoint(..)) = Key::parse(&prefix, &subject) else {
                continue;
            };
            if let Ok(Record::Waitpoint(_, id, w)) = key.decode(&payload) {
                out.entry(w.dispatch)
                    .or_default()
                    .push(TreeWaitpoint { seq, id, payload });
            }
        }
        Ok(out)
    }
}
