//! `/agents`: each configured agent's world, limits and grants (names, never values), the
//! SHA-256 of the component this host loaded, whether it is paused and why, and each flow
//! limit's use; an operator pauses and resumes it from here.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use maud::{Markup, html};
use serde::Deserialize;
use tracing::info;

use super::super::session::Session;
use super::super::view::{Nav, age, csrf, encode, notice};
use super::{
    Acting, Dashboard, PageError, PageState, Params, bad_request, name, not_found, params, respond,
    see_other,
};
use crate::api::AgentInfo;
use crate::work::flow::{self, AgentFlow, FlowError};

/// What the agents page shows: the config's plugins, what this host loaded of them, and how
/// their flow control stands.
struct Agents {
    /// The config in force (its plugin tables).
    config: Arc<crate::config::Config>,
    /// `None` until the plugins are loaded.
    loaded: Option<Vec<AgentInfo>>,
    /// Per agent, its pauses and limits.
    flows: BTreeMap<String, AgentFlow>,
    notice: Option<String>,
}

/// `GET /agents`.
pub(super) async fn page(
    State(d): PageState,
    headers: HeaderMap,
    uri: Uri,
    query: Result<Query<Params>, QueryRejection>,
) -> Result<Response, PageError> {
    let session = d.session(&headers, &uri)?;
    let p = params(query)?;
    let agents = read(&d, p.notice).await?;
    Ok(respond(
        "Agents",
        Nav::Agents,
        &session,
        render(&agents, &session),
    ))
}

async fn read(d: &Dashboard, notice: Option<String>) -> Result<Agents, PageError> {
    let pauses = d.api.store.limits.pauses().await?;
    let config = d.api.config();
    let mut flows = BTreeMap::new();
    for name in config.plugins.keys() {
        let state = flow::flow(&config, &d.api.store, name, &pauses).await?;
        flows.insert(name.clone(), state);
    }
    Ok(Agents {
        config,
        loaded: d.api.agents.read().map(|a| a.clone()).unwrap_or_default(),
        flows,
        notice,
    })
}

/// The form of a pause or a resume.
#[derive(Debug, Default, Deserialize)]
pub(super) struct PauseForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    reason: String,
}

impl From<FlowError> for PageError {
    fn from(e: FlowError) -> PageError {
        match e {
            FlowError::UnknownAgent { .. } => not_found("No such agent."),
            FlowError::Invalid { message, .. } => bad_request(message),
            FlowError::ReasonTooLong { .. } => bad_request(e.to_string()),
            FlowError::Store(e) => e.into(),
        }
    }
}

fn agent_href(agent: &str, notice: &str) -> String {
    format!("/agents?notice={notice}#agent-{}", encode(agent))
}

/// `POST /agents/{agent}/pause`: pauses all of the agent's claims, with the form's reason.
pub(super) async fn pause(
    State(d): PageState,
    Path(agent): Path<String>,
    Acting(session): Acting,
    form: Result<Form<PauseForm>, FormRejection>,
) -> Result<Response, PageError> {
    let form = form.map(|Form(f)| f).unwrap_or_default();
    Dashboard::csrf_ok(&session, &form.csrf, "pause")?;
    name("agent", &agent)?;
    let reason = form.reason.trim();
    match flow::pause(&d.api.config(), &d.api.store, &agent, None, reason).await {
        Ok(_) => {}
        Err(FlowError::Invalid { .. } | FlowError::ReasonTooLong { .. }) => {
            return Ok(see_other(agent_href(&agent, "pause-refused")));
        }
        Err(e) => return Err(e.into()),
    }
    info!(%agent, token = %session.name, "agent paused from the dashboard");
    Ok(see_other(agent_href(&agent, "paused")))
}

/// `POST /agents/{agent}/resume`: lifts the agent's pause.
pub(super) async fn resume(
    State(d): PageState,
    Path(agent): Path<String>,
    Acting(session): Acting,
    form: Result<Form<PauseForm>, FormRejection>,
) -> Result<Response, PageError> {
    let form = form.map(|Form(f)| f).unwrap_or_default();
    Dashboard::csrf_ok(&session, &form.csrf, "resume")?;
    name("agent", &agent)?;
    let lifted = flow::resume(&d.api.config(), &d.api.store, &agent, None).await?;
    info!(%agent, token = %session.name, lifted, "agent resumed from the dashboard");
    Ok(see_other(agent_href(
        &agent,
        if lifted { "resumed" } else { "not-paused" },
    )))
}

fn flow_rows(state: &AgentFlow) -> Markup {
    html! {
        dt { "Paused" }
        dd.pause {
            @if state.paused {
                span.status.paused { "paused" }
                @if let Some(reason) = state.pause_reason.as_deref().filter(|r| !r.is_empty()) {
                    " " span.reason { (reason) }
                }
            } @else { span.muted { "no" } }
        }
        @if !state.paused_keys.is_empty() {
            dt { "Paused keys" }
            dd { @for (i, k) in state.paused_keys.iter().enumerate() {
                @if i > 0 { ", " } span.mono { (k.key) }
                @if !k.reason.is_empty() { " (" (k.reason) ")" }
            } }
        }
        @if let Some(source) = &state.concurrency_key { dt { "Concurrency key" } dd.mono { (source) } }
        @if let Some(n) = state.key_concurrency { dt { "Per key" } dd { "at most " (n) " running" } }
        @if let Some(rate) = &state.key_rate { dt { "Per key rate" } dd { (rate) } }
        @for scope in &state.limits {
            dt { "Limit " span.mono { (scope.name) } }
            dd {
                @if let Some(cap) = scope.concurrency { (scope.running) " of " (cap) " running" }
                @if scope.concurrency.is_some() && scope.rate.is_some() { "; " }
                @if let Some(rate) = &scope.rate {
                    (rate)
                    @if let Some(t) = scope.tokens { ", " (format!("{t:.1}")) " tokens left" }
                }
                @if !scope.origins.is_empty() { " (requests to " (scope.origins.join(", ")) ")" }
            }
        }
    }
}

fn pause_actions(name: &str, state: &AgentFlow, session: &Session) -> Markup {
    html! {
        div.actions {
            @if state.paused {
                form method="post" action={ "/agents/" (encode(name)) "/resume" } {
                    (csrf(session))
                    button.resume type="submit" { "Resume" }
                }
            } @else {
                form method="post" action={ "/agents/" (encode(name)) "/pause" } {
                    (csrf(session))
                    input type="text" name="reason" maxlength="1024" placeholder="Reason (optional)";
                    " "
                    button.danger.pause type="submit" { "Pause" }
                }
            }
        }
    }
}

fn render(agents: &Agents, session: &Session) -> Markup {
    let Agents {
        config,
        loaded,
        flows,
        notice: shown,
    } = agents;
    html! {
        h1 { "Agents" }
        (notice(shown.as_deref(), None))
        div.cards {
            @for (name, p) in &config.plugins {
                @let info = loaded.as_ref().and_then(|a| a.iter().find(|a| &a.name == name));
                @let world = info.map(|a| a.world);
                @let state = flows.get(name);
                section.card id={ "agent-" (name) } data-agent=(name) data-paused=[state.map(|s| s.paused.to_string())] {
                    h2 { (name) }
                    dl.meta {
                        @if let Some(state) = state { (flow_rows(state)) }
                        dt { "World" } dd { @match world { Some(w) => (w), None => span.muted { "not loaded yet" } } }
                        @if let Some(info) = info { dt { "Contract" } dd { (info.contract) } }
                        dt { "Component SHA-256" }
                        dd.mono {
                            @match info {
                                Some(a) => (a.sha256),
                                None => span.muted { "not loaded yet" },
                            }
                        }
                        dt { "Concurrency" } dd { (p.concurrency) }
                        dt { "Memory" } dd { (p.memory) " bytes" }
                        dt { "Timeout" } dd { (age(p.timeout.as_millis() as u64)) }
                        dt { "Fuel" } dd { @match p.fuel { Some(f) => (f), None => "unlimited" } }
                        dt { "Max attempts" } dd { (p.max_attempts) }
                        dt { "Reuse instance" } dd { (p.reuse_instance) }
                        dt { "Environment" }
                        dd { @if p.env.is_empty() { span.muted { "none" } } @else {
                            @for (i, k) in p.env.keys().enumerate() { @if i > 0 { ", " } span.mono { (k) } }
                            span.muted { " (names only)" }
                        } }
                        dt { "Directories" }
                        dd { @if p.dirs.is_empty() { span.muted { "none" } } @else {
                            @for (i, dir) in p.dirs.iter().enumerate() { @if i > 0 { ", " } span.mono { (dir.guest) } @if dir.writable { " (writable)" } @else { " (read-only)" } }
                        } }
                        dt { "Outbound hosts" }
                        dd { @if p.allowed_hosts.is_empty() { span.muted { "none" } } @else { span.mono { (p.allowed_hosts.join(", ")) } } }
                        dt { "May enqueue to" }
                        dd { @if p.enqueue_to.is_empty() { span.muted { "none" } } @else { (p.enqueue_to.join(", ")) } }
                    }
                    @if let Some(state) = state.filter(|_| session.operator()) {
                        (pause_actions(name, state, session))
                    }
                }
            }
        }
        p.muted { "The SHA-256 is of the component as this host loaded and runs it (the file may have changed since)." }
    }
}
