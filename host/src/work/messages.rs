//! Sending a message into a thread's inbox, and waiting until a guest acknowledged it: what the
//! API, the CLI and the dashboard do with a message, written once.

use std::time::Duration;

use metrics::counter;

use crate::config::{BusyPolicy, Config};
use crate::store::{Message, MessageKind, NewMessage, OnBusy, Sent, Store, StoreError};
use crate::telemetry::MESSAGES_SENT;

/// Why a send was refused before or by the store.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The message names an agent the config does not serve.
    #[error("no agent `{0}`")]
    UnknownAgent(String),
    /// The payload is over `[host] max_message` (or what the store holds).
    #[error("payload: {size} bytes exceeds [host] max_message ({limit} bytes)")]
    TooLarge {
        /// The payload's size.
        size: u64,
        /// The limit in force.
        limit: u64,
    },
    /// The store refused it (`Invalid` naming the field, `Limit` for a full inbox) or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The largest message payload in force: `[host] max_message` (default `max_payload`),
/// clamped to what the store holds.
pub fn max_message(config: &Config, store: &Store) -> u64 {
    config
        .host
        .max_message
        .unwrap_or(config.host.max_payload)
        .min(store.inbox.max_message())
}

/// Stores `new` as the next message of `thread`, within the config's limits: the agent it
/// names must be served, the payload at most [`max_message`], the thread's pending messages
/// under `[host] max_inbox`. A message with no policy of its own, not sent as a steer, takes
/// the `[plugins.x.inbox] on_busy` of the agent it names. Counts it in the metrics.
///
/// # Errors
///
/// [`SendError`], naming what was wrong; nothing is stored when it is refused.
pub async fn send(
    store: &Store,
    config: &Config,
    thread: &str,
    new: NewMessage,
) -> Result<Sent, SendError> {
    if let Some(agent) = &new.agent
        && !config.plugins.contains_key(agent)
    {
        return Err(SendError::UnknownAgent(agent.clone()));
    }
    let limit = max_message(config, store);
    let size = new.payload.len() as u64;
    if size > limit {
        return Err(SendError::TooLarge { size, limit });
    }
    let mut new = new;
    if new.on_busy.is_none()
        && new.kind == MessageKind::FollowUp
        && let Some(plugin) = new.agent.as_ref().and_then(|a| config.plugins.get(a))
    {
        new.on_busy = plugin.inbox.on_busy.map(|p| match p {
            BusyPolicy::Enqueue => OnBusy::Enqueue,
            BusyPolicy::Steer => OnBusy::Steer,
            BusyPolicy::Reject => OnBusy::Reject,
            BusyPolicy::Interrupt => OnBusy::Interrupt,
            BusyPolicy::Rollback => OnBusy::Rollback,
            BusyPolicy::Merge => OnBusy::Merge,
        });
    }
    if new.follow_up_window.is_none()
        && let Some(plugin) = new.agent.as_ref().and_then(|a| config.plugins.get(a))
    {
        new.follow_up_window = plugin.inbox.follow_up_window();
    }
    let agent = new.agent.clone().unwrap_or_else(|| "none".to_owned());
    let sent = store.inbox.send(thread, new, config.host.max_inbox).await?;
    counter!(MESSAGES_SENT, "agent" => agent).increment(1);
    Ok(sent)
}

/// What a send answers of the run it interrupted (the API's and `thread send --json`'s
/// `interrupted`): the dispatch and the log entry marking its turn's end, or null.
pub fn interrupted_json(sent: &Sent) -> serde_json::Value {
    match &sent.interrupted {
        Some((dispatch, entry)) => serde_json::json!({"dispatch": dispatch, "entry": entry}),
        None => serde_json::Value::Null,
    }
}

/// Waits until message `seq` of `thread` leaves `pending` (acked or discarded), up to
/// `timeout`, woken by the thread's watch. `Ok(None)` when the time ran out first.
///
/// # Errors
///
/// When the store fails, or the message does not exist.
pub async fn until_settled(
    store: &Store,
    thread: &str,
    seq: u64,
    timeout: Duration,
) -> Result<Option<Message>, StoreError> {
    let until = tokio::time::Instant::now() + timeout;
    // The watch is a hint, and a store that cannot watch (a NATS client) never fires it: read
    // again at most this often regardless.
    const RECHECK: Duration = Duration::from_millis(250);
    let mut watch = store.inbox.watch(thread);
    loop {
        let Some(message) = store.inbox.message(thread, seq).await? else {
            return Err(StoreError::Invalid(format!(
                "seq: thread `{}` has no message {seq}",
                thread.escape_debug()
            )));
        };
        if message.state != crate::store::MessageState::Pending {
            return Ok(Some(message));
        }
        let now = tokio::time::Instant::now();
        if now >= until {
            return Ok(None);
        }
        tokio::select! {
            () = watch.changed() => {}
            () = tokio::time::sleep_until(until.min(now + RECHECK)) => {}
        }
    }
}

/// The oldest pending message of `thread` above `after`, waiting for one until `until` or
/// until `stop` resolves: what a guest's `next-message` does. The thread's watch is registered
/// before the first read, so a message sent in between is never waited past; with no change
/// seen, no read is made. `Ok(None)` when the time ran out or `stop` resolved first.
///
/// # Errors
///
/// When the store fails.
pub async fn wait_next(
    store: &Store,
    thread: &str,
    after: u64,
    until: std::time::Instant,
    stop: impl std::future::Future<Output = ()>,
) -> Result<Option<Message>, StoreError> {
    let pending = crate::store::MessageFilter {
        state: Some(crate::store::MessageState::Pending),
        after,
        limit: 1,
        max_bytes: None,
    };
    let mut watch = store.inbox.watch(thread);
    tokio::pin!(stop);
    loop {
        if let Some(message) = store
            .inbox
            .messages(thread, &pending)
            .await?
            .into_iter()
            .next()
        {
            return Ok(Some(message));
        }
        if std::time::Instant::now() >= until {
            return Ok(None);
        }
        tokio::select! {
            () = watch.changed() => {}
            () = &mut stop => return Ok(None),
            () = tokio::time::sleep_until(until.into()) => {}
        }
    }
}
