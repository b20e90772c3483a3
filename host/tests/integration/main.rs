//! Every integration test of the host, in one test binary so that wasmtime is linked once.
//!
//! Shared support: [`common`] (guests built from source, a scratch directory with a
//! `homing.toml`, the `homing` binary), [`natsd`] (real `nats-server` processes), [`hosts`]
//! (real `homing run` processes and the journals they leave), [`history`] (the history checker
//! of the fault tests) and [`conformance`] (the store suite, generic over a backend).
//!
//! The suites, one module each (`cargo test --release -p homing --test integration MODULE`
//! runs one; `cargo test conformance` runs exactly the conformance suites):
//!
//! - `embedded_conformance`, `nats_conformance`: the store suite on each backend;
//! - `embedded_store`: embedded-backend specifics;
//! - `guest_imports`: the host side of the WIT imports, called directly;
//! - `compat`: components built against `homing:agent@0.1.0` running unchanged;
//! - `faults`: fault injection at the store level, checked by the history checker;
//! - `cluster_faults`: the same checks on a three-node JetStream cluster whose stream leaders
//!   are killed and stalled while hosts claim through the gate, and one host dies;
//! - `api`: the HTTP API of a real `homing run`, called over loopback;
//! - `api_limits`: its resource limits, attacked over loopback (slow bodies, many connections,
//!   streams, token guessing);
//! - `openapi_client`: a Python client generated from the served OpenAPI description
//!   (`openapi-python-client`) enqueuing, waiting and completing waitpoints through the API;
//! - `mcp_broker`: MCP tools brokered by the host for guests, against an MCP server built with
//!   the official MCP Python SDK: refusals, approvals, a journaled retry, SIGKILLs, the bearer
//!   kept out of sight, on both stores;
//! - `mcp_endpoint`: agents as MCP tools, driven by the official MCP Python SDK in both protocol
//!   eras (2025-11-25 and 2026-07-28), a waitpoint answered through `homing_respond` and through
//!   `input_required`, and each refusal over raw HTTP, on both backends;
//! - `openai_endpoint`: the OpenAI-compatible endpoint as the official `openai` Python SDK uses
//!   it, plain and streamed, two turns of one conversation on one thread, on both backends;
//! - `dashboard`: the web dashboard of a real `homing run`, in a headless Chromium ([`browser`]);
//! - `e2e`, `polyglot`: the `homing` binary with real components;
//! - `inbox`: a thread's inbox end to end: messages that wake, steer and outlive a run;
//! - `waiting`: waitpoints end to end, host side: waiters that hold no worker, restarts, a host
//!   killed before suspending, two NATS hosts;
//! - `journal_view`: a dispatch's journal through the API, the CLI and the dashboard of a real
//!   `homing run`;
//! - `flow_hosts`: flow control across real hosts: a rate, a concurrency key (with a host
//!   SIGKILLed holding slots), an origin limit and a pause on two NATS hosts; fairness across
//!   keys on the embedded store;
//! - `flow_surface`: pausing and resuming agents and concurrency keys at enqueue, through the
//!   API, the CLI and the dashboard of a real `homing run`;
//! - `waitpoints`: waitpoints through the API and the CLI of a real `homing run` (the
//!   dashboard's Waiting page is in `dashboard`);
//! - `waitpoint_guests`: runs that wait for a person or a webhook: Rust, Python and JavaScript guests
//!   and the approval example suspended, completed from outside (token, CLI, API) or timed
//!   out, and resumed;
//! - `journal_runs`, `journal_guests`: journaled runs whose retries are answered from the
//!   journal (no second model call, no second log append): the Rust `journal-probe` guest, then
//!   the Python and JavaScript agents;
//! - `outbound_http`: guests' HTTP(S) requests, allow-list, address rules, TLS, caps, secrets;
//! - `outbound_guests`: outbound HTTP and variables from Rust, Python and JavaScript guests and
//!   the assistant example, against local servers on the loopback address;
//! - `new_and_build`: `homing new` and `homing build` in every language, outside the
//!   repository, from nothing to acked dispatches; the SDK packages;
//! - `bounded_input`: endless or huge inputs refused fast, memory watched;
//! - `thread_reads`: many readers of a thread's large inbox, page and log stream leave the
//!   host's memory within the routes' byte caps;
//! - `bounded_reads`: routes whose cost is set by stored data (journals, waitpoints) read a
//!   bounded number of bytes, and concurrent readers of large data leave memory flat;
//! - `nats_hosts`: many hosts on one NATS store;
//! - `nats_view`: a host's view of the stream while its own write's apply is held back;
//! - `process_faults`: hosts killed at random points and restarted;
//! - `schedule_surface`: schedules from the TOML, the CLI and the API of a real `homing run` on
//!   both backends, their refusals, and a reload that removes one;
//! - `fuzz`: guests making random WIT call sequences;
//! - `hostile_input`: made-up methods, lists over big dispatches, redirects after login and
//!   names with control characters against a real `homing run`.
//!
//! Tests share one process: a `nats-server` kept in a static (by the NATS conformance suite
//! and by the fault tests) lives until the process exits, and the guests are built once.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod browser;
mod common;
mod conformance;
mod history;
mod hosts;
mod natsd;

mod api;
mod api_limits;
mod bounded_input;
mod bounded_reads;
mod cluster_faults;
mod compat;
mod dashboard;
mod e2e;
mod embedded_conformance;
mod embedded_store;
mod faults;
mod flow_control;
mod flow_hosts;
mod flow_surface;
mod fuzz;
mod guest_imports;
mod hostile_input;
mod inbox;
mod journal_guests;
mod journal_runs;
mod journal_view;
mod live_reload;
mod mcp_broker;
mod mcp_endpoint;
mod nats_clocks;
mod nats_conformance;
mod nats_hosts;
mod nats_view;
mod new_and_build;
mod openai_endpoint;
mod openapi_client;
mod outbound_guests;
mod outbound_http;
mod polyglot;
mod process_faults;
mod schedule_surface;
mod streaming;
mod thread_reads;
mod traces;
mod waiting;
mod waitpoint_guests;
mod waitpoints;
