//! `[telemetry]`: where a host sends its traces.
//!
//! Traces go out over OTLP/HTTP with protobuf bodies (the collector's port 4318). The endpoint
//! comes from `otlp_endpoint`, else from the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
//! (used as is) or `OTEL_EXPORTER_OTLP_ENDPOINT` (with `/v1/traces` appended); with none of
//! them set, no span is exported and none costs anything. A hosted back end's key goes in
//! `headers` (a value from the environment or a file, secret), or in the standard
//! `OTEL_EXPORTER_OTLP_HEADERS` / `OTEL_EXPORTER_OTLP_TRACES_HEADERS` (`k=v,k2=v2`), which the
//! exporter reads itself; `headers` wins for a name both set.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::vars::ValueSpec;

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
    /// Headers sent with every export (`{ "x-api-key" = { env = "OTLP_KEY", secret = true } }`):
    /// a hosted back end's credentials. Never logged or shown, but by name.
    pub headers: BTreeMap<String, ValueSpec>,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            service_name: None,
            sample_ratio: 1.0,
            headers: BTreeMap::new(),
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
        for (name, spec) in &self.headers {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(format!(
                    "[telemetry] headers: `{}` is not a header name",
                    name.escape_debug()
                ));
            }
            spec.check()
                .map_err(|e| format!("[telemetry] headers.{name}: {e}"))?;
        }
        Ok(())
    }

    /// The export headers, read from where each comes from.
    ///
    /// # Errors
    ///
    /// A required value that is unset or a file that cannot be read, naming the header and
    /// where it was looked for; a value that is no valid header value. Never the value.
    pub fn read_headers(
        &self,
        base_dir: &std::path::Path,
    ) -> Result<std::collections::HashMap<String, String>, String> {
        let mut out = std::collections::HashMap::new();
        for (name, spec) in &self.headers {
            let Some(value) = spec
                .resolve(base_dir)
                .map_err(|e| format!("[telemetry] headers.{name}: {e}"))?
            else {
                continue;
            };
            let text = value.expose();
            if http::HeaderValue::from_str(text).is_err() {
                return Err(format!(
                    "[telemetry] headers.{name}: the value (from {}) is not a valid header value",
                    spec.origin()
                ));
            }
            out.insert(name.clone(), text.to_owned());
        }
        Ok(out)
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

    #[test]
    fn export_headers_are_read_from_their_sources_and_bad_ones_named_without_values() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("key.txt"), "s3cret-value\n").unwrap();
        let parse = |text: &str| -> TelemetryConfig { toml::from_str(text).unwrap() };
        let config = parse(
            "[headers]\n\"x-team\" = \"homing\"\n\"x-api-key\" = { file = \"key.txt\", secret = true }\n",
        );
        config.check().unwrap();
        let headers = config.read_headers(dir.path()).unwrap();
        assert_eq!(headers["x-team"], "homing");
        assert_eq!(headers["x-api-key"], "s3cret-value");
        let bad = parse("[headers]\n\"bad header\" = \"x\"\n");
        assert!(bad.check().unwrap_err().contains("`bad header`"));
        let missing = parse(
            "[headers]\n\"x-api-key\" = { env = \"HOMING_TEST_UNSET_OTLP_KEY\", required = true, secret = true }\n",
        );
        let e = missing.read_headers(dir.path()).unwrap_err();
        assert!(
            e.contains("headers.x-api-key") && e.contains("HOMING_TEST_UNSET_OTLP_KEY"),
            "{e}"
        );
        std::fs::write(dir.path().join("bad.txt"), "line\nbreak-inside").unwrap();
        let broken = parse("[headers]\nk = { file = \"bad.txt\", secret = true }\n");
        let e = broken.read_headers(dir.path()).unwrap_err();
        assert!(
            e.contains("headers.k") && !e.contains("break-inside"),
            "{e}"
        );
    }
}
