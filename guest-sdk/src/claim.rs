//! [`Claim`]: a dispatch this guest holds, and everything it can do with it.
//!
//! A claim reaches a guest in one of two ways: the host lends it to
//! [`Handler::handle`](crate::Handler::handle) (the `handler` world), or the guest takes it
//! with [`claim_next`](crate::claim_next) (the `agent` world). Either way the guest sees the
//! same [`Claim`]: the dispatch's [`DispatchInfo`] (read once, when the claim is wrapped) and
//! the calls that settle it, record progress, write the thread log, stream output to watchers
//! ([`Claim::emit`]) and enqueue follow-up work.
//!
//! Every write through a claim is fenced by the host: once the lease is lost or the thread is
//! interrupted, writes fail with [`Error::LostClaim`] or [`Error::Interrupted`]
//! ([`Error::claim_is_gone`]) and change nothing, so a guest stops on those errors rather than
//! retrying. In long loops, [`Claim::stop_requested`] says whether the host wants the guest to
//! stop before a write fails.
//!
//! Settling: a handler that returns without settling gets its return value applied by the host
//! (`Ok` completes, `Err` nacks). In the `agent` world a claim dropped unsettled is nacked by
//! the host (a retry with backoff), so settle every claim you take.

use std::time::Duration;

use crate::__bindings::mailbox;
use crate::enqueue::Enqueue;
use crate::error::Error;
use crate::step::StepKeys;

pub use crate::__bindings::types::{
    DispatchInfo, Item, LogEntry, LogRange, Message, MessageKind, MessageNote, StopReason,
    TurnEvent, TurnMark,
};

/// The entries of `entries` a reader of the conversation keeps: all but those a `rollback`
/// message masked ([`TurnMark::masked`]: the stopped run's entries, still stored). A mark comes
/// after what it masks, so give it entries read to the log's end, as
/// [`Claim::read_log_all`] returns them. The marks themselves are kept.
pub fn unmasked(entries: Vec<LogEntry>) -> Vec<LogEntry> {
    let masks: Vec<LogRange> = entries
        .iter()
        .filter_map(|e| e.turn.as_ref().and_then(|t| t.masked))
        .collect();
    if masks.is_empty() {
        return entries;
    }
    entries
        .into_iter()
        .filter(|e| !masks.iter().any(|m| (m.first..=m.last).contains(&e.seq)))
        .collect()
}

/// How many log entries [`Claim::read_log_all`] asks for per call. The host may return fewer
/// (it caps the page size); the loop ends on an empty page, not a short one.
const LOG_PAGE: u32 = 256;

/// A dispatch this guest holds: its [`DispatchInfo`] plus the calls that act on it.
///
/// The lifetime is that of the host's loan in the `handler` world; a claim taken with
/// [`claim_next`](crate::claim_next) is owned and is `Claim<'static>`.
#[derive(Debug)]
pub struct Claim<'a> {
    handle: Handle<'a>,
    info: DispatchInfo,
    steps: StepKeys,
}

/// The host resource: lent for one `handle` call, or owned after `claim-next`.
#[derive(Debug)]
enum Handle<'a> {
    Lent(&'a mailbox::Claim),
    #[cfg_attr(not(feature = "agent"), allow(dead_code))]
    Owned(mailbox::Claim),
}

impl<'a> Claim<'a> {
    /// Wraps a claim the host lent to `handle`.
    #[cfg_attr(not(feature = "handler"), allow(dead_code))]
    pub(crate) fn lent(claim: &'a mailbox::Claim) -> Self {
        let info = claim.info();
        Claim {
            handle: Handle::Lent(claim),
            info,
            steps: StepKeys::default(),
        }
    }

    pub(crate) fn raw(&self) -> &mailbox::Claim {
        match &self.handle {
            Handle::Lent(claim) => claim,
            Handle::Owned(claim) => claim,
        }
    }

    /// How often each step name was used in this claim ([`Claim::step`]).
    pub(crate) fn step_keys(&self) -> &StepKeys {
        &self.steps
    }

    /// The dispatch: id, thread, payload, metadata, attempt and the rest.
    pub fn info(&self) -> &DispatchInfo {
        &self.info
    }

    /// The dispatch id.
    pub fn id(&self) -> &str {
        &self.info.id
    }

    /// The agent (plugin name) the dispatch is routed to: this plugin.
    pub fn agent(&self) -> &str {
        &self.info.agent
    }

    /// The thread (conversation) the dispatch belongs to.
    pub fn thread(&self) -> &str {
        &self.info.thread
    }

    /// The run this dispatch activates.
    pub fn run_id(&self) -> &str {
        &self.info.run_id
    }

    /// The dispatch's input bytes.
    pub fn payload(&self) -> &[u8] {
        &self.info.payload
    }

    /// Every enqueue the dispatch's `collect` debounce window gathered, oldest first (each
    /// with its payload, metadata and arrival time); empty for a dispatch without one. The
    /// [payload](Claim::payload) is the latest item's. A retry gets the same items.
    pub fn items(&self) -> Vec<Item> {
        self.raw().items()
    }

    /// The payload as UTF-8 text.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] when the payload is not UTF-8.
    pub fn payload_str(&self) -> Result<&str, Error> {
        std::str::from_utf8(&self.info.payload)
            .map_err(|e| Error::Invalid(format!("payload is not UTF-8 text: {e}")))
    }

    /// Failed attempts before this one (0 on the first run).
    pub fn attempt(&self) -> u32 {
        self.info.attempt
    }

    /// How many times the dispatch has been claimed, this claim included (1 on its first run):
    /// retries and resumes each add one.
    pub fn claims(&self) -> u32 {
        self.info.claims
    }

    /// How many times the dispatch came back from waiting on its waitpoints.
    pub fn resumes(&self) -> u32 {
        self.info.resumes
    }

    /// Failed attempts after which the dispatch dead-letters.
    pub fn max_attempts(&self) -> u32 {
        self.info.max_attempts
    }

    /// Whether failing this attempt dead-letters the dispatch instead of retrying it.
    pub fn is_last_attempt(&self) -> bool {
        self.info.attempt.saturating_add(1) >= self.info.max_attempts
    }

    /// The dispatch's priority: 0 is most urgent, 255 least.
    pub fn priority(&self) -> u8 {
        self.info.priority
    }

    /// The metadata value under `key`, if the submitter set one.
    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.info.metadata(key)
    }

    /// Records that the run started (visible to operators).
    ///
    /// # Errors
    ///
    /// Whatever the host refuses with, notably [`Error::LostClaim`] and [`Error::Interrupted`].
    pub fn record_start(&self) -> Result<(), Error> {
        Ok(self.raw().record_start()?)
    }

    /// Records the run's output; the dispatch stays claimed until settled.
    ///
    /// # Errors
    ///
    /// Whatever the host refuses with, notably [`Error::LostClaim`] and [`Error::Interrupted`].
    pub fn record_result(&self, output: impl AsRef<[u8]>) -> Result<(), Error> {
        Ok(self.raw().record_result(output.as_ref())?)
    }

    /// Records `output` and acks in one step.
    ///
    /// # Errors
    ///
    /// Whatever the host refuses with, notably [`Error::LostClaim`] and [`Error::Interrupted`].
    pub fn complete(&self, output: impl AsRef<[u8]>) -> Result<(), Error> {
        Ok(self.raw().complete(output.as_ref())?)
    }

    /// Settles the dispatch as done, keeping any recorded result.
    ///
    /// # Errors
    ///
    /// Whatever the host refuses with, notably [`Error::LostClaim`] and [`Error::Interrupted`].
    pub fn ack(&self) -> Result<(), Error> {
        Ok(self.raw().ack()?)
    }

    /// Gives the dispatch back for a retry. `retry_after` is a hint (whole milliseconds); the
    /// host applies its backoff policy and caps. At the attempt limit the dispatch
    /// dead-letters.
    ///
    /// # Errors
    ///
    /// Whatever the host refuses with, notably [`Error::LostClaim`] and [`Error::Interrupted`].
    pub fn nack(&self, error: &str, retry_after: Option<Duration>) -> Result<(), Error> {
        let retry_after_ms = retry_after.map(duration_to_ms);
        Ok(self.raw().nack(error, retry_after_ms)?)
    }

    /// Gives up on the dispatch: it will not be retried.
    ///
    /// # Errors
    ///
    /// Whatever the host refuses with, notably [`Error::LostClaim`] and [`Error::Interrupted`].
    pub fn dead_letter(&self, error: &str) -> Result<(), Error> {
        Ok(self.raw().dead_letter(error)?)
    }

    /// Appends an entry to this dispatch's thread log; returns its sequence.
    ///
    /// # Errors
    ///
    /// Whatever the host refuses with, notably [`Error::LostClaim`] and [`Error::Interrupted`].
    pub fn append(&self, entry: impl AsRef<[u8]>) -> Result<u64, Error> {
        Ok(self.raw().append(entry.as_ref())?)
    }

    /// Appends an entry only if the thread log's latest sequence is still `expected_latest`
    /// (0 for an empty log); returns its sequence. Use it to write a decision made from what
    /// was read, so that a concurrent writer cannot slip in between.
    ///
    /// # Errors
    ///
    /// [`Error::Conflict`] with the log's latest sequence when another entry came first; also
    /// whatever else the host refuses with.
    pub fn append_expected(
        &self,
        entry: impl AsRef<[u8]>,
        expected_latest: u64,
    ) -> Result<u64, Error> {
        Ok(self
            .raw()
            .append_expected(entry.as_ref(), expected_latest)?)
    }

    /// Reads up to `limit` entries of the thread log with a sequence greater than `after`
    /// (0 reads from the start). The host may return fewer than `limit` even when more exist.
    ///
    /// # Errors
    ///
    /// Whatever the host refuses with, notably [`Error::LostClaim`] and [`Error::Interrupted`].
    pub fn read_log(&self, after: u64, limit: u32) -> Result<Vec<LogEntry>, Error> {
        Ok(self.raw().read_log(after, limit)?)
    }

    /// Reads the whole thread log, oldest first, page by page.
    ///
    /// # Errors
    ///
    /// The first error of [`Claim::read_log`].
    pub fn read_log_all(&self) -> Result<Vec<LogEntry>, Error> {
        let mut entries = Vec::new();
        let mut after = 0;
        loop {
            let page = self.read_log(after, LOG_PAGE)?;
            let Some(last) = page.last().map(|entry| entry.seq) else {
                break;
            };
            // Sequences increase; a page that does not move forward would loop forever.
            if last <= after {
                break;
            }
            after = last;
            entries.extend(page);
        }
        Ok(entries)
    }

    /// The thread log's latest visible sequence (0 when empty).
    ///
    /// # Errors
    ///
    /// Whatever the host refuses with, notably [`Error::LostClaim`] and [`Error::Interrupted`].
    pub fn log_latest(&self) -> Result<u64, Error> {
        Ok(self.raw().log_latest()?)
    }

    /// Why the host wants the guest to stop early, if it does: check it in long loops.
    pub fn stop_requested(&self) -> Option<StopReason> {
        self.raw().stop_requested()
    }

    /// The oldest message of the thread's inbox that is still pending and that this claim has
    /// not been handed yet, waiting up to `wait` for one to arrive (`Duration::ZERO`: do not
    /// wait; whole milliseconds, capped at about 49 days). `None` when nothing arrived in time,
    /// or early when the host wants the guest to stop (see [`Claim::stop_requested`]). The
    /// host wakes the wait as soon as a message is sent, from any host; the wait holds the
    /// worker and ends a second before the dispatch's deadline.
    ///
    /// A message stays pending until a claim acknowledges it ([`Claim::ack_message`]), so a
    /// later run of the thread (a retry, the next dispatch) is handed it again.
    ///
    /// # Errors
    ///
    /// [`Error::LostClaim`] or [`Error::Interrupted`] once the claim is gone;
    /// [`Error::Unavailable`] when the store cannot be read.
    pub fn next_message(&self, wait: Duration) -> Result<Option<Message>, Error> {
        let wait_ms = u32::try_from(wait.as_millis()).unwrap_or(u32::MAX);
        Ok(self.raw().next_message(wait_ms)?)
    }

    /// Every message handed to this claim now, oldest first, without waiting: the steers and
    /// follow-ups that arrived since the last call. An iterator that ends when the inbox has
    /// nothing new (or on the first error, which it yields).
    pub fn messages(&self) -> impl Iterator<Item = Result<Message, Error>> + '_ {
        let mut done = false;
        std::iter::from_fn(move || {
            if done {
                return None;
            }
            match self.next_message(Duration::ZERO) {
                Ok(Some(message)) => Some(Ok(message)),
                Ok(None) => {
                    done = true;
                    None
                }
                Err(e) => {
                    done = true;
                    Some(Err(e))
                }
            }
        })
    }

    /// Acknowledges message `seq` of this thread: it is marked acknowledged and appended to the
    /// thread log in one step (its body as the entry's data, the rest as the entry's
    /// [`LogEntry::message`] note), so a later run sees it in the history and is not handed it
    /// again. Returns the entry's log sequence; acking again returns the same sequence.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] when `seq` is not a message of this thread or was discarded;
    /// [`Error::Duplicate`] when another dispatch acknowledged it; [`Error::LostClaim`],
    /// [`Error::Interrupted`].
    pub fn ack_message(&self, seq: u64) -> Result<u64, Error> {
        Ok(self.raw().ack_message(seq)?)
    }

    /// Streams `chunk` (for example a model's next tokens) to whoever watches this dispatch;
    /// returns its sequence within this claim (1, 2, ...). Not durable: watchers may resume
    /// for the host's `stream_retention` after the dispatch settles, and the durable record
    /// stays the result and the thread log. A later claim of the dispatch (a retry, a resume)
    /// starts again at 1 and watchers are told to drop what earlier claims streamed. The host
    /// checks it in memory, not in the store, so it is cheap enough to call per token.
    ///
    /// An empty chunk is passed to the host as is (it refuses it), so a bug that emits nothing
    /// shows; [`Claim::emit_text`] skips empty text instead.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for an empty chunk or one over 64 KiB; [`Error::Denied`] past the
    /// host's `max_stream_bytes` for this claim or its emit rate (streaming is best effort: a
    /// guest may stop emitting and carry on with its work); [`Error::LostClaim`] or
    /// [`Error::Interrupted`] once the claim is gone or settled.
    pub fn emit(&self, chunk: impl AsRef<[u8]>) -> Result<u64, Error> {
        Ok(self.raw().emit(chunk.as_ref())?)
    }

    /// Streams `text` as one UTF-8 chunk, like [`Claim::emit`]; returns its sequence. Empty
    /// text is not sent: it returns `Ok(0)` without calling the host (0 is never a sequence),
    /// so a model's empty deltas can be passed straight through.
    ///
    /// # Errors
    ///
    /// Those of [`Claim::emit`]: notably [`Error::Invalid`] for text over 64 KiB and
    /// [`Error::Denied`] past the host's stream limits.
    pub fn emit_text(&self, text: &str) -> Result<u64, Error> {
        if text.is_empty() {
            return Ok(0);
        }
        self.emit(text.as_bytes())
    }

    /// Enqueues a follow-up dispatch; without [`Enqueue::thread`] it goes to this dispatch's
    /// thread. Returns the new dispatch's id.
    ///
    /// # Errors
    ///
    /// [`Error::Denied`] when this plugin may not address the target agent,
    /// [`Error::Duplicate`] when the dedupe key is taken, [`Error::Invalid`] for a bad request
    /// (including a [`Enqueue::json`] value that failed to serialize); also whatever else the
    /// host refuses with.
    pub fn enqueue(&self, request: Enqueue) -> Result<String, Error> {
        let request = request.into_request()?;
        Ok(self.raw().enqueue(&request)?)
    }
}

#[cfg(feature = "agent")]
impl Claim<'static> {
    /// Wraps a claim this guest took with `claim-next`.
    pub(crate) fn owned(claim: mailbox::Claim) -> Self {
        let info = claim.info();
        Claim {
            handle: Handle::Owned(claim),
            info,
            steps: StepKeys::default(),
        }
    }
}

impl DispatchInfo {
    /// The metadata value under `key`, if the submitter set one.
    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.metadata
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

impl LogEntry {
    /// The entry's bytes as UTF-8 text, or `None` when they are not UTF-8.
    pub fn text(&self) -> Option<&str> {
        std::str::from_utf8(&self.data).ok()
    }
}

impl Message {
    /// The message's body as UTF-8 text, or `None` when it is not UTF-8.
    pub fn text(&self) -> Option<&str> {
        std::str::from_utf8(&self.body).ok()
    }

    /// The metadata value under `key`, if the sender set one.
    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.metadata
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Whole milliseconds, saturating: a WIT `u64` of milliseconds outlasts any real delay.
pub(crate) fn duration_to_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cases `testdata/masks.json` shares with the Python and JavaScript SDKs.
    #[cfg(feature = "json")]
    #[test]
    fn unmasked_keeps_what_the_shared_cases_expect() -> Result<(), serde_json::Error> {
        use serde_json::Value;
        let cases: Vec<Value> = serde_json::from_str(include_str!("../testdata/masks.json"))?;
        assert!(cases.len() >= 6);
        for case in cases {
            let entries = case["entries"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| LogEntry {
                    seq: e["seq"].as_u64().unwrap_or_default(),
                    data: Vec::new(),
                    appended_at: 0,
                    message: None,
                    turn: e.get("turn").map(|t| TurnMark {
                        event: if t["event"] == "rolled-back" {
                            TurnEvent::RolledBack
                        } else {
                            TurnEvent::Interrupted
                        },
                        dispatch: "d".into(),
                        message: 1,
                        masked: t["masked"].as_array().map(|r| LogRange {
                            first: r[0].as_u64().unwrap_or_default(),
                            last: r[1].as_u64().unwrap_or_default(),
                        }),
                    }),
                })
                .collect();
            let kept: Vec<Value> = unmasked(entries).iter().map(|e| e.seq.into()).collect();
            assert_eq!(Value::from(kept), case["expected"], "{}", case["name"]);
        }
        Ok(())
    }

    fn info_with_metadata(metadata: &[(&str, &str)]) -> DispatchInfo {
        DispatchInfo {
            id: "d1".into(),
            agent: "echo".into(),
            thread: "t".into(),
            run_id: "r".into(),
            payload: Vec::new(),
            metadata: metadata
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            attempt: 0,
            max_attempts: 3,
            priority: 128,
            claims: 1,
            resumes: 0,
            concurrency_key: None,
        }
    }

    #[test]
    fn metadata_finds_a_key_and_misses_an_absent_one() {
        let info = info_with_metadata(&[("a", "1"), ("reply-to", "echo:t")]);
        assert_eq!(info.metadata("reply-to"), Some("echo:t"));
        assert_eq!(info.metadata("missing"), None);
    }

    #[test]
    fn log_entry_text_is_none_for_bytes_that_are_not_utf8() {
        let text = LogEntry {
            seq: 1,
            data: b"hi".to_vec(),
            appended_at: 0,
            message: None,
            turn: None,
        };
        let binary = LogEntry {
            seq: 2,
            data: vec![0xff, 0xfe],
            appended_at: 0,
            message: None,
            turn: None,
        };
        assert_eq!(text.text(), Some("hi"));
        assert_eq!(binary.text(), None);
    }

    #[test]
    fn durations_convert_to_whole_milliseconds_and_saturate() {
        assert_eq!(duration_to_ms(Duration::from_micros(2_500)), 2);
        assert_eq!(duration_to_ms(Duration::MAX), u64::MAX);
    }
}
