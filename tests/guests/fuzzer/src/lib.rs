//! `fuzzer`: a handler-world guest that makes a random sequence of WIT calls per dispatch.
//!
//! The payload is `<seed>:<steps>`. Each attempt seeds a splitmix64 generator from the seed
//! and its attempt number, makes `steps` random calls through its claim (every claim method,
//! in random order, with random and extreme arguments, including calls after it settled the
//! claim), `mailbox.enqueue` and `log.write`, and checks each outcome against what the
//! contract says it must be. It then logs one summary line (`FUZZSUM {json}`: its outcome
//! counts, what it settled and when, what it appended and enqueued, the violations it saw)
//! and returns: when it did not settle, `ok(summary)` (the host completes with it) or now and
//! then `err` (the host nacks). `host/tests/fuzz.rs` checks the summaries against the store.
//!
//! The guest never panics: a panic would hide the calls it made.

// Shared by `fuzzer` and `fuzzer-agent`; each uses part of it.
#[allow(dead_code)]
mod fuzz;

use homing_guest::__bindings::handler_world::exports::homing::agent::handle::Guest;
use homing_guest::__bindings::mailbox::Claim;

struct Fuzzer;

impl Guest for Fuzzer {
    fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
        let mut run = fuzz::Run::start(claim, "handler", "fuzzer");
        while run.left > 0 {
            run.step(claim);
        }
        let returns_ok = run.rng().chance(75);
        let end = match run.settled_end() {
            Some(end) => end,
            None if returns_ok => "ret-ok",
            None => "ret-err",
        };
        let summary = run.report(end);
        if returns_ok {
            Ok(summary.into_bytes())
        } else {
            Err(fuzz::odd(run.rng(), 4))
        }
    }
}

homing_guest::__bindings::handler_world::__export_handler_world!(
    Fuzzer with_types_in homing_guest::__bindings::handler_world
);
