//! [`Enqueue`]: a follow-up dispatch to ask the host for, built step by step.
//!
//! ```
//! # use homing_guest::Enqueue;
//! # use std::time::Duration;
//! let request = Enqueue::to("summarize")
//!     .payload("the text")
//!     .thread("customer-42")
//!     .priority(10)
//!     .delay(Duration::from_secs(5))
//!     .dedupe_key("summary")
//!     .metadata("reply-to", "echo:customer-42");
//! # let _ = request;
//! ```
//!
//! Send it through a claim with [`Claim::enqueue`](crate::Claim::enqueue), where leaving out
//! the thread means the claimed dispatch's thread, or with the free function [`enqueue`],
//! where a thread is required. The host checks the target against the plugin's `enqueue_to`
//! list and answers [`Error::Denied`] for any other agent.

use std::time::Duration;

pub use crate::__bindings::types::Gather;
use crate::__bindings::{
    mailbox,
    types::{Debounce, EnqueueRequest},
};
use crate::claim::duration_to_ms;
use crate::error::Error;

/// A follow-up dispatch for the host to enqueue. Unset fields take the host's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "an Enqueue does nothing until it is passed to `enqueue` or `Claim::enqueue`"]
pub struct Enqueue {
    agent: String,
    thread: Option<String>,
    payload: Vec<u8>,
    metadata: Vec<(String, String)>,
    priority: Option<u8>,
    delay: Option<Duration>,
    dedupe_key: Option<String>,
    max_attempts: Option<u32>,
    /// (key, quiet ms, max wait ms, gather, max items): the WIT record derives no equality.
    debounce: Option<(String, u64, u64, Gather, u32)>,
    /// A problem found while building (a JSON payload that failed to serialize), reported by
    /// the call that sends the request so the builder chain stays unbroken.
    deferred_error: Option<Error>,
}

impl Enqueue {
    /// Starts a request to the agent (plugin name) `agent`, with an empty payload.
    pub fn to(agent: impl Into<String>) -> Self {
        Enqueue {
            agent: agent.into(),
            thread: None,
            payload: Vec::new(),
            metadata: Vec::new(),
            priority: None,
            delay: None,
            dedupe_key: None,
            max_attempts: None,
            debounce: None,
            deferred_error: None,
        }
    }

    /// Sets the input for the target agent.
    pub fn payload(mut self, payload: impl Into<Vec<u8>>) -> Self {
        self.payload = payload.into();
        self
    }

    /// Sets the thread; without it, [`Claim::enqueue`](crate::Claim::enqueue) uses the
    /// claimed dispatch's thread.
    pub fn thread(mut self, thread: impl Into<String>) -> Self {
        self.thread = Some(thread.into());
        self
    }

    /// Sets the priority: 0 is most urgent, 255 least (the host's default is 128).
    pub fn priority(mut self, priority: u8) -> Self {
        self.priority = Some(priority);
        self
    }

    /// Delays the dispatch: it may not be claimed before this has passed (whole milliseconds;
    /// the host caps it).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// Sets a dedupe key: the host keeps at most one live dispatch per (thread, key) and
    /// answers [`Error::Duplicate`] with the holder's id for another.
    pub fn dedupe_key(mut self, key: impl Into<String>) -> Self {
        self.dedupe_key = Some(key.into());
        self
    }

    /// Sets the metadata value under `key`, replacing an earlier value for the same key.
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        let key = key.into();
        let value = value.into();
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = value,
            None => self.metadata.push((key, value)),
        }
        self
    }

    /// Debounces it: it joins the open window of (thread, `key`) instead of adding work, or
    /// opens one, due `quiet` after the window's latest enqueue and no later than `max_wait`
    /// after its first (at most 7 days); the id the host answers is the window's. The run gets
    /// the latest payload (see [`Enqueue::gather`]); a window seals at 100 items (see
    /// [`Enqueue::max_items`]). Not with a delay or a dedupe key.
    pub fn debounce(mut self, key: impl Into<String>, quiet: Duration, max_wait: Duration) -> Self {
        self.debounce = Some((
            key.into(),
            duration_to_ms(quiet),
            duration_to_ms(max_wait),
            Gather::Last,
            100,
        ));
        self
    }

    /// With [`Enqueue::debounce`]: what the run gets, the latest enqueue's payload
    /// ([`Gather::Last`]), the first's, or every one's ([`Gather::Collect`], read with
    /// [`Claim::items`](crate::Claim::items)).
    pub fn gather(mut self, gather: Gather) -> Self {
        if let Some(d) = self.debounce.as_mut() {
            d.3 = gather;
        }
        self
    }

    /// With [`Enqueue::debounce`]: the window is sealed and due at once at this many enqueues.
    pub fn max_items(mut self, max_items: u32) -> Self {
        if let Some(d) = self.debounce.as_mut() {
            d.4 = max_items;
        }
        self
    }

    /// Sets the attempt limit (the host sets the default and a cap).
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = Some(max_attempts);
        self
    }

    /// Records an error to report when the request is sent.
    #[cfg_attr(not(feature = "json"), allow(dead_code))]
    pub(crate) fn defer_error(mut self, error: Error) -> Self {
        self.deferred_error.get_or_insert(error);
        self
    }

    /// Whether the request names a thread.
    fn has_thread(&self) -> bool {
        self.thread.is_some()
    }

    /// The WIT request, or the error deferred while building.
    pub(crate) fn into_request(self) -> Result<EnqueueRequest, Error> {
        if let Some(error) = self.deferred_error {
            return Err(error);
        }
        Ok(EnqueueRequest {
            agent: self.agent,
            thread: self.thread,
            payload: self.payload,
            metadata: self.metadata,
            priority: self.priority,
            delay_ms: self.delay.map(duration_to_ms),
            dedupe_key: self.dedupe_key,
            max_attempts: self.max_attempts,
            concurrency_key: None,
            debounce: self
                .debounce
                .map(
                    |(key, quiet_ms, max_wait_ms, payload, max_items)| Debounce {
                        key,
                        quiet_ms,
                        max_wait_ms,
                        payload,
                        max_items,
                    },
                ),
        })
    }
}

/// Enqueues a dispatch on the thread the request names; returns its id.
///
/// Outside a claim there is no thread to default to, so set one with [`Enqueue::thread`].
/// Inside a handler, prefer [`Claim::enqueue`](crate::Claim::enqueue).
///
/// # Errors
///
/// [`Error::Invalid`] when the request names no thread (checked before calling the host) or is
/// otherwise invalid, [`Error::Denied`] when this plugin may not address the target agent,
/// [`Error::Duplicate`] when the dedupe key is taken; also whatever else the host refuses with.
pub fn enqueue(request: Enqueue) -> Result<String, Error> {
    if !request.has_thread() {
        return Err(Error::Invalid(
            "thread: an enqueue outside a claim must name a thread".to_owned(),
        ));
    }
    let request = request.into_request()?;
    Ok(mailbox::enqueue(&request)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_fields_become_none_so_the_host_applies_its_defaults() -> Result<(), Error> {
        let request = Enqueue::to("echo").into_request()?;
        assert_eq!(request.agent, "echo");
        assert_eq!(request.thread, None);
        assert!(request.payload.is_empty());
        assert!(request.metadata.is_empty());
        assert_eq!(request.priority, None);
        assert_eq!(request.delay_ms, None);
        assert_eq!(request.dedupe_key, None);
        assert_eq!(request.max_attempts, None);
        Ok(())
    }

    #[test]
    fn every_builder_field_reaches_the_request() -> Result<(), Error> {
        let request = Enqueue::to("echo")
            .payload("hi")
            .thread("t/1")
            .priority(3)
            .delay(Duration::from_millis(1_500))
            .dedupe_key("k")
            .max_attempts(9)
            .metadata("a", "1")
            .into_request()?;
        assert_eq!(request.thread.as_deref(), Some("t/1"));
        assert_eq!(request.payload, b"hi");
        assert_eq!(request.priority, Some(3));
        assert_eq!(request.delay_ms, Some(1_500));
        assert_eq!(request.dedupe_key.as_deref(), Some("k"));
        assert_eq!(request.max_attempts, Some(9));
        assert_eq!(request.metadata, vec![("a".to_owned(), "1".to_owned())]);
        Ok(())
    }

    #[test]
    fn setting_a_metadata_key_twice_keeps_the_last_value() -> Result<(), Error> {
        let request = Enqueue::to("echo")
            .metadata("k", "old")
            .metadata("other", "x")
            .metadata("k", "new")
            .into_request()?;
        assert_eq!(
            request.metadata,
            vec![
                ("k".to_owned(), "new".to_owned()),
                ("other".to_owned(), "x".to_owned())
            ]
        );
        Ok(())
    }

    #[test]
    fn a_deferred_error_is_reported_when_the_request_is_built() {
        let built = Enqueue::to("echo")
            .defer_error(Error::Invalid("first".into()))
            .defer_error(Error::Invalid("second".into()))
            .into_request();
        assert!(matches!(built, Err(Error::Invalid(why)) if why == "first"));
    }

    #[test]
    fn enqueue_outside_a_claim_without_a_thread_is_invalid_before_any_host_call() {
        assert!(matches!(
            enqueue(Enqueue::to("echo")),
            Err(Error::Invalid(why)) if why.starts_with("thread")
        ));
    }
}
