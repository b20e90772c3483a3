//! `GET /v1/agents`: each plugin, its world, limits, grants, queue counts and whether it is
//! paused; `POST /v1/agents/{agent}/pause` and `/resume`. Grants show what is granted, not
//! secrets: the names of the environment variables a guest sees, never their values.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use serde_json::{Map, Value, json};

use super::dispatches::{Fields, name, object, read_body};
use super::{ApiError, ApiState};
use crate::runtime::Plugin;
use crate::runtime::host::short_version;
use crate::store::Status;
use crate::supervisor::Fleet;
use crate::work::flow::{self, FlowError, MAX_PAUSE_REASON};

/// A loaded plugin as the API describes it.
#[derive(Debug, Clone)]
pub struct AgentInfo {
    /// The plugin's name.
    pub name: String,
    /// Its world (`handler`, `agent`).
    pub world: &'static str,
    /// The contract version it was built against (`homing:agent@0.2.1`).
    pub contract: &'static str,
    /// The SHA-256 (hex) of the component bytes it runs: read and hashed once, when it was
    /// loaded (the file may have changed since).
    pub sha256: String,
    /// Its `version` label.
    pub label: Option<String>,
    /// Every version kept, newest first: (short hash, label).
    pub versions: Vec<(String, Option<String>)>,
    /// Why the last reload left it as it was.
    pub reload_error: Option<String>,
    /// Removed by a reload: its runs in flight finish, it claims nothing more.
    pub removed: bool,
}

impl AgentInfo {
    /// The description of a loaded plugin.
    pub fn of(plugin: &Plugin) -> AgentInfo {
        AgentInfo {
            name: plugin.ctx.name.clone(),
            world: plugin.world.name(),
            contract: plugin.contract.name(),
            sha256: plugin.sha256.clone(),
            label: plugin.ctx.config.version.clone(),
            versions: vec![(
                short_version(&plugin.sha256),
                plugin.ctx.config.version.clone(),
            )],
            reload_error: None,
            removed: false,
        }
    }

    /// The versions kept, newest first, as `/v1/agents` lists them.
    fn kept(&self) -> Value {
        self.versions
            .iter()
            .map(|(version, label)| json!({ "version": version, "label": label }))
            .collect()
    }

    /// The description of every plugin a host serves, with its versions and reload state.
    pub fn of_fleet(fleet: &Fleet) -> Vec<AgentInfo> {
        fleet
            .slots()
            .iter()
            .filter_map(|slot| {
                let view = slot.view();
                let newest = view.versions.first()?;
                Some(AgentInfo {
                    versions: view
                        .versions
                        .iter()
                        .map(|p| (short_version(&p.sha256), p.ctx.config.version.clone()))
                        .collect(),
                    reload_error: view.error,
                    removed: view.removed,
                    ..AgentInfo::of(newest)
                })
            })
            .collect()
    }
}

/// `GET /v1/agents`.
pub(super) async fn list(State(state): State<Arc<ApiState>>) -> Result<Json<Value>, ApiError> {
    let counts = state.store.mailbox.counts().await?;
    let pauses = state.store.limits.pauses().await?;
    let loaded = state.agents.read().map(|a| a.clone()).unwrap_or_default();
    let mut out = Vec::new();
    for (name, p) in &state.config().plugins {
        let info = loaded
            .as_ref()
            .and_then(|agents| agents.iter().find(|a| &a.name == name));
        let world = info.map(|a| a.world);
        let mut queue = Map::new();
        for status in Status::ALL {
            let n = counts
                .iter()
                .find(|c| &c.agent == name && c.status == status)
                .map_or(0, |c| c.count);
            queue.insert(status.as_str().into(), n.into());
        }
        let flow = flow::flow(&state.config(), &state.store, name, &pauses).await?;
        out.push(json!({
            "name": name,
            "world": world,
            "contract": info.map(|a| a.contract),
            "loaded": world.is_some(),
            "component_sha256": info.map(|a| a.sha256.as_str()),
            "version": info.map(|a| short_version(&a.sha256)),
            "version_label": info.and_then(|a| a.label.as_deref()),
            "versions": info.map(AgentInfo::kept),
            "reload_error": info.and_then(|a| a.reload_error.as_deref()),
            "removed": info.is_some_and(|a| a.removed),
            "limits": {
                "concurrency": p.concurrency,
                "memory": p.memory,
                "timeout_ms": p.timeout.as_millis() as u64,
                "fuel": p.fuel,
                "max_attempts": p.max_attempts,
                "reuse_instance": p.reuse_instance,
                // Flow control: each limit its claims or requests honour, and its use now.
                "scopes": flow.limits,
                "concurrency_key": flow.concurrency_key,
                "key_concurrency": flow.key_concurrency,
                "key_rate": flow.key_rate,
            },
            "grants": {
                "env": p.env.keys().collect::<Vec<_>>(),
                "dirs": p.dirs.iter().map(|d| json!({ "guest": d.guest, "writable": d.writable })).collect::<Vec<_>>(),
                "allowed_hosts": p.allowed_hosts,
                "allowed_outbound_hosts": p.allowed_outbound_hosts.iter().map(ToString::to_string).collect::<Vec<_>>(),
                // Names, kinds and sources only: never a value.
                "variables": p.variables.iter().map(|(k, v)| json!({ "name": k, "secret": v.is_secret(), "from": v.origin() })).collect::<Vec<_>>(),
                "enqueue_to": p.enqueue_to,
            },
            "queue": queue,
            "paused": flow.paused,
            "pause_reason": flow.pause_reason,
            "paused_at": flow.paused_at,
            "paused_keys": flow.paused_keys,
        }));
    }
    // Plugins a reload added after the API started (its config is the one it started with).
    for info in loaded.iter().flatten() {
        if state.config().plugins.contains_key(&info.name) {
            continue;
        }
        out.push(json!({
            "name": info.name,
            "world": info.world,
            "contract": info.contract,
            "loaded": true,
            "component_sha256": info.sha256,
            "version": short_version(&info.sha256),
            "version_label": info.label,
            "versions": info.kept(),
            "reload_error": info.reload_error,
            "removed": info.removed,
        }));
    }
    let config_error = state
        .reload
        .read()
        .ok()
        .and_then(|r| r.as_ref().and_then(|r| r.1.config_error()));
    Ok(Json(json!({ "agents": out, "config_error": config_error })))
}

/// `POST /v1/agents/{agent}/reload`: reloads the config file and this agent's component (a
/// new version is compiled, checked and swapped in; in-flight runs finish on theirs) →
/// `{"agent", "version", "swapped", "error"}`. 404 for an agent neither served nor configured,
/// 503 when no host runs in this process, 422 when the config no longer loads.
pub(super) async fn reload(
    State(state): State<Arc<ApiState>>,
    Path(agent): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    name("agent", &agent)?;
    let bytes = read_body(&headers, body, state.body_limit).await?;
    if !bytes.iter().all(u8::is_ascii_whitespace) {
        Fields::new(object(&bytes)?).finish()?;
    }
    let Some((reloader, fleet)) = state.reload.read().ok().and_then(|r| r.clone()) else {
        return Err(ApiError::busy(
            "no host is running in this process to reload",
        ));
    };
    let out = reloader
        .reload(Some(agent.clone()), "API")
        .await
        .map_err(|e| {
            if e.starts_with("no plugin") {
                ApiError::not_found(e).with("field", "agent")
            } else {
                ApiError::unprocessable(e)
            }
        })?;
    let slot = fleet.slot(&agent);
    let version = slot
        .as_ref()
        .and_then(|s| s.current())
        .map(|c| short_version(&c.newest.sha256));
    let error = out
        .failed
        .iter()
        .find(|(name, _)| name == &agent)
        .map(|(_, e)| e.clone());
    Ok(Json(json!({
        "agent": agent,
        "version": version,
        "swapped": out.swapped.iter().any(|(name, _, _)| name == &agent),
        "added": out.added.contains(&agent),
        "error": error,
    })))
}

/// A refused pause or resume as the API answers it: 404 for an unknown agent, 413 for a reason
/// over its limit, 400 for other bad input.
impl From<FlowError> for ApiError {
    fn from(e: FlowError) -> ApiError {
        match e {
            FlowError::UnknownAgent { ref agent, .. } => {
                ApiError::not_found(format!("no agent `{agent}`")).with("field", "agent")
            }
            FlowError::ReasonTooLong { .. } => {
                ApiError::too_large("reason", e.to_string(), MAX_PAUSE_REASON as u64)
            }
            FlowError::Invalid { field, message } => ApiError::invalid(field, message),
            FlowError::Store(e) => e.into(),
        }
    }
}

/// `POST /v1/agents/{agent}/pause`: `{"key"?, "reason"?}` → `{"agent", "key", "reason", "at"}`.
/// No host claims the agent's dispatches (of `key` only, when given) until it is resumed.
pub(super) async fn pause(
    State(state): State<Arc<ApiState>>,
    Path(agent): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    name("agent", &agent)?;
    let bytes = read_body(&headers, body, state.body_limit).await?;
    let mut fields = Fields::new(object(&bytes)?);
    let key = fields.string("key")?;
    let reason = fields.string("reason")?.unwrap_or_default();
    fields.finish()?;
    let pause = flow::pause(
        &state.config(),
        &state.store,
        &agent,
        key.as_deref(),
        &reason,
    )
    .await?;
    Ok(Json(json!({
        "agent": pause.agent,
        "key": pause.key,
        "reason": pause.reason,
        "at": pause.at,
    })))
}

/// `POST /v1/agents/{agent}/resume`: `{"key"?}` → `{"agent", "key", "resumed"}` (`resumed` is
/// `false` when there was no such pause).
pub(super) async fn resume(
    State(state): State<Arc<ApiState>>,
    Path(agent): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    name("agent", &agent)?;
    let bytes = read_body(&headers, body, state.body_limit).await?;
    let mut fields = Fields::new(object(&bytes)?);
    let key = fields.string("key")?;
    fields.finish()?;
    let resumed = flow::resume(&state.config(), &state.store, &agent, key.as_deref()).await?;
    Ok(Json(
        json!({ "agent": agent, "key": key, "resumed": resumed }),
    ))
}
