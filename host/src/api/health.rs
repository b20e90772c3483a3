//! `/livez` and `/readyz` (unauthenticated, for probes: they show no work, only whether the
//! host serves and what keeps it from being ready) and `/metrics` (counts, behind a token of
//! any role unless `[api] public_metrics`).

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tracing::warn;

use super::ApiState;

/// How long `/readyz` waits for the store.
const STORE_PROBE: Duration = Duration::from_secs(2);

/// `GET /livez`: the process serves.
pub(super) async fn livez() -> Response {
    Json(json!({ "status": "ok" })).into_response()
}

/// `GET /readyz`: the store answers and every plugin is loaded; else 503 naming what is not.
pub(super) async fn readyz(State(state): State<Arc<ApiState>>) -> Response {
    let mut not_ready = Vec::new();
    // A read that goes to the store (on NATS, past the local view to the server).
    let probe = state.store.mailbox.thread_epoch("homing-readyz-probe");
    match tokio::time::timeout(STORE_PROBE, probe).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            warn!("readyz: the store does not answer: {e}");
            not_ready.push("store: unavailable".to_owned());
        }
        Err(_) => not_ready.push(format!("store: no answer within {STORE_PROBE:?}")),
    }
    let loaded = state
        .agents
        .read()
        .map(|a| {
            a.as_ref()
                .map(|a| a.iter().map(|a| a.name.clone()).collect::<Vec<_>>())
        })
        .unwrap_or_default();
    let config = state.config();
    let missing: Vec<&String> = config
        .plugins
        .keys()
        .filter(|name| !loaded.as_ref().is_some_and(|l| l.contains(name)))
        .collect();
    if !missing.is_empty() {
        not_ready.push(format!(
            "plugins not loaded: {}",
            missing
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if not_ready.is_empty() {
        Json(json!({ "status": "ready" })).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "not ready", "not_ready": not_ready })),
        )
            .into_response()
    }
}

/// `GET /metrics`: the Prometheus text format.
pub(super) async fn metrics(State(state): State<Arc<ApiState>>) -> Response {
    match &state.metrics {
        Some(handle) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            handle.render(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "metrics are not recorded\n").into_response(),
    }
}
