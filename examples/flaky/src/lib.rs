//! `flaky`: fails on purpose, to exercise retries and dead-lettering.
//!
//! - `fail-until:<n>`: fails while the attempt (failed attempts so far, from 0) is below `n`,
//!   then succeeds with `ok after <attempt> failures`.
//! - `always`: always fails, so the dispatch dead-letters at the attempt limit.
//! - anything else: fails the first attempt only.

use homing_guest::{Claim, Handler};

/// The handler.
struct Flaky;

impl Handler for Flaky {
    fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
        let attempt = claim.attempt();
        let payload = String::from_utf8_lossy(claim.payload());
        let failures_wanted = match payload.trim() {
            "always" => u32::MAX,
            other => other
                .strip_prefix("fail-until:")
                .and_then(|n| n.parse().ok())
                .unwrap_or(1),
        };
        if attempt < failures_wanted {
            homing_guest::info!("failing attempt {attempt} on purpose");
            return Err(format!("failing on purpose (attempt {attempt})"));
        }
        Ok(format!("ok after {attempt} failures").into_bytes())
    }
}

homing_guest::export_handler!(Flaky);
