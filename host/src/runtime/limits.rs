//! Per-instance resource limits: a cap on total linear memory across every memory of the
//! component (a Python guest has many core modules sharing memories; a per-memory cap would
//! let it use several times its budget), and a bound on tables and instances.

use wasmtime::ResourceLimiter;

/// Most table elements a guest table may grow to.
pub const MAX_TABLE_ELEMENTS: usize = 1 << 20;
/// Most instances (core and component) in one store.
pub const MAX_INSTANCES: usize = 1_000;
/// Most tables and memories in one store.
pub const MAX_TABLES_AND_MEMORIES: usize = 1_000;

/// Caps the sum of all linear memories of one instance.
#[derive(Debug, Clone)]
pub struct MemoryLimiter {
    cap: u64,
    used: u64,
    /// Set when a growth was refused, for the error message.
    pub refused: bool,
}

impl MemoryLimiter {
    /// A limiter allowing `cap` bytes in total.
    pub fn new(cap: u64) -> Self {
        MemoryLimiter {
            cap,
            used: 0,
            refused: false,
        }
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let grow = desired.saturating_sub(current) as u64;
        if self.used.saturating_add(grow) > self.cap {
            self.refused = true;
            return Ok(false);
        }
        self.used += grow;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn tables(&self) -> usize {
        MAX_TABLES_AND_MEMORIES
    }

    fn memories(&self) -> usize {
        MAX_TABLES_AND_MEMORIES
    }
}
