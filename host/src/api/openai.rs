//! The OpenAI-compatible endpoint: chat front ends and OpenAI SDKs talk to Homing's agents as
//! they would to a model.
//!
//! | route | role | does |
//! | --- | --- | --- |
//! | `GET /openai/v1/models` | reader | the agents with `[plugins.x.openai] expose = true`, as models |
//! | `POST /openai/v1/chat/completions` | producer | one turn of a conversation with such an agent |
//!
//! A conversation is a thread: the one the `Homing-Thread` header names, else
//! `openai.<model>.<user>` when the request carries a `user`, else a new thread for the one
//! request. The text of the request's last message, which must be the user's, is sent into the
//! thread's inbox addressed to the agent, exactly as `POST /v1/threads/{thread}/messages` sends
//! it (the agent's `[plugins.x.inbox]` policy applies); the rest of `messages` is not read, since
//! the thread already holds the conversation. The answer is the output of the run that took the
//! message: the turn the message started on an idle thread, else the run that acknowledged it.
//! With `"stream": true` the run's streamed output (what the guest emits) comes as
//! `chat.completion.chunk` events as it is made, and whatever of the output was not streamed
//! follows in the last chunk, so an agent that streams nothing still answers.
//!
//! Every answer carries `Homing-Thread` and `Homing-Dispatch` headers. Once the message is
//! stored, an answer that is not a completion (the run failed, or had not finished within
//! `[api] max_wait`) carries `x-should-retry: false`, which the official SDKs honour: a retry
//! would send the message again. Errors have OpenAI's shape, `{"error": {"message", "type",
//! "param", "code"}}`. Request fields this endpoint does not use (sampling settings, tools,
//! `max_tokens`) are accepted and ignored: the agent decides how it calls its model.
//! `usage` is the dispatch's metered tokens (the model calls the run made to origins of
//! `[pricing]`, summed over its attempts): in a completion when any were metered, and in a last
//! chunk (no choices) when a streamed request asks for it with `stream_options.include_usage`
//! (`null` when none were metered).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::stream;
use serde_json::{Map, Value, json};
use tokio::sync::watch;
use tracing::info;

use super::auth::Caller;
use super::dispatches::{name, object, read_body};
use super::limits::StreamPermit;
use super::{ApiError, ApiState, Route};
use crate::config::Config;
use crate::config::api::Role;
use crate::live::follow::{Event as LiveEvent, Follower};
use crate::store::{MessageKind, MessageState, NewMessage, Sent, Status, Store, StoreError};
use crate::work::messages;

/// The path of the chat route.
pub(super) const CHAT: &str = "/openai/v1/chat/completions";

/// The header naming the conversation's thread, in the request and the answer.
const THREAD_HEADER: &str = "homing-thread";
/// The header naming the dispatch that answered, in the answer.
const DISPATCH_HEADER: &str = "homing-dispatch";

/// The endpoint's routes, with the roles they need.
pub(super) fn routes() -> Vec<Route> {
    vec![
        Route {
            method: Method::GET,
            path: "/openai/v1/models",
            role: Role::Reader,
            own_auth: false,
            handler: get(models),
        },
        Route {
            method: Method::POST,
            path: CHAT,
            role: Role::Producer,
            own_auth: false,
            handler: post(chat),
        },
    ]
}

/// Whether `agent` is served as a model.
fn exposed(config: &Config, agent: &str) -> bool {
    config.plugins.get(agent).is_some_and(|p| p.openai.expose)
}

/// `GET /openai/v1/models`: the exposed agents, by name.
async fn models(State(state): State<Arc<ApiState>>) -> Response {
    let config = state.config();
    let data: Vec<Value> = config
        .plugins
        .iter()
        .filter(|(_, p)| p.openai.expose)
        .map(|(name, _)| json!({ "id": name, "object": "model", "created": 0, "owned_by": "homing" }))
        .collect();
    Json(json!({ "object": "list", "data": data })).into_response()
}

/// What a chat request asks, once read.
#[derive(Debug)]
struct Ask {
    model: String,
    text: String,
    stream: bool,
    /// `stream_options.include_usage`.
    include_usage: bool,
    user: Option<String>,
}

/// Reads a chat request's body: `model` an exposed agent, `messages` ending with the user's
/// text, `stream` a boolean, `n` 1 when given.
fn ask(config: &Config, body: Map<String, Value>) -> Result<Ask, ApiError> {
    let model = match body.get("model") {
        Some(Value::String(m)) => m.clone(),
        _ => return Err(ApiError::invalid("model", "model: required, a string")),
    };
    if !exposed(config, &model) {
        return Err(ApiError::not_found(format!(
            "model `{}` does not exist or is not served here (`[plugins.x.openai] expose`)",
            model.escape_debug()
        ))
        .with("field", "model")
        .with("code", "model_not_found"));
    }
    let Some(Value::Array(history)) = body.get("messages") else {
        return Err(ApiError::invalid(
            "messages",
            "messages: required, an array of messages",
        ));
    };
    let Some(last) = history.last() else {
        return Err(ApiError::invalid("messages", "messages: must not be empty"));
    };
    if last.get("role").and_then(Value::as_str) != Some("user") {
        return Err(ApiError::invalid(
            "messages",
            "messages: the last message must be the user's (role `user`); the thread holds the \
             rest of the conversation",
        ));
    }
    let text = match last.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (
                    part.get("type").and_then(Value::as_str),
                    part.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(piece)) => text.push_str(piece),
                    _ => {
                        return Err(ApiError::invalid(
                            "messages",
                            "messages: the last message's content parts must all be text \
                             (`{\"type\": \"text\", \"text\": ...}`)",
                        ));
                    }
                }
            }
            text
        }
        _ => {
            return Err(ApiError::invalid(
                "messages",
                "messages: the last message's content must be text or text parts",
            ));
        }
    };
    if text.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "messages: the last message's content is empty",
        ));
    }
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::invalid("stream", "stream: must be a boolean")),
    };
    let include_usage = match body.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ApiError::invalid(
                    "stream_options",
                    "stream_options.include_usage: must be a boolean",
                ));
            }
        },
        Some(_) => {
            return Err(ApiError::invalid(
                "stream_options",
                "stream_options: must be an object",
            ));
        }
    };
    match body.get("n") {
        None | Some(Value::Null) => {}
        Some(n) if n.as_u64() == Some(1) => {}
        Some(_) => {
            return Err(ApiError::invalid(
                "n",
                "n: an agent gives one answer per turn; only 1 is served",
            ));
        }
    }
    let user = match body.get("user") {
        None | Some(Value::Null) => None,
        Some(Value::String(u)) if !u.is_empty() => {
            name("user", u)?;
            Some(u.clone())
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "user",
                "user: must be a non-empty string",
            ));
        }
    };
    Ok(Ask {
        model,
        text,
        stream,
        include_usage,
        user,
    })
}

/// The conversation's thread: the `Homing-Thread` header's, else the user's, else a new one.
fn thread_of(headers: &HeaderMap, ask: &Ask) -> Result<String, ApiError> {
    if let Some(value) = headers.get(THREAD_HEADER) {
        let thread = value.to_str().map_err(|_| {
            ApiError::invalid(THREAD_HEADER, "Homing-Thread: must be printable text")
        })?;
        name(THREAD_HEADER, thread)?;
        return Ok(thread.to_owned());
    }
    let thread = match &ask.user {
        Some(user) => format!("openai.{}.{user}", ask.model),
        None => format!("openai.{}.{}", ask.model, uuid::Uuid::now_v7()),
    };
    name("user", &thread)?;
    Ok(thread)
}

/// `POST /openai/v1/chat/completions`.
async fn chat(
    State(state): State<Arc<ApiState>>,
    caller: Option<axum::Extension<Caller>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let api = state.config().api.clone();
    let limit = api.request_timeout + api.max_wait;
    match tokio::time::timeout(limit, turn(&state, caller, &headers, body)).await {
        Ok(Ok(response)) => response,
        Ok(Err(refused)) => refused.into_response(),
        Err(_) => Refusal::new(ApiError::timeout(limit)).into_response(),
    }
}

/// A refusal in OpenAI's shape, with the thread and dispatch when they are known; once the
/// message is stored, it tells the SDKs not to retry.
struct Refusal {
    error: ApiError,
    thread: Option<String>,
    dispatch: Option<String>,
    stored: bool,
}

impl Refusal {
    fn new(error: ApiError) -> Refusal {
        Refusal {
            error,
            thread: None,
            dispatch: None,
            stored: false,
        }
    }
}

impl From<ApiError> for Refusal {
    fn from(error: ApiError) -> Refusal {
        Refusal::new(error)
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut response = self.error.openai_shape();
        let headers = response.headers_mut();
        ids(headers, self.thread.as_deref(), self.dispatch.as_deref());
        if self.stored {
            headers.insert(
                HeaderName::from_static("x-should-retry"),
                HeaderValue::from_static("false"),
            );
        }
        response
    }
}

/// Sets the `Homing-Thread` and `Homing-Dispatch` headers.
fn ids(headers: &mut HeaderMap, thread: Option<&str>, dispatch: Option<&str>) {
    for (header, value) in [(THREAD_HEADER, thread), (DISPATCH_HEADER, dispatch)] {
        if let Some(value) = value.and_then(|v| HeaderValue::from_str(v).ok()) {
            headers.insert(HeaderName::from_static(header), value);
        }
    }
}

/// One turn: the message sent, the run that answers it found, then its output awaited (or
/// streamed).
async fn turn(
    state: &Arc<ApiState>,
    caller: Option<axum::Extension<Caller>>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Refusal> {
    let config = state.config();
    let bytes = read_body(headers, body, state.body_limit).await?;
    let ask = ask(&config, object(&bytes)?)?;
    let thread = thread_of(headers, &ask)?;
    let token = caller.map_or_else(|| "-".to_owned(), |axum::Extension(c)| c.name);
    // Opened before the message is stored, so a stream never waits for a slot after it.
    let permit = if ask.stream {
        Some(state.streams.open(&token)?)
    } else {
        None
    };
    let new = NewMessage::new(
        MessageKind::FollowUp,
        ask.text.as_bytes(),
        format!("openai:{token}"),
    )
    .to_agent(ask.model.clone());
    let sent = messages::send(&state.store, &config, &thread, new)
        .await
        .map_err(ApiError::from)?;
    info!(
        thread = %thread.escape_debug(),
        seq = sent.message.seq,
        model = %ask.model,
        token = %token,
        "chat turn sent through the OpenAI-compatible endpoint"
    );
    let stored = |error: ApiError, dispatch: Option<&str>| Refusal {
        error,
        thread: Some(thread.clone()),
        dispatch: dispatch.map(str::to_owned),
        stored: true,
    };
    let until = tokio::time::Instant::now() + config.api.max_wait;
    let dispatch = match answering(&state.store, &thread, &ask.model, &sent, until).await {
        Ok(Some(id)) => id,
        Ok(None) => {
            return Err(stored(
                ApiError::gateway_timeout(format!(
                    "no run took the message within [api] max_wait ({:?}); it stays in thread \
                     `{}` as message {}",
                    config.api.max_wait,
                    thread.escape_debug(),
                    sent.message.seq
                )),
                None,
            ));
        }
        Err(e) => return Err(stored(e, None)),
    };
    let created = state.store.clock.now_ms() / 1000;
    let completion = Completion {
        id: format!("chatcmpl-{dispatch}"),
        model: ask.model.clone(),
        created,
    };
    if let Some(permit) = permit {
        let follower = match Follower::open(&state.live, &dispatch, None).await {
            Ok(Some(follower)) => follower,
            Ok(None) => {
                return Err(stored(
                    ApiError::not_found(format!("dispatch `{dispatch}` is gone")),
                    Some(&dispatch),
                ));
            }
            Err(e) => return Err(stored(e.into(), Some(&dispatch))),
        };
        let chunks = Chunks {
            follower,
            completion,
            until: tokio::time::Instant::now() + config.api.max_stream,
            shutdown: state.shutdown.clone(),
            phase: Phase::Start,
            include_usage: ask.include_usage,
            usage: None,
            streamed: Vec::new(),
            emitted: 0,
            reset: false,
            _permit: permit,
        };
        let mut response = Sse::new(stream::unfold(chunks, Chunks::next))
            .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
            .into_response();
        ids(response.headers_mut(), Some(&thread), Some(&dispatch));
        return Ok(response);
    }
    let remaining = until.saturating_duration_since(tokio::time::Instant::now());
    let done = crate::work::until_terminal(
        &state.store,
        &dispatch,
        remaining,
        Some(state.shutdown.clone()),
    )
    .await
    .map_err(|e| stored(e.into(), Some(&dispatch)))?;
    if !done.status.is_terminal() {
        return Err(stored(
            ApiError::gateway_timeout(format!(
                "the run had not finished within [api] max_wait ({:?}); follow dispatch `{dispatch}` \
                 at /v1/dispatches/{dispatch}",
                config.api.max_wait
            )),
            Some(&dispatch),
        ));
    }
    if done.status != Status::Acked {
        return Err(stored(failed(&done), Some(&dispatch)));
    }
    let usage = done.usage;
    let output = done.result.map(|r| r.output).unwrap_or_default();
    let mut whole = completion.whole(&String::from_utf8_lossy(&output));
    if let (Some(usage), Some(map)) = (usage, whole.as_object_mut()) {
        map.insert("usage".into(), usage_json(&usage));
    }
    let mut response = Json(whole).into_response();
    ids(response.headers_mut(), Some(&thread), Some(&dispatch));
    Ok(response)
}

/// The error of a run that ended without an answer.
fn failed(d: &crate::store::Dispatch) -> ApiError {
    let why = d
        .last_error
        .clone()
        .unwrap_or_else(|| "no error recorded".to_owned());
    ApiError::bad_gateway(format!(
        "the run ended {} without an answer: {why}",
        d.status.as_str()
    ))
}

/// The dispatch whose output answers message `sent`: the turn the send started for `model`
/// when it started one, else the run that acknowledged the message, waited for until `until`
/// (`None` when no run took it by then).
async fn answering(
    store: &Store,
    thread: &str,
    model: &str,
    sent: &Sent,
    until: tokio::time::Instant,
) -> Result<Option<String>, ApiError> {
    for id in &sent.follow_ups {
        if let Some(d) = store.mailbox.load(id).await?
            && d.agent == model
        {
            return Ok(Some(id.clone()));
        }
    }
    let seq = sent.message.seq;
    let left = until.saturating_duration_since(tokio::time::Instant::now());
    let Some(message) = messages::until_settled(store, thread, seq, left).await? else {
        return Ok(None);
    };
    match (message.state, message.acked_by) {
        (MessageState::Acked, Some(by)) => Ok(Some(by)),
        _ => Err(ApiError::conflict(format!(
            "message {seq} of thread `{}` was discarded before a run took it",
            thread.escape_debug()
        ))),
    }
}

impl From<StoreError> for Refusal {
    fn from(e: StoreError) -> Refusal {
        Refusal::new(e.into())
    }
}

/// A dispatch's metered tokens as OpenAI's `usage`.
fn usage_json(u: &crate::store::model::Usage) -> Value {
    json!({
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.input_tokens.saturating_add(u.output_tokens),
        "prompt_tokens_details": { "cached_tokens": u.cached_tokens },
    })
}

/// The parts every completion object of one answer shares.
struct Completion {
    id: String,
    model: String,
    created: u64,
}

impl Completion {
    /// A `chat.completion` with the whole answer.
    fn whole(&self, text: &str) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": { "role": "assistant", "content": text, "refusal": null },
                "finish_reason": "stop",
                "logprobs": null,
            }],
        })
    }

    /// A `chat.completion.chunk` with `delta`, and the reason the answer ended in the last.
    fn chunk(&self, delta: Value, finish: Option<&str>) -> Event {
        Event::default().data(
            json!({
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [{ "index": 0, "delta": delta, "finish_reason": finish, "logprobs": null }],
            })
            .to_string(),
        )
    }
}

/// Where a streamed answer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The role chunk is next.
    Start,
    /// Following the run.
    Running,
    /// The `[DONE]` line is next.
    Done,
    /// Nothing more.
    Ended,
}

/// A streamed answer: the run's deltas as chunks.
struct Chunks {
    follower: Follower,
    completion: Completion,
    until: tokio::time::Instant,
    shutdown: watch::Receiver<bool>,
    phase: Phase,
    /// `stream_options.include_usage`: a last chunk carries the usage.
    include_usage: bool,
    /// That last chunk's usage, once the run ended (`Null` when nothing was metered).
    usage: Option<Value>,
    /// The bytes streamed so far, of the first claim's deltas.
    streamed: Vec<u8>,
    /// How many of them went to the client (whole characters only).
    emitted: usize,
    /// A later claim started: its deltas are not streamed (a chunk cannot be taken back); the
    /// result says what the earlier stream left out, when it extends it.
    reset: bool,
    _permit: StreamPermit,
}

impl Chunks {
    async fn next(mut self) -> Option<(Result<Event, Infallible>, Chunks)> {
        loop {
            match self.phase {
                Phase::Start => {
                    self.phase = Phase::Running;
                    let role = json!({ "role": "assistant", "content": "" });
                    return Some((Ok(self.completion.chunk(role, None)), self));
                }
                Phase::Done => {
                    if let Some(usage) = self.usage.take() {
                        let c = &self.completion;
                        let chunk = json!({
                            "id": c.id, "object": "chat.completion.chunk", "created": c.created,
                            "model": c.model, "choices": [], "usage": usage,
                        });
                        return Some((Ok(Event::default().data(chunk.to_string())), self));
                    }
                    self.phase = Phase::Ended;
                    return Some((Ok(Event::default().data("[DONE]")), self));
                }
                Phase::Ended => return None,
                Phase::Running => {}
            }
            if *self.shutdown.borrow() {
                return self.error("the host is stopping; the run goes on");
            }
            let until = self.until;
            let next = tokio::select! {
                next = self.follower.next() => next,
                () = tokio::time::sleep_until(until) => {
                    return self.error("the stream reached [api] max_stream; the run goes on");
                }
                _ = self.shutdown.changed() => {
                    return self.error("the host is stopping; the run goes on");
                }
            };
            match next {
                Ok(Some(LiveEvent::Delta { chunk, .. })) if !self.reset => {
                    self.streamed.extend_from_slice(&chunk);
                    if let Some(text) = take_text(&self.streamed, &mut self.emitted) {
                        return Some((
                            Ok(self.completion.chunk(json!({ "content": text }), None)),
                            self,
                        ));
                    }
                }
                Ok(Some(LiveEvent::Reset { .. })) => self.reset = true,
                Ok(Some(LiveEvent::Result(d))) => {
                    if d.status != Status::Acked {
                        let error = failed(&d);
                        return self.error(&error.message());
                    }
                    if self.include_usage {
                        self.usage = Some(d.usage.as_ref().map_or(Value::Null, usage_json));
                    }
                    let output = d.result.map(|r| r.output).unwrap_or_default();
                    let sent = self.streamed.get(..self.emitted).unwrap_or_default();
                    let rest = output
                        .strip_prefix(sent)
                        .map(|rest| String::from_utf8_lossy(rest).into_owned())
                        .unwrap_or_default();
                    self.phase = Phase::Done;
                    let delta = if rest.is_empty() {
                        json!({})
                    } else {
                        json!({ "content": rest })
                    };
                    return Some((Ok(self.completion.chunk(delta, Some("stop"))), self));
                }
                Ok(Some(LiveEvent::Dropped { .. })) => {
                    return self.error("the client stayed too far behind the stream");
                }
                Ok(Some(_)) => {}
                Ok(None) => return None,
                Err(e) => {
                    tracing::warn!("OpenAI-compatible stream: {e}");
                    return self.error("the run's stream could not be read");
                }
            }
        }
    }

    /// Ends the stream with an error event (which the SDKs raise).
    fn error(mut self, message: &str) -> Option<(Result<Event, Infallible>, Chunks)> {
        self.phase = Phase::Ended;
        let event = Event::default().data(
            json!({ "error": { "message": message, "type": "server_error", "param": null, "code": null } })
                .to_string(),
        );
        Some((Ok(event), self))
    }
}

/// The text of `bytes` after `emitted` that completes UTF-8 characters, moving `emitted` past
/// it: a character split across deltas is sent once its last byte came. `None` when nothing is
/// complete yet. Bytes that can never be UTF-8 show as U+FFFD.
fn take_text(bytes: &[u8], emitted: &mut usize) -> Option<String> {
    let tail = bytes.get(*emitted..)?;
    let end = match std::str::from_utf8(tail) {
        Ok(_) => tail.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => tail.len(),
    };
    if end == 0 {
        return None;
    }
    *emitted += end;
    Some(String::from_utf8_lossy(&tail[..end]).into_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_character_split_across_deltas_is_sent_whole_once_complete() {
        let text = "né";
        let bytes = text.as_bytes();
        let mut emitted = 0;
        assert_eq!(take_text(&bytes[..2], &mut emitted).as_deref(), Some("n"));
        assert_eq!(take_text(&bytes[..2], &mut emitted), None);
        assert_eq!(take_text(bytes, &mut emitted).as_deref(), Some("é"));
        assert_eq!(emitted, bytes.len());
        let mut emitted = 0;
        assert_eq!(
            take_text(b"a\xffb", &mut emitted).as_deref(),
            Some("a\u{fffd}b")
        );
    }

    fn config(plugins: &str) -> Config {
        Config::parse(plugins, "homing.toml", std::path::Path::new(".")).unwrap()
    }

    fn body(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn a_request_is_refused_naming_what_was_wrong() {
        let config = config(
            "[plugins.a]\npath = \"a.wasm\"\n[plugins.a.openai]\nexpose = true\n\
             [plugins.b]\npath = \"b.wasm\"\n",
        );
        let user = |content: Value| json!([{ "role": "user", "content": content }]);
        let cases = [
            (json!({ "messages": user(json!("hi")) }), "model"),
            (
                json!({ "model": "b", "messages": user(json!("hi")) }),
                "model",
            ),
            (
                json!({ "model": "nope", "messages": user(json!("hi")) }),
                "model",
            ),
            (json!({ "model": "a" }), "messages"),
            (json!({ "model": "a", "messages": [] }), "messages"),
            (
                json!({ "model": "a", "messages": [{ "role": "assistant", "content": "x" }] }),
                "messages",
            ),
            (
                json!({ "model": "a", "messages": user(json!("")) }),
                "messages",
            ),
            (
                json!({ "model": "a", "messages": user(json!([{ "type": "image_url", "image_url": {} }])) }),
                "messages",
            ),
            (
                json!({ "model": "a", "messages": user(json!("hi")), "stream": "yes" }),
                "stream",
            ),
            (
                json!({ "model": "a", "messages": user(json!("hi")), "n": 2 }),
                "n",
            ),
            (
                json!({ "model": "a", "messages": user(json!("hi")), "stream_options": true }),
                "stream_options",
            ),
            (
                json!({ "model": "a", "messages": user(json!("hi")), "stream_options": { "include_usage": "yes" } }),
                "stream_options",
            ),
            (
                json!({ "model": "a", "messages": user(json!("hi")), "user": 7 }),
                "user",
            ),
            (
                json!({ "model": "a", "messages": user(json!("hi")), "user": "a\u{7}b" }),
                "user",
            ),
        ];
        for (request, field) in cases {
            let refused = ask(&config, body(request.clone())).unwrap_err();
            let response = refused.openai_shape();
            assert!(response.status().is_client_error(), "{request}");
            let text = format!("{:?}", ask(&config, body(request.clone())).unwrap_err());
            assert!(text.contains(field), "{request}: {text}");
        }
        let fine = ask(
            &config,
            body(json!({
                "model": "a",
                "messages": [
                    { "role": "system", "content": "be brief" },
                    { "role": "user", "content": [{ "type": "text", "text": "hello " }, { "type": "text", "text": "there" }] },
                ],
                "temperature": 0.2,
                "stream": true,
                "user": "ada",
            })),
        )
        .unwrap();
        assert_eq!(fine.text, "hello there");
        assert!(fine.stream);
        assert_eq!(thread_of(&HeaderMap::new(), &fine).unwrap(), "openai.a.ada");
        let mut headers = HeaderMap::new();
        headers.insert(THREAD_HEADER, HeaderValue::from_static("chat-7"));
        assert_eq!(thread_of(&headers, &fine).unwrap(), "chat-7");
    }
}
