//! A plugin's network policy: its grants, as the config parsed them, and the one decision on
//! every outbound connection, for HTTP (`wasi:http`) and raw TCP (`wasi:sockets`) alike.
//!
//! A connection passes two rules:
//!
//! 1. **a grant admits it.** HTTP: an `allowed_outbound_hosts` entry matches the request's
//!    scheme, host and port. TCP: an `allowed_hosts` entry has the connect's port and its host
//!    resolves, now, to the connect's address (a guest resolves names itself, so the host
//!    checks the address it was handed).
//! 2. **the address rule.** The address is globally routable, or a grant of the same kind
//!    names that destination: the address literally, or `localhost` for a loopback address,
//!    with the same scheme (HTTP) and a port that covers the connection's. So `http://*:*` with
//!    `http://127.0.0.1:8080` reaches 127.0.0.1 on port 8080 only, never on another port nor
//!    over https; and a name that resolves to a private address (by mistake or by DNS
//!    rebinding) reaches nothing a grant did not name.
//!
//! Names are resolved at request time (a CDN's addresses change), except those pinned by
//! `[host] hosts`, which are never looked up.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::config::PluginConfig;
use crate::config::outbound::{HostPattern, OutboundHost, Scheme, TcpGrant, tcp_grants};

/// What a connection carries: HTTP with its scheme, or raw TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carrier {
    /// A `wasi:http` request.
    Http(Scheme),
    /// A `wasi:sockets` TCP connect.
    Tcp,
}

/// One plugin's grants and the decisions on them.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    http: Vec<OutboundHost>,
    tcp: Vec<TcpGrant>,
    /// `[host] hosts`: names (lowercase, no trailing dot) pinned to addresses.
    pinned: BTreeMap<String, IpAddr>,
}

impl Policy {
    /// The policy of a plugin with `config`'s grants; `pinned` is `[host] hosts`.
    ///
    /// # Errors
    ///
    /// When an `allowed_hosts` entry is not `host:port` (the config check refuses it first).
    pub fn new(config: &PluginConfig, pinned: &BTreeMap<String, IpAddr>) -> Result<Self, String> {
        Ok(Policy {
            http: config.allowed_outbound_hosts.clone(),
            tcp: tcp_grants(&config.allowed_hosts).map_err(|e| format!("allowed_hosts: {e}"))?,
            pinned: pinned
                .iter()
                .map(|(k, v)| (k.trim_end_matches('.').to_ascii_lowercase(), *v))
                .collect(),
        })
    }

    /// This policy with `grants` added to its HTTP grants: the policy of the host's own
    /// requests for the plugin (its MCP servers), which its guest does not have.
    pub fn with_http(&self, grants: impl IntoIterator<Item = OutboundHost>) -> Policy {
        let mut out = self.clone();
        out.http.extend(grants);
        out
    }

    /// The `allowed_outbound_hosts` entries.
    pub fn http_grants(&self) -> &[OutboundHost] {
        &self.http
    }

    /// Whether any raw TCP is granted.
    pub fn grants_tcp(&self) -> bool {
        !self.tcp.is_empty()
    }

    /// The entry that admits an HTTP request to `scheme://host:port` (`host` lowercase, without
    /// brackets or a trailing dot), if any.
    pub fn admit_http(&self, scheme: Scheme, host: &str, port: u16) -> Option<&OutboundHost> {
        self.http.iter().find(|e| e.matches(scheme, host, port))
    }

    /// The addresses of `host` (lowercase, without brackets or a trailing dot) on `port`: an
    /// address as it is, a pinned name's address, or what DNS answers now.
    ///
    /// # Errors
    ///
    /// When the name does not resolve.
    pub async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        let fixed = host
            .parse::<IpAddr>()
            .ok()
            .or_else(|| self.pinned.get(host).copied());
        match fixed {
            Some(ip) => Ok(vec![SocketAddr::new(ip, port)]),
            None => Ok(tokio::net::lookup_host((host, port)).await?.collect()),
        }
    }

    /// The address rule: whether a connection carrying `carrier` may reach `addr`. A public
    /// address always; any other only when a grant of the same carrier, covering the port,
    /// names it (literally, or as `localhost` for a loopback address).
    pub fn may_reach(&self, carrier: Carrier, addr: SocketAddr) -> bool {
        let ip = canonical(addr.ip());
        if is_public(ip) {
            return true;
        }
        let names = |host: &HostPattern| match host {
            HostPattern::Ip(named) => canonical(*named) == ip,
            HostPattern::Name(name) => name == "localhost" && ip.is_loopback(),
            HostPattern::Any | HostPattern::Subdomains(_) => false,
        };
        let port = addr.port();
        match carrier {
            Carrier::Http(scheme) => self
                .http
                .iter()
                .any(|e| e.scheme == scheme && e.port.is_none_or(|p| p == port) && names(&e.host)),
            Carrier::Tcp => self.tcp.iter().any(|g| g.port == port && names(&g.host)),
        }
    }

    /// Whether a raw TCP connect to `addr` is granted: an `allowed_hosts` entry on its port
    /// resolves to it, and the address rule lets it through.
    pub async fn allows_tcp(&self, addr: SocketAddr) -> bool {
        let ip = canonical(addr.ip());
        for grant in self.tcp.iter().filter(|g| g.port == addr.port()) {
            let found = match &grant.host {
                HostPattern::Ip(named) => vec![SocketAddr::new(*named, grant.port)],
                HostPattern::Name(name) => self.resolve(name, grant.port).await.unwrap_or_default(),
                HostPattern::Any | HostPattern::Subdomains(_) => Vec::new(),
            };
            if found.iter().any(|a| canonical(a.ip()) == ip) {
                return self.may_reach(Carrier::Tcp, addr);
            }
        }
        false
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// Whether an address is globally routable: not loopback, private, link-local, shared,
/// documentation, benchmarking, multicast, reserved or unspecified. (std's `is_global` is not
/// stable yet; this follows the IANA special-purpose registries.)
pub fn is_public(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(a == 0 // "this network"
        || a == 10
        || a == 127
        || (a == 100 && (64..128).contains(&b)) // shared (carrier-grade NAT)
        || (a == 169 && b == 254) // link-local, cloud metadata
        || (a == 172 && (16..32).contains(&b))
        || (a == 192 && b == 0 && c == 0) // protocol assignments
        || (a == 192 && b == 0 && c == 2) // documentation
        || (a == 192 && b == 168)
        || (a == 198 && (18..20).contains(&b)) // benchmarking
        || (a == 198 && b == 51 && c == 100) // documentation
        || (a == 203 && b == 0 && c == 113) // documentation
        || a >= 224) // multicast, reserved, broadcast
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() {
        return false;
    }
    // NAT64 and 6to4 carry an IPv4 address: judge that one.
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        let v4 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
        return is_public_v4(v4);
    }
    if s[0] == 0x2002 {
        let v4 = Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8);
        return is_public_v4(v4);
    }
    !((s[0] & 0xfe00) == 0xfc00 // unique local
        || (s[0] & 0xffc0) == 0xfe80 // link-local
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
        || s[0..6] == [0, 0, 0, 0, 0, 0]) // IPv4-compatible and other reserved
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    /// A policy of `http` (`allowed_outbound_hosts`) and `tcp` (`allowed_hosts`) entries.
    fn policy(http: &[&str], tcp: &[&str]) -> Policy {
        Policy {
            http: http.iter().map(|e| e.parse().unwrap()).collect(),
            tcp: tcp.iter().map(|e| e.parse().unwrap()).collect(),
            pinned: BTreeMap::new(),
        }
    }

    fn at(addr: &str) -> SocketAddr {
        addr.parse().unwrap()
    }

    const HTTP: Carrier = Carrier::Http(Scheme::Http);
    const HTTPS: Carrier = Carrier::Http(Scheme::Https);

    #[test]
    fn only_public_addresses_are_public() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in [
            "1.1.1.1",
            "93.184.216.34",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn a_private_address_passes_only_when_a_grant_names_it() {
        let api = policy(&["https://api.example.com"], &[]);
        assert!(api.may_reach(HTTPS, at("1.1.1.1:443")));
        assert!(!api.may_reach(HTTPS, at("127.0.0.1:443")));
        assert!(!api.may_reach(HTTPS, at("169.254.169.254:443")));
        let named = policy(&["https://api.example.com", "http://10.0.0.5:*"], &[]);
        assert!(named.may_reach(HTTP, at("10.0.0.5:80")));
        assert!(named.may_reach(HTTP, at("10.0.0.5:9999")));
        assert!(!named.may_reach(HTTP, at("10.0.0.6:80")));
        let local = policy(&["http://localhost:11434"], &[]);
        assert!(local.may_reach(HTTP, at("127.0.0.1:11434")));
        assert!(local.may_reach(HTTP, at("[::1]:11434")));
        assert!(!local.may_reach(HTTP, at("10.0.0.1:11434")));
    }

    #[test]
    fn the_grant_naming_an_address_must_cover_the_scheme_and_port() {
        // Issue 32: any-host on any port, and one loopback port named.
        let p = policy(&["http://*:*", "http://127.0.0.1:8080"], &[]);
        assert!(p.admit_http(Scheme::Http, "127.0.0.1", 9090).is_some());
        assert!(!p.may_reach(HTTP, at("127.0.0.1:9090")));
        assert!(p.may_reach(HTTP, at("127.0.0.1:8080")));
        assert!(!p.may_reach(HTTPS, at("127.0.0.1:8080")));
        assert!(!p.may_reach(HTTP, at("[::ffff:127.0.0.1]:9090")));
        let local = policy(&["http://*:*", "http://localhost:11434"], &[]);
        assert!(local.may_reach(HTTP, at("127.0.0.1:11434")));
        assert!(!local.may_reach(HTTP, at("127.0.0.1:22")));
        // A TCP grant is not an HTTP one, nor the other way round.
        let tcp = policy(&["http://*:*"], &["127.0.0.1:5432"]);
        assert!(!tcp.may_reach(HTTP, at("127.0.0.1:5432")));
        assert!(tcp.may_reach(Carrier::Tcp, at("127.0.0.1:5432")));
        let http = policy(&["http://127.0.0.1:*"], &[]);
        assert!(!http.may_reach(Carrier::Tcp, at("127.0.0.1:5432")));
    }

    #[tokio::test]
    async fn a_tcp_connect_needs_its_port_its_address_and_the_address_rule() {
        let p = policy(&[], &["127.0.0.1:5432", "localhost:6379", "[::1]:7000"]);
        assert!(p.allows_tcp(at("127.0.0.1:5432")).await);
        assert!(!p.allows_tcp(at("127.0.0.1:5433")).await);
        assert!(!p.allows_tcp(at("127.0.0.2:5432")).await);
        assert!(p.allows_tcp(at("[::1]:7000")).await);
        assert!(!p.allows_tcp(at("127.0.0.1:7000")).await);
        // localhost resolves to loopback, which its grant names.
        assert!(p.allows_tcp(at("127.0.0.1:6379")).await);
        // A pinned name that points at a private address reaches it only when named.
        let mut pinned = policy(&[], &["db.internal:5432"]);
        pinned
            .pinned
            .insert("db.internal".into(), "10.0.0.7".parse().unwrap());
        assert!(!pinned.allows_tcp(at("10.0.0.7:5432")).await);
        pinned.tcp.push("10.0.0.7:5432".parse().unwrap());
        assert!(pinned.allows_tcp(at("10.0.0.7:5432")).await);
    }
}
