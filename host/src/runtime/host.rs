//! What a guest's imports do: the per-instance state and the host side of the WIT interfaces.
//!
//! A guest sees its dispatch as a `claim` resource whose host representation is a
//! [`ClaimHandle`]: the dispatch as claimed, the token (which never crosses into the guest),
//! what the guest did with it, and the [`ClaimControl`] the lease keeper and the supervisor use
//! to ask it to stop. Every write through a claim goes to the store with the token and is fenced
//! there; the host adds what the store cannot know: the backoff policy, the enqueue allow-list,
//! and caps on what one dispatch may do (enqueues, log volume, read sizes).
//!
//! # One cap on guest bytes
//!
//! Every byte string a guest hands the host to store (an enqueued payload, an output through
//! `record-result` or `complete` or returned by `handle`, a thread-log entry) is held to one
//! cap, [`PluginContext::payload_cap`]: `[host] max_payload`, or what the store can hold when
//! that is less (a NATS server's `max_payload` bounds its backend). Over it the guest is told
//! `invalid`, naming the field and the cap, on every backend alike; an oversized output
//! returned by `handle` fails the attempt with that message ([`check_returned_output`]).
//!
//! # Guest log lines
//!
//! Guest text reaches the host's log (through `log.write`, stdout and stderr) with its control
//! characters escaped ([`escape_log_text`]): a guest cannot end a line early, start a forged
//! host line, or send terminal escape sequences to an operator's terminal.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{debug, error, info, trace, warn};
use wasmtime::component::{Resource, ResourceTable};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::handler::homing::agent::{log, mailbox, types};
use super::bindings::{DispatchInfo, EnqueueRequest, GuestError, Level, StopReason};
use super::limits::MemoryLimiter;
use crate::config::PluginConfig;
use crate::store::{Dispatch, Fence, NewDispatch, RunResult, Store, StoreError};
use crate::supervisor::lease::LeaseGuard;

/// At most this many follow-up dispatches per claim; an enqueue storm gets `denied` after it.
pub const MAX_ENQUEUES_PER_CLAIM: u32 = 1_000;
/// At most this many log lines (WIT log plus stdout/stderr) per dispatch; the rest are counted
/// and dropped, so a log flood cannot drown the host's log.
pub const MAX_LOG_LINES: u32 = 10_000;
/// Longest log line kept; longer ones are cut.
pub const MAX_LOG_LINE: usize = 4 * 1024;
/// Most thread-log entries one `read-log` returns.
pub const MAX_READ: u32 = 1_000;
/// Longest delay a guest may ask for on a follow-up dispatch.
pub const MAX_ENQUEUE_DELAY: Duration = Duration::from_secs(30 * 24 * 3600);

/// Why the host wants a guest to stop, as an atomic the epoch callback can read.
#[derive(Debug, Default)]
pub struct ClaimControl {
    stop: AtomicU8,
}

const STOP_INTERRUPTED: u8 = 1;
const STOP_LEASE_LOST: u8 = 2;
const STOP_SHUTDOWN: u8 = 3;
const STOP_DEADLINE: u8 = 4;

impl ClaimControl {
    /// Asks the guest to stop for `reason`. The first hard reason (interrupt, lost lease) wins.
    pub fn request_stop(&self, reason: StopReason) {
        let code = match reason {
            StopReason::Interrupted => STOP_INTERRUPTED,
            StopReason::LeaseLost => STOP_LEASE_LOST,
            StopReason::Shutdown => STOP_SHUTDOWN,
            StopReason::Deadline => STOP_DEADLINE,
        };
        let _ = self.stop.fetch_update(
            Ordering::SeqCst,
            Ordering::SeqCst,
            |current| match current {
                STOP_INTERRUPTED | STOP_LEASE_LOST => None,
                _ => Some(code),
            },
        );
    }

    /// The current stop request, if any.
    pub fn stop_reason(&self) -> Option<StopReason> {
        match self.stop.load(Ordering::SeqCst) {
            STOP_INTERRUPTED => Some(StopReason::Interrupted),
            STOP_LEASE_LOST => Some(StopReason::LeaseLost),
            STOP_SHUTDOWN => Some(StopReason::Shutdown),
            STOP_DEADLINE => Some(StopReason::Deadline),
            _ => None,
        }
    }

    /// Whether the guest must be cancelled now (its writes would be refused anyway).
    pub fn must_cancel(&self) -> bool {
        matches!(
            self.stop.load(Ordering::SeqCst),
            STOP_INTERRUPTED | STOP_LEASE_LOST
        )
    }
}

/// What the guest did to settle its claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// ack or complete.
    Acked,
    /// nack (requeued or dead-lettered by the store).
    Nacked,
    /// dead-letter.
    DeadLettered,
}

/// The host side of a `claim` resource.
#[derive(Debug)]
pub struct ClaimHandle {
    /// The dispatch as claimed.
    pub dispatch: Dispatch,
    /// Its claim token.
    pub token: String,
    /// Set once the guest settled it.
    pub settled: Option<Settlement>,
    /// Stop requests for this claim.
    pub control: Arc<ClaimControl>,
    /// Follow-ups enqueued through this claim.
    pub enqueued: u32,
    /// Keeps the lease alive until dropped.
    pub lease: Option<LeaseGuard>,
}

impl ClaimHandle {
    /// The fence of this claim's thread-log writes.
    pub fn fence(&self) -> Fence {
        Fence {
            dispatch: self.dispatch.id.clone(),
            token: self.token.clone(),
            epoch: self.dispatch.epoch,
        }
    }
}

/// Shared by every instance of one plugin.
#[derive(Debug)]
pub struct PluginContext {
    /// The plugin (agent) name.
    pub name: String,
    /// Its config.
    pub config: PluginConfig,
    /// The store.
    pub store: Store,
    /// `claimed_by` for this plugin's claims.
    pub consumer: String,
    /// Lease length of claims.
    pub lease: Duration,
    /// Max attempts of each plugin the guest may enqueue to (target name, default).
    pub targets: Vec<(String, u32)>,
    /// The largest payload a follow-up may carry.
    pub max_payload: u64,
    /// The directory relative grant paths resolve against (the config file's).
    pub config_dir: std::path::PathBuf,
    /// Set when the host is shutting down.
    pub shutdown: Arc<std::sync::atomic::AtomicBool>,
}

impl PluginContext {
    /// The cap on every byte string a guest hands the host to store (see the module): the
    /// host's `max_payload`, or what the store holds when that is less.
    pub fn payload_cap(&self) -> u64 {
        self.max_payload.min(self.store.max_value())
    }

    /// Refuses `len` bytes of `field` over [`PluginContext::payload_cap`], naming the field,
    /// the size and the cap.
    pub fn check_payload(&self, field: &str, len: usize) -> Result<(), String> {
        let cap = self.payload_cap();
        if len as u64 <= cap {
            return Ok(());
        }
        Err(if cap < self.max_payload {
            format!(
                "{field}: {len} bytes exceeds the host's max_payload of {cap} bytes (what the \
                 store can hold; [host] max_payload is {})",
                self.max_payload
            )
        } else {
            format!("{field}: {len} bytes exceeds the host's max_payload of {cap} bytes")
        })
    }

    /// The context of a plugin run outside a supervisor (benchmarks, probes): a 30 s lease, no
    /// enqueue targets, a 1 MiB payload cap, never shutting down.
    pub fn standalone(
        name: &str,
        config: PluginConfig,
        store: Store,
        config_dir: std::path::PathBuf,
    ) -> Self {
        PluginContext {
            name: name.to_owned(),
            config,
            store,
            consumer: format!("standalone/{name}"),
            lease: Duration::from_secs(30),
            targets: Vec::new(),
            max_payload: 1 << 20,
            config_dir,
            shutdown: Default::default(),
        }
    }
}

/// The failure of an attempt whose handler returned an output over the cap: `None` when the
/// output fits. The supervisor settles a returned output with `complete`; an output the store
/// must refuse is turned into this failure first, so the attempt is nacked at once with a
/// message naming the limit instead of holding its thread until the lease runs out.
pub fn check_returned_output(plugin: &PluginContext, output: &[u8]) -> Option<String> {
    let cap = plugin.payload_cap();
    (output.len() as u64 > cap).then(|| {
        if cap < plugin.max_payload {
            format!(
                "output of {} bytes exceeds max_payload {cap} (what the store can hold; \
                 [host] max_payload is {})",
                output.len(),
                plugin.max_payload
            )
        } else {
            format!("output of {} bytes exceeds max_payload {cap}", output.len())
        }
    })
}

/// A warning for an operator whose `[host] max_payload` is more than `store` can hold (the
/// host then caps guest bytes at what the store holds): `None` when it fits.
pub fn max_payload_warning(max_payload: u64, store: &Store) -> Option<String> {
    let holds = store.max_value();
    (max_payload > holds).then(|| {
        format!(
            "[host] max_payload is {max_payload} bytes but the store holds at most {holds} bytes \
             per payload, output or log entry; guest values are capped at {holds} bytes (lower \
             max_payload to silence this, or raise the NATS server's max_payload)"
        )
    })
}

/// `text` with its control characters escaped, for the host's log: `\n` and `\r` as those
/// two characters, any other control character (ESC, NUL, DEL, C1) as `\u{..}`; tabs are kept.
/// So a guest's line stays one line of the host's log and carries no terminal escapes.
pub fn escape_log_text(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() && c != '\t') {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\t' => out.push(c),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Which dispatch an instance is working on, for log lines.
#[derive(Debug, Default, Clone)]
pub struct LogTag {
    /// The dispatch id.
    pub dispatch: String,
    /// Its attempt.
    pub attempt: u32,
}

/// Log lines written by one instance, shared with its stdout/stderr streams.
#[derive(Debug, Default)]
pub struct LogState {
    /// The current dispatch.
    pub tag: LogTag,
    /// Lines written so far.
    pub lines: u32,
    /// Lines dropped past the cap.
    pub dropped: u32,
}

/// Why a call into the guest was cut short by the epoch callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abort {
    /// The per-dispatch time limit passed.
    Timeout,
    /// The claim must stop (interrupt or lost lease).
    Cancelled(StopReason),
}

/// The data of one wasmtime `Store`: one guest instance.
pub struct GuestState {
    wasi: WasiCtx,
    table: ResourceTable,
    /// The memory cap.
    pub limits: MemoryLimiter,
    /// The plugin this instance belongs to.
    pub plugin: Arc<PluginContext>,
    /// The log tag and budget, shared with stdout/stderr.
    pub log: Arc<Mutex<LogState>>,
    /// The current dispatch's deadline.
    pub deadline: Option<Instant>,
    /// The current claim's control, for the epoch callback.
    pub control: Option<Arc<ClaimControl>>,
    /// Set by the epoch callback when it ends a call.
    pub abort: Option<Abort>,
    /// `agent` world: dispatches this instance may still claim.
    pub claims_left: u32,
    /// `agent` world: a dispatch the host claimed before starting the instance.
    pub first_claim: Option<ClaimHandle>,
}

impl std::fmt::Debug for GuestState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestState")
            .field("plugin", &self.plugin.name)
            .finish_non_exhaustive()
    }
}

impl WasiView for GuestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl GuestState {
    /// A fresh state for one instance.
    pub fn new(wasi: WasiCtx, plugin: Arc<PluginContext>, log: Arc<Mutex<LogState>>) -> Self {
        GuestState {
            wasi,
            table: ResourceTable::new(),
            limits: MemoryLimiter::new(plugin.config.memory),
            plugin,
            log,
            deadline: None,
            control: None,
            abort: None,
            claims_left: 0,
            first_claim: None,
        }
    }

    /// The resource table (claims live here while the guest holds them).
    pub fn table(&mut self) -> &mut ResourceTable {
        &mut self.table
    }

    /// Starts work on `claim`: sets the deadline, the control the epoch callback reads and the
    /// log tag.
    pub fn begin(&mut self, claim: &ClaimHandle) {
        self.deadline = Some(Instant::now() + self.plugin.config.timeout);
        self.control = Some(claim.control.clone());
        if let Ok(mut log) = self.log.lock() {
            log.tag = LogTag {
                dispatch: claim.dispatch.id.clone(),
                attempt: claim.dispatch.attempt,
            };
            // The log budget is per dispatch, also when an instance serves several.
            log.lines = 0;
            log.dropped = 0;
        }
    }

    /// Writes one guest log line, within the instance's budget.
    pub fn emit(log: &Mutex<LogState>, plugin: &str, level: Level, message: &str) {
        let Ok(mut state) = log.lock() else { return };
        if state.lines >= MAX_LOG_LINES {
            state.dropped += 1;
            if state.dropped == 1 {
                warn!(plugin, dispatch = %state.tag.dispatch, "guest log budget of {MAX_LOG_LINES} lines used up; dropping further lines");
            }
            return;
        }
        state.lines += 1;
        let mut end = message.len().min(MAX_LOG_LINE);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        let message = escape_log_text(message.get(..end).unwrap_or_default());
        let (dispatch, attempt) = (&state.tag.dispatch, state.tag.attempt);
        match level {
            Level::Trace => trace!(target: "guest", plugin, %dispatch, attempt, "{message}"),
            Level::Debug => debug!(target: "guest", plugin, %dispatch, attempt, "{message}"),
            Level::Info => info!(target: "guest", plugin, %dispatch, attempt, "{message}"),
            Level::Warn => warn!(target: "guest", plugin, %dispatch, attempt, "{message}"),
            Level::Error => error!(target: "guest", plugin, %dispatch, attempt, "{message}"),
        }
    }

    fn claim(&self, handle: &Resource<ClaimHandle>) -> wasmtime::Result<&ClaimHandle> {
        Ok(self.table.get(handle)?)
    }

    fn claim_mut(&mut self, handle: &Resource<ClaimHandle>) -> wasmtime::Result<&mut ClaimHandle> {
        Ok(self.table.get_mut(handle)?)
    }

    /// A settling write through a claim: runs `op`, records the settlement on success.
    async fn settle<F, Fut>(
        &mut self,
        handle: &Resource<ClaimHandle>,
        kind: Settlement,
        op: F,
    ) -> wasmtime::Result<Result<(), GuestError>>
    where
        F: FnOnce(Store, String, String, Dispatch) -> Fut,
        Fut: std::future::Future<Output = Result<Dispatch, StoreError>>,
    {
        let claim = self.claim(handle)?;
        let (id, token, dispatch) = (
            claim.dispatch.id.clone(),
            claim.token.clone(),
            claim.dispatch.clone(),
        );
        let result = op(self.plugin.store.clone(), id, token, dispatch).await;
        match result {
            Ok(_) => {
                let claim = self.claim_mut(handle)?;
                claim.settled = Some(kind);
                // The dispatch is settled: stop renewing its lease.
                claim.lease = None;
                Ok(Ok(()))
            }
            Err(e) => Ok(Err(guest_error(e))),
        }
    }

    fn enqueue_request(
        &self,
        request: EnqueueRequest,
        default_thread: Option<&str>,
        parent: Option<&Dispatch>,
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
        let thread = match (request.thread, default_thread) {
            (Some(thread), _) => thread,
            (None, Some(thread)) => thread.to_owned(),
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
        let mut new = NewDispatch::new(request.agent, thread, request.payload)
            .with_priority(request.priority.unwrap_or(crate::store::DEFAULT_PRIORITY))
            .with_delay_ms(delay)
            .with_max_attempts(
                request
                    .max_attempts
                    .unwrap_or(*target_max)
                    .clamp(1, (*target_max).max(1)),
            );
        new.metadata = request.metadata.into_iter().collect();
        new.metadata
            .insert("enqueued-by".into(), plugin.name.clone());
        if let Some(parent) = parent {
            new.metadata.insert("parent".into(), parent.id.clone());
        }
        new.dedupe_key = request.dedupe_key;
        Ok(new)
    }
}

/// Maps a store refusal onto the closed WIT error.
pub fn guest_error(err: StoreError) -> GuestError {
    match err {
        StoreError::NotFound { .. }
        | StoreError::NotClaimed { .. }
        | StoreError::LostClaim { .. } => GuestError::LostClaim(err.to_string()),
        StoreError::StaleEpoch { .. } => GuestError::Interrupted(err.to_string()),
        StoreError::InvalidTransition { .. } => GuestError::LostClaim(err.to_string()),
        StoreError::Duplicate { id, holder } => GuestError::Duplicate(holder.unwrap_or(id)),
        StoreError::Invalid(message) => GuestError::Invalid(message),
        StoreError::Conflict { latest } => GuestError::Conflict(latest),
        StoreError::Contention(message) => GuestError::Contention(message),
        StoreError::Unavailable(message) => GuestError::Unavailable(message),
        StoreError::Corrupt { .. } => GuestError::Internal(err.to_string()),
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
    }
}

impl types::Host for GuestState {}

impl log::Host for GuestState {
    async fn write(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        GuestState::emit(&self.log, &self.plugin.name, level, &message);
        Ok(())
    }
}

impl mailbox::Host for GuestState {
    async fn enqueue(
        &mut self,
        request: EnqueueRequest,
    ) -> wasmtime::Result<Result<String, GuestError>> {
        let new = match self.enqueue_request(request, None, None) {
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

impl mailbox::HostClaim for GuestState {
    async fn info(&mut self, handle: Resource<ClaimHandle>) -> wasmtime::Result<DispatchInfo> {
        Ok(dispatch_info(&self.claim(&handle)?.dispatch))
    }

    async fn record_start(
        &mut self,
        handle: Resource<ClaimHandle>,
    ) -> wasmtime::Result<Result<(), GuestError>> {
        let claim = self.claim(&handle)?;
        let out = self
            .plugin
            .store
            .mailbox
            .record_start(&claim.dispatch.id, &claim.token)
            .await;
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
        let out = self
            .plugin
            .store
            .mailbox
            .record_result(&claim.dispatch.id, &claim.token, RunResult::success(output))
            .await;
        Ok(out.map(drop).map_err(guest_error))
    }

    async fn complete(
        &mut self,
        handle: Resource<ClaimHandle>,
        output: Vec<u8>,
    ) -> wasmtime::Result<Result<(), GuestError>> {
        self.claim(&handle)?;
        if let Err(e) = self.plugin.check_payload("output", output.len()) {
            return Ok(Err(GuestError::Invalid(e)));
        }
        self.settle(
            &handle,
            Settlement::Acked,
            |store, id, token, _| async move {
                store
                    .mailbox
                    .complete(&id, &token, RunResult::success(output))
                    .await
            },
        )
        .await
    }

    async fn ack(
        &mut self,
        handle: Resource<ClaimHandle>,
    ) -> wasmtime::Result<Result<(), GuestError>> {
        self.settle(
            &handle,
            Settlement::Acked,
            |store, id, token, _| async move { store.mailbox.ack(&id, &token).await },
        )
        .await
    }

    async fn nack(
        &mut self,
        handle: Resource<ClaimHandle>,
        error: String,
        retry_after_ms: Option<u64>,
    ) -> wasmtime::Result<Result<(), GuestError>> {
        let policy = self.plugin.config.retry.clone();
        self.settle(
            &handle,
            Settlement::Nacked,
            |store, id, token, dispatch| async move {
                let delay =
                    policy.delay(dispatch.attempt, retry_after_ms.map(Duration::from_millis));
                let retry_at = store
                    .now()
                    .saturating_add(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
                store.mailbox.nack(&id, &token, retry_at, &error).await
            },
        )
        .await
    }

    async fn dead_letter(
        &mut self,
        handle: Resource<ClaimHandle>,
        error: String,
    ) -> wasmtime::Result<Result<(), GuestError>> {
        self.settle(&handle, Settlement::DeadLettered, |store, id, token, _| async move {
            store.mailbox.dead_letter(&id, &token, &error).await
        })
        .await
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
        let thread = claim.dispatch.thread.clone();
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
        let thread = claim.dispatch.thread.clone();
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
        let thread = self.claim(&handle)?.dispatch.thread.clone();
        // "Up to `limit`": none for 0 (the store would read its default page for 0).
        if limit == 0 {
            return Ok(Ok(Vec::new()));
        }
        let limit = usize::try_from(limit.min(MAX_READ)).unwrap_or(1);
        let out = self.plugin.store.log.read(&thread, after, limit).await;
        Ok(out
            .map(|entries| {
                entries
                    .into_iter()
                    .map(|e| types::LogEntry {
                        seq: e.seq,
                        data: e.data,
                        appended_at: e.appended_at,
                    })
                    .collect()
            })
            .map_err(guest_error))
    }

    async fn log_latest(
        &mut self,
        handle: Resource<ClaimHandle>,
    ) -> wasmtime::Result<Result<u64, GuestError>> {
        let thread = self.claim(&handle)?.dispatch.thread.clone();
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
        if let Some(reason) = claim.control.stop_reason() {
            return Ok(Some(reason));
        }
        if self.plugin.shutdown.load(Ordering::SeqCst) {
            return Ok(Some(StopReason::Shutdown));
        }
        Ok(None)
    }

    async fn enqueue(
        &mut self,
        handle: Resource<ClaimHandle>,
        request: EnqueueRequest,
    ) -> wasmtime::Result<Result<String, GuestError>> {
        let claim = self.claim(&handle)?;
        // A follow-up is a write through the claim: once the claim is settled, its lease lost
        // or its thread interrupted, it is refused like every other one.
        if claim.settled.is_some() {
            return Ok(Err(GuestError::LostClaim(format!(
                "dispatch `{}` was already settled through this claim",
                claim.dispatch.id
            ))));
        }
        match claim.control.stop_reason() {
            Some(StopReason::Interrupted) => {
                return Ok(Err(GuestError::Interrupted(format!(
                    "the thread of dispatch `{}` was interrupted",
                    claim.dispatch.id
                ))));
            }
            Some(StopReason::LeaseLost) => {
                return Ok(Err(GuestError::LostClaim(format!(
                    "the lease on dispatch `{}` was lost",
                    claim.dispatch.id
                ))));
            }
            _ => {}
        }
        if claim.enqueued >= MAX_ENQUEUES_PER_CLAIM {
            return Ok(Err(GuestError::Denied(format!(
                "a dispatch may enqueue at most {MAX_ENQUEUES_PER_CLAIM} follow-ups"
            ))));
        }
        let (thread, parent) = (claim.dispatch.thread.clone(), claim.dispatch.clone());
        let new = match self.enqueue_request(request, Some(&thread), Some(&parent)) {
            Ok(new) => new,
            Err(e) => return Ok(Err(e)),
        };
        let out = self.plugin.store.mailbox.enqueue(new).await;
        if out.is_ok() {
            self.claim_mut(&handle)?.enqueued += 1;
        }
        Ok(out.map(|d| d.id).map_err(guest_error))
    }

    async fn drop(&mut self, handle: Resource<ClaimHandle>) -> wasmtime::Result<()> {
        let claim = self.table.delete(handle)?;
        if claim.settled.is_none() && !claim.control.must_cancel() {
            // The agent world's guest dropped a claim it never settled: a failed attempt.
            let policy = &self.plugin.config.retry;
            let delay = policy.delay(claim.dispatch.attempt, None);
            let store = &self.plugin.store;
            let retry_at = store
                .now()
                .saturating_add(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
            if let Err(e) = store
                .mailbox
                .nack(
                    &claim.dispatch.id,
                    &claim.token,
                    retry_at,
                    "guest dropped the claim without settling it",
                )
                .await
            {
                debug!(plugin = %self.plugin.name, dispatch = %claim.dispatch.id, "nack of dropped claim refused: {e}");
            }
        }
        Ok(())
    }
}

/// How long one `claim-next` may wait for work, whatever the guest asks.
pub const MAX_CLAIM_WAIT: Duration = Duration::from_secs(5);

impl super::bindings::agent::homing::agent::queue::Host for GuestState {
    async fn claim_next(
        &mut self,
        wait_ms: u32,
    ) -> wasmtime::Result<Result<Option<Resource<ClaimHandle>>, GuestError>> {
        if self.plugin.shutdown.load(Ordering::SeqCst) {
            return Ok(Ok(None));
        }
        if let Some(first) = self.first_claim.take() {
            self.begin(&first);
            return Ok(Ok(Some(self.table.push(first)?)));
        }
        if self.claims_left == 0 {
            return Ok(Ok(None));
        }
        let wait = Duration::from_millis(u64::from(wait_ms)).min(MAX_CLAIM_WAIT);
        let until = Instant::now() + wait;
        let plugin = self.plugin.clone();
        let signal = plugin.store.mailbox.work_signal();
        loop {
            let notified = signal.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match crate::supervisor::claim_for(&plugin).await {
                Ok(Some(claim)) => {
                    self.claims_left -= 1;
                    self.begin(&claim);
                    return Ok(Ok(Some(self.table.push(claim)?)));
                }
                Ok(None) => {}
                Err(e) => return Ok(Err(guest_error(e))),
            }
            let now = Instant::now();
            if now >= until || plugin.shutdown.load(Ordering::SeqCst) {
                return Ok(Ok(None));
            }
            // Wake on a signal, or re-check at least every 250ms (signals are hints).
            let nap = (until - now).min(Duration::from_millis(250));
            let _ = tokio::time::timeout(nap, notified).await;
        }
    }
}
