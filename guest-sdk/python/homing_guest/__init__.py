"""Write Homing agents in Python: a thin layer over the bindings componentize-py generates.

The shape follows the Rust SDK (`homing-guest`): a handler is a function of a `Claim`, and one
call exports it. A `Claim` reads the dispatch (`id`, `thread`, `payload`, `text`, `attempt`,
`metadata`), settles it (`complete`, `ack`, `nack`, `dead_letter`), writes and reads the thread
log (`append`, `append_expected`, `read_log`, `read_log_all`, `log_latest`), reads and
acknowledges the thread's inbox (`next_message`, `messages`, `ack_message`), waits for people
and webhooks (`wait_for`; under it `waitpoint`, `waitpoints`, `await_waitpoint`, `suspend`),
memoizes work across retries and resumes (`step`), streams output to watchers (`emit`), calls
the tools of the plugin's MCP servers through the host (`mcp_tools`, `mcp_call`,
`mcp_call_or_suspend`) and enqueues follow-ups (`enqueue`). `homing_guest.history` closes the
tool calls a stopped run left in a chat history. Host
refusals raise `HomingError`, whose `kind` is the WIT `error` case (`"lost-claim"`,
`"conflict"`, ...); stop on `error.claim_is_gone()`.

    import homing_guest

    def handle(claim):
        homing_guest.info(f"echoing {len(claim.payload)} bytes")
        return claim.payload

    Handle = homing_guest.export_handler(handle)

The handler returns `bytes` or `str` (the output: the host completes the dispatch with it) or
raises (the host nacks: a retry with backoff, a dead letter at the attempt limit). An exception
never traps the guest: its text becomes the nack's reason. For the `agent` world, write
`WitWorld = homing_guest.export_agent(run)`, where `run()` loops over `claim_next(wait_ms)`.

Build with `homing build` (it supplies this package), or by hand with `componentize-py -d <wit>
-w <world> componentize <module> -p <the directory holding this package>`; the contract is in
this package's `wit/` directory. The package works in any world that includes `homing:agent`'s
`handler` or `agent` world.
Everything is imported when the module is: componentize-py snapshots the program after its
imports ran, and the component has no Python files to import from later.
"""

from __future__ import annotations

import datetime
import json
import traceback
from typing import Callable, Iterable, Iterator, List, Optional, Tuple, Union

from componentize_py_types import Err

from wit_world.imports import log as _log
from wit_world.imports import mailbox as _mailbox

try:  # Only the agent world imports `queue`.
    from wit_world.imports import queue as _queue
except ImportError:
    _queue = None

try:  # A world that also imports `wasi:filesystem/types` renames `types` to avoid the clash.
    from wit_world.imports import homing_agent_types as _types
except ImportError:
    from wit_world.imports import types as _types

__all__ = [
    "Claim",
    "HomingError",
    "LogEntry",
    "McpOutcome",
    "McpResult",
    "McpTool",
    "Message",
    "MessageNote",
    "Wait",
    "Waitpoint",
    "claim_next",
    "enqueue",
    "export_agent",
    "export_handler",
    "wait_for",
    "step",
    "trace",
    "debug",
    "info",
    "warn",
    "error",
]

Bytes = Union[bytes, str]

#: Entries asked for per `read_log` call by `Claim.read_log_all`; the host may cap a page.
LOG_PAGE = 256

#: The longest wait `next-message` takes (a WIT `u32` of milliseconds); longer waits are cut.
_MAX_WAIT_MS = 2**32 - 1

# The WIT `error` cases, by the generated class, in the WIT's own spelling.
_ERROR_KINDS = {
    _types.Error_LostClaim: "lost-claim",
    _types.Error_Interrupted: "interrupted",
    _types.Error_Contention: "contention",
    _types.Error_Invalid: "invalid",
    _types.Error_Denied: "denied",
    _types.Error_Duplicate: "duplicate",
    _types.Error_Conflict: "conflict",
    _types.Error_Unavailable: "unavailable",
    _types.Error_Internal: "internal",
}


class HomingError(Exception):
    """The host refused a call. `kind` is the WIT `error` case, `value` its payload (the text,
    or for `conflict` the thread log's latest sequence)."""

    def __init__(self, kind: str, value: Union[str, int]):
        super().__init__(f"{kind}: {value}")
        self.kind = kind
        self.value = value

    def claim_is_gone(self) -> bool:
        """Whether the claim is lost (lease gone, already settled) or its thread interrupted:
        stop working on it, do not retry."""
        return self.kind in ("lost-claim", "interrupted")


def _host(call: Callable, *args):
    """Calls a binding, turning the WIT error into a `HomingError`."""
    try:
        return call(*args)
    except Err as err:
        value = err.value
        kind = _ERROR_KINDS.get(type(value), "internal")
        raise HomingError(kind, getattr(value, "value", str(value))) from None


def _bytes(data: Bytes) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


def _kind(raw) -> str:
    """A WIT enum case in the WIT's own spelling (`MessageKind.FOLLOW_UP` -> `"follow-up"`)."""
    return raw.name.lower().replace("_", "-")


def _lookup(pairs, key: str) -> Optional[str]:
    for k, v in pairs:
        if k == key:
            return v
    return None


def _timeout_ms(timeout: Union[int, datetime.timedelta]) -> int:
    """Whole milliseconds of a waitpoint timeout given in milliseconds or as a `timedelta`."""
    if isinstance(timeout, datetime.timedelta):
        return max(int(timeout.total_seconds() * 1000), 0)
    return max(int(timeout), 0)


def _pairs(metadata: Union[dict, Iterable[Tuple[str, str]], None]) -> List[Tuple[str, str]]:
    return list(metadata.items()) if isinstance(metadata, dict) else list(metadata or [])


def _wait_ms(wait: Union[int, float, datetime.timedelta]) -> int:
    """Whole milliseconds of a wait in seconds or a `timedelta`, cut to what the WIT carries
    (a negative wait is no wait)."""
    seconds = wait.total_seconds() if isinstance(wait, datetime.timedelta) else wait
    return min(max(int(seconds * 1000), 0), _MAX_WAIT_MS)


class MessageNote:
    """What a log entry carries when it records an acknowledged inbox message: `seq` (the
    message's inbox sequence), `kind` (`"steer"` or `"follow-up"`), `sent_at` (Unix ms, store
    clock), `sent_by` (`"cli"`, `"api:<token name>"`, ...) and the sender's metadata."""

    __slots__ = ("seq", "kind", "sent_at", "sent_by", "_metadata")

    def __init__(self, raw):
        self.seq: int = raw.seq
        self.kind: str = _kind(raw.kind)
        self.sent_at: int = raw.sent_at
        self.sent_by: str = raw.sent_by
        self._metadata: List[Tuple[str, str]] = list(raw.metadata)

    def metadata(self, key: str) -> Optional[str]:
        """The metadata value under `key`, if the sender set one."""
        return _lookup(self._metadata, key)

    def __repr__(self) -> str:
        return f"MessageNote(seq={self.seq}, kind={self.kind!r}, sent_by={self.sent_by!r})"


class TurnMark:
    """Where the host ended a turn: `event` (`"interrupted"`, `"rolled-back"` or `"merged"`),
    `dispatch` (the run it stopped), `message` (the inbox sequence of the message that stopped
    it) and, for a rollback or a merge, `masked`: `(first, last)`, the log entries that run wrote, which the
    conversation no longer holds (`homing_guest.history.unmasked` drops them), else `None`.
    Tool calls a stopped run left without results: see `homing_guest.history`."""

    __slots__ = ("event", "dispatch", "message", "masked")

    def __init__(self, raw):
        event = raw.event
        self.event: str = getattr(event, "name", str(event)).lower().replace("_", "-")
        self.dispatch: str = raw.dispatch
        self.message: int = raw.message
        masked = getattr(raw, "masked", None)
        self.masked: Optional[Tuple[int, int]] = (
            None if masked is None else (masked.first, masked.last)
        )

    def __repr__(self) -> str:
        return (
            f"TurnMark(event={self.event!r}, dispatch={self.dispatch!r}, "
            f"message={self.message}, masked={self.masked!r})"
        )


class LogEntry:
    """One thread-log entry: `seq`, `data` (bytes), `appended_at` (Unix ms, host clock),
    `message`, a `MessageNote` when the entry records an acknowledged inbox message (its body
    is `data`), else `None`, and `turn`, a `TurnMark` when the host wrote the entry to mark
    where a turn ended (its data is empty), else `None`."""

    __slots__ = ("seq", "data", "appended_at", "message", "turn")

    def __init__(self, raw):
        self.seq: int = raw.seq
        self.data: bytes = raw.data
        self.appended_at: int = raw.appended_at
        note = getattr(raw, "message", None)
        self.message: Optional[MessageNote] = None if note is None else MessageNote(note)
        turn = getattr(raw, "turn", None)
        self.turn: Optional[TurnMark] = None if turn is None else TurnMark(turn)

    @property
    def text(self) -> Optional[str]:
        """The entry as UTF-8 text, or `None` when it is not text."""
        try:
            return self.data.decode()
        except UnicodeDecodeError:
            return None

    def __repr__(self) -> str:
        return f"LogEntry(seq={self.seq}, data={self.data!r})"


class Message:
    """A message of the thread's inbox, as a claim is handed it: `seq` (its inbox sequence, not
    a log sequence: pass it to `Claim.ack_message`), `kind` (`"steer"` or `"follow-up"`), `body`
    (bytes, never empty), `sent_at` (Unix ms, store clock), `sent_by` (`"cli"`,
    `"api:<token name>"`, ...), `agent` (the agent the sender addressed, or `None`) and the
    sender's metadata (`metadata(key)`, `metadata_pairs`)."""

    __slots__ = ("seq", "kind", "body", "sent_at", "sent_by", "agent", "metadata_pairs")

    def __init__(self, raw):
        self.seq: int = raw.seq
        self.kind: str = _kind(raw.kind)
        self.body: bytes = raw.body
        self.sent_at: int = raw.sent_at
        self.sent_by: str = raw.sent_by
        self.agent: Optional[str] = raw.agent
        self.metadata_pairs: List[Tuple[str, str]] = list(raw.metadata)

    @property
    def text(self) -> Optional[str]:
        """The body as UTF-8 text, or `None` when it is not text."""
        try:
            return self.body.decode()
        except UnicodeDecodeError:
            return None

    def metadata(self, key: str) -> Optional[str]:
        """The metadata value under `key`, if the sender set one."""
        return _lookup(self.metadata_pairs, key)

    def __repr__(self) -> str:
        return f"Message(seq={self.seq}, kind={self.kind!r}, body={self.body!r})"


class Waitpoint:
    """A waitpoint of the dispatch: `id` (as the API, the CLI and the dashboard name it),
    `name`, `state` (`"pending"`, `"completed"`, `"timed-out"` or `"cancelled"`), `timeout_at`,
    `created_at` and `settled_at` (Unix ms, store clock), `completion` (the bytes a completion
    sent, else `None`), `settled_by` (`"token"`, `"operator:<name>"`, `"cli"`, `"timeout"`,
    `"interrupt"`, `"dispatch-ended"`, or `None`) and its metadata (`metadata(key)`,
    `metadata_pairs`).

    `token` is the bearer token that completes this waitpoint and no other, and `callback_url`
    the URL that carries it (when the host's `[api] public_url` is set); both are `None` except
    in the answer of the call that created the waitpoint (or of a later run's first call that
    found it still pending). Hand them to whoever will complete the waitpoint; never log them.
    `repr()` leaves them out."""

    __slots__ = (
        "id",
        "name",
        "state",
        "timeout_at",
        "completion",
        "settled_at",
        "settled_by",
        "metadata_pairs",
        "created_at",
        "token",
        "callback_url",
    )

    def __init__(self, raw):
        self.id: str = raw.id
        self.name: str = raw.name
        self.state: str = _kind(raw.state)
        self.timeout_at: int = raw.timeout_at
        self.completion: Optional[bytes] = raw.completion
        self.settled_at: Optional[int] = raw.settled_at
        self.settled_by: Optional[str] = raw.settled_by
        self.metadata_pairs: List[Tuple[str, str]] = list(raw.metadata)
        self.created_at: int = raw.created_at
        self.token: Optional[str] = raw.token
        self.callback_url: Optional[str] = raw.callback_url

    @property
    def pending(self) -> bool:
        """Whether it still waits for a completion, a cancellation or its timeout."""
        return self.state == "pending"

    @property
    def text(self) -> Optional[str]:
        """What the completion sent, as UTF-8 text; `None` when it was not completed or the
        bytes are not text."""
        if self.completion is None:
            return None
        try:
            return self.completion.decode()
        except UnicodeDecodeError:
            return None

    def json(self):
        """What the completion sent, parsed as JSON (the dashboard's buttons send
        `{"approved": true}` or `{"approved": false}`); raises `HomingError("invalid", ...)`
        when it was not completed or is not JSON."""
        if self.completion is None:
            raise HomingError("invalid", f"waitpoint {self.name} is {self.state}, not completed")
        try:
            return json.loads(self.completion)
        except ValueError as e:
            raise HomingError("invalid", f"waitpoint {self.name}: completion is not JSON: {e}") from None

    def metadata(self, key: str) -> Optional[str]:
        """The metadata value under `key`, if it was created with one."""
        return _lookup(self.metadata_pairs, key)

    def __repr__(self) -> str:
        return f"Waitpoint(id={self.id!r}, name={self.name!r}, state={self.state!r})"


class Wait:
    """What `Claim.wait_for` found. `suspended` is true when the waitpoint is still pending and
    the run is suspended: return from the handler at once (the return value is ignored; the
    handler runs again from its start once the waitpoint is settled). Otherwise `state` is
    `"completed"`, `"timed-out"` or `"cancelled"`, and `waitpoint` is the settled waitpoint
    (`completion`, `text` and `json()` read what a completion sent)."""

    __slots__ = ("suspended", "waitpoint")

    def __init__(self, waitpoint: Waitpoint, suspended: bool):
        self.waitpoint = waitpoint
        self.suspended = suspended

    @property
    def state(self) -> str:
        return self.waitpoint.state

    @property
    def completed(self) -> bool:
        return self.waitpoint.state == "completed"

    @property
    def completion(self) -> Optional[bytes]:
        return self.waitpoint.completion

    @property
    def text(self) -> Optional[str]:
        return self.waitpoint.text

    def json(self):
        return self.waitpoint.json()

    def __repr__(self) -> str:
        return f"Wait(suspended={self.suspended}, waitpoint={self.waitpoint!r})"


def _parse_json(text: str, what: str):
    """`text` parsed as JSON; raises `HomingError("invalid", ...)` naming `what` when it is not."""
    try:
        return json.loads(text)
    except ValueError as e:
        raise HomingError("invalid", f"{what} is not JSON: {e}") from None


def _arguments_json(tool: str, arguments: Union[dict, str, None]) -> str:
    """The arguments of an MCP call as JSON text: a `str` as is, `None` as `{}`, anything else
    serialized."""
    if isinstance(arguments, str):
        return arguments
    try:
        return json.dumps({} if arguments is None else arguments, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise HomingError("invalid", f"the arguments of {tool} are not JSON: {e}") from None


class McpTool:
    """A tool of an MCP server, as the plugin's `[plugins.x.mcp.NAME]` lets it see it (only the
    tools its `tools` allow-list names): `name`, `description` (what the server says the tool
    does, or `None`), `input_schema` (the JSON Schema of its arguments, parsed; `schema_text` is
    the text as the host gave it), `needs_approval` (whether a call waits for a person first,
    by the plugin's rules) and the server's hints (MCP tool annotations, with MCP's defaults
    when absent): `read_only` (it changes nothing), `destructive` (it may destroy data),
    `idempotent` (calling it twice is harmless) and `open_world` (it reaches beyond the
    server)."""

    __slots__ = (
        "name",
        "description",
        "input_schema",
        "schema_text",
        "needs_approval",
        "read_only",
        "destructive",
        "idempotent",
        "open_world",
    )

    def __init__(self, raw):
        self.name: str = raw.name
        self.description: Optional[str] = raw.description
        self.schema_text: str = raw.input_schema
        self.input_schema = _parse_json(raw.input_schema, f"the input schema of {raw.name}")
        self.needs_approval: bool = raw.needs_approval
        self.read_only: bool = raw.read_only
        self.destructive: bool = raw.destructive
        self.idempotent: bool = raw.idempotent
        self.open_world: bool = raw.open_world

    def __repr__(self) -> str:
        return f"McpTool(name={self.name!r}, needs_approval={self.needs_approval})"


class McpResult:
    """What an MCP tool answered: `content` (its content blocks, the MCP content objects as the
    server sent them, parsed: a list of dicts), `structured` (its structured output, parsed, or
    `None` when it gave none) and `is_error` (the tool reported an error: a result the model
    can read, not a failed call). `text` joins its text blocks."""

    __slots__ = ("content", "structured", "is_error")

    def __init__(self, raw):
        self.content: list = _parse_json(raw.content, "the content of an MCP result")
        structured = raw.structured
        self.structured = (
            None
            if structured is None
            else _parse_json(structured, "the structured output of an MCP result")
        )
        self.is_error: bool = raw.is_error

    @property
    def text(self) -> str:
        """The text of its `text` content blocks, joined with newlines."""
        return "\n".join(
            block["text"]
            for block in self.content
            if isinstance(block, dict)
            and block.get("type") == "text"
            and isinstance(block.get("text"), str)
        )

    def __repr__(self) -> str:
        return f"McpResult(is_error={self.is_error}, content={self.content!r})"


class McpOutcome:
    """How an `mcp_call` ended. `kind` is the WIT `mcp-outcome` case:

    - `"done"`: the tool ran (or an earlier run of this dispatch ran it, answered from the
      journal); `result` is its `McpResult`, and `text` the text of its text blocks.
    - `"needs-approval"`: the plugin's rules ask a person first; `waitpoint` is the `Waitpoint`
      the host made (without a token: an operator completes it with `{"approved": true}` or
      `{"approved": false, "reason": ".."}`, as the dashboard's Approve and Reject buttons
      do). Suspend, and make the same call again when the run resumes
      (`Claim.mcp_call_or_suspend` does both).
    - `"rejected"`: not run: the approval was refused, timed out or was cancelled; `reason`
      says which, with the person's reason, to tell the model.
    - `"unknown"`: an earlier run of this dispatch sent the call and ended before its answer
      was journaled, and the tool is not idempotent, so it was not sent again: whether it ran
      is unknown; `reason` says so, for the model or a person.

    The fields a case does not carry are `None`."""

    __slots__ = ("kind", "result", "waitpoint", "reason")

    def __init__(self, raw):
        self.result: Optional[McpResult] = None
        self.waitpoint: Optional[Waitpoint] = None
        self.reason: Optional[str] = None
        if isinstance(raw, _types.McpOutcome_Done):
            self.kind = "done"
            self.result = McpResult(raw.value)
        elif isinstance(raw, _types.McpOutcome_NeedsApproval):
            self.kind = "needs-approval"
            self.waitpoint = Waitpoint(raw.value)
        elif isinstance(raw, _types.McpOutcome_Rejected):
            self.kind = "rejected"
            self.reason = raw.value
        elif isinstance(raw, _types.McpOutcome_Unknown):
            self.kind = "unknown"
            self.reason = raw.value
        else:
            raise HomingError("internal", f"an MCP outcome this SDK does not know: {raw!r}")

    @property
    def done(self) -> bool:
        """Whether the tool ran (`result` holds its answer)."""
        return self.kind == "done"

    @property
    def text(self) -> Optional[str]:
        """The text of the result's text blocks when the tool ran, else `None`."""
        return None if self.result is None else self.result.text

    def __repr__(self) -> str:
        detail = {
            "done": self.result,
            "needs-approval": self.waitpoint,
        }.get(self.kind, self.reason)
        return f"McpOutcome(kind={self.kind!r}, {detail!r})"


class Claim:
    """A dispatch this guest holds: what it is, and the calls that act on it. The dispatch info
    is read once, when the claim is wrapped."""

    def __init__(self, raw: _mailbox.Claim):
        self._raw = raw
        self.info = raw.info()
        # How often each step name was used in this claim (`step`).
        self._steps: dict = {}

    # The dispatch.
    @property
    def id(self) -> str:
        return self.info.id

    @property
    def agent(self) -> str:
        return self.info.agent

    @property
    def thread(self) -> str:
        return self.info.thread

    @property
    def run_id(self) -> str:
        return self.info.run_id

    @property
    def payload(self) -> bytes:
        return self.info.payload

    def items(self) -> list:
        """Every enqueue the dispatch's `collect` debounce window gathered, oldest first:
        records with `payload` (bytes), `metadata` (pairs) and `enqueued_at` (Unix ms). Empty
        for a dispatch without one; the payload is the latest item's; a retry gets the same."""
        return list(self._raw.items())

    @property
    def text(self) -> str:
        """The payload as UTF-8 text; raises `HomingError("invalid", ...)` when it is not."""
        try:
            return self.info.payload.decode()
        except UnicodeDecodeError as e:
            raise HomingError("invalid", f"payload is not UTF-8 text: {e}") from None

    @property
    def attempt(self) -> int:
        """Failed attempts before this one (0 on the first run)."""
        return self.info.attempt

    @property
    def max_attempts(self) -> int:
        return self.info.max_attempts

    @property
    def claims(self) -> int:
        """How many times the dispatch has been claimed, this claim included (1 on its first
        run): retries and resumes each add one."""
        return self.info.claims

    @property
    def resumes(self) -> int:
        """How many times the dispatch came back from waiting on its waitpoints (0 until it
        first suspends). A resume is not a failed attempt."""
        return self.info.resumes

    @property
    def priority(self) -> int:
        return self.info.priority

    def is_last_attempt(self) -> bool:
        """Whether failing this attempt dead-letters the dispatch instead of retrying it."""
        return self.info.attempt + 1 >= self.info.max_attempts

    def metadata(self, key: str) -> Optional[str]:
        """The metadata value under `key`, if the submitter set one."""
        return _lookup(self.info.metadata, key)

    # Progress and settling.
    def record_start(self) -> None:
        _host(self._raw.record_start)

    def record_result(self, output: Bytes) -> None:
        _host(self._raw.record_result, _bytes(output))

    def complete(self, output: Bytes) -> None:
        """Records `output` and acks in one step."""
        _host(self._raw.complete, _bytes(output))

    def ack(self) -> None:
        _host(self._raw.ack)

    def nack(self, error: str, retry_after_ms: Optional[int] = None) -> None:
        """Gives the dispatch back for a retry; `retry_after_ms` is a hint the host caps."""
        _host(self._raw.nack, error, retry_after_ms)

    def dead_letter(self, error: str) -> None:
        _host(self._raw.dead_letter, error)

    def stop_requested(self) -> Optional[str]:
        """`None`, or why the host wants the guest to stop (`"interrupted"`, `"lease-lost"`,
        `"shutdown"`, `"deadline"`): check it in long loops."""
        reason = self._raw.stop_requested()
        return None if reason is None else reason.name.lower().replace("_", "-")

    # The thread log.
    def append(self, entry: Bytes) -> int:
        """Appends to the thread log; returns the entry's sequence."""
        return _host(self._raw.append, _bytes(entry))

    def append_expected(self, entry: Bytes, expected_latest: int) -> int:
        """Appends only if the log's latest sequence is `expected_latest`; else raises
        `HomingError("conflict", latest)`."""
        return _host(self._raw.append_expected, _bytes(entry), expected_latest)

    def read_log(self, after: int = 0, limit: int = LOG_PAGE) -> List[LogEntry]:
        """Up to `limit` entries with a sequence greater than `after`."""
        return [LogEntry(e) for e in _host(self._raw.read_log, after, limit)]

    def read_log_all(self) -> List[LogEntry]:
        """The whole thread log, page by page."""
        entries: List[LogEntry] = []
        after = 0
        while True:
            page = self.read_log(after, LOG_PAGE)
            if not page:
                return entries
            entries.extend(page)
            after = page[-1].seq

    def log_latest(self) -> int:
        return _host(self._raw.log_latest)

    # The inbox.
    def next_message(
        self, wait: Union[int, float, datetime.timedelta] = 0
    ) -> Optional[Message]:
        """The oldest pending message of the thread's inbox that this claim has not been handed
        yet, waiting up to `wait` (seconds, or a `timedelta`; 0: do not wait) for one to
        arrive: the host wakes the wait as soon as a message is sent. `None` when nothing came
        in time, or early when the host wants the guest to stop (see `stop_requested`). A
        message stays pending until a claim acks it (`ack_message`), so a later run of the
        thread (a retry, the next dispatch) is handed it again. Raises `HomingError`
        (`"lost-claim"` or `"interrupted"` once the claim is gone, `"unavailable"`)."""
        raw = _host(self._raw.next_message, _wait_ms(wait))
        return None if raw is None else Message(raw)

    def messages(self) -> Iterator[Message]:
        """Every message handed to this claim now, oldest first, without waiting: the steers
        and follow-ups that arrived since the last call. A generator that ends when the inbox
        has nothing new; a host refusal raises from it."""
        while True:
            message = self.next_message(0)
            if message is None:
                return
            yield message

    def ack_message(self, seq: int) -> int:
        """Acknowledges message `seq` of this thread: it is marked acknowledged and appended
        to the thread log in one step (its body as the entry's data, the rest as the entry's
        `message` note), so a later run sees it in the history and is not handed it again.
        Returns the entry's log sequence; acking again returns the same sequence. Raises
        `HomingError`: `"invalid"` when `seq` is not a message of this thread or was
        discarded, `"duplicate"` (the acking dispatch's id as `value`) when another dispatch
        acked it, `"lost-claim"`, `"interrupted"`."""
        return _host(self._raw.ack_message, seq)

    # Waitpoints.
    def waitpoint(
        self,
        name: str,
        timeout_ms: Union[int, datetime.timedelta],
        metadata: Union[dict, Iterable[Tuple[str, str]], None] = None,
    ) -> Waitpoint:
        """The waitpoint `name` of this dispatch, created if it does not exist yet: pending,
        timing out `timeout_ms` from now (milliseconds or a `timedelta`; 1 ms to 30 days), with
        `metadata` (shown to operators). A retried or resumed run gets the one it created
        before, in its current state. Its `token` is set only when this call created it (or is
        a later run's first look at it while pending). Raises `HomingError` (`"invalid"` for a
        bad name, timeout or metadata; `"denied"` past 256 waitpoints; `"lost-claim"`,
        `"interrupted"`)."""
        raw = _host(self._raw.waitpoint, name, _timeout_ms(timeout_ms), _pairs(metadata))
        return Waitpoint(raw)

    def waitpoints(self) -> List[Waitpoint]:
        """Every waitpoint of this dispatch, oldest first, without tokens."""
        return [Waitpoint(w) for w in _host(self._raw.waitpoints)]

    def await_waitpoint(
        self, id: str, wait: Union[int, float, datetime.timedelta] = 0
    ) -> Waitpoint:
        """Waits in place until waitpoint `id` (its id, not its name) leaves pending, up to
        `wait` (seconds, or a `timedelta`), and returns it as it then is: still pending when
        the time ran out or the host wants the guest to stop. Holds the worker: for answers
        expected within seconds; `suspend` is for longer waits. Raises `HomingError`
        (`"invalid"` when `id` is not a waitpoint of this dispatch, `"lost-claim"`,
        `"interrupted"`)."""
        return Waitpoint(_host(self._raw.await_waitpoint, id, _wait_ms(wait)))

    def suspend(self) -> None:
        """Ends this run without finishing the dispatch: it becomes `waiting`, holding no
        worker, and is claimed again (a resume, not a new attempt) once one of its waitpoints
        leaves pending; the resumed run starts from the beginning of the handler. Return from
        the handler next (its return value is ignored); every later call through this claim
        raises `"lost-claim"`. Raises `HomingError` (`"invalid"` when nothing is pending,
        `"denied"` past `max_resumes`)."""
        _host(self._raw.suspend)

    def wait_for(
        self,
        name: str,
        timeout_ms: Union[int, datetime.timedelta],
        metadata: Union[dict, Iterable[Tuple[str, str]], None] = None,
        on_token: Optional[Callable[[Waitpoint], None]] = None,
    ) -> Wait:
        """Waits for the waitpoint `name` without holding a worker: creates it (or finds it
        again on a resumed or retried run) and, while it is pending, suspends the run. Returns
        a `Wait`: when `wait.suspended`, return from the handler at once; the handler runs
        again from its start once the waitpoint is completed, times out or is cancelled, and
        the same call then returns its outcome.

            wait = claim.wait_for("approve", 3_600_000, {"tool": "send_email"})
            if wait.suspended:
                return None
            if wait.completed and wait.json().get("approved"):
                ...

        `on_token(waitpoint)` is called, before the run suspends, whenever the host hands out
        a token (`waitpoint.token`, `waitpoint.callback_url`): when the waitpoint is created,
        and on a later run's first call that finds it still pending. The claim is live there:
        send the token to whoever will complete the waitpoint; never log it. An exception from
        `on_token` propagates and the run does not suspend (raised out of the handler, it
        nacks the dispatch: the retry gets a fresh token). Without `on_token` the token is
        dropped and an operator completes the waitpoint (dashboard, CLI, API)."""
        waitpoint = self.waitpoint(name, timeout_ms, metadata)
        if waitpoint.token is not None and on_token is not None:
            on_token(waitpoint)
        # The token is handed out (or dropped) here, never kept in the answer.
        waitpoint.token = None
        waitpoint.callback_url = None
        if not waitpoint.pending:
            return Wait(waitpoint, suspended=False)
        # A completion landing between the look above and this call is not lost: the host
        # resumes the dispatch at once.
        self.suspend()
        return Wait(waitpoint, suspended=True)

    # Memoized steps.
    def _step_key(self, name: str) -> str:
        """The key of the next use of `name` in this claim: `name`, then `name#2`, ..."""
        count = self._steps.get(name, 0) + 1
        self._steps[name] = count
        return name if count == 1 else f"{name}#{count}"

    def step(self, name: str, fn: Callable[[], object]):
        """Runs `fn()` once per dispatch under `name` and keeps its result (JSON): a later run
        of the same dispatch (a retry, or the run resumed after a waitpoint) gets the stored
        value back without calling `fn` again.

            summary = claim.step("summarize", lambda: summarize(claim.text))

        The n-th use of a name in one run is keyed `name`, `name#2`, `name#3`, ..., so steps
        in a loop each keep their own value (keep `#` out of names). The result must be JSON
        (dicts, lists, strings, numbers, booleans, None; a tuple comes back as a list). When
        `fn` raises, nothing is stored and the exception propagates. Values are kept only when
        the plugin's config sets `journal = "steps"` or `"run"`; with `journal = "off"`, the
        default, `fn` runs every time. Raises `HomingError` (`"invalid"` for a blank name, a
        key over 256 bytes, a value over `max_payload` or one that is not JSON;
        `"lost-claim"`, `"interrupted"`)."""
        key = self._step_key(name)
        stored = _host(self._raw.step_get, key)
        if stored is not None:
            try:
                return json.loads(bytes(stored))
            except ValueError as err:
                raise HomingError(
                    "invalid", f"the stored value of step {key} is not JSON: {err}"
                ) from None
        value = fn()
        try:
            data = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as err:
            raise HomingError("invalid", f"the value of step {key} is not JSON: {err}") from None
        _host(self._raw.step_put, key, data)
        return value

    # Streamed output.
    def emit(self, chunk: Bytes) -> int:
        """Streams `chunk` (bytes, or a `str` sent as UTF-8; a model's next tokens, say) to
        whoever watches this dispatch; returns its sequence within this claim (1, 2, ...).
        Not durable: the result and the thread log stay the record, and a later claim of the
        dispatch (a retry, a resume) starts again at 1. Cheap enough to call per token. An
        empty chunk is passed to the host, which refuses it. Raises `HomingError`:
        `"invalid"` for an empty chunk or one over 64 KiB, `"denied"` past the host's
        `max_stream_bytes` for this claim or its emit rate (a guest may stop streaming and
        carry on), `"lost-claim"`, `"interrupted"`."""
        return _host(self._raw.emit, _bytes(chunk))

    # Tools of MCP servers.
    def mcp_tools(self, server: str) -> List[McpTool]:
        """The tools of MCP server `server` (a `[plugins.x.mcp.NAME]` of this plugin) that its
        allow-list lets the plugin call, sorted by name. The host lists them with the
        server's credentials, which the guest never sees. Raises `HomingError`: `"invalid"`
        for a server the plugin does not configure, `"denied"` when the tool list no longer
        matches its `pin` (the text names the digest found) or the server's URL is refused,
        `"unavailable"` when the server cannot be listed, `"lost-claim"`, `"interrupted"`."""
        return [McpTool(t) for t in _host(self._raw.mcp_tools, server)]

    def mcp_call(
        self, server: str, tool: str, arguments: Union[dict, str, None] = None
    ) -> McpOutcome:
        """Calls tool `tool` of MCP server `server` with `arguments` (a dict, serialized as
        JSON, or a JSON object as a `str`; `None` sends `{}`) and returns how it ended, an
        `McpOutcome`:

            outcome = claim.mcp_call("records", "lookup", {"id": "42"})
            if outcome.done:
                return outcome.text

        Nothing is sent unless the tool is allowed and listed, the list matches the `pin` and
        the arguments satisfy the tool's input schema. Under `journal = "run"` a retried or
        resumed run making the same calls in the same order is answered from the journal: no
        tool runs twice. Raises `HomingError`: `"invalid"` for an unknown server or tool, or
        arguments that are not a JSON object or fail the schema; `"denied"` for a tool outside
        the allow-list, a changed tool list under a pin, or an answer over `max_result`;
        `"unavailable"` when the server did not answer; `"lost-claim"`, `"interrupted"`."""
        raw = _host(self._raw.mcp_call, server, tool, _arguments_json(tool, arguments))
        return McpOutcome(raw)

    def mcp_call_or_suspend(
        self, server: str, tool: str, arguments: Union[dict, str, None] = None
    ) -> Optional[McpOutcome]:
        """`mcp_call`, suspending the run while the call waits for a person's approval: `None`
        then (return from the handler at once; it runs again from its start once the
        approval settles, and the same call then returns `"done"`, or `"rejected"` when it was
        refused, timed out or was cancelled). Raises as `mcp_call` and `suspend`."""
        outcome = self.mcp_call(server, tool, arguments)
        if outcome.kind == "needs-approval":
            self.suspend()
            return None
        return outcome

    # Follow-up work.
    def enqueue(self, agent: str, payload: Bytes, **options) -> str:
        """Enqueues a follow-up to `agent` (on this thread unless `thread=` says otherwise);
        returns its id. Options: `thread`, `metadata` (dict or pairs), `priority`,
        `delay_ms`, `dedupe_key`, `max_attempts`, `debounce` (a dict: `key`, `quiet_ms`,
        `max_wait_ms`, optional `payload` "last", "first" or "collect" and `max_items`; the
        id returned is then the window's)."""
        return _host(self._raw.enqueue, _request(agent, payload, **options))

    def __repr__(self) -> str:
        return f"Claim(id={self.id!r}, thread={self.thread!r}, attempt={self.attempt})"


def _request(
    agent: str,
    payload: Bytes,
    thread: Optional[str] = None,
    metadata: Union[dict, Iterable[Tuple[str, str]], None] = None,
    priority: Optional[int] = None,
    delay_ms: Optional[int] = None,
    dedupe_key: Optional[str] = None,
    max_attempts: Optional[int] = None,
    debounce: Optional[dict] = None,
):
    pairs = _pairs(metadata)
    return _types.EnqueueRequest(
        agent=agent,
        thread=thread,
        payload=_bytes(payload),
        metadata=pairs,
        priority=priority,
        delay_ms=delay_ms,
        dedupe_key=dedupe_key,
        max_attempts=max_attempts,
        # Concurrency keys are refused by hosts that do not limit runs by them yet.
        concurrency_key=None,
        debounce=_debounce(debounce),
    )


_GATHER = {"last": "LAST", "first": "FIRST", "collect": "COLLECT"}


def _debounce(d: Optional[dict]):
    if d is None:
        return None
    payload = d.get("payload", "last")
    if payload not in _GATHER:
        raise HomingError(
            "invalid", f"debounce payload {payload!r}: expected last, first or collect"
        )
    return _types.Debounce(
        key=d["key"],
        quiet_ms=int(d["quiet_ms"]),
        max_wait_ms=int(d["max_wait_ms"]),
        payload=getattr(_types.Gather, _GATHER[payload]),
        max_items=int(d.get("max_items", 100)),
    )


def wait_for(
    claim: Claim,
    name: str,
    timeout_ms: Union[int, datetime.timedelta],
    metadata: Union[dict, Iterable[Tuple[str, str]], None] = None,
    on_token: Optional[Callable[[Waitpoint], None]] = None,
) -> Wait:
    """`claim.wait_for(name, timeout_ms, metadata, on_token)`."""
    return claim.wait_for(name, timeout_ms, metadata, on_token)


def step(claim: Claim, name: str, fn: Callable[[], object]):
    """`claim.step(name, fn)`."""
    return claim.step(name, fn)


def enqueue(agent: str, thread: str, payload: Bytes, **options) -> str:
    """Enqueues a dispatch on an explicit thread; returns its id."""
    return _host(_mailbox.enqueue, _request(agent, payload, thread=thread, **options))


def claim_next(wait_ms: int = 0) -> Optional[Claim]:
    """Agent world: the next dispatch for this plugin, waiting up to `wait_ms`; `None` when
    nothing came, the instance's claim budget is used, or the host is stopping."""
    if _queue is None:
        raise HomingError("invalid", "claim_next needs the agent world (it imports `queue`)")
    raw = _host(_queue.claim_next, wait_ms)
    return None if raw is None else Claim(raw)


def _write(level, message: str) -> None:
    _log.write(level, message)


def trace(message: str) -> None:
    _write(_log.Level.TRACE, message)


def debug(message: str) -> None:
    _write(_log.Level.DEBUG, message)


def info(message: str) -> None:
    _write(_log.Level.INFO, message)


def warn(message: str) -> None:
    _write(_log.Level.WARN, message)


def error(message: str) -> None:
    _write(_log.Level.ERROR, message)


def _failure(e: BaseException) -> Err:
    """The `err(message)` for an exception; a `HomingError` keeps its own text."""
    if not isinstance(e, HomingError):
        warn("".join(traceback.format_exception(e)).rstrip())
    return Err(str(e) or type(e).__name__)


def export_handler(handle: Callable[[Claim], Bytes]):
    """The `Handle` class componentize-py looks for, calling `handle(claim)` per dispatch.

    A `bytes`/`str` result completes the dispatch; `None` means the handler settled it itself;
    any exception nacks it with the exception's text."""
    from wit_world import exports

    class Handle(exports.Handle):
        def handle(self, claim):
            try:
                out = handle(Claim(claim))
            except Exception as e:  # noqa: BLE001 - every failure becomes a nack, not a trap
                raise _failure(e) from None
            return b"" if out is None else _bytes(out)

    return Handle


def export_agent(run: Callable[[], None]):
    """The `WitWorld` class componentize-py looks for in the `agent` world, calling `run()`
    once per instance. `run` loops over `claim_next` and settles each claim; an exception
    ends it with the exception's text (the host logs it and nacks unsettled claims)."""
    import wit_world

    class WitWorld(wit_world.WitWorld):
        def run(self) -> None:
            try:
                run()
            except Exception as e:  # noqa: BLE001
                raise _failure(e) from None

    return WitWorld
