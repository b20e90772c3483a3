//! `steerable`: an agent that works in steps and changes course when a person steers it.
//!
//! The payload is a goal (UTF-8 text). The agent works on it in [`STEPS`] steps: each step
//! appends `step <i>/<n>: working on <goal>` to the thread log, then waits up to [`PAUSE`] for a
//! message in the thread's inbox (a stand-in for the time a model call takes; the wait ends the
//! moment a message arrives). A message sent while it runs (`homing thread send THREAD
//! --kind steer --payload "..."`) is acknowledged, which appends it to the log, and becomes the
//! new goal: `changed course: <goal>` is logged and the remaining steps work on it. The output
//! is `done: <goal>` with the goal it ended on.
//!
//! A dispatch the inbox started (a message arrived when no run was live; its payload is empty)
//! answers each pending message in turn: it acknowledges it and appends `noted: <message>`.
//!
//! A message the run did not get to (it arrived after the last step) stays pending: the host
//! answers it with a follow-up dispatch of this agent once the run settles.

use std::time::Duration;

use homing_guest::{Claim, Handler};

/// Steps per goal.
const STEPS: usize = 5;
/// The pause between steps, cut short by a message.
const PAUSE: Duration = Duration::from_millis(400);

/// The handler.
struct Steerable;

impl Handler for Steerable {
    fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
        if claim.payload().is_empty() {
            return answer_pending(claim);
        }
        let mut goal = claim.payload_str()?.to_owned();
        let mut step = 0;
        while step < STEPS {
            if claim.stop_requested().is_some() {
                return Err("asked to stop before the work was done".into());
            }
            step += 1;
            claim.append(format!("step {step}/{STEPS}: working on {goal}"))?;
            if let Some(message) = claim.next_message(PAUSE)? {
                let text = message.text().unwrap_or("(a message that is not text)").to_owned();
                claim.ack_message(message.seq)?;
                homing_guest::info!("steered after step {step}: {text}");
                goal = text;
                claim.append(format!("changed course: {goal}"))?;
            }
        }
        Ok(format!("done: {goal}").into_bytes())
    }
}

/// A run started by the inbox: notes every pending message.
fn answer_pending(claim: &Claim) -> Result<Vec<u8>, String> {
    let mut noted = 0;
    for message in claim.messages() {
        let message = message?;
        let text = message.text().unwrap_or("(not text)").to_owned();
        claim.ack_message(message.seq)?;
        claim.append(format!("noted: {text}"))?;
        noted += 1;
    }
    Ok(format!("noted {noted} message(s)").into_bytes())
}

homing_guest::export_handler!(Steerable);
