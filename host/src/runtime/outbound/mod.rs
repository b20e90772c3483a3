//! Outbound HTTP for guests: `wasi:http/outgoing-handler`, sent by the host.
//!
//! Every request a guest makes passes, in order (each step a function of [`send`]):
//! 1. the plugin's cap on requests in flight per instance (`http.max_concurrent`);
//! 2. the allow-list: its origin must match an `allowed_outbound_hosts` entry, or it is refused
//!    with `HTTP-request-denied`;
//! 3. the request body cap (`http.max_request_body`), on the declared length and on the bytes;
//! 4. address safety ([`policy`], the same rule as raw TCP): the host resolves the name itself,
//!    at request time, and connects only to the addresses it resolved. An address that is not
//!    globally routable (loopback, private, link-local such as the cloud metadata service at
//!    169.254.169.254, shared, reserved) is refused with `destination-IP-prohibited` unless an
//!    entry with the request's scheme, covering its port, names that address literally (or
//!    names `localhost`, for a loopback address). A name that resolves to such an address (by
//!    mistake or by DNS rebinding) therefore reaches nothing inside the network;
//! 5. TLS by the host for `https` ([`crate::tls`]: the built-in web roots plus `tls_ca` files);
//! 6. timeouts: connect, first byte and between bytes, each the guest's own when shorter than
//!    the plugin's, and all clamped to the dispatch's remaining time; an interrupt or a lost
//!    lease ends the request at once;
//! 7. the response body cap (`http.max_response_body`, in [`bodies`]).
//!
//! One log line per request, tagged with plugin, dispatch and attempt: method, origin, path
//! without the query, status, bytes and milliseconds, or why it was refused. Never headers or
//! bodies (they carry credentials).

use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{info, warn};
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use super::host::{LogState, Secrets};
use crate::claim::{ClaimControl, Recorder};
use crate::config::outbound::Scheme;
use crate::config::{HttpLimits, PluginConfig};

mod bodies;
pub mod flow;
pub mod genai;
mod journal;
pub mod policy;
mod send;

pub use policy::Policy;

/// What every instance of one plugin shares: its policy, limits and TLS setup.
pub struct Outbound {
    plugin: String,
    policy: Arc<Policy>,
    /// The policy of the host's own requests for the plugin ([`HttpHooks::host_exchange`]):
    /// the guest's grants and the plugin's MCP servers' origins.
    host_policy: Arc<Policy>,
    /// `[pricing."ORIGIN"]`: the model APIs whose calls are metered ([`genai`]).
    models: Arc<Vec<crate::config::pricing::ModelOrigin>>,
    limits: HttpLimits,
    tls: Option<Arc<rustls::ClientConfig>>,
    flow: flow::Flow,
}

impl std::fmt::Debug for Outbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound")
            .field("plugin", &self.plugin)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Outbound {
    /// The outbound setup of plugin `name`; `ca_files` are the extra roots to trust, `hosts`
    /// the names pinned to addresses (`[host] hosts`).
    ///
    /// # Errors
    ///
    /// When a CA file cannot be read or holds no certificate, or a grant does not parse.
    pub fn new(
        name: &str,
        config: &PluginConfig,
        ca_files: &[PathBuf],
        hosts: &std::collections::BTreeMap<String, IpAddr>,
    ) -> anyhow::Result<Self> {
        let policy = Policy::new(config, hosts).map_err(anyhow::Error::msg)?;
        let host_policy = policy.with_http(config.mcp.values().flat_map(|s| s.grants()));
        let needs_tls = host_policy
            .http_grants()
            .iter()
            .any(|h| h.scheme == Scheme::Https);
        // The CA files are read even when no entry is https, so a bad path fails at start.
        let extra = crate::tls::read_ca_files(ca_files)?;
        let tls = if needs_tls {
            Some(Arc::new(crate::tls::config_with(extra)?))
        } else {
            None
        };
        Ok(Outbound {
            plugin: name.to_owned(),
            policy: Arc::new(policy),
            host_policy: Arc::new(host_policy),
            models: Arc::default(),
            limits: config.http.clone(),
            tls,
            flow: flow::Flow::default(),
        })
    }

    /// The same setup honouring `flow`'s origin limits and parking statuses.
    pub fn with_flow(mut self, flow: flow::Flow) -> Self {
        self.flow = flow;
        self
    }

    /// The same setup metering the calls to `models` ([`genai`]).
    pub fn with_models(mut self, models: Vec<crate::config::pricing::ModelOrigin>) -> Self {
        self.models = Arc::new(models);
        self
    }

    /// A plugin that may send nothing (instances built outside a plugin: probes, tests).
    pub fn deny_all(name: &str) -> Self {
        Outbound {
            plugin: name.to_owned(),
            policy: Arc::new(Policy::default()),
            host_policy: Arc::new(Policy::default()),
            models: Arc::default(),
            limits: HttpLimits::default(),
            tls: None,
            flow: flow::Flow::default(),
        }
    }

    /// The plugin's network policy (raw TCP decides on it too).
    pub fn policy(&self) -> &Arc<Policy> {
        &self.policy
    }

    /// An instance's hooks: its own cap on requests in flight.
    pub fn hooks(self: &Arc<Self>, log: Arc<Mutex<LogState>>) -> HttpHooks {
        HttpHooks {
            outbound: self.clone(),
            log,
            control: None,
            deadline: None,
            traceparent: None,
            journal: None,
            usage: None,
            permits: Arc::new(Semaphore::new(self.limits.max_concurrent as usize)),
        }
    }
}

/// The `wasi:http` hooks of one instance.
pub struct HttpHooks {
    outbound: Arc<Outbound>,
    log: Arc<Mutex<LogState>>,
    /// The current claim's control: an interrupt or a lost lease ends requests in flight.
    pub control: Option<Arc<ClaimControl>>,
    /// The current dispatch's deadline: no request outlives it.
    pub deadline: Option<Instant>,
    /// The `traceparent` the current dispatch was enqueued with: sent on when traces are not
    /// exported (when they are, each request carries its own span's).
    pub traceparent: Option<String>,
    /// The current claim's journal, under `journal = "run"`: each exchange is a journaled call.
    pub journal: Option<Arc<Recorder>>,
    /// Where the current claim's metered model calls add their tokens ([`genai`]).
    pub usage: Option<genai::UsageSink>,
    permits: Arc<Semaphore>,
}

impl std::fmt::Debug for HttpHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpHooks")
            .field("plugin", &self.outbound.plugin)
            .finish_non_exhaustive()
    }
}

type SendResult = Result<(http::Response<WasiBody>, IoFuture), HttpError>;
type IoFuture = Box<dyn Future<Output = Result<(), HttpError>> + Send>;

impl HttpHooks {
    /// A request's job, tagged with the current dispatch and attempt, its path and server
    /// scrubbed of the plugin's secrets (a path may carry one: a bot token, a webhook's URL),
    /// its span a child of the current one.
    fn job(
        &self,
        method: &http::Method,
        uri: &http::Uri,
        deadline: Option<Instant>,
        policy: Arc<Policy>,
    ) -> Job {
        let (dispatch, attempt, secrets) = self
            .log
            .lock()
            .map(|log| {
                (
                    log.tag.dispatch.clone(),
                    log.tag.attempt,
                    log.secrets.clone(),
                )
            })
            .unwrap_or_default();
        let path = secrets.scrub(uri.path()).into_owned();
        let server = secrets.scrub(uri.host().unwrap_or_default()).into_owned();
        let span = request_span(method, &path, &server);
        Job {
            outbound: self.outbound.clone(),
            policy,
            dispatch,
            attempt,
            control: self.control.clone(),
            deadline,
            permit: self.permits.clone().try_acquire_owned().ok(),
            method: method.to_string(),
            origin: String::new(),
            granted: NO_GRANT.to_owned(),
            path,
            secrets,
            started: Instant::now(),
            span,
            slots: Vec::new(),
            meter: None,
            usage: self.usage.clone(),
        }
    }
}

impl WasiHttpHooks for HttpHooks {
    fn send_request(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> Box<dyn Future<Output = SendResult> + Send> {
        // A child of the guest call (the current span while the guest asks for the request).
        let job = self.job(
            request.method(),
            request.uri(),
            self.deadline,
            self.outbound.policy.clone(),
        );
        let span = job.span.clone();
        // The trace goes on to the server, unless the guest set its own.
        if !request.headers().contains_key(TRACEPARENT)
            && let Some(parent) =
                crate::telemetry::trace::traceparent(&span).or_else(|| self.traceparent.clone())
            && let Ok(value) = http::HeaderValue::from_str(&parent)
        {
            request.headers_mut().insert(TRACEPARENT, value);
        }
        let shown = self
            .journal
            .is_some()
            .then(|| journal::shown_url(request.uri(), &job.path, &job.secrets));
        match (self.journal.clone(), shown) {
            (Some(recorder), Some(shown)) => Box::new(tracing::Instrument::instrument(
                job.send_journaled(recorder, request, options, shown),
                span,
            )),
            _ => Box::new(tracing::Instrument::instrument(
                job.send(request, options),
                span,
            )),
        }
    }
}

/// One request on its way.
struct Job {
    outbound: Arc<Outbound>,
    /// What decides where it may go: the guest's policy, or the host's for its own requests.
    policy: Arc<Policy>,
    dispatch: String,
    attempt: u32,
    control: Option<Arc<ClaimControl>>,
    deadline: Option<Instant>,
    permit: Option<OwnedSemaphorePermit>,
    method: String,
    origin: String,
    /// The `allowed_outbound_hosts` entry the request matched, as the metrics' `origin` label
    /// ([`NO_GRANT`] until one matched): only values the configuration defines.
    granted: String,
    path: String,
    /// The plugin's secrets: scrubbed from every part of the request the host shows, and kept
    /// out of the journal.
    secrets: Arc<Secrets>,
    started: Instant,
    span: tracing::Span,
    /// The origin-limit slots it holds until its response body is done.
    slots: Vec<flow::SlotGuard>,
    /// A model call's meter ([`genai`]), from its admission to its response's end.
    meter: Option<genai::Meter>,
    /// Where the claim's metered usage adds up.
    usage: Option<genai::UsageSink>,
}

/// The metrics' `origin` of a request that matched no `allowed_outbound_hosts` entry.
const NO_GRANT: &str = "none";

/// The W3C trace context header.
const TRACEPARENT: &str = "traceparent";

/// Why the host ended a request early.
#[derive(Debug)]
enum Ended {
    Deadline,
    Cancelled,
}

impl Job {
    /// Logs a refusal or failure and returns `err`.
    fn refuse(&self, why: &str, err: HttpError) -> HttpError {
        let label = match &err {
            HttpError::HttpRequestDenied | HttpError::DestinationIpProhibited => "denied",
            _ => "error",
        };
        self.span.record("otel.status_code", "ERROR");
        crate::telemetry::outbound_request(
            &self.outbound.plugin,
            &self.granted,
            label.to_owned(),
            self.started.elapsed(),
        );
        warn!(
            plugin = %self.outbound.plugin,
            dispatch = %self.dispatch,
            attempt = self.attempt,
            method = %self.method,
            origin = %self.origin,
            path = %self.path,
            ms = self.started.elapsed().as_millis() as u64,
            "outbound request refused: {why}"
        );
        err
    }

    /// The time left before the dispatch's deadline, capped at `limit`, and shortened to the
    /// guest's own `asked` when that is shorter.
    fn budget(&self, limit: Duration, asked: Option<Duration>) -> Duration {
        let mut budget = limit.min(asked.unwrap_or(limit));
        if let Some(deadline) = self.deadline {
            budget = budget.min(deadline.saturating_duration_since(Instant::now()));
        }
        budget
    }

    /// Runs `fut` within `budget`, ended early by an interrupt or a lost lease.
    async fn bounded<T>(&self, budget: Duration, fut: impl Future<Output = T>) -> Result<T, Ended> {
        let control = self.control.clone();
        let cancelled = async move {
            match control {
                Some(control) => control.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            out = fut => Ok(out),
            () = tokio::time::sleep(budget) => Err(Ended::Deadline),
            () = cancelled => Err(Ended::Cancelled),
        }
    }

    fn ended(&self, ended: Ended, during: &str, timeout: HttpError) -> HttpError {
        match ended {
            Ended::Deadline => self.refuse(&format!("timed out {during}"), timeout),
            Ended::Cancelled => self.refuse(
                &format!("cancelled {during}: the claim must stop"),
                HttpError::InternalError(Some("cancelled by the host".into())),
            ),
        }
    }

    /// Logs the line of a request that got its response, and its metric: `outcome` is why it
    /// ended early, if it did.
    fn finish(&self, status: u16, bytes: u64, outcome: Option<&str>) {
        let ms = self.started.elapsed().as_millis() as u64;
        // As an i64: the OpenTelemetry bridge sends unsigned integers as text.
        self.span
            .record("http.response.status_code", i64::from(status));
        if status >= 500 || outcome.is_some() {
            self.span.record("otel.status_code", "ERROR");
        }
        crate::telemetry::outbound_request(
            &self.outbound.plugin,
            &self.granted,
            if outcome.is_some() {
                "error".to_owned()
            } else {
                status.to_string()
            },
            self.started.elapsed(),
        );
        match outcome {
            None => info!(
                plugin = %self.outbound.plugin,
                dispatch = %self.dispatch,
                attempt = self.attempt,
                method = %self.method,
                origin = %self.origin,
                path = %self.path,
                status,
                bytes,
                ms,
                "outbound request"
            ),
            Some(why) => warn!(
                plugin = %self.outbound.plugin,
                dispatch = %self.dispatch,
                attempt = self.attempt,
                method = %self.method,
                origin = %self.origin,
                path = %self.path,
                status,
                bytes,
                ms,
                "outbound request ended: {why}"
            ),
        }
    }
}

/// What an exchange the host makes for a guest answered ([`HttpHooks::host_exchange`]).
#[derive(Debug)]
pub struct HostAnswer {
    /// The status.
    pub status: u16,
    /// The response headers.
    pub headers: http::HeaderMap,
    /// The body, as far as it was read.
    pub body: bytes::Bytes,
}

/// Why an exchange the host makes for a guest failed.
#[derive(Debug)]
pub enum HostExchangeError {
    /// The plugin's policy refused it (the origin, the address, a cap); nothing was sent.
    Refused(String),
    /// It never reached the server (no connection): nothing was sent.
    NotSent(String),
    /// It may have reached the server, and no full answer came back (a timeout, a broken
    /// connection).
    Unknown(String),
    /// The answer passed the cap (bytes): it was not read further.
    TooLarge(u64),
}

impl HttpHooks {
    /// Sends `request` for the guest, as the host's own (the MCP broker's requests): through
    /// every step a guest's request takes (the allow-list, the address rule, TLS, the
    /// origin limits, the plugin's timeouts and the dispatch's deadline, an interrupt), within
    /// `timeout` in all, logged with the plugin and dispatch. The body is read until `done`
    /// says the bytes so far hold the answer (an event stream may stay open), its end, or `cap`
    /// bytes (then `TooLarge`).
    pub async fn host_exchange(
        &self,
        request: http::Request<bytes::Bytes>,
        timeout: Duration,
        cap: u64,
        done: impl Fn(&[u8]) -> bool,
    ) -> Result<HostAnswer, HostExchangeError> {
        use http_body_util::BodyExt;
        // A child of the current span (the broker's `execute_tool`, or the guest call).
        let own = Instant::now().checked_add(timeout);
        let deadline = match (self.deadline, own) {
            (Some(d), Some(own)) => Some(d.min(own)),
            (d, own) => d.or(own),
        };
        let job = self.job(
            request.method(),
            request.uri(),
            deadline,
            self.outbound.host_policy.clone(),
        );
        let span = job.span.clone();
        let mut request = request;
        // The head goes out in origin form: the authority travels as `Host` (as `wasi:http`
        // sets it for a guest's own requests).
        if !request.headers().contains_key(http::header::HOST)
            && let Some(host) = request.uri().host().and_then(|host| {
                let port = request
                    .uri()
                    .port()
                    .map(|p| format!(":{p}"))
                    .unwrap_or_default();
                // Never a URL's user info: only the host and port.
                http::HeaderValue::from_str(&format!("{host}{port}")).ok()
            })
        {
            request.headers_mut().insert(http::header::HOST, host);
        }
        let request = request.map(|body| {
            http_body_util::Full::new(body)
                .map_err(|never| match never {})
                .boxed_unsync()
        });
        let exchange = async move {
            let (response, io) = job.send(request, None).await.map_err(|e| match e {
                HttpError::HttpRequestDenied
                | HttpError::DestinationIpProhibited
                | HttpError::ConnectionLimitReached
                | HttpError::HttpRequestBodySize(_)
                | HttpError::HttpProtocolError
                | HttpError::HttpRequestUriInvalid => {
                    HostExchangeError::Refused(host_error_text(&e))
                }
                HttpError::ConnectionRefused
                | HttpError::Connect(_)
                | HttpError::Tls(_)
                | HttpError::DestinationNotFound
                | HttpError::DestinationUnavailable
                | HttpError::DestinationIpUnroutable
                | HttpError::DnsTimeout
                | HttpError::DnsError { .. }
                | HttpError::ConnectionTimeout
                | HttpError::TlsCertificateError
                | HttpError::TlsAlertReceived { .. }
                | HttpError::TlsProtocolError => HostExchangeError::NotSent(host_error_text(&e)),
                other => HostExchangeError::Unknown(host_error_text(&other)),
            })?;
            // The connection is driven beside the body, as `wasi:http` drives it.
            let driver = tokio::spawn(Box::into_pin(io));
            let status = response.status().as_u16();
            let (parts, mut body) = response.into_parts();
            let mut out = bytes::BytesMut::new();
            let read = loop {
                match body.frame().await {
                    None => break Ok(()),
                    Some(Err(e)) => break Err(HostExchangeError::Unknown(host_error_text(&e))),
                    Some(Ok(frame)) => {
                        if let Some(data) = frame.data_ref() {
                            if out.len() as u64 + data.len() as u64 > cap {
                                break Err(HostExchangeError::TooLarge(cap));
                            }
                            out.extend_from_slice(data);
                            if done(&out) {
                                break Ok(());
                            }
                        }
                    }
                }
            };
            drop(body);
            driver.abort();
            read.map(|()| HostAnswer {
                status,
                headers: parts.headers,
                body: out.freeze(),
            })
        };
        match tokio::time::timeout(timeout, tracing::Instrument::instrument(exchange, span)).await {
            Ok(out) => out,
            Err(_) => Err(HostExchangeError::Unknown(format!(
                "no answer within {} ms",
                timeout.as_millis()
            ))),
        }
    }
}

/// The client span of one request (its path and server already scrubbed of secrets).
fn request_span(method: &http::Method, path: &str, server: &str) -> tracing::Span {
    tracing::info_span!(
        target: crate::telemetry::trace::TARGET,
        "homing.http",
        otel.kind = "client",
        http.request.method = %method,
        url.path = %path,
        server.address = %server,
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        otel.name = tracing::field::Empty,
        gen_ai.operation.name = tracing::field::Empty,
        gen_ai.provider.name = tracing::field::Empty,
        gen_ai.request.model = tracing::field::Empty,
        gen_ai.request.max_tokens = tracing::field::Empty,
        gen_ai.request.temperature = tracing::field::Empty,
        gen_ai.response.model = tracing::field::Empty,
        gen_ai.response.id = tracing::field::Empty,
        gen_ai.response.finish_reasons = tracing::field::Empty,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        gen_ai.usage.cache_read.input_tokens = tracing::field::Empty,
    )
}

/// A `wasi:http` error as the broker's errors show it.
fn host_error_text(e: &HttpError) -> String {
    match e {
        HttpError::HttpRequestDenied => {
            "the origin is not in the plugin's allowed_outbound_hosts".into()
        }
        HttpError::DestinationIpProhibited => {
            "the address is not public and no allowed_outbound_hosts entry names it".into()
        }
        other => format!("{other}"),
    }
}
