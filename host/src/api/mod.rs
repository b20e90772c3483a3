//! The HTTP API `homing run` serves when `[api] listen` is set: JSON in and out, over axum.
//!
//! | route | role | does |
//! | --- | --- | --- |
//! | `POST /v1/dispatches` | producer | enqueue |
//! | `GET /v1/dispatches` | reader | list, paged by cursor |
//! | `GET /v1/dispatches/{id}` | reader | one dispatch; `?wait=30s` long-polls until it is terminal |
//! | `POST /v1/dispatches/{id}/cancel` | operator | cancel a queued dispatch |
//! | `POST /v1/dispatches/{id}/retry` | operator | re-enqueue a dead-lettered or cancelled one |
//! | `GET /v1/dispatches/{id}/stream` | reader | the dispatch's output as server-sent events while it runs, resumable with `Last-Event-ID` |
//! | `GET /v1/dispatches/{id}/journal` | reader | a page of the dispatch's journal entries (no bodies), and its steps |
//! | `GET /v1/dispatches/{id}/journal/{pos}` | reader | one journal entry with its body |
//! | `GET /v1/threads/{thread}/log` | reader | a page of the thread's log |
//! | `GET /v1/threads/{thread}/log/stream` | reader | the log as server-sent events, following |
//! | `POST /v1/threads/{thread}/interrupt` | operator | interrupt the thread |
//! | `POST /v1/threads/{thread}/messages` | producer | send a message into the thread's inbox |
//! | `GET /v1/threads/{thread}/messages` | reader | a page of the thread's messages |
//! | `POST /v1/threads/{thread}/messages/discard` | operator | discard pending messages |
//! | `GET /v1/waitpoints` | reader | a page of waitpoints, by thread, dispatch and state |
//! | `GET /v1/waitpoints/{id}` | reader | one waitpoint |
//! | `POST /v1/waitpoints/{id}/complete` | the waitpoint's token, or operator | complete it with the body |
//! | `POST /v1/waitpoints/{id}/cancel` | operator | cancel a pending waitpoint |
//! | `GET /v1/agents` | reader | plugins: world, limits and their use, grants, queue counts, pauses |
//! | `POST /v1/agents/{agent}/pause` | operator | pause the agent's claims (or one concurrency key's) |
//! | `POST /v1/agents/{agent}/resume` | operator | lift a pause |
//! | `POST /v1/agents/{agent}/reload` | operator | reload the config and the agent's component |
//! | `GET /v1/openapi.json` | reader | the description of all of the above |
//! | `GET /openai/v1/models`, `POST /openai/v1/chat/completions` | reader, producer | agents as models, for OpenAI clients (see `openai`) |
//! | `POST /mcp` | producer | agents as MCP tools (see `mcp`) |
//! | `GET /metrics` | reader | Prometheus metrics (no token with `[api] public_metrics`) |
//! | `GET /livez`, `/readyz` | none | health, for probes |
//!
//! The table of [`routes`] is the one place a `/v1` route and its role are named: the router
//! is built from it, and a test checks `openapi.json` against it. Every `/v1` request passes
//! [`auth`] (a bearer token of the route's role, compared in constant time; invalid ones
//! limited per client address) but the waitpoint completion, which checks its tokens itself
//! with the same limits (see `waitpoints`), then takes a slot of `[api] max_concurrent` (after the token,
//! so that clients without one cannot take them all), under a time limit; bodies are read up
//! to `[api] max_body` and must arrive within `[api] body_timeout`. Connections are counted
//! per client address at accept, and event streams while they are open (see `limits`).
//! `/livez` and `/readyz` take no slot. Errors are JSON `{"error": ..., "field": ...}` naming
//! what was wrong, never a store's internals.
//!
//! - `auth`: tokens and the middleware;
//! - `limits`: connections and failed tokens per client address, streams, the body timer;
//! - `error`: [`ApiError`] and how store errors map to statuses;
//! - `dispatches`, `journal`, `threads`, `waitpoints`, `agents`, `health`: the handlers (what they do with work, the
//!   CLI and guests do too, through [`crate::work`]);
//! - `view`: the JSON shape of a dispatch (no claim token);
//! - `openai`: the OpenAI-compatible endpoint, outside `/v1` and the OpenAPI description (its
//!   shape is OpenAI's), behind the same tokens and layers;
//! - `dashboard`: the operators' web pages at `/` (unless `[api] dashboard = false`), behind
//!   the same layers, with sessions opened by a token of the same list.

mod agents;
mod auth;
mod dashboard;
mod dispatches;
mod error;
mod health;
mod journal;
mod limits;
mod mcp;
mod openai;
mod schedules;
pub(crate) mod stream;
mod threads;
mod view;
mod waitpoints;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::{Semaphore, SemaphorePermit, watch};
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::config::api::Role;
use crate::live::{Hub, LiveSettings};
use crate::store::Store;
pub use agents::AgentInfo;
pub use error::ApiError;

/// The OpenAPI description served at `/v1/openapi.json`.
pub const OPENAPI: &str = include_str!("openapi.json");

/// What the handlers share.
#[derive(Debug)]
pub(crate) struct ApiState {
    store: Store,
    /// The config the API started with, its `[plugins]` and `[limits]` replaced by each reload
    /// of the host in this process (`[api]`, `[host]` and `[store]` stay as they started).
    config: RwLock<Arc<Config>>,
    /// The payload cap in force: `[host] max_payload`, clamped to what the store holds.
    max_payload: u64,
    body_limit: u64,
    tokens: auth::Tokens,
    metrics: Option<PrometheusHandle>,
    /// The plugins, once loaded (`/readyz` is 503 until then).
    agents: RwLock<Option<Vec<AgentInfo>>>,
    /// The host running in this process: how to ask it to reload, and what it serves.
    reload: RwLock<Option<(crate::supervisor::Reloader, Arc<crate::supervisor::Fleet>)>>,
    shutdown: watch::Receiver<bool>,
    /// `[api] max_concurrent`: a slot is taken once a request is authenticated.
    in_flight: Semaphore,
    /// Invalid tokens per client address, of `/v1` and of the dashboard's logins.
    failures: limits::Failures,
    /// The event streams open.
    streams: Arc<limits::Streams>,
    /// Where running claims stream, and their watchers read.
    live: Hub,
}

impl ApiState {
    /// The config in force.
    pub(crate) fn config(&self) -> Arc<Config> {
        match self.config.read() {
            Ok(config) => config.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// A slot of `[api] max_concurrent` for an authenticated request, held while it runs;
    /// 503 when none is free.
    fn slot(&self) -> Result<SemaphorePermit<'_>, ApiError> {
        self.in_flight
            .try_acquire()
            .map_err(|_| ApiError::busy("too many requests in flight; retry later"))
    }
}

/// One `/v1` route: its method, path, the least role that may call it, and its handler.
pub(crate) struct Route {
    pub method: Method,
    pub path: &'static str,
    pub role: Role,
    /// The handler checks its tokens itself (the waitpoint completion: a waitpoint's own
    /// token, or a token of `role`); the bearer check of `/v1` is left out.
    pub own_auth: bool,
    handler: MethodRouter<Arc<ApiState>>,
}

/// Every `/v1` route.
pub(crate) fn routes() -> Vec<Route> {
    let route = |method: Method, path, role, handler| Route {
        method,
        path,
        role,
        own_auth: false,
        handler,
    };
    vec![
        route(
            Method::POST,
            "/v1/dispatches",
            Role::Producer,
            post(dispatches::enqueue),
        ),
        route(
            Method::GET,
            "/v1/dispatches",
            Role::Reader,
            get(dispatches::list),
        ),
        route(
            Method::GET,
            "/v1/dispatches/{id}",
            Role::Reader,
            get(dispatches::show),
        ),
        route(
            Method::POST,
            "/v1/dispatches/{id}/cancel",
            Role::Operator,
            post(dispatches::cancel),
        ),
        route(
            Method::POST,
            "/v1/dispatches/{id}/retry",
            Role::Operator,
            post(dispatches::retry),
        ),
        route(
            Method::GET,
            "/v1/dispatches/{id}/stream",
            Role::Reader,
            get(stream::show),
        ),
        route(
            Method::GET,
            "/v1/dispatches/{id}/journal",
            Role::Reader,
            get(journal::list),
        ),
        route(
            Method::GET,
            "/v1/dispatches/{id}/journal/{pos}",
            Role::Reader,
            get(journal::entry),
        ),
        route(
            Method::GET,
            "/v1/threads/{thread}/log",
            Role::Reader,
            get(threads::log),
        ),
        route(
            Method::GET,
            "/v1/threads/{thread}/log/stream",
            Role::Reader,
            get(threads::stream),
        ),
        route(
            Method::POST,
            "/v1/threads/{thread}/interrupt",
            Role::Operator,
            post(threads::interrupt),
        ),
        route(
            Method::POST,
            "/v1/threads/{thread}/messages",
            Role::Producer,
            post(threads::send),
        ),
        route(
            Method::GET,
            "/v1/threads/{thread}/messages",
            Role::Reader,
            get(threads::messages),
        ),
        route(
            Method::POST,
            "/v1/threads/{thread}/messages/discard",
            Role::Operator,
            post(threads::discard),
        ),
        route(
            Method::GET,
            "/v1/waitpoints",
            Role::Reader,
            get(waitpoints::list),
        ),
        route(
            Method::GET,
            "/v1/waitpoints/{id}",
            Role::Reader,
            get(waitpoints::show),
        ),
        Route {
            own_auth: true,
            ..route(
                Method::POST,
                "/v1/waitpoints/{id}/complete",
                Role::Operator,
                post(waitpoints::complete),
            )
        },
        route(
            Method::POST,
            "/v1/waitpoints/{id}/cancel",
            Role::Operator,
            post(waitpoints::cancel),
        ),
        route(Method::GET, "/v1/agents", Role::Reader, get(agents::list)),
        route(
            Method::POST,
            "/v1/agents/{agent}/pause",
            Role::Operator,
            post(agents::pause),
        ),
        route(
            Method::POST,
            "/v1/agents/{agent}/resume",
            Role::Operator,
            post(agents::resume),
        ),
        route(
            Method::POST,
            "/v1/agents/{agent}/reload",
            Role::Operator,
            post(agents::reload),
        ),
        route(
            Method::GET,
            "/v1/schedules",
            Role::Reader,
            get(schedules::list),
        ),
        route(
            Method::POST,
            "/v1/schedules",
            Role::Operator,
            post(schedules::create),
        ),
        route(
            Method::GET,
            "/v1/schedules/{name}",
            Role::Reader,
            get(schedules::show),
        ),
        route(
            Method::DELETE,
            "/v1/schedules/{name}",
            Role::Operator,
            axum::routing::delete(schedules::delete),
        ),
        route(
            Method::POST,
            "/v1/schedules/{name}/pause",
            Role::Operator,
            post(schedules::pause),
        ),
        route(
            Method::POST,
            "/v1/schedules/{name}/resume",
            Role::Operator,
            post(schedules::resume),
        ),
        route(
            Method::POST,
            "/v1/schedules/{name}/trigger",
            Role::Operator,
            post(schedules::trigger),
        ),
        route(
            Method::POST,
            "/v1/schedules/{name}/backfill",
            Role::Operator,
            post(schedules::backfill),
        ),
        route(Method::GET, "/v1/openapi.json", Role::Reader, get(openapi)),
    ]
}

async fn openapi() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI,
    )
        .into_response()
}

fn router(state: Arc<ApiState>) -> Router {
    let mut v1 = Router::new();
    for Route {
        method,
        path,
        role,
        own_auth,
        handler,
    } in routes()
        .into_iter()
        .chain(openai::routes())
        .chain(mcp::routes())
    {
        tracing::debug!(%method, path, %role, own_auth, "API route");
        let handler = if own_auth {
            handler
        } else {
            handler.route_layer(axum::middleware::from_fn_with_state(
                (state.clone(), role),
                auth::require,
            ))
        };
        v1 = v1.route(path, handler);
    }
    if state.config().api.dashboard {
        v1 = v1.merge(dashboard::router(state.clone()));
    }
    let mut metrics = get(health::metrics);
    if state.config().api.public_metrics {
        metrics = metrics.route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            in_flight,
        ));
    } else {
        metrics = metrics.route_layer(axum::middleware::from_fn_with_state(
            (state.clone(), Role::Reader),
            auth::require,
        ));
    }
    v1.route("/livez", get(health::livez))
        .route("/readyz", get(health::readyz))
        .route("/metrics", metrics)
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route")
}

/// A slot of `max_concurrent` for a route that needs no token (`/metrics` with `[api]
/// public_metrics`).
async fn in_flight(State(state): State<Arc<ApiState>>, request: Request, next: Next) -> Response {
    match state.slot() {
        Ok(_slot) => next.run(request).await,
        Err(busy) => busy.into_response(),
    }
}

/// Every request: a time limit (long polls get their `wait` on top; streams end themselves at
/// `max_stream`), `body_timeout` for its body (408 when it runs out), and a count by route.
/// The slot of `max_concurrent` is taken later, once the request is authenticated.
async fn guard(State(state): State<Arc<ApiState>>, request: Request, next: Next) -> Response {
    let body_timeout = state.config().api.body_timeout;
    let expired = Arc::new(AtomicBool::new(false));
    let request = request.map(|body| {
        axum::body::Body::new(limits::TimedBody::new(body, body_timeout, expired.clone()))
    });
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = method_label(request.method());
    let api = &state.config().api;
    let limit = if route.ends_with("/stream") || route == openai::CHAT {
        // Streams end themselves; a chat turn bounds itself by `request_timeout + max_wait`
        // until its answer (or its stream) starts.
        None
    } else if route == "/v1/dispatches/{id}" || route == "/mcp" {
        Some(api.request_timeout + api.max_wait)
    } else {
        Some(api.request_timeout)
    };
    let response = match limit {
        None => next.run(request).await,
        Some(limit) => match tokio::time::timeout(limit, next.run(request)).await {
            Ok(response) => response,
            Err(_) => ApiError::timeout(limit).into_response(),
        },
    };
    let response = if expired.load(Ordering::Relaxed) {
        // Whatever the handler made of a body that stopped short, the cause was the time; the
        // rest of the body is never read, so the connection closes.
        let mut response = ApiError::body_timeout(body_timeout).into_response();
        response.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
        response
    } else {
        response
    };
    metrics::counter!(
        crate::telemetry::API_REQUESTS,
        "route" => route,
        "method" => method,
        "status" => response.status().as_u16().to_string()
    )
    .increment(1);
    response
}

/// The `method` label of a request: a standard method by name, anything else `other`. A
/// client may send any token as a method; as a label each one would be a series of its own.
fn method_label(method: &Method) -> &'static str {
    const STANDARD: [(Method, &str); 9] = [
        (Method::GET, "GET"),
        (Method::HEAD, "HEAD"),
        (Method::POST, "POST"),
        (Method::PUT, "PUT"),
        (Method::DELETE, "DELETE"),
        (Method::PATCH, "PATCH"),
        (Method::OPTIONS, "OPTIONS"),
        (Method::TRACE, "TRACE"),
        (Method::CONNECT, "CONNECT"),
    ];
    STANDARD
        .iter()
        .find(|(m, _)| m == method)
        .map_or("other", |(_, label)| *label)
}

/// How long a client may take to send a request's headers (also how long an idle keep-alive
/// connection is kept): a connection that sends nothing cannot hold a slot for long.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts connections until `stop`, at most `max_connections_per_client` at once from one
/// client address (one more is answered 503 and closed), serving each over HTTP/1.1 with a
/// header read timeout and its client address in every request's extensions; then waits for
/// the connections in flight (long polls and streams end on `stop` too).
async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    mut stop: watch::Receiver<bool>,
    api: &crate::config::api::ApiConfig,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let service = hyper_util::service::TowerToHyperService::new(app);
    let header_timeout = HEADER_READ_TIMEOUT.min(api.request_timeout);
    let connections = limits::Connections::new(api.max_connections_per_client);
    let refusal = limits::too_many_connections();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, or a connection reset before it was accepted:
                // pause rather than spin.
                warn!("API: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let client = limits::ClientAddr::of(peer.ip());
        let Some(admitted) = connections.admit(client) else {
            debug!(%client, "API: connection refused: [api] max_connections_per_client");
            // A fresh socket's send buffer takes this at once; if not, it is closed bare.
            let _ = stream.try_write(&refusal);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        let service =
            hyper::service::service_fn(move |mut request: http::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(client);
                hyper::service::Service::call(&service, request)
            });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let _ = connection.await;
            drop(admitted);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// A running API server.
#[derive(Debug)]
pub struct ApiServer {
    state: Arc<ApiState>,
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl ApiServer {
    /// Reads the tokens' secrets, binds `[api] listen` and starts serving.
    ///
    /// # Errors
    ///
    /// When a secret cannot be read, the address cannot be bound, or `listen` is unset.
    pub async fn start(
        config: Arc<Config>,
        store: Store,
        metrics: Option<PrometheusHandle>,
    ) -> anyhow::Result<ApiServer> {
        let live = Hub::new(&store, LiveSettings::of(&config));
        ApiServer::start_with_hub(config, store, metrics, live).await
    }

    /// [`ApiServer::start`] serving the streams of the claims of `live` (the hub of the host
    /// in this process).
    ///
    /// # Errors
    ///
    /// As [`ApiServer::start`].
    pub async fn start_with_hub(
        config: Arc<Config>,
        store: Store,
        metrics: Option<PrometheusHandle>,
        live: Hub,
    ) -> anyhow::Result<ApiServer> {
        let api = &config.api;
        let Some(listen) = api.listen else {
            anyhow::bail!("[api] listen is not set");
        };
        let tokens = auth::Tokens::read(&api.tokens, &config.base_dir)
            .map_err(|e| anyhow::anyhow!("{}: [api] tokens: {e}", config.source))?;
        if tokens.is_empty() {
            warn!(
                "[api] has no tokens: every /v1 request is refused (401); only /livez and /readyz answer (and /metrics with [api] public_metrics)"
            );
        }
        let max_payload = config.host.max_payload.min(store.max_value());
        let body_limit = api.body_limit(max_payload);
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("[api] listen: cannot bind {listen}"))?;
        let addr = listener.local_addr()?;
        let (stop, shutdown) = watch::channel(false);
        let state = Arc::new(ApiState {
            store,
            max_payload,
            body_limit,
            tokens,
            metrics,
            agents: RwLock::new(None),
            reload: RwLock::new(None),
            shutdown: shutdown.clone(),
            in_flight: Semaphore::new(api.max_concurrent),
            failures: limits::Failures::default(),
            streams: limits::Streams::new(api.max_streams, api.max_streams_per_token),
            live,
            config: RwLock::new(config.clone()),
        });
        let app = router(state.clone());
        let serving = config.clone();
        let task = tokio::spawn(async move { serve(listener, app, shutdown, &serving.api).await });
        info!(%addr, "HTTP API listening");
        Ok(ApiServer {
            state,
            addr,
            stop,
            task,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Records the loaded plugins: `/readyz` answers 200 from here on (while the store answers).
    pub fn plugins_loaded(&self, agents: Vec<AgentInfo>) {
        if let Ok(mut slot) = self.state.agents.write() {
            *slot = Some(agents);
        }
    }

    /// Serves the host running in this process: `POST /v1/agents/{agent}/reload` asks it to
    /// reload, and `/v1/agents` follows what each reload installed. Returns what the host calls
    /// once it runs (its file watch up, its workers started: `/readyz` answers 200 from then)
    /// and after each reload.
    pub fn serve_host(
        &self,
        reloader: crate::supervisor::Reloader,
        fleet: Arc<crate::supervisor::Fleet>,
    ) -> crate::supervisor::OnReload {
        if let Ok(mut slot) = self.state.reload.write() {
            *slot = Some((reloader, fleet));
        }
        let state = self.state.clone();
        Box::new(move |fleet, config| {
            if let Ok(mut slot) = state.agents.write() {
                *slot = Some(AgentInfo::of_fleet(fleet));
            }
            if let Ok(mut held) = state.config.write() {
                let mut next = (**held).clone();
                next.plugins = config.plugins.clone();
                next.limits = config.limits.clone();
                *held = Arc::new(next);
            }
        })
    }

    /// What `homing config check` says of `[api]`: each token read as [`ApiServer::start`]
    /// reads it (a missing or short secret fails here, naming the token and where it was
    /// looked for), described by name, role and source; never a secret. It is the first step
    /// of starting the server, taken alone, so a config the check passes is one `start`
    /// accepts.
    ///
    /// # Errors
    ///
    /// When a token's secret cannot be read or two tokens share a secret.
    pub fn check_tokens(config: &Config) -> anyhow::Result<Vec<String>> {
        auth::Tokens::read(&config.api.tokens, &config.base_dir)
            .map_err(|e| anyhow::anyhow!("{}: [api] tokens: {e}", config.source))?;
        Ok(config
            .api
            .tokens
            .iter()
            .map(|t| {
                let from = match &t.secret {
                    crate::config::api::SecretSource::Env(var) => {
                        format!("environment variable {var}")
                    }
                    crate::config::api::SecretSource::File(path) => {
                        format!("file {}", config.resolve(path).display())
                    }
                };
                format!("token {} ({}) from {from}", t.name, t.role)
            })
            .collect())
    }

    /// Stops accepting, ends long polls and streams, and waits (at most `within`) for the
    /// requests in flight.
    pub async fn stop(self, within: Duration) {
        let _ = self.stop.send(true);
        let mut task = self.task;
        if tokio::time::timeout(within, &mut task).await.is_err() {
            warn!("API requests still running after {within:?}; dropping them");
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use std::collections::BTreeSet;

    use super::*;
    use crate::store::SystemClock;
    use crate::store::embedded::EmbeddedStore;

    /// `(METHOD, path)` of every operation `openapi.json` describes, with its role.
    fn described() -> BTreeSet<(String, String, Option<String>)> {
        let spec: serde_json::Value = serde_json::from_str(OPENAPI).unwrap();
        let mut out = BTreeSet::new();
        for (path, item) in spec["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                out.insert((
                    method.to_uppercase(),
                    path.clone(),
                    op["x-homing-role"].as_str().map(str::to_owned),
                ));
            }
        }
        out
    }

    #[test]
    fn a_method_is_a_label_only_when_it_is_a_standard_one() {
        assert_eq!(method_label(&Method::GET), "GET");
        assert_eq!(method_label(&Method::PATCH), "PATCH");
        for made_up in ["XMETHOD1", "get", "PROPFIND"] {
            let method = Method::from_bytes(made_up.as_bytes()).unwrap();
            assert_eq!(method_label(&method), "other", "{made_up}");
        }
    }

    #[test]
    fn openapi_describes_exactly_the_routes_served_with_their_roles() {
        let mut served: BTreeSet<(String, String, Option<String>)> = routes()
            .iter()
            .map(|r| {
                (
                    r.method.to_string(),
                    r.path.to_owned(),
                    Some(r.role.as_str().to_owned()),
                )
            })
            .collect();
        for path in ["/livez", "/readyz", "/metrics"] {
            served.insert(("GET".into(), path.into(), None));
        }
        assert_eq!(described(), served);
    }

    #[test]
    fn openapi_says_metrics_needs_a_token_and_what_an_interrupt_takes() {
        let spec: serde_json::Value = serde_json::from_str(OPENAPI).unwrap();
        let metrics = &spec["paths"]["/metrics"]["get"];
        assert_eq!(metrics["security"][0], serde_json::json!({ "bearer": [] }));
        assert!(metrics["responses"]["401"].is_object());
        assert!(
            metrics["description"]
                .as_str()
                .unwrap()
                .contains("public_metrics")
        );
        let body = &spec["paths"]["/v1/threads/{thread}/interrupt"]["post"]["requestBody"];
        let schema = &body["content"]["application/json"]["schema"];
        assert_eq!(schema["properties"]["reason"]["type"], "string");
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(body["required"], false);
        // Every /v1 route may answer 429 (invalid tokens from one address).
        for route in routes() {
            let op = &spec["paths"][route.path][route.method.as_str().to_lowercase()];
            assert!(op["responses"]["429"].is_object(), "{}", route.path);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_v1_route_is_served_and_refuses_a_request_without_a_token() {
        let config = Config::parse(
            "[api]\nlisten = \"127.0.0.1:0\"\nrequest_timeout = \"1s\"\n[plugins.echo]\npath = \"echo.wasm\"\n",
            "homing.toml",
            std::path::Path::new("."),
        )
        .unwrap();
        let store = EmbeddedStore::open_in_memory(Arc::new(SystemClock))
            .unwrap()
            .store();
        let server = ApiServer::start(Arc::new(config), store, None)
            .await
            .unwrap();
        let base = format!("http://{}", server.addr());
        let client = reqwest::Client::new();
        for route in routes()
            .into_iter()
            .chain(openai::routes())
            .chain(mcp::routes())
        {
            let path = route
                .path
                .replace("{id}", "x")
                .replace("{thread}", "t")
                .replace("{pos}", "0");
            let response = client
                .request(route.method.clone(), format!("{base}{path}"))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 401, "{} {path}", route.method);
            assert!(response.headers().contains_key("www-authenticate"));
            let body: serde_json::Value = response.json().await.unwrap();
            assert!(body["error"].is_string(), "{body}");
        }
        let live = client.get(format!("{base}/livez")).send().await.unwrap();
        assert_eq!(live.status(), 200);
        let ready = client.get(format!("{base}/readyz")).send().await.unwrap();
        assert_eq!(ready.status(), 503, "the plugin is not loaded");
        let body: serde_json::Value = ready.json().await.unwrap();
        assert_eq!(body["not_ready"][0], "plugins not loaded: echo");
        let missing = client
            .get(format!("{base}/v2/nothing"))
            .send()
            .await
            .unwrap();
        assert_eq!(missing.status(), 404);
        // The dashboard's pages need a session too: to the login page, which is served.
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let page = client.get(format!("{base}/agents")).send().await.unwrap();
        assert_eq!(page.status(), 303);
        assert_eq!(page.headers()["location"], "/login?next=%2Fagents");
        let login = client.get(format!("{base}/login")).send().await.unwrap();
        assert_eq!(login.status(), 200);
        assert!(login.headers().contains_key("content-security-policy"));
        server.stop(Duration::from_secs(5)).await;
    }
}
