//! The wall clock and random sources of an instance of a plugin with `journal = "run"`: each
//! read goes through the current claim's journal (`crate::claim::journal`), which answers it
//! with the earlier run's value at the same point while the run replays, and keeps it for the
//! next entry. Outside a claim, and for plugins that journal nothing, they are the defaults.
//!
//! Monotonic clocks are not journaled: they measure durations, and a replayed run is faster.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand_core::{Rng, TryRng};
use wasmtime_wasi::HostWallClock;

use crate::claim::Recorder;
use crate::claim::journal::RandomSource;

/// The journal of the claim an instance works on, shared with its clock and random sources.
#[derive(Debug, Clone, Default)]
pub struct JournalSlot(Arc<Mutex<Option<Arc<Recorder>>>>);

impl JournalSlot {
    /// Sets the current claim's journal (`None` between claims).
    pub fn set(&self, recorder: Option<Arc<Recorder>>) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = recorder;
        }
    }

    fn get(&self) -> Option<Arc<Recorder>> {
        self.0.lock().ok().and_then(|slot| slot.clone())
    }

    /// The wall clock that reads through this slot.
    pub fn wall_clock(&self) -> JournaledClock {
        JournaledClock {
            slot: self.clone(),
            inner: wasmtime_wasi::clocks::wall_clock(),
        }
    }

    /// The random source `source` that reads through this slot.
    pub fn random(&self, source: RandomSource) -> JournaledRandom {
        JournaledRandom {
            slot: self.clone(),
            source,
            inner: wasmtime_wasi::thread_rng(),
        }
    }
}

/// `wasi:clocks/wall-clock` through the journal.
pub struct JournaledClock {
    slot: JournalSlot,
    inner: Box<dyn HostWallClock + Send>,
}

impl std::fmt::Debug for JournaledClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournaledClock").finish_non_exhaustive()
    }
}

impl HostWallClock for JournaledClock {
    fn resolution(&self) -> Duration {
        self.inner.resolution()
    }

    fn now(&self) -> Duration {
        let live = self.inner.now();
        match self.slot.get() {
            Some(recorder) => recorder.wall_clock(live),
            None => live,
        }
    }
}

/// `wasi:random/random` or `wasi:random/insecure` through the journal.
pub struct JournaledRandom {
    slot: JournalSlot,
    source: RandomSource,
    inner: Box<dyn Rng + Send>,
}

impl std::fmt::Debug for JournaledRandom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournaledRandom")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl JournaledRandom {
    fn fill(&mut self, buf: &mut [u8]) {
        match self.slot.get() {
            Some(recorder) => {
                let inner = &mut self.inner;
                recorder.random(self.source, buf, |b| inner.fill_bytes(b));
            }
            None => self.inner.fill_bytes(buf),
        }
    }
}

impl TryRng for JournaledRandom {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        let mut bytes = [0; 4];
        self.fill(&mut bytes);
        Ok(u32::from_le_bytes(bytes))
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        let mut bytes = [0; 8];
        self.fill(&mut bytes);
        Ok(u64::from_le_bytes(bytes))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        self.fill(dst);
        Ok(())
    }
}
