//! `/v1/dispatches/{id}/journal`: what a dispatch's runs recorded (readers). The view is
//! `work::journal`'s, shared with the CLI and the dashboard.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use serde_json::{Value, json};

use super::dispatches::{MAX_PAGE_BYTES, limit, name, param, params};
use super::{ApiError, ApiState};
use crate::work::journal::{self, EntryView, JournalError, StepView};

type RawQuery = Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>;

impl From<JournalError> for ApiError {
    fn from(e: JournalError) -> ApiError {
        match e {
            JournalError::NoDispatch(id) => ApiError::not_found(format!("no dispatch `{id}`")),
            e @ JournalError::NoEntry { .. } => ApiError::not_found(e.to_string()),
            JournalError::Store(e) => e.into(),
        }
    }
}

/// A position from a path or a query: 400 naming `field` unless it is a `u32`.
fn position(field: &str, text: &str) -> Result<u32, ApiError> {
    text.parse::<u32>().map_err(|_| {
        ApiError::invalid(
            field,
            format!("{field}: must be a journal position (an integer from 0)"),
        )
    })
}

/// `GET /v1/dispatches/{id}/journal?after=&limit=`: a page of the call entries after position
/// `after` (from the start without it), without bodies, and `next_cursor` (the `after` of the
/// next page) when there may be more; the first page (no `after`) also lists the steps, by
/// key, without values. 404 for an unknown dispatch; a dispatch without a journal has empty
/// lists.
pub(super) async fn list(
    State(state): State<Arc<ApiState>>,
    Path(id): Path<String>,
    query: RawQuery,
) -> Result<Json<Value>, ApiError> {
    name("id", &id)?;
    let pairs = params(query, &["after", "limit"])?;
    let limit = limit(&pairs)?;
    let after = param(&pairs, "after")
        .map(|text| position("after", text))
        .transpose()?;
    let data = journal::load(&state.store, &id).await?;
    let later = data
        .calls
        .iter()
        .filter(|c| after.is_none_or(|a| c.pos > a));
    // A page stops before passing the byte cap; the next starts after its last entry.
    let mut entries = Vec::new();
    let mut bytes = 0;
    let mut cut = false;
    let mut last = None;
    let mut remaining = false;
    for call in later {
        if entries.len() == limit {
            remaining = true;
            break;
        }
        let v = json!(EntryView::of(call));
        let size = v.to_string().len();
        if !entries.is_empty() && bytes + size > MAX_PAGE_BYTES {
            cut = true;
            break;
        }
        bytes += size + 1;
        entries.push(v);
        last = Some(call.pos);
    }
    let next = (cut || remaining).then_some(last).flatten();
    let mut out = json!({
        "dispatch": id,
        "entries": entries,
        "next_cursor": next,
        "bytes": data.bytes(),
    });
    if after.is_none()
        && let Value::Object(map) = &mut out
    {
        let steps: Vec<StepView> = data.steps.iter().map(StepView::of).collect();
        map.insert("steps".into(), json!(steps));
    }
    Ok(Json(out))
}

/// `GET /v1/dispatches/{id}/journal/{pos}`: one call entry with its whole answer and its body
/// (text, or base64 with `"encoding": "base64"`). 404 for an unknown dispatch or position.
pub(super) async fn entry(
    State(state): State<Arc<ApiState>>,
    Path((id, pos)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    name("id", &id)?;
    let pos = position("pos", &pos)?;
    let entry = journal::entry(&state.store, &id, pos).await?;
    Ok(Json(journal::entry_json(&entry)))
}
