//! `mcp-tools` and `mcp-call` on the claim (`homing:agent@0.2.1`): tool calls the host brokers
//! to the plugin's MCP servers ([`crate::runtime::mcp`]).
//!
//! A call passes, in order, and nothing is sent until every step agrees:
//! 1. the claim is live (as for any write through it);
//! 2. the server is one of the plugin's, the tool is in its `tools` allow-list;
//! 3. the arguments are a JSON object;
//! 4. the server's allowed tools are listed (or were, within `TOOLS_FRESH`), their digest
//!    matches the `pin`, the tool is among them, the arguments satisfy its input schema;
//! 5. approval, when the plugin's rules ask for it: a waitpoint of the dispatch, named after the
//!    call (server, tool, the digest of its arguments, and which such call of the run it is),
//!    made by the host with a token no one is given, so only an operator (API, CLI, dashboard)
//!    settles it. Pending: the guest gets `needs-approval`; completed with
//!    `{"approved": true}`: the call goes on; anything else, a timeout or a cancel: `rejected`;
//! 6. under `journal = "run"`, the journal (docs/contract.md, section 11): the call's record
//!    is a step keyed by its identity and which such call of the run it is, so it is found
//!    whatever the run did before it. An earlier run's answer there is replayed. An earlier
//!    run's intent (sent, never answered) is sent again only for an idempotent tool; for any
//!    other the guest gets `unknown`. A tool that is not idempotent gets its intent recorded,
//!    fenced, before the request leaves: a lost claim sends nothing; a journal that cannot be
//!    read sends nothing;
//! 7. the request, through the plugin's outbound path under the host's grant of the server's
//!    origin, within the server's `timeout` and `max_result`; its answer recorded under the
//!    call's key.

use std::collections::BTreeMap;

use metrics::counter;
use serde_json::{Map, Value, json};
use wasmtime::component::Resource;

use super::claim::{journaling, refuse_write, wit_waitpoint};
use super::{GuestState, guest_error};
use crate::claim::ClaimHandle;
use crate::claim::journal::mcp_key;
use crate::config::mcp::McpServer;
use crate::runtime::bindings::{GuestError, types};
use crate::runtime::mcp::client::ClientError;
use crate::runtime::mcp::{self as broker, Tool, canonical};
use crate::store::journal::{CallKind, identity};
use crate::store::waitpoints::{mint_token, token_digest};
use crate::store::{NewWaitpoint, Waitpoint, WaitpointState};
use crate::telemetry::MCP_CALLS;

/// The approval answer's schema, shown to whoever completes the waitpoint (the MCP endpoint
/// turns it into a form).
const APPROVAL_SCHEMA: &str = r#"{"type":"object","properties":{"approved":{"type":"boolean","description":"Run the tool call"},"reason":{"type":"string","description":"Why not (told to the agent)"}},"required":["approved"]}"#;

/// The most of the arguments an approval waitpoint shows: a call whose arguments are longer is
/// refused rather than shown in part (a person approves what is sent, all of it).
const SHOWN_ARGUMENTS: usize = 8 * 1024;

/// The start of the names of approval waitpoints: the host's own, refused to guests.
pub(super) const APPROVAL_PREFIX: &str = "mcp/";

impl GuestState {
    /// The plugin's secrets and the OAuth access tokens its servers issued, scrubbed from
    /// what a server's answers bring back.
    fn secrets(&self) -> std::sync::Arc<super::Secrets> {
        let configured = self
            .log
            .lock()
            .map(|log| log.secrets.clone())
            .unwrap_or_default();
        let tokens = self.mcp.tokens();
        if tokens.is_empty() {
            return configured;
        }
        std::sync::Arc::new(configured.and(tokens.iter().map(|t| t.as_str())))
    }

    /// `mcp-tools`.
    pub(super) async fn mcp_tools(
        &mut self,
        handle: Resource<ClaimHandle>,
        server: String,
    ) -> wasmtime::Result<Result<Vec<types::McpTool>, GuestError>> {
        let claim = self.claim(&handle)?;
        if let Some(refusal) = refuse_write(claim) {
            return Ok(Err(refusal));
        }
        let broker = self.mcp.clone();
        let config = match broker.config(&server) {
            Ok(config) => config.clone(),
            Err(e) => return Ok(Err(e)),
        };
        let list = match broker.tools(&self.http, &server).await {
            Ok(list) => list,
            Err(e) => return Ok(Err(scrubbed(e, &self.secrets()))),
        };
        Ok(Ok(list
            .tools
            .iter()
            .map(|t| wit_tool(t, &config))
            .collect()))
    }

    /// `mcp-call`.
    pub(super) async fn mcp_call(
        &mut self,
        handle: Resource<ClaimHandle>,
        server: String,
        tool: String,
        arguments: String,
    ) -> wasmtime::Result<Result<types::McpOutcome, GuestError>> {
        let agent = self.plugin.name.clone();
        // Only configured names as labels: a guest's string never makes a series.
        let label = if self.mcp.config(&server).is_ok() {
            server.clone()
        } else {
            "unknown".to_owned()
        };
        let count = |outcome: &'static str| {
            counter!(MCP_CALLS, "agent" => agent.clone(), "server" => label.clone(), "outcome" => outcome)
                .increment(1);
        };
        let secrets = self.secrets();
        let out = self
            .mcp_call_inner(&handle, &server, &tool, &arguments)
            .await?
            .map_err(|e| scrubbed(e, &secrets));
        count(match &out {
            Ok(Outcome::Done { replayed: true, .. }) => "replayed",
            Ok(Outcome::Done { is_error: true, .. }) => "tool_error",
            Ok(Outcome::Done { .. }) => "done",
            Ok(Outcome::Wit(types::McpOutcome::NeedsApproval(_))) => "needs_approval",
            Ok(Outcome::Wit(types::McpOutcome::Rejected(_))) => "rejected",
            Ok(Outcome::Wit(_)) => "unknown",
            Err(GuestError::Denied(_) | GuestError::Invalid(_)) => "refused",
            Err(_) => "failed",
        });
        Ok(out.map(Outcome::into_wit))
    }

    async fn mcp_call_inner(
        &mut self,
        handle: &Resource<ClaimHandle>,
        server: &str,
        tool: &str,
        arguments: &str,
    ) -> wasmtime::Result<Result<Outcome, GuestError>> {
        let claim = self.claim(handle)?;
        if let Some(refusal) = refuse_write(claim) {
            return Ok(Err(refusal));
        }
        let dispatch = claim.dispatch().id.clone();
        let broker = self.mcp.clone();
        let config = match broker.config(server) {
            Ok(config) => config.clone(),
            Err(e) => return Ok(Err(e)),
        };
        if !config.allows(tool) {
            return Ok(Err(GuestError::Denied(format!(
                "tool `{tool}` of server `{server}` is not in [plugins.{}.mcp.{server}] tools",
                self.plugin.name
            ))));
        }
        let args = match serde_json::from_str::<Value>(arguments) {
            Ok(Value::Object(args)) => args,
            Ok(_) => {
                return Ok(Err(GuestError::Invalid(
                    "arguments: must be a JSON object".into(),
                )));
            }
            Err(e) => {
                return Ok(Err(GuestError::Invalid(format!(
                    "arguments: not JSON: {e}"
                ))));
            }
        };
        let list = match broker.tools(&self.http, server).await {
            Ok(list) => list,
            Err(e) => return Ok(Err(e)),
        };
        let Some(spec) = list.get(tool).cloned() else {
            return Ok(Err(GuestError::Invalid(format!(
                "tool: server `{server}` lists no tool `{tool}`"
            ))));
        };
        if let Err(e) = crate::work::arguments::check(&spec.input_schema, &args) {
            return Ok(Err(GuestError::Invalid(format!("tool `{tool}`: {e}"))));
        }
        let canonical_args =
            serde_json::to_vec(&canonical(&Value::Object(args.clone()))).unwrap_or_default();
        let id = identity([server.as_bytes(), tool.as_bytes(), &canonical_args]);
        let nth = {
            let seen = self.mcp_seen.entry(format!("{dispatch}/{id}")).or_insert(0);
            *seen += 1;
            *seen
        };
        if spec.needs_approval(config.rule_for(tool)) {
            let shown = String::from_utf8_lossy(&canonical_args).into_owned();
            match self
                .approval(handle, server, tool, &id, nth, &shown, &config)
                .await?
            {
                Ok(None) => {}
                Ok(Some(outcome)) => return Ok(Ok(Outcome::Wit(outcome))),
                Err(e) => return Ok(Err(e)),
            }
        }
        self.send_journaled(handle, server, tool, &spec, &args, &id, nth)
            .await
    }

    /// The approval of the `nth` call of this run with identity `id`: `None` when it was
    /// approved, else what the guest gets.
    #[allow(clippy::too_many_arguments)]
    async fn approval(
        &mut self,
        handle: &Resource<ClaimHandle>,
        server: &str,
        tool: &str,
        id: &str,
        nth: u32,
        arguments: &str,
        config: &McpServer,
    ) -> wasmtime::Result<Result<Option<types::McpOutcome>, GuestError>> {
        let claim = self.claim(handle)?;
        let fence = claim.fence();
        let agent = claim.dispatch().agent.clone();
        // The whole identity: a shorter prefix could be matched by other arguments.
        let name = format!("{APPROVAL_PREFIX}{server}/{}/{id}#{nth}", short(tool));
        let shown_args = self.secrets().scrub(arguments).into_owned();
        if shown_args.len() > SHOWN_ARGUMENTS {
            return Ok(Err(GuestError::Denied(format!(
                "tool `{tool}` needs approval, and its arguments ({} bytes as JSON) are over the \
                 {SHOWN_ARGUMENTS} bytes an approval shows",
                shown_args.len()
            ))));
        }
        let metadata: BTreeMap<String, String> = [
            ("kind", "mcp-approval".to_owned()),
            (
                "message",
                format!("Approve the call of tool `{tool}` on MCP server `{server}`?"),
            ),
            ("schema", APPROVAL_SCHEMA.to_owned()),
            ("server", server.to_owned()),
            ("tool", tool.to_owned()),
            ("arguments", shown_args),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        // A token no one is given: only an operator's route settles an approval, never the
        // guest or whoever it would hand a token to.
        let token = match mint_token() {
            Ok(token) => token,
            Err(e) => return Ok(Err(guest_error(e))),
        };
        let new = NewWaitpoint {
            name,
            timeout_ms: crate::store::millis(config.approval_timeout),
            metadata,
            token_digest: token_digest(&token),
        };
        let created = match self
            .plugin
            .store
            .waitpoints
            .create_waitpoint(&fence, new)
            .await
        {
            Ok(created) => created,
            Err(e) => return Ok(Err(guest_error(e))),
        };
        if created.created {
            crate::telemetry::waitpoint_created(&agent);
        }
        let mut w = created.waitpoint;
        w.token_digests.clear();
        Ok(Ok(decide(w, config)))
    }

    /// Step 6 and 7: the journal, then the request. The call's record is kept by key (its
    /// identity and `nth`), not by position, so a run that diverged from its earlier runs
    /// still finds it.
    #[allow(clippy::too_many_arguments)]
    async fn send_journaled(
        &mut self,
        handle: &Resource<ClaimHandle>,
        server: &str,
        tool: &str,
        spec: &Tool,
        args: &Map<String, Value>,
        id: &str,
        nth: u32,
    ) -> wasmtime::Result<Result<Outcome, GuestError>> {
        let claim = self.claim(handle)?;
        let recorder = journaling(claim);
        let this_claim = claim.dispatch().claims;
        let key = mcp_key(server, short(tool), id, nth);
        if let Some(recorder) = &recorder {
            let kept = match recorder.step_get(&key).await {
                Ok(kept) => kept.and_then(|b| serde_json::from_slice::<Value>(&b).ok()),
                // Whether an earlier run sent it cannot be known: only a call that may run
                // twice goes on.
                Err(_) if spec.idempotent => None,
                Err(e) => {
                    return Ok(Err(GuestError::Unavailable(format!(
                        "the dispatch's journal could not be read, so whether an earlier run \
                         sent this call of `{tool}` is unknown; the tool is not idempotent, so \
                         it is not sent: {e}"
                    ))));
                }
            };
            if let Some(kept) = kept {
                let state = kept.get("state").and_then(Value::as_str);
                match (state, kept.get("result")) {
                    (Some("done"), Some(result)) => {
                        recorder.replayed_kept(CallKind::Mcp);
                        return Ok(Ok(Outcome::done(result, true)));
                    }
                    (Some("failed"), _) => {}
                    _ if spec.idempotent => {}
                    _ => {
                        let by = kept.get("claim").and_then(Value::as_u64).unwrap_or(0);
                        return Ok(Ok(Outcome::Wit(types::McpOutcome::Unknown(format!(
                            "an earlier run of this dispatch (claim {by}) sent this call of \
                             `{tool}` and ended before its answer was recorded; the tool is \
                             not idempotent, so it is not sent again: whether it ran is unknown"
                        )))));
                    }
                }
            }
            if !spec.idempotent {
                let intent = kept_record("intent", server, tool, this_claim, None);
                match recorder.keep(key.clone(), intent).await {
                    Ok(true) => {}
                    // No room for the intent: sending it unrecorded could send it twice.
                    Ok(false) => {
                        return Ok(Err(GuestError::Denied(format!(
                            "tool `{tool}` is not idempotent and the dispatch's journal is full \
                             (journal_max_bytes): it is not sent unrecorded"
                        ))));
                    }
                    Err(e) => return Ok(Err(guest_error(e))),
                }
            }
        }
        let span = tracing::info_span!(
            target: crate::telemetry::trace::TARGET,
            "execute_tool",
            otel.name = %format!("execute_tool {tool}"),
            otel.kind = "client",
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = %tool,
            mcp.server = %server,
            error.type = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let sent = tracing::Instrument::instrument(
            self.mcp.call(&self.http, server, tool, args),
            span.clone(),
        )
        .await;
        let secrets = self.secrets();
        let record = |state: &'static str, result: Option<Value>| {
            let recorder = recorder.clone();
            let key = key.clone();
            async move {
                let Some(recorder) = recorder else { return };
                let mut bytes = kept_record(state, server, tool, this_claim, result.as_ref());
                if bytes.len() as u64 > recorder.max_body() {
                    // Too large to keep: kept without its result (a replay then treats it as
                    // an intent).
                    bytes = kept_record(state, server, tool, this_claim, None);
                }
                match recorder.keep(key, bytes).await {
                    Ok(true) => recorder.recorded(CallKind::Mcp),
                    Ok(false) => {}
                    Err(e) => tracing::warn!(
                        dispatch = %recorder.dispatch(),
                        "journal: an MCP call's answer was not recorded: {e}"
                    ),
                }
            }
        };
        match sent {
            Ok(result) => {
                let text = result.to_string();
                // An answer that holds a secret is not kept: a replay then goes live (or is
                // reported unknown), and the journal never holds the secret; the guest gets it
                // scrubbed.
                let (kept, result) = match secrets.scrub(&text) {
                    std::borrow::Cow::Borrowed(_) => (Some(result.clone()), result),
                    std::borrow::Cow::Owned(scrubbed) => (
                        None,
                        serde_json::from_str(&scrubbed).unwrap_or_else(|_| {
                            json!({ "content": [{ "type": "text", "text": scrubbed }], "isError": true })
                        }),
                    ),
                };
                record("done", kept).await;
                let outcome = Outcome::done(&result, false);
                if matches!(outcome, Outcome::Done { is_error: true, .. }) {
                    span.record("error.type", "tool_error");
                    span.record("otel.status_code", "ERROR");
                }
                Ok(Ok(outcome))
            }
            Err(e) => {
                span.record("error.type", "mcp_error");
                span.record("otel.status_code", "ERROR");
                match &e {
                    // Never sent, or answered with an error: not run, sent again next time.
                    ClientError::Refused(_)
                    | ClientError::NotSent(_)
                    | ClientError::Unauthorized(_)
                    | ClientError::Answered { .. } => {
                        if !spec.idempotent {
                            record("failed", None).await;
                        }
                    }
                    // May have run: the intent stays (a later run reports it unknown); an
                    // idempotent call has none and is sent again.
                    ClientError::Unknown(_) | ClientError::TooLarge(_) => {}
                }
                Ok(Err(broker::guest_error(server, "tools/call", e)))
            }
        }
    }
}

/// `tool` cut to at most 100 bytes, as names and keys show it (a waitpoint's name and a
/// step's key are at most 256 bytes; the identity beside it tells calls apart).
fn short(tool: &str) -> &str {
    crate::input::cut_to(tool, 100)
}

/// A brokered call's record as the journal keeps it (`result`: the `tools/call` result, for
/// `done`).
fn kept_record(
    state: &str,
    server: &str,
    tool: &str,
    claim: u32,
    result: Option<&Value>,
) -> Vec<u8> {
    let mut kept = json!({ "state": state, "server": server, "tool": tool, "claim": claim });
    if let Some(result) = result {
        kept["result"] = result.clone();
    }
    kept.to_string().into_bytes()
}

/// `e` with the plugin's secrets scrubbed from its text (a server's error may echo them).
fn scrubbed(e: GuestError, secrets: &super::Secrets) -> GuestError {
    let clean = |text: String| secrets.scrub(&text).into_owned();
    match e {
        GuestError::Denied(t) => GuestError::Denied(clean(t)),
        GuestError::Invalid(t) => GuestError::Invalid(clean(t)),
        GuestError::Unavailable(t) => GuestError::Unavailable(clean(t)),
        GuestError::Internal(t) => GuestError::Internal(clean(t)),
        other => other,
    }
}

/// What an approval waitpoint in its current state means for the call.
fn decide(w: Waitpoint, config: &McpServer) -> Option<types::McpOutcome> {
    match w.state {
        WaitpointState::Pending => Some(types::McpOutcome::NeedsApproval(wit_waitpoint(
            w, None, None,
        ))),
        WaitpointState::Completed => {
            let answer = w
                .result
                .as_deref()
                .and_then(|r| serde_json::from_slice::<Value>(r).ok());
            let approve = answer
                .as_ref()
                .and_then(|a| a.get("approved"))
                .and_then(Value::as_bool);
            let by = w.settled_by.as_deref().unwrap_or("someone");
            match approve {
                Some(true) => None,
                Some(false) => {
                    let reason = answer
                        .as_ref()
                        .and_then(|a| a.get("reason"))
                        .and_then(Value::as_str)
                        .map_or_else(String::new, |r| format!(": {r}"));
                    Some(types::McpOutcome::Rejected(format!(
                        "the call was rejected by {by}{reason}"
                    )))
                }
                None => Some(types::McpOutcome::Rejected(format!(
                    "the approval was completed by {by} without {{\"approved\": true}}"
                ))),
            }
        }
        WaitpointState::TimedOut => Some(types::McpOutcome::Rejected(format!(
            "no one approved the call within {} s",
            config.approval_timeout.as_secs()
        ))),
        WaitpointState::Cancelled => Some(types::McpOutcome::Rejected(format!(
            "the approval was cancelled ({})",
            w.settled_by.as_deref().unwrap_or("cancelled")
        ))),
    }
}

/// A call's outcome before it becomes the WIT's.
enum Outcome {
    Done {
        result: types::McpResult,
        is_error: bool,
        replayed: bool,
    },
    Wit(types::McpOutcome),
}

impl Outcome {
    /// A `tools/call` result.
    fn done(result: &Value, replayed: bool) -> Outcome {
        let is_error = result
            .get("isError")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        Outcome::Done {
            result: types::McpResult {
                content: result
                    .get("content")
                    .map_or_else(|| "[]".to_owned(), Value::to_string),
                structured: result.get("structuredContent").map(Value::to_string),
                is_error,
            },
            is_error,
            replayed,
        }
    }

    fn into_wit(self) -> types::McpOutcome {
        match self {
            Outcome::Done { result, .. } => types::McpOutcome::Done(result),
            Outcome::Wit(outcome) => outcome,
        }
    }
}

/// A tool as `mcp-tools` lists it.
fn wit_tool(t: &Tool, config: &McpServer) -> types::McpTool {
    types::McpTool {
        name: t.name.clone(),
        description: t.description.clone(),
        input_schema: t.input_schema.to_string(),
        needs_approval: t.needs_approval(config.rule_for(&t.name)),
        read_only: t.read_only,
        destructive: t.destructive,
        idempotent: t.idempotent,
        open_world: t.open_world,
    }
}
