//! `sandbox`: a guest that does, on demand, what a sandbox must contain.
//!
//! The payload names one action:
//!
//! | payload | does |
//! | --- | --- |
//! | `read-file:<path>` | reads a file and returns its text |
//! | `write-file:<path>` | writes `written` to a file |
//! | `env:<name>` | returns an environment variable |
//! | `connect:<host:port>` | opens a TCP connection, returns `connected` |
//! | `alloc` | allocates without bound |
//! | `spin` | loops forever without host calls |
//! | `sleep` | blocks in a host call (WASI sleep) for an hour |
//! | `panic` | panics |
//! | `recurse` | recurses without bound |
//! | `log-flood` | writes 100,000 log lines |
//! | `enqueue-storm:<agent>` | enqueues follow-ups until the host refuses |
//! | `wait-stop` | sleeps in short host calls until the host asks it to stop, then reports |
//! | `print:<text>` | writes the text to stdout and to stderr |
//! | `print-env:<name>` | writes an environment variable's value to stdout, to stderr and with `log.write` (a guest that prints its secret) |
//! | `print-config:<name>` | the same with a `wasi:config` variable's value |
//! | `hang-once` | on its first attempt blocks for an hour; later attempts return `recovered` |
//! | `journal:<ms>` | appends `start <id>` to the thread log, works `ms` milliseconds, appends `end <id>` |
//! | `count` | returns how many dispatches this instance has handled (instance reuse) |
//! | `big:<n>` | returns `n` bytes of binary output ([`pattern`], not UTF-8) |
//! | `oversize:<n>` | tries `n` bytes through append, append-expected, enqueue (to `sandbox`), record-result and complete; returns one line per call: `<call>: <outcome>` |
//! | `log:<text>` | writes the text with `log.write` (info), as it is |
//! | anything else | returns it |

use std::hint::black_box;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use homing_guest::{Claim, Enqueue, Handler};

struct Sandbox;

/// `n` bytes where byte `i` is `(i * 31 + 7) % 251`: binary (0xC0 and 0xFF make it invalid
/// UTF-8), and easy to check by whoever reads it back.
pub fn pattern(n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| ((i * 31 + 7) % 251) as u8 | if i % 7 == 0 { 0xC0 } else { 0 })
        .collect()
}

/// `ok` or the error, for `oversize`'s report.
fn outcome<T>(result: Result<T, homing_guest::Error>) -> String {
    match result {
        Ok(_) => "ok".to_owned(),
        Err(e) => e.to_string(),
    }
}

/// Dispatches handled by this instance.
static CALLS: AtomicU32 = AtomicU32::new(0);

#[allow(unconditional_recursion)]
fn recurse(depth: u64) -> u64 {
    let pad = black_box([depth; 64]);
    recurse(depth + 1) + pad[0]
}

impl Handler for Sandbox {
    fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
        let calls = CALLS.fetch_add(1, Ordering::SeqCst) + 1;
        let payload = claim.payload_str().unwrap_or_default().to_owned();
        let (action, arg) = payload.split_once(':').unwrap_or((payload.as_str(), ""));
        match action {
            "read-file" => std::fs::read_to_string(arg)
                .map(String::into_bytes)
                .map_err(|e| format!("read {arg}: {e}")),
            "write-file" => std::fs::write(arg, b"written")
                .map(|()| b"written".to_vec())
                .map_err(|e| format!("write {arg}: {e}")),
            "env" => std::env::var(arg)
                .map(String::into_bytes)
                .map_err(|e| format!("env {arg}: {e}")),
            "connect" => std::net::TcpStream::connect(arg)
                .map(|_| b"connected".to_vec())
                .map_err(|e| format!("connect {arg}: {e}")),
            "alloc" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    black_box(&hoard);
                }
            }
            "spin" => {
                let mut n: u64 = 0;
                loop {
                    n = black_box(n.wrapping_add(1));
                }
            }
            "sleep" => {
                std::thread::sleep(Duration::from_secs(3600));
                Ok(b"woke".to_vec())
            }
            "panic" => {
                #[allow(clippy::panic)]
                {
                    panic!("the sandbox guest panics on purpose")
                }
            }
            "recurse" => Ok(recurse(0).to_le_bytes().to_vec()),
            "log-flood" => {
                for i in 0..100_000 {
                    homing_guest::info!("flood line {i}");
                }
                Ok(b"flooded".to_vec())
            }
            "enqueue-storm" => {
                let mut sent = 0u32;
                loop {
                    match claim.enqueue(
                        Enqueue::to(arg)
                            .thread(format!("storm-{sent}"))
                            .payload("x"),
                    ) {
                        Ok(_) => sent += 1,
                        Err(e) => return Ok(format!("sent {sent} then refused: {e}").into_bytes()),
                    }
                }
            }
            "wait-stop" => loop {
                if let Some(reason) = claim.stop_requested() {
                    return Ok(format!("stop requested: {reason:?}").into_bytes());
                }
                std::thread::sleep(Duration::from_millis(20));
            },
            "journal" => {
                // Two fenced appends around the work: overlapping claims of one thread would
                // interleave their pairs, and a zombie's append is refused.
                claim
                    .append(format!("start {}", claim.id()))
                    .map_err(|e| e.to_string())?;
                std::thread::sleep(Duration::from_millis(arg.parse().unwrap_or(0)));
                claim
                    .append(format!("end {}", claim.id()))
                    .map_err(|e| e.to_string())?;
                Ok(b"journaled".to_vec())
            }
            "count" => Ok(calls.to_string().into_bytes()),
            "big" => Ok(pattern(arg.parse().unwrap_or(0))),
            "oversize" => {
                let data = pattern(arg.parse().unwrap_or(0));
                let report = [
                    format!("append: {}", outcome(claim.append(&data))),
                    format!(
                        "append-expected: {}",
                        outcome(claim.append_expected(&data, 0))
                    ),
                    format!(
                        "enqueue: {}",
                        outcome(
                            claim.enqueue(
                                Enqueue::to("sandbox")
                                    .thread(format!("oversize-{}", claim.id()))
                                    .payload(data.clone())
                            )
                        )
                    ),
                    format!("record-result: {}", outcome(claim.record_result(&data))),
                    format!("complete: {}", outcome(claim.complete(&data))),
                ];
                Ok(report.join("\n").into_bytes())
            }
            "log" => {
                homing_guest::logging::info(arg);
                Ok(b"logged".to_vec())
            }
            "hang-once" => {
                if claim.attempt() == 0 {
                    std::thread::sleep(Duration::from_secs(3600));
                }
                Ok(b"recovered".to_vec())
            }
            "print" => {
                println!("out: {arg}");
                eprintln!("err: {arg}");
                Ok(b"printed".to_vec())
            }
            "print-env" | "print-config" => {
                let value = if action == "print-env" {
                    std::env::var(arg).map_err(|e| format!("env {arg}: {e}"))?
                } else {
                    homing_guest::config::require(arg)?
                };
                println!("out: {arg} is {value}.");
                eprintln!("err: {arg} is {value}.");
                homing_guest::logging::info(&format!("log: {arg} is {value}."));
                Ok(b"printed".to_vec())
            }
            _ => Ok(payload.into_bytes()),
        }
    }
}

homing_guest::export_handler!(Sandbox);
