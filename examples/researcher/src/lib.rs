//! `researcher`: an agent that asks a model for several notes in a row, each call sending the
//! notes so far, and returns them. It keeps no resume logic of its own: it is written the
//! plain way, one call after the other, and is run with `journal = "run"`, so a retry (after a
//! failed model call, a crash or a lost lease) is answered from the journal for every call the
//! failed attempt made, and pays only for the calls it had not made yet.
//!
//! The payload is the topic (text). The agent makes `NOTES` chat-completions calls to
//! `{base_url}/chat/completions` (`authorization: Bearer <api_key>`), each with the topic and
//! the notes so far, appends each note to the thread log (`{"dispatch", "note"}`), and returns
//! the notes, one per line. A call that fails (an HTTP error status included) fails the
//! attempt; the host retries it with the plugin's backoff.
//!
//! Variables: `base_url`, `model`, and `api_key` (a secret; never logged, stored or returned,
//! and kept out of the journal: request headers are journaled only as a digest).

use std::time::Duration;

use homing_guest::http::Request;
use homing_guest::{Claim, Handler, config};
use serde_json::{Value, json};

/// How many notes a run asks for.
const NOTES: usize = 3;

/// A model call's deadline.
const MODEL_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest model reply read.
const MAX_REPLY_BYTES: usize = 1 << 20;

struct Researcher;

impl Handler for Researcher {
    fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
        let topic = claim.payload_str()?.to_owned();
        let url = format!(
            "{}/chat/completions",
            config::require("base_url")?.trim_end_matches('/')
        );
        let model = config::require("model")?;
        let key = config::get("api_key")?.filter(|key| !key.is_empty());
        let mut notes: Vec<String> = Vec::new();
        for n in 1..=NOTES {
            let mut messages = vec![json!({"role": "user", "content": format!(
                "Write note {n} of {NOTES} on: {topic}"
            )})];
            for note in &notes {
                messages.push(json!({"role": "assistant", "content": note}));
            }
            let mut request = Request::post(&url)
                .header("accept", "application/json")
                .timeout(MODEL_TIMEOUT)
                .max_response_bytes(MAX_REPLY_BYTES);
            if let Some(key) = &key {
                request = request.bearer_auth(key);
            }
            let response = request
                .json(&json!({"model": model, "messages": messages}))?
                .send()?;
            if !response.is_success() {
                return Err(format!(
                    "the model server answered HTTP {} to note {n}",
                    response.status
                ));
            }
            let reply: Value = response.json()?;
            let note = reply["choices"][0]["message"]["content"]
                .as_str()
                .ok_or("the model's reply has no choices[0].message.content")?
                .to_owned();
            claim
                .append_json(&json!({"dispatch": claim.id(), "note": note}))
                .map_err(|e| e.to_string())?;
            homing_guest::info!("note {n} of {NOTES} written");
            notes.push(note);
        }
        Ok(notes.join("\n").into_bytes())
    }
}

homing_guest::export_handler!(Researcher);
