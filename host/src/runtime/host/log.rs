//! The `log` interface and every guest log line: `log.write`, and stdout and stderr (which the
//! runtime turns into lines through the same [`GuestState::emit`]).
//!
//! Lines are tagged with plugin, dispatch and attempt, and held to a budget per dispatch
//! ([`MAX_LOG_LINES`] lines of at most [`MAX_LOG_LINE`] bytes): past it they are counted and
//! dropped, so a log flood cannot drown the host's log.
//!
//! Guest text reaches the host's log with its control characters escaped
//! ([`escape_log_text`]): a guest cannot end a line early, start a forged host line, or send
//! terminal escape sequences to an operator's terminal.

use std::borrow::Cow;
use std::sync::Mutex;

use tracing::{debug, error, info, trace, warn};

use super::GuestState;
use super::policy::{MAX_LOG_LINE, MAX_LOG_LINES};
use crate::runtime::bindings::Level;
use crate::runtime::bindings::handler::homing::agent::log;

/// Which dispatch an instance is working on, for log lines.
#[derive(Debug, Default, Clone)]
pub struct LogTag {
    /// The dispatch id.
    pub dispatch: String,
    /// Its attempt.
    pub attempt: u32,
}

/// Log lines written by one instance, shared with its stdout/stderr streams.
#[derive(Debug, Default)]
pub struct LogState {
    /// The current dispatch.
    pub tag: LogTag,
    /// Lines written so far.
    pub lines: u32,
    /// Lines dropped past the cap.
    pub dropped: u32,
}

impl LogState {
    /// Starts the budget of a new dispatch: the budget is per dispatch, also when an instance
    /// serves several.
    pub fn begin(&mut self, tag: LogTag) {
        self.tag = tag;
        self.lines = 0;
        self.dropped = 0;
    }
}

/// `text` with its control characters escaped, for the host's log: `\n` and `\r` as those
/// two characters, any other control character (ESC, NUL, DEL, C1) as `\u{..}`; tabs are kept.
/// So a guest's line stays one line of the host's log and carries no terminal escapes.
pub fn escape_log_text(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() && c != '\t') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\t' => out.push(c),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

impl GuestState {
    /// Writes one guest log line, within the instance's budget.
    pub fn emit(log: &Mutex<LogState>, plugin: &str, level: Level, message: &str) {
        let Ok(mut state) = log.lock() else { return };
        if state.lines >= MAX_LOG_LINES {
            state.dropped += 1;
            if state.dropped == 1 {
                warn!(plugin, dispatch = %state.tag.dispatch, "guest log budget of {MAX_LOG_LINES} lines used up; dropping further lines");
            }
            return;
        }
        state.lines += 1;
        let mut end = message.len().min(MAX_LOG_LINE);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        let message = escape_log_text(message.get(..end).unwrap_or_default());
        let (dispatch, attempt) = (&state.tag.dispatch, state.tag.attempt);
        match level {
            Level::Trace => trace!(target: "guest", plugin, %dispatch, attempt, "{message}"),
            Level::Debug => debug!(target: "guest", plugin, %dispatch, attempt, "{message}"),
            Level::Info => info!(target: "guest", plugin, %dispatch, attempt, "{message}"),
            Level::Warn => warn!(target: "guest", plugin, %dispatch, attempt, "{message}"),
            Level::Error => error!(target: "guest", plugin, %dispatch, attempt, "{message}"),
        }
    }
}

impl log::Host for GuestState {
    async fn write(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        GuestState::emit(&self.log, &self.plugin.name, level, &message);
        Ok(())
    }
}
