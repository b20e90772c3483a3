//! `[telemetry]`: where a host sends its traces.
//!
//! Traces go out over OTLP/HTTP with protobuf bodies (the collector's port 4318). The endpoint
//! comes from `otlp_endpoint`, else from the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
//! (used as is) or `OTEL_EXPORTER_OTLP_ENDPOINT` (with `/v1/traces` appended); with none of
//! them set, no span is exported and none costs anything.

use serde::Deserialize;

/// `[telemetry]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The collector's OTLP/HTTP base URL (`http://127.0.0.1:4318`); `/v1/traces` is appended.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the spans (default: `OTEL_SERVICE_NAME`, else `homing`).
    pub service_name: Option<String>,
    /// The share of traces started here that are sampled, 0 to 1. A dispatch enqueued with a
    /// `traceparent` follows its parent's decision instead.
    pub sample_ratio: f64,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            service_name: None,
            sample_ratio: 1.0,
        }
    }
}

/// The standard variable naming the traces endpoint in full.
pub const TRACES_ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
/// The standard variable naming the OTLP base URL.
pub const ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

impl TelemetryConfig {
    /// The URL traces are posted to, and where it came from; `None` when traces are off.
    ///
    /// # Errors
    ///
    /// When the endpoint is not an `http` or `https` URL with a host, naming where it came
    /// from.
    pub fn traces_url(&self) -> Result<Option<(String, String)>, String> {
        let env = |var: &str| std::env::var(var).ok().filter(|v| !v.trim().is_empty());
        let (url, origin) = if let Some(base) = &self.otlp_endpoint {
            (with_path(base), "[telemetry] otlp_endpoint".to_owned())
        } else if let Some(full) = env(TRACES_ENDPOINT_VAR) {
            (full, format!("environment variable {TRACES_ENDPOINT_VAR}"))
        } else if let Some(base) = env(ENDPOINT_VAR) {
            (
                with_path(&base),
                format!("environment variable {ENDPOINT_VAR}"),
            )
        } else {
            return Ok(None);
        };
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("{origin}: `{url}` is not a URL: {e}"))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(format!(
                "{origin}: `{url}` must be an http:// or https:// URL with a host"
            ));
        }
        Ok(Some((url, origin)))
    }

    pub(super) fn check(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err(format!(
                "[telemetry] sample_ratio: {} is not between 0 and 1",
                self.sample_ratio
            ));
        }
        if self
            .service_name
            .as_deref()
            .is_some_and(|n| n.trim().is_empty())
        {
            return Err("[telemetry] service_name: blank".into());
        }
        if self.otlp_endpoint.is_some() {
            self.traces_url()?;
        }
        Ok(())
    }
}

/// `base` with the traces path appended.
fn with_path(base: &str) -> String {
    format!("{}/v1/traces", base.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn the_endpoint_is_a_base_url_and_bad_ones_are_named() {
        let mut config = TelemetryConfig {
            otlp_endpoint: Some("http://127.0.0.1:4318/".into()),
            ..TelemetryConfig::default()
        };
        assert_eq!(
            config.traces_url().unwrap().map(|(u, _)| u).as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        config.otlp_endpoint = Some("collector:4318".into());
        let err = config.check().unwrap_err();
        assert!(err.contains("[telemetry] otlp_endpoint"), "{err}");
        config.otlp_endpoint = None;
        config.sample_ratio = 1.5;
        assert!(config.check().unwrap_err().contains("sample_ratio"));
    }
}
