//! Time is an input the host owns: stores read `now` from a [`Clock`], never from a caller.
//!
//! Production uses [`SystemClock`]; tests use [`ManualClock`] and move time by hand, so lease
//! expiry and delays are tested without sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A duration in the store's unit, whole milliseconds, saturating at `u64::MAX`: the one
/// conversion between the host's `Duration`s and the store's millisecond times.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A source of Unix-millisecond timestamps.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The machine's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        // A clock before 1970 reads as 0 rather than failing: leases then look expired,
        // which is the safe direction.
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(millis)
            .unwrap_or(0);
        // Never backwards within a process: when the wall clock steps back, time stands still
        // until it catches up, so a lease this host granted is never shortened by its own clock
        // and a record's times never run backwards. (Across hosts, a claim still checks each
        // dispatch's `available_at` against the time it reads.)
        static LATEST: AtomicU64 = AtomicU64::new(0);
        never_backwards(&LATEST, wall)
    }
}

/// `wall`, or the latest time already returned through `latest` when `wall` is behind it.
fn never_backwards(latest: &AtomicU64, wall: u64) -> u64 {
    latest.fetch_max(wall, Ordering::SeqCst).max(wall)
}

/// A clock tests set and advance by hand.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
    /// A jump taken right after the next reading (see [`ManualClock::advance_after_next_read`]).
    jump: AtomicU64,
}

impl ManualClock {
    /// A clock reading `start`.
    pub fn new(start: u64) -> Arc<Self> {
        Arc::new(ManualClock {
            now: AtomicU64::new(start),
            jump: AtomicU64::new(0),
        })
    }

    /// Sets the time.
    pub fn set(&self, now: u64) {
        self.now.store(now, Ordering::SeqCst);
    }

    /// Moves the time forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }

    /// Moves the time forward by `ms` just after the next reading, which still sees the time
    /// as it is: what a task descheduled right after reading the clock finds when it reads
    /// again.
    pub fn advance_after_next_read(&self, ms: u64) {
        self.jump.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        let now = self.now.load(Ordering::SeqCst);
        let jump = self.jump.swap(0, Ordering::SeqCst);
        if jump > 0 {
            self.now.fetch_add(jump, Ordering::SeqCst);
        }
        now
    }
}

/// A shared clock handle.
pub type SharedClock = Arc<dyn Clock>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_jumps_after_the_next_reading() {
        let clock = ManualClock::new(1_000);
        clock.advance_after_next_read(500);
        assert_eq!(
            clock.now_ms(),
            1_000,
            "the next reading sees the time as it was"
        );
        assert_eq!(clock.now_ms(), 1_500);
        assert_eq!(clock.now_ms(), 1_500, "one jump only");
    }

    #[test]
    fn a_wall_clock_stepping_back_holds_still_until_it_catches_up() {
        let latest = AtomicU64::new(0);
        assert_eq!(never_backwards(&latest, 5_000), 5_000);
        assert_eq!(never_backwards(&latest, 1_000), 5_000, "stepped back: held");
        assert_eq!(never_backwards(&latest, 4_999), 5_000);
        assert_eq!(
            never_backwards(&latest, 5_001),
            5_001,
            "caught up: moves again"
        );
    }
}
