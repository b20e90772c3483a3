//! `/schedules`: each schedule's times, its next fires in UTC and in its zone, what waits in
//! its buffer and its last outcomes (fired, and skipped with the reason); an operator pauses,
//! resumes and triggers it from here.

use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use maud::{Markup, html};
use serde::Deserialize;
use tracing::info;

use super::super::session::Session;
use super::super::view::{Nav, csrf, encode, notice};
use super::{
    Acting, Dashboard, PageError, PageState, Params, bad_request, not_found, page_share, params,
    respond, see_other,
};
use crate::api::dispatches::MAX_PAGE_BYTES;
use crate::store::schedules::{Spec, check_schedule_name, fire_label};
use crate::work::schedules::{self as sched, ScheduleError, ScheduleView};

/// The most schedules the page lists (the first by name; the API pages through all).
const SHOWN: usize = 100;

impl From<ScheduleError> for PageError {
    fn from(e: ScheduleError) -> PageError {
        match e {
            ScheduleError::NotFound(_) => not_found("No such schedule."),
            ScheduleError::Invalid(m) => bad_request(m),
            ScheduleError::Exists(_) => bad_request(e.to_string()),
            ScheduleError::Store(e) => e.into(),
        }
    }
}

/// `GET /schedules`.
pub(super) async fn page(
    State(d): PageState,
    headers: HeaderMap,
    uri: Uri,
    query: Result<Query<Params>, QueryRejection>,
) -> Result<Response, PageError> {
    let session = d.session(&headers, &uri)?;
    let p = params(query)?;
    // At most a page's bytes of records, under a share of the host's read budget.
    let _share = page_share().await?;
    let page = d
        .api
        .store
        .schedules
        .schedules(None, SHOWN, Some(MAX_PAGE_BYTES))
        .await?;
    let now = d.api.store.now();
    let views: Vec<ScheduleView> = page.into_iter().map(|s| sched::view(s, now)).collect();
    Ok(respond(
        "Schedules",
        Nav::Schedules,
        &session,
        render(&views, p.notice.as_deref(), &session),
    ))
}

/// The form of a pause, a resume or a trigger.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ScheduleForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    reason: String,
}

fn href(name: &str, notice: &str) -> String {
    format!("/schedules?notice={notice}#schedule-{}", encode(name))
}

fn checked_name(name: &str) -> Result<(), PageError> {
    check_schedule_name(name).map_err(bad_request)
}

/// The form of an operator's `action` on schedule `name`, its CSRF token and the name checked.
fn acted(
    session: &Session,
    form: Result<Form<ScheduleForm>, FormRejection>,
    action: &str,
    name: &str,
) -> Result<ScheduleForm, PageError> {
    let form = form.map(|Form(f)| f).unwrap_or_default();
    Dashboard::csrf_ok(session, &form.csrf, action)?;
    checked_name(name)?;
    Ok(form)
}

/// `POST /schedules/{name}/pause`.
pub(super) async fn pause(
    State(d): PageState,
    Path(name): Path<String>,
    Acting(session): Acting,
    form: Result<Form<ScheduleForm>, FormRejection>,
) -> Result<Response, PageError> {
    let form = acted(&session, form, "pause", &name)?;
    match sched::pause(&d.api.store, &name, form.reason.trim()).await {
        Ok(_) => {}
        Err(ScheduleError::Invalid(_)) => return Ok(see_other(href(&name, "pause-refused"))),
        Err(e) => return Err(e.into()),
    }
    info!(schedule = %name, token = %session.name, "schedule paused from the dashboard");
    Ok(see_other(href(&name, "schedule-paused")))
}

/// `POST /schedules/{name}/resume`.
pub(super) async fn resume(
    State(d): PageState,
    Path(name): Path<String>,
    Acting(session): Acting,
    form: Result<Form<ScheduleForm>, FormRejection>,
) -> Result<Response, PageError> {
    acted(&session, form, "resume", &name)?;
    sched::resume(&d.api.store, &name, false).await?;
    info!(schedule = %name, token = %session.name, "schedule resumed from the dashboard");
    Ok(see_other(href(&name, "resumed")))
}

/// `POST /schedules/{name}/trigger`.
pub(super) async fn trigger(
    State(d): PageState,
    Path(name): Path<String>,
    Acting(session): Acting,
    form: Result<Form<ScheduleForm>, FormRejection>,
) -> Result<Response, PageError> {
    acted(&session, form, "trigger", &name)?;
    let m = sched::trigger(&d.api.store, &name, None).await?;
    info!(schedule = %name, outcome = %m.outcome, dispatch = m.id.as_deref().unwrap_or(""), token = %session.name, "schedule triggered from the dashboard");
    let notice = match (&m.id, m.outcome.as_str()) {
        (Some(_), _) => "triggered",
        (None, "buffered") => "trigger-buffered",
        (None, _) => "trigger-skipped",
    };
    Ok(see_other(href(&name, notice)))
}

fn when(v: &ScheduleView) -> String {
    let def = &v.schedule.def;
    match &def.spec {
        Spec::Cron(c) => format!("cron {c} ({})", def.timezone),
        Spec::Every {
            every_ms,
            anchor_ms,
        } => {
            format!("every {every_ms} ms from {}", fire_label(*anchor_ms))
        }
        Spec::At(at) => format!("once at {}", fire_label(*at)),
    }
}

fn actions(v: &ScheduleView, session: &Session) -> Markup {
    let name = &v.schedule.def.name;
    html! {
        div.actions {
            @if v.schedule.paused.is_some() {
                form method="post" action={ "/schedules/" (encode(name)) "/resume" } {
                    (csrf(session))
                    button.resume type="submit" { "Resume" }
                }
            } @else {
                form method="post" action={ "/schedules/" (encode(name)) "/pause" } {
                    (csrf(session))
                    input type="text" name="reason" maxlength="1024" placeholder="Reason (optional)";
                    " "
                    button.danger.pause type="submit" { "Pause" }
                }
            }
            form method="post" action={ "/schedules/" (encode(name)) "/trigger" } {
                (csrf(session))
                button type="submit" { "Fire now" }
            }
        }
    }
}

fn render(views: &[ScheduleView], shown: Option<&str>, session: &Session) -> Markup {
    html! {
        h1 { "Schedules" }
        (notice(shown, None))
        @if views.is_empty() {
            p.muted { "No schedules. Declare one as [schedules.NAME] in homing.toml, or create one with homing schedule create." }
        }
        div.cards {
            @for v in views {
                @let s = &v.schedule;
                section.card id={ "schedule-" (s.def.name) } data-schedule=(s.def.name) {
                    h2 { (s.def.name) }
                    dl.meta {
                        dt { "Agent" } dd { a href={ "/agents#agent-" (encode(&s.def.agent)) } { (s.def.agent) } }
                        dt { "When" } dd.mono { (when(v)) }
                        dt { "Source" } dd { (s.source.as_str()) }
                        dt { "Paused" }
                        dd {
                            @match &s.paused {
                                Some(p) => { span.status.paused { "paused" } @if !p.reason.is_empty() { " " span.reason { (p.reason) } } },
                                None => span.muted { "no" },
                            }
                        }
                        dt { "Handled to" } dd.mono { (fire_label(s.watermark)) }
                        dt { "Next fires" }
                        dd {
                            @if v.next.is_empty() { span.muted { "none" } }
                            ul.next { @for n in &v.next { li { span.mono { (n.utc) } " · " (n.local) } } }
                        }
                        @if !s.buffered.is_empty() {
                            dt { "Buffered" }
                            dd { @for (i, b) in s.buffered.iter().enumerate() { @if i > 0 { ", " } span.mono { (fire_label(*b)) } } }
                        }
                        @if let Some(d) = &s.last_dispatch {
                            dt { "Last dispatch" } dd { a.mono href={ "/dispatches/" (encode(d)) } { (d) } }
                        }
                    }
                    @if !s.outcomes.is_empty() {
                        table.outcomes {
                            thead { tr { th { "Fire time (UTC)" } th { "Outcome" } } }
                            tbody {
                                @for o in s.outcomes.iter().rev() {
                                    tr {
                                        td.mono { (fire_label(o.fire)) @if let Some(t) = o.through { " to " (fire_label(t)) } }
                                        td {
                                            @if let Some(d) = &o.dispatch {
                                                "fired " a.mono href={ "/dispatches/" (encode(d)) } { (d) }
                                                @if let Some(k) = o.kind { " (" (k.as_str()) ")" }
                                            } @else if let Some(r) = o.skipped {
                                                span.status.skipped { "skipped" } " " (r.as_str())
                                                @if o.slots > 1 { " (" (o.slots) " slots)" }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                    @if session.operator() { (actions(v, session)) }
                }
            }
        }
    }
}
