//! Homing: a host for sandboxed AI-agent plugins.
//!
//! Agents are WebAssembly components (WASI p2) that the host runs over a durable mailbox of
//! dispatches and a per-thread log.
//!
//! # Module map
//!
//! Dependencies run one way, down this list; each layer uses only the layers below it:
//!
//! - [`cli`] — the `homing` command: run a host, enqueue and inspect work;
//! - [`bench`] — `homing bench`, the measurements (uses every layer below, like a user);
//! - [`api`] — the HTTP API, health checks and `/metrics` that `homing run` serves, and the
//!   dashboard;
//! - [`supervisor`] — workers per plugin (claim, run, settle what the guest left unsettled),
//!   the sweeper, the schedules' tick worker, shutdown;
//! - [`runtime`] — the wasmtime engine, plugin loading, the call paths, limits, and in
//!   [`runtime::host`] the host side of the WIT imports, one file per interface;
//! - [`claim`] — a claimed dispatch as the host holds it: the claim handle, its stop requests,
//!   the lease guard, settlement and retry time, and claiming;
//! - [`work`] — what the API, the CLI and guests do with work, written once: a request made a
//!   checked dispatch, cancel, retry, waiting until a dispatch is terminal, and schedules;
//! - [`live`] — the live hub (beside `work`): what running claims stream, buffered per claim,
//!   persisted in batches and handed to watchers;
//! - [`telemetry`] — Prometheus metrics: their names, the recorder, the timed store and the
//!   queue gauges;
//! - [`store`] — the mailbox and sequence-store contract (docs/contract.md), the decisions made
//!   once (`store::rules`), and the two backends, `embedded` (SQLite) and `nats` (JetStream);
//! - [`config`] — `homing.toml`;
//! - [`tls`] — client TLS setup (web roots and `tls_ca` files), for guests' HTTPS and the
//!   trace exporter;
//! - [`input`] — bounded reads of files and pipes.
//!
//! Beside them, [`natsd`] starts a local `nats-server` for `homing bench` and the test suites.

pub mod api;
pub mod bench;
pub mod claim;
pub mod cli;
pub mod config;
pub mod input;
pub mod live;
pub mod natsd;
pub mod runtime;
mod scratch;
pub mod store;
pub mod supervisor;
pub mod telemetry;
pub mod tls;
pub mod work;
