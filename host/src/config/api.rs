//! `[api]`: the HTTP API `homing run` serves when `listen` is set, and who may call it.
//!
//! Deny by default: without `listen` nothing listens; every `/v1` route needs a bearer token of a
//! role high enough for it; a `listen` address off the loopback interface without any token
//! refuses to start. A token's secret comes from the environment or a file, never from the
//! config text, and lives in a [`Secret`], whose `Debug` prints `<redacted>` and which has no
//! `Display`, so it cannot reach a log line, an error or a page by accident.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::units::{duration, optional_size};

/// `[api]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    /// Where to listen (`127.0.0.1:7080`); no API when absent.
    pub listen: Option<SocketAddr>,
    /// The bearer tokens and their roles.
    pub tokens: Vec<TokenConfig>,
    /// The largest request body (default: room for a `[host] max_payload` payload in base64,
    /// plus 64 KiB for the other fields).
    #[serde(deserialize_with = "optional_size")]
    pub max_body: Option<u64>,
    /// How long one request may take (a long poll's `wait` is added to it).
    #[serde(deserialize_with = "duration")]
    pub request_timeout: Duration,
    /// The longest `?wait` a long poll may ask for.
    #[serde(deserialize_with = "duration")]
    pub max_wait: Duration,
    /// How long one server-sent-event stream stays open before the server ends it (the
    /// client reconnects with `Last-Event-ID` and misses nothing).
    #[serde(deserialize_with = "duration")]
    pub max_stream: Duration,
    /// Authenticated requests served at once (a `/v1` request with a valid token, a dashboard
    /// request with a session, `/metrics`); more are refused with 503 at once. `/livez`,
    /// `/readyz` and refusals of unauthenticated requests take no slot.
    pub max_concurrent: usize,
    /// How long a request's body may take to arrive in full, from its head: a client that
    /// sends a body slowly is answered 408 and its connection closed after this.
    #[serde(deserialize_with = "duration")]
    pub body_timeout: Duration,
    /// Connections open at once from one client address (an IPv6 client by its /64); more
    /// are answered 503 and closed at accept. Behind a proxy every client has the proxy's
    /// address: raise it there.
    pub max_connections_per_client: usize,
    /// Server-sent-event streams open at once, in all; more are refused with 503.
    pub max_streams: usize,
    /// Server-sent-event streams open at once with one token; more are refused with 429.
    pub max_streams_per_token: usize,
    /// Whether the operators' dashboard is served at `/` (its pages need a login with one of
    /// `tokens`).
    pub dashboard: bool,
    /// Whether `/metrics` answers without a token (for a scraper that cannot send one); by
    /// default it needs a token of any role, as Prometheus sends with `authorization`.
    pub public_metrics: bool,
    /// The base URL people and webhooks reach this API at (`https://homing.example.com`):
    /// waitpoint callback URLs start with it. No callback URLs when absent.
    pub public_url: Option<String>,
    /// The MCP endpoint, `POST /mcp` (`[api.mcp]`).
    pub mcp: McpServerConfig,
}

/// `[api.mcp]`: how `POST /mcp` serves the agents marked `[plugins.x.mcp_server] expose`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpServerConfig {
    /// `"per-agent"` (a tool per exposed agent) or `"dispatcher"` (`list_agents` and
    /// `invoke_agent` for all of them).
    pub tools: McpTools,
    /// How long a `tools/call` waits for its run before it answers with the dispatch to ask
    /// about later (`homing_result`); at most `[api] max_wait`.
    #[serde(deserialize_with = "duration")]
    pub call_wait: Duration,
    /// Browser origins allowed to call `/mcp` (`https://app.example.com`); a request carrying
    /// any other `Origin` is refused (403), so a web page cannot drive a local host (DNS
    /// rebinding). Requests without an `Origin` (non-browser clients) are not affected.
    pub allowed_origins: Vec<String>,
}

impl Default for McpServerConfig {
    fn default() -> Self {
        McpServerConfig {
            tools: McpTools::PerAgent,
            call_wait: Duration::from_secs(20),
            allowed_origins: Vec::new(),
        }
    }
}

/// `[api.mcp] tools`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum McpTools {
    /// One tool per exposed agent, named as the agent.
    PerAgent,
    /// Two tools for all of them: `list_agents` and `invoke_agent`.
    Dispatcher,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: None,
            tokens: Vec::new(),
            max_body: None,
            request_timeout: Duration::from_secs(30),
            max_wait: Duration::from_secs(60),
            max_stream: Duration::from_secs(3600),
            max_concurrent: 1024,
            body_timeout: Duration::from_secs(5),
            max_connections_per_client: 256,
            max_streams: 256,
            max_streams_per_token: 64,
            dashboard: true,
            public_metrics: false,
            public_url: None,
            mcp: McpServerConfig::default(),
        }
    }
}

/// What a token may do; each role includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads dispatches, logs and agents.
    Reader,
    /// Also enqueues.
    Producer,
    /// Everything: also cancels, retries and interrupts.
    Operator,
}

impl Role {
    /// The role's name in the config and in refusals.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Producer => "producer",
            Role::Operator => "operator",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One `[[api.tokens]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// A name for logs and metrics (the secret never appears there).
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// Where its secret comes from.
    pub secret: SecretSource,
}

/// Where a token's secret is read from.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "lowercase")]
pub enum SecretSource {
    /// An environment variable.
    Env(String),
    /// A file (relative to the config), read up to 4 KiB; one trailing newline is dropped.
    File(PathBuf),
}

/// The shortest secret accepted: a guessable token is refused at start.
pub const MIN_SECRET_LEN: usize = 16;

/// The largest secret file read.
const MAX_SECRET_FILE: u64 = 4096;

/// A secret value. `Debug` prints `<redacted>`; there is no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Secret {
    /// The secret's bytes, for hashing and comparing; never for printing.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl SecretSource {
    /// Reads the secret. Errors name the source, never the value.
    ///
    /// # Errors
    ///
    /// When the variable is unset or empty, the file cannot be read or is too large, or the
    /// secret is shorter than [`MIN_SECRET_LEN`].
    pub fn read(&self, base_dir: &Path) -> Result<Secret, String> {
        let (bytes, what) = match self {
            SecretSource::Env(var) => match std::env::var_os(var) {
                Some(value) => (
                    value.into_encoded_bytes(),
                    format!("environment variable {var}"),
                ),
                None => return Err(format!("environment variable {var} is not set")),
            },
            SecretSource::File(path) => {
                let path = if path.is_absolute() {
                    path.clone()
                } else {
                    base_dir.join(path)
                };
                let mut bytes = crate::input::read_file_capped(
                    &path,
                    MAX_SECRET_FILE,
                    "the secret file",
                    "the secret size limit",
                )
                .map_err(|e| e.to_string())?;
                if bytes.last() == Some(&b'\n') {
                    bytes.pop();
                    if bytes.last() == Some(&b'\r') {
                        bytes.pop();
                    }
                }
                (bytes, format!("file {}", path.display()))
            }
        };
        if bytes.len() < MIN_SECRET_LEN {
            return Err(format!(
                "the secret in {what} is shorter than {MIN_SECRET_LEN} bytes"
            ));
        }
        Ok(Secret(bytes))
    }
}

impl ApiConfig {
    /// Checks what can be checked without reading secrets.
    pub(super) fn check(&self) -> Result<(), String> {
        let mut names = std::collections::BTreeSet::new();
        for token in &self.tokens {
            if token.name.trim().is_empty() {
                return Err("[api] tokens: a token's name is blank".into());
            }
            if !names.insert(token.name.as_str()) {
                return Err(format!(
                    "[api] tokens: the name `{}` is used twice",
                    token.name
                ));
            }
            if let SecretSource::Env(var) = &token.secret
                && var.trim().is_empty()
            {
                return Err(format!(
                    "[api] tokens: `{}`: secret.env names no variable",
                    token.name
                ));
            }
        }
        if let Some(listen) = self.listen
            && !listen.ip().is_loopback()
            && self.tokens.is_empty()
        {
            return Err(format!(
                "[api] listen: {listen} is not a loopback address and [api] tokens is empty; \
                 add a token (`tokens = [{{ name = \"..\", role = \"reader\", secret = {{ env = \"..\" }} }}]`) \
                 or listen on 127.0.0.1"
            ));
        }
        if self.request_timeout.is_zero() {
            return Err("[api] request_timeout: must be more than 0".into());
        }
        if self.max_stream.is_zero() {
            return Err("[api] max_stream: must be more than 0".into());
        }
        if self.max_concurrent == 0 {
            return Err("[api] max_concurrent: must be at least 1".into());
        }
        if self.body_timeout.is_zero() {
            return Err("[api] body_timeout: must be more than 0".into());
        }
        for (key, value) in [
            (
                "max_connections_per_client",
                self.max_connections_per_client,
            ),
            ("max_streams", self.max_streams),
            ("max_streams_per_token", self.max_streams_per_token),
        ] {
            if value == 0 {
                return Err(format!("[api] {key}: must be at least 1"));
            }
        }
        if self.max_body == Some(0) {
            return Err("[api] max_body: must be more than 0".into());
        }
        if let Some(url) = &self.public_url {
            check_public_url(url)?;
        }
        Ok(())
    }

    /// The callback URL that completes waitpoint `id` with `token`, when `public_url` is set.
    pub fn callback_url(&self, id: &str, token: &str) -> Option<String> {
        Some(callback_url(self.public_url.as_deref()?, id, token))
    }

    /// The body cap in force: `max_body`, or room for a `max_payload` payload in base64 plus
    /// 64 KiB.
    pub fn body_limit(&self, max_payload: u64) -> u64 {
        self.max_body.unwrap_or_else(|| {
            max_payload
                .saturating_mul(4)
                .div_ceil(3)
                .saturating_add(64 << 10)
        })
    }
}

/// The URL under `public_url` that completes waitpoint `id` with `token`.
pub fn callback_url(public_url: &str, id: &str, token: &str) -> String {
    let base = public_url.trim_end_matches('/');
    format!("{base}/v1/waitpoints/{id}/complete?token={token}")
}

/// `public_url` is `http(s)://host[:port][/path]`: no query, fragment or credentials, since
/// callback URLs append to it.
fn check_public_url(url: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("[api] public_url: `{}` {why}", url.escape_debug()));
    let Ok(uri) = url.parse::<http::Uri>() else {
        return bad("is not a URL");
    };
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return bad("must start with http:// or https://");
    }
    let Some(authority) = uri.authority() else {
        return bad("names no host");
    };
    if authority.as_str().contains('@') {
        return bad("must not carry credentials");
    }
    if uri.query().is_some() || url.contains('#') {
        return bad("must not have a query or a fragment");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::config::Config;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, "homing.toml", Path::new("/etc/homing")).map_err(|e| e.to_string())
    }

    #[test]
    fn public_url_is_a_base_for_callback_urls() {
        let config = parse("[api]\npublic_url = \"https://homing.example.com/base/\"\n").unwrap();
        assert_eq!(
            config.api.callback_url("w1", "hwp_t").as_deref(),
            Some("https://homing.example.com/base/v1/waitpoints/w1/complete?token=hwp_t")
        );
        assert_eq!(parse("").unwrap().api.callback_url("w1", "t"), None);
        for (bad, why) in [
            ("ftp://x", "http:// or https://"),
            ("https://x/?a=1", "a query"),
            ("https://x/#f", "fragment"),
            ("https://u:p@x", "credentials"),
            ("not a url", "not a URL"),
        ] {
            let e = parse(&format!("[api]\npublic_url = \"{bad}\"\n")).unwrap_err();
            assert!(
                e.contains("[api] public_url") && e.contains(why),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn the_api_is_off_unless_listen_is_set() {
        let config = parse("").unwrap();
        assert!(config.api.listen.is_none());
        assert!(config.api.tokens.is_empty());
        assert_eq!(config.api.body_limit(3), 4 + (64 << 10));
        assert!(config.api.dashboard, "the dashboard comes with the API");
        let config = parse("[api]\nlisten = \"127.0.0.1:7080\"\ndashboard = false\n").unwrap();
        assert!(!config.api.dashboard);
    }

    #[test]
    fn tokens_take_a_role_and_a_secret_source() {
        let config = parse(
            "[api]\nlisten = \"127.0.0.1:7080\"\nmax_body = \"2MiB\"\nrequest_timeout = \"5s\"\ntokens = [\n  { name = \"web\", role = \"producer\", secret = { env = \"HOMING_WEB_TOKEN\" } },\n  { name = \"ops\", role = \"operator\", secret = { file = \"ops.token\" } },\n]\n",
        )
        .unwrap();
        assert_eq!(config.api.tokens.len(), 2);
        assert_eq!(config.api.tokens[0].role, Role::Producer);
        assert!(
            matches!(&config.api.tokens[1].secret, SecretSource::File(p) if p == Path::new("ops.token"))
        );
        assert_eq!(config.api.body_limit(1), 2 << 20);
        assert_eq!(config.api.request_timeout, Duration::from_secs(5));
        assert_eq!(config.api.body_timeout, Duration::from_secs(5));
        assert_eq!(config.api.max_connections_per_client, 256);
        assert_eq!(
            (config.api.max_streams, config.api.max_streams_per_token),
            (256, 64)
        );
        assert!(Role::Reader < Role::Producer && Role::Producer < Role::Operator);
    }

    #[test]
    fn a_public_listen_without_tokens_is_refused_and_bad_keys_name_the_line() {
        let err = parse("[api]\nlisten = \"0.0.0.0:7080\"\n").unwrap_err();
        assert!(
            err.contains("[api] listen: 0.0.0.0:7080 is not a loopback address"),
            "{err}"
        );
        let err = parse("[api]\nlisten = \"127.0.0.1:7080\"\nrole = \"x\"\n").unwrap_err();
        assert!(err.contains("line 3") && err.contains("role"), "{err}");
        let err = parse(
            "[api]\ntokens = [{ name = \"a\", role = \"admin\", secret = { env = \"X\" } }]\n",
        )
        .unwrap_err();
        assert!(err.contains("admin"), "{err}");
        let err = parse(
            "[api]\ntokens = [{ name = \"a\", role = \"reader\", secret = { env = \"X\" } }, { name = \"a\", role = \"reader\", secret = { env = \"Y\" } }]\n",
        )
        .unwrap_err();
        assert!(err.contains("used twice"), "{err}");
    }

    #[test]
    fn the_resource_limits_are_read_and_zero_is_refused() {
        let config = parse(
            "[api]\nlisten = \"127.0.0.1:7080\"\nbody_timeout = \"2s\"\nmax_connections_per_client = 8\nmax_streams = 3\nmax_streams_per_token = 2\n",
        )
        .unwrap();
        assert_eq!(config.api.body_timeout, Duration::from_secs(2));
        assert_eq!(config.api.max_connections_per_client, 8);
        assert_eq!(
            (config.api.max_streams, config.api.max_streams_per_token),
            (3, 2)
        );
        for (key, zero) in [
            ("body_timeout", "\"0s\""),
            ("max_connections_per_client", "0"),
            ("max_streams", "0"),
            ("max_streams_per_token", "0"),
        ] {
            let err = parse(&format!("[api]\n{key} = {zero}\n")).unwrap_err();
            assert!(err.contains(&format!("[api] {key}: must be")), "{err}");
        }
    }

    #[test]
    fn secrets_are_redacted_and_short_ones_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("t"), "0123456789abcdefXYZ\n").unwrap();
        let secret = SecretSource::File("t".into()).read(dir.path()).unwrap();
        assert_eq!(secret.expose(), b"0123456789abcdefXYZ");
        assert_eq!(format!("{secret:?}"), "<redacted>");
        std::fs::write(dir.path().join("short"), "hunter2").unwrap();
        let err = SecretSource::File("short".into())
            .read(dir.path())
            .unwrap_err();
        assert!(
            err.contains("shorter than 16") && !err.contains("hunter2"),
            "{err}"
        );
        let err = SecretSource::Env("HOMING_TEST_UNSET_SECRET_VAR".into())
            .read(dir.path())
            .unwrap_err();
        assert!(err.contains("is not set"), "{err}");
    }
}
