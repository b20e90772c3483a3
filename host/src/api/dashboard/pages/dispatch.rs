//! `/dispatches/{id}`: one dispatch (payload, result, metadata, attempts, a timeline, its
//! waitpoints, its journal), and the actions on it: cancel, retry (and interrupting its thread, posted to
//! the thread's page).

use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use tracing::info;

use super::super::session::Session;
use super::super::stats;
use super::super::view::{Nav, bytes, csrf, dispatch_href, notice, status, thread_href, when};
use super::{
    Acting, ActionForm, Dashboard, PageError, PageState, Params, action_form, name, not_found,
    page_share, params, respond, see_other,
};
use crate::store::journal::{JournalAsk, JournalPage};
use crate::store::waitpoints::MAX_WAITPOINTS;
use crate::store::{Dispatch, Status, Waitpoint, WaitpointFilter, WaitpointState};
use crate::work;
use crate::work::journal::{self as journal_view, EntryView};

/// The most journal entries the page lists; the API and the CLI list them all.
const MAX_JOURNAL_ROWS: usize = 500;

/// The most bytes of journal entries (their answers: no bodies) and of steps the page reads;
/// past them, the API and the CLI list the rest.
const MAX_JOURNAL_LISTED: usize = 1 << 20;

/// The most bytes of pretty-printed bodies one page carries; later bodies are left to the API.
const MAX_JOURNAL_BODIES: usize = 1 << 20;

/// The most bytes of bodies the page reads to pretty-print them (one entry at a time, each at
/// most [`journal_view::PRETTY_MAX`]), JSON or not.
const MAX_BODIES_READ: usize = 2 * MAX_JOURNAL_BODIES;

/// The most bytes of waitpoints (their metadata: no results) the page reads.
const MAX_WAITPOINTS_LISTED: usize = 1 << 20;

/// What the page of a dispatch shows.
struct DispatchPage {
    r: Dispatch,
    /// Its waitpoints, oldest first, without their results.
    waitpoints: Vec<Waitpoint>,
    /// Whether it has more waitpoints than the page read.
    more_waitpoints: bool,
    now: u64,
    /// What happened when, oldest first.
    timeline: Vec<(u64, String)>,
    /// What its runs recorded: the first call entries by position and steps by key, without
    /// bodies or values.
    journal: JournalPage,
    /// The small JSON bodies of the listed entries, pretty-printed, by position.
    pretty: std::collections::BTreeMap<u32, String>,
}

/// `GET /dispatches/{id}/stream`: the dispatch's stream (as the API's
/// `/v1/dispatches/{id}/stream`) for the page's script, with the session's authority.
pub(super) async fn stream(
    State(d): PageState,
    headers: HeaderMap,
    uri: Uri,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    let session = d.session(&headers, &uri)?;
    name("id", &id)?;
    let after = crate::api::stream::cursor(None, &headers)
        .map_err(|_| PageError::Status(StatusCode::BAD_REQUEST, "Bad Last-Event-ID.".into()))?;
    let permit = d.api.streams.open(&session.name).map_err(|_| {
        PageError::Status(
            StatusCode::TOO_MANY_REQUESTS,
            "Too many streams are open.".into(),
        )
    })?;
    match crate::api::stream::open(&d.api, &id, after, permit).await {
        Ok(Some(sse)) => Ok(sse.into_response()),
        Ok(None) => Err(not_found("No such dispatch.")),
        Err(_) => Err(PageError::Status(
            StatusCode::SERVICE_UNAVAILABLE,
            "The stream cannot be read now.".into(),
        )),
    }
}

/// `GET /dispatches/{id}`.
pub(super) async fn page(
    State(d): PageState,
    headers: HeaderMap,
    uri: Uri,
    Path(id): Path<String>,
    query: Result<Query<Params>, QueryRejection>,
) -> Result<Response, PageError> {
    let session = d.session(&headers, &uri)?;
    name("id", &id)?;
    let p = params(query)?;
    let page = read(&d, &id).await?;
    Ok(respond(
        &format!("Dispatch {}", page.r.id),
        Nav::Dispatches,
        &session,
        render(&page, &p, &session),
    ))
}

/// The dispatch, and its timeline from the times it records.
async fn read(d: &Dashboard, id: &str) -> Result<DispatchPage, PageError> {
    let Some(r) = d.api.store.mailbox.load(id).await? else {
        return Err(not_found("No such dispatch."));
    };
    let now = d.now();
    let mut timeline: Vec<(u64, String)> = vec![(r.created_at, "enqueued".into())];
    if r.available_at > r.created_at {
        timeline.push((r.available_at, "available to claim".into()));
    }
    if let Some(t) = r.started_at {
        timeline.push((t, "run started".into()));
    }
    if let Some(claim) = &r.claim {
        timeline.push((
            claim.lease_until,
            format!("lease ends (held by {})", claim.claimed_by),
        ));
    }
    if let Some(t) = r.completed_at {
        timeline.push((t, format!("settled: {}", r.status)));
    }
    timeline.push((r.updated_at, "last changed".into()));
    timeline.sort_by_key(|(t, _)| *t);
    // A page of each, without results, bodies or values: a share of the host's read budget.
    let _share = page_share().await?;
    let waitpoints = d
        .api
        .store
        .waitpoints
        .read_waitpoints(
            &WaitpointFilter {
                dispatch: Some(id.to_owned()),
                limit: MAX_WAITPOINTS as usize,
                ..WaitpointFilter::default()
            },
            MAX_WAITPOINTS_LISTED,
            false,
        )
        .await?;
    let journal = d
        .api
        .store
        .journal
        .journal_page(
            id,
            &JournalAsk {
                after: None,
                limit: MAX_JOURNAL_ROWS,
                max_bytes: MAX_JOURNAL_LISTED,
                max_step_bytes: MAX_JOURNAL_LISTED / 4,
            },
        )
        .await?;
    // The JSON bodies shown pretty-printed, read one at a time while they fit in the page's
    // share.
    let mut pretty = std::collections::BTreeMap::new();
    let mut room = MAX_JOURNAL_BODIES;
    let mut reads = MAX_BODIES_READ;
    for call in &journal.calls {
        let Some(size) = call.body_size.and_then(|s| usize::try_from(s).ok()) else {
            continue;
        };
        if size > journal_view::PRETTY_MAX || size > room {
            continue;
        }
        let Some(left) = reads.checked_sub(size) else {
            break;
        };
        reads = left;
        let Some(entry) = d.api.store.journal.call_entry(id, call.entry.pos).await? else {
            continue;
        };
        if let Some(text) = entry.body.as_deref().and_then(journal_view::pretty_json)
            && let Some(left) = room.checked_sub(text.len())
        {
            room = left;
            pretty.insert(call.entry.pos, text);
        }
    }
    Ok(DispatchPage {
        r,
        waitpoints: waitpoints.waitpoints,
        more_waitpoints: waitpoints.more,
        now,
        timeline,
        journal,
        pretty,
    })
}

fn render(page: &DispatchPage, p: &Params, session: &Session) -> Markup {
    let DispatchPage {
        r,
        waitpoints,
        more_waitpoints,
        now,
        timeline,
        journal,
        pretty,
    } = page;
    let now = *now;
    let href = dispatch_href(&r.id);
    let live = !r.status.is_terminal();
    html! {
        h1 { "Dispatch " span.mono { (r.id) } }
        (notice(p.notice.as_deref(), p.n.as_deref()))
        div #live hx-get=[live.then_some(href.as_str())] hx-trigger=[live.then_some("every 2s")] hx-select=[live.then_some("#live")] hx-swap=[live.then_some("outerHTML")] {
            dl.meta {
                dt { "Status" } dd #status { (status(r.status)) @if live { span.muted { " (refreshing)" } } }
                dt { "Agent" } dd { (r.agent) }
                dt { "Thread" } dd { a #thread-link href=(thread_href(&r.thread)) { (r.thread) } }
                dt { "Priority" } dd { (r.priority) }
                dt { "Attempts" } dd { (r.attempt) " failed of " (r.max_attempts) " allowed" }
                dt { "Claims" } dd { (r.claims) @if r.resumes > 0 { " (" (r.resumes) " resumes)" } }
                @if let Some(u) = &r.usage {
                    dt { "Tokens" } dd #usage { (u.input_tokens) " in (" (u.cached_tokens) " cached), " (u.output_tokens) " out, " (u.calls) " model calls" }
                }
                dt { "Epoch" } dd { (r.epoch) }
                dt { "Run id" } dd.mono { (r.run_id) }
                @if let Some(key) = &r.dedupe_key { dt { "Dedupe key" } dd.mono { (key) } }
                @if let Some(key) = &r.concurrency_key { dt { "Concurrency key" } dd.mono #concurrency-key { (key) } }
                @if !r.versions.is_empty() {
                    dt { "Versions" }
                    dd #versions {
                        ol.versions {
                            @for v in &r.versions {
                                li { "claim " (v.claim) ": " span.mono { (v.version) } @if let Some(label) = &v.label { " (" (label) ")" } }
                            }
                        }
                    }
                }
                @if let Some(claim) = &r.claim {
                    dt { "Held by" } dd.mono { (claim.claimed_by) " (host " (stats::host_of(&claim.claimed_by)) ")" }
                }
                @if let Some(e) = &r.last_error { dt { "Last error" } dd #last-error { (e) } }
            }
            @if session.operator() {
                div.actions {
                    @if r.status.can_cancel() {
                        form method="post" action={ (href) "/cancel" } {
                            (csrf(session))
                            button.danger #cancel type="submit" { "Cancel" }
                        }
                    }
                    @if matches!(r.status, Status::DeadLetter | Status::Cancelled) {
                        form method="post" action={ (href) "/retry" } {
                            (csrf(session))
                            button #retry type="submit" { "Retry" }
                        }
                    }
                    @if live {
                        form method="post" action={ (thread_href(&r.thread)) "/interrupt" } {
                            (csrf(session))
                            button.danger #interrupt type="submit" { "Interrupt thread" }
                        }
                    }
                }
            }
            h2 { "Attempts" }
            p {
                (r.attempt) " failed attempt(s) so far."
                @if let Some(claim) = &r.claim { " The current attempt is held by " span.mono { (claim.claimed_by) } "." }
                @if let Some(e) = &r.last_error { " The last error: " q { (e) } }
            }
            p.muted { "The store keeps the latest attempt of a dispatch (holder, start, error), not each one." }
            @if !waitpoints.is_empty() {
                h2 { "Waitpoints" }
                div.scroll {
                    table #dispatch-waitpoints {
                        thead { tr {
                            th scope="col" { "Name" } th scope="col" { "State" } th scope="col" { "Created" }
                            th scope="col" { "Times out or settled" }
                        } }
                        tbody {
                            @for w in waitpoints {
                                tr data-waitpoint=(w.id) {
                                    td { (w.name) br; span.mono.muted { (w.id) } }
                                    td { (w.state.as_str()) }
                                    td { (when(w.created_at, now)) " (claim " (w.created_claim) ")" }
                                    td {
                                        @match (w.state, w.settled_at) {
                                            (WaitpointState::Pending, _) | (_, None) => { "times out " (when(w.timeout_at, now)) }
                                            (_, Some(at)) => {
                                                (when(at, now))
                                                @if let Some(by) = &w.settled_by { " by " span.mono { (by) } }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                @if *more_waitpoints {
                    p.muted { "The first " (waitpoints.len()) " waitpoints; the API lists them all." }
                }
                @if waitpoints.iter().any(Waitpoint::is_pending) {
                    p { a href="/waiting" { "Pending waitpoints are decided on the Waiting page." } }
                }
            }
            h2 { "Timeline" }
            ol.timeline {
                @for (t, what) in timeline { li { (when(*t, now)) " — " (what) } }
            }
            @if let Some(result) = &r.result {
                h2 { "Result (" (result.status.as_str()) ")" }
                @if let Some(e) = &result.error { p #result-error { "Error: " (e) } }
                (bytes(&result.output, "result"))
            }
        }
        // Outside the refreshing part: the page's script fills it from the dispatch's stream.
        section #output data-stream={ (href) "/stream" } {
            h2 { "Output" }
            p #output-state.muted { "What the run streams shows here as it comes." }
            pre #output-text {}
        }
        (journal_section(journal, pretty, now))
        @if let Some(w) = &r.window {
            (window_section(r, w, now))
        }
        h2 { "Payload" }
        (bytes(&r.payload, "payload"))
        h2 { "Metadata" }
        @if r.metadata.is_empty() { p.muted { "none" } }
        @else {
            dl.meta #metadata {
                @for (k, v) in &r.metadata {
                    dt.mono { (k) }
                    dd.mono {
                        @if k == "retry-of" { a href=(dispatch_href(v)) { (v) } } @else { (v) }
                    }
                }
            }
        }
    }
}

/// The journal: a table of the first call entries (an http entry's JSON body pretty-printed in
/// a `<details>` when it is small), then the steps by key. Nothing when the journal is empty.
fn journal_section(
    journal: &JournalPage,
    pretty: &std::collections::BTreeMap<u32, String>,
    now: u64,
) -> Markup {
    if journal.call_count == 0 && journal.step_count == 0 {
        return html! {};
    }
    html! {
        h2 { "Journal" }
        p.muted {
            (journal.call_count) " call entries, " (journal.step_count) " steps, "
            (journal.bytes) " bytes. A retry or a resume is answered from these instead of asking again."
        }
        @if !journal.calls.is_empty() {
            div.scroll {
                table #journal {
                    thead { tr {
                        th scope="col" { "Pos" } th scope="col" { "Kind" } th scope="col" { "Claim" }
                        th scope="col" { "Attempt" } th scope="col" { "Status" } th scope="col" { "Call" }
                        th scope="col" { "Duration" } th scope="col" { "Size" } th scope="col" { "Recorded" }
                    } }
                    tbody {
                        @for call in &journal.calls {
                            @let v = EntryView::of_summary(call);
                            tr data-pos=(v.pos) {
                                td { (v.pos) }
                                td { (v.kind) }
                                td { (v.claim) }
                                td { (v.attempt) }
                                td { @if let Some(s) = v.status { (s) } }
                                td.mono {
                                    @if v.answer.is_none() {
                                        (v.method.as_deref().unwrap_or("?")) " " (v.url.as_deref().unwrap_or("?"))
                                    } @else {
                                        (v.describe())
                                    }
                                    @if let Some(size) = v.body_size {
                                        @if let Some(pretty) = pretty.get(&v.pos) {
                                            details {
                                                summary { "body (" (size) " bytes)" }
                                                pre { (pretty) }
                                            }
                                        } @else {
                                            br; span.muted { "body: " (size) " bytes (see the API)" }
                                        }
                                    }
                                }
                                td { (journal_view::duration(v.duration_us)) }
                                td { (v.size) }
                                td { (when(v.recorded_at, now)) }
                            }
                        }
                    }
                }
            }
            @if journal.more {
                p.muted {
                    "The first " (journal.calls.len()) " entries; "
                    span.mono { "homing dispatch show ID --journal" } " and the API list them all."
                }
            }
        }
        @if !journal.steps.is_empty() {
            h3 { "Steps" }
            div.scroll {
                table #journal-steps {
                    thead { tr {
                        th scope="col" { "Key" } th scope="col" { "Claim" } th scope="col" { "Attempt" }
                        th scope="col" { "Size" } th scope="col" { "Recorded" }
                    } }
                    tbody {
                        @for s in &journal.steps {
                            tr {
                                td.mono { (s.key) }
                                td { (s.claim) }
                                td { (s.attempt) }
                                td { (s.size) }
                                td { (when(s.recorded_at, now)) }
                            }
                        }
                    }
                }
            }
            @if journal.more_steps {
                p.muted {
                    "The first " (journal.steps.len()) " steps; "
                    span.mono { "homing dispatch show ID --journal" } " lists them all."
                }
            }
        }
    }
}

/// `POST /dispatches/{id}/cancel`.
pub(super) async fn cancel(
    State(d): PageState,
    Path(id): Path<String>,
    Acting(session): Acting,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Result<Response, PageError> {
    Dashboard::csrf_ok(&session, &action_form(form).csrf, "cancel")?;
    name("id", &id)?;
    let r = work::cancel(&d.api.store, &id).await?;
    info!(dispatch = %r.id, token = %session.name, "cancelled from the dashboard");
    Ok(see_other(format!(
        "{}?notice=cancelled",
        dispatch_href(&r.id)
    )))
}

/// `POST /dispatches/{id}/retry`.
pub(super) async fn retry(
    State(d): PageState,
    Path(id): Path<String>,
    Acting(session): Acting,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Result<Response, PageError> {
    Dashboard::csrf_ok(&session, &action_form(form).csrf, "retry")?;
    name("id", &id)?;
    let r = work::retry(&d.api.config(), &d.api.store, &id).await?;
    info!(dispatch = %id, new = %r.id, token = %session.name, "retried from the dashboard");
    Ok(see_other(format!(
        "{}?notice=retried",
        dispatch_href(&r.id)
    )))
}

/// The items a window's section shows at most (the rest are counted).
const WINDOW_ITEMS_SHOWN: usize = 50;

/// A dispatch's debounce window: its key, whether others may still join, when it is due, and
/// the first items of a `collect` window (each cut as a payload is).
fn window_section(r: &Dispatch, w: &crate::store::model::Window, now: u64) -> Markup {
    let state = match crate::store::rules::window::state(r) {
        "open" => "open: enqueues with its key join it",
        "sealed" => "sealed: full",
        _ => "closed: it was claimed",
    };
    html! {
        h2 { "Debounce window" }
        dl.meta #window {
            dt { "Key" } dd.mono { (w.key) }
            dt { "State" } dd #window-state { (state) }
            dt { "Holds" } dd #window-count { (w.count) " of at most " (w.max_items) " (" (w.payload.as_str()) ")" }
            dt { "Quiet / longest wait" } dd { (w.quiet_ms) " ms / " (w.max_wait_ms) " ms" }
            dt { "First / latest" } dd { (when(w.first_at, now)) " / " (when(w.last_at, now)) }
            dt { "Due" } dd { (when(r.available_at, now)) }
        }
        @if !w.items.is_empty() {
            ol #window-items {
                @for (n, item) in w.items.iter().take(WINDOW_ITEMS_SHOWN).enumerate() {
                    li { (bytes(&item.payload, &format!("item-{}", n + 1))) }
                }
            }
            @if w.items.len() > WINDOW_ITEMS_SHOWN {
                p.muted { "The first " (WINDOW_ITEMS_SHOWN) " of " (w.items.len()) " items are shown." }
            }
        }
    }
}
