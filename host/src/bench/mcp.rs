//! The cost of one MCP tool call a guest makes through the host's broker (`mcp-call`), against
//! the same `tools/call` made by the host directly.
//!
//! A stand-in MCP server in this process answers on a loopback port (JSON answers, one tool,
//! `add`, read-only so no approval). Through the guest: the `mcp-probe` test guest is called
//! (fresh instance + `handle`) with a payload making no call and with one making one call; the
//! difference of the two medians is what one brokered call costs (the allow-list, the pin and
//! schema checks, the plugin's outbound path, the component boundary; the session and the tool
//! list are reused, as a busy plugin's are). Directly: the host POSTs the same `tools/call`
//! with hyper on a fresh connection, as the broker does.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::bail;
use axum::Json;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use http_body_util::Full;
use serde_json::{Value, json};

use super::outbound::Probe;
use super::{Figure, figure};

/// The stand-in server: answers `initialize`, `tools/list` and `tools/call`, counting calls.
fn stand_in(calls: Arc<AtomicUsize>) -> axum::Router {
    axum::Router::new().route(
        "/mcp",
        axum::routing::post(move |Json(body): Json<Value>| {
            let calls = calls.clone();
            async move {
                let id = body.get("id").cloned().unwrap_or(Value::Null);
                let answer = |result: Value| {
                    Json(json!({ "jsonrpc": "2.0", "id": id, "result": result }))
                };
                match body.get("method").and_then(Value::as_str).unwrap_or_default() {
                    "initialize" => {
                        let mut headers = HeaderMap::new();
                        headers.insert("mcp-session-id", axum::http::HeaderValue::from_static("bench"));
                        (
                            headers,
                            answer(json!({
                                "protocolVersion": "2025-11-25",
                                "capabilities": { "tools": {} },
                                "serverInfo": { "name": "bench", "version": "1" },
                            })),
                        )
                            .into_response()
                    }
                    "tools/list" => answer(json!({ "tools": [{
                        "name": "add",
                        "inputSchema": {
                            "type": "object",
                            "properties": { "a": { "type": "integer" }, "b": { "type": "integer" } },
                            "required": ["a", "b"],
                        },
                        "annotations": { "readOnlyHint": true },
                    }] }))
                    .into_response(),
                    "tools/call" => {
                        calls.fetch_add(1, Ordering::Relaxed);
                        answer(json!({ "content": [{ "type": "text", "text": "3" }], "isError": false }))
                            .into_response()
                    }
                    _ => StatusCode::ACCEPTED.into_response(),
                }
            }
        }),
    )
}

/// Measures `samples` tool calls each way; `probe` is the `mcp-probe` guest.
pub(super) async fn mcp(probe: &Path, samples: usize) -> anyhow::Result<Vec<Figure>> {
    let calls = Arc::new(AtomicUsize::new(0));
    let mut probe = Probe::serve(probe, stand_in(calls.clone()), |port| {
        format!(
            "[plugins.probe.mcp.bench]\nurl = \"http://127.0.0.1:{port}/mcp\"\ntools = [\"add\"]\n"
        )
    })
    .await?;
    let addr = probe.addr();
    let mut through_guest = Vec::new();
    for (thread, payload) in [
        ("no", json!({ "op": "none" })),
        (
            "one",
            json!({ "op": "call", "server": "bench", "tool": "add", "args": { "a": 1, "b": 2 } }),
        ),
    ] {
        let times = probe
            .calls(thread, &payload.to_string(), samples, None)
            .await?;
        through_guest.push(figure(
            format!("mcp-probe fresh instance + call, {thread} tool call"),
            "µs",
            times,
        ));
    }
    if calls.load(Ordering::Relaxed) != samples {
        bail!(
            "the stand-in MCP server saw {} tool calls, not {samples}",
            calls.load(Ordering::Relaxed)
        );
    }

    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": { "name": "add", "arguments": { "a": 1, "b": 2 } },
    })
    .to_string();
    let mut direct = Vec::with_capacity(samples);
    for _ in 0..samples {
        let request = http::Request::post("/mcp")
            .header(http::header::HOST, addr.to_string())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json, text/event-stream")
            .header("mcp-session-id", "bench")
            .body(Full::new(bytes::Bytes::from(body.clone())))?;
        let (took, answer) = super::outbound::fresh_exchange(addr, request).await?;
        direct.push(took);
        if !answer.starts_with(b"{") {
            bail!("the stand-in MCP server answered {answer:?}");
        }
    }
    probe.stop();

    Ok(super::outbound::compared(
        through_guest,
        direct,
        [
            "mcp tools/call, host directly (hyper)",
            "mcp tools/call brokered via guest (1-call - 0-call)",
            "mcp tools/call, brokered / host directly",
        ],
    ))
}
