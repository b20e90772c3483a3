//! Streams of a dispatch's output as server-sent events: `GET /v1/dispatches/{id}/stream`,
//! `POST /v1/dispatches?stream=true`, and the dashboard's live output.
//!
//! Events, in order: `status` first and on each change of the dispatch's status or claim;
//! `delta` (id `claim:seq`; data `{"text": ...}`, or `{"data": base64, "encoding": "base64"}`
//! for bytes that are not UTF-8); `reset` (id `claim:0`) when a later claim starts, so the
//! client drops what earlier claims streamed; `dropped` when the client stayed more than 1 MiB
//! behind for 10 s (it resumes with `Last-Event-ID`); and a final `result` (id `end`), after
//! which the stream ends. A client that reconnects with `Last-Event-ID` (or `?after=claim:seq`)
//! gets what followed, nothing lost or repeated, for `[host] stream_retention` after the run;
//! one that reconnects after the result (`Last-Event-ID: end`) is answered 204 No Content, which
//! tells a browser's `EventSource` to stop.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use futures_util::stream::{self, Stream};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::auth::Caller;
use super::dispatches::{name, param, params};
use super::limits::StreamPermit;
use super::{ApiError, ApiState, view};
use crate::live::follow::{Event as LiveEvent, Follower, MAX_LAG_BYTES, PATIENCE};
use crate::store::Dispatch;
use crate::store::deltas::Cursor;

/// The id of the `result` event. A client that reconnects with it as its `Last-Event-ID` saw
/// the stream's end, and is answered 204, which tells an `EventSource` to stop reconnecting
/// (a stream without it would send the result again at every retry).
pub(crate) const END_ID: &str = "end";

/// The stream's position to resume after: `?after=claim:seq`, else `Last-Event-ID`.
pub(super) fn cursor(after: Option<&str>, headers: &HeaderMap) -> Result<Option<Cursor>, ApiError> {
    resume_text(after, headers)
        .map(|t| {
            t.parse::<Cursor>()
                .map_err(|e| ApiError::invalid("after", format!("after: {e}")))
        })
        .transpose()
}

/// `?after`, else `Last-Event-ID`, as given.
fn resume_text<'a>(after: Option<&'a str>, headers: &'a HeaderMap) -> Option<&'a str> {
    after.or_else(|| headers.get("last-event-id").and_then(|v| v.to_str().ok()))
}

/// `GET /v1/dispatches/{id}/stream[?after=claim:seq]` (or `Last-Event-ID`): the dispatch's
/// event stream; 404 for an unknown id.
pub(super) async fn show(
    State(state): State<Arc<ApiState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    caller: Option<axum::Extension<Caller>>,
    query: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    name("id", &id)?;
    let pairs = params(query, &["after"])?;
    if resume_text(param(&pairs, "after"), &headers).map(str::trim) == Some(END_ID) {
        // The client saw the result: nothing follows it.
        return match state.store.mailbox.load(&id).await? {
            Some(_) => Ok(axum::http::StatusCode::NO_CONTENT.into_response()),
            None => Err(ApiError::not_found(format!("no dispatch `{id}`"))),
        };
    }
    let after = cursor(param(&pairs, "after"), &headers)?;
    let token = caller.map_or_else(String::new, |axum::Extension(c)| c.name);
    let permit = state.streams.open(&token)?;
    match open(&state, &id, after, permit).await? {
        Some(sse) => Ok(sse.into_response()),
        None => Err(ApiError::not_found(format!("no dispatch `{id}`"))),
    }
}

/// The event stream of dispatch `id` after `after`; `None` when there is no such dispatch.
/// Counts against `[api] max_streams` (and the token's share) while open, and ends after
/// `[api] max_stream` or when the server stops.
pub(super) async fn open(
    state: &Arc<ApiState>,
    id: &str,
    after: Option<Cursor>,
    permit: StreamPermit,
) -> Result<Option<Sse<impl Stream<Item = Result<Event, Infallible>> + use<>>>, ApiError> {
    let Some(follower) = Follower::open(&state.live, id, after).await? else {
        return Ok(None);
    };
    let watch = Watch {
        follower,
        until: tokio::time::Instant::now() + state.config().api.max_stream,
        shutdown: state.shutdown.clone(),
        done: false,
        _permit: permit,
    };
    Ok(Some(
        Sse::new(stream::unfold(watch, Watch::next))
            .keep_alive(KeepAlive::new().interval(Duration::from_secs(15))),
    ))
}

struct Watch {
    follower: Follower,
    until: tokio::time::Instant,
    shutdown: watch::Receiver<bool>,
    done: bool,
    _permit: StreamPermit,
}

impl Watch {
    async fn next(mut self) -> Option<(Result<Event, Infallible>, Watch)> {
        if self.done || *self.shutdown.borrow() {
            return None;
        }
        let until = self.until;
        let next = tokio::select! {
            next = self.follower.next() => next,
            () = tokio::time::sleep_until(until) => return None,
            _ = self.shutdown.changed() => return None,
        };
        let event = match next {
            Ok(Some(event)) => {
                self.done = matches!(event, LiveEvent::Result(_) | LiveEvent::Dropped { .. });
                sse(event)
            }
            Ok(None) => return None,
            Err(e) => {
                self.done = true;
                Event::default()
                    .event("error")
                    .data(json!({ "error": e.to_string() }).to_string())
            }
        };
        Some((Ok(event), self))
    }
}

/// A delta's data: its text, or its bytes in base64 when they are not UTF-8. As JSON, line
/// breaks are escaped, so the data is always one line of the event.
pub(crate) fn delta_json(chunk: &Bytes) -> Value {
    match std::str::from_utf8(chunk) {
        Ok(text) => json!({ "text": text }),
        Err(_) => json!({ "data": STANDARD.encode(chunk), "encoding": "base64" }),
    }
}

/// What a `status` event says of a dispatch.
fn status(d: &Dispatch) -> Value {
    json!({
        "id": d.id,
        "agent": d.agent,
        "thread": d.thread,
        "status": d.status.as_str(),
        "terminal": d.status.is_terminal(),
        "attempts": d.attempt,
        "claims": d.claims,
        "resumes": d.resumes,
    })
}

/// An event as it goes on the wire.
fn sse(event: LiveEvent) -> Event {
    match event {
        LiveEvent::Status(d) => Event::default()
            .event("status")
            .data(status(&d).to_string()),
        LiveEvent::Delta { at, chunk } => Event::default()
            .event("delta")
            .id(at.to_string())
            .data(delta_json(&chunk).to_string()),
        LiveEvent::Reset { claim } => Event::default()
            .event("reset")
            .id(Cursor::new(claim, 0).to_string())
            .data(json!({ "claim": claim }).to_string()),
        LiveEvent::Dropped { last } => Event::default().event("dropped").data(
            json!({
                "last": last.to_string(),
                "reason": format!(
                    "the client stayed more than {MAX_LAG_BYTES} bytes behind the stream for \
                     {}s; reconnect with Last-Event-ID to resume",
                    PATIENCE.as_secs()
                ),
            })
            .to_string(),
        ),
        LiveEvent::Result(d) => {
            let mut value = status(&d);
            if let Some(map) = value.as_object_mut() {
                map.insert(
                    "output".into(),
                    d.result
                        .as_ref()
                        .map_or(Value::Null, |r| view::bytes(&r.output)),
                );
                // An acked run's own error (none, usually); else why it ended as it did.
                let error = match d.status {
                    crate::store::Status::Acked => d.result.as_ref().and_then(|r| r.error.clone()),
                    _ => d.last_error.clone(),
                };
                map.insert("error".into(), json!(error));
            }
            Event::default()
                .event("result")
                .id(END_ID)
                .data(value.to_string())
        }
    }
}
