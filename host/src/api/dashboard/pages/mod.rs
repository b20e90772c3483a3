//! The dashboard's handlers: one file per page, with the actions posted from it. Each page
//! first reads what it shows into a view of its own (`read`: the store calls, the same the
//! API's handlers make: `list` with a filter and cursor, `counts`, `load`, the thread log),
//! then renders that view (`render`: markup only, no store call). Actions go through the
//! operations the API and the CLI share (`work::cancel`, `work::retry`) and the store's
//! `interrupt`.
//!
//! - `overview`: `/`;
//! - `dispatches`: `/dispatches`, the list;
//! - `dispatch`: `/dispatches/{id}`, with its cancel and retry;
//! - `thread`: `/threads/{thread}`, with its interrupt and its send box (messages);
//! - `dead_letters`: `/dead-letters`, with retrying the selected;
//! - `waiting`: `/waiting`, the pending waitpoints, with approving and rejecting each;
//! - `agents`: `/agents`, with pausing and resuming each agent;
//! - `schedules`: `/schedules`, with pausing, resuming and firing each schedule;
//! - `login`: `/login` and `/logout`;
//! - this module: the route table, and what the pages share: the session of a page and of an
//!   action, the error page, query parameters.

mod agents;
mod dead_letters;
mod dispatch;
mod dispatches;
mod login;
mod overview;
mod schedules;
mod thread;
mod waiting;

use std::sync::Arc;

use axum::Form;
use axum::Router;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use maud::{Markup, html};
use serde::Deserialize;
use tracing::warn;

use super::session::Session;
use super::view::{self, Nav, encode};
use super::{Dashboard, LOGIN_LIMIT};
use crate::config::api::Role;
use crate::store::model::check_name;
use crate::store::{ListCursor, StoreError};
use crate::work::OpError;

/// Rows per page of a list.
const PAGE: usize = 50;
/// The most rows read to order a list newest first, or to find an agent's oldest queued.
const SCAN: usize = 1000;

type PageState = State<Arc<Dashboard>>;

/// The pages and actions, for the dashboard's router (which adds the assets and its layers).
pub(super) fn routes() -> Router<Arc<Dashboard>> {
    Router::new()
        .route("/", get(overview::page))
        .route(
            "/login",
            get(login::page)
                .post(login::login)
                .layer(DefaultBodyLimit::max(LOGIN_LIMIT)),
        )
        .route("/logout", post(login::logout))
        .route("/dispatches", get(dispatches::page))
        .route("/dispatches/{id}", get(dispatch::page))
        .route("/dispatches/{id}/stream", get(dispatch::stream))
        .route("/dispatches/{id}/cancel", post(dispatch::cancel))
        .route("/dispatches/{id}/retry", post(dispatch::retry))
        .route("/threads/{thread}", get(thread::page))
        .route("/threads/{thread}/interrupt", post(thread::interrupt))
        .route("/threads/{thread}/messages", post(thread::send))
        .route("/dead-letters", get(dead_letters::page))
        .route("/dead-letters/retry", post(dead_letters::retry_selected))
        .route("/waiting", get(waiting::page))
        .route("/schedules", get(schedules::page))
        .route("/schedules/{name}/pause", post(schedules::pause))
        .route("/schedules/{name}/resume", post(schedules::resume))
        .route("/schedules/{name}/trigger", post(schedules::trigger))
        .route("/waitpoints/{id}/approve", post(waiting::approve))
        .route("/waitpoints/{id}/reject", post(waiting::reject))
        .route("/agents", get(agents::page))
        .route("/agents/{agent}/pause", post(agents::pause))
        .route("/agents/{agent}/resume", post(agents::resume))
}

/// Why a page is not shown.
#[derive(Debug)]
pub(super) enum PageError {
    /// No session: to the login page, then back to this path.
    Login(String),
    /// A status and a sentence for the operator.
    Status(StatusCode, String),
}

impl From<StoreError> for PageError {
    fn from(e: StoreError) -> PageError {
        warn!("dashboard: the store failed: {e}");
        PageError::Status(
            StatusCode::SERVICE_UNAVAILABLE,
            "The store could not be read just now; try again.".into(),
        )
    }
}

impl From<OpError> for PageError {
    fn from(e: OpError) -> PageError {
        match e {
            OpError::NotFound(_) => not_found("No such dispatch."),
            OpError::WrongState { .. } => PageError::Status(
                StatusCode::CONFLICT,
                "That action does not apply to the dispatch in its current state.".into(),
            ),
            OpError::Store(e) => e.into(),
        }
    }
}

fn not_found(what: &str) -> PageError {
    PageError::Status(StatusCode::NOT_FOUND, what.to_owned())
}

fn forbidden(what: &str) -> PageError {
    PageError::Status(StatusCode::FORBIDDEN, what.to_owned())
}

fn bad_request(what: String) -> PageError {
    PageError::Status(StatusCode::BAD_REQUEST, what)
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        match self {
            PageError::Login(next) => {
                Redirect::to(&format!("/login?next={}", encode(&next))).into_response()
            }
            PageError::Status(code, message) => {
                let body = view::page(
                    code.canonical_reason().unwrap_or("Error"),
                    Nav::None,
                    None,
                    html! {
                        h1 { (code.as_u16()) " " (code.canonical_reason().unwrap_or("")) }
                        p.notice.error role="alert" { (message) }
                        p { a href="/" { "Back to the overview" } }
                    },
                );
                (code, html_response(body)).into_response()
            }
        }
    }
}

/// A page's share of the host's read budget, held while the page's store reads and its HTML
/// hold memory.
async fn page_share() -> Result<tokio::sync::SemaphorePermit<'static>, PageError> {
    crate::api::journal::reserve(crate::api::journal::PAGE_SHARE)
        .await
        .map_err(|_| {
            PageError::Status(
                StatusCode::SERVICE_UNAVAILABLE,
                "The host is shutting down.".into(),
            )
        })
}

fn html_response(markup: Markup) -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        markup.into_string(),
    )
        .into_response()
}

/// A page of the dashboard for `session`: `body` in the layout, as a response.
fn respond(title: &str, nav: Nav, session: &Session, body: Markup) -> Response {
    html_response(view::page(title, nav, Some(session), body))
}

impl Dashboard {
    /// The request's session, or a redirect to the login page.
    fn session(&self, headers: &HeaderMap, uri: &Uri) -> Result<Session, PageError> {
        self.sessions.get(headers).ok_or_else(|| {
            PageError::Login(uri.path_and_query().map_or("/", |p| p.as_str()).to_owned())
        })
    }

    /// The session of an action, from the request's head (before its form is read): a
    /// session, posting from this origin, of at least role `need` (operator for the actions
    /// on dispatches and threads, producer for sending a message). Each refusal is logged
    /// with the token's name, never a secret.
    fn acting(&self, headers: &HeaderMap, what: &str, need: Role) -> Result<Session, PageError> {
        let Some(session) = self.sessions.get(headers) else {
            warn!(action = what, "dashboard action refused: no session");
            return Err(PageError::Status(
                StatusCode::UNAUTHORIZED,
                "Log in first.".into(),
            ));
        };
        if !same_origin(headers) {
            warn!(action = what, token = %session.name, "dashboard action refused: cross-origin");
            return Err(forbidden("The form was not posted from this dashboard."));
        }
        if session.role < need {
            warn!(action = what, token = %session.name, role = %session.role, "dashboard action refused: role");
            return Err(forbidden(&format!(
                "Your token has role {}; this action needs {need}.",
                session.role
            )));
        }
        Ok(session)
    }

    /// The form's CSRF token is the session's.
    fn csrf_ok(session: &Session, csrf: &str, what: &str) -> Result<(), PageError> {
        if session.csrf_ok(csrf) {
            return Ok(());
        }
        warn!(action = what, token = %session.name, "dashboard action refused: CSRF token missing or wrong");
        Err(forbidden(
            "The form's CSRF token is missing or wrong; reload the page and try again.",
        ))
    }

    fn now(&self) -> u64 {
        self.api.store.now()
    }
}

/// The session of an action post, checked from the request's head by [`Dashboard::acting`]:
/// a handler takes it before its form, so that a post without a session, from another origin
/// or by a reader is refused before its body is read.
struct Acting(Session);

impl FromRequestParts<Arc<Dashboard>> for Acting {
    type Rejection = PageError;

    async fn from_request_parts(
        parts: &mut Parts,
        d: &Arc<Dashboard>,
    ) -> Result<Acting, PageError> {
        d.acting(&parts.headers, parts.uri.path(), Role::Operator)
            .map(Acting)
    }
}

/// The session of a post that needs only the producer role (sending a message), checked like
/// [`Acting`] from the request's head.
struct Producing(Session);

impl FromRequestParts<Arc<Dashboard>> for Producing {
    type Rejection = PageError;

    async fn from_request_parts(
        parts: &mut Parts,
        d: &Arc<Dashboard>,
    ) -> Result<Producing, PageError> {
        d.acting(&parts.headers, parts.uri.path(), Role::Producer)
            .map(Producing)
    }
}

/// Whether a post comes from this origin: its `Origin` (when sent) names the `Host` it was
/// sent to, and `Sec-Fetch-Site` (when sent) says same-origin.
fn same_origin(headers: &HeaderMap) -> bool {
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = text("sec-fetch-site")
        && !matches!(site, "same-origin" | "none")
    {
        return false;
    }
    match (text(header::ORIGIN.as_str()), text(header::HOST.as_str())) {
        (None, _) => true,
        (Some(origin), Some(host)) => {
            origin.strip_prefix("http://") == Some(host)
                || origin.strip_prefix("https://") == Some(host)
        }
        (Some(_), None) => false,
    }
}

/// Checks a dispatch id or thread name from a page's path or query, as enqueue and the API
/// check it: 400 when it is blank, too long or not printable.
fn name(field: &str, value: &str) -> Result<(), PageError> {
    check_name(field, value).map_err(bad_request)
}

#[derive(Debug, Default, Deserialize)]
struct Params {
    agent: Option<String>,
    status: Option<String>,
    thread: Option<String>,
    id: Option<String>,
    order: Option<String>,
    after: Option<String>,
    page: Option<usize>,
    notice: Option<String>,
    n: Option<String>,
    next: Option<String>,
}

fn params(query: Result<Query<Params>, QueryRejection>) -> Result<Params, PageError> {
    query
        .map(|Query(p)| p)
        .map_err(|_| bad_request("The address has a bad query string.".into()))
}

fn nonblank(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// The `after` cursor of a list's query, when one is given: 400 when it is not a cursor.
fn after(p: &Params) -> Result<Option<ListCursor>, PageError> {
    nonblank(&p.after)
        .map(|c| c.parse::<ListCursor>().map_err(bad_request))
        .transpose()
}

fn see_other(location: String) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response()
}

#[derive(Debug, Default, Deserialize)]
struct ActionForm {
    #[serde(default)]
    csrf: String,
}

fn action_form(form: Result<Form<ActionForm>, FormRejection>) -> ActionForm {
    form.map(|Form(f)| f).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_post_from_another_origin_is_refused() {
        let mut h = HeaderMap::new();
        h.insert(
            header::HOST,
            "127.0.0.1:7080"
                .parse()
                .unwrap_or(header::HeaderValue::from_static("x")),
        );
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            header::HeaderValue::from_static("http://127.0.0.1:7080"),
        );
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            header::HeaderValue::from_static("http://evil.example"),
        );
        assert!(!same_origin(&h));
        h.insert(
            header::ORIGIN,
            header::HeaderValue::from_static("http://127.0.0.1:7080"),
        );
        h.insert(
            "sec-fetch-site",
            header::HeaderValue::from_static("cross-site"),
        );
        assert!(!same_origin(&h));
    }
}
