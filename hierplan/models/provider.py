"""What the provider adapters share: names, API keys, timeouts, and provider errors as ModelError.

Each adapter makes exactly one attempt per :meth:`request` (the SDK's own retries are off): the
retry loop lives in :meth:`hierplan.hierarchy.context.NodeContext.call_model`, so that every
attempt passes through the budget and tracing wrappers and lands in the run record. What an
adapter must say about a failure is whether another attempt may succeed (``retryable``), how long
the provider asked to wait (``retry_after``) and what the failed attempt consumed (``usage``):

============================================  =========================================
HTTP 429, 408, 409, 5xx, 529 (overloaded)     retryable, ``Retry-After`` honoured
429 for a used-up quota or a request larger   not retried: waiting does not help
than the tokens-per-minute limit
timeouts, dropped connections, cut streams    retryable
malformed replies (bad JSON, bad tool args)   retryable
a reply cut at max_tokens, or stopped by a    not retried: the same request ends the
full context window                           same way (the message says what to change)
400, 404, 413, 422                            not retried: the provider's message
401, 403                                      :class:`ModelAuthError`: the run stops
============================================  =========================================
"""

from __future__ import annotations

import email.utils
import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar
from urllib.parse import urlsplit

from hierplan.errors import ModelAuthError, ModelError, ModelNotAvailableError
from hierplan.models.base import Message, ToolSpec
from hierplan.units import Usage

DEFAULT_TIMEOUT_S = 120.0
"""How long one attempt may wait for the reply (for a streamed reply: for the next event)."""

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


class _Closable(Protocol):
    @property
    def base_url(self) -> Any: ...

    async def close(self) -> None: ...


ClientT = TypeVar("ClientT", bound=_Closable)


class ProviderModel(Generic[ClientT]):
    """The part of a provider adapter that is the same for every provider.

    A subclass names its ``provider_name``, ``key_variable`` and ``base_url_variable``, calls
    :meth:`_setup` first in
    its ``__init__`` (names, the timeout and the API key, checked before any work), then builds
    its SDK client as ``_client`` from the key :meth:`_setup` returns.
    """

    provider_name: ClassVar[str]
    key_variable: ClassVar[str]
    base_url_variable: ClassVar[str]
    model_name: str
    timeout_s: float
    _client: ClientT

    def _setup(
        self, model_name: str, api_key: str | None, timeout_s: float, priced_as: str | None
    ) -> str:
        """Set the model's names and timeout; return the API key (or raise a clear error)."""
        self.model_name = model_name
        self._name = f"{self.provider_name}:{model_name}"
        self._priced_as = priced_as or self._name
        self.timeout_s = check_timeout(timeout_s, self._name)
        return require_key(api_key, self.key_variable, self._name)

    @property
    def name(self) -> str:
        """``<provider>:<model>``."""
        return self._name

    @property
    def provider(self) -> str:
        """The provider part of :attr:`name`."""
        return self.provider_name

    @property
    def priced_as(self) -> str:
        """The price-table entry this model is charged at."""
        return self._priced_as

    @property
    def simulated(self) -> bool:
        """Never: these are a real model's answers."""
        return False

    async def aclose(self) -> None:
        """Close the SDK client and its connections."""
        await self._client.close()

    def _connection_error(self, exc: BaseException, usage: Usage | None = None) -> ModelError:
        """:func:`connection_error` naming the URL the client tried (the SDK's own, which
        holds what ``base_url`` or the environment gave it) and, when no connection was made,
        what to check (a connection cut after the request went out says nothing of the URL)."""
        hint = (
            None
            if sent(exc)
            else f"check --base-url (or {self.base_url_variable}), that the server runs and the "
            f"network reaches it, and that {self.key_variable} holds that server's key"
        )
        return connection_error(self._name, exc, usage, url=str(self._client.base_url), hint=hint)


_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")


class ToolNames:
    """The names a request's tools go by on the wire, and back.

    Both APIs take tool names of letters, digits, ``_`` and ``-`` only (OpenAI up to 64
    characters, Anthropic 128) and refuse the whole request otherwise, while MCP tool names may
    hold dots and slashes (``calendar.read``). Other characters become ``_``; a name that then
    collides with another gets a number. Names the wire takes as they are stay as they are, and
    the same tools always map the same way, so a conversation's turns agree.

    >>> names = ToolNames(["calendar.read", "calendar_read"], limit=64)
    >>> names.wire("calendar.read"), names.local("calendar_read_2")
    ('calendar_read_2', 'calendar.read')
    """

    def __init__(self, names: Iterable[str], *, limit: int) -> None:
        self.limit = limit
        self._wire: dict[str, str] = {}
        self._local: dict[str, str] = {}
        ordered = list(dict.fromkeys(names))
        # Names already valid claim themselves first: renaming never takes a real tool's name.
        for name in sorted(ordered, key=lambda n: self._safe(n) != n):
            self.wire(name)

    @classmethod
    def of(cls, tools: Iterable[ToolSpec], messages: Iterable[Message], limit: int) -> ToolNames:
        """The names of a request: its tools, then tools its conversation called."""
        called = (call.name for m in messages for call in m.tool_calls)
        return cls([*(t.name for t in tools), *called], limit=limit)

    def _safe(self, name: str) -> str:
        return _UNSAFE_NAME.sub("_", name)[: self.limit] or "_"

    def wire(self, name: str) -> str:
        """The name ``name`` goes by on the wire."""
        found = self._wire.get(name)
        if found is not None:
            return found
        base = candidate = self._safe(name)
        number = 2
        while candidate in self._local:
            suffix = f"_{number}"
            candidate = base[: self.limit - len(suffix)] + suffix
            number += 1
        self._wire[name] = candidate
        self._local[candidate] = name
        return candidate

    def local(self, wire: str) -> str:
        """The tool a wire name stands for (a name no tool goes by is returned as it is)."""
        return self._local.get(wire, wire)


def require_key(given: str | None, variable: str, model: str) -> str:
    """The API key: ``given``, else the environment ``variable``; a clear error if neither.

    >>> require_key("sk-test", "OPENAI_API_KEY", "openai:gpt-5-mini")
    'sk-test'
    """
    key = given if given is not None else os.environ.get(variable)
    if not key or not key.strip():
        raise ModelNotAvailableError(
            f"{model} needs an API key: set {variable} (a local server that ignores keys "
            f"takes any value), or, from Python, pass api_key in model_options"
        )
    return key.strip()


def check_timeout(timeout_s: float, model: str) -> float:
    """``timeout_s`` as a positive float, or a clear error."""
    try:
        value = float(timeout_s)
    except (TypeError, ValueError):
        raise ModelNotAvailableError(
            f"{model}: timeout_s must be a number of seconds, not {timeout_s!r}"
        ) from None
    if not value > 0:
        raise ModelNotAvailableError(f"{model}: timeout_s must be more than 0 s, not {value:g}")
    return value


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """The wait a response asks for: ``retry-after-ms``, or ``retry-after`` in seconds or as
    an HTTP date. ``None`` when absent or unreadable.

    >>> retry_after({"retry-after": "2"}), retry_after({"retry-after-ms": "150"})
    (2.0, 0.15)
    """
    if not headers:
        return None
    lowered = {k.lower(): v for k, v in headers.items()}
    millis = lowered.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def body_message(body: Any) -> str | None:
    """The human-readable message in a provider's error body, when there is one: its
    ``message``, or the whole body when it is text (a server's plain-text or HTML error page,
    which the SDKs leave out of their own message)."""
    if isinstance(body, str):
        return body.strip() or None
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping) and isinstance(inner.get("message"), str):
            kind = inner.get("type")
            return f"{kind}: {inner['message']}" if isinstance(kind, str) else inner["message"]
        if isinstance(inner, str):
            return inner
    return None


def status_error(
    model: str,
    status: int,
    message: str,
    headers: Mapping[str, str] | None = None,
    *,
    usage: Usage | None = None,
    body: Any = None,
    url: str | None = None,
) -> ModelError:
    """The :class:`ModelError` for an HTTP error status, with the provider's message (``body``:
    the error body, which tells a used-up quota from a rate limit; ``url``: where the request
    went, named in a 404's message)."""
    text = f"{model}: HTTP {status}: {one_line(message)}"
    if status == 404 and url is not None:
        text = f"{text} ({not_found_hint(url)})"
    if status in (401, 403):
        return ModelAuthError(text)
    if quota_exhausted(body):
        return ModelError(
            f"{text} (the account's credit or spend limit is used up: add credit or use another "
            "key; not retried)",
            usage=usage,
        )
    if status == 429 and "request too large" in message.lower():
        # One request above the tokens-per-minute limit (OpenAI counts max_tokens in it) is
        # refused however long the wait: retrying only spends the retries' time.
        return ModelError(
            f"{text} (one request needs more than the account's tokens-per-minute limit, so "
            "waiting does not help: lower executor_max_tokens / planner_max_tokens, which count "
            "towards it, or raise the limit; not retried)",
            usage=usage,
        )
    return ModelError(
        text,
        retryable=status in RETRYABLE_STATUS or status >= 500,
        retry_after=retry_after(headers),
        usage=usage,
    )


ERROR_MESSAGE_LIMIT = 300
"""The most characters of a provider's error message an error repeats."""


def one_line(message: str, limit: int = ERROR_MESSAGE_LIMIT) -> str:
    """``message`` on one line, cut to ``limit`` characters: a proxy in front of a server
    answers errors with whole HTML pages, which would fill a console and break the CLI's
    one-line error.

    >>> one_line("<html>\\n<h1>502 Bad Gateway</h1>\\n</html>")
    '<html> <h1>502 Bad Gateway</h1> </html>'
    """
    flat = " ".join(message.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def not_found_hint(url: str) -> str:
    """What to check after a 404 from ``url``: the model name, or a base URL that lacks or
    repeats the ``/v1`` of the API's path (the most common wrong base URLs).

    >>> not_found_hint("http://localhost:8080/v1/v1/messages")[:44]
    'the request went to http://localhost:8080/v1'
    """
    path = urlsplit(url).path
    where = f"the request went to {url}"
    if "/v1/v1/" in path:
        return f"{where}: give the base URL without the /v1 that the client adds itself"
    if not path.startswith("/v1/") and "/v1/" not in path:
        return (
            f"{where}: if the server serves the API under /v1, as OpenAI-compatible servers "
            "do, end the base URL with /v1"
        )
    return f"{where}: check the model name and the base URL"


# The HTTP library's errors raised before a request is sent (by name: the two SDKs each bring
# their own copy of the library). Any other timeout or broken connection may come after the
# provider took the request, and billed it.
_BEFORE_SENDING = frozenset({"ConnectError", "ConnectTimeout", "PoolTimeout"})


def sent(exc: BaseException) -> bool:
    """Whether the request of a call that failed with ``exc`` (an SDK's timeout or connection
    error, or the HTTP library's own) may have reached the provider: not when connecting
    failed, or when no connection of the pool came free."""
    chain: BaseException | None = exc
    while chain is not None:
        if type(chain).__name__ in _BEFORE_SENDING:
            return False
        chain = chain.__cause__ or chain.__context__
    return True


def timeout_error(
    model: str, timeout_s: float, usage: Usage | None = None, *, after_sending: bool = True
) -> ModelError:
    """A retryable error for an attempt that waited ``timeout_s`` in vain (``usage``: what a
    streamed reply reported before it stopped, which makes it a stalled stream;
    ``after_sending``: whether the request may have reached the provider, whose bill the
    attempt then counts for at its worst case when no usage came back)."""
    waited = "no reply within" if usage is None else "the reply stream stopped for"
    return ModelError(
        f"{model}: {waited} {timeout_s:g} s (timeout_s); the attempt was abandoned",
        retryable=True,
        usage=usage,
        unknown_usage=usage is None and after_sending,
    )


def connection_error(
    model: str,
    exc: BaseException,
    usage: Usage | None = None,
    *,
    url: str | None = None,
    hint: str | None = None,
) -> ModelError:
    """A retryable error for a connection that failed or broke off (``usage``: what the
    provider reported before the break, if anything; without it, a connection lost after the
    request went out counts at the attempt's worst case). ``url`` is where the connection went
    and ``hint`` what to check, which the message shows when given."""
    cause = exc.__cause__ or exc.__context__ or exc
    detail = f"{type(cause).__name__}: {cause}".rstrip(": ")
    where = f" to {url}" if url else ""
    advice = f"; {hint}" if hint else ""
    return ModelError(
        f"{model}: connection failed{where} ({detail}){advice}",
        retryable=True,
        usage=usage,
        unknown_usage=usage is None and sent(exc),
    )


def malformed_error(model: str, what: str, usage: Usage | None = None) -> ModelError:
    """A retryable error for a reply that could not be read."""
    return ModelError(f"{model}: malformed reply: {what}", retryable=True, usage=usage)


def truncated_error(
    model: str, max_tokens: int, what: str, usage: Usage | None = None
) -> ModelError:
    """The error for a reply cut at ``max_tokens`` in the middle of ``what``. Not retryable:
    the same request would be cut at the same place, and every attempt is paid in full."""
    return ModelError(
        f"{model}: the reply was cut at max_tokens={max_tokens} in the middle of {what}; "
        "raise executor_max_tokens / planner_max_tokens (or the node's budget, if it lowered "
        "max_tokens to fit)",
        retryable=False,
        usage=usage,
    )


def context_full_error(model: str, usage: Usage | None) -> ModelError:
    """The error for a reply stopped because the conversation filled the model's context
    window. Not retryable, and unlike a reply cut at ``max_tokens``, not cured by a larger one:
    the input leaves too little room."""
    held = "" if usage is None else f" ({usage.input_tokens} input tokens)"
    return ModelError(
        f"{model}: the reply stopped when the conversation filled the model's context "
        f"window{held}; a larger max_tokens does not help: shorten the step's input (its "
        "instruction and tool results) or use a model with a larger context window",
        retryable=False,
        usage=usage,
    )


def quota_exhausted(body: Any) -> bool:
    """Whether an error body says the account's credit or spend limit is used up: an HTTP
    429 that waiting does not cure."""
    inner = body.get("error", body) if isinstance(body, Mapping) else None
    if not isinstance(inner, Mapping):
        return False
    codes = {inner.get("type"), inner.get("code")}
    return bool(codes & {"insufficient_quota", "billing_hard_limit_reached"})


class RepeatedKeyError(ValueError):
    """JSON text with a key given twice in one object. ``json.loads`` keeps the last value
    silently, so a plan step ``{"id": "a", ..., "id": "b"}`` or tool arguments
    ``{"path": "x", "path": "y"}`` would run as something other than what was written."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        names = ", ".join(map(repr, keys))
        super().__init__(f"{names} given more than once in one object: keep one")


def loads_json(text: str) -> Any:
    """``json.loads`` for text from outside (model replies, goal lines): nesting too deep for
    the parser (a model that loops on ``[`` until ``max_tokens`` writes exactly that), a
    number too long to convert and a key given twice in one object (a
    :class:`RepeatedKeyError`) are reported as the :class:`ValueError` that any other
    unreadable JSON raises (a :class:`json.JSONDecodeError` when the syntax is wrong)."""
    repeated: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(items)
        if len(out) < len(items):  # rare: only then look for which keys
            seen: set[str] = set()
            for key, _ in items:
                if key in seen and key not in repeated:
                    repeated.append(key)
                seen.add(key)
        return out

    try:
        data = json.loads(text, object_pairs_hook=pairs)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None
    except json.JSONDecodeError:
        raise
    except ValueError:  # Python's limit on the digits of an integer it converts
        raise ValueError("JSON holds a number with too many digits to read") from None
    if repeated:
        raise RepeatedKeyError(repeated)
    return data


def json_problem(exc: ValueError) -> str:
    """What :func:`loads_json` found wrong, in a few words."""
    return f"{exc.msg} at char {exc.pos}" if isinstance(exc, json.JSONDecodeError) else str(exc)


def tool_arguments(
    model: str,
    tool: str,
    raw: Any,
    usage: Usage | None,
    field: Literal["arguments", "input"] = "arguments",
    *,
    cut_at: int | None = None,
) -> dict[str, Any]:
    """A tool call's arguments as an object, or a :func:`malformed_error` saying what was
    wrong (``field``: what the provider calls them). ``raw`` is their JSON text, or already an
    object: some servers speaking a provider's format send the object itself. ``cut_at``: the
    ``max_tokens`` the reply was cut at, if it was; unreadable arguments are then a
    :func:`truncated_error` (not retried) rather than a malformed reply."""
    subject = f"the {field} of tool call {tool!r} {'are' if field == 'arguments' else 'is'}"
    if isinstance(raw, Mapping):
        return dict(raw)
    if not isinstance(raw, str):
        raise malformed_error(model, f"{subject} neither JSON text nor an object", usage)
    try:
        parsed = loads_json(raw)
    except ValueError as exc:  # JSONDecodeError is a ValueError
        if cut_at is not None:
            what = f"the {field} of tool call {tool!r}"
            raise truncated_error(model, cut_at, what, usage) from None
        raise malformed_error(model, f"{subject} not JSON ({json_problem(exc)})", usage) from None
    if not isinstance(parsed, dict):
        raise malformed_error(model, f"{subject} not an object", usage)
    return parsed
