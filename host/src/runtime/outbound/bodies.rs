//! The bodies of an outbound request: the guest's request body, capped as it is sent, and the
//! response body as the guest reads it, capped, timed, cancellable, and logged once when it
//! ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use wasmtime_wasi_http::{Error as HttpError, WasiBody};

use super::Job;
use crate::claim::ClaimControl;

/// The request body, capped.
pub(super) struct CappedRequest {
    inner: WasiBody,
    sent: u64,
    cap: u64,
    /// Where a metered model call keeps the body's first bytes ([`super::genai`]).
    tee: Option<Arc<std::sync::Mutex<Vec<u8>>>>,
}

impl CappedRequest {
    /// `inner`, failing with `HTTP-request-body-size` once more than `cap` bytes went by.
    pub(super) fn new(inner: WasiBody, cap: u64) -> Self {
        CappedRequest {
            inner,
            sent: 0,
            cap,
            tee: None,
        }
    }

    /// The same body, its first [`super::genai::MAX_REQUEST_READ`] bytes copied to `tee` as
    /// they are sent.
    pub(super) fn with_tee(mut self, tee: Option<Arc<std::sync::Mutex<Vec<u8>>>>) -> Self {
        self.tee = tee;
        self
    }
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
            let fits = self.tee.as_ref().is_none_or(|tee| {
                let Ok(mut kept) = tee.lock() else {
                    return false;
                };
                if kept.len() + data.len() <= super::genai::MAX_REQUEST_READ {
                    kept.extend_from_slice(data);
                    true
                } else {
                    // Too long to read: nothing is kept (a part is not JSON).
                    *kept = Vec::new();
                    false
                }
            });
            if !fits {
                self.tee = None;
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
pub(super) struct GuardedResponse {
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
    /// The body of `job`'s response with `status`: at most `cap` bytes, each chunk within
    /// `between` of the last, none past the job's deadline or its claim's cancellation.
    pub(super) fn new(
        incoming: hyper::body::Incoming,
        job: Job,
        status: u16,
        cap: u64,
        between: Duration,
    ) -> Self {
        let cancelled = job.control.clone().map(|control: Arc<ClaimControl>| {
            Box::pin(async move { control.cancelled().await })
                as Pin<Box<dyn Future<Output = ()> + Send>>
        });
        GuardedResponse {
            incoming,
            cap,
            received: 0,
            between,
            timer: Box::pin(tokio::time::sleep(between)),
            deadline: job.deadline,
            cancelled,
            status,
            job: Some(job),
            failed: None,
        }
    }

    fn end(&mut self, why: Option<String>) {
        if let Some(mut job) = self.job.take() {
            if let Some(meter) = job.meter.take() {
                meter.finish(&job.span, why.is_none());
            }
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
                    if let Some(meter) = self.job.as_mut().and_then(|j| j.meter.as_mut()) {
                        meter.observe(data);
                    }
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
