//! The `mailbox` interface outside a claim: `enqueue`, and the checks every follow-up request
//! passes, through a claim or not.
//!
//! A guest may enqueue only to the agents its plugin's `enqueue_to` names, with a payload
//! within the payload cap and a delay within [`MAX_ENQUEUE_DELAY`]; its `max-attempts` is held
//! to the target's own. The host records who enqueued it (`enqueued-by`) and, through a claim,
//! the parent dispatch (`parent`), whose thread is the default.

use std::collections::BTreeMap;
use std::time::Duration;

use super::GuestState;
use super::policy::{MAX_ENQUEUE_DELAY, guest_error};
use crate::runtime::bindings::mailbox;
use crate::runtime::bindings::types::Gather;
use crate::runtime::bindings::{EnqueueRequest, GuestError};
use crate::store::model::{self, Debounce};
use crate::store::{Dispatch, NewDispatch};
use crate::work::{Attempts, Request};

impl GuestState {
    /// The dispatch `request` asks for, or why the guest may not have it. `parent` is the
    /// claim it is enqueued through, whose thread is the default; outside a claim the request
    /// must name its thread. `trace` is the `traceparent` the new dispatch continues (unless
    /// the guest gave one itself), so follow-up work stays in the trace that caused it.
    pub(super) fn enqueue_request(
        &self,
        request: EnqueueRequest,
        parent: Option<&Dispatch>,
        trace: Option<String>,
    ) -> Result<NewDispatch, GuestError> {
        let plugin = &self.plugin;
        let Some((_, target_max)) = plugin
            .targets
            .iter()
            .find(|(name, _)| *name == request.agent)
        else {
            return Err(GuestError::Denied(format!(
                "plugin `{}` may not enqueue to `{}` (allowed: {})",
                plugin.name,
                request.agent,
                if plugin.config.enqueue_to.is_empty() {
                    "none".to_owned()
                } else {
                    plugin.config.enqueue_to.join(", ")
                }
            )));
        };
        let thread = match (request.thread, parent) {
            (Some(thread), _) => thread,
            (None, Some(parent)) => parent.thread.clone(),
            (None, None) => {
                return Err(GuestError::Invalid(
                    "thread: required outside a claim".into(),
                ));
            }
        };
        plugin
            .check_payload("payload", request.payload.len())
            .map_err(GuestError::Invalid)?;
        let delay = request.delay_ms.unwrap_or(0);
        if Duration::from_millis(delay) > MAX_ENQUEUE_DELAY {
            return Err(GuestError::Invalid(format!(
                "delay-ms: {delay} exceeds the host's cap of {} days",
                MAX_ENQUEUE_DELAY.as_secs() / 86400
            )));
        }
        let mut metadata: BTreeMap<String, String> = request.metadata.into_iter().collect();
        metadata.insert("enqueued-by".into(), plugin.name.clone());
        if let Some(parent) = parent {
            metadata.insert("parent".into(), parent.id.clone());
        }
        if let Some(trace) = trace {
            metadata.entry("traceparent".into()).or_insert(trace);
        }
        let request = Request {
            priority: request.priority,
            delay: Duration::from_millis(delay),
            metadata,
            dedupe_key: request.dedupe_key,
            max_attempts: request.max_attempts,
            concurrency_key: request.concurrency_key,
            debounce: match request.debounce {
                Some(d) => Some(Debounce {
                    key: d.key,
                    quiet_ms: d.quiet_ms,
                    max_wait_ms: d.max_wait_ms,
                    payload: match d.payload {
                        Gather::Last => model::Gather::Last,
                        Gather::First => model::Gather::First,
                        Gather::Collect => model::Gather::Collect,
                    },
                    max_items: d.max_items,
                }),
                None => plugin.target_debounce.get(&request.agent).cloned(),
            },
            ..Request::new(request.agent, thread, request.payload)
        };
        // The target's `concurrency_key` takes the key from the metadata when none is named.
        let keys = plugin.target_keys.get(&request.agent);
        // The rules every entry point applies (names printable and bounded, metadata bounded,
        // the concurrency key), before the store sees it: refused as `invalid`, naming the
        // field.
        request
            .into_dispatch(Attempts::AtMost(*target_max), keys)
            .map_err(GuestError::Invalid)
    }
}

impl mailbox::Host for GuestState {
    async fn enqueue(
        &mut self,
        request: EnqueueRequest,
    ) -> wasmtime::Result<Result<String, GuestError>> {
        // Outside a claim: the trace of the guest call in progress, if any.
        let trace = crate::telemetry::trace::traceparent(&tracing::Span::current())
            .or_else(|| self.http.traceparent.clone());
        let new = match self.enqueue_request(request, None, trace) {
            Ok(new) => new,
            Err(e) => return Ok(Err(e)),
        };
        Ok(self
            .plugin
            .store
            .mailbox
            .enqueue(new)
            .await
            .map(|d| d.id)
            .map_err(guest_error))
    }
}
