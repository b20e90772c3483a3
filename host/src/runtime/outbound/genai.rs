//! GenAI telemetry for the model calls a guest makes: a request to an origin of
//! `[pricing."ORIGIN"]` on a path the host knows (OpenAI's `.../chat/completions`,
//! `.../responses`, `.../completions`, `.../embeddings`; Anthropic's `.../messages`) is read as
//! it passes, without changing a byte of it:
//!
//! - the request body, up to [`MAX_REQUEST_READ`], for the requested model and `max_tokens`;
//! - the response body: whole, up to [`MAX_RESPONSE_READ`], when it is JSON; event by event
//!   when it is an event stream (the usage rides on the last chunk, or on Anthropic's
//!   `message_start` and `message_delta`), keeping no more than one event at a time.
//!
//! When the response ends, the request's span (`homing.http`) gets the OpenTelemetry GenAI
//! attributes and the name `{operation} {model}`, the metrics `gen_ai_client_token_usage` and
//! `gen_ai_client_operation_duration_seconds` get their samples, and the claim's usage
//! ([`Usage`]) adds the call's tokens. A call whose answer cannot be read (cut off, over the
//! read limit, not JSON) is still timed, with no token counts.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use metrics::histogram;
use serde_json::Value;

use crate::config::outbound::Scheme;
use crate::config::pricing::{ModelFormat, ModelOrigin};

/// The most of a request body read for its model (a longer one is sent whole, unread).
pub const MAX_REQUEST_READ: usize = 1 << 20;
/// The most of a JSON response kept to read its usage.
pub const MAX_RESPONSE_READ: usize = 4 << 20;
/// The longest event of an event stream read (a longer one is skipped).
const MAX_EVENT: usize = 1 << 20;
/// The most distinct model names the metrics label; later ones are `other`.
const MAX_MODEL_LABELS: usize = 32;
/// The longest model name shown (span attribute, label).
const MAX_MODEL_NAME: usize = 128;

/// Where a claim's metered usage adds up.
pub type UsageSink = Arc<Mutex<Usage>>;

pub use crate::store::model::Usage;

/// The GenAI operation a request to a model origin is, from its method and path.
fn operation(format: ModelFormat, method: &http::Method, path: &str) -> Option<&'static str> {
    if method != http::Method::POST {
        return None;
    }
    let path = path.trim_end_matches('/');
    match format {
        ModelFormat::Openai => {
            if path.ends_with("/chat/completions") || path.ends_with("/responses") {
                Some("chat")
            } else if path.ends_with("/completions") {
                Some("text_completion")
            } else if path.ends_with("/embeddings") {
                Some("embeddings")
            } else {
                None
            }
        }
        ModelFormat::Anthropic => path.ends_with("/messages").then_some("chat"),
    }
}

/// What the request asked, read from its body.
#[derive(Debug, Default)]
struct Asked {
    model: Option<String>,
    max_tokens: Option<u64>,
    temperature: Option<f64>,
}

/// What the response told, read from its body.
#[derive(Debug, Default)]
struct Told {
    model: Option<String>,
    id: Option<String>,
    input: Option<u64>,
    output: Option<u64>,
    cached: Option<u64>,
    finish: BTreeSet<String>,
}

impl Told {
    /// Takes what one JSON answer (a whole response, or one streamed event) says.
    fn absorb(&mut self, v: &Value) {
        let inner = [Some(v), v.get("message"), v.get("response")];
        for o in inner.into_iter().flatten() {
            let text = |key: &str| o.get(key).and_then(Value::as_str).map(shown);
            if let Some(model) = text("model") {
                self.model = Some(model);
            }
            if self.id.is_none() {
                self.id = text("id");
            }
            if let Some(u) = o.get("usage").filter(|u| u.is_object()) {
                let n = |key: &str| u.get(key).and_then(Value::as_u64);
                if let Some(input) = n("prompt_tokens").or_else(|| n("input_tokens")) {
                    self.input = Some(input);
                }
                if let Some(output) = n("completion_tokens").or_else(|| n("output_tokens")) {
                    self.output = Some(output);
                }
                let cached = u
                    .pointer("/prompt_tokens_details/cached_tokens")
                    .or_else(|| u.pointer("/input_tokens_details/cached_tokens"))
                    .or_else(|| u.get("cache_read_input_tokens"))
                    .and_then(Value::as_u64);
                if cached.is_some() {
                    self.cached = cached;
                }
            }
            let reasons = o
                .get("choices")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|c| c.get("finish_reason"))
                .chain(o.get("stop_reason"))
                .chain(o.pointer("/delta/stop_reason"));
            for reason in reasons.filter_map(Value::as_str) {
                if self.finish.len() < 8 {
                    self.finish.insert(shown(reason));
                }
            }
        }
    }
}

/// `text` cut to [`MAX_MODEL_NAME`] bytes.
fn shown(text: &str) -> String {
    crate::input::cut_to(text, MAX_MODEL_NAME).to_owned()
}

/// How the response body is read.
#[derive(Debug)]
enum Reading {
    /// JSON, kept whole (until it passes the limit: then `Gave up`).
    Json(Vec<u8>),
    /// An event stream: the current line.
    Events(Vec<u8>, bool),
    /// Nothing more is read.
    GaveUp,
}

/// One metered model call, from its request's admission to its response's end.
#[derive(Debug)]
pub(super) struct Meter {
    agent: String,
    provider: String,
    operation: &'static str,
    /// The request body as it was sent (up to [`MAX_REQUEST_READ`]), shared with the body.
    request: Arc<Mutex<Vec<u8>>>,
    reading: Reading,
    told: Told,
    status: u16,
    started: Instant,
    sink: Option<UsageSink>,
}

/// `model` as a metric label: one of the first [`MAX_MODEL_LABELS`] names seen, else `other`.
fn model_label(model: &str) -> String {
    static SEEN: OnceLock<Mutex<BTreeSet<String>>> = OnceLock::new();
    let mut seen = SEEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if seen.contains(model) {
        return model.to_owned();
    }
    if seen.len() < MAX_MODEL_LABELS {
        seen.insert(model.to_owned());
        return model.to_owned();
    }
    "other".to_owned()
}

impl Meter {
    /// The meter of a request to `scheme://host:port` `path` with `method`, when one of
    /// `origins` is that origin and the path is an operation of its format.
    pub(super) fn start(
        origins: &[ModelOrigin],
        agent: &str,
        target: (Scheme, &str, u16),
        method: &http::Method,
        path: &str,
        sink: Option<UsageSink>,
    ) -> Option<Meter> {
        let (scheme, host, port) = target;
        let origin = origins
            .iter()
            .find(|o| o.origin.matches(scheme, host, port))?;
        let operation = operation(origin.format, method, path)?;
        Some(Meter {
            agent: agent.to_owned(),
            provider: origin.provider.clone(),
            operation,
            request: Arc::default(),
            reading: Reading::GaveUp,
            told: Told::default(),
            status: 0,
            started: Instant::now(),
            sink,
        })
    }

    /// Where the request body's first bytes are kept as it is sent.
    pub(super) fn request_tee(&self) -> Arc<Mutex<Vec<u8>>> {
        self.request.clone()
    }

    /// The response's head: how its body will be read.
    pub(super) fn respond(&mut self, status: u16, headers: &http::HeaderMap) {
        self.status = status;
        let kind = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_ascii_lowercase();
        self.reading = if kind.starts_with("text/event-stream") {
            Reading::Events(Vec::new(), false)
        } else if kind.contains("json") {
            Reading::Json(Vec::new())
        } else {
            Reading::GaveUp
        };
    }

    /// Reads `data`, the next bytes of the response body.
    pub(super) fn observe(&mut self, data: &[u8]) {
        match &mut self.reading {
            Reading::GaveUp => {}
            Reading::Json(kept) => {
                if kept.len() + data.len() > MAX_RESPONSE_READ {
                    self.reading = Reading::GaveUp;
                } else {
                    kept.extend_from_slice(data);
                }
            }
            Reading::Events(line, skipping) => {
                let mut told = std::mem::take(&mut self.told);
                for chunk in data.split_inclusive(|b| *b == b'\n') {
                    let ends = chunk.ends_with(b"\n");
                    if !*skipping {
                        if line.len() + chunk.len() > MAX_EVENT {
                            *skipping = true;
                            line.clear();
                        } else {
                            line.extend_from_slice(chunk);
                        }
                    }
                    if ends {
                        if !*skipping {
                            event_line(line, &mut told);
                        }
                        line.clear();
                        *skipping = false;
                    }
                }
                self.told = told;
            }
        }
    }

    /// The response ended (`complete`: read to its end): the span's attributes, the metrics'
    /// samples, the claim's usage.
    pub(super) fn finish(mut self, span: &tracing::Span, complete: bool) {
        if complete
            && let Reading::Json(kept) = std::mem::replace(&mut self.reading, Reading::GaveUp)
            && let Ok(v) = serde_json::from_slice::<Value>(&kept)
        {
            self.told.absorb(&v);
        }
        let asked = self
            .request
            .lock()
            .ok()
            .and_then(|body| serde_json::from_slice::<Value>(&body).ok())
            .map(|v| Asked {
                model: v.get("model").and_then(Value::as_str).map(shown),
                max_tokens: ["max_tokens", "max_completion_tokens", "max_output_tokens"]
                    .iter()
                    .find_map(|k| v.get(*k).and_then(Value::as_u64)),
                temperature: v.get("temperature").and_then(Value::as_f64),
            })
            .unwrap_or_default();
        let told = &self.told;
        let model = told
            .model
            .clone()
            .or_else(|| asked.model.clone())
            .unwrap_or_default();
        let name = if model.is_empty() {
            self.operation.to_owned()
        } else {
            format!("{} {model}", self.operation)
        };
        crate::telemetry::trace::rename(span, &name);
        span.record("gen_ai.operation.name", self.operation);
        span.record("gen_ai.provider.name", self.provider.as_str());
        if let Some(m) = &asked.model {
            span.record("gen_ai.request.model", m.as_str());
        }
        if let Some(n) = asked.max_tokens {
            span.record(
                "gen_ai.request.max_tokens",
                i64::try_from(n).unwrap_or(i64::MAX),
            );
        }
        if let Some(t) = asked.temperature {
            span.record("gen_ai.request.temperature", t);
        }
        if let Some(m) = &told.model {
            span.record("gen_ai.response.model", m.as_str());
        }
        if let Some(id) = &told.id {
            span.record("gen_ai.response.id", id.as_str());
        }
        if !told.finish.is_empty() {
            let reasons: Vec<&str> = told.finish.iter().map(String::as_str).collect();
            span.record("gen_ai.response.finish_reasons", reasons.join(",").as_str());
        }
        let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        if let Some(n) = told.input {
            span.record("gen_ai.usage.input_tokens", as_i64(n));
        }
        if let Some(n) = told.output {
            span.record("gen_ai.usage.output_tokens", as_i64(n));
        }
        if let Some(n) = told.cached {
            span.record("gen_ai.usage.cache_read.input_tokens", as_i64(n));
        }
        let model = if model.is_empty() {
            "unknown".to_owned()
        } else {
            model_label(&model)
        };
        let error = if !complete {
            "incomplete"
        } else if self.status >= 400 {
            "http_error"
        } else {
            ""
        };
        histogram!(
            crate::telemetry::GENAI_DURATION,
            "agent" => self.agent.clone(),
            "gen_ai_operation_name" => self.operation,
            "gen_ai_provider_name" => self.provider.clone(),
            "gen_ai_request_model" => model.clone(),
            "error_type" => error,
        )
        .record(self.started.elapsed().as_secs_f64());
        for (kind, n) in [("input", told.input), ("output", told.output)] {
            if let Some(n) = n {
                histogram!(
                    crate::telemetry::GENAI_TOKENS,
                    "agent" => self.agent.clone(),
                    "gen_ai_operation_name" => self.operation,
                    "gen_ai_provider_name" => self.provider.clone(),
                    "gen_ai_request_model" => model.clone(),
                    "gen_ai_token_type" => kind,
                )
                .record(n as f64);
            }
        }
        if let Some(sink) = &self.sink
            && let Ok(mut usage) = sink.lock()
        {
            usage.add(&Usage {
                input_tokens: told.input.unwrap_or(0),
                output_tokens: told.output.unwrap_or(0),
                cached_tokens: told.cached.unwrap_or(0),
                calls: 1,
            });
        }
    }
}

/// One line of an event stream: a `data:` line's JSON is absorbed (`[DONE]` and the rest are
/// not JSON and pass).
fn event_line(line: &[u8], told: &mut Told) {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let Some(data) = line.strip_prefix(b"data:") else {
        return;
    };
    if let Ok(v) = serde_json::from_slice::<Value>(data.trim_ascii_start()) {
        told.absorb(&v);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use serde_json::json;

    fn read(v: &Value) -> Told {
        let mut told = Told::default();
        told.absorb(v);
        told
    }

    #[test]
    fn operations_are_read_from_the_path() {
        let post = http::Method::POST;
        assert_eq!(
            operation(ModelFormat::Openai, &post, "/v1/chat/completions"),
            Some("chat")
        );
        assert_eq!(
            operation(ModelFormat::Openai, &post, "/openai/v1/responses"),
            Some("chat")
        );
        assert_eq!(
            operation(ModelFormat::Openai, &post, "/v1/completions"),
            Some("text_completion")
        );
        assert_eq!(
            operation(ModelFormat::Openai, &post, "/v1/embeddings"),
            Some("embeddings")
        );
        assert_eq!(operation(ModelFormat::Openai, &post, "/v1/models"), None);
        assert_eq!(
            operation(
                ModelFormat::Openai,
                &http::Method::GET,
                "/v1/chat/completions"
            ),
            None
        );
        assert_eq!(
            operation(ModelFormat::Anthropic, &post, "/v1/messages"),
            Some("chat")
        );
        assert_eq!(
            operation(ModelFormat::Anthropic, &post, "/v1/messages/count_tokens"),
            None
        );
    }

    #[test]
    fn usage_is_read_from_each_format() {
        let chat = read(&json!({
            "id": "chatcmpl-1", "model": "gpt-4o-2024-08-06",
            "choices": [{"finish_reason": "stop"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 4}}
        }));
        assert_eq!(
            (chat.input, chat.output, chat.cached),
            (Some(12), Some(5), Some(4))
        );
        assert_eq!(chat.model.as_deref(), Some("gpt-4o-2024-08-06"));
        assert!(chat.finish.contains("stop"));
        let responses = read(&json!({
            "type": "response.completed",
            "response": {"id": "resp_1", "model": "gpt-5", "usage": {"input_tokens": 7, "output_tokens": 3}}
        }));
        assert_eq!((responses.input, responses.output), (Some(7), Some(3)));
        assert_eq!(responses.id.as_deref(), Some("resp_1"));
        // Anthropic streams: the input in message_start, the output (a running total) in
        // message_delta.
        let mut told = Told::default();
        told.absorb(&json!({"type": "message_start", "message": {"id": "msg_1", "model": "claude-x", "usage": {"input_tokens": 20, "output_tokens": 1, "cache_read_input_tokens": 8}}}));
        told.absorb(&json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}}));
        assert_eq!(
            (told.input, told.output, told.cached),
            (Some(20), Some(9), Some(8))
        );
        assert!(told.finish.contains("end_turn"));
        // OpenAI stream chunks before the last carry `usage: null`.
        let mut told = Told::default();
        told.absorb(
            &json!({"model": "m", "choices": [{"delta": {"content": "hi"}}], "usage": null}),
        );
        assert_eq!(told.input, None);
    }

    #[test]
    fn an_event_stream_is_read_line_by_line_across_chunks() {
        let mut meter = Meter {
            agent: "a".into(),
            provider: "openai".into(),
            operation: "chat",
            request: Arc::default(),
            reading: Reading::GaveUp,
            told: Told::default(),
            status: 0,
            started: Instant::now(),
            sink: None,
        };
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            "text/event-stream".parse().unwrap(),
        );
        meter.respond(200, &headers);
        let stream = "data: {\"model\":\"m1\",\"choices\":[{\"delta\":{}}],\"usage\":null}\n\ndata: {\"model\":\"m1\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n";
        for piece in stream.as_bytes().chunks(7) {
            meter.observe(piece);
        }
        assert_eq!((meter.told.input, meter.told.output), (Some(3), Some(2)));
        assert_eq!(meter.told.model.as_deref(), Some("m1"));
    }

    #[test]
    fn model_labels_are_bounded() {
        for i in 0..(MAX_MODEL_LABELS + 8) {
            let _ = model_label(&format!("bounded-test-{i}"));
        }
        assert_eq!(model_label("never-seen-before-model"), "other");
    }
}
