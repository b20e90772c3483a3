"""Outbound HTTP for Homing agents in Python: a small blocking client over `wasi:http`.

The component's world must import `wasi:http/outgoing-handler@0.2.x` (see
`examples/wit/tool-agent.wit`); import this module only in such a world. The host decides where
a request may go: it is refused unless its origin is in the plugin's `allowed_outbound_hosts`
(`HttpError` with `code == "HTTP-request-denied"`), and the host does TLS for `https` URLs.

    from homing_guest import http

    response = http.request("POST", "https://api.example.com/v1/echo",
                            headers=[("content-type", "application/json")],
                            body='{"hello": "world"}', timeout=10)
    if response.ok:
        data = response.json()

A request blocks until the whole response body is read. `timeout` (seconds, default 30) is the
deadline of the whole request and is also passed to the host as its connect, first-byte and
between-bytes timeouts; a body larger than `max_response_bytes` (default 8 MiB) fails. Request
bodies go out in chunks of at most 4096 bytes.

componentize-py bundles a `poll_loop` module for `wasi:http`, but it imports the interface as
`wit_world.imports.types`, a name that a world with `homing:agent` (and often
`wasi:filesystem`) gives to another interface; and a handler is synchronous anyway. So this
module drives the generated bindings directly and waits with `wasi:io/poll`.

Errors never include header values or bodies, so an `authorization` header cannot leak through
one.
"""

from __future__ import annotations

import json as _json
from typing import Iterable, List, Mapping, Optional, Tuple, Union

from componentize_py_types import Err

from wit_world.imports import monotonic_clock, outgoing_handler, poll, streams

try:  # A world with `homing:agent/types` names wasi:http's `types` apart.
    from wit_world.imports import wasi_http_types as _types
except ImportError:  # pragma: no cover - a world without a clash
    from wit_world.imports import types as _types  # type: ignore[no-redef]

__all__ = ["HttpError", "Response", "request", "get", "post"]

#: The deadline of a request (seconds) unless `timeout` says otherwise.
DEFAULT_TIMEOUT = 30.0
#: The largest response body read unless `max_response_bytes` says otherwise.
DEFAULT_MAX_RESPONSE_BYTES = 8 << 20

_WRITE_CHUNK = 4096
_READ_CHUNK = 64 << 10

# The WIT names of `wasi:http/types.error-code`, keyed by the generated class's suffix
# (`ErrorCode_HttpRequestDenied` -> `HTTP-request-denied`).
_CODE_NAMES = [
    "DNS-timeout", "DNS-error", "destination-not-found", "destination-unavailable",
    "destination-IP-prohibited", "destination-IP-unroutable", "connection-refused",
    "connection-terminated", "connection-timeout", "connection-read-timeout",
    "connection-write-timeout", "connection-limit-reached", "TLS-protocol-error",
    "TLS-certificate-error", "TLS-alert-received", "HTTP-request-denied",
    "HTTP-request-length-required", "HTTP-request-body-size", "HTTP-request-method-invalid",
    "HTTP-request-URI-invalid", "HTTP-request-URI-too-long",
    "HTTP-request-header-section-size", "HTTP-request-header-size",
    "HTTP-request-trailer-section-size", "HTTP-request-trailer-size",
    "HTTP-response-incomplete", "HTTP-response-header-section-size",
    "HTTP-response-header-size", "HTTP-response-body-size",
    "HTTP-response-trailer-section-size", "HTTP-response-trailer-size",
    "HTTP-response-transfer-coding", "HTTP-response-content-coding", "HTTP-response-timeout",
    "HTTP-upgrade-failed", "HTTP-protocol-error", "loop-detected", "configuration-error",
    "internal-error",
]
_CODES = {"".join(p[:1].upper() + p[1:].lower() for p in n.split("-")): n for n in _CODE_NAMES}

_METHODS = {
    "GET": _types.Method_Get, "HEAD": _types.Method_Head, "POST": _types.Method_Post,
    "PUT": _types.Method_Put, "DELETE": _types.Method_Delete, "PATCH": _types.Method_Patch,
    "OPTIONS": _types.Method_Options,
}

Headers = Union[Mapping[str, Union[str, bytes]], Iterable[Tuple[str, Union[str, bytes]]]]


class HttpError(Exception):
    """A request failed. `code` is the `wasi:http` error-code name the host reported
    (`"HTTP-request-denied"`, `"connection-refused"`, ...), `"timeout"` for the request's own
    deadline, `"response-too-large"` for a body over the limit, or `None` for a request that
    could not be built or a response that did not decode."""

    def __init__(self, code: Optional[str], message: str):
        super().__init__(f"http: {code}: {message}" if code else f"http: {message}")
        self.code = code

    @property
    def denied(self) -> bool:
        """Whether the host refused the destination (`allowed_outbound_hosts`)."""
        return self.code == "HTTP-request-denied"


def _code_error(value) -> HttpError:
    name = _CODES.get(type(value).__name__.removeprefix("ErrorCode_"), "internal-error")
    if name == "HTTP-request-denied":
        return HttpError(name, "the host does not allow this destination (see allowed_outbound_hosts)")
    detail = getattr(value, "value", None)
    return HttpError(name, detail if isinstance(detail, str) else "the request failed")


class Response:
    """A response, read in full: `status`, `headers` (a list of `(name, bytes)`) and `body`."""

    def __init__(self, status: int, headers: List[Tuple[str, bytes]], body: bytes):
        self.status = status
        self.headers = headers
        self.body = body

    @property
    def ok(self) -> bool:
        """Whether the status is 2xx."""
        return 200 <= self.status < 300

    def header(self, name: str) -> Optional[str]:
        """The first value of header `name` (any case), as text."""
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value.decode(errors="replace")
        return None

    def text(self) -> str:
        try:
            return self.body.decode()
        except UnicodeDecodeError:
            raise HttpError(None, "the response body is not UTF-8") from None

    def json(self):
        try:
            return _json.loads(self.body)
        except ValueError as e:
            raise HttpError(None, f"the response body is not JSON: {e}") from None

    def __repr__(self) -> str:  # no header values, no body
        return f"Response(status={self.status}, body_len={len(self.body)})"


def _split(url: str) -> Tuple[object, str, str]:
    scheme, sep, rest = url.partition("://")
    kinds = {"http": _types.Scheme_Http(), "https": _types.Scheme_Https()}
    if not sep or scheme.lower() not in kinds:
        raise HttpError(None, "the URL must start with http:// or https://")
    rest = rest.split("#", 1)[0]
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, path = rest[:end], rest[end:]
    if not authority or "@" in authority:
        raise HttpError(None, "the URL needs a host (and no user information)")
    if not path.startswith("/"):
        path = "/" + path
    return kinds[scheme.lower()], authority, path


def _pairs(headers: Optional[Headers]) -> List[Tuple[str, Union[str, bytes]]]:
    """Headers given as a mapping or as pairs, as a list of pairs."""
    if isinstance(headers, Mapping):
        return list(headers.items())
    return list(headers or [])


def _wait(pollable, deadline: int) -> None:
    """Blocks until `pollable` is ready or the monotonic clock passes `deadline` (ns)."""
    with monotonic_clock.subscribe_instant(deadline) as timer:
        ready = poll.poll([pollable, timer])
    pollable.__exit__(None, None, None)
    if 0 not in ready:
        raise HttpError("timeout", "the request timed out")


def _stream_error(e: Err) -> HttpError:
    if isinstance(e.value, streams.StreamError_LastOperationFailed):
        code = _types.http_error_code(e.value.value)
        if code is not None:
            return _code_error(code)
    return HttpError("connection-terminated", "the body stream failed")


def request(
    method: str,
    url: str,
    headers: Optional[Headers] = None,
    body: Union[bytes, str, None] = None,
    timeout: float = DEFAULT_TIMEOUT,
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
) -> Response:
    """Sends a request and reads the whole response. Raises `HttpError`."""
    scheme, authority, path = _split(url)
    data = body.encode() if isinstance(body, str) else (body or b"")
    fields = [(k, v.encode() if isinstance(v, str) else bytes(v)) for k, v in _pairs(headers)]
    if data and not any(k.lower() == "content-length" for k, _ in fields):
        fields.append(("content-length", str(len(data)).encode()))
    try:
        outgoing = _types.OutgoingRequest(_types.Fields.from_list(fields))
    except Err as e:
        raise HttpError(None, f"a header is not allowed or not valid ({type(e.value).__name__})") from None
    kind = _METHODS.get(method.upper())
    try:
        outgoing.set_method(kind() if kind else _types.Method_Other(method))
        outgoing.set_scheme(scheme)
        outgoing.set_authority(authority)
        outgoing.set_path_with_query(path)
    except Err:
        raise HttpError(None, f"the method or URL is not valid: {method} {url}") from None
    outgoing_body = outgoing.body()
    options = _types.RequestOptions()
    nanos = int(timeout * 1e9)
    for setter in (options.set_connect_timeout, options.set_first_byte_timeout,
                   options.set_between_bytes_timeout):
        try:  # a host may not support every timeout; the request's own deadline still holds
            setter(nanos)
        except Err:
            pass
    deadline = monotonic_clock.now() + nanos

    try:
        future = outgoing_handler.handle(outgoing, options)
    except Err as e:
        raise _code_error(e.value) from None
    with outgoing_body.write() as sink:
        try:
            for start in range(0, len(data), _WRITE_CHUNK):
                sink.blocking_write_and_flush(data[start : start + _WRITE_CHUNK])
        except Err as e:
            raise _stream_error(e) from None
    try:
        _types.OutgoingBody.finish(outgoing_body, None)
    except Err as e:
        raise _code_error(e.value) from None

    # Every resource is dropped before the one it came from (a parent dropped first traps).
    with future:
        while (result := future.get()) is None:
            _wait(future.subscribe(), deadline)
        if isinstance(result, Err):
            raise HttpError("internal-error", "the response was already taken")
        if isinstance(result.value, Err):
            raise _code_error(result.value.value)
        with result.value.value as response:
            with response.headers() as fields_in:
                headers_in = fields_in.entries()
            with response.consume() as incoming:
                with incoming.stream() as source:
                    data_in = _read(source, deadline, max_response_bytes)
            return Response(response.status(), headers_in, data_in)


def _read(source, deadline: int, limit: int) -> bytes:
    """Reads a body stream to its end, within the deadline and the size limit."""
    chunks, size = [], 0
    while True:
        try:
            chunk = source.read(_READ_CHUNK)
        except Err as e:
            if isinstance(e.value, streams.StreamError_Closed):
                return b"".join(chunks)
            raise _stream_error(e) from None
        if not chunk:
            _wait(source.subscribe(), deadline)
            continue
        size += len(chunk)
        if size > limit:
            raise HttpError("response-too-large", f"the body is larger than {limit} bytes")
        chunks.append(chunk)


def get(url: str, **options) -> Response:
    """`request("GET", url, ...)`."""
    return request("GET", url, **options)


def post(url: str, body: Union[bytes, str, None] = None, json=None, **options) -> Response:
    """`request("POST", url, ...)`; with `json=value`, the body is `value` as JSON and the
    content type `application/json` (unless `headers` names one)."""
    if json is not None:
        body = _json.dumps(json)
        headers = _pairs(options.pop("headers", None))
        if not any(k.lower() == "content-type" for k, _ in headers):
            headers.append(("content-type", "application/json"))
        options["headers"] = headers
    return request("POST", url, body=body, **options)
