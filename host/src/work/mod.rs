//! What every entry point does with work, written once: the API, the CLI and a guest each
//! turn their own kind of request into a [`Request`], which [`Request::into_dispatch`] makes a
//! checked [`NewDispatch`](crate::store::NewDispatch); the API, the CLI and the dashboard
//! [`cancel`] and [`retry`] through here, and the API's long poll and `homing enqueue --wait`
//! wait for a dispatch to finish with [`until_terminal`].
//!
//! This layer sits on the store and the config: it knows nothing of HTTP, the command line or
//! the WIT. Each caller keeps what is its own (how it reads its input, its caps, the names of
//! its fields in errors, the metadata the host adds for it) and maps [`OpError`] and the
//! refusals of [`Request::into_dispatch`] to its statuses, exit codes or guest errors.
//!
//! - `request`: a request for a new dispatch, and the attempts it gets;
//! - `ops`: cancel and retry;
//! - `wait`: waiting until a dispatch is terminal;
//! - `messages`: sending a message into a thread's inbox and waiting for its acknowledgement;
//! - `waitpoints`: completing and cancelling waitpoints (the token check, the store call, the
//!   metric), how a reader sees one, and a guest waiting in place for one to settle;
//! - `journal`: how a reader sees a dispatch's journal (its call entries and steps);
//! - `flow`: pausing and resuming an agent's claims, and how its flow control stands;
//! - `schedules`: schedules and their ticks (docs/contract.md section 16);
//! - `arguments`: a tool's arguments checked against its input schema (MCP, both ways).

pub mod arguments;
pub mod flow;
pub mod journal;
pub mod messages;
mod ops;
mod request;
pub mod schedules;
mod wait;
pub mod waitpoints;

pub use ops::{OpError, cancel, retry};
pub use request::{Attempts, Request, configured_debounce};
pub use wait::until_terminal;
