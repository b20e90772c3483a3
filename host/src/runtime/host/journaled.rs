//! The claim's thread-log and enqueue calls under `journal = "run"`: each is a journaled call
//! of the run (see `crate::claim::journal`).
//!
//! - An append is written with its entry in one atomic step (`record_append`), so a replay
//!   returns the sequence the earlier run got and never appends twice.
//! - A log read records the range it returned; its replay reads that range again (what the
//!   earlier run appended after it is not shown), and counts as a difference when the range
//!   no longer reads the same (trimmed since).
//! - `latest` records the watermark it returned.
//! - An enqueue takes an id derived from the dispatch, the position and the request, so one
//!   the earlier run made before it could record it is found again by that id instead of
//!   being made twice; its entry records the id.
//!
//! A refused call (a conflict, a lost claim) is not recorded and gives its position back.

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::claim::journal::{Recorder, Turn};
use crate::store::journal::{CallKind, identity};
use crate::store::{LogEntry, NewDispatch, Store, StoreError, StoreResult};

/// `append` (`expected` `None`) or `append-expected` of `data` to the claim's thread.
pub(super) async fn append(
    recorder: &Recorder,
    store: &Store,
    thread: &str,
    data: &[u8],
    expected: Option<u64>,
) -> StoreResult<u64> {
    let (kind, expected_bytes) = match expected {
        Some(n) => (CallKind::LogAppendExpected, n.to_be_bytes().to_vec()),
        None => (CallKind::LogAppend, Vec::new()),
    };
    let call = recorder.start(kind, identity([data, &expected_bytes]));
    if let Turn::Replay(entry) = recorder.decide(&call).await {
        if let Some(seq) = entry.answer.get("seq").and_then(|s| s.as_u64()) {
            recorder.replayed(&entry);
            return Ok(seq);
        }
        recorder.diverge(&call, Some(entry.kind)).await;
    }
    let Some(entry) = recorder.entry(&call, json!({}), None).await else {
        // The journal is full: an unjournaled append.
        let fence = recorder.fence();
        return match expected {
            Some(n) => {
                store
                    .log
                    .append_expected(thread, data, n, Some(fence))
                    .await
            }
            None => store.log.append(thread, data, Some(fence)).await,
        };
    };
    let out = store
        .journal
        .record_append(recorder.fence(), entry, data, expected)
        .await;
    match &out {
        Ok(_) => recorder.recorded(kind),
        Err(_) => recorder.release(&call),
    }
    out
}

/// `read-log(after, limit)` of the claim's thread.
pub(super) async fn read(
    recorder: &Recorder,
    store: &Store,
    thread: &str,
    after: u64,
    limit: usize,
) -> StoreResult<Vec<LogEntry>> {
    let call = recorder.start(
        CallKind::LogRead,
        identity([&after.to_be_bytes()[..], &(limit as u64).to_be_bytes()]),
    );
    let replay = match recorder.decide(&call).await {
        Turn::Replay(entry) => Some(entry),
        Turn::Live => None,
    };
    let entries = store.log.read(thread, after, limit).await;
    let entries = match entries {
        Ok(entries) => entries,
        Err(e) => {
            recorder.release(&call);
            return Err(e);
        }
    };
    if let Some(entry) = replay {
        let last = entry.answer.get("last").and_then(|v| v.as_u64());
        let count = entry.answer.get("count").and_then(|v| v.as_u64());
        if let (Some(last), Some(count)) = (last, count) {
            let kept: Vec<LogEntry> = entries.iter().filter(|e| e.seq <= last).cloned().collect();
            if kept.len() as u64 == count {
                recorder.replayed(&entry);
                return Ok(kept);
            }
        }
        // The range no longer reads as it did: the run goes on live from here.
        recorder.diverge(&call, Some(entry.kind)).await;
    }
    let answer = json!({
        "after": after,
        "last": entries.last().map_or(after, |e| e.seq),
        "count": entries.len(),
    });
    if let Some(entry) = recorder.entry(&call, answer, None).await {
        recorder.record(entry).await;
    }
    Ok(entries)
}

/// `latest` of the claim's thread.
pub(super) async fn latest(recorder: &Recorder, store: &Store, thread: &str) -> StoreResult<u64> {
    let call = recorder.start(CallKind::LogLatest, identity([&b"latest"[..]]));
    if let Turn::Replay(entry) = recorder.decide(&call).await {
        if let Some(latest) = entry.answer.get("latest").and_then(|v| v.as_u64()) {
            recorder.replayed(&entry);
            return Ok(latest);
        }
        recorder.diverge(&call, Some(entry.kind)).await;
    }
    let latest = match store.log.latest(thread).await {
        Ok(latest) => latest,
        Err(e) => {
            recorder.release(&call);
            return Err(e);
        }
    };
    if let Some(entry) = recorder
        .entry(&call, json!({ "latest": latest }), None)
        .await
    {
        recorder.record(entry).await;
    }
    Ok(latest)
}

/// The parts of a follow-up that identify it (not its trace context, which differs on every
/// run).
fn enqueue_identity(new: &NewDispatch) -> String {
    let metadata: Vec<(&String, &String)> = new
        .metadata
        .iter()
        .filter(|(k, _)| k.as_str() != "traceparent")
        .collect();
    let metadata = serde_json::to_vec(&metadata).unwrap_or_default();
    let parts = [
        new.agent.as_bytes(),
        new.thread.as_bytes(),
        &new.payload,
        &metadata,
        &[new.priority],
        &new.delay_ms.to_be_bytes(),
        new.dedupe_key.as_deref().unwrap_or_default().as_bytes(),
        &new.max_attempts.to_be_bytes(),
    ];
    // A concurrency key is part of the request when there is one; without one the identity is
    // what it was before keys existed, so journals recorded then still replay.
    match &new.concurrency_key {
        Some(key) => identity(parts.into_iter().chain([key.as_bytes()])),
        None => identity(parts),
    }
}

/// Enqueues the follow-up `new` through the claim. Returns its id.
pub(super) async fn enqueue(
    recorder: &Recorder,
    store: &Store,
    mut new: NewDispatch,
) -> StoreResult<String> {
    let call = recorder.start(CallKind::Enqueue, enqueue_identity(&new));
    if let Turn::Replay(entry) = recorder.decide(&call).await {
        if let Some(id) = entry.answer.get("id").and_then(|v| v.as_str()) {
            recorder.replayed(&entry);
            return Ok(id.to_owned());
        }
        recorder.diverge(&call, Some(entry.kind)).await;
    }
    // The same dispatch, position and request give the same id: an enqueue the earlier run
    // made without recording it is found again instead of made twice.
    let digest = Sha256::new()
        .chain_update(recorder.dispatch().as_bytes())
        .chain_update(call.pos.to_be_bytes())
        .chain_update(call.identity.as_bytes())
        .finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    let id = uuid::Builder::from_custom_bytes(bytes)
        .into_uuid()
        .to_string();
    new.id = Some(id.clone());
    let out = match store.mailbox.enqueue(new).await {
        Ok(d) => Ok(d.id),
        Err(StoreError::Duplicate { .. }) if store.mailbox.load(&id).await?.is_some() => {
            Ok(id.clone())
        }
        Err(e) => Err(e),
    };
    match &out {
        Ok(id) => {
            if let Some(entry) = recorder.entry(&call, json!({ "id": id }), None).await {
                recorder.record(entry).await;
            }
        }
        Err(_) => recorder.release(&call),
    }
    out
}
