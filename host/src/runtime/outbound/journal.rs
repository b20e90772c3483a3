//! Outbound HTTP under `journal = "run"`: each exchange is a journaled call (see
//! `crate::claim::journal`).
//!
//! The request is admitted as every request is (a refused one is refused live, never answered
//! from a journal); then its body is read whole (within `http.max_request_body`) so the call's
//! identity can be taken: the SHA-256 of its method, its full URL, its headers (less the trace
//! context headers, which differ on every run) and its body. Secrets in headers, URLs and
//! bodies reach the journal only through that digest.
//!
//! - Replayed: the guest gets the recorded status, headers and body; nothing is sent.
//! - Live: the request is sent as any other. A response with a lasting status is recorded
//!   once the guest has read its body to the end, and before that end reaches the guest, so a
//!   guest never acts on an answer the journal does not hold. Transient outcomes (no
//!   response, status 408, 429 or 5xx, a body that failed midway) are not recorded.
//!
//! What the entry keeps: the method, the URL shown with its query values removed and the
//! plugin's secrets scrubbed from it, the status, the response headers less `set-cookie` (and
//! scrubbed of secrets), and the body (without it when larger than the store keeps or when the
//! response holds a secret: a replay then makes the call live).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use tracing::info;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody};

use super::{Job, SendResult, TRACEPARENT};
use crate::claim::journal::{Call, Recorder, Turn};
use crate::runtime::host::Secrets;
use crate::store::journal::{CallEntry, CallKind, identity};

/// Request headers left out of a call's identity: the trace context differs on every run.
const UNSTABLE_HEADERS: &[&str] = &[TRACEPARENT, "tracestate"];

/// Response headers never journaled.
const UNKEPT_HEADERS: &[&str] = &["set-cookie", "set-cookie2"];

/// Whether a status is transient: made again on a retry, never recorded.
pub(super) fn transient(status: u16) -> bool {
    status == 408 || status == 429 || status >= 500
}

/// The URL as an entry shows it: scheme, host and port, `path` (already scrubbed of secrets),
/// and the query's names without their values; then scrubbed of `secrets` whole.
pub(super) fn shown_url(uri: &http::Uri, path: &str, secrets: &Secrets) -> String {
    let mut out = format!(
        "{}://{}",
        uri.scheme_str().unwrap_or("http"),
        uri.host().unwrap_or_default()
    );
    if let Some(port) = uri.port_u16() {
        out.push_str(&format!(":{port}"));
    }
    out.push_str(path);
    if let Some(query) = uri.query() {
        let names: Vec<&str> = query
            .split('&')
            .map(|pair| pair.split('=').next().unwrap_or_default())
            .collect();
        out.push('?');
        out.push_str(&names.join("=&"));
        out.push('=');
    }
    secrets.scrub(&out).into_owned()
}

/// The identity of a request: method, URL, headers (sorted, less the unstable ones), body.
fn request_identity(parts: &http::request::Parts, body: &[u8]) -> String {
    let mut headers: Vec<(&str, &[u8])> = parts
        .headers
        .iter()
        .filter(|(name, _)| !UNSTABLE_HEADERS.contains(&name.as_str()))
        .map(|(name, value)| (name.as_str(), value.as_bytes()))
        .collect();
    headers.sort();
    let method = parts.method.as_str().as_bytes();
    let uri = parts.uri.to_string();
    let mut items: Vec<&[u8]> = vec![method, uri.as_bytes()];
    for (name, value) in &headers {
        items.push(name.as_bytes());
        items.push(value);
    }
    items.push(body);
    identity(items)
}

/// The response a replayed entry gives, or `None` when the entry kept no body (or is not one
/// this host can rebuild): the call then goes live.
fn replayed_response(entry: &CallEntry) -> Option<http::Response<WasiBody>> {
    let body = entry.body.clone()?;
    let status = http::StatusCode::from_u16(entry.answer.get("status")?.as_u64()? as u16).ok()?;
    let mut response = http::Response::builder().status(status);
    for pair in entry.answer.get("headers")?.as_array()? {
        let name = pair.get(0)?.as_str()?;
        let value = pair.get(1)?.as_str()?;
        if name.eq_ignore_ascii_case("content-length")
            || name.eq_ignore_ascii_case("transfer-encoding")
        {
            continue;
        }
        response = response.header(name, value);
    }
    response = response.header(http::header::CONTENT_LENGTH, body.len());
    response
        .body(
            Full::new(Bytes::from(body))
                .map_err(|never| match never {})
                .boxed_unsync(),
        )
        .ok()
}

impl Job {
    /// Sends `request` as a journaled call of `recorder`'s run (see the module's docs).
    /// `shown` is the URL as an entry shows it.
    pub(super) async fn send_journaled(
        mut self,
        recorder: Arc<Recorder>,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        shown: String,
    ) -> SendResult {
        self.admit(&request)?;
        // The position is taken now, in the order the guest asked, before the body arrives:
        // requests made in parallel keep that order whichever body is written first.
        let mut call = recorder.start(CallKind::Http, String::new());
        let (parts, body) = request.into_parts();
        let cap = self.outbound.limits.max_request_body;
        let budget = self.budget(
            self.outbound.limits.first_byte_timeout,
            options.and_then(|o| o.first_byte_timeout),
        );
        let bytes = match self.bounded(budget, read_body(body, cap)).await {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(err)) => {
                recorder.release(&call);
                let why = match &err {
                    HttpError::HttpRequestBodySize(_) => {
                        format!("the request body passed http.max_request_body of {cap} bytes")
                    }
                    other => format!("the request body failed: {other}"),
                };
                return Err(self.refuse(&why, err));
            }
            Err(ended) => {
                recorder.release(&call);
                return Err(self.ended(
                    ended,
                    "reading the request body",
                    HttpError::ConnectionWriteTimeout,
                ));
            }
        };
        call.identity = request_identity(&parts, &bytes);
        if let Turn::Replay(entry) = recorder.decide(&call).await
            && let Some(response) = replayed_response(&entry)
        {
            recorder.replayed(&entry);
            info!(
                plugin = %self.outbound.plugin,
                dispatch = %self.dispatch,
                attempt = self.attempt,
                method = %self.method,
                origin = %self.origin,
                path = %self.path,
                status = response.status().as_u16(),
                position = call.pos,
                "outbound request answered from the journal"
            );
            let io: super::IoFuture = Box::new(async { Ok(()) });
            return Ok((response, io));
        }
        let method = self.method.clone();
        let secrets = self.secrets.clone();
        let request = http::Request::from_parts(
            parts,
            Full::new(bytes)
                .map_err(|never| match never {})
                .boxed_unsync(),
        );
        let (response, io) = match self.send(request, options).await {
            Ok(sent) => sent,
            Err(e) => {
                recorder.release(&call);
                return Err(e);
            }
        };
        let status = response.status().as_u16();
        if transient(status) {
            recorder.release(&call);
            return Ok((response, io));
        }
        // A response that holds a secret (a server that echoes its request, a redirect to a
        // webhook's URL) is kept with the secret scrubbed from its headers and without its
        // body: a replay then makes the call live, and the journal never holds the secret.
        let mut secret_seen = false;
        let headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .filter(|(name, _)| !UNKEPT_HEADERS.contains(&name.as_str()))
            .map(|(name, value)| {
                let value = String::from_utf8_lossy(value.as_bytes());
                let scrubbed = secrets.scrub(&value);
                secret_seen |= matches!(scrubbed, std::borrow::Cow::Owned(_));
                (name.as_str().to_owned(), scrubbed.into_owned())
            })
            .collect();
        let answer = serde_json::json!({
            "method": method,
            "url": shown,
            "status": status,
            "headers": headers,
        });
        let response = response.map(|body| {
            Recording {
                inner: body,
                recorder,
                call,
                answer: Some(answer),
                kept: BytesMut::new(),
                too_large: false,
                secret_seen,
                secrets,
                writing: None,
                done: false,
            }
            .boxed_unsync()
        });
        Ok((response, io))
    }
}

/// Reads a request body whole, failing once it passes `cap` bytes.
async fn read_body(mut body: WasiBody, cap: u64) -> Result<Bytes, HttpError> {
    let mut out = BytesMut::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            out.extend_from_slice(&data);
            if out.len() as u64 > cap {
                return Err(HttpError::HttpRequestBodySize(Some(out.len() as u64)));
            }
        }
    }
    Ok(out.freeze())
}

/// A live response body that records its exchange once the guest has read it to the end.
struct Recording {
    inner: WasiBody,
    recorder: Arc<Recorder>,
    call: Call,
    /// Taken when the entry is written.
    answer: Option<serde_json::Value>,
    kept: BytesMut,
    too_large: bool,
    /// Whether the response's headers held a secret: then its body is not kept either.
    secret_seen: bool,
    secrets: Arc<Secrets>,
    writing: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    done: bool,
}

impl Body for Recording {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if self.writing.is_none() {
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        let limit = self.recorder.max_body();
                        if self.too_large || (self.kept.len() + data.len()) as u64 > limit {
                            self.too_large = true;
                            self.kept = BytesMut::new();
                        } else {
                            self.kept.extend_from_slice(data);
                        }
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                Poll::Ready(Some(Err(e))) => {
                    // A body that failed midway is transient: nothing is recorded.
                    self.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    let Some(answer) = self.answer.take() else {
                        self.done = true;
                        return Poll::Ready(None);
                    };
                    let kept = std::mem::take(&mut self.kept);
                    let body =
                        (!self.too_large && !self.secret_seen && !self.secrets.found_in(&kept))
                            .then(|| kept.to_vec());
                    let recorder = self.recorder.clone();
                    let call = self.call.clone();
                    self.writing = Some(Box::pin(async move {
                        if let Some(entry) = recorder.entry(&call, answer, body).await {
                            recorder.record(entry).await;
                        }
                    }));
                }
            }
        }
        if let Some(writing) = self.writing.as_mut() {
            match writing.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(()) => {
                    self.writing = None;
                    self.done = true;
                }
            }
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        // Not before the entry is written: the end reaches the guest only after it.
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn a_shown_url_keeps_the_query_names_without_their_values() {
        let uri: http::Uri = "https://user:pw@api.example.com:8443/v1/chat?key=sk-secret&mode=x"
            .parse()
            .unwrap();
        let none = Secrets::default();
        let shown = shown_url(&uri, "/v1/chat", &none);
        assert_eq!(shown, "https://api.example.com:8443/v1/chat?key=&mode=");
        assert!(!shown.contains("sk-secret") && !shown.contains("pw"));
        let plain: http::Uri = "http://127.0.0.1/x".parse().unwrap();
        assert_eq!(shown_url(&plain, "/x", &none), "http://127.0.0.1/x");
        // A secret host is scrubbed as a secret path is.
        let secret = Secrets::new(["tenant-0123456789.example.com"]);
        let hooked: http::Uri = "https://tenant-0123456789.example.com/x".parse().unwrap();
        assert_eq!(shown_url(&hooked, "/x", &secret), "https://[redacted]/x");
    }

    #[test]
    fn transient_statuses_are_the_retryable_ones() {
        for status in [408, 429, 500, 502, 503, 504] {
            assert!(transient(status), "{status}");
        }
        for status in [200, 201, 301, 400, 401, 404, 409, 422] {
            assert!(!transient(status), "{status}");
        }
    }

    #[test]
    fn the_identity_ignores_the_trace_context_but_not_the_credentials() {
        let request = |auth: &str, trace: &str| {
            let (parts, ()) = http::Request::post("http://m/v1")
                .header("authorization", auth)
                .header("traceparent", trace)
                .body(())
                .unwrap()
                .into_parts();
            parts
        };
        let a = request_identity(&request("Bearer k1", "00-aa-01"), b"{}");
        assert_eq!(
            a,
            request_identity(&request("Bearer k1", "00-bb-01"), b"{}")
        );
        assert_ne!(
            a,
            request_identity(&request("Bearer k2", "00-aa-01"), b"{}")
        );
        assert_ne!(
            a,
            request_identity(&request("Bearer k1", "00-aa-01"), b"{ }")
        );
        assert!(!a.contains("k1"));
    }

    #[test]
    fn a_replayed_response_has_the_recorded_status_headers_and_body() {
        let mut entry = CallEntry::new(
            "d",
            0,
            CallKind::Http,
            identity([&b"x"[..]]),
            serde_json::json!({"status": 201, "headers": [["x-reply", "yes"], ["content-length", "999"]]}),
            Some(b"hello".to_vec()),
            1,
            0,
            10,
        );
        let response = replayed_response(&entry).unwrap();
        assert_eq!(response.status(), 201);
        assert_eq!(response.headers()["x-reply"], "yes");
        assert_eq!(response.headers()["content-length"], "5");
        entry.body = None;
        assert!(replayed_response(&entry).is_none(), "no body kept: live");
    }
}
