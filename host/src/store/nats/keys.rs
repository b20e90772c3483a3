//! Subjects of the stream and the records they hold.
//!
//! Everything mutable about a thread lives under its own subject tree `<p>.th.<thread>.>`, so
//! one `Nats-Expected-Last-Subject-Sequence` against that tree fences a write by everything
//! that happened to the thread (see the parent module).
//!
//! Ids, thread names and dedupe keys are arbitrary strings; each becomes one subject token as
//! unpadded URL-safe base64 (`A-Z a-z 0-9 - _`), which never contains `.`, `*`, `>` or spaces;
//! the empty string is `~`.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;

use super::view::{Record, Stored, ThreadRec};
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
    /// The thread a caller-chosen id belongs to: `<p>.id.<id>`.
    Id(String),
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
            Key::Id(id) => format!("{prefix}.id.{}", enc(id)),
        }
    }

    /// The thread whose tree holds this key.
    pub fn thread(&self) -> Option<&str> {
        match self {
            Key::Thread(t) | Key::Dispatch(t, _) | Key::Entry(t, _) => Some(t),
            Key::Id(_) => None,
        }
    }

    /// The subject filter of a thread's whole tree.
    pub fn tree(prefix: &str, thread: &str) -> String {
        format!("{prefix}.th.{}.>", enc(thread))
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
                    _ => return None,
                }
            }
            "id" => Key::Id(dec(parts.next()?)?),
            _ => return None,
        };
        parts.next().is_none().then_some(key)
    }

    /// The name a `Corrupt` error gives this key.
    pub fn describe(&self) -> String {
        match self {
            Key::Dispatch(_, id) => format!("dispatches/{id}"),
            Key::Thread(t) => format!("threads/{t}"),
            Key::Entry(t, seq) => format!("log/{t}/{seq}"),
            Key::Id(id) => format!("ids/{id}"),
        }
    }

    /// Decodes the payload of this key's message. An empty dispatch payload is a tombstone.
    pub fn decode(self, payload: &[u8]) -> Result<Record, (String, String)> {
        let name = self.describe();
        match self {
            Key::Dispatch(thread, id) => {
                if payload.is_empty() {
                    return Ok(Record::Dispatch(thread, id, None));
                }
                let stored: Stored =
                    serde_json::from_slice(payload).map_err(|e| (name.clone(), e.to_string()))?;
                if stored.d.id != id || stored.d.thread != thread {
                    return Err((
                        name,
                        format!(
                            "the record holds id `{}` of thread `{}`",
                            stored.d.id, stored.d.thread
                        ),
                    ));
                }
                stored.d.check_shape().map_err(|e| (name, e))?;
                Ok(Record::Dispatch(thread, id, Some(Box::new(stored))))
            }
            Key::Thread(t) => {
                let rec: ThreadRec =
                    serde_json::from_slice(payload).map_err(|e| (name, e.to_string()))?;
                Ok(Record::Thread(t, rec))
            }
            Key::Entry(t, seq) => Ok(Record::Entry(t, seq)),
            Key::Id(id) => {
                let thread =
                    String::from_utf8(payload.to_vec()).map_err(|e| (name, e.to_string()))?;
                Ok(Record::Id(id, thread))
            }
        }
    }
}

/// The payload of a dispatch record.
pub fn encode_dispatch(stored: &Stored) -> StoreResult<Bytes> {
    serde_json::to_vec(stored)
        .map(Bytes::from)
        .map_err(|e| StoreError::Invalid(format!("dispatch {}: cannot encode: {e}", stored.d.id)))
}

/// The payload of a thread record.
pub fn encode_thread(rec: &ThreadRec) -> StoreResult<Bytes> {
    serde_json::to_vec(rec)
        .map(Bytes::from)
        .map_err(|e| StoreError::Invalid(format!("thread record: cannot encode: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_round_trip_any_name() {
        for name in ["", "a", "thread.with.dots", "sp ace*>", "ünï/cødé", "-_-"] {
            for key in [
                Key::Thread(name.into()),
                Key::Dispatch(name.into(), format!("{name}!")),
                Key::Entry(name.into(), 42),
                Key::Id(name.into()),
            ] {
                let subject = key.subject("hm");
                assert_eq!(Key::parse("hm", &subject), Some(key.clone()), "{subject}");
                assert!(!subject.contains(' '));
            }
        }
        assert_eq!(Key::parse("hm", "other.th.YQ.t"), None);
        assert_eq!(Key::parse("hm", "hm.x.YQ"), None);
        assert_eq!(Key::parse("hm", "hm.th.YQ.t.extra"), None);
    }
}
