//! `[store]`: which backend holds the mailbox and the thread logs, and that backend's settings.
//!
//! The section is a tagged enum on its `backend` key (`embedded` when absent), so each backend
//! accepts only its own keys: `url` under an embedded store, or `fsync` under a NATS one, is an
//! error naming the file, the line and the key, never silently ignored.

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
/// name a stream, a replica count a cluster accepts, timeouts above zero.
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
    if prefix.is_empty()
        || !prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(format!(
            "prefix `{prefix}`: use letters, digits, `_` and `-` only (it names a stream)"
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

/// One URL or several.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Urls {
    /// `url = "nats://a:4222"`.
    One(String),
    /// `url = ["nats://a:4222", "nats://b:4222"]`.
    Many(Vec<String>),
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
