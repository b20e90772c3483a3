//! One request, step by step: admit it, connect (resolve, the address rule, TCP), secure it
//! (TLS for https), shake hands, exchange the head, and hand the guest the response. Each step
//! logs its own refusal (through [`Job::refuse`]) and returns the `wasi:http` error.

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http::uri::Scheme as UriScheme;
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use tokio::net::TcpStream;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody};

use super::bodies::{CappedRequest, GuardedResponse};
use super::policy::Carrier;
use super::{IoFuture, Job, SendResult};
use crate::config::outbound::Scheme;

/// The body sent on the wire.
type Outgoing = UnsyncBoxBody<Bytes, HttpError>;
/// The HTTP/1.1 connection, driven beside the exchange.
type Connection = hyper::client::conn::http1::Connection<TokioIo<Box<dyn Io>>, Outgoing>;

/// The byte stream under an HTTP connection: TCP, or TLS over TCP.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Io for T {}

/// Where an admitted request goes.
pub(super) struct Target {
    pub(super) scheme: Scheme,
    /// Lowercase, without brackets or a trailing dot.
    pub(super) host: String,
    pub(super) port: u16,
}

impl Job {
    /// Sends `request`: each step in turn, each bounded by its budget.
    pub(super) async fn send(
        mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
    ) -> SendResult {
        let target = self.admit(&request)?;
        self.meter = super::genai::Meter::start(
            &self.outbound.models,
            &self.outbound.plugin,
            (target.scheme, &target.host, target.port),
            request.method(),
            request.uri().path(),
            self.usage.clone(),
        );
        self.wait_for_limits(&target).await?;
        let limits = self.outbound.limits.clone();
        let connect_budget = self.budget(
            limits.connect_timeout,
            options.and_then(|o| o.connect_timeout),
        );
        let stream = self.connect(&target, connect_budget).await?;
        let stream = self.secure(&target, stream, connect_budget).await?;
        let (sender, connection) = self.handshake(stream, connect_budget).await?;
        let tee = self.meter.as_ref().map(|m| m.request_tee());
        let request = outgoing(request, limits.max_request_body, tee);
        // Taken now: each is clamped to the time the dispatch has left after connecting.
        let first_byte = self.budget(
            limits.first_byte_timeout,
            options.and_then(|o| o.first_byte_timeout),
        );
        let between = self.budget(
            limits.between_bytes_timeout,
            options.and_then(|o| o.between_bytes_timeout),
        );
        let (response, connection) = self
            .exchange(sender, connection, request, first_byte)
            .await?;
        self.respond(response, connection, between)
    }

    /// Admits the request: http or https with a host, a permit among the instance's requests
    /// in flight, an `allowed_outbound_hosts` entry for its origin, a declared body within the
    /// cap. Records its origin for the log line.
    pub(super) fn admit(&mut self, request: &http::Request<WasiBody>) -> Result<Target, HttpError> {
        let uri = request.uri();
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
        self.origin = self
            .secrets
            .scrub(&format!(
                "{}://{}:{port}",
                scheme.as_str(),
                raw_host.to_ascii_lowercase()
            ))
            .into_owned();
        let limits = &self.outbound.limits;
        if self.permit.is_none() {
            return Err(self.refuse(
                &format!(
                    "more than {} requests in flight (http.max_concurrent)",
                    limits.max_concurrent
                ),
                HttpError::ConnectionLimitReached,
            ));
        }
        let Some(entry) = self.policy.admit_http(scheme, &host, port) else {
            return Err(self.refuse(
                "the origin is not in allowed_outbound_hosts",
                HttpError::HttpRequestDenied,
            ));
        };
        self.granted = entry.to_string();
        if let Some(length) = content_length(request.headers())
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
        Ok(Target { scheme, host, port })
    }

    /// Resolves the target and connects, within `budget`, to the first address the policy
    /// lets it reach that answers.
    async fn connect(&self, target: &Target, budget: Duration) -> Result<TcpStream, HttpError> {
        match self.bounded(budget, self.dial(target)).await {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err((why, err))) => Err(self.refuse(&why, err)),
            Err(ended) => Err(self.ended(ended, "connecting", HttpError::ConnectionTimeout)),
        }
    }

    /// [`Job::connect`] without its budget: the refusal's text and error.
    async fn dial(&self, target: &Target) -> Result<TcpStream, (String, HttpError)> {
        let Target { scheme, host, port } = target;
        let policy = &self.policy;
        let addrs = policy.resolve(host, *port).await.map_err(|e| {
            (
                format!("cannot resolve `{host}`: {e}"),
                HttpError::DnsError {
                    rcode: Some("address not available".into()),
                    info_code: None,
                },
            )
        })?;
        let (allowed, refused): (Vec<SocketAddr>, Vec<SocketAddr>) = addrs
            .into_iter()
            .partition(|a| policy.may_reach(Carrier::Http(*scheme), *a));
        if allowed.is_empty() {
            let list: Vec<String> = refused.iter().map(|a| a.ip().to_string()).collect();
            return Err((
                format!(
                    "`{host}` resolves to {}, which is not a public address; name the address \
                     (or localhost) in allowed_outbound_hosts, with this scheme and port, to \
                     reach it",
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

    /// The stream as the request goes over it: as it is for http, after a TLS handshake
    /// within `budget` for https.
    async fn secure(
        &self,
        target: &Target,
        stream: TcpStream,
        budget: Duration,
    ) -> Result<Box<dyn Io>, HttpError> {
        if target.scheme == Scheme::Http {
            return Ok(Box::new(stream));
        }
        let Some(tls) = self.outbound.tls.clone() else {
            return Err(self.refuse("no TLS setup", HttpError::TlsProtocolError));
        };
        let name = match target.host.parse::<IpAddr>() {
            Ok(ip) => rustls::pki_types::ServerName::from(ip),
            Err(_) => {
                rustls::pki_types::ServerName::try_from(target.host.clone()).map_err(|_| {
                    self.refuse(
                        "not a valid TLS server name",
                        HttpError::HttpRequestUriInvalid,
                    )
                })?
            }
        };
        let handshake = tokio_rustls::TlsConnector::from(tls).connect(name, stream);
        match self.bounded(budget, handshake).await {
            Ok(Ok(stream)) => Ok(Box::new(stream)),
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
                Err(self.refuse(&format!("TLS: {e}"), err))
            }
            Err(ended) => Err(self.ended(ended, "in TLS", HttpError::ConnectionTimeout)),
        }
    }

    /// The HTTP/1.1 handshake over `stream`, within `budget`.
    async fn handshake(
        &self,
        stream: Box<dyn Io>,
        budget: Duration,
    ) -> Result<
        (
            hyper::client::conn::http1::SendRequest<Outgoing>,
            Connection,
        ),
        HttpError,
    > {
        let handshake = hyper::client::conn::http1::handshake(TokioIo::new(stream));
        match self.bounded(budget, handshake).await {
            Ok(Ok(pair)) => Ok(pair),
            Ok(Err(e)) => Err(self.refuse(&format!("HTTP handshake: {e}"), HttpError::from(e))),
            Err(ended) => Err(self.ended(ended, "connecting", HttpError::ConnectionTimeout)),
        }
    }

    /// Sends the request and waits, within `first_byte`, for the response head, driving the
    /// connection meanwhile. Returns the head and the connection when it still runs (it goes
    /// on beside the body).
    async fn exchange(
        &self,
        mut sender: hyper::client::conn::http1::SendRequest<Outgoing>,
        connection: Connection,
        request: http::Request<Outgoing>,
        first_byte: Duration,
    ) -> Result<
        (
            http::Response<hyper::body::Incoming>,
            Option<Pin<Box<Connection>>>,
        ),
        HttpError,
    > {
        let mut connection = Box::pin(connection);
        let mut connection_done = false;
        let response = self.bounded(first_byte, async {
            let send = sender.send_request(request);
            tokio::pin!(send);
            loop {
                tokio::select! {
                    res = &mut send => break res,
                    done = &mut connection, if !connection_done => {
                        connection_done = true;
                        if let Err(e) = done {
                            break Err(e);
                        }
                    }
                }
            }
        });
        match response.await {
            Ok(Ok(response)) => Ok((response, (!connection_done).then_some(connection))),
            Ok(Err(e)) => Err(self.failed_exchange(e)),
            Err(ended) => Err(self.ended(
                ended,
                "waiting for the response",
                HttpError::HttpResponseTimeout,
            )),
        }
    }

    /// The refusal of an exchange that failed: a cap our request body hit comes back as the
    /// body's error, and is named as the cap.
    fn failed_exchange(&self, e: hyper::Error) -> HttpError {
        let over = std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<HttpError>())
            .and_then(|ours| match ours {
                HttpError::HttpRequestBodySize(n) => Some(*n),
                _ => None,
            });
        match over {
            Some(sent) => self.refuse(
                &format!(
                    "the request body passed http.max_request_body of {} bytes",
                    self.outbound.limits.max_request_body
                ),
                HttpError::HttpRequestBodySize(sent),
            ),
            None => {
                let err = HttpError::from(e);
                self.refuse(&format!("{err}"), err)
            }
        }
    }

    /// The response the guest gets: refused when its declared length is over the cap, else
    /// with its body guarded ([`GuardedResponse`], which logs the request's line when it ends)
    /// and the connection driven beside it.
    fn respond(
        mut self,
        response: http::Response<hyper::body::Incoming>,
        connection: Option<Pin<Box<Connection>>>,
        between: Duration,
    ) -> SendResult {
        let status = response.status().as_u16();
        self.park_if_asked(status, response.headers());
        if let Some(meter) = self.meter.as_mut() {
            meter.respond(status, response.headers());
        }
        let cap = self.outbound.limits.max_response_body;
        if let Some(length) = content_length(response.headers())
            && length > cap
        {
            return Err(self.refuse(
                &format!(
                    "status {status}: the response body of {length} bytes is over \
                     http.max_response_body of {cap} bytes"
                ),
                HttpError::HttpResponseBodySize(Some(length)),
            ));
        }
        let response = response.map(|incoming| {
            GuardedResponse::new(incoming, self, status, cap, between).boxed_unsync()
        });
        let io: IoFuture = Box::new(async move {
            match connection {
                Some(connection) => connection.await.map_err(HttpError::from),
                None => Ok(()),
            }
        });
        Ok((response, io))
    }
}

/// The request as it goes on the wire: origin-form (the scheme and authority are the Host
/// header's business), its body capped at `cap` bytes.
fn outgoing(
    request: http::Request<WasiBody>,
    cap: u64,
    tee: Option<std::sync::Arc<std::sync::Mutex<Vec<u8>>>>,
) -> http::Request<Outgoing> {
    let (mut parts, body) = request.into_parts();
    parts.uri = match parts.uri.path_and_query() {
        Some(pq) => http::Uri::from(pq.clone()),
        None => http::Uri::from_static("/"),
    };
    http::Request::from_parts(
        parts,
        CappedRequest::new(body, cap).with_tee(tee).boxed_unsync(),
    )
}

/// The `content-length` a message declares, if it declares one that parses.
fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}
