//! An `agent` component built against the frozen `homing:agent@0.1.0` (`wit/0.1.0/`), for the
//! test that 0.1.0 components keep running on a host that speaks 0.2.0. It loops over
//! `claim-next` and, by payload:
//! - `ack`: appends `agent saw` to the thread log, records the result `acked` and acks;
//! - `log`: reads the whole thread log and completes with its entries as `seq:text` lines (an
//!   entry that records an inbox message reads here as a plain entry);
//! - `stop`: waits (polling `stop-requested`, at most 30 s) until the host asks it to stop,
//!   then completes with `stopped: <reason>`;
//! - anything else: dead-letters, naming it.

wit_bindgen::generate!({
    path: "../../../wit/0.1.0",
    world: "agent",
});

use homing::agent::log::{Level, write};
use homing::agent::mailbox::Claim;
use homing::agent::queue::claim_next;

struct Compat;

fn log_lines(claim: &Claim) -> String {
    match claim.read_log(0, 1000) {
        Ok(entries) => entries
            .iter()
            .map(|e| format!("{}:{}", e.seq, String::from_utf8_lossy(&e.data)))
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("read-log failed: {e:?}"),
    }
}

fn wait_for_stop(claim: &Claim) -> String {
    // `stop-requested` is a host call, so this loop yields to the host each turn; the host's
    // epoch callback also bounds it by the dispatch's timeout.
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(30) {
        if let Some(reason) = claim.stop_requested() {
            return format!("stopped: {reason:?}");
        }
    }
    "stopped: never asked".into()
}

impl Guest for Compat {
    fn run() -> Result<(), String> {
        while let Some(claim) = claim_next(1_000).map_err(|e| format!("{e:?}"))? {
            let info = claim.info();
            let outcome = match info.payload.as_slice() {
                b"ack" => claim
                    .append(b"agent saw")
                    .and_then(|_| claim.record_result(b"acked"))
                    .and_then(|()| claim.ack()),
                b"log" => claim.complete(log_lines(&claim).as_bytes()),
                b"stop" => {
                    let text = wait_for_stop(&claim);
                    write(Level::Info, &text);
                    claim.complete(text.as_bytes())
                }
                other => claim.dead_letter(&format!(
                    "unknown command {}",
                    String::from_utf8_lossy(other)
                )),
            };
            if let Err(e) = outcome {
                write(Level::Warn, &format!("settling {} failed: {e:?}", info.id));
            }
        }
        Ok(())
    }
}

export!(Compat);
