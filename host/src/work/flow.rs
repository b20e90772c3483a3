//! Pausing and resuming an agent's claims, and how its flow control stands (paused or not,
//! each limit's use, the runs parked), as the API, the CLI and the dashboard offer them.

use serde::Serialize;

use crate::config::Config;
use crate::config::limits::with_burst;
use crate::config::outbound::OutboundHost;
use crate::store::limits::Pause;
use crate::store::limits::{LimitSet, Scope, agent_scope_name, named_scope_name};
use crate::store::model::{check_concurrency_key, printable};
use crate::store::{ListCursor, ListFilter, Status, Store, StoreError};

/// The longest pause reason, in bytes.
pub const MAX_PAUSE_REASON: usize = 1024;

/// The most queued dispatches [`parked`] reads to count the parked ones.
pub const MAX_PARKED_SCAN: usize = 10_000;

/// Why a pause or a resume did not happen.
#[derive(Debug, thiserror::Error)]
pub enum FlowError {
    /// No plugin of this name in the config.
    #[error("no agent `{agent}` (configured: {known})")]
    UnknownAgent {
        /// The name asked for.
        agent: String,
        /// The configured plugins, comma-separated (`none` when there are none).
        known: String,
    },
    /// A field is not acceptable.
    #[error("{message}")]
    Invalid {
        /// The field (`key`, `reason`).
        field: &'static str,
        /// What is wrong, naming it.
        message: String,
    },
    /// The reason is longer than [`MAX_PAUSE_REASON`] bytes.
    #[error("reason is {len} bytes, over the limit of {MAX_PAUSE_REASON} bytes")]
    ReasonTooLong {
        /// Its length.
        len: usize,
    },
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Checks that `agent` is a configured plugin.
///
/// # Errors
///
/// [`FlowError::UnknownAgent`], naming it and the configured ones.
pub fn known_agent(config: &Config, agent: &str) -> Result<(), FlowError> {
    if config.plugins.contains_key(agent) {
        return Ok(());
    }
    let known: Vec<&str> = config.plugins.keys().map(String::as_str).collect();
    Err(FlowError::UnknownAgent {
        agent: agent.to_owned(),
        known: if known.is_empty() {
            "none".to_owned()
        } else {
            known.join(", ")
        },
    })
}

fn check_key(key: Option<&str>) -> Result<(), FlowError> {
    match key {
        None => Ok(()),
        Some(key) => check_concurrency_key(key).map_err(|message| FlowError::Invalid {
            field: "key",
            message: message.replacen("concurrency_key", "key", 1),
        }),
    }
}

/// Checks a pause reason: at most [`MAX_PAUSE_REASON`] bytes, printable.
///
/// # Errors
///
/// [`FlowError::ReasonTooLong`], or [`FlowError::Invalid`] naming `reason`.
pub fn check_reason(reason: &str) -> Result<(), FlowError> {
    if reason.len() > MAX_PAUSE_REASON {
        return Err(FlowError::ReasonTooLong { len: reason.len() });
    }
    if let Some((at, c)) = reason.char_indices().find(|(_, c)| !printable(*c)) {
        return Err(FlowError::Invalid {
            field: "reason",
            message: format!(
                "reason holds the non-printable character U+{:04X} at byte {at}",
                u32::from(c)
            ),
        });
    }
    Ok(())
}

/// Pauses claims of `agent` (of its dispatches with `key` only, when given): no host claims
/// them until it is resumed; running ones finish. Pausing again replaces the reason.
///
/// # Errors
///
/// [`FlowError::UnknownAgent`], [`FlowError::Invalid`] for a key over
/// [`MAX_CONCURRENCY_KEY`](crate::store::model::MAX_CONCURRENCY_KEY) bytes or a reason that is not printable,
/// [`FlowError::ReasonTooLong`], or the store's error.
pub async fn pause(
    config: &Config,
    store: &Store,
    agent: &str,
    key: Option<&str>,
    reason: &str,
) -> Result<Pause, FlowError> {
    known_agent(config, agent)?;
    check_key(key)?;
    check_reason(reason)?;
    Ok(store.limits.pause(agent, key, reason).await?)
}

/// Lifts the pause of `agent` (of its `key` only, when given); `false` when there was none.
///
/// # Errors
///
/// As [`pause`].
pub async fn resume(
    config: &Config,
    store: &Store,
    agent: &str,
    key: Option<&str>,
) -> Result<bool, FlowError> {
    known_agent(config, agent)?;
    check_key(key)?;
    Ok(store.limits.resume(agent, key).await?)
}

/// One paused concurrency key.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PausedKey {
    /// The key.
    pub key: String,
    /// Why, as the operator said.
    pub reason: String,
    /// When (milliseconds since the Unix epoch).
    pub at: u64,
}

/// One limited scope an agent's claims or requests count toward, and its use now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScopeUse {
    /// The stored scope (`agent:A`, `limit:N`).
    pub name: String,
    /// `claims` (the agent's claims honour it) or `requests` (its outbound requests to
    /// `origins` do).
    pub applies_to: &'static str,
    /// The origins it limits (requests only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub origins: Vec<String>,
    /// At most this many at once.
    pub concurrency: Option<u32>,
    /// At most this rate, as text (`"60/min"`).
    pub rate: Option<String>,
    /// The rate's burst.
    pub burst: Option<u32>,
    /// Holding a slot now.
    pub running: u32,
    /// Tokens in its bucket now (`None` without a rate).
    pub tokens: Option<f64>,
}

/// How an agent's flow control stands.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentFlow {
    /// The agent.
    pub agent: String,
    /// Whether all its claims are paused.
    pub paused: bool,
    /// The whole pause's reason.
    pub pause_reason: Option<String>,
    /// When it was paused (milliseconds since the Unix epoch).
    pub paused_at: Option<u64>,
    /// Its paused concurrency keys.
    pub paused_keys: Vec<PausedKey>,
    /// Its concurrency key source (`meta:<key>`), if set.
    pub concurrency_key: Option<String>,
    /// Per key: at most this many running.
    pub key_concurrency: Option<u32>,
    /// Per key: at most this rate.
    pub key_rate: Option<String>,
    /// Each limit it honours, and its use.
    pub limits: Vec<ScopeUse>,
}

/// How `agent`'s flow control stands, with `pauses` the pauses in force (read once for many
/// agents): its pauses, and each limit of its config with the use the store reads now.
///
/// # Errors
///
/// The store's error.
pub async fn flow(
    config: &Config,
    store: &Store,
    agent: &str,
    pauses: &[Pause],
) -> Result<AgentFlow, StoreError> {
    let whole = pauses.iter().find(|p| p.agent == agent && p.key.is_none());
    let paused_keys = pauses
        .iter()
        .filter(|p| p.agent == agent)
        .filter_map(|p| {
            Some(PausedKey {
                key: p.key.clone()?,
                reason: p.reason.clone(),
                at: p.at,
            })
        })
        .collect();
    let set = limit_set(config, agent);
    let mut limits = Vec::new();
    let scopes = set
        .shared
        .iter()
        .map(|s| (s, "claims", Vec::new()))
        .chain(origin_limits(config, agent).iter().map(|o| {
            (
                &o.scope,
                "requests",
                o.origins.iter().map(ToString::to_string).collect(),
            )
        }))
        .map(|(s, applies_to, origins)| (s.clone(), applies_to, origins))
        .collect::<Vec<_>>();
    for (scope, applies_to, origins) in scopes {
        let usage = store.limits.usage(&scope.name, scope.rate.as_ref()).await?;
        limits.push(ScopeUse {
            name: scope.name,
            applies_to,
            origins,
            concurrency: scope.concurrency,
            rate: scope.rate.map(|r| r.to_string()),
            burst: scope.rate.map(|r| r.burst),
            running: usage.running,
            tokens: usage.tokens,
        });
    }
    let plugin = config.plugins.get(agent);
    Ok(AgentFlow {
        agent: agent.to_owned(),
        paused: whole.is_some(),
        pause_reason: whole.map(|p| p.reason.clone()),
        paused_at: whole.map(|p| p.at),
        paused_keys,
        concurrency_key: plugin
            .and_then(|p| p.concurrency_key.as_ref())
            .map(|crate::config::limits::KeySource::Metadata(k)| format!("meta:{k}")),
        key_concurrency: set.key_concurrency,
        key_rate: set.key_rate.map(|r| r.to_string()),
        limits,
    })
}

/// How many of `agent`'s queued dispatches are parked (a run that met a `park_on` status,
/// waiting for the limit to free up: `last_error` starts with `parked`), reading at most
/// [`MAX_PARKED_SCAN`] queued ones; the second value is `true` when there were more to read.
///
/// # Errors
///
/// The store's error.
pub async fn parked(store: &Store, agent: &str) -> Result<(u64, bool), StoreError> {
    let mut count = 0;
    let mut read = 0;
    let mut after: Option<ListCursor> = None;
    loop {
        let filter = ListFilter {
            agent: Some(agent.to_owned()),
            statuses: vec![Status::Queued],
            limit: 500,
            after: after.clone(),
            ..ListFilter::default()
        };
        let rows = store.mailbox.list_rows(&filter).await?;
        read += rows.len();
        count += rows
            .iter()
            .filter(|d| {
                d.last_error
                    .as_deref()
                    .is_some_and(|e| e.starts_with("parked"))
            })
            .count() as u64;
        let Some(last) = rows.last().filter(|_| rows.len() == 500) else {
            return Ok((count, false));
        };
        if read >= MAX_PARKED_SCAN {
            return Ok((count, true));
        }
        after = Some(ListCursor {
            priority: last.priority,
            created_at: last.created_at,
            id: last.id.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::store::model::MAX_CONCURRENCY_KEY;

    #[test]
    fn reasons_and_keys_are_checked_naming_the_field() {
        assert!(check_reason("").is_ok());
        assert!(check_reason("rate limited by the provider <b>").is_ok());
        let e = check_reason(&"x".repeat(1025)).unwrap_err();
        assert!(matches!(e, FlowError::ReasonTooLong { len: 1025 }), "{e}");
        assert!(e.to_string().starts_with("reason is 1025 bytes"), "{e}");
        let Err(FlowError::Invalid { field, .. }) = check_reason("a\u{1b}[2J") else {
            panic!("an ESC passed");
        };
        assert_eq!(field, "reason");
        let long = "k".repeat(MAX_CONCURRENCY_KEY + 1);
        let Err(FlowError::Invalid { field, message }) = check_key(Some(&long)) else {
            panic!("a long key passed");
        };
        assert_eq!(field, "key");
        assert!(message.starts_with("key is 129 bytes"), "{message}");
    }

    #[test]
    fn an_unknown_agent_is_named_with_the_known_ones() {
        let config = Config::parse(
            "[plugins.echo]\npath = \"echo.wasm\"\n",
            "homing.toml",
            std::path::Path::new("."),
        )
        .unwrap();
        assert!(known_agent(&config, "echo").is_ok());
        let e = known_agent(&config, "nope").unwrap_err().to_string();
        assert_eq!(e, "no agent `nope` (configured: echo)");
    }
}

/// A limit a plugin's outbound requests honour.
#[derive(Debug, Clone, PartialEq)]
pub struct OriginLimit {
    /// The origins it covers.
    pub origins: Vec<OutboundHost>,
    /// Its stored scope (`limit:<name>`).
    pub scope: Scope,
}

/// The limits plugin `name`'s claims honour (empty when it sets none).
pub fn limit_set(config: &Config, name: &str) -> LimitSet {
    let Some(plugin) = config.plugins.get(name) else {
        return LimitSet::default();
    };
    let mut shared = Vec::new();
    if let Some(rate) = with_burst(plugin.rate, plugin.burst) {
        shared.push(Scope {
            name: agent_scope_name(name),
            concurrency: None,
            rate: Some(rate),
        });
    }
    for limit in &plugin.limits {
        if let Some(l) = config.limits.get(limit).filter(|l| l.origins.is_empty()) {
            shared.push(Scope {
                name: named_scope_name(limit),
                concurrency: l.concurrency,
                rate: l.rate(),
            });
        }
    }
    LimitSet {
        shared,
        key_concurrency: plugin.key_concurrency,
        key_rate: with_burst(plugin.key_rate, plugin.key_burst),
        weights: plugin.key_weights.clone(),
    }
}

/// The origin limits plugin `name`'s outbound requests honour.
pub fn origin_limits(config: &Config, name: &str) -> Vec<OriginLimit> {
    let Some(plugin) = config.plugins.get(name) else {
        return Vec::new();
    };
    plugin
        .limits
        .iter()
        .filter_map(|limit| {
            let l = config.limits.get(limit).filter(|l| !l.origins.is_empty())?;
            Some(OriginLimit {
                origins: l.origins.clone(),
                scope: Scope {
                    name: named_scope_name(limit),
                    concurrency: l.concurrency,
                    rate: l.rate(),
                },
            })
        })
        .collect()
}

#[cfg(test)]
mod limit_set_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::collections::BTreeMap;
    use std::path::Path;

    use super::*;
    use crate::config::limits::{KeySource, Rate};

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, "homing.toml", Path::new("/etc/homing")).map_err(|e| e.to_string())
    }

    const PLUGIN: &str =
        "[plugins.a]\npath = \"a.wasm\"\nallowed_outbound_hosts = [\"https://api.openai.com\"]\n";

    #[test]
    fn limits_become_the_plugins_limit_set_and_origin_limits() {
        let text = format!(
            "{PLUGIN}rate = \"60/min\"\nburst = 5\nconcurrency_key = \"meta:customer\"\n\
             key_concurrency = 1\nkey_rate = \"10/s\"\nlimits = [\"gpu\", \"openai\"]\n\
             key_weights = {{ vip = 3 }}\n\
             [limits.gpu]\nconcurrency = 20\n\
             [limits.openai]\norigins = [\"https://api.openai.com\"]\nrate = \"500/min\"\nconcurrency = 8\n"
        );
        let config = parse(&text).unwrap();
        let set = limit_set(&config, "a");
        assert_eq!(set.shared.len(), 2);
        assert_eq!(set.shared[0].name, "agent:a");
        assert_eq!(
            set.shared[0].rate,
            Some(Rate::new(60, 60_000).with_burst(5))
        );
        assert_eq!(set.shared[1].name, "limit:gpu");
        assert_eq!(set.shared[1].concurrency, Some(20));
        assert_eq!(set.key_concurrency, Some(1));
        assert_eq!(set.turn_cost("vip"), 333);
        let origins = origin_limits(&config, "a");
        assert_eq!(origins.len(), 1);
        assert_eq!(origins[0].scope.name, "limit:openai");
        assert_eq!(origins[0].scope.concurrency, Some(8));
        let plugin = &config.plugins["a"];
        let meta = BTreeMap::from([("customer".to_owned(), "c1".to_owned())]);
        assert_eq!(
            plugin.concurrency_key.as_ref().unwrap().key_of(&meta),
            Some("c1".into())
        );
        assert!(limit_set(&parse(PLUGIN).unwrap(), "a").is_empty());
        // The key an enqueue names wins; else the metadata's; a blank value gives none.
        let source = config.key_source("a");
        assert_eq!(
            KeySource::key_for(source, Some("named".into()), &meta),
            Some("named".into())
        );
        assert_eq!(KeySource::key_for(source, None, &meta), Some("c1".into()));
        let blank = BTreeMap::from([("customer".to_owned(), " ".to_owned())]);
        assert_eq!(KeySource::key_for(source, None, &blank), None);
        assert_eq!(KeySource::key_for(None, None, &meta), None);
        assert!(config.key_source("nope").is_none());
    }
}
