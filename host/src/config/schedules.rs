//! `[schedules.<name>]`: agents that run on a calendar (docs/contract.md section 16). The
//! config reads the table and checks what it alone knows (the agent is a plugin of the file,
//! one of `cron`, `every` and `at`, the payload's source and size); what the times mean (the
//! cron, the zone, the jitter against the spacing of the fires) is the store's rules', checked
//! by `work::schedules::defs_of` with the lines found here.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::units::{duration, optional_duration};

/// One `[schedules.<name>]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
    /// The plugin its dispatches go to.
    pub agent: String,
    /// The payload of every fire, as text.
    #[serde(default)]
    pub payload: Option<String>,
    /// A file whose bytes are the payload (relative to the config file).
    #[serde(default)]
    pub payload_file: Option<String>,
    /// Metadata of every fire.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// The thread of its dispatches: a name, or `per-fire` for a thread per fire (default:
    /// the schedule's name).
    #[serde(default)]
    pub thread: Option<String>,
    /// A cron expression (5 or 6 fields, or `@daily`...).
    #[serde(default)]
    pub cron: Option<String>,
    /// An interval of absolute time (`15m`).
    #[serde(default, deserialize_with = "optional_duration")]
    pub every: Option<Duration>,
    /// A fire time `every` counts from (RFC 3339; default the Unix epoch).
    #[serde(default)]
    pub anchor: Option<String>,
    /// One fire, at this time (RFC 3339).
    #[serde(default)]
    pub at: Option<String>,
    /// The IANA zone the cron is read in (default `UTC`).
    #[serde(default)]
    pub timezone: Option<String>,
    /// No fire before (RFC 3339).
    #[serde(default)]
    pub start_at: Option<String>,
    /// No fire after (RFC 3339).
    #[serde(default)]
    pub end_at: Option<String>,
    /// A delay of each fire in `[0, jitter)`, the same on every host.
    #[serde(default, deserialize_with = "duration")]
    pub jitter: Duration,
    /// `skip` (default), `buffer_one`, `buffer_all`, `cancel_other` or `allow`.
    #[serde(default)]
    pub overlap: Option<String>,
    /// The slots `buffer_all` keeps (default 16).
    #[serde(default)]
    pub max_buffered: Option<u32>,
    /// Which missed slots fire after downtime.
    #[serde(default)]
    pub catchup: CatchupConfig,
    /// The daylight-saving policy.
    #[serde(default)]
    pub dst: DstConfig,
    /// Pause when one of its dispatches dead-letters.
    #[serde(default)]
    pub pause_on_failure: bool,
    /// The line of each key in the file, and of the table itself (under ""): where an error
    /// found later points.
    #[serde(skip)]
    pub lines: BTreeMap<String, usize>,
}

/// The keys of a schedule's table, in the order a reader meets them.
const KEYS: [&str; 19] = [
    "agent",
    "payload",
    "payload_file",
    "metadata",
    "thread",
    "cron",
    "every",
    "anchor",
    "at",
    "timezone",
    "start_at",
    "end_at",
    "jitter",
    "overlap",
    "max_buffered",
    "catchup",
    "dst",
    "pause_on_failure",
    "",
];

/// `catchup = { policy, window, max }`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatchupConfig {
    /// `latest` (default), `all` or `none`.
    #[serde(default)]
    pub policy: Option<String>,
    /// How old a missed slot may be and still fire (default `1h`).
    #[serde(default, deserialize_with = "optional_duration")]
    pub window: Option<Duration>,
    /// The most slots `all` fires (default 10).
    #[serde(default)]
    pub max: Option<u32>,
}

/// `dst = { gap, fold }`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DstConfig {
    /// `shift` (default) or `skip`.
    #[serde(default)]
    pub gap: Option<String>,
    /// `first` (default), `last` or `both`.
    #[serde(default)]
    pub fold: Option<String>,
}

/// The value of `thread` that gives each fire a thread of its own.
pub const PER_FIRE: &str = "per-fire";

impl ScheduleConfig {
    /// Where `key` is (or the table, when the key is not in it): `line N: ` for a message.
    pub fn at_line(&self, key: &str) -> String {
        self.lines
            .get(key)
            .or_else(|| self.lines.get(""))
            .map(|n| format!("line {n}: "))
            .unwrap_or_default()
    }

    /// The payload: the text, or the file's bytes (at most `max_payload`).
    ///
    /// # Errors
    ///
    /// The key that is wrong and why.
    pub fn payload_bytes(
        &self,
        base: &Path,
        max_payload: u64,
    ) -> Result<Vec<u8>, (String, String)> {
        match (&self.payload, &self.payload_file) {
            (Some(_), Some(_)) => Err((
                "payload_file".into(),
                "set either payload or payload_file, not both".into(),
            )),
            (Some(text), None) => {
                if text.len() as u64 > max_payload {
                    return Err((
                        "payload".into(),
                        format!(
                            "{} bytes exceeds [host] max_payload of {max_payload} bytes",
                            text.len()
                        ),
                    ));
                }
                Ok(text.clone().into_bytes())
            }
            (None, Some(file)) => {
                let path = base.join(file);
                crate::input::read_file_capped(
                    &path,
                    max_payload,
                    "payload_file",
                    "[host] max_payload",
                )
                .map_err(|e| ("payload_file".into(), e.to_string()))
            }
            (None, None) => Ok(Vec::new()),
        }
    }
}

/// Finds the lines of every schedule's keys in `text`.
pub(super) fn find_lines(text: &str, schedules: &mut BTreeMap<String, ScheduleConfig>) {
    for (name, s) in schedules.iter_mut() {
        let table = format!("schedules.{name}");
        for key in KEYS {
            if let Some(n) = super::limits::line_of(text, &table, key) {
                s.lines.insert(key.to_owned(), n);
            }
        }
    }
}

/// The checks the config makes of `[schedules]` alone: the table's key and key of the first
/// problem, and the message.
pub(super) fn check(
    schedules: &BTreeMap<String, ScheduleConfig>,
    plugins: &BTreeMap<String, super::PluginConfig>,
) -> Result<(), (String, String, String)> {
    for (name, s) in schedules {
        let table = format!("schedules.{name}");
        let fail = |key: &str, message: String| Err((table.clone(), key.to_owned(), message));
        if !plugins.contains_key(&s.agent) {
            return fail(
                "agent",
                format!(
                    "`{}` is not a plugin of this file (known: {})",
                    s.agent.escape_debug(),
                    plugins.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            );
        }
        let whens = [s.cron.is_some(), s.every.is_some(), s.at.is_some()]
            .iter()
            .filter(|b| **b)
            .count();
        if whens != 1 {
            return fail("cron", "set exactly one of cron, every and at".to_owned());
        }
        if s.anchor.is_some() && s.every.is_none() {
            return fail("anchor", "anchor goes with every".to_owned());
        }
        if s.payload.is_some() && s.payload_file.is_some() {
            return fail(
                "payload_file",
                "set either payload or payload_file, not both".to_owned(),
            );
        }
    }
    Ok(())
}
