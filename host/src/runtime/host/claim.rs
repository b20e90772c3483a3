//! The `claim` resource of the `mailbox` interface: what a guest can do with a dispatch it
//! was given.
//!
//! The resource's host representation is a [`ClaimHandle`] in the instance's resource table;
//! the guest holds only its index, never the token. Every write through it goes to the store
//! with the token and is fenced there (a lost lease or an interrupted thread refuses it).
//! Settling goes through the claim layer ([`ClaimHandle::ack`] and the rest), which records the
//! settlement on the handle and stops its lease guard; a follow-up enqueued through a settled
//! or stopped claim is refused here, like every other write through it.
//!
//! In the `agent` world the guest owns its claims: one it drops unsettled is a failed attempt,
//! nacked with the plugin's backoff (unless it was already told to stop, when the store would
//! refuse the nack anyway).

use crate::live::EmitError;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use metrics::{counter, histogram};

use tracing::debug;
use wasmtime::component::Resource;

use super::GuestState;
use super::journaled;
use super::policy::{MAX_ENQUEUES_PER_CLAIM, MAX_READ, MAX_STEP_KEY, guest_error};
use crate::claim::{self, ClaimHandle};
use crate::runtime::bindings::{DispatchInfo, EnqueueRequest, GuestError, StopReason};
use crate::runtime::bindings::{mailbox, types};
use crate::store::waitpoints::{hands_token, mint_token, token_digest};
use crate::store::{
    Dispatch, Message, MessageKind, NewWaitpoint, RunResult, TurnEvent, Waitpoint, WaitpointState,
};
use crate::telemetry::{MESSAGE_DELIVERY, MESSAGES_ACKED};
use crate::work::{messages, waitpoints};

impl From<claim::StopReason> for StopReason {
    fn from(reason: claim::StopReason) -> Self {
        match reason {
            claim::StopReason::Interrupted => StopReason::Interrupted,
            claim::StopReason::LeaseLost => StopReason::LeaseLost,
            claim::StopReason::Shutdown => StopReason::Shutdown,
            claim::StopReason::Deadline => StopReason::Deadline,
            claim::StopReason::Drained => StopReason::Upgrade,
        }
    }
}

/// A stored waitpoint as a claim sees it: never its digests; its token and callback URL only
/// when this call handed one out.
pub(super) fn wit_waitpoint(
    w: Waitpoint,
    token: Option<String>,
    callback_url: Option<String>,
) -> types::Waitpoint {
    types::Waitpoint {
        id: w.id,
        name: w.name,
        state: match w.state {
            WaitpointState::Pending => types::WaitpointState::Pending,
            WaitpointState::Completed => types::WaitpointState::Completed,
            WaitpointState::TimedOut => types::WaitpointState::TimedOut,
            WaitpointState::Cancelled => types::WaitpointState::Cancelled,
        },
        timeout_at: w.timeout_at,
        completion: w.result,
        settled_at: w.settled_at,
        settled_by: w.settled_by,
        metadata: w.metadata.into_iter().collect(),
        created_at: w.created_at,
        token,
        callback_url,
    }
}

/// The `info` record of a dispatch.
pub fn dispatch_info(d: &Dispatch) -> DispatchInfo {
    DispatchInfo {
        id: d.id.clone(),
        agent: d.agent.clone(),
        thread: d.thread.clone(),
        run_id: d.run_id.clone(),
        payload: d.payload.clone(),
        metadata: d
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        attempt: d.attempt,
        max_attempts: d.max_attempts,
        priority: d.priority,
        claims: d.claims,
        resumes: d.resumes,
        concurrency_key: d.concurrency_key.clone(),
    }
}

impl GuestState {
    /// When a wait of `wait_ms` in a host call ends, and whether the dispatch's deadline cut
    /// it short: it ends a second before the deadline, so the guest has time to act.
    fn wait_until(&self, wait_ms: u32) -> (Instant, bool) {
        let started = Instant::now();
        let mut until = started + Duration::from_millis(u64::from(wait_ms));
        let cut = self
            .deadline
            .map(|deadline| deadline.checked_sub(DEADLINE_MARGIN).unwrap_or(started));
        let by_deadline = cut.is_some_and(|cut| cut < until);
        if let Some(cut) = cut.filter(|_| by_deadline) {
            until = cut;
        }
        (until, by_deadline)
    }

    /// The claim behind `handle`; a handle not in the table traps the guest.
    pub(super) fn claim(&self, handle: &Resource<ClaimHandle>) -> wasmtime::Result<&ClaimHandle> {
        Ok(self.table.get(handle)?)
    }

    /// The claim behind `handle`, to write through.
    fn claim_mut(&mut self, handle: &Resource<ClaimHandle>) -> wasmtime::Result<&mut ClaimHandle> {
        Ok(self.table.get_mut(handle)?)
    }
}

/// The claim's journal when it journals the run's calls (`journal = "run"`).
pub(super) fn journaling(claim: &ClaimHandle) -> Option<std::sync::Arc<claim::Recorder>> {
    claim
        .journal()
        .cloned()
        .filter(|recorder| recorder.journals_calls())
}

/// Refuses a step key the contract does not allow: blank, over 256 bytes, or one of the
/// host's own (starting `homing/`).
fn check_step_key(key: &str) -> Result<(), GuestError> {
    if key.trim().is_empty() {
        return Err(GuestError::Invalid("key: must not be blank".into()));
    }
    if key.starts_with(claim::journal::HOST_STEP_PREFIX) {
        return Err(GuestError::Invalid(format!(
            "key: keys starting `{}` are the host's",
            claim::journal::HOST_STEP_PREFIX
        )));
    }
    if key.len() > MAX_STEP_KEY {
        return Err(GuestError::Invalid(format!(
            "key: {} bytes exceeds the cap of {MAX_STEP_KEY} bytes",
            key.len()
        )));
    }
    Ok(())
}

/// How long before the dispatch's deadline a wait in a host call ends.
const DEADLINE_MARGIN: Duration = Duration::from_secs(1);

/// The WIT kind of a message.
fn message_kind(kind: MessageKind) -> types::MessageKind {
    match kind {
        MessageKind::Steer => types::MessageKind::Steer,
        MessageKind::FollowUp => types::MessageKind::FollowUp,
    }
}

/// A stored message as a claim receives it.
fn wit_message(m: Message) -> types::Message {
    types::Message {
        seq: m.seq,
        kind: message_kind(m.kind),
        body: m.payload,
        metadata: m.metadata.into_iter().collect(),
        sent_at: m.sent_at,
        sent_by: m.sent_by,
        agent: m.agent,
    }
}

/// Why a write through `claim` is refused before it reaches the store, if it is: the claim
/// is settled, or told to stop for good.
pub(super) fn refuse_write(claim: &ClaimHandle) -> Option<GuestError> {
    let id = &claim.dispatch().id;
    if claim.settled().is_some() {
        return Some(GuestError::LostClaim(format!(
            "dispatch `{id}` was already settled through this claim"
        )));
    }
    match claim.control().stop_reason() {
        Some(claim::StopReason::Interrupted) => Some(GuestError::Interrupted(format!(
            "the thread of dispatch `{id}` was interrupted"
        ))),
        Some(claim::StopReason::LeaseLost) => Some(GuestError::LostClaim(format!(
            "the lease on dispatch `{id}` was lost"
        ))),
        _ => None,
    }
}

/// Why a follow-up may not be enqueued through `claim`, if it may not: the claim is settled,
/// told to stop for good, or has used up its follow-ups.
fn refuse_follow_up(claim: &ClaimHandle) -> Option<GuestError> {
    if let Some(refusal) = refuse_write(claim) {
        return Some(refusal);
    }
    (claim.enqueued() >= MAX_ENQUEUES_PER_CLAIM).then(|| {
        GuestError::Denied(format!(
            "a dispatch may enqueue at most {MAX_ENQUEUES_PER_CLAIM} follow-ups"
        ))
    })
}

impl mailbox::HostClaim for GuestState {
    async fn info(&mut self, handle: Resource<ClaimHandle>) -> wasmtime::Result<DispatchInfo> {
        Ok(dispatch_info(self.claim(&handle)?.dispatch()))
    }

    async fn record_start(
        &mut self,
        handle: Resource<ClaimHandle>,
    ) -> wasmtime::Result<Result<(), GuestError>> {
        let claim = self.claim(&handle)?;
        let out = claim.record_start(&self.plugin.store).await;
        Ok(out.map(drop).map_err(guest_error))
    }

    async fn record_result(
        &mut self,
        handle: Resource<ClaimHandle>,
        output: Vec<u8>,
    ) -> wasmtime::Result<Result<(), GuestError>> {
        let claim = self.claim(&handle)?;
        if let Err(e) = self.plugin.check_payload("output", output.len()) {
            return Ok(Err(GuestError::Invalid(e)));
        }
        let out = claim
            .record_result(&self.plugin.store, RunResult::success(output))
            .await;
        Ok(out.map(drop).map_err(guest_error))
    }

    async fn complete(
        &mut self,
        handle: Resource<ClaimHandle>,
        output: Vec<u8>,
    ) -> wasmtime::Result<Result<(), GuestError>> {
        let claim = self.table.get_mut(&handle)?;
        if let Err(e) = self.plugin.check_payload("output", output.len()) {
            return Ok(Err(GuestError::Invalid(e)));
        }
        let out = claim.complete(&self.plugin.store, output).await;
        Ok(out.map(drop).map_err(guest_error))
    }

    async fn ack(
        &mut self,
        handle: Resource<ClaimHandle>,
    ) -> wasmtime::Result<Result<(), GuestError>> {
        let claim = self.table.get_mut(&handle)?;
        let out = claim.ack(&self.plugin.store).await;
        Ok(out.map(drop).map_err(guest_error))
    }

    async fn nack(
        &mut self,
        handle: Resource<ClaimHandle>,
        error: String,
        retry_after_ms: Option<u64>,
    ) -> wasmtime::Result<Result<(), GuestError>> {
        let claim = self.table.get_mut(&handle)?;
        let (store, retry) = (&self.plugin.store, &self.plugin.config.retry);
        let asked = retry_after_ms.map(Duration::from_millis);
        let out = claim.nack(store, retry, &error, asked).await;
        Ok(out.map(drop).map_err(guest_error))
    }

    async fn dead_letter(
        &mut self,
        handle: Resource<ClaimHandle>,
        error: String,
    ) -> wasmtime::Result<Result<(), GuestError>> {
        let claim = self.table.get_mut(&handle)?;
        let out = claim.dead_letter(&self.plugin.store, &error).await;
        Ok(out.map(drop).map_err(guest_error))
    }

    async fn append(
        &mut self,
        handle: Resource<ClaimHandle>,
        entry: Vec<u8>,
    ) -> wasmtime::Result<Result<u64, GuestError>> {
        let claim = self.claim(&handle)?;
        if let Err(e) = self.plugin.check_payload("entry", entry.len()) {
            return Ok(Err(GuestError::Invalid(e)));
        }
        let fence = claim.fence();
        let thread = claim.dispatch().thread.clone();
        if let Some(recorder) = journaling(claim) {
            let out = journaled::append(&recorder, &self.plugin.store, &thread, &entry, None);
            return Ok(out.await.map_err(guest_error));
        }
        Ok(self
            .plugin
            .store
            .log
            .append(&thread, &entry, Some(&fence))
            .await
            .map_err(guest_error))
    }

    async fn append_expected(
        &mut self,
        handle: Resource<ClaimHandle>,
        entry: Vec<u8>,
        expected_latest: u64,
    ) -> wasmtime::Result<Result<u64, GuestError>> {
        let claim = self.claim(&handle)?;
        if let Err(e) = self.plugin.check_payload("entry", entry.len()) {
            return Ok(Err(GuestError::Invalid(e)));
        }
        let fence = claim.fence();
        let thread = claim.dispatch().thread.clone();
        if let Some(recorder) = journaling(claim) {
            let store = &self.plugin.store;
            let out = journaled::append(&recorder, store, &thread, &entry, Some(expected_latest));
            return Ok(out.await.map_err(guest_error));
        }
        Ok(self
            .plugin
            .store
            .log
            .append_expected(&thread, &entry, expected_latest, Some(&fence))
            .await
            .map_err(guest_error))
    }

    async fn read_log(
        &mut self,
        handle: Resource<ClaimHandle>,
        after: u64,
        limit: u32,
    ) -> wasmtime::Result<Result<Vec<types::LogEntry>, GuestError>> {
        let claim = self.claim(&handle)?;
        let thread = claim.dispatch().thread.clone();
        let recorder = journaling(claim);
        // "Up to `limit`": none for 0 (the store would read its default page for 0).
        if limit == 0 {
            return Ok(Ok(Vec::new()));
        }
        let limit = usize::try_from(limit.min(MAX_READ)).unwrap_or(1);
        let store = &self.plugin.store;
        let out = match recorder {
            Some(recorder) => journaled::read(&recorder, store, &thread, after, limit).await,
            None => store.log.read(&thread, after, limit).await,
        };
        Ok(out
            .map(|entries| {
                entries
                    .into_iter()
                    .map(|e| types::LogEntry {
                        seq: e.seq,
                        data: e.data,
                        appended_at: e.appended_at,
                        message: e.note.map(|note| types::MessageNote {
                            seq: note.seq,
                            kind: message_kind(note.kind),
                            metadata: note.metadata.into_iter().collect(),
                            sent_at: note.sent_at,
                            sent_by: note.sent_by,
                        }),
                        turn: e.turn.map(|turn| types::TurnMark {
                            event: match turn.event {
                                TurnEvent::Interrupted => types::TurnEvent::Interrupted,
                                TurnEvent::RolledBack => types::TurnEvent::RolledBack,
                                TurnEvent::Merged => types::TurnEvent::Merged,
                            },
                            dispatch: turn.dispatch,
                            message: turn.message,
                            masked: turn.masked.map(|r| types::LogRange {
                                first: r.first,
                                last: r.last,
                            }),
                        }),
                    })
                    .collect()
            })
            .map_err(guest_error))
    }

    async fn log_latest(
        &mut self,
        handle: Resource<ClaimHandle>,
    ) -> wasmtime::Result<Result<u64, GuestError>> {
        let claim = self.claim(&handle)?;
        let thread = claim.dispatch().thread.clone();
        if let Some(recorder) = journaling(claim) {
            let out = journaled::latest(&recorder, &self.plugin.store, &thread).await;
            return Ok(out.map_err(guest_error));
        }
        Ok(self
            .plugin
            .store
            .log
            .latest(&thread)
            .await
            .map_err(guest_error))
    }

    async fn stop_requested(
        &mut self,
        handle: Resource<ClaimHandle>,
    ) -> wasmtime::Result<Option<StopReason>> {
        let claim = self.claim(&handle)?;
        if let Some(reason) = claim.control().stop_reason() {
            return Ok(Some(reason.into()));
        }
        if self.plugin.shutdown.load(Ordering::SeqCst) {
            return Ok(Some(StopReason::Shutdown));
        }
        if self.plugin.retired.load(Ordering::SeqCst) {
            return Ok(Some(StopReason::Upgrade));
        }
        Ok(None)
    }

    async fn enqueue(
        &mut self,
        handle: Resource<ClaimHandle>,
        request: EnqueueRequest,
    ) -> wasmtime::Result<Result<String, GuestError>> {
        let claim = self.claim(&handle)?;
        if let Some(refusal) = refuse_follow_up(claim) {
            return Ok(Err(refusal));
        }
        let parent = claim.dispatch().clone();
        // A follow-up is a child of this attempt's span (or, with traces off, carries on the
        // `traceparent` this dispatch was enqueued with).
        let trace = crate::telemetry::trace::traceparent(claim.span())
            .or_else(|| parent.metadata.get("traceparent").cloned());
        let new = match self.enqueue_request(request, Some(&parent), trace) {
            Ok(new) => new,
            Err(e) => return Ok(Err(e)),
        };
        let out = match journaling(claim) {
            Some(recorder) => journaled::enqueue(&recorder, &self.plugin.store, new).await,
            None => self.plugin.store.mailbox.enqueue(new).await.map(|d| d.id),
        };
        if out.is_ok() {
            self.claim_mut(&handle)?.count_enqueued();
        }
        Ok(out.map_err(guest_error))
    }

    async fn items(
        &mut self,
        handle: Resource<ClaimHandle>,
    ) -> wasmtime::Result<Vec<crate::runtime::bindings::types::Item>> {
        let d = self.claim(&handle)?.dispatch();
        Ok(d.window
            .iter()
            .flat_map(|w| &w.items)
            .map(|i| crate::runtime::bindings::types::Item {
                payload: i.payload.clone(),
                metadata: i.metadata.clone().into_iter().collect(),
                enqueued_at: i.enqueued_at,
            })
            .collect())
    }

    async fn next_message(
        &mut self,
        handle: Resource<ClaimHandle>,
        wait_ms: u32,
    ) -> wasmtime::Result<Result<Option<types::Message>, GuestError>> {
        let claim = self.claim(&handle)?;
        if let Some(refusal) = refuse_write(claim) {
            return Ok(Err(refusal));
        }
        let thread = claim.dispatch().thread.clone();
        let agent = claim.dispatch().agent.clone();
        let control = claim.control().clone();
        let after = claim.handed();
        let (until, by_deadline) = self.wait_until(wait_ms);
        let store = self.plugin.store.clone();
        match messages::wait_next(&store, &thread, after, until, control.stopped()).await {
            Err(e) => Ok(Err(guest_error(e))),
            Ok(Some(message)) => {
                self.claim_mut(&handle)?.hand_through(message.seq);
                let waited = store.now().saturating_sub(message.sent_at);
                histogram!(MESSAGE_DELIVERY, "agent" => agent).record(waited as f64 / 1000.0);
                Ok(Ok(Some(wit_message(message))))
            }
            Ok(None) => {
                if by_deadline && Instant::now() >= until && control.stop_reason().is_none() {
                    control.request_stop(claim::StopReason::Deadline);
                }
                Ok(Ok(None))
            }
        }
    }

    async fn ack_message(
        &mut self,
        handle: Resource<ClaimHandle>,
        seq: u64,
    ) -> wasmtime::Result<Result<u64, GuestError>> {
        let claim = self.claim(&handle)?;
        if let Some(refusal) = refuse_write(claim) {
            return Ok(Err(refusal));
        }
        let fence = claim.fence();
        let thread = claim.dispatch().thread.clone();
        let agent = claim.dispatch().agent.clone();
        let out = self
            .plugin
            .store
            .inbox
            .ack_message(&thread, seq, &fence)
            .await;
        if out.is_ok() {
            counter!(MESSAGES_ACKED, "agent" => agent).increment(1);
        }
        Ok(out.map_err(guest_error))
    }

    async fn waitpoint(
        &mut self,
        handle: Resource<ClaimHandle>,
        name: String,
        timeout_ms: u64,
        metadata: Vec<(String, String)>,
    ) -> wasmtime::Result<Result<types::Waitpoint, GuestError>> {
        let claim = self.claim(&handle)?;
        if let Some(refusal) = refuse_write(claim) {
            return Ok(Err(refusal));
        }
        // The MCP broker's approvals: a guest that could make one could approve its own call.
        if name.starts_with(super::mcp::APPROVAL_PREFIX) {
            return Ok(Err(GuestError::Invalid(format!(
                "name: `{}` names are the host's (MCP approvals)",
                super::mcp::APPROVAL_PREFIX
            ))));
        }
        let fence = claim.fence();
        let claims = claim.dispatch().claims;
        let agent = claim.dispatch().agent.clone();
        let given = claim.tokens().to_vec();
        let token = match mint_token() {
            Ok(token) => token,
            Err(e) => return Ok(Err(guest_error(e))),
        };
        let digest = token_digest(&token);
        let new = NewWaitpoint {
            name,
            timeout_ms,
            metadata: metadata.into_iter().collect(),
            token_digest: digest.clone(),
        };
        let store = &self.plugin.store;
        let created = match store.waitpoints.create_waitpoint(&fence, new).await {
            Ok(created) => created,
            Err(e) => return Ok(Err(guest_error(e))),
        };
        let mut w = created.waitpoint;
        // A token is handed once per waitpoint and claim: to the run that created it, and to
        // the first look of each later run that finds it still pending (its earlier token may
        // have been lost with the run that made it; both stay valid).
        let handed = if created.created {
            crate::telemetry::waitpoint_created(&agent);
            true
        } else {
            hands_token(&w, claims, &given)
                && matches!(
                    store.waitpoints.add_token(&fence, &w.id, &digest).await,
                    Ok(true)
                )
        };
        let token = handed.then_some(token);
        if token.is_some() {
            self.claim_mut(&handle)?.gave_token(w.id.clone());
        }
        w.token_digests.clear();
        let url = token.as_deref().and_then(|token| {
            let base = self.plugin.public_url.as_deref()?;
            Some(crate::config::api::callback_url(base, &w.id, token))
        });
        Ok(Ok(wit_waitpoint(w, token, url)))
    }

    async fn waitpoints(
        &mut self,
        handle: Resource<ClaimHandle>,
    ) -> wasmtime::Result<Result<Vec<types::Waitpoint>, GuestError>> {
        let id = self.claim(&handle)?.dispatch().id.clone();
        let out = self.plugin.store.waitpoints.waitpoints_of(&id).await;
        Ok(out
            .map(|all| {
                all.into_iter()
                    .map(|w| wit_waitpoint(w, None, None))
                    .collect()
            })
            .map_err(guest_error))
    }

    async fn await_waitpoint(
        &mut self,
        handle: Resource<ClaimHandle>,
        id: String,
        wait_ms: u32,
    ) -> wasmtime::Result<Result<types::Waitpoint, GuestError>> {
        let claim = self.claim(&handle)?;
        if let Some(refusal) = refuse_write(claim) {
            return Ok(Err(refusal));
        }
        let dispatch = claim.dispatch().id.clone();
        let thread = claim.dispatch().thread.clone();
        let control = claim.control().clone();
        let (until, by_deadline) = self.wait_until(wait_ms);
        let store = self.plugin.store.clone();
        let out =
            waitpoints::wait_settled(&store, &thread, &dispatch, &id, until, control.stopped())
                .await;
        match out {
            Err(e) => Ok(Err(guest_error(e))),
            Ok(w) => {
                if w.is_pending()
                    && by_deadline
                    && Instant::now() >= until
                    && control.stop_reason().is_none()
                {
                    control.request_stop(claim::StopReason::Deadline);
                }
                Ok(Ok(wit_waitpoint(w, None, None)))
            }
        }
    }

    async fn suspend(
        &mut self,
        handle: Resource<ClaimHandle>,
    ) -> wasmtime::Result<Result<(), GuestError>> {
        let max_resumes = self.plugin.config.max_resumes;
        let claim = self.table.get_mut(&handle)?;
        if let Some(refusal) = refuse_write(claim) {
            return Ok(Err(refusal));
        }
        let out = claim.suspend(&self.plugin.store, max_resumes).await;
        Ok(out.map(drop).map_err(guest_error))
    }

    async fn step_get(
        &mut self,
        handle: Resource<ClaimHandle>,
        key: String,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, GuestError>> {
        let claim = self.claim(&handle)?;
        if let Err(e) = check_step_key(&key) {
            return Ok(Err(e));
        }
        // With `journal = "off"` nothing is ever stored, so every key reads as unset.
        let Some(recorder) = claim.journal().cloned() else {
            return Ok(Ok(None));
        };
        Ok(recorder.step_get(&key).await.map_err(guest_error))
    }

    async fn step_put(
        &mut self,
        handle: Resource<ClaimHandle>,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), GuestError>> {
        let claim = self.claim(&handle)?;
        if let Some(refusal) = refuse_write(claim) {
            return Ok(Err(refusal));
        }
        if let Err(e) = check_step_key(&key) {
            return Ok(Err(e));
        }
        if let Err(e) = self.plugin.check_payload("value", value.len()) {
            return Ok(Err(GuestError::Invalid(e)));
        }
        // `journal = "off"`: stores nothing and succeeds, so a guest's step helpers work under
        // any setting (they then run every step each time); said once per claim.
        let Some(recorder) = claim.journal().cloned() else {
            let plugin = self.plugin.name.clone();
            let claim = self.claim_mut(&handle)?;
            if claim.warn_steps_once() {
                debug!(plugin = %plugin, dispatch = %claim.dispatch().id, "step-put stores nothing: the plugin's journal is \"off\"");
            }
            return Ok(Ok(()));
        };
        Ok(recorder.step_put(key, value).await.map_err(guest_error))
    }

    async fn emit(
        &mut self,
        handle: Resource<ClaimHandle>,
        chunk: Vec<u8>,
    ) -> wasmtime::Result<Result<u64, GuestError>> {
        let hub = self.plugin.live.clone();
        let (agent, timeout) = (&self.plugin.name, self.plugin.config.timeout);
        let claim = self.table.get_mut(&handle)?;
        if let Some(refusal) = refuse_write(claim) {
            return Ok(Err(refusal));
        }
        // The first delta of a claim opens its stream; the claim ends it when it settles.
        let live = claim.live_or(|d| hub.open(&d.id, agent, d.claims, timeout));
        Ok(live.emit(&chunk).map_err(|e| match e {
            EmitError::Empty | EmitError::TooLarge { .. } => GuestError::Invalid(e.to_string()),
            EmitError::Bytes { .. } | EmitError::Rate { .. } => GuestError::Denied(e.to_string()),
            EmitError::Closed => GuestError::LostClaim(e.to_string()),
        }))
    }

    async fn mcp_tools(
        &mut self,
        handle: Resource<ClaimHandle>,
        server: String,
    ) -> wasmtime::Result<Result<Vec<types::McpTool>, GuestError>> {
        GuestState::mcp_tools(self, handle, server).await
    }

    async fn mcp_call(
        &mut self,
        handle: Resource<ClaimHandle>,
        server: String,
        tool: String,
        arguments: String,
    ) -> wasmtime::Result<Result<types::McpOutcome, GuestError>> {
        GuestState::mcp_call(self, handle, server, tool, arguments).await
    }

    async fn drop(&mut self, handle: Resource<ClaimHandle>) -> wasmtime::Result<()> {
        let mut claim = self.table.delete(handle)?;
        if claim.settled().is_none() && !claim.control().must_cancel() {
            // The agent world's guest dropped a claim it never settled: a failed attempt.
            let (store, retry) = (&self.plugin.store, &self.plugin.config.retry);
            let error = "guest dropped the claim without settling it";
            if let Err(e) = claim.nack(store, retry, error, None).await {
                debug!(plugin = %self.plugin.name, dispatch = %claim.dispatch().id, "nack of dropped claim refused: {e}");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn a_guest_step_key_is_refused_blank_too_long_or_the_hosts() {
        assert!(check_step_key("ask#2").is_ok());
        assert!(matches!(check_step_key(" "), Err(GuestError::Invalid(_))));
        assert!(matches!(
            check_step_key(&"k".repeat(MAX_STEP_KEY + 1)),
            Err(GuestError::Invalid(_))
        ));
        match check_step_key("homing/mcp/records/add/00#1") {
            Err(GuestError::Invalid(why)) => assert!(why.contains("host's"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
