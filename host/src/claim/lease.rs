//! The lease guard: keeps a claim's lease alive while its guest runs.
//!
//! Renewal happens at a third of the lease, so two renewals can fail (a slow store, a pause)
//! before the lease runs out. Between renewals the keeper reads the thread's epoch every
//! [`INTERRUPT_POLL`], so an interrupt stops the guest promptly even when it was issued by
//! another process. When the store says the claim is gone (its lease ran out and was
//! reclaimed, or the thread was interrupted), the keeper asks the guest to stop through the
//! claim's [`ClaimControl`]; the epoch callback then ends the guest's call. A transport error
//! is not a lost claim: the keeper keeps trying until the lease would have run out.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::AbortHandle;
use tracing::{debug, warn};

use super::{ClaimControl, StopReason};
use crate::store::{Dispatch, Status, Store, millis};

/// Renews one claim until dropped.
#[derive(Debug)]
pub struct LeaseGuard {
    task: AbortHandle,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How often the keeper checks whether the claim's thread was interrupted, between renewals.
/// An interrupt can come from another process (`homing thread interrupt`), which cannot signal
/// this one; a cheap epoch read bounds how long the guest runs on after it.
pub const INTERRUPT_POLL: Duration = Duration::from_millis(250);

impl LeaseGuard {
    /// Starts renewing the lease of `dispatch` (held with `token`) every `lease / 3`, and
    /// watching its thread's epoch every [`INTERRUPT_POLL`].
    pub fn start(
        store: Store,
        dispatch: &Dispatch,
        token: String,
        lease: Duration,
        control: Arc<ClaimControl>,
    ) -> Self {
        let (id, thread, epoch) = (dispatch.id.clone(), dispatch.thread.clone(), dispatch.epoch);
        let agent = dispatch.agent.clone();
        let period = (lease / 3).max(Duration::from_millis(10));
        let lease_ms = millis(lease);
        let task = tokio::spawn(async move {
            // When the lease was last extended, and when to try next (sooner after a failure).
            let mut renewed_at = tokio::time::Instant::now();
            let mut next_renewal = renewed_at + period;
            loop {
                tokio::time::sleep_until(
                    next_renewal.min(tokio::time::Instant::now() + INTERRUPT_POLL),
                )
                .await;
                if matches!(store.mailbox.thread_epoch(&thread).await, Ok(current) if current > epoch)
                {
                    debug!(dispatch = %id, "thread interrupted; stopping its guest");
                    control.request_stop(StopReason::Interrupted);
                    return;
                }
                if tokio::time::Instant::now() < next_renewal {
                    continue;
                }
                match store.mailbox.extend_lease(&id, &token, lease_ms).await {
                    Ok(true) => {
                        crate::telemetry::lease_renewed(&agent);
                        renewed_at = tokio::time::Instant::now();
                        next_renewal = renewed_at + period;
                    }
                    Ok(false) => {
                        let reason = match store.mailbox.load(&id).await {
                            Ok(Some(d)) if d.status == Status::Superseded => {
                                StopReason::Interrupted
                            }
                            _ => StopReason::LeaseLost,
                        };
                        if reason == StopReason::LeaseLost {
                            crate::telemetry::lease_lost(&agent);
                        }
                        debug!(dispatch = %id, ?reason, "claim is gone; stopping its guest");
                        control.request_stop(reason);
                        return;
                    }
                    Err(e) => {
                        warn!(dispatch = %id, "lease renewal failed: {e}");
                        if renewed_at.elapsed() >= lease {
                            crate::telemetry::lease_lost(&agent);
                            control.request_stop(StopReason::LeaseLost);
                            return;
                        }
                        // Try again at the next poll rather than a whole period later.
                        next_renewal = tokio::time::Instant::now() + INTERRUPT_POLL;
                    }
                }
            }
        });
        LeaseGuard {
            task: task.abort_handle(),
        }
    }
}
