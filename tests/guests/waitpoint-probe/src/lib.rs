//! `waitpoint-probe`: waits on a waitpoint on demand, for the waitpoints' end-to-end tests.
//!
//! The payload is a command:
//!
//! - `wait <timeout-ms>`: creates (or finds) its waitpoint `approve`; while it is pending, logs
//!   `waiting <id>` (once, by the run that created it) and suspends; once it left `pending`,
//!   completes with `<state> <result>` (the result as text, `-` when none);
//! - `wait-then-hang <timeout-ms>`: as `wait`, but the first run logs `created <id>` and then
//!   waits for a stop request for up to a minute without suspending (the test kills the host
//!   meanwhile); a later run finds the same waitpoint and suspends as `wait` does;
//! - `echo <text>`: completes with the text at once.

#![allow(clippy::missing_safety_doc)]

wit_bindgen::generate!({
    path: "../../../wit",
    world: "handler",
});

use exports::homing::agent::handle::Guest;
use homing::agent::mailbox::Claim;
use homing::agent::types::{Error, WaitpointState};

struct Probe;

fn err(e: Error) -> String {
    format!("{e:?}")
}

fn state(s: WaitpointState) -> &'static str {
    match s {
        WaitpointState::Pending => "pending",
        WaitpointState::Completed => "completed",
        WaitpointState::TimedOut => "timed-out",
        WaitpointState::Cancelled => "cancelled",
    }
}

fn wait(claim: &Claim, timeout_ms: u64, hang: bool) -> Result<Vec<u8>, String> {
    let w = claim
        .waitpoint("approve", timeout_ms, &[("asks".into(), "approval".into())])
        .map_err(err)?;
    if w.state != WaitpointState::Pending {
        let result = w
            .completion
            .map(|r| String::from_utf8_lossy(&r).into_owned())
            .unwrap_or_else(|| "-".into());
        return Ok(format!("{} {result}", state(w.state)).into_bytes());
    }
    let created = w.token.is_some() && claim.info().claims == 1;
    if created {
        claim
            .append(format!("waiting {}", w.id).as_bytes())
            .map_err(err)?;
    }
    if hang && claim.info().claims == 1 {
        claim
            .append(format!("created {}", w.id).as_bytes())
            .map_err(err)?;
        // Hold the claim without suspending: the test kills the host meanwhile.
        for _ in 0..600 {
            if claim.stop_requested().is_some() {
                break;
            }
            let _ = claim.next_message(100);
        }
        return Err("hung up without suspending".into());
    }
    claim.suspend().map_err(err)?;
    Ok(Vec::new())
}

impl Guest for Probe {
    fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
        let payload = String::from_utf8_lossy(&claim.info().payload).into_owned();
        let mut words = payload.split_whitespace();
        let command = words.next().unwrap_or("");
        let arg = words.next().unwrap_or("60000");
        match command {
            "wait" | "wait-then-hang" => {
                let timeout_ms: u64 = arg.parse().map_err(|e| format!("bad timeout: {e}"))?;
                wait(claim, timeout_ms, command == "wait-then-hang")
            }
            "echo" => Ok(arg.as_bytes().to_vec()),
            other => Err(format!("unknown command {other}")),
        }
    }
}

export!(Probe);
