//! Typed JSON payloads (the `json` feature): read a payload or a log entry as a `Deserialize`
//! type, and write `Serialize` values as payloads, log entries and outputs.
//!
//! ```no_run
//! use homing_guest::{json, Claim, Enqueue, Handler};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Deserialize)]
//! struct Order { id: u64, items: Vec<String> }
//!
//! #[derive(Serialize)]
//! struct Receipt { id: u64, count: usize }
//!
//! struct Orders;
//!
//! impl Handler for Orders {
//!     fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
//!         let order: Order = claim.payload_json()?;
//!         let receipt = Receipt { id: order.id, count: order.items.len() };
//!         claim.append_json(&receipt)?;
//!         claim.enqueue(Enqueue::to("billing").json(&receipt))?;
//!         Ok(json::to_vec(&receipt)?)
//!     }
//! }
//! # homing_guest::export_handler!(Orders);
//! ```
//!
//! Both directions report failures as [`Error::Invalid`], so `?` works next to host calls: a
//! payload that does not parse is the submitter's mistake, and a value that does not serialize
//! (a map with non-string keys, a failing `Serialize` impl) is the guest's.

use serde::{Deserialize, Serialize};

use crate::claim::{Claim, LogEntry};
use crate::enqueue::Enqueue;
use crate::error::Error;

/// Serializes `value` as JSON bytes, for example a handler's output.
///
/// # Errors
///
/// [`Error::Invalid`] when `value` cannot be serialized as JSON.
pub fn to_vec<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, Error> {
    serde_json::to_vec(value)
        .map_err(|e| Error::Invalid(format!("value cannot be serialized as JSON: {e}")))
}

/// Parses `bytes` as JSON; `what` names them in the error.
fn from_slice<'de, T: Deserialize<'de>>(bytes: &'de [u8], what: &str) -> Result<T, Error> {
    serde_json::from_slice(bytes).map_err(|e| {
        Error::Invalid(format!(
            "{what} is not the expected JSON ({}): {e}",
            std::any::type_name::<T>()
        ))
    })
}

impl Claim<'_> {
    /// Parses the payload as JSON into `T`.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] when the payload is not JSON of `T`'s shape.
    pub fn payload_json<'de, T: Deserialize<'de>>(&'de self) -> Result<T, Error> {
        from_slice(self.payload(), "payload")
    }

    /// Appends `value` as a JSON entry to the thread log; returns its sequence.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] when `value` cannot be serialized; otherwise as [`Claim::append`].
    pub fn append_json<T: Serialize + ?Sized>(&self, value: &T) -> Result<u64, Error> {
        self.append(to_vec(value)?)
    }
}

impl LogEntry {
    /// Parses the entry as JSON into `T`.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] when the entry is not JSON of `T`'s shape.
    pub fn json<'de, T: Deserialize<'de>>(&'de self) -> Result<T, Error> {
        from_slice(&self.data, "log entry")
    }
}

impl Enqueue {
    /// Sets the payload to `value` as JSON. A value that cannot be serialized is reported as
    /// [`Error::Invalid`] when the request is sent, so the builder chain stays unbroken.
    pub fn json<T: Serialize + ?Sized>(self, value: &T) -> Self {
        match to_vec(value) {
            Ok(payload) => self.payload(payload),
            Err(error) => self.defer_error(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn a_log_entry_parses_into_its_type() -> Result<(), Error> {
        let entry = LogEntry {
            seq: 1,
            data: br#"{"n":3}"#.to_vec(),
            appended_at: 0,
            message: None,
            turn: None,
        };
        let value: BTreeMap<String, u32> = entry.json()?;
        assert_eq!(value.get("n"), Some(&3));
        Ok(())
    }

    #[test]
    fn bytes_of_the_wrong_shape_are_invalid() {
        let entry = LogEntry {
            seq: 1,
            data: b"not json".to_vec(),
            appended_at: 0,
            message: None,
            turn: None,
        };
        assert!(matches!(entry.json::<u32>(), Err(Error::Invalid(_))));
    }

    #[test]
    fn a_value_that_cannot_be_serialized_fails_when_the_enqueue_is_sent() {
        let mut unserializable = BTreeMap::new();
        unserializable.insert((1, 2), "tuple keys are not JSON object keys");
        let built = Enqueue::to("echo").json(&unserializable).into_request();
        assert!(matches!(built, Err(Error::Invalid(_))));
    }

    #[test]
    fn a_serializable_value_becomes_the_payload() -> Result<(), Error> {
        let request = Enqueue::to("echo").json(&vec![1, 2]).into_request()?;
        assert_eq!(request.payload, b"[1,2]");
        Ok(())
    }
}
