//! The claim of the embedded backend (T2): the lane a claim picks, and taking its head as the
//! rules say (`rules::take`), repairing a lane that disagrees with the records. Both claim
//! paths use it: the plain claim (`mailbox`) and the gated one (`limits`).

use rusqlite::{Connection, OptionalExtension, params};

use super::TxError;
use super::effects::store_superseded;
use super::lanes::{demote, refresh_lane, store_claimed, thread_row};
use super::rows::{self, db};
use crate::store::StoreError;
use crate::store::StoreResult;
use crate::store::model::{Dispatch, Status};
use crate::store::rules::{self, Take};
use crate::store::versions::{Choice, Offer};

/// Chooses the lane a claim takes: its thread and head, or none.
pub(super) type LanePick<'a> = dyn FnMut(&Connection) -> StoreResult<Option<(String, String)>> + 'a;

/// The best lane of `agent` free to claim: its thread and head.
pub(super) fn next_lane(tx: &Connection, agent: &str) -> StoreResult<Option<(String, String)>> {
    tx.prepare_cached(
        "SELECT thread, head FROM lanes WHERE agent = ?1 AND busy = 0 \
         ORDER BY priority, served, created LIMIT 1",
    )
    .map_err(db)?
    .query_row(params![agent], |row| Ok((row.get(0)?, row.get(1)?)))
    .optional()
    .map_err(db)
}

/// Claims the head of the lane `pick` chooses (T2), repairing a lane whose head turns out
/// unusable and picking again. Returns the claimed record and the thread it was on. With an
/// `offer` (section 14), the claim records the version it runs, and a head pinned to a version
/// not offered is passed over: its lane is set busy for the rest of this transaction (so no pick
/// returns it) and set free again before it commits.
#[allow(clippy::too_many_arguments)]
pub(super) fn claim_picked(
    tx: &Connection,
    agent: &str,
    consumer: &str,
    lease_ms: u64,
    start: bool,
    now: u64,
    offer: Option<&Offer>,
    pick: &mut LanePick<'_>,
) -> Result<Option<(Dispatch, String)>, TxError> {
    let mut passed = Vec::new();
    let out = claim_offered(
        tx,
        agent,
        (consumer, lease_ms, start, now),
        offer,
        pick,
        &mut passed,
    );
    for thread in &passed {
        set_busy(tx, thread, false)?;
    }
    out
}

/// What [`rules::take`](crate::store::rules::take) needs of `d`'s thread besides its epoch:
/// the log's latest sequence, read only for a first claim (later claims keep their
/// `log_from`).
pub(super) fn log_from(tx: &Connection, d: &Dispatch) -> StoreResult<u64> {
    match d.log_from {
        Some(n) => Ok(n),
        None => Ok(super::log::marks(tx, &d.thread)?.latest),
    }
}

fn set_busy(tx: &Connection, thread: &str, busy: bool) -> StoreResult<()> {
    tx.prepare_cached("UPDATE lanes SET busy = ?2 WHERE thread = ?1")
        .map_err(db)?
        .execute(params![thread, busy])
        .map_err(db)?;
    Ok(())
}

fn claim_offered(
    tx: &Connection,
    agent: &str,
    (consumer, lease_ms, start, now): (&str, u64, bool, u64),
    offer: Option<&Offer>,
    pick: &mut LanePick<'_>,
    passed: &mut Vec<String>,
) -> Result<Option<(Dispatch, String)>, TxError> {
    // A lane whose head turns out unusable is repaired and the pick repeated; the bound only
    // guards against a store that keeps handing back the same broken lane. A head not yet due
    // (the clock stepped back since it was promoted) goes back to waiting, which does not
    // count: each such step takes one dispatch out of the lanes.
    let mut repairs = 0;
    while repairs < 64 {
        let Some((thread, head)) = pick(tx)? else {
            return Ok(None);
        };
        let t = thread_row(tx, &thread)?;
        let candidate = rows::load(tx, &head)?.map(|row| row.dispatch);
        match candidate {
            Some(d) if d.status == Status::Queued && t.holder.is_none() => {
                if !rules::due(&d, now) {
                    demote(tx, &d)?;
                    continue;
                }
                let choice = offer.map(|o| (o, o.choose(&d, now)));
                if let Some((_, Choice::Elsewhere)) = choice {
                    set_busy(tx, &thread, true)?;
                    passed.push(thread);
                    continue;
                }
                repairs += 1;
                let log = log_from(tx, &d)?;
                match rules::take(d, (t.epoch, log), consumer, lease_ms, now, start) {
                    Take::Claimed(mut d) => {
                        if let Some((o, Choice::Run(index))) = choice {
                            o.record(&mut d, index);
                        }
                        store_claimed(tx, &d)?;
                        return Ok(Some((d, thread)));
                    }
                    Take::Stale(d) => store_superseded(tx, Status::Queued, &d, None)?,
                }
            }
            _ => {
                repairs += 1;
                // The lane disagrees with the records (it cannot, short of a bug or a
                // hand-edited file): rebuild it from them and pick again.
                tx.prepare_cached("UPDATE lanes SET busy = ?2 WHERE thread = ?1")
                    .map_err(db)?
                    .execute(params![thread, t.holder.is_some()])
                    .map_err(db)?;
                refresh_lane(tx, agent, &thread)?;
            }
        }
    }
    Err(StoreError::Contention(format!(
        "claim for agent `{agent}` found no consistent lane"
    ))
    .into())
}
