//! `/agents`: each configured agent's world, limits and grants (names, never values), and the
//! SHA-256 of the component this host loaded.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use maud::{Markup, html};

use super::super::view::{Nav, age};
use super::{Dashboard, PageError, PageState, respond};
use crate::api::AgentInfo;
use crate::config::PluginConfig;

/// What the agents page shows: the config's plugins, and what this host loaded of them.
struct Agents<'a> {
    plugins: &'a BTreeMap<String, PluginConfig>,
    /// `None` until the plugins are loaded.
    loaded: Option<Vec<AgentInfo>>,
}

/// `GET /agents`.
pub(super) async fn page(
    State(d): PageState,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, PageError> {
    let session = d.session(&headers, &uri)?;
    Ok(respond("Agents", Nav::Agents, &session, render(&read(&d))))
}

fn read(d: &Dashboard) -> Agents<'_> {
    Agents {
        plugins: &d.api.config.plugins,
        loaded: d.api.agents.read().map(|a| a.clone()).unwrap_or_default(),
    }
}

fn render(agents: &Agents<'_>) -> Markup {
    let Agents { plugins, loaded } = agents;
    html! {
        h1 { "Agents" }
        div.cards {
            @for (name, p) in *plugins {
                @let info = loaded.as_ref().and_then(|a| a.iter().find(|a| &a.name == name));
                @let world = info.map(|a| a.world);
                section.card data-agent=(name) {
                    h2 { (name) }
                    dl.meta {
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
                }
            }
        }
        p.muted { "The SHA-256 is of the component as this host loaded and runs it (the file may have changed since)." }
    }
}
