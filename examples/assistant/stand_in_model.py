#!/usr/bin/env python3
"""A STAND-IN for a model server, for the assistant example's demo and tests. Not a model.

It answers OpenAI-style `POST .../chat/completions` requests on the loopback address with canned
replies that exercise one tool round trip:

- a request whose messages hold no `role: tool` message after the last user message gets an
  assistant reply asking for the tool `add` (the first two integers in the user's message,
  else 2 and 3);
- a request that carries the tool's result gets a final assistant text that quotes it;
- a request whose history holds a tool call that a later message shows will never be answered
  (no tool message for its id right after the assistant message that made it) is answered 400,
  as OpenAI answers it;
- a request that offers no tools (the researcher example's) gets a note numbered after the
  assistant messages it carries: `Note N on <the user's message>.`. When the user's message
  contains `(fail once)`, the request for note 3 of that message is answered 503 the first
  time, so a demo can show a run that fails after two model calls and its retry.

A request with `"stream": true` is answered the way OpenAI streams: `text/event-stream`, one
server-sent event per `chat.completion.chunk` (`data: {...}` and a blank line), flushed one by
one in a chunked body. The first chunk carries `delta.role`; then a text reply comes as one chunk
per word-ish token (`delta.content`, each word with the spaces before it, so the tokens join
into the reply's text), or a tool call as `delta.tool_calls` (the id and name, then the
arguments in two pieces); a last chunk carries `finish_reason` with an empty delta, and
`data: [DONE]` ends the stream. Every reply reports its `usage` as OpenAI does (the prompt and
completion tokens counted as word-ish tokens): in the JSON, or, when the request asks with
`stream_options.include_usage`, in a last chunk with no choices. With `--no-stream` it answers every request with plain JSON, as a
server that does not stream would. `--stream-delay-ms N` (or `STAND_IN_STREAM_DELAY_MS`) waits N ms
between chunks, for demos; the default is no delay. Errors (401, 404, 400, 503) are JSON either
way.

`GET .../stats` answers `{"requests": N, "streamed": M}`: how many chat requests it has
answered so far, and how many of them it streamed.

It requires `Authorization: Bearer <key>` (the key from `--api-key` or the environment
variable `STAND_IN_API_KEY`) and answers 401 otherwise. It records nothing: no keys, no bodies;
its stderr log names only the method, path and status of each request.

Usage: stand_in_model.py [--api-key KEY] [--port N] [--stream-delay-ms N] [--no-stream]
It binds 127.0.0.1 (port 0 unless given) and prints its base URL (`http://127.0.0.1:PORT/v1`)
as the first line on stdout. It runs until killed. Python standard library only.
"""

import argparse
import http.server
import json
import os
import re
import sys
import threading
import time


def tool_call_reply(messages):
    """The reply asking for `add`, with numbers taken from the last user message."""
    user = next((m for m in reversed(messages) if m.get("role") == "user"), {})
    numbers = [int(n) for n in re.findall(r"-?\d+", str(user.get("content") or ""))]
    a, b = numbers[:2] if len(numbers) >= 2 else (2, 3)
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_stand_in_{len(messages)}",
                "type": "function",
                "function": {"name": "add", "arguments": json.dumps({"a": a, "b": b})},
            }
        ],
    }, "tool_calls"


def final_reply(tool_message):
    text = f"The stand-in model says: the tool answered {tool_message.get('content')}."
    return {"role": "assistant", "content": text}, "stop"


# Guarded by LOCK: the chat requests answered, and the user messages already failed once.
LOCK = threading.Lock()
STATS = {"requests": 0, "streamed": 0}
FAILED_ONCE = set()


def note_reply(messages):
    """A numbered note on the first user message; `None` when it is the one to fail."""
    user = next((m for m in messages if m.get("role") == "user"), {})
    topic = str(user.get("content") or "")
    n = 1 + sum(1 for m in messages if m.get("role") == "assistant")
    if "(fail once)" in topic and n == 3:
        with LOCK:
            if topic not in FAILED_ONCE:
                FAILED_ONCE.add(topic)
                return None
    return {"role": "assistant", "content": f"Note {n} on {topic}."}, "stop"


def unanswered_call(messages):
    """The id of a tool call that a later message shows will never be answered: the tool
    messages right after an assistant message with `tool_calls` must answer each of its ids.
    OpenAI refuses such a history with a 400, and so does the stand-in."""
    for i, m in enumerate(messages):
        if m.get("role") != "assistant" or not m.get("tool_calls"):
            continue
        j = i + 1
        answered = set()
        while j < len(messages) and messages[j].get("role") == "tool":
            answered.add(messages[j].get("tool_call_id"))
            j += 1
        if j == len(messages):
            continue
        for call in m["tool_calls"]:
            if call.get("id") not in answered:
                return call.get("id")
    return None


def answer(request):
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return 400, {"error": {"message": "messages must be a non-empty list"}}
    dangling = unanswered_call(messages)
    if dangling is not None:
        return 400, {
            "error": {
                "message": "An assistant message with 'tool_calls' must be followed by tool "
                f"messages responding to each 'tool_call_id'. Missing: {dangling}"
            }
        }
    offered = [t.get("function", {}).get("name") for t in request.get("tools") or []]
    last_user = max(
        (i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1
    )
    tool_results = [m for m in messages[last_user + 1 :] if m.get("role") == "tool"]
    if tool_results:
        message, finish = final_reply(tool_results[-1])
    elif "add" in offered:
        message, finish = tool_call_reply(messages)
    else:
        reply = note_reply(messages)
        if reply is None:
            return 503, {"error": {"message": "the stand-in fails this request once, on purpose"}}
        message, finish = reply
    prompt = sum(len(tokens(m["content"])) for m in messages if isinstance(m.get("content"), str))
    completion = len(tokens(message.get("content") or "")) + sum(
        len(tokens(c["function"]["arguments"])) + 2 for c in message.get("tool_calls") or []
    )
    return 200, {
        "id": "chatcmpl-stand-in",
        "object": "chat.completion",
        "model": request.get("model", "stand-in"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def tokens(text):
    """The text in word-ish tokens, each word with the whitespace before it: they join back
    into the text exactly."""
    return re.findall(r"\s*\S+|\s+", text)


def stream_chunks(body, with_usage=False):
    """The `chat.completion.chunk` objects that stream the completion `body` (as `answer`
    returns it)."""
    choice = body["choices"][0]
    message = choice["message"]

    def chunk(delta, finish=None):
        return {
            "id": body["id"],
            "object": "chat.completion.chunk",
            "model": body["model"],
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    yield chunk({"role": "assistant", "content": ""})
    for token in tokens(message.get("content") or ""):
        yield chunk({"content": token})
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        yield chunk(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": function["name"], "arguments": ""},
                    }
                ]
            }
        )
        arguments = function["arguments"]
        half = len(arguments) // 2
        for piece in (arguments[:half], arguments[half:]):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, choice["finish_reason"])
    if with_usage:
        yield {"id": body["id"], "object": "chat.completion.chunk", "model": body["model"],
               "choices": [], "usage": body["usage"]}


def handler_for(api_key, stream_delay, streams=True):
    class StandIn(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def reply(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def stream(self, body, with_usage):
            """Sends `body` as server-sent events in a chunked body, flushing each event (a
            last one with the usage when `with_usage`)."""
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            events = [f"data: {json.dumps(c)}\n\n" for c in stream_chunks(body, with_usage)]
            events.append("data: [DONE]\n\n")
            for i, event in enumerate(events):
                if i and stream_delay:
                    time.sleep(stream_delay)
                data = event.encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def do_GET(self):
            if not self.path.rstrip("/").endswith("/stats"):
                self.reply(404, {"error": {"message": "only /stats is here"}})
                return
            with LOCK:
                self.reply(200, dict(STATS))

        def do_POST(self):
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            with LOCK:
                STATS["requests"] += 1
            if self.headers.get("authorization") != f"Bearer {api_key}":
                self.reply(401, {"error": {"message": "missing or wrong API key"}})
                return
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self.reply(404, {"error": {"message": "only /chat/completions is here"}})
                return
            try:
                request = json.loads(raw)
            except ValueError:
                self.reply(400, {"error": {"message": "the body is not JSON"}})
                return
            status, body = answer(request)
            if status == 200 and streams and request.get("stream") is True:
                with LOCK:
                    STATS["streamed"] += 1
                options = request.get("stream_options")
                self.stream(body, isinstance(options, dict) and options.get("include_usage") is True)
            else:
                self.reply(status, body)

        def log_message(self, format, *args):
            # Method, path and status only (the default would do the same; kept explicit).
            sys.stderr.write(f"stand-in model: {self.command} {self.path} {args[1] if len(args) > 1 else ''}\n")

    return StandIn


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api-key", default=os.environ.get("STAND_IN_API_KEY"))
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--stream-delay-ms",
        type=int,
        default=int(os.environ.get("STAND_IN_STREAM_DELAY_MS") or 0),
        help="wait this long between streamed chunks (default: no delay)",
    )
    parser.add_argument(
        "--no-stream", action="store_true", help="answer plain JSON even when asked to stream"
    )
    args = parser.parse_args()
    if not args.api_key:
        parser.error("give the expected key with --api-key or STAND_IN_API_KEY")
    handler = handler_for(args.api_key, max(args.stream_delay_ms, 0) / 1000, not args.no_stream)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), handler)
    print(f"http://127.0.0.1:{server.server_address[1]}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
