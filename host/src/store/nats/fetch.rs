//! Reading straight from the stream, for an instance that does not follow it.
//!
//! A host follows the whole stream into its view (see `watcher`). A short-lived client (every
//! `homing` command but `run`) must not: replaying the stream costs time in proportion to what
//! it retains. Such an instance reads, for each operation, only the records the operation
//! decides on, with JetStream's direct gets, into a view of its own:
//!
//! - a thread: the last sequence of its subject tree first (the fence its write will name),
//!   then its thread record and the last message of each of its dispatch and waitpoint
//!   subjects in one `multi_last` request (paged when the thread has more subjects than one
//!   such request answers);
//! - a dispatch by id: its thread (the id index of a caller-chosen id, else one lookup of the
//!   subject `<p>.th.*.d.<id>`, then of `<p>.ar.*.<id>`), then that thread's fence, thread
//!   record and waitpoints, and the one record;
//! - a waitpoint by id: one lookup of `<p>.th.*.w.<id>` (then of `<p>.aw.*.<id>`), then its
//!   thread's fence, thread record and waitpoints, and its dispatch's record;
//! - a thread log: the fence, the thread record and waitpoints, and the last entry's subject.
//!
//! Every read of a thread takes its waitpoints along (in the same request as its thread
//! record): any write that ends a dispatch cancels the dispatch's pending waitpoints with it.
//!
//! The fence is read *before* the records: a write naming it is stored only if nothing of the
//! thread changed since, and then everything read after it is exactly the thread's state at
//! it. A record that changed in between makes the write fail and the operation read again. A
//! refusal (not found, not queued) is decided on records at least as new as the request, so
//! it needs no barrier. Operations over every thread (claims, sweeps, counts) read the whole
//! stream once, in pages; only a host does those in earnest.
//!
//! # On a cluster
//!
//! With more than one replica ([`NatsConfig::replicas`]), a direct get is answered by any
//! replica that has nearly caught up with the stream, the leader or a follower, and a follower
//! lags behind the leader by what it has not applied yet. Two reads of one decision may then be
//! answered by two replicas, and a fence from a current one with records from a lagging one
//! would let a write expecting that fence be stored on records older than it: a settled
//! dispatch read as still queued, and claimed again. So on a cluster:
//!
//! - every read of one message (the fences, the lookups by id, one record) goes to the stream's
//!   leader, through the non-direct `$JS.API.STREAM.MSG.GET` API. Only the leader answers it,
//!   and only once it applied everything it committed, so it holds every write a client was
//!   told was stored (a refusal decided on it is as new as the request, as on one server);
//! - a thread's records are still one direct `multi_last` (the non-direct API serves one message
//!   a request). Its end-of-batch says up to which stream sequence the replica that answered
//!   had applied the stream (`Nats-UpTo-Sequence`): an answer from a replica short of the
//!   thread's fence is asked for again, and one that found nothing, which says nothing of where
//!   its replica stands, is checked with the leader;
//! - a thread with more subjects than one `multi_last` serves has its tree read page by page in
//!   sequence order, which counts once its pages reached the fence (a page from a replica
//!   behind it ends the read short of it).
//!
//! Reads over every thread (`Read::All`, lists, counts, the archiver's pages) stay direct and
//! unchecked: they apply the stream in sequence order, and a thread's fence in such a view is
//! the last message of the thread they read, so a lagging replica gives an older view, never
//! one whose fence is newer than its records. One server (`replicas = 1`) answers every read
//! from its one store: nothing of this applies there, and every read is a direct get.
//!
//! [`NatsConfig::replicas`]: super::NatsConfig::replicas
//!
//! # The archive
//!
//! Settled records move out of their thread's tree into the archive (`archive`). Every read of
//! dispatch records reads the tree first and the archive after, and a record found in the tree
//! wins: the archiver writes its copy before it deletes the tree's, and any later version of
//! a record is written to the tree, so the tree's is never older and a record being archived
//! is found in one or the other.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_nats::HeaderMap;
use base64::Engine as _;
use bytes::Bytes;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;

use super::NatsStore;
use super::jetstream::unavailable;
use super::keys::Key;
use super::view::{Record, View};
use crate::store::StoreResult;

/// Messages per page of a batched direct get.
pub(super) const PAGE: usize = 1000;
/// Bytes per page of a batched direct get (the server stops a page at this size).
pub(super) const PAGE_BYTES: usize = 8 * 1024 * 1024;
/// The longest pause before asking again for a read a lagging replica answered (a cluster).
const MAX_LAG_PAUSE: Duration = Duration::from_millis(50);

/// What an operation reads before it decides, when the instance does not follow the stream.
#[derive(Debug, Clone, Copy)]
pub(super) enum Read<'a> {
    /// Every record of the stream.
    All,
    /// A thread's record and all its dispatches.
    Thread(&'a str),
    /// A thread's record and its latest log entry.
    Log(&'a str),
    /// One dispatch, its thread's record, and the id index of a caller-chosen id.
    Dispatch(&'a str),
    /// The whole thread of a dispatch.
    ThreadOf(&'a str),
    /// A thread's record and its inbox messages.
    Inbox(&'a str),
    /// The thread record and inbox messages of a dispatch's thread.
    InboxOf(&'a str),
    /// The thread record and latest log entry of a dispatch's thread.
    LogOf(&'a str),
    /// One waitpoint (from its thread's tree, else the archive), its dispatch and its
    /// thread's record.
    Waitpoint(&'a str),
}

/// One message of a direct get.
pub(super) struct Got {
    pub seq: u64,
    pub subject: String,
    pub payload: Bytes,
}

/// The answer to a batched direct get.
#[derive(Default)]
pub(super) struct Batch {
    pub messages: Vec<Got>,
    /// Matching messages the server holds past this page.
    pub pending: u64,
    /// The server answered "too many results" (a `multi_last` over more subjects than it
    /// serves at once).
    pub too_many: bool,
    /// The stream sequence a `multi_last` read up to: the last one the replica that answered
    /// had applied, when the request named none (absent when nothing matched).
    pub upto: Option<u64>,
}

/// The reply to a non-direct message get (`$JS.API.STREAM.MSG.GET`).
#[derive(Deserialize)]
struct MsgGetReply {
    #[serde(default)]
    message: Option<StoredMsg>,
    #[serde(default)]
    error: Option<async_nats::jetstream::Error>,
}

/// The message a non-direct get found.
#[derive(Deserialize)]
struct StoredMsg {
    subject: String,
    seq: u64,
    /// The payload, in base64 (absent when empty).
    #[serde(default)]
    data: Option<String>,
}

/// The message a reply to a non-direct get holds: `None` when the stream holds none that
/// matches.
fn got_of(reply: &[u8]) -> StoreResult<Option<Got>> {
    let parsed: MsgGetReply =
        serde_json::from_slice(reply).map_err(|e| unavailable("message get reply", e))?;
    if let Some(error) = parsed.error {
        if error.error_code() == async_nats::jetstream::ErrorCode::NO_MESSAGE_FOUND {
            return Ok(None);
        }
        return Err(unavailable("message get", error));
    }
    let Some(found) = parsed.message else {
        return Err(unavailable("message get", "a reply with no message"));
    };
    let payload = match found.data {
        None => Bytes::new(),
        Some(data) => Bytes::from(
            base64::engine::general_purpose::STANDARD
                .decode(data.as_bytes())
                .map_err(|e| unavailable("message get reply", e))?,
        ),
    };
    Ok(Some(Got {
        seq: found.seq,
        subject: found.subject,
        payload,
    }))
}

fn header_u64(headers: Option<&async_nats::HeaderMap>, name: &str) -> u64 {
    headers
        .and_then(|h| h.get(name))
        .and_then(|v| v.as_str().parse().ok())
        .unwrap_or(0)
}

impl NatsStore {
    /// One direct-get request answered by several messages (`batch`, `multi_last`), ended by
    /// the server's end-of-batch status.
    pub(super) async fn get_batch(&self, body: serde_json::Value) -> StoreResult<Batch> {
        let client = &self.inner.client;
        let api = format!("$JS.API.DIRECT.GET.{}", self.inner.prefix);
        let inbox = client.new_inbox();
        let mut replies = client
            .subscribe(inbox.clone())
            .await
            .map_err(|e| unavailable("direct get", e))?;
        client
            .publish_with_reply(api, inbox, Bytes::from(body.to_string()))
            .await
            .map_err(|e| unavailable("direct get", e))?;
        let deadline = tokio::time::Instant::now() + self.inner.timeout;
        let mut batch = Batch::default();
        loop {
            let message = match tokio::time::timeout_at(deadline, replies.next()).await {
                Ok(Some(message)) => message,
                Ok(None) => return Err(unavailable("direct get", "the connection closed")),
                Err(_) => return Err(unavailable("direct get", "timed out")),
            };
            if let Some(status) = message.status {
                match status.as_u16() {
                    204 => {
                        let headers = message.headers.as_ref();
                        batch.pending = header_u64(headers, "Nats-Num-Pending");
                        batch.upto = headers
                            .and_then(|h| h.get("Nats-UpTo-Sequence"))
                            .and_then(|v| v.as_str().parse().ok());
                        return Ok(batch);
                    }
                    // Nothing (more) matches.
                    404 => return Ok(batch),
                    413 => {
                        batch.too_many = true;
                        return Ok(batch);
                    }
                    code => {
                        return Err(unavailable(
                            "direct get",
                            format!("status {code}: {}", message.description.unwrap_or_default()),
                        ));
                    }
                }
            }
            let headers = message.headers.as_ref();
            let subject = headers
                .and_then(|h| h.get("Nats-Subject"))
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default();
            batch.messages.push(Got {
                seq: header_u64(headers, "Nats-Sequence"),
                subject,
                payload: message.payload,
            });
        }
    }

    /// The last message of any subject matching `filter` (which may hold wildcards): a direct
    /// get on one server, the stream leader's answer on a cluster (see the module).
    pub(super) async fn get_last_matching(&self, filter: &str) -> StoreResult<Option<Got>> {
        if self.inner.replicated {
            return self.leader_last_matching(filter).await;
        }
        // One message, with no end-of-batch status.
        let api = format!("$JS.API.DIRECT.GET.{}", self.inner.prefix);
        let request = async_nats::Request::new()
            .payload(Bytes::from(json!({ "last_by_subj": filter }).to_string()))
            .timeout(Some(self.inner.timeout));
        let fut = self.inner.client.send_request(api, request);
        let message = match tokio::time::timeout(
            self.inner.timeout + Duration::from_millis(100),
            fut,
        )
        .await
        {
            Ok(Ok(message)) => message,
            Ok(Err(e)) => return Err(unavailable("direct get", e)),
            Err(_) => return Err(unavailable("direct get", "timed out")),
        };
        if let Some(status) = message.status {
            if status.as_u16() == 404 {
                return Ok(None);
            }
            return Err(unavailable(
                "direct get",
                format!(
                    "status {status}: {}",
                    message.description.unwrap_or_default()
                ),
            ));
        }
        let headers = message.headers.as_ref();
        Ok(Some(Got {
            seq: header_u64(headers, "Nats-Sequence"),
            subject: headers
                .and_then(|h| h.get("Nats-Subject"))
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default(),
            payload: message.payload,
        }))
    }

    /// The last message of any subject matching `filter`, as the stream's leader holds it:
    /// the non-direct get, which only the leader answers, and only once it applied what it
    /// committed (a follower's direct answer may lag behind what clients were told is stored).
    async fn leader_last_matching(&self, filter: &str) -> StoreResult<Option<Got>> {
        let api = format!("$JS.API.STREAM.MSG.GET.{}", self.inner.prefix);
        let body = json!({ "last_by_subj": filter, "no_hdr": true }).to_string();
        let reply = self
            .request(api, Bytes::from(body), HeaderMap::new())
            .await?;
        got_of(&reply)
    }

    /// Whether the stream's leader holds no message of any of `filters`.
    async fn none_at_leader(&self, filters: &[String]) -> StoreResult<bool> {
        for filter in filters {
            if self.leader_last_matching(filter).await?.is_some() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The last message of each subject matching `filters`, as of stream sequence `floor` or
    /// later: on a cluster, an answer from a replica that had not applied the stream up to
    /// `floor` is asked for again (see the module). Too many subjects for one request is
    /// answered as the server says (`too_many`), for the caller to read page by page.
    async fn multi_last_from(&self, filters: &[String], floor: u64) -> StoreResult<Batch> {
        let body = json!({ "multi_last": filters, "batch": PAGE });
        if !self.inner.replicated || floor == 0 {
            // One server, or a tree that held nothing at its fence: whatever a replica holds
            // of it is as new as the fence.
            return self.get_batch(body).await;
        }
        let deadline = tokio::time::Instant::now() + self.inner.timeout;
        let mut pause = Duration::from_millis(1);
        loop {
            let batch = self.get_batch(body.clone()).await?;
            let current = match batch.upto {
                Some(upto) => upto >= floor,
                None if batch.too_many => true,
                // Nothing matched where that replica stands, wherever it stands: the leader's
                // nothing is as new as the fence.
                None => self.none_at_leader(filters).await?,
            };
            if current {
                return Ok(batch);
            }
            tracing::debug!(
                floor,
                upto = ?batch.upto,
                "nats: a replica behind the fence answered a read; asking again"
            );
            if tokio::time::Instant::now() + pause >= deadline {
                return Err(unavailable(
                    "direct get",
                    format!("no replica that answered had applied the stream up to {floor}"),
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_LAG_PAUSE);
        }
    }

    /// The last stream sequence of a thread's tree (0 when it holds nothing).
    pub(super) async fn tree_seq(&self, thread: &str) -> StoreResult<u64> {
        let tree = Key::tree(self.prefix(), thread);
        Ok(self
            .get_last_matching(&tree)
            .await?
            .map_or(0, |got| got.seq))
    }

    /// The thread a dispatch id belongs to: the id index of a caller-chosen id, else the one
    /// dispatch subject of that id in any thread. `None` when no record of it exists.
    pub(super) async fn thread_of(&self, id: &str, view: &mut View) -> StoreResult<Option<String>> {
        let prefix = self.prefix().to_owned();
        let index = Key::Id(id.to_owned()).subject(&prefix);
        if let Some((seq, payload)) = self.get_last(&index).await? {
            view.apply_message(&prefix, seq, &index, &payload);
            if let Ok(thread) = String::from_utf8(payload.to_vec()) {
                return Ok(Some(thread));
            }
        }
        // Only a minted id (a UUID) can be without an index record: a caller-chosen id is
        // stored with one, in the same atomic batch as its dispatch.
        if uuid::Uuid::try_parse(id).is_err() {
            return Ok(None);
        }
        // The tree first, then the archive: the archiver copies a record out before it deletes
        // it from the tree, so a record archived meanwhile is found in one or the other.
        for key in [
            Key::Dispatch("*".into(), id.to_owned()),
            Key::Archive("*".into(), id.to_owned()),
        ] {
            // The thread token is the encoding of `*`, not a wildcard: put one in.
            let any = wildcard_thread(&key.subject(&prefix), &prefix);
            if let Some(got) = self.get_last_matching(&any).await?
                && let Some(Key::Dispatch(thread, _) | Key::Archive(thread, _)) =
                    Key::parse(&prefix, &got.subject)
            {
                return Ok(Some(thread));
            }
        }
        Ok(None)
    }

    /// Where waitpoint `id` is: its thread and dispatch when its thread's tree holds it, else
    /// nothing (an archived one is applied to `view` as it is: it belongs to an ended dispatch
    /// and no operation writes it). One lookup of `<p>.th.*.w.<id>`, then of `<p>.aw.*.<id>`:
    /// the archiver copies a waitpoint out before it deletes it from the tree, so one being
    /// archived is found in one or the other.
    async fn waitpoint_home(
        &self,
        id: &str,
        view: &mut View,
    ) -> StoreResult<Option<(String, Option<String>)>> {
        // The store mints every waitpoint id.
        if uuid::Uuid::try_parse(id).is_err() {
            return Ok(None);
        }
        let prefix = self.prefix().to_owned();
        let [tree, archive] = Key::waitpoint_anywhere(&prefix, id);
        if let Some(got) = self.get_last_matching(&tree).await?
            && let Some(Key::Waitpoint(thread, found)) = Key::parse(&prefix, &got.subject)
        {
            // A damaged record is reported by the read of the thread's waitpoints.
            let dispatch = match Key::Waitpoint(thread.clone(), found).decode(&got.payload) {
                Ok(Record::Waitpoint(_, _, w)) => Some(w.dispatch),
                _ => None,
            };
            return Ok(Some((thread, dispatch)));
        }
        if let Some(got) = self.get_last_matching(&archive).await? {
            view.apply_message(&prefix, got.seq, &got.subject, &got.payload);
        }
        Ok(None)
    }

    /// Applies every message of a batch to `view`: those of thread trees first, then archived
    /// copies (which a record of the tree replaces; see [`View::apply_archived`]).
    fn apply_batch(&self, view: &mut View, batch: &Batch) {
        let prefix = self.prefix();
        let archive = [format!("{prefix}.ar."), format!("{prefix}.aw.")];
        for archived in [false, true] {
            for got in &batch.messages {
                if archive.iter().any(|a| got.subject.starts_with(a)) == archived {
                    view.apply_message(prefix, got.seq, &got.subject, &got.payload);
                }
            }
        }
    }

    /// Reads every message of the stream matching `filter` (all when `None`), page by page
    /// from the first sequence, handing each page to `each`.
    pub(super) async fn scan(
        &self,
        filter: Option<&str>,
        mut each: impl FnMut(&Batch),
    ) -> StoreResult<()> {
        let mut from = 1u64;
        loop {
            let mut body = json!({ "seq": from, "batch": PAGE, "max_bytes": PAGE_BYTES });
            if let Some(filter) = filter {
                body["next_by_subj"] = json!(filter);
            }
            let batch = self.get_batch(body).await?;
            let Some(last) = batch.messages.last().map(|m| m.seq) else {
                return Ok(());
            };
            each(&batch);
            if batch.pending == 0 {
                return Ok(());
            }
            from = last + 1;
        }
    }

    /// A thread's record and the last message of each of its waitpoint subjects, of each of
    /// its dispatch subjects, in its tree and in the archive (when `dispatches`), and of each
    /// of its message subjects (when `messages`). Every decision that may end a dispatch reads
    /// its thread's waitpoints (the end cancels the pending ones), and they are few: those of
    /// the live and recently settled dispatches.
    ///
    /// `fence` is the thread's fence, read before: what is read holds everything of the thread
    /// up to it (see the module).
    async fn read_thread_records(
        &self,
        thread: &str,
        view: &mut View,
        fence: u64,
        dispatches: bool,
        messages: bool,
    ) -> StoreResult<()> {
        let prefix = self.prefix().to_owned();
        let record = Key::Thread(thread.to_owned()).subject(&prefix);
        let mut filters = vec![Key::waitpoints_of(&prefix, thread)];
        if dispatches {
            filters.push(dispatches_of(&prefix, thread));
            filters.push(Key::archive_of(&prefix, thread));
        }
        if messages {
            filters.push(Key::messages_of(&prefix, thread));
        }
        let mut all = vec![record.clone()];
        all.extend(filters.iter().cloned());
        let batch = self.multi_last_from(&all, fence).await?;
        if !batch.too_many && batch.pending == 0 {
            self.apply_batch(view, &batch);
            return Ok(());
        }
        if self.inner.replicated && fence > 0 {
            self.read_tree_from(thread, view, fence, dispatches, messages)
                .await?;
            if dispatches {
                // The archive's pages are not checked against the fence: they hold settled
                // records, which never change and on which no write is decided. At worst a
                // record archived while a lagging replica answered is missing from this read
                // (a listing, or what a refusal says of a settled dispatch).
                let archive = Key::archive_of(&prefix, thread);
                let mut pages = Vec::new();
                self.scan(Some(&archive), |batch| {
                    pages.extend(
                        batch
                            .messages
                            .iter()
                            .map(|m| (m.seq, m.subject.clone(), m.payload.clone())),
                    );
                })
                .await?;
                for (seq, subject, payload) in pages {
                    view.apply_message(&prefix, seq, &subject, &payload);
                }
            }
            return Ok(());
        }
        // More subjects than one `multi_last` answers: page through them, the tree's
        // records before the archive's.
        if let Some((seq, payload)) = self.get_last(&record).await? {
            view.apply_message(&prefix, seq, &record, &payload);
        }
        for filter in filters {
            let mut pages = Vec::new();
            self.scan(Some(&filter), |batch| {
                pages.extend(
                    batch
                        .messages
                        .iter()
                        .map(|m| (m.seq, m.subject.clone(), m.payload.clone())),
                );
            })
            .await?;
            for (seq, subject, payload) in pages {
                view.apply_message(&prefix, seq, &subject, &payload);
            }
        }
        Ok(())
    }

    /// The records of `thread`'s tree (its thread record and waitpoints, its dispatches when
    /// `dispatches`, its inbox messages when `messages`), applied to `view` once read page by
    /// page in sequence order up to `fence` at least: how a cluster reads a thread with more
    /// subjects than one `multi_last` serves. A page of a direct get says nothing of where the
    /// replica that answered it stands, but the pages are read in sequence order and each
    /// holds, for its range of sequences, what its replica held then, so a read that reached
    /// the fence holds every record of the thread as of the fence or newer (a newer one makes
    /// the write fail). A read short of the fence came from a replica behind it: it is read
    /// again.
    async fn read_tree_from(
        &self,
        thread: &str,
        view: &mut View,
        fence: u64,
        dispatches: bool,
        messages: bool,
    ) -> StoreResult<()> {
        let prefix = self.prefix().to_owned();
        let tree = Key::tree(&prefix, thread);
        let deadline = tokio::time::Instant::now() + self.inner.timeout;
        let mut pause = Duration::from_millis(1);
        loop {
            let mut kept = Vec::new();
            let mut last = 0u64;
            self.scan(Some(&tree), |batch| {
                for got in &batch.messages {
                    last = last.max(got.seq);
                    let wanted = match Key::parse(&prefix, &got.subject) {
                        Some(Key::Thread(_) | Key::Waitpoint(..)) => true,
                        Some(Key::Dispatch(..)) => dispatches,
                        Some(Key::Message(..)) => messages,
                        _ => false,
                    };
                    if wanted {
                        kept.push((got.seq, got.subject.clone(), got.payload.clone()));
                    }
                }
            })
            .await?;
            // Short of the fence: a lagging replica, or a tree whose last message was removed
            // since (a settled record's TTL), which the leader's fence as it stands now tells.
            if last >= fence || self.tree_seq(thread).await? <= last {
                for (seq, subject, payload) in kept {
                    view.apply_message(&prefix, seq, &subject, &payload);
                }
                return Ok(());
            }
            if tokio::time::Instant::now() + pause >= deadline {
                return Err(unavailable(
                    "direct get",
                    format!("no replica that answered had applied the stream up to {fence}"),
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_LAG_PAUSE);
        }
    }

    /// A view holding what `reads` name, read from the server now.
    pub(super) async fn snapshot(&self, reads: &[Read<'_>]) -> StoreResult<View> {
        let mut view = View::default();
        let prefix = self.prefix().to_owned();
        if reads.iter().any(|r| matches!(r, Read::All)) {
            self.scan(None, |batch| self.apply_batch(&mut view, batch))
                .await?;
            return Ok(view);
        }
        // Which threads, and how much of each.
        let mut whole = BTreeSet::new();
        let mut logs = BTreeSet::new();
        let mut inboxes = BTreeSet::new();
        let mut found: std::collections::HashMap<&str, Option<String>> =
            std::collections::HashMap::new();
        let mut records: Vec<(String, String)> = Vec::new();
        let mut touched = BTreeSet::new();
        for read in reads {
            match *read {
                Read::All => {}
                Read::Thread(t) => {
                    whole.insert(t.to_owned());
                }
                Read::Log(t) => {
                    logs.insert(t.to_owned());
                }
                Read::Inbox(t) => {
                    inboxes.insert(t.to_owned());
                }
                Read::Waitpoint(id) => {
                    if let Some((t, dispatch)) = self.waitpoint_home(id, &mut view).await? {
                        if let Some(dispatch) = dispatch {
                            records.push((t.clone(), dispatch));
                        }
                        touched.insert(t);
                    }
                }
                Read::Dispatch(id) | Read::ThreadOf(id) | Read::InboxOf(id) | Read::LogOf(id) => {
                    let t = match found.get(id) {
                        Some(t) => t.clone(),
                        None => {
                            let t = self.thread_of(id, &mut view).await?;
                            found.insert(id, t.clone());
                            t
                        }
                    };
                    let Some(t) = t else {
                        continue;
                    };
                    match read {
                        Read::ThreadOf(_) => {
                            whole.insert(t);
                        }
                        Read::InboxOf(_) => {
                            inboxes.insert(t);
                        }
                        Read::LogOf(_) => {
                            logs.insert(t);
                        }
                        _ => records.push((t, id.to_owned())),
                    }
                }
            }
        }
        touched.extend(whole.iter().cloned());
        touched.extend(logs.iter().cloned());
        touched.extend(inboxes.iter().cloned());
        touched.extend(records.iter().map(|(t, _)| t.clone()));
        // Fences first (see the module).
        let mut fences = BTreeMap::new();
        for t in &touched {
            fences.insert(t.clone(), self.tree_seq(t).await?);
        }
        let fence = |t: &String| fences.get(t).copied().unwrap_or(0);
        for t in &whole {
            self.read_thread_records(t, &mut view, fence(t), true, inboxes.contains(t))
                .await?;
            view.mark_whole(t);
        }
        for t in inboxes.iter().filter(|t| !whole.contains(*t)) {
            self.read_thread_records(t, &mut view, fence(t), false, true)
                .await?;
        }
        for t in touched
            .iter()
            .filter(|t| !whole.contains(*t) && !inboxes.contains(*t))
        {
            self.read_thread_records(t, &mut view, fence(t), false, false)
                .await?;
        }
        for (t, id) in &records {
            if whole.contains(t) {
                continue;
            }
            // The tree first, then the archive (see `thread_of`).
            for key in [
                Key::Dispatch(t.clone(), id.clone()),
                Key::Archive(t.clone(), id.clone()),
            ] {
                let subject = key.subject(&prefix);
                if let Some((seq, payload)) = self.get_last(&subject).await? {
                    view.apply_message(&prefix, seq, &subject, &payload);
                    break;
                }
            }
        }
        for t in &logs {
            let entries = Key::entries_of(&prefix, t);
            if let Some(got) = self.get_last_matching(&entries).await?
                && let Some(Key::Entry(_, n)) = Key::parse(&prefix, &got.subject)
            {
                view.apply(got.seq, Record::Entry(t.clone(), n));
            }
        }
        for (t, seq) in fences {
            view.set_thread_seq(&t, seq);
        }
        Ok(view)
    }
}

/// `<p>.th.<thread>.d.*`: every dispatch subject of a thread.
fn dispatches_of(prefix: &str, thread: &str) -> String {
    let one = Key::Dispatch(thread.to_owned(), String::new()).subject(prefix);
    match one.rsplit_once('.') {
        Some((head, _)) => format!("{head}.*"),
        None => one,
    }
}

/// `subject` (a dispatch subject, in a tree or the archive) with its thread token replaced by
/// `*`.
fn wildcard_thread(subject: &str, prefix: &str) -> String {
    let Some((kind, rest)) = subject
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('.'))
        .and_then(|r| r.split_once('.'))
    else {
        return subject.to_owned();
    };
    match rest.split_once('.') {
        Some((_, tail)) => format!("{prefix}.{kind}.*.{tail}"),
        None => subject.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn wildcards_replace_whole_tokens() {
        let one = Key::Dispatch("t".into(), "id".into()).subject("p");
        assert_eq!(wildcard_thread(&one, "p"), "p.th.*.d.aWQ");
        let archived = Key::Archive("t".into(), "id".into()).subject("p");
        assert_eq!(wildcard_thread(&archived, "p"), "p.ar.*.aWQ");
        assert_eq!(dispatches_of("p", "t"), "p.th.dA.d.*");
    }

    #[test]
    fn a_leader_reply_gives_its_message_or_nothing() {
        let found = br#"{"type":"io.nats.jetstream.api.v1.stream_msg_get_response",
            "message":{"subject":"p.th.dA.t","seq":42,"data":"aGVsbG8=",
            "time":"2024-01-01T00:00:00Z"}}"#;
        let got = got_of(found).unwrap().unwrap();
        assert_eq!((got.seq, got.subject.as_str()), (42, "p.th.dA.t"));
        assert_eq!(&got.payload[..], b"hello");
        // An empty payload has no `data`.
        let empty = br#"{"message":{"subject":"p.pz.a","seq":7,"time":"2024-01-01T00:00:00Z"}}"#;
        assert!(got_of(empty).unwrap().unwrap().payload.is_empty());
        let none = br#"{"type":"io.nats.jetstream.api.v1.stream_msg_get_response",
            "error":{"code":404,"err_code":10037,"description":"no message found"}}"#;
        assert!(got_of(none).unwrap().is_none());
        let leaderless = br#"{"error":{"code":503,"err_code":10008,
            "description":"JetStream system temporarily unavailable"}}"#;
        assert!(matches!(
            got_of(leaderless),
            Err(crate::store::StoreError::Unavailable(_))
        ));
    }
}
