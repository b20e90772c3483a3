//! `/v1/threads/{thread}`: the log (a page, or a stream of server-sent events), interrupt, and
//! the inbox (send, list, discard).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::info;

use super::auth::Caller;
use super::dispatches::{Fields, MAX_PAGE_BYTES, limit, name, object, param, params, read_body};
use super::limits::StreamPermit;
use super::{ApiError, ApiState, view};
use crate::live::Hub;
use crate::live::follow::{Event as LiveEvent, Follower, PATIENCE};
use crate::store::{
    ListFilter, LogEntry, Message, MessageFilter, MessageKind, MessageState, NewMessage, OnBusy,
    Status, Store, StoreError, ThreadWatch,
};
use crate::work::messages::{self, SendError};

fn after(pairs: &[(String, String)], headers: &HeaderMap) -> Result<u64, ApiError> {
    let text = param(pairs, "after")
        .or_else(|| headers.get("last-event-id").and_then(|v| v.to_str().ok()));
    match text {
        None => Ok(0),
        Some(text) => text
            .trim()
            .parse()
            .map_err(|_| ApiError::invalid("after", "after: must be a log sequence number")),
    }
}

/// `GET /v1/threads/{thread}/log?after=&limit=`: entries read from the store within
/// [`MAX_PAGE_BYTES`] of data, the page ending early rather than pass [`MAX_PAGE_BYTES`] as
/// shown (the next page starts after its last entry's `seq`).
pub(super) async fn log(
    State(state): State<Arc<ApiState>>,
    Path(thread): Path<String>,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    name("thread", &thread)?;
    let pairs = params(query, &["after", "limit"])?;
    let (after, limit) = (after(&pairs, &headers)?, limit(&pairs)?);
    let read = state
        .store
        .log
        .read_within(&thread, after, limit, MAX_PAGE_BYTES)
        .await?;
    let mut entries = Vec::new();
    let mut bytes = 0;
    for e in &read {
        let entry = view::entry(e);
        let size = entry.to_string().len();
        if !entries.is_empty() && bytes + size > MAX_PAGE_BYTES {
            break;
        }
        bytes += size + 1;
        entries.push(entry);
    }
    let latest = state.store.log.latest(&thread).await?;
    Ok(Json(json!({
        "thread": thread,
        "entries": entries,
        "latest": latest,
    })))
}

/// Log entries read from the store per call by a stream.
const LOG_BATCH: usize = 16;
/// The data a stream reads ahead of its client, of entries and of messages each (at least one
/// of either whenever there is one): what a slow client can make it hold.
const STREAM_BUFFER_BYTES: usize = 256 << 10;

/// How often a stream with nothing new reads the log again, at most.
const STREAM_POLL_MAX: Duration = Duration::from_millis(250);
const STREAM_POLL_FIRST: Duration = Duration::from_millis(10);
/// Entries read per store call.
const STREAM_BATCH: usize = LOG_BATCH;

struct Follow {
    store: Store,
    thread: String,
    after: u64,
    buffered: VecDeque<LogEntry>,
    /// The sequence of the last entry sent to the client.
    shown: u64,
    /// When the last event went to the client: a client that takes longer than [`PATIENCE`]
    /// for the next while more is waiting is dropped (it resumes with `Last-Event-ID`).
    sent_at: Option<tokio::time::Instant>,
    /// The inbox sequence of the last message shown as sent.
    sent_after: u64,
    /// Messages sent since, not shown yet.
    sent: VecDeque<Message>,
    /// Fires when the thread may have changed (a hint; the poll below backs it up).
    watch: ThreadWatch,
    until: tokio::time::Instant,
    shutdown: watch::Receiver<bool>,
    done: bool,
    /// With `?deltas=true`: the hub, and the follower of the thread's running dispatch.
    deltas: Option<(Hub, Option<Follower>)>,
    /// Counts this stream against `[api] max_streams` and `max_streams_per_token` until the
    /// stream ends: it is dropped with the stream, when the time is up, the host stops or the
    /// client goes.
    _permit: StreamPermit,
}

impl Follow {
    /// Ends the stream after a failed read of `what`: the last event says to reconnect.
    fn failed(mut self, what: &str, e: &StoreError) -> (Result<Event, Infallible>, Follow) {
        self.done = true;
        tracing::warn!(thread = %self.thread, "API log stream, reading the {what}: {e}");
        let event = Event::default().event("error").data(
            json!({ "error": "the log could not be read; reconnect with Last-Event-ID" })
                .to_string(),
        );
        (Ok(event), self)
    }

    /// Ends the stream of a client that stayed behind: the last event names the sequence to
    /// resume after. What it was sent is read again from the store on its reconnect; nothing
    /// is held for it meanwhile.
    fn dropped(mut self) -> (Result<Event, Infallible>, Follow) {
        self.done = true;
        self.buffered.clear();
        self.sent.clear();
        metrics::counter!(crate::telemetry::STREAM_CLIENTS_DROPPED).increment(1);
        let event = Event::default().event("dropped").data(
            json!({
                "last": self.shown,
                "reason": format!(
                    "the client took more than {}s for the next event; reconnect with \
                     Last-Event-ID to resume",
                    PATIENCE.as_secs()
                ),
            })
            .to_string(),
        );
        (Ok(event), self)
    }

    /// The next event: a buffered entry, else the next read that finds one; `None` once the
    /// stream's time is up or the host stops.
    async fn next(mut self) -> Option<(Result<Event, Infallible>, Follow)> {
        if self.done {
            return None;
        }
        if self.sent_at.is_some_and(|at| at.elapsed() >= PATIENCE) {
            // The client took its time: dropped when more was waiting for it.
            let waiting = !self.sent.is_empty()
                || !self.buffered.is_empty()
                || self
                    .store
                    .log
                    .latest(&self.thread)
                    .await
                    .is_ok_and(|latest| latest > self.after);
            if waiting {
                return Some(self.dropped());
            }
        }
        let mut poll = STREAM_POLL_FIRST;
        loop {
            if let Some(m) = self.sent.pop_front() {
                // No id: `Last-Event-ID` keeps naming log sequences.
                let event = Event::default()
                    .event("message")
                    .data(view::message(&m).to_string());
                self.sent_at = Some(tokio::time::Instant::now());
                return Some((Ok(event), self));
            }
            if let Some(entry) = self.buffered.pop_front() {
                let event = Event::default()
                    .id(entry.seq.to_string())
                    .event("entry")
                    .data(view::entry(&entry).to_string());
                self.shown = entry.seq;
                self.sent_at = Some(tokio::time::Instant::now());
                return Some((Ok(event), self));
            }
            match self
                .store
                .log
                .read_within(&self.thread, self.after, STREAM_BATCH, STREAM_BUFFER_BYTES)
                .await
            {
                Ok(entries) if !entries.is_empty() => {
                    self.after = entries.last().map_or(self.after, |e| e.seq);
                    self.buffered.extend(entries);
                    continue;
                }
                Ok(_) => {}
                Err(e) => return Some(self.failed("log", &e)),
            }
            let filter = MessageFilter {
                state: None,
                after: self.sent_after,
                limit: STREAM_BATCH,
                max_bytes: Some(STREAM_BUFFER_BYTES),
            };
            match self.store.inbox.messages(&self.thread, &filter).await {
                Ok(found) if !found.is_empty() => {
                    self.sent_after = found.last().map_or(self.sent_after, |m| m.seq);
                    self.sent.extend(found);
                    continue;
                }
                Ok(_) => {}
                Err(e) => return Some(self.failed("inbox", &e)),
            }
            if let Some((hub, follower @ None)) = &mut self.deltas {
                // The thread's running dispatch, if any, is followed from its current claim.
                let running = ListFilter {
                    thread: Some(self.thread.clone()),
                    statuses: vec![Status::Claimed],
                    limit: 1,
                    ..ListFilter::default()
                };
                match self.store.mailbox.list(&running).await {
                    Ok(found) => {
                        if let Some(d) = found.first() {
                            *follower = Follower::open(hub, &d.id, None).await.ok().flatten();
                        }
                    }
                    Err(e) => return Some(self.failed("dispatches", &e)),
                }
            }
            let now = tokio::time::Instant::now();
            if now >= self.until || *self.shutdown.borrow() {
                return None;
            }
            let follower = self.deltas.as_mut().and_then(|(_, f)| f.as_mut());
            let streamed = tokio::select! {
                () = tokio::time::sleep(poll.min(self.until - now)) => None,
                () = self.watch.changed() => None,
                _ = self.shutdown.changed() => None,
                event = async {
                    match follower {
                        Some(f) => Some((f.next().await, f.cursor())),
                        None => std::future::pending().await,
                    }
                } => event,
            };
            poll = (poll * 2).min(STREAM_POLL_MAX);
            let Some((event, _)) = streamed else {
                continue;
            };
            let dispatch = self
                .deltas
                .as_ref()
                .and_then(|(_, f)| f.as_ref())
                .map(|f| f.dispatch().to_owned())
                .unwrap_or_default();
            // No ids: `Last-Event-ID` keeps naming log sequences.
            let event = match event {
                Ok(Some(LiveEvent::Delta { chunk, .. })) => {
                    let mut data = super::stream::delta_json(&chunk);
                    data["dispatch"] = Value::String(dispatch);
                    Event::default().event("delta").data(data.to_string())
                }
                Ok(Some(LiveEvent::Reset { claim })) => Event::default()
                    .event("reset")
                    .data(json!({ "dispatch": dispatch, "claim": claim }).to_string()),
                Ok(Some(LiveEvent::Status(_))) => continue,
                // Settled, dropped or unreadable: the next running dispatch is looked for.
                _ => {
                    if let Some((_, f)) = &mut self.deltas {
                        *f = None;
                    }
                    continue;
                }
            };
            return Some((Ok(event), self));
        }
    }
}

/// `GET /v1/threads/{thread}/log/stream?after=N` (or `Last-Event-ID: N`): every entry after N
/// as an `entry` event whose id is its sequence, then new ones as they are appended (an entry
/// that records an acknowledged message carries it as `message`), and each inbox message sent
/// while the stream is open as a `message` event without an id. The server
/// ends the stream after `[api] max_stream`; reconnecting with `Last-Event-ID` misses nothing.
/// At most `[api] max_streams` are open at once (503 beyond), `max_streams_per_token` with one
/// token (429 beyond).
pub(super) async fn stream(
    State(state): State<Arc<ApiState>>,
    Path(thread): Path<String>,
    headers: HeaderMap,
    caller: Option<axum::Extension<Caller>>,
    query: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    name("thread", &thread)?;
    let pairs = params(query, &["after", "deltas"])?;
    let after = after(&pairs, &headers)?;
    let deltas = match param(&pairs, "deltas") {
        None | Some("false") => None,
        Some("true") => Some((state.live.clone(), None)),
        Some(_) => return Err(ApiError::invalid("deltas", "deltas: `true` or `false`")),
    };
    let token = caller.map_or_else(String::new, |axum::Extension(c)| c.name);
    let permit = state.streams.open(&token)?;
    // Registered before the first read, so nothing written in between is waited past.
    let watch = state.store.inbox.watch(&thread);
    // Refuse at once when the store cannot be read, rather than with an open empty stream.
    state.store.log.latest(&thread).await?;
    // Messages sent from now on are shown as they come; those sent earlier are in the list.
    let sent_after = state.store.inbox.inbox(&thread).await?.latest;
    let follow = Follow {
        store: state.store.clone(),
        thread,
        after,
        buffered: VecDeque::new(),
        shown: after,
        sent_at: None,
        sent_after,
        sent: VecDeque::new(),
        watch,
        until: tokio::time::Instant::now() + state.config().api.max_stream,
        shutdown: state.shutdown.clone(),
        done: false,
        deltas,
        _permit: permit,
    };
    let events = stream::unfold(follow, Follow::next);
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

/// `POST /v1/threads/{thread}/interrupt` with an optional `{"reason": "..."}`.
pub(super) async fn interrupt(
    State(state): State<Arc<ApiState>>,
    Path(thread): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    name("thread", &thread)?;
    let bytes = read_body(&headers, body, state.body_limit).await?;
    let mut fields = Fields::new(object(&bytes)?);
    let reason = fields
        .string("reason")?
        .unwrap_or_else(|| "interrupted through the API".to_owned());
    fields.finish()?;
    let interrupt = state.store.mailbox.interrupt(&thread, &reason).await?;
    Ok(Json(json!({
        "thread": thread,
        "epoch": interrupt.epoch,
        "superseded": interrupt.superseded,
        "active": interrupt.active.as_ref().map(|d| d.id.clone()),
    })))
}

/// A refused send as the API answers it: 404 for an unknown agent, 413 over the size limit,
/// 429 for a full inbox, 400 for bad input.
impl From<SendError> for ApiError {
    fn from(e: SendError) -> ApiError {
        match e {
            SendError::UnknownAgent(agent) => {
                ApiError::not_found(format!("no agent `{agent}`")).with("field", "agent")
            }
            SendError::TooLarge { limit, .. } => {
                ApiError::too_large("payload", e.to_string(), limit)
            }
            SendError::Store(StoreError::Limit(message)) => {
                ApiError::too_many(message, 1).with("limit", "max_inbox")
            }
            SendError::Store(e) => e.into(),
        }
    }
}

/// `POST /v1/threads/{thread}/messages`: `payload` (or `payload_base64`), `kind`
/// (`follow_up`, the default, or `steer`), `on_busy` (`enqueue`, `steer`, `reject`,
/// `interrupt`: then the thread's state decides the kind), `agent`, `metadata` → `201 {"seq",
/// "kind", "busy", "interrupted", "follow_ups"}`; 409 `thread_busy` naming the holder when
/// `reject` meets a busy thread.
pub(super) async fn send(
    State(state): State<Arc<ApiState>>,
    Path(thread): Path<String>,
    caller: Option<axum::Extension<Caller>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    name("thread", &thread)?;
    let bytes = read_body(&headers, body, state.body_limit).await?;
    let mut fields = Fields::new(object(&bytes)?);
    let payload = fields.payload()?;
    let kind = match fields.string("kind")? {
        None => MessageKind::FollowUp,
        Some(kind) => kind
            .parse()
            .map_err(|e: String| ApiError::invalid("kind", format!("kind: {e}")))?,
    };
    let on_busy = fields
        .string("on_busy")?
        .map(|p| p.parse::<OnBusy>())
        .transpose()
        .map_err(|e| ApiError::invalid("on_busy", format!("on_busy: {e}")))?;
    let agent = fields.string("agent")?;
    let metadata = fields.metadata()?;
    fields.finish()?;
    if let Some(agent) = &agent {
        name("agent", agent)?;
    }
    let token = caller.map_or_else(|| "-".to_owned(), |axum::Extension(c)| c.name);
    let new = NewMessage {
        kind,
        payload,
        metadata,
        agent,
        sent_by: format!("api:{token}"),
        on_busy,
        follow_up_window: None,
    };
    let sent = messages::send(&state.store, &state.config(), &thread, new).await?;
    info!(
        thread = %thread.escape_debug(),
        seq = sent.message.seq,
        token = %token,
        "message sent through the API"
    );
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "thread": thread,
            "seq": sent.message.seq,
            "kind": sent.message.kind,
            "busy": sent.busy,
            "applied": sent.applied,
            "interrupted": messages::interrupted_json(&sent),
            "reopened": sent.reopened,
            "follow_ups": sent.follow_ups,
        })),
    )
        .into_response())
}

/// `GET /v1/threads/{thread}/messages?state=pending|acked|discarded&after=&limit=`: a page of
/// the thread's messages, oldest first, and its inbox watermarks.
pub(super) async fn messages(
    State(state): State<Arc<ApiState>>,
    Path(thread): Path<String>,
    query: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    name("thread", &thread)?;
    let pairs = params(query, &["state", "after", "limit"])?;
    let state_filter = match param(&pairs, "state") {
        None => None,
        Some(text) => Some(
            text.parse::<MessageState>()
                .map_err(|e| ApiError::invalid("state", format!("state: {e}")))?,
        ),
    };
    let after = match param(&pairs, "after") {
        None => 0,
        Some(text) => text
            .trim()
            .parse()
            .map_err(|_| ApiError::invalid("after", "after: must be a message sequence"))?,
    };
    let filter = MessageFilter {
        state: state_filter,
        after,
        limit: limit(&pairs)?,
        max_bytes: Some(MAX_PAGE_BYTES),
    };
    let found = state.store.inbox.messages(&thread, &filter).await?;
    let inbox = state.store.inbox.inbox(&thread).await?;
    // Read within the byte cap of payloads; the page stops before passing it as shown; the
    // next starts after its last `seq`.
    let mut out = Vec::with_capacity(found.len());
    let mut bytes = 0;
    for m in &found {
        let v = view::message(m);
        let size = v.to_string().len();
        if !out.is_empty() && bytes + size > MAX_PAGE_BYTES {
            break;
        }
        bytes += size + 1;
        out.push(v);
    }
    Ok(Json(json!({
        "thread": thread,
        "messages": out,
        "inbox": { "latest": inbox.latest, "pending": inbox.pending, "followed": inbox.followed },
    })))
}

/// `POST /v1/threads/{thread}/messages/discard` with `{"through": seq}`: discards the pending
/// messages up to `seq` (an operator clearing messages no run will read).
pub(super) async fn discard(
    State(state): State<Arc<ApiState>>,
    Path(thread): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    name("thread", &thread)?;
    let bytes = read_body(&headers, body, state.body_limit).await?;
    let mut fields = Fields::new(object(&bytes)?);
    let through = fields
        .integer("through", 1, u64::MAX)?
        .ok_or_else(|| ApiError::invalid("through", "through: is required"))?;
    fields.finish()?;
    let discarded = state.store.inbox.discard_messages(&thread, through).await?;
    Ok(Json(json!({ "thread": thread, "discarded": discarded })))
}
