//! API errors: a status and a JSON body `{"error": ..., "field": ..., ...}` that says what was
//! wrong in the caller's terms. Store errors map onto statuses by variant; a store that is
//! unreachable or a record that fails to decode is logged here in full and reported to the
//! caller without the details (no server names, no subjects, no SQL).

use std::time::Duration;

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};
use tracing::warn;

use crate::store::StoreError;

/// A refusal or failure, as the caller sees it.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: Map<String, Value>,
    retry_after: Option<u64>,
    authenticate: bool,
}

impl ApiError {
    fn new(status: StatusCode, error: impl Into<String>) -> ApiError {
        let mut body = Map::new();
        body.insert("error".into(), Value::String(error.into()));
        ApiError {
            status,
            body,
            retry_after: None,
            authenticate: false,
        }
    }

    /// Adds a key to the body.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> ApiError {
        self.body.insert(key.into(), value.into());
        self
    }

    /// The error with its field and message put under `prefix` (a nested object's field,
    /// `debounce.` + `quiet`).
    pub fn prefixed(mut self, prefix: &str) -> ApiError {
        for key in ["field", "error"] {
            if let Some(Value::String(text)) = self.body.get_mut(key) {
                *text = format!("{prefix}{text}");
            }
        }
        self
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// 400, naming the field.
    pub fn invalid(field: &str, error: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, error).with("field", field)
    }

    /// 404.
    pub fn not_found(error: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, error)
    }

    /// 422: the request was understood but what it asks cannot be done now (a reload of a
    /// config that no longer loads).
    pub fn unprocessable(error: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, error)
    }

    /// 409.
    pub fn conflict(error: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, error)
    }

    /// 413, naming the field and the limit.
    pub fn too_large(field: &str, error: impl Into<String>, limit: u64) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, error)
            .with("field", field)
            .with("limit", limit)
    }

    /// 401: no token, or one that matches none.
    pub fn unauthenticated(error: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(StatusCode::UNAUTHORIZED, error);
        e.authenticate = true;
        e
    }

    /// 403: a known token whose role is too small.
    pub fn forbidden(error: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, error)
    }

    /// 503 with a retry hint.
    pub fn busy(error: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, error);
        e.retry_after = Some(1);
        e
    }

    /// 429 with a retry hint in seconds: this caller (a client address, a token) is over a
    /// limit of its own.
    pub fn too_many(error: impl Into<String>, retry_after: u64) -> ApiError {
        let mut e = ApiError::new(StatusCode::TOO_MANY_REQUESTS, error);
        e.retry_after = Some(retry_after.max(1));
        e
    }

    /// 408: the request's body did not arrive within `[api] body_timeout`.
    pub fn body_timeout(limit: Duration) -> ApiError {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("the request body did not arrive within [api] body_timeout ({limit:?})"),
        )
    }

    /// 502: what the request waited for failed (a run that ended without an answer).
    pub fn bad_gateway(error: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_GATEWAY, error)
    }

    /// 504: what the request waited for did not finish within its limit.
    pub fn gateway_timeout(error: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::GATEWAY_TIMEOUT, error)
    }

    /// What the error says.
    pub fn message(&self) -> String {
        match self.body.get("error") {
            Some(Value::String(text)) => text.clone(),
            _ => String::new(),
        }
    }

    /// The error as the OpenAI-compatible endpoint answers it: `{"error": {"message", "type",
    /// "param", "code"}}`, with OpenAI's type for the status, the field as `param` and the
    /// code when there is one; its headers as [`IntoResponse`] sets them.
    pub fn openai_shape(mut self) -> Response {
        let kind = match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        };
        let message = self.message();
        let error = serde_json::json!({
            "message": message,
            "type": kind,
            "param": self.body.get("field").cloned().unwrap_or(Value::Null),
            "code": self.body.get("code").cloned().unwrap_or(Value::Null),
        });
        self.body = Map::new();
        self.body.insert("error".into(), error);
        self.into_response()
    }

    /// 503: the request took longer than its limit.
    pub fn timeout(limit: Duration) -> ApiError {
        ApiError::busy(format!("the request took longer than {limit:?}"))
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        match e {
            StoreError::NotFound { id } => ApiError::not_found(format!("no dispatch `{id}`")),
            StoreError::Duplicate { id, holder } => {
                let holder = holder.unwrap_or_else(|| id.clone());
                let message = if holder == id {
                    format!("dispatch `{id}` exists with different content")
                } else {
                    format!("the dedupe key is held by live dispatch `{holder}`")
                };
                ApiError::conflict(message).with("id", holder)
            }
            StoreError::Invalid(message) => {
                let field = message
                    .split_once(':')
                    .map(|(field, _)| field)
                    .filter(|f| {
                        !f.is_empty() && f.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                    })
                    .unwrap_or("body")
                    .to_owned();
                ApiError::invalid(&field, message)
            }
            e @ (StoreError::NotClaimed { .. }
            | StoreError::LostClaim { .. }
            | StoreError::StaleEpoch { .. }
            | StoreError::Conflict { .. }) => ApiError::conflict(e.to_string()),
            StoreError::Busy { thread, holder } => ApiError::conflict(format!(
                "thread `{thread}` is busy: dispatch `{holder}` holds it (on_busy = reject)"
            ))
            .with("code", "thread_busy")
            .with("thread", thread)
            .with("holder", holder),
            StoreError::Limit(message) => {
                let mut e = ApiError::new(StatusCode::TOO_MANY_REQUESTS, message);
                e.retry_after = Some(1);
                e
            }
            StoreError::Contention(detail) => {
                warn!("API: store contention: {detail}");
                ApiError::busy("the store is busy; retry later")
            }
            StoreError::Unavailable(detail) => {
                warn!("API: store unavailable: {detail}");
                ApiError::busy("the store is unavailable; retry later")
            }
            StoreError::Corrupt { key, reason } => {
                warn!("API: corrupt record `{key}`: {reason}");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(Value::Object(self.body))).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.authenticate {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"homing\""),
            );
        }
        response
    }
}
