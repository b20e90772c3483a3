//! Flow control on the NATS backend (the contract, docs/contract.md, section 13).
//!
//! Each scope is one record outside every thread's tree, `<p>.lim.<scope>`: the holders of its
//! slots and its bucket ([`LimitRec`]). Each pause is one record, `<p>.pz.<agent>` or
//! `<p>.pz.<agent 0x1f key>`, written empty when it is lifted. A host's view holds both (the
//! watcher loads and follows them), so a gated claim reads nothing more than a plain one.
//!
//! A host's claim writes no atomic batch: the server stages each batch in a store of its own,
//! created and deleted per batch, which cost about 2.5 ms a claim. Instead each scope record
//! with a cap gets the claim's slot first, one write expecting its subject's last sequence as
//! the view knows it (a decision taken on a stale record fails at the server and is taken
//! again after a barrier), and the claim is stored after it; the slot is written ahead of its
//! claim ([`Holder::ahead_of_claim`]) and given back when the claim does not land. A rate-only
//! scope's tokens are taken from its bucket in blocks ([`Block`]) and spent on this host's
//! claims, so such a claim writes what a plain claim writes. Caps hold exactly across every
//! host; a bucket never gives more tokens than its burst and refill. A slot is held while its
//! claim lives ([`Holder::live`], read from the dispatch records in the view), so neither a
//! settlement nor a dead host's expired lease writes the scope record: the next write prunes
//! the dead holders. A claim with no limits and no pause of its agent is the plain claim: one
//! message. An instance that does not follow the stream claims in one atomic batch.
//!
//! A concurrency key's scope with a cap of at least [`BLOCK_MIN_CAP`] gives a host its slots in
//! a block ([`SlotBlock`]) while the key is far from its cap: one holder in the record standing
//! for several slots until a time, under which the host's claims of the key write no slot. Each
//! claim under a block runs with a lease that ends before the block does, and a lease is only
//! extended as far as the block holds (the block is held longer first), so when a block lapses
//! every claim it covered has lapsed too. Blocks are taken only while the scope's other
//! holders and the block fit in half its cap; past that, claims take slots of their own.
//!
//! Fairness across concurrency keys keeps a turn per key on this instance (start-time fair
//! queuing): a claim of a key advances its turn by the key's cost, and a key seen for the first
//! time starts at the turn of the last key served, not at zero.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use super::NatsStore;
use super::commit::{CommitError, Expect, Plan, Write, plain};
use super::effects::{Applied, changed};
use super::fetch::Read;
use super::keys::Key;
use super::view::{LimitRec, Record, View};
use crate::store::limits::{
    Block, Bucket, ClaimRequest, Gated, Holder, Limits, Pause, Rate, Scope, Usage, pause_name,
    paused,
};
use crate::store::model::{Dispatch, Status, check_concurrency_key};
use crate::store::rules::{self, Take};
use crate::store::versions::{Choice as VersionChoice, Offer};
use crate::store::{StoreError, StoreResult};

/// How many times an operation on one scope record decides again after a conflict.
const SCOPE_ATTEMPTS: usize = 32;

/// The smallest cap whose key scopes give slots in blocks: below it every claim writes its own
/// slot (a small cap binds often, and a block would keep slots from other hosts).
pub(super) const BLOCK_MIN_CAP: u32 = 16;

/// Past this many scopes with a refill lock, the locks no claimer holds are dropped.
const KEPT_REFILL_LOCKS: usize = 1024;

/// Past this many key scopes with a slot block of this instance, the lapsed ones are dropped.
const KEPT_SLOT_BLOCKS: usize = 1024;

/// A slot block is held for this many leases of the claim that writes it.
const BLOCK_LEASES: u64 = 3;

/// How much earlier than its slot block a lease extended under it ends at the latest (a margin:
/// the bound is an instant, so no later clock reading moves it).
const BLOCK_SLACK_MS: u64 = 100;

/// The slots of the smallest block of a scope with cap `cap`: a sixteenth of it, from 1 to 8.
fn block_slots(cap: u32) -> u32 {
    (cap / BLOCK_MIN_CAP).clamp(1, 8)
}

/// The slot block this instance holds in one key scope's record, and the claims it took under
/// it.
#[derive(Debug, Clone, Default)]
pub(super) struct SlotBlock {
    /// Its slots and when it lapses, as last stored in the scope's record.
    slots: u32,
    until: u64,
    /// The claims taken under it, each as a slot written ahead of its claim: held while the
    /// claim may land or lives.
    claims: Vec<Holder>,
    /// A write of the block is under way: no claim is taken under it until that write lands.
    writing: bool,
}

impl SlotBlock {
    /// How many of its claims hold a slot at `now`, as `view` has their records.
    fn in_use(&self, view: &View, now: u64) -> u32 {
        let live = self.claims.iter().filter(|h| {
            let current = view.dispatch(&h.id).ok().flatten().map(|s| &s.dispatch);
            h.live(current, now)
        });
        u32::try_from(live.count()).unwrap_or(u32::MAX)
    }

    /// Whether a claim with a lease of `lease_ms` from `now` can be taken under it: a slot is
    /// free and the block outlasts that lease by half a lease.
    fn room(&self, view: &View, now: u64, lease_ms: u64) -> bool {
        !self.writing
            && self.until >= now.saturating_add(lease_ms.saturating_add(lease_ms / 2))
            && self.in_use(view, now) < self.slots
    }
}

/// What this instance holds of the scopes a decision reads: tokens of rate blocks
/// (`token(scope)`: whether it holds one) and its slot blocks.
struct Held<'a> {
    token: &'a (dyn Fn(&str) -> bool + Sync),
    slots: Option<&'a HashMap<String, SlotBlock>>,
    lease_ms: u64,
}

impl Held<'_> {
    /// Whether a claim of `scope` can be taken under this instance's slot block.
    fn slot(&self, view: &View, scope: &str, now: u64) -> bool {
        self.slots
            .and_then(|s| s.get(scope))
            .is_some_and(|b| b.room(view, now, self.lease_ms))
    }
}

/// The round-robin turns of one agent's concurrency keys on this instance.
#[derive(Debug, Clone, Default)]
pub(super) struct Turns {
    /// The turn of the key served last: a key without a turn, or behind it, starts here.
    floor: u64,
    /// Each key's next turn.
    of: HashMap<String, u64>,
}

impl Turns {
    /// The turn `key` would be served at now.
    fn turn(&self, key: &str) -> u64 {
        rules::turns::turn(self.of.get(key).copied(), self.floor)
    }
}

/// What a gated claim decided.
enum Claimed {
    /// Claimed: the record, the key served and its turn, and what was passed over.
    Got(Box<Dispatch>, Option<(String, u64)>, Vec<String>),
    /// Nothing claimed.
    Nothing(Box<Gated>),
    /// A stale candidate was superseded; decide again.
    Again,
}

/// Whether a key can be claimed now.
#[derive(Clone, Copy)]
enum KeyState {
    Open,
    /// Paused, or all its slots held.
    Shut,
    /// Its bucket is empty until then.
    Until(u64),
}

/// The liveness of every holder of `rec` as `view` has their claims.
fn live_holders<'a>(view: &View, rec: Option<&'a LimitRec>, now: u64) -> Vec<&'a Holder> {
    rec.map(|r| {
        r.holders
            .iter()
            .filter(|h| {
                let current = view.dispatch(&h.id).ok().flatten().map(|s| &s.dispatch);
                h.live(current, now)
            })
            .collect()
    })
    .unwrap_or_default()
}

/// How many slots `holders` hold (a slot block counts its size).
fn weight<'a>(holders: impl IntoIterator<Item = &'a Holder>) -> u32 {
    holders
        .into_iter()
        .fold(0u32, |n, h| n.saturating_add(h.weight()))
}

/// Whether `scope` admits one more claim now: `Ok(())`, or why not (`None`: all slots held;
/// `Some(t)`: no token until `t`). A claim under this instance's slot block needs no slot of
/// the record; its token, like a rate-only scope's, comes from this instance's block of tokens
/// when it holds one.
fn admits(
    view: &View,
    scope: &Scope,
    now: u64,
    held: &Held<'_>,
) -> StoreResult<Result<(), Option<u64>>> {
    let (rec, _) = view.limit(&scope.name)?;
    let in_block = scope.concurrency.is_some() && held.slot(view, &scope.name, now);
    if let Some(cap) = scope.concurrency
        && !in_block
        && weight(live_holders(view, rec, now)) >= cap
    {
        return Ok(Err(None));
    }
    if let Some(rate) = &scope.rate
        && !((scope.concurrency.is_none() || in_block) && (held.token)(&scope.name))
        && let Err(at) = Bucket::take(rec.and_then(|r| r.bucket), rate, now)
    {
        return Ok(Err(Some(at)));
    }
    Ok(Ok(()))
}

/// Where a keyed claim's slot comes from.
enum Slot {
    /// This instance's slot block: nothing written.
    InBlock,
    /// This instance's slot block, written anew (taken, grown or held longer) with the claim
    /// in it: its slots and when it lapses.
    NewBlock(Write, u32, u64),
    /// A slot of the claim's own in the record.
    Own(Write),
}

/// The slot of claim `d` in key scope `scope` (cap `cap`): under this instance's slot block
/// when it has room; else in a block written anew when the scope's other holders and the
/// block fit in half the cap; else a slot of its own. The claim is counted in `blocks` at once
/// (so this instance's next decision sees it), and taken out again if it does not land
/// ([`NatsStore::block_settled`]).
#[allow(clippy::too_many_arguments)]
fn key_slot(
    view: &View,
    scope: &Scope,
    cap: u32,
    d: &Dispatch,
    now: u64,
    lease_ms: u64,
    blocks: &mut HashMap<String, SlotBlock>,
    block_id: &str,
) -> StoreResult<Slot> {
    if blocks.len() > KEPT_SLOT_BLOCKS {
        // A lapsed block covers no live claim (their leases ended with it).
        blocks.retain(|_, b| b.writing || b.until > now);
    }
    let mine = blocks.get_mut(&scope.name);
    if let Some(b) = mine {
        b.claims.retain(|h| {
            let current = view.dispatch(&h.id).ok().flatten().map(|s| &s.dispatch);
            h.live(current, now)
        });
        if b.room(view, now, lease_ms) {
            b.claims.push(Holder::ahead_of_claim(d));
            return Ok(Slot::InBlock);
        }
    }
    let mine = blocks.get(&scope.name);
    if cap >= BLOCK_MIN_CAP && !mine.is_some_and(|b| b.writing) {
        let (rec, seq) = view.limit(&scope.name)?;
        // Every live holder but this instance's block stays, a slot of the candidate's id
        // included: it may be another host's claim of it that this view has not seen land (a
        // stale own slot of this instance is dead, or counts twice at worst: never too few).
        let others: Vec<Holder> = live_holders(view, rec, now)
            .into_iter()
            .filter(|h| h.id != block_id)
            .cloned()
            .collect();
        let in_use = mine.map_or(0, |b| b.in_use(view, now));
        let slots = block_slots(cap).max(in_use.saturating_add(1));
        if weight(&others).saturating_add(slots) <= cap / 2 {
            let until = now
                .saturating_add(lease_ms.saturating_mul(BLOCK_LEASES))
                .max(mine.map_or(0, |b| b.until));
            let mut holders = others;
            holders.push(Holder::block(block_id, slots, until));
            let stored = rec.and_then(|r| r.bucket);
            let bucket = match &scope.rate {
                Some(rate) => Bucket::take(stored, rate, now).ok().or(stored),
                None => stored,
            };
            let write = scope_write(&scope.name, seq, LimitRec { holders, bucket })?;
            let b = blocks.entry(scope.name.clone()).or_default();
            b.writing = true;
            b.claims.push(Holder::ahead_of_claim(d));
            return Ok(Slot::NewBlock(write, slots, until));
        }
    }
    Ok(Slot::Own(take_scope(
        view,
        scope,
        Holder::ahead_of_claim(d),
        now,
    )?))
}

/// The write of `scope`'s record after a claim: its dead holders pruned, the claim's `holder` added
/// (with a cap), one token taken (with a rate), expecting the record's subject as the view
/// knows it.
fn take_scope(view: &View, scope: &Scope, holder: Holder, now: u64) -> StoreResult<Write> {
    let (rec, seq) = view.limit(&scope.name)?;
    // A live slot of `d`'s id stays: it may be another host's claim of `d`, landed or landing,
    // that this view has not seen yet (this claim then fails, and gives its own slot back).
    let mut holders: Vec<Holder> = live_holders(view, rec, now).into_iter().cloned().collect();
    if scope.concurrency.is_some() {
        holders.push(holder);
    }
    let stored = rec.and_then(|r| r.bucket);
    let bucket = match &scope.rate {
        Some(rate) => Bucket::take(stored, rate, now).ok().or(stored),
        None => stored,
    };
    scope_write(&scope.name, seq, LimitRec { holders, bucket })
}

/// The write of a scope record expecting its subject's last sequence `seq`.
fn scope_write(scope: &str, seq: u64, rec: LimitRec) -> StoreResult<Write> {
    let payload = serde_json::to_vec(&rec)
        .map_err(|e| StoreError::Invalid(format!("limits/{scope}: cannot encode: {e}")))?;
    Ok(Write {
        key: Key::Limit(scope.to_owned()),
        expect: Expect::Subject(seq),
        payload: Bytes::from(payload),
        record: Record::Limit(scope.to_owned(), rec),
    })
}

/// The shared scopes of a claim, each name once.
fn distinct(scopes: &[Scope]) -> Vec<&Scope> {
    let mut seen = HashSet::new();
    scopes
        .iter()
        .filter(|s| seen.insert(s.name.as_str()))
        .collect()
}

impl NatsStore {
    /// `claim_gated` on an instance that does not follow the stream (it reads the records of
    /// each attempt from the server): the claim and every scope record it changes in one
    /// atomic batch, each token taken as the claim is made.
    async fn claim_gated_batched(&self, req: &ClaimRequest<'_>) -> StoreResult<Gated> {
        let limits = req.limits;
        let agent = req.agent;
        let none = |_: &str| false;
        let ours = Held {
            token: &none,
            slots: None,
            lease_ms: req.lease_ms,
        };
        let shared = distinct(&limits.shared);
        for _ in 0..64 {
            let turns = if limits.keyed() {
                self.inner
                    .turns
                    .lock()
                    .map(|t| t.get(agent).cloned().unwrap_or_default())
                    .unwrap_or_default()
            } else {
                Turns::default()
            };
            let mut held: Option<String> = None;
            let out = self
                .run(&[Read::All], |view, now, _| {
                    if let Some(thread) = held.take() {
                        view.release(&thread);
                    }
                    view.promote(agent, now);
                    let pauses = view.pauses_of(agent);
                    if paused(&pauses, agent, None) {
                        return Ok(Plan::Done(Ok(Claimed::Nothing(Box::default()))));
                    }
                    for scope in &shared {
                        if let Err(retry_at) = admits(view, scope, now, &ours)? {
                            return Ok(Plan::Done(Ok(Claimed::Nothing(Box::new(Gated {
                                retry_at,
                                ..Gated::default()
                            })))));
                        }
                    }
                    let (d, served, throttled) = match choose(
                        view, agent, limits, req.offer, &pauses, &turns, now, &ours,
                    )? {
                        Ok(choice) => choice,
                        Err((throttled, retry_at)) => {
                            return Ok(Plan::Done(Ok(Claimed::Nothing(Box::new(Gated {
                                dispatch: None,
                                retry_at,
                                throttled,
                            })))));
                        }
                    };
                    let thread_epoch = view.thread(&d.thread)?.epoch;
                    let version = req.offer.map(|o| (o, o.choose(&d, now)));
                    let log = view.latest(&d.thread);
                    match rules::take(
                        d,
                        (thread_epoch, log),
                        req.consumer,
                        req.lease_ms,
                        now,
                        req.start,
                    ) {
                        Take::Stale(d) => {
                            let Applied { writes, wake } = changed(view, Status::Queued, plain(d))?;
                            Ok(Plan::Write {
                                writes,
                                answer: Ok(Claimed::Again),
                                wake,
                            })
                        }
                        Take::Claimed(mut d) => {
                            if let Some((o, VersionChoice::Run(index))) = version {
                                o.record(&mut d, index);
                            }
                            let mut writes =
                                changed(view, Status::Queued, plain(d.clone()))?.writes;
                            for scope in &shared {
                                writes.push(take_scope(view, scope, Holder::of_claim(&d), now)?);
                            }
                            if let Some(key) = &d.concurrency_key
                                && let Some(scope) = limits.key_scope(agent, key)
                            {
                                writes.push(take_scope(view, &scope, Holder::of_claim(&d), now)?);
                            }
                            view.reserve(&d.thread);
                            held = Some(d.thread.clone());
                            Ok(Plan::Write {
                                writes,
                                answer: Ok(Claimed::Got(Box::new(d), served, throttled)),
                                wake: false,
                            })
                        }
                    }
                })
                .await;
            if let Some(thread) = held {
                self.view()?.release(&thread);
            }
            match out? {
                Claimed::Got(d, served, throttled) => {
                    self.served(agent, limits, served);
                    return Ok(Gated {
                        dispatch: Some(*d),
                        retry_at: None,
                        throttled,
                    });
                }
                Claimed::Nothing(gated) => return Ok(*gated),
                Claimed::Again => continue,
            }
        }
        Err(StoreError::Contention(format!(
            "claim for agent `{agent}` kept finding stale dispatches"
        )))
    }
}

/// What a gated claim decided on the view.
enum Decided {
    /// Nothing to claim.
    Nothing(Box<Gated>),
    /// A stale candidate to supersede (then decide again).
    Stale(Vec<Write>),
    /// A claim, reserved in the view until its writes are done.
    Claim(Box<Pending>),
}

/// A claim decided on the view and not yet stored.
struct Pending {
    /// The claimed record.
    dispatch: Dispatch,
    /// The key served and its turn, and what was passed over.
    served: Option<(String, u64)>,
    throttled: Vec<String>,
    /// The scopes it takes a token of from this instance's blocks, each with whether a new
    /// block, when one is needed, is taken together with the claim (the bucket holds
    /// plenty) rather than before it.
    rated: Vec<(String, Rate, bool)>,
    /// The writes of the scopes with a cap, each adding the claim's slot (and taking a token,
    /// with a rate), stored one at a time before the claim.
    slots: Vec<Write>,
    /// The key scope whose slot block the claim is under, and the block's slots and lapse
    /// when one of `slots` writes it anew.
    block: Option<(String, Option<(u32, u64)>)>,
    /// The claim's own writes.
    claim: Vec<Write>,
}

/// Why a gated claim's writes did not all go.
enum Missed {
    /// A record moved under the decision: decide again after a barrier.
    Conflict,
    /// A rate-only scope's bucket is empty until then (decide again: the view now knows).
    NoToken,
    /// The store failed.
    Failed(StoreError),
}

impl NatsStore {
    /// `claim_gated`: the claim with its limits and pauses decided on the view.
    ///
    /// A host takes a rate-only scope's tokens from its shared bucket in blocks ([`Block`])
    /// and spends them on its claims, so such a claim writes what a plain claim writes. A
    /// scope with a cap gets the claim's slot in its record, each with its own
    /// compare-and-set, before the claim is stored ([`Holder::ahead_of_claim`]): a slot is
    /// never missing from the record while its claim lives. A claim that does not land gives
    /// its slots back (or they lapse with the lease it would have had) and its tokens back to
    /// the block. Claims of different scopes go concurrently; those of one scope race on its
    /// record, and the compare-and-set keeps them exact.
    pub(super) async fn claim_gated_inner(&self, req: &ClaimRequest<'_>) -> StoreResult<Gated> {
        if !self.follows() {
            return self.claim_gated_batched(req).await;
        }
        // The best dispatch may have been enqueued on another host a moment ago.
        self.barrier().await?;
        self.claim_gated_caught_up(req).await
    }

    /// [`claim_gated_inner`](Self::claim_gated_inner) for an instance that follows the stream,
    /// once a barrier that began after the caller asked for the claim has passed.
    pub(super) async fn claim_gated_caught_up(&self, req: &ClaimRequest<'_>) -> StoreResult<Gated> {
        let limits = req.limits;
        let agent = req.agent;
        let shared = distinct(&limits.shared);
        let unkeyed = Turns::default();
        for attempt in 0..64 {
            let now = self.now();
            // The turns and the blocks are read in place, under their locks, while the view's
            // lock is held (always taken in this order: view, turns, blocks), not copied for
            // each claim: with 50 keys the copies were about 1.5% of a host's samples.
            let decided = {
                let mut view = self.view()?;
                let all_turns = self.inner.turns.lock().map_err(|_| {
                    StoreError::Unavailable("nats: the key turns' lock is poisoned".into())
                })?;
                let turns = if limits.keyed() {
                    all_turns.get(agent).unwrap_or(&unkeyed)
                } else {
                    &unkeyed
                };
                let blocks = self.inner.blocks.lock().map_err(|_| {
                    StoreError::Unavailable("nats: the rate blocks' lock is poisoned".into())
                })?;
                let mut slot_blocks = self.inner.slot_blocks.lock().map_err(|_| {
                    StoreError::Unavailable("nats: the slot blocks' lock is poisoned".into())
                })?;
                let local = |scope: &str| blocks.get(scope).is_some_and(|b| b.has(now));
                let mine = Mine {
                    token: &local,
                    slots: &mut slot_blocks,
                    block_id: &self.inner.block_id,
                };
                decide(&mut view, req, &shared, turns, now, mine)?
            };
            let missed = match decided {
                Decided::Nothing(gated) => return Ok(*gated),
                Decided::Stale(writes) => match self.commit(writes, true).await {
                    Ok(()) => continue,
                    Err(CommitError::Store(e)) => return Err(e),
                    Err(CommitError::Conflict) => Missed::Conflict,
                },
                Decided::Claim(pending) => {
                    let Pending {
                        dispatch,
                        served,
                        throttled,
                        rated,
                        slots,
                        block,
                        claim,
                    } = *pending;
                    let out = self.store_claim(&dispatch, &rated, slots, claim).await;
                    if let Some((scope, written)) = block {
                        self.block_settled(&scope, &dispatch, written, out.is_ok());
                    }
                    self.view()?.release(&dispatch.thread);
                    match out {
                        Ok(()) => {
                            self.served(agent, limits, served);
                            return Ok(Gated {
                                dispatch: Some(dispatch),
                                retry_at: None,
                                throttled,
                            });
                        }
                        Err(missed) => missed,
                    }
                }
            };
            match missed {
                Missed::Failed(e) => return Err(e),
                Missed::NoToken => {}
                Missed::Conflict => {
                    if let Some(pause) = backoff(attempt.min(8)) {
                        tokio::time::sleep(pause).await;
                    }
                    self.barrier().await?;
                }
            }
        }
        Err(StoreError::Contention(format!(
            "claim for agent `{agent}` kept meeting concurrent writers"
        )))
    }

    /// Advances the turn of the key a claim served.
    fn served(
        &self,
        agent: &str,
        limits: &crate::store::limits::LimitSet,
        served: Option<(String, u64)>,
    ) {
        if let Some((key, turn)) = served
            && let Ok(mut all) = self.inner.turns.lock()
        {
            let turns = all.entry(agent.to_owned()).or_default();
            let s = rules::turns::served(turn, limits.turn_cost(&key), turns.floor);
            turns.floor = s.floor;
            // Another claim of the key may have moved it on since this one read its turn.
            let slot = turns.of.entry(key).or_default();
            *slot = (*slot).max(s.next);
        }
    }

    /// Stores a decided claim: its tokens from this instance's blocks (a block of a bucket
    /// low on tokens taken first), then at once the blocks of buckets with plenty (one scope
    /// at a time), its slots (one scope at a time) and the claim, so a claim waits for one
    /// round trip, not two or three. When the claim lands but a slot or token does not
    /// (another claim took the scope's record first, or its bucket ran dry after all), the
    /// claim is given back unrun ([`Mailbox::release`], no attempt counted), so no claim runs
    /// without its slots and tokens. What was taken is given back when a step fails.
    async fn store_claim(
        &self,
        d: &Dispatch,
        rated: &[(String, Rate, bool)],
        slots: Vec<Write>,
        claim: Vec<Write>,
    ) -> Result<(), Missed> {
        let mut spent: Vec<&str> = Vec::new();
        let mut to_take: Vec<(&str, &Rate)> = Vec::new();
        for (scope, rate, plenty) in rated {
            if self.spend(scope, self.now()) {
                spent.push(scope);
            } else if *plenty {
                to_take.push((scope, rate));
            } else {
                match self.token(scope, rate).await {
                    Ok(Ok(())) => spent.push(scope),
                    Ok(Err(_)) | Err(_) => {
                        self.unspend(&spent);
                        return Err(Missed::NoToken);
                    }
                }
            }
        }
        let take_tokens = async {
            let mut taken: Vec<&str> = Vec::new();
            for (scope, rate) in to_take {
                match self.token(scope, rate).await {
                    Ok(Ok(())) => taken.push(scope),
                    Ok(Err(_)) | Err(_) => return (taken, false),
                }
            }
            (taken, true)
        };
        let take_slots = async {
            let mut slotted: Vec<String> = Vec::new();
            for w in slots {
                let Key::Limit(scope) = w.key.clone() else {
                    continue;
                };
                match self.commit(vec![w], true).await {
                    Ok(()) => slotted.push(scope),
                    Err(CommitError::Conflict) => return (slotted, Some(Missed::Conflict)),
                    Err(CommitError::Store(e)) => return (slotted, Some(Missed::Failed(e))),
                }
            }
            (slotted, None)
        };
        let ((taken, tokens), (slotted, slot_missed), claimed) =
            tokio::join!(take_tokens, take_slots, self.commit(claim, true));
        spent.extend(taken);
        let slot_missed = match slot_missed {
            None if !tokens => Some(Missed::NoToken),
            missed => missed,
        };
        let missed = match (slot_missed, claimed) {
            (None, Ok(())) => return Ok(()),
            (Some(missed), Ok(())) => {
                if let Some(token) = d.token() {
                    // Best effort: a claim not given back lapses with its lease and is
                    // reclaimed, never run by this host.
                    let _ = crate::store::Mailbox::release(
                        self,
                        &d.id,
                        token,
                        self.now(),
                        "claimed without its concurrency slot or rate token: given back unrun",
                    )
                    .await;
                }
                missed
            }
            (Some(missed), Err(_)) => missed,
            (None, Err(CommitError::Conflict)) => Missed::Conflict,
            (None, Err(CommitError::Store(e))) => Missed::Failed(e),
        };
        // The claim did not land (or was given back): its slots go back (else they lapse with
        // the lease it would have had), and its tokens to this instance's blocks.
        for scope in slotted {
            // Best effort: a slot not given back lapses with the lease it was written for.
            let _ = self.give_back_slot(&scope, &d.id, d.claims).await;
        }
        self.unspend(&spent);
        Err(missed)
    }

    /// The lock this instance takes a block of `scope`'s tokens under. Locks no claimer holds
    /// are dropped once there are more than [`KEPT_REFILL_LOCKS`].
    fn refill_lock(&self, scope: &str) -> StoreResult<std::sync::Arc<tokio::sync::Mutex<()>>> {
        let mut locks = self.inner.refills.lock().map_err(|_| {
            StoreError::Unavailable("nats: the refill locks' lock is poisoned".into())
        })?;
        if locks.len() > KEPT_REFILL_LOCKS && !locks.contains_key(scope) {
            locks.retain(|_, lock| std::sync::Arc::strong_count(lock) > 1);
        }
        Ok(locks.entry(scope.to_owned()).or_default().clone())
    }

    /// Takes one of this instance's tokens of `scope`, if it holds one that has not lapsed.
    fn spend(&self, scope: &str, now: u64) -> bool {
        let Ok(mut blocks) = self.inner.blocks.lock() else {
            return false;
        };
        blocks.get_mut(scope).is_some_and(|b| b.spend(now))
    }

    /// Gives tokens spent on a claim that did not land back to this instance's blocks.
    fn unspend(&self, scopes: &[&str]) {
        if let Ok(mut blocks) = self.inner.blocks.lock() {
            for scope in scopes {
                if let Some(b) = blocks.get_mut(*scope) {
                    b.left = b.left.saturating_add(1);
                }
            }
        }
    }

    /// One token of rate-only `scope` for a claim: from this instance's block, or a new block
    /// taken from the shared bucket (one compare-and-set on the scope record), of which the
    /// claim spends one. `Err(t)`: the bucket has no token until `t`.
    async fn token(&self, scope: &str, rate: &Rate) -> StoreResult<Result<(), u64>> {
        if self.spend(scope, self.now()) {
            return Ok(Ok(()));
        }
        let refill = self.refill_lock(scope)?;
        let _one_block_at_a_time = refill.lock().await;
        if self.spend(scope, self.now()) {
            return Ok(Ok(()));
        }
        let taken = self
            .on_scope(scope, |rec, live, now| {
                match Block::take(rec.bucket, rate, now) {
                    Err(at) => (None, Err(at)),
                    Ok((bucket, take)) => (
                        Some(LimitRec {
                            holders: pruned(rec, live),
                            bucket: Some(bucket),
                        }),
                        Ok((take, now)),
                    ),
                }
            })
            .await?;
        let (take, at) = match taken {
            Ok(taken) => taken,
            Err(at) => return Ok(Err(at)),
        };
        if let Ok(mut blocks) = self.inner.blocks.lock() {
            let block = Block::refilled(blocks.get(scope).copied(), take - 1, at);
            blocks.insert(scope.to_owned(), block);
        }
        Ok(Ok(()))
    }

    /// After a claim under this instance's slot block of `scope` was stored (`landed`) or not:
    /// the block written anew (`written`: its slots and lapse) now stands, or the claim leaves
    /// the block's count.
    fn block_settled(&self, scope: &str, d: &Dispatch, written: Option<(u32, u64)>, landed: bool) {
        let Ok(mut blocks) = self.inner.slot_blocks.lock() else {
            return;
        };
        let Some(b) = blocks.get_mut(scope) else {
            return;
        };
        if let Some((slots, until)) = written {
            b.writing = false;
            if landed {
                b.slots = slots;
                b.until = b.until.max(until);
            }
        }
        if !landed {
            b.claims.retain(|h| !(h.id == d.id && h.claims == d.claims));
        }
    }

    /// The latest instant the lease of claim `id` may reach when extended by `extension_ms`: for
    /// a claim under this instance's slot block, just before the block lapses (the block is
    /// held longer first when it would not outlast the extension by half of it); `Some(None)`
    /// for a claim under no block; `None` when the block has lapsed (its slots may be another's
    /// now: the claim is lost). The bound is an instant, not a length: the write that extends
    /// the lease reads the clock later than this does (after a round trip, a retry, a
    /// descheduled task), and a length from that later reading could outrun the block.
    pub(super) async fn lease_in_block(&self, id: &str, extension_ms: u64) -> Option<Option<u64>> {
        let now = self.now();
        let found = {
            let (Ok(view), Ok(blocks)) = (self.view(), self.inner.slot_blocks.lock()) else {
                return Some(None);
            };
            // The claim the record holds now. One whose lease ran out is not extended at all
            // (the rules refuse it), so its block is not held longer for it.
            let current = view
                .dispatch(id)
                .ok()
                .flatten()
                .map(|s| &s.dispatch)
                .filter(|d| d.status == Status::Claimed);
            if current.is_some_and(|d| !crate::store::rules::lease_live(d, now)) {
                return None;
            }
            let Some(d) = current else {
                return Some(None);
            };
            let mine = blocks.iter().find_map(|(scope, b)| {
                b.claims
                    .iter()
                    .any(|h| h.id == id && h.claims == d.claims)
                    .then(|| (scope.clone(), b.until))
            });
            match mine {
                Some(found) => found,
                None => return foreign_bound(&view, d, now),
            }
        };
        let (scope, mut until) = found;
        if until < now.saturating_add(extension_ms.saturating_add(extension_ms / 2)) {
            let longer = now.saturating_add(extension_ms.saturating_mul(BLOCK_LEASES));
            match self.hold_block(&scope, longer).await {
                Ok(Some(held)) => until = held,
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(scope = %scope, "nats: cannot hold a slot block longer ({e}); its claims' leases end with it");
                }
            }
        }
        let until_max = until.saturating_sub(BLOCK_SLACK_MS);
        (until_max > now).then_some(Some(until_max))
    }

    /// Holds this instance's slot block of `scope` until `until` (never shorter than it is):
    /// the lapse it has now, or `None` when the record no longer holds it.
    async fn hold_block(&self, scope: &str, until: u64) -> StoreResult<Option<u64>> {
        let id = self.inner.block_id.clone();
        let held = self
            .on_scope(scope, |rec, live, _| {
                let ours = rec
                    .holders
                    .iter()
                    .zip(live)
                    .find(|(h, live)| **live && h.id == id && h.slots > 0);
                let Some((block, _)) = ours else {
                    return (None, None);
                };
                let until = block.until.max(until);
                let mut holders: Vec<Holder> = pruned(rec, live)
                    .into_iter()
                    .filter(|h| h.id != id)
                    .collect();
                holders.push(Holder::block(&id, block.slots, until));
                (
                    Some(LimitRec {
                        holders,
                        bucket: rec.bucket,
                    }),
                    Some(until),
                )
            })
            .await?;
        if let Some(until) = held
            && let Ok(mut blocks) = self.inner.slot_blocks.lock()
            && let Some(b) = blocks.get_mut(scope)
        {
            b.until = b.until.max(until);
        }
        Ok(held)
    }

    /// Takes the slot written ahead of claim number `claims` of dispatch `id` out of `scope`'s
    /// record (nothing when it is not there).
    async fn give_back_slot(&self, scope: &str, id: &str, claims: u32) -> StoreResult<()> {
        self.on_scope(scope, |rec, live, _| {
            match given_back(rec, live, id, claims) {
                Some(holders) => (
                    Some(LimitRec {
                        holders,
                        bucket: rec.bucket,
                    }),
                    (),
                ),
                None => (None, ()),
            }
        })
        .await
    }
}

/// The bound of an extension of claim `d` that this instance did not take under a slot block
/// of its own (another instance took it: a host's earlier instance, a second one in the
/// process): when its key's scope holds no slot of the claim's own, the claim may be under any
/// live block of the scope, so the extension ends before the first of them lapses. A claim
/// whose block is gone from the record has lapsed with it, and the rules refuse its extension.
/// `Some(None)`: no bound; `None`: the bound has passed.
fn foreign_bound(view: &View, d: &Dispatch, now: u64) -> Option<Option<u64>> {
    let Some(key) = d.concurrency_key.as_deref() else {
        return Some(None);
    };
    let Ok((Some(rec), _)) = view.limit(&crate::store::limits::key_scope_name(&d.agent, key))
    else {
        return Some(None);
    };
    if rec
        .holders
        .iter()
        .any(|h| h.id == d.id && h.claims == d.claims)
    {
        return Some(None);
    }
    let first = rec
        .holders
        .iter()
        .filter(|h| h.claims == 0 && h.slots > 0 && h.until > now)
        .map(|h| h.until)
        .min();
    match first {
        None => Some(None),
        Some(until) => {
            let bound = until.saturating_sub(BLOCK_SLACK_MS);
            (bound > now).then_some(Some(bound))
        }
    }
}

/// What this instance holds, for [`decide`]: whether it holds a token of a scope's rate block,
/// its slot blocks (a claim under one is counted there at once), and their holder name.
struct Mine<'a> {
    token: &'a (dyn Fn(&str) -> bool + Sync),
    slots: &'a mut HashMap<String, SlotBlock>,
    block_id: &'a str,
}

/// Decides a gated claim on the view: nothing (and why), a stale candidate to supersede, or
/// the claim with the scopes it takes.
fn decide(
    view: &mut View,
    req: &ClaimRequest<'_>,
    shared: &[&Scope],
    turns: &Turns,
    now: u64,
    mine: Mine<'_>,
) -> StoreResult<Decided> {
    let (agent, limits) = (req.agent, req.limits);
    view.promote(agent, now);
    let pauses = view.pauses_of(agent);
    if paused(&pauses, agent, None) {
        return Ok(Decided::Nothing(Box::default()));
    }
    let held = Held {
        token: mine.token,
        slots: Some(&*mine.slots),
        lease_ms: req.lease_ms,
    };
    for scope in shared {
        if let Err(retry_at) = admits(view, scope, now, &held)? {
            return Ok(Decided::Nothing(Box::new(Gated {
                retry_at,
                ..Gated::default()
            })));
        }
    }
    let (d, served, throttled) =
        match choose(view, agent, limits, req.offer, &pauses, turns, now, &held)? {
            Ok(choice) => choice,
            Err((throttled, retry_at)) => {
                return Ok(Decided::Nothing(Box::new(Gated {
                    dispatch: None,
                    retry_at,
                    throttled,
                })));
            }
        };
    let thread_epoch = view.thread(&d.thread)?.epoch;
    let version = req.offer.map(|o| (o, o.choose(&d, now)));
    let log = view.latest(&d.thread);
    let d = match rules::take(
        d,
        (thread_epoch, log),
        req.consumer,
        req.lease_ms,
        now,
        req.start,
    ) {
        Take::Stale(d) => {
            return Ok(Decided::Stale(
                changed(view, Status::Queued, plain(d))?.writes,
            ));
        }
        Take::Claimed(mut d) => {
            if let Some((o, VersionChoice::Run(index))) = version {
                o.record(&mut d, index);
            }
            d
        }
    };
    let key_scope = d
        .concurrency_key
        .as_deref()
        .and_then(|key| limits.key_scope(agent, key));
    let mut rated = Vec::new();
    let mut slots = Vec::new();
    for scope in shared.iter().copied() {
        if scope.concurrency.is_some() {
            slots.push(take_scope(view, scope, Holder::ahead_of_claim(&d), now)?);
        } else if let Some(rate) = &scope.rate {
            rated.push(rated_entry(view, scope, *rate, now)?);
        }
    }
    let mut block = None;
    if let Some(scope) = &key_scope {
        match scope.concurrency {
            Some(cap) => {
                let slot = key_slot(
                    view,
                    scope,
                    cap,
                    &d,
                    now,
                    req.lease_ms,
                    mine.slots,
                    mine.block_id,
                )?;
                match slot {
                    Slot::InBlock => {
                        if let Some(rate) = &scope.rate {
                            rated.push(rated_entry(view, scope, *rate, now)?);
                        }
                        block = Some((scope.name.clone(), None));
                    }
                    Slot::NewBlock(write, n, until) => {
                        slots.push(write);
                        block = Some((scope.name.clone(), Some((n, until))));
                    }
                    Slot::Own(write) => slots.push(write),
                }
            }
            None => {
                if let Some(rate) = &scope.rate {
                    rated.push(rated_entry(view, scope, *rate, now)?);
                }
            }
        }
    }
    let claim = changed(view, Status::Queued, plain(d.clone()))?.writes;
    view.reserve(&d.thread);
    Ok(Decided::Claim(Box::new(Pending {
        dispatch: d,
        served,
        throttled,
        rated,
        slots,
        block,
        claim,
    })))
}

/// A token of `scope` at `rate` for a claim decided at `now`, from this instance's blocks; a
/// new block, when one is needed, is taken together with the claim when the bucket holds
/// plenty (a binding rate's block is taken first, so a claim never lands to be given back for
/// want of a token).
fn rated_entry(
    view: &View,
    scope: &Scope,
    rate: Rate,
    now: u64,
) -> StoreResult<(String, Rate, bool)> {
    let (rec, _) = view.limit(&scope.name)?;
    let plenty = Block::plenty(rec.and_then(|r| r.bucket), &rate, now);
    Ok((scope.name.clone(), rate, plenty))
}

/// What [`choose`] found: the dispatch to claim, the key served and its turn (when claims
/// rotate across keys), the dispatches passed over, and when a key's bucket refills.
type Choice = (Dispatch, Option<(String, u64)>, Vec<String>);

/// What [`choose`] reports when nothing is eligible: the dispatches passed over, and when the
/// first key's bucket refills.
type Passed = (Vec<String>, Option<u64>);

/// Picks the dispatch a gated claim takes: the heads of `agent`'s open lanes in claim order,
/// skipping those whose key is paused, full or out of tokens; with per-key limits, among the
/// eligible heads of the best priority, the key with the lowest turn. When none is eligible:
/// the dispatches passed over, and when the first key's bucket refills.
#[allow(clippy::too_many_arguments)]
fn choose(
    view: &mut View,
    agent: &str,
    limits: &crate::store::limits::LimitSet,
    offer: Option<&Offer>,
    pauses: &[Pause],
    turns: &Turns,
    now: u64,
    held: &Held<'_>,
) -> StoreResult<Result<Choice, Passed>> {
    loop {
        let mut late: Vec<Dispatch> = Vec::new();
        let mut throttled: Vec<String> = Vec::new();
        let mut retry_at: Option<u64> = None;
        let mut states: HashMap<String, KeyState> = HashMap::new();
        // (priority, turn, the record)
        let mut best: Option<(u8, u64, &Dispatch)> = None;
        for s in view.heads(agent) {
            let d = &s.dispatch;
            if let Some((priority, _, _)) = best
                && d.priority > priority
            {
                break;
            }
            if !rules::due(d, now) {
                late.push(d.clone());
                continue;
            }
            // Pinned to a version this claimer does not run, and still left to those that do
            // (section 14): passed over like a held key, without holding anything.
            if offer.is_some_and(|o| o.choose(d, now) == VersionChoice::Elsewhere) {
                continue;
            }
            let key = d.concurrency_key.as_deref();
            let state = match key {
                Some(k) => match states.get(k) {
                    Some(state) => *state,
                    None => {
                        let state = key_state(view, agent, k, limits, pauses, now, held)?;
                        states.insert(k.to_owned(), state);
                        state
                    }
                },
                None => KeyState::Open,
            };
            match state {
                KeyState::Open => {}
                KeyState::Shut => {
                    throttled.push(d.id.clone());
                    continue;
                }
                KeyState::Until(at) => {
                    retry_at = Some(retry_at.map_or(at, |r| r.min(at)));
                    throttled.push(d.id.clone());
                    continue;
                }
            }
            if !limits.keyed() {
                best = Some((d.priority, 0, d));
                break;
            }
            let turn = turns.turn(key.unwrap_or(""));
            if best.is_none_or(|(_, t, _)| turn < t) {
                best = Some((d.priority, turn, d));
            }
            // No key can be served before the floor.
            if turn <= turns.floor {
                break;
            }
        }
        let chosen = best.map(|(_, turn, d)| {
            let served = limits
                .keyed()
                .then(|| (d.concurrency_key.clone().unwrap_or_default(), turn));
            (d.clone(), served)
        });
        // A head not yet due (the clock stepped back since it was promoted) goes back to
        // waiting; when nothing else was found, the lanes are looked at again.
        let again = chosen.is_none() && !late.is_empty();
        for d in &late {
            view.demote(d);
        }
        if !again {
            return Ok(match chosen {
                Some((d, served)) => Ok((d, served, throttled)),
                None => Err((throttled, retry_at)),
            });
        }
    }
}

/// Whether key `key` of `agent` admits a claim now.
fn key_state(
    view: &View,
    agent: &str,
    key: &str,
    limits: &crate::store::limits::LimitSet,
    pauses: &[Pause],
    now: u64,
    held: &Held<'_>,
) -> StoreResult<KeyState> {
    if paused(pauses, agent, Some(key)) {
        return Ok(KeyState::Shut);
    }
    let Some(scope) = limits.key_scope(agent, key) else {
        return Ok(KeyState::Open);
    };
    Ok(match admits(view, &scope, now, held)? {
        Ok(()) => KeyState::Open,
        Err(None) => KeyState::Shut,
        Err(Some(at)) => KeyState::Until(at),
    })
}

/// A pause's name, checked.
fn pause_key(agent: &str, key: Option<&str>) -> StoreResult<Key> {
    if agent.trim().is_empty() {
        return Err(StoreError::Invalid("agent is blank".into()));
    }
    if let Some(key) = key {
        check_concurrency_key(key).map_err(StoreError::Invalid)?;
    }
    Ok(Key::Pause(pause_name(agent, key)))
}

/// A random pause before deciding again after a conflict on a scope record (none after the
/// first), so that writers that lost a race spread out.
fn backoff(attempt: usize) -> Option<Duration> {
    (attempt > 0).then(|| {
        Duration::from_micros(100)
            .saturating_mul(1u32 << attempt.min(8))
            .min(Duration::from_millis(20))
            .mul_f64(fastrand::f64())
    })
}

impl NatsStore {
    /// A scope record, the sequence of its last message, and whether each of its holders is
    /// live now: from the view on a host, else read from the server (with the records of the
    /// claims holding slots).
    async fn read_scope(&self, scope: &str, now: u64) -> StoreResult<(LimitRec, u64, Vec<bool>)> {
        if self.follows() {
            let view = self.view()?;
            let (rec, seq) = view.limit(scope)?;
            let rec = rec.cloned().unwrap_or_default();
            let live = rec
                .holders
                .iter()
                .map(|h| {
                    let current = view.dispatch(&h.id).ok().flatten().map(|s| &s.dispatch);
                    h.live(current, now)
                })
                .collect();
            return Ok((rec, seq, live));
        }
        let key = Key::Limit(scope.to_owned());
        let (rec, seq) = match self.get_last(&key.subject(self.prefix())).await? {
            None => (LimitRec::default(), 0),
            Some((seq, payload)) => match key.decode(&payload) {
                Ok(Record::Limit(_, rec)) => (rec, seq),
                Ok(_) => (LimitRec::default(), seq),
                Err((key, reason)) => return Err(StoreError::Corrupt { key, reason }),
            },
        };
        let mut live = Vec::with_capacity(rec.holders.len());
        for h in &rec.holders {
            let current = if h.claims == 0 {
                None
            } else {
                self.load_dispatch(&h.id).await?
            };
            live.push(h.live(current.as_ref(), now));
        }
        Ok((rec, seq, live))
    }

    /// Reads `scope`'s record, lets `decide` say what to store (`None`: nothing) and what to
    /// answer, and stores it expecting the record as read; decides again after a conflict.
    async fn on_scope<T>(
        &self,
        scope: &str,
        mut decide: impl FnMut(&LimitRec, &[bool], u64) -> (Option<LimitRec>, T),
    ) -> StoreResult<T> {
        // A host decides on its view first; an answer that writes nothing (a refusal) is only
        // given once confirmed on a view caught up with the stream.
        let mut fresh = !self.follows();
        for attempt in 0..SCOPE_ATTEMPTS {
            let now = self.now();
            let (rec, seq, live) = self.read_scope(scope, now).await?;
            let (write, answer) = decide(&rec, &live, now);
            let Some(new) = write else {
                if fresh {
                    return Ok(answer);
                }
                self.barrier().await?;
                fresh = true;
                continue;
            };
            match self
                .commit(vec![scope_write(scope, seq, new)?], self.follows())
                .await
            {
                Ok(()) => return Ok(answer),
                Err(CommitError::Store(e)) => return Err(e),
                Err(CommitError::Conflict) => {
                    if let Some(pause) = backoff(attempt) {
                        tokio::time::sleep(pause).await;
                    }
                    self.barrier().await?;
                    fresh = true;
                }
            }
        }
        Err(StoreError::Contention(format!(
            "limits/{scope}: too many concurrent writers; retry later"
        )))
    }
}

/// The live holders of `rec` (by `live`).
/// `rec`'s live holders (`live`) without one slot written ahead of claim number `claims` of
/// dispatch `id`; `None` when it holds none. One, not every such slot: another host claiming the
/// same dispatch from the same record writes a slot that looks the same, and its claim (the one
/// that landed) keeps it.
fn given_back(rec: &LimitRec, live: &[bool], id: &str, claims: u32) -> Option<Vec<Holder>> {
    let at = rec
        .holders
        .iter()
        .position(|h| h.id == id && h.claims == claims)?;
    Some(
        rec.holders
            .iter()
            .zip(live)
            .enumerate()
            .filter(|(i, (_, live))| *i != at && **live)
            .map(|(_, (h, _))| h.clone())
            .collect(),
    )
}

fn pruned(rec: &LimitRec, live: &[bool]) -> Vec<Holder> {
    rec.holders
        .iter()
        .zip(live)
        .filter(|(_, live)| **live)
        .map(|(h, _)| h.clone())
        .collect()
}

#[async_trait]
impl Limits for NatsStore {
    async fn take_token(&self, scope: &str, rate: &Rate) -> StoreResult<Option<u64>> {
        self.on_scope(scope, |rec, live, now| {
            match Bucket::take(rec.bucket, rate, now) {
                Ok(bucket) => (
                    Some(LimitRec {
                        holders: pruned(rec, live),
                        bucket: Some(bucket),
                    }),
                    None,
                ),
                Err(at) => (None, Some(at)),
            }
        })
        .await
    }

    async fn acquire_slot(
        &self,
        scope: &str,
        cap: u32,
        holder: &str,
        until: u64,
    ) -> StoreResult<bool> {
        self.on_scope(scope, |rec, live, _| {
            let mut holders: Vec<Holder> = pruned(rec, live)
                .into_iter()
                .filter(|h| !(h.id == holder && h.claims == 0))
                .collect();
            if weight(&holders) >= cap {
                return (None, false);
            }
            holders.push(Holder {
                id: holder.to_owned(),
                claims: 0,
                until,
                slots: 0,
            });
            (
                Some(LimitRec {
                    holders,
                    bucket: rec.bucket,
                }),
                true,
            )
        })
        .await
    }

    async fn release_slot(&self, scope: &str, holder: &str) -> StoreResult<()> {
        self.on_scope(scope, |rec, live, _| {
            if !rec.holders.iter().any(|h| h.id == holder && h.claims == 0) {
                return (None, ());
            }
            let holders = pruned(rec, live)
                .into_iter()
                .filter(|h| !(h.id == holder && h.claims == 0))
                .collect();
            (
                Some(LimitRec {
                    holders,
                    bucket: rec.bucket,
                }),
                (),
            )
        })
        .await
    }

    async fn pause(&self, agent: &str, key: Option<&str>, reason: &str) -> StoreResult<Pause> {
        crate::store::limits::check_pause(agent, key, reason)?;
        let name = pause_key(agent, key)?;
        let pause = Pause {
            agent: agent.to_owned(),
            key: key.map(str::to_owned),
            reason: crate::store::rules::error_text(reason),
            at: self.now(),
        };
        let payload = serde_json::to_vec(&pause)
            .map_err(|e| StoreError::Invalid(format!("{}: cannot encode: {e}", name.describe())))?;
        let Key::Pause(stored) = name.clone() else {
            return Err(StoreError::Invalid("not a pause".into()));
        };
        let write = Write {
            key: name,
            expect: Expect::None,
            payload: Bytes::from(payload),
            record: Record::Pause(stored, Some(pause.clone())),
        };
        match self.commit(vec![write], self.follows()).await {
            Ok(()) => Ok(pause),
            Err(CommitError::Store(e)) => Err(e),
            Err(CommitError::Conflict) => Err(StoreError::Contention(
                "a pause met a conflict it does not expect".into(),
            )),
        }
    }

    async fn resume(&self, agent: &str, key: Option<&str>) -> StoreResult<bool> {
        let name = pause_key(agent, key)?;
        let Key::Pause(stored) = name.clone() else {
            return Err(StoreError::Invalid("not a pause".into()));
        };
        for attempt in 0..SCOPE_ATTEMPTS {
            let (found, seq) = if self.follows() {
                self.barrier().await?;
                let view = self.view()?;
                let (p, seq) = view.pause(&stored);
                (p.is_some(), seq)
            } else {
                match self.get_last(&name.subject(self.prefix())).await? {
                    Some((seq, payload)) => (!payload.is_empty(), seq),
                    None => (false, 0),
                }
            };
            if !found {
                return Ok(false);
            }
            let write = Write {
                key: name.clone(),
                expect: Expect::Subject(seq),
                payload: Bytes::new(),
                record: Record::Pause(stored.clone(), None),
            };
            match self.commit(vec![write], self.follows()).await {
                Ok(()) => {
                    // Claims held back by the pause may go now.
                    self.signal();
                    return Ok(true);
                }
                Err(CommitError::Store(e)) => return Err(e),
                Err(CommitError::Conflict) => {
                    if let Some(pause) = backoff(attempt) {
                        tokio::time::sleep(pause).await;
                    }
                }
            }
        }
        Err(StoreError::Contention(format!(
            "{}: too many concurrent writers; retry later",
            name.describe()
        )))
    }

    async fn pauses(&self) -> StoreResult<Vec<Pause>> {
        let mut out = if self.follows() {
            self.barrier().await?;
            self.view()?.all_pauses()
        } else {
            let prefix = self.prefix().to_owned();
            let mut out = Vec::new();
            for (subject, (_, payload)) in self.last_of_each(&Key::pauses(&prefix)).await? {
                let Some(key @ Key::Pause(_)) = Key::parse(&prefix, &subject) else {
                    continue;
                };
                match key.decode(&payload) {
                    Ok(Record::Pause(_, Some(p))) => out.push(p),
                    Ok(_) => {}
                    Err((key, reason)) => return Err(StoreError::Corrupt { key, reason }),
                }
            }
            out
        };
        out.sort_by(|a, b| (&a.agent, &a.key).cmp(&(&b.agent, &b.key)));
        Ok(out)
    }

    async fn usage(&self, scope: &str, rate: Option<&Rate>) -> StoreResult<Usage> {
        if self.follows() {
            self.barrier().await?;
        }
        let now = self.now();
        let (rec, _, live) = self.read_scope(scope, now).await?;
        let held = rec.holders.iter().zip(&live).filter(|(_, l)| **l);
        Ok(Usage {
            scope: scope.to_owned(),
            running: weight(held.map(|(h, _)| h)),
            tokens: rate.map(|r| Bucket::level(rec.bucket, r, now)),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::store::model::NewDispatch;
    use crate::store::nats::view::Stored;
    use crate::store::rules::{queued_record, take};

    const NOW: u64 = 1_000;
    const LEASE: u64 = 5_000;

    fn queued(id: &str) -> Dispatch {
        let new = NewDispatch::new("agent", "t", b"p".to_vec()).with_concurrency_key("k");
        queued_record(id, &new, 0, NOW)
    }

    /// `d` claimed by `consumer` (each claim gets a token of its own).
    fn claimed(d: &Dispatch, consumer: &str) -> Dispatch {
        let Take::Claimed(d) = take(d.clone(), (d.epoch, 0), consumer, LEASE, NOW, true) else {
            panic!("a current record is taken");
        };
        d
    }

    fn scope(cap: u32) -> Scope {
        Scope {
            name: crate::store::limits::key_scope_name("agent", "k"),
            concurrency: Some(cap),
            rate: None,
        }
    }

    /// A view holding `d` queued and the key's record holding `holders`.
    fn view_with(d: &Dispatch, holders: Vec<Holder>) -> View {
        let mut view = View::lean();
        let stored = Stored {
            dispatch: d.clone(),
            settled: None,
            waitpoints: false,
        };
        view.apply(
            1,
            Record::Dispatch(d.thread.clone(), d.id.clone(), Some(Box::new(stored))),
        );
        view.apply(
            2,
            Record::Limit(
                scope(16).name,
                LimitRec {
                    holders,
                    bucket: None,
                },
            ),
        );
        view
    }

    fn holders(write: &Write) -> &[Holder] {
        match &write.record {
            Record::Limit(_, rec) => &rec.holders,
            other => panic!("not a scope record: {other:?}"),
        }
    }

    /// Issue 49: another host's slot for its claim of `d` has reached this view, its claim of
    /// `d` not yet. This host's slot for its own claim of `d` (which will fail) must leave the
    /// other's slot in the record: taking it out left the other claim running with no slot, a
    /// key at 17 of its 16.
    #[test]
    fn a_slot_for_a_claim_keeps_another_hosts_slot_for_the_same_dispatch() {
        let d = queued("d1");
        let theirs = Holder::ahead_of_claim(&claimed(&d, "other"));
        let view = view_with(&d, vec![theirs.clone()]);
        let ours = claimed(&d, "this");

        let own = take_scope(&view, &scope(2), Holder::ahead_of_claim(&ours), NOW).unwrap();
        assert!(holders(&own).contains(&theirs), "{:?}", holders(&own));
        assert_eq!(weight(holders(&own)), 2);

        let mut blocks = HashMap::new();
        let slot = key_slot(
            &view,
            &scope(16),
            16,
            &ours,
            NOW,
            LEASE,
            &mut blocks,
            "block.1",
        );
        let Ok(Slot::NewBlock(block, ..)) = slot else {
            panic!("a block is taken");
        };
        assert!(holders(&block).contains(&theirs), "{:?}", holders(&block));
    }

    /// Giving a slot back takes out one slot of the claim, not every slot that looks like it.
    #[test]
    fn giving_a_slot_back_takes_out_one() {
        let d = claimed(&queued("d1"), "this");
        let slot = Holder::ahead_of_claim(&d);
        let block = Holder::block("block.1", 2, NOW + 3 * LEASE);
        let rec = LimitRec {
            holders: vec![slot.clone(), block.clone(), slot.clone()],
            bucket: None,
        };
        let left = given_back(&rec, &[true, true, true], &d.id, d.claims).unwrap();
        assert_eq!(left, vec![block.clone(), slot.clone()]);
        let dead = given_back(&rec, &[true, true, false], &d.id, d.claims).unwrap();
        assert_eq!(dead, vec![block.clone()], "dead holders are pruned too");
        assert_eq!(given_back(&rec, &[true; 3], "d2", d.claims), None);
    }
}
