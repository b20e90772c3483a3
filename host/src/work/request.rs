//! A request for a new dispatch, as the API, the CLI and a guest make it, and the one place it
//! becomes a [`NewDispatch`]: the defaults filled in, the attempts decided, and the rules the
//! store applies checked before the store sees it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::limits::KeySource;
use crate::config::{Config, DebouncePayload};
use crate::store::model::{Debounce, Gather};
use crate::store::{DEFAULT_MAX_ATTEMPTS, DEFAULT_PRIORITY, NewDispatch, millis};

/// What a caller asks of a new dispatch. What a field leaves out gets the default: the
/// store's priority, no delay, a UUID v7 id, the attempts of [`Attempts`].
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// The agent (plugin) to route to.
    pub agent: String,
    /// The thread.
    pub thread: String,
    /// Opaque input for the agent.
    pub payload: Vec<u8>,
    /// The dispatch id, when the caller chose it.
    pub id: Option<String>,
    /// 0 most urgent, 255 least.
    pub priority: Option<u8>,
    /// How long before it may be claimed.
    pub delay: Duration,
    /// Metadata, with whatever the host adds for the caller already in it.
    pub metadata: BTreeMap<String, String>,
    /// At most one live dispatch per (thread, key).
    pub dedupe_key: Option<String>,
    /// The failed attempts asked for before it dead-letters.
    pub max_attempts: Option<u32>,
    /// The key its runs are limited by (flow control), when the caller named one.
    pub concurrency_key: Option<String>,
    /// The window it joins or opens, when the caller asked for one (else see
    /// [`configured_debounce`]).
    pub debounce: Option<Debounce>,
}

/// The debounce `[plugins.x.debounce]` gives an enqueue to `agent` that asks for none.
pub fn configured_debounce(config: &Config, agent: &str) -> Option<Debounce> {
    let d = config.plugins.get(agent)?.debounce.as_ref()?;
    Some(Debounce {
        key: d.key.clone(),
        quiet_ms: millis(d.quiet),
        max_wait_ms: millis(d.max_wait),
        payload: match d.payload {
            DebouncePayload::Last => Gather::Last,
            DebouncePayload::First => Gather::First,
            DebouncePayload::Collect => Gather::Collect,
        },
        max_items: d.max_items,
    })
}

/// The attempts a new dispatch gets, from what its [`Request`] asked and its agent's own
/// `max_attempts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempts {
    /// What was asked, else this (the agent's own): a producer or an operator may ask any
    /// number.
    AskedOr(u32),
    /// What was asked held to 1 up to this (the agent's own), else this: a guest's follow-up
    /// work gets no more attempts than its target allows.
    AtMost(u32),
}

impl Attempts {
    /// For a producer or an operator: what was asked, else the `max_attempts` of `agent` in
    /// `config`, else the store's default.
    pub fn configured(config: &Config, agent: &str) -> Attempts {
        Attempts::AskedOr(
            config
                .plugins
                .get(agent)
                .map_or(DEFAULT_MAX_ATTEMPTS, |p| p.max_attempts),
        )
    }

    fn of(self, asked: Option<u32>) -> u32 {
        match self {
            Attempts::AskedOr(own) => asked.unwrap_or(own),
            Attempts::AtMost(own) => asked.unwrap_or(own).clamp(1, own.max(1)),
        }
    }
}

impl Request {
    /// A request for `agent` on `thread`, everything else left to the defaults.
    pub fn new(
        agent: impl Into<String>,
        thread: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Request {
        Request {
            agent: agent.into(),
            thread: thread.into(),
            payload: payload.into(),
            ..Request::default()
        }
    }

    /// The dispatch this request asks for, with `attempts` deciding its `max_attempts` and
    /// `keys` (the target plugin's `concurrency_key`) its concurrency key when the request
    /// names none, checked by the rules enqueue applies (names printable and bounded, metadata
    /// bounded, at least one attempt, a key of at most 128 bytes; docs/contract.md, section 2).
    ///
    /// # Errors
    ///
    /// The store's description of the first rule broken, naming the field as the store names
    /// it (`id`, `agent`, `thread`, `dedupe_key`, `metadata`, `max_attempts`,
    /// `concurrency_key`); each caller words it for its own fields.
    pub fn into_dispatch(
        self,
        attempts: Attempts,
        keys: Option<&KeySource>,
    ) -> Result<NewDispatch, String> {
        let key = KeySource::key_for(keys, self.concurrency_key, &self.metadata);
        let mut new = NewDispatch::new(self.agent, self.thread, self.payload)
            .with_priority(self.priority.unwrap_or(DEFAULT_PRIORITY))
            .with_delay_ms(millis(self.delay))
            .with_max_attempts(attempts.of(self.max_attempts));
        new.id = self.id;
        new.metadata = self.metadata;
        new.dedupe_key = self.dedupe_key;
        new.concurrency_key = key;
        new.debounce = self.debounce;
        new.validate()?;
        Ok(new)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_defaults_fill_what_a_request_leaves_out() {
        let new = Request::new("echo", "t1", b"hi".to_vec())
            .into_dispatch(Attempts::AskedOr(3), None)
            .unwrap();
        assert_eq!(new.priority, DEFAULT_PRIORITY);
        assert_eq!(new.delay_ms, 0);
        assert_eq!(new.max_attempts, 3);
        assert_eq!(new.id, None);
        assert_eq!(new.payload, b"hi");
    }

    #[test]
    fn a_guest_gets_no_more_attempts_than_its_target_allows() {
        assert_eq!(Attempts::AskedOr(3).of(Some(10)), 10);
        assert_eq!(Attempts::AtMost(3).of(Some(10)), 3);
        assert_eq!(Attempts::AtMost(3).of(Some(0)), 1);
        assert_eq!(Attempts::AtMost(3).of(None), 3);
        assert_eq!(Attempts::AtMost(0).of(None), 1);
        // Zero asked of a producer is refused by the rules, not raised.
        let refused = Request {
            max_attempts: Some(0),
            ..Request::new("echo", "t1", Vec::new())
        }
        .into_dispatch(Attempts::AskedOr(3), None);
        assert_eq!(
            refused.err().as_deref(),
            Some("max_attempts must be at least 1")
        );
    }

    #[test]
    fn the_store_rules_are_checked_naming_the_field() {
        let mut request = Request::new("echo", "t\u{1b}1", Vec::new());
        let e = request
            .clone()
            .into_dispatch(Attempts::AskedOr(1), None)
            .unwrap_err();
        assert!(e.starts_with("thread holds the non-printable"), "{e}");
        request.thread = "t1".into();
        request.dedupe_key = Some(String::new());
        let e = request
            .into_dispatch(Attempts::AskedOr(1), None)
            .unwrap_err();
        assert_eq!(e, "dedupe_key is empty");
    }

    #[test]
    fn the_configured_attempts_are_the_agents_own() {
        let config = Config::parse(
            "[plugins.echo]\npath = \"echo.wasm\"\nmax_attempts = 7\n",
            "homing.toml",
            std::path::Path::new("."),
        )
        .unwrap();
        assert_eq!(Attempts::configured(&config, "echo"), Attempts::AskedOr(7));
        assert_eq!(
            Attempts::configured(&config, "other"),
            Attempts::AskedOr(DEFAULT_MAX_ATTEMPTS)
        );
    }
}
