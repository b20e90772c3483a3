//! A `handler` component built against the frozen `homing:agent@0.1.0` (`wit/0.1.0/`), for the
//! test that 0.1.0 components keep running on a host that speaks 0.2.0. With the
//! `compat-v0_1-agent` guest it calls every 0.1.0 import.
//!
//! The payload picks what it does:
//! - `all`: every claim call in turn (info, record-start, append, append-expected winning and
//!   losing, read-log, log-latest, stop-requested, enqueue through the claim and the free
//!   enqueue, both to `compat-agent` with payload `ack`, record-result, log.write), then returns
//!   a report of what each answered: the test compares it with what 0.1.0 answered;
//! - `complete`: completes with `done` itself (the value `handle` returns is then ignored);
//! - `nack`: nacks the first attempt with a retry hint, completes the second with `retried`;
//! - `dead`: dead-letters with `gave up`.

#![allow(clippy::missing_safety_doc)]

wit_bindgen::generate!({
    path: "../../../wit/0.1.0",
    world: "handler",
});

use exports::homing::agent::handle::Guest;
use homing::agent::log::{Level, write};
use homing::agent::mailbox::{Claim, enqueue};
use homing::agent::types::{EnqueueRequest, Error};

struct Compat;

fn request(thread: Option<String>) -> EnqueueRequest {
    EnqueueRequest {
        agent: "compat-agent".into(),
        thread,
        payload: b"ack".to_vec(),
        metadata: vec![("from".into(), "compat-handler".into())],
        priority: None,
        delay_ms: None,
        dedupe_key: None,
        max_attempts: None,
    }
}

fn shown<T: std::fmt::Debug>(out: &Result<T, Error>) -> String {
    match out {
        Ok(v) => format!("ok({v:?})"),
        Err(Error::Conflict(latest)) => format!("conflict({latest})"),
        Err(e) => format!("err({e:?})"),
    }
}

fn all(claim: &Claim) -> String {
    let info = claim.info();
    let mut report = vec![format!(
        "info agent={} thread={} payload={} attempt={} max={} priority={}",
        info.agent,
        info.thread,
        String::from_utf8_lossy(&info.payload),
        info.attempt,
        info.max_attempts,
        info.priority
    )];
    report.push(format!("start {}", shown(&claim.record_start())));
    let first = claim.append(b"a");
    report.push(format!("append {}", shown(&first)));
    let latest = first.unwrap_or(0);
    let second = claim.append_expected(b"b", latest);
    report.push(format!("append-expected {}", shown(&second)));
    report.push(format!(
        "append-expected-stale {}",
        shown(&claim.append_expected(b"c", latest))
    ));
    let entries = claim.read_log(0, 10).map(|entries| {
        entries
            .iter()
            .map(|e| format!("{}:{}", e.seq, String::from_utf8_lossy(&e.data)))
            .collect::<Vec<_>>()
            .join(",")
    });
    report.push(format!("read-log {}", shown(&entries)));
    report.push(format!("log-latest {}", shown(&claim.log_latest())));
    report.push(format!("stop {:?}", claim.stop_requested()));
    let through_claim = claim.enqueue(&request(None)).map(|id| !id.is_empty());
    report.push(format!("enqueue {}", shown(&through_claim)));
    let free = enqueue(&request(Some(info.thread.clone()))).map(|id| !id.is_empty());
    report.push(format!("free-enqueue {}", shown(&free)));
    let stranger = claim.enqueue(&EnqueueRequest {
        agent: "nobody".into(),
        ..request(None)
    });
    report.push(format!(
        "enqueue-stranger {}",
        match stranger {
            Err(Error::Denied(_)) => "denied",
            _ => "not denied",
        }
    ));
    report.push(format!(
        "record-result {}",
        shown(&claim.record_result(b"partial"))
    ));
    write(Level::Info, "compat handler ran every call");
    report.join("\n")
}

impl Guest for Compat {
    fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
        let info = claim.info();
        match info.payload.as_slice() {
            b"all" => Ok(all(claim).into_bytes()),
            b"complete" => {
                claim.complete(b"done").map_err(|e| format!("{e:?}"))?;
                Ok(b"ignored".to_vec())
            }
            b"nack" if info.attempt == 0 => {
                claim
                    .nack("again", Some(10))
                    .map_err(|e| format!("{e:?}"))?;
                Ok(Vec::new())
            }
            b"nack" => Ok(b"retried".to_vec()),
            b"dead" => {
                claim.dead_letter("gave up").map_err(|e| format!("{e:?}"))?;
                Ok(Vec::new())
            }
            other => Err(format!(
                "unknown command {}",
                String::from_utf8_lossy(other)
            )),
        }
    }
}

export!(Compat);
