//! How a host reaches its NATS cluster, and how much one message of the stream can carry.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::keys;
use crate::config::{NatsSettings, check_nats, shown_nats_urls};

/// How a host reaches its NATS cluster (`[store]` with `backend = "nats"`). `Debug` shows the
/// URLs without their user parts.
#[derive(Clone, PartialEq, Eq)]
pub struct NatsConfig {
    /// Server URLs; the client picks one and fails over to the others. One may carry
    /// credentials in its user part: show them only through [`shown_nats_urls`].
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
    /// How long the server keeps a settled record before it expires it by itself (JetStream's
    /// per-message TTL; `[host] retention`). `None`: records stay until `purge_terminal`.
    pub settled_ttl: Option<Duration>,
    /// How long a settled record stays in its thread's tree before a host's sweep moves it to
    /// the archive (see `archive`), out of what a starting host reads.
    pub archive_after: Duration,
}

impl std::fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsConfig")
            .field("urls", &shown_nats_urls(&self.urls))
            .field("credentials", &self.credentials)
            .field("prefix", &self.prefix)
            .field("replicas", &self.replicas)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("settled_ttl", &self.settled_ttl)
            .field("archive_after", &self.archive_after)
            .finish()
    }
}

/// [`NatsConfig::archive_after`] unless set otherwise.
pub const ARCHIVE_AFTER: Duration = Duration::from_secs(30);

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig::from_settings(&NatsSettings::default(), Path::to_path_buf)
    }
}

impl NatsConfig {
    /// The connection settings of `[store]` with `backend = "nats"`; `resolve` anchors a
    /// relative credentials path (at the config file's directory).
    pub fn from_settings(settings: &NatsSettings, resolve: impl Fn(&Path) -> PathBuf) -> Self {
        NatsConfig {
            urls: settings.urls(),
            credentials: settings.credentials.as_deref().map(resolve),
            prefix: settings.prefix.clone(),
            replicas: settings.replicas,
            connect_timeout: settings.connect_timeout,
            request_timeout: settings.request_timeout,
            settled_ttl: None,
            archive_after: ARCHIVE_AFTER,
        }
    }

    /// Checks the settings a server cannot check for us (the same rule `homing.toml` is held
    /// to).
    pub fn validate(&self) -> Result<(), String> {
        check_nats(
            &self.urls,
            &self.prefix,
            self.replicas,
            [self.connect_timeout, self.request_timeout],
        )
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
