//! `batch`: an `agent`-world guest that claims its own work and counts words.
//!
//! `run` loops over `claim_next`, records the start of each claim, completes it with
//! `words=<n>` (whitespace-separated words of the payload, read as UTF-8 with invalid bytes
//! replaced), and returns once `claim_next` gives `None`. A failure on one claim is logged and
//! the loop goes on; the host nacks the claim that was left unsettled when it is dropped.

use homing_guest::{Agent, Claim, Error, claim_next};

/// How long each `claim_next` waits for work before the agent calls it a day.
const WAIT_MS: u32 = 500;

/// The agent.
struct Batch;

impl Agent for Batch {
    fn run() -> Result<(), String> {
        let mut done = 0_u64;
        while let Some(claim) = claim_next(WAIT_MS)? {
            match count_words(&claim) {
                Ok(()) => done += 1,
                Err(error) => homing_guest::warn!("dispatch {}: {error}", claim.id()),
            }
        }
        homing_guest::info!("no more work after {done} dispatches");
        Ok(())
    }
}

/// Handles one claim: start, count, complete.
fn count_words(claim: &Claim) -> Result<(), Error> {
    claim.record_start()?;
    let words = String::from_utf8_lossy(claim.payload())
        .split_whitespace()
        .count();
    claim.complete(format!("words={words}"))
}

homing_guest::export_agent!(Batch);
