"""Test doubles that ship with the package: strict scripted models and function models.

A :class:`ScriptedModel` answers from a fixed script and raises :class:`UnexpectedModelCall` on a
call past its end; ``assert_complete()`` checks every scripted answer was used. It never wraps
around, so a test cannot pass by accident on a recycled answer.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import anyio

from hierplan.errors import ModelError, UnexpectedModelCall
from hierplan.models.base import ModelRequest, ModelResponse, StreamItem, ToolCall
from hierplan.models.tokens import estimate_request_tokens, estimate_text_tokens
from hierplan.units import Usage


class Pause(Protocol):
    """A part of a :class:`StreamedText` that is not text: the model awaits its ``wait()``
    before it writes on (an ``anyio.Event`` pauses it until the event is set)."""

    async def wait(self) -> None:
        """Return when the model may write on."""
        ...


@dataclass(frozen=True, slots=True)
class StreamedText:
    """A scripted answer written in parts, for tests of what reads a stream: each ``str`` of
    ``parts`` is a delta, each other part a :class:`Pause`, such as an ``anyio.Event`` (the
    model is still writing until it is set); the deltas before a pause have been read when the
    model reaches it. Asked with ``request``, the whole text comes once every pause has passed.

    >>> StreamedText(("1. lookup(1)\n", "2. lookup(2)\n"))
    StreamedText(parts=('1. lookup(1)\\n', '2. lookup(2)\\n'))
    """

    parts: Sequence[str | Pause]

    @property
    def text(self) -> str:
        """The whole text."""
        return "".join(p for p in self.parts if isinstance(p, str))


ScriptItem = ModelResponse | StreamedText | BaseException | Callable[[ModelRequest], ModelResponse]
ResponseFunction = Callable[[ModelRequest], ModelResponse | Awaitable[ModelResponse]]
"""The function a :class:`FunctionModel` answers each request with (sync or async)."""


def estimated_usage(request: ModelRequest, response: ModelResponse) -> Usage:
    """Usage estimated from request and response text (for doubles that do not set it)."""
    out = response.text
    if response.output is not None:
        out += repr(response.output)
    for call in response.tool_calls:
        out += call.name + repr(dict(call.arguments))
    return Usage(estimate_request_tokens(request), max(1, estimate_text_tokens(out)))


@dataclass
class ScriptedModel:
    """A model that returns scripted responses in order.

    Each script item is a :class:`ModelResponse`, an exception to raise, or a function of the
    request. Responses without usage get an estimate unless ``report_usage`` is false. Calls are
    recorded in ``requests``.

    >>> model = ScriptedModel([ModelResponse(text="done")])
    """

    script: Iterable[ScriptItem]
    name: str = "scripted"
    priced_as: str = "scripted"
    latency_s: float = 0.0
    report_usage: bool = True
    requests: list[ModelRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._items: list[ScriptItem] = list(self.script)
        self._next = 0

    @property
    def provider(self) -> str:
        """Always ``scripted``."""
        return "scripted"

    @property
    def simulated(self) -> bool:
        """Scripted answers are not a real model's."""
        return True

    @property
    def remaining(self) -> int:
        """How many scripted items are left."""
        return len(self._items) - self._next

    async def request(self, request: ModelRequest) -> ModelResponse:
        """Return the next scripted response, or raise if the script is used up."""
        item = await self._take(request)
        if isinstance(item, StreamedText):
            for part in item.parts:
                if not isinstance(part, str):
                    await part.wait()
            item = ModelResponse(text=item.text)
        response = item(request) if callable(item) else item
        return _finish(response, request, self.name, self.report_usage)

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamItem, None]:
        """The next scripted response as a stream: a :class:`StreamedText` part by part, any
        other answer as one delta."""
        item = await self._take(request)
        if isinstance(item, StreamedText):
            for part in item.parts:
                if isinstance(part, str):
                    yield part
                else:
                    await part.wait()
            yield _finish(ModelResponse(text=item.text), request, self.name, self.report_usage)
            return
        response = item(request) if callable(item) else item
        response = _finish(response, request, self.name, self.report_usage)
        if response.text:
            yield response.text
        yield response

    async def _take(
        self, request: ModelRequest
    ) -> ModelResponse | StreamedText | Callable[[ModelRequest], ModelResponse]:
        """The next script item (raised, when it is an exception), after the latency."""
        self.requests.append(request)
        if self._next >= len(self._items):
            raise UnexpectedModelCall(
                f"ScriptedModel {self.name!r} received call {self._next + 1} but its script has "
                f"{len(self._items)} item(s); last request purpose={request.purpose!r} "
                f"node={request.node_path!r}"
            )
        item = self._items[self._next]
        self._next += 1
        if self.latency_s:
            await anyio.sleep(self.latency_s)
        if isinstance(item, BaseException):
            raise item
        return item

    def assert_complete(self) -> None:
        """Raise ``AssertionError`` unless every scripted item was used."""
        if self._next != len(self._items):
            raise AssertionError(
                f"ScriptedModel {self.name!r} used {self._next} of {len(self._items)} item(s)"
            )


@dataclass
class FunctionModel:
    """A model whose answers come from a function of the request (sync or async).

    The function gets every call a real model would. ``request.phase`` is ``planning`` for a
    planner's call, which wants a plan (answer with :func:`plan_response`), and ``execution``
    for an executor's or a ReAct loop's (answer with :func:`tool_response` or
    :func:`text_response`; the results of its tool calls so far are the messages of role
    ``tool`` in ``request.messages``). A :class:`ScriptedModel` gives its answers to calls in
    the order they come, which differs between strategies and between concurrent steps; a
    function answers each request by what it asks. Calls are priced as ``priced_as``, which
    the price table does not know: give the run ``price_in``/``price_out`` to use a USD budget.

    >>> import hierplan
    >>> from hierplan import Plan, Step
    >>> def answer(request: ModelRequest) -> ModelResponse:
    ...     if request.phase == "planning":
    ...         step = Step(id="greet", title="greet", instruction="say hi")
    ...         return plan_response(Plan(goal="greet", steps=[step]))
    ...     return text_response("hi")
    >>> hierplan.run_sync("greet", model=FunctionModel(answer), strategy="dag").answer
    'hi'
    """

    function: ResponseFunction
    name: str = "function"
    priced_as: str = "function"
    report_usage: bool = True
    calls: int = 0

    @property
    def provider(self) -> str:
        """Always ``function``."""
        return "function"

    @property
    def simulated(self) -> bool:
        """Function answers are not a real model's."""
        return True

    async def request(self, request: ModelRequest) -> ModelResponse:
        """Call the function and return its response."""
        self.calls += 1
        result = self.function(request)
        response = await result if inspect.isawaitable(result) else result
        return _finish(response, request, self.name, self.report_usage)


def _finish(
    response: ModelResponse, request: ModelRequest, name: str, report_usage: bool
) -> ModelResponse:
    # One chained test for the usual case: this runs for every call.
    if not (
        isinstance(response, ModelResponse)
        and type(response.text) is str
        and type(response.flags) is list
        and (
            (usage := response.usage) is None
            or (
                type(usage) is Usage
                and type(usage.input_tokens) is int
                and type(usage.output_tokens) is int
                and type(usage.cached_input_tokens) is int
                and type(usage.reasoning_tokens) is int
                and type(usage.cache_write_tokens) is int
                and type(usage.cache_write_1h_tokens) is int
            )
        )
    ):
        raise ModelError(f"model {name!r} answered with {_malformed(response)}")
    if usage is None and report_usage:
        response.usage = estimated_usage(request, response)
    if not response.model:
        response.model = name
    return response


def _malformed(response: object) -> str:
    """What is wrong with an answer of a user's function or script, and what to give instead:
    said here, rather than failing later far from the cause (a budget left unsettled)."""
    if not isinstance(response, ModelResponse):
        return (
            f"{type(response).__name__}, not a ModelResponse: return text_response(...), "
            "plan_response(...), tool_response(...) or a ModelResponse"
        )
    if type(response.text) is not str:
        return f"text {response.text!r}: a response's text is a str ('' for none)"
    if type(response.flags) is not list:
        return f"flags {response.flags!r}: a response's flags are a list of str ([] for none)"
    usage = response.usage
    if type(usage) is not Usage:
        return (
            f"usage {usage!r}: give Usage(input_tokens, output_tokens), or None to have it "
            "estimated"
        )
    counts = {f.name: getattr(usage, f.name) for f in fields(usage)}
    bad = ", ".join(f"{k}={v!r}" for k, v in counts.items() if type(v) is not int)
    return f"usage {bad}: token counts are whole numbers (int)"


def text_response(text: str) -> ModelResponse:
    """A scripted final answer."""
    return ModelResponse(text=text)


def plan_response(plan: Any) -> ModelResponse:
    """A scripted structured plan (a :class:`~hierplan.plans.plan.Plan` or a dict)."""
    data = plan.model_dump(mode="json", exclude_none=True) if hasattr(plan, "model_dump") else plan
    return ModelResponse(text=json.dumps(data), output=data)


def tool_response(*calls: tuple[str, dict[str, Any]], text: str = "") -> ModelResponse:
    """Scripted tool calls: ``tool_response(("add", {"a": 1, "b": 2}))``; ids are ``call_<n>``."""
    return ModelResponse(
        text=text,
        tool_calls=tuple(ToolCall(f"call_{i}", name, args) for i, (name, args) in enumerate(calls)),
    )
