//! Flow control in the store (the contract, docs/contract.md, section 13): the limits a claim
//! honours (concurrency slots, token buckets, pauses), decided inside the claim's atomic step so
//! they hold exactly across every host, and the same slots and buckets taken one at a time by
//! the host's outbound HTTP client.
//!
//! This file holds the trait and what a claim asks and finds; the records live in
//! `model::limits`, the rules (a bucket's level, a block of tokens, whether a slot is still
//! held, whether a pause holds a dispatch back) in `rules::limits`, both re-exported here.

use std::fmt;

use async_trait::async_trait;
use serde::Serialize;

use super::StoreResult;
use super::model::Dispatch;

pub use super::model::limits::{
    Bucket, Holder, LimitSet, Pause, Rate, Scope, agent_scope_name, key_scope_name,
    named_scope_name,
};
pub use super::rules::limits::{BLOCK_MS, Block, check_pause, pause_name, paused};

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
