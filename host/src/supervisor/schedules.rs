//! The tick worker: every host runs one, claiming the schedules' tick dispatches like any other
//! work (with a lease, reclaimed when the host dies), running each tick (`work::schedules::tick`)
//! and acking it. A tick that fails is released to run again after a pause, counting no attempt:
//! a schedule never dead-letters its own tick. It polls every `IDLE_POLL` (a quarter second)
//! when no tick is due.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tracing::{debug, warn};

use super::IDLE_POLL;
use crate::store::rules::schedules::META_SCHEDULE;
use crate::store::{Dispatch, Store};
use crate::telemetry;
use crate::work::schedules::{TICK_AGENT, tick};

/// The shortest lease of a tick: far more than a tick takes (a few store operations); the
/// host's `lease` when longer.
const MIN_TICK_LEASE_MS: u64 = 5_000;
/// How long a failed tick waits before it runs again.
const TICK_RETRY_MS: u64 = 1_000;

/// Claims and runs ticks until `shutdown`.
pub(super) async fn tick_loop(
    store: Store,
    consumer: String,
    lease: Duration,
    shutdown: Arc<AtomicBool>,
    wake: Arc<Notify>,
) {
    let lease_ms = crate::store::millis(lease).max(MIN_TICK_LEASE_MS);
    let mut failures: u32 = 0;
    while !shutdown.load(Ordering::SeqCst) {
        // Not the store's work signal: it fires on every enqueue and settlement of any work,
        // and a tick is always enqueued for later (a claim per signal cost the plugins' workers
        // a tenth of their throughput on NATS). A due tick waits at most one poll.
        let woken = wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        match store.mailbox.claim(TICK_AGENT, &consumer, lease_ms).await {
            Ok(Some(d)) => {
                failures = 0;
                run(&store, &d).await;
            }
            Ok(None) => {
                tokio::select! {
                    () = &mut woken => {}
                    () = tokio::time::sleep(IDLE_POLL) => {}
                }
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                let backoff = Duration::from_millis(50u64.saturating_mul(1 << failures.min(6)));
                warn!("claiming a schedule tick failed ({e}); retrying in {backoff:?}");
                tokio::select! {
                    () = &mut woken => {}
                    () = tokio::time::sleep(backoff) => {}
                }
            }
        }
    }
}

/// Runs one claimed tick and settles it.
async fn run(store: &Store, d: &Dispatch) {
    let Some(token) = d.claim.as_ref().map(|c| c.token.clone()) else {
        return;
    };
    let name = d.metadata.get(META_SCHEDULE).cloned().unwrap_or_default();
    let lag = store.now().saturating_sub(d.available_at);
    match tick(store, &name, &d.id).await {
        Ok(done) => {
            if !done.stale {
                let fired: Vec<&'static str> = done.fired.iter().map(|(_, k)| k.as_str()).collect();
                let skipped: Vec<(&'static str, u64)> =
                    done.skipped.iter().map(|(r, n)| (r.as_str(), *n)).collect();
                telemetry::schedule_ticked(&name, lag, &fired, &skipped);
            }
            debug!(schedule = %name, tick = %d.id, fired = done.fired.len(), "schedule ticked");
            if let Err(e) = store.mailbox.ack(&d.id, &token).await {
                // A reclaim runs it again: every step is idempotent.
                warn!(schedule = %name, tick = %d.id, "acking a schedule tick failed: {e}");
            }
        }
        Err(e) => {
            warn!(schedule = %name, tick = %d.id, "a schedule tick failed ({e}); it runs again");
            let at = store.now().saturating_add(TICK_RETRY_MS);
            if let Err(e) = store
                .mailbox
                .release(&d.id, &token, at, "the tick failed; it runs again")
                .await
            {
                warn!(schedule = %name, tick = %d.id, "releasing a failed tick failed: {e}");
            }
        }
    }
}
