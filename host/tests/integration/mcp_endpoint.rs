//! Agents as MCP tools, as the official MCP Python SDK (`mcp`, pinned and installed into
//! `.tools/python` by `cargo xtask python-clients`) uses them, against a real `homing run` on
//! the embedded store and on a real `nats-server`, in both protocol eras: a 2025-11-25 client
//! (the `initialize` handshake) and a 2026-07-28 one (the revision in every request, its
//! headers checked). The SDK lists the tools, calls the echo agent (its JSON output comes back
//! as structured content; arguments that miss a required property are a tool error the model
//! can read; an unknown tool is the protocol's error), and calls the `approval` example, whose
//! run stops on a waitpoint for a person: the 2025 client answers it with `homing_respond`, the
//! 2026 client through `input_required`, its elicitation callback accepting the form the
//! waitpoint describes. A call retried with the same idempotency key enqueues once. Raw HTTP
//! then checks each refusal: malformed JSON, a batch, a wrong revision, a header that does not
//! match the body, a foreign `Origin`, no token, a reader's token; nothing is enqueued by any.

use serde_json::{Value, json};

use crate::api::{Api, PRODUCER, READER, TOKENS};
use crate::common::{guest, toml_path};
use crate::natsd::NatsServer;
use crate::openai_endpoint::run_python;
use crate::outbound_guests::StandIn;

const KEY: &str = "stand-in-key-for-the-mcp-test-77c0";

fn config(store: &str, port: u16) -> String {
    format!(
        r#"
[host]
lease = "10s"
sweep_interval = "200ms"
shutdown_grace = "2s"

{store}
[api]
listen = "127.0.0.1:{port}"
request_timeout = "10s"
max_wait = "60s"
{TOKENS}

[api.mcp]
call_wait = "10s"
allowed_origins = ["https://allowed.example"]

[plugins.echo]
path = {echo}

[plugins.echo.mcp_server]
expose = true
description = "Says the text back."
input_schema = {{ type = "object", properties = {{ text = {{ type = "string" }} }}, required = ["text"] }}

[plugins.approval]
path = {approval}
concurrency = 2
timeout = "30s"
max_attempts = 2
allowed_outbound_hosts = ["http://127.0.0.1:*"]

[plugins.approval.mcp_server]
expose = true

[plugins.approval.variables]
base_url = {{ env = "ASSISTANT_BASE_URL" }}
model = "stand-in"
api_key = {{ env = "ASSISTANT_API_KEY", secret = true }}

[plugins.hidden]
path = {echo}
"#,
        echo = toml_path(&guest("echo")),
        approval = toml_path(&guest("approval")),
    )
}

/// What the script does with the SDK, in the era `MODE` names; it prints what it saw.
const SCRIPT: &str = r#"
import json, os, sys
import anyio
import mcp_types as types
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

URL = os.environ["BASE"] + "/mcp"
MODE = os.environ["MODE"]
asked = []

async def on_elicit(ctx, params):
    asked.append({"message": params.message, "schema": params.requested_schema})
    return types.ElicitResult(action="accept", content={"approved": True})

def shown(result):
    return {
        "text": "".join(c.text for c in result.content if getattr(c, "type", "") == "text"),
        "structured": result.structured_content,
        "error": bool(result.is_error),
    }

async def main():
    out = {}
    async with create_mcp_http_client(headers={"Authorization": "Bearer " + os.environ["PRODUCER"]}) as http:
        kwargs = {"mode": MODE}
        if MODE != "legacy":
            kwargs["elicitation_callback"] = on_elicit
        async with Client(streamable_http_client(URL, http_client=http), **kwargs) as client:
            out["version"] = client.protocol_version
            tools = await client.list_tools()
            out["tools"] = sorted(t.name for t in tools.tools)
            out["echo_schema"] = [t.input_schema for t in tools.tools if t.name == "echo"][0]
            out["echo"] = shown(await client.call_tool("echo", {"text": "hi"}))
            out["echo_bad"] = shown(await client.call_tool("echo", {}))
            try:
                await client.call_tool("nope", {})
                out["unknown"] = None
            except MCPError as e:
                out["unknown"] = {"code": e.code, "message": e.message}
            thread = "mcp-idem-" + MODE
            out["idem"] = [shown(await client.call_tool("echo", {"text": "once"},
                                       meta={"io.homing/thread": thread, "io.homing/idempotency-key": "k-" + MODE}))
                           for _ in range(2)]
            out["idem_thread"] = thread
            if MODE == "legacy":
                first = shown(await client.call_tool("approval", {"question": "What is 40 + 2?"}))
                out["approval_first"] = first
                answer = {"id": first["structured"]["dispatch"], "answer": {"approved": True}}
                out["approval"] = shown(await client.call_tool("homing_respond", answer))
            else:
                out["approval"] = shown(await client.call_tool("approval", {"question": "What is 7 + 5?"}))
                out["asked"] = asked
    print(json.dumps(out))

anyio.run(main)
"#;

async fn tools(store: &str) {
    let model = StandIn::start(KEY);
    let store = store.to_owned();
    let api = Api::start_with_env(
        move |port| config(&store, port),
        &[
            ("ASSISTANT_BASE_URL", model.url.as_str()),
            ("ASSISTANT_API_KEY", KEY),
        ],
    )
    .await;

    for (mode, version) in [("legacy", "2025-11-25"), ("2026-07-28", "2026-07-28")] {
        let seen = run_python(&api, SCRIPT, &[("PRODUCER", PRODUCER), ("MODE", mode)]).await;
        assert_eq!(seen["version"], version, "{seen}");
        assert_eq!(
            seen["tools"],
            json!([
                "approval",
                "echo",
                "homing_cancel",
                "homing_respond",
                "homing_result"
            ]),
            "{seen}"
        );
        assert_eq!(seen["echo_schema"]["required"], json!(["text"]));
        assert_eq!(
            seen["echo"]["structured"],
            json!({ "text": "hi" }),
            "{seen}"
        );
        assert_eq!(seen["echo"]["error"], false);
        assert!(seen["echo_bad"]["error"].as_bool().unwrap(), "{seen}");
        assert!(
            seen["echo_bad"]["text"]
                .as_str()
                .unwrap()
                .contains("`text` is required"),
            "{seen}"
        );
        assert_eq!(seen["unknown"]["code"], -32602, "{seen}");
        let approval = &seen["approval"];
        assert_eq!(approval["error"], false, "{mode}: {seen}");
        let answer = if mode == "legacy" { "42" } else { "12" };
        assert!(
            approval["text"].as_str().unwrap().contains(answer),
            "{mode}: {seen}"
        );
        if mode == "legacy" {
            assert_eq!(
                seen["approval_first"]["structured"]["status"],
                "input_required"
            );
        } else {
            let asked = &seen["asked"][0];
            assert!(
                asked["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("Approve running add"),
                "{seen}"
            );
            assert_eq!(asked["schema"]["required"], json!(["approved"]), "{seen}");
        }
        // The retried call found the first one's dispatch.
        assert_eq!(seen["idem"][0], seen["idem"][1], "{seen}");
        assert_eq!(
            seen["idem"][0]["structured"],
            json!({ "text": "once" }),
            "{seen}"
        );
        let thread = seen["idem_thread"].as_str().unwrap();
        let (status, listed) = api.get(&format!("/v1/dispatches?thread={thread}")).await;
        assert_eq!(status, 200, "{listed}");
        assert_eq!(
            listed["dispatches"].as_array().unwrap().len(),
            1,
            "{listed}"
        );
    }

    // Refusals over raw HTTP: nothing enqueued by any.
    let (_, before) = api.get("/v1/dispatches?limit=500").await;
    let count = |v: &Value| v["dispatches"].as_array().unwrap().len();
    let client = reqwest::Client::new();
    let post = |body: String, headers: Vec<(&'static str, &'static str)>, token: Option<&str>| {
        let mut request = client
            .post(api.url("/mcp"))
            .header("content-type", "application/json")
            .body(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        for (k, v) in headers {
            request = request.header(k, v);
        }
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let text = response.text().await.unwrap();
            (
                status,
                serde_json::from_str::<Value>(&text).unwrap_or(json!(text)),
            )
        }
    };
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "x"}}})
    .to_string();
    let modern = |version: &str| {
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": "x"},
                "_meta": {"io.modelcontextprotocol/protocolVersion": version,
                    "io.modelcontextprotocol/clientCapabilities": {}}}})
        .to_string()
    };
    let hidden = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "hidden", "arguments": {}}})
    .to_string();
    let tools_call = vec![("mcp-method", "tools/call"), ("mcp-name", "echo")];
    // (what, body, headers, token, status, JSON-RPC code, a word the refusal says)
    let refusals = [
        (
            "not JSON",
            "{not json".to_owned(),
            vec![],
            Some(PRODUCER),
            400,
            Some(-32700),
            "JSON",
        ),
        (
            "a batch",
            format!("[{call}]"),
            vec![],
            Some(PRODUCER),
            400,
            Some(-32600),
            "batch",
        ),
        (
            "a revision not served",
            modern("2099-01-01"),
            tools_call.clone(),
            Some(PRODUCER),
            400,
            Some(-32022),
            "2026-07-28",
        ),
        (
            "another tool in Mcp-Name",
            modern("2026-07-28"),
            vec![("mcp-method", "tools/call"), ("mcp-name", "other")],
            Some(PRODUCER),
            400,
            Some(-32020),
            "Mcp-Name",
        ),
        (
            "another method in Mcp-Method",
            modern("2026-07-28"),
            vec![("mcp-method", "tools/list"), ("mcp-name", "echo")],
            Some(PRODUCER),
            400,
            Some(-32020),
            "Mcp-Method",
        ),
        (
            "an old revision not served",
            call.clone(),
            vec![("mcp-protocol-version", "1999-01-01")],
            Some(PRODUCER),
            400,
            Some(-32022),
            "1999-01-01",
        ),
        (
            "a foreign Origin",
            call.clone(),
            vec![("origin", "https://evil.example")],
            Some(PRODUCER),
            403,
            None,
            "allowed_origins",
        ),
        ("no token", call.clone(), vec![], None, 401, None, "token"),
        (
            "a reader's token",
            call.clone(),
            vec![],
            Some(READER),
            403,
            None,
            "role",
        ),
        (
            "an agent not exposed",
            hidden,
            vec![],
            Some(PRODUCER),
            200,
            Some(-32602),
            "hidden",
        ),
    ];
    for (what, body, headers, token, status, code, says) in refusals {
        let (got, answer) = post(body, headers, token).await;
        assert_eq!(got, status, "{what}: {answer}");
        if let Some(code) = code {
            assert_eq!(answer["error"]["code"], code, "{what}: {answer}");
        }
        assert!(answer.to_string().contains(says), "{what}: {answer}");
    }
    let (_, after) = api.get("/v1/dispatches?limit=500").await;
    assert_eq!(
        count(&after),
        count(&before),
        "a refusal enqueued something"
    );
    // A browser page on an allowed origin may call.
    let (status, body) = post(
        call,
        vec![("origin", "https://allowed.example")],
        Some(PRODUCER),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["result"]["structuredContent"],
        json!({ "text": "x" }),
        "{body}"
    );
    let response = client
        .get(api.url("/mcp"))
        .bearer_auth(PRODUCER)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 405);
    assert!(!api.log().contains(KEY), "the stand-in's key leaked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_sdk_calls_agents_as_tools_on_the_embedded_store() {
    tools("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_sdk_calls_agents_as_tools_on_nats() {
    let server = NatsServer::start();
    let store = server.store_section("mcp");
    tools(&store).await;
}
