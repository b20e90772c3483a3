//! Outbound HTTP from guests, end to end: a real `homing run` with the `http-probe` guest,
//! against HTTP and HTTPS servers on the loopback address that these tests run themselves.
//!
//! What is proven: allowed requests round trip with headers and bodies; everything else is
//! refused before a byte leaves (an origin not on the list, a listed name that resolves to a
//! loopback or link-local address, a named address on a port its entry does not name); TLS verifies against `tls_ca`; a slow server is cut at the
//! dispatch's deadline and the dispatch retried; an interrupt ends a request in flight; an
//! oversized response is refused naming the cap; a secret variable reaches the server but no
//! log line, stored record or CLI output; a missing required secret is a config error.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::routing::any;
use serde_json::{Value, json};

use crate::common::{Env, guest, signal, toml_path, wait_exit};

/// One request a test server received.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

#[derive(Clone, Default)]
struct Server {
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Polls until the server has seen `n` requests.
    fn wait_for(&self, n: usize, within: Duration) {
        let deadline = Instant::now() + within;
        while self.seen().len() < n {
            assert!(
                Instant::now() < deadline,
                "the server saw {} requests, not {n}, within {within:?}",
                self.seen().len()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `/echo` answers with what it received; `/slow` answers after 60 s; `/big` sends 64 KiB.
async fn handle(
    State(server): State<Server>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, HeaderMap, Vec<u8>) {
    let seen = Seen {
        method: method.to_string(),
        path: uri.path().to_owned(),
        headers: headers
            .iter()
            .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
            .collect(),
        body: body.to_vec(),
    };
    server.seen.lock().unwrap().push(seen.clone());
    let mut out = HeaderMap::new();
    match uri.path() {
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(60)).await;
            (StatusCode::OK, out, b"late".to_vec())
        }
        "/big" => (StatusCode::OK, out, vec![b'x'; 64 * 1024]),
        _ => {
            out.insert("x-served-by", "outbound-test".parse().unwrap());
            // `/reflect` also sends its `x-test` header back as a response header.
            if uri.path() == "/reflect"
                && let Some(value) = headers.get("x-test")
            {
                out.insert("x-reflected", value.clone());
            }
            let reply = json!({
                "method": seen.method,
                "header": headers.get("x-test").map(|v| v.to_str().unwrap_or_default()),
                "body": String::from_utf8_lossy(&seen.body),
            });
            (StatusCode::CREATED, out, reply.to_string().into_bytes())
        }
    }
}

/// Starts the test server on a loopback port in a thread of its own; with `tls`, it serves
/// HTTPS with that server configuration.
fn start_server(tls: Option<Arc<rustls::ServerConfig>>) -> (Server, SocketAddr) {
    let server = Server::default();
    let app = Router::new()
        .fallback(any(handle))
        .with_state(server.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            match tls {
                None => axum::serve(listener, app).await.unwrap(),
                Some(config) => serve_tls(listener, app, config).await,
            }
        });
    });
    let addr = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    (server, addr)
}

async fn serve_tls(
    listener: tokio::net::TcpListener,
    app: Router,
    config: Arc<rustls::ServerConfig>,
) {
    use hyper_util::rt::TokioIo;
    use hyper_util::service::TowerToHyperService;
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(tcp).await else {
                return;
            };
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app))
                .await;
        });
    }
}

/// A config running the probe with `extra` plugin keys and `host` keys.
fn config(host: &str, plugin: &str) -> String {
    format!(
        "[host]\nlease = \"5s\"\nsweep_interval = \"200ms\"\n{host}\n[plugins.probe]\npath = {}\nconcurrency = 2\ntimeout = \"10s\"\nmax_attempts = 1\n{plugin}\n",
        toml_path(&guest("http_probe"))
    )
}

fn probe(env: &Env, payload: Value) -> Value {
    let id = env.enqueue("probe", "t", &payload.to_string(), &[]);
    env.run_until_idle();
    env.show(&id)
}

fn output(d: &Value) -> Value {
    let text = d["result"]["output"].as_str().unwrap_or_default();
    serde_json::from_str(text).unwrap_or_else(|_| panic!("not a probe report: {d}"))
}

#[test]
fn allowed_get_and_post_round_trip_with_headers_and_bodies() {
    let (server, addr) = start_server(None);
    let env = Env::new(&config(
        "",
        &format!(
            "allowed_outbound_hosts = [\"http://127.0.0.1:{}\"]\n",
            addr.port()
        ),
    ));
    let get = probe(
        &env,
        json!({"url": format!("http://127.0.0.1:{}/echo?q=1", addr.port()), "headers": [["x-test", "get-header"]]}),
    );
    assert_eq!(get["status"], "acked", "{get}");
    let report = output(&get);
    assert_eq!(report["status"], 201);
    let reply: Value = serde_json::from_str(report["body"].as_str().unwrap()).unwrap();
    assert_eq!(reply["method"], "GET");
    assert_eq!(reply["header"], "get-header");
    assert!(
        report["headers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h[0] == "x-served-by" && h[1] == "outbound-test"),
        "{report}"
    );

    let post = probe(
        &env,
        json!({"method": "POST", "url": format!("http://127.0.0.1:{}/echo", addr.port()),
               "headers": [["x-test", "post-header"], ["content-type", "application/json"]],
               "body": "{\"hello\":\"world\"}"}),
    );
    assert_eq!(post["status"], "acked", "{post}");
    let reply: Value = serde_json::from_str(output(&post)["body"].as_str().unwrap()).unwrap();
    assert_eq!(reply["method"], "POST");
    assert_eq!(reply["body"], "{\"hello\":\"world\"}");
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].method, "POST");
    assert_eq!(seen[1].body, b"{\"hello\":\"world\"}");
    assert_eq!(seen[0].path, "/echo");
}

#[test]
fn an_origin_not_on_the_list_is_refused_and_logged_and_nothing_is_sent() {
    let (server, addr) = start_server(None);
    // Deny by default: no list at all.
    let env = Env::new(&config("", ""));
    let denied = probe(
        &env,
        json!({"url": format!("http://127.0.0.1:{}/echo", addr.port())}),
    );
    assert_eq!(denied["status"], "dead_letter", "{denied}");
    let error = denied["last_error"].as_str().unwrap();
    assert!(error.contains("HTTP-request-denied"), "{error}");

    // Listed: another port, another scheme, another host: each refused.
    let env = Env::new(&config(
        "",
        &format!(
            "allowed_outbound_hosts = [\"http://127.0.0.1:{}\", \"https://127.0.0.1:*\"]\n",
            addr.port() + 1
        ),
    ));
    for url in [
        format!("http://127.0.0.1:{}/echo", addr.port()),
        format!("http://localhost:{}/echo", addr.port()),
    ] {
        let id = env.enqueue("probe", "t", &json!({ "url": url }).to_string(), &[]);
        let log = env.run_until_idle();
        let d = env.show(&id);
        assert_eq!(d["status"], "dead_letter", "{d}");
        assert!(
            d["last_error"]
                .as_str()
                .unwrap()
                .contains("HTTP-request-denied"),
            "{d}"
        );
        let line = log
            .lines()
            .find(|l| l.contains("outbound request refused"))
            .unwrap_or_else(|| panic!("no refusal line in the log:\n{log}"));
        assert!(line.contains("probe"), "{line}");
        assert!(line.contains(&id), "{line}");
        assert!(line.contains(&format!(":{}", addr.port())), "{line}");
        assert!(line.contains("allowed_outbound_hosts"), "{line}");
    }
    assert!(
        server.seen().is_empty(),
        "a refused request reached the server"
    );
}

#[test]
fn a_listed_name_resolving_to_a_non_public_address_is_refused_unless_the_address_is_listed() {
    let (server, addr) = start_server(None);
    let port = addr.port();
    let hosts =
        "hosts = { \"models.test\" = \"127.0.0.1\", \"metadata.test\" = \"169.254.169.254\" }";
    let url = format!("http://models.test:{port}/echo");

    let env = Env::new(&config(
        hosts,
        "allowed_outbound_hosts = [\"http://models.test:*\", \"http://metadata.test\", \"http://*:*\"]\n",
    ));
    for url in [
        url.clone(),
        "http://metadata.test/latest".into(),
        "http://169.254.169.254/latest/meta-data".into(),
    ] {
        let d = probe(&env, json!({ "url": url }));
        assert_eq!(d["status"], "dead_letter", "{d}");
        let error = d["last_error"].as_str().unwrap();
        assert!(
            error.contains("destination-IP-prohibited"),
            "{url}: {error}"
        );
    }
    assert!(server.seen().is_empty());

    // Naming the address lets the same name through.
    let env = Env::new(&config(
        hosts,
        "allowed_outbound_hosts = [\"http://models.test:*\", \"http://127.0.0.1:*\"]\n",
    ));
    let d = probe(&env, json!({ "url": url }));
    assert_eq!(d["status"], "acked", "{d}");
    assert_eq!(output(&d)["status"], 201);
    assert_eq!(server.seen().len(), 1);
    let host_header = server.seen()[0]
        .headers
        .iter()
        .find(|(k, _)| k == "host")
        .map(|(_, v)| v.clone());
    assert_eq!(
        host_header.as_deref(),
        Some(format!("models.test:{port}").as_str())
    );

    // And localhost, named, reaches loopback.
    let env = Env::new(&config(
        "",
        &format!("allowed_outbound_hosts = [\"http://localhost:{port}\"]\n"),
    ));
    let d = probe(
        &env,
        json!({ "url": format!("http://localhost:{port}/echo") }),
    );
    assert_eq!(d["status"], "acked", "{d}");
}

#[test]
fn a_named_address_opens_only_the_scheme_and_port_its_entry_names() {
    // Issue 32: `http://*:*` beside `http://127.0.0.1:PORT` let a guest reach 127.0.0.1 on
    // any port and send its API key there. The entry that names the address must also cover
    // the request's scheme and port.
    let secret = "sk-homing-test-other-port-7c1d2e3f4a5b";
    let (named, named_addr) = start_server(None);
    let (other, other_addr) = start_server(None);
    let (named_port, other_port) = (named_addr.port(), other_addr.port());
    let env = Env::new(&config(
        "",
        &format!(
            "allowed_outbound_hosts = [\"http://*:*\", \"http://127.0.0.1:{named_port}\", \"http://localhost:{named_port}\"]\n[plugins.probe.variables]\napi_key = {{ file = \"key.txt\", secret = true }}\n"
        ),
    ));
    std::fs::write(env.path().join("key.txt"), secret).unwrap();
    let send = |host: &str, port: u16| {
        env.enqueue(
            "probe",
            "t",
            &json!({ "url": format!("http://{host}:{port}/echo"),
                     "headers": [["authorization", "Bearer {config.api_key}"]] })
            .to_string(),
            &[],
        )
    };
    let refused = [send("127.0.0.1", other_port), send("localhost", other_port)];
    let allowed = [send("127.0.0.1", named_port), send("localhost", named_port)];
    let log = env.run_until_idle();
    for id in refused {
        let d = env.show(&id);
        assert_eq!(d["status"], "dead_letter", "{d}");
        let error = d["last_error"].as_str().unwrap();
        assert!(error.contains("destination-IP-prohibited"), "{error}");
        let line = log
            .lines()
            .find(|l| l.contains("outbound request refused") && l.contains(&id))
            .unwrap_or_else(|| panic!("no refusal line for {id} in:\n{log}"));
        assert!(line.contains("this scheme and port"), "{line}");
    }
    assert!(
        other.seen().is_empty(),
        "a request reached the port no entry names: {:?}",
        other.seen()
    );
    for id in allowed {
        let d = env.show(&id);
        assert_eq!(d["status"], "acked", "{d}");
        assert_eq!(output(&d)["status"], 201);
    }
    let seen = named.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen.iter().all(|s| {
        s.headers
            .iter()
            .any(|(k, v)| k == "authorization" && v == &format!("Bearer {secret}"))
    }));
    assert!(!log.contains(secret), "the secret is in the log:\n{log}");
}

/// A test CA and a server certificate for `localhost` and 127.0.0.1 signed by it.
fn test_pki() -> (String, Arc<rustls::ServerConfig>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "homing test CA");
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .unwrap();
    let cert = params.signed_by(&key, &ca).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
    )
    .unwrap();
    (ca.pem(), Arc::new(config))
}

#[test]
fn https_verifies_against_tls_ca_and_fails_without_it() {
    let (ca_pem, tls) = test_pki();
    let (server, addr) = start_server(Some(tls));
    let port = addr.port();
    let allow = format!("allowed_outbound_hosts = [\"https://localhost:{port}\"]\n");
    let url = format!("https://localhost:{port}/echo");

    let env = Env::new(&config("", &allow));
    let d = probe(&env, json!({ "url": url }));
    assert_eq!(d["status"], "dead_letter", "{d}");
    let error = d["last_error"].as_str().unwrap();
    assert!(error.contains("TLS-certificate-error"), "{error}");
    assert!(server.seen().is_empty());

    let env = Env::new(&config("tls_ca = \"ca.pem\"", &allow));
    std::fs::write(env.path().join("ca.pem"), &ca_pem).unwrap();
    let d = probe(
        &env,
        json!({ "method": "POST", "url": url, "body": "over tls" }),
    );
    assert_eq!(d["status"], "acked", "{d}");
    let reply: Value = serde_json::from_str(output(&d)["body"].as_str().unwrap()).unwrap();
    assert_eq!(reply["body"], "over tls");

    // Per plugin works the same; a file that is no certificate fails the config check.
    let env = Env::new(&config("", &format!("{allow}tls_ca = \"ca.pem\"\n")));
    std::fs::write(env.path().join("ca.pem"), &ca_pem).unwrap();
    assert_eq!(probe(&env, json!({ "url": url }))["status"], "acked");
    std::fs::write(env.path().join("ca.pem"), "not a certificate").unwrap();
    let err = env.fails(&["config", "check"]);
    assert!(err.contains("tls_ca") && err.contains("ca.pem"), "{err}");
}

#[test]
fn a_slow_server_is_cut_at_the_deadline_and_the_dispatch_retried() {
    let (server, addr) = start_server(None);
    let env = Env::new(&format!(
        "[host]\nlease = \"5s\"\nsweep_interval = \"200ms\"\n[plugins.probe]\npath = {}\ntimeout = \"1s\"\nmax_attempts = 2\nallowed_outbound_hosts = [\"http://127.0.0.1:{}\"]\n[plugins.probe.retry]\ninitial = \"10ms\"\nmax = \"10ms\"\n",
        toml_path(&guest("http_probe")),
        addr.port()
    ));
    let id = env.enqueue(
        "probe",
        "t",
        &json!({ "url": format!("http://127.0.0.1:{}/slow", addr.port()) }).to_string(),
        &[],
    );
    let started = Instant::now();
    let log = env.run_until_idle();
    let d = env.show(&id);
    assert_eq!(d["status"], "dead_letter", "{d}");
    assert_eq!(d["attempt"], 2, "retried once: {d}");
    assert_eq!(server.seen().len(), 2, "one request per attempt");
    // Both attempts ended at their deadline, not at the server's 60 s.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert!(
        log.contains("timed out") || log.contains("deadline"),
        "no timeout in the log:\n{log}"
    );
}

#[test]
fn an_interrupt_ends_a_request_in_flight() {
    let (server, addr) = start_server(None);
    let env = Env::new(&format!(
        "[host]\nlease = \"60s\"\nsweep_interval = \"200ms\"\n[plugins.probe]\npath = {}\ntimeout = \"120s\"\nallowed_outbound_hosts = [\"http://127.0.0.1:{}\"]\n",
        toml_path(&guest("http_probe")),
        addr.port()
    ));
    let id = env.enqueue(
        "probe",
        "talk",
        &json!({ "url": format!("http://127.0.0.1:{}/slow", addr.port()), "timeout_ms": 110_000 })
            .to_string(),
        &[],
    );
    let mut host = env.spawn_run();
    server.wait_for(1, Duration::from_secs(30));
    env.ok(&["thread", "interrupt", "talk"]);
    // The request would hang for 60 s; the interrupt ends it at once.
    let d = env.wait_status(&id, "superseded", Duration::from_secs(10));
    assert!(d["result"].is_null(), "{d}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !env.host_log().contains("the claim must stop") {
        assert!(
            Instant::now() < deadline,
            "no cancel line:\n{}",
            env.host_log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(&host, "TERM");
    assert!(wait_exit(&mut host, Duration::from_secs(15)).success());
}

#[test]
fn an_oversized_response_or_request_is_refused_naming_the_cap() {
    let (_server, addr) = start_server(None);
    let env = Env::new(&config(
        "",
        &format!(
            "allowed_outbound_hosts = [\"http://127.0.0.1:{}\"]\n[plugins.probe.http]\nmax_response_body = \"1KiB\"\nmax_request_body = \"16\"\n",
            addr.port()
        ),
    ));
    let id = env.enqueue(
        "probe",
        "t",
        &json!({ "url": format!("http://127.0.0.1:{}/big", addr.port()) }).to_string(),
        &[],
    );
    let log = env.run_until_idle();
    let d = env.show(&id);
    assert_eq!(d["status"], "dead_letter", "{d}");
    assert!(
        d["last_error"]
            .as_str()
            .unwrap()
            .contains("HTTP-response-body-size"),
        "{d}"
    );
    assert!(
        log.contains("http.max_response_body of 1024 bytes"),
        "{log}"
    );

    let id = env.enqueue(
        "probe",
        "t",
        &json!({ "method": "POST", "url": format!("http://127.0.0.1:{}/echo", addr.port()), "body": "x".repeat(100) })
            .to_string(),
        &[],
    );
    let log = env.run_until_idle();
    let d = env.show(&id);
    assert!(
        d["last_error"]
            .as_str()
            .unwrap()
            .contains("HTTP-request-body-size"),
        "{d}"
    );
    assert!(log.contains("http.max_request_body of 16 bytes"), "{log}");
}

#[test]
fn a_secret_reaches_the_server_but_no_log_record_or_output() {
    let secret = "sk-homing-test-0a1b2c3d4e5f60718293";
    let (server, addr) = start_server(None);
    let env = Env::new(&config(
        "",
        &format!(
            "allowed_outbound_hosts = [\"http://127.0.0.1:{}\"]\n[plugins.probe.variables]\nmodel = \"small\"\napi_key = {{ file = \"key.txt\", secret = true }}\n[plugins.probe.env]\nAPI_KEY = {{ file = \"key.txt\", secret = true }}\n",
            addr.port()
        ),
    ));
    std::fs::write(env.path().join("key.txt"), format!("{secret}\n")).unwrap();
    let id = env.enqueue(
        "probe",
        "t",
        &json!({ "url": format!("http://127.0.0.1:{}/echo", addr.port()),
                 "headers": [["authorization", "Bearer {config.api_key}"]],
                 "config_keys": ["model"] })
        .to_string(),
        &[],
    );
    // A token in the path (as some APIs take it): the log line shows the path redacted.
    let in_path = env.enqueue(
        "probe",
        "t2",
        &json!({ "url": format!("http://127.0.0.1:{}/bot{{config.api_key}}/send", addr.port()) })
            .to_string(),
        &[],
    );
    let mut outputs = vec![
        env.ok(&["config", "check"]),
        env.ok(&["config", "check", "--json"]),
    ];
    let log = env.run_until_idle();
    let d = env.show(&id);
    assert_eq!(d["status"], "acked", "{d}");
    assert_eq!(output(&d)["config"]["model"], "small");
    assert_eq!(env.show(&in_path)["status"], "acked");

    // It reached the server, in the header and the path the guest built.
    let seen = server.seen();
    let auth = seen
        .iter()
        .find(|s| s.path == "/echo")
        .and_then(|s| s.headers.iter().find(|(k, _)| k == "authorization"))
        .map(|(_, v)| v.clone());
    assert_eq!(auth.as_deref(), Some(format!("Bearer {secret}").as_str()));
    assert!(
        seen.iter().any(|s| s.path == format!("/bot{secret}/send")),
        "{seen:?}"
    );
    let line = log
        .lines()
        .find(|l| l.contains("outbound request") && l.contains(&in_path))
        .unwrap_or_else(|| panic!("no request line for {in_path}:\n{log}"));
    assert!(line.contains("/bot[redacted]/send"), "{line}");

    // And nowhere else: the host log, every CLI output, the store's bytes.
    outputs.push(log);
    outputs.push(env.ok(&["dispatch", "show", &id, "--json"]));
    outputs.push(env.ok(&["dispatch", "list", "--json"]));
    outputs.push(env.ok(&["thread", "log", "t"]));
    for text in &outputs {
        assert!(!text.contains(secret), "the secret leaked:\n{text}");
    }
    assert!(
        outputs[0].contains("secret api_key from file key.txt"),
        "{}",
        outputs[0]
    );
    for entry in std::fs::read_dir(env.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n == "key.txt") || path.is_dir() {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "the secret is in {}",
            path.display()
        );
    }
}

/// Secrets a journaled run sends as a whole URL (a webhook's), a path segment, a query value,
/// a header value and a body fragment reach the server, and no place a person or a tool reads:
/// the host's log, the journal routes, `homing dispatch show --journal` (text and JSON), the
/// dashboard's dispatch page, the store's files. A response that echoes one is journaled
/// without its body, and with the secret scrubbed from its headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_in_every_part_of_a_journaled_request_stay_out_of_every_view() {
    use crate::api::{Api, READER, TOKENS};
    use crate::dashboard::{raw_client, session};
    let (server, addr) = start_server(None);
    let port = addr.port();
    let token = "XyZ0a1b2c3d4e5f6g7h8i9j0kLmN";
    let hook = format!("http://127.0.0.1:{port}/services/T0001/B0002/{token}");
    let secrets = [
        ("hook", hook.clone()),
        ("segment", "seg-0123456789abcdef-0123".to_owned()),
        ("query", "qv-0123456789abcdef-4567".to_owned()),
        ("header", "hv-0123456789abcdef-89ab".to_owned()),
        ("body", "bd-0123456789abcdef-cdef".to_owned()),
    ];
    let api = Api::start_with(
        |api_port| {
            let mut vars = String::new();
            for (name, _) in &secrets {
                vars.push_str(&format!(
                    "{name} = {{ file = \"{name}.txt\", secret = true }}\n"
                ));
            }
            format!(
                "[host]\nlease = \"5s\"\nsweep_interval = \"200ms\"\nshutdown_grace = \"2s\"\n\n[api]\nlisten = \"127.0.0.1:{api_port}\"\nrequest_timeout = \"10s\"\n{TOKENS}\n\n[plugins.probe]\npath = {}\nconcurrency = 2\ntimeout = \"10s\"\nmax_attempts = 1\njournal = \"run\"\nallowed_outbound_hosts = [\"http://127.0.0.1:{port}\"]\n[plugins.probe.variables]\n{vars}",
                toml_path(&guest("http_probe"))
            )
        },
        |dir| {
            for (name, value) in &secrets {
                std::fs::write(dir.join(format!("{name}.txt")), format!("{value}\n")).unwrap();
            }
        },
    )
    .await;
    let base = format!("http://127.0.0.1:{port}");
    let payloads = [
        // The webhook, whole; its server echoes the body, which holds no secret.
        json!({ "method": "POST", "url": "{config.hook}", "body": "{\"text\":\"deployed\"}", "quiet": true }),
        // A path segment and a query value.
        json!({ "url": format!("{base}/bot/{{config.segment}}/send?key={{config.query}}&mode=x"), "quiet": true }),
        // A header, reflected by the server in its headers and its body.
        json!({ "url": format!("{base}/reflect"), "headers": [["x-test", "{config.header}"]], "quiet": true }),
        // A body fragment, echoed in the response's body.
        json!({ "method": "POST", "url": format!("{base}/echo"), "body": "{\"secret\":\"{config.body}\"}", "quiet": true }),
    ];
    let mut ids = Vec::new();
    for payload in payloads {
        ids.push(
            api.enqueue(
                json!({ "agent": "probe", "thread": "leak", "payload": payload.to_string() }),
            )
            .await,
        );
    }
    for id in &ids {
        let d = api.wait_terminal(id).await;
        assert_eq!(d["status"], "acked", "{d}");
    }

    // Every secret reached the server where the guest put it.
    let seen = server.seen();
    assert!(
        seen.iter()
            .any(|s| s.path == format!("/services/T0001/B0002/{token}"))
    );
    assert!(
        seen.iter()
            .any(|s| s.path == format!("/bot/{}/send", secrets[1].1))
    );
    assert!(seen.iter().any(|s| {
        s.headers
            .iter()
            .any(|(k, v)| k == "x-test" && *v == secrets[3].1)
    }));
    assert!(
        seen.iter()
            .any(|s| String::from_utf8_lossy(&s.body).contains(&secrets[4].1))
    );

    // What a person or a tool reads.
    let mut views: Vec<(String, String)> = Vec::new();
    let client = raw_client();
    let (cookie, _) = session(&api, &client, READER).await;
    for id in &ids {
        let (status, list) = api.get(&format!("/v1/dispatches/{id}/journal")).await;
        assert_eq!(status, 200, "{list}");
        let entries = list["entries"].as_array().unwrap();
        assert_eq!(entries.len(), 1, "{list}");
        views.push((format!("journal list {id}"), list.to_string()));
        let (status, entry) = api.get(&format!("/v1/dispatches/{id}/journal/0")).await;
        assert_eq!(status, 200, "{entry}");
        views.push((format!("journal entry {id}"), entry.to_string()));
        views.push((
            format!("dispatch show --journal {id}"),
            api.env.ok(&["dispatch", "show", id, "--journal"]),
        ));
        views.push((
            format!("dispatch show --journal --json {id}"),
            api.env.ok(&["dispatch", "show", id, "--journal", "--json"]),
        ));
        let page = client
            .get(api.url(&format!("/dispatches/{id}")))
            .header(reqwest::header::COOKIE, &cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(page.status(), 200);
        views.push((format!("dashboard {id}"), page.text().await.unwrap()));
    }
    // The entries, as they show: each URL scrubbed, and the responses that echoed a secret
    // kept without their bodies (a replay then goes live).
    let entry = |i: usize| {
        let (_, text) = &views[i * 5 + 1];
        serde_json::from_str::<Value>(text).unwrap()
    };
    assert_eq!(entry(0)["url"], format!("{base}[redacted]"), "{}", entry(0));
    assert!(
        entry(0)["body"].is_string(),
        "no secret, kept: {}",
        entry(0)
    );
    assert_eq!(
        entry(1)["url"],
        format!("{base}/bot/[redacted]/send?key=&mode="),
        "{}",
        entry(1)
    );
    let reflected = &entry(2)["answer"]["headers"];
    assert!(
        reflected
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h[0] == "x-reflected" && h[1] == "[redacted]"),
        "{reflected}"
    );
    assert!(
        entry(2).get("body").is_none_or(Value::is_null),
        "{}",
        entry(2)
    );
    assert!(
        entry(3).get("body").is_none_or(Value::is_null),
        "{}",
        entry(3)
    );
    views.push(("host log".to_owned(), api.log()));
    views.push((
        "thread log".to_owned(),
        api.env.ok(&["thread", "log", "leak"]),
    ));
    for (name, text) in &views {
        for (secret, value) in &secrets {
            assert!(
                !text.contains(value.as_str()),
                "the {secret} secret leaked into the {name}:\n{text}"
            );
        }
        assert!(
            !text.contains(token),
            "the webhook's token leaked into the {name}:\n{text}"
        );
    }
    // The log line of each request is there, scrubbed.
    let host_log = api.log();
    assert!(host_log.contains("/bot/[redacted]/send"), "{host_log}");
    // And the store's files hold none of them.
    for entry in std::fs::read_dir(api.env.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "txt") || path.is_dir() {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        for (secret, value) in &secrets {
            assert!(
                memchr_find(&bytes, value.as_bytes()).is_none()
                    && memchr_find(&bytes, token.as_bytes()).is_none(),
                "the {secret} secret is in {}",
                path.display()
            );
        }
    }
}

/// Where `needle` is in `haystack`.
fn memchr_find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[test]
fn a_missing_required_secret_is_a_config_error_naming_it_and_where_it_was_looked_for() {
    let env = Env::new(&config(
        "",
        "[plugins.probe.variables]\napi_key = { env = \"HOMING_TEST_UNSET_API_KEY\", secret = true }\n",
    ));
    let expected = "[plugins.probe.variables] `api_key` is required but environment variable HOMING_TEST_UNSET_API_KEY is not set";
    let err = env.fails(&["config", "check"]);
    assert!(err.contains(expected), "{err}");
    let out = env
        .command(&["run", "--until-idle"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(expected), "{err}");
    // The commands that run no guest do not need it.
    env.enqueue("probe", "t", "{}", &[]);

    // Set, it runs.
    let out = env
        .command(&["run", "--until-idle"])
        .env("HOMING_TEST_UNSET_API_KEY", "now-it-is-set-0123456789")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
