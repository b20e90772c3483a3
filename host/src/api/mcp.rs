//! Agents as MCP tools: `POST /mcp`, the Model Context Protocol over Streamable HTTP, answered
//! with one JSON body per request (no server-sent events, no sessions).
//!
//! Both protocol eras are served: a client that opens with `initialize` (revisions 2024-11-05 to
//! 2025-11-25) is answered with its revision, and a 2026-07-28 client, whose every request
//! carries its revision in `_meta`, gets `server/discover` and results with `resultType`; its
//! `Mcp-Method` and `Mcp-Name` headers must match the body (`-32020`), and a revision this
//! server does not speak is refused with `-32022` naming the ones it does.
//!
//! Tools, by `[api.mcp] tools`: one per agent marked `[plugins.x.mcp_server] expose = true`
//! (`per-agent`, the default), or `list_agents` and `invoke_agent` for all of them
//! (`dispatcher`); and in both, `homing_result`, `homing_respond` and `homing_cancel`, which
//! take the dispatch a call answered with. A call enqueues a dispatch whose payload is the
//! arguments as JSON (on the thread `_meta["io.homing/thread"]` names, else a new one;
//! `_meta["io.homing/idempotency-key"]` makes a retried call find the dispatch the first one
//! made instead of enqueuing again), then waits up to `[api.mcp] call_wait`:
//!
//! - the run ended: its output as text (and as `structuredContent` when it is a JSON object),
//!   `isError` when it did not succeed;
//! - the run waits on a waitpoint: a 2026-07-28 client gets `input_required` with a form per
//!   pending waitpoint (its metadata's `message` and `schema`), and its retry, carrying the
//!   answers and the dispatch as `requestState`, completes them (a declined form cancels the
//!   waitpoint) and waits again; an older client is told to answer with `homing_respond`;
//! - still running: a 2026-07-28 client gets `input_required` with only `requestState`, which
//!   it retries by itself; an older client is told to ask `homing_result`.
//!
//! `homing_respond` and `homing_cancel` act only on dispatches the same token made through
//! `/mcp` (an operator's token on any). A request carrying an `Origin` that `[api.mcp]
//! allowed_origins` does not list is refused (403) before anything is read: a web page must not
//! drive a host on the loopback address (DNS rebinding).

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tracing::info;

use super::auth::Caller;
use super::dispatches::read_body;
use super::{ApiError, ApiState, Route};
use crate::config::Config;
use crate::config::api::{McpTools, Role};
use crate::store::waitpoints::{MAX_WAITPOINTS, WaitpointFilter};
use crate::store::{Dispatch, NewDispatch, Status, WaitpointState};
use crate::work::{Attempts, Request};

/// The revisions of the `initialize` era this server answers, oldest first.
const HANDSHAKE: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
/// The revision of the per-request era.
const MODERN: &str = "2026-07-28";

const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
const META_THREAD: &str = "io.homing/thread";
const META_IDEMPOTENCY: &str = "io.homing/idempotency-key";

/// The most of a dispatch's pending waitpoints (metadata and names) one request reads: a run's
/// forms are small, and a reader's memory must not follow what a run stored.
const MAX_PENDING_BYTES: usize = 256 << 10;

/// The dispatch metadata naming the token that made a call.
const CALLER_KEY: &str = "mcp.caller";

/// JSON-RPC and MCP error codes.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const INTERNAL_ERROR: i64 = -32603;
const HEADER_MISMATCH: i64 = -32020;
const UNSUPPORTED_VERSION: i64 = -32022;

/// The endpoint's route.
pub(super) fn routes() -> Vec<Route> {
    vec![Route {
        method: Method::POST,
        path: "/mcp",
        role: Role::Producer,
        own_auth: false,
        handler: post(mcp),
    }]
}

/// A JSON-RPC error, with the HTTP status it goes with.
#[derive(Debug)]
struct RpcError {
    status: StatusCode,
    code: i64,
    message: String,
    data: Option<Value>,
}

impl RpcError {
    fn new(status: StatusCode, code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            status,
            code,
            message: message.into(),
            data: None,
        }
    }

    fn params(message: impl Into<String>) -> RpcError {
        RpcError::new(StatusCode::OK, INVALID_PARAMS, message)
    }
}

impl From<ApiError> for RpcError {
    fn from(e: ApiError) -> RpcError {
        let code = if e.status().is_client_error() {
            INVALID_PARAMS
        } else {
            INTERNAL_ERROR
        };
        RpcError::new(StatusCode::OK, code, e.message())
    }
}

impl From<crate::store::StoreError> for RpcError {
    fn from(e: crate::store::StoreError) -> RpcError {
        ApiError::from(e).into()
    }
}

fn error_response(id: &Value, e: RpcError) -> Response {
    let mut error = json!({ "code": e.code, "message": e.message });
    if let Some(data) = e.data {
        error["data"] = data;
    }
    (
        e.status,
        Json(json!({ "jsonrpc": "2.0", "id": id, "error": error })),
    )
        .into_response()
}

/// Which era a request speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Era {
    /// `initialize` and the revisions before 2026-07-28.
    Handshake,
    /// 2026-07-28: the revision in every request.
    Modern,
}

/// Who called, and how.
struct Call<'a> {
    state: &'a Arc<ApiState>,
    config: Arc<Config>,
    token: String,
    role: Role,
    era: Era,
}

/// `POST /mcp`.
async fn mcp(
    State(state): State<Arc<ApiState>>,
    caller: Option<axum::Extension<Caller>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let config = state.config();
    if let Some(origin) = headers.get("origin") {
        let allowed = origin.to_str().is_ok_and(|o| {
            config
                .api
                .mcp
                .allowed_origins
                .iter()
                .any(|a| a.eq_ignore_ascii_case(o))
        });
        if !allowed {
            return ApiError::forbidden(
                "Origin: not in [api.mcp] allowed_origins; browsers may not call /mcp from this page",
            )
            .into_response();
        }
    }
    let bytes = match read_body(&headers, body, state.body_limit).await {
        Ok(bytes) => bytes,
        Err(e) => return e.into_response(),
    };
    let message: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            return error_response(
                &Value::Null,
                RpcError::new(
                    StatusCode::BAD_REQUEST,
                    PARSE_ERROR,
                    format!("the body is not JSON: {e}"),
                ),
            );
        }
    };
    let Value::Object(message) = message else {
        return error_response(
            &Value::Null,
            RpcError::new(
                StatusCode::BAD_REQUEST,
                INVALID_REQUEST,
                "a JSON-RPC message must be an object (batches are not served)",
            ),
        );
    };
    let id = message.get("id").cloned();
    let reply_id = id.clone().unwrap_or(Value::Null);
    if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return error_response(
            &reply_id,
            RpcError::new(
                StatusCode::BAD_REQUEST,
                INVALID_REQUEST,
                "jsonrpc: must be \"2.0\"",
            ),
        );
    }
    let Some(method) = message.get("method").and_then(Value::as_str) else {
        return error_response(
            &reply_id,
            RpcError::new(
                StatusCode::BAD_REQUEST,
                INVALID_REQUEST,
                "method: required, a string (this endpoint takes requests and notifications)",
            ),
        );
    };
    let params = match message.get("params") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(p)) => p.clone(),
        Some(_) => {
            return error_response(
                &reply_id,
                RpcError::new(
                    StatusCode::BAD_REQUEST,
                    INVALID_PARAMS,
                    "params: must be an object",
                ),
            );
        }
    };
    let era = match era(&headers, method, &params) {
        Ok(era) => era,
        Err(e) => return error_response(&reply_id, e),
    };
    let Some(id) = id else {
        // A notification (`notifications/initialized`, `notifications/cancelled`): nothing to
        // answer.
        return StatusCode::ACCEPTED.into_response();
    };
    let (token, role) = caller.map_or_else(
        || ("-".to_owned(), Role::Reader),
        |axum::Extension(c)| (c.name, c.role),
    );
    let call = Call {
        state: &state,
        config,
        token,
        role,
        era,
    };
    match call.answer(method, &params).await {
        Ok(mut result) => {
            if era == Era::Modern
                && let Some(map) = result.as_object_mut()
            {
                map.entry("resultType").or_insert_with(|| json!("complete"));
            }
            Json(json!({ "jsonrpc": "2.0", "id": id, "result": result })).into_response()
        }
        Err(e) => {
            let e = if era == Era::Modern && e.status == StatusCode::OK {
                RpcError {
                    status: match e.code {
                        METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
                        INTERNAL_ERROR => StatusCode::OK,
                        _ => StatusCode::BAD_REQUEST,
                    },
                    ..e
                }
            } else {
                e
            };
            error_response(&id, e)
        }
    }
}

/// The request's era, its headers checked against its body.
fn era(headers: &HeaderMap, method: &str, params: &Map<String, Value>) -> Result<Era, RpcError> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let asked = params
        .get("_meta")
        .and_then(|m| m.get(META_VERSION))
        .and_then(Value::as_str);
    let Some(asked) = asked else {
        // The handshake era: `initialize` names its revision in the body; later requests in the
        // header.
        if let Some(v) = header("mcp-protocol-version")
            && method != "initialize"
            && !HANDSHAKE.contains(&v)
        {
            let mut e = RpcError::new(
                StatusCode::BAD_REQUEST,
                UNSUPPORTED_VERSION,
                format!(
                    "MCP-Protocol-Version: `{}` is not served; this server speaks {} and {MODERN}",
                    v.escape_debug(),
                    HANDSHAKE.join(", ")
                ),
            );
            e.data = Some(json!({ "supported": supported(), "requested": v }));
            return Err(e);
        }
        return Ok(Era::Handshake);
    };
    if asked != MODERN {
        let mut e = RpcError::new(
            StatusCode::BAD_REQUEST,
            UNSUPPORTED_VERSION,
            format!(
                "protocol version `{}` is not served per request; this server speaks {MODERN} \
                 (and {} through initialize)",
                asked.escape_debug(),
                HANDSHAKE.join(", ")
            ),
        );
        e.data = Some(json!({ "supported": supported(), "requested": asked }));
        return Err(e);
    }
    let mismatch = |what: &str| {
        Err(RpcError::new(
            StatusCode::BAD_REQUEST,
            HEADER_MISMATCH,
            format!("{what} does not match the request body"),
        ))
    };
    if header("mcp-protocol-version").is_some_and(|v| v != MODERN) {
        return mismatch("MCP-Protocol-Version");
    }
    match header("mcp-method") {
        Some(m) if m == method => {}
        Some(_) => return mismatch("Mcp-Method"),
        None => {
            return Err(RpcError::new(
                StatusCode::BAD_REQUEST,
                HEADER_MISMATCH,
                "Mcp-Method: required with protocol version 2026-07-28",
            ));
        }
    }
    if method == "tools/call" {
        let name = params.get("name").and_then(Value::as_str);
        if header("mcp-name") != name {
            return mismatch("Mcp-Name");
        }
    }
    Ok(Era::Modern)
}

fn supported() -> Vec<&'static str> {
    HANDSHAKE.iter().copied().chain([MODERN]).collect()
}

/// The companion tools, served in both modes.
const RESULT_TOOL: &str = "homing_result";
const RESPOND_TOOL: &str = "homing_respond";
const CANCEL_TOOL: &str = "homing_cancel";
const LIST_TOOL: &str = "list_agents";
const INVOKE_TOOL: &str = "invoke_agent";

impl Call<'_> {
    async fn answer(&self, method: &str, params: &Map<String, Value>) -> Result<Value, RpcError> {
        match (method, self.era) {
            ("initialize", Era::Handshake) => {
                let asked = params
                    .get("protocolVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let version = if HANDSHAKE.contains(&asked) {
                    asked
                } else {
                    HANDSHAKE[HANDSHAKE.len() - 1]
                };
                Ok(json!({
                    "protocolVersion": version,
                    "capabilities": { "tools": { "listChanged": false } },
                    "serverInfo": server_info(),
                    "instructions": INSTRUCTIONS,
                }))
            }
            ("server/discover", Era::Modern) => Ok(json!({
                "supportedVersions": [MODERN],
                "capabilities": { "tools": { "listChanged": false } },
                "ttlMs": 0,
                "cacheScope": "private",
                "instructions": INSTRUCTIONS,
                "_meta": { "io.modelcontextprotocol/serverInfo": server_info() },
            })),
            ("ping", _) => Ok(json!({})),
            ("tools/list", era) => {
                let mut result = json!({ "tools": self.tools() });
                if era == Era::Modern {
                    result["ttlMs"] = json!(0);
                    result["cacheScope"] = json!("private");
                }
                Ok(result)
            }
            ("tools/call", _) => self.call(params).await,
            (other, _) => Err(RpcError::new(
                StatusCode::OK,
                METHOD_NOT_FOUND,
                format!("method `{}` is not served here", other.escape_debug()),
            )),
        }
    }

    /// The agents served as tools.
    fn exposed(&self) -> Vec<(&String, &crate::config::PluginConfig)> {
        self.config
            .plugins
            .iter()
            .filter(|(_, p)| p.mcp_server.expose)
            .collect()
    }

    fn tools(&self) -> Vec<Value> {
        let mut tools = Vec::new();
        match self.config.api.mcp.tools {
            McpTools::PerAgent => {
                for (name, plugin) in self.exposed() {
                    tools.push(json!({
                        "name": name,
                        "description": description(name, plugin),
                        "inputSchema": input_schema(plugin),
                    }));
                }
            }
            McpTools::Dispatcher => {
                let names: Vec<&String> = self.exposed().into_iter().map(|(n, _)| n).collect();
                tools.push(json!({
                    "name": LIST_TOOL,
                    "description": "Lists the agents invoke_agent can run, with what each does and the arguments it takes.",
                    "inputSchema": { "type": "object", "properties": {} },
                    "annotations": { "readOnlyHint": true },
                }));
                tools.push(json!({
                    "name": INVOKE_TOOL,
                    "description": "Runs an agent with arguments (see list_agents) and answers with its output.",
                    "inputSchema": {
                        "type": "object",
                        "properties": {
                            "agent": { "type": "string", "enum": names },
                            "arguments": { "type": "object" },
                        },
                        "required": ["agent"],
                    },
                }));
            }
        }
        let id = json!({ "type": "string", "description": "the dispatch a call answered with" });
        tools.push(json!({
            "name": RESULT_TOOL,
            "description": "The outcome of an agent call that was still running: its output once it finished.",
            "inputSchema": { "type": "object", "properties": { "id": id }, "required": ["id"] },
            "annotations": { "readOnlyHint": true },
        }));
        tools.push(json!({
            "name": RESPOND_TOOL,
            "description": "Answers what a running agent call asks (the form it is waiting on), then waits for its outcome.",
            "inputSchema": {
                "type": "object",
                "properties": { "id": id, "answer": { "type": "object" } },
                "required": ["id", "answer"],
            },
        }));
        tools.push(json!({
            "name": CANCEL_TOOL,
            "description": "Cancels an agent call that has not finished (queued or waiting).",
            "inputSchema": { "type": "object", "properties": { "id": id }, "required": ["id"] },
            "annotations": { "destructiveHint": true },
        }));
        tools
    }

    async fn call(&self, params: &Map<String, Value>) -> Result<Value, RpcError> {
        let Some(name) = params.get("name").and_then(Value::as_str) else {
            return Err(RpcError::params("name: required, the tool's name"));
        };
        let arguments = match params.get("arguments") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(a)) => a.clone(),
            Some(_) => return Err(RpcError::params("arguments: must be an object")),
        };
        let meta = params.get("_meta").and_then(Value::as_object);
        match name {
            RESULT_TOOL => {
                let d = self.dispatch_arg(&arguments, false).await?;
                self.outcome(d, Duration::ZERO).await
            }
            RESPOND_TOOL => {
                let d = self.dispatch_arg(&arguments, true).await?;
                let Some(answer) = arguments.get("answer") else {
                    return Err(RpcError::params("answer: required, an object"));
                };
                let pending = self.pending(&d.id).await?;
                let Some(w) = pending.first() else {
                    return Ok(tool_error(format!(
                        "dispatch `{}` is waiting on nothing (it is {})",
                        d.id,
                        d.status.as_str()
                    )));
                };
                self.settle(&w.id, Some(answer)).await?;
                self.outcome(d, self.wait()).await
            }
            CANCEL_TOOL => {
                let d = self.dispatch_arg(&arguments, true).await?;
                match crate::work::cancel(&self.state.store, &d.id).await {
                    Ok(d) => Ok(text_result(
                        format!("dispatch `{}` cancelled", d.id),
                        Some(json!({ "dispatch": d.id, "status": d.status.as_str() })),
                        false,
                    )),
                    Err(e) => Ok(tool_error(e.to_string())),
                }
            }
            LIST_TOOL if self.config.api.mcp.tools == McpTools::Dispatcher => {
                let agents: Vec<Value> = self
                    .exposed()
                    .into_iter()
                    .map(|(name, plugin)| {
                        json!({
                            "name": name,
                            "description": description(name, plugin),
                            "inputSchema": input_schema(plugin),
                        })
                    })
                    .collect();
                Ok(text_result(
                    json!(agents).to_string(),
                    Some(json!({ "agents": agents })),
                    false,
                ))
            }
            INVOKE_TOOL if self.config.api.mcp.tools == McpTools::Dispatcher => {
                let agent = arguments
                    .get("agent")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                let inner = match arguments.get("arguments") {
                    None | Some(Value::Null) => Map::new(),
                    Some(Value::Object(a)) => a.clone(),
                    Some(_) => {
                        return Ok(tool_error("arguments: must be an object".to_owned()));
                    }
                };
                if !self.exposed().iter().any(|(n, _)| **n == agent) {
                    return Ok(tool_error(format!(
                        "agent: `{}` is not one of the agents served here (see list_agents)",
                        agent.escape_debug()
                    )));
                }
                self.run(&agent, inner, meta, params).await
            }
            agent
                if self.config.api.mcp.tools == McpTools::PerAgent
                    && self.exposed().iter().any(|(n, _)| n.as_str() == agent) =>
            {
                self.run(agent, arguments, meta, params).await
            }
            other => Err(RpcError::params(format!(
                "unknown tool `{}`",
                other.escape_debug()
            ))),
        }
    }

    /// The dispatch an `id` argument names; with `own`, only one this token made through
    /// `/mcp` (any, for an operator).
    async fn dispatch_arg(
        &self,
        arguments: &Map<String, Value>,
        own: bool,
    ) -> Result<Dispatch, RpcError> {
        let Some(id) = arguments.get("id").and_then(Value::as_str) else {
            return Err(RpcError::params(
                "id: required, the dispatch a call answered with",
            ));
        };
        self.owned(id, own).await
    }

    async fn owned(&self, id: &str, own: bool) -> Result<Dispatch, RpcError> {
        let missing = || {
            RpcError::params(format!(
                "no dispatch `{}` made through /mcp",
                id.escape_debug()
            ))
        };
        if crate::store::model::check_name("id", id).is_err() {
            return Err(missing());
        }
        let Some(d) = self.state.store.mailbox.load(id).await? else {
            return Err(missing());
        };
        let mine = d.metadata.get(CALLER_KEY).is_some_and(|c| *c == self.token);
        if !d.metadata.contains_key(CALLER_KEY) || (own && !mine && self.role < Role::Operator) {
            return Err(missing());
        }
        Ok(d)
    }

    /// How long a call waits for its run.
    fn wait(&self) -> Duration {
        self.config.api.mcp.call_wait.min(self.config.api.max_wait)
    }

    /// Enqueues the call of `agent` (or, on a retry carrying `requestState`, takes up the
    /// dispatch it names, settling the forms it answers), then waits for its outcome.
    async fn run(
        &self,
        agent: &str,
        arguments: Map<String, Value>,
        meta: Option<&Map<String, Value>>,
        params: &Map<String, Value>,
    ) -> Result<Value, RpcError> {
        if let Some(state) = params.get("requestState").and_then(Value::as_str) {
            let d = self.owned(state, true).await?;
            if let Some(Value::Object(responses)) = params.get("inputResponses") {
                let pending = self.pending(&d.id).await?;
                for (key, response) in responses {
                    if !pending.iter().any(|w| w.id == *key) {
                        continue;
                    }
                    let accepted = response.get("action").and_then(Value::as_str) == Some("accept");
                    let content = response
                        .get("content")
                        .cloned()
                        .unwrap_or_else(|| json!({}));
                    self.settle(key, accepted.then_some(&content)).await?;
                }
            }
            return self.outcome(d, self.wait()).await;
        }
        if let Err(why) = check_arguments(&self.config, agent, &arguments) {
            return Ok(tool_error(why));
        }
        let meta_string = |key: &str| meta.and_then(|m| m.get(key)).and_then(Value::as_str);
        let thread = match meta_string(META_THREAD) {
            Some(t) => {
                crate::store::model::check_name(META_THREAD, t).map_err(RpcError::params)?;
                t.to_owned()
            }
            None => format!("mcp.{agent}.{}", uuid::Uuid::now_v7()),
        };
        let payload = Value::Object(arguments).to_string().into_bytes();
        if payload.len() as u64 > self.state.max_payload {
            return Ok(tool_error(format!(
                "arguments: {} bytes exceeds max_payload ({} bytes)",
                payload.len(),
                self.state.max_payload
            )));
        }
        let mut request = Request::new(agent, thread, payload);
        request
            .metadata
            .insert(CALLER_KEY.into(), self.token.clone());
        if let Some(key) = meta_string(META_IDEMPOTENCY) {
            // The id is derived from who asked, what for and the key: a retried call stores
            // nothing new and finds the first call's dispatch.
            let digest = Sha256::digest(format!("{}\n{agent}\n{key}", self.token).as_bytes());
            let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
            request.id = Some(format!("mcp-{hex}"));
        }
        request.debounce = crate::work::configured_debounce(&self.config, agent);
        let attempts = Attempts::configured(&self.config, agent);
        let new: NewDispatch = request
            .into_dispatch(attempts, self.config.key_source(agent))
            .map_err(RpcError::params)?;
        let id = new.id.clone();
        let d = match self.state.store.mailbox.enqueue(new).await {
            Ok(d) => d,
            Err(crate::store::StoreError::Duplicate { .. }) if id.is_some() => {
                // The key was used for a call with other arguments: nothing is enqueued.
                return Ok(tool_error(format!(
                    "{META_IDEMPOTENCY}: this key was used for a call with other arguments"
                )));
            }
            Err(e) => return Err(e.into()),
        };
        info!(dispatch = %d.id, agent = %d.agent, token = %self.token, "enqueued through /mcp");
        self.outcome(d, self.wait()).await
    }

    /// The pending waitpoints of dispatch `id`, without results, read within
    /// [`MAX_PENDING_BYTES`] (the first whatever its size).
    async fn pending(&self, id: &str) -> Result<Vec<crate::store::Waitpoint>, RpcError> {
        let filter = WaitpointFilter {
            dispatch: Some(id.to_owned()),
            state: Some(WaitpointState::Pending),
            limit: MAX_WAITPOINTS as usize,
            ..WaitpointFilter::default()
        };
        Ok(self
            .state
            .store
            .waitpoints
            .read_waitpoints(&filter, MAX_PENDING_BYTES, false)
            .await?
            .waitpoints)
    }

    /// Completes waitpoint `id` with `answer`, or cancels it without one.
    async fn settle(&self, id: &str, answer: Option<&Value>) -> Result<(), RpcError> {
        let by = format!("mcp:{}", self.token);
        let settled = match answer {
            Some(answer) => {
                crate::work::waitpoints::complete(
                    &self.state.store,
                    &self.config,
                    id,
                    answer.to_string().into_bytes(),
                    &by,
                )
                .await
            }
            None => crate::work::waitpoints::cancel(&self.state.store, id, &by).await,
        };
        match settled {
            Ok(_) | Err(crate::work::waitpoints::WaitpointError::Settled(_)) => Ok(()),
            Err(e) => Err(RpcError::params(e.to_string())),
        }
    }

    /// What the call says of dispatch `d` once it ended, waits on a person, or `within` passed.
    async fn outcome(&self, d: Dispatch, within: Duration) -> Result<Value, RpcError> {
        let deadline = tokio::time::Instant::now() + within;
        let signal = self.state.store.mailbox.work_signal();
        let mut d = d;
        let mut poll = Duration::from_millis(5);
        loop {
            if d.status.is_terminal() {
                return Ok(finished(&d));
            }
            if d.status == Status::Waiting {
                let pending = self.pending(&d.id).await?;
                if !pending.is_empty() {
                    return Ok(self.asks(&d, &pending));
                }
            }
            let now = tokio::time::Instant::now();
            if now >= deadline || *self.state.shutdown.borrow() {
                return Ok(self.running(&d));
            }
            let notified = signal.notified();
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep(poll.min(deadline - now)) => {}
            }
            poll = (poll * 2).min(Duration::from_millis(250));
            d = match self.state.store.mailbox.load(&d.id).await? {
                Some(d) => d,
                None => return Ok(tool_error(format!("dispatch `{}` is gone", d.id))),
            };
        }
    }

    /// A call whose run waits on `pending`.
    fn asks(&self, d: &Dispatch, pending: &[crate::store::Waitpoint]) -> Value {
        if self.era == Era::Modern {
            let requests: Map<String, Value> = pending
                .iter()
                .map(|w| {
                    let message = w.metadata.get("message").cloned().unwrap_or_else(|| {
                        format!("Agent `{}` waits for an answer at `{}`.", w.agent, w.name)
                    });
                    let schema = w
                        .metadata
                        .get("schema")
                        .and_then(|s| serde_json::from_str::<Value>(s).ok())
                        .filter(|s| s.get("type").and_then(Value::as_str) == Some("object"))
                        .unwrap_or_else(|| json!({ "type": "object", "properties": {} }));
                    (
                        w.id.clone(),
                        json!({
                            "method": "elicitation/create",
                            "params": { "mode": "form", "message": message, "requestedSchema": schema },
                        }),
                    )
                })
                .collect();
            return json!({
                "resultType": "input_required",
                "inputRequests": requests,
                "requestState": d.id,
            });
        }
        let w = &pending[0];
        let message = w.metadata.get("message").cloned().unwrap_or_default();
        text_result(
            format!(
                "dispatch `{}` waits for an answer ({message}); call {RESPOND_TOOL} with {{\"id\": \"{}\", \"answer\": {{...}}}}",
                d.id, d.id
            ),
            Some(json!({
                "dispatch": d.id,
                "status": "input_required",
                "waitpoint": w.id,
                "message": message,
                "schema": w.metadata.get("schema").and_then(|s| serde_json::from_str::<Value>(s).ok()),
            })),
            false,
        )
    }

    /// A call whose run has not finished.
    fn running(&self, d: &Dispatch) -> Value {
        if self.era == Era::Modern {
            return json!({ "resultType": "input_required", "requestState": d.id });
        }
        text_result(
            format!(
                "dispatch `{}` is still {}; call {RESULT_TOOL} with {{\"id\": \"{}\"}} for its outcome",
                d.id,
                d.status.as_str(),
                d.id
            ),
            Some(json!({ "dispatch": d.id, "status": d.status.as_str(), "thread": d.thread })),
            false,
        )
    }
}

const INSTRUCTIONS: &str = "Each tool runs a Homing agent. A call that takes long answers with a \
dispatch id: ask homing_result for its outcome, answer what it asks with homing_respond.";

fn server_info() -> Value {
    json!({ "name": "homing", "version": env!("CARGO_PKG_VERSION") })
}

fn description(name: &str, plugin: &crate::config::PluginConfig) -> String {
    plugin.mcp_server.description.clone().unwrap_or_else(|| {
        format!("Runs the Homing agent `{name}` with the arguments as its input.")
    })
}

fn input_schema(plugin: &crate::config::PluginConfig) -> Value {
    plugin
        .mcp_server
        .input_schema
        .as_ref()
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or_else(|| json!({ "type": "object" }))
}

/// A tool result of text, with structured content.
fn text_result(text: String, structured: Option<Value>, is_error: bool) -> Value {
    let mut result = json!({ "content": [{ "type": "text", "text": text }], "isError": is_error });
    if let Some(s) = structured {
        result["structuredContent"] = s;
    }
    result
}

/// A failed tool call, which the model reads.
fn tool_error(text: String) -> Value {
    text_result(text, None, true)
}

/// The result of an ended run.
fn finished(d: &Dispatch) -> Value {
    if d.status != Status::Acked {
        let why = d
            .last_error
            .clone()
            .unwrap_or_else(|| "no error recorded".into());
        return text_result(
            format!(
                "the run ended {} without an answer: {why}",
                d.status.as_str()
            ),
            Some(json!({ "dispatch": d.id, "status": d.status.as_str() })),
            true,
        );
    }
    let output = d
        .result
        .as_ref()
        .map(|r| r.output.as_slice())
        .unwrap_or_default();
    let structured = serde_json::from_slice::<Value>(output)
        .ok()
        .filter(Value::is_object);
    text_result(
        String::from_utf8_lossy(output).into_owned(),
        structured,
        false,
    )
}

/// Checks `arguments` against the agent's `input_schema` ([`crate::work::arguments::check`]).
fn check_arguments(
    config: &Config,
    agent: &str,
    arguments: &Map<String, Value>,
) -> Result<(), String> {
    match config
        .plugins
        .get(agent)
        .and_then(|p| p.mcp_server.input_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
    {
        Some(schema) => crate::work::arguments::check(&schema, arguments),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use axum::http::HeaderValue;

    use super::*;

    fn params(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    fn modern(version: &str) -> Map<String, Value> {
        params(json!({ "name": "echo", "_meta": { META_VERSION: version } }))
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (k, v) in pairs {
            headers.insert(*k, HeaderValue::from_static(v));
        }
        headers
    }

    #[test]
    fn the_era_is_read_from_the_body_and_the_headers_must_match_it() {
        let none = HeaderMap::new();
        assert_eq!(
            era(&none, "initialize", &Map::new()).unwrap(),
            Era::Handshake
        );
        let legacy = headers(&[("mcp-protocol-version", "2025-06-18")]);
        assert_eq!(
            era(&legacy, "tools/list", &Map::new()).unwrap(),
            Era::Handshake
        );
        let unknown = headers(&[("mcp-protocol-version", "1999-01-01")]);
        let e = era(&unknown, "tools/list", &Map::new()).unwrap_err();
        assert_eq!(
            (e.status, e.code),
            (StatusCode::BAD_REQUEST, UNSUPPORTED_VERSION)
        );

        let good = headers(&[("mcp-method", "tools/call"), ("mcp-name", "echo")]);
        assert_eq!(
            era(&good, "tools/call", &modern(MODERN)).unwrap(),
            Era::Modern
        );
        let e = era(&good, "tools/call", &modern("2099-01-01")).unwrap_err();
        assert_eq!(e.code, UNSUPPORTED_VERSION);
        assert_eq!(e.data.unwrap()["requested"], "2099-01-01");
        for wrong in [
            headers(&[("mcp-name", "echo")]),
            headers(&[("mcp-method", "tools/list"), ("mcp-name", "echo")]),
            headers(&[("mcp-method", "tools/call"), ("mcp-name", "other")]),
            headers(&[("mcp-method", "tools/call")]),
            headers(&[
                ("mcp-method", "tools/call"),
                ("mcp-name", "echo"),
                ("mcp-protocol-version", "2025-11-25"),
            ]),
        ] {
            let e = era(&wrong, "tools/call", &modern(MODERN)).unwrap_err();
            assert_eq!(
                (e.status, e.code),
                (StatusCode::BAD_REQUEST, HEADER_MISMATCH),
                "{wrong:?}"
            );
        }
    }

    #[test]
    fn arguments_are_checked_against_the_required_properties_and_their_types() {
        let config = Config::parse(
            "[plugins.a]\npath = \"a.wasm\"\n[plugins.a.mcp_server]\nexpose = true\n\
             input_schema = { type = \"object\", properties = { n = { type = \"integer\" }, s = { type = \"string\" } }, required = [\"n\"] }\n",
            "homing.toml",
            std::path::Path::new("."),
        )
        .unwrap();
        let args = |v: Value| v.as_object().unwrap().clone();
        assert!(
            check_arguments(
                &config,
                "a",
                &args(json!({ "n": 3, "s": "x", "extra": [] }))
            )
            .is_ok()
        );
        let missing = check_arguments(&config, "a", &args(json!({ "s": "x" }))).unwrap_err();
        assert!(missing.contains("`n` is required"), "{missing}");
        let wrong = check_arguments(&config, "a", &args(json!({ "n": 1.5 }))).unwrap_err();
        assert!(wrong.contains("`n` must be of type integer"), "{wrong}");
        let wrong = check_arguments(&config, "a", &args(json!({ "n": 1, "s": 2 }))).unwrap_err();
        assert!(wrong.contains("`s`"), "{wrong}");
    }

    #[test]
    fn a_schema_that_is_not_an_object_or_an_origin_with_a_path_is_refused_at_load() {
        for (text, named) in [
            (
                "[plugins.a]\npath = \"a.wasm\"\n[plugins.a.mcp_server]\ninput_schema = { type = \"string\" }\n",
                "[plugins.a.mcp_server] input_schema",
            ),
            (
                "[api.mcp]\nallowed_origins = [\"https://a.example/path\"]\n",
                "[api.mcp] allowed_origins",
            ),
            ("[api.mcp]\ncall_wait = \"0s\"\n", "[api.mcp] call_wait"),
            ("[api.mcp]\ntools = \"all\"\n", "tools"),
        ] {
            let e = Config::parse(text, "homing.toml", std::path::Path::new("."))
                .unwrap_err()
                .to_string();
            assert!(e.contains(named), "{text}: {e}");
        }
    }

    #[test]
    fn an_ended_run_answers_its_output_and_a_json_object_is_structured() {
        let mut d = crate::store::rules::queued_record(
            "d1",
            &NewDispatch::new("echo", "t", b"{}".to_vec()),
            0,
            10,
        );
        d.status = Status::Acked;
        d.result = Some(crate::store::RunResult::success(b"{\"ok\":true}".to_vec()));
        let r = finished(&d);
        assert_eq!(r["structuredContent"], json!({ "ok": true }));
        assert_eq!(r["isError"], false);
        d.result = Some(crate::store::RunResult::success(b"[1]".to_vec()));
        assert!(finished(&d).get("structuredContent").is_none());
        d.status = Status::DeadLetter;
        d.last_error = Some("boom".into());
        let r = finished(&d);
        assert_eq!(r["isError"], true);
        assert!(r["content"][0]["text"].as_str().unwrap().contains("boom"));
    }
}
