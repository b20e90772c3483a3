//! `delegate`: fans a payload out to `echo`, one word per dispatch, and gathers the replies.
//!
//! A dispatch without the metadata `reply-for` is a request. Its payload is split into
//! whitespace-separated words; `expect:<n>` is appended to the thread log, and word `i` is
//! enqueued to `echo` on the thread `<thread>/part-<i>` with the metadata
//! `reply-to = <this agent>:<thread>`, so each echo sends its output back here. The output is
//! `fanned out <n>`.
//!
//! A dispatch with `reply-for` is such a reply. Its payload is appended as `part:<payload>`;
//! then the log is read, and the `part:` entries since the last `expect:<n>` are counted. When
//! all `n` are in, `gathered:<parts joined by spaces, in arrival order>` is appended and is the
//! output; until then the output is `waiting <k>/<n>`.
//!
//! Two replies handled at once could both see all parts; `gathered:` is therefore appended
//! only if the log is still as read (`append_expected`), and a reply that finds `gathered:`
//! already written after the last `expect:` does not gather again.

use homing_guest::{Claim, Enqueue, Error, Handler, LogEntry};

/// The agent every word is sent to.
const WORKER: &str = "echo";

/// How often a reply re-reads the log after losing the race to write `gathered:`; each loss
/// means another writer moved the log on, so a few rounds settle it.
const GATHER_ROUNDS: u32 = 8;

/// The handler.
struct Delegate;

impl Handler for Delegate {
    fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
        let output = match claim.metadata("reply-for") {
            None => fan_out(claim)?,
            Some(_) => gather(claim)?,
        };
        Ok(output.into_bytes())
    }
}

/// Sends one word per dispatch to the worker and announces how many replies to expect.
fn fan_out(claim: &Claim) -> Result<String, Error> {
    let text = claim.payload_str()?;
    let words: Vec<&str> = text.split_whitespace().collect();
    let thread = claim.thread();
    claim.append(format!("expect:{}", words.len()))?;
    let reply_to = format!("{}:{thread}", claim.agent());
    for (i, word) in words.iter().enumerate() {
        let part = Enqueue::to(WORKER)
            .thread(format!("{thread}/part-{i}"))
            .payload(*word)
            .metadata("reply-to", reply_to.as_str())
            // Each part has its own thread, so this dispatch's id is a unique key per part:
            // a retried fan-out does not start a second live worker for a part.
            .dedupe_key(claim.id());
        match claim.enqueue(part) {
            Ok(_) | Err(Error::Duplicate(_)) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(format!("fanned out {}", words.len()))
}

/// Records one reply and, when it is the last one expected, the gathered text.
fn gather(claim: &Claim) -> Result<String, Error> {
    claim.append(format!("part:{}", String::from_utf8_lossy(claim.payload())))?;
    for _ in 0..GATHER_ROUNDS {
        let log = claim.read_log_all()?;
        let latest = log.last().map_or(0, |entry| entry.seq);
        let round = Round::read(&log)?;
        if round.gathered {
            return Ok(format!(
                "already gathered {}/{}",
                round.parts.len(),
                round.expected
            ));
        }
        if round.parts.len() != round.expected {
            return Ok(format!("waiting {}/{}", round.parts.len(), round.expected));
        }
        let text = round.parts.join(" ");
        match claim.append_expected(format!("gathered:{text}"), latest) {
            Ok(_) => return Ok(text),
            Err(Error::Conflict(_)) => continue,
            Err(error) => return Err(error),
        }
    }
    Err(Error::Contention(format!(
        "the thread log kept changing through {GATHER_ROUNDS} rounds of gathering"
    )))
}

/// The state of the latest fan-out on this thread, as its log shows it.
struct Round<'log> {
    /// `n` of the last `expect:<n>`.
    expected: usize,
    /// The `part:` payloads after it, in arrival order.
    parts: Vec<&'log str>,
    /// Whether `gathered:` was already written after it.
    gathered: bool,
}

impl<'log> Round<'log> {
    fn read(log: &'log [LogEntry]) -> Result<Self, Error> {
        let lines: Vec<&str> = log.iter().filter_map(LogEntry::text).collect();
        let Some((start, expected)) = lines
            .iter()
            .enumerate()
            .rev()
            .find_map(|(i, line)| Some((i, line.strip_prefix("expect:")?)))
        else {
            return Err(Error::Invalid(
                "a reply arrived on a thread with no expect: entry".to_owned(),
            ));
        };
        let expected = expected
            .parse()
            .map_err(|e| Error::Invalid(format!("log entry expect:{expected}: {e}")))?;
        let since = lines.get(start + 1..).unwrap_or_default();
        Ok(Round {
            expected,
            parts: since
                .iter()
                .filter_map(|line| line.strip_prefix("part:"))
                .collect(),
            gathered: since.iter().any(|line| line.starts_with("gathered:")),
        })
    }
}

homing_guest::export_handler!(Delegate);
