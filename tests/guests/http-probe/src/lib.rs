//! `http-probe`: a guest that makes the outbound HTTP requests and reads the variables its
//! payload asks for, for the host's tests of `wasi:http` and `wasi:config`.
//!
//! Payload (JSON; every field optional):
//!
//! ```json
//! {"method": "POST", "url": "http://127.0.0.1:8080/echo", "headers": [["x-k", "v"]],
//!  "body": "text", "timeout_ms": 5000, "max_response_bytes": 1024, "repeat": 1,
//!  "config_keys": ["a", "b"], "fail_on_error": false}
//! ```
//!
//! The URL, a header value and the body may hold `{config.NAME}`, replaced by that variable
//! before sending (so a secret reaches the server without passing through the payload). With
//! `"quiet": true` the report leaves out the response's headers and body (so a server that
//! echoes a secret does not put it in the result).
//!
//! It reads each of `config_keys`, then (when `url` is given) sends the request `repeat` times
//! in sequence (default once) and returns the last response:
//!
//! ```json
//! {"status": 200, "headers": [["content-type", "text/plain"]], "body": "...",
//!  "requests": 1, "config": {"a": "value", "b": null}}
//! ```
//!
//! A failed request fails the dispatch with the SDK's error text, which names the `wasi:http`
//! error code (for example `http: HTTP-request-denied: ...`); so does a failed config read.

use std::collections::BTreeMap;
use std::time::Duration;

use homing_guest::http::{Method, Request};
use homing_guest::{Claim, Handler, config};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Probe {
    #[serde(default = "get")]
    method: String,
    url: Option<String>,
    #[serde(default)]
    headers: Vec<(String, String)>,
    #[serde(default)]
    body: Option<String>,
    timeout_ms: Option<u64>,
    max_response_bytes: Option<usize>,
    #[serde(default = "one")]
    repeat: u32,
    #[serde(default)]
    config_keys: Vec<String>,
    /// Fail the dispatch when the last response's status is 400 or more.
    #[serde(default)]
    fail_on_error: bool,
    /// Leave the response's headers and body out of the report.
    #[serde(default)]
    quiet: bool,
}

fn get() -> String {
    "GET".to_owned()
}

fn one() -> u32 {
    1
}

#[derive(Serialize, Default)]
struct Report {
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<u16>,
    headers: Vec<(String, String)>,
    body: String,
    requests: u32,
    config: BTreeMap<String, Option<String>>,
}

struct HttpProbe;

impl HttpProbe {
    fn request(probe: &Probe, url: &str) -> Result<Request, String> {
        let mut request = Request::new(Method::parse(&probe.method), url);
        for (name, value) in &probe.headers {
            request = request.header(name.as_str(), with_config(value)?.as_str());
        }
        if let Some(body) = &probe.body {
            request = request.body(with_config(body)?.as_str());
        }
        if let Some(ms) = probe.timeout_ms {
            request = request.timeout(Duration::from_millis(ms));
        }
        if let Some(limit) = probe.max_response_bytes {
            request = request.max_response_bytes(limit);
        }
        Ok(request)
    }
}

/// `value` with each `{config.NAME}` replaced by that variable (empty when unset), so a test
/// can send a secret the payload never holds.
fn with_config(value: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("{config.") {
        out.push_str(&rest[..start]);
        let after = &rest[start + "{config.".len()..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        out.push_str(&config::get(&after[..end])?.unwrap_or_default());
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

impl Handler for HttpProbe {
    fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
        let probe: Probe = claim.payload_json()?;
        let mut report = Report::default();
        for key in &probe.config_keys {
            report.config.insert(key.clone(), config::get(key)?);
        }
        if let Some(url) = &probe.url {
            for _ in 0..probe.repeat.max(1) {
                let response = HttpProbe::request(&probe, &with_config(url)?)?.send()?;
                report.requests += 1;
                report.status = Some(response.status);
                if probe.quiet {
                    continue;
                }
                report.headers = response
                    .headers
                    .iter()
                    .map(|(name, value)| {
                        (name.clone(), String::from_utf8_lossy(value).into_owned())
                    })
                    .collect();
                report.body = String::from_utf8_lossy(&response.body).into_owned();
            }
            if probe.fail_on_error
                && let Some(status) = report.status.filter(|s| *s >= 400)
            {
                return Err(format!("the server answered {status}"));
            }
        }
        Ok(homing_guest::json::to_vec(&report)?)
    }
}

homing_guest::export_handler!(HttpProbe);
