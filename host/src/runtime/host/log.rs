//! The `log` interface and every guest log line: `log.write`, and stdout and stderr (which the
//! runtime turns into lines through the same [`GuestState::emit`]).
//!
//! Lines are tagged with plugin, dispatch and attempt, and held to a budget per dispatch
//! ([`MAX_LOG_LINES`] lines of at most [`MAX_LOG_LINE`] bytes): past it they are counted and
//! dropped, so a log flood cannot drown the host's log.
//!
//! Guest text reaches the host's log with the plugin's secret values replaced by `[redacted]`
//! ([`Secrets`]), then with its control characters escaped ([`escape_log_text`]): a guest that
//! prints its API key does not put it in the host's log, and cannot end a line early, start a
//! forged host line, or send terminal escape sequences to an operator's terminal.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use tracing::{debug, error, info, trace, warn};

use super::GuestState;
use super::policy::{MAX_LOG_LINE, MAX_LOG_LINES};
use crate::runtime::bindings::Level;
use crate::runtime::bindings::log;

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
    /// The plugin's secret values, scrubbed from every line.
    pub secrets: Arc<Secrets>,
}

/// What replaces a secret value in a logged line.
pub const REDACTED: &str = "[redacted]";

/// The shortest line of a multi-line secret scrubbed on its own (a guest's output reaches the
/// log line by line, so a secret PEM key is scrubbed line by line too); shorter lines, such as
/// a lone brace, would redact text that is no secret.
const MIN_SECRET_LINE: usize = 8;

/// The shortest path segment of a secret URL scrubbed on its own: a webhook's token segment is
/// longer; a word such as `services` or `webhooks` is not, and is no secret.
const MIN_URL_SEGMENT: usize = 16;

/// A plugin's secret values (the `secret = true` entries of its `variables` and `env`), to
/// scrub from the text a guest logs and from what the host shows of its outbound requests.
/// `Debug` shows how many, never one.
#[derive(Default)]
pub struct Secrets {
    /// Longest first, so a secret holding another is replaced whole.
    values: Vec<zeroize::Zeroizing<String>>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({} redacted)", self.values.len())
    }
}

impl Secrets {
    /// The secrets to scrub: each value; its percent-encoded form (as a guest puts it in a path
    /// or a query); the parts of one that is a URL ([`url_parts`]); and each line of at least
    /// [`MIN_SECRET_LINE`] bytes of a multi-line one. Empty values are skipped.
    pub fn new<'a>(values: impl IntoIterator<Item = &'a str>) -> Self {
        let mut out: Vec<zeroize::Zeroizing<String>> = Vec::new();
        let mut add = |text: &str| {
            if !text.is_empty() && !out.iter().any(|v| v.as_str() == text) {
                out.push(zeroize::Zeroizing::new(text.to_owned()));
            }
        };
        for value in values {
            add(value);
            let encoded = zeroize::Zeroizing::new(
                percent_encoding::utf8_percent_encode(value, URL_COMPONENT).to_string(),
            );
            add(&encoded);
            for part in url_parts(value) {
                add(part);
            }
            if value.contains('\n') {
                for line in value.lines().map(|l| l.trim_end_matches('\r')) {
                    if line.len() >= MIN_SECRET_LINE {
                        add(line);
                    }
                }
            }
        }
        out.sort_by_key(|v| std::cmp::Reverse(v.len()));
        Secrets { values: out }
    }

    /// These secrets and `more`, each with the forms [`Secrets::new`] adds.
    pub fn and<'a>(&self, more: impl IntoIterator<Item = &'a str>) -> Secrets {
        let mut values = self.values.clone();
        for value in Secrets::new(more).values {
            if !values.iter().any(|v| v.as_str() == value.as_str()) {
                values.push(value);
            }
        }
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        Secrets { values }
    }

    /// `text` with every secret value replaced by [`REDACTED`].
    pub fn scrub<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let mut out = Cow::Borrowed(text);
        for secret in &self.values {
            if out.contains(secret.as_str()) {
                out = Cow::Owned(out.replace(secret.as_str(), REDACTED));
            }
        }
        out
    }

    /// Whether `bytes` hold a secret anywhere.
    pub fn found_in(&self, bytes: &[u8]) -> bool {
        self.values
            .iter()
            .any(|secret| memchr::memmem::find(bytes, secret.as_bytes()).is_some())
    }

    /// How many bytes at the end of `text` might begin a secret (the longest end of `text`
    /// that is a proper beginning of one): a stream cut there holds them back, so the secret
    /// is whole, and scrubbed, in the next piece.
    pub fn unfinished(&self, text: &[u8]) -> usize {
        self.values
            .iter()
            .map(|secret| open_prefix(secret.as_bytes(), text))
            .max()
            .unwrap_or(0)
    }
}

/// What a URL component keeps unencoded: the unreserved characters of RFC 3986 (so the set
/// of JavaScript's `encodeURIComponent`, less `!'()*`).
const URL_COMPONENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// The parts of a secret that is an absolute URL (a Slack- or Discord-style webhook, say) that
/// a request or what the host shows of it can hold apart from the whole: the user information
/// and its password, the path, its segments of at least [`MIN_URL_SEGMENT`] bytes, the query
/// and each of its values. Parts shorter than [`MIN_SECRET_LINE`] are left out (a path of `/`
/// is no secret). A value that is not such a URL has none.
fn url_parts(value: &str) -> Vec<&str> {
    let value = value.trim();
    let Some(rest) = value
        .split_once("://")
        .filter(|(scheme, _)| !scheme.is_empty() && !scheme.contains(char::is_whitespace))
        .map(|(_, rest)| rest)
    else {
        return Vec::new();
    };
    let (authority, path_and_query) =
        rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()));
    let (path_and_query, _fragment) = path_and_query
        .split_once('#')
        .unwrap_or((path_and_query, ""));
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let mut parts = Vec::new();
    if let Some((userinfo, _host)) = authority.rsplit_once('@') {
        parts.push(userinfo);
        parts.extend(userinfo.split_once(':').map(|(_, password)| password));
    }
    parts.push(path_and_query);
    parts.push(path);
    parts.extend(path.split('/').filter(|s| s.len() >= MIN_URL_SEGMENT));
    parts.push(query);
    parts.extend(
        query
            .split('&')
            .map(|pair| pair.split_once('=').map_or(pair, |(_, v)| v)),
    );
    parts.retain(|part| part.len() >= MIN_SECRET_LINE);
    parts
}

/// The length of the longest proper beginning of `secret` that `text` ends with, in time
/// linear in both (Knuth-Morris-Pratt: a long secret and a guest's flood of look-alike bytes
/// cost no quadratic time).
fn open_prefix(secret: &[u8], text: &[u8]) -> usize {
    if secret.len() < 2 {
        return 0;
    }
    // fail[i]: the longest proper beginning of secret[..=i] that it also ends with.
    let mut fail = vec![0usize; secret.len()];
    let mut k = 0;
    for i in 1..secret.len() {
        while k > 0 && secret[i] != secret[k] {
            k = fail[k - 1];
        }
        if secret[i] == secret[k] {
            k += 1;
        }
        fail[i] = k;
    }
    // Only the last len - 1 bytes can hold a proper beginning.
    let start = text.len().saturating_sub(secret.len() - 1);
    let mut k = 0;
    for &b in &text[start..] {
        while k > 0 && (k == secret.len() || b != secret[k]) {
            k = fail[k - 1];
        }
        if b == secret[k] {
            k += 1;
        }
    }
    if k == secret.len() { fail[k - 1] } else { k }
}

impl LogState {
    /// Starts the budget of a new dispatch: the budget is per dispatch, also when an instance
    /// serves several.
    pub fn begin(&mut self, tag: LogTag) {
        // The secrets stay: they are the plugin's.
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
        // Scrubbed whole, then cut: a cut never splits a secret the line holds.
        let message = state.secrets.scrub(message);
        let message = escape_log_text(crate::input::cut_to(&message, MAX_LOG_LINE));
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn secrets_are_scrubbed_whole_and_line_by_line() {
        let secrets = Secrets::new([
            "sk-abc",
            "sk-abcdef",
            "",
            "-----BEGIN-----\nline-one-0123\nab",
        ]);
        assert_eq!(
            secrets.scrub("key sk-abcdef and sk-abc, twice sk-abc"),
            "key [redacted] and [redacted], twice [redacted]"
        );
        assert!(matches!(secrets.scrub("nothing here"), Cow::Borrowed(_)));
        // A multi-line secret: whole, or line by line (lines under 8 bytes are left alone).
        assert_eq!(
            secrets.scrub("pem: -----BEGIN-----\nline-one-0123\nab."),
            "pem: [redacted]."
        );
        assert_eq!(secrets.scrub("line-one-0123"), "[redacted]");
        assert_eq!(secrets.scrub("ab"), "ab");
        assert!(!format!("{secrets:?}").contains("sk-"));
        // More secrets (an access token issued later) join, longest first.
        let more = secrets.and(["tok-123", "sk-abc"]);
        assert_eq!(more.scrub("tok-123 sk-abcdef"), "[redacted] [redacted]");
        assert_eq!(
            secrets.scrub("tok-123"),
            "tok-123",
            "the first set is unchanged"
        );
    }

    #[test]
    fn a_secret_url_is_scrubbed_whole_and_in_the_parts_a_request_carries() {
        let hook = "https://hooks.example.com/services/T0001/B0002/XyZ0123456789abcdefGHIJ";
        let keyed = "https://user:pa55-w0rd-long@api.example.com/v1?key=sk-query-value-1&x=1";
        let secrets = Secrets::new([hook, keyed, "a b/c+d=secret"]);
        // Whole, and as the path a request to it carries.
        assert_eq!(secrets.scrub(&format!("POST {hook}")), "POST [redacted]");
        assert_eq!(
            secrets.scrub("/services/T0001/B0002/XyZ0123456789abcdefGHIJ"),
            "[redacted]"
        );
        // Its token segment alone, in another path; the short words of the path stay.
        assert_eq!(
            secrets.scrub("/other/XyZ0123456789abcdefGHIJ/services"),
            "/other/[redacted]/services"
        );
        // The password, the user information, the query and a query value.
        assert_eq!(secrets.scrub("pw pa55-w0rd-long"), "pw [redacted]");
        assert_eq!(secrets.scrub("?key=sk-query-value-1"), "?key=[redacted]");
        // A plain secret as a guest encodes it in a URL.
        assert_eq!(
            secrets.scrub("/q?s=a%20b%2Fc%2Bd%3Dsecret"),
            "/q?s=[redacted]"
        );
        // A URL that is no secret, and the short parts of one, are left alone.
        assert_eq!(
            secrets.scrub("https://hooks.example.com/"),
            "https://hooks.example.com/"
        );
        assert_eq!(secrets.scrub("x=1"), "x=1");
        assert!(secrets.found_in(b"{\"hook\":\"XyZ0123456789abcdefGHIJ\"}"));
        assert!(!secrets.found_in(b"nothing"));
    }

    #[test]
    fn an_unfinished_secret_at_the_end_is_found() {
        let secrets = Secrets::new(["sk-live-123", "aab"]);
        assert_eq!(secrets.unfinished(b"text sk-li"), 5);
        assert_eq!(secrets.unfinished(b"text sk-live-123"), 0);
        assert_eq!(secrets.unfinished(b"aaaa"), 2);
        assert_eq!(secrets.unfinished(b"xyz"), 0);
        assert_eq!(secrets.unfinished(b""), 0);
        // Against the obvious quadratic search, on look-alike bytes.
        let brute = |secret: &[u8], text: &[u8]| {
            (1..secret.len())
                .rev()
                .find(|&n| text.ends_with(&secret[..n]))
                .unwrap_or(0)
        };
        for secret in [&b"abab"[..], b"aaab", b"abcabd", b"a", b"aabaaab"] {
            for text in [
                &b"abab"[..],
                b"xxabaa",
                b"aaaaaa",
                b"abcab",
                b"aabaa",
                b"aabaaabaa",
            ] {
                assert_eq!(
                    open_prefix(secret, text),
                    brute(secret, text),
                    "{secret:?} {text:?}"
                );
            }
        }
    }
}
