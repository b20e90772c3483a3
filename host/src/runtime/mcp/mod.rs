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
                config
                    .allows(name)
                    .then(|| (name.to_owned(), definition(e)))
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

/// `value` with every object's keys sorted: the form a digest is taken of (arguments keep
/// everything they send, `_meta` included).
pub fn canonical(value: &Value) -> Value {
    sorted(value, false)
}

/// A tool's definition as its digest covers it: sorted, without `_meta` (which servers may
/// vary per listing).
fn definition(value: &Value) -> Value {
    sorted(value, true)
}

fn sorted(value: &Value, without_meta: bool) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map
                .keys()
                .filter(|k| !(without_meta && *k == "_meta"))
                .collect();
            keys.sort();
            let mut out = Map::new();
            for key in keys {
                out.insert(key.clone(), sorted(&map[key], without_meta));
            }
            Value::Object(out)
        }
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| sorted(v, without_meta)).collect())
        }
        other => other.clone(),
    }
}

/// One configured server.
struct Server {
    config: McpServer,
    /// Its bearer, or its OAuth client's secret.
    credential: Option<Zeroizing<String>>,
    session: tokio::sync::Mutex<Option<Session>>,
    tools: Mutex<Option<(Instant, Arc<ToolList>)>>,
    /// Under OAuth: the access token and when to ask for a new one.
    token: tokio::sync::Mutex<Option<(Zeroizing<String>, Instant)>>,
    /// The last access tokens issued (newest last): scrubbed from what the server answers,
    /// read without waiting for a token being asked for.
    issued: Mutex<Vec<Zeroizing<String>>>,
}

/// How many of a server's latest access tokens are scrubbed.
const ISSUED_KEPT: usize = 4;

impl Server {
    /// What the host sends as the bearer: the configured one, or an OAuth access token (asked
    /// for when there is none or it is about to expire).
    async fn bearer(
        &self,
        hooks: &HttpHooks,
        fresh: bool,
    ) -> Result<Option<Zeroizing<String>>, ClientError> {
        let Some(credential) = &self.credential else {
            return Ok(None);
        };
        let Some(oauth) = self.config.auth.as_ref().and_then(|a| a.oauth.as_ref()) else {
            return Ok(Some(credential.clone()));
        };
        let mut slot = self.token.lock().await;
        if !fresh
            && let Some((token, until)) = slot.as_ref()
            && Instant::now() < *until
        {
            return Ok(Some(token.clone()));
        }
        let (token, until) =
            client::fetch_token(hooks, oauth, credential, self.config.timeout).await?;
        *slot = Some((token.clone(), until));
        if let Ok(mut issued) = self.issued.lock() {
            if issued.len() >= ISSUED_KEPT {
                issued.remove(0);
            }
            issued.push(token.clone());
        }
        Ok(Some(token))
    }
}

/// Whether `policy` lets the plugin reach `url`'s origin.
fn admitted(policy: &Policy, url: &str) -> bool {
    let Ok(uri) = url.parse::<http::Uri>() else {
        return false;
    };
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
    policy.admit_http(scheme, &host, port).is_some()
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
    /// The broker of plugin `name`. Each server's origins are the host's grants, not the
    /// guest's ([`crate::runtime::outbound::Outbound`]); `policy`, the guest's, is read only to
    /// warn when it reaches a server too (around the broker: no allow-list, no approval).
    pub fn new(name: &str, config: &PluginConfig, values: &Resolved, policy: &Policy) -> McpBroker {
        let mut servers = BTreeMap::new();
        for (server, c) in &config.mcp {
            let urls = std::iter::once(("url", c.url.as_str())).chain(
                c.auth
                    .as_ref()
                    .and_then(|a| a.oauth.as_ref())
                    .map(|o| ("auth.oauth.token_url", o.token_url.as_str())),
            );
            for (key, url) in urls {
                if admitted(policy, url) {
                    tracing::warn!(
                        plugin = %name,
                        "[plugins.{name}.mcp.{server}] {key}: `{}` is in the plugin's \
                         allowed_outbound_hosts too, so its guest can reach the server around \
                         the broker (no tool allow-list, no approval); the broker needs no grant",
                        shown_url(url)
                    );
                }
            }
            servers.insert(
                server.clone(),
                Server {
                    config: c.clone(),
                    credential: values
                        .mcp
                        .get(server)
                        .map(|v| Zeroizing::new(v.expose().to_owned())),
                    session: tokio::sync::Mutex::new(None),
                    tools: Mutex::new(None),
                    token: tokio::sync::Mutex::new(None),
                    issued: Mutex::new(Vec::new()),
                },
            );
        }
        McpBroker {
            plugin: name.to_owned(),
            servers,
        }
    }

    /// The OAuth access tokens the host was issued lately, for every server: the plugin's
    /// secrets as much as its configured ones (a server may echo one back).
    pub fn tokens(&self) -> Vec<Zeroizing<String>> {
        self.servers
            .values()
            .filter_map(|s| s.issued.lock().ok().map(|i| i.clone()))
            .flatten()
            .collect()
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
            .with_session(hooks, s, |endpoint, session| async move {
                endpoint
                    .list_tools(&session, |name| s.config.allows(name))
                    .await
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
        self.with_session(hooks, s, |endpoint, session| async move {
            endpoint.call_tool(&session, tool, arguments).await
        })
        .await
    }

    /// Runs `op` in the server's session (opened when there is none), once more in a new
    /// session when the server forgot the first, or with a new access token when the server
    /// refused an OAuth one.
    async fn with_session<'a, T, F, Fut>(
        &self,
        hooks: &'a HttpHooks,
        s: &'a Server,
        op: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(Endpoint<'a>, Session) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        let oauth = s.config.auth.as_ref().is_some_and(|a| a.oauth.is_some());
        let mut fresh_token = false;
        for _ in 0..3 {
            let bearer = s.bearer(hooks, fresh_token).await?;
            let endpoint = || Endpoint {
                hooks,
                url: &s.config.url,
                bearer: bearer.clone(),
                timeout: s.config.timeout,
                cap: s.config.max_result,
            };
            let session = {
                let mut slot = s.session.lock().await;
                match slot.as_ref() {
                    Some(session) => Ok(session.clone()),
                    None => match endpoint().initialize().await {
                        Ok(session) => {
                            *slot = Some(session.clone());
                            Ok(session)
                        }
                        Err(e) => Err(e),
                    },
                }
            };
            let out = match session {
                Ok(session) => op(endpoint(), session).await,
                Err(e) => Err(e),
            };
            match out {
                Err(ClientError::Answered { expired: true, .. }) => {
                    *s.session.lock().await = None;
                }
                Err(ClientError::Unauthorized(_)) if oauth && !fresh_token => {
                    fresh_token = true;
                }
                out => return out,
            }
        }
        Err(ClientError::Answered {
            text: "the server kept refusing the session or the token".into(),
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
        ClientError::Unauthorized(why) => GuestError::Denied(format!("server `{server}`: {why}")),
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
