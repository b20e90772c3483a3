//! `[store]`: which backend holds the mailbox and the thread logs, and that backend's settings.
//!
//! The section is a tagged enum on its `backend` key (`embedded` when absent), so each backend
//! accepts only its own keys: `url` under an embedded store, or `fsync` under a NATS one, is an
//! error naming the file, the line and the key, never silently ignored.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

use super::units::duration;

/// `[store]`: one backend and its settings.
#[derive(Debug, Clone)]
pub enum StoreConfig {
    /// `backend = "embedded"` (the default): SQLite in one file, for one machine.
    Embedded(EmbeddedSettings),
    /// `backend = "nats"`: NATS JetStream, for many hosts.
    Nats(NatsSettings),
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig::Embedded(EmbeddedSettings::default())
    }
}

impl StoreConfig {
    /// Which backend this is.
    pub fn backend(&self) -> Backend {
        match self {
            StoreConfig::Embedded(_) => Backend::Embedded,
            StoreConfig::Nats(_) => Backend::Nats,
        }
    }
}

/// The keys of `backend = "embedded"`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddedSettings {
    /// The store's file (default `homing.db` next to the config).
    pub path: Option<PathBuf>,
    /// fsync every commit (survives power loss; slower).
    pub fsync: bool,
}

/// The keys of `backend = "nats"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NatsSettings {
    /// NATS server URLs: one string (comma-separated) or a list (default
    /// `nats://127.0.0.1:4222`).
    pub url: Option<Urls>,
    /// A NATS `.creds` file.
    pub credentials: Option<PathBuf>,
    /// The NATS stream name and subject prefix (default `homing`); two deployments sharing a
    /// server use two prefixes.
    pub prefix: String,
    /// Stream replicas: 1, or 3 on a cluster.
    pub replicas: usize,
    /// How long to wait for the NATS connection at start.
    #[serde(deserialize_with = "duration")]
    pub connect_timeout: Duration,
    /// How long any one NATS request may take before it fails as unavailable.
    #[serde(deserialize_with = "duration")]
    pub request_timeout: Duration,
}

/// The server a NATS store connects to when `url` is not set.
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";

impl Default for NatsSettings {
    fn default() -> Self {
        NatsSettings {
            url: None,
            credentials: None,
            prefix: "homing".into(),
            replicas: 1,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
        }
    }
}

impl NatsSettings {
    /// The server URLs: `url` split at commas, or the list, or [`DEFAULT_NATS_URL`].
    pub fn urls(&self) -> Vec<String> {
        match &self.url {
            None => vec![DEFAULT_NATS_URL.to_owned()],
            Some(Urls::One(url)) => url
                .split(',')
                .map(|u| u.trim().to_owned())
                .filter(|u| !u.is_empty())
                .collect(),
            Some(Urls::Many(urls)) => urls.clone(),
        }
    }
}

/// Checks NATS settings a server cannot check for us: at least one URL, a prefix that can
/// name a stream and does not start with `_HOMING`, a replica count a cluster accepts, timeouts above zero.
///
/// # Errors
///
/// A message naming the key.
pub fn check_nats(
    urls: &[String],
    prefix: &str,
    replicas: usize,
    timeouts: [Duration; 2],
) -> Result<(), String> {
    if urls.is_empty() {
        return Err("url: at least one server URL is needed".into());
    }
    let mut users = urls.iter().filter_map(|u| split_nats_url(u).1);
    if let Some(first) = users.next()
        && users.any(|other| other != first)
    {
        return Err(
            "url: the server URLs carry different user parts; every server takes the same \
             credentials"
                .into(),
        );
    }
    if prefix.is_empty()
        || !prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(format!(
            "prefix `{prefix}`: use letters, digits, `_` and `-` only (it names a stream)"
        ));
    }
    if prefix.starts_with("_HOMING") {
        return Err(format!(
            "prefix `{prefix}`: names starting with `_HOMING` are Homing's own (live deltas \
             travel on `_HOMING_LIVE.<prefix>.>`, which no deployment's stream may capture)"
        ));
    }
    if !matches!(replicas, 1 | 3 | 5) {
        return Err(format!("replicas = {replicas}: use 1, 3 or 5"));
    }
    if timeouts.iter().any(Duration::is_zero) {
        return Err("timeouts must be above zero".into());
    }
    Ok(())
}

/// The credentials a NATS URL carries in its user part. `Debug` shows which kind, never a
/// value.
#[derive(Clone, PartialEq, Eq)]
pub enum UrlCredentials {
    /// `nats://user:password@host`.
    UserPassword(String, String),
    /// `nats://token@host`.
    Token(String),
}

impl fmt::Debug for UrlCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UrlCredentials::UserPassword(..) => f.write_str("UserPassword(<redacted>)"),
            UrlCredentials::Token(_) => f.write_str("Token(<redacted>)"),
        }
    }
}

/// Splits a NATS server URL into the URL without its user part, which may be shown, and the
/// credentials that part carried (`user:password@` or `token@`, percent-decoded), which never
/// are. The user part is everything before the last `@` after the scheme, so a password
/// holding `/`, `?` or `#` is never mistaken for the host.
pub fn split_nats_url(url: &str) -> (String, Option<UrlCredentials>) {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let Some((user, host)) = rest.rsplit_once('@') else {
        return (url.to_owned(), None);
    };
    let credentials = match user.split_once(':') {
        _ if user.is_empty() => None,
        Some((name, password)) => Some(UrlCredentials::UserPassword(
            percent_decode(name),
            percent_decode(password),
        )),
        None => Some(UrlCredentials::Token(percent_decode(user))),
    };
    (format!("{scheme}{host}"), credentials)
}

/// `url` as the host shows it, in output, errors and logs: without its user part (a user and
/// password, or a token). Every NATS URL the host prints goes through here.
pub fn shown_nats_url(url: &str) -> String {
    split_nats_url(url).0
}

/// `urls` as the host shows them ([`shown_nats_url`]), joined with `, `.
pub fn shown_nats_urls(urls: &[String]) -> String {
    urls.iter()
        .map(|u| shown_nats_url(u))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `%XX` escapes decoded (bytes that are not UTF-8 become U+FFFD); anything else as it is.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One URL or several. `Debug` shows them without their user parts.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Urls {
    /// `url = "nats://a:4222"`.
    One(String),
    /// `url = ["nats://a:4222", "nats://b:4222"]`.
    Many(Vec<String>),
}

impl fmt::Debug for Urls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Urls::One(url) => f.debug_tuple("One").field(&shown_nats_url(url)).finish(),
            Urls::Many(urls) => f
                .debug_tuple("Many")
                .field(&urls.iter().map(|u| shown_nats_url(u)).collect::<Vec<_>>())
                .finish(),
        }
    }
}

/// The store backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// SQLite in one file.
    Embedded,
    /// NATS JetStream.
    Nats,
}

impl Backend {
    /// The `backend` value.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Embedded => "embedded",
            Backend::Nats => "nats",
        }
    }

    /// Whether `key` is one of this backend's keys.
    fn has_key(self, key: &str) -> bool {
        match self {
            Backend::Embedded => ["path", "fsync"].contains(&key),
            Backend::Nats => [
                "url",
                "credentials",
                "prefix",
                "replicas",
                "connect_timeout",
                "request_timeout",
            ]
            .contains(&key),
        }
    }
}

impl<'de> Deserialize<'de> for StoreConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut table = toml::Table::deserialize(deserializer)?;
        let backend = match table.remove("backend") {
            None => Backend::Embedded,
            Some(value) => Backend::deserialize(value).map_err(|_| {
                D::Error::custom("backend: must be \"embedded\" or \"nats\"".to_owned())
            })?,
        };
        // A key of the other backend gets a message saying so, not just "unknown field".
        for key in table.keys() {
            if !backend.has_key(key) {
                let other = match backend {
                    Backend::Embedded => Backend::Nats,
                    Backend::Nats => Backend::Embedded,
                };
                let hint = if other.has_key(key) {
                    format!(
                        " (`{key}` belongs to backend = \"{}\"; this store is \"{}\")",
                        other.name(),
                        backend.name()
                    )
                } else {
                    String::new()
                };
                return Err(D::Error::custom(format!(
                    "unknown field `{key}` in [store]{hint}"
                )));
            }
        }
        let value = toml::Value::Table(table);
        match backend {
            Backend::Embedded => EmbeddedSettings::deserialize(value)
                .map(StoreConfig::Embedded)
                .map_err(|e| D::Error::custom(format!("[store] {}", e.message()))),
            Backend::Nats => NatsSettings::deserialize(value)
                .map(StoreConfig::Nats)
                .map_err(|e| D::Error::custom(format!("[store] {}", e.message()))),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn a_nats_url_is_shown_without_its_user_part() {
        let cases = [
            ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222", None),
            (
                "nats://user:pa%40ss@host:4222",
                "nats://host:4222",
                Some(UrlCredentials::UserPassword("user".into(), "pa@ss".into())),
            ),
            (
                "tls://tok3n@host",
                "tls://host",
                Some(UrlCredentials::Token("tok3n".into())),
            ),
            // A password with a slash or a hash is still the user part.
            (
                "nats://u:p/ss#x@host:1",
                "nats://host:1",
                Some(UrlCredentials::UserPassword("u".into(), "p/ss#x".into())),
            ),
            (
                "u:p@host:4222",
                "host:4222",
                Some(UrlCredentials::UserPassword("u".into(), "p".into())),
            ),
            ("nats://@host", "nats://host", None),
        ];
        for (url, shown, credentials) in cases {
            assert_eq!(
                split_nats_url(url),
                (shown.to_owned(), credentials),
                "{url}"
            );
            assert_eq!(shown_nats_url(url), shown);
        }
        assert_eq!(
            shown_nats_urls(&["nats://a:b@h1:1".into(), "nats://h2:2".into()]),
            "nats://h1:1, nats://h2:2"
        );
        let debug = format!(
            "{:?} {:?}",
            Urls::One("nats://a:secret-pw@h".into()),
            split_nats_url("nats://a:secret-pw@h").1
        );
        assert!(!debug.contains("secret-pw"), "{debug}");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }

    #[test]
    fn servers_of_one_store_take_one_set_of_credentials() {
        let check = |urls: &[&str]| {
            let urls: Vec<String> = urls.iter().map(|u| (*u).to_owned()).collect();
            check_nats(&urls, "p", 1, [Duration::from_secs(1); 2])
        };
        assert!(check(&["nats://a:b@h1", "nats://h2", "nats://a:b@h3"]).is_ok());
        let err = check(&["nats://a:b@h1", "nats://a:c@h2"]).unwrap_err();
        assert!(err.contains("different user parts"), "{err}");
    }

    #[test]
    fn prefixes_starting_with_homings_own_are_refused() {
        let check =
            |prefix: &str| check_nats(&["nats://h".into()], prefix, 1, [Duration::from_secs(1); 2]);
        for bad in ["_HOMING", "_HOMING_LIVE", "_HOMINGx"] {
            let err = check(bad).unwrap_err();
            assert!(err.starts_with(&format!("prefix `{bad}`")), "{err}");
            assert!(err.contains("_HOMING_LIVE"), "{err}");
        }
        for good in ["homing", "_homing", "x_HOMING"] {
            assert!(check(good).is_ok(), "{good}");
        }
    }
}
