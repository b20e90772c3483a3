//! `waitpoint-sdk-probe`: waits on waitpoints through the Rust SDK's helpers (`wait_for_with`,
//! `await_waitpoint`), for the guest-side waitpoint tests (`host/tests/integration/waitpoints.rs`).
//!
//! The payload is a command:
//!
//! - `wait <name> <timeout-ms> [notify-url]`: `Claim::wait_for_with` on the waitpoint `name`.
//!   When the host hands out a token, appends `waiting on <name> (<id>)` to the thread log and,
//!   with a notify URL, POSTs `{"waitpoint", "name", "token", "callback_url"}` to it (a
//!   failed POST fails the run, which is then retried). While pending the run suspends. Once
//!   the waitpoint is settled, the resumed run appends and completes with `<name> <state> by
//!   <settled-by> after <n> resume(s): <completion text>`.
//! - `await <name> <timeout-ms> <wait-ms>`: creates the waitpoint and waits in place
//!   (`Claim::await_waitpoint`), holding the worker; completes with `<name> <state> in place:
//!   <completion text>`.

use std::time::Duration;

use homing_guest::http::Request;
use homing_guest::{Claim, Handler, Wait, Waitpoint, WaitpointState};
use serde_json::json;

struct Probe;

fn ms(arg: Option<&str>) -> Result<Duration, String> {
    let ms: u64 = arg
        .ok_or("missing milliseconds")?
        .parse()
        .map_err(|e| format!("bad milliseconds: {e}"))?;
    Ok(Duration::from_millis(ms))
}

fn state(w: &Waitpoint) -> &'static str {
    match w.state {
        WaitpointState::Pending => "pending",
        WaitpointState::Completed => "completed",
        WaitpointState::TimedOut => "timed-out",
        WaitpointState::Cancelled => "cancelled",
    }
}

fn wait(
    claim: &Claim,
    name: &str,
    timeout: Duration,
    notify: Option<&str>,
) -> Result<Vec<u8>, String> {
    let wait = claim.wait_for_with(name, timeout, &[("probe", "wait")], |waitpoint, token| {
        claim.append(format!("waiting on {name} ({})", waitpoint.id))?;
        let Some(url) = notify else {
            return Ok::<(), String>(());
        };
        let body = json!({
            "waitpoint": waitpoint.id,
            "name": waitpoint.name,
            "token": token.secret(),
            "callback_url": token.callback_url(),
        });
        let response = Request::post(url)
            .timeout(Duration::from_secs(10))
            .json(&body)?
            .send()?;
        if !response.is_success() {
            return Err(format!("the notify URL answered {}", response.status));
        }
        Ok(())
    })?;
    let Some(waitpoint) = wait.waitpoint() else {
        // Suspended: the return value is ignored.
        return Ok(Vec::new());
    };
    let line = format!(
        "{name} {} by {} after {} resume(s): {}",
        state(waitpoint),
        waitpoint.settled_by.as_deref().unwrap_or("?"),
        claim.resumes(),
        waitpoint.text()
    );
    claim.append(&line)?;
    if let Wait::Completed(w) = &wait {
        // The completion is JSON when the dashboard's buttons sent it; the probe only checks
        // that the typed reader agrees with the text.
        if let Ok(value) = w.completion_json::<serde_json::Value>() {
            homing_guest::info!("completion of {name} is JSON: {value}");
        }
    }
    Ok(line.into_bytes())
}

impl Handler for Probe {
    fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
        let payload = claim.payload_str()?.to_owned();
        let mut words = payload.split_whitespace();
        match words.next() {
            Some("wait") => {
                let name = words.next().ok_or("missing name")?;
                let timeout = ms(words.next())?;
                wait(claim, name, timeout, words.next())
            }
            Some("await") => {
                let name = words.next().ok_or("missing name")?;
                let timeout = ms(words.next())?;
                let hold = ms(words.next())?;
                let created = claim.waitpoint(name, timeout, &[("probe", "await")])?;
                let w = claim.await_waitpoint(&created.id, hold)?;
                Ok(format!("{name} {} in place: {}", state(&w), w.text()).into_bytes())
            }
            other => Err(format!("unknown command {other:?}")),
        }
    }
}

homing_guest::export_handler!(Probe);
