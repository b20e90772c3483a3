//! How a reader sees a dispatch's journal (the contract, docs/contract.md, section 11): the
//! one view the API (`GET /v1/dispatches/{id}/journal`), `homing dispatch show ID --journal`
//! and the dashboard's dispatch page all show.
//!
//! A listing shows each call entry without its body: its position, kind, the claim and attempt
//! that recorded it, what it answered in brief (for `http` the method, the URL as recorded,
//! without query values, and the status; for the others the small answer: a sequence, a range,
//! an id), when, how long the call took live and its stored size. Steps are shown by key,
//! without their values. [`entry`] gives one entry with its body.
//!
//! A listing reads a page ([`page`], [`crate::store::Journal::journal_page`]): no body and no
//! step value, at most the page's bytes whatever the journal holds. [`entry`] reads the one
//! entry. Only the CLI, reading its own store, loads a journal whole ([`load`]).

use base64::Engine;
use serde::Serialize;
use serde_json::{Value, json};

use crate::store::journal::{CallSummary, JournalAsk, JournalPage};
use crate::store::{CallEntry, CallKind, JournalData, Step, Store, StoreError};

/// The largest http body shown pretty-printed as JSON (the dashboard); a larger one is left
/// out of the page.
pub const PRETTY_MAX: usize = 64 << 10;

/// Why a journal, or one of its entries, was not shown.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// No dispatch has this id.
    #[error("no dispatch `{}`", .0.escape_debug())]
    NoDispatch(String),
    /// The dispatch has no entry at this position.
    #[error("dispatch `{}` has no journal entry at position {pos}", .dispatch.escape_debug())]
    NoEntry {
        /// The dispatch.
        dispatch: String,
        /// The position asked for.
        pos: u32,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The journal of dispatch `id`: its call entries by position, and its steps by key.
///
/// # Errors
///
/// [`JournalError::NoDispatch`] for an unknown id; [`JournalError::Store`].
pub async fn load(store: &Store, id: &str) -> Result<JournalData, JournalError> {
    if store.mailbox.load(id).await?.is_none() {
        return Err(JournalError::NoDispatch(id.to_owned()));
    }
    Ok(store.journal.load_journal(id).await?)
}

/// A page of dispatch `id`'s journal as `ask` says ([`crate::store::Journal::journal_page`]):
/// entries without bodies, steps without values.
///
/// # Errors
///
/// [`JournalError::NoDispatch`] for an unknown id; [`JournalError::Store`].
pub async fn page(store: &Store, id: &str, ask: &JournalAsk) -> Result<JournalPage, JournalError> {
    known(store, id).await?;
    Ok(store.journal.journal_page(id, ask).await?)
}

/// Entry `pos` of dispatch `id`'s journal, without its body (its size instead).
///
/// # Errors
///
/// [`JournalError::NoDispatch`], [`JournalError::NoEntry`], [`JournalError::Store`].
pub async fn summary(store: &Store, id: &str, pos: u32) -> Result<CallSummary, JournalError> {
    known(store, id).await?;
    store
        .journal
        .call_summary(id, pos)
        .await?
        .ok_or_else(|| no_entry(id, pos))
}

/// Entry `pos` of dispatch `id`'s journal, with its body: the one entry read.
///
/// # Errors
///
/// [`JournalError::NoDispatch`], [`JournalError::NoEntry`], [`JournalError::Store`].
pub async fn entry(store: &Store, id: &str, pos: u32) -> Result<CallEntry, JournalError> {
    known(store, id).await?;
    store
        .journal
        .call_entry(id, pos)
        .await?
        .ok_or_else(|| no_entry(id, pos))
}

/// [`JournalError::NoDispatch`] unless dispatch `id` is stored.
async fn known(store: &Store, id: &str) -> Result<(), JournalError> {
    if store.mailbox.load(id).await?.is_none() {
        return Err(JournalError::NoDispatch(id.to_owned()));
    }
    Ok(())
}

fn no_entry(id: &str, pos: u32) -> JournalError {
    JournalError::NoEntry {
        dispatch: id.to_owned(),
        pos,
    }
}

/// A call entry as a listing shows it (no body, no headers, no identity).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EntryView {
    /// Its position in the run.
    pub pos: u32,
    /// Its kind (`http`, `log-read`, ...).
    pub kind: &'static str,
    /// The claim number that recorded it.
    pub claim: u32,
    /// The attempt that recorded it.
    pub attempt: u32,
    /// An `http` entry's method.
    pub method: Option<String>,
    /// An `http` entry's URL as recorded (query values left out).
    pub url: Option<String>,
    /// An `http` entry's response status.
    pub status: Option<u16>,
    /// What another kind answered (`{"seq"}`, `{"after", "last", "count"}`, `{"id"}`); `None`
    /// for `http`.
    pub answer: Option<Value>,
    /// The size of the kept body; `None` when none was kept.
    pub body_size: Option<u64>,
    /// When it was recorded (Unix ms, store time).
    pub recorded_at: u64,
    /// How long the call took live (µs).
    pub duration_us: u64,
    /// Its stored size (bytes).
    pub size: u64,
}

impl EntryView {
    /// The view of `entry`.
    pub fn of(entry: &CallEntry) -> EntryView {
        let http = entry.kind == CallKind::Http;
        let text = |key: &str| {
            http.then(|| {
                entry
                    .answer
                    .get(key)
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .flatten()
        };
        EntryView {
            pos: entry.pos,
            kind: entry.kind.as_str(),
            claim: entry.claim,
            attempt: entry.attempt,
            method: text("method"),
            url: text("url"),
            status: http
                .then(|| entry.answer.get("status").and_then(Value::as_u64))
                .flatten()
                .and_then(|s| u16::try_from(s).ok()),
            answer: (!http).then(|| entry.answer.clone()),
            body_size: entry.body.as_ref().map(|b| b.len() as u64),
            recorded_at: entry.recorded_at,
            duration_us: entry.duration_us,
            size: entry.size,
        }
    }

    /// The view of a listed entry (its body's size from the summary).
    pub fn of_summary(call: &CallSummary) -> EntryView {
        EntryView {
            body_size: call.body_size,
            ..EntryView::of(&call.entry)
        }
    }

    /// What the call did, in one line: `POST https://api.example/v1 -> 200` for `http`,
    /// `seq 12` for an append, `after 3: 5 entries (last 8)` for a read, `id ...` for an
    /// enqueue. As stored: a terminal's caller escapes control characters.
    pub fn describe(&self) -> String {
        match &self.answer {
            None => {
                let status = self
                    .status
                    .map_or_else(|| "no status".to_owned(), |s| s.to_string());
                format!(
                    "{} {} -> {status}",
                    self.method.as_deref().unwrap_or("?"),
                    self.url.as_deref().unwrap_or("?")
                )
            }
            Some(answer) => describe_answer(answer),
        }
    }
}

/// A non-http answer in brief.
fn describe_answer(answer: &Value) -> String {
    let num = |key: &str| answer.get(key).and_then(Value::as_u64);
    if let Some(seq) = num("seq") {
        return format!("seq {seq}");
    }
    if let Some(id) = answer.get("id").and_then(Value::as_str) {
        return format!("id {id}");
    }
    let text = |key: &str| answer.get(key).and_then(Value::as_str);
    if let (Some(server), Some(tool), Some(state)) = (text("server"), text("tool"), text("state")) {
        return format!("{server}/{tool}: {state}");
    }
    if let (Some(count), Some(after)) = (num("count"), num("after")) {
        let last = num("last").map_or_else(String::new, |l| format!(" (last {l})"));
        return format!("after {after}: {count} entries{last}");
    }
    let text = answer.to_string();
    match text.char_indices().nth(200) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

/// A step as a listing shows it (no value).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepView {
    /// The guest's key.
    pub key: String,
    /// The claim number that stored it.
    pub claim: u32,
    /// The attempt that stored it.
    pub attempt: u32,
    /// When (Unix ms, store time).
    pub recorded_at: u64,
    /// Its size: key and value (bytes).
    pub size: u64,
    /// For a record the host keeps for itself (a key starting `homing/`: a brokered MCP call)
    /// read with its value, the state it records (`intent`, `done`, `failed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

impl StepView {
    /// The view of `step`.
    pub fn of(step: &Step) -> StepView {
        StepView {
            key: step.key.clone(),
            claim: step.claim,
            attempt: step.attempt,
            recorded_at: step.recorded_at,
            size: step.size,
            state: step
                .key
                .starts_with(crate::store::journal::HOST_STEP_PREFIX)
                .then(|| serde_json::from_slice::<Value>(&step.value).ok())
                .flatten()
                .and_then(|v| v.get("state").and_then(Value::as_str).map(str::to_owned)),
        }
    }
}

/// Entry `entry` as `GET /v1/dispatches/{id}/journal/{pos}` shows it: the listing's fields,
/// the whole answer (an http entry's response headers too) and the body, as text when it is
/// UTF-8 and otherwise base64 with `"encoding": "base64"` (`null` when none was kept).
pub fn entry_json(entry: &CallEntry) -> Value {
    let mut out = json!(EntryView::of(entry));
    if let Value::Object(map) = &mut out {
        map.insert("dispatch".into(), json!(entry.dispatch));
        map.insert("answer".into(), entry.answer.clone());
        let (body, encoding) = match entry.body.as_deref().map(body_text) {
            None => (Value::Null, None),
            Some(Body::Text(text)) => (Value::String(text), None),
            Some(Body::Base64(b64)) => (Value::String(b64), Some("base64")),
        };
        map.insert("body".into(), body);
        if let Some(encoding) = encoding {
            map.insert("encoding".into(), json!(encoding));
        }
    }
    out
}

/// [`entry_json`] of `entry` as the bytes of its JSON document, written without a copy of the
/// body beside them: at most the body and its encoding are held (text as a JSON string, else
/// base64), never a second copy in a `serde_json::Value`. The body is dropped once encoded.
pub fn entry_document(mut entry: CallEntry) -> Vec<u8> {
    let body = entry.body.take();
    let text = body.as_deref().map(std::str::from_utf8);
    let mut head = entry_json(&entry);
    if let Value::Object(map) = &mut head {
        map.remove("body");
        map.insert(
            "body_size".into(),
            json!(body.as_ref().map(|b| b.len() as u64)),
        );
        if matches!(text, Some(Err(_))) {
            map.insert("encoding".into(), json!("base64"));
        }
    }
    let head = head.to_string();
    let body_room = match (&body, &text) {
        (Some(b), Some(Ok(_))) => b.len() + b.len() / 8 + 2,
        (Some(b), _) => b.len().div_ceil(3) * 4 + 2,
        (None, _) => 4,
    };
    let mut out = Vec::with_capacity(head.len() + body_room + 16);
    // The head without its closing brace, then the body and the brace.
    out.extend_from_slice(head.strip_suffix('}').unwrap_or(&head).as_bytes());
    out.extend_from_slice(b",\"body\":");
    match (&body, text) {
        (None, _) | (_, None) => out.extend_from_slice(b"null"),
        (Some(_), Some(Ok(text))) => {
            if serde_json::to_writer(&mut out, text).is_err() {
                out.extend_from_slice(b"null");
            }
        }
        (Some(bytes), Some(Err(_))) => {
            use base64::Engine as _;
            out.push(b'"');
            let at = out.len();
            out.resize(at + bytes.len().div_ceil(3) * 4, 0);
            let written = base64::engine::general_purpose::STANDARD
                .encode_slice(bytes, &mut out[at..])
                .unwrap_or(0);
            out.truncate(at + written);
            out.push(b'"');
        }
    }
    drop(body);
    out.push(b'}');
    out
}

/// A body as it is shown: its text, or base64 when it is not UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// UTF-8 text.
    Text(String),
    /// Base64 of bytes that are not UTF-8.
    Base64(String),
}

/// How `bytes` are shown.
pub fn body_text(bytes: &[u8]) -> Body {
    match std::str::from_utf8(bytes) {
        Ok(text) => Body::Text(text.to_owned()),
        Err(_) => Body::Base64(base64::engine::general_purpose::STANDARD.encode(bytes)),
    }
}

/// A duration in µs for people: `830us`, `12.5ms`, `3.20s`.
pub fn duration(us: u64) -> String {
    if us < 1_000 {
        format!("{us}us")
    } else if us < 1_000_000 {
        format!("{:.1}ms", us as f64 / 1e3)
    } else {
        format!("{:.2}s", us as f64 / 1e6)
    }
}

/// `body` pretty-printed when it is JSON of at most [`PRETTY_MAX`] bytes.
pub fn pretty_json(body: &[u8]) -> Option<String> {
    if body.len() > PRETTY_MAX {
        return None;
    }
    let value: Value = serde_json::from_slice(body).ok()?;
    serde_json::to_string_pretty(&value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(body: Option<&[u8]>) -> CallEntry {
        CallEntry::new(
            "d1",
            0,
            CallKind::Http,
            "abc".into(),
            json!({"method": "POST", "url": "https://api.example/v1?key=", "status": 200,
                   "headers": [["content-type", "application/json"]]}),
            body.map(<[u8]>::to_vec),
            1,
            0,
            1500,
        )
    }

    #[test]
    fn an_http_entry_is_listed_by_method_url_and_status_without_its_body() {
        let v = EntryView::of(&http(Some(br#"{"a":1}"#)));
        assert_eq!(v.method.as_deref(), Some("POST"));
        assert_eq!(v.url.as_deref(), Some("https://api.example/v1?key="));
        assert_eq!(v.status, Some(200));
        assert_eq!(v.answer, None);
        assert_eq!(v.body_size, Some(7));
        assert_eq!(v.describe(), "POST https://api.example/v1?key= -> 200");
        let listed = json!(v);
        assert!(listed.get("body").is_none(), "{listed}");
        assert!(listed.get("headers").is_none(), "{listed}");
    }

    #[test]
    fn other_kinds_show_their_small_answer() {
        let entry = |kind, answer| {
            EntryView::of(&CallEntry::new(
                "d1",
                1,
                kind,
                "x".into(),
                answer,
                None,
                2,
                1,
                10,
            ))
        };
        assert_eq!(
            entry(CallKind::LogAppend, json!({"seq": 12})).describe(),
            "seq 12"
        );
        assert_eq!(
            entry(CallKind::Enqueue, json!({"id": "01J"})).describe(),
            "id 01J"
        );
        assert_eq!(
            entry(
                CallKind::LogRead,
                json!({"after": 3, "last": 8, "count": 5})
            )
            .describe(),
            "after 3: 5 entries (last 8)"
        );
        let read = entry(
            CallKind::LogRead,
            json!({"after": 3, "last": 8, "count": 5}),
        );
        assert_eq!(read.method, None);
        assert_eq!(read.status, None);
    }

    #[test]
    fn a_body_is_text_when_utf8_and_base64_otherwise() {
        let text = entry_json(&http(Some(b"hello")));
        assert_eq!(text["body"], "hello");
        assert!(text.get("encoding").is_none());
        assert_eq!(text["answer"]["headers"][0][0], "content-type");
        let binary = entry_json(&http(Some(&[0xff, 0x00])));
        assert_eq!(binary["body"], "/wA=");
        assert_eq!(binary["encoding"], "base64");
        let none = entry_json(&http(None));
        assert_eq!(none["body"], Value::Null);
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn an_entry_document_is_its_json_with_the_body() {
        for body in [
            Some(&b"hello \"there\"\n\x01"[..]),
            Some(&[0xff, 0x00, 0x01, 0x02][..]),
            Some(&[][..]),
            None,
        ] {
            let entry = http(body);
            let expected = entry_json(&entry);
            let document: Value = serde_json::from_slice(&entry_document(entry)).unwrap();
            assert_eq!(document, expected, "{body:?}");
        }
    }

    #[test]
    fn durations_read_in_the_unit_that_fits() {
        assert_eq!(duration(830), "830us");
        assert_eq!(duration(12_500), "12.5ms");
        assert_eq!(duration(3_200_000), "3.20s");
    }

    #[test]
    fn json_bodies_are_pretty_printed_up_to_the_cap() {
        assert_eq!(
            pretty_json(br#"{"a":1}"#).as_deref(),
            Some("{\n  \"a\": 1\n}")
        );
        assert_eq!(pretty_json(b"not json"), None);
        let big = format!("[{}]", "1,".repeat(PRETTY_MAX / 2) + "1");
        assert_eq!(pretty_json(big.as_bytes()), None);
    }
}
