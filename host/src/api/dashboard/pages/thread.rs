//! `/threads/{thread}`: a thread's epoch, its latest log entries (following new ones) and its
//! dispatches, and interrupting it.

use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use maud::{Markup, html};
use tracing::info;

use super::super::session::Session;
use super::super::view::{self, Nav, csrf, dispatch_table, encode, notice, thread_href, when};
use super::{
    Acting, ActionForm, Dashboard, PAGE, PageError, PageState, Params, action_form, name, params,
    respond, see_other,
};
use crate::store::{DispatchRow, ListFilter, LogEntry};

/// Log entries a thread page shows (the latest).
const LOG_SHOW: usize = 200;
/// The most log entry bytes shown per entry.
const ENTRY_SHOW: usize = 4096;

/// What the page of a thread shows.
struct ThreadPage {
    thread: String,
    epoch: u64,
    /// The sequence of its latest log entry: how many it has.
    latest: u64,
    /// The latest [`LOG_SHOW`] of them.
    entries: Vec<LogEntry>,
    /// Its first [`PAGE`] dispatches in priority order.
    rows: Vec<DispatchRow>,
    now: u64,
}

/// `GET /threads/{thread}`.
pub(super) async fn page(
    State(d): PageState,
    headers: HeaderMap,
    uri: Uri,
    Path(thread): Path<String>,
    query: Result<Query<Params>, QueryRejection>,
) -> Result<Response, PageError> {
    let session = d.session(&headers, &uri)?;
    name("thread", &thread)?;
    let p = params(query)?;
    let page = read(&d, thread).await?;
    Ok(respond(
        &format!("Thread {}", page.thread),
        Nav::None,
        &session,
        render(&page, &p, &session),
    ))
}

async fn read(d: &Dashboard, thread: String) -> Result<ThreadPage, PageError> {
    let store = &d.api.store;
    let now = d.now();
    let epoch = store.mailbox.thread_epoch(&thread).await?;
    let latest = store.log.latest(&thread).await?;
    let from = latest.saturating_sub(LOG_SHOW as u64);
    let entries = store.log.read(&thread, from, LOG_SHOW).await?;
    let rows = store
        .mailbox
        .list_rows(&ListFilter {
            thread: Some(thread.clone()),
            limit: PAGE,
            ..ListFilter::default()
        })
        .await?;
    Ok(ThreadPage {
        thread,
        epoch,
        latest,
        entries,
        rows,
        now,
    })
}

fn render(page: &ThreadPage, p: &Params, session: &Session) -> Markup {
    let ThreadPage {
        thread,
        epoch,
        latest,
        entries,
        rows,
        now,
    } = page;
    let (latest, now) = (*latest, *now);
    let href = thread_href(thread);
    html! {
        h1 { "Thread " span.mono { (thread) } }
        (notice(p.notice.as_deref(), p.n.as_deref()))
        @if session.operator() {
            div.actions {
                form method="post" action={ (href) "/interrupt" } {
                    (csrf(session))
                    button.danger #interrupt type="submit" { "Interrupt thread" }
                }
            }
        }
        div #live hx-get=(href) hx-trigger="every 2s" hx-select="#live" hx-swap="outerHTML" {
            dl.meta {
                dt { "Epoch" } dd #epoch { (epoch) }
                dt { "Log entries" } dd { (latest) }
            }
            h2 { "Log" }
            p.muted { "Follows new entries (refreshes every 2 seconds)."
                @if latest > LOG_SHOW as u64 { " The latest " (LOG_SHOW) " of " (latest) " are shown." } }
            div.scroll {
                table #log {
                    thead { tr { th.num scope="col" { "Seq" } th scope="col" { "Appended" } th scope="col" { "Entry" } } }
                    tbody {
                        @for e in entries {
                            tr data-seq=(e.seq) {
                                td.num { (e.seq) }
                                td { (when(e.appended_at, now)) }
                                td { pre { (entry_text(&e.data)) } }
                            }
                        }
                        @if entries.is_empty() { tr { td colspan="3" { span.muted { "No entries." } } } }
                    }
                }
            }
            h2 { "Dispatches" }
            (dispatch_table(rows, now, None))
            @if rows.len() == PAGE {
                p { a href={ "/dispatches?thread=" (encode(thread)) } { "All dispatches of this thread" } }
            }
        }
    }
}

/// A log entry, shown as text or hex, cut at [`ENTRY_SHOW`] bytes.
fn entry_text(data: &[u8]) -> String {
    let text = match view::shown(&data[..data.len().min(ENTRY_SHOW)]) {
        view::Shown::Json(t) | view::Shown::Text(t) | view::Shown::Hex(t) => t,
    };
    if data.len() > ENTRY_SHOW {
        format!("{text}… ({} bytes in all)", data.len())
    } else {
        text
    }
}

/// `POST /threads/{thread}/interrupt`.
pub(super) async fn interrupt(
    State(d): PageState,
    Path(thread): Path<String>,
    Acting(session): Acting,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Result<Response, PageError> {
    Dashboard::csrf_ok(&session, &action_form(form).csrf, "interrupt")?;
    name("thread", &thread)?;
    let reason = format!("interrupted from the dashboard by {}", session.name);
    let done = d.api.store.mailbox.interrupt(&thread, &reason).await?;
    info!(%thread, epoch = done.epoch, superseded = done.superseded.len(), token = %session.name, "thread interrupted from the dashboard");
    Ok(see_other(format!(
        "{}?notice=interrupted",
        thread_href(&thread)
    )))
}
