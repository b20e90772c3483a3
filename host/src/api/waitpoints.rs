//! `/v1/waitpoints`: list and show (readers), complete (the waitpoint's own token, or an
//! operator) and cancel (operators).
//!
//! The completion route authenticates by itself, since its callers are mostly not configured
//! tokens but whoever was handed a waitpoint's token (a webhook, a person's link): it is left
//! out of the bearer check of `/v1` and takes the token from `Authorization: Bearer` or from
//! `?token=`. A configured token of the operator role completes any waitpoint; any other token
//! is checked against the waitpoint's stored digests by `work::waitpoints::authorize` (in
//! constant time, an unknown id taking the same path), and a wrong one, or an unknown id, is
//! answered 401 alike and counted toward the client address's invalid-token limit (429 past
//! it), as the bearer check counts. The route keeps the API's other limits: its time, the body
//! timer, a slot of `max_concurrent` (taken before the store is read), the body cap. Neither
//! its query string nor a token is ever logged.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tracing::info;

use super::auth::{self, Caller};
use super::dispatches::{MAX_PAGE_BYTES, limit, name, param, params, read_body};
use super::journal::{PAGE_SHARE, held_json, reserve};
use super::limits::ClientAddr;
use super::{ApiError, ApiState};
use crate::config::api::Role;
use crate::store::{WaitpointFilter, WaitpointState};
use crate::work::waitpoints::{
    self as work, BY_TOKEN, WaitpointError, by_operator, parse_cursor, view,
};

type RawQuery = Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>;

/// A refused completion or cancellation as the API answers it.
impl From<WaitpointError> for ApiError {
    fn from(e: WaitpointError) -> ApiError {
        match e {
            WaitpointError::Unauthorized => unauthorized(),
            WaitpointError::NotFound(id) => {
                ApiError::not_found(format!("no waitpoint `{}`", id.escape_debug()))
            }
            WaitpointError::Settled(w) => {
                ApiError::conflict(format!("the waitpoint is {}, not pending", w.state))
                    .with("state", w.state.as_str())
                    .with("settled_at", json!(w.settled_at))
            }
            e @ WaitpointError::TooLarge { limit, .. } => {
                ApiError::too_large("body", e.to_string(), limit)
            }
            WaitpointError::Store(e) => e.into(),
        }
    }
}

/// The one answer to an unknown id and to a wrong token.
fn unauthorized() -> ApiError {
    ApiError::unauthenticated(
        "no waitpoint has this id and token (a waitpoint's token, or an operator's, is needed)",
    )
}

/// `GET /v1/waitpoints?thread=&dispatch=&state=&limit=&cursor=`: a page of waitpoints, oldest
/// first, never with their tokens' digests; `next_cursor` when there may be more.
///
/// The store reads the page only, ending it early rather than hold more than
/// [`MAX_PAGE_BYTES`] of results and metadata ([`crate::store::Waitpoints::read_waitpoints`]),
/// under a [`PAGE_SHARE`] of the host's read budget; each waitpoint is written into the answer
/// and dropped in turn.
pub(super) async fn list(
    State(state): State<Arc<ApiState>>,
    query: RawQuery,
) -> Result<Response, ApiError> {
    let pairs = params(query, &["thread", "dispatch", "state", "limit", "cursor"])?;
    let limit = limit(&pairs)?;
    for field in ["thread", "dispatch"] {
        if let Some(value) = param(&pairs, field) {
            name(field, value)?;
        }
    }
    let state_filter = param(&pairs, "state")
        .map(|text| {
            text.parse::<WaitpointState>()
                .map_err(|e| ApiError::invalid("state", format!("state: {e}")))
        })
        .transpose()?;
    let after = param(&pairs, "cursor")
        .map(|text| {
            parse_cursor(text).map_err(|e| ApiError::invalid("cursor", format!("cursor: {e}")))
        })
        .transpose()?;
    let filter = WaitpointFilter {
        thread: param(&pairs, "thread").map(str::to_owned),
        dispatch: param(&pairs, "dispatch").map(str::to_owned),
        state: state_filter,
        after,
        limit,
    };
    let share = reserve(PAGE_SHARE).await?;
    let page = state
        .store
        .waitpoints
        .read_waitpoints(&filter, MAX_PAGE_BYTES, true)
        .await?;
    // A page stops before passing the byte cap; the next starts after its last one.
    // Room for the whole page at once (pages are only touched as they are written).
    let mut body = Vec::with_capacity(MAX_PAGE_BYTES + 128);
    body.extend_from_slice(b"{\"waitpoints\":[");
    let mut cut = false;
    let mut last = None;
    for (count, w) in page.waitpoints.into_iter().enumerate() {
        let text = view(&w).to_string();
        if count > 0 && body.len() + text.len() + 64 > MAX_PAGE_BYTES {
            cut = true;
            break;
        }
        if count > 0 {
            body.push(b',');
        }
        body.extend_from_slice(text.as_bytes());
        last = Some(work::cursor(&w));
    }
    let next = (cut || page.more).then_some(last).flatten();
    body.extend_from_slice(b"],\"next_cursor\":");
    body.extend_from_slice(json!(next).to_string().as_bytes());
    body.push(b'}');
    Ok(held_json(body, share, state.config().api.request_timeout))
}

/// `GET /v1/waitpoints/{id}`: one waitpoint, without its tokens' digests.
pub(super) async fn show(
    State(state): State<Arc<ApiState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    name("id", &id)?;
    match state.store.waitpoints.waitpoint(&id).await? {
        Some(w) => Ok(Json(view(&w))),
        None => Err(WaitpointError::NotFound(id).into()),
    }
}

/// `POST /v1/waitpoints/{id}/cancel`: an operator cancels a pending waitpoint (its waiting
/// dispatch resumes and reads `cancelled`); 409 naming its state when it is not pending.
pub(super) async fn cancel(
    State(state): State<Arc<ApiState>>,
    Path(id): Path<String>,
    caller: Option<axum::Extension<Caller>>,
) -> Result<Json<Value>, ApiError> {
    name("id", &id)?;
    let token = caller.map_or_else(|| "-".to_owned(), |axum::Extension(c)| c.name);
    let w = work::cancel(&state.store, &id, &by_operator(&token)).await?;
    info!(waitpoint = %w.id, dispatch = %w.dispatch, token = %token, "waitpoint cancelled through the API");
    Ok(Json(view(&w)))
}

/// Who a completion's tokens make its caller.
enum Completer {
    /// A configured token of the operator role (or above), by name.
    Operator(String),
    /// The waitpoint's own token.
    Token,
}

/// `POST /v1/waitpoints/{id}/complete[?token=]`: the body is the result, stored as sent.
/// `200 {"state": "completed"}`; 401 for an unknown id or a wrong token alike (404 for an
/// operator); 403 for a configured token of a smaller role; 409 `{"state", "settled_at"}` when
/// it is not pending (also once its timeout passed); 413 over `[host] max_payload`.
pub(super) async fn complete(
    State(state): State<Arc<ApiState>>,
    Path(id): Path<String>,
    client: Option<axum::Extension<ClientAddr>>,
    headers: HeaderMap,
    query: RawQuery,
    body: Body,
) -> Response {
    match completion(&state, &id, client, &headers, query, body).await {
        Ok(response) | Err(response) => response,
    }
}

async fn completion(
    state: &ApiState,
    id: &str,
    client: Option<axum::Extension<ClientAddr>>,
    headers: &HeaderMap,
    query: RawQuery,
    body: Body,
) -> Result<Response, Response> {
    const PATH: &str = "/v1/waitpoints/{id}/complete";
    let method = Method::POST;
    // Nothing of the query string goes into an answer or a log: it holds the token.
    let Ok(Query(pairs)) = query else {
        return Err(ApiError::invalid("query", "bad query string").into_response());
    };
    if let Some((key, _)) = pairs.iter().find(|(k, _)| k != "token") {
        let key = key.escape_debug().to_string();
        return Err(
            ApiError::invalid(&key, format!("{key}: unknown query parameter")).into_response(),
        );
    }
    let mut presented: Vec<&str> = Vec::with_capacity(2);
    presented.extend(auth::bearer(headers));
    presented.extend(param(&pairs, "token").map(str::trim));
    if presented.is_empty() {
        return Err(auth::refused(
            "missing",
            &method,
            PATH,
            ApiError::unauthenticated(
                "a token is required: the waitpoint's (Authorization: Bearer ... or ?token=) or an operator's",
            ),
            None,
        ));
    }
    // A configured token of the operator role completes any waitpoint; a smaller role none
    // (unless a token presented with it is the waitpoint's own).
    let configured: Vec<(String, Role)> = presented
        .iter()
        .filter_map(|p| state.tokens.identify(p.as_bytes()))
        .collect();
    let operator = configured
        .iter()
        .find(|(_, role)| *role >= Role::Operator)
        .map(|(name, _)| name.clone());
    // The slot of `max_concurrent`, before the store is read.
    let _slot = state.slot().map_err(IntoResponse::into_response)?;
    let completer = match operator {
        Some(name) => Completer::Operator(name),
        None => match work::authorize(&state.store, id, &presented).await {
            Ok(_) => Completer::Token,
            Err(WaitpointError::Unauthorized) => {
                // Only when every token presented is a configured one (of a smaller role) is
                // it a matter of role; a candidate for the waitpoint's own that matched
                // nothing is an invalid token, counted, whatever came with it.
                let all_configured = configured.len() == presented.len();
                return Err(match configured.first().filter(|_| all_configured) {
                    Some((name, role)) => auth::refused(
                        "role",
                        &method,
                        PATH,
                        ApiError::forbidden(format!(
                            "token `{name}` has role {role}; completing a waitpoint needs its own token or an operator's"
                        )),
                        Some(name),
                    ),
                    None => {
                        let client = client.map_or(ClientAddr::UNKNOWN, |axum::Extension(c)| c);
                        auth::invalid(state, client, &method, PATH, unauthorized())
                    }
                });
            }
            Err(e) => return Err(ApiError::from(e).into_response()),
        },
    };
    let result = read_body(headers, body, state.body_limit)
        .await
        .map_err(IntoResponse::into_response)?;
    let settled_by = match &completer {
        Completer::Operator(name) => by_operator(name),
        Completer::Token => BY_TOKEN.to_owned(),
    };
    let w = work::complete(&state.store, &state.config(), id, result, &settled_by)
        .await
        .map_err(|e| ApiError::from(e).into_response())?;
    info!(
        waitpoint = %w.id,
        dispatch = %w.dispatch,
        by = %settled_by,
        "waitpoint completed through the API"
    );
    Ok(Json(json!({ "state": w.state.as_str() })).into_response())
}
