//! The MCP broker of one plugin: the servers of its `[plugins.x.mcp.NAME]`, reached by the host
//! on its guests' behalf (`mcp-tools`, `mcp-call`; the claim side is `runtime/host/mcp.rs`).
//!
//! What the broker keeps per server, shared by the plugin's instances:
//! - one session, opened on first use and opened again when the server forgets it;
//! - the allowed part of its tool list for [`TOOLS_FRESH`], with the digest a `pin` is checked
//!   against. A definition that changed under a pin is refused until the pin changes (a
//!   server cannot swap a harmless tool for another behind the operator's back).
//!
//! The server's bearer is held here and set on each request by the host; the guest names the
//! server and never sees it, and it is scrubbed from every log line as the plugin's secrets
//! are.

pub mod client;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::config::PluginConfig;
use crate::config::mcp::{ApprovalRule, McpServer, shown_url};
use crate::config::outbound::Scheme;
use crate::config::vars::Resolved;
use crate::runtime::bindings::GuestError;
use crate::runtime::outbound::{HttpHooks, Policy};
use client::{ClientError, Endpoint, Session};

/// How long a server's tool list is used before it is listed again.
pub const TOOLS_FRESH: Duration = Duration::from_secs(30);

/// A tool as the broker sees it, with MCP's defaults for missing annotations.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// Its input schema (an object schema).
    pub input_schema: Value,
    pub read_only: bool,
    pub destructive: bool,
    pub idempotent: bool,
    pub open_world: bool,
}

impl Tool {
    /// The tool of a `tools/list` entry, or `None` when it has no name.
    fn of(entry: &Value) -> Option<Tool> {
        let hint = |key: &str, default: bool| {
            entry
                .get("annotations")
                .and_then(|a| a.get(key))
                .and_then(Value::as_bool)
                .unwrap_or(default)
        };
        let read_only = hint("readOnlyHint", false);
        Some(Tool {
            name: entry.get("name")?.as_str()?.to_owned(),
            description: entry
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_owned),
            input_schema: entry
                .get("inputSchema")
                .cloned()
                .unwrap_or_else(|| serde_json::json!({ "type": "object" })),
            read_only,
            // MCP's defaults: a tool that does not say otherwise may destroy, may repeat
            // badly, and reaches the open world. A read-only tool destroys nothing.
            destructive: !read_only && hint("destructiveHint", true),
            idempotent: read_only || hint("idempotentHint", false),
            open_world: hint("openWorldHint", true),
        })
    }

    /// Whether a call of it waits for a person under `rule`.
    pub fn needs_approval(&self, rule: ApprovalRule) -> bool {
        match rule {
            ApprovalRule::Never => false,
            ApprovalRule::Always => true,
            ApprovalRule::Destructive => self.destructive,
            ApprovalRule::OpenWorld => self.open_world,
        }
    }
}

/// The tools of a server a plugin may call, and their digest.
#[derive(Debug)]
pub struct ToolList {
    /// Sorted by name.
    pub tools: Vec<Tool>,
    /// `sha256:<hex>` of the allowed tools' definitions as the server sent them (canonical
    /// JSON, sorted by name): what `pin` is compared with.
    pub digest: String,
}

impl ToolList {
    /// The allowed tools of `entries` under `config`.
    fn of(entries: &[Value], config: &McpServer) -> ToolList {
        let mut kept: Vec<(String, Value)> = entries
            .iter()
            .filter_map(|e| {
                let name = e.get("name")?.as_str()?;
                config.allows(name).then(|| (name.to_owned(), canonical(e)))
            })
            .collect();
        kept.sort_by(|a, b| a.0.cmp(&b.0));
        let tools = kept.iter().filter_map(|(_, e)| Tool::of(e)).collect();
        let defs: Vec<Value> = kept.into_iter().map(|(_, e)| e).collect();
        let bytes = serde_json::to_vec(&defs).unwrap_or_default();
        let digest = Sha256::digest(&bytes);
        ToolList {
            tools,
            digest: format!(
                "sha256:{}",
                digest
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>()
            ),
        }
    }

    /// The tool named `name`.
    pub fn get(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| t.name == name)
    }
}

/// `value` with every object's keys sorted, and without `_meta` (which servers may vary per
/// listing): the form a digest is taken of.
pub fn canonical(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().filter(|k| *k != "_meta").collect();
            keys.sort();
            let mut out = Map::new();
            for key in keys {
                out.insert(key.clone(), canonical(&map[key]));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// One configured server.
struct Server {
    config: McpServer,
    bearer: Option<Zeroizing<String>>,
    session: tokio::sync::Mutex<Option<Session>>,
    tools: Mutex<Option<(Instant, Arc<ToolList>)>>,
}

/// The broker of one plugin.
#[derive(Default)]
pub struct McpBroker {
    plugin: String,
    servers: BTreeMap<String, Server>,
}

impl std::fmt::Debug for McpBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpBroker")
            .field("plugin", &self.plugin)
            .field("servers", &self.servers.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl McpBroker {
    /// The broker of plugin `name`: each server's URL must be one `policy` lets the plugin
    /// reach (checked again, with its address, on every request).
    ///
    /// # Errors
    ///
    /// A server whose URL's origin is not in `allowed_outbound_hosts`, named.
    pub fn new(
        name: &str,
        config: &PluginConfig,
        values: &Resolved,
        policy: &Policy,
    ) -> Result<McpBroker, String> {
        let mut servers = BTreeMap::new();
        for (server, c) in &config.mcp {
            let uri: http::Uri = c
                .url
                .parse()
                .map_err(|_| format!("[plugins.{name}.mcp.{server}] url: not a URL"))?;
            let scheme = if uri.scheme_str() == Some("https") {
                Scheme::Https
            } else {
                Scheme::Http
            };
            let host = uri
                .host()
                .unwrap_or_default()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_ascii_lowercase();
            let port = uri.port_u16().unwrap_or(scheme.default_port());
            if policy.admit_http(scheme, &host, port).is_none() {
                return Err(format!(
                    "[plugins.{name}.mcp.{server}] url: the origin of `{}` is not in \
                     [plugins.{name}] allowed_outbound_hosts; the host reaches MCP servers under \
                     the plugin's egress policy",
                    shown_url(&c.url)
                ));
            }
            servers.insert(
                server.clone(),
                Server {
                    config: c.clone(),
                    bearer: values
                        .mcp
                        .get(server)
                        .map(|v| Zeroizing::new(v.expose().to_owned())),
                    session: tokio::sync::Mutex::new(None),
                    tools: Mutex::new(None),
                },
            );
        }
        Ok(McpBroker {
            plugin: name.to_owned(),
            servers,
        })
    }

    /// The configuration of server `server`.
    ///
    /// # Errors
    ///
    /// `invalid` naming the servers the plugin has, when it has no such server.
    pub fn config(&self, server: &str) -> Result<&McpServer, GuestError> {
        self.server(server).map(|s| &s.config)
    }

    fn server(&self, server: &str) -> Result<&Server, GuestError> {
        self.servers.get(server).ok_or_else(|| {
            let names: Vec<&str> = self.servers.keys().map(String::as_str).collect();
            GuestError::Invalid(format!(
                "server: `{server}` is not an MCP server of plugin `{}` (it has: {})",
                self.plugin,
                if names.is_empty() {
                    "none; add [plugins.x.mcp.NAME]".to_owned()
                } else {
                    names.join(", ")
                }
            ))
        })
    }

    /// The allowed tools of `server`, listed again when the last listing is older than
    /// [`TOOLS_FRESH`], checked against its `pin`.
    ///
    /// # Errors
    ///
    /// `invalid` for an unknown server; `denied` for a pin mismatch or a refused URL;
    /// `unavailable` when the server cannot be listed.
    pub async fn tools(
        &self,
        hooks: &HttpHooks,
        server: &str,
    ) -> Result<Arc<ToolList>, GuestError> {
        let list = self.list(hooks, server).await?;
        if let Some(pin) = &self.server(server)?.config.pin
            && *pin != list.digest
        {
            return Err(GuestError::Denied(format!(
                "server `{server}`: the allowed tools' definitions changed: their digest is {}, \
                 not the pin {pin}; review them (`homing plugin mcp-tools`) and pin the new digest",
                list.digest
            )));
        }
        Ok(list)
    }

    /// [`McpBroker::tools`] without the pin check (what `homing plugin mcp-tools` shows).
    ///
    /// # Errors
    ///
    /// As [`McpBroker::tools`], less the pin.
    pub async fn list(&self, hooks: &HttpHooks, server: &str) -> Result<Arc<ToolList>, GuestError> {
        let s = self.server(server)?;
        let cached = s
            .tools
            .lock()
            .ok()
            .and_then(|t| t.clone())
            .filter(|(at, _)| at.elapsed() < TOOLS_FRESH)
            .map(|(_, list)| list);
        if let Some(list) = cached {
            return Ok(list);
        }
        let entries = self
            .with_session(hooks, server, s, |endpoint, session| async move {
                endpoint.list_tools(&session).await
            })
            .await
            .map_err(|e| guest_error(server, "tools/list", e))?;
        let list = Arc::new(ToolList::of(&entries, &s.config));
        if let Ok(mut slot) = s.tools.lock() {
            *slot = Some((Instant::now(), list.clone()));
        }
        Ok(list)
    }

    /// Calls `tool` with `arguments`: the `tools/call` result object.
    ///
    /// # Errors
    ///
    /// As [`client::Endpoint::call_tool`] (the session opened again once if it expired).
    pub async fn call(
        &self,
        hooks: &HttpHooks,
        server: &str,
        tool: &str,
        arguments: &Map<String, Value>,
    ) -> Result<Value, ClientError> {
        let s = self
            .servers
            .get(server)
            .ok_or_else(|| ClientError::Refused(format!("no server `{server}`")))?;
        self.with_session(hooks, server, s, |endpoint, session| async move {
            endpoint.call_tool(&session, tool, arguments).await
        })
        .await
    }

    /// Runs `op` in the server's session (opened when there is none), once more in a new
    /// session when the server forgot the first.
    async fn with_session<'a, T, F, Fut>(
        &self,
        hooks: &'a HttpHooks,
        _name: &str,
        s: &'a Server,
        op: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(Endpoint<'a>, Session) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        let endpoint = || Endpoint {
            hooks,
            url: &s.config.url,
            bearer: s.bearer.as_ref().map(|b| b.as_str()),
            timeout: s.config.timeout,
            cap: s.config.max_result,
        };
        for _ in 0..2 {
            let session = {
                let mut slot = s.session.lock().await;
                match slot.as_ref() {
                    Some(session) => session.clone(),
                    None => {
                        let session = endpoint().initialize().await?;
                        *slot = Some(session.clone());
                        session
                    }
                }
            };
            match op(endpoint(), session).await {
                Err(ClientError::Answered { expired: true, .. }) => {
                    *s.session.lock().await = None;
                }
                out => return out,
            }
        }
        Err(ClientError::Answered {
            text: "the server forgot two sessions in a row".into(),
            expired: false,
        })
    }
}

/// A client error as the guest gets it, naming the server and the method.
pub fn guest_error(server: &str, method: &str, e: ClientError) -> GuestError {
    match e {
        ClientError::Refused(why) => GuestError::Denied(format!("server `{server}`: {why}")),
        ClientError::NotSent(why) => {
            GuestError::Unavailable(format!("server `{server}` ({method}): {why}"))
        }
        ClientError::Unknown(why) => GuestError::Unavailable(format!(
            "server `{server}` ({method}): {why}; the request may have reached it"
        )),
        ClientError::TooLarge(cap) => GuestError::Denied(format!(
            "server `{server}` ({method}): the answer passed max_result of {cap} bytes"
        )),
        ClientError::Answered { text, .. } => {
            GuestError::Unavailable(format!("server `{server}` ({method}): {text}"))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;

    fn server(tools: &[&str]) -> McpServer {
        let list: Vec<String> = tools.iter().map(|t| format!("\"{t}\"")).collect();
        toml::from_str(&format!(
            "url = \"http://127.0.0.1:1/mcp\"\ntools = [{}]",
            list.join(",")
        ))
        .unwrap()
    }

    #[test]
    fn unannotated_tools_take_mcps_defaults() {
        let t = Tool::of(&json!({ "name": "x" })).unwrap();
        assert!(t.destructive && t.open_world && !t.idempotent && !t.read_only);
        let r = Tool::of(&json!({ "name": "r", "annotations": { "readOnlyHint": true } })).unwrap();
        assert!(!r.destructive && r.idempotent && r.read_only);
        assert!(t.needs_approval(ApprovalRule::Destructive));
        assert!(!r.needs_approval(ApprovalRule::Destructive));
        assert!(r.needs_approval(ApprovalRule::OpenWorld));
        assert!(!t.needs_approval(ApprovalRule::Never));
    }

    #[test]
    fn the_digest_covers_the_allowed_tools_only_in_any_order_of_keys_and_tools() {
        let a = json!({ "name": "a", "description": "one", "inputSchema": { "type": "object" } });
        let b = json!({ "name": "b", "inputSchema": { "type": "object" }, "description": "two" });
        let hidden = json!({ "name": "zz", "description": "not allowed" });
        let config = server(&["a", "b"]);
        let one = ToolList::of(&[a.clone(), b.clone(), hidden], &config);
        let b_reordered = json!({ "description": "two", "inputSchema": { "type": "object" }, "name": "b", "_meta": { "x": 1 } });
        let two = ToolList::of(&[b_reordered, a.clone()], &config);
        assert_eq!(one.digest, two.digest);
        assert_eq!(one.tools.len(), 2);
        let changed = json!({ "name": "a", "description": "one (changed)", "inputSchema": { "type": "object" } });
        let three = ToolList::of(&[changed, b], &config);
        assert_ne!(one.digest, three.digest);
        assert!(one.digest.starts_with("sha256:") && one.digest.len() == 71);
        assert!(ToolList::of(&[a], &server(&[])).tools.is_empty());
    }
}
