//! Flow control on the embedded backend (the contract, docs/contract.md, section 13).
//!
//! Four tables of schema 4: `limit_slots` (who holds a shared scope's slots), `limit_buckets`
//! (a scope's tokens), `key_turns` (how far each concurrency key has come in the rotation) and
//! `pauses`. The slots of a concurrency key's scope are not rows: they are the key's running
//! dispatches, counted from their records (schema 7's `dispatches_claimed_keys`), so a keyed
//! claim writes no slot. Every decision is taken inside the claim's write transaction, so one
//! writer makes them all: caps are exact with any number of processes on the file.
//!
//! A claim's rate tokens are taken from a scope's bucket in blocks ([`Block`]), as a NATS host
//! takes them, and spent by the claims of this store instance: a claim writes its scope's
//! bucket once per block instead of once per claim. The blocks live with the writer thread
//! (a thread-local: that thread runs every claim of its store instance, and nothing else
//! needs them); one taken by an operation that is then rolled back is forgotten with the
//! rest, so no token is spent that the bucket did not give.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::claim::claim_picked;
use super::rows::db;
use super::{EmbeddedStore, TxError, lanes, turns};
use crate::store::StoreResult;
use crate::store::limits::{
    Block, Bucket, ClaimRequest, Gated, Holder, LimitSet, Limits, Pause, Rate, Scope, Usage,
};
use crate::store::model::{Dispatch, Status};
use crate::store::rules::{self, clamp};
use crate::store::versions::Offer;

thread_local! {
    /// The rate tokens this writer thread took from scopes' buckets and has not spent.
    static BLOCKS: RefCell<HashMap<String, Block>> = RefCell::new(HashMap::new());
}

/// Past this many scopes with blocks, the lapsed ones are dropped when another is added.
const KEPT_BLOCKS: usize = 1024;

/// Forgets this writer thread's blocks: called when an operation or a batch is rolled back,
/// since a block it took from a bucket was then never taken.
pub(super) fn forget_blocks() {
    BLOCKS.with(|b| b.borrow_mut().clear());
}

/// Where a scope stands for one more holder.
enum Room {
    /// A claim may take it, with the token it takes.
    Free(Token),
    /// Its slots are all held.
    Full,
    /// Its bucket is empty until then.
    Empty(u64),
}

/// The rate token a claim takes of a scope.
#[derive(Debug, Clone, Copy)]
enum Token {
    /// The scope has no rate.
    Unrated,
    /// One of this writer's block.
    Held,
    /// A new block: the bucket to store, and how many tokens it gave (the claim spends one).
    Block(Bucket, u32),
}

/// Whose claims hold a scope's slots.
#[derive(Debug, Clone, Copy)]
enum Holders<'a> {
    /// The rows of `limit_slots` (the scopes of a whole agent or of named limits, which
    /// outbound requests may hold too).
    Slots,
    /// The running dispatches of `agent` with concurrency key `key`.
    Claims { agent: &'a str, key: &'a str },
}

/// How many dispatches of `agent` with concurrency key `key` run at `now` (claimed, lease
/// alive): the holders of the key's scope.
fn running_with_key(tx: &Connection, agent: &str, key: &str, now: u64) -> StoreResult<u64> {
    Ok(super::rows::scalar_u64(
        tx,
        "SELECT count(*) FROM dispatches INDEXED BY dispatches_claimed_keys \
         WHERE agent = ?1 AND concurrency_key = ?2 AND status = 'claimed' AND lease_until >= ?3",
        &[&agent, &key, &clamp(now)],
    )?
    .unwrap_or(0))
}

/// The live holders of `scope` at `now`, deleting the rows of holders that are gone.
fn live_holders(tx: &Connection, scope: &str, now: u64) -> StoreResult<u32> {
    let holders: Vec<Holder> = {
        let mut stmt = tx
            .prepare_cached("SELECT holder, claims, until FROM limit_slots WHERE scope = ?1")
            .map_err(db)?;
        let rows = stmt
            .query_map(params![scope], |row| {
                Ok(Holder {
                    id: row.get(0)?,
                    claims: row.get(1)?,
                    until: row.get(2)?,
                    slots: 0,
                })
            })
            .map_err(db)?;
        rows.collect::<Result<_, _>>().map_err(db)?
    };
    let mut live = 0;
    for h in holders {
        let held = if h.claims == 0 {
            h.until > now
        } else {
            // The three columns the rule reads, not the whole row.
            let row: Option<(String, u32, Option<u64>)> = tx
                .prepare_cached("SELECT status, claims, lease_until FROM dispatches WHERE id = ?1")
                .map_err(db)?
                .query_row(params![h.id], |row| {
                    Ok((row.get(0)?, row.get(1)?, row.get(2)?))
                })
                .optional()
                .map_err(db)?;
            row.is_some_and(|(status, claims, lease)| {
                h.held(status == Status::Claimed.as_str(), claims, lease, now)
            })
        };
        if held {
            live += 1;
        } else {
            tx.prepare_cached("DELETE FROM limit_slots WHERE scope = ?1 AND holder = ?2")
                .map_err(db)?
                .execute(params![scope, h.id])
                .map_err(db)?;
        }
    }
    Ok(live)
}

/// Up to this many slot rows of a scope are not checked one by one while they are fewer than
/// its cap: rows count every live holder (and some gone), so fewer rows than the cap means room.
const UNCHECKED_ROWS: u64 = 8;

/// Whether `scope` has fewer slot rows than `cap` and than [`UNCHECKED_ROWS`]: then it has
/// room without reading whether each holder still holds (a dispatch read per row). Past that
/// the rows are checked, which deletes those of holders that are gone.
fn clearly_below(tx: &Connection, scope: &str, cap: u32) -> StoreResult<bool> {
    let rows = super::rows::scalar_u64(
        tx,
        "SELECT count(*) FROM limit_slots WHERE scope = ?1",
        &[&scope],
    )?
    .unwrap_or(0);
    Ok(rows < u64::from(cap) && rows < UNCHECKED_ROWS)
}

fn bucket(tx: &Connection, scope: &str) -> StoreResult<Option<Bucket>> {
    tx.prepare_cached("SELECT tokens, at FROM limit_buckets WHERE scope = ?1")
        .map_err(db)?
        .query_row(params![scope], |row| {
            Ok(Bucket {
                tokens: row.get(0)?,
                at: row.get(1)?,
            })
        })
        .optional()
        .map_err(db)
}

fn store_bucket(tx: &Connection, scope: &str, b: Bucket) -> StoreResult<()> {
    tx.prepare_cached(
        "INSERT INTO limit_buckets (scope, tokens, at) VALUES (?1, ?2, ?3) \
         ON CONFLICT (scope) DO UPDATE SET tokens = excluded.tokens, at = excluded.at",
    )
    .map_err(db)?
    .execute(params![scope, b.tokens, clamp(b.at)])
    .map_err(db)?;
    Ok(())
}

fn add_holder(tx: &Connection, scope: &str, h: &Holder) -> StoreResult<()> {
    tx.prepare_cached(
        "INSERT INTO limit_slots (scope, holder, claims, until) VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT (scope, holder) DO UPDATE SET claims = excluded.claims, until = excluded.until",
    )
    .map_err(db)?
    .execute(params![scope, h.id, h.claims, clamp(h.until)])
    .map_err(db)?;
    Ok(())
}

/// Whether `scope`, its slots held by `holders`, has room for one more holder at `now`.
fn room(tx: &Connection, scope: &Scope, holders: Holders<'_>, now: u64) -> StoreResult<Room> {
    if let Some(cap) = scope.concurrency {
        let full = match holders {
            Holders::Slots => {
                !clearly_below(tx, &scope.name, cap)? && live_holders(tx, &scope.name, now)? >= cap
            }
            Holders::Claims { agent, key } => {
                running_with_key(tx, agent, key, now)? >= u64::from(cap)
            }
        };
        if full {
            return Ok(Room::Full);
        }
    }
    let Some(rate) = &scope.rate else {
        return Ok(Room::Free(Token::Unrated));
    };
    if BLOCKS.with(|b| b.borrow().get(&scope.name).is_some_and(|b| b.has(now))) {
        return Ok(Room::Free(Token::Held));
    }
    Ok(match Block::take(bucket(tx, &scope.name)?, rate, now) {
        Ok((b, taken)) => Room::Free(Token::Block(b, taken)),
        Err(at) => Room::Empty(at),
    })
}

/// Takes what a claim holds of `scope`: its token, and with `slot_of` (the claimed dispatch,
/// when the scope's slots are rows) its slot row.
fn take_room(
    tx: &Connection,
    scope: &Scope,
    token: Token,
    slot_of: Option<&Dispatch>,
    now: u64,
) -> StoreResult<()> {
    match token {
        Token::Unrated => {}
        Token::Held => BLOCKS.with(|b| {
            if let Some(block) = b.borrow_mut().get_mut(&scope.name) {
                block.spend(now);
            }
        }),
        Token::Block(bucket, taken) => {
            store_bucket(tx, &scope.name, bucket)?;
            BLOCKS.with(|b| {
                let mut blocks = b.borrow_mut();
                if blocks.len() >= KEPT_BLOCKS {
                    blocks.retain(|_, block| block.has(now));
                }
                let block = Block::refilled(blocks.get(&scope.name).copied(), taken - 1, now);
                blocks.insert(scope.name.clone(), block);
            });
        }
    }
    if scope.concurrency.is_some()
        && let Some(d) = slot_of
    {
        add_holder(tx, &scope.name, &Holder::of_claim(d))?;
    }
    Ok(())
}

/// The paused keys of `agent` (`""` for the whole agent).
fn paused_keys(tx: &Connection, agent: &str) -> StoreResult<Vec<String>> {
    let mut stmt = tx
        .prepare_cached("SELECT key FROM pauses WHERE agent = ?1")
        .map_err(db)?;
    let rows = stmt
        .query_map(params![agent], |row| row.get(0))
        .map_err(db)?;
    rows.collect::<Result<_, _>>().map_err(db)
}

fn earliest(a: Option<u64>, b: u64) -> Option<u64> {
    Some(a.map_or(b, |a| a.min(b)))
}

/// The best lane of `agent` whose key is not in `blocked`: in lane order, or, with keyed
/// limits (`floor` is then the agent's turn floor), the lane of the key whose turn comes first
/// within the best priority.
fn pick_lane(
    tx: &Connection,
    agent: &str,
    floor: Option<u64>,
    blocked: &HashSet<String>,
) -> StoreResult<Option<(String, String, String, u64)>> {
    let Some(floor) = floor else {
        let mut stmt = tx
            .prepare_cached(
                "SELECT thread, head, ckey FROM lanes WHERE agent = ?1 AND busy = 0 \
                 ORDER BY priority, served, created",
            )
            .map_err(db)?;
        let mut rows = stmt.query(params![agent]).map_err(db)?;
        while let Some(row) = rows.next().map_err(db)? {
            let key: String = row.get(2).map_err(db)?;
            if !blocked.contains(&key) {
                return Ok(Some((
                    row.get(0).map_err(db)?,
                    row.get(1).map_err(db)?,
                    key,
                    0,
                )));
            }
        }
        return Ok(None);
    };
    // The priorities with a free lane, best first; the rotation is within the first that has
    // a lane of a key not blocked.
    let mut after = i64::MIN;
    while let Some(priority) = free_priority(tx, agent, after)? {
        if let Some(lane) = rotate(tx, agent, priority, floor, blocked)? {
            return Ok(Some(lane));
        }
        after = priority;
    }
    Ok(None)
}

/// The best free lane of `agent` at `priority` with a key not in `blocked`, with its key and
/// turn: the key whose turn comes first, a key's turn counting as `floor` when below it
/// (ties: the lower stored turn, then the key). Keys are read in turn order (the index
/// `key_turns_order`) only until one has a free lane, so a claim reads the keys that are
/// running, blocked or idle before it, not every key. An idle key at or below the floor (no
/// lane left) has nothing to remember and its row is deleted on the way. Dispatches without a
/// key form the key `""`, which has a row only once claimed.
fn rotate(
    tx: &Connection,
    agent: &str,
    priority: i64,
    floor: u64,
    blocked: &HashSet<String>,
) -> StoreResult<Option<(String, String, String, u64)>> {
    let unkeyed = if blocked.contains("") {
        None
    } else {
        key_lane(tx, agent, "", priority)?
    };
    let unkeyed = match unkeyed {
        Some(lane) => {
            let turn = rules::turns::turn(turns::turn(tx, agent, "")?, floor);
            Some((lane, turn))
        }
        None => None,
    };
    let mut idle = Vec::new();
    let mut found = None;
    turns::in_order(tx, agent, |key, stored| {
        let turn = rules::turns::turn(Some(stored), floor);
        if unkeyed.as_ref().is_some_and(|(_, t)| *t <= turn) {
            return Ok(true);
        }
        if key.is_empty() || blocked.contains(key) {
            return Ok(false);
        }
        if let Some(lane) = key_lane(tx, agent, key, priority)? {
            found = Some((lane, key.to_owned(), turn));
            return Ok(true);
        }
        if stored <= floor && !has_lane(tx, agent, key)? {
            idle.push(key.to_owned());
        }
        Ok(false)
    })?;
    for key in &idle {
        turns::remove(tx, agent, key)?;
    }
    Ok(match (found, unkeyed) {
        (Some(((thread, head), key, turn)), _) => Some((thread, head, key, turn)),
        (None, Some(((thread, head), turn))) => Some((thread, head, String::new(), turn)),
        (None, None) => None,
    })
}

/// The best priority above `after` at which `agent` has a free lane.
fn free_priority(tx: &Connection, agent: &str, after: i64) -> StoreResult<Option<i64>> {
    tx.prepare_cached(
        "SELECT priority FROM lanes INDEXED BY lanes_pick WHERE agent = ?1 AND busy = 0 \
         AND priority > ?2 ORDER BY priority LIMIT 1",
    )
    .map_err(db)?
    .query_row(params![agent, after], |row| row.get(0))
    .optional()
    .map_err(db)
}

/// The free lane of `key` at `priority` served first: its thread and head.
fn key_lane(
    tx: &Connection,
    agent: &str,
    key: &str,
    priority: i64,
) -> StoreResult<Option<(String, String)>> {
    tx.prepare_cached(
        "SELECT thread, head FROM lanes INDEXED BY lanes_by_key \
         WHERE agent = ?1 AND ckey = ?2 AND busy = 0 AND priority = ?3 \
         ORDER BY served, created LIMIT 1",
    )
    .map_err(db)?
    .query_row(params![agent, key, priority], |row| {
        Ok((row.get(0)?, row.get(1)?))
    })
    .optional()
    .map_err(db)
}

/// Whether `key` has a lane of `agent`, free or busy.
fn has_lane(tx: &Connection, agent: &str, key: &str) -> StoreResult<bool> {
    Ok(super::rows::scalar_u64(
        tx,
        "SELECT 1 FROM lanes INDEXED BY lanes_by_key WHERE agent = ?1 AND ckey = ?2 LIMIT 1",
        &[&agent, &key],
    )?
    .is_some())
}

/// Deletes the turns that carry nothing: keys with no lane whose turn is at or below their
/// agent's floor (they would count as the floor). The rotation deletes those it passes; this
/// catches the rest (agents without keyed limits never rotate).
pub(super) fn forget_idle_keys(tx: &Connection) -> StoreResult<usize> {
    let gone: Vec<(String, String)> = {
        let mut stmt = tx
            .prepare_cached(
                "DELETE FROM key_turns WHERE key <> '' \
                 AND turn <= COALESCE((SELECT value FROM counters WHERE name = 'turn:' || key_turns.agent), 0) \
                 AND NOT EXISTS (SELECT 1 FROM lanes INDEXED BY lanes_by_key \
                     WHERE lanes.agent = key_turns.agent AND lanes.ckey = key_turns.key) \
                 RETURNING agent, key",
            )
            .map_err(db)?;
        let rows = stmt
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .map_err(db)?;
        rows.collect::<Result<_, _>>().map_err(db)?
    };
    // The rule read the table's turns; the writer's own, when it has moved them, stay.
    for (agent, key) in &gone {
        turns::deleted(tx, agent, key)?;
    }
    Ok(gone.len())
}

/// The gated claim inside the writer's transaction.
#[allow(clippy::too_many_arguments)]
fn claim_gated_tx(
    tx: &Connection,
    agent: &str,
    consumer: &str,
    lease_ms: u64,
    start: bool,
    limits: &LimitSet,
    offer: Option<&Offer>,
    now: u64,
) -> Result<Gated, TxError> {
    lanes::promote_due(tx, now)?;
    let paused = paused_keys(tx, agent)?;
    if paused.iter().any(String::is_empty) {
        return Ok(Gated::default());
    }
    let mut out = Gated::default();
    // The scopes every dispatch of the agent counts toward decide first: when one is full,
    // nothing of the agent may start.
    let mut shared = Vec::with_capacity(limits.shared.len());
    for scope in &limits.shared {
        match room(tx, scope, Holders::Slots, now)? {
            Room::Free(token) => shared.push((scope, token)),
            Room::Full => return Ok(out),
            Room::Empty(at) => {
                out.retry_at = Some(at);
                return Ok(out);
            }
        }
    }
    let mut blocked: HashSet<String> = paused.into_iter().collect();
    // The floor is read once: nothing before the turn's advance below moves it.
    let floor = if limits.keyed() {
        Some(turns::floor(tx, agent)?)
    } else {
        None
    };
    let mut key_room = None;
    let mut picked_turn = 0;
    let claimed = {
        // Each turn of the loop claims or blocks one more key, so the keys bound it.
        let mut pick = |tx: &Connection| -> StoreResult<Option<(String, String)>> {
            loop {
                let Some((thread, head, key, turn)) = pick_lane(tx, agent, floor, &blocked)? else {
                    return Ok(None);
                };
                picked_turn = turn;
                let scope = (!key.is_empty())
                    .then(|| limits.key_scope(agent, &key))
                    .flatten();
                let Some(scope) = scope else {
                    key_room = None;
                    return Ok(Some((thread, head)));
                };
                match room(tx, &scope, Holders::Claims { agent, key: &key }, now)? {
                    Room::Free(token) => {
                        key_room = Some((scope, token));
                        return Ok(Some((thread, head)));
                    }
                    Room::Full => {}
                    Room::Empty(at) => out.retry_at = earliest(out.retry_at, at),
                }
                out.throttled.push(head);
                blocked.insert(key);
            }
        };
        claim_picked(tx, agent, consumer, lease_ms, start, now, offer, &mut pick)?
    };
    let Some((d, _thread)) = claimed else {
        return Ok(out);
    };
    for (scope, token) in &shared {
        take_room(tx, scope, *token, Some(&d), now)?;
    }
    if let Some((scope, token)) = &key_room {
        // A key's slots are its running dispatches: this claim holds one by being claimed.
        take_room(tx, scope, *token, None, now)?;
    }
    if let Some(floor) = floor {
        let key = d.concurrency_key.as_deref().unwrap_or_default();
        turns::advance(tx, agent, key, (picked_turn, floor), limits.turn_cost(key))?;
    }
    out.dispatch = Some(d);
    Ok(out)
}

impl EmbeddedStore {
    /// `claim_gated`: the claim with its limits and pauses decided in the same step.
    pub(super) async fn claim_gated_inner(&self, req: &ClaimRequest<'_>) -> StoreResult<Gated> {
        let claim = OwnedClaim::of(req);
        self.write(move |tx, now| claim.run(tx, now)).await
    }
}

/// A [`ClaimRequest`] owned, to be sent to the writer thread.
pub(super) struct OwnedClaim {
    agent: String,
    consumer: String,
    lease_ms: u64,
    start: bool,
    limits: LimitSet,
    offer: Option<Offer>,
}

impl OwnedClaim {
    pub(super) fn of(req: &ClaimRequest<'_>) -> OwnedClaim {
        OwnedClaim {
            agent: req.agent.to_owned(),
            consumer: req.consumer.to_owned(),
            lease_ms: req.lease_ms,
            start: req.start,
            limits: req.limits.clone(),
            offer: req.offer.cloned(),
        }
    }

    /// The gated claim, in the write transaction `tx`.
    pub(super) fn run(&self, tx: &Connection, now: u64) -> Result<Gated, TxError> {
        claim_gated_tx(
            tx,
            &self.agent,
            &self.consumer,
            self.lease_ms,
            self.start,
            &self.limits,
            self.offer.as_ref(),
            now,
        )
    }
}

#[async_trait]
impl Limits for EmbeddedStore {
    async fn take_token(&self, scope: &str, rate: &Rate) -> StoreResult<Option<u64>> {
        let (scope, rate) = (scope.to_owned(), *rate);
        self.write(
            move |tx, now| match Bucket::take(bucket(tx, &scope)?, &rate, now) {
                Ok(b) => {
                    store_bucket(tx, &scope, b)?;
                    Ok(None)
                }
                Err(at) => Ok(Some(at)),
            },
        )
        .await
    }

    async fn acquire_slot(
        &self,
        scope: &str,
        cap: u32,
        holder: &str,
        until: u64,
    ) -> StoreResult<bool> {
        let (scope, holder) = (scope.to_owned(), holder.to_owned());
        self.write(move |tx, now| {
            if live_holders(tx, &scope, now)? >= cap {
                return Ok(false);
            }
            add_holder(
                tx,
                &scope,
                &Holder {
                    id: holder,
                    claims: 0,
                    until,
                    slots: 0,
                },
            )?;
            Ok(true)
        })
        .await
    }

    async fn release_slot(&self, scope: &str, holder: &str) -> StoreResult<()> {
        let (scope, holder) = (scope.to_owned(), holder.to_owned());
        self.write(move |tx, _| {
            tx.prepare_cached("DELETE FROM limit_slots WHERE scope = ?1 AND holder = ?2")
                .map_err(db)?
                .execute(params![scope, holder])
                .map_err(db)?;
            Ok(())
        })
        .await
    }

    async fn pause(&self, agent: &str, key: Option<&str>, reason: &str) -> StoreResult<Pause> {
        crate::store::limits::check_pause(agent, key, reason)?;
        let (agent, key, reason) = (agent.to_owned(), key.map(str::to_owned), reason.to_owned());
        self.write(move |tx, now| {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO pauses (agent, key, reason, at) VALUES (?1, ?2, ?3, ?4)",
            )
            .map_err(db)?
            .execute(params![agent, key.clone().unwrap_or_default(), reason, now])
            .map_err(db)?;
            Ok(Pause {
                agent,
                key,
                reason,
                at: now,
            })
        })
        .await
    }

    async fn resume(&self, agent: &str, key: Option<&str>) -> StoreResult<bool> {
        let (agent, key) = (agent.to_owned(), key.unwrap_or_default().to_owned());
        let lifted = self
            .write(move |tx, _| {
                let n = tx
                    .prepare_cached("DELETE FROM pauses WHERE agent = ?1 AND key = ?2")
                    .map_err(db)?
                    .execute(params![agent, key])
                    .map_err(db)?;
                Ok(n > 0)
            })
            .await?;
        if lifted {
            self.signal();
        }
        Ok(lifted)
    }

    async fn pauses(&self) -> StoreResult<Vec<Pause>> {
        self.read(|tx| {
            let mut stmt = tx
                .prepare_cached("SELECT agent, key, reason, at FROM pauses ORDER BY agent, key")
                .map_err(db)?;
            let rows = stmt
                .query_map([], |row| {
                    let key: String = row.get(1)?;
                    Ok(Pause {
                        agent: row.get(0)?,
                        key: (!key.is_empty()).then_some(key),
                        reason: row.get(2)?,
                        at: row.get(3)?,
                    })
                })
                .map_err(db)?;
            rows.collect::<Result<_, _>>().map_err(db)
        })
        .await
    }

    async fn usage(&self, scope: &str, rate: Option<&Rate>) -> StoreResult<Usage> {
        let (scope, rate) = (scope.to_owned(), rate.copied());
        self.write(move |tx, now| {
            let running = live_holders(tx, &scope, now)?;
            let tokens = match rate {
                Some(rate) => Some(Bucket::level(bucket(tx, &scope)?, &rate, now)),
                None => None,
            };
            Ok(Usage {
                scope,
                running,
                tokens,
            })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::store::{ManualClock, StoreError};

    /// How many scopes the writer thread holds blocks of.
    async fn blocks_held(store: &EmbeddedStore) -> usize {
        store
            .write(|_, _| Ok(BLOCKS.with(|b| b.borrow().len())))
            .await
            .unwrap()
    }

    /// Puts a block of `scope` on the writer thread, as a claim taking one does.
    fn hold(scope: &str, now: u64) {
        BLOCKS.with(|b| {
            b.borrow_mut().insert(
                scope.to_owned(),
                Block {
                    left: 3,
                    until: now + 100,
                },
            )
        });
    }

    /// A block lives with the writer thread while the operation that took it is kept, and is
    /// forgotten (with the others) when an operation rolls back: its bucket write never
    /// happened, so its tokens were never taken.
    #[tokio::test]
    async fn a_block_taken_by_an_operation_that_rolls_back_is_forgotten() {
        let store = EmbeddedStore::open_in_memory(ManualClock::new(1_000)).unwrap();
        store
            .write(|_, now| {
                hold("agent:kept", now);
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(blocks_held(&store).await, 1);
        let aborted: StoreResult<()> = store
            .write(|_, now| {
                hold("agent:lost", now);
                Err(TxError::Abort(StoreError::Unavailable(
                    "rolled back".into(),
                )))
            })
            .await;
        assert!(aborted.is_err());
        assert_eq!(blocks_held(&store).await, 0);
    }
}
