//! `[plugins.x.mcp.NAME]`: an MCP server whose tools the plugin's guests call through the host
//! (`mcp-tools` and `mcp-call` on the claim, `homing:agent@0.2.1`).
//!
//! The host holds the connection and the credentials: the guest names the server and the tool,
//! never sees the URL's token or the bearer. Nothing is callable by default: `tools` lists what
//! the plugin may call (names, or patterns with `*`), and `approval` decides which calls wait for
//! a person first.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::units::{duration, size};
use super::vars::ValueSpec;

/// One MCP server of a plugin.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    /// The server's Streamable HTTP endpoint (`http` or `https`). Its origin is granted to the
    /// host only (the guest cannot reach it around the broker unless `allowed_outbound_hosts`
    /// names it too); the host reaches it under the same address rules, origin limits and
    /// timeouts as the guest's own requests.
    pub url: String,
    /// How the host authenticates to the server (none by default).
    #[serde(default)]
    pub auth: Option<McpAuth>,
    /// The tools the plugin may see and call: names, or patterns where `*` matches any run of
    /// characters (`"issues_*"`, `"*"`). Empty (the default) allows none.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Which calls wait for a person's approval (default `"destructive"`).
    #[serde(default)]
    pub approval: ApprovalRule,
    /// Rules for particular tools, by name or pattern, over `approval`: the exact name wins,
    /// then the longest matching pattern.
    #[serde(default)]
    pub approval_for: BTreeMap<String, ApprovalRule>,
    /// How long an approval waits for a person before the call is rejected (default 24 hours,
    /// at most 30 days).
    #[serde(default = "default_approval_timeout", deserialize_with = "duration")]
    pub approval_timeout: Duration,
    /// The digest of the allowed tools' definitions (`sha256:<hex>`, as `homing plugin mcp-tools`
    /// prints it). When set, a server whose tools changed is refused until it is pinned again.
    #[serde(default)]
    pub pin: Option<String>,
    /// How long one request to the server may take (default 30 s; also cut to the dispatch's
    /// remaining time).
    #[serde(default = "default_timeout", deserialize_with = "duration")]
    pub timeout: Duration,
    /// The largest answer the host reads from the server (default 1 MiB).
    #[serde(default = "default_max_result", deserialize_with = "size")]
    pub max_result: u64,
}

/// How the host authenticates to an MCP server: one of `bearer` and `oauth`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpAuth {
    /// Sent as `Authorization: Bearer <value>`. A value from the environment or a file (as
    /// `variables` are), kept out of every log line, error and stored record.
    #[serde(default)]
    pub bearer: Option<ValueSpec>,
    /// OAuth 2.0 client credentials: the host asks `token_url` for an access token and sends
    /// it as the bearer, asking again before it expires or when the server refuses it.
    #[serde(default)]
    pub oauth: Option<McpOAuth>,
}

impl McpAuth {
    /// The secret the host holds for the server: the bearer, or the OAuth client's secret.
    pub fn credential(&self) -> Option<&ValueSpec> {
        self.bearer
            .as_ref()
            .or_else(|| self.oauth.as_ref().map(|o| &o.client_secret))
    }
}

/// OAuth 2.0 client credentials (RFC 6749, section 4.4), the client authenticated with HTTP
/// Basic.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpOAuth {
    /// The authorization server's token endpoint (`http` or `https`; its origin must be in the
    /// plugin's `allowed_outbound_hosts` too).
    pub token_url: String,
    /// The client's id.
    pub client_id: String,
    /// The client's secret (a value from the environment or a file, never shown).
    pub client_secret: ValueSpec,
    /// The scope asked for, if any.
    #[serde(default)]
    pub scope: Option<String>,
}

/// When a call waits for a person.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ApprovalRule {
    /// Never: the call goes out at once.
    Never,
    /// Always.
    Always,
    /// When the tool may destroy data: it is not marked read-only and not marked
    /// `destructiveHint: false` (MCP's defaults make an unannotated tool destructive).
    #[default]
    Destructive,
    /// When the tool reaches beyond its server (`openWorldHint`, true unless marked false).
    OpenWorld,
}

impl ApprovalRule {
    /// The rule's name, as written.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalRule::Never => "never",
            ApprovalRule::Always => "always",
            ApprovalRule::Destructive => "destructive",
            ApprovalRule::OpenWorld => "open-world",
        }
    }
}

fn default_approval_timeout() -> Duration {
    Duration::from_secs(24 * 3600)
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_max_result() -> u64 {
    1 << 20
}

/// The longest approval wait (a waitpoint's longest timeout).
const MAX_APPROVAL_TIMEOUT: Duration = Duration::from_secs(30 * 24 * 3600);

/// Whether `name` matches `pattern`, where `*` matches any run of characters (and nothing
/// else is special). Hand-written: tool names are short, and a glob crate's path rules
/// (separators, classes, escapes) would only add ways to misread an allow-list.
pub fn matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*`: the whole name.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

impl McpServer {
    /// Whether the plugin may call `tool`.
    pub fn allows(&self, tool: &str) -> bool {
        self.tools.iter().any(|p| matches(p, tool))
    }

    /// The approval rule for `tool`: its exact entry in `approval_for`, else the longest
    /// matching pattern there, else `approval`.
    pub fn rule_for(&self, tool: &str) -> ApprovalRule {
        if let Some(rule) = self.approval_for.get(tool) {
            return *rule;
        }
        self.approval_for
            .iter()
            .filter(|(p, _)| p.contains('*') && matches(p, tool))
            .max_by_key(|(p, _)| p.len())
            .map_or(self.approval, |(_, rule)| *rule)
    }

    /// The origins the host reaches for this server (its URL's, and the OAuth token URL's),
    /// each exactly: the grants the plugin's broker has and its guest does not.
    pub fn grants(&self) -> Vec<crate::config::outbound::OutboundHost> {
        let urls = std::iter::once(self.url.as_str()).chain(
            self.auth
                .as_ref()
                .and_then(|a| a.oauth.as_ref())
                .map(|o| o.token_url.as_str()),
        );
        urls.filter_map(|url| {
            let uri = url.parse::<http::Uri>().ok()?;
            let scheme = uri.scheme_str()?;
            let host = uri.host()?;
            let port = uri
                .port_u16()
                .unwrap_or(if scheme == "https" { 443 } else { 80 });
            format!("{scheme}://{host}:{port}").parse().ok()
        })
        .collect()
    }

    /// What can be checked without the network; `key` names the table in errors.
    pub(super) fn check(&self, key: &str) -> Result<(), String> {
        check_url(&self.url).map_err(|e| format!("{key} url: {e}"))?;
        if self.tools.iter().any(|t| t.trim().is_empty()) {
            return Err(format!("{key} tools: an entry is blank"));
        }
        if let Some(pin) = &self.pin {
            let hex = pin.strip_prefix("sha256:").unwrap_or_default();
            if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!(
                    "{key} pin: `{pin}` is not `sha256:` and 64 hex digits (run `homing plugin \
                     mcp-tools` to print the digest)"
                ));
            }
        }
        if self.approval_timeout.is_zero() || self.approval_timeout > MAX_APPROVAL_TIMEOUT {
            return Err(format!(
                "{key} approval_timeout: must be more than 0 and at most 30 days"
            ));
        }
        if self.timeout.is_zero() {
            return Err(format!("{key} timeout: must be more than 0"));
        }
        if self.max_result == 0 {
            return Err(format!("{key} max_result: must be more than 0"));
        }
        if let Some(auth) = &self.auth {
            match (&auth.bearer, &auth.oauth) {
                (Some(bearer), None) => bearer
                    .check()
                    .map_err(|e| format!("{key} auth.bearer {e}"))?,
                (None, Some(oauth)) => {
                    check_url(&oauth.token_url)
                        .map_err(|e| format!("{key} auth.oauth.token_url: {e}"))?;
                    if oauth.client_id.is_empty() {
                        return Err(format!("{key} auth.oauth.client_id: must not be empty"));
                    }
                    oauth
                        .client_secret
                        .check()
                        .map_err(|e| format!("{key} auth.oauth.client_secret {e}"))?;
                }
                _ => {
                    return Err(format!("{key} auth: set one of `bearer` and `oauth`"));
                }
            }
        }
        Ok(())
    }
}

/// Checks an http or https URL with a host.
fn check_url(url: &str) -> Result<(), String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("`{}` is not a URL: {e}", shown_url(url)))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(format!(
            "`{}` must be an http or https URL with a host",
            shown_url(url)
        ));
    }
    Ok(())
}

/// A server's URL as errors and logs show it: scheme, host, port and path, never a query or
/// user info (either may hold a key).
pub fn shown_url(url: &str) -> String {
    match url.parse::<http::Uri>() {
        Ok(uri) => {
            let host = uri.host().unwrap_or_default();
            let port = uri.port_u16().map(|p| format!(":{p}")).unwrap_or_default();
            format!(
                "{}://{host}{port}{}",
                uri.scheme_str().unwrap_or("?"),
                uri.path()
            )
        }
        Err(_) => "<not a URL>".into(),
    }
}

/// Checks a server name: lowercase letters, digits, `-` and `_`, at most 64 bytes.
pub(super) fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not a server name (lowercase letters, digits, `-` and `_`, at most 64)"
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn a_pattern_matches_with_stars_only() {
        assert!(matches("add", "add"));
        assert!(!matches("add", "adds"));
        assert!(matches("*", "anything"));
        assert!(matches("issues_*", "issues_list"));
        assert!(!matches("issues_*", "pulls_list"));
        assert!(matches("*_list", "issues_list"));
        assert!(matches("a*b*c", "aXbYc"));
        assert!(!matches("a*b*c", "aXcYb"));
        assert!(!matches("ab*ba", "aba"));
        assert!(matches("get_?", "get_?"));
    }

    fn server(text: &str) -> McpServer {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn the_exact_rule_wins_then_the_longest_pattern() {
        let s = server(
            r#"
url = "http://127.0.0.1:1/mcp"
tools = ["*"]
approval = "never"
approval_for = { "delete_*" = "always", "delete_draft*" = "never", "send" = "open-world" }
"#,
        );
        assert_eq!(s.rule_for("list"), ApprovalRule::Never);
        assert_eq!(s.rule_for("delete_user"), ApprovalRule::Always);
        assert_eq!(s.rule_for("delete_drafts"), ApprovalRule::Never);
        assert_eq!(s.rule_for("send"), ApprovalRule::OpenWorld);
        assert!(s.allows("whatever"));
    }

    #[test]
    fn nothing_is_allowed_by_default_and_bad_values_are_named() {
        let s = server(r#"url = "http://127.0.0.1:1/mcp""#);
        assert!(!s.allows("add"));
        assert_eq!(s.approval, ApprovalRule::Destructive);
        s.check("[plugins.a.mcp.s]").unwrap();
        let bad = server(r#"url = "ftp://x/mcp""#)
            .check("[plugins.a.mcp.s]")
            .unwrap_err();
        assert!(bad.contains("url") && bad.contains("http"), "{bad}");
        let bad = server("url = \"http://x/mcp\"\npin = \"abc\"")
            .check("[plugins.a.mcp.s]")
            .unwrap_err();
        assert!(bad.contains("pin"), "{bad}");
        assert!(shown_url("https://u:p@h:8443/mcp?key=secret") == "https://h:8443/mcp");
        let both = server(
            "url = \"http://x/mcp\"\n[auth]\nbearer = \"b\"\noauth = { token_url = \"http://x/t\", client_id = \"c\", client_secret = \"s\" }",
        )
        .check("[plugins.a.mcp.s]")
        .unwrap_err();
        assert!(both.contains("one of `bearer` and `oauth`"), "{both}");
        let bad = server(
            "url = \"http://x/mcp\"\n[auth]\noauth = { token_url = \"x\", client_id = \"c\", client_secret = \"s\" }",
        )
        .check("[plugins.a.mcp.s]")
        .unwrap_err();
        assert!(bad.contains("auth.oauth.token_url"), "{bad}");
        assert!(check_name("github").is_ok() && check_name("Git Hub").is_err());
    }

    #[test]
    fn the_host_is_granted_each_url_origin_exactly() {
        let s = server(
            "url = \"https://mcp.example.com/mcp?key=k\"\n[auth]\noauth = { token_url = \"http://[::1]:8080/token\", client_id = \"c\", client_secret = \"s\" }",
        );
        let grants: Vec<String> = s.grants().iter().map(ToString::to_string).collect();
        assert_eq!(
            grants,
            ["https://mcp.example.com:443", "http://[::1]:8080"],
            "the URL's origin with its default port, then the token URL's"
        );
    }
}
