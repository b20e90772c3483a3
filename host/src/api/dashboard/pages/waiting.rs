//! `/waiting`: the pending waitpoints, oldest first (paged by cursor, as the API), each with
//! its dispatch, thread, agent, times and metadata; for an operator's session, Approve and
//! Reject, which complete it with `{"approved": true}` or `{"approved": false}` through the
//! same operation as the API and the CLI (`work::waitpoints::complete`), as
//! `operator:<token name>`.

use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use maud::{Markup, html};
use tracing::info;

use super::super::session::Session;
use super::super::view::{Nav, csrf, dispatch_href, encode, notice, thread_href, when};
use super::{
    Acting, ActionForm, Dashboard, PAGE, PageError, PageState, Params, action_form, bad_request,
    nonblank, params, respond, see_other,
};
use crate::store::{Waitpoint, WaitpointFilter, WaitpointState};
use crate::work::waitpoints::{self, WaitpointError, by_operator};

/// The result an Approve completes with.
pub(super) const APPROVED: &[u8] = br#"{"approved": true}"#;
/// The result a Reject completes with.
pub(super) const REJECTED: &[u8] = br#"{"approved": false}"#;

/// What a page of the waiting list shows.
struct WaitingPage {
    rows: Vec<Waitpoint>,
    now: u64,
    /// Whether this page starts after a cursor.
    paged: bool,
    /// The cursor of the next page, when there may be one.
    next: Option<String>,
}

/// `GET /waiting?after=`.
pub(super) async fn page(
    State(d): PageState,
    headers: HeaderMap,
    uri: Uri,
    query: Result<Query<Params>, QueryRejection>,
) -> Result<Response, PageError> {
    let session = d.session(&headers, &uri)?;
    let p = params(query)?;
    let page = read(&d, &p).await?;
    Ok(respond(
        "Waiting",
        Nav::Waiting,
        &session,
        render(&page, &p, &session),
    ))
}

async fn read(d: &Dashboard, p: &Params) -> Result<WaitingPage, PageError> {
    let after = nonblank(&p.after)
        .map(|c| waitpoints::parse_cursor(c).map_err(bad_request))
        .transpose()?;
    let paged = after.is_some();
    let rows = d
        .api
        .store
        .waitpoints
        .list_waitpoints(&WaitpointFilter {
            state: Some(WaitpointState::Pending),
            after,
            limit: PAGE,
            ..WaitpointFilter::default()
        })
        .await?;
    let next = (rows.len() == PAGE)
        .then(|| rows.last().map(waitpoints::cursor))
        .flatten();
    Ok(WaitingPage {
        rows,
        now: d.now(),
        paged,
        next,
    })
}

fn render(page: &WaitingPage, p: &Params, session: &Session) -> Markup {
    let WaitingPage {
        rows,
        now,
        paged,
        next,
    } = page;
    let now = *now;
    html! {
        h1 { "Waiting" }
        (notice(p.notice.as_deref(), p.n.as_deref()))
        p.muted { "Pending waitpoints, oldest first: each holds its dispatch in "
            span.mono { "waiting" } " until it is completed, cancelled or times out." }
        div.scroll {
            table.stack #waitpoints {
                thead { tr {
                    th scope="col" { "Waitpoint" }
                    th scope="col" { "Dispatch" }
                    th scope="col" { "Thread" }
                    th scope="col" { "Agent" }
                    th scope="col" { "Created" }
                    th scope="col" { "Times out" }
                    th scope="col" { "Metadata" }
                    @if session.operator() { th scope="col" { "Decide" } }
                } }
                tbody {
                    @for w in rows {
                        tr data-waitpoint=(w.id) {
                            td data-label="Waitpoint" { (w.name) br; span.mono.muted { (w.id) } }
                            td.id data-label="Dispatch" { a href=(dispatch_href(&w.dispatch)) { (w.dispatch) } }
                            td data-label="Thread" { a href=(thread_href(&w.thread)) { (w.thread) } }
                            td data-label="Agent" { (w.agent) }
                            td data-label="Created" { (when(w.created_at, now)) }
                            td data-label="Times out" { (when(w.timeout_at, now)) }
                            td data-label="Metadata" {
                                @if w.metadata.is_empty() { span.muted { "none" } }
                                @else {
                                    dl.meta.metadata {
                                        @for (key, value) in &w.metadata { dt { (key) } dd { (value) } }
                                    }
                                }
                            }
                            @if session.operator() {
                                td data-label="Decide" {
                                    div.actions {
                                        form method="post" action={ "/waitpoints/" (encode(&w.id)) "/approve" } {
                                            (csrf(session))
                                            button.approve type="submit" { "Approve" }
                                        }
                                        form method="post" action={ "/waitpoints/" (encode(&w.id)) "/reject" } {
                                            (csrf(session))
                                            button.danger.reject type="submit" { "Reject" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                    @if rows.is_empty() {
                        tr { td colspan="8" { span.muted { "Nothing is waiting." } } }
                    }
                }
            }
        }
        nav.pager aria-label="Pages" {
            @if *paged { a href="/waiting" { "First page" } }
            @if let Some(next) = next { a href={ "/waiting?after=" (encode(next)) } rel="next" { "Next page" } }
        }
    }
}

/// `POST /waitpoints/{id}/approve`.
pub(super) async fn approve(
    State(d): PageState,
    Path(id): Path<String>,
    Acting(session): Acting,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Result<Response, PageError> {
    decide(&d, &id, &session, &action_form(form).csrf, true).await
}

/// `POST /waitpoints/{id}/reject`.
pub(super) async fn reject(
    State(d): PageState,
    Path(id): Path<String>,
    Acting(session): Acting,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Result<Response, PageError> {
    decide(&d, &id, &session, &action_form(form).csrf, false).await
}

/// Completes waitpoint `id` with the decision, then back to the list saying what happened: a
/// waitpoint no longer pending, or gone, is a notice there, not an error page.
async fn decide(
    d: &Dashboard,
    id: &str,
    session: &Session,
    csrf_token: &str,
    approved: bool,
) -> Result<Response, PageError> {
    let what = if approved { "approve" } else { "reject" };
    Dashboard::csrf_ok(session, csrf_token, what)?;
    let result = if approved { APPROVED } else { REJECTED };
    let by = by_operator(&session.name);
    let notice = match waitpoints::complete(&d.api.store, &d.api.config(), id, result.to_vec(), &by)
        .await
    {
        Ok(w) => {
            info!(waitpoint = %w.id, dispatch = %w.dispatch, approved, token = %session.name, "waitpoint decided from the dashboard");
            if approved { "approved" } else { "rejected" }
        }
        Err(WaitpointError::Settled(_)) => "waitpoint-settled",
        Err(WaitpointError::NotFound(_) | WaitpointError::Unauthorized) => "waitpoint-missing",
        Err(WaitpointError::TooLarge { .. }) => "waitpoint-refused",
        Err(WaitpointError::Store(e)) => return Err(e.into()),
    };
    Ok(see_other(format!("/waiting?notice={notice}")))
}
