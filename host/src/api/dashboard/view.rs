//! The pieces every page is made of: the layout, links, times, stored bytes shown as text,
//! pretty JSON or hex. Everything goes through maud, which escapes every value it inserts;
//! nothing here writes unescaped text except the fixed SVG of the chart, built from numbers.

use std::fmt::Write as _;

use maud::{DOCTYPE, Markup, html};

use super::session::Session;
use crate::store::{DispatchRow, Status};

/// The largest part of a stored value a page shows; the rest is counted, not shown.
pub(super) const SHOW_BYTES: usize = 256 << 10;

/// Which page of the navigation is current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Nav {
    Overview,
    Dispatches,
    Waiting,
    DeadLetters,
    Agents,
    Schedules,
    None,
}

/// The page around `body`.
pub(super) fn page(title: &str, nav: Nav, session: Option<&Session>, body: Markup) -> Markup {
    let link = |href: &'static str, label: &'static str, this: Nav| {
        html! { a href=(href) aria-current=[(nav == this).then_some("page")] { (label) } }
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="htmx-config" content=r#"{"includeIndicatorStyles":false,"allowEval":false,"allowScriptTags":false,"selfRequestsOnly":true}"#;
                title { (title) " · Homing" }
                link rel="stylesheet" href="/assets/app.css";
                script src="/assets/htmx.min.js" defer {}
                script src="/assets/app.js" defer {}
            }
            body {
                a.skip href="#main" { "Skip to content" }
                header.top {
                    span.brand { "Homing" }
                    @if let Some(session) = session {
                        nav aria-label="Main" {
                            (link("/", "Overview", Nav::Overview))
                            (link("/dispatches", "Dispatches", Nav::Dispatches))
                            (link("/waiting", "Waiting", Nav::Waiting))
                            (link("/dead-letters", "Dead letters", Nav::DeadLetters))
                            (link("/agents", "Agents", Nav::Agents))
                            (link("/schedules", "Schedules", Nav::Schedules))
                        }
                        div.who {
                            span { (session.name) " (" (session.role) ")" }
                            form method="post" action="/logout" {
                                (csrf(session))
                                button type="submit" { "Log out" }
                            }
                        }
                    }
                }
                main #main { (body) }
            }
        }
    }
}

/// The hidden CSRF field of a form.
pub(super) fn csrf(session: &Session) -> Markup {
    html! { input type="hidden" name="csrf" value=(session.csrf); }
}

/// A status badge.
pub(super) fn status(status: Status) -> Markup {
    html! { span class={ "status " (status.as_str()) } { (status.as_str()) } }
}

/// Percent-encodes `text` for a path segment or a query value.
pub(super) fn encode(text: &str) -> String {
    crate::api::view::encode(text)
}

/// The page of a dispatch.
pub(super) fn dispatch_href(id: &str) -> String {
    format!("/dispatches/{}", encode(id))
}

/// The page of a thread.
pub(super) fn thread_href(thread: &str) -> String {
    format!("/threads/{}", encode(thread))
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS UTC`.
pub(super) fn time(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (proleptic Gregorian), by 400-year eras.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// A duration in milliseconds, roughly: `45s`, `3m 12s`, `2h 5m`, `3d 4h`.
pub(super) fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// A time with how long ago it was.
pub(super) fn when(ms: u64, now: u64) -> Markup {
    html! {
        time title=(time(ms)) { (time(ms)) }
        @if now >= ms { span.muted { " (" (age(now - ms)) " ago)" } }
        @else { span.muted { " (in " (age(ms - now)) ")" } }
    }
}

/// How stored bytes are best shown.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Shown {
    /// A JSON object or array, pretty-printed.
    Json(String),
    /// UTF-8 text.
    Text(String),
    /// Anything else, as a hex dump.
    Hex(String),
}

/// Shows at most [`SHOW_BYTES`] of `data` as pretty JSON, text or hex.
pub(super) fn shown(data: &[u8]) -> Shown {
    let data = &data[..data.len().min(SHOW_BYTES)];
    match std::str::from_utf8(data) {
        Ok(text) => match serde_json::from_str::<serde_json::Value>(text) {
            Ok(value @ (serde_json::Value::Object(_) | serde_json::Value::Array(_))) => {
                Shown::Json(serde_json::to_string_pretty(&value).unwrap_or_else(|_| text.into()))
            }
            _ => Shown::Text(text.to_owned()),
        },
        // Cut inside a character by the cap: show the whole characters as text.
        Err(e) if e.error_len().is_none() && e.valid_up_to() > 0 => {
            Shown::Text(String::from_utf8_lossy(&data[..e.valid_up_to()]).into_owned())
        }
        Err(_) => Shown::Hex(hex_dump(data)),
    }
}

/// 16 bytes a line: offset, hex, and the printable ASCII.
fn hex_dump(data: &[u8]) -> String {
    let mut out = String::new();
    for (i, chunk) in data.chunks(16).enumerate() {
        let _ = write!(out, "{:08x}  ", i * 16);
        for b in chunk {
            let _ = write!(out, "{b:02x} ");
        }
        for _ in chunk.len()..16 {
            out.push_str("   ");
        }
        out.push(' ');
        for b in chunk {
            out.push(if b.is_ascii_graphic() || *b == b' ' {
                *b as char
            } else {
                '.'
            });
        }
        out.push('\n');
    }
    out
}

/// Stored bytes in a `<pre>`, with what kind they are and how many.
pub(super) fn bytes(data: &[u8], id: &str) -> Markup {
    let (kind, text) = match shown(data) {
        Shown::Json(t) => ("JSON", t),
        Shown::Text(t) => ("text", t),
        Shown::Hex(t) => ("binary, as hex", t),
    };
    html! {
        p.muted { (data.len()) " bytes, shown as " (kind)
            @if data.len() > SHOW_BYTES { "; the first " (SHOW_BYTES) " bytes" } }
        pre #(id) { (text) }
    }
}

/// A small bar chart of per-minute counts, oldest first, as inline SVG (no script, no style).
pub(super) fn chart(series: &[u64], label: &str) -> Markup {
    let max = series.iter().copied().max().unwrap_or(0).max(1);
    let width = series.len() * 10;
    html! {
        svg.chart viewBox={ "0 0 " (width) " 40" } preserveAspectRatio="none" role="img" aria-label=(label) {
            title { (label) }
            line x1="0" y1="39.5" x2=(width) y2="39.5" {}
            @for (i, n) in series.iter().enumerate() {
                @let h = (*n as f64 / max as f64 * 38.0).max(if *n > 0 { 2.0 } else { 0.0 });
                rect x=(i * 10 + 1) y=(format!("{:.1}", 39.0 - h)) width="8" height=(format!("{h:.1}")) {}
            }
        }
    }
}

/// A table of dispatches; with `select`, a checkbox per row (the form around it is the
/// caller's) and the last errors.
pub(super) fn dispatch_table(rows: &[DispatchRow], now: u64, select: Option<&Session>) -> Markup {
    html! {
        div.scroll {
            table.dispatches.stack {
                thead { tr {
                    @if select.is_some() {
                        th scope="col" {
                            label { input #select-all type="checkbox" aria-label="Select all"; }
                        }
                    }
                    th scope="col" { "Id" }
                    th scope="col" { "Agent" }
                    th scope="col" { "Thread" }
                    th scope="col" { "Status" }
                    th.num scope="col" { "Priority" }
                    th.num scope="col" { "Attempts" }
                    th scope="col" { "Created" }
                    @if select.is_some() { th scope="col" { "Last error" } }
                } }
                tbody {
                    @for row in rows {
                        tr data-id=(row.id) {
                            @if select.is_some() {
                                td data-label="Select" { input type="checkbox" name="id" value=(row.id) aria-label={ "Select " (row.id) }; }
                            }
                            td.id data-label="Id" { a href=(dispatch_href(&row.id)) { (row.id) } }
                            td data-label="Agent" { (row.agent) }
                            td data-label="Thread" { a href=(thread_href(&row.thread)) { (row.thread) } }
                            td data-label="Status" { (status(row.status)) }
                            td.num data-label="Priority" { (row.priority) }
                            td.num data-label="Attempts" { (row.attempt) "/" (row.max_attempts) }
                            td data-label="Created" { (when(row.created_at, now)) }
                            @if select.is_some() { td data-label="Last error" { (row.last_error.as_deref().unwrap_or("")) } }
                        }
                    }
                    @if rows.is_empty() {
                        tr { td colspan="9" { span.muted { "No dispatches match." } } }
                    }
                }
            }
        }
    }
}

/// One notice above a page, named by `?notice=` (with `?n=`, a count or a message's
/// sequence) after an action; a refusal shows as an error. Only these fixed sentences: a link
/// cannot put words of its own on the page. Unknown names show nothing.
pub(super) fn notice(name: Option<&str>, n: Option<&str>) -> Markup {
    let n: Option<u64> = n.and_then(|n| n.parse().ok());
    let seq = n.map_or_else(String::new, |n| format!(" {n}"));
    let (text, error) = match name {
        Some("cancelled") => ("Cancelled.".to_owned(), false),
        Some("retried") => (
            "Retried: this is the new dispatch, queued again.".to_owned(),
            false,
        ),
        Some("interrupted") => ("Thread interrupted.".to_owned(), false),
        Some("retried-n") => (format!("Retried {} dead letter(s).", n.unwrap_or(0)), false),
        Some("none-selected") => ("Nothing was selected.".to_owned(), false),
        Some("sent") => (format!("Message{seq} sent: it is pending."), false),
        Some("sent-follow-up") => (
            format!("Message{seq} sent: it started a follow-up dispatch."),
            false,
        ),
        Some("message-empty") => ("Not sent: the message is empty.".to_owned(), true),
        Some("message-unknown-agent") => {
            ("Not sent: no such agent is configured.".to_owned(), true)
        }
        Some("message-too-large") => (
            "Not sent: the message is larger than the host accepts.".to_owned(),
            true,
        ),
        Some("message-inbox-full") => (
            "Not sent: the thread's inbox is full ([host] max_inbox messages pending).".to_owned(),
            true,
        ),
        Some("message-needs-agent") => (
            "Not sent: this thread has never run an agent; choose the agent to answer it."
                .to_owned(),
            true,
        ),
        Some("message-refused") => ("Not sent: the store refused the message.".to_owned(), true),
        Some("message-thread-busy") => (
            "Not sent: the thread is busy and its agent rejects messages while it runs (on_busy = reject).".to_owned(),
            true,
        ),
        Some("approved") => (
            "Approved: the waitpoint is completed and its dispatch resumes.".to_owned(),
            false,
        ),
        Some("rejected") => (
            "Rejected: the waitpoint is completed and its dispatch resumes.".to_owned(),
            false,
        ),
        Some("waitpoint-settled") => (
            "Not done: the waitpoint was no longer pending (completed, cancelled or timed out)."
                .to_owned(),
            true,
        ),
        Some("waitpoint-missing") => ("Not done: no such waitpoint.".to_owned(), true),
        Some("paused") => (
            "Paused: no host claims its dispatches until it is resumed.".to_owned(),
            false,
        ),
        Some("resumed") => ("Resumed.".to_owned(), false),
        Some("schedule-paused") => (
            "Paused: none of its slots fires until it is resumed.".to_owned(),
            false,
        ),
        Some("triggered") => ("Fired: its dispatch is queued.".to_owned(), false),
        Some("trigger-buffered") => (
            "Buffered: its last dispatch is still live; this one fires when it ends.".to_owned(),
            false,
        ),
        Some("trigger-skipped") => (
            "Not fired: its last dispatch is still live and its overlap policy skips (the API's and the CLI's trigger take another policy)."
                .to_owned(),
            true,
        ),
        Some("not-paused") => ("It was not paused.".to_owned(), false),
        Some("pause-refused") => (
            "Not paused: the reason must be printable and at most 1 KiB.".to_owned(),
            true,
        ),
        Some("waitpoint-refused") => ("Not done: the store refused the result.".to_owned(), true),
        _ => return html! {},
    };
    if error {
        html! { p.notice.error role="alert" { (text) } }
    } else {
        html! { p.notice role="status" { (text) } }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_ages_read_plainly() {
        assert_eq!(time(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(time(1_709_210_096_000), "2024-02-29 12:34:56 UTC");
        assert_eq!(time(4_102_444_800_000), "2100-01-01 00:00:00 UTC");
        assert_eq!(age(59_999), "59s");
        assert_eq!(age(192_000), "3m 12s");
        assert_eq!(age(7_500_000), "2h 5m");
        assert_eq!(encode("a b/<c>"), "a%20b%2F%3Cc%3E");
    }

    #[test]
    fn bytes_show_as_json_text_or_hex_and_are_escaped() {
        assert_eq!(shown(b"{\"a\":1}"), Shown::Json("{\n  \"a\": 1\n}".into()));
        assert_eq!(shown(b"42"), Shown::Text("42".into()));
        assert!(
            matches!(shown(&[0xff, 0, 0x41]), Shown::Hex(h) if h.starts_with("00000000  ff 00 41") && h.trim_end().ends_with("..A"))
        );
        let html = bytes(b"<script>alert(1)</script>", "p").into_string();
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;/script&gt;") && !html.contains("<script>"),
            "{html}"
        );
        let mut long = "é".repeat(SHOW_BYTES);
        long.push('x');
        assert!(matches!(shown(long.as_bytes()), Shown::Text(t) if t.len() == SHOW_BYTES));
    }
}
