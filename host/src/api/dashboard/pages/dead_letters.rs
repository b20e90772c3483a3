//! `/dead-letters`: the dead letters with their last errors, paged by cursor, and retrying
//! those selected.

use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use maud::{Markup, html};
use tracing::info;

use super::super::session::Session;
use super::super::view::{Nav, csrf, dispatch_table, encode, notice};
use super::{
    Acting, Dashboard, PAGE, PageError, PageState, Params, after, bad_request, name, nonblank,
    params, respond, see_other,
};
use crate::store::{DispatchRow, ListFilter, Status};
use crate::work::{self, OpError};

/// The most dead letters retried by one post.
const MAX_SELECTED: usize = 100;

/// What a page of dead letters shows.
struct DeadLetters {
    /// Only this agent's.
    agent: Option<String>,
    rows: Vec<DispatchRow>,
    now: u64,
    /// The cursor of the next page, encoded, when there is one.
    next: Option<String>,
}

/// `GET /dead-letters?agent=&after=`.
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
        "Dead letters",
        Nav::DeadLetters,
        &session,
        render(&page, &p, &session),
    ))
}

async fn read(d: &Dashboard, p: &Params) -> Result<DeadLetters, PageError> {
    let after = after(p)?;
    let agent = nonblank(&p.agent);
    if let Some(agent) = agent {
        name("agent", agent)?;
    }
    let rows = d
        .api
        .store
        .mailbox
        .list_rows(&ListFilter {
            agent: agent.map(str::to_owned),
            statuses: vec![Status::DeadLetter],
            limit: PAGE,
            after,
            ..ListFilter::default()
        })
        .await?;
    let now = d.now();
    let next = (rows.len() == PAGE)
        .then(|| rows.last().map(|r| encode(&r.cursor().to_string())))
        .flatten();
    Ok(DeadLetters {
        agent: agent.map(str::to_owned),
        rows,
        now,
        next,
    })
}

fn render(page: &DeadLetters, p: &Params, session: &Session) -> Markup {
    let DeadLetters {
        agent,
        rows,
        now,
        next,
    } = page;
    let agent = agent.as_deref();
    let keep = agent
        .map(|a| format!("agent={}&", encode(a)))
        .unwrap_or_default();
    let operator = session.operator().then_some(session);
    html! {
        h1 { "Dead letters" @if let Some(a) = agent { " of " (a) } }
        (notice(p.notice.as_deref(), p.n.as_deref()))
        @if let Some(session) = operator {
            form method="post" action="/dead-letters/retry" {
                (csrf(session))
                div.actions { button #retry-selected type="submit" { "Retry selected" } }
                (dispatch_table(rows, *now, Some(session)))
            }
        } @else {
            (dispatch_table(rows, *now, None))
        }
        nav.pager aria-label="Pages" {
            @if let Some(next) = next { a href={ "/dead-letters?" (keep) "after=" (next) } rel="next" { "Next page" } }
        }
    }
}

/// `POST /dead-letters/retry` with `csrf` and one `id` per selected dead letter.
pub(super) async fn retry_selected(
    State(d): PageState,
    Acting(session): Acting,
    form: Result<Form<Vec<(String, String)>>, FormRejection>,
) -> Result<Response, PageError> {
    let pairs = form.map(|Form(p)| p).unwrap_or_default();
    let csrf = pairs
        .iter()
        .find(|(k, _)| k == "csrf")
        .map_or("", |(_, v)| v.as_str());
    Dashboard::csrf_ok(&session, csrf, "retry selected")?;
    let ids: Vec<&str> = pairs
        .iter()
        .filter(|(k, _)| k == "id")
        .map(|(_, v)| v.as_str())
        .collect();
    if ids.is_empty() {
        return Ok(see_other("/dead-letters?notice=none-selected".into()));
    }
    if ids.len() > MAX_SELECTED {
        return Err(bad_request(format!(
            "Select at most {MAX_SELECTED} at once."
        )));
    }
    for id in &ids {
        name("id", id)?;
    }
    let mut retried = 0;
    for id in ids {
        match work::retry(&d.api.config(), &d.api.store, id).await {
            Ok(r) => {
                retried += 1;
                info!(dispatch = %id, new = %r.id, token = %session.name, "retried from the dashboard");
            }
            // Retried already by someone else, or gone: the rest go on.
            Err(OpError::NotFound(_) | OpError::WrongState { .. }) => {}
            Err(OpError::Store(e)) => return Err(e.into()),
        }
    }
    Ok(see_other(format!(
        "/dead-letters?notice=retried-n&n={retried}"
    )))
}
