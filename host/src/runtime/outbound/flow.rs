//! Flow control where a guest's request leaves the sandbox: the origin limits it honours
//! (`[limits.x]` with `origins`, listed in the plugin's `limits`) and the statuses that park
//! its run (`park_on`).
//!
//! A request to a limited origin first takes one of the limit's slots (`concurrency`), held
//! until its response body is done, then one of its tokens (`rate`); both live in the store,
//! so every host and plugin listing the limit shares them. A request over the limit waits, up
//! to the dispatch's deadline, instead of failing; an interrupt or a lost lease ends the wait.
//! A slot taken by a host that dies frees itself when the request's deadline passes.

use std::time::{Duration, Instant};

use tracing::{info, warn};
use wasmtime_wasi_http::Error as HttpError;

use super::Job;
use super::send::Target;
use crate::claim::Park;
use crate::store::Store;
use crate::work::flow::OriginLimit;

/// The longest a slot is held when the dispatch has no deadline.
const UNBOUNDED_HOLD: Duration = Duration::from_secs(600);
/// The longest one wait for a slot before asking again (a slot freed on another host wakes
/// nothing here).
const SLOT_RECHECK: Duration = Duration::from_millis(200);
/// How long a run is parked when the response names no `Retry-After`.
const DEFAULT_PARK: Duration = Duration::from_secs(10);

/// What a plugin's requests honour besides its grants.
#[derive(Debug, Clone, Default)]
pub struct Flow {
    /// Where the slots and tokens live.
    pub store: Option<Store>,
    /// The plugin's origin limits.
    pub limits: Vec<OriginLimit>,
    /// Statuses that park the run.
    pub park_on: Vec<u16>,
    /// The longest park.
    pub max_park: Duration,
}

/// A slot of an origin limit, given back when the request is done with it.
pub(super) struct SlotGuard {
    store: Store,
    scope: String,
    holder: String,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let (store, scope, holder) = (
            self.store.clone(),
            std::mem::take(&mut self.scope),
            std::mem::take(&mut self.holder),
        );
        // Not awaited here (a drop cannot); should it fail, the slot frees itself at its
        // expiry.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = store.limits.release_slot(&scope, &holder).await;
            });
        }
    }
}

impl Job {
    /// Waits for the slots and tokens of every origin limit `target` falls under.
    pub(super) async fn wait_for_limits(&mut self, target: &Target) -> Result<(), HttpError> {
        // The setup is shared (an `Arc`): cloned for the loop below, which borrows `self`.
        let outbound = self.outbound.clone();
        let Some(store) = outbound.flow.store.as_ref() else {
            return Ok(());
        };
        for limit in &outbound.flow.limits {
            if !limit
                .origins
                .iter()
                .any(|o| o.matches(target.scheme, &target.host, target.port))
            {
                continue;
            }
            let started = Instant::now();
            if let Some(cap) = limit.scope.concurrency {
                let holder = uuid::Uuid::now_v7().to_string();
                let mut nap = Duration::from_millis(10);
                loop {
                    let hold = self
                        .deadline
                        .map_or(UNBOUNDED_HOLD, |d| {
                            d.saturating_duration_since(Instant::now())
                        })
                        .max(Duration::from_millis(1));
                    let until = store.after(hold);
                    match store
                        .limits
                        .acquire_slot(&limit.scope.name, cap, &holder, until)
                        .await
                    {
                        Ok(true) => break,
                        Ok(false) => {}
                        Err(e) => return Err(self.store_failed(&e)),
                    }
                    self.wait(nap, &limit.scope.name).await?;
                    nap = (nap * 2).min(SLOT_RECHECK);
                }
                self.slots.push(SlotGuard {
                    store: store.clone(),
                    scope: limit.scope.name.clone(),
                    holder,
                });
            }
            if let Some(rate) = &limit.scope.rate {
                loop {
                    match store.limits.take_token(&limit.scope.name, rate).await {
                        Ok(None) => break,
                        Ok(Some(at)) => {
                            let nap = Duration::from_millis(at.saturating_sub(store.now()).max(1));
                            self.wait(nap, &limit.scope.name).await?;
                        }
                        Err(e) => return Err(self.store_failed(&e)),
                    }
                }
            }
            let waited = started.elapsed();
            if waited >= Duration::from_millis(1) {
                crate::telemetry::origin_wait(&self.outbound.plugin, &limit.scope.name, waited);
            }
        }
        Ok(())
    }

    /// Sleeps `nap`, ended by the dispatch's deadline or a stop of its claim.
    async fn wait(&self, nap: Duration, scope: &str) -> Result<(), HttpError> {
        let left = self
            .deadline
            .map_or(nap, |d| d.saturating_duration_since(Instant::now()));
        if left.is_zero() {
            return Err(self.refuse(
                &format!("the dispatch's time ran out waiting for limit `{scope}`"),
                HttpError::ConnectionLimitReached,
            ));
        }
        match self.bounded(nap.min(left), tokio::time::sleep(nap)).await {
            Ok(()) => Ok(()),
            Err(ended) => Err(self.ended(
                ended,
                &format!("waiting for limit `{scope}`"),
                HttpError::ConnectionLimitReached,
            )),
        }
    }

    fn store_failed(&self, e: &crate::store::StoreError) -> HttpError {
        self.refuse(
            &format!("the store could not decide an origin limit: {e}"),
            HttpError::InternalError(Some("origin limit unavailable".into())),
        )
    }

    /// Parks the run when `status` is one of the plugin's `park_on`: until the response's
    /// `Retry-After`, at most `max_park`.
    pub(super) fn park_if_asked(&self, status: u16, headers: &http::HeaderMap) {
        let flow = &self.outbound.flow;
        if !flow.park_on.contains(&status) {
            return;
        }
        let (Some(control), Some(store)) = (&self.control, &flow.store) else {
            return;
        };
        let wait = retry_after(headers)
            .unwrap_or(DEFAULT_PARK)
            .min(flow.max_park);
        control.park(Park {
            status,
            until: store.after(wait),
        });
        info!(
            plugin = %self.outbound.plugin,
            dispatch = %self.dispatch,
            attempt = self.attempt,
            origin = %self.origin,
            status,
            park_ms = wait.as_millis() as u64,
            "outbound response parks the run (park_on): a failure of this attempt counts none"
        );
        if wait == flow.max_park {
            warn!(plugin = %self.outbound.plugin, dispatch = %self.dispatch, "park capped at max_park");
        }
    }
}

/// A `Retry-After` header: seconds, or an HTTP date.
fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(std::time::SystemTime::now())
            .unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let mut h = http::HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(http::header::RETRY_AFTER, "2".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert(
            http::header::RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&h), Some(Duration::ZERO));
        h.insert(http::header::RETRY_AFTER, "soon".parse().unwrap());
        assert_eq!(retry_after(&h), None);
    }
}
