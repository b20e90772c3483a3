//! `GET /v1/agents`: each plugin, its world, limits, grants and queue counts. Grants show what
//! is granted, not secrets: the names of the environment variables a guest sees, never their
//! values.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde_json::{Map, Value, json};

use super::{ApiError, ApiState};
use crate::runtime::Plugin;
use crate::store::Status;

/// A loaded plugin as the API describes it.
#[derive(Debug, Clone)]
pub struct AgentInfo {
    /// The plugin's name.
    pub name: String,
    /// Its world (`handler`, `agent`).
    pub world: &'static str,
    /// The contract version it was built against (`homing:agent@0.2.0`).
    pub contract: &'static str,
    /// The SHA-256 (hex) of the component bytes it runs: read and hashed once, when it was
    /// loaded (the file may have changed since).
    pub sha256: String,
}

impl AgentInfo {
    /// The description of a loaded plugin.
    pub fn of(plugin: &Plugin) -> AgentInfo {
        AgentInfo {
            name: plugin.ctx.name.clone(),
            world: plugin.world.name(),
            contract: plugin.contract.name(),
            sha256: plugin.sha256.clone(),
        }
    }
}

/// `GET /v1/agents`.
pub(super) async fn list(State(state): State<Arc<ApiState>>) -> Result<Json<Value>, ApiError> {
    let counts = state.store.mailbox.counts().await?;
    let loaded = state.agents.read().map(|a| a.clone()).unwrap_or_default();
    let mut out = Vec::new();
    for (name, p) in &state.config.plugins {
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
        out.push(json!({
            "name": name,
            "world": world,
            "contract": info.map(|a| a.contract),
            "loaded": world.is_some(),
            "component_sha256": info.map(|a| a.sha256.as_str()),
            "limits": {
                "concurrency": p.concurrency,
                "memory": p.memory,
                "timeout_ms": p.timeout.as_millis() as u64,
                "fuel": p.fuel,
                "max_attempts": p.max_attempts,
                "reuse_instance": p.reuse_instance,
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
        }));
    }
    Ok(Json(json!({ "agents": out })))
}
