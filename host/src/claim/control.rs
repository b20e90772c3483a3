//! Stop requests: how the lease keeper and the supervisor ask the guest holding a claim to stop.
//!
//! A request is one atomic byte, so the epoch callback (which runs inside the guest's call, on
//! every tick) can read it without a lock. The reasons rank: an interrupt or a lost lease is
//! final (every write through the claim would be refused, so the guest is cancelled at the next
//! tick), while a shutdown or a deadline only asks the guest to finish, and a later hard reason
//! replaces it. The runtime maps [`StopReason`] onto the WIT `stop-reason` a guest reads.

use std::sync::atomic::{AtomicU8, Ordering};

/// Why the host wants the guest holding a claim to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The claim's thread was interrupted: the store refuses the claim's writes.
    Interrupted,
    /// The lease ran out or was reclaimed: the claim belongs to someone else.
    LeaseLost,
    /// The host is shutting down: finish soon.
    Shutdown,
    /// The dispatch's time is nearly up: finish soon.
    Deadline,
    /// The run outlived `drain_timeout` on a version a reload replaced: it is stopped and its
    /// dispatch given back to the queue without an attempt.
    Drained,
}

impl StopReason {
    /// Whether the guest must be cancelled for this reason (its writes would be refused).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            StopReason::Interrupted | StopReason::LeaseLost | StopReason::Drained
        )
    }

    fn code(self) -> u8 {
        match self {
            StopReason::Interrupted => STOP_INTERRUPTED,
            StopReason::LeaseLost => STOP_LEASE_LOST,
            StopReason::Shutdown => STOP_SHUTDOWN,
            StopReason::Deadline => STOP_DEADLINE,
            StopReason::Drained => STOP_DRAINED,
        }
    }

    fn from_code(code: u8) -> Option<StopReason> {
        match code {
            STOP_INTERRUPTED => Some(StopReason::Interrupted),
            STOP_LEASE_LOST => Some(StopReason::LeaseLost),
            STOP_SHUTDOWN => Some(StopReason::Shutdown),
            STOP_DEADLINE => Some(StopReason::Deadline),
            STOP_DRAINED => Some(StopReason::Drained),
            _ => None,
        }
    }
}

const STOP_INTERRUPTED: u8 = 1;
const STOP_LEASE_LOST: u8 = 2;
const STOP_SHUTDOWN: u8 = 3;
const STOP_DEADLINE: u8 = 4;
const STOP_DRAINED: u8 = 5;

/// A run parked on an upstream status (`park_on`): the claim is given back to the queue,
/// without an attempt, when it settles as a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Park {
    /// The status that parked it.
    pub status: u16,
    /// When it may run again (store time, milliseconds).
    pub until: u64,
}

/// The stop request of one claim, shared by its holder, its lease keeper and the supervisor.
#[derive(Debug, Default)]
pub struct ClaimControl {
    /// Set when an outbound response parked the run (the latest time wins).
    park: std::sync::Mutex<Option<Park>>,
    stop: AtomicU8,
    /// Woken when a final reason is set, for host calls that wait (outbound requests).
    cancelled: tokio::sync::Notify,
    /// Woken on every stop request, for host calls that wait and return early on any reason
    /// (`next-message`).
    requested: tokio::sync::Notify,
}

impl ClaimControl {
    /// Asks the guest to stop for `reason`. The first final reason (interrupt, lost lease) wins.
    pub fn request_stop(&self, reason: StopReason) {
        let code = reason.code();
        let _ =
            self.stop
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |current| {
                    match StopReason::from_code(current) {
                        Some(held) if held.is_final() => None,
                        _ => Some(code),
                    }
                });
        if self.must_cancel() {
            self.cancelled.notify_waiters();
        }
        self.requested.notify_waiters();
    }

    /// Resolves once any stop is requested (at once if one already is).
    pub async fn stopped(&self) {
        loop {
            let woken = self.requested.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.stop_reason().is_some() {
                return;
            }
            woken.await;
        }
    }

    /// Resolves once the guest must be cancelled (at once if it already must).
    pub async fn cancelled(&self) {
        loop {
            let woken = self.cancelled.notified();
            tokio::pin!(woken);
            // Registered before the check, so a stop set in between still wakes us.
            woken.as_mut().enable();
            if self.must_cancel() {
                return;
            }
            woken.await;
        }
    }

    /// The current stop request, if any.
    pub fn stop_reason(&self) -> Option<StopReason> {
        StopReason::from_code(self.stop.load(Ordering::SeqCst))
    }

    /// Parks the run: a failure it settles with gives the dispatch back to the queue until
    /// `park.until` instead of counting an attempt.
    pub fn park(&self, park: Park) {
        if let Ok(mut held) = self.park.lock() {
            *held = Some(match *held {
                Some(before) if before.until > park.until => before,
                _ => park,
            });
        }
    }

    /// The park of this run, if an upstream status parked it.
    pub fn parked(&self) -> Option<Park> {
        self.park.lock().ok().and_then(|held| *held)
    }

    /// Whether the guest must be cancelled now (its writes would be refused anyway).
    pub fn must_cancel(&self) -> bool {
        self.stop_reason().is_some_and(StopReason::is_final)
    }
}

#[cfg(test)]
mod tests {
    use super::{ClaimControl, StopReason};

    #[test]
    fn a_final_stop_reason_is_never_replaced() {
        let control = ClaimControl::default();
        control.request_stop(StopReason::LeaseLost);
        control.request_stop(StopReason::Interrupted);
        control.request_stop(StopReason::Shutdown);
        assert_eq!(control.stop_reason(), Some(StopReason::LeaseLost));
        assert!(control.must_cancel());
    }

    #[test]
    fn a_request_to_finish_gives_way_to_a_final_reason() {
        let control = ClaimControl::default();
        assert_eq!(control.stop_reason(), None);
        control.request_stop(StopReason::Shutdown);
        assert_eq!(control.stop_reason(), Some(StopReason::Shutdown));
        assert!(!control.must_cancel());
        control.request_stop(StopReason::Interrupted);
        assert_eq!(control.stop_reason(), Some(StopReason::Interrupted));
        assert!(control.must_cancel());
    }
}
