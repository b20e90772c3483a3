//! The engine: the one wasmtime `Config` of the host, the pooling allocator, and the epoch
//! ticker that bounds how long a guest runs past its deadline or its claim.
//!
//! [`Runtime::new`] is the one place a wasmtime `Config` is built, so compiled artifacts in the
//! cache always match the engine that loads them. Epoch interruption is always on: a ticker
//! thread bumps the epoch every [`EPOCH_TICK`], and each store's epoch callback (see
//! [`Runtime::new_store`]) checks the dispatch's deadline and its claim's stop request, then
//! yields to tokio.
//!
//! The pooling allocator makes a fresh instance per dispatch cheap (memories are reused, reset
//! by madvise, rather than mapped anew). It needs a large virtual address reservation; with
//! `pooling = "auto"` the runtime tries it and falls back to on-demand allocation when the
//! machine refuses, and says which it uses in the log.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use tracing::{info, warn};
use wasmtime::{Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::Runtime;
use crate::config::{Config, Pooling};

/// How often the epoch ticks: the granularity of timeouts and cancellation.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Bytes of each pooled linear memory reset with memset rather than returned to the kernel.
pub const KEEP_RESIDENT: usize = 2 << 20;

/// Bumps the engine's epoch until dropped.
pub(super) struct EpochTicker {
    stop: Arc<AtomicBool>,
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl EpochTicker {
    /// Starts the ticker thread of `engine`.
    fn start(engine: &Engine) -> anyhow::Result<EpochTicker> {
        let stop = Arc::new(AtomicBool::new(false));
        let ticker_engine = engine.clone();
        let ticker_stop = stop.clone();
        std::thread::Builder::new()
            .name("homing-epoch".into())
            .spawn(move || {
                while !ticker_stop.load(Ordering::SeqCst) {
                    std::thread::sleep(EPOCH_TICK);
                    ticker_engine.increment_epoch();
                }
            })
            .context("cannot start the epoch ticker thread")?;
        Ok(EpochTicker { stop })
    }
}

impl Runtime {
    /// Builds the engine for `config`'s plugins.
    ///
    /// # Errors
    ///
    /// When wasmtime refuses the configuration (pooling requested with `on` but unavailable).
    pub fn new(config: &Config) -> anyhow::Result<Runtime> {
        let fuel = config.plugins.values().any(|p| p.fuel.is_some());
        let max_memory = config
            .plugins
            .values()
            .map(|p| p.memory)
            .max()
            .unwrap_or(64 << 20);
        let instances: u32 = config
            .plugins
            .values()
            .map(|p| p.concurrency)
            .sum::<u32>()
            .max(1);
        let (engine, pooling) = match config.host.pooling {
            Pooling::Off => (Engine::new(&engine_config(fuel, None))?, false),
            Pooling::On => (
                Engine::new(&engine_config(fuel, Some((max_memory, instances))))?,
                true,
            ),
            Pooling::Auto => match Engine::new(&engine_config(fuel, Some((max_memory, instances))))
            {
                Ok(engine) => (engine, true),
                Err(e) => {
                    warn!("pooling allocator unavailable ({e:#}); using on-demand allocation");
                    (Engine::new(&engine_config(fuel, None))?, false)
                }
            },
        };
        info!(
            pooling,
            "wasmtime engine ready ({} allocation)",
            if pooling { "pooling" } else { "on-demand" }
        );
        let ticker = EpochTicker::start(&engine)?;
        Ok(Runtime {
            engine,
            pooling,
            cache_dir: config.cache_dir(),
            max_component_size: config.host.max_component_size,
            _ticker: ticker,
        })
    }

    /// Whether the pooling allocator is in use.
    pub fn pooling(&self) -> bool {
        self.pooling
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

/// The one wasmtime `Config` of the host. `pooling` is `(largest memory cap, instances)`.
fn engine_config(fuel: bool, pooling: Option<(u64, u32)>) -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    config.consume_fuel(fuel);
    if let Some((max_memory, instances)) = pooling {
        let mut pool = PoolingAllocationConfig::default();
        // Room for every worker's instance plus slack for instances being torn down.
        let components = instances.saturating_mul(2).clamp(16, 1_000);
        pool.total_component_instances(components);
        // Interpreted-language guests (Python, JS) carry many core modules per component.
        pool.max_core_instances_per_component(64);
        pool.max_memories_per_component(16);
        pool.max_tables_per_component(64);
        pool.total_core_instances(components.saturating_mul(16));
        pool.total_memories(components.saturating_mul(4));
        pool.total_tables(components.saturating_mul(16));
        pool.max_memory_size(usize::try_from(max_memory).unwrap_or(usize::MAX));
        // Reset small memories and tables with memset instead of madvise: a fresh instance per
        // dispatch otherwise pays a TLB shootdown across cores on every teardown (measured: the
        // largest kernel cost of the tokio workers end to end). Batched decommits do the same
        // for whatever lies beyond.
        pool.linear_memory_keep_resident(KEEP_RESIDENT);
        pool.table_keep_resident(KEEP_RESIDENT / 16);
        pool.decommit_batch_size(16);
        // With the kernel's PAGEMAP_SCAN (Linux 6.7+) the reset touches only the pages the
        // instance dirtied instead of memsetting all of `KEEP_RESIDENT`: the echo guest's
        // fresh-instance start went from 32 µs to 11 µs (its 1 MiB stack is mostly untouched).
        pool.pagemap_scan(wasmtime::Enabled::Auto);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    config
}
