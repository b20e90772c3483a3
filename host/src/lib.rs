//! Homing: a host for sandboxed AI-agent plugins.
//!
//! Agents are WebAssembly components (WASI p2) that the host runs over a durable mailbox of
//! dispatches and a per-thread log. The modules follow the architecture:
//!
//! - [`store`] — the mailbox and sequence-store contract and its backends;
//! - [`runtime`] — the wasmtime engine, plugins, limits and the host side of the WIT imports;
//! - [`supervisor`] — workers, the lease keeper, the sweeper and shutdown;
//! - [`config`] — `homing.toml`;
//! - [`cli`] — the `homing` command;
//! - [`bench`] — `homing bench`, the measurements;
//! - [`natsd`] — a local `nats-server` for `homing bench` and the test suites.

pub mod bench;
pub mod cli;
pub mod config;
pub mod natsd;
pub mod runtime;
mod scratch;
pub mod store;
pub mod supervisor;
