//! `mcp-probe`: calls MCP tools through the host (`mcp-tools`, `mcp-call`), for the broker's
//! tests (`host/tests/integration/mcp_broker.rs`).
//!
//! The payload is a JSON command:
//!
//! - `{"op": "tools", "server": S}`: completes with the tools as JSON
//!   (`[{name, needs_approval, read_only, destructive, idempotent, open_world}]`);
//! - `{"op": "call", "server": S, "tool": T, "args": {...}, "fail_first": bool}`: calls the tool
//!   with `Claim::mcp_call_or_suspend` (suspending while it waits for approval) and completes
//!   with the outcome as JSON (`{"outcome": "done", "text", "structured", "is_error"}`,
//!   `{"outcome": "rejected" | "unknown", "why"}`, `{"error": ...}`); with `fail_first`, the
//!   first attempt fails after the call (a retry must be answered from the journal); with
//!   `diverge`, a log read that differs on every run comes first (the run diverges from its
//!   journal before the call);
//! - `{"op": "raw", "server": S, "tool": T, "arguments": "<text>"}`: calls with the arguments
//!   text as given (for the refusals);
//! - `{"op": "none"}`: calls nothing (the bench's baseline);
//! - `{"op": "get", "url": U}`: the guest's own GET of `U` (`{"status"}` or `{"error"}`);
//! - `{"op": "forge", "name": N}`: tries to make the waitpoint `N` itself (an approval's name
//!   is the host's: refused).

use homing_guest::{Claim, Handler, McpOutcome};
use serde_json::{Value, json};

struct Probe;

fn outcome(outcome: Option<McpOutcome>) -> Value {
    match outcome {
        None => json!({ "outcome": "suspended" }),
        Some(McpOutcome::Done(r)) => json!({
            "outcome": "done",
            "text": r.text(),
            "structured": r.structured.as_deref().and_then(|s| serde_json::from_str::<Value>(s).ok()),
            "is_error": r.is_error,
        }),
        Some(McpOutcome::Rejected(why)) => json!({ "outcome": "rejected", "why": why }),
        Some(McpOutcome::Unknown(why)) => json!({ "outcome": "unknown", "why": why }),
        Some(McpOutcome::NeedsApproval(w)) => json!({ "outcome": "needs-approval", "waitpoint": w.id }),
    }
}

impl Handler for Probe {
    fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
        let cmd: Value = claim.payload_json().map_err(|e| e.to_string())?;
        let text = |key: &str| cmd.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
        let server = text("server");
        let answer = match text("op").as_str() {
            "tools" => match claim.mcp_tools(&server) {
                Ok(tools) => Value::Array(
                    tools
                        .into_iter()
                        .map(|t| {
                            json!({
                                "name": t.name,
                                "needs_approval": t.needs_approval,
                                "read_only": t.read_only,
                                "destructive": t.destructive,
                                "idempotent": t.idempotent,
                                "open_world": t.open_world,
                            })
                        })
                        .collect(),
                ),
                Err(e) => json!({ "error": format!("{e:?}") }),
            },
            "call" => {
                let args = cmd.get("args").cloned().unwrap_or_else(|| json!({}));
                if cmd.get("diverge").and_then(Value::as_bool) == Some(true) {
                    claim
                        .read_log(u64::from(claim.claims()), 1)
                        .map_err(|e| e.to_string())?;
                }
                match claim.mcp_call_or_suspend(&server, &text("tool"), &args.to_string()) {
                    Ok(None) => return Ok(Vec::new()),
                    Ok(done) => {
                        if cmd.get("fail_first").and_then(Value::as_bool) == Some(true)
                            && claim.attempt() == 0
                        {
                            return Err("failing the first attempt after the call".into());
                        }
                        outcome(done)
                    }
                    Err(e) => json!({ "error": format!("{e:?}") }),
                }
            }
            "raw" => match claim.mcp_call(&server, &text("tool"), &text("arguments")) {
                Ok(done) => outcome(Some(done)),
                Err(e) => json!({ "error": format!("{e:?}") }),
            },
            "none" => json!({}),
            "get" => match homing_guest::http::Request::get(text("url")).send() {
                Ok(r) => json!({ "status": r.status }),
                Err(e) => json!({ "error": format!("{e:?}") }),
            },
            "forge" => match claim.waitpoint(&text("name"), std::time::Duration::from_secs(60), &[]) {
                Ok(w) => json!({ "made": w.id }),
                Err(e) => json!({ "error": format!("{e:?}") }),
            },
            other => return Err(format!("unknown op `{other}`")),
        };
        Ok(answer.to_string().into_bytes())
    }
}

homing_guest::export_handler!(Probe);
