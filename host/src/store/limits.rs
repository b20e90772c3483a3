//! Flow control in the store (the contract, docs/contract.md, section 13): the limits a claim
//! honours (concurrency slots, token buckets, pauses), decided inside the claim's atomic step so
//! they hold exactly across every host, and the same slots and buckets taken one at a time by
//! the host's outbound HTTP client.
//!
//! The rules here are pure functions of stored state and the clock, shared by both backends:
//! a bucket refills continuously and a slot is held by a live claim (or, for a request slot,
//! until its own expiry), so a host that dies while holding one frees it when its lease runs
//! out, without anyone having to release it.

use std::collections::BTreeMap;
use std::fmt;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::StoreResult;
use super::model::Dispatch;

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

impl Bucket {
    /// The tokens held at `now` under `rate`, starting from `stored` (full when `None`).
    pub fn level(stored: Option<Bucket>, rate: &Rate, now: u64) -> f64 {
        let burst = f64::from(rate.burst.max(1));
        match stored {
            None => burst,
            Some(b) => {
                let elapsed = now.saturating_sub(b.at) as f64;
                let tokens = if b.tokens.is_finite() { b.tokens } else { 0.0 };
                (tokens + elapsed / rate.ms_per_token()).clamp(0.0, burst)
            }
        }
    }

    /// Takes one token at `now`: the bucket to store, or the time the next token arrives.
    ///
    /// # Errors
    ///
    /// The time (milliseconds) at which a token will be there.
    pub fn take(stored: Option<Bucket>, rate: &Rate, now: u64) -> Result<Bucket, u64> {
        let level = Bucket::level(stored, rate, now);
        if level >= 1.0 {
            Ok(Bucket {
                tokens: level - 1.0,
                at: now,
            })
        } else {
            let wait = ((1.0 - level) * rate.ms_per_token()).ceil().max(1.0);
            Err(now.saturating_add(wait as u64))
        }
    }
}

/// How long a block of tokens lasts: a host (or an embedded store's writer) takes enough of a
/// scope's tokens for this long at the rate (at least one, at most the burst) for its claims,
/// and the tokens it has not spent by then lapse.
pub const BLOCK_MS: u64 = 100;

/// Tokens taken from a shared bucket for claims and not spent yet.
#[derive(Debug, Clone, Copy, Default)]
pub struct Block {
    /// Tokens left.
    pub left: u32,
    /// When the tokens left lapse.
    pub until: u64,
}

impl Block {
    /// Takes a block of `rate`'s tokens out of the bucket `stored` at `now`: [`BLOCK_MS`]
    /// worth, at least one, at most the burst, fewer when the bucket holds fewer. The bucket
    /// to store and how many were taken, or when the next token arrives.
    ///
    /// # Errors
    ///
    /// The time (milliseconds) at which a token will be there.
    pub fn take(stored: Option<Bucket>, rate: &Rate, now: u64) -> Result<(Bucket, u32), u64> {
        let want = block_size(rate);
        let level = Bucket::level(stored, rate, now);
        let take = if level >= f64::from(want) {
            want
        } else {
            // The level is within 0 and the burst, a u32.
            level.floor() as u32
        };
        if take == 0 {
            return Err(Bucket::take(stored, rate, now)
                .err()
                .unwrap_or(now.saturating_add(1)));
        }
        Ok((
            Bucket {
                tokens: level - f64::from(take),
                at: now,
            },
            take,
        ))
    }

    /// The block after `left` more tokens were taken at `at`: added to what `old` has left
    /// (tokens given back by a claim that did not land stay), lapsing with the older tokens,
    /// so none is spent later than a block after its take.
    pub fn refilled(old: Option<Block>, left: u32, at: u64) -> Block {
        let fresh = Block {
            left,
            until: at.saturating_add(BLOCK_MS),
        };
        match old {
            Some(old) if old.left > 0 && old.until > at => Block {
                left: old.left.saturating_add(fresh.left),
                until: old.until.min(fresh.until),
            },
            _ => fresh,
        }
    }

    /// Whether the bucket `stored` holds at least two blocks of `rate`'s tokens at `now`: a
    /// block taken now is then all but sure to be there when the take lands, whoever else
    /// takes one meanwhile.
    pub fn plenty(stored: Option<Bucket>, rate: &Rate, now: u64) -> bool {
        Bucket::level(stored, rate, now) >= 2.0 * f64::from(block_size(rate))
    }

    /// Spends one token at `now`, if one is left and has not lapsed.
    pub fn spend(&mut self, now: u64) -> bool {
        if self.left > 0 && self.until > now {
            self.left -= 1;
            true
        } else {
            false
        }
    }

    /// Whether a token is left at `now`.
    pub fn has(&self, now: u64) -> bool {
        self.left > 0 && self.until > now
    }
}

/// How many tokens of `rate` a block takes: [`BLOCK_MS`] worth, at least one, at most the
/// burst.
fn block_size(rate: &Rate) -> u32 {
    let worth = (BLOCK_MS as f64 / rate.ms_per_token()).floor();
    let burst = rate.burst.max(1);
    if worth >= f64::from(burst) {
        burst
    } else if worth >= 1.0 {
        worth as u32
    } else {
        1
    }
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

    /// Whether the slot is still held at `now`: a request slot until its expiry; a claim slot
    /// while `current` (the dispatch's record as the store has it) is the same claim, still
    /// claimed and within its lease.
    pub fn live(&self, current: Option<&Dispatch>, now: u64) -> bool {
        match current {
            Some(d) => self.held(
                d.status == super::Status::Claimed,
                d.claims,
                d.claim.as_ref().map(|c| c.lease_until),
                now,
            ),
            None => self.claims == 0 && self.until > now,
        }
    }

    /// [`Holder::live`] from the three fields it reads of the holder's record: whether it is
    /// claimed, its claim number and its lease.
    pub fn held(&self, claimed: bool, claims: u32, lease_until: Option<u64>, now: u64) -> bool {
        if self.claims == 0 {
            return self.until > now;
        }
        // The lease boundary of the rules (`lease_live`): a lease still runs at its last
        // millisecond.
        if claimed && claims == self.claims && lease_until.is_some_and(|l| l >= now) {
            return true;
        }
        // Written ahead of its claim, which has not landed (yet): held for as long as that
        // claim could live. A claim that landed is judged by its record alone.
        claims < self.claims && self.until > now
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

/// What a gated claim asks for.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// The agent whose dispatches are claimed.
    pub agent: &'a str,
    /// `claimed_by` of the claim.
    pub consumer: &'a str,
    /// Lease length.
    pub lease_ms: u64,
    /// Record the start in the same step.
    pub start: bool,
    /// The limits to honour.
    pub limits: &'a LimitSet,
    /// The versions the claimer can run (section 14): the claim records the one it runs and
    /// passes over dispatches pinned elsewhere. `None` records nothing.
    pub offer: Option<&'a super::versions::Offer>,
}

/// What a gated claim found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Gated {
    /// The claimed dispatch.
    pub dispatch: Option<Dispatch>,
    /// When nothing was claimed because of a rate: the time the first limit frees up, so the
    /// claimer sleeps until then instead of polling.
    pub retry_at: Option<u64>,
    /// Dispatches passed over because a limit or a pause held them back.
    pub throttled: Vec<String>,
}

impl Gated {
    /// A claim of `d`.
    pub fn got(d: Dispatch) -> Gated {
        Gated {
            dispatch: Some(d),
            ..Gated::default()
        }
    }
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

/// How much of a scope is in use.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Usage {
    /// The scope's stored name.
    pub scope: String,
    /// Live holders of its slots.
    pub running: u32,
    /// Tokens in its bucket now (`None` without a rate).
    pub tokens: Option<f64>,
}

/// The stored pause of `agent` and `key` (or the agent's whole pause), as a name.
pub fn pause_name(agent: &str, key: Option<&str>) -> String {
    match key {
        Some(key) => format!("{agent}\u{1f}{key}"),
        None => agent.to_owned(),
    }
}

/// Whether `pauses` holds `d` back: its agent is paused, or its key is.
pub fn paused(pauses: &[Pause], agent: &str, key: Option<&str>) -> bool {
    pauses
        .iter()
        .any(|p| p.agent == agent && (p.key.is_none() || p.key.as_deref() == key))
}

/// The checks every backend makes of a pause before storing it.
///
/// # Errors
///
/// `Invalid` naming the agent, the key or the reason.
pub fn check_pause(agent: &str, key: Option<&str>, reason: &str) -> super::StoreResult<()> {
    crate::store::model::check_name("agent", agent).map_err(super::StoreError::Invalid)?;
    if let Some(key) = key {
        crate::store::model::check_concurrency_key(key).map_err(super::StoreError::Invalid)?;
    }
    if reason.len() > 1024 {
        return Err(super::StoreError::Invalid(format!(
            "reason is {} bytes; at most 1024",
            reason.len()
        )));
    }
    if reason.chars().any(char::is_control) {
        return Err(super::StoreError::Invalid(
            "reason holds a control character".into(),
        ));
    }
    Ok(())
}

/// Flow control state outside the claim: pauses, and the slots and buckets the outbound HTTP
/// client takes one request at a time (the contract, section 13). Every method is atomic
/// across every instance of the backend.
#[async_trait]
pub trait Limits: Send + Sync + fmt::Debug + 'static {
    /// Takes one token from `scope`'s bucket: `None` when taken, else the time a token will
    /// be there.
    async fn take_token(&self, scope: &str, rate: &Rate) -> StoreResult<Option<u64>>;

    /// Takes one of `cap` slots of `scope` for `holder` until `until`. `false` when all are
    /// held.
    async fn acquire_slot(
        &self,
        scope: &str,
        cap: u32,
        holder: &str,
        until: u64,
    ) -> StoreResult<bool>;

    /// Gives back `holder`'s slot of `scope` (nothing when it holds none).
    async fn release_slot(&self, scope: &str, holder: &str) -> StoreResult<()>;

    /// Pauses claims of `agent` (of its dispatches with `key` only, when given). Pausing again
    /// replaces the reason.
    async fn pause(&self, agent: &str, key: Option<&str>, reason: &str) -> StoreResult<Pause>;

    /// Lifts a pause; `false` when there was none.
    async fn resume(&self, agent: &str, key: Option<&str>) -> StoreResult<bool>;

    /// Every pause in force.
    async fn pauses(&self) -> StoreResult<Vec<Pause>>;

    /// How much of `scope` is in use now (`rate` reads its bucket's level).
    async fn usage(&self, scope: &str, rate: Option<&Rate>) -> StoreResult<Usage>;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn rates_parse_in_every_unit_and_refuse_the_rest() {
        assert_eq!("60/min".parse::<Rate>().unwrap(), Rate::new(60, 60_000));
        assert_eq!("10/s".parse::<Rate>().unwrap(), Rate::new(10, 1_000));
        assert_eq!("500/minute".parse::<Rate>().unwrap().per_ms, 60_000);
        assert_eq!("1000/h".parse::<Rate>().unwrap().per_ms, 3_600_000);
        assert_eq!("3/250ms".parse::<Rate>().unwrap().per_ms, 250);
        assert_eq!("5/day".parse::<Rate>().unwrap().to_string(), "5/day");
        for bad in ["60/fortnight", "60", "x/min", "0/min", "-1/min", "5/0s", ""] {
            assert!(bad.parse::<Rate>().is_err(), "{bad}");
        }
        assert!(
            "60/fortnight"
                .parse::<Rate>()
                .unwrap_err()
                .contains("60/fortnight")
        );
    }

    #[test]
    fn a_bucket_starts_full_refills_and_says_when_the_next_token_comes() {
        let rate = Rate::new(60, 60_000).with_burst(2);
        let b = Bucket::take(None, &rate, 0).unwrap();
        let b = Bucket::take(Some(b), &rate, 0).unwrap();
        assert_eq!(Bucket::take(Some(b), &rate, 0), Err(1_000));
        assert_eq!(Bucket::take(Some(b), &rate, 500), Err(1_000));
        let b = Bucket::take(Some(b), &rate, 1_000).unwrap();
        assert!(b.tokens.abs() < 1e-9);
        // Never above the burst, whatever the quiet spell.
        assert!((Bucket::level(Some(b), &rate, 10_000_000) - 2.0).abs() < 1e-9);
    }

    #[test]
    fn a_claim_slot_lives_with_its_claim_and_a_request_slot_until_its_expiry() {
        let new = crate::store::NewDispatch::new("a", "t", "");
        let d = crate::store::rules::queued_record("d", &new, 0, 0);
        let crate::store::rules::Take::Claimed(d) =
            crate::store::rules::take(d, 0, "w", 1_000, 10, false)
        else {
            panic!("not claimed");
        };
        let held = Holder::of_claim(&d);
        assert!(held.live(Some(&d), 500));
        assert!(!held.live(Some(&d), 2_000), "lease ran out");
        assert!(!held.live(None, 500), "gone");
        let mut again = d.clone();
        again.claims += 1;
        assert!(!held.live(Some(&again), 500), "a later claim");
        let req = Holder {
            id: "r".into(),
            claims: 0,
            until: 100,
            slots: 0,
        };
        assert!(req.live(None, 99) && !req.live(None, 100));
        // A slot written ahead of its claim: held while the claim may still land, then by the
        // claim itself.
        let queued = crate::store::rules::queued_record("d", &new, 0, 0);
        let ahead = Holder::ahead_of_claim(&d);
        assert_eq!((ahead.claims, ahead.until), (1, 1_010));
        assert!(ahead.live(Some(&queued), 500), "the claim may still land");
        assert!(!ahead.live(Some(&queued), 1_010), "it could no longer live");
        assert!(ahead.live(Some(&d), 500), "landed");
        assert!(!ahead.live(Some(&again), 500), "a later claim");
        assert!(!ahead.live(None, 500), "gone");
    }

    #[test]
    fn a_pause_holds_back_its_agent_or_only_its_key() {
        let p = |key: Option<&str>| Pause {
            agent: "a".into(),
            key: key.map(str::to_owned),
            reason: String::new(),
            at: 0,
        };
        assert!(paused(&[p(None)], "a", Some("k")));
        assert!(paused(&[p(Some("k"))], "a", Some("k")));
        assert!(!paused(&[p(Some("k"))], "a", Some("j")));
        assert!(!paused(&[p(Some("k"))], "a", None));
        assert!(!paused(&[p(None)], "b", None));
    }
}
