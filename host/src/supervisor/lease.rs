//! The lease keeper: renews a claim's lease while its guest runs.
//!
//! Renewal happens at a third of the lease, so two renewals can fail (a slow store, a pause)
//! before the lease runs out. When the store says the claim is gone (its lease ran out and was
//! reclaimed, or the thread was interrupted), the keeper asks the guest to stop through the
//! claim's [`ClaimControl`]; the epoch callback then ends the guest's call. A transport error
//! is not a lost claim: the keeper keeps trying until the lease would have run out.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::AbortHandle;
use tracing::{debug, warn};

use crate::runtime::bindings::StopReason;
use crate::runtime::host::ClaimControl;
use crate::store::{Status, Store};

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

impl LeaseGuard {
    /// Starts renewing the lease of (`id`, `token`) every `lease / 3`.
    pub fn start(
        store: Store,
        id: String,
        token: String,
        lease: Duration,
        control: Arc<ClaimControl>,
    ) -> Self {
        let period = (lease / 3).max(Duration::from_millis(10));
        let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        let task = tokio::spawn(async move {
            let mut last_renewed = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(period).await;
                match store.mailbox.extend_lease(&id, &token, lease_ms).await {
                    Ok(true) => last_renewed = tokio::time::Instant::now(),
                    Ok(false) => {
                        let reason = match store.mailbox.load(&id).await {
                            Ok(Some(d)) if d.status == Status::Superseded => {
                                StopReason::Interrupted
                            }
                            _ => StopReason::LeaseLost,
                        };
                        debug!(dispatch = %id, ?reason, "claim is gone; stopping its guest");
                        control.request_stop(reason);
                        return;
                    }
                    Err(e) => {
                        warn!(dispatch = %id, "lease renewal failed: {e}");
                        if last_renewed.elapsed() >= lease {
                            control.request_stop(StopReason::LeaseLost);
                            return;
                        }
                    }
                }
            }
        });
        LeaseGuard {
            task: task.abort_handle(),
        }
    }
}
