//! Connection and stream plumbing of the NATS backend: connecting, creating or checking the
//! stream, plain requests (stream info, direct gets, purges) and what the server's answers
//! mean. Errors are sorted by the client's error kinds and JetStream's API error codes, never
//! by their text.

use std::fmt;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::context::{CreateStreamError, CreateStreamErrorKind};
use async_nats::jetstream::context::{GetStreamError, GetStreamErrorKind};
use async_nats::jetstream::{self, ErrorCode, stream};
use bytes::Bytes;
use serde::Deserialize;

use super::NatsStore;
use super::config::{MIN_SERVER_PAYLOAD, NatsConfig, Room};
use crate::config::{UrlCredentials, split_nats_url};
use crate::store::{StoreError, StoreResult};

/// The outcome of a commit that the server refused.
pub(super) enum CommitError {
    /// An expectation failed: someone wrote first.
    Conflict,
    /// Anything else: the operation fails with this error.
    Store(StoreError),
}

/// The `Unavailable` error of a failed request: what was asked, and what went wrong.
pub(super) fn unavailable(what: &str, e: impl fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("nats: {what}: {e}"))
}

/// The reply to a publish (or a purge): the stored sequence, or the API error.
#[derive(Deserialize)]
struct PubAck {
    #[serde(default)]
    seq: u64,
    #[serde(default)]
    error: Option<jetstream::Error>,
}

#[derive(Deserialize)]
struct InfoState {
    #[serde(default)]
    last_seq: u64,
}

#[derive(Deserialize)]
struct InfoReply {
    #[serde(default)]
    state: Option<InfoState>,
    #[serde(default)]
    error: Option<jetstream::Error>,
}

/// Whether the server refused a write because an expectation failed: someone else wrote the
/// thread first. A single server answers `STREAM_WRONG_LAST_SEQUENCE` (naming the sequence it
/// found); a cluster, or a batch whose subject is already being written, the constant form.
fn lost_race(error: &jetstream::Error) -> bool {
    let code = error.error_code();
    code == ErrorCode::STREAM_WRONG_LAST_SEQUENCE
        || code == ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT
}

/// The stream sequence a publish's `reply` reports, or why nothing was stored.
pub(super) fn stored_seq(reply: &[u8]) -> Result<u64, CommitError> {
    let ack: PubAck = serde_json::from_slice(reply)
        .map_err(|e| CommitError::Store(unavailable("publish reply", e)))?;
    match ack.error {
        None => Ok(ack.seq),
        Some(error) if lost_race(&error) => Err(CommitError::Conflict),
        Some(error) => Err(CommitError::Store(unavailable("publish refused", error))),
    }
}

/// Whether a stream lookup failed because the stream does not exist.
fn stream_missing(e: &GetStreamError) -> bool {
    matches!(e.kind(), GetStreamErrorKind::JetStream(error)
        if error.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

/// Whether a stream creation failed because a stream of that name exists.
fn stream_exists(e: &CreateStreamError) -> bool {
    matches!(e.kind(), CreateStreamErrorKind::JetStream(error)
        if error.error_code() == ErrorCode::STREAM_NAME_EXIST)
}

/// Looks the stream of `config` up without creating it: its info, or `None` when it does not
/// exist.
pub(super) async fn find_stream(
    js: &jetstream::Context,
    config: &NatsConfig,
) -> StoreResult<Option<stream::Info>> {
    match js.get_stream(&config.prefix).await {
        Ok(mut s) => Ok(Some(
            s.info()
                .await
                .map_err(|e| unavailable("stream info", e))?
                .clone(),
        )),
        Err(e) if stream_missing(&e) => Ok(None),
        Err(e) => Err(unavailable("stream lookup", e)),
    }
}

impl NatsStore {
    /// The stream's last sequence, asked of the server.
    pub(super) async fn stream_last_seq(&self) -> StoreResult<u64> {
        let subject = format!("$JS.API.STREAM.INFO.{}", self.inner.prefix);
        let reply = self
            .request(subject, Bytes::new(), HeaderMap::new())
            .await?;
        let info: InfoReply =
            serde_json::from_slice(&reply).map_err(|e| unavailable("stream info reply", e))?;
        if let Some(error) = info.error {
            return Err(unavailable("stream info", error));
        }
        Ok(info.state.map_or(0, |s| s.last_seq))
    }

    /// Sends one request and waits for its reply, within the request timeout.
    pub(super) async fn request(
        &self,
        subject: String,
        payload: Bytes,
        headers: HeaderMap,
    ) -> StoreResult<Bytes> {
        let request = async_nats::Request::new()
            .payload(payload)
            .headers(headers)
            .timeout(Some(self.inner.timeout));
        let shown = subject.clone();
        let fut = self.inner.client.send_request(subject, request);
        match tokio::time::timeout(self.inner.timeout + Duration::from_millis(100), fut).await {
            Ok(Ok(message)) => Ok(message.payload),
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::MaxPayloadExceeded => {
                Err(self.too_big(&shown, e))
            }
            Ok(Err(e)) => Err(unavailable(&format!("request to {shown}"), e)),
            Err(_) => Err(unavailable(&format!("request to {shown}"), "timed out")),
        }
    }

    /// The error of a message the client or server refused as over `max_payload`: retrying
    /// cannot help, so it is `Invalid`, not `Unavailable`.
    pub(super) fn too_big(&self, subject: &str, e: impl fmt::Display) -> StoreError {
        StoreError::Invalid(format!(
            "nats: the message to {subject} is over the server's max_payload ({e}; {} bytes \
             when this host connected)",
            self.inner.room.server
        ))
    }

    /// Reads a subject's last message straight from the server (on a cluster, from the stream's
    /// leader: see `fetch`): its sequence and payload.
    pub(super) async fn get_last(&self, subject: &str) -> StoreResult<Option<(u64, Bytes)>> {
        Ok(self
            .get_last_matching(subject)
            .await?
            .map(|got| (got.seq, got.payload)))
    }

    /// Purges messages as `body` says (`filter`, `seq`: see the JetStream purge API).
    pub(super) async fn purge(&self, body: serde_json::Value) -> StoreResult<()> {
        let api = format!("$JS.API.STREAM.PURGE.{}", self.inner.prefix);
        let body = body.to_string();
        let reply = self
            .request(api, Bytes::from(body), HeaderMap::new())
            .await?;
        let parsed: PubAck =
            serde_json::from_slice(&reply).map_err(|e| unavailable("purge reply", e))?;
        if let Some(error) = parsed.error {
            return Err(unavailable("purge", error));
        }
        Ok(())
    }

    /// Deletes the one message at stream sequence `seq` (never anything newer on its subject:
    /// a message replaced since is already gone, and then nothing is deleted). `Ok(false)`
    /// when the server deleted nothing: no message has that sequence any more.
    pub(super) async fn delete_seq(&self, seq: u64) -> StoreResult<bool> {
        #[derive(Deserialize)]
        struct DeleteReply {
            #[serde(default)]
            success: bool,
            #[serde(default)]
            error: Option<jetstream::Error>,
        }
        let api = format!("$JS.API.STREAM.MSG.DELETE.{}", self.inner.prefix);
        let body = serde_json::json!({ "seq": seq, "no_erase": true }).to_string();
        let reply = self
            .request(api, Bytes::from(body), HeaderMap::new())
            .await?;
        let parsed: DeleteReply =
            serde_json::from_slice(&reply).map_err(|e| unavailable("delete reply", e))?;
        match parsed.error {
            None => Ok(parsed.success),
            // The server's "delete failed" code: here, no message at that sequence.
            Some(error) if error.error_code() == ErrorCode::STREAM_MESSAGE_DELETE_FAILED => {
                Ok(false)
            }
            Some(error) => Err(unavailable("delete", error)),
        }
    }

    /// The error of a message publish the client refused.
    pub(super) fn publish_failed(&self, subject: &str, e: async_nats::PublishError) -> StoreError {
        if e.kind() == async_nats::client::PublishErrorKind::MaxPayloadExceeded {
            self.too_big(subject, e)
        } else {
            unavailable("publish", e)
        }
    }
}

/// The room of the server `client` is connected to, from its advertised `max_payload` (the
/// client's own negotiated value when the server info does not say).
pub(super) fn room_of(client: &async_nats::Client) -> StoreResult<Room> {
    let advertised = client.server_info().max_payload;
    let server = if advertised > 0 {
        advertised
    } else {
        client.max_payload()
    } as u64;
    if server < MIN_SERVER_PAYLOAD {
        return Err(StoreError::Invalid(format!(
            "the NATS server's max_payload is {server} bytes; Homing needs at least \
             {MIN_SERVER_PAYLOAD} (raise max_payload in the server's configuration)"
        )));
    }
    Ok(Room::of(server))
}

/// The largest NATS `.creds` file read (a JWT and a seed take a few KiB).
pub const MAX_CREDENTIALS_SIZE: u64 = 64 * 1024;

/// Connects to the first server of `config` that answers, within its connect timeout.
pub(super) async fn connect_client(config: &NatsConfig) -> StoreResult<async_nats::Client> {
    let mut options = async_nats::ConnectOptions::new()
        .connection_timeout(config.connect_timeout)
        .request_timeout(Some(config.request_timeout))
        .name("homing");
    if let Some(creds) = &config.credentials {
        // Read here, with a bound, rather than handing the path to the client: a FIFO or a
        // huge file named by mistake is refused by name instead of read without end.
        let text = crate::input::read_file_capped(
            creds,
            MAX_CREDENTIALS_SIZE,
            "the NATS credentials file",
            "the credentials size limit",
        )
        .map_err(|e| StoreError::Invalid(e.to_string()))?;
        let text = String::from_utf8(text).map_err(|_| {
            StoreError::Invalid(format!(
                "the NATS credentials file {} is not UTF-8",
                creds.display()
            ))
        })?;
        options = options.credentials(&text).map_err(|e| {
            StoreError::Invalid(format!("credentials file {}: {e}", creds.display()))
        })?;
    }
    // The client gets the URLs without their user parts, and those as credentials: so it
    // authenticates with them, and never shows them (in its errors or its own log lines).
    let mut servers = Vec::with_capacity(config.urls.len());
    for url in &config.urls {
        let (server, credentials) = split_nats_url(url);
        servers.push(server);
        options = match credentials {
            Some(UrlCredentials::UserPassword(user, password)) => {
                options.user_and_password(user, password)
            }
            Some(UrlCredentials::Token(token)) => options.token(token),
            None => options,
        };
    }
    let shown = servers.join(", ");
    let connect = options.connect(servers);
    match tokio::time::timeout(config.connect_timeout + Duration::from_secs(1), connect).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(unavailable(&format!("cannot connect to {shown}"), e)),
        Err(_) => Err(unavailable(
            &format!("cannot connect to {shown}"),
            "timed out",
        )),
    }
}

/// The stream a deployment of `config` needs.
fn stream_config(config: &NatsConfig) -> stream::Config {
    stream::Config {
        name: config.prefix.clone(),
        subjects: vec![format!("{}.>", config.prefix)],
        max_messages_per_subject: 1,
        discard: stream::DiscardPolicy::Old,
        retention: stream::RetentionPolicy::Limits,
        storage: stream::StorageType::File,
        num_replicas: config.replicas,
        allow_direct: true,
        allow_rollup: true,
        allow_message_ttl: true,
        allow_atomic_publish: true,
        ..Default::default()
    }
}

/// Fails when an existing stream was made for another shape of deployment.
pub(super) fn check_config(found: &stream::Config, config: &NatsConfig) -> StoreResult<()> {
    let want = stream_config(config);
    let mut diffs = Vec::new();
    if found.num_replicas != want.num_replicas {
        diffs.push(format!(
            "replicas {} (configured {})",
            found.num_replicas, want.num_replicas
        ));
    }
    if found.max_messages_per_subject != 1 {
        diffs.push(format!(
            "max_msgs_per_subject {} (need 1)",
            found.max_messages_per_subject
        ));
    }
    if !found.max_age.is_zero() || found.max_messages > 0 || found.max_bytes > 0 {
        diffs.push("a retention limit (max_age, max_msgs or max_bytes) would drop records".into());
    }
    if !found.allow_atomic_publish || !found.allow_direct || !found.allow_message_ttl {
        diffs.push("atomic batches, direct gets and message TTLs must be allowed".into());
    }
    if found.subjects != want.subjects {
        diffs.push(format!(
            "subjects {:?} (need {:?})",
            found.subjects, want.subjects
        ));
    }
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "the NATS stream `{}` exists with other settings: {}; fix the config or the stream",
            config.prefix,
            diffs.join("; ")
        )))
    }
}

/// Creates the stream of `config`, or checks the one that exists.
/// The server's time, as the `ts` of its answer to a stream info request (servers from 2.10
/// say it), in Unix milliseconds. `None` when the request fails or the server does not say: the
/// caller's clock then keeps its own time until the stream's messages carry stamps.
pub(super) async fn server_time(js: &jetstream::Context, stream: &str) -> Option<u64> {
    #[derive(Deserialize)]
    struct Stamped {
        ts: Option<String>,
    }
    let answer: jetstream::response::Response<Stamped> = js
        .request(format!("STREAM.INFO.{stream}"), &serde_json::json!({}))
        .await
        .ok()?;
    let jetstream::response::Response::Ok(Stamped { ts: Some(ts) }) = answer else {
        return None;
    };
    let at: jiff::Timestamp = ts.parse().ok()?;
    u64::try_from(at.as_millisecond()).ok()
}

pub(super) async fn ensure_stream(js: &jetstream::Context, config: &NatsConfig) -> StoreResult<()> {
    match js.get_stream(&config.prefix).await {
        Ok(mut s) => {
            let info = s.info().await.map_err(|e| unavailable("stream info", e))?;
            check_config(&info.config, config)
        }
        Err(e) if stream_missing(&e) => {
            match js.create_stream(stream_config(config)).await {
                Ok(_) => Ok(()),
                // Another host created it first (with other settings, or the server would
                // have answered with the stream): check what it made.
                Err(e) if stream_exists(&e) => {
                    let mut s = js
                        .get_stream(&config.prefix)
                        .await
                        .map_err(|e| unavailable("stream lookup", e))?;
                    let info = s.info().await.map_err(|e| unavailable("stream info", e))?;
                    check_config(&info.config, config)
                }
                Err(e) => Err(unavailable("create stream", e)),
            }
        }
        Err(e) => Err(unavailable("stream lookup", e)),
    }
}
