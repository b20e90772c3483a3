//! The operators' dashboard, served by `homing run` at `/` next to the API when `[api] listen`
//! is set (and `[api] dashboard` is not `false`): server-rendered pages (maud, which escapes
//! every value it inserts), htmx and a small script of our own served from the binary, no
//! CDN, no build step.
//!
//! | page | shows |
//! | --- | --- |
//! | `/` | per agent: queued, claimed, retrying, dead letters, oldest queued, settled per minute over 15 minutes; the hosts seen; refreshes itself |
//! | `/dispatches` | the list, filtered by agent, status (`waiting` too), thread or id; priority or newest order; paged |
//! | `/dispatches/{id}` | payload, result, metadata, attempts, timeline, waitpoints; cancel, retry, interrupt |
//! | `/threads/{thread}` | the thread's log, following new entries, its inbox and pending messages, and its dispatches; interrupt; the send box |
//! | `/waiting` | pending waitpoints with their metadata; approve or reject each |
//! | `/dead-letters` | dead letters, select and retry |
//! | `/agents` | world, limits, grants (names, never values), the SHA-256 of the component it runs |
//!
//! Security: every page needs a session, opened at `/login` with an API token (see
//! `session`); the cookie is HttpOnly and SameSite=Strict and holds a random id, never the
//! token. Every action is a POST carrying the session's CSRF token, checked in constant time,
//! from the same origin, by a session of the `operator` role (`producer` for sending a
//! message); a `reader` sees no action buttons or send box and its posts are refused. Every response carries a Content-Security-Policy that
//! allows no inline script, `frame-ancestors 'none'` and `X-Frame-Options: DENY`; pages are
//! `no-store`. The API's layers apply too: a time limit, `[api] body_timeout` for bodies; a
//! request with a session takes a slot of `[api] max_concurrent` (one without takes none: it
//! only gets the login page, a redirect or a refusal). A post's session, origin and role are
//! checked from its head, before its form is read; form bodies are capped at [`FORM_LIMIT`],
//! the login form at [`LOGIN_LIMIT`]. Failed logins are limited per client address, with the
//! API's invalid tokens (`limits::Failures`); a right token always logs in.
//!
//! - `session`: sessions, CSRF;
//! - `stats`: throughput and hosts, sampled from the store;
//! - `pages`: the route table and the handlers, one file per page, each reading what it shows
//!   apart from rendering it; `view`: layout, formatting and the pieces pages share.

mod pages;
mod session;
mod stats;
mod view;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::ApiState;

/// The largest form body accepted.
pub(super) const FORM_LIMIT: usize = 64 << 10;
/// The largest login form accepted (a token and the page to go back to): anyone may post it,
/// so it is read only this far, and refused at once when it declares more.
pub(super) const LOGIN_LIMIT: usize = 8 << 10;

/// The dashboard's Content-Security-Policy: only our own script and style, no inline script,
/// no framing, forms post only to us.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const HTMX: &str = include_str!("assets/htmx.min.js");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// What the dashboard's handlers share.
#[derive(Debug)]
pub(super) struct Dashboard {
    api: Arc<ApiState>,
    sessions: session::Sessions,
    stats: Arc<stats::Stats>,
    /// This host's id.
    host_id: String,
}

/// The dashboard's routes, for the API's router (which adds its own layers around them).
pub(super) fn router(api: Arc<ApiState>) -> Router<Arc<ApiState>> {
    let dashboard = Arc::new(Dashboard {
        host_id: api.config().host_id(),
        sessions: session::Sessions::default(),
        stats: Arc::new(stats::Stats::default()),
        api: api.clone(),
    });
    tokio::spawn(stats::run(
        dashboard.stats.clone(),
        api.store.clone(),
        api.shutdown.clone(),
    ));
    pages::routes()
        .route("/assets/{name}", get(asset))
        .layer(DefaultBodyLimit::max(FORM_LIMIT))
        .layer(axum::middleware::from_fn_with_state(
            dashboard.clone(),
            in_flight,
        ))
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(dashboard)
}

/// A request with a session takes a slot of `[api] max_concurrent` while it runs (503 when
/// none is free); one without takes none.
async fn in_flight(State(d): State<Arc<Dashboard>>, request: Request, next: Next) -> Response {
    if d.sessions.get(request.headers()).is_none() {
        return next.run(request).await;
    }
    let Ok(_slot) = d.api.slot() else {
        return (
            [(header::RETRY_AFTER, "1")],
            pages::PageError::Status(
                StatusCode::SERVICE_UNAVAILABLE,
                "Too many requests are in flight; try again in a moment.".into(),
            ),
        )
            .into_response();
    };
    next.run(request).await
}

/// The files the pages load.
async fn asset(Path(name): Path<String>) -> Response {
    let (body, kind) = match name.as_str() {
        "htmx.min.js" => (HTMX, "text/javascript; charset=utf-8"),
        "app.js" => (APP_JS, "text/javascript; charset=utf-8"),
        "app.css" => (APP_CSS, "text/css; charset=utf-8"),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        body,
    )
        .into_response()
}

/// Adds the security headers to every dashboard response; `no-store` unless it is an asset.
async fn security_headers(request: Request, next: Next) -> Response {
    let asset = request.uri().path().starts_with("/assets/");
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !asset {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}
