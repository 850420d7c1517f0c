"""The model interface: one request type, one response type, one protocol.

Every model (simulated, scripted, or a real provider) implements :class:`Model`. Budgets and
tracing wrap a ``Model``; they never reach inside a provider.

The request and response types are slotted dataclasses rather than pydantic models because they
sit on the hot path of every leaf; they are validated at the edges (plan parsing, tool args).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

import anyio

from hierplan.errors import ModelError, ModelNotAvailableError
from hierplan.units import Usage

Role = Literal["system", "user", "assistant", "tool"]
Phase = Literal["planning", "execution"]


@dataclass(slots=True, frozen=True)
class ToolSpec:
    """A tool as a model sees it: a name, a description and a JSON schema for its arguments.

    ``tokens_estimate`` is the estimate of its size in a request, which
    :mod:`hierplan.models.tokens` works out on first use and keeps here: it lives and dies with
    the spec, where a cache beside it would keep every run's specs alive.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    tokens_estimate: int | None = field(default=None, init=False, repr=False, compare=False)


@dataclass(slots=True, frozen=True)
class ToolCall:
    """A model's request to call a tool."""

    id: str
    name: str
    arguments: Mapping[str, Any]


@dataclass(slots=True, frozen=True)
class Message:
    """One chat message. Tool results use role ``tool`` with the ``tool_call_id`` they answer."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


@dataclass(slots=True, frozen=True)
class OutputSchema:
    """Structured output wanted from the model: a name and a JSON schema (``tokens_estimate``
    as :class:`ToolSpec`'s)."""

    name: str
    schema: Mapping[str, Any]
    tokens_estimate: int | None = field(default=None, init=False, repr=False, compare=False)


@dataclass(slots=True, frozen=True)
class ModelRequest:
    """Everything a model needs for one call.

    ``phase`` tags the call as planning or execution for accounting; ``node_path`` and ``purpose``
    are metadata for records and traces, not sent to providers as prompt text.
    """

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    output_schema: OutputSchema | None = None
    max_tokens: int = 2048
    temperature: float | None = None
    phase: Phase = "execution"
    node_path: str = ""
    purpose: str = ""

    def with_max_tokens(self, max_tokens: int) -> ModelRequest:
        """Return a copy with a different ``max_tokens`` (budgets lower it to what fits)."""
        return replace(self, max_tokens=max_tokens)


@dataclass(slots=True)
class ModelResponse:
    """A model's answer: text, tool calls, or structured ``output``, with usage.

    ``usage`` is ``None`` when the provider did not report it; budgets then settle at the
    reserved worst case and flag the call.
    """

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    output: Any = None
    usage: Usage | None = None
    model: str = ""
    finish_reason: str = "stop"
    simulated: bool = False
    flags: list[str] = field(default_factory=list)


@runtime_checkable
class Model(Protocol):
    """The one interface every model implements.

    ``name`` is the model's full string (``sim``, ``openai:gpt-4.1-mini``), ``provider`` the
    provider part, ``priced_as`` the model whose price applies (a simulated model is priced as
    if it were a named real one), and ``simulated`` says whether answers come from an oracle.

    A model whose provider adds input of its own to a request (the Anthropic adapter: its
    tool-use system prompt) also has ``hidden_input_tokens(request) -> int``, which budgets
    add to their estimate of the request's input.

    A model that holds connections (the provider adapters) also has ``async aclose()``;
    :func:`hierplan.run` closes the models it resolved from strings when the run ends, in the
    run's event loop (see :func:`close_model`).
    """

    @property
    def name(self) -> str: ...

    @property
    def provider(self) -> str: ...

    @property
    def priced_as(self) -> str: ...

    @property
    def simulated(self) -> bool: ...

    async def request(self, request: ModelRequest) -> ModelResponse:
        """Send one request and return the response."""
        ...


class WrappedModel:
    """A model around another (``inner``) that passes on its identity: the four properties of
    :class:`Model` are the inner model's, so that a wrapper (retries, accounting) is priced,
    labelled and recorded as the model it wraps. Subclasses add ``request`` (and ``stream``)
    and set ``inner`` in their own ``__init__``: assigned there rather than through a
    ``super().__init__`` call, which, for the three wrappers of every node, costs a leaf 0.4 to
    0.9 % more instructions (benchmarks/instructions.py, repeated counts)."""

    __slots__ = ("inner",)

    inner: Model

    @property
    def name(self) -> str:
        """The wrapped model's name."""
        return self.inner.name

    @property
    def provider(self) -> str:
        """The wrapped model's provider."""
        return self.inner.provider

    @property
    def priced_as(self) -> str:
        """The wrapped model's price key."""
        return self.inner.priced_as

    @property
    def simulated(self) -> bool:
        """Whether the wrapped model is simulated."""
        return self.inner.simulated


StreamItem = str | ModelResponse
"""What a model's stream yields: text deltas as they are written, then one :class:`ModelResponse`
(the whole answer, with its usage) last."""


@runtime_checkable
class StreamingModel(Model, Protocol):
    """A model that can also stream its answer: ``stream(request)`` is an async generator of
    text deltas ending with the whole :class:`ModelResponse` (the same answer and usage
    :meth:`Model.request` gives). Closing the generator early cancels the call; whoever wraps
    the model (the budget's accounting) counts what was written by then."""

    def stream(self, request: ModelRequest) -> AsyncGenerator[StreamItem, None]:
        """Send one request; its text as it is written, then the response."""
        ...


def stream_of(model: Model, request: ModelRequest) -> AsyncGenerator[StreamItem, None]:
    """``model``'s stream of ``request``: its own when it streams, else its whole answer as one
    delta once :meth:`Model.request` returns. Close it (``contextlib.aclosing``) when done."""
    stream = getattr(model, "stream", None)
    if stream is not None:
        streamed: AsyncGenerator[StreamItem, None] = stream(request)
        return streamed
    return _whole(model, request)


async def _whole(model: Model, request: ModelRequest) -> AsyncGenerator[StreamItem, None]:
    response = await model.request(request)
    if response.text:
        yield response.text
    yield response


async def stream_retried(
    model: Model, request: ModelRequest, pause: Callable[[int, ModelError], float]
) -> AsyncGenerator[StreamItem, None]:
    """``model``'s stream of ``request`` (:func:`stream_of`), started again when it fails with a
    :class:`~hierplan.errors.ModelError` before its first text delta. ``pause(attempt, exc)``
    (``attempt`` is 1 for the first) says how long to wait before the next attempt, or raises
    to give up. An error after the first delta stands: the reader has acted on the text."""
    attempt = 0
    while True:
        attempt += 1
        written = False
        try:
            async with aclosing(stream_of(model, request)) as items:
                async for item in items:
                    written = written or isinstance(item, str)
                    yield item
            return
        except ModelError as exc:
            if written:
                raise
            delay = pause(attempt, exc)
        await anyio.sleep(delay)


async def close_model(model: object) -> None:
    """Close ``model`` if it has an ``aclose()`` (shielded, so a cancelled run still closes)."""
    close = getattr(model, "aclose", None)
    if close is not None:
        with anyio.CancelScope(shield=True):
            await close()


@dataclass(slots=True, frozen=True)
class ModelString:
    """A parsed model string: ``sim``, ``openai:<name>``, ``anthropic:<name>``, ``scripted``."""

    provider: str
    name: str

    def __str__(self) -> str:
        return self.provider if not self.name else f"{self.provider}:{self.name}"


KNOWN_PROVIDERS = ("sim", "openai", "anthropic")


def parse_model_string(value: str) -> ModelString:
    """Parse ``sim``, ``sim:<priced-as>``, ``openai:<model>`` or ``anthropic:<model>``.

    >>> parse_model_string("openai:gpt-4.1-mini")
    ModelString(provider='openai', name='gpt-4.1-mini')
    """
    text = value.strip()
    provider, _, name = text.partition(":")
    provider = provider.strip().lower()
    name = name.strip()
    if provider not in KNOWN_PROVIDERS:
        raise ModelNotAvailableError(
            f"unknown model {value!r}: use 'sim' (offline simulator), 'sim:<priced-as model>', "
            "'openai:<model>' or 'anthropic:<model>'"
        )
    if provider != "sim" and not name:
        raise ModelNotAvailableError(
            f"model {value!r} names no model: write it as '{provider}:<model name>'"
        )
    return ModelString(provider, name)


def system(text: str) -> Message:
    """A system message."""
    return Message("system", text)


def user(text: str) -> Message:
    """A user message."""
    return Message("user", text)
