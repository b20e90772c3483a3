//! The OpenAPI description as a generated client reads it: a real `homing run` serves
//! `/v1/openapi.json`, `openapi-python-client` (a common generator, from PyPI; pinned and
//! installed into `.tools/python` by `cargo xtask openapi-generator` when missing) makes a
//! Python client of it, and a script drives the API through that client only: it enqueues two
//! dispatches of the `waitpoint_sdk_probe` guest, which create waitpoints and suspend; completes
//! one with the waitpoint's own token and a JSON body and the other as an operator with bytes,
//! through the generated completion operation; waits for both with the long poll; and reads
//! the waitpoints, agents, rows and log back through the generated models.
//!
//! What it guards: the generator makes every operation, with no warning (a completion body of
//! `*/*` made it skip that one); and the fields the handlers always send are required in the
//! generated models (typed `str`, not `str | Unset`), which parse every answer the script gets.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::{Value, json};

use crate::api::{Api, OPERATOR, PRODUCER, READER, TOKENS};
use crate::common::{guest, root, target_dir, toml_path};

/// The venv's `openapi-python-client`, installed by `cargo xtask openapi-generator` (once per
/// test process) when it is missing; fails loudly, never skips, when it cannot be had.
fn generator() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let result = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(root())
            // Its own target dir: the test's cargo may still hold the lock on this one.
            .env("CARGO_TARGET_DIR", target_dir().join("xtask"))
            .env_remove("RUSTFLAGS")
            .args([
                "run",
                "--quiet",
                "--package",
                "xtask",
                "--",
                "openapi-generator",
            ])
            .output()
            .expect("cannot run cargo to install openapi-python-client");
        let stdout = String::from_utf8_lossy(&result.stdout);
        assert!(
            result.status.success(),
            "`cargo xtask openapi-generator` failed (it needs python3 with pip and venv, to \
             install openapi-python-client into .tools/python):\n{stdout}\n{}",
            String::from_utf8_lossy(&result.stderr)
        );
        let bin = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
        assert!(bin.is_file(), "no generator at {}", bin.display());
        bin
    })
}

/// A host serving the probe, whose runs may POST a waitpoint's token to the script's local
/// server.
fn config(port: u16) -> String {
    format!(
        r#"
[host]
lease = "10s"
sweep_interval = "200ms"
shutdown_grace = "2s"

[api]
listen = "127.0.0.1:{port}"
public_url = "http://127.0.0.1:{port}"
request_timeout = "10s"
max_wait = "30s"
{TOKENS}

[plugins.probe]
path = {probe}
concurrency = 2
timeout = "60s"
max_attempts = 2
allowed_outbound_hosts = ["http://127.0.0.1:*"]
"#,
        probe = toml_path(&guest("waitpoint_sdk_probe")),
    )
}

/// Runs `command` off the runtime's threads.
async fn output(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("cannot start a command: {e}"))
}

/// What `command` printed, both streams.
fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_generated_from_the_description_enqueues_waits_and_completes_waitpoints() {
    let generator = tokio::task::spawn_blocking(generator).await.unwrap();
    let bin = generator.parent().unwrap();
    let api = Api::start_with(config, |_| {}).await;

    // The document as served.
    let served = reqwest::Client::new()
        .get(api.url("/v1/openapi.json"))
        .bearer_auth(READER)
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), 200);
    let document = served.bytes().await.unwrap();
    let dir = api.env.path().join("client");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("openapi.json"), document).unwrap();

    // The client: every operation, and not one warning.
    let path = std::env::join_paths(std::iter::once(bin.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let mut generate = Command::new(generator);
    generate
        .current_dir(&dir)
        .env("PATH", path)
        .args(["generate", "--path", "openapi.json"])
        .args(["--output-path", "homing_client", "--meta", "none"]);
    let generated = output(generate).await;
    let report = said(&generated);
    assert!(
        generated.status.success(),
        "the generator failed:\n{report}"
    );
    assert!(
        !report.contains("Warning") && !report.contains("WARNING"),
        "the generator skipped or degraded part of the description:\n{report}"
    );
    let operation = dir.join("homing_client/api/default/complete_waitpoint.py");
    assert!(
        operation.is_file(),
        "no waitpoint completion was generated:\n{report}"
    );

    // The script, with the generated package on its path.
    std::fs::write(dir.join("drive.py"), DRIVER).unwrap();
    let mut drive = Command::new(bin.join("python"));
    drive
        .current_dir(&dir)
        .arg("drive.py")
        .env("PYTHONPATH", dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("HOMING_API", &api.base)
        .env("HOMING_READER", READER)
        .env("HOMING_PRODUCER", PRODUCER)
        .env("HOMING_OPERATOR", OPERATOR);
    let driven = output(drive).await;
    assert!(
        driven.status.success(),
        "the script driving the generated client failed:\n{}\nhost log:\n{}",
        said(&driven),
        api.log()
    );
    let seen: Value = serde_json::from_slice(&driven.stdout)
        .unwrap_or_else(|e| panic!("the script printed no JSON ({e}):\n{}", said(&driven)));

    // The generated models: what the handlers always send is required, and typed without Unset.
    for op in [
        "enqueue",
        "get_dispatch",
        "list_waitpoints",
        "complete_waitpoint",
    ] {
        assert!(
            seen["operations"].as_array().unwrap().contains(&json!(op)),
            "{op}: {}",
            seen["operations"]
        );
    }
    let required = |model: &str| -> Vec<&str> {
        seen["required"][model]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect()
    };
    let dispatch = required("Dispatch");
    for field in [
        "id",
        "agent",
        "thread",
        "status",
        "terminal",
        "attempts",
        "payload",
        "metadata",
        "result",
        "created_at",
        "completed_at",
    ] {
        assert!(dispatch.contains(&field), "Dispatch.{field}: {dispatch:?}");
    }
    let waitpoint = required("Waitpoint");
    for field in [
        "id",
        "dispatch",
        "state",
        "result",
        "settled_by",
        "settled_at",
    ] {
        assert!(
            waitpoint.contains(&field),
            "Waitpoint.{field}: {waitpoint:?}"
        );
    }
    assert_eq!(required("EnqueueResponse201"), ["id", "status"]);
    assert_eq!(required("CompleteWaitpointResponse200"), ["state"]);
    let types = seen["annotations"].as_object().unwrap();
    assert_eq!(types["id"], "str", "{types:?}");
    assert_eq!(types["terminal"], "bool", "{types:?}");
    assert_eq!(types["completed_at"], "int | None", "{types:?}");
    for (field, kind) in types {
        assert!(
            !kind.as_str().unwrap().contains("Unset"),
            "Dispatch.{field} is optional in the client: {kind}"
        );
    }

    // What the client did: enqueued, waited on, completed, waited for.
    let (by_token, by_operator) = (&seen["enqueued"]["token"], &seen["enqueued"]["operator"]);
    assert_eq!(by_token["status"], "queued", "{seen}");
    assert_eq!(by_operator["status"], "queued", "{seen}");
    let pending = &seen["pending"];
    assert_eq!(pending["dispatch"], by_token["id"], "{pending}");
    assert_eq!(
        (&pending["name"], &pending["state"]),
        (&json!("approve"), &json!("pending")),
        "{pending}"
    );
    assert!(pending["result"].is_null(), "{pending}");
    assert_eq!(
        seen["waiting"],
        json!({ "token": "waiting", "operator": "waiting" })
    );
    assert_eq!(
        seen["completed"],
        json!({ "token": "completed", "operator": "completed" })
    );
    assert_eq!(
        seen["again"],
        json!({ "type": "Error", "state": "completed" }),
        "a second completion is a 409 the client parses"
    );

    // The token holder's JSON body reached the resumed run as sent.
    let waited = &seen["waited"]["token"];
    assert_eq!(waited["id"], by_token["id"]);
    assert_eq!(
        (&waited["status"], &waited["terminal"], &waited["resumes"]),
        (&json!("acked"), &json!(true), &json!(1)),
        "{waited}"
    );
    let output = waited["output"].as_str().unwrap();
    let sent = output
        .strip_prefix("approve completed by token after 1 resume(s): ")
        .unwrap_or_else(|| panic!("{output}"));
    assert_eq!(
        serde_json::from_str::<Value>(sent).unwrap(),
        json!({ "approved": true, "by": "generated client" })
    );
    let settled = &seen["settled"]["token"];
    assert_eq!(
        (
            &settled["state"],
            &settled["settled_by"],
            &settled["result"]
        ),
        (&json!("completed"), &json!("token"), &json!(sent)),
        "{settled}"
    );

    // The operator's bytes, not UTF-8, came back as {"base64"} through the generated union.
    let waited = &seen["waited"]["operator"];
    assert_eq!(waited["id"], by_operator["id"]);
    assert_eq!(
        (&waited["status"], &waited["resumes"]),
        (&json!("acked"), &json!(1)),
        "{waited}"
    );
    assert_eq!(
        waited["output"],
        "review completed by operator:operator after 1 resume(s): shipped \u{FFFD}"
    );
    let settled = &seen["settled"]["operator"];
    assert_eq!(settled["settled_by"], "operator:operator", "{settled}");
    assert_eq!(
        settled["result"],
        json!({ "base64": "c2hpcHBlZCD/" }),
        "{settled}"
    );

    // The rest, read through the generated models.
    assert_eq!(seen["agents"], json!(["probe"]));
    assert_eq!(seen["rows"], json!(["acked", "acked"]));
    assert_eq!(
        seen["log"],
        json!([
            format!("waiting on approve ({})", pending["id"].as_str().unwrap()),
            output
        ])
    );
}

/// The script: see the module's documentation. Prints one JSON object of what it saw.
const DRIVER: &str = r##""""Drives a Homing API through the client openapi-python-client generated from its OpenAPI
description (the package `homing_client`): enqueues two dispatches of the waitpoint probe,
completes their waitpoints through the generated completion operation (one with the
waitpoint's own token and a JSON body, one as an operator with bytes), waits for each with the
long poll, and reads the rest back. Prints one JSON object of what it saw; exits non-zero,
saying why, on anything unexpected.

Environment: HOMING_API (the base URL), HOMING_READER, HOMING_PRODUCER, HOMING_OPERATOR."""

import inspect
import io
import json
import os
import pkgutil
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import attrs
import httpx

import homing_client.api.default as operations
from homing_client import AuthenticatedClient
from homing_client.api.default import (
    complete_waitpoint,
    enqueue,
    get_dispatch,
    get_waitpoint,
    list_agents,
    list_dispatches,
    list_waitpoints,
    thread_log,
)
from homing_client.models import (
    CompleteWaitpointResponse200,
    Dispatch,
    Enqueue,
    EnqueueResponse201,
    ListAgentsResponse200,
    ListDispatchesResponse200,
    ListWaitpointsResponse200,
    ThreadLogResponse200,
    Waitpoint,
)
from homing_client.models.complete_waitpoint_json_body_type_0 import (
    CompleteWaitpointJsonBodyType0,
)
from homing_client.types import File

BASE = os.environ["HOMING_API"]
TIMEOUT = httpx.Timeout(60.0)


def client(token):
    return AuthenticatedClient(
        base_url=BASE, token=token, timeout=TIMEOUT, raise_on_unexpected_status=True
    )


reader = client(os.environ["HOMING_READER"])
producer = client(os.environ["HOMING_PRODUCER"])
operator = client(os.environ["HOMING_OPERATOR"])


def fail(message):
    print(message, file=sys.stderr)
    sys.exit(1)


def expect(value, kind, what):
    if not isinstance(value, kind):
        fail(f"{what}: expected {kind.__name__}, got {value!r}")
    return value


def until(what, probe, within=60.0):
    deadline = time.monotonic() + within
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def required(model):
    """The fields a model's constructor requires: those the description marks required."""
    return [
        name
        for name, p in inspect.signature(model.__init__).parameters.items()
        if name not in ("self", "additional_properties") and p.default is inspect.Parameter.empty
    ]


def text(value):
    """A `Bytes` value as the client parsed it: text, or {"base64": ...}."""
    return value if isinstance(value, str) else {"base64": value.base64}


# Whoever a run hands a waitpoint's token to: a local server the probe POSTs to.
notified = []


class Notify(BaseHTTPRequestHandler):
    def do_POST(self):
        size = int(self.headers.get("content-length", "0"))
        notified.append(json.loads(self.rfile.read(size)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Notify)
threading.Thread(target=server.serve_forever, daemon=True).start()
notify_url = f"http://127.0.0.1:{server.server_port}/notify"

out = {
    "operations": sorted(m.name for m in pkgutil.iter_modules(operations.__path__)),
    "required": {
        m.__name__: required(m)
        for m in (Dispatch, Waitpoint, EnqueueResponse201, CompleteWaitpointResponse200)
    },
    "annotations": {f.name: str(f.type) for f in attrs.fields(Dispatch)},
}

# Enqueue: one waitpoint whose token the run hands out, one that only an operator completes.
enqueued = {}
for who, thread, payload in [
    ("token", "openapi-token", f"wait approve 60000 {notify_url}"),
    ("operator", "openapi-operator", "wait review 60000"),
]:
    reply = enqueue.sync(
        client=producer,
        body=Enqueue(agent="probe", thread=thread, payload=payload),
    )
    reply = expect(reply, EnqueueResponse201, f"enqueue {who}")
    enqueued[who] = {"id": reply.id, "status": reply.status}
out["enqueued"] = enqueued


def waiting(who):
    d = get_dispatch.sync(enqueued[who]["id"], client=reader)
    d = expect(d, Dispatch, f"get {who}")
    return d if d.status.value == "waiting" else None


# The token holder: the waitpoint's own token as the bearer, a JSON object as the body.
note = until("the notification", lambda: next((n for n in notified if n["name"] == "approve"), None))
approve, token = note["waitpoint"], note["token"]
pending = expect(get_waitpoint.sync(approve, client=reader), Waitpoint, "get the waitpoint")
out["pending"] = {
    "id": pending.id,
    "dispatch": pending.dispatch,
    "name": pending.name,
    "state": pending.state.value,
    "result": pending.result,
}
out["waiting"] = {"token": until("waiting", lambda: waiting("token")).status.value}
holder = client(token)
done = complete_waitpoint.sync(
    approve,
    client=holder,
    body=CompleteWaitpointJsonBodyType0.from_dict({"approved": True, "by": "generated client"}),
)
completed = {"token": expect(done, CompleteWaitpointResponse200, "complete by token").state.value}

# The operator: finds the other waitpoint by its dispatch, completes it with raw bytes.
def listed():
    page = list_waitpoints.sync(client=reader, dispatch=enqueued["operator"]["id"])
    page = expect(page, ListWaitpointsResponse200, "list waitpoints")
    return page.waitpoints


review = until("the operator's waitpoint", listed)[0].id
out["waiting"]["operator"] = until("waiting", lambda: waiting("operator")).status.value
done = complete_waitpoint.sync(
    review,
    client=operator,
    body=File(payload=io.BytesIO(b"shipped \xff"), mime_type="application/octet-stream"),
)
completed["operator"] = expect(done, CompleteWaitpointResponse200, "complete by operator").state.value
out["completed"] = completed

# A completed waitpoint is completed once: the generated operation parses the 409 as an Error.
again = complete_waitpoint.sync(approve, client=holder, body="again")
out["again"] = {"type": type(again).__name__, "state": getattr(again, "state", None)}

# Wait: the long poll, until each dispatch is terminal.
waited = {}
for who, info in enqueued.items():

    def terminal():
        d = get_dispatch.sync(info["id"], client=reader, wait="20s")
        d = expect(d, Dispatch, f"wait for {who}")
        return d if d.terminal else None

    d = until(f"{who} to end", terminal, within=90.0)
    waited[who] = {
        "id": d.id,
        "status": d.status.value,
        "terminal": d.terminal,
        "resumes": d.resumes,
        "attempts": d.attempts,
        "output": text(d.result.output) if d.result is not None else None,
        "result_status": d.result.status.value if d.result is not None else None,
        "completed_at": d.completed_at,
        "versions": len(d.versions),
    }
out["waited"] = waited

# What the waitpoints say now, and the rest read back through the generated models.
settled = {}
for who, wid in [("token", approve), ("operator", review)]:
    w = expect(get_waitpoint.sync(wid, client=reader), Waitpoint, f"get {who}'s waitpoint")
    settled[who] = {
        "state": w.state.value,
        "settled_by": w.settled_by,
        "result": text(w.result),
        "settled_at": w.settled_at,
    }
out["settled"] = settled
agents = expect(list_agents.sync(client=reader), ListAgentsResponse200, "list agents")
out["agents"] = [a.name for a in agents.agents]
rows = expect(
    list_dispatches.sync(client=reader, agent="probe"), ListDispatchesResponse200, "list"
)
out["rows"] = sorted(r.status.value for r in rows.dispatches)
log = expect(thread_log.sync("openapi-token", client=reader), ThreadLogResponse200, "log")
out["log"] = [text(e.data) for e in log.entries]
print(json.dumps(out))
"##;
