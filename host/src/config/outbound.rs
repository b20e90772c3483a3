//! Outbound grants, parsed: `allowed_outbound_hosts` (HTTP), `allowed_hosts` (raw TCP),
//! `tls_ca` and `[plugins.x.http]` limits. The config parses them, here and only here; the
//! runtime's outbound policy decides on them.
//!
//! An `allowed_outbound_hosts` entry is `scheme://host[:port]`: the scheme `http` or `https`;
//! the host a name, `*.name` (any subdomain of `name`, not `name` itself), an IP address (IPv6
//! in brackets), or `*` (any host); the port a number or `*`, and the scheme's default (443,
//! 80) when absent. A path, query or user part is refused: the grant is an origin.
//!
//! An `allowed_hosts` entry is `host:port`: a name or an IP address (IPv6 in brackets) and a
//! port number, both required.
//!
//! Allowing a host is not allowing what it resolves to: the policy applies the address rules
//! on every request and connect.

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::units::{duration, size};

/// A URL scheme an outbound grant may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Plain HTTP.
    Http,
    /// HTTP over TLS, by the host.
    Https,
}

impl Scheme {
    /// Its name in a URL.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    /// Its default port.
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

/// The host part of a grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// Any host (`*`).
    Any,
    /// Exactly this name (lowercase, no trailing dot).
    Name(String),
    /// Any subdomain of this name (`*.example.com`: `a.example.com`, `a.b.example.com`).
    Subdomains(String),
    /// This address, written literally.
    Ip(IpAddr),
}

impl fmt::Display for HostPattern {
    /// As written in a grant: an IPv6 address in brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Any => f.write_str("*"),
            HostPattern::Name(name) => f.write_str(name),
            HostPattern::Subdomains(name) => write!(f, "*.{name}"),
            HostPattern::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            HostPattern::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

/// One `allowed_outbound_hosts` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboundHost {
    /// The scheme.
    pub scheme: Scheme,
    /// The host.
    pub host: HostPattern,
    /// The port; `None` is any port.
    pub port: Option<u16>,
}

impl fmt::Display for OutboundHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme.as_str(), self.host)?;
        match self.port {
            Some(port) => write!(f, ":{port}"),
            None => f.write_str(":*"),
        }
    }
}

impl std::str::FromStr for OutboundHost {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("`{text}` {why}");
        let (scheme, rest) = text
            .split_once("://")
            .ok_or_else(|| bad("is not scheme://host[:port]"))?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            other => return Err(bad(&format!("has scheme `{other}`; use http or https"))),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#', '@']) {
            return Err(bad(
                "has a path, query or user part; an entry is an origin, scheme://host[:port]",
            ));
        }
        let (host, port) = split_host_port(rest).map_err(|why| bad(&why))?;
        let port = match port {
            "" => Some(scheme.default_port()),
            "*" => None,
            p => Some(parse_port(p).map_err(|why| bad(&format!("{why} or *")))?),
        };
        Ok(OutboundHost { scheme, host, port })
    }
}

/// Splits `host[:port]` (an IPv6 address in brackets) into the host, parsed, and the port text
/// (empty when absent). The one reading of a grant's host and port, for HTTP and TCP grants.
fn split_host_port(text: &str) -> Result<(HostPattern, &str), String> {
    if let Some(v6) = text.strip_prefix('[') {
        let (ip, after) = v6.split_once(']').ok_or("has an unclosed `[`")?;
        let port = match after {
            "" => "",
            p => p.strip_prefix(':').ok_or("has text after the address")?,
        };
        let ip: IpAddr = ip
            .parse()
            .map_err(|_| format!("has `{ip}`, not an IPv6 address"))?;
        return Ok((HostPattern::Ip(ip), port));
    }
    let (host, port) = text.rsplit_once(':').unwrap_or((text, ""));
    Ok((parse_host(host)?, port))
}

/// A port number, 1 to 65535.
fn parse_port(port: &str) -> Result<u16, String> {
    port.parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("has port `{port}`; use 1-65535"))
}

fn parse_host(host: &str) -> Result<HostPattern, String> {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host == "*" {
        return Ok(HostPattern::Any);
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(HostPattern::Ip(ip));
    }
    let (pattern, name) = match host.strip_prefix("*.") {
        Some(name) => (true, name.to_owned()),
        None => (false, host.clone()),
    };
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(format!(
            "has host `{host}`; use a name, *.name, an IP address or *"
        ));
    }
    Ok(if pattern {
        HostPattern::Subdomains(name)
    } else {
        HostPattern::Name(name)
    })
}

impl OutboundHost {
    /// Whether a request to `scheme://host:port` matches this entry. `host` is lowercase
    /// without a trailing dot (an IPv6 address without brackets).
    pub fn matches(&self, scheme: Scheme, host: &str, port: u16) -> bool {
        if scheme != self.scheme || self.port.is_some_and(|p| p != port) {
            return false;
        }
        match &self.host {
            HostPattern::Any => true,
            HostPattern::Name(name) => host == name,
            HostPattern::Subdomains(name) => host
                .strip_suffix(name.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            HostPattern::Ip(ip) => host.parse::<IpAddr>().is_ok_and(|h| h == *ip),
        }
    }
}

/// One `allowed_hosts` entry: a raw TCP connect the guest may open, `host:port` (an IPv6
/// address in brackets). The host is a name or an address, never a pattern; the port is
/// required.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpGrant {
    /// A name ([`HostPattern::Name`]) or an address ([`HostPattern::Ip`]).
    pub host: HostPattern,
    /// The port.
    pub port: u16,
}

impl std::str::FromStr for TcpGrant {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("`{text}` {why}");
        let (host, port) = split_host_port(text).map_err(|why| bad(&why))?;
        if matches!(host, HostPattern::Any | HostPattern::Subdomains(_)) {
            return Err(bad("names a pattern; a TCP grant is one host:port"));
        }
        if port.is_empty() {
            return Err(bad("has no port; a TCP grant is host:port"));
        }
        let port = parse_port(port).map_err(|why| bad(&why))?;
        Ok(TcpGrant { host, port })
    }
}

impl fmt::Display for TcpGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// Parses a plugin's `allowed_hosts`.
///
/// # Errors
///
/// The first entry that is not `host:port`, named, with why.
pub fn tcp_grants(entries: &[String]) -> Result<Vec<TcpGrant>, String> {
    entries.iter().map(|e| e.parse()).collect()
}

impl<'de> Deserialize<'de> for OutboundHost {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// `[plugins.x.http]`: the caps on a plugin's outbound requests.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpLimits {
    /// The largest request body a guest may send.
    #[serde(deserialize_with = "size")]
    pub max_request_body: u64,
    /// The largest response body a guest may receive.
    #[serde(deserialize_with = "size")]
    pub max_response_body: u64,
    /// Requests one instance may have in flight at once.
    pub max_concurrent: u32,
    /// The longest a connection may take (DNS, TCP and TLS), unless the guest asks for less.
    #[serde(deserialize_with = "duration")]
    pub connect_timeout: Duration,
    /// The longest until the response head, unless the guest asks for less.
    #[serde(deserialize_with = "duration")]
    pub first_byte_timeout: Duration,
    /// The longest between two chunks of the response body, unless the guest asks for less.
    #[serde(deserialize_with = "duration")]
    pub between_bytes_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_request_body: 4 << 20,
            max_response_body: 16 << 20,
            max_concurrent: 8,
            connect_timeout: Duration::from_secs(10),
            first_byte_timeout: Duration::from_secs(60),
            between_bytes_timeout: Duration::from_secs(30),
        }
    }
}

impl HttpLimits {
    pub(super) fn check(&self) -> Result<(), String> {
        if self.max_concurrent == 0 {
            return Err("http.max_concurrent: must be at least 1".into());
        }
        for (key, value) in [
            ("connect_timeout", self.connect_timeout),
            ("first_byte_timeout", self.first_byte_timeout),
            ("between_bytes_timeout", self.between_bytes_timeout),
        ] {
            if value.is_zero() {
                return Err(format!("http.{key}: must be more than 0"));
            }
        }
        Ok(())
    }
}

/// The extra certificate authorities of `[host] tls_ca` and a plugin's `tls_ca`.
pub type CaFiles = Vec<PathBuf>;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn host(text: &str) -> OutboundHost {
        text.parse().unwrap()
    }

    #[test]
    fn entries_parse_to_scheme_host_and_port() {
        let h = host("https://api.anthropic.com");
        assert_eq!(h.scheme, Scheme::Https);
        assert_eq!(h.host, HostPattern::Name("api.anthropic.com".into()));
        assert_eq!(h.port, Some(443));
        assert_eq!(host("http://localhost:11434").port, Some(11434));
        assert_eq!(host("http://127.0.0.1:*").port, None);
        assert_eq!(
            host("https://*.openai.com").host,
            HostPattern::Subdomains("openai.com".into())
        );
        assert_eq!(
            host("http://[::1]:8080").host,
            HostPattern::Ip("::1".parse().unwrap())
        );
        assert_eq!(
            host("HTTPS://API.Example.COM/").to_string(),
            "https://api.example.com:443"
        );
        for bad in [
            "api.example.com",
            "ftp://example.com",
            "https://example.com/v1",
            "https://user@example.com",
            "https://example.com:0",
            "https://example.com:99999",
            "https://exa mple.com",
            "https://[::1",
            "https://",
        ] {
            assert!(bad.parse::<OutboundHost>().is_err(), "{bad}");
        }
    }

    #[test]
    fn tcp_grants_are_one_host_and_port() {
        let g: TcpGrant = "DB.Example.com.:5432".parse().unwrap();
        assert_eq!(g.host, HostPattern::Name("db.example.com".into()));
        assert_eq!(g.port, 5432);
        assert_eq!(g.to_string(), "db.example.com:5432");
        let g: TcpGrant = "[::1]:7000".parse().unwrap();
        assert_eq!(g.host, HostPattern::Ip("::1".parse().unwrap()));
        assert_eq!(g.to_string(), "[::1]:7000");
        assert_eq!(
            "127.0.0.1:1".parse::<TcpGrant>().unwrap().host,
            HostPattern::Ip("127.0.0.1".parse().unwrap())
        );
        for (bad, why) in [
            ("db.example.com", "has no port"),
            ("db.example.com:", "has no port"),
            ("db.example.com:0", "use 1-65535"),
            ("db.example.com:http", "use 1-65535"),
            ("*:5432", "names a pattern"),
            ("*.example.com:5432", "names a pattern"),
            (":5432", "has host"),
            ("[::1:5432", "unclosed"),
            ("user@db:5432", "has host"),
        ] {
            let err = bad.parse::<TcpGrant>().unwrap_err();
            assert!(err.contains(why) && err.contains(bad), "{bad}: {err}");
        }
        let err = tcp_grants(&["a:1".into(), "b".into()]).unwrap_err();
        assert!(err.starts_with("`b`"), "{err}");
    }

    #[test]
    fn matching_takes_scheme_host_and_port() {
        let h = host("https://*.openai.com");
        assert!(h.matches(Scheme::Https, "api.openai.com", 443));
        assert!(h.matches(Scheme::Https, "a.b.openai.com", 443));
        assert!(!h.matches(Scheme::Https, "openai.com", 443));
        assert!(!h.matches(Scheme::Https, "evilopenai.com", 443));
        assert!(!h.matches(Scheme::Http, "api.openai.com", 443));
        assert!(!h.matches(Scheme::Https, "api.openai.com", 8443));
        let any_port = host("http://127.0.0.1:*");
        assert!(any_port.matches(Scheme::Http, "127.0.0.1", 9));
        assert!(!any_port.matches(Scheme::Http, "127.0.0.2", 9));
        assert!(host("https://*").matches(Scheme::Https, "x.y", 443));
    }
}
