//! The `{{name}}` agent (Homing's `agent` world): the host calls `run`, which claims work
//! itself with `claim_next` and settles every claim (a claim left unsettled is nacked by the
//! host). `run` returns when `claim_next` gives `None`.
//!
//! Each message is kept in the thread log, the agent's only memory: a later dispatch on the
//! same thread, on any host, reads it back.
//!
//! To be steered while it runs (`homing thread send THREAD --kind steer --payload "..."`), a
//! long run reads its thread's inbox between steps and acknowledges what it takes, which
//! appends the message to the thread log:
//!
//! ```ignore
//! if let Some(message) = claim.next_message(std::time::Duration::from_millis(200))? {
//!     claim.ack_message(message.seq)?;
//!     // change course with message.text()
//! }
//! ```

use homing_guest::{Agent, Claim, Error, claim_next};

/// How long each `claim_next` waits for more work before `run` returns.
const WAIT_MS: u32 = 500;

struct Loop;

impl Agent for Loop {
    fn run() -> Result<(), String> {
        while let Some(claim) = claim_next(WAIT_MS)? {
            if let Err(error) = answer(&claim) {
                homing_guest::warn!("dispatch {}: {error}", claim.id());
                if !error.claim_is_gone() {
                    claim.nack(&error.to_string(), None)?;
                }
            }
        }
        Ok(())
    }
}

/// Handles one claim: remember the message, complete with the reply.
fn answer(claim: &Claim) -> Result<(), Error> {
    let text = claim.payload_str()?;
    let earlier = claim.read_log_all()?.len();
    claim.append(text)?;
    homing_guest::info!("message {} on thread {}", earlier + 1, claim.thread());
    claim.complete(reply(text, earlier + 1, claim.thread()))
}

/// The answer to the `n`th message on `thread`.
fn reply(text: &str, n: usize, thread: &str) -> String {
    format!("hello, {text}! (message {n} on thread {thread})")
}

homing_guest::export_agent!(Loop);

// Plain functions test natively with `cargo test`; only the calls through the claim need the
// host (`homing run`).
#[cfg(test)]
mod tests {
    #[test]
    fn replies_with_the_count() {
        assert_eq!(
            super::reply("world", 1, "t1"),
            "hello, world! (message 1 on thread t1)"
        );
    }
}
