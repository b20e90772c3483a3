//! The `queue` interface of the `agent` world: `claim-next`, through which a guest that drives
//! its own loop takes its next dispatch.
//!
//! The first call hands over the dispatch the host claimed before starting the instance; later
//! ones claim through the claim layer, at most the instance's budget (`reuse_instance`), and
//! wait for work up to [`MAX_CLAIM_WAIT`] whatever the guest asks. Once the host is shutting
//! down, `claim-next` returns none.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use wasmtime::component::Resource;

use super::GuestState;
use super::policy::{MAX_CLAIM_WAIT, guest_error};
use crate::claim::{self, ClaimHandle};
use crate::runtime::bindings::GuestError;
use crate::runtime::bindings::v0_2::agent::homing::agent::queue;

/// The longest `claim-next` waits on the work signal before checking the store again: signals
/// are hints (another process writes the same store without signalling this one).
const CLAIM_RECHECK: Duration = Duration::from_millis(250);

impl queue::Host for GuestState {
    async fn claim_next(
        &mut self,
        wait_ms: u32,
    ) -> wasmtime::Result<Result<Option<Resource<ClaimHandle>>, GuestError>> {
        if self.plugin.shutdown.load(Ordering::SeqCst) || self.plugin.retired.load(Ordering::SeqCst)
        {
            return Ok(Ok(None));
        }
        if let Some(first) = self.first_claim.take() {
            self.begin(&first);
            return Ok(Ok(Some(self.table.push(first)?)));
        }
        if self.claims_left == 0 {
            return Ok(Ok(None));
        }
        let wait = Duration::from_millis(u64::from(wait_ms)).min(MAX_CLAIM_WAIT);
        let until = Instant::now() + wait;
        let plugin = self.plugin.clone();
        let signal = plugin.store.mailbox.work_signal();
        loop {
            let notified = signal.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match claim::claim_for(&plugin.claimer()).await {
                Ok(Some(claim)) => {
                    self.claims_left -= 1;
                    self.begin(&claim);
                    return Ok(Ok(Some(self.table.push(claim)?)));
                }
                Ok(None) => {}
                Err(e) => return Ok(Err(guest_error(e))),
            }
            let now = Instant::now();
            if now >= until
                || plugin.shutdown.load(Ordering::SeqCst)
                || plugin.retired.load(Ordering::SeqCst)
            {
                return Ok(Ok(None));
            }
            let nap = (until - now).min(CLAIM_RECHECK);
            let _ = tokio::time::timeout(nap, notified).await;
        }
    }
}
