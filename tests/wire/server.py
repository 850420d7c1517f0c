"""A local HTTP server speaking OpenAI's and Anthropic's wire formats, with injected faults.

``POST /v1/chat/completions`` answers as OpenAI does and ``POST /v1/messages`` as Anthropic does
(streamed when asked, as hierplan's adapter always asks). Either path accepts the key as
``Authorization: Bearer`` or ``x-api-key``. A :class:`Faults` plan decides, request by request,
whether to misbehave and how:

=============  ===============================================================================
rate_limit     429 with ``retry-after`` (and ``retry-after-ms``)
server_error   500
overloaded     529 ``overloaded_error`` (Anthropic) / 503 (OpenAI)
stream_error   an ``error`` event inside a 200 stream (Anthropic; 500 for OpenAI)
stream_timeout a ``timeout_error`` event inside a 200 stream (Anthropic; 500 for OpenAI)
quota          429 ``insufficient_quota``: the account's credit is used up (OpenAI)
too_large      429 "Request too large": one request exceeds the tokens-per-minute limit (OpenAI)
slow           nothing for ``slow_s`` seconds (past the client's timeout), then no answer
stall          half a stream, then nothing for ``slow_s`` seconds, then the connection closes
               (Anthropic; ``slow`` for OpenAI, whose replies are not streamed)
malformed      a 200 whose JSON (or one streamed event) does not parse
no_usage       a good reply without usage
truncated      the connection closes halfway through the body
bad_request    400 with the provider's message
unauthorized   401 whatever the key
html_error     a proxy's 502 HTML page (OpenAI) or 401 HTML page (Anthropic), many lines long
=============  ===============================================================================

``refused_fields`` names request fields the OpenAI path refuses with OpenAI's own 400, as its API
refuses ``max_tokens`` for reasoning models (``max_completion_tokens`` is then suggested).

Every request is logged as a :class:`Hit`. The server runs in its own threads, so it serves any
client: async tests, the CLI in a subprocess, benchmarks.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import socket
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import anthropic_wire, openai_wire
from .backends import Backend, Reply, WireError

FAULT_KINDS = (
    "rate_limit",
    "server_error",
    "overloaded",
    "slow",
    "malformed",
    "no_usage",
    "truncated",
)
"""The faults of a random plan: the ones the issue lists."""

NOT_FAILURES = frozenset({"no_usage"})
"""Faults after which the attempt still succeeds."""

STREAM_FAULTS: dict[str, tuple[int, str, str]] = {
    "stream_error": (529, "overloaded_error", "Overloaded"),
    "stream_timeout": (504, "timeout_error", "Request timed out"),
}
"""Errors sent inside a 200 stream (Anthropic), by fault."""


@dataclass(frozen=True)
class Hit:
    """One request: which API, the fault injected (if any) and the status sent."""

    provider: str
    fault: str | None
    status: int


class Faults:
    """Which request misbehaves: a script first, then a seeded random draw at ``rate``."""

    def __init__(self) -> None:
        self._script: list[str | None] = []
        self.rate = 0.0
        self.kinds: tuple[str, ...] = FAULT_KINDS
        self._rng = random.Random(0)
        self._lock = threading.Lock()

    def script(self, kinds: Iterable[str | None]) -> Faults:
        """The next requests get these faults (``None``: answer normally), in order."""
        with self._lock:
            self._script.extend(kinds)
        return self

    def random(self, rate: float, kinds: Sequence[str] = FAULT_KINDS, seed: int = 0) -> Faults:
        """After the script, each request misbehaves with probability ``rate``."""
        with self._lock:
            self.rate, self.kinds, self._rng = rate, tuple(kinds), random.Random(seed)
        return self

    def next(self) -> str | None:
        """The fault of the next request."""
        with self._lock:
            if self._script:
                return self._script.pop(0)
            if self.rate and self._rng.random() < self.rate:
                return self._rng.choice(self.kinds)
            return None


class WireServer:
    """The server on ``127.0.0.1`` (a free port); a context manager that starts and stops it.

    >>> with WireServer(ScriptBackend([Reply(text="hi")])) as server:  # doctest: +SKIP
    ...     base_url = server.openai_base_url
    """

    def __init__(
        self,
        backend: Backend,
        *,
        api_keys: Iterable[str] = ("test-key",),
        retry_after_s: float = 0.05,
        retry_after_ms: bool = True,
        slow_s: float = 1.0,
        refused_fields: Iterable[str] = (),
    ) -> None:
        self.backend = backend
        self.refused_fields = tuple(refused_fields)
        self.api_keys = frozenset(api_keys)
        self.retry_after_s = retry_after_s
        self.retry_after_ms = retry_after_ms
        self.slow_s = slow_s
        self.faults = Faults()
        self.hits: list[Hit] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._http = _HTTPServer(("127.0.0.1", 0), _Handler)
        self._http.wire = self
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (Anthropic's base URL)."""
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def openai_base_url(self) -> str:
        """The base URL an OpenAI client takes (with ``/v1``)."""
        return self.url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        """The base URL an Anthropic client takes."""
        return self.url

    def base_url(self, provider: str) -> str:
        """The base URL for ``provider`` (``openai`` or ``anthropic``)."""
        return self.openai_base_url if provider == "openai" else self.anthropic_base_url

    def start(self) -> WireServer:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._http.shutdown()
        self._http.server_close()

    def __enter__(self) -> WireServer:
        return self.start()

    def __exit__(self, kind: object, *exc: object) -> None:
        self.stop()
        if kind is None and self.errors:
            raise AssertionError(f"the wire server hit errors: {self.errors}")

    def count(self, fault: str | None = None) -> int:
        """Requests that got ``fault`` (all requests when ``None``)."""
        with self._lock:
            return sum(1 for h in self.hits if fault is None or h.fault == fault)

    def failures(self) -> int:
        """Requests whose fault made the attempt fail."""
        with self._lock:
            return sum(1 for h in self.hits if h.fault and h.fault not in NOT_FAILURES)

    def log(self, hit: Hit) -> None:
        with self._lock:
            self.hits.append(hit)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    wire: WireServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up on a slow reply resets its connection: expected, not news.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


_FORMATS: dict[str, tuple[str, Any]] = {
    "/v1/chat/completions": ("openai", openai_wire),
    "/v1/messages": ("anthropic", anthropic_wire),
}
_ERRORS = {
    "openai": {
        "rate_limit": (429, "rate_limit_exceeded", "Rate limit reached; try again later."),
        "server_error": (500, "server_error", "The server had an error processing your request."),
        "overloaded": (503, "server_error", "The engine is currently overloaded."),
        "stream_error": (500, "server_error", "The server had an error processing your request."),
        "quota": (429, "insufficient_quota", "You exceeded your current quota."),
        "too_large": (
            429,
            "tokens",
            "Request too large for gpt-5-mini in organization org-test on tokens per min (TPM): "
            "Limit 30000, Requested 45000. The input or output tokens must be reduced in order "
            "to run successfully.",
        ),
        "bad_request": (400, "invalid_request_error", "This model's maximum context is exceeded."),
        "unauthorized": (401, "invalid_api_key", "Incorrect API key provided."),
    },
    "anthropic": {
        "rate_limit": (429, "rate_limit_error", "Number of requests has exceeded your rate limit."),
        "server_error": (500, "api_error", "Internal server error"),
        "overloaded": (529, "overloaded_error", "Overloaded"),
        "bad_request": (400, "invalid_request_error", "prompt is too long: 250000 tokens"),
        "unauthorized": (401, "authentication_error", "invalid x-api-key"),
    },
}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes: without this, Nagle's algorithm and the
        # client's delayed ACK add about 40 ms to every reply.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        return  # quiet: tests read the hit log instead

    def do_POST(self) -> None:
        wire = self.server.wire
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        found = _FORMATS.get(self.path.split("?")[0])
        if found is None:
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        provider, fmt = found
        if not self._authorized(wire):
            kind = "authentication_error" if provider == "anthropic" else "invalid_api_key"
            wire.log(Hit(provider, None, 401))
            self._json(401, fmt.error(401, kind, "invalid or missing API key"))
            return
        refused = self._refused_field(provider, raw)
        if refused is not None:
            wire.log(Hit(provider, None, 400))
            self._json(400, refused)
            return
        fault = wire.faults.next()
        if fault in STREAM_FAULTS and provider == "openai":
            fault = "server_error"
        if fault == "stall" and provider == "openai":
            fault = "slow"
        try:
            call = fmt.parse(json.loads(raw))
        except WireError as exc:
            wire.log(Hit(provider, fault, exc.status))
            self._json(exc.status, fmt.error(exc.status, exc.kind, exc.message))
            return
        # Each request is logged before a byte of its answer leaves: a client that has its
        # answer finds the request in the log.
        error = None if fault in STREAM_FAULTS else _ERRORS[provider].get(str(fault))
        if error is not None:
            status, kind, message = error
            wire.log(Hit(provider, fault, status))
            self._json(status, fmt.error(status, kind, message), self._retry_headers(fault))
            return
        if fault == "html_error":
            status = 502 if provider == "openai" else 401
            wire.log(Hit(provider, fault, status))
            self._html(status)
            return
        if fault == "slow":
            wire.log(Hit(provider, fault, 200))
            # The client has given up by now; the provider it stands for may have billed the
            # request all the same, which is why the client counts it at its worst case.
            time.sleep(wire.slow_s)
            self._json(200, {"late": True})
            return
        try:
            # A broken reply needs no answer: the backend's answers are kept for the retry.
            broken = fault in ("malformed", "truncated", "stall", *STREAM_FAULTS)
            reply = Reply(text="(an answer that never arrives whole)") if broken else None
            reply = reply or wire.backend.answer(call)
        except Exception as exc:  # a backend bug or a used-up script: loud, and not retried
            wire.errors.append(f"{type(exc).__name__}: {exc}")
            wire.log(Hit(provider, fault, 400))
            self._json(400, fmt.error(400, "invalid_request_error", f"wire server: {exc}"))
            return
        wire.log(Hit(provider, fault, 200))
        usage = fault != "no_usage"
        if provider == "anthropic" and call.body.get("stream"):
            self._stream(anthropic_wire.events(reply, call, usage=usage), fault)
        elif provider == "anthropic":
            self._json(200, anthropic_wire.message(reply, call, usage=usage), fault=fault)
        elif call.body.get("stream"):
            # As the API: a stream reports its usage only when stream_options asks for it.
            asked = bool((call.body.get("stream_options") or {}).get("include_usage"))
            self._sse(openai_wire.chunks(reply, call, usage=usage and asked), fault)
        else:
            self._json(200, openai_wire.completion(reply, call, usage=usage), fault=fault)

    def _refused_field(self, provider: str, raw: bytes) -> dict[str, Any] | None:
        """OpenAI's error body for a request carrying a refused field, else ``None``."""
        body = json.loads(raw)
        field = next((f for f in self.server.wire.refused_fields if f in body), None)
        if provider != "openai" or field is None:
            return None
        other = "max_tokens" if field == "max_completion_tokens" else "max_completion_tokens"
        return {
            "error": {
                "message": f"Unsupported parameter: '{field}' is not supported with this model. "
                f"Use '{other}' instead.",
                "type": "invalid_request_error",
                "param": field,
                "code": "unsupported_parameter",
            }
        }

    def _authorized(self, wire: WireServer) -> bool:
        bearer = self.headers.get("authorization", "")
        key = bearer.removeprefix("Bearer ") if bearer.startswith("Bearer ") else None
        return (key or self.headers.get("x-api-key")) in wire.api_keys

    def _retry_headers(self, fault: str | None) -> dict[str, str]:
        wire = self.server.wire
        if fault != "rate_limit":
            return {}
        headers = {"retry-after": str(math.ceil(wire.retry_after_s))}
        if wire.retry_after_ms:
            headers["retry-after-ms"] = str(int(wire.retry_after_s * 1000))
        return headers

    def _json(
        self,
        status: int,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
        fault: str | None = None,
    ) -> None:
        data = json.dumps(body).encode()
        if fault == "malformed":
            data = data[: len(data) // 2]
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if fault == "truncated":
                self.wfile.write(data[: len(data) // 2])
                self._hang_up()
                return
            self.wfile.write(data)
        except OSError:
            self.close_connection = True  # the client gave up (a slow reply): nothing to do

    def _html(self, status: int) -> None:
        """A proxy's error page, as nginx sends one, padded past any sensible message."""
        title = f"{status} {'Bad Gateway' if status == 502 else 'Authorization Required'}"
        lines = [f"<html><head><title>{title}</title></head>", f"<body><h1>{title}</h1>"]
        lines += [f"<!-- padding {i} -->" for i in range(100)] + ["</body></html>", ""]
        data = "\r\n".join(lines).encode()
        self.send_response(status)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, events: list[tuple[str, str]], fault: str | None) -> None:
        if fault == "malformed":
            events = [*events[:2], ("content_block_start", "{not json"), *events[2:]]
        if fault in STREAM_FAULTS:
            error = STREAM_FAULTS[fault]
            events = [events[0], ("error", json.dumps(anthropic_wire.error(*error)))]
        cut = len(events) // 2 if fault in ("truncated", "stall") else len(events)
        try:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for name, data in events[:cut]:
                chunk = f"event: {name}\ndata: {data}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            if fault == "stall":
                self.wfile.flush()
                time.sleep(self.server.wire.slow_s)  # the client has given up by now
            if fault in ("truncated", "stall"):
                self.wfile.flush()
                self._hang_up()
                return
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True

    def _sse(self, chunks: list[str], fault: str | None) -> None:
        """OpenAI's stream: ``data:`` lines, then ``data: [DONE]``. ``malformed`` sends a
        chunk that does not parse; ``truncated`` hangs up after the first chunk, ``stall`` waits
        ``slow_s`` there first (before any text: a client may retry)."""
        if fault == "malformed":
            chunks = [chunks[0], "{not json", *chunks[1:]]
        broken = fault in ("truncated", "stall")
        cut = 1 if broken else len(chunks)
        try:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for data in [*chunks[:cut], *([] if broken else ["[DONE]"])]:
                line = f"data: {data}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            if fault == "stall":
                self.wfile.flush()
                time.sleep(self.server.wire.slow_s)  # the client has given up by now
            if broken:
                self.wfile.flush()
                self._hang_up()
                return
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True

    def _hang_up(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)
