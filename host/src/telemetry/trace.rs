//! Traces: a `homing.dispatch` span per attempt, exported over OTLP when `[telemetry]` (or the
//! standard `OTEL_EXPORTER_OTLP_*` variables) names a collector.
//!
//! Spans are `tracing` spans of target `homing::trace`, turned into OpenTelemetry spans by
//! `tracing-opentelemetry`; the log output never shows them. The tree of one attempt:
//!
//! - `homing.dispatch` (agent, thread, dispatch id, attempt, outcome): from claim to settled;
//!   its parent is the `traceparent` the dispatch was enqueued with, if any;
//!   - `homing.guest_call`: the guest's export call;
//!     - `homing.store`: each store operation (backend, operation);
//!     - `homing.http`: each outbound request, whose context the host sends on as the
//!       request's `traceparent`.
//!
//! Without an exporter the spans are disabled and cost a filter check.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::registry::LookupSpan;

use crate::config::{Config, TelemetryConfig};
use crate::store::Dispatch;

/// The target of every span this module's callers open.
pub const TARGET: &str = "homing::trace";

/// How long one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The layer that exports `homing::trace` spans (and warnings inside them, as span events),
/// when `config` names a collector; `Ok(None)` when traces are off.
///
/// # Errors
///
/// When the endpoint is malformed or `[host] tls_ca` cannot be read.
pub fn layer<S>(
    config: &Config,
    runtime: tokio::runtime::Handle,
) -> anyhow::Result<Option<Box<dyn Layer<S> + Send + Sync>>>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    let settings: &TelemetryConfig = &config.telemetry;
    let Some((url, _origin)) = settings.traces_url().map_err(anyhow::Error::msg)? else {
        return Ok(None);
    };
    let ca: Vec<_> = config
        .host
        .tls_ca
        .iter()
        .map(|p| config.resolve(p))
        .collect();
    let tls = crate::tls::client_config(&ca).context("[host] tls_ca")?;
    let client = super::otlp::Client::new(tls, runtime, EXPORT_TIMEOUT);
    let headers = settings
        .read_headers(&config.base_dir)
        .map_err(anyhow::Error::msg)?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_headers(headers)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .context("building the OTLP span exporter")?;
    let service = settings
        .service_name
        .clone()
        .or_else(|| std::env::var("OTEL_SERVICE_NAME").ok())
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "homing".to_owned());
    let resource = Resource::builder_empty()
        .with_service_name(service)
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            settings.sample_ratio,
        ))))
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("homing");
    let _ = PROVIDER.set(provider);
    ENABLED.store(true, Ordering::Relaxed);
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_filter(filter_fn(|meta| {
            meta.target().starts_with("homing")
                && (meta.is_span() || *meta.level() <= tracing::Level::WARN)
        }));
    Ok(Some(Box::new(layer)))
}

/// Exports what is still buffered and stops the exporter (at the end of the process). It
/// blocks while the last batch is sent, for at most the export timeout.
pub fn shutdown() {
    if let Some(provider) = PROVIDER.get()
        && let Err(e) = provider.shutdown_with_timeout(EXPORT_TIMEOUT)
    {
        eprintln!("warning: the last traces were not exported: {e}");
    }
}

/// The span of one claimed attempt, a child of the `traceparent` in the dispatch's metadata.
pub fn dispatch_span(agent: &str, dispatch: &Dispatch) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "homing.dispatch",
        otel.kind = "consumer",
        homing.agent = agent,
        homing.thread = %dispatch.thread,
        homing.dispatch_id = %dispatch.id,
        // As an i64: the OpenTelemetry bridge has no unsigned integers and sends them as text,
        // which a back end cannot compare as numbers.
        homing.attempt = i64::from(dispatch.attempt),
        homing.version = crate::store::versions::pinned(dispatch).unwrap_or_default(),
        homing.outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        homing.model_calls = tracing::field::Empty,
    );
    if enabled()
        && let Some(parent) = dispatch.metadata.get("traceparent")
    {
        let carrier = HashMap::from([("traceparent".to_owned(), parent.clone())]);
        let context = TraceContextPropagator::new().extract(&carrier);
        if context.span().span_context().is_valid() {
            let _ = span.set_parent(context);
        }
    }
    span
}

/// Records how an attempt ended on its span; a failure marks the span as an error.
pub fn record_outcome(span: &Span, outcome: &str, failed: bool) {
    span.record("homing.outcome", outcome);
    if failed {
        span.record("otel.status_code", "ERROR");
    }
}

/// Names `span` `name` in the exported trace, also once its OpenTelemetry span was started
/// (recording `otel.name` renames only a span not yet started, and a span that passed on its
/// `traceparent` was).
pub fn rename(span: &Span, name: &str) {
    span.record("otel.name", name);
    if enabled() {
        span.context().span().update_name(name.to_owned());
    }
}

/// Records the tokens an attempt's model calls used on its span (the sums of its calls').
pub fn record_usage(span: &Span, usage: &crate::store::model::Usage) {
    let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    span.record("gen_ai.usage.input_tokens", as_i64(usage.input_tokens));
    span.record("gen_ai.usage.output_tokens", as_i64(usage.output_tokens));
    span.record("homing.model_calls", as_i64(usage.calls));
}

/// The W3C `traceparent` of `span`, for a request it makes; `None` when traces are off.
pub fn traceparent(span: &Span) -> Option<String> {
    if !enabled() {
        return None;
    }
    let context: Context = span.context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    carrier.remove("traceparent")
}
