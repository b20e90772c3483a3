//! The records of flow control (the contract, section 13): a scope's token bucket and the
//! holders of its slots as stored, a pause, and the limits a claim honours. What they mean at a
//! time (a bucket's level, whether a slot is still held, whether a pause holds a dispatch back)
//! is the rules' (`rules::limits`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Dispatch;

pub use crate::config::limits::Rate;

/// A token bucket as stored: the tokens it held at `at` (milliseconds). A missing bucket is
/// full.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    /// Tokens held at `at` (fractional: a bucket refills continuously).
    pub tokens: f64,
    /// When `tokens` was computed.
    pub at: u64,
}

/// One holder of a concurrency slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// The dispatch whose claim holds it, or the id of an outbound request.
    pub id: String,
    /// The claim number holding it (a claim slot); 0 for a request slot.
    #[serde(default)]
    pub claims: u32,
    /// A request slot's expiry. A claim slot is held while its claim lives; when the slot is
    /// written ahead of its claim (NATS), this is the lease that claim is given, and the slot
    /// is held until then while the dispatch's record has not reached that claim number.
    #[serde(default)]
    pub until: u64,
    /// A slot block (NATS): this many slots one host holds until `until` for its own claims,
    /// each of which runs with a lease that ends by then. 0 for every other holder.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub slots: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Holder {
    /// The slot of `d`'s claim, written ahead of the claim itself: held while that claim
    /// lives, or, until the lease it is given runs out, while it may still land.
    pub fn ahead_of_claim(d: &Dispatch) -> Holder {
        Holder {
            id: d.id.clone(),
            claims: d.claims,
            until: d.claim.as_ref().map_or(0, |c| c.lease_until),
            slots: 0,
        }
    }

    /// The slot held by `d`'s current claim.
    pub fn of_claim(d: &Dispatch) -> Holder {
        Holder {
            id: d.id.clone(),
            claims: d.claims,
            until: 0,
            slots: 0,
        }
    }

    /// A slot block of `slots` slots held by `id` until `until`.
    pub fn block(id: &str, slots: u32, until: u64) -> Holder {
        Holder {
            id: id.to_owned(),
            claims: 0,
            until,
            slots,
        }
    }

    /// How many slots the holder counts for: a block's size, else one.
    pub fn weight(&self) -> u32 {
        self.slots.max(1)
    }
}

/// The limits one claim honours, each a stored scope with a concurrency cap, a rate or both.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LimitSet {
    /// Scopes every dispatch of the agent counts toward (the plugin's own rate, named limits).
    pub shared: Vec<Scope>,
    /// Per concurrency key: at most this many running with one key.
    pub key_concurrency: Option<u32>,
    /// Per concurrency key: at most this rate of claims with one key.
    pub key_rate: Option<Rate>,
    /// Round-robin weights per key (default 1): a key of weight 3 gets three turns to one.
    pub weights: BTreeMap<String, u32>,
}

impl LimitSet {
    /// Whether there is nothing to check.
    pub fn is_empty(&self) -> bool {
        self.shared.is_empty() && self.key_concurrency.is_none() && self.key_rate.is_none()
    }

    /// Whether claims rotate across concurrency keys (some per-key limit is set).
    pub fn keyed(&self) -> bool {
        self.key_concurrency.is_some() || self.key_rate.is_some()
    }

    /// The scope of `key` of `agent`, when per-key limits are set.
    pub fn key_scope(&self, agent: &str, key: &str) -> Option<Scope> {
        self.keyed().then(|| Scope {
            name: key_scope_name(agent, key),
            concurrency: self.key_concurrency,
            rate: self.key_rate,
        })
    }

    /// How much a claim of `key` advances the key's turn (1000 divided by its weight).
    pub fn turn_cost(&self, key: &str) -> u64 {
        1_000 / u64::from(self.weights.get(key).copied().unwrap_or(1).max(1))
    }
}

/// The stored name of the scope of concurrency key `key` of `agent`.
pub fn key_scope_name(agent: &str, key: &str) -> String {
    format!("key:{agent}:{key}")
}

/// The stored name of agent `agent`'s own rate.
pub fn agent_scope_name(agent: &str) -> String {
    format!("agent:{agent}")
}

/// The stored name of the named limit `name`.
pub fn named_scope_name(name: &str) -> String {
    format!("limit:{name}")
}

/// One limited scope: a stored name with a concurrency cap, a rate or both.
#[derive(Debug, Clone, PartialEq)]
pub struct Scope {
    /// The stored name (`agent:A`, `key:A:K`, `limit:N`).
    pub name: String,
    /// At most this many holders at once.
    pub concurrency: Option<u32>,
    /// At most this rate of takes.
    pub rate: Option<Rate>,
}

/// A pause of an agent, or of one concurrency key of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    /// The agent.
    pub agent: String,
    /// The key, when only one key is paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Why, as the operator said.
    #[serde(default)]
    pub reason: String,
    /// When (milliseconds).
    pub at: u64,
}
