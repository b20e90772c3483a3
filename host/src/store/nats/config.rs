//! How a host reaches its NATS cluster, and how much one message of the stream can carry.

use std::path::PathBuf;
use std::time::Duration;

use super::keys;

/// How a host reaches its NATS cluster (`[store]` with `backend = "nats"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsConfig {
    /// Server URLs; the client picks one and fails over to the others.
    pub urls: Vec<String>,
    /// A `.creds` file (JWT and NKey seed), when the server wants one.
    pub credentials: Option<PathBuf>,
    /// The stream name and the first token of every subject.
    pub prefix: String,
    /// Stream replicas: 1, or 3 on a cluster.
    pub replicas: usize,
    /// How long to wait for a connection at start.
    pub connect_timeout: Duration,
    /// How long any one request may take before it fails with `Unavailable`.
    pub request_timeout: Duration,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            urls: vec!["nats://127.0.0.1:4222".into()],
            credentials: None,
            prefix: "homing".into(),
            replicas: 1,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
        }
    }
}

impl NatsConfig {
    /// Checks the settings a server cannot check for us.
    pub fn validate(&self) -> Result<(), String> {
        if self.urls.is_empty() {
            return Err("url: at least one server URL is needed".into());
        }
        if self.prefix.is_empty()
            || !self
                .prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(format!(
                "prefix `{}`: use letters, digits, `_` and `-` only (it names a stream)",
                self.prefix
            ));
        }
        if !matches!(self.replicas, 1 | 3 | 5) {
            return Err(format!("replicas = {}: use 1, 3 or 5", self.replicas));
        }
        if self.request_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err("timeouts must be above zero".into());
        }
        Ok(())
    }
}

/// Room kept in each message for its NATS headers (expectations, batch ids, the subject filter
/// of a thread's tree): they count against the server's `max_payload`.
const HEADER_ROOM: u64 = 4 * 1024;
/// Room kept in a dispatch record for everything but its payload and output: names, metadata,
/// dedupe key, claim, error texts.
const FIELDS_ROOM: u64 = 64 * 1024;
/// What a record may grow by after its enqueue besides its output: a claim, a settlement's
/// token, an error text of up to [`crate::store::MAX_ERROR_TEXT`] bytes.
pub(super) const GROWTH_ROOM: u64 = 16 * 1024;
/// What a log entry's message adds to the entry: the append time.
const ENTRY_HEADER: u64 = 8;
/// The smallest server `max_payload` the backend works with.
pub const MIN_SERVER_PAYLOAD: u64 = 256 * 1024;

/// How much one message of the stream can carry, from the server's advertised `max_payload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// The server's `max_payload`: headers and payload of one message.
    pub server: u64,
    /// The largest record (message payload) written: `server` less [`HEADER_ROOM`].
    pub record: u64,
    /// The largest payload, and the largest output, of a dispatch: the two share one record
    /// with its other fields.
    pub value: u64,
    /// The largest log entry.
    pub entry: u64,
}

impl Room {
    /// The room under a server whose `max_payload` is `server` bytes.
    pub fn of(server: u64) -> Room {
        let record = server.saturating_sub(HEADER_ROOM);
        Room {
            server,
            record,
            value: record.saturating_sub(keys::FRAME_OVERHEAD + FIELDS_ROOM) / 2,
            entry: record.saturating_sub(ENTRY_HEADER),
        }
    }

    /// Why `value` is what it is, for error messages.
    pub(crate) fn value_why(&self) -> String {
        format!(
            "a dispatch's payload and output share one NATS message, and the server's \
             max_payload is {} bytes",
            self.server
        )
    }

    /// Why `entry` is what it is, for error messages.
    pub(crate) fn entry_why(&self) -> String {
        format!(
            "one NATS message per entry, and the server's max_payload is {} bytes",
            self.server
        )
    }
}
