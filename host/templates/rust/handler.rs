//! The `{{name}}` agent (Homing's `handler` world): the host claims a dispatch and calls
//! `handle` once for it; `Ok(output)` completes it and `Err(message)` nacks it (a retry with
//! backoff, a dead letter at the attempt limit).
//!
//! Each message is kept in the thread log, the agent's only memory: a later dispatch on the
//! same thread, on any host, reads it back.
//!
//! To wait for a person (an approval, say) without holding a worker, wait on a waitpoint: while
//! it is pending the run is suspended and `handle` returns at once; once someone answers (the
//! dashboard's Approve and Reject buttons, `homing waitpoint complete ID --payload ...`) or the
//! timeout passes, `handle` runs again from the top and the same call returns the outcome. What
//! ran before it runs again too: keep its results in the thread log and skip what is done.
//!
//! ```ignore
//! use homing_guest::Wait;
//! let timeout = std::time::Duration::from_secs(3600);
//! match claim.wait_for("approve", timeout, &[("action", "deploy")])? {
//!     Wait::Suspended => return Ok(Vec::new()),
//!     Wait::Completed(answer) => { /* answer.text(): `{"approved": true}` from the dashboard */ }
//!     Wait::TimedOut(_) | Wait::Cancelled(_) => { /* nobody approved it */ }
//! }
//! ```

use homing_guest::{Claim, Handler};

struct Agent;

impl Handler for Agent {
    fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
        let text = claim.payload_str()?;
        let earlier = claim.read_log_all()?.len();
        claim.append(text)?;
        homing_guest::info!("message {} on thread {}", earlier + 1, claim.thread());
        Ok(reply(text, earlier + 1, claim.thread()).into_bytes())
    }
}

/// The answer to the `n`th message on `thread`.
fn reply(text: &str, n: usize, thread: &str) -> String {
    format!("hello, {text}! (message {n} on thread {thread})")
}

homing_guest::export_handler!(Agent);

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
