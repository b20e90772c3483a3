//! Subjects of the stream and the records they hold.
//!
//! Ids, thread names and dedupe keys are arbitrary strings; each becomes one subject token as
//! unpadded URL-safe base64 (`A-Z a-z 0-9 - _`), which never contains `.`, `*`, `>` or spaces.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;

use super::view::{Record, Stored, ThreadRec};
use crate::store::{StoreError, StoreResult};

/// One key of the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    /// A dispatch record.
    Dispatch(String),
    /// A thread record.
    Thread(String),
    /// A dedupe key of a thread.
    Dedupe(String, String),
    /// One log entry of a thread.
    Entry(String, u64),
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
            Key::Dispatch(id) => format!("{prefix}.d.{}", enc(id)),
            Key::Thread(t) => format!("{prefix}.t.{}", enc(t)),
            Key::Dedupe(t, k) => format!("{prefix}.k.{}.{}", enc(t), enc(k)),
            Key::Entry(t, seq) => format!("{prefix}.e.{}.{seq}", enc(t)),
        }
    }

    /// The subject filter of every log entry of a thread.
    pub fn entries_of(prefix: &str, thread: &str) -> String {
        format!("{prefix}.e.{}.*", enc(thread))
    }

    /// The key a subject names, if it is one of ours.
    pub fn parse(prefix: &str, subject: &str) -> Option<Key> {
        let rest = subject.strip_prefix(prefix)?.strip_prefix('.')?;
        let mut parts = rest.split('.');
        let kind = parts.next()?;
        let first = dec(parts.next()?)?;
        let key = match kind {
            "d" => Key::Dispatch(first),
            "t" => Key::Thread(first),
            "k" => Key::Dedupe(first, dec(parts.next()?)?),
            "e" => Key::Entry(first, parts.next()?.parse().ok()?),
            _ => return None,
        };
        parts.next().is_none().then_some(key)
    }

    /// The name a `Corrupt` error gives this key.
    pub fn describe(&self) -> String {
        match self {
            Key::Dispatch(id) => format!("dispatches/{id}"),
            Key::Thread(t) => format!("threads/{t}"),
            Key::Dedupe(t, k) => format!("dedupe/{t}/{k}"),
            Key::Entry(t, seq) => format!("log/{t}/{seq}"),
        }
    }

    /// Decodes the payload of this key's message. An empty payload is a tombstone.
    pub fn decode(self, payload: &[u8]) -> Result<Record, (String, String)> {
        let corrupt = |key: &Key, e: String| (key.describe(), e);
        match self {
            Key::Dispatch(id) => {
                if payload.is_empty() {
                    return Ok(Record::Dispatch(id, None));
                }
                let stored: Stored = serde_json::from_slice(payload)
                    .map_err(|e| corrupt(&Key::Dispatch(id.clone()), e.to_string()))?;
                if stored.d.id != id {
                    return Err((
                        format!("dispatches/{id}"),
                        format!("the record holds id `{}`", stored.d.id),
                    ));
                }
                stored
                    .d
                    .check_shape()
                    .map_err(|e| (format!("dispatches/{id}"), e))?;
                Ok(Record::Dispatch(id, Some(Box::new(stored))))
            }
            Key::Thread(t) => {
                let rec: ThreadRec = serde_json::from_slice(payload)
                    .map_err(|e| corrupt(&Key::Thread(t.clone()), e.to_string()))?;
                if rec.trimmed > rec.latest {
                    return Err((
                        format!("threads/{t}"),
                        format!(
                            "watermarks out of order (latest {}, trimmed {})",
                            rec.latest, rec.trimmed
                        ),
                    ));
                }
                Ok(Record::Thread(t, rec))
            }
            Key::Dedupe(t, k) => {
                if payload.is_empty() {
                    return Ok(Record::Dedupe(t, k, None));
                }
                let holder = String::from_utf8(payload.to_vec())
                    .map_err(|e| (format!("dedupe/{t}/{k}"), e.to_string()))?;
                Ok(Record::Dedupe(t, k, Some(holder)))
            }
            Key::Entry(..) => Ok(Record::LogEntry),
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
                Key::Dispatch(name.into()),
                Key::Thread(name.into()),
                Key::Dedupe(name.into(), format!("{name}!")),
                Key::Entry(name.into(), 42),
            ] {
                let subject = key.subject("hm");
                assert_eq!(Key::parse("hm", &subject), Some(key.clone()), "{subject}");
                assert!(!subject.contains(' '));
            }
        }
        assert_eq!(Key::parse("hm", "other.d.YQ"), None);
        assert_eq!(Key::parse("hm", "hm.x.YQ"), None);
        assert_eq!(Key::parse("hm", "hm.d.YQ.extra"), None);
    }
}
