//! Write Homing agents in Rust.
//!
//! A Homing agent is a WebAssembly component that the Homing host runs against its durable
//! mailbox. This crate wraps the bindings that `wit-bindgen` generates from the contract
//! (`wit/homing.wit`, package `homing:agent@0.2.1`, a copy the crate carries) in plain Rust:
//! a handler is a trait impl and one macro call.
//!
//! ```no_run
//! use homing_guest::{Claim, Handler};
//!
//! struct Echo;
//!
//! impl Handler for Echo {
//!     fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
//!         homing_guest::info!("echoing {} bytes", claim.payload().len());
//!         Ok(claim.payload().to_vec())
//!     }
//! }
//!
//! homing_guest::export_handler!(Echo);
//! ```
//!
//! # The two worlds
//!
//! - **`handler`** (feature `handler`, the default): the host claims a dispatch and calls
//!   [`Handler::handle`] once for it; the return value settles it. See [`handler`].
//! - **`agent`** (feature `agent`): the host calls [`Agent::run`] once, and it takes work with
//!   [`claim_next`] and settles each claim itself. See [`agent`].
//!
//! A guest crate enables the feature of the world it exports and invokes that world's export
//! macro once. Both features may be on together (cargo unifies features across a workspace);
//! the component still exports only the world whose macro it invoked.
//!
//! # The pieces
//!
//! - [`Claim`] ([`claim`]): the dispatch being handled: its [`DispatchInfo`], settling
//!   (`complete`, `ack`, `nack`, `dead_letter`), progress (`record_start`, `record_result`),
//!   the thread log (`append`, `append_expected`, `read_log`, `log_latest`), the thread's
//!   inbox (`next_message`, `messages`, `ack_message`) and follow-ups (`enqueue`).
//! - [`waitpoint`]: waiting for a person or a webhook without holding a worker
//!   ([`Claim::wait_for`], [`Wait`], [`Waitpoint`]; the calls under it: `waitpoint`,
//!   `waitpoints`, `await_waitpoint`, `suspend`).
//! - [`step`](mod@step): memoized steps ([`Claim::step`], [`Claim::step_bytes`]): work run
//!   once per dispatch and answered from the host on its retries and resumes.
//! - [`mcp`]: tools of the plugin's MCP servers, called through the host, which holds their
//!   credentials and asks a person first where the plugin says so ([`Claim::mcp_call`],
//!   [`Claim::mcp_call_or_suspend`], [`Claim::mcp_tools`]).
//! - [`Enqueue`] ([`enqueue`](mod@enqueue)): a builder for follow-up dispatches, sent with
//!   [`Claim::enqueue`] or the free function [`enqueue()`].
//! - [`Error`] ([`error`](mod@error)): why the host refused a call, mirroring the WIT `error` variant.
//! - [`logging`]: the host's log, through [`info!`], [`warn!`] and the other macros.
//! - [`json`] (feature `json`): typed JSON payloads with serde.
//! - [`http`] (feature `http`): outbound HTTP requests over `wasi:http`, to the origins the
//!   plugin's `allowed_outbound_hosts` allows.
//! - [`config`] (feature `config`): the plugin's variables and secrets over `wasi:config`.
//!
//! # Building
//!
//! Make the guest a `cdylib` and build it with
//! `cargo build --release --target wasm32-wasip2`; the output `.wasm` is already a
//! component (`homing build` does both, and `homing new NAME --lang rust` writes a crate set up
//! this way). The crate carries its own copy of the contract in `wit/`, so it builds from a
//! registry or a packaged copy as well as from the Homing repository.

// The crate docs link every world's items; with a feature off, its links have no target.
#![cfg_attr(
    not(all(
        feature = "handler",
        feature = "agent",
        feature = "json",
        feature = "http",
        feature = "config"
    )),
    allow(rustdoc::broken_intra_doc_links)
)]

#[cfg(not(any(feature = "handler", feature = "agent")))]
compile_error!("homing-guest needs a world: enable the feature `handler` or `agent`");

#[doc(hidden)]
#[path = "bindings.rs"]
pub mod __bindings;

#[cfg(feature = "agent")]
pub mod agent;
pub mod claim;
#[cfg(feature = "config")]
pub mod config;
pub mod enqueue;
pub mod error;
#[cfg(feature = "handler")]
pub mod handler;
#[cfg(feature = "json")]
pub mod history;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "json")]
pub mod json;
pub mod logging;
pub mod mcp;
pub mod step;
pub mod waitpoint;

#[cfg(feature = "agent")]
pub use agent::{Agent, claim_next};
pub use claim::{
    Claim, DispatchInfo, Item, LogEntry, LogRange, Message, MessageKind, MessageNote, StopReason,
    TurnEvent, TurnMark, unmasked,
};
pub use enqueue::{Enqueue, Gather, enqueue};
pub use error::Error;
#[cfg(feature = "handler")]
pub use handler::Handler;
pub use logging::Level;
pub use mcp::{McpOutcome, McpResult, McpTool};
pub use waitpoint::{Wait, Waitpoint, WaitpointState, WaitpointToken};

/// Compiles the README's examples as doctests, so the documented handler keeps building.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
