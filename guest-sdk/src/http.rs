//! Outbound HTTP (feature `http`): a small blocking client over `wasi:http/outgoing-handler`.
//!
//! A handler runs synchronously, so a request blocks until its response body has been read in
//! full (or a limit is hit). The host decides where a request may go: it is refused unless the
//! origin is in the plugin's `allowed_outbound_hosts` ([`HttpError::Denied`]), and the host does
//! TLS for `https` URLs.
//!
//! ```no_run
//! # fn demo() -> Result<(), homing_guest::http::HttpError> {
//! use std::time::Duration;
//! use homing_guest::http::Request;
//!
//! let response = Request::get("https://api.example.com/v1/status")
//!     .header("accept", "text/plain")
//!     .timeout(Duration::from_secs(10))
//!     .send()?;
//! if response.is_success() {
//!     homing_guest::info!("status page: {}", response.text()?);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! [`Request::send_streaming`] returns at the response's headers instead, and the body is read
//! as it arrives ([`StreamingResponse::read_chunk`]): for server-sent events, a model's tokens.
//!
//! With the `json` feature as well, [`Request::json`] sends a serialized body (and sets
//! `content-type: application/json`) and [`Response::json`] parses one.
//!
//! Limits: a whole request (from sending to the last body byte) has a deadline, 30 seconds
//! unless [`Request::timeout`] says otherwise, also passed to the host as the connect,
//! first-byte and between-bytes timeouts; a response body larger than 8 MiB (or
//! [`Request::max_response_bytes`]) fails with [`HttpError::ResponseTooLarge`]. The request body
//! is written in chunks of at most 4096 bytes.
//!
//! Errors name what failed ([`HttpError`]) and carry the `wasi:http` `error-code` name when the
//! host reported one ([`HttpError::code`]); they never include header values or bodies, so an
//! `authorization` header cannot leak through an error message.

use std::fmt;
use std::time::{Duration, Instant};

use wasip2::clocks::monotonic_clock;
use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    ErrorCode, Fields, IncomingBody, IncomingResponse, Method as WasiMethod, OutgoingBody,
    OutgoingRequest, RequestOptions, Scheme,
};
use wasip2::io::poll;
use wasip2::io::streams::{InputStream, StreamError};

/// The deadline of a request unless [`Request::timeout`] sets one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest response body read unless [`Request::max_response_bytes`] sets another limit.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 8 << 20;

/// The largest chunk handed to one `blocking-write-and-flush` (the WASI limit is 4096).
const WRITE_CHUNK: usize = 4096;

/// The most bytes asked of the response stream per read.
const READ_CHUNK: u64 = 64 << 10;

/// An HTTP method.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Method {
    /// `GET`
    Get,
    /// `HEAD`
    Head,
    /// `POST`
    Post,
    /// `PUT`
    Put,
    /// `DELETE`
    Delete,
    /// `PATCH`
    Patch,
    /// `OPTIONS`
    Options,
    /// Any other method, as written (the host checks it is a valid token).
    Other(String),
}

impl Method {
    /// The method for a name such as `"GET"` or `"post"` (standard names in any case; anything
    /// else becomes [`Method::Other`] as given).
    pub fn parse(name: &str) -> Method {
        match name.to_ascii_uppercase().as_str() {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "PATCH" => Method::Patch,
            "OPTIONS" => Method::Options,
            _ => Method::Other(name.to_owned()),
        }
    }

    fn to_wasi(&self) -> WasiMethod {
        match self {
            Method::Get => WasiMethod::Get,
            Method::Head => WasiMethod::Head,
            Method::Post => WasiMethod::Post,
            Method::Put => WasiMethod::Put,
            Method::Delete => WasiMethod::Delete,
            Method::Patch => WasiMethod::Patch,
            Method::Options => WasiMethod::Options,
            Method::Other(name) => WasiMethod::Other(name.clone()),
        }
    }
}

/// Why a request failed. Host-reported failures keep the `wasi:http` `error-code` name
/// ([`HttpError::code`]); the text never contains header values or bodies.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HttpError {
    /// The request could not be built: a URL that is not `http://` or `https://` with a host,
    /// an invalid header name or value, an invalid method. The text says which.
    InvalidRequest(String),
    /// The host refused the request (`HTTP-request-denied`): its origin is not in the plugin's
    /// `allowed_outbound_hosts`, or it resolves to an address the host does not allow.
    Denied,
    /// The name did not resolve (`DNS-timeout`, `DNS-error`, `destination-not-found`).
    Dns {
        /// The `wasi:http` error-code name.
        code: &'static str,
    },
    /// No connection (`connection-refused`, `destination-unavailable`,
    /// `destination-IP-prohibited`, ...), or it broke (`connection-terminated`).
    Connect {
        /// The `wasi:http` error-code name.
        code: &'static str,
    },
    /// A deadline passed: the host's (`connection-timeout`, `HTTP-response-timeout`, ...) or
    /// the request's own ([`Request::timeout`], code `timeout`).
    Timeout {
        /// The `wasi:http` error-code name, or `timeout` for the request's own deadline.
        code: &'static str,
    },
    /// TLS failed (`TLS-protocol-error`, `TLS-certificate-error`, `TLS-alert-received`).
    Tls {
        /// The `wasi:http` error-code name.
        code: &'static str,
    },
    /// The response body is larger than the request's limit (bytes).
    ResponseTooLarge {
        /// The limit that was passed.
        limit: usize,
    },
    /// Any other failure the host reported (protocol errors, size limits on its side,
    /// configuration and internal errors).
    Failed {
        /// The `wasi:http` error-code name.
        code: &'static str,
        /// The host's detail text, when it gave one.
        detail: Option<String>,
    },
    /// The response body is not what the caller asked it to be (not UTF-8, not the JSON
    /// expected), or a request body did not serialize. The text says why.
    Decode(String),
}

impl HttpError {
    /// The `wasi:http` `error-code` name of a host-reported failure (`HTTP-request-denied`,
    /// `connection-refused`, ...), `timeout` for the request's own deadline, or `None` for
    /// failures found in the guest.
    pub fn code(&self) -> Option<&'static str> {
        match self {
            HttpError::Denied => Some("HTTP-request-denied"),
            HttpError::Dns { code }
            | HttpError::Connect { code }
            | HttpError::Timeout { code }
            | HttpError::Tls { code }
            | HttpError::Failed { code, .. } => Some(code),
            HttpError::InvalidRequest(_)
            | HttpError::ResponseTooLarge { .. }
            | HttpError::Decode(_) => None,
        }
    }

    /// Whether trying the same request again later may succeed (DNS, connection and timeout
    /// failures).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            HttpError::Dns { .. } | HttpError::Connect { .. } | HttpError::Timeout { .. }
        )
    }

    fn from_code(code: &ErrorCode) -> HttpError {
        let name = code_name(code);
        match code {
            ErrorCode::HttpRequestDenied => HttpError::Denied,
            ErrorCode::DnsTimeout | ErrorCode::DnsError(_) | ErrorCode::DestinationNotFound => {
                HttpError::Dns { code: name }
            }
            ErrorCode::DestinationUnavailable
            | ErrorCode::DestinationIpProhibited
            | ErrorCode::DestinationIpUnroutable
            | ErrorCode::ConnectionRefused
            | ErrorCode::ConnectionTerminated
            | ErrorCode::ConnectionLimitReached => HttpError::Connect { code: name },
            ErrorCode::ConnectionTimeout
            | ErrorCode::ConnectionReadTimeout
            | ErrorCode::ConnectionWriteTimeout
            | ErrorCode::HttpResponseTimeout => HttpError::Timeout { code: name },
            ErrorCode::TlsProtocolError
            | ErrorCode::TlsCertificateError
            | ErrorCode::TlsAlertReceived(_) => HttpError::Tls { code: name },
            ErrorCode::InternalError(Some(detail)) => HttpError::Failed {
                code: name,
                detail: Some(detail.clone()),
            },
            _ => HttpError::Failed {
                code: name,
                detail: None,
            },
        }
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::InvalidRequest(why) => write!(f, "http: invalid request: {why}"),
            HttpError::Denied => write!(
                f,
                "http: HTTP-request-denied: the host does not allow this destination \
                 (see allowed_outbound_hosts)"
            ),
            HttpError::Dns { code } => write!(f, "http: {code}: the name did not resolve"),
            HttpError::Connect { code } => write!(f, "http: {code}: no connection"),
            HttpError::Timeout { code } => write!(f, "http: {code}: the request timed out"),
            HttpError::Tls { code } => write!(f, "http: {code}: TLS failed"),
            HttpError::ResponseTooLarge { limit } => {
                write!(f, "http: the response body is larger than {limit} bytes")
            }
            HttpError::Failed { code, detail } => match detail {
                Some(detail) => write!(f, "http: {code}: {detail}"),
                None => write!(f, "http: {code}"),
            },
            HttpError::Decode(why) => write!(f, "http: {why}"),
        }
    }
}

impl std::error::Error for HttpError {}

/// Lets `?` carry an [`HttpError`] out of a handler (which returns `Result<_, String>`).
impl From<HttpError> for String {
    fn from(error: HttpError) -> String {
        error.to_string()
    }
}

/// The WIT name of a `wasi:http` `error-code` case.
fn code_name(code: &ErrorCode) -> &'static str {
    match code {
        ErrorCode::DnsTimeout => "DNS-timeout",
        ErrorCode::DnsError(_) => "DNS-error",
        ErrorCode::DestinationNotFound => "destination-not-found",
        ErrorCode::DestinationUnavailable => "destination-unavailable",
        ErrorCode::DestinationIpProhibited => "destination-IP-prohibited",
        ErrorCode::DestinationIpUnroutable => "destination-IP-unroutable",
        ErrorCode::ConnectionRefused => "connection-refused",
        ErrorCode::ConnectionTerminated => "connection-terminated",
        ErrorCode::ConnectionTimeout => "connection-timeout",
        ErrorCode::ConnectionReadTimeout => "connection-read-timeout",
        ErrorCode::ConnectionWriteTimeout => "connection-write-timeout",
        ErrorCode::ConnectionLimitReached => "connection-limit-reached",
        ErrorCode::TlsProtocolError => "TLS-protocol-error",
        ErrorCode::TlsCertificateError => "TLS-certificate-error",
        ErrorCode::TlsAlertReceived(_) => "TLS-alert-received",
        ErrorCode::HttpRequestDenied => "HTTP-request-denied",
        ErrorCode::HttpRequestLengthRequired => "HTTP-request-length-required",
        ErrorCode::HttpRequestBodySize(_) => "HTTP-request-body-size",
        ErrorCode::HttpRequestMethodInvalid => "HTTP-request-method-invalid",
        ErrorCode::HttpRequestUriInvalid => "HTTP-request-URI-invalid",
        ErrorCode::HttpRequestUriTooLong => "HTTP-request-URI-too-long",
        ErrorCode::HttpRequestHeaderSectionSize(_) => "HTTP-request-header-section-size",
        ErrorCode::HttpRequestHeaderSize(_) => "HTTP-request-header-size",
        ErrorCode::HttpRequestTrailerSectionSize(_) => "HTTP-request-trailer-section-size",
        ErrorCode::HttpRequestTrailerSize(_) => "HTTP-request-trailer-size",
        ErrorCode::HttpResponseIncomplete => "HTTP-response-incomplete",
        ErrorCode::HttpResponseHeaderSectionSize(_) => "HTTP-response-header-section-size",
        ErrorCode::HttpResponseHeaderSize(_) => "HTTP-response-header-size",
        ErrorCode::HttpResponseBodySize(_) => "HTTP-response-body-size",
        ErrorCode::HttpResponseTrailerSectionSize(_) => "HTTP-response-trailer-section-size",
        ErrorCode::HttpResponseTrailerSize(_) => "HTTP-response-trailer-size",
        ErrorCode::HttpResponseTransferCoding(_) => "HTTP-response-transfer-coding",
        ErrorCode::HttpResponseContentCoding(_) => "HTTP-response-content-coding",
        ErrorCode::HttpResponseTimeout => "HTTP-response-timeout",
        ErrorCode::HttpUpgradeFailed => "HTTP-upgrade-failed",
        ErrorCode::HttpProtocolError => "HTTP-protocol-error",
        ErrorCode::LoopDetected => "loop-detected",
        ErrorCode::ConfigurationError => "configuration-error",
        ErrorCode::InternalError(_) => "internal-error",
    }
}

/// An outbound request, built up and then [sent](Request::send).
#[derive(Clone)]
pub struct Request {
    method: Method,
    url: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    timeout: Duration,
    max_response_bytes: usize,
}

/// Header values stay out of `Debug` output: they may hold credentials.
impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Request")
            .field("method", &self.method)
            .field("url", &self.url)
            .field("header_names", &names)
            .field("body_len", &self.body.len())
            .field("timeout", &self.timeout)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish()
    }
}

impl Request {
    /// A request with this method to `url` (`http://` or `https://`, a host, an optional port,
    /// path and query).
    pub fn new(method: Method, url: impl Into<String>) -> Request {
        Request {
            method,
            url: url.into(),
            headers: Vec::new(),
            body: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }

    /// A `GET` request.
    pub fn get(url: impl Into<String>) -> Request {
        Request::new(Method::Get, url)
    }

    /// A `POST` request.
    pub fn post(url: impl Into<String>) -> Request {
        Request::new(Method::Post, url)
    }

    /// A `PUT` request.
    pub fn put(url: impl Into<String>) -> Request {
        Request::new(Method::Put, url)
    }

    /// A `DELETE` request.
    pub fn delete(url: impl Into<String>) -> Request {
        Request::new(Method::Delete, url)
    }

    /// Adds a header (a name may repeat). `host`, `connection` and other hop-by-hop headers
    /// are the host's to set; it refuses them.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Request {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Adds `authorization: Bearer <token>`.
    pub fn bearer_auth(self, token: &str) -> Request {
        self.header("authorization", format!("Bearer {token}"))
    }

    /// Sets the body. A `content-length` header is added when sent, unless one was set.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Request {
        self.body = body.into();
        self
    }

    /// The deadline for the whole request, from sending to the last byte of the response
    /// ([`DEFAULT_TIMEOUT`] unless set).
    pub fn timeout(mut self, timeout: Duration) -> Request {
        self.timeout = timeout;
        self
    }

    /// The largest response body to accept ([`DEFAULT_MAX_RESPONSE_BYTES`] unless set).
    pub fn max_response_bytes(mut self, limit: usize) -> Request {
        self.max_response_bytes = limit;
        self
    }

    /// Sends the request and reads the whole response.
    ///
    /// # Errors
    ///
    /// An [`HttpError`] naming what failed: the request could not be built, the host denied
    /// it, the name did not resolve, no connection, a timeout, TLS, a body over the limit, or
    /// another `wasi:http` error.
    pub fn send(self) -> Result<Response, HttpError> {
        let limit = self.max_response_bytes;
        let (response, deadline) = self.start()?;
        read_response(response, deadline, limit)
    }

    /// Sends the request and returns as soon as the response's status and headers arrive; the
    /// body is read piece by piece with [`StreamingResponse::read_chunk`] (or
    /// [`StreamingResponse::chunks`]), as the server sends it. For server-sent events and other
    /// streamed answers (a model's tokens). The request's deadline ([`Request::timeout`]) and
    /// size limit ([`Request::max_response_bytes`]) still cover the whole body.
    ///
    /// # Errors
    ///
    /// Those of [`Request::send`] up to the response's headers; reading the body fails later,
    /// from [`StreamingResponse::read_chunk`].
    pub fn send_streaming(self) -> Result<StreamingResponse, HttpError> {
        let limit = self.max_response_bytes;
        let (response, deadline) = self.start()?;
        StreamingResponse::new(response, deadline, limit)
    }

    /// Sends the request and waits for the response's head; returns it with the deadline.
    fn start(self) -> Result<(IncomingResponse, Instant), HttpError> {
        let deadline = Instant::now() + self.timeout;
        let target = Target::parse(&self.url)?;
        let mut headers = self.headers;
        let has_length = headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("content-length"));
        if !self.body.is_empty() && !has_length {
            headers.push((
                "content-length".to_owned(),
                self.body.len().to_string().into_bytes(),
            ));
        }
        let fields = Fields::from_list(&headers).map_err(|e| {
            HttpError::InvalidRequest(format!("a header is not allowed or not valid ({e:?})"))
        })?;
        let request = OutgoingRequest::new(fields);
        request
            .set_method(&self.method.to_wasi())
            .map_err(|()| HttpError::InvalidRequest("the method is not valid".to_owned()))?;
        request
            .set_scheme(Some(&target.scheme))
            .map_err(|()| HttpError::InvalidRequest("the scheme is not valid".to_owned()))?;
        request
            .set_authority(Some(&target.authority))
            .map_err(|()| HttpError::InvalidRequest("the host or port is not valid".to_owned()))?;
        request
            .set_path_with_query(Some(&target.path_with_query))
            .map_err(|()| HttpError::InvalidRequest("the path is not valid".to_owned()))?;
        let body = request
            .body()
            .map_err(|()| HttpError::InvalidRequest("no request body".to_owned()))?;

        let options = RequestOptions::new();
        let nanos = u64::try_from(self.timeout.as_nanos()).unwrap_or(u64::MAX);
        // A host may not support every timeout; the request's own deadline still holds.
        let _ = options.set_connect_timeout(Some(nanos));
        let _ = options.set_first_byte_timeout(Some(nanos));
        let _ = options.set_between_bytes_timeout(Some(nanos));

        let pending = outgoing_handler::handle(request, Some(options))
            .map_err(|code| HttpError::from_code(&code))?;
        write_body(body, &self.body)?;

        let response = loop {
            if let Some(ready) = pending.get() {
                break ready
                    .map_err(|()| HttpError::Failed {
                        code: "internal-error",
                        detail: Some("the response was already taken".to_owned()),
                    })?
                    .map_err(|code| HttpError::from_code(&code))?;
            }
            let ready = pending.subscribe();
            wait(&ready, deadline)?;
        };
        Ok((response, deadline))
    }
}

/// Writes the request body in chunks of at most [`WRITE_CHUNK`] bytes and finishes it.
fn write_body(body: OutgoingBody, bytes: &[u8]) -> Result<(), HttpError> {
    {
        let stream = body
            .write()
            .map_err(|()| HttpError::InvalidRequest("no request body stream".to_owned()))?;
        for chunk in bytes.chunks(WRITE_CHUNK) {
            stream
                .blocking_write_and_flush(chunk)
                .map_err(|e| stream_error(e, "writing the request body"))?;
        }
    }
    OutgoingBody::finish(body, None).map_err(|code| HttpError::from_code(&code))
}

/// Blocks until `ready` is ready or the deadline passes.
fn wait(ready: &poll::Pollable, deadline: Instant) -> Result<(), HttpError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(HttpError::Timeout { code: "timeout" });
    }
    let timer =
        monotonic_clock::subscribe_duration(u64::try_from(left.as_nanos()).unwrap_or(u64::MAX));
    let fired = poll::poll(&[ready, &timer]);
    if fired.contains(&0) {
        Ok(())
    } else {
        Err(HttpError::Timeout { code: "timeout" })
    }
}

/// Header names and values, as a response carries them.
type HeaderList = Vec<(String, Vec<u8>)>;

/// A response's status and headers, and its body to read.
fn head(response: &IncomingResponse) -> Result<(u16, HeaderList, IncomingBody), HttpError> {
    let (status, headers) = (response.status(), response.headers().entries());
    let body = response.consume().map_err(|()| HttpError::Failed {
        code: "internal-error",
        detail: Some("the response body was already taken".to_owned()),
    })?;
    Ok((status, headers, body))
}

/// Reads the status, headers and whole body of a response.
fn read_response(
    response: IncomingResponse,
    deadline: Instant,
    limit: usize,
) -> Result<Response, HttpError> {
    let (status, headers, body) = head(&response)?;
    let bytes = read_body(&body, deadline, limit)?;
    // Trailers are not read; dropping the body ends it.
    drop(body);
    Ok(Response {
        status,
        headers,
        body: bytes,
    })
}

/// Reads a response body to its end, within the deadline and the size limit.
fn read_body(body: &IncomingBody, deadline: Instant, limit: usize) -> Result<Vec<u8>, HttpError> {
    let stream: InputStream = body.stream().map_err(|()| HttpError::Failed {
        code: "internal-error",
        detail: Some("the response body stream was already taken".to_owned()),
    })?;
    let mut bytes = Vec::new();
    loop {
        match stream.read(READ_CHUNK) {
            Ok(chunk) if chunk.is_empty() => {
                let ready = stream.subscribe();
                wait(&ready, deadline)?;
            }
            Ok(chunk) => {
                if bytes.len() + chunk.len() > limit {
                    return Err(HttpError::ResponseTooLarge { limit });
                }
                bytes.extend_from_slice(&chunk);
            }
            Err(StreamError::Closed) => return Ok(bytes),
            Err(e) => return Err(stream_error(e, "reading the response body")),
        }
    }
}

/// An error of a body stream: the `wasi:http` error-code behind it when there is one.
fn stream_error(error: StreamError, doing: &str) -> HttpError {
    match error {
        StreamError::Closed => HttpError::Failed {
            code: "connection-terminated",
            detail: Some(format!("the stream closed while {doing}")),
        },
        StreamError::LastOperationFailed(e) => match wasip2::http::types::http_error_code(&e) {
            Some(code) => HttpError::from_code(&code),
            None => HttpError::Failed {
                code: "internal-error",
                detail: Some(format!("{doing}: {}", e.to_debug_string())),
            },
        },
    }
}

/// Where a URL points: scheme, `host[:port]`, and path with query.
#[derive(Debug)]
struct Target {
    scheme: Scheme,
    authority: String,
    path_with_query: String,
}

impl Target {
    fn parse(url: &str) -> Result<Target, HttpError> {
        let invalid = |why: &str| HttpError::InvalidRequest(format!("URL {why}"));
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| invalid("has no scheme (want http:// or https://)"))?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            _ => return Err(invalid("scheme is not http or https")),
        };
        // The fragment is the client's; it is never sent.
        let rest = rest.split_once('#').map_or(rest, |(before, _)| before);
        let split = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(split);
        if authority.is_empty() {
            return Err(invalid("has no host"));
        }
        if authority.contains('@') {
            return Err(invalid(
                "has user information (send credentials in a header)",
            ));
        }
        let path_with_query = match path.chars().next() {
            None => "/".to_owned(),
            Some('?') => format!("/{path}"),
            Some(_) => path.to_owned(),
        };
        Ok(Target {
            scheme,
            authority: authority.to_owned(),
            path_with_query,
        })
    }
}

/// A response, read in full.
#[derive(Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The headers in the order received (names in lowercase, as the host gives them).
    pub headers: Vec<(String, Vec<u8>)>,
    /// The whole body.
    pub body: Vec<u8>,
}

/// Header values and the body stay out of `Debug` output.
impl fmt::Debug for Response {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Response")
            .field("status", &self.status)
            .field("header_names", &names)
            .field("body_len", &self.body.len())
            .finish()
    }
}

impl Response {
    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The first value of header `name` (any case) that is UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .find_map(|(_, value)| std::str::from_utf8(value).ok())
    }

    /// The body as text.
    ///
    /// # Errors
    ///
    /// [`HttpError::Decode`] when the body is not UTF-8.
    pub fn text(&self) -> Result<&str, HttpError> {
        std::str::from_utf8(&self.body)
            .map_err(|_| HttpError::Decode("the response body is not UTF-8".to_owned()))
    }
}

/// A response whose body is read as it arrives ([`Request::send_streaming`]): the status and
/// headers first, then the body chunk by chunk.
///
/// ```no_run
/// # fn demo() -> Result<(), homing_guest::http::HttpError> {
/// use homing_guest::http::Request;
///
/// let mut response = Request::get("http://127.0.0.1:8080/events").send_streaming()?;
/// while let Some(chunk) = response.read_chunk()? {
///     homing_guest::info!("{} more bytes", chunk.len());
/// }
/// # Ok(())
/// # }
/// ```
pub struct StreamingResponse {
    /// The status code.
    pub status: u16,
    /// The headers in the order received (names in lowercase, as the host gives them).
    pub headers: Vec<(String, Vec<u8>)>,
    // Drop order matters: the stream is a child of the body, which the host wants dropped
    // after it. Fields drop in declaration order; both are `None` once the body ended.
    stream: Option<InputStream>,
    body: Option<IncomingBody>,
    _response: IncomingResponse,
    deadline: Instant,
    limit: usize,
    read: usize,
}

/// Header values and the body stay out of `Debug` output.
impl fmt::Debug for StreamingResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("StreamingResponse")
            .field("status", &self.status)
            .field("header_names", &names)
            .field("read", &self.read)
            .field("ended", &self.stream.is_none())
            .finish()
    }
}

impl StreamingResponse {
    fn new(
        response: IncomingResponse,
        deadline: Instant,
        limit: usize,
    ) -> Result<StreamingResponse, HttpError> {
        let (status, headers, body) = head(&response)?;
        let stream = body.stream().map_err(|()| HttpError::Failed {
            code: "internal-error",
            detail: Some("the response body stream was already taken".to_owned()),
        })?;
        Ok(StreamingResponse {
            status,
            headers,
            stream: Some(stream),
            body: Some(body),
            _response: response,
            deadline,
            limit,
            read: 0,
        })
    }

    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The first value of header `name` (any case) that is UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .find_map(|(_, value)| std::str::from_utf8(value).ok())
    }

    /// The body's next bytes, as many as have arrived (waiting for some), or `None` once the
    /// body has ended. Chunks follow the network, not the content: a line or a UTF-8
    /// character may be split across two of them.
    ///
    /// # Errors
    ///
    /// [`HttpError::Timeout`] when the request's deadline passes,
    /// [`HttpError::ResponseTooLarge`] past its size limit, or the stream's own failure. After
    /// an error the body is closed and later calls return `None`.
    pub fn read_chunk(&mut self) -> Result<Option<Vec<u8>>, HttpError> {
        let result = self.next_bytes();
        if !matches!(result, Ok(Some(_))) {
            self.end();
        }
        result
    }

    fn next_bytes(&mut self) -> Result<Option<Vec<u8>>, HttpError> {
        let Some(stream) = &self.stream else {
            return Ok(None);
        };
        loop {
            match stream.read(READ_CHUNK) {
                Ok(chunk) if chunk.is_empty() => {
                    let ready = stream.subscribe();
                    wait(&ready, self.deadline)?;
                }
                Ok(chunk) => {
                    self.read = self.read.saturating_add(chunk.len());
                    if self.read > self.limit {
                        return Err(HttpError::ResponseTooLarge { limit: self.limit });
                    }
                    return Ok(Some(chunk));
                }
                Err(StreamError::Closed) => return Ok(None),
                Err(e) => return Err(stream_error(e, "reading the response body")),
            }
        }
    }

    /// Drops the stream, then the body (trailers are not read).
    fn end(&mut self) {
        self.stream = None;
        self.body = None;
    }

    /// The rest of the body, chunk by chunk: an iterator of [`StreamingResponse::read_chunk`]'s
    /// chunks that ends with the body or after yielding the first error.
    pub fn chunks(&mut self) -> impl Iterator<Item = Result<Vec<u8>, HttpError>> + '_ {
        std::iter::from_fn(move || self.read_chunk().transpose())
    }

    /// Reads the rest of the body and returns the whole [`Response`] (with only the bytes not
    /// read yet as its body): for a server that answered without streaming after all.
    ///
    /// # Errors
    ///
    /// Those of [`StreamingResponse::read_chunk`].
    pub fn into_response(mut self) -> Result<Response, HttpError> {
        let mut body = Vec::new();
        while let Some(chunk) = self.read_chunk()? {
            body.extend_from_slice(&chunk);
        }
        Ok(Response {
            status: self.status,
            headers: std::mem::take(&mut self.headers),
            body,
        })
    }
}

#[cfg(feature = "json")]
impl Request {
    /// Sets the body to `value` as JSON and adds `content-type: application/json` (unless a
    /// `content-type` was set).
    ///
    /// # Errors
    ///
    /// [`HttpError::Decode`] when the value does not serialize.
    pub fn json<T: serde::Serialize + ?Sized>(mut self, value: &T) -> Result<Request, HttpError> {
        let body = serde_json::to_vec(value)
            .map_err(|e| HttpError::Decode(format!("the request body does not serialize: {e}")))?;
        if !self
            .headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("content-type"))
        {
            self = self.header("content-type", "application/json");
        }
        Ok(self.body(body))
    }
}

#[cfg(feature = "json")]
impl Response {
    /// The body parsed as JSON.
    ///
    /// # Errors
    ///
    /// [`HttpError::Decode`] when the body is not JSON of type `T`.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, HttpError> {
        serde_json::from_slice(&self.body).map_err(|e| {
            HttpError::Decode(format!("the response body is not the JSON expected: {e}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str) -> Result<(String, String), HttpError> {
        Target::parse(url).map(|t| (t.authority, t.path_with_query))
    }

    #[test]
    fn urls_split_into_authority_and_path() {
        let pair = |a: &str, p: &str| Ok((a.to_owned(), p.to_owned()));
        assert_eq!(target("http://127.0.0.1:8080"), pair("127.0.0.1:8080", "/"));
        assert_eq!(
            target("https://api.example.com/v1/chat?x=1#frag"),
            pair("api.example.com", "/v1/chat?x=1")
        );
        assert_eq!(target("HTTP://h?q=1"), pair("h", "/?q=1"));
        assert!(target("ftp://h/").is_err());
        assert!(target("http:///path").is_err());
        assert!(target("https://user:pw@h/").is_err());
        assert!(target("example.com").is_err());
    }

    #[test]
    fn methods_parse_in_any_case() {
        assert_eq!(Method::parse("post"), Method::Post);
        assert_eq!(Method::parse("PURGE"), Method::Other("PURGE".to_owned()));
    }

    #[test]
    fn errors_name_the_wasi_code() {
        let denied = HttpError::from_code(&ErrorCode::HttpRequestDenied);
        assert_eq!(denied, HttpError::Denied);
        assert!(denied.to_string().contains("HTTP-request-denied"));
        assert_eq!(
            HttpError::from_code(&ErrorCode::ConnectionRefused).code(),
            Some("connection-refused")
        );
        assert!(HttpError::from_code(&ErrorCode::DnsTimeout).is_transient());
    }

    #[test]
    fn debug_output_hides_header_values() {
        let request = Request::get("http://h/").bearer_auth("s3cret");
        assert!(!format!("{request:?}").contains("s3cret"));
    }
}
