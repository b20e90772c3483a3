//! `stream-probe`: a handler that streams chunks with `claim.emit`, for the host's tests of
//! streamed output (issue 28).
//!
//! Payload (JSON, every field optional):
//!
//! ```json
//! {"count": 5, "text": "tok", "size": 1024, "binary": false, "pause_after": 2,
//!  "fail_on_attempts": [0], "fail_after": 3, "expect_refusal": false}
//! ```
//!
//! It emits `count` chunks (default 3): `"{text}{i}"` for i in 1..=count (`text` defaults to
//! `tok`); with `size`, chunk i is exactly `size` bytes instead (the text and index repeated,
//! cut to `size`); with `binary`, the chunk's bytes are not UTF-8 (`0xff 0xfe` then the index's
//! low byte, repeated to `size` bytes, or 4 bytes without `size`). With `pause_after` = K, after K
//! emits it waits up to 60 s for one message in its thread's inbox and acks it before emitting
//! the rest (tests attach watchers in the pause; no message in time is an error). When its
//! attempt is in `fail_on_attempts` it traps after `fail_after` emits (default: all of them).
//!
//! Each emit must return the next sequence (1, 2, 3, ...); otherwise the run fails with an error
//! naming what came back. Unless it traps it returns `{"emitted": count, "last_seq": N}`; with
//! `expect_refusal`, it emits until the host refuses (ignoring `count`, up to a million chunks)
//! and returns `{"refused_at": i, "error": "<the error>"}` (i: the refused chunk's index).

use std::time::Duration;

use homing_guest::{Claim, Handler};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
struct Probe {
    #[serde(default = "three")]
    count: u64,
    #[serde(default = "tok")]
    text: String,
    size: Option<usize>,
    #[serde(default)]
    binary: bool,
    pause_after: Option<u64>,
    #[serde(default)]
    fail_on_attempts: Vec<u32>,
    fail_after: Option<u64>,
    #[serde(default)]
    expect_refusal: bool,
}

fn three() -> u64 {
    3
}

fn tok() -> String {
    "tok".to_owned()
}

/// The most chunks an `expect_refusal` run emits before giving up on a refusal.
const REFUSAL_LIMIT: u64 = 1_000_000;

impl Probe {
    /// Chunk `i` (from 1).
    fn chunk(&self, i: u64) -> Vec<u8> {
        let unit: Vec<u8> = if self.binary {
            vec![0xff, 0xfe, (i & 0xff) as u8, 0x80]
        } else {
            format!("{}{i}", self.text).into_bytes()
        };
        // `unit` is never empty (it holds the index), so a sized chunk is exactly `size` bytes
        // (an empty one with `size: 0`, for the host to refuse).
        match self.size {
            Some(size) => unit.iter().copied().cycle().take(size).collect(),
            None => unit,
        }
    }
}

/// Waits for one inbox message on the thread and acks it.
fn pause(claim: &Claim) -> Result<(), String> {
    let Some(message) = claim.next_message(Duration::from_secs(60))? else {
        return Err("stream-probe: no message came while paused".to_owned());
    };
    claim.ack_message(message.seq)?;
    Ok(())
}

struct StreamProbe;

impl Handler for StreamProbe {
    fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
        let probe: Probe = claim.payload_json()?;
        let failing = probe.fail_on_attempts.contains(&claim.attempt());
        let fail_after = probe.fail_after.unwrap_or(probe.count);
        let last = if probe.expect_refusal {
            REFUSAL_LIMIT
        } else {
            probe.count
        };
        let mut last_seq = 0;
        for i in 1..=last {
            if failing && i > fail_after {
                panic!(
                    "stream-probe: failing attempt {} after {fail_after} emits, on purpose",
                    claim.attempt()
                );
            }
            match claim.emit(probe.chunk(i)) {
                Ok(seq) if seq == i => last_seq = seq,
                Ok(seq) => {
                    return Err(format!(
                        "stream-probe: emit {i} returned sequence {seq}, expected {i}"
                    ));
                }
                Err(error) if probe.expect_refusal => {
                    let out = json!({"refused_at": i, "error": error.to_string()});
                    return Ok(out.to_string().into_bytes());
                }
                Err(error) => return Err(format!("stream-probe: emit {i} failed: {error}")),
            }
            if probe.pause_after == Some(i) {
                pause(claim)?;
            }
        }
        if failing {
            panic!(
                "stream-probe: failing attempt {} after {last} emits, on purpose",
                claim.attempt()
            );
        }
        if probe.expect_refusal {
            return Err(format!(
                "stream-probe: the host accepted {REFUSAL_LIMIT} chunks without refusing one"
            ));
        }
        Ok(json!({"emitted": probe.count, "last_seq": last_seq})
            .to_string()
            .into_bytes())
    }
}

homing_guest::export_handler!(StreamProbe);
