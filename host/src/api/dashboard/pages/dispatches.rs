//! `/dispatches`: the list, filtered by agent, status, thread or id, in priority order (paged
//! by cursor, as the API) or newest first (paged by number, over the first [`SCAN`] matches).

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use maud::{Markup, html};

use super::super::view::{Nav, dispatch_table, encode};
use super::{
    Dashboard, PAGE, PageError, PageState, Params, SCAN, after, bad_request, name, nonblank,
    params, respond,
};
use crate::store::{DispatchRow, ListFilter, Status};

/// What a page of the list shows.
struct List {
    /// The configured agents, for the filter.
    agents: Vec<String>,
    agent: Option<String>,
    thread: Option<String>,
    id: Option<String>,
    status: Option<Status>,
    newest: bool,
    rows: Vec<DispatchRow>,
    now: u64,
    /// The page number, newest first.
    page_no: usize,
    /// Whether this page starts after a cursor (priority order).
    paged: bool,
    /// The query of the next page (`after=` or `page=`), when there is one.
    next: Option<String>,
    /// Newest first, and more matches than were read.
    truncated: bool,
    /// The filters as a query prefix (`key=value&` each), kept across pages.
    keep: String,
}

/// `GET /dispatches?agent=&status=&thread=&id=&order=priority|newest&after=&page=`.
pub(super) async fn page(
    State(d): PageState,
    headers: HeaderMap,
    uri: Uri,
    query: Result<Query<Params>, QueryRejection>,
) -> Result<Response, PageError> {
    let session = d.session(&headers, &uri)?;
    let p = params(query)?;
    let list = read(&d, &p).await?;
    Ok(respond(
        "Dispatches",
        Nav::Dispatches,
        &session,
        render(&list),
    ))
}

/// The filters of `p`, checked, and the rows they select: one dispatch by id, a page in
/// priority order from the store, or the first [`SCAN`] sorted newest first.
async fn read(d: &Dashboard, p: &Params) -> Result<List, PageError> {
    let agent = nonblank(&p.agent);
    let thread = nonblank(&p.thread);
    let id = nonblank(&p.id);
    for (field, value) in [("agent", agent), ("thread", thread), ("id", id)] {
        if let Some(value) = value {
            name(field, value)?;
        }
    }
    let newest = p.order.as_deref() == Some("newest");
    let status_filter = nonblank(&p.status)
        .map(|s| s.parse::<Status>().map_err(bad_request))
        .transpose()?;
    let after = after(p)?;
    let paged = after.is_some();
    let store = &d.api.store;
    let now = d.now();
    let page_no = p.page.unwrap_or(0);
    let (rows, next, truncated) = if let Some(id) = id {
        let one = store.mailbox.load(id).await?.filter(|r| {
            agent.is_none_or(|a| r.agent == a)
                && thread.is_none_or(|t| r.thread == t)
                && status_filter.is_none_or(|s| r.status == s)
        });
        (
            one.iter().map(DispatchRow::of).collect::<Vec<_>>(),
            None,
            false,
        )
    } else {
        let filter = ListFilter {
            agent: agent.map(str::to_owned),
            thread: thread.map(str::to_owned),
            statuses: status_filter.into_iter().collect(),
            limit: if newest { SCAN } else { PAGE },
            after: if newest { None } else { after },
        };
        if newest {
            let mut all = store.mailbox.list_rows(&filter).await?;
            let truncated = all.len() == SCAN;
            all.sort_by(|a, b| {
                b.created_at
                    .cmp(&a.created_at)
                    .then_with(|| b.id.cmp(&a.id))
            });
            let start = page_no.saturating_mul(PAGE).min(all.len());
            let end = (start + PAGE).min(all.len());
            let more = end < all.len();
            let rows = all.drain(start..end).collect::<Vec<_>>();
            (
                rows,
                more.then(|| format!("page={}", page_no + 1)),
                truncated,
            )
        } else {
            let rows = store.mailbox.list_rows(&filter).await?;
            let next = (rows.len() == PAGE)
                .then(|| {
                    rows.last()
                        .map(|r| format!("after={}", encode(&r.cursor().to_string())))
                })
                .flatten();
            (rows, next, false)
        }
    };
    let mut keep = String::new();
    for (key, value) in [
        ("agent", agent),
        ("status", nonblank(&p.status)),
        ("thread", thread),
        ("order", p.order.as_deref()),
    ] {
        if let Some(value) = value {
            keep.push_str(&format!("{key}={}&", encode(value)));
        }
    }
    Ok(List {
        agents: d.api.config().plugins.keys().cloned().collect(),
        agent: agent.map(str::to_owned),
        thread: thread.map(str::to_owned),
        id: id.map(str::to_owned),
        status: status_filter,
        newest,
        rows,
        now,
        page_no,
        paged,
        next,
        truncated,
        keep,
    })
}

fn render(list: &List) -> Markup {
    let List {
        agents,
        agent,
        thread,
        id,
        status: status_filter,
        newest,
        rows,
        now,
        page_no,
        paged,
        next,
        truncated,
        keep,
    } = list;
    let (agent, thread, id) = (agent.as_deref(), thread.as_deref(), id.as_deref());
    let (newest, page_no) = (*newest, *page_no);
    html! {
        h1 { "Dispatches" }
        form.filters method="get" action="/dispatches" role="search" {
            label { "Agent"
                select name="agent" {
                    option value="" { "any" }
                    @for a in agents { option value=(a) selected[agent == Some(a.as_str())] { (a) } }
                }
            }
            label { "Status"
                select name="status" {
                    option value="" { "any" }
                    @for s in Status::ALL { option value=(s.as_str()) selected[*status_filter == Some(s)] { (s.as_str()) } }
                }
            }
            label { "Thread" input type="text" name="thread" value=[thread]; }
            label { "Id" input type="text" name="id" value=[id]; }
            label { "Order"
                select name="order" {
                    option value="priority" selected[!newest] { "priority" }
                    option value="newest" selected[newest] { "newest" }
                }
            }
            button type="submit" { "Filter" }
            a href="/dispatches" { "Clear" }
        }
        @if *truncated {
            p.muted { "Newest first among the first " (SCAN) " matches in priority order; narrow the filter to see the rest." }
        }
        (dispatch_table(rows, *now, None))
        nav.pager aria-label="Pages" {
            @if newest && page_no > 0 { a href={ "/dispatches?" (keep) "page=" (page_no - 1) } { "Previous page" } }
            @if !newest && *paged { a href={ "/dispatches?" (keep) } { "First page" } }
            @if let Some(next) = next { a href={ "/dispatches?" (keep) (next) } rel="next" { "Next page" } }
        }
    }
}
