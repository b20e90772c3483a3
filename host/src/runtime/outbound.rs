//! Outbound HTTP for guests: `wasi:http/outgoing-handler`, sent by the host.
//!
//! Every request a guest makes passes, in order:
//! 1. the plugin's cap on requests in flight per instance (`http.max_concurrent`);
//! 2. the allow-list: its origin must match an `allowed_outbound_hosts` entry, or it is refused
//!    with `HTTP-request-denied`;
//! 3. the request body cap (`http.max_request_body`), on the declared length and on the bytes;
//! 4. address safety: the host resolves the name itself, at request time, and connects only to
//!    the addresses it resolved. An address that is not globally routable (loopback, private,
//!    link-local such as the cloud metadata service at 169.254.169.254, shared, reserved) is
//!    refused with `destination-IP-prohibited` unless an entry names that address literally, or
//!    the matching entry's host is `localhost` and the address is loopback. A name that
//!    resolves to such an address (by mistake or by DNS rebinding) therefore reaches nothing
//!    inside the network;
//! 5. TLS by the host for `https` (rustls: the built-in web roots plus `tls_ca` files);
//! 6. timeouts: connect, first byte and between bytes, each the guest's own when shorter than
//!    the plugin's, and all clamped to the dispatch's remaining time; an interrupt or a lost
//!    lease ends the request at once;
//! 7. the response body cap (`http.max_response_body`).
//!
//! One log line per request, tagged with plugin, dispatch and attempt: method, origin, path
//! without the query, status, bytes and milliseconds, or why it was refused. Never headers or
//! bodies (they carry credentials).

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http::uri::Scheme as UriScheme;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{info, warn};
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use super::host::LogState;
use crate::claim::ClaimControl;
use crate::config::outbound::{HostPattern, Scheme};
use crate::config::{HttpLimits, OutboundHost, PluginConfig};

/// The largest CA file read.
const MAX_CA_FILE: u64 = 1 << 20;

/// What every instance of one plugin shares: its grants, limits and TLS setup.
pub struct Outbound {
    plugin: String,
    hosts: std::collections::BTreeMap<String, IpAddr>,
    allow: Vec<OutboundHost>,
    limits: HttpLimits,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for Outbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound")
            .field("plugin", &self.plugin)
            .field("allow", &self.allow)
            .finish_non_exhaustive()
    }
}

impl Outbound {
    /// The outbound setup of plugin `name`; `ca_files` are the extra roots to trust.
    ///
    /// # Errors
    ///
    /// When a CA file cannot be read or holds no certificate.
    pub fn new(
        name: &str,
        config: &PluginConfig,
        ca_files: &[PathBuf],
        hosts: &std::collections::BTreeMap<String, IpAddr>,
    ) -> anyhow::Result<Self> {
        let needs_tls = config
            .allowed_outbound_hosts
            .iter()
            .any(|h| h.scheme == Scheme::Https);
        // The CA files are read even when no entry is https, so a bad path fails at start.
        let extra = read_ca_files(ca_files)?;
        let tls = if needs_tls {
            Some(Arc::new(tls_config(extra)?))
        } else {
            None
        };
        Ok(Outbound {
            plugin: name.to_owned(),
            hosts: hosts
                .iter()
                .map(|(k, v)| (k.trim_end_matches('.').to_ascii_lowercase(), *v))
                .collect(),
            allow: config.allowed_outbound_hosts.clone(),
            limits: config.http.clone(),
            tls,
        })
    }

    /// A plugin that may send nothing (instances built outside a plugin: probes, tests).
    pub fn deny_all(name: &str) -> Self {
        Outbound {
            plugin: name.to_owned(),
            hosts: Default::default(),
            allow: Vec::new(),
            limits: HttpLimits::default(),
            tls: None,
        }
    }

    /// An instance's hooks: its own cap on requests in flight.
    pub fn hooks(self: &Arc<Self>, log: Arc<Mutex<LogState>>) -> HttpHooks {
        HttpHooks {
            outbound: self.clone(),
            log,
            control: None,
            deadline: None,
            traceparent: None,
            permits: Arc::new(Semaphore::new(self.limits.max_concurrent as usize)),
        }
    }
}

/// A TLS client setup trusting the web roots and the certificates in `ca_files` (the host's
/// own HTTPS clients, such as the trace exporter, use it too).
///
/// # Errors
///
/// When a CA file cannot be read or holds no usable certificate.
pub fn client_tls(ca_files: &[PathBuf]) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    Ok(Arc::new(tls_config(read_ca_files(ca_files)?)?))
}

fn read_ca_files(
    files: &[PathBuf],
) -> anyhow::Result<Vec<rustls::pki_types::CertificateDer<'static>>> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut out = Vec::new();
    for path in files {
        let bytes = crate::input::read_file_capped(path, MAX_CA_FILE, "the CA file", "1 MiB")
            .with_context(|| format!("tls_ca {}", path.display()))?;
        let mut found = 0;
        for cert in CertificateDer::pem_slice_iter(&bytes) {
            let cert =
                cert.with_context(|| format!("tls_ca {}: not a PEM certificate", path.display()))?;
            out.push(cert);
            found += 1;
        }
        if found == 0 {
            bail!("tls_ca {}: holds no PEM certificate", path.display());
        }
    }
    Ok(out)
}

fn tls_config(
    extra: Vec<rustls::pki_types::CertificateDer<'static>>,
) -> anyhow::Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    for cert in extra {
        roots
            .add(cert)
            .context("tls_ca: a certificate is not a usable trust anchor")?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("TLS setup")?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
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

impl WasiHttpHooks for HttpHooks {
    fn send_request(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> Box<dyn Future<Output = SendResult> + Send> {
        let (dispatch, attempt) = self
            .log
            .lock()
            .map(|log| (log.tag.dispatch.clone(), log.tag.attempt))
            .unwrap_or_default();
        // A child of the guest call (the current span while the guest asks for the request).
        let span = tracing::info_span!(
            target: crate::telemetry::trace::TARGET,
            "homing.http",
            otel.kind = "client",
            http.request.method = %request.method(),
            url.path = %request.uri().path(),
            server.address = request.uri().host().unwrap_or_default(),
            http.response.status_code = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        // The trace goes on to the server, unless the guest set its own.
        if !request.headers().contains_key(TRACEPARENT)
            && let Some(parent) =
                crate::telemetry::trace::traceparent(&span).or_else(|| self.traceparent.clone())
            && let Ok(value) = http::HeaderValue::from_str(&parent)
        {
            request.headers_mut().insert(TRACEPARENT, value);
        }
        let job = Job {
            outbound: self.outbound.clone(),
            dispatch,
            attempt,
            control: self.control.clone(),
            deadline: self.deadline,
            permit: self.permits.clone().try_acquire_owned().ok(),
            method: request.method().to_string(),
            origin: String::new(),
            granted: NO_GRANT.to_owned(),
            path: request.uri().path().to_owned(),
            started: Instant::now(),
            span: span.clone(),
        };
        Box::new(tracing::Instrument::instrument(
            job.send(request, options),
            span,
        ))
    }
}

/// One request on its way.
struct Job {
    outbound: Arc<Outbound>,
    dispatch: String,
    attempt: u32,
    control: Option<Arc<ClaimControl>>,
    deadline: Option<Instant>,
    permit: Option<OwnedSemaphorePermit>,
    method: String,
    origin: String,
    /// The `allowed_outbound_hosts` entry the request matched, as the metrics' `origin` label
    /// ([`NO_GRANT`] until one matched).
    granted: String,
    path: String,
    started: Instant,
    span: tracing::Span,
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

    async fn send(
        mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
    ) -> SendResult {
        let uri = request.uri().clone();
        let scheme = match uri.scheme() {
            Some(s) if *s == UriScheme::HTTPS => Scheme::Https,
            Some(s) if *s == UriScheme::HTTP => Scheme::Http,
            _ => return Err(self.refuse("not http or https", HttpError::HttpProtocolError)),
        };
        let Some(raw_host) = uri.host() else {
            return Err(self.refuse("no host", HttpError::HttpRequestUriInvalid));
        };
        let host = raw_host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .trim_end_matches('.')
            .to_ascii_lowercase();
        let port = uri.port_u16().unwrap_or(scheme.default_port());
        self.origin = format!(
            "{}://{}:{port}",
            scheme.as_str(),
            raw_host.to_ascii_lowercase()
        );

        let limits = self.outbound.limits.clone();
        if self.permit.is_none() {
            return Err(self.refuse(
                &format!(
                    "more than {} requests in flight (http.max_concurrent)",
                    limits.max_concurrent
                ),
                HttpError::ConnectionLimitReached,
            ));
        }
        let Some(entry) = self
            .outbound
            .allow
            .iter()
            .find(|e| e.matches(scheme, &host, port))
            .cloned()
        else {
            return Err(self.refuse(
                "the origin is not in allowed_outbound_hosts",
                HttpError::HttpRequestDenied,
            ));
        };
        self.granted = entry.to_string();
        if let Some(length) = declared_length(&request)
            && length > limits.max_request_body
        {
            return Err(self.refuse(
                &format!(
                    "the request body of {length} bytes is over http.max_request_body of {} bytes",
                    limits.max_request_body
                ),
                HttpError::HttpRequestBodySize(Some(length)),
            ));
        }

        // Resolve and connect within the connect budget.
        let connect_budget = self.budget(
            limits.connect_timeout,
            options.and_then(|o| o.connect_timeout),
        );
        let connect = self.bounded(connect_budget, self.connect(&entry, &host, port));
        let stream = match connect.await {
            Ok(Ok(stream)) => stream,
            Ok(Err((why, err))) => return Err(self.refuse(&why, err)),
            Err(ended) => {
                return Err(self.ended(ended, "connecting", HttpError::ConnectionTimeout));
            }
        };
        let stream: Box<dyn Io> = match scheme {
            Scheme::Http => Box::new(stream),
            Scheme::Https => {
                let Some(tls) = self.outbound.tls.clone() else {
                    return Err(self.refuse("no TLS setup", HttpError::TlsProtocolError));
                };
                let name = match host.parse::<IpAddr>() {
                    Ok(ip) => rustls::pki_types::ServerName::from(ip),
                    Err(_) => match rustls::pki_types::ServerName::try_from(host.clone()) {
                        Ok(name) => name,
                        Err(_) => {
                            return Err(self.refuse(
                                "not a valid TLS server name",
                                HttpError::HttpRequestUriInvalid,
                            ));
                        }
                    },
                };
                let handshake = tokio_rustls::TlsConnector::from(tls).connect(name, stream);
                match self.bounded(connect_budget, handshake).await {
                    Ok(Ok(stream)) => Box::new(stream),
                    Ok(Err(e)) => {
                        let certificate = e
                            .get_ref()
                            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                            .is_some_and(|e| matches!(e, rustls::Error::InvalidCertificate(_)));
                        let err = if certificate {
                            HttpError::TlsCertificateError
                        } else {
                            HttpError::TlsProtocolError
                        };
                        return Err(self.refuse(&format!("TLS: {e}"), err));
                    }
                    Err(ended) => {
                        return Err(self.ended(ended, "in TLS", HttpError::ConnectionTimeout));
                    }
                }
            }
        };
        let handshake = hyper::client::conn::http1::handshake(TokioIo::new(stream));
        let (mut sender, conn) = match self.bounded(connect_budget, handshake).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => {
                return Err(self.refuse(&format!("HTTP handshake: {e}"), HttpError::from(e)));
            }
            Err(ended) => {
                return Err(self.ended(ended, "connecting", HttpError::ConnectionTimeout));
            }
        };

        // Origin-form on the wire: the scheme and authority are the Host header's business.
        let (mut parts, body) = request.into_parts();
        parts.uri = match uri.path_and_query() {
            Some(pq) => http::Uri::from(pq.clone()),
            None => http::Uri::from_static("/"),
        };
        let body = CappedRequest {
            inner: body,
            sent: 0,
            cap: limits.max_request_body,
        }
        .boxed_unsync();
        let request = http::Request::from_parts(parts, body);

        let first_byte = self.budget(
            limits.first_byte_timeout,
            options.and_then(|o| o.first_byte_timeout),
        );
        let between = self.budget(
            limits.between_bytes_timeout,
            options.and_then(|o| o.between_bytes_timeout),
        );
        // The connection is driven while the head is awaited, then handed back to run beside
        // the body.
        let mut conn = Box::pin(conn);
        let mut conn_done = false;
        let response = self.bounded(first_byte, async {
            let send = sender.send_request(request);
            tokio::pin!(send);
            loop {
                tokio::select! {
                    res = &mut send => break res,
                    done = &mut conn, if !conn_done => {
                        conn_done = true;
                        if let Err(e) = done {
                            break Err(e);
                        }
                    }
                }
            }
        });
        let response = match response.await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                // A cap our request body hit comes back as the body's error.
                let over = std::error::Error::source(&e)
                    .and_then(|s| s.downcast_ref::<HttpError>())
                    .and_then(|ours| match ours {
                        HttpError::HttpRequestBodySize(n) => Some(*n),
                        _ => None,
                    });
                let err = match over {
                    Some(sent) => {
                        return Err(self.refuse(
                            &format!(
                                "the request body passed http.max_request_body of {} bytes",
                                limits.max_request_body
                            ),
                            HttpError::HttpRequestBodySize(sent),
                        ));
                    }
                    None => HttpError::from(e),
                };
                return Err(self.refuse(&format!("{err}"), err));
            }
            Err(ended) => {
                return Err(self.ended(
                    ended,
                    "waiting for the response",
                    HttpError::HttpResponseTimeout,
                ));
            }
        };
        let status = response.status().as_u16();
        if let Some(length) = response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            && length > limits.max_response_body
        {
            return Err(self.refuse(
                &format!(
                    "status {status}: the response body of {length} bytes is over http.max_response_body of {} bytes",
                    limits.max_response_body
                ),
                HttpError::HttpResponseBodySize(Some(length)),
            ));
        }
        let response = response.map(|incoming| {
            GuardedResponse {
                incoming,
                cap: limits.max_response_body,
                received: 0,
                between,
                timer: Box::pin(tokio::time::sleep(between)),
                deadline: self.deadline,
                cancelled: self.control.clone().map(|control| {
                    Box::pin(async move { control.cancelled().await })
                        as Pin<Box<dyn Future<Output = ()> + Send>>
                }),
                status,
                job: Some(self),
                failed: None,
            }
            .boxed_unsync()
        });
        let io: IoFuture = Box::new(async move {
            if conn_done {
                Ok(())
            } else {
                conn.await.map_err(HttpError::from)
            }
        });
        Ok((response, io))
    }

    /// Resolves `host`, keeps the addresses `entry` may reach, and connects to the first that
    /// answers.
    async fn connect(
        &self,
        entry: &OutboundHost,
        host: &str,
        port: u16,
    ) -> Result<TcpStream, (String, HttpError)> {
        let fixed = host
            .parse::<IpAddr>()
            .ok()
            .or_else(|| self.outbound.hosts.get(host).copied());
        let addrs: Vec<SocketAddr> = match fixed {
            Some(ip) => vec![SocketAddr::new(ip, port)],
            None => match tokio::net::lookup_host((host, port)).await {
                Ok(found) => found.collect(),
                Err(e) => {
                    return Err((
                        format!("cannot resolve `{host}`: {e}"),
                        HttpError::DnsError {
                            rcode: Some("address not available".into()),
                            info_code: None,
                        },
                    ));
                }
            },
        };
        let (allowed, refused): (Vec<SocketAddr>, Vec<SocketAddr>) = addrs
            .into_iter()
            .partition(|a| may_reach(entry, &self.outbound.allow, a.ip()));
        if allowed.is_empty() {
            let list: Vec<String> = refused.iter().map(|a| a.ip().to_string()).collect();
            return Err((
                format!(
                    "`{host}` resolves to {}, which is not a public address; name the address \
                     (or localhost) in allowed_outbound_hosts to reach it",
                    if list.is_empty() {
                        "nothing".into()
                    } else {
                        list.join(", ")
                    }
                ),
                HttpError::DestinationIpProhibited,
            ));
        }
        let mut last = None;
        for addr in allowed {
            match TcpStream::connect(addr).await {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Err(e) => last = Some(e),
            }
        }
        Err((
            format!(
                "cannot connect: {}",
                last.map(|e| e.to_string()).unwrap_or_default()
            ),
            HttpError::ConnectionRefused,
        ))
    }

    fn finish(&self, status: u16, bytes: u64, outcome: Option<&str>) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.span.record("http.response.status_code", status);
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

/// The byte stream under an HTTP connection: TCP, or TLS over TCP.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Io for T {}

fn declared_length(request: &http::Request<WasiBody>) -> Option<u64> {
    request
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// Whether `entry` lets a request reach `ip`: any public address; a non-public one only when
/// some entry names it literally, or `entry` is `localhost` and `ip` is loopback.
pub fn may_reach(entry: &OutboundHost, all: &[OutboundHost], ip: IpAddr) -> bool {
    let ip = canonical(ip);
    if is_public(ip) {
        return true;
    }
    if matches!(&entry.host, HostPattern::Name(name) if name == "localhost") && ip.is_loopback() {
        return true;
    }
    all.iter()
        .any(|e| matches!(e.host, HostPattern::Ip(named) if canonical(named) == ip))
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// Whether an address is globally routable: not loopback, private, link-local, shared,
/// documentation, benchmarking, multicast, reserved or unspecified. (std's `is_global` is not
/// stable yet; this follows the IANA special-purpose registries.)
pub fn is_public(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(a == 0 // "this network"
        || a == 10
        || a == 127
        || (a == 100 && (64..128).contains(&b)) // shared (carrier-grade NAT)
        || (a == 169 && b == 254) // link-local, cloud metadata
        || (a == 172 && (16..32).contains(&b))
        || (a == 192 && b == 0 && c == 0) // protocol assignments
        || (a == 192 && b == 0 && c == 2) // documentation
        || (a == 192 && b == 168)
        || (a == 198 && (18..20).contains(&b)) // benchmarking
        || (a == 198 && b == 51 && c == 100) // documentation
        || (a == 203 && b == 0 && c == 113) // documentation
        || a >= 224) // multicast, reserved, broadcast
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() {
        return false;
    }
    // NAT64 and 6to4 carry an IPv4 address: judge that one.
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        let v4 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
        return is_public_v4(v4);
    }
    if s[0] == 0x2002 {
        let v4 = Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8);
        return is_public_v4(v4);
    }
    !((s[0] & 0xfe00) == 0xfc00 // unique local
        || (s[0] & 0xffc0) == 0xfe80 // link-local
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
        || s[0..6] == [0, 0, 0, 0, 0, 0]) // IPv4-compatible and other reserved
}

/// The request body, capped.
struct CappedRequest {
    inner: WasiBody,
    sent: u64,
    cap: u64,
}

impl Body for CappedRequest {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            self.sent += data.len() as u64;
            if self.sent > self.cap {
                return Poll::Ready(Some(Err(HttpError::HttpRequestBodySize(Some(self.sent)))));
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The response body as the guest reads it: capped, timed, cancellable, and logged once when
/// it ends or is dropped.
struct GuardedResponse {
    incoming: hyper::body::Incoming,
    cap: u64,
    received: u64,
    between: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
    deadline: Option<Instant>,
    cancelled: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    status: u16,
    /// Taken when the line is logged (holds the permit until then).
    job: Option<Job>,
    failed: Option<String>,
}

impl GuardedResponse {
    fn end(&mut self, why: Option<String>) {
        if let Some(job) = self.job.take() {
            job.finish(self.status, self.received, why.as_deref());
        }
    }

    fn fail(
        &mut self,
        why: String,
        err: HttpError,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        self.failed = Some(why.clone());
        self.end(Some(why));
        Poll::Ready(Some(Err(err)))
    }

    fn next_timer(&self) -> tokio::time::Instant {
        let mut at = Instant::now() + self.between;
        if let Some(deadline) = self.deadline {
            at = at.min(deadline);
        }
        tokio::time::Instant::from_std(at)
    }
}

impl Body for GuardedResponse {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        if self.failed.is_some() {
            return Poll::Ready(None);
        }
        if let Some(cancelled) = self.cancelled.as_mut()
            && cancelled.as_mut().poll(cx).is_ready()
        {
            return self.fail(
                "cancelled while reading the body: the claim must stop".into(),
                HttpError::InternalError(Some("cancelled by the host".into())),
            );
        }
        match Pin::new(&mut self.incoming).poll_frame(cx) {
            Poll::Ready(None) => {
                self.end(None);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                let why = format!("the body failed: {e}");
                self.fail(why, HttpError::from(e))
            }
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.received += data.len() as u64;
                    if self.received > self.cap {
                        let cap = self.cap;
                        let received = self.received;
                        return self.fail(
                            format!(
                                "the response body passed http.max_response_body of {cap} bytes"
                            ),
                            HttpError::HttpResponseBodySize(Some(received)),
                        );
                    }
                }
                let at = self.next_timer();
                self.timer.as_mut().reset(at);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                if self.timer.as_mut().poll(cx).is_ready() {
                    let past_deadline = self.deadline.is_some_and(|d| Instant::now() >= d);
                    let why = if past_deadline {
                        "the dispatch's deadline passed while reading the body"
                    } else {
                        "no body bytes within the between-bytes timeout"
                    };
                    return self.fail(why.into(), HttpError::ConnectionReadTimeout);
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed.is_some() || self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}

impl Drop for GuardedResponse {
    fn drop(&mut self) {
        if self.job.is_some() {
            self.end(Some("the guest dropped the body before its end".into()));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn entry(text: &str) -> OutboundHost {
        text.parse().unwrap()
    }

    #[test]
    fn only_public_addresses_pass_unless_named() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in [
            "1.1.1.1",
            "93.184.216.34",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
        let api = entry("https://api.example.com");
        let all = vec![api.clone()];
        assert!(!may_reach(&api, &all, "127.0.0.1".parse().unwrap()));
        assert!(!may_reach(&api, &all, "169.254.169.254".parse().unwrap()));
        let named = vec![api.clone(), entry("http://10.0.0.5:*")];
        assert!(may_reach(&api, &named, "10.0.0.5".parse().unwrap()));
        assert!(!may_reach(&api, &named, "10.0.0.6".parse().unwrap()));
        let local = entry("http://localhost:11434");
        assert!(may_reach(
            &local,
            std::slice::from_ref(&local),
            "127.0.0.1".parse().unwrap()
        ));
        assert!(may_reach(
            &local,
            std::slice::from_ref(&local),
            "::1".parse().unwrap()
        ));
        assert!(!may_reach(
            &local,
            std::slice::from_ref(&local),
            "10.0.0.1".parse().unwrap()
        ));
    }
}
