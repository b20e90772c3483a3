//! `inbox-probe`: reads its thread's inbox on demand, for the inbox's end-to-end tests.
//!
//! The payload is a command:
//!
//! - `wait <ms>`: logs `waiting`, waits up to `ms` for a message, acks it and completes with
//!   `got <seq> <text>` (or `nothing` when none came in time);
//! - `hold <ms>`: waits for a message, logs `handed <seq>` without acking it, then waits up to
//!   `ms` more (the host is killed meanwhile) and fails; a retry (attempt 1 on) drains instead;
//! - `drain`: acks every pending message, completes with their texts joined by `|`;
//! - `ignore`: completes with `ignored` without reading the inbox;
//! - `items ...`: completes with the payloads of its debounce window's items joined by `|`;
//! - empty (a dispatch the inbox started): as `drain`.

use std::time::Duration;

use homing_guest::{Claim, Handler};

struct Probe;

fn ms(arg: Option<&str>) -> Result<Duration, String> {
    let ms: u64 = arg
        .unwrap_or("0")
        .parse()
        .map_err(|e| format!("bad milliseconds: {e}"))?;
    Ok(Duration::from_millis(ms))
}

fn drain(claim: &Claim) -> Result<Vec<u8>, String> {
    let mut texts = Vec::new();
    for message in claim.messages() {
        let message = message?;
        claim.ack_message(message.seq)?;
        texts.push(message.text().unwrap_or("?").to_owned());
    }
    Ok(texts.join("|").into_bytes())
}

impl Handler for Probe {
    fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
        let payload = claim.payload_str()?.to_owned();
        let mut words = payload.split_whitespace();
        match words.next() {
            Some("wait") => {
                let wait = ms(words.next())?;
                claim.append("waiting")?;
                match claim.next_message(wait)? {
                    Some(message) => {
                        let seq = claim.ack_message(message.seq)?;
                        Ok(format!(
                            "got {} {} as entry {seq}",
                            message.seq,
                            message.text().unwrap_or("?")
                        )
                        .into_bytes())
                    }
                    None => Ok(b"nothing".to_vec()),
                }
            }
            Some("hold") if claim.attempt() > 0 => drain(claim),
            Some("hold") => {
                let wait = ms(words.next())?;
                let Some(message) = claim.next_message(wait)? else {
                    return Err("no message to hold".into());
                };
                claim.append(format!("handed {}", message.seq))?;
                // Not acked: the host dies while this waits.
                let _ = claim.next_message(wait)?;
                Err("held the message without acknowledging it".into())
            }
            Some("ignore") => Ok(b"ignored".to_vec()),
            Some("items") => {
                let items: Vec<String> = claim
                    .items()
                    .iter()
                    .map(|i| String::from_utf8_lossy(&i.payload).into_owned())
                    .collect();
                Ok(items.join("|").into_bytes())
            }
            Some("drain") | None => drain(claim),
            Some(other) => Err(format!("unknown command {other}")),
        }
    }
}

homing_guest::export_handler!(Probe);
