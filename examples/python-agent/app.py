"""`python-agent`: a small tool-using assistant, in Python.

Each dispatch is one user message (UTF-8 text). The agent picks a tool by the message's first
word, runs it, and records the turn in the thread log as two JSON entries,
`{"role": "user", "content": ...}` and `{"role": "agent", "content": ...}`, so any instance
can pick the conversation up: the log is its only memory. The reply is the dispatch's output.

| message | tool |
| --- | --- |
| `remember <fact>` | notes the fact (it is in the log from now on) |
| `recall` | reads the thread log back and lists the facts noted so far |
| `read <path>` | a file's first 4 KiB (needs a `dirs` grant) |
| `env <NAME>` | an environment variable (needs an `env` grant) |
| `connect <ip>:<port>` | opens a TCP connection (needs an `allowed_hosts` grant) |
| `http <METHOD> <url> [body]` | an HTTP request (needs `allowed_outbound_hosts`); replies `{"status", "x-reply", "body"}` as JSON |
| `config <key>` | a plugin variable (`[plugins.NAME.variables]`); names with `key`, `secret`, `token` or `password` are not shown |
| `ask <agent> <text>` | hands `<text>` to another agent on this thread (needs `enqueue_to`) |
| `flaky <n>` | a tool that is unavailable for its first `n` attempts: the agent nacks |
| `inbox` | acknowledges the messages pending in the thread's inbox and replies with them |
| `wait <n> [ms]` | waits for up to `n` inbox messages (up to `ms`, default 10000, for each), acknowledging each |
| `wait-for <name> [ms] [notify-url]` | waits for a person: creates the waitpoint `<name>` (timing out after `ms`, default 3600000) and suspends; the resumed run replies with what became of it |
| `research <n> <url> [fail-first]` | `n` model calls in sequence: POSTs `{"turn": i, "history": <log entries>}` to `url` (needs `allowed_outbound_hosts`), appends each answer to the log as `{"role": "tool", "content": ...}`, replies with the answers separated by a vertical bar (space, bar, space); with `fail-first`, attempt 0 fails after the calls |
| `memo <n> <url> [fail-first]` | `n` model calls, each a memoized step (`claim.step("ask", ...)`, keyed `ask`, `ask#2`, ...): POSTs `{"turn": i, "history": 0}` to `url` (needs `allowed_outbound_hosts`), replies with the answers separated by a vertical bar (space, bar, space); with `fail-first`, attempt 0 fails after the calls |
| `stream <text>` | streams the text to the dispatch's watchers a word at a time (`claim.emit`, each word with the whitespace before it) and replies `streamed <n> chunks (last #<seq>): <text>`, `<seq>` being the last sequence `emit` returned |
| `mcp <server> <tool> [json-arguments]` | calls a tool of an MCP server through the host (`[plugins.NAME.mcp.<server>]`); replies `mcp done: <text>`, `mcp tool error: <text>`, `mcp rejected: <reason>` or `mcp unknown: <reason>`, and suspends while the call waits for approval |
| anything else | a reply that counts the turns |

Messages sent to the thread (`homing thread send`) reach the agent through its inbox: `inbox`
and `wait` read them, acknowledge each (which appends it to the thread log, so the agent's
history has them as user turns) and reply `inbox: #<seq> <kind> <text> [(from <meta from>)];
...`, or `inbox: nothing`. A dispatch the host enqueued to answer messages (metadata
`enqueued-by=inbox`, an empty payload) is an `inbox` turn.

`wait-for` ends the run without a reply while the waitpoint is pending (the dispatch waits,
holding no worker); whoever completes it (`homing waitpoint complete ID --payload ...`, the
API, the dashboard) resumes the dispatch, which runs again from the start and replies
`<name> completed by <who> after <n> resume(s): <text>`, `<name> timed-out after ...` or
`<name> cancelled by <who> after ...`. With a
`notify-url` (it needs `allowed_outbound_hosts`), the waitpoint's token and callback URL are
POSTed there as JSON (`{"waitpoint", "name", "token", "callback_url"}`) when the host hands them
out, so that whoever receives them can complete it; they are never logged.

`research` is how an agent builds a conversation with a model: before each call it reads the
thread log (the answers so far are in it) and sends how many entries it holds; each answer is
appended as a `tool` turn as soon as it arrives. With `fail-first`, the first attempt raises
after its calls, before the user and agent turns are appended, so the dispatch is retried: under
`journal = "run"` the retry is answered from the journal (no second request, no second append).

`memo` is the same conversation kept by steps instead of the journal: each call runs inside
`claim.step`, whose result the host keeps under `journal = "steps"` (or `"run"`), so the retry
after `fail-first` gets the first run's answers back without asking the model again. With
`journal = "off"` nothing is kept and the retry asks again. It appends no `tool` turns (the
history it sends is always 0).

A tool that fails (denied by the sandbox, say) is reported in the reply, as an assistant would
tell its user; only an unavailable tool gives the dispatch back for a retry. The same protocol
is implemented in JavaScript by `examples/js-agent`.
"""

# Every import is at the top: componentize-py snapshots the module after importing it, and
# the snapshot has no file system to import from later.
import datetime
import json
import os
import re
from typing import Optional

from componentize_py_types import Err
from wit_world.imports import instance_network, network, tcp_create_socket

import homing_guest
from homing_guest import Claim, config, http

# The most a `read` returns.
READ_LIMIT = 4096

# Variables whose names contain one of these are secrets: `config` says only that they are set.
SECRET_WORDS = ("key", "secret", "token", "password")


class ToolError(Exception):
    """A tool failed; the reply says so."""


def handle(claim: Claim):
    # A follow-up the host enqueued for unacknowledged messages carries no text of its own.
    message = "inbox" if claim.metadata("enqueued-by") == "inbox" else claim.text.strip()
    tool, _, arg = message.partition(" ")
    arg = arg.strip()
    history = [turn(e) for e in claim.read_log_all()]

    if tool == "wait-for":
        try:
            reply = wait_for_person(claim, arg)
        except ToolError as e:
            reply = f"tool {tool} failed: {e}"
        if reply is None:
            # Suspended: the claim is over; the resumed run replies.
            return None
    elif tool == "mcp":
        reply = call_mcp_tool(claim, arg)
        if reply is None:
            # Waiting for an operator's approval: the resumed run makes the same call.
            return None
    elif tool == "flaky":
        needed = int(arg or "1")
        if claim.attempt < needed:
            # Before anything is written: the retry starts from the same log.
            claim.nack(f"tool flaky unavailable (attempt {claim.attempt + 1})", 10)
            return None
        reply = f"succeeded after {claim.attempt} failed attempts"
    else:
        try:
            reply = run_tool(claim, tool, arg, message, history)
        except ToolError as e:
            reply = f"tool {tool} failed: {e}"

    claim.append(json.dumps({"role": "user", "content": message}))
    claim.append(json.dumps({"role": "agent", "content": reply}))
    homing_guest.info(f"turn on {claim.thread}: {tool} -> {reply[:60]}")
    return reply


def call_mcp_tool(claim: Claim, arg: str) -> Optional[str]:
    """`mcp <server> <tool> [json-arguments]`: the tool's answer, or None once the run is
    suspended waiting for approval."""
    server, _, rest = arg.partition(" ")
    tool, _, arguments = rest.strip().partition(" ")
    try:
        outcome = claim.mcp_call_or_suspend(server, tool, arguments.strip() or None)
    except homing_guest.HomingError as e:
        return f"mcp refused: {e}"
    if outcome is None:
        return None
    if outcome.kind == "done":
        prefix = "mcp tool error" if outcome.result.is_error else "mcp done"
        return f"{prefix}: {outcome.text}"
    return f"mcp {outcome.kind}: {outcome.reason}"


def turn(entry: homing_guest.LogEntry) -> dict:
    """A log entry as a turn: an acknowledged inbox message is the user's; the rest are the
    JSON turns this agent wrote."""
    if entry.message is not None:
        return {"role": "user", "content": entry.text or "", "inbox": entry.message.seq}
    return json.loads(entry.data)


def read_inbox(claim: Claim, arg: str, wait: bool) -> str:
    """`inbox`: the messages pending now; `wait <n> [ms]`: up to `n` messages, waiting up to
    `ms` for each. Acknowledges each one as it is read."""
    read = []

    def take(m: homing_guest.Message) -> None:
        claim.ack_message(m.seq)
        sender = m.metadata("from")
        text = m.text if m.text is not None else f"<{len(m.body)} bytes>"
        read.append(f"#{m.seq} {m.kind} {text}" + (f" (from {sender})" if sender else ""))

    if wait:
        words = arg.split()
        try:
            count = int(words[0]) if words else 1
            each = datetime.timedelta(milliseconds=int(words[1]) if len(words) > 1 else 10000)
        except ValueError:
            raise ToolError(f"{arg}: expected <n> [ms]") from None
        for _ in range(count):
            m = claim.next_message(each)
            if m is None:
                break
            take(m)
    else:
        for m in claim.messages():
            take(m)
    return "inbox: " + ("; ".join(read) if read else "nothing")


def wait_for_person(claim: Claim, arg: str) -> Optional[str]:
    """`wait-for <name> [ms] [notify-url]`: `None` once the run is suspended, else the reply
    naming what became of the waitpoint."""
    words = arg.split()
    if not words:
        raise ToolError("expected <name> [ms] [notify-url]")
    name = words[0]
    try:
        timeout_ms = int(words[1]) if len(words) > 1 else 3_600_000
    except ValueError:
        raise ToolError(f"{words[1]}: expected milliseconds") from None
    notify = words[2] if len(words) > 2 else None

    def hand_out(waitpoint: homing_guest.Waitpoint) -> None:
        homing_guest.info(f"waitpoint {name} ({waitpoint.id}) waits for a person")
        if notify is None:
            return
        body = json.dumps(
            {
                "waitpoint": waitpoint.id,
                "name": waitpoint.name,
                "token": waitpoint.token,
                "callback_url": waitpoint.callback_url,
            }
        )
        response = http.request(
            "POST", notify, headers=[("content-type", "application/json")], body=body, timeout=10
        )
        if response.status >= 300:
            # Raised out of the handler: a nack, and the retry hands out a fresh token.
            raise RuntimeError(f"the notify URL answered {response.status}")

    wait = claim.wait_for(name, timeout_ms, {"asked-by": claim.agent}, on_token=hand_out)
    if wait.suspended:
        return None
    who = wait.waitpoint.settled_by or "?"
    after = f"after {claim.resumes} resume(s)"
    if wait.completed:
        return f"{name} completed by {who} {after}: {wait.text}"
    if wait.state == "cancelled":
        return f"{name} cancelled by {who} {after}"
    return f"{name} {wait.state} {after}"


def run_tool(claim: Claim, tool: str, arg: str, message: str, history: list) -> str:
    if tool in ("inbox", "wait"):
        return read_inbox(claim, arg, tool == "wait")
    if tool == "remember":
        return f"noted: {arg}"
    if tool == "recall":
        facts = [
            e["content"][len("remember ") :]
            for e in history
            if e.get("role") == "user" and e.get("content", "").startswith("remember ")
        ]
        return "you told me: " + "; ".join(facts) if facts else "you have not told me anything yet"
    if tool == "read":
        try:
            with open(arg, "rb") as f:
                return f.read(READ_LIMIT).decode(errors="replace")
        except OSError as e:
            raise ToolError(f"{arg}: {e.strerror or e}") from None
    if tool == "env":
        value = os.environ.get(arg)
        if value is None:
            raise ToolError(f"{arg} is not set")
        return value
    if tool == "connect":
        return connect(arg)
    if tool == "http":
        return http_tool(claim, arg)
    if tool == "research":
        return research(claim, arg)
    if tool == "memo":
        return memo(claim, arg)
    if tool == "stream":
        return stream(claim, arg)
    if tool == "config":
        try:
            value = config.get(arg)
        except config.ConfigError as e:
            raise ToolError(str(e)) from None
        if value is None:
            raise ToolError(f"{arg} is not set")
        if any(word in arg for word in SECRET_WORDS):
            return f"{arg} is set ({len(value)} characters, not shown)"
        return value
    if tool == "ask":
        agent, _, text = arg.partition(" ")
        # A retry of this dispatch must not ask twice: the dedupe key is this dispatch.
        try:
            asked = claim.enqueue(
                agent, text, metadata={"from": claim.agent}, dedupe_key=f"ask-{claim.id}"
            )
        except homing_guest.HomingError as e:
            if e.kind != "duplicate":
                raise ToolError(str(e)) from None
            asked = str(e.value)
        return f"asked {agent}: {asked}"
    turns = 1 + sum(1 for e in history if e.get("role") == "user")
    return f'#{turns}: you said "{message}"'


def stream(claim: Claim, arg: str) -> str:
    """`stream <text>`: emits the text to the dispatch's watchers a word at a time, each word
    with the whitespace before it (the chunks join back into the text). A chunk the host
    refuses fails the tool; a claim that is gone raises out of the handler."""
    chunks = re.findall(r"\s*\S+", arg)
    if not chunks:
        raise ToolError("expected <text>")
    seq = 0
    for chunk in chunks:
        try:
            seq = claim.emit(chunk)
        except homing_guest.HomingError as e:
            if e.claim_is_gone():
                raise
            raise ToolError(str(e)) from None
    return f"streamed {len(chunks)} chunks (last #{seq}): {arg}"


def http_tool(claim: Claim, arg: str) -> str:
    """`<METHOD> <url> [body]`: sends the request with the header `x-agent: <this agent>` (and
    the body as text/plain), and replies with the status, the response's `x-reply` header and
    its body."""
    method, _, rest = arg.partition(" ")
    url, _, body = rest.strip().partition(" ")
    headers = [("x-agent", claim.agent)]
    if body:
        headers.append(("content-type", "text/plain"))
    try:
        response = http.request(method, url, headers=headers, body=body or None, timeout=10)
        text = response.text()
    except http.HttpError as e:
        raise ToolError(str(e)) from None
    return json.dumps({"status": response.status, "x-reply": response.header("x-reply"), "body": text})


def calls_arg(arg: str) -> tuple:
    """`<n> <url> [fail-first]` as (n, url, fail_first), for `research` and `memo`."""
    words = arg.split()
    try:
        count = int(words[0])
        url = words[1]
    except (IndexError, ValueError):
        count, url = -1, ""
    flag = words[2:]
    if count < 0 or flag not in ([], ["fail-first"]):
        raise ToolError("expected <n> <url> [fail-first]")
    return count, url, bool(flag)


def post_turn(url: str, turn: int, history: int) -> str:
    """POSTs `{"turn", "history"}` to `url` and returns the answer's text; a failed request or
    a status of 300 or more is a `ToolError`."""
    body = json.dumps({"turn": turn, "history": history})
    try:
        response = http.request(
            "POST", url, headers=[("content-type", "application/json")], body=body, timeout=10
        )
        answer = response.text()
    except http.HttpError as e:
        raise ToolError(str(e)) from None
    if response.status >= 300:
        raise ToolError(f"{url} answered {response.status}")
    return answer


def research(claim: Claim, arg: str) -> str:
    """`<n> <url> [fail-first]`: `n` POSTs to `url`, each after reading the thread log, each
    answer appended to the log as a `tool` turn; the answers joined by ` | `. With
    `fail-first`, attempt 0 raises after the calls (a nack: the dispatch is retried)."""
    count, url, fail_first = calls_arg(arg)
    answers = []
    for i in range(count):
        answer = post_turn(url, i, len(claim.read_log_all()))
        claim.append(json.dumps({"role": "tool", "content": answer}))
        answers.append(answer)
    if fail_first and claim.attempt == 0:
        # Raised out of the handler: a nack, before the turn's user and agent entries.
        raise RuntimeError(f"research failed on attempt 0 after {count} calls (fail-first)")
    return " | ".join(answers)


def memo(claim: Claim, arg: str) -> str:
    """`<n> <url> [fail-first]`: `n` POSTs to `url`, each inside the step `ask` (keys `ask`,
    `ask#2`, ...), so a retry gets the kept answers back instead of asking again; the answers
    joined by ` | `. With `fail-first`, attempt 0 raises after the steps (a nack: the dispatch
    is retried)."""
    count, url, fail_first = calls_arg(arg)
    # A failed call raises out of its step, which keeps nothing: the reply says so.
    answers = [claim.step("ask", lambda i=i: post_turn(url, i, 0)) for i in range(count)]
    if fail_first and claim.attempt == 0:
        # Raised out of the handler: a nack, before the turn's user and agent entries.
        raise RuntimeError(f"memo failed on attempt 0 after {count} steps (fail-first)")
    return " | ".join(answers)


def connect(target: str) -> str:
    """Opens a TCP connection to `ip:port` through `wasi:sockets` (Python has no `socket`
    module here) and closes it."""
    host, _, port = target.rpartition(":")
    try:
        octets = tuple(int(part) for part in host.split("."))
        address = network.IpSocketAddress_Ipv4(network.Ipv4SocketAddress(int(port), octets))
        if len(octets) != 4:
            raise ValueError
    except ValueError:
        raise ToolError(f"{target}: expected <ipv4>:<port>") from None
    try:
        sock = tcp_create_socket.create_tcp_socket(network.IpAddressFamily.IPV4)
        sock.start_connect(instance_network.instance_network(), address)
        while True:
            sock.subscribe().block()
            try:
                sock.finish_connect()
                break
            except Err as e:
                if e.value != network.ErrorCode.WOULD_BLOCK:
                    raise
    except Err as e:
        reason = getattr(e.value, "name", str(e.value)).lower().replace("_", "-")
        raise ToolError(f"{target}: {reason}") from None
    return f"connected to {target}"


Handle = homing_guest.export_handler(handle)
