//! The call paths: one dispatch through a `handler` plugin's `handle`, an `agent` plugin's
//! `run`, and a bare instance start (for benchmarks and health checks).
//!
//! Two bounds end a call that runs too long: the epoch deadline, which traps inside the guest
//! within a tick of the dispatch's timeout, and a tokio timeout ([`CALL_TIMEOUT_SLACK`] later)
//! for the other way a call can hang, a host import that waits. How a call ended is a
//! [`CallEnd`]; the supervisor decides from it how to settle what the guest left unsettled.
//!
//! In the `handler` world the claim is lent to the guest through the instance's resource
//! table for the call and taken back after it: [`HandlerRun`] says whether it came back.

use std::time::{Duration, Instant};

use tracing::Instrument;
use wasmtime::Store as WasmStore;
use wasmtime::component::Resource;

use super::host::{Abort, ClaimHandle, GuestState, check_returned_output};
use super::plugin::{Plugin, PluginPre};
use super::{Runtime, bindings};

/// Slack added to a plugin's timeout for the tokio timeout around a call, so the epoch deadline
/// (which traps cleanly inside the guest) normally fires first.
pub const CALL_TIMEOUT_SLACK: Duration = Duration::from_secs(1);

/// How a guest call ended.
#[derive(Debug)]
pub enum CallEnd {
    /// `handle` returned `ok(output)` (or `run` returned ok, with no output).
    Returned(Vec<u8>),
    /// The guest returned an error message.
    Failed(String),
    /// The call trapped or was cut short (or never started).
    Trapped {
        /// Why, for the dispatch's error text.
        reason: String,
        /// Set when the epoch callback or the memory limiter caused it.
        abort: Option<Abort>,
    },
}

impl CallEnd {
    /// A call that could not start: no abort, `reason` as the error.
    fn not_started(reason: String) -> CallEnd {
        CallEnd::Trapped {
            reason,
            abort: None,
        }
    }
}

/// What one `handler` call did with its claim.
#[derive(Debug)]
pub enum HandlerRun {
    /// The claim came back from the instance's resource table, with what the guest did to it
    /// (its settlement, if any), and the call ended as `end`.
    Finished {
        /// The claim, to settle what the guest left unsettled (boxed: a dispatch is large
        /// beside the other outcome).
        claim: Box<ClaimHandle>,
        /// How the call ended.
        end: CallEnd,
    },
    /// The claim could not be put in or taken back from the resource table (never expected):
    /// the host cannot settle it, so its lease runs out and maintenance reclaims it.
    ClaimLost {
        /// How the call ended (or why it never started).
        end: CallEnd,
    },
}

impl HandlerRun {
    /// How the call ended.
    pub fn end(&self) -> &CallEnd {
        match self {
            HandlerRun::Finished { end, .. } | HandlerRun::ClaimLost { end } => end,
        }
    }
}

/// An instance of a `handler` component, of either contract version.
enum HandlerInstance {
    V0_2(bindings::v0_2::handler::Handler),
    V0_1(bindings::v0_1::handler::Handler),
}

impl HandlerInstance {
    /// Instantiates `pre` (a handler of either version) in `store`.
    async fn new(
        pre: &PluginPre,
        store: &mut WasmStore<GuestState>,
    ) -> wasmtime::Result<HandlerInstance> {
        match pre {
            PluginPre::Handler(pre) => pre.instantiate_async(store).await.map(Self::V0_2),
            PluginPre::HandlerV0_1(pre) => pre.instantiate_async(store).await.map(Self::V0_1),
            PluginPre::Agent(_) | PluginPre::AgentV0_1(_) => {
                Err(wasmtime::format_err!("plugin is not a handler"))
            }
        }
    }

    /// Calls `handle` with the claim at `rep` of the store's resource table, lent as a borrow.
    async fn handle(
        &self,
        store: &mut WasmStore<GuestState>,
        rep: u32,
    ) -> wasmtime::Result<Result<Vec<u8>, String>> {
        match self {
            Self::V0_2(i) => {
                i.homing_agent_handle()
                    .call_handle(store, Resource::new_borrow(rep))
                    .await
            }
            Self::V0_1(i) => {
                i.homing_agent_handle()
                    .call_handle(store, Resource::new_borrow(rep))
                    .await
            }
        }
    }
}

/// A `handler` instance kept by a worker between dispatches (`reuse_instance > 1`).
pub struct WarmInstance {
    store: WasmStore<GuestState>,
    instance: HandlerInstance,
    uses: u32,
}

impl std::fmt::Debug for WarmInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmInstance")
            .field("uses", &self.uses)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Creates a fresh store and instance of `plugin` and drops them: the per-dispatch start
    /// cost, for benchmarks and health checks.
    ///
    /// # Errors
    ///
    /// When instantiation fails.
    pub async fn start_instance(&self, plugin: &Plugin) -> anyhow::Result<()> {
        let mut store = self.new_store(plugin)?;
        let deadline = Some(Instant::now() + plugin.ctx.config.timeout);
        store.data_mut().deadline = deadline;
        store.data_mut().http.deadline = deadline;
        // Each arm makes an instance and lets it go at once: the start is what is measured.
        match &plugin.pre {
            PluginPre::Handler(pre) => {
                pre.instantiate_async(&mut store).await?;
            }
            PluginPre::Agent(pre) => {
                pre.instantiate_async(&mut store).await?;
            }
            PluginPre::HandlerV0_1(pre) => {
                pre.instantiate_async(&mut store).await?;
            }
            PluginPre::AgentV0_1(pre) => {
                pre.instantiate_async(&mut store).await?;
            }
        }
        Ok(())
    }

    /// Runs one dispatch through a `handler` plugin: one `handle` call, on a fresh instance
    /// unless `warm` holds one this worker may reuse (`reuse_instance > 1`). Returns how the call
    /// ended and, unless it was lost in the resource table, the claim with what the guest did to
    /// it. An instance that trapped or timed out is never reused: a trap can leave it in any
    /// state.
    pub async fn run_handler(
        &self,
        plugin: &Plugin,
        claim: ClaimHandle,
        warm: &mut Option<WarmInstance>,
    ) -> HandlerRun {
        let not_started = |claim, reason| HandlerRun::Finished {
            claim: Box::new(claim),
            end: CallEnd::not_started(reason),
        };
        let pre = &plugin.pre;
        if !matches!(pre, PluginPre::Handler(_) | PluginPre::HandlerV0_1(_)) {
            return not_started(claim, "plugin is not a handler".into());
        }
        let reuse = plugin.ctx.config.reuse_instance;
        let (mut store, instance, uses) = match warm.take() {
            Some(w) if w.uses < reuse => (w.store, Some(w.instance), w.uses),
            _ => match self.new_store_for(plugin, Some(&claim.dispatch().id)) {
                Ok(store) => (store, None, 0),
                Err(e) => return not_started(claim, format!("{e:#}")),
            },
        };
        if let Some(fuel) = plugin.ctx.config.fuel
            && let Err(e) = store.set_fuel(fuel)
        {
            return not_started(claim, format!("{e:#}"));
        }
        store.data_mut().abort = None;
        if let Some(recorder) = claim.journal() {
            // A replaying run reads its clock and random values from the journal at once.
            recorder.prepare().await;
        }
        store.data_mut().begin(&claim);
        let span = guest_call_span(&claim, instance.is_none());
        let resource = match store.data_mut().table().push(claim) {
            Ok(resource) => resource,
            Err(e) => {
                return HandlerRun::ClaimLost {
                    end: CallEnd::not_started(format!("resource table: {e}")),
                };
            }
        };
        let rep = resource.rep();
        let limit = plugin.ctx.config.timeout + CALL_TIMEOUT_SLACK;
        let call = async {
            let instance = match instance {
                Some(instance) => instance,
                None => {
                    let started = Instant::now();
                    let instance = HandlerInstance::new(pre, &mut store).await?;
                    crate::telemetry::instance_start(&plugin.ctx.name, started.elapsed());
                    instance
                }
            };
            let out = instance.handle(&mut store, rep).await;
            out.map(|out| (out, instance))
        };
        let (end, instance) = match tokio::time::timeout(limit, call.instrument(span)).await {
            Ok(Ok((Ok(output), instance))) => (CallEnd::Returned(output), Some(instance)),
            Ok(Ok((Err(message), instance))) => (CallEnd::Failed(message), Some(instance)),
            Ok(Err(trap)) => (trapped(&store, trap), None),
            Err(_) => (
                CallEnd::Trapped {
                    reason: format!("timed out after {limit:?} (waiting in a host call)"),
                    abort: Some(Abort::Timeout),
                },
                None,
            ),
        };
        // The supervisor completes a returned output; one over the cap would be refused by
        // the store there and the attempt would hold its thread until its lease ran out. Fail
        // it now instead, naming the limit, so it is nacked at once.
        let end = match end {
            CallEnd::Returned(output) => match check_returned_output(&plugin.ctx, &output) {
                Some(reason) => CallEnd::Failed(reason),
                None => CallEnd::Returned(output),
            },
            end => end,
        };
        let run = match store.data_mut().table().delete(resource) {
            Ok(claim) => HandlerRun::Finished {
                claim: Box::new(claim),
                end,
            },
            Err(_) => HandlerRun::ClaimLost { end },
        };
        if let Some(instance) = instance
            && uses + 1 < reuse
        {
            *warm = Some(WarmInstance {
                store,
                instance,
                uses: uses + 1,
            });
        }
        run
    }

    /// Runs an `agent` plugin's `run` on a fresh instance that starts with `first` and may claim
    /// up to `budget - 1` more dispatches through `claim-next`.
    pub async fn run_agent(&self, plugin: &Plugin, first: ClaimHandle, budget: u32) -> CallEnd {
        if !matches!(plugin.pre, PluginPre::Agent(_) | PluginPre::AgentV0_1(_)) {
            return CallEnd::not_started("plugin is not an agent".into());
        }
        let mut store = match self.new_store(plugin) {
            Ok(store) => store,
            Err(e) => return CallEnd::not_started(format!("{e:#}")),
        };
        store.data_mut().begin(&first);
        // The run is traced under its first claim; the claims it takes itself have their own.
        let span = guest_call_span(&first, true);
        store.data_mut().first_claim = Some(first);
        store.data_mut().claims_left = budget.saturating_sub(1);
        let limit = (plugin.ctx.config.timeout + CALL_TIMEOUT_SLACK).saturating_mul(budget.max(1));
        let call = async {
            let started = Instant::now();
            match &plugin.pre {
                PluginPre::Agent(pre) => {
                    let instance = pre.instantiate_async(&mut store).await?;
                    crate::telemetry::instance_start(&plugin.ctx.name, started.elapsed());
                    instance.call_run(&mut store).await
                }
                PluginPre::AgentV0_1(pre) => {
                    let instance = pre.instantiate_async(&mut store).await?;
                    crate::telemetry::instance_start(&plugin.ctx.name, started.elapsed());
                    instance.call_run(&mut store).await
                }
                PluginPre::Handler(_) | PluginPre::HandlerV0_1(_) => {
                    Err(wasmtime::format_err!("plugin is not an agent"))
                }
            }
        };
        match tokio::time::timeout(limit, call.instrument(span)).await {
            Ok(Ok(Ok(()))) => CallEnd::Returned(Vec::new()),
            Ok(Ok(Err(message))) => CallEnd::Failed(message),
            Ok(Err(trap)) => trapped(&store, trap),
            Err(_) => CallEnd::Trapped {
                reason: format!("timed out after {limit:?}"),
                abort: Some(Abort::Timeout),
            },
        }
    }
}

/// The span of one guest call, a child of `claim`'s attempt.
fn guest_call_span(claim: &ClaimHandle, fresh: bool) -> tracing::Span {
    tracing::info_span!(
        target: crate::telemetry::trace::TARGET,
        parent: claim.span(),
        "homing.guest_call",
        homing.instance = if fresh { "fresh" } else { "reused" },
    )
}

/// Describes a trap, preferring what the epoch callback or the limiter recorded.
fn trapped(store: &WasmStore<GuestState>, trap: wasmtime::Error) -> CallEnd {
    let data = store.data();
    let abort = data.abort;
    let reason = match abort {
        Some(Abort::Timeout) => format!("timed out after {:?}", data.plugin.config.timeout),
        Some(Abort::Cancelled(reason)) => {
            format!("cancelled ({:?})", bindings::StopReason::from(reason))
        }
        None if data.limits.refused => format!(
            "memory limit of {} bytes reached: {trap:#}",
            data.plugin.config.memory
        ),
        None => format!("guest trapped: {trap:#}"),
    };
    CallEnd::Trapped { reason, abort }
}
