//! Time is an input the host owns: stores read `now` from a [`Clock`], never from a caller.
//!
//! Production uses [`SystemClock`]; tests use [`ManualClock`] and move time by hand, so lease
//! expiry and delays are tested without sleeping. A store shared by several hosts (NATS) reads
//! its server's time instead, through a [`ServerClock`]: then a host whose own clock is hours off
//! neither fires a schedule early nor takes a live lease (docs/contract.md, "The store's clock").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A duration in the store's unit, whole milliseconds, saturating at `u64::MAX`: the one
/// conversion between the host's `Duration`s and the store's millisecond times.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A source of Unix-millisecond timestamps.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;

    /// A store tells its clock the time its server stamped on something (`server_ms`), read at
    /// `received`. A clock that keeps its own time ignores it; a [`ServerClock`] follows it.
    fn observe_server(&self, server_ms: u64, received: Instant) {
        let _ = (server_ms, received);
    }
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

/// How far a reading may run past the server's time per millisecond elapsed since the last
/// stamp: the monotonic clock is assumed up to 100 parts per million fast, so an estimate runs
/// behind the server, never ahead, however long no stamp arrives.
const DRIFT_DIVISOR: u64 = 10_000;

/// The server's time, as the latest stamps it put on messages show it, carried forward by this
/// machine's monotonic clock.
///
/// A stamp is read after the server wrote it, so `stamp + time since it was read` is at most
/// the server's time now: every reading is a lower bound of the server's clock (less the
/// network's latency), whatever this machine's wall clock says. Of the stamps seen, the one
/// giving the latest reading is kept: an old message delivered late (a replay) cannot move the
/// clock back. Before the first stamp the local clock answers; a store makes its first stamp
/// when it connects, before anything reads the time.
#[derive(Debug)]
pub struct ServerClock {
    local: SharedClock,
    anchor: Mutex<Option<Anchor>>,
    latest: AtomicU64,
}

#[derive(Debug, Clone, Copy)]
struct Anchor {
    at: Instant,
    server_ms: u64,
}

impl Anchor {
    /// The server's time at `now`, by this stamp.
    fn reading(&self, now: Instant) -> u64 {
        let elapsed = millis(now.saturating_duration_since(self.at));
        self.server_ms
            .saturating_add(elapsed - elapsed / DRIFT_DIVISOR)
    }
}

impl ServerClock {
    /// A clock following the server's stamps, answering from the machine's clock until the
    /// first: what every NATS store of a host, the CLI and the bench reads.
    pub fn system() -> Arc<Self> {
        ServerClock::over(Arc::new(SystemClock))
    }

    /// A clock following the server's stamps, answering from `local` until the first.
    pub fn over(local: SharedClock) -> Arc<Self> {
        Arc::new(ServerClock {
            local,
            anchor: Mutex::new(None),
            latest: AtomicU64::new(0),
        })
    }

    fn reading_at(&self, now: Instant) -> Option<u64> {
        let anchor = *self.anchor.lock().unwrap_or_else(PoisonError::into_inner);
        anchor.map(|a| never_backwards(&self.latest, a.reading(now)))
    }

    fn observe_at(&self, server_ms: u64, received: Instant, now: Instant) {
        let stamp = Anchor {
            at: received,
            server_ms,
        };
        let mut anchor = self.anchor.lock().unwrap_or_else(PoisonError::into_inner);
        let later = match *anchor {
            Some(current) => stamp.reading(now) >= current.reading(now),
            None => true,
        };
        if later {
            *anchor = Some(stamp);
        }
    }
}

impl Clock for ServerClock {
    fn now_ms(&self) -> u64 {
        self.reading_at(Instant::now())
            .unwrap_or_else(|| self.local.now_ms())
    }

    fn observe_server(&self, server_ms: u64, received: Instant) {
        self.observe_at(server_ms, received, Instant::now());
    }
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
    fn a_server_clock_reads_the_servers_time_whatever_the_local_one_says() {
        // The local clock is six hours ahead of the server.
        let server_now = 1_700_000_000_000;
        let local = ManualClock::new(server_now + 6 * 3_600_000);
        let clock = ServerClock::over(local);
        assert_eq!(clock.now_ms(), server_now + 6 * 3_600_000, "no stamp yet");
        let t0 = Instant::now();
        clock.observe_at(server_now, t0, t0);
        assert_eq!(clock.reading_at(t0), Some(server_now));
        // Ten seconds on: the stamp carried forward, a millisecond behind for the drift bound.
        let later = t0 + Duration::from_secs(10);
        assert_eq!(clock.reading_at(later), Some(server_now + 9_999));
        // A message stamped a minute ago and delivered now (a replay) does not move it back.
        clock.observe_at(server_now - 50_000, later, later);
        assert_eq!(clock.reading_at(later), Some(server_now + 9_999));
        // A fresher stamp ahead of the estimate moves it forward.
        clock.observe_at(server_now + 10_050, later, later);
        assert_eq!(clock.reading_at(later), Some(server_now + 10_050));
        // Readings never run backwards, even from an earlier instant.
        assert_eq!(clock.reading_at(t0), Some(server_now + 10_050));
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
