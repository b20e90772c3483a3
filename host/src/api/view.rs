//! The JSON shape of a dispatch, a list row and a log entry in the API. Bytes are a UTF-8
//! string when they are text, else `{"base64": ...}` (as in the CLI's JSON). A dispatch's
//! claim token is never shown: only who holds it and until when. A list row carries no
//! payload or output, only their sizes.

use std::fmt::Write as _;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use crate::store::{Dispatch, DispatchRow, LogEntry, Message};

/// Percent-encodes `text` for a path segment or a query value: everything but ASCII letters,
/// digits and `-_.~`. What goes into a `Location` header or a link this way is one segment
/// whatever it holds.
pub(crate) fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The path of a dispatch in the API (its `Location`).
pub(crate) fn dispatch_path(id: &str) -> String {
    format!("/v1/dispatches/{}", encode(id))
}

/// Bytes as JSON: text, or `{"base64": ...}`.
pub(crate) fn bytes(data: &[u8]) -> Value {
    match std::str::from_utf8(data) {
        Ok(text) => Value::String(text.to_owned()),
        Err(_) => json!({ "base64": STANDARD.encode(data) }),
    }
}

/// A dispatch as the API shows it. Times are milliseconds since the Unix epoch.
pub(crate) fn dispatch(d: &Dispatch) -> Value {
    json!({
        "id": d.id,
        "agent": d.agent,
        "thread": d.thread,
        "run_id": d.run_id,
        "status": d.status.as_str(),
        "terminal": d.status.is_terminal(),
        "priority": d.priority,
        "attempts": d.attempt,
        "max_attempts": d.max_attempts,
        "claims": d.claims,
        "resumes": d.resumes,
        "epoch": d.epoch,
        "payload": bytes(&d.payload),
        "metadata": d.metadata,
        "dedupe_key": d.dedupe_key,
        "concurrency_key": d.concurrency_key,
        // The version of its plugin each claim ran, oldest first; the last is its pin.
        "versions": d.versions.iter().map(|v| json!({
            "claim": v.claim,
            "version": v.version,
            "label": v.label,
        })).collect::<Vec<_>>(),
        // Its debounce window: what joined it and when it is due (null when it has none).
        "window": d.window.as_ref().map(|w| window(d, w)),
        // The tokens its runs' metered model calls used (null when none were metered).
        "usage": d.usage.as_ref().map(|u| json!({
            "input_tokens": u.input_tokens,
            "output_tokens": u.output_tokens,
            "cached_tokens": u.cached_tokens,
            "model_calls": u.calls,
        })),
        "claimed_by": d.claim.as_ref().map(|c| c.claimed_by.clone()),
        "lease_until": d.claim.as_ref().map(|c| c.lease_until),
        "result": d.result.as_ref().map(|r| json!({
            "status": r.status.as_str(),
            "output": bytes(&r.output),
            "error": r.error,
        })),
        "last_error": d.last_error,
        "available_at": d.available_at,
        "created_at": d.created_at,
        "updated_at": d.updated_at,
        "started_at": d.started_at,
        "completed_at": d.completed_at,
    })
}

/// A dispatch's debounce window as the API shows it.
fn window(d: &Dispatch, w: &crate::store::model::Window) -> Value {
    json!({
        "key": w.key,
        "payload": w.payload.as_str(),
        "quiet_ms": w.quiet_ms,
        "max_wait_ms": w.max_wait_ms,
        "max_items": w.max_items,
        "count": w.count,
        "first_at": w.first_at,
        "last_at": w.last_at,
        "sealed": w.sealed,
        "open": crate::store::rules::window::open_key(d).is_some(),
        "items": w.items.iter().map(|i| json!({
            "payload": bytes(&i.payload),
            "metadata": i.metadata,
            "enqueued_at": i.enqueued_at,
        })).collect::<Vec<_>>(),
    })
}

/// A dispatch as a list shows it: the fields of [`dispatch`] but `payload` and the result's
/// `output`, which are `payload_size` and `output_size` (bytes).
pub(crate) fn row(d: &DispatchRow) -> Value {
    json!({
        "id": d.id,
        "agent": d.agent,
        "thread": d.thread,
        "run_id": d.run_id,
        "status": d.status.as_str(),
        "terminal": d.status.is_terminal(),
        "priority": d.priority,
        "attempts": d.attempt,
        "max_attempts": d.max_attempts,
        "claims": d.claims,
        "resumes": d.resumes,
        "epoch": d.epoch,
        "payload_size": d.payload_size,
        "metadata": d.metadata,
        "dedupe_key": d.dedupe_key,
        "concurrency_key": d.concurrency_key,
        "claimed_by": d.claimed_by,
        "lease_until": d.lease_until,
        "result": d.result.as_ref().map(|r| json!({
            "status": r.status.as_str(),
            "output_size": r.output_size,
            "error": r.error,
        })),
        "last_error": d.last_error,
        "available_at": d.available_at,
        "created_at": d.created_at,
        "updated_at": d.updated_at,
        "started_at": d.started_at,
        "completed_at": d.completed_at,
    })
}

/// A log entry.
pub(crate) fn entry(e: &LogEntry) -> Value {
    let mut v = json!({ "seq": e.seq, "data": bytes(&e.data), "appended_at": e.appended_at });
    if let (Some(note), Some(map)) = (&e.note, v.as_object_mut()) {
        map.insert(
            "message".into(),
            json!({
                "seq": note.seq,
                "kind": note.kind.as_str(),
                "metadata": note.metadata,
                "sent_at": note.sent_at,
                "sent_by": note.sent_by,
            }),
        );
    }
    if let (Some(turn), Some(map)) = (&e.turn, v.as_object_mut()) {
        let mut mark = json!({
            "event": turn.event.as_str(),
            "dispatch": turn.dispatch,
            "message": turn.message,
        });
        if let (Some(masked), Some(m)) = (turn.masked, mark.as_object_mut()) {
            m.insert(
                "masked".into(),
                json!({ "first": masked.first, "last": masked.last }),
            );
        }
        map.insert("turn".into(), mark);
    }
    v
}

/// A message of a thread's inbox as the API shows it.
pub(crate) fn message(m: &Message) -> Value {
    json!({
        "thread": m.thread,
        "seq": m.seq,
        "kind": m.kind.as_str(),
        "payload": bytes(&m.payload),
        "metadata": m.metadata,
        "agent": m.agent,
        "sent_by": m.sent_by,
        "sent_at": m.sent_at,
        "state": m.state.as_str(),
        "settled_at": m.settled_at,
        "acked_by": m.acked_by,
        "log_seq": m.log_seq,
        // The turn policy that took effect when it met a busy thread (null on an idle one).
        "applied": m.applied.map(|p| p.as_str()),
    })
}
