//! Flow control in the file: `[limits.<name>]` tables and the keys of a plugin that refer to
//! them (`limits`, `rate`, `concurrency_key`, `key_concurrency`, ...), checked with the line
//! and key of whatever is wrong, and turned into the [`LimitSet`] its claims honour and the
//! origin limits its outbound requests honour.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::outbound::{HostPattern, OutboundHost};
use super::{Config, PluginConfig};

/// A rate: `count` events per `per_ms` milliseconds, with bursts up to `burst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Events per period.
    pub count: u32,
    /// The period.
    pub per_ms: u64,
    /// The most events at once after a quiet spell (the bucket's size); defaults to `count`.
    pub burst: u32,
}

impl Rate {
    /// `count` per `per_ms` with a burst of `count`.
    pub fn new(count: u32, per_ms: u64) -> Rate {
        Rate {
            count,
            per_ms,
            burst: count,
        }
    }

    /// The same rate with another burst (at least 1).
    pub fn with_burst(self, burst: u32) -> Rate {
        Rate {
            burst: burst.max(1),
            ..self
        }
    }

    /// Milliseconds per token (fractional).
    pub fn ms_per_token(&self) -> f64 {
        self.per_ms as f64 / f64::from(self.count.max(1))
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.per_ms {
            1_000 => "s".to_owned(),
            60_000 => "min".to_owned(),
            3_600_000 => "h".to_owned(),
            86_400_000 => "day".to_owned(),
            ms => format!("{ms}ms"),
        };
        write!(f, "{}/{unit}", self.count)
    }
}

impl FromStr for Rate {
    type Err = String;

    /// `"60/min"`, `"10/s"`, `"500/minute"`, `"1000/h"`, `"5/day"`, `"3/250ms"`.
    fn from_str(text: &str) -> Result<Rate, String> {
        let bad = || {
            format!(
                "`{text}` is not a rate: write events per unit, like \"60/min\" (units: ms, s, \
                 min, h, day, or a number before one, as in \"3/250ms\")"
            )
        };
        let (count, unit) = text.trim().split_once('/').ok_or_else(bad)?;
        let count: u64 = count.trim().parse().map_err(|_| bad())?;
        if count == 0 {
            return Err(format!("`{text}`: a rate must allow at least 1 event"));
        }
        let count = u32::try_from(count).map_err(|_| format!("`{text}`: too many events"))?;
        let unit = unit.trim();
        let digits = unit.chars().take_while(char::is_ascii_digit).count();
        let (n, name) = unit.split_at(digits);
        let n: u64 = if n.is_empty() {
            1
        } else {
            n.parse().map_err(|_| bad())?
        };
        let per = match name.trim() {
            "ms" | "millisecond" | "milliseconds" => 1,
            "s" | "sec" | "second" | "seconds" => 1_000,
            "m" | "min" | "minute" | "minutes" => 60_000,
            "h" | "hour" | "hours" => 3_600_000,
            "d" | "day" | "days" => 86_400_000,
            _ => return Err(bad()),
        };
        let per_ms = n.saturating_mul(per);
        if per_ms == 0 {
            return Err(format!("`{text}`: the period must be more than 0"));
        }
        Ok(Rate::new(count, per_ms))
    }
}

/// `[limits.<name>]`: a limit shared by the plugins that list it. Without `origins` it limits
/// their claims (at most `concurrency` running at once across every host, at most `rate`
/// claims); with `origins` it limits their outbound HTTP requests to those origins instead.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitConfig {
    /// At most this many at once.
    #[serde(default)]
    pub concurrency: Option<u32>,
    /// At most this rate, like `"500/min"`.
    #[serde(default, deserialize_with = "rate")]
    pub rate: Option<Rate>,
    /// The rate's burst (default: its count).
    #[serde(default)]
    pub burst: Option<u32>,
    /// The origins whose requests it limits (`scheme://host[:port]`).
    #[serde(default)]
    pub origins: Vec<OutboundHost>,
}

impl LimitConfig {
    /// The rate with its burst applied.
    pub fn rate(&self) -> Option<Rate> {
        with_burst(self.rate, self.burst)
    }
}

/// Where a plugin's dispatches take their concurrency key from when the enqueue names none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// `"meta:<name>"`: the value of metadata key `<name>`.
    Metadata(String),
}

impl KeySource {
    /// The key of a dispatch with `metadata`.
    pub fn key_of(&self, metadata: &BTreeMap<String, String>) -> Option<String> {
        match self {
            KeySource::Metadata(name) => metadata.get(name).cloned(),
        }
    }

    /// The concurrency key of a new dispatch: the one its enqueue named, else the one `source`
    /// (the target plugin's `concurrency_key`) takes from its metadata. A blank metadata value
    /// gives no key. Every entry point (the API, the CLI, a guest) decides it here.
    pub fn key_for(
        source: Option<&KeySource>,
        named: Option<String>,
        metadata: &BTreeMap<String, String>,
    ) -> Option<String> {
        named.or_else(|| {
            source
                .and_then(|s| s.key_of(metadata))
                .filter(|k| !k.trim().is_empty())
        })
    }
}

impl<'de> Deserialize<'de> for KeySource {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        match text.strip_prefix("meta:") {
            Some(name) if !name.trim().is_empty() => Ok(KeySource::Metadata(name.to_owned())),
            _ => Err(serde::de::Error::custom(format!(
                "`{text}` is not a key source: write \"meta:<metadata key>\""
            ))),
        }
    }
}

/// A rate written as text (`"60/min"`).
pub(crate) fn rate<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Rate>, D::Error> {
    let text = String::deserialize(deserializer)?;
    text.parse().map(Some).map_err(serde::de::Error::custom)
}

pub(crate) fn with_burst(rate: Option<Rate>, burst: Option<u32>) -> Option<Rate> {
    rate.map(|r| match burst {
        Some(b) => r.with_burst(b),
        None => r,
    })
}

/// The longest a run is parked on a `park_on` status when `max_park` is not set.
pub const DEFAULT_MAX_PARK: Duration = Duration::from_secs(300);

impl Config {
    /// Where plugin `name` takes a dispatch's concurrency key from when its enqueue names none.
    pub fn key_source(&self, name: &str) -> Option<&KeySource> {
        self.plugins.get(name)?.concurrency_key.as_ref()
    }

    /// Checks the limits and the plugins' flow-control keys. An error names the table and
    /// key (the caller adds the line).
    pub(super) fn check_limits(&self) -> Result<(), (String, String, String)> {
        for (name, limit) in &self.limits {
            let table = format!("limits.{name}");
            let err = |key: &str, msg: String| Err((table.clone(), key.to_owned(), msg));
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return err(
                    "",
                    "a limit name may hold only letters, digits, `-` and `_`".into(),
                );
            }
            if limit.concurrency == Some(0) {
                return err("concurrency", "must be at least 1".into());
            }
            if limit.burst == Some(0) {
                return err("burst", "must be at least 1".into());
            }
            if limit.burst.is_some() && limit.rate.is_none() {
                return err("burst", "needs a `rate`".into());
            }
            if limit.concurrency.is_none() && limit.rate.is_none() {
                return err(
                    "",
                    "sets neither `concurrency` nor `rate`: it would limit nothing".into(),
                );
            }
        }
        for (name, plugin) in &self.plugins {
            let table = format!("plugins.{name}");
            let err = |key: &str, msg: String| Err((table.clone(), key.to_owned(), msg));
            for (key, value) in [
                ("key_concurrency", plugin.key_concurrency),
                ("burst", plugin.burst),
                ("key_burst", plugin.key_burst),
            ] {
                if value == Some(0) {
                    return err(key, "must be at least 1".into());
                }
            }
            if plugin.burst.is_some() && plugin.rate.is_none() {
                return err("burst", "needs a `rate`".into());
            }
            if plugin.key_burst.is_some() && plugin.key_rate.is_none() {
                return err("key_burst", "needs a `key_rate`".into());
            }
            if let Some((key, _)) = plugin.key_weights.iter().find(|(_, w)| **w == 0) {
                return err(
                    "key_weights",
                    format!("`{key}`: a weight must be at least 1"),
                );
            }
            if !plugin.key_weights.is_empty()
                && plugin.key_concurrency.is_none()
                && plugin.key_rate.is_none()
            {
                return err(
                    "key_weights",
                    "weigh keys only with `key_concurrency` or `key_rate` set".into(),
                );
            }
            for status in &plugin.park_on {
                if !(400..=599).contains(status) {
                    return err(
                        "park_on",
                        format!("{status} is not an HTTP error status (400-599)"),
                    );
                }
            }
            if plugin.max_park.is_zero() {
                return err("max_park", "must be more than 0".into());
            }
            for limit in &plugin.limits {
                let Some(l) = self.limits.get(limit) else {
                    let known: Vec<&str> = self.limits.keys().map(String::as_str).collect();
                    return err(
                        "limits",
                        format!(
                            "`{limit}` is not a configured limit (configured: {})",
                            if known.is_empty() {
                                "none".to_owned()
                            } else {
                                known.join(", ")
                            }
                        ),
                    );
                };
                for origin in &l.origins {
                    if !allowed(plugin, origin) {
                        return err(
                            "limits",
                            format!(
                                "`{limit}` limits requests to {origin}, which is not in this \
                                 plugin's allowed_outbound_hosts"
                            ),
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

/// Whether `plugin` may send requests to `origin` (an entry matches it, or is the same
/// pattern).
fn allowed(plugin: &PluginConfig, origin: &OutboundHost) -> bool {
    plugin.allowed_outbound_hosts.iter().any(|entry| {
        entry == origin
            || match (&origin.host, origin.port) {
                (HostPattern::Name(host), Some(port)) => entry.matches(origin.scheme, host, port),
                (HostPattern::Ip(ip), Some(port)) => {
                    entry.matches(origin.scheme, &ip.to_string(), port)
                }
                _ => false,
            }
    })
}

/// The line of `key` in table `[table]` of `text` (of the table's header when `key` is empty
/// or not found), 1-based.
pub(super) fn line_of(text: &str, table: &str, key: &str) -> Option<usize> {
    let header = format!("[{table}]");
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim().replace(' ', "") == header)?;
    if !key.is_empty() {
        for (i, l) in lines.iter().enumerate().skip(start + 1) {
            let l = l.trim_start();
            if l.starts_with('[') {
                break;
            }
            if l.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
            {
                return Some(i + 1);
            }
        }
    }
    Some(start + 1)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::path::Path;

    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, "homing.toml", Path::new("/etc/homing")).map_err(|e| e.to_string())
    }

    const PLUGIN: &str =
        "[plugins.a]\npath = \"a.wasm\"\nallowed_outbound_hosts = [\"https://api.openai.com\"]\n";

    #[test]
    fn bad_limits_are_refused_naming_file_line_and_key() {
        let cases = [
            (
                format!("{PLUGIN}rate = \"60/fortnight\"\n"),
                "line 4",
                "60/fortnight",
            ),
            (
                format!("{PLUGIN}key_concurrency = -1\n"),
                "line 4",
                "key_concurrency",
            ),
            (
                format!("{PLUGIN}key_concurrency = 0\n"),
                "line 4: [plugins.a] key_concurrency: must be at least 1",
                "",
            ),
            (
                format!("{PLUGIN}limits = [\"nope\"]\n"),
                "line 4: [plugins.a] limits: `nope` is not a configured limit",
                "",
            ),
            (
                format!(
                    "{PLUGIN}limits = [\"x\"]\n[limits.x]\norigins = [\"https://example.com\"]\nrate = \"1/s\"\n"
                ),
                "line 4: [plugins.a] limits: `x` limits requests to https://example.com:443",
                "allowed_outbound_hosts",
            ),
            (
                format!("{PLUGIN}[limits.x]\nconcurrency = 0\n"),
                "line 5: [limits.x] concurrency: must be at least 1",
                "",
            ),
            (
                format!("{PLUGIN}[limits.x]\norigins = []\n"),
                "line 4: [limits.x]: sets neither",
                "",
            ),
            (
                format!("{PLUGIN}concurrency_key = \"customer\"\n"),
                "line 4",
                "meta:",
            ),
            (format!("{PLUGIN}park_on = [200]\n"), "park_on", "400-599"),
        ];
        for (text, first, second) in cases {
            let e = parse(&text).unwrap_err();
            assert!(e.starts_with("homing.toml"), "{e}");
            assert!(e.contains(first) && e.contains(second), "{text}\n=> {e}");
        }
    }
}
