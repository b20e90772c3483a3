//! Human units in `homing.toml`: durations ("30s", "7d") and sizes ("64MiB"), as strings or
//! bare numbers (milliseconds, bytes).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// Parses "250ms", "30s", "5m", "2h", "7d" (or a bare number of milliseconds).
///
/// # Errors
///
/// A message naming the accepted forms.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (use e.g. 500ms, 30s, 5m, 2h, 7d)"))?;
    let millis = match unit.trim() {
        "" | "ms" => 1.0,
        "s" => 1e3,
        "m" | "min" => 60e3,
        "h" => 3600e3,
        "d" => 86400e3,
        other => {
            return Err(format!(
                "`{other}` is not a duration unit (use ms, s, m, h or d)"
            ));
        }
    };
    let total = value * millis;
    if !total.is_finite() || !(0.0..=1e15).contains(&total) {
        return Err(format!("`{text}` is out of range"));
    }
    Ok(Duration::from_micros((total * 1000.0) as u64))
}

/// Parses "64MiB", "512KiB", "1GiB", "10MB" or a bare number of bytes.
///
/// # Errors
///
/// A message naming the accepted forms.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size (use e.g. 512KiB, 64MiB, 1GiB)"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "`{other}` is not a size unit (use B, KiB, MiB, GiB, KB, MB or GB)"
            ));
        }
    };
    value
        .checked_mul(scale)
        .ok_or_else(|| format!("`{text}` is out of range"))
}

#[derive(Deserialize)]
#[serde(untagged)]
enum NumberOrText {
    Number(u64),
    Text(String),
}

impl fmt::Display for NumberOrText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NumberOrText::Number(n) => write!(f, "{n}"),
            NumberOrText::Text(t) => f.write_str(t),
        }
    }
}

pub(crate) fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    match NumberOrText::deserialize(deserializer)? {
        NumberOrText::Number(ms) => Ok(Duration::from_millis(ms)),
        NumberOrText::Text(text) => parse_duration(&text).map_err(serde::de::Error::custom),
    }
}

pub(crate) fn size<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    match NumberOrText::deserialize(deserializer)? {
        NumberOrText::Number(bytes) => Ok(bytes),
        NumberOrText::Text(text) => parse_size(&text).map_err(serde::de::Error::custom),
    }
}

/// An optional size (`"64KiB"` or bytes), present when the key is.
pub(crate) fn optional_duration<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    duration(deserializer).map(Some)
}

pub(crate) fn optional_size<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<u64>, D::Error> {
    size(deserializer).map(Some)
}
