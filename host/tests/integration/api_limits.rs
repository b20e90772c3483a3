//! The HTTP API's resource limits, against a real `homing run` over loopback, each attacked the
//! way it was found wanting: slow request bodies (`POST /login` with a large `Content-Length`
//! and a byte now and then) that held every `max_concurrent` slot, `/livez` included; many
//! connections from one address; event streams that were not counted; failed logins that
//! locked out the right token. The attackers connect from other loopback addresses
//! (127.0.0.2, ...) than the checks (127.0.0.1), as a client elsewhere would.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use reqwest::header;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::api::{Api, OPERATOR, PRODUCER, READER, TOKENS};
use crate::common::{guest, toml_path};

fn config(port: u16, api: &str) -> String {
    format!(
        r#"
[host]
shutdown_grace = "2s"

[api]
listen = "127.0.0.1:{port}"
request_timeout = "30s"
{api}
{TOKENS}

[plugins.echo]
path = {echo}
"#,
        echo = toml_path(&guest("echo")),
    )
}

async fn start(api: &str) -> (Api, SocketAddr) {
    let api_section = api.to_owned();
    let api = Api::start_with(|port| config(port, &api_section), |_| {}).await;
    let addr: SocketAddr = api.base.trim_start_matches("http://").parse().unwrap();
    (api, addr)
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// A TCP connection to `addr` from the loopback address `from`.
async fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(ip(from), 0)).unwrap();
    socket.connect(addr).await.unwrap()
}

/// An HTTP client whose connections come from the loopback address `from`.
fn client_from(from: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(ip(from))
        .redirect(reqwest::redirect::Policy::none())
        .pool_idle_timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// Reads one response's status line and headers (and as much of its body as its
/// `content-length` says, when it says) within `within`; `None` when the connection closes or
/// the time runs out first.
async fn read_response(stream: &mut TcpStream, within: Duration) -> Option<(u16, String)> {
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let head = &text[..end];
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if text.len() >= end + 4 + length {
                let status = head.split(' ').nth(1)?.parse().ok()?;
                return Some((status, text));
            }
        }
        let n = tokio::time::timeout_at(deadline, stream.read(&mut chunk))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Sends a request head declaring `length` bytes of body and then a byte every 500 ms, until
/// the server answers; returns the status and how long after the head it came. Signals `sent`
/// once the head is written.
async fn trickle(
    addr: SocketAddr,
    from: &'static str,
    head: String,
    sent: tokio::sync::mpsc::Sender<()>,
) -> (Option<u16>, Duration) {
    let stream = connect_from(from, addr).await;
    let (mut reader, mut writer) = stream.into_split();
    writer.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    sent.send(()).await.unwrap();
    let dripping = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if writer.write_all(b"a").await.is_err() {
                return;
            }
        }
    });
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    let status = loop {
        match tokio::time::timeout(Duration::from_secs(40), reader.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => {
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf);
                if let Some(line) = text.lines().next()
                    && text.contains("\r\n")
                {
                    break line.split(' ').nth(1).and_then(|s| s.parse().ok());
                }
            }
            _ => break None,
        }
    };
    dripping.abort();
    (status, started.elapsed())
}

fn slow_post(addr: SocketAddr, path: &str, length: usize, token: Option<&str>) -> String {
    let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/x-www-form-urlencoded\r\n{auth}content-length: {length}\r\n\r\n"
    )
}

/// 40 connections that send `POST /login` slowly, with `max_concurrent = 4`: `/livez` and an
/// authenticated request still answer at once (a slot is taken only after authentication,
/// health takes none), a login body that declares more than the login form's cap is refused
/// at once, one that trickles is cut at `body_timeout` (default 5 s) with 408, and a dashboard
/// action or a `/v1` post without a session or token is refused before its body is read.
/// Before the fix, 4 such connections made every request, `/livez` included, answer 503 for
/// `request_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_hold_no_slot_and_are_cut_at_body_timeout() {
    const SLOW: usize = 40;
    let (api, addr) = start("max_concurrent = 4").await;
    let (sent, mut heads) = tokio::sync::mpsc::channel(SLOW);
    let mut slow = tokio::task::JoinSet::new();
    for i in 0..SLOW {
        // Half declare less than the login form's 8 KiB cap, half more (but less than the
        // 64 KiB of the other forms).
        let length = if i % 2 == 0 { 4_000 } else { 60_000 };
        let head = slow_post(addr, "/login", length, None);
        let sent = sent.clone();
        slow.spawn(async move { (length, trickle(addr, "127.0.0.2", head, sent).await) });
    }
    for _ in 0..SLOW {
        heads.recv().await.unwrap();
    }

    // While the slow bodies are in flight (for the next 5 s), health and work answer at once.
    let checks = client_from("127.0.0.1");
    let until = Instant::now() + Duration::from_millis(2_500);
    let mut probes = 0;
    while Instant::now() < until {
        let started = Instant::now();
        let live =
            tokio::time::timeout(Duration::from_secs(1), checks.get(api.url("/livez")).send())
                .await
                .expect("/livez did not answer within 1 s")
                .unwrap();
        assert_eq!(live.status(), 200, "/livez: {}", live.text().await.unwrap());
        let agents = tokio::time::timeout(
            Duration::from_secs(1),
            checks.get(api.url("/v1/agents")).bearer_auth(READER).send(),
        )
        .await
        .expect("/v1/agents did not answer within 1 s")
        .unwrap();
        assert_eq!(
            agents.status(),
            200,
            "/v1/agents: {}",
            agents.text().await.unwrap()
        );
        assert!(started.elapsed() < Duration::from_secs(1));
        probes += 1;
    }
    assert!(probes >= 5, "only {probes} probes in 2.5 s");

    // A post to an action without a session, or to /v1 without a token, is refused from its
    // head: the body it declares is never waited for.
    for (path, token, expected) in [
        ("/dispatches/x/cancel", None, 401),
        ("/threads/t/interrupt", None, 401),
        ("/logout", None, 403),
        ("/v1/dispatches", None, 401),
        (
            "/v1/threads/t/interrupt",
            Some("wrong-secret-0123456789abcdef"),
            401,
        ),
    ] {
        let mut stream = connect_from("127.0.0.3", addr).await;
        let started = Instant::now();
        stream
            .write_all(slow_post(addr, path, 1_000, token).as_bytes())
            .await
            .unwrap();
        let (status, text) = read_response(&mut stream, Duration::from_secs(2))
            .await
            .unwrap_or_else(|| panic!("{path}: no answer within 2 s"));
        assert_eq!(status, expected, "{path}: {text}");
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    // An authenticated enqueue whose body trickles is cut at body_timeout too, with a JSON 408.
    let mut stream = connect_from("127.0.0.1", addr).await;
    let started = Instant::now();
    stream
        .write_all(slow_post(addr, "/v1/dispatches", 1_000, Some(PRODUCER)).as_bytes())
        .await
        .unwrap();
    stream.write_all(b"{\"agent\": ").await.unwrap();
    let (status, text) = read_response(&mut stream, Duration::from_secs(10))
        .await
        .expect("the slow enqueue was not answered");
    let took = started.elapsed();
    assert_eq!(status, 408, "{text}");
    assert!(text.contains("body_timeout"), "{text}");
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(8),
        "{took:?}"
    );

    // Every slow login was answered: 413 at once past the login cap, else 408 at 5 s.
    while let Some(done) = slow.join_next().await {
        let (length, (status, took)) = done.unwrap();
        if length > 8 << 10 {
            assert_eq!(status, Some(413), "declared {length}");
            assert!(took < Duration::from_secs(2), "413 after {took:?}");
        } else {
            assert_eq!(status, Some(408), "declared {length}");
            assert!(
                took >= Duration::from_secs(4) && took < Duration::from_secs(8),
                "408 after {took:?}"
            );
        }
    }
    let log = api.log();
    for secret in [READER, PRODUCER, OPERATOR] {
        assert!(!log.contains(secret), "a token reached the log");
    }
}

/// `max_connections_per_client = 8`: a ninth connection from one address is answered 503
/// (naming the key) and closed at once, while another address is served; once one of the
/// eight closes, the address is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_client_are_limited_at_accept() {
    let (api, addr) = start("max_connections_per_client = 8").await;
    let livez = format!("GET /livez HTTP/1.1\r\nhost: {addr}\r\n\r\n");
    let mut open = Vec::new();
    for i in 0..8 {
        let mut stream = connect_from("127.0.0.2", addr).await;
        stream.write_all(livez.as_bytes()).await.unwrap();
        let (status, _) = read_response(&mut stream, Duration::from_secs(2))
            .await
            .unwrap_or_else(|| panic!("connection {i} was not served"));
        assert_eq!(status, 200);
        open.push(stream);
    }
    let mut ninth = connect_from("127.0.0.2", addr).await;
    let (status, text) = read_response(&mut ninth, Duration::from_secs(2))
        .await
        .expect("the ninth connection got no answer");
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("max_connections_per_client"), "{text}");
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(2), ninth.read_to_end(&mut rest)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "the ninth is closed"
    );

    let other = client_from("127.0.0.1");
    let r = other.get(api.url("/livez")).send().await.unwrap();
    assert_eq!(r.status(), 200, "another address is served");

    drop(open.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut stream = connect_from("127.0.0.2", addr).await;
        stream.write_all(livez.as_bytes()).await.unwrap();
        match read_response(&mut stream, Duration::from_secs(2)).await {
            Some((200, _)) => break,
            Some((503, _)) | None => {}
            Some((other, text)) => panic!("{other}: {text}"),
        }
        assert!(
            Instant::now() < deadline,
            "a closed connection was not given back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The eight still open are still served.
    for stream in &mut open {
        stream.write_all(livez.as_bytes()).await.unwrap();
        let (status, _) = read_response(stream, Duration::from_secs(2)).await.unwrap();
        assert_eq!(status, 200);
    }
}

/// Opens `GET /v1/threads/t/log/stream` with `token`; the response, open.
async fn stream(api: &Api, token: &str) -> reqwest::Response {
    client_from("127.0.0.1")
        .get(api.url("/v1/threads/t/log/stream"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
}

/// `max_streams = 3`, `max_streams_per_token = 2`: a token's third stream is 429, the fourth
/// stream in all 503, each with a JSON error naming the key; open streams take no slot of
/// `max_concurrent`; a stream closed by its client gives its place back. Before the fix, a
/// stream was not counted once its head was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_streams_are_counted_until_they_end() {
    let (api, _) = start("max_streams = 3\nmax_streams_per_token = 2\nmax_concurrent = 2").await;
    let first = stream(&api, READER).await;
    let second = stream(&api, READER).await;
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    let third = stream(&api, READER).await;
    assert_eq!(third.status(), 429);
    assert!(third.headers().contains_key(header::RETRY_AFTER));
    let body: Value = third.json().await.unwrap();
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("max_streams_per_token"),
        "{body}"
    );
    let other = stream(&api, PRODUCER).await;
    assert_eq!(other.status(), 200, "another token's first");
    let over = stream(&api, OPERATOR).await;
    assert_eq!(over.status(), 503);
    let body: Value = over.json().await.unwrap();
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("[api] max_streams"),
        "{body}"
    );
    // Three streams open, and both slots of max_concurrent free.
    for _ in 0..3 {
        let r = client_from("127.0.0.1")
            .get(api.url("/v1/agents"))
            .bearer_auth(READER)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }

    drop(first);
    let closed = Instant::now();
    let deadline = closed + Duration::from_secs(30);
    loop {
        let again = stream(&api, READER).await;
        if again.status() == 200 {
            break;
        }
        assert_eq!(again.status(), 429);
        assert!(
            Instant::now() < deadline,
            "a closed stream was not given back within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "a closed stream's place came back after {:?}",
        closed.elapsed()
    );
    drop((second, other));
}

/// Failed tokens are limited per client address and never lock out a right token: 30 wrong
/// logins from one address, then the 31st is 429 with `Retry-After`, and the right token
/// still logs in from that address; another address is not limited. The same for bearer
/// tokens on `/v1`. Before the fix, 30 wrong logins from anyone refused every login,
/// the right token's included, for a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_tokens_are_limited_per_address_and_never_lock_out_a_right_one() {
    let (api, _) = start("").await;
    let wrong = "wrong-token-0123456789abcdef";
    let login = |client: &reqwest::Client, token: &str| {
        client
            .post(api.url("/login"))
            .form(&[("token", token), ("next", "/agents")])
            .send()
    };
    let guesser = client_from("127.0.0.2");
    for i in 0..30 {
        let r = login(&guesser, wrong).await.unwrap();
        assert_eq!(r.status(), 401, "wrong login {i}");
    }
    let r = login(&guesser, wrong).await.unwrap();
    assert_eq!(r.status(), 429);
    let retry: u64 = r.headers()[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    let r = login(&guesser, READER).await.unwrap();
    assert_eq!(
        r.status(),
        303,
        "a right token logs in from the same address"
    );
    assert_eq!(r.headers()[header::LOCATION], "/agents");
    let operator = client_from("127.0.0.1");
    let r = login(&operator, wrong).await.unwrap();
    assert_eq!(r.status(), 401, "another address is not limited");
    let r = login(&operator, OPERATOR).await.unwrap();
    assert_eq!(r.status(), 303);

    // Bearer tokens on /v1, from a third address.
    let guesser = client_from("127.0.0.3");
    let agents = |client: &reqwest::Client, token: &str| {
        client.get(api.url("/v1/agents")).bearer_auth(token).send()
    };
    for i in 0..30 {
        let r = agents(&guesser, wrong).await.unwrap();
        assert_eq!(r.status(), 401, "wrong token {i}");
    }
    for _ in 0..3 {
        let r = agents(&guesser, wrong).await.unwrap();
        assert_eq!(r.status(), 429);
        assert!(r.headers().contains_key(header::RETRY_AFTER));
        let body: Value = r.json().await.unwrap();
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .contains("too many invalid tokens"),
            "{body}"
        );
    }
    let r = agents(&guesser, READER).await.unwrap();
    assert_eq!(r.status(), 200, "a right bearer token passes");
    // A missing token is not a guess: 401, not 429.
    let r = guesser.get(api.url("/v1/agents")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = agents(&client_from("127.0.0.4"), wrong).await.unwrap();
    assert_eq!(r.status(), 401, "another address is not limited");

    let log = api.log();
    assert_eq!(
        log.matches("too many invalid tokens from this address")
            .count(),
        2,
        "one line per address and run of failures:\n{log}"
    );
    for secret in [READER, PRODUCER, OPERATOR, wrong] {
        assert!(!log.contains(secret), "a token reached the log");
    }
}
