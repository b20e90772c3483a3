//! `/v1/dispatches`: enqueue, list, show (with a long poll), cancel, retry.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::{Body, BodyDataStream};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use futures_util::StreamExt;
use serde_json::{Map, Value, json};
use tracing::info;

use super::auth::Caller;
use super::{ApiError, ApiState, view};
use crate::config::parse_duration;
use crate::store::model::{Debounce, Gather};
use crate::store::{ListCursor, ListFilter, Status};
use crate::work::{self, Attempts, OpError, Request};

/// The most rows one page of the list holds.
pub(crate) const MAX_PAGE: usize = 1000;

/// The most bytes of rows (or log entries) one page carries: a page that would pass it ends
/// early, with its `next_cursor` (its last entry's `seq`), and always holds at least one.
pub(crate) const MAX_PAGE_BYTES: usize = 2 << 20;

/// Rows read by the first store call of a page of the list; later calls read as many as the
/// rows read so far say fit in what is left of [`MAX_PAGE_BYTES`]. So a page of small rows
/// is two store calls at most (on NATS, across threads, each is a read of every record),
/// and a page of big rows never holds many more than fit the cap.
const LIST_BATCH: usize = 100;

/// Checks a dispatch id, agent or thread name taken from a route's path or query, as enqueue
/// checks it (one rule for every route): 400 naming `field` when it is blank, longer than
/// enqueue allows or not printable.
pub(super) fn name(field: &str, value: &str) -> Result<(), ApiError> {
    crate::store::model::check_name(field, value).map_err(|e| ApiError::invalid(field, e))
}

impl From<OpError> for ApiError {
    fn from(e: OpError) -> ApiError {
        match e {
            OpError::NotFound(id) => ApiError::not_found(format!("no dispatch `{id}`")),
            e @ OpError::WrongState { status, .. } => {
                ApiError::conflict(e.to_string()).with("status", status.as_str())
            }
            OpError::Store(e) => e.into(),
        }
    }
}

/// Reads a request body up to `limit` bytes: 413 past it (at once when `Content-Length`
/// says so, else as soon as the bytes read pass it).
///
/// Before a 413 the rest of a body of moderate size is read and dropped ([`drain`]): a
/// server that answers and closes while the client is still sending makes most clients
/// report a broken connection instead of the 413.
pub(super) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: u64,
) -> Result<Vec<u8>, ApiError> {
    let too_large = || {
        ApiError::too_large(
            "body",
            format!("the request body exceeds [api] max_body ({limit} bytes)"),
            limit,
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut stream = body.into_data_stream();
    if declared.is_some_and(|n| n > limit) {
        if declared.is_some_and(|n| n <= DRAIN_LIMIT) {
            drain(&mut stream, 0).await;
        }
        return Err(too_large());
    }
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|_| ApiError::invalid("body", "the request body could not be read"))?;
        if (out.len() + chunk.len()) as u64 > limit {
            drain(&mut stream, (out.len() + chunk.len()) as u64).await;
            return Err(too_large());
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// The most of a refused body that is read and dropped before the 413.
const DRAIN_LIMIT: u64 = 1 << 20;
/// The longest a refused body is read for.
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// Reads and drops the rest of a refused body, `read` bytes of it already read, up to
/// [`DRAIN_LIMIT`] in all and for at most [`DRAIN_TIME`]; past either the connection closes
/// after the answer, as it would have anyway.
async fn drain(stream: &mut BodyDataStream, mut read: u64) {
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while read <= DRAIN_LIMIT {
            match stream.next().await {
                Some(Ok(chunk)) => read += chunk.len() as u64,
                _ => return,
            }
        }
    })
    .await;
}

/// A JSON object body, or 400.
pub(super) fn object(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::invalid("body", "the body must be a JSON object")),
        Err(e) => Err(ApiError::invalid(
            "body",
            format!("the body is not valid JSON: {e}"),
        )),
    }
}

/// The fields of a JSON object, taken one by one; what is left over is an unknown field.
pub(super) struct Fields(Map<String, Value>);

impl Fields {
    pub(super) fn new(map: Map<String, Value>) -> Fields {
        Fields(map)
    }

    pub(super) fn string(&mut self, key: &str) -> Result<Option<String>, ApiError> {
        match self.0.remove(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ApiError::invalid(key, format!("{key}: must be a string"))),
        }
    }

    fn required(&mut self, key: &str) -> Result<String, ApiError> {
        self.string(key)?
            .ok_or_else(|| ApiError::invalid(key, format!("{key}: is required")))
    }

    /// `payload` (text) or `payload_base64`, not both; empty when neither is given.
    pub(super) fn payload(&mut self) -> Result<Vec<u8>, ApiError> {
        let text = self.string("payload")?;
        let encoded = self.string("payload_base64")?;
        match (text, encoded) {
            (Some(_), Some(_)) => Err(ApiError::invalid(
                "payload_base64",
                "give payload or payload_base64, not both",
            )),
            (Some(text), None) => Ok(text.into_bytes()),
            (None, Some(encoded)) => STANDARD.decode(encoded.as_bytes()).map_err(|e| {
                ApiError::invalid("payload_base64", format!("payload_base64: not base64: {e}"))
            }),
            (None, None) => Ok(Vec::new()),
        }
    }

    /// `metadata`: an object of strings (empty when absent).
    pub(super) fn metadata(
        &mut self,
    ) -> Result<std::collections::BTreeMap<String, String>, ApiError> {
        let mut metadata = std::collections::BTreeMap::new();
        match self.take("metadata") {
            None => {}
            Some(Value::Object(map)) => {
                for (key, value) in map {
                    let Value::String(value) = value else {
                        return Err(ApiError::invalid(
                            "metadata",
                            format!("metadata: `{key}` must be a string"),
                        ));
                    };
                    metadata.insert(key, value);
                }
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    "metadata",
                    "metadata: must be an object of strings",
                ));
            }
        }
        Ok(metadata)
    }

    pub(super) fn integer(
        &mut self,
        key: &str,
        min: u64,
        max: u64,
    ) -> Result<Option<u64>, ApiError> {
        match self.0.remove(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => match n.as_u64() {
                Some(v) if (min..=max).contains(&v) => Ok(Some(v)),
                _ => Err(ApiError::invalid(
                    key,
                    format!("{key}: must be an integer from {min} to {max}"),
                )),
            },
            Some(_) => Err(ApiError::invalid(key, format!("{key}: must be an integer"))),
        }
    }

    /// A duration: text (`"30s"`) or whole milliseconds. `field` names it in errors.
    fn duration(&mut self, key: &str) -> Result<Option<Duration>, ApiError> {
        duration_of(key, self.take(key))
    }

    /// `debounce`: `{key, quiet, max_wait, payload, max_items}` (`payload` `last`, `first`
    /// or `collect`, default `last`; `max_items` default 100), each checked by the store's
    /// rules and named `debounce.<field>` when wrong.
    fn debounce(&mut self) -> Result<Option<Debounce>, ApiError> {
        let Some(value) = self.take("debounce") else {
            return Ok(None);
        };
        let Value::Object(map) = value else {
            return Err(ApiError::invalid(
                "debounce",
                "debounce: must be an object {key, quiet, max_wait, payload, max_items}",
            ));
        };
        let mut f = Fields::new(map);
        let named = |e: ApiError| e.prefixed("debounce.");
        let key = f.required("key").map_err(named)?;
        let quiet = f.duration("quiet").map_err(named)?;
        let max_wait = f.duration("max_wait").map_err(named)?;
        let payload = match f.string("payload").map_err(named)? {
            None => Gather::Last,
            Some(text) => text.parse().map_err(|e: String| {
                ApiError::invalid("debounce.payload", format!("debounce.payload: {e}"))
            })?,
        };
        let max_items = f
            .integer(
                "max_items",
                1,
                u64::from(crate::store::model::window::MAX_WINDOW_ITEMS),
            )
            .map_err(named)?;
        f.finish().map_err(named)?;
        let (Some(quiet), Some(max_wait)) = (quiet, max_wait) else {
            let field = if quiet.is_none() { "quiet" } else { "max_wait" };
            return Err(ApiError::invalid(
                &format!("debounce.{field}"),
                format!("debounce.{field}: is required"),
            ));
        };
        Ok(Some(Debounce {
            key,
            quiet_ms: crate::store::millis(quiet),
            max_wait_ms: crate::store::millis(max_wait),
            payload,
            max_items: max_items.map_or(100, |n| u32::try_from(n).unwrap_or(u32::MAX)),
        }))
    }

    fn take(&mut self, key: &str) -> Option<Value> {
        self.0.remove(key).filter(|v| !v.is_null())
    }

    /// 400 naming the first field nobody asked for.
    pub(super) fn finish(self) -> Result<(), ApiError> {
        match self.0.keys().next() {
            Some(key) => Err(ApiError::invalid(key, format!("{key}: unknown field"))),
            None => Ok(()),
        }
    }
}

/// A duration field's value: text (`"30s"`) or whole milliseconds.
fn duration_of(key: &str, value: Option<Value>) -> Result<Option<Duration>, ApiError> {
    match value {
        None => Ok(None),
        Some(Value::String(text)) => parse_duration(&text)
            .map(Some)
            .map_err(|e| ApiError::invalid(key, format!("{key}: {e}"))),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(ms) => Ok(Some(Duration::from_millis(ms))),
            None => Err(ApiError::invalid(key, format!("{key}: must be a duration"))),
        },
        Some(_) => Err(ApiError::invalid(
            key,
            format!("{key}: a duration (\"30s\") or milliseconds"),
        )),
    }
}

/// A W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`), or `None` when malformed.
fn traceparent(headers: &HeaderMap) -> Option<String> {
    let value = headers.get("traceparent")?.to_str().ok()?.trim();
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (parts.len() == 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && parts[1] != "0".repeat(32)
        && hex(parts[2], 16)
        && parts[2] != "0".repeat(16)
        && hex(parts[3], 2))
    .then(|| value.to_ascii_lowercase())
}

/// `POST /v1/dispatches`.
pub(super) async fn enqueue(
    State(state): State<Arc<ApiState>>,
    caller: Option<axum::Extension<Caller>>,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    let pairs = params(query, &["stream"])?;
    let streamed = match param(&pairs, "stream") {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(ApiError::invalid("stream", "stream: `true` or `false`")),
    };
    // The stream's slot is taken before the enqueue, so a refused stream enqueues nothing.
    let permit = if streamed {
        let token = caller.as_ref().map_or("", |c| c.name.as_str());
        Some(state.streams.open(token)?)
    } else {
        None
    };
    let bytes = read_body(&headers, body, state.body_limit).await?;
    let mut fields = Fields::new(object(&bytes)?);
    let agent = fields.required("agent")?;
    let thread = fields.required("thread")?;
    let payload = fields.payload()?;
    let priority = fields.integer("priority", 0, 255)?;
    let max_attempts = fields.integer("max_attempts", 1, u64::from(u32::MAX))?;
    let dedupe_key = fields.string("dedupe_key")?;
    let concurrency_key = fields.string("concurrency_key")?;
    let id = fields.string("id")?;
    let delay = fields.duration("delay")?;
    let debounce = fields.debounce()?;
    let mut metadata = fields.metadata()?;
    fields.finish()?;
    name("agent", &agent)?;
    if !state.config().plugins.contains_key(&agent) {
        return Err(ApiError::not_found(format!("no agent `{agent}`")).with("field", "agent"));
    }
    if payload.len() as u64 > state.max_payload {
        return Err(ApiError::too_large(
            "payload",
            format!(
                "payload: {} bytes exceeds max_payload ({} bytes)",
                payload.len(),
                state.max_payload
            ),
            state.max_payload,
        ));
    }
    if let Some(parent) = traceparent(&headers) {
        metadata.insert("traceparent".into(), parent);
    }
    let attempts = Attempts::configured(&state.config(), &agent);
    let request = Request {
        id,
        priority: priority.map(|p| p as u8),
        delay: delay.unwrap_or_default(),
        metadata,
        dedupe_key,
        max_attempts: max_attempts.map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        concurrency_key,
        debounce: debounce.or_else(|| work::configured_debounce(&state.config(), &agent)),
        ..Request::new(agent, thread, payload)
    };
    let config = state.config();
    let keys = config.key_source(&request.agent);
    // The store's rules, refused naming the field (the first word of the message).
    let new = request.into_dispatch(attempts, keys).map_err(|message| {
        let field = message
            .split([' ', ':'])
            .next()
            .unwrap_or("body")
            .to_owned();
        ApiError::invalid(&field, message)
    })?;
    let d = state.store.mailbox.enqueue(new).await?;
    info!(
        dispatch = %d.id,
        agent = %d.agent,
        token = caller.as_ref().map_or("-", |c| c.name.as_str()),
        "enqueued through the API"
    );
    if let Some(permit) = permit {
        let Some(sse) = super::stream::open(&state, &d.id, None, permit).await? else {
            return Err(ApiError::not_found(format!("no dispatch `{}`", d.id)));
        };
        let id = header::HeaderValue::from_str(&d.id)
            .map_err(|_| ApiError::invalid("id", "id: not a valid header value"))?;
        let mut response = sse.into_response();
        response.headers_mut().insert("homing-dispatch-id", id);
        return Ok(response);
    }
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, view::dispatch_path(&d.id))],
        Json(match &d.window {
            // A debounced enqueue: the window that holds it, without its items (a GET of the
            // dispatch shows them).
            Some(w) => json!({
                "id": d.id,
                "status": d.status.as_str(),
                "window": {
                    "key": w.key,
                    "count": w.count,
                    "open": crate::store::rules::window::open_key(&d).is_some(),
                    "sealed": w.sealed,
                    "due_at": d.available_at,
                },
            }),
            None => json!({ "id": d.id, "status": d.status.as_str() }),
        }),
    )
        .into_response())
}

/// Query parameters as pairs, unknown ones refused.
pub(super) fn params(
    query: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
    known: &[&str],
) -> Result<Vec<(String, String)>, ApiError> {
    let Query(pairs) =
        query.map_err(|e| ApiError::invalid("query", format!("bad query string: {e}")))?;
    if let Some((key, _)) = pairs.iter().find(|(k, _)| !known.contains(&k.as_str())) {
        return Err(ApiError::invalid(
            key,
            format!("{key}: unknown query parameter"),
        ));
    }
    Ok(pairs)
}

pub(super) fn param<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// A `limit` parameter: 1 to [`MAX_PAGE`], default 100.
pub(super) fn limit(pairs: &[(String, String)]) -> Result<usize, ApiError> {
    match param(pairs, "limit") {
        None => Ok(100),
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=MAX_PAGE).contains(&n) => Ok(n),
            _ => Err(ApiError::invalid(
                "limit",
                format!("limit: must be an integer from 1 to {MAX_PAGE}"),
            )),
        },
    }
}

/// `GET /v1/dispatches?agent=&thread=&status=&limit=&cursor=`: rows without payloads or
/// outputs (their sizes instead), read from the store in batches sized to the page's byte
/// cap ([`LIST_BATCH`]), the page ending early rather than pass [`MAX_PAGE_BYTES`].
pub(super) async fn list(
    State(state): State<Arc<ApiState>>,
    query: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let pairs = params(query, &["agent", "thread", "status", "limit", "cursor"])?;
    let limit = limit(&pairs)?;
    let mut statuses = Vec::new();
    if let Some(text) = param(&pairs, "status") {
        for name in text.split(',').filter(|s| !s.is_empty()) {
            statuses.push(
                name.parse::<Status>()
                    .map_err(|e| ApiError::invalid("status", format!("status: {e}")))?,
            );
        }
    }
    let after = match param(&pairs, "cursor") {
        None => None,
        Some(text) => Some(
            text.parse::<ListCursor>()
                .map_err(|e| ApiError::invalid("cursor", format!("cursor: {e}")))?,
        ),
    };
    for field in ["agent", "thread"] {
        if let Some(value) = param(&pairs, field) {
            name(field, value)?;
        }
    }
    let mut filter = ListFilter {
        thread: param(&pairs, "thread").map(str::to_owned),
        agent: param(&pairs, "agent").map(str::to_owned),
        statuses,
        limit,
        after,
    };
    let mut body = b"{\"dispatches\":[".to_vec();
    let mut count = 0;
    let mut last = None;
    let mut cut = false;
    while count < limit && !cut {
        // After the first call, as many more as fit at the average size so far, and one to
        // find the end.
        filter.limit = match body.len().checked_div(count) {
            None => LIST_BATCH,
            Some(average) => MAX_PAGE_BYTES.saturating_sub(body.len()) / average.max(1) + 1,
        }
        .min(limit - count);
        let rows = state.store.mailbox.list_rows(&filter).await?;
        let read_all = rows.len() < filter.limit;
        for row in &rows {
            let text = view::row(row).to_string();
            if count > 0 && body.len() + text.len() + 64 > MAX_PAGE_BYTES {
                cut = true;
                break;
            }
            if count > 0 {
                body.push(b',');
            }
            body.extend_from_slice(text.as_bytes());
            count += 1;
            last = Some(row.cursor());
        }
        if read_all {
            break;
        }
        filter.after = last.clone();
    }
    let next = (cut || count == limit)
        .then(|| last.map(|c| c.to_string()))
        .flatten();
    body.extend_from_slice(b"],\"next_cursor\":");
    body.extend_from_slice(json!(next).to_string().as_bytes());
    body.push(b'}');
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// `GET /v1/dispatches/{id}?wait=30s`.
pub(super) async fn show(
    State(state): State<Arc<ApiState>>,
    Path(id): Path<String>,
    query: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    name("id", &id)?;
    let pairs = params(query, &["wait"])?;
    let max_wait = state.config().api.max_wait;
    let wait = match param(&pairs, "wait") {
        None => Duration::ZERO,
        Some(text) => {
            let wait = parse_duration(text)
                .map_err(|e| ApiError::invalid("wait", format!("wait: {e}")))?;
            if wait > max_wait {
                return Err(ApiError::invalid(
                    "wait",
                    format!("wait: at most {max_wait:?} ([api] max_wait)"),
                ));
            }
            wait
        }
    };
    // A long poll ends early when the server stops.
    let d = work::until_terminal(&state.store, &id, wait, Some(state.shutdown.clone())).await?;
    Ok(Json(view::dispatch(&d)))
}

/// `POST /v1/dispatches/{id}/cancel`.
pub(super) async fn cancel(
    State(state): State<Arc<ApiState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    name("id", &id)?;
    let d = work::cancel(&state.store, &id).await?;
    Ok(Json(view::dispatch(&d)))
}

/// `POST /v1/dispatches/{id}/retry`.
pub(super) async fn retry(
    State(state): State<Arc<ApiState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    name("id", &id)?;
    let d = work::retry(&state.config(), &state.store, &id).await?;
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, view::dispatch_path(&d.id))],
        Json(json!({ "id": d.id, "retry_of": id })),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn traceparent_is_kept_only_when_well_formed() {
        let mut headers = HeaderMap::new();
        let good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        headers.insert("traceparent", good.parse().unwrap());
        assert_eq!(traceparent(&headers).as_deref(), Some(good));
        for bad in [
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "zz-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01",
        ] {
            headers.insert("traceparent", bad.parse().unwrap());
            assert_eq!(traceparent(&headers), None, "{bad}");
        }
    }
}
