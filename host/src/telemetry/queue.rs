//! The queue as gauges: how many dispatches each agent has in each status, and how long its
//! oldest queued dispatch has waited, and whether it is paused. Read from the store by the sweeper, so every host of a
//! shared store reports the same numbers.

use metrics::gauge;

use super::{AGENT_PAUSED, MESSAGES_PENDING, QUEUE_DEPTH, QUEUE_OLDEST_AGE};
use crate::store::{ListCursor, ListFilter, Status, Store, StoreResult};

/// The statuses the depth gauge reports: live work. Settled work is counted as it settles
/// (`homing_dispatches_finished_total`); counting what the store retains on every sweep would
/// read every retained record each time on NATS.
const LIVE: [Status; 3] = [Status::Queued, Status::Claimed, Status::Waiting];

/// Sets the queue gauges of `agents` (each live status, zeros included) from the store, at a
/// cost bounded by live work.
///
/// # Errors
///
/// When the store cannot be read; the gauges keep their last values.
pub async fn refresh_queue(store: &Store, agents: &[String]) -> StoreResult<()> {
    super::store_feed_restarts(store);
    let counts = store.mailbox.live_counts().await?;
    for agent in agents {
        for status in LIVE {
            let count = counts
                .iter()
                .find(|c| &c.agent == agent && c.status == status)
                .map_or(0, |c| c.count);
            gauge!(QUEUE_DEPTH, "agent" => agent.clone(), "status" => status.as_str())
                .set(count as f64);
        }
        let age = match oldest_queued(store, agent).await? {
            Some(created_at) => store.now().saturating_sub(created_at) as f64 / 1000.0,
            None => 0.0,
        };
        gauge!(QUEUE_OLDEST_AGE, "agent" => agent.clone()).set(age);
    }
    gauge!(MESSAGES_PENDING).set(store.inbox.pending_total().await? as f64);
    // One read of the pauses in force (a handful of records), whoever paused them.
    let pauses = store.limits.pauses().await?;
    for agent in agents {
        let paused = crate::store::limits::paused(&pauses, agent, None);
        gauge!(AGENT_PAUSED, "agent" => agent.clone()).set(if paused { 1.0 } else { 0.0 });
    }
    Ok(())
}

/// The `created_at` of `agent`'s oldest queued dispatch. The list is ordered by priority, then
/// age, so the oldest is the first row of one of the priorities in use: read the first row of
/// each, skipping from one priority to the next (one cheap read per priority in use).
async fn oldest_queued(store: &Store, agent: &str) -> StoreResult<Option<u64>> {
    let mut oldest: Option<u64> = None;
    let mut after = None;
    loop {
        let filter = ListFilter {
            thread: None,
            agent: Some(agent.to_owned()),
            statuses: vec![Status::Queued],
            limit: 1,
            after,
        };
        let Some(first) = store.mailbox.list_rows(&filter).await?.into_iter().next() else {
            return Ok(oldest);
        };
        oldest = Some(oldest.map_or(first.created_at, |o| o.min(first.created_at)));
        if first.priority == u8::MAX {
            return Ok(oldest);
        }
        // Past every row of this priority.
        after = Some(ListCursor {
            priority: first.priority,
            created_at: i64::MAX as u64,
            id: char::MAX.to_string(),
        });
    }
}
