//! `/v1/schedules`: list, show, create, pause, resume, trigger, backfill and delete schedules
//! (docs/contract.md section 16). A schedule created here takes the keys of a
//! `[schedules.<name>]` table as a JSON object, with its `name`; a payload comes as `payload`
//! (text) or `payload_base64`, never from a file of the host.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::dispatches::{Fields, MAX_PAGE_BYTES, object, read_body};
use super::journal::{PAGE_SHARE, reserve};
use super::{ApiError, ApiState};
use crate::config::schedules::ScheduleConfig;
use crate::store::model::schedules::{Overlap, Source};
use crate::store::rules::schedules::{check_schedule_name, fire_label};
use crate::work::schedules::{self as sched, ScheduleError};

impl From<ScheduleError> for ApiError {
    fn from(e: ScheduleError) -> ApiError {
        match e {
            ScheduleError::NotFound(_) => ApiError::not_found(e.to_string()),
            ScheduleError::Exists(_) => ApiError::conflict(e.to_string()),
            ScheduleError::Invalid(message) => {
                let field = message
                    .split_once(':')
                    .map(|(field, _)| field.split('.').next().unwrap_or(field))
                    .filter(|f| {
                        !f.is_empty() && f.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                    })
                    .unwrap_or("body")
                    .to_owned();
                ApiError::invalid(&field, message)
            }
            ScheduleError::Store(e) => e.into(),
        }
    }
}

/// A schedule's view as JSON.
fn shown(view: sched::ScheduleView) -> Result<Value, ApiError> {
    serde_json::to_value(view)
        .map_err(|e| ApiError::unprocessable(format!("the schedule cannot be shown: {e}")))
}

fn schedule_name(name: &str) -> Result<(), ApiError> {
    check_schedule_name(name).map_err(|e| ApiError::invalid("name", e))
}

/// `GET /v1/schedules?after=&limit=`: a page of schedules by name, each with its next fires,
/// at most `limit` (100) and about [`MAX_PAGE_BYTES`] of records; `next_after` names the last
/// when there may be more.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    after: Option<String>,
    limit: Option<usize>,
}

/// The most schedules one page lists.
const MAX_PAGE: usize = 100;

pub(super) async fn list(
    State(state): State<Arc<ApiState>>,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = q.limit.unwrap_or(MAX_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::invalid(
            "limit",
            format!("limit: must be from 1 to {MAX_PAGE}"),
        ));
    }
    // The store reads at most the page's bytes (and one record), under a share of the read
    // budget held until the answer is made.
    let _share = reserve(PAGE_SHARE).await?;
    let page = state
        .store
        .schedules
        .schedules(q.after.as_deref(), limit, Some(MAX_PAGE_BYTES))
        .await?;
    let now = state.store.now();
    // A page ended by its count or by its bytes may have more after it.
    let bytes: usize = page
        .iter()
        .map(|s| serde_json::to_vec(&s.schedule).map_or(0, |v| v.len()))
        .sum();
    let next = (page.len() == limit || bytes >= MAX_PAGE_BYTES)
        .then(|| page.last().map(|s| s.schedule.def.name.clone()))
        .flatten();
    let views: Vec<_> = page.into_iter().map(|s| sched::view(s, now)).collect();
    Ok(Json(json!({ "schedules": views, "next_after": next })))
}

/// `GET /v1/schedules/{name}`.
pub(super) async fn show(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    schedule_name(&name)?;
    Ok(Json(shown(sched::show(&state.store, &name).await?)?))
}

/// `POST /v1/schedules`: the keys of a `[schedules.<name>]` table and its `name` → the new
/// schedule, 201.
pub(super) async fn create(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<(axum::http::StatusCode, Json<Value>), ApiError> {
    let config = state.config();
    let bytes = read_body(&headers, body, state.body_limit).await?;
    let mut map: Map<String, Value> = object(&bytes)?;
    let name = match map.remove("name") {
        Some(Value::String(name)) => name,
        Some(_) => return Err(ApiError::invalid("name", "name: must be a string")),
        None => return Err(ApiError::invalid("name", "name: is required")),
    };
    schedule_name(&name)?;
    if map.contains_key("payload_file") {
        return Err(ApiError::invalid(
            "payload_file",
            "payload_file: not accepted over the API (the host's files are not the caller's); \
             send payload or payload_base64",
        ));
    }
    // The payload, as every route takes one; the rest is the table.
    let mut payload_map = Map::new();
    for key in ["payload", "payload_base64"] {
        if let Some(v) = map.remove(key) {
            payload_map.insert(key.to_owned(), v);
        }
    }
    let payload = Fields::new(payload_map).payload()?;
    if payload.len() as u64 > config.host.max_payload {
        return Err(ApiError::invalid(
            "payload",
            format!(
                "payload: {} bytes exceeds [host] max_payload of {} bytes",
                payload.len(),
                config.host.max_payload
            ),
        ));
    }
    let table: ScheduleConfig = serde_json::from_value(Value::Object(map)).map_err(|e| {
        let message = e.to_string();
        let field = message
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split('`').next())
            .unwrap_or("body")
            .to_owned();
        ApiError::invalid(&field, format!("{field}: {message}"))
    })?;
    if !config.plugins.contains_key(&table.agent) {
        return Err(ApiError::invalid(
            "agent",
            format!(
                "agent: `{}` is not a plugin of this host",
                table.agent.escape_debug()
            ),
        ));
    }
    let def = sched::def_of(&name, &table, payload)
        .map_err(|(key, why)| ApiError::invalid(&key, format!("{key}: {why}")))?;
    let stored = sched::create(&state.store, def, Source::Api).await?;
    let view = sched::view(stored, state.store.now());
    Ok((axum::http::StatusCode::CREATED, Json(shown(view)?)))
}

/// `DELETE /v1/schedules/{name}` → `{"name", "deleted": true}`; 404 when there is none.
pub(super) async fn delete(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    schedule_name(&name)?;
    if sched::delete(&state.store, &name).await? {
        Ok(Json(json!({ "name": name, "deleted": true })))
    } else {
        Err(ApiError::not_found(format!("no schedule `{name}`")))
    }
}

/// The JSON object of an action on schedule `name` (its name checked first); an empty body is
/// `{}` when `empty_ok`.
async fn action_body(
    state: &ApiState,
    name: &str,
    headers: &HeaderMap,
    body: Body,
    empty_ok: bool,
) -> Result<Map<String, Value>, ApiError> {
    schedule_name(name)?;
    let bytes = read_body(headers, body, state.body_limit).await?;
    if empty_ok && bytes.is_empty() {
        return Ok(Map::new());
    }
    object(&bytes)
}

/// `POST /v1/schedules/{name}/pause`: `{"reason"?}`.
pub(super) async fn pause(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let mut fields = Fields::new(action_body(&state, &name, &headers, body, false).await?);
    let reason = fields.string("reason")?.unwrap_or_default();
    fields.finish()?;
    let stored = sched::pause(&state.store, &name, &reason).await?;
    Ok(Json(
        json!({ "name": name, "paused": stored.schedule.paused }),
    ))
}

/// `POST /v1/schedules/{name}/resume`: `{"catch_up"?: bool}`.
pub(super) async fn resume(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let mut map = action_body(&state, &name, &headers, body, false).await?;
    let catch_up = match map.remove("catch_up") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => b,
        Some(_) => return Err(ApiError::invalid("catch_up", "catch_up: must be a boolean")),
    };
    Fields::new(map).finish()?;
    sched::resume(&state.store, &name, catch_up).await?;
    Ok(Json(json!({ "name": name, "resumed": true })))
}

/// An optional `overlap` of a trigger's or a backfill's body.
fn overlap_field(fields: &mut Fields) -> Result<Option<Overlap>, ApiError> {
    fields
        .string("overlap")?
        .map(|o| o.parse::<Overlap>())
        .transpose()
        .map_err(|e| ApiError::invalid("overlap", format!("overlap: {e}")))
}

/// A manual slot's outcome as JSON.
fn manual(m: &sched::Manual) -> Value {
    let mut v = json!({
        "fire": fire_label(m.fire),
        "outcome": m.outcome,
    });
    if let Some(id) = &m.id {
        v["id"] = json!(id);
    }
    if let Some(live) = &m.live {
        v["live"] = json!(live);
    }
    v
}

/// `POST /v1/schedules/{name}/trigger`: `{"overlap"?}` (default: the schedule's) → the slot's
/// outcome: `fired` with the dispatch's `id`, `buffered`, or the skip's reason with the `live`
/// dispatch it overlapped.
pub(super) async fn trigger(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let mut fields = Fields::new(action_body(&state, &name, &headers, body, true).await?);
    let overlap = overlap_field(&mut fields)?;
    fields.finish()?;
    let m = sched::trigger(&state.store, &name, overlap).await?;
    let mut v = manual(&m);
    v["name"] = json!(name);
    Ok(Json(v))
}

/// `POST /v1/schedules/{name}/backfill`: `{"from", "to", "overlap"?}` (RFC 3339; the overlap
/// policy defaults to the schedule's) → each slot's outcome, oldest first.
pub(super) async fn backfill(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let mut fields = Fields::new(action_body(&state, &name, &headers, body, false).await?);
    let time = |fields: &mut Fields, key: &str| -> Result<u64, ApiError> {
        let text = fields
            .string(key)?
            .ok_or_else(|| ApiError::invalid(key, format!("{key}: is required")))?;
        sched::parse_time(&text).map_err(|e| ApiError::invalid(key, format!("{key}: {e}")))
    };
    let from = time(&mut fields, "from")?;
    let to = time(&mut fields, "to")?;
    let overlap = overlap_field(&mut fields)?;
    fields.finish()?;
    let slots = sched::backfill(&state.store, &name, from, to, overlap).await?;
    let ids: Vec<&str> = slots.iter().filter_map(|m| m.id.as_deref()).collect();
    let slots: Vec<Value> = slots.iter().map(manual).collect();
    Ok(Json(json!({ "name": name, "ids": ids, "slots": slots })))
}
