//! `journal-probe`: an agent run shaped like a chat with tools, for the host's tests of
//! journaled runs (`journal = "run"`).
//!
//! Payload (JSON):
//!
//! ```json
//! {"url": "http://127.0.0.1:8080/model", "calls": 3, "prompt": "hello",
//!  "fail_on_attempts": [0], "after": 3, "enqueue_to": "other"}
//! ```
//!
//! For each of `calls` turns it reads its thread log (the conversation so far), sends the
//! model (`url`, with `Authorization: Bearer {config.api_key}`) the prompt and the conversation
//! as JSON, and appends the model's answer to the log. When its attempt is in
//! `fail_on_attempts` it traps after `after` turns (default: all of them). After its turns it
//! enqueues one follow-up to `enqueue_to` when that is set. Unless it traps it returns
//! `{"answers": [...], "log": N}`: each turn's answer and the log's watermark. Before the
//! turns, it asks the model `steps` times through memoized steps (`claim.step("plan", ..)`). From turn
//! `vary_from` on, the prompt names the attempt, so a retry asks something else there. With
//! `stamp`, each request also carries the wall-clock time and a random number read just
//! before it, so only a run given the same clock and random values asks the same.

use homing_guest::http::{Method, Request};
use homing_guest::{Claim, Enqueue, Handler, config};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
struct Probe {
    url: String,
    #[serde(default = "three")]
    calls: u32,
    #[serde(default)]
    prompt: String,
    #[serde(default)]
    fail_on_attempts: Vec<u32>,
    after: Option<u32>,
    enqueue_to: Option<String>,
    vary_from: Option<u32>,
    #[serde(default)]
    stamp: bool,
    #[serde(default)]
    steps: u32,
}

/// A wall-clock time (ms) and a number drawn from the guest's random source, read now.
fn stamp() -> (u64, u64) {
    use std::hash::{BuildHasher, Hasher};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    // A fresh `RandomState` draws its keys from `wasi:random` (once per instance).
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(7);
    (now, hasher.finish())
}

fn three() -> u32 {
    3
}

struct JournalProbe;

impl Handler for JournalProbe {
    fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
        let probe: Probe = claim.payload_json()?;
        let key = config::get("api_key")?.unwrap_or_default();
        let failing = probe.fail_on_attempts.contains(&claim.attempt());
        let mut answers = Vec::new();
        // Memoized steps, all under one name: keys `plan`, `plan#2`, ...
        for n in 0..probe.steps {
            let answer: String = claim.step("plan", || -> Result<String, String> {
                let body = json!({"prompt": probe.prompt, "turn": n, "history": []});
                let response = Request::new(Method::Post, &probe.url)
                    .header("content-type", "application/json")
                    .body(body.to_string().as_str())
                    .send()?;
                Ok(String::from_utf8_lossy(&response.body).into_owned())
            })?;
            answers.push(answer);
        }
        for turn in 0..probe.calls {
            if failing && probe.after == Some(turn) {
                break;
            }
            let history: Vec<String> = claim
                .read_log(0, 1000)
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|e| String::from_utf8_lossy(&e.data).into_owned())
                .collect();
            let prompt = match probe.vary_from {
                Some(from) if turn >= from => {
                    format!("{} (attempt {})", probe.prompt, claim.attempt())
                }
                _ => probe.prompt.clone(),
            };
            let mut body = json!({"prompt": prompt, "turn": turn, "history": history});
            if probe.stamp {
                let (now, random) = stamp();
                body["stamp"] = json!({"now": now, "random": random.to_string()});
            }
            let response = Request::new(Method::Post, &probe.url)
                .header("authorization", format!("Bearer {key}").as_str())
                .header("content-type", "application/json")
                .body(body.to_string().as_str())
                .send()?;
            if response.status != 200 {
                return Err(format!("the model answered {}", response.status));
            }
            let answer = String::from_utf8_lossy(&response.body).into_owned();
            claim.append(answer.as_bytes()).map_err(|e| e.to_string())?;
            answers.push(answer);
        }
        if let Some(agent) = &probe.enqueue_to {
            claim
                .enqueue(Enqueue::to(agent.as_str()).payload(b"follow-up".to_vec()))
                .map_err(|e| e.to_string())?;
        }
        if failing {
            panic!(
                "journal-probe: failing attempt {} on purpose",
                claim.attempt()
            );
        }
        let log = claim.log_latest().map_err(|e| e.to_string())?;
        Ok(json!({"answers": answers, "log": log})
            .to_string()
            .into_bytes())
    }
}

homing_guest::export_handler!(JournalProbe);
