//! The API's limits beyond one request's time and size, each so that no client can take what
//! the others need:
//!
//! - [`Connections`]: connections open at once per client address (`[api]
//!   max_connections_per_client`), counted at accept; one over it is answered 503 and closed;
//! - [`Failures`]: invalid tokens per client address (the dashboard's logins and `/v1` bearer
//!   tokens together); past [`MAX_FAILURES`] in [`FAILURE_WINDOW`], a wrong token is answered
//!   429 with `Retry-After`. A right token is always accepted: one client's guesses never lock
//!   out another, nor the operator who shares its address;
//! - [`Streams`]: server-sent-event streams open at once (`[api] max_streams`, and
//!   `max_streams_per_token` for one token), held until the stream ends;
//! - [`TimedBody`]: a request body must arrive in full within `[api] body_timeout` of its head.
//!
//! A client address is its IP address, an IPv6 one cut to its /64 (one host's share of a
//! network), an IPv4-mapped IPv6 one read as the IPv4 address.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::ApiError;

/// Locks a table of counts; a panic elsewhere while it was held leaves counts that are still
/// counts, so a poisoned lock is used as it is.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Where a request comes from, as the limits count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ClientAddr(IpAddr);

impl ClientAddr {
    /// The client address of a peer's IP address.
    pub(crate) fn of(ip: IpAddr) -> ClientAddr {
        match ip.to_canonical() {
            IpAddr::V4(v4) => ClientAddr(IpAddr::V4(v4)),
            IpAddr::V6(v6) => {
                let s = v6.segments();
                ClientAddr(IpAddr::V6(Ipv6Addr::new(
                    s[0], s[1], s[2], s[3], 0, 0, 0, 0,
                )))
            }
        }
    }

    /// The address of a request that came by no connection the server accepted (none does:
    /// every request is served by `serve`, which records it).
    pub(crate) const UNKNOWN: ClientAddr = ClientAddr(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
}

impl fmt::Display for ClientAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) => write!(f, "{v6}/64"),
        }
    }
}

/// The connections open per client address.
#[derive(Debug)]
pub(super) struct Connections {
    max: usize,
    open: Mutex<HashMap<ClientAddr, usize>>,
}

/// One admitted connection; its count is given back when it is dropped.
#[derive(Debug)]
pub(super) struct Connection {
    table: Arc<Connections>,
    client: ClientAddr,
}

impl Connections {
    pub(super) fn new(max: usize) -> Arc<Connections> {
        Arc::new(Connections {
            max,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// Counts a new connection from `client`, or `None` when it has `max` open already.
    pub(super) fn admit(self: &Arc<Self>, client: ClientAddr) -> Option<Connection> {
        let mut open = lock(&self.open);
        let count = open.entry(client).or_default();
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(Connection {
            table: self.clone(),
            client,
        })
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let mut open = lock(&self.table.open);
        if let Some(count) = open.get_mut(&self.client) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.client);
            }
        }
    }
}

/// The response a connection over `max_connections_per_client` gets before it is closed.
pub(super) fn too_many_connections() -> Vec<u8> {
    let body = r#"{"error":"too many connections from this address ([api] max_connections_per_client); close some and retry"}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Invalid tokens accepted per client address in [`FAILURE_WINDOW`]; past them, a wrong
/// token is answered 429.
pub(crate) const MAX_FAILURES: usize = 30;
/// The window failures are counted in.
pub(crate) const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// The most client addresses whose failures are kept; past it, the one that failed longest
/// ago is forgotten.
const MAX_CLIENTS_TRACKED: usize = 10_000;

/// What a failure recorded by [`Failures::fail`] means for its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failed {
    /// Within the limit: answer as a wrong token (401).
    Counted,
    /// Past the limit: answer 429, retry after this many seconds. `first` is the first
    /// failure past it in this run of failures (the one worth a log line).
    Limited { retry_after: u64, first: bool },
}

/// Recent invalid tokens per client address.
#[derive(Debug, Default)]
pub(crate) struct Failures {
    table: Mutex<HashMap<ClientAddr, Recent>>,
}

/// One client's failures: the times of its last [`MAX_FAILURES`], and whether its last one
/// was past the limit.
#[derive(Debug, Default)]
struct Recent {
    times: VecDeque<Instant>,
    limited: bool,
}

impl Failures {
    /// Records an invalid token from `client`.
    pub(crate) fn fail(&self, client: ClientAddr) -> Failed {
        self.fail_at(client, Instant::now())
    }

    fn fail_at(&self, client: ClientAddr, now: Instant) -> Failed {
        let recent = |t: &Instant| now.saturating_duration_since(*t) < FAILURE_WINDOW;
        let mut table = lock(&self.table);
        if !table.contains_key(&client) && table.len() >= MAX_CLIENTS_TRACKED {
            table.retain(|_, r| r.times.back().is_some_and(recent));
            if table.len() >= MAX_CLIENTS_TRACKED
                && let Some(oldest) = table
                    .iter()
                    .min_by_key(|(_, r)| r.times.back().copied())
                    .map(|(c, _)| *c)
            {
                table.remove(&oldest);
            }
        }
        let r = table.entry(client).or_default();
        while r.times.front().is_some_and(|t| !recent(t)) {
            r.times.pop_front();
        }
        let before = r.times.len();
        r.times.push_back(now);
        if r.times.len() > MAX_FAILURES {
            r.times.pop_front();
        }
        if before < MAX_FAILURES {
            r.limited = false;
            return Failed::Counted;
        }
        // The oldest kept failure leaves the window first; then a failure counts again.
        let retry = r.times.front().map_or(FAILURE_WINDOW, |oldest| {
            FAILURE_WINDOW.saturating_sub(now.saturating_duration_since(*oldest))
        });
        let retry_after = retry.as_secs() + u64::from(retry.subsec_nanos() > 0);
        let first = !r.limited;
        r.limited = true;
        Failed::Limited {
            retry_after: retry_after.max(1),
            first,
        }
    }
}

/// The server-sent-event streams open, in all and per token.
#[derive(Debug)]
pub(crate) struct Streams {
    all: Arc<Semaphore>,
    max: usize,
    max_per_token: usize,
    per_token: Mutex<HashMap<String, usize>>,
}

/// One open stream; its counts are given back when the stream ends (it is dropped with it).
#[derive(Debug)]
pub(crate) struct StreamPermit {
    _all: OwnedSemaphorePermit,
    streams: Arc<Streams>,
    token: String,
}

impl Streams {
    pub(crate) fn new(max: usize, max_per_token: usize) -> Arc<Streams> {
        Arc::new(Streams {
            all: Arc::new(Semaphore::new(max)),
            max,
            max_per_token,
            per_token: Mutex::new(HashMap::new()),
        })
    }

    /// Counts a new stream of `token`: 429 when that token has `max_streams_per_token` open,
    /// 503 when `max_streams` are open in all.
    pub(crate) fn open(self: &Arc<Self>, token: &str) -> Result<StreamPermit, ApiError> {
        let mut per_token = lock(&self.per_token);
        let count = per_token.get(token).copied().unwrap_or(0);
        if count >= self.max_per_token {
            return Err(ApiError::too_many(
                format!(
                    "token `{token}` has {count} event streams open, the most [api] max_streams_per_token allows; close one and retry"
                ),
                1,
            ));
        }
        let Ok(all) = self.all.clone().try_acquire_owned() else {
            return Err(ApiError::busy(format!(
                "{} event streams are open, the most [api] max_streams allows; retry later",
                self.max
            )));
        };
        per_token.insert(token.to_owned(), count + 1);
        Ok(StreamPermit {
            _all: all,
            streams: self.clone(),
            token: token.to_owned(),
        })
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut per_token = lock(&self.streams.per_token);
        if let Some(count) = per_token.get_mut(&self.token) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                per_token.remove(&self.token);
            }
        }
    }
}

/// A request body that fails once `body_timeout` has passed since the request's head
/// arrived, and says so in `expired` (the guard then answers 408).
pub(super) struct TimedBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    expired: Arc<AtomicBool>,
}

impl TimedBody {
    pub(super) fn new(inner: Body, limit: Duration, expired: Arc<AtomicBool>) -> TimedBody {
        TimedBody {
            inner,
            deadline: Box::pin(tokio::time::sleep(limit)),
            expired,
        }
    }
}

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if this.inner.is_end_stream() {
            return Pin::new(&mut this.inner).poll_frame(cx);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.expired.store(true, Ordering::Relaxed);
            return Poll::Ready(Some(Err(axum::Error::new(
                "the request body did not arrive within [api] body_timeout",
            ))));
        }
        Pin::new(&mut this.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn addr(text: &str) -> ClientAddr {
        ClientAddr::of(text.parse().unwrap())
    }

    #[test]
    fn a_client_is_its_ipv4_address_or_its_ipv6_64() {
        assert_eq!(addr("10.0.0.1"), addr("::ffff:10.0.0.1"));
        assert_ne!(addr("10.0.0.1"), addr("10.0.0.2"));
        assert_eq!(addr("2001:db8:1:2::1"), addr("2001:db8:1:2:ffff::9"));
        assert_ne!(addr("2001:db8:1:2::1"), addr("2001:db8:1:3::1"));
        assert_eq!(addr("2001:db8:1:2::1").to_string(), "2001:db8:1:2::/64");
        assert_eq!(addr("127.0.0.1").to_string(), "127.0.0.1");
    }

    #[test]
    fn connections_are_counted_per_client_until_dropped() {
        let table = Connections::new(2);
        let (a, b) = (addr("127.0.0.2"), addr("127.0.0.3"));
        let first = table.admit(a).unwrap();
        let _second = table.admit(a).unwrap();
        assert!(table.admit(a).is_none(), "a third from one address");
        let _other = table.admit(b).unwrap();
        drop(first);
        let _again = table.admit(a).unwrap();
        assert!(table.admit(a).is_none());
        let text = String::from_utf8(too_many_connections()).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
        assert!(head.contains(&format!("content-length: {}", body.len())));
        serde_json::from_str::<serde_json::Value>(body).unwrap();
    }

    #[test]
    fn failures_are_limited_per_client_and_leave_the_window() {
        let failures = Failures::default();
        let (a, b) = (addr("127.0.0.2"), addr("127.0.0.3"));
        let start = Instant::now();
        for i in 0..MAX_FAILURES {
            let at = start + Duration::from_millis(i as u64);
            assert_eq!(failures.fail_at(a, at), Failed::Counted, "failure {i}");
        }
        let at = start + Duration::from_secs(1);
        assert_eq!(
            failures.fail_at(a, at),
            Failed::Limited {
                retry_after: 60,
                first: true
            }
        );
        assert!(matches!(
            failures.fail_at(a, at),
            Failed::Limited { first: false, .. }
        ));
        assert_eq!(failures.fail_at(b, at), Failed::Counted, "another client");
        // Once the window has passed over the oldest kept failures, they count again.
        let later = start + FAILURE_WINDOW + Duration::from_secs(2);
        assert_eq!(failures.fail_at(a, later), Failed::Counted);
    }

    #[test]
    fn the_failure_table_is_bounded() {
        let failures = Failures::default();
        let now = Instant::now();
        for i in 0..MAX_CLIENTS_TRACKED as u32 + 10 {
            failures.fail_at(ClientAddr::of(IpAddr::V4(i.into())), now);
        }
        assert_eq!(lock(&failures.table).len(), MAX_CLIENTS_TRACKED);
    }

    #[test]
    fn streams_are_limited_in_all_and_per_token() {
        let streams = Streams::new(3, 2);
        let a1 = streams.open("a").unwrap();
        let _a2 = streams.open("a").unwrap();
        let refused = streams.open("a").unwrap_err();
        assert_eq!(refused.status(), 429);
        let _b1 = streams.open("b").unwrap();
        let refused = streams.open("c").unwrap_err();
        assert_eq!(refused.status(), 503);
        drop(a1);
        let _c1 = streams.open("c").unwrap();
        assert_eq!(streams.open("a").unwrap_err().status(), 503);
    }
}
