//! The plugin runtime: one wasmtime engine, plugins compiled once, a fresh instance per dispatch.
//!
//! - `engine` — the one wasmtime `Config`, the pooling allocator and the epoch ticker;
//! - `plugin` — loading a plugin (compile or cache, detect its world, link, pre-instantiate)
//!   and the fresh store of each instance, with its WASI grants, limits and epoch callback;
//! - `call` — the call paths: `handle`, `run`, and a bare instance start;
//! - [`host`] — the host side of the WIT imports, one file per interface;
//! - [`mcp`] — the MCP broker of a plugin: its servers, their sessions and tool lists;
//! - [`bindings`], [`cache`], [`limits`] — the generated bindings, the compiled-artifact cache,
//!   the memory limiter.
//!
//! Epoch interruption is always on: a guest in a tight loop is stopped within a tick
//! ([`EPOCH_TICK`]) of its deadline, and a guest whose claim was lost or whose thread was
//! interrupted is cancelled within a tick of the lease guard noticing. A tokio timeout around
//! every call covers the other way a call can hang: a host import that waits.
//!
//! The runtime sits on the claim layer (a guest's `claim` resource is a
//! [`ClaimHandle`](crate::claim::ClaimHandle)) and knows nothing of workers or the CLI.

pub mod bindings;
pub mod cache;
mod call;
mod engine;
pub mod host;
pub mod limits;
pub mod mcp;
pub mod outbound;
mod output;
mod plugin;

use std::path::PathBuf;

use wasmtime::Engine;

pub use call::{CALL_TIMEOUT_SLACK, CallEnd, HandlerRun, WarmInstance};
pub use engine::{EPOCH_TICK, KEEP_RESIDENT};
pub use plugin::{Contract, Plugin, World, detect_contract, detect_world};

/// `with_context` for wasmtime's own error type.
pub(crate) trait WasmContext<T> {
    /// Wraps the error with a message, as an `anyhow::Error`.
    fn wasm_context<C: std::fmt::Display + Send + Sync + 'static>(
        self,
        f: impl FnOnce() -> C,
    ) -> anyhow::Result<T>;
}

impl<T> WasmContext<T> for Result<T, wasmtime::Error> {
    fn wasm_context<C: std::fmt::Display + Send + Sync + 'static>(
        self,
        f: impl FnOnce() -> C,
    ) -> anyhow::Result<T> {
        self.map_err(|e| anyhow::Error::from(e).context(f()))
    }
}

/// The engine and what every plugin shares.
pub struct Runtime {
    engine: Engine,
    pooling: bool,
    cache_dir: PathBuf,
    max_component_size: u64,
    _ticker: engine::EpochTicker,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("pooling", &self.pooling)
            .finish_non_exhaustive()
    }
}
