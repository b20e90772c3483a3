//! Traces (issue 14): a real `homing run` exporting spans over OTLP/HTTP to a stand-in
//! collector on the loopback address, which decodes the protobuf batches it is sent.
//!
//! - a dispatch enqueued with a `traceparent` is traced as a `homing.dispatch` span whose
//!   parent is that `traceparent`, with the guest call, the store operations and the guest's
//!   outbound request beneath it; the server the guest called receives the trace context of
//!   the request's own span;
//! - a dispatch enqueued without one starts a trace of its own;
//! - with no collector configured, a guest's request still carries the dispatch's
//!   `traceparent` unchanged;
//! - work a guest enqueues continues the trace: its span is a child of the attempt that
//!   enqueued it (or, with no collector, it carries the same `traceparent` on);
//! - a collector URL that is not one is refused by `homing config check`, naming the key.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use prost::Message;
use serde_json::{Value, json};

use crate::common::{Env, Served, guest, toml_path};
use crate::outbound_guests::{EchoServer, output, probe_config, run_until_idle_with};

/// A span as the collector received it.
#[derive(Debug, Clone)]
struct Got {
    name: String,
    trace: String,
    id: String,
    parent: String,
    attributes: BTreeMap<String, String>,
    /// Each attribute's OTLP type: `string`, `int`, `bool`, `double` or what else came.
    kinds: BTreeMap<String, &'static str>,
}

/// A stand-in OTLP/HTTP collector: `POST /v1/traces` with a protobuf body.
struct Collector {
    served: Served,
    received: Arc<Mutex<Received>>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the collector received: the spans, and each request's target as it came on the wire.
#[derive(Default)]
struct Received {
    spans: Vec<Got>,
    targets: Vec<String>,
    /// Each export's `x-api-key` header, if it had one.
    keys: Vec<Option<String>>,
}

async fn receive(
    State(received): State<Arc<Mutex<Received>>>,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> &'static str {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf batch");
    let mut received = received.lock().unwrap();
    received.targets.push(uri.to_string());
    received.keys.push(
        headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    );
    let spans = &mut received.spans;
    for resource in request.resource_spans {
        for scope in resource.scope_spans {
            for span in scope.spans {
                let (attributes, kinds) = span
                    .attributes
                    .iter()
                    .map(|kv| {
                        let (value, kind) = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                            Some(Any::StringValue(s)) => (s.clone(), "string"),
                            Some(Any::IntValue(i)) => (i.to_string(), "int"),
                            Some(Any::BoolValue(b)) => (b.to_string(), "bool"),
                            Some(Any::DoubleValue(d)) => (d.to_string(), "double"),
                            other => (format!("{other:?}"), "other"),
                        };
                        ((kv.key.clone(), value), (kv.key.clone(), kind))
                    })
                    .unzip();
                spans.push(Got {
                    name: span.name,
                    trace: hex(&span.trace_id),
                    id: hex(&span.span_id),
                    parent: hex(&span.parent_span_id),
                    attributes,
                    kinds,
                });
            }
        }
    }
    ""
}

impl Collector {
    fn start() -> Collector {
        let received = Arc::new(Mutex::new(Received::default()));
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(receive))
            .with_state(Arc::clone(&received));
        Collector {
            served: Served::start(app),
            received,
        }
    }

    fn spans(&self) -> Vec<Got> {
        self.received.lock().unwrap().spans.clone()
    }

    /// The request target of every export, as it came on the wire.
    fn targets(&self) -> Vec<String> {
        self.received.lock().unwrap().targets.clone()
    }

    /// The `x-api-key` of every export.
    fn keys(&self) -> Vec<Option<String>> {
        self.received.lock().unwrap().keys.clone()
    }
}

/// The `homing.dispatch` span of dispatch `id`.
fn dispatch_span(spans: &[Got], id: &str) -> Got {
    spans
        .iter()
        .find(|s| {
            s.name == "homing.dispatch"
                && s.attributes.get("homing.dispatch_id").map(String::as_str) == Some(id)
        })
        .unwrap_or_else(|| panic!("no homing.dispatch span for {id}: {spans:#?}"))
        .clone()
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

fn traceparent() -> String {
    format!("00-{TRACE}-{PARENT}-01")
}

/// The `traceparent` header the echo server saw, from a probe's output.
fn traceparent_seen(out: &str) -> Option<String> {
    let got: Value = serde_json::from_str(out).unwrap();
    let echoed: Value = serde_json::from_str(got["body"].as_str().unwrap()).unwrap();
    echoed["headers"]["traceparent"].as_str().map(str::to_owned)
}

#[test]
fn spans_reach_the_collector_under_the_enqueued_traceparent() {
    let collector = Collector::start();
    let server = EchoServer::start();
    let config = format!(
        "{}\n[telemetry]\notlp_endpoint = \"http://{}\"\nservice_name = \"homing-test\"\n\
         [telemetry.headers]\n\"x-api-key\" = {{ env = \"HOMING_TEST_OTLP_KEY\", secret = true }}\n",
        probe_config(r#"allowed_outbound_hosts = ["http://127.0.0.1:*"]"#, ""),
        collector.served.addr
    );
    let env = Env::new(&config);
    // The key is required: without it the check (and a start) stops, naming the header.
    let refused = env.fails(&["config", "check"]);
    assert!(
        refused.contains("[telemetry] headers.x-api-key")
            && refused.contains("HOMING_TEST_OTLP_KEY"),
        "{refused}"
    );
    const OTLP_KEY: &str = "otlp-key-for-the-trace-test-90d1";
    let out = env
        .command(&["config", "check"])
        .env("HOMING_TEST_OTLP_KEY", OTLP_KEY)
        .output()
        .unwrap();
    let checked = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{checked}");
    assert!(
        !checked.contains(OTLP_KEY),
        "config check showed the key: {checked}"
    );
    assert!(
        checked.contains(&format!(
            "traces: exported to http://{}/v1/traces (from [telemetry] otlp_endpoint; headers: \
             x-api-key from environment variable HOMING_TEST_OTLP_KEY)",
            collector.served.addr
        )),
        "{checked}"
    );
    let request = json!({"method": "GET", "url": server.url("/traced")}).to_string();
    let meta = format!("traceparent={}", traceparent());
    let traced = env.enqueue("probe", "t1", &request, &["--meta", &meta]);
    let untraced = env.enqueue("probe", "t2", &request, &[]);
    // The host exports what it holds before it exits, each batch with the back end's key.
    let log = run_until_idle_with(&env, &[("HOMING_TEST_OTLP_KEY", OTLP_KEY)]);
    let keys = collector.keys();
    assert!(!keys.is_empty());
    assert!(
        keys.iter().all(|k| k.as_deref() == Some(OTLP_KEY)),
        "{keys:?}"
    );
    assert!(
        !log.contains(OTLP_KEY),
        "the exporter's key leaked into the log"
    );
    let spans = collector.spans();
    let dispatch = |id: &str| dispatch_span(&spans, id);
    let children = |parent: &Got, name: &str| -> Vec<Got> {
        spans
            .iter()
            .filter(|s| s.name == name && s.parent == parent.id && s.trace == parent.trace)
            .cloned()
            .collect()
    };

    // The attempt continues the trace it was enqueued with.
    let root = dispatch(&traced);
    assert_eq!((root.trace.as_str(), root.parent.as_str()), (TRACE, PARENT));
    for (key, value) in [
        ("homing.agent", "probe"),
        ("homing.thread", "t1"),
        ("homing.attempt", "0"),
        ("homing.outcome", "acked"),
    ] {
        assert_eq!(
            root.attributes.get(key).map(String::as_str),
            Some(value),
            "{key}: {root:#?}"
        );
    }
    // Numbers go out as numbers, so a back end can query `status_code >= 500`.
    assert_eq!(root.kinds.get("homing.attempt"), Some(&"int"), "{root:#?}");
    assert_eq!(root.kinds.get("homing.agent"), Some(&"string"), "{root:#?}");
    let call = children(&root, "homing.guest_call");
    assert_eq!(call.len(), 1, "one guest call: {spans:#?}");
    let http = children(&call[0], "homing.http");
    assert_eq!(http.len(), 1, "the outbound request: {spans:#?}");
    assert_eq!(
        http[0]
            .attributes
            .get("http.response.status_code")
            .map(String::as_str),
        Some("200")
    );
    assert_eq!(
        http[0].kinds.get("http.response.status_code"),
        Some(&"int"),
        "{:#?}",
        http[0]
    );
    // Every request reached the collector in origin form (`POST /v1/traces`), as a server
    // expects it, not in the absolute form only a proxy should receive.
    let targets = collector.targets();
    assert!(!targets.is_empty());
    assert!(
        targets.iter().all(|t| t == "/v1/traces"),
        "request targets: {targets:?}"
    );
    let settled: Vec<String> = children(&root, "homing.store")
        .iter()
        .filter_map(|s| s.attributes.get("homing.operation").cloned())
        .collect();
    // The worker's next claim may go with the completion, in one store step.
    assert!(
        settled
            .iter()
            .any(|op| op == "complete" || op == "complete_and_claim"),
        "settling is a store span of the attempt: {settled:?}"
    );
    // The server saw the request's own span as the parent, in the same trace.
    assert_eq!(
        traceparent_seen(&output(&env, &traced)),
        Some(format!("00-{TRACE}-{}-01", http[0].id))
    );

    // Without a traceparent, a trace of its own.
    let own = dispatch(&untraced);
    assert!(own.parent.is_empty(), "a root span: {own:#?}");
    assert_ne!(own.trace, TRACE);
    let seen = traceparent_seen(&output(&env, &untraced)).unwrap();
    assert!(seen.starts_with(&format!("00-{}-", own.trace)), "{seen}");
}

#[test]
fn without_a_collector_the_enqueued_traceparent_is_passed_on() {
    let server = EchoServer::start();
    let env = Env::new(&probe_config(
        r#"allowed_outbound_hosts = ["http://127.0.0.1:*"]"#,
        "",
    ));
    let request = json!({"method": "GET", "url": server.url("/plain")}).to_string();
    let meta = format!("traceparent={}", traceparent());
    let traced = env.enqueue("probe", "t1", &request, &["--meta", &meta]);
    let untraced = env.enqueue("probe", "t2", &request, &[]);
    // The standard variables would turn export on; this host has none.
    let log = run_until_idle_with(&env, &[]);
    assert_eq!(
        traceparent_seen(&output(&env, &traced)),
        Some(traceparent()),
        "{log}"
    );
    assert_eq!(traceparent_seen(&output(&env, &untraced)), None);
}

#[test]
fn a_collector_url_that_is_not_one_is_refused_by_name() {
    let env = Env::new(&format!(
        "{}\n[telemetry]\notlp_endpoint = \"collector:4318\"\n",
        probe_config("", "")
    ));
    let err = env.fails(&["config", "check"]);
    assert!(
        err.contains("[telemetry] otlp_endpoint") && err.contains("collector:4318"),
        "{err}"
    );
    let env = Env::new(&format!(
        "{}\n[telemetry]\nsample_ratio = 2.0\n",
        probe_config("", "")
    ));
    let err = env.fails(&["run", "--until-idle"]);
    assert!(err.contains("[telemetry] sample_ratio"), "{err}");
}

/// `delegate` fanning out to `echo`, which replies to `delegate`: three generations of work.
fn fan_out_config() -> String {
    format!(
        "[host]\nsweep_interval = \"200ms\"\n[plugins.delegate]\npath = {}\nenqueue_to = [\"echo\"]\n[plugins.echo]\npath = {}\nenqueue_to = [\"delegate\"]\n",
        toml_path(&guest("delegate")),
        toml_path(&guest("echo")),
    )
}

#[test]
fn follow_up_work_continues_the_trace_that_caused_it() {
    let collector = Collector::start();
    let env = Env::new(&format!(
        "{}[telemetry]\notlp_endpoint = \"http://{}\"\n",
        fan_out_config(),
        collector.served.addr
    ));
    let meta = format!("traceparent={}", traceparent());
    let root = env.enqueue("delegate", "fan", "alpha beta", &["--meta", &meta]);
    run_until_idle_with(&env, &[]);
    let list = env.list();
    assert_eq!(
        list.len(),
        5,
        "a fan-out, two parts, two replies: {list:#?}"
    );
    let spans = collector.spans();
    let span_of = |id: &str| dispatch_span(&spans, id);
    // Each dispatch's span is a child of the attempt that enqueued it, all in one trace, and
    // its stored traceparent names that attempt's span.
    for d in &list {
        let id = d["id"].as_str().unwrap();
        let span = span_of(id);
        assert_eq!(span.trace, TRACE, "{d}");
        if id == root {
            assert_eq!(span.parent, PARENT);
            continue;
        }
        let parent = d["metadata"]["parent"].as_str().unwrap();
        let by = span_of(parent);
        assert_eq!(span.parent, by.id, "{d}");
        assert_eq!(
            d["metadata"]["traceparent"].as_str(),
            Some(format!("00-{TRACE}-{}-01", by.id).as_str()),
            "{d}"
        );
    }
}

#[test]
fn without_a_collector_follow_up_work_carries_the_traceparent_on() {
    let env = Env::new(&fan_out_config());
    let meta = format!("traceparent={}", traceparent());
    env.enqueue("delegate", "fan", "alpha beta", &["--meta", &meta]);
    env.enqueue("delegate", "plain", "gamma", &[]);
    run_until_idle_with(&env, &[]);
    let list = env.list();
    assert_eq!(list.len(), 8, "{list:#?}");
    for d in &list {
        let plain = d["thread"].as_str().unwrap().starts_with("plain");
        let expected = if plain { None } else { Some(traceparent()) };
        assert_eq!(
            d["metadata"]["traceparent"].as_str(),
            expected.as_deref(),
            "{d}"
        );
    }
}

/// A stand-in model API speaking one format on loopback: OpenAI's Chat Completions (a JSON
/// answer, or an event stream whose last chunk carries the usage when asked for) or
/// Anthropic's Messages (an event stream: the input in `message_start`, the output in
/// `message_delta`), with the usage the real APIs report.
fn model_server(anthropic: bool) -> Served {
    use axum::response::IntoResponse;
    async fn openai(axum::Json(asked): axum::Json<Value>) -> axum::response::Response {
        let usage = json!({"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18,
                           "prompt_tokens_details": {"cached_tokens": 3}});
        let model = "gpt-test-2026-01-01";
        if asked["stream"] == true {
            let chunk = |choices: Value, usage: Value| {
                format!(
                    "data: {}\n\n",
                    json!({"id": "chatcmpl-s1", "object": "chat.completion.chunk", "model": model,
                           "choices": choices, "usage": usage})
                )
            };
            let mut body = chunk(
                json!([{"index": 0, "delta": {"content": "hel"}}]),
                Value::Null,
            );
            body += &chunk(
                json!([{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]),
                Value::Null,
            );
            if asked["stream_options"]["include_usage"] == true {
                body += &chunk(json!([]), usage);
            }
            body += "data: [DONE]\n\n";
            return ([("content-type", "text/event-stream")], body).into_response();
        }
        axum::Json(json!({
            "id": "chatcmpl-j1", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
            "usage": usage,
        }))
        .into_response()
    }
    async fn anthropic_messages(axum::Json(_): axum::Json<Value>) -> axum::response::Response {
        let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
        let body = [
            event("message_start", json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test-1", "content": [], "usage": {"input_tokens": 20, "output_tokens": 1, "cache_read_input_tokens": 5}}})),
            event("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}})),
            event("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}})),
            event("message_stop", json!({"type": "message_stop"})),
        ]
        .concat();
        ([("content-type", "text/event-stream")], body).into_response()
    }
    let app = if anthropic {
        axum::Router::new().route("/v1/messages", axum::routing::post(anthropic_messages))
    } else {
        axum::Router::new().route("/v1/chat/completions", axum::routing::post(openai))
    };
    Served::start(app)
}

/// GenAI telemetry (issue 54): a guest's calls to origins of `[pricing]` are read as they pass.
/// Each call's span gets the OpenTelemetry GenAI name and attributes (the models, the token
/// usage, the finish reasons) from a JSON answer, an OpenAI event stream and an Anthropic one;
/// the attempt's span sums its calls' tokens; the `gen_ai_client_*` metrics count them and pass
/// Prometheus's linter; a request to an origin not listed is not read.
#[test]
fn model_calls_get_genai_spans_and_metrics() {
    let collector = Collector::start();
    let openai = model_server(false);
    let anthropic = model_server(true);
    let echo = EchoServer::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let api = crate::api::Api::start_with(
            |port| {
                format!(
                    r#"
[host]
lease = "10s"
sweep_interval = "200ms"

[api]
listen = "127.0.0.1:{port}"
{tokens}

[telemetry]
otlp_endpoint = "http://{collector}"

[pricing."http://{openai}"]
format = "openai"

[pricing."http://{anthropic}"]
format = "anthropic"

[plugins.probe]
path = {path}
timeout = "20s"
max_attempts = 1
allowed_outbound_hosts = ["http://127.0.0.1:*"]
"#,
                    tokens = crate::api::TOKENS,
                    collector = collector.served.addr,
                    openai = openai.addr,
                    anthropic = anthropic.addr,
                    path = toml_path(&guest("http_probe")),
                )
            },
            |_| {},
        )
        .await;
        let post = |url: String, body: Value| {
            json!({"method": "POST", "url": url, "headers": [["content-type", "application/json"]],
                   "body": body.to_string(), "quiet": true})
            .to_string()
        };
        let asked = json!({"model": "gpt-test", "max_tokens": 50, "temperature": 0.5,
                           "messages": [{"role": "user", "content": "hi"}]});
        let mut streamed = asked.clone();
        streamed["stream"] = json!(true);
        streamed["stream_options"] = json!({"include_usage": true});
        let payloads = [
            ("plain", post(format!("http://{}/v1/chat/completions", openai.addr), asked)),
            ("streamed", post(format!("http://{}/v1/chat/completions", openai.addr), streamed)),
            (
                "claude",
                post(
                    format!("http://{}/v1/messages", anthropic.addr),
                    json!({"model": "claude-test", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}),
                ),
            ),
            ("other", post(echo.url("/v1/chat/completions"), json!({"model": "x"}))),
        ];
        let mut ids = BTreeMap::new();
        for (name, payload) in payloads {
            let id = api
                .enqueue(json!({"agent": "probe", "thread": name, "payload": payload}))
                .await;
            let d = api.wait_terminal(&id).await;
            assert_eq!(d["status"], "acked", "{name}: {d}");
            ids.insert(name, id);
        }

        let scrape = api.scrape().await;
        crate::common::promtool_check(&scrape);
        let m = crate::api::parse_metrics(&scrape);
        let tokens = |provider: &str, kind: &str| {
            crate::api::sample(
                &m,
                "gen_ai_client_token_usage_sum",
                &[("agent", "probe"), ("gen_ai_provider_name", provider), ("gen_ai_token_type", kind)],
            )
        };
        assert_eq!(tokens("openai", "input"), 22.0, "{scrape}");
        assert_eq!(tokens("openai", "output"), 14.0);
        assert_eq!(tokens("anthropic", "input"), 20.0);
        assert_eq!(tokens("anthropic", "output"), 9.0);
        let calls = crate::api::sample(
            &m,
            "gen_ai_client_operation_duration_seconds_count",
            &[("gen_ai_operation_name", "chat"), ("gen_ai_request_model", "gpt-test-2026-01-01")],
        );
        assert_eq!(calls, 2.0, "{scrape}");

        // The spans arrive as the exporter sends its batches.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let spans = loop {
            let spans = collector.spans();
            if ids.values().all(|id| spans.iter().any(|s| s.attributes.get("homing.dispatch_id") == Some(id)))
                && spans.iter().filter(|s| s.name.starts_with("chat ")).count() >= 3
            {
                break spans;
            }
            assert!(std::time::Instant::now() < deadline, "spans missing: {spans:#?}");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        };
        let model_span = |thread: &str| -> Got {
            let root = dispatch_span(&spans, &ids[thread]);
            let calls: Vec<&Got> = spans.iter().filter(|s| s.trace == root.trace && s.name.contains(' ')).collect();
            assert_eq!(calls.len(), 1, "{thread}: {spans:#?}");
            calls[0].clone()
        };
        let attr = |s: &Got, k: &str| s.attributes.get(k).cloned().unwrap_or_default();
        let plain = model_span("plain");
        assert_eq!(plain.name, "chat gpt-test-2026-01-01");
        for (k, v) in [
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.provider.name", "openai"),
            ("gen_ai.request.model", "gpt-test"),
            ("gen_ai.request.max_tokens", "50"),
            ("gen_ai.request.temperature", "0.5"),
            ("gen_ai.response.model", "gpt-test-2026-01-01"),
            ("gen_ai.response.id", "chatcmpl-j1"),
            ("gen_ai.response.finish_reasons", "stop"),
            ("gen_ai.usage.input_tokens", "11"),
            ("gen_ai.usage.output_tokens", "7"),
            ("gen_ai.usage.cache_read.input_tokens", "3"),
        ] {
            assert_eq!(attr(&plain, k), v, "{k}: {plain:#?}");
        }
        assert_eq!(plain.kinds.get("gen_ai.usage.input_tokens"), Some(&"int"));
        let streamed = model_span("streamed");
        assert_eq!(
            (attr(&streamed, "gen_ai.usage.input_tokens"), attr(&streamed, "gen_ai.usage.output_tokens")),
            ("11".into(), "7".into()),
            "read from the stream's last chunk: {streamed:#?}"
        );
        let claude = model_span("claude");
        assert_eq!(claude.name, "chat claude-test-1");
        for (k, v) in [
            ("gen_ai.provider.name", "anthropic"),
            ("gen_ai.usage.input_tokens", "20"),
            ("gen_ai.usage.output_tokens", "9"),
            ("gen_ai.usage.cache_read.input_tokens", "5"),
            ("gen_ai.response.finish_reasons", "end_turn"),
        ] {
            assert_eq!(attr(&claude, k), v, "{k}: {claude:#?}");
        }
        // The attempt sums its calls.
        let root = dispatch_span(&spans, &ids["claude"]);
        assert_eq!(attr(&root, "gen_ai.usage.output_tokens"), "9", "{root:#?}");
        assert_eq!(attr(&root, "homing.model_calls"), "1", "{root:#?}");
        // An origin not in [pricing] is not read: its request keeps its plain span.
        let other = dispatch_span(&spans, &ids["other"]);
        assert!(
            spans.iter().any(|s| s.trace == other.trace && s.name == "homing.http"
                && !s.attributes.contains_key("gen_ai.operation.name")),
            "{spans:#?}"
        );
        assert!(!other.attributes.contains_key("homing.model_calls"));
    });
}
