//! Subjects of the stream and the records they hold.
//!
//! Everything mutable about a thread lives under its own subject tree `<p>.th.<thread>.>`, so
//! one `Nats-Expected-Last-Subject-Sequence` against that tree fences a write by everything
//! that happened to the thread (see the parent module).
//!
//! Ids, thread names and dedupe keys are arbitrary strings; each becomes one subject token as
//! unpadded URL-safe base64 (`A-Z a-z 0-9 - _`), which never contains `.`, `*`, `>` or spaces;
//! the empty string is `~`.
//!
//! # Dispatch records
//!
//! A dispatch record is framed so that its two opaque byte fields cost exactly their length:
//!
//! | bytes | content |
//! | --- | --- |
//! | 1 | `1`, the format |
//! | 4 | `H`, big-endian |
//! | `H` | the record as JSON, with `payload` and the result's `output` left empty |
//! | 4 | `P`, big-endian |
//! | `P` | the payload |
//! | the rest | the result's output (nothing when the record has no result) |
//!
//! Records written before the framing (plain JSON, binary bytes as `{"hex": ...}`) start with
//! `{` and are still read.
//!
//! # Message and waitpoint records
//!
//! Framed the same way with one byte field: the format byte, a `u32` length, the fields as
//! JSON, then the payload (a message) or the result (a waitpoint). A waitpoint's JSON holds an
//! empty `result` exactly when it has one, so an empty result and no result stay apart.
//!
//! # Log entries
//!
//! The append time as 8 big-endian bytes, then the entry's data; one that records an inbox
//! message carries its note between the two ([`encode_entry`]).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::{BufMut, Bytes, BytesMut};

use super::records::{LimitRec, MessageHead, Record, Stored, ThreadRec};
use crate::store::inbox::Message;
use crate::store::limits::{Pause, pause_name};
use crate::store::model::EntryNote;
use crate::store::model::LogEntry;
use crate::store::waitpoints::Waitpoint;
use crate::store::{StoreError, StoreResult};

/// One key of the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    /// A thread record: `<p>.th.<thread>.t`.
    Thread(String),
    /// A dispatch record: `<p>.th.<thread>.d.<id>`.
    Dispatch(String, String),
    /// One log entry: `<p>.th.<thread>.e.<seq>`.
    Entry(String, u64),
    /// One inbox message: `<p>.th.<thread>.m.<seq>` (see [`encode_message`]).
    Message(String, u64),
    /// One waitpoint, by id: `<p>.th.<thread>.w.<id>` (see [`encode_waitpoint`]).
    Waitpoint(String, String),
    /// The thread a caller-chosen id belongs to: `<p>.id.<id>`.
    Id(String),
    /// The archived copy of a settled dispatch record, outside its thread's tree:
    /// `<p>.ar.<thread>.<id>` (see `archive`).
    Archive(String, String),
    /// A waitpoint of an archived dispatch, moved out of its thread's tree with it:
    /// `<p>.aw.<thread>.<id>`.
    ArchivedWaitpoint(String, String),
    /// A call entry of a dispatch's journal, by position: `<p>.jn.<dispatch>.c.<pos>`
    /// (outside every tree; see `journal`).
    JournalCall(String, u32),
    /// A step of a dispatch's journal, by key: `<p>.jn.<dispatch>.s.<key>`.
    JournalStep(String, String),
    /// The mark of a dispatch that has a journal, holding its thread: `<p>.jx.<dispatch>`.
    JournalMark(String),
    /// A batch of deltas a claim of a dispatch streamed, by claim number and first sequence:
    /// `<p>.dl.<dispatch>.<claim>.<first>` (outside every tree; see `deltas`).
    Delta(String, u32, u64),
    /// The slots and bucket of a flow-control scope, by its stored name: `<p>.lim.<scope>`
    /// (outside every tree; see `limits`).
    Limit(String),
    /// A pause, by [`pause_name`](crate::store::limits::pause_name): `<p>.pz.<name>`; an
    /// empty payload is a resume.
    Pause(String),
    /// A schedule, by name: `<p>.sc.<name>` (outside every tree; see `schedules`); an empty
    /// payload is a deletion.
    Schedule(String),
}

/// The token of the empty string (base64 of nothing is empty, and subjects have no empty
/// tokens); `~` is outside the base64 alphabet.
const EMPTY: &str = "~";

fn enc(s: &str) -> String {
    if s.is_empty() {
        return EMPTY.to_owned();
    }
    URL_SAFE_NO_PAD.encode(s.as_bytes())
}

fn dec(token: &str) -> Option<String> {
    if token == EMPTY {
        return Some(String::new());
    }
    let bytes = URL_SAFE_NO_PAD.decode(token).ok()?;
    String::from_utf8(bytes).ok()
}

impl Key {
    /// The subject under `prefix`.
    pub fn subject(&self, prefix: &str) -> String {
        match self {
            Key::Thread(t) => format!("{prefix}.th.{}.t", enc(t)),
            Key::Dispatch(t, id) => format!("{prefix}.th.{}.d.{}", enc(t), enc(id)),
            Key::Entry(t, seq) => format!("{prefix}.th.{}.e.{seq}", enc(t)),
            Key::Message(t, seq) => format!("{prefix}.th.{}.m.{seq}", enc(t)),
            Key::Waitpoint(t, id) => format!("{prefix}.th.{}.w.{}", enc(t), enc(id)),
            Key::Id(id) => format!("{prefix}.id.{}", enc(id)),
            Key::Archive(t, id) => format!("{prefix}.ar.{}.{}", enc(t), enc(id)),
            Key::ArchivedWaitpoint(t, id) => format!("{prefix}.aw.{}.{}", enc(t), enc(id)),
            Key::JournalCall(d, pos) => format!("{prefix}.jn.{}.c.{pos}", enc(d)),
            Key::JournalStep(d, key) => format!("{prefix}.jn.{}.s.{}", enc(d), enc(key)),
            Key::JournalMark(d) => format!("{prefix}.jx.{}", enc(d)),
            Key::Delta(d, claim, first) => format!("{prefix}.dl.{}.{claim}.{first}", enc(d)),
            Key::Limit(scope) => format!("{prefix}.lim.{}", enc(scope)),
            Key::Pause(name) => format!("{prefix}.pz.{}", enc(name)),
            Key::Schedule(name) => format!("{prefix}.sc.{}", enc(name)),
        }
    }

    /// The thread whose tree holds this key.
    pub fn thread(&self) -> Option<&str> {
        match self {
            Key::Thread(t)
            | Key::Dispatch(t, _)
            | Key::Entry(t, _)
            | Key::Message(t, _)
            | Key::Waitpoint(t, _) => Some(t),
            Key::Id(_)
            | Key::Archive(..)
            | Key::ArchivedWaitpoint(..)
            | Key::JournalCall(..)
            | Key::JournalStep(..)
            | Key::JournalMark(_)
            | Key::Delta(..)
            | Key::Limit(_)
            | Key::Pause(_)
            | Key::Schedule(_) => None,
        }
    }

    /// The subject filter of every thread's tree (what a host's view is built from).
    pub fn trees(prefix: &str) -> String {
        format!("{prefix}.th.>")
    }

    /// The subject filter of a thread's archived records.
    pub fn archive_of(prefix: &str, thread: &str) -> String {
        format!("{prefix}.ar.{}.*", enc(thread))
    }

    /// The subject filter of every archived record.
    pub fn archives(prefix: &str) -> String {
        format!("{prefix}.ar.*.*")
    }

    /// The subject filter of a thread's whole tree.
    pub fn tree(prefix: &str, thread: &str) -> String {
        format!("{prefix}.th.{}.>", enc(thread))
    }

    /// The subject filter of every message of a thread.
    pub fn messages_of(prefix: &str, thread: &str) -> String {
        format!("{prefix}.th.{}.m.*", enc(thread))
    }

    /// The subject filter of every message of every thread.
    pub fn all_messages(prefix: &str) -> String {
        format!("{prefix}.th.*.m.*")
    }

    /// The subject filter of every waitpoint in a thread's tree.
    pub fn waitpoints_of(prefix: &str, thread: &str) -> String {
        format!("{prefix}.th.{}.w.*", enc(thread))
    }

    /// The subject filter of every waitpoint in every thread's tree.
    pub fn all_waitpoints(prefix: &str) -> String {
        format!("{prefix}.th.*.w.*")
    }

    /// The subject filter of a thread's archived waitpoints.
    pub fn archived_waitpoints_of(prefix: &str, thread: &str) -> String {
        format!("{prefix}.aw.{}.*", enc(thread))
    }

    /// The subject filter of every archived waitpoint.
    pub fn all_archived_waitpoints(prefix: &str) -> String {
        format!("{prefix}.aw.*.*")
    }

    /// The subject filters of waitpoint `id` in any thread's tree, then in the archive.
    pub fn waitpoint_anywhere(prefix: &str, id: &str) -> [String; 2] {
        [
            format!("{prefix}.th.*.w.{}", enc(id)),
            format!("{prefix}.aw.*.{}", enc(id)),
        ]
    }

    /// The subject filter of a dispatch's whole journal.
    pub fn journal_of(prefix: &str, dispatch: &str) -> String {
        format!("{prefix}.jn.{}.>", enc(dispatch))
    }

    /// The subject filter of a dispatch's call entries.
    pub fn journal_calls_of(prefix: &str, dispatch: &str) -> String {
        format!("{prefix}.jn.{}.c.*", enc(dispatch))
    }

    /// The subject filter of a dispatch's steps.
    pub fn journal_steps_of(prefix: &str, dispatch: &str) -> String {
        format!("{prefix}.jn.{}.s.*", enc(dispatch))
    }

    /// The subject filter of every journal mark.
    pub fn journal_marks(prefix: &str) -> String {
        format!("{prefix}.jx.*")
    }

    /// The subject filter of every delta batch of a dispatch.
    pub fn deltas_of(prefix: &str, dispatch: &str) -> String {
        format!("{prefix}.dl.{}.>", enc(dispatch))
    }

    /// The core NATS subject a dispatch's deltas travel on live between hosts, outside every
    /// stream (configuration refuses prefixes starting with `_HOMING`, so no deployment's
    /// stream captures it).
    pub fn live(prefix: &str, dispatch: &str) -> String {
        format!("_HOMING_LIVE.{prefix}.{}", enc(dispatch))
    }

    /// The subject filter of every flow-control scope record.
    pub fn limits(prefix: &str) -> String {
        format!("{prefix}.lim.*")
    }

    /// The subject filter of every pause record.
    pub fn pauses(prefix: &str) -> String {
        format!("{prefix}.pz.*")
    }

    /// The subject filter of every schedule.
    pub fn schedules(prefix: &str) -> String {
        format!("{prefix}.sc.*")
    }

    /// The subject filter of every log entry of a thread.
    pub fn entries_of(prefix: &str, thread: &str) -> String {
        format!("{prefix}.th.{}.e.*", enc(thread))
    }

    /// The key a subject names, if it is one of ours.
    pub fn parse(prefix: &str, subject: &str) -> Option<Key> {
        let rest = subject.strip_prefix(prefix)?.strip_prefix('.')?;
        let mut parts = rest.split('.');
        let key = match parts.next()? {
            "th" => {
                let thread = dec(parts.next()?)?;
                match parts.next()? {
                    "t" => Key::Thread(thread),
                    "d" => Key::Dispatch(thread, dec(parts.next()?)?),
                    "e" => Key::Entry(thread, parts.next()?.parse().ok()?),
                    "m" => Key::Message(thread, parts.next()?.parse().ok()?),
                    "w" => Key::Waitpoint(thread, dec(parts.next()?)?),
                    _ => return None,
                }
            }
            "id" => Key::Id(dec(parts.next()?)?),
            "ar" => {
                let thread = dec(parts.next()?)?;
                Key::Archive(thread, dec(parts.next()?)?)
            }
            "aw" => {
                let thread = dec(parts.next()?)?;
                Key::ArchivedWaitpoint(thread, dec(parts.next()?)?)
            }
            "jn" => {
                let dispatch = dec(parts.next()?)?;
                match parts.next()? {
                    "c" => Key::JournalCall(dispatch, parts.next()?.parse().ok()?),
                    "s" => Key::JournalStep(dispatch, dec(parts.next()?)?),
                    _ => return None,
                }
            }
            "jx" => Key::JournalMark(dec(parts.next()?)?),
            "dl" => {
                let dispatch = dec(parts.next()?)?;
                let claim = parts.next()?.parse().ok()?;
                Key::Delta(dispatch, claim, parts.next()?.parse().ok()?)
            }
            "lim" => Key::Limit(dec(parts.next()?)?),
            "pz" => Key::Pause(dec(parts.next()?)?),
            "sc" => Key::Schedule(dec(parts.next()?)?),
            _ => return None,
        };
        parts.next().is_none().then_some(key)
    }

    /// The name a `Corrupt` error gives this key.
    pub fn describe(&self) -> String {
        match self {
            Key::Dispatch(_, id) | Key::Archive(_, id) => format!("dispatches/{id}"),
            Key::Thread(t) => format!("threads/{t}"),
            Key::Entry(t, seq) => format!("log/{t}/{seq}"),
            Key::Message(t, seq) => format!("messages/{t}/{seq}"),
            Key::Waitpoint(_, id) | Key::ArchivedWaitpoint(_, id) => format!("waitpoints/{id}"),
            Key::Id(id) => format!("ids/{id}"),
            Key::JournalCall(d, pos) => format!("journal/{d}/{pos}"),
            Key::JournalStep(d, key) => format!("journal/{d}/steps/{key}"),
            Key::JournalMark(d) => format!("journal/{d}"),
            Key::Delta(d, claim, first) => format!("deltas/{d}/{claim}/{first}"),
            Key::Limit(scope) => format!("limits/{scope}"),
            Key::Pause(name) => format!("pauses/{}", name.replace('\u{1f}', "/")),
            Key::Schedule(name) => format!("schedules/{name}"),
        }
    }

    /// Decodes the payload of this key's message. An empty dispatch payload is a tombstone.
    /// An archived copy decodes as the record it copies.
    pub fn decode(self, payload: &[u8]) -> Result<Record, (String, String)> {
        let name = self.describe();
        match self {
            Key::Dispatch(thread, id) | Key::Archive(thread, id) => {
                if payload.is_empty() {
                    return Ok(Record::Dispatch(thread, id, None));
                }
                let stored = decode_dispatch(payload).map_err(|e| (name.clone(), e))?;
                if stored.dispatch.id != id || stored.dispatch.thread != thread {
                    return Err((
                        name,
                        format!(
                            "the record holds id `{}` of thread `{}`",
                            stored.dispatch.id, stored.dispatch.thread
                        ),
                    ));
                }
                stored.dispatch.check_shape().map_err(|e| (name, e))?;
                Ok(Record::Dispatch(thread, id, Some(Box::new(stored))))
            }
            Key::Thread(t) => {
                let rec: ThreadRec =
                    serde_json::from_slice(payload).map_err(|e| (name, e.to_string()))?;
                Ok(Record::Thread(t, rec))
            }
            Key::Entry(t, seq) => Ok(Record::Entry(t, seq)),
            Key::Message(t, seq) => {
                let (head, _) = decode_message_head(payload).map_err(|e| (name.clone(), e))?;
                if head.seq != seq || head.thread != t {
                    return Err((
                        name,
                        format!(
                            "the record holds message {} of thread `{}`",
                            head.seq, head.thread
                        ),
                    ));
                }
                Ok(Record::Message(
                    t,
                    seq,
                    Box::new(MessageHead::of(&head, payload.len())),
                ))
            }
            Key::Waitpoint(thread, id) | Key::ArchivedWaitpoint(thread, id) => {
                let w = decode_waitpoint(payload).map_err(|e| (name.clone(), e))?;
                if w.id != id || w.thread != thread {
                    return Err((
                        name,
                        format!(
                            "the record holds waitpoint `{}` of thread `{}`",
                            w.id, w.thread
                        ),
                    ));
                }
                Ok(Record::Waitpoint(thread, id, Box::new(w)))
            }
            Key::Id(id) => {
                let thread =
                    String::from_utf8(payload.to_vec()).map_err(|e| (name, e.to_string()))?;
                Ok(Record::Id(id, thread))
            }
            // A host's view holds no journal and no deltas: they are read when asked for.
            Key::JournalCall(d, _)
            | Key::JournalStep(d, _)
            | Key::JournalMark(d)
            | Key::Delta(d, _, _) => Ok(Record::Journal(d)),
            Key::Limit(scope) => {
                let rec: LimitRec = if payload.is_empty() {
                    LimitRec::default()
                } else {
                    serde_json::from_slice(payload).map_err(|e| (name, e.to_string()))?
                };
                Ok(Record::Limit(scope, rec))
            }
            Key::Pause(pause) => {
                if payload.is_empty() {
                    return Ok(Record::Pause(pause, None));
                }
                let p: Pause =
                    serde_json::from_slice(payload).map_err(|e| (name.clone(), e.to_string()))?;
                if pause_name(&p.agent, p.key.as_deref()) != pause {
                    return Err((
                        name,
                        format!("the record holds the pause of agent `{}`", p.agent),
                    ));
                }
                Ok(Record::Pause(pause, Some(p)))
            }
            // A host's view holds no schedule: a tick reads its schedule when it runs.
            Key::Schedule(name) => Ok(Record::Schedule(name)),
        }
    }
}

/// The format byte of a framed dispatch record.
const FRAMED: u8 = 1;
/// What the frame adds to a dispatch record besides its JSON: the format byte, two lengths.
pub const FRAME_OVERHEAD: u64 = 9;

/// The payload of a dispatch record (framed; see the module). `stored` is handed back as it
/// came: its payload and output are only moved out while the JSON part is written.
pub fn encode_dispatch(stored: &mut Stored) -> StoreResult<Bytes> {
    let payload = std::mem::take(&mut stored.dispatch.payload);
    let output = stored
        .dispatch
        .result
        .as_mut()
        .map(|r| std::mem::take(&mut r.output));
    let header = serde_json::to_vec(&*stored);
    stored.dispatch.payload = payload;
    if let (Some(result), Some(output)) = (stored.dispatch.result.as_mut(), output) {
        result.output = output;
    }
    let id = &stored.dispatch.id;
    let header =
        header.map_err(|e| StoreError::Invalid(format!("dispatch {id}: cannot encode: {e}")))?;
    let length = |what: &str, n: usize| {
        u32::try_from(n).map_err(|_| {
            StoreError::Invalid(format!(
                "dispatch {id}: {what} of {n} bytes is too large for a record"
            ))
        })
    };
    let output = stored
        .dispatch
        .result
        .as_ref()
        .map_or(&[][..], |r| &r.output[..]);
    let mut out = BytesMut::with_capacity(
        FRAME_OVERHEAD as usize + header.len() + stored.dispatch.payload.len() + output.len(),
    );
    out.put_u8(FRAMED);
    out.put_u32(length("the record's fields", header.len())?);
    out.put_slice(&header);
    out.put_u32(length("payload", stored.dispatch.payload.len())?);
    out.put_slice(&stored.dispatch.payload);
    out.put_slice(output);
    Ok(out.freeze())
}

/// A big-endian `u32` at `at`, as a length.
fn length_at(bytes: &[u8], at: usize) -> Result<usize, String> {
    let raw: [u8; 4] = at
        .checked_add(4)
        .and_then(|end| bytes.get(at..end))
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| format!("record truncated at byte {at} (a length was expected)"))?;
    usize::try_from(u32::from_be_bytes(raw)).map_err(|e| e.to_string())
}

/// Decodes a dispatch record: framed, or the plain JSON of earlier versions.
fn decode_dispatch(bytes: &[u8]) -> Result<Stored, String> {
    match bytes.first() {
        Some(b'{') => serde_json::from_slice(bytes).map_err(|e| e.to_string()),
        Some(&FRAMED) => {
            let header_len = length_at(bytes, 1)?;
            let header_end = 5usize.saturating_add(header_len);
            let header = bytes
                .get(5..header_end)
                .ok_or_else(|| format!("record truncated: {header_len} bytes of fields missing"))?;
            let mut stored: Stored = serde_json::from_slice(header).map_err(|e| e.to_string())?;
            let payload_len = length_at(bytes, header_end)?;
            let payload_start = header_end.saturating_add(4);
            let payload_end = payload_start.saturating_add(payload_len);
            stored.dispatch.payload = bytes
                .get(payload_start..payload_end)
                .ok_or_else(|| format!("record truncated: payload of {payload_len} bytes missing"))?
                .to_vec();
            let rest = bytes.get(payload_end..).unwrap_or_default();
            match stored.dispatch.result.as_mut() {
                Some(result) => result.output = rest.to_vec(),
                None if rest.is_empty() => {}
                None => {
                    return Err(format!(
                        "{} bytes of output in a record without a result",
                        rest.len()
                    ));
                }
            }
            Ok(stored)
        }
        Some(other) => Err(format!("unknown record format (first byte {other:#04x})")),
        None => Err("empty record".to_owned()),
    }
}

/// The payload of a message record, framed like a dispatch record: the format byte, a `u32`
/// length and the message as JSON with its payload left empty, then the payload (the rest).
pub fn encode_message(message: &Message) -> StoreResult<Bytes> {
    let mut fields = message.clone();
    fields.payload = Vec::new();
    let what = || {
        format!(
            "message {} of thread `{}`",
            message.seq,
            message.thread.escape_debug()
        )
    };
    let header = serde_json::to_vec(&fields)
        .map_err(|e| StoreError::Invalid(format!("{}: cannot encode: {e}", what())))?;
    let n = u32::try_from(header.len()).map_err(|_| {
        StoreError::Invalid(format!("{}: its fields are too large for a record", what()))
    })?;
    let mut out = BytesMut::with_capacity(5 + header.len() + message.payload.len());
    out.put_u8(FRAMED);
    out.put_u32(n);
    out.put_slice(&header);
    out.put_slice(&message.payload);
    Ok(out.freeze())
}

/// The fields of a message record (its payload left empty) and where its payload starts.
fn decode_message_head(bytes: &[u8]) -> Result<(Message, usize), String> {
    match bytes.first() {
        Some(&FRAMED) => {
            let header_len = length_at(bytes, 1)?;
            let header_end = 5usize.saturating_add(header_len);
            let header = bytes
                .get(5..header_end)
                .ok_or_else(|| format!("record truncated: {header_len} bytes of fields missing"))?;
            let message: Message = serde_json::from_slice(header).map_err(|e| e.to_string())?;
            Ok((message, header_end))
        }
        Some(other) => Err(format!("unknown record format (first byte {other:#04x})")),
        None => Err("empty record".to_owned()),
    }
}

/// Decodes a whole message record of `key` (a [`Key::Message`]).
pub fn decode_message(key: &Key, bytes: &[u8]) -> StoreResult<Message> {
    let corrupt = |reason: String| StoreError::Corrupt {
        key: key.describe(),
        reason,
    };
    let (mut message, start) = decode_message_head(bytes).map_err(corrupt)?;
    if let Key::Message(thread, seq) = key
        && (message.seq != *seq || &message.thread != thread)
    {
        return Err(corrupt(format!(
            "the record holds message {} of thread `{}`",
            message.seq, message.thread
        )));
    }
    message.payload = bytes.get(start..).unwrap_or_default().to_vec();
    Ok(message)
}

/// The payload of a waitpoint record, framed like a message record: the format byte, a `u32`
/// length and the waitpoint as JSON, then its result (the rest). The JSON holds an empty
/// `result` when the waitpoint has one, and none when it has none, so an empty result and no
/// result stay apart.
pub fn encode_waitpoint(w: &Waitpoint) -> StoreResult<Bytes> {
    let mut fields = w.clone();
    let result = fields.result.as_mut().map(std::mem::take);
    let what = || format!("waitpoint {}", w.id);
    let header = serde_json::to_vec(&fields)
        .map_err(|e| StoreError::Invalid(format!("{}: cannot encode: {e}", what())))?;
    let n = u32::try_from(header.len()).map_err(|_| {
        StoreError::Invalid(format!("{}: its fields are too large for a record", what()))
    })?;
    let result = result.unwrap_or_default();
    let mut out = BytesMut::with_capacity(5 + header.len() + result.len());
    out.put_u8(FRAMED);
    out.put_u32(n);
    out.put_slice(&header);
    out.put_slice(&result);
    Ok(out.freeze())
}

/// Decodes a waitpoint record (see [`encode_waitpoint`]).
fn decode_waitpoint(bytes: &[u8]) -> Result<Waitpoint, String> {
    match bytes.first() {
        Some(&FRAMED) => {
            let header_len = length_at(bytes, 1)?;
            let header_end = 5usize.saturating_add(header_len);
            let header = bytes
                .get(5..header_end)
                .ok_or_else(|| format!("record truncated: {header_len} bytes of fields missing"))?;
            let mut w: Waitpoint = serde_json::from_slice(header).map_err(|e| e.to_string())?;
            let rest = bytes.get(header_end..).unwrap_or_default();
            match w.result.as_mut() {
                Some(result) => *result = rest.to_vec(),
                None if rest.is_empty() => {}
                None => {
                    return Err(format!(
                        "{} bytes of result in a record without a result",
                        rest.len()
                    ));
                }
            }
            Ok(w)
        }
        Some(other) => Err(format!("unknown record format (first byte {other:#04x})")),
        None => Err("empty record".to_owned()),
    }
}

/// Decodes a whole waitpoint record of `key` (a [`Key::Waitpoint`] or
/// [`Key::ArchivedWaitpoint`]).
pub fn decode_waitpoint_of(key: &Key, bytes: &[u8]) -> StoreResult<Waitpoint> {
    match key.clone().decode(bytes) {
        Ok(Record::Waitpoint(_, _, w)) => Ok(*w),
        Ok(_) => Err(StoreError::Corrupt {
            key: key.describe(),
            reason: "not a waitpoint record".into(),
        }),
        Err((key, reason)) => Err(StoreError::Corrupt { key, reason }),
    }
}

/// The payload of a thread record.
pub fn encode_thread(rec: &ThreadRec) -> StoreResult<Bytes> {
    serde_json::to_vec(rec)
        .map(Bytes::from)
        .map_err(|e| StoreError::Invalid(format!("thread record: cannot encode: {e}")))
}

/// The bit of an entry's 8-byte time that says a note follows it (stored times are below
/// 2^63, so no entry without a note has it).
const NOTED: u64 = 1 << 63;

/// The payload of a log entry: its time as 8 big-endian bytes, then the data; an entry that
/// records an inbox message sets the time's top bit and puts a `u32` length and the note's
/// JSON between the time and the data.
pub fn encode_entry(now: u64, data: &[u8], note: Option<&EntryNote>) -> StoreResult<Bytes> {
    let note = note
        .map(|n| {
            serde_json::to_vec(n)
                .map_err(|e| StoreError::Invalid(format!("note: cannot encode: {e}")))
        })
        .transpose()?;
    let mut payload = BytesMut::with_capacity(12 + data.len() + note.as_ref().map_or(0, Vec::len));
    match note {
        Some(note) => {
            let n = u32::try_from(note.len())
                .map_err(|_| StoreError::Invalid("note: too large for an entry".into()))?;
            payload.put_u64((now & !NOTED) | NOTED);
            payload.put_u32(n);
            payload.put_slice(&note);
        }
        None => payload.put_u64(now & !NOTED),
    }
    payload.put_slice(data);
    Ok(payload.freeze())
}

/// Decodes a log entry's payload (both forms, see [`encode_entry`]).
pub fn decode_entry(thread: &str, seq: u64, payload: &[u8]) -> StoreResult<LogEntry> {
    let corrupt = |reason: String| StoreError::Corrupt {
        key: format!("log/{thread}/{seq}"),
        reason,
    };
    let Some(time) = payload.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()) else {
        return Err(corrupt(format!(
            "entry of {} bytes has no header",
            payload.len()
        )));
    };
    let time = u64::from_be_bytes(time);
    if time & NOTED == 0 {
        return Ok(LogEntry {
            seq,
            data: payload[8..].to_vec(),
            appended_at: time,
            note: None,
            turn: None,
        });
    }
    let Some(len) = payload.get(8..12).and_then(|b| <[u8; 4]>::try_from(b).ok()) else {
        return Err(corrupt("entry truncated before its note's length".into()));
    };
    let end = usize::try_from(u32::from_be_bytes(len))
        .ok()
        .and_then(|n| n.checked_add(12))
        .ok_or_else(|| corrupt("note length out of range".into()))?;
    let note = payload
        .get(12..end)
        .ok_or_else(|| corrupt("entry truncated inside its note".into()))?;
    let note: EntryNote =
        serde_json::from_slice(note).map_err(|e| corrupt(format!("note: {e}")))?;
    let mut entry = LogEntry {
        seq,
        data: payload.get(end..).unwrap_or_default().to_vec(),
        appended_at: time & !NOTED,
        note: None,
        turn: None,
    };
    note.set_on(&mut entry);
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NewDispatch;
    use crate::store::model::{Claim, RunResult, Status};
    use crate::store::rules::queued_record;

    fn sample(payload: Vec<u8>, output: Option<Vec<u8>>) -> Stored {
        let new = NewDispatch::new("agent", "thread", payload).with_metadata("k", "v");
        let mut d = queued_record("d1", &new, 3, 1_700_000_000_000);
        if let Some(output) = output {
            d.status = Status::Claimed;
            d.claim = Some(Claim {
                token: "tok".into(),
                claimed_by: "host/agent".into(),
                lease_until: 1_700_000_030_000,
            });
            d.result = Some(RunResult::success(output));
        }
        Stored {
            dispatch: d,
            settled: None,
            waitpoints: false,
        }
    }

    fn round_trip(stored: &Stored) -> Result<Stored, (String, String)> {
        let mut copy = stored.clone();
        let bytes = encode_dispatch(&mut copy).map_err(|e| ("encode".to_owned(), e.to_string()))?;
        assert_eq!(&copy, stored, "encoding hands the record back unchanged");
        match Key::Dispatch("thread".into(), "d1".into()).decode(&bytes)? {
            Record::Dispatch(_, _, Some(back)) => Ok(*back),
            other => Err(("decode".into(), format!("not a dispatch: {other:?}"))),
        }
    }

    #[test]
    fn dispatch_records_are_framed_and_round_trip_binary_and_text() {
        let binary: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
        for (payload, output) in [
            (Vec::new(), None),
            (binary.clone(), None),
            (b"text \"quoted\" \n".to_vec(), Some(binary.clone())),
            (binary.clone(), Some(Vec::new())),
            (vec![0xff; 3], Some(b"{\"json\": true}".to_vec())),
        ] {
            let stored = sample(payload, output);
            assert_eq!(round_trip(&stored), Ok(stored.clone()));
        }
        // Bytes cost their length: no hex, no base64, no escapes.
        let mut big = sample(binary.clone(), Some(binary.clone()));
        let framed = encode_dispatch(&mut big).map(|b| b.len()).unwrap_or(0);
        assert!(
            framed > 2 * binary.len() && framed < 2 * binary.len() + 1024,
            "{framed}"
        );
    }

    #[test]
    fn legacy_json_records_with_hex_bytes_are_still_read() {
        let stored = sample(vec![0xff, 0x00], Some(vec![0x01, 0xfe]));
        let mut json = serde_json::to_value(&stored).unwrap_or_default();
        json["payload"] = serde_json::json!({"hex": "ff00"});
        json["result"]["output"] = serde_json::json!({"hex": "01fe"});
        let bytes = serde_json::to_vec(&json).unwrap_or_default();
        let back = match Key::Dispatch("thread".into(), "d1".into()).decode(&bytes) {
            Ok(Record::Dispatch(_, _, Some(back))) => Ok(*back),
            other => Err(format!("{other:?}")),
        };
        assert_eq!(back, Ok(stored));
    }

    #[test]
    fn damaged_records_are_corrupt_never_a_panic() {
        let mut stored = sample(b"payload".to_vec(), Some(b"output".to_vec()));
        let bytes = encode_dispatch(&mut stored).unwrap_or_default();
        let key = Key::Dispatch("thread".into(), "d1".into());
        for cut in 1..bytes.len() {
            // Any prefix either fails to decode or (cut inside the output) decodes to less.
            if let Ok(Record::Dispatch(_, _, Some(back))) = key.clone().decode(&bytes[..cut]) {
                assert_ne!(*back, stored, "cut at {cut}");
            }
        }
        for bad in [
            &[7u8, 0, 0][..],
            &[1u8, 0xff, 0xff, 0xff, 0xff][..],
            &[1u8][..],
        ] {
            assert!(key.clone().decode(bad).is_err(), "{bad:?}");
        }
        let mut queued = sample(b"p".to_vec(), None);
        let mut bytes = encode_dispatch(&mut queued).unwrap_or_default().to_vec();
        bytes.extend_from_slice(b"stray");
        assert!(key.decode(&bytes).is_err(), "output without a result");
    }

    #[test]
    fn message_records_round_trip_and_the_view_keeps_their_heads() {
        use crate::store::inbox::{Message, MessageKind, MessageState};
        let message = Message {
            thread: "t".into(),
            seq: 3,
            kind: MessageKind::FollowUp,
            payload: vec![0, 255, b'{', 7],
            metadata: [("k".to_owned(), "v".to_owned())].into(),
            agent: Some("a".into()),
            sent_by: "cli".into(),
            sent_at: 5,
            state: MessageState::Acked,
            settled_at: Some(6),
            acked_by: Some("d".into()),
            log_seq: Some(9),
            applied: Some(crate::store::inbox::OnBusy::Interrupt),
        };
        let bytes = encode_message(&message).unwrap_or_default();
        let key = Key::Message("t".into(), 3);
        assert_eq!(decode_message(&key, &bytes).ok(), Some(message.clone()));
        let head = match key.clone().decode(&bytes) {
            Ok(Record::Message(t, 3, head)) if t == "t" => Some(*head),
            _ => None,
        };
        assert_eq!(head, Some(MessageHead::of(&message, bytes.len())));
        // Another key's record, and damaged records, are corrupt, never a panic.
        assert!(decode_message(&Key::Message("t".into(), 4), &bytes).is_err());
        for cut in 0..bytes.len() / 2 {
            assert!(decode_message(&key, &bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn waitpoint_records_round_trip_with_and_without_a_result() {
        use crate::store::waitpoints::{Waitpoint, WaitpointState};
        let pending = Waitpoint {
            id: "w1".into(),
            dispatch: "d1".into(),
            thread: "t".into(),
            agent: "a".into(),
            name: "approve".into(),
            state: WaitpointState::Pending,
            token_digests: vec!["ab".repeat(32)],
            metadata: [("k".to_owned(), "v".to_owned())].into(),
            timeout_at: 9,
            result: None,
            settled_by: None,
            created_at: 1,
            settled_at: None,
            created_claim: 1,
        };
        let mut empty = pending.clone();
        empty.state = WaitpointState::Completed;
        empty.result = Some(Vec::new());
        let mut binary = empty.clone();
        binary.result = Some(vec![0, 255, b'{', 7]);
        let key = Key::Waitpoint("t".into(), "w1".into());
        for w in [pending, empty, binary] {
            let bytes = encode_waitpoint(&w).unwrap_or_default();
            assert_eq!(decode_waitpoint_of(&key, &bytes).ok(), Some(w.clone()));
            let archived = Key::ArchivedWaitpoint("t".into(), "w1".into());
            assert_eq!(decode_waitpoint_of(&archived, &bytes).ok(), Some(w.clone()));
            // Another key's record, and damaged records, are corrupt, never a panic.
            assert!(decode_waitpoint_of(&Key::Waitpoint("t".into(), "w2".into()), &bytes).is_err());
            for cut in 0..bytes
                .len()
                .saturating_sub(w.result.as_ref().map_or(0, Vec::len))
            {
                assert!(
                    decode_waitpoint_of(&key, &bytes[..cut]).is_err(),
                    "cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn subjects_round_trip_any_name() {
        for name in ["", "a", "thread.with.dots", "sp ace*>", "ünï/cødé", "-_-"] {
            for key in [
                Key::Thread(name.into()),
                Key::Dispatch(name.into(), format!("{name}!")),
                Key::Entry(name.into(), 42),
                Key::Message(name.into(), 7),
                Key::Waitpoint(name.into(), format!("{name}#")),
                Key::Id(name.into()),
                Key::Archive(name.into(), format!("{name}?")),
                Key::ArchivedWaitpoint(name.into(), format!("{name}%")),
                Key::JournalCall(name.into(), 7),
                Key::JournalStep(name.into(), format!("{name}.k")),
                Key::JournalMark(name.into()),
                Key::Delta(name.into(), 3, 17),
                Key::Limit(format!("key:{name}:k")),
                Key::Pause(format!("{name}\u{1f}k")),
            ] {
                let subject = key.subject("hm");
                assert_eq!(Key::parse("hm", &subject), Some(key.clone()), "{subject}");
                assert!(!subject.contains(' '));
            }
        }
        assert_eq!(Key::parse("hm", "other.th.YQ.t"), None);
        assert_eq!(Key::parse("hm", "hm.x.YQ"), None);
        assert_eq!(Key::parse("hm", "hm.th.YQ.t.extra"), None);
        assert_eq!(Key::parse("hm", "hm.dl.YQ.x.1"), None);
        assert_eq!(Key::parse("hm", "hm.dl.YQ.1"), None);
        assert_eq!(Key::live("hm", "a.b"), "_HOMING_LIVE.hm.YS5i");
    }

    #[test]
    fn entries_with_and_without_a_note_round_trip() {
        let plain = encode_entry(1_700_000_000_000, b"data", None).unwrap_or_default();
        let back = decode_entry("t", 1, &plain).ok();
        assert_eq!(back.as_ref().map(|e| e.note.is_none()), Some(true));
        assert_eq!(
            back.map(|e| (e.appended_at, e.data)),
            Some((1_700_000_000_000, b"data".to_vec()))
        );
        let note = crate::store::MessageNote {
            seq: 4,
            kind: crate::store::inbox::MessageKind::Steer,
            metadata: Default::default(),
            sent_at: 3,
            sent_by: "cli".into(),
        };
        let noted = encode_entry(
            1_700_000_000_001,
            b"",
            Some(&EntryNote::Message(note.clone())),
        )
        .unwrap_or_default();
        let back = decode_entry("t", 2, &noted).ok();
        assert_eq!(
            back.map(|e| (e.appended_at, e.data, e.note, e.turn)),
            Some((1_700_000_000_001, Vec::new(), Some(note), None))
        );
        for cut in 0..12 {
            assert!(decode_entry("t", 2, &noted[..cut]).is_err(), "cut at {cut}");
        }
        let turn = crate::store::model::TurnMark {
            event: crate::store::model::TurnEvent::RolledBack,
            dispatch: "d".into(),
            message: 7,
            masked: Some(crate::store::model::LogRange { first: 3, last: 5 }),
        };
        let marked = encode_entry(
            1_700_000_000_002,
            b"",
            Some(&EntryNote::Turn { turn: turn.clone() }),
        )
        .unwrap_or_default();
        let back = decode_entry("t", 3, &marked).ok();
        assert_eq!(back.map(|e| (e.note, e.turn)), Some((None, Some(turn))));
    }
}
