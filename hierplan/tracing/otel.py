"""OpenTelemetry spans and metrics of a run, per the GenAI semantic conventions.

:class:`Tracing` is an :class:`~hierplan.hierarchy.context.Instrument`: it wraps each node's
model and opens a span around the run, each node, each planning round and each tool call. It
uses the OpenTelemetry API only; the caller may pass a tracer provider and a meter provider
(otherwise the globally registered ones are used, which do nothing until an SDK is set up).

The span tree of a hierarchical run::

    invoke_workflow hierplan                 INTERNAL  the run; rollups for the whole tree
    └── invoke_agent planner                 INTERNAL  a planner node (path 1); subtree rollups
        ├── plan planner                     INTERNAL  one planning round
        │   └── chat sim                     CLIENT    the planning model call: usage and cost
        └── invoke_agent planner             INTERNAL  a sub-planner (path 1.2)
            ├── plan planner
            │   └── chat sim
            └── invoke_agent executor        INTERNAL  a leaf (path 1.2.1)
                ├── chat sim                 CLIENT
                └── execute_tool copy_rows   INTERNAL

Cost sits on ``chat`` spans only (``gen_ai.usage.cost`` and ``llm.cost.total``, in USD), so a
backend that sums a trace's spans counts each call once. Agent, plan and workflow spans carry
rollups computed from the run record when they end: ``gen_ai.aggregated_usage.*`` (tokens and
cost of every call below) and ``hierplan.*`` (node path, depth, strategy, own and subtree cost,
planning and execution cost, budget).

Run events (gate decisions, replans with their diff, retries, budget events...) become span
events on the span of the node whose path they name; an event for a node whose span is not
open goes to its nearest open ancestor. Any event type is attached the same way, so new event
types show up without changes here. A run whose workflow span is not recorded (no SDK, or a
sampler that drops the trace) gets no event listener, so it builds no events for tracing.

Prompt and completion content is recorded only with ``capture_content=True`` (or the
conventional ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``); even then strings that
look like API keys are replaced by ``[REDACTED]``. Nothing from the environment, model options
or request headers is ever recorded.

The Anthropic SDK emits a ``chat`` span of its own for every request when it finds a tracer
provider. Under hierplan's ``chat`` span it would count the same tokens twice, so unless told
otherwise (``provider_spans=True``) :class:`Tracing` sets ``ANTHROPIC_OPEN_TELEMETRY=false``
when it is created, before the run builds its clients; a value the user set is left alone.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from importlib import metadata
from types import TracebackType
from typing import Any

import anyio
from opentelemetry import context, metrics, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from hierplan.agents.models.base import (
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    ToolCall,
    Usage,
)
from hierplan.errors import ModelError
from hierplan.hierarchy.context import Instrument, NodeContext, RunContext
from hierplan.hierarchy.events import RunEvent
from hierplan.hierarchy.record import NodeRecord

INSTRUMENTATION_NAME = "hierplan"

TOKEN_BUCKETS: tuple[int, ...] = (
    1,
    4,
    16,
    64,
    256,
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
    16777216,
    67108864,
)
"""Explicit bucket boundaries of ``gen_ai.client.token.usage`` (GenAI conventions)."""

DURATION_BUCKETS: tuple[float, ...] = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
"""Explicit bucket boundaries of ``gen_ai.client.operation.duration`` in seconds."""

COST_METRIC = "hierplan.client.cost"
"""The USD cost counter, by depth, phase, provider and model."""

CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
ANTHROPIC_SPANS_ENV = "ANTHROPIC_OPEN_TELEMETRY"

# Events that are already spans (or their ends): attaching them again would only add noise.
SPAN_LIKE_EVENTS = frozenset(
    {"run_started", "node_started", "node_finished", "model_called", "tool_called", "run_finished"}
)
_EVENT_BASE_FIELDS = frozenset({"type", "run_id", "path", "at"})
FAILED_STATUSES = frozenset({"failed", "partial", "rejected", "budget_exhausted"})
EVENT_TEXT_LIMIT = 2000
_log = logging.getLogger(__name__)

_SECRET = re.compile(
    r"(sk-[A-Za-z0-9_\-]{16,}"  # OpenAI and Anthropic keys
    r"|AKIA[0-9A-Z]{16}"  # AWS access key ids
    r"|(?i:bearer)\s+[A-Za-z0-9._\-]{16,}"
    r"|(?i:api[_-]?key|secret|password|token)[\"']?\s*[:=]\s*[\"']?[^\s\"',}]{8,})"
)


def redact(text: str) -> str:
    """``text`` with anything that looks like an API key or credential replaced."""
    return _SECRET.sub("[REDACTED]", text)


def _version() -> str:
    try:
        return metadata.version("hierplan")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(slots=True)
class _RunTrace:
    """What one run's spans share: the open node spans by path, the root record, and the
    attributes every agent span of a kind starts with (the same for the whole run)."""

    run: RunContext
    workflow: Span
    spans: dict[str, Span] = field(default_factory=dict)
    root: NodeRecord | None = None
    agent_bases: dict[tuple[str, bool], dict[str, AttributeValue]] = field(default_factory=dict)

    def agent_base(self, kind: str, names_model: bool) -> dict[str, AttributeValue]:
        """The run-wide attributes of ``kind``'s agent spans (see :func:`_agent_base`)."""
        key = (kind, names_model)
        base = self.agent_bases.get(key)
        if base is None:
            base = self.agent_bases[key] = _agent_base(self.run, kind, names_model)
        return base

    def span_for(self, path: str) -> Span:
        """The open span of ``path``, of its nearest open ancestor, or the workflow span."""
        while path:
            found = self.spans.get(path)
            if found is not None:
                return found
            path = path.rpartition(".")[0]
        return self.workflow


class Tracing(Instrument):
    """Trace runs with OpenTelemetry: spans, span events and metrics (see the module docs).

    >>> from opentelemetry.sdk.trace import TracerProvider
    >>> tracing = Tracing(tracer_provider=TracerProvider())
    >>> # await hierplan.run(scenario="data_migration", instruments=[tracing])

    ``capture_content`` records prompts, completions, goals and tool arguments (redacted,
    cut to ``content_limit`` characters); by default it follows
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``. One instance may trace many runs,
    also at the same time.
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        capture_content: bool | None = None,
        content_limit: int = 16_384,
        provider_spans: bool = False,
    ) -> None:
        version = _version()
        self.tracer = trace.get_tracer(
            INSTRUMENTATION_NAME, version, tracer_provider=tracer_provider
        )
        meter = metrics.get_meter(INSTRUMENTATION_NAME, version, meter_provider=meter_provider)
        self.capture_content = (
            _env_flag(CONTENT_ENV) if capture_content is None else capture_content
        )
        self.content_limit = content_limit
        self.token_usage = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=list(TOKEN_BUCKETS),
        )
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )
        self.cost = meter.create_counter(
            COST_METRIC, unit="USD", description="Cost of model calls in USD."
        )
        self.runs: dict[RunContext, _RunTrace] = {}
        if not provider_spans:
            os.environ.setdefault(ANTHROPIC_SPANS_ENV, "false")

    # -- the Instrument seam ---------------------------------------------------------------

    def wrap_model(self, model: Model, node: NodeContext) -> Model:
        """Wrap ``model`` so that every call is a ``chat`` span with usage, cost and metrics."""
        return TracedModel(model, self, node)

    def run_scope(self, run: RunContext) -> AbstractAsyncContextManager[None]:
        """The ``invoke_workflow hierplan`` span around the whole run."""
        return _RunScope(self, run)

    def node_scope(self, node: NodeContext) -> AbstractAsyncContextManager[None]:
        """The ``invoke_agent planner|executor`` span around one node."""
        return _NodeScope(self, node)

    def planning_scope(self, node: NodeContext, reason: str) -> AbstractAsyncContextManager[None]:
        """The ``plan <agent>`` span around one planning round."""
        return _PlanScope(self, node, reason)

    def tool_scope(self, node: NodeContext, call: ToolCall) -> AbstractAsyncContextManager[None]:
        """The ``execute_tool <tool>`` span around one tool call."""
        return _ToolScope(self, node, call)

    # -- events and content ----------------------------------------------------------------

    def attach_event(self, state: _RunTrace, event: RunEvent) -> None:
        """Add ``event`` to the span of the node it names (or its nearest open ancestor)."""
        attributes: dict[str, AttributeValue] = {"hierplan.node.path": event.path}
        for name, value in event:
            if name in _EVENT_BASE_FIELDS or value is None:
                continue
            converted = _attribute_value(value)
            if isinstance(converted, str):
                converted = redact(converted)[:EVENT_TEXT_LIMIT]
            if converted is not None:
                attributes[f"hierplan.{name}"] = converted
            elif self.capture_content:
                attributes[f"hierplan.{name}"] = self.content(_json(value))
        state.span_for(event.path).add_event(
            f"hierplan.{event.type}", attributes, timestamp=int(event.at * 1e9)
        )

    def content(self, text: str) -> str:
        """``text`` as recorded content: redacted and cut to ``content_limit``."""
        clean = redact(text)
        if len(clean) > self.content_limit:
            return clean[: self.content_limit] + "…[truncated]"
        return clean


def _listener(tracing: Tracing, state: _RunTrace) -> Callable[[RunEvent], None]:
    """The bus listener of one run: events to span events."""

    def listener(event: RunEvent) -> None:
        if event.type in SPAN_LIKE_EVENTS:
            return
        try:
            tracing.attach_event(state, event)
        except Exception:  # tracing must never break a run
            _log.exception("hierplan tracing: could not record event %s", event.type)

    return listener


class _SpanScope(AbstractAsyncContextManager[None]):
    """A span made current for the scope's duration. Subclasses say how it starts and ends.

    Small classes rather than ``@asynccontextmanager`` generators: these wrap every leaf, and a
    generator-based context manager costs several times more per use.
    """

    __slots__ = ("_span", "_token", "tracing")

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing

    def start(self) -> Span:
        """Start the span (when the scope is entered)."""
        raise NotImplementedError

    def finish(self, span: Span, exc: BaseException | None) -> None:
        """Add what is known at the end; ``exc`` is what ended the scope, if anything."""
        if exc is not None:
            _set_error(span, exc)

    async def __aenter__(self) -> None:
        self._span = self.start()
        self._token = context.attach(trace.set_span_in_context(self._span))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        context.detach(self._token)
        span = self._span
        try:
            if span.is_recording():
                self.finish(span, exc)
        except Exception:  # tracing must never break a run
            _log.exception("hierplan tracing: could not finish span %r", span)
        finally:
            span.end()


class _RunScope(_SpanScope):
    __slots__ = ("run", "state", "unsubscribe")

    def __init__(self, tracing: Tracing, run: RunContext) -> None:
        super().__init__(tracing)
        self.run = run

    def start(self) -> Span:
        run = self.run
        settings = run.settings
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "invoke_workflow",
            "gen_ai.workflow.name": "hierplan",
            "openinference.span.kind": "CHAIN",
            "hierplan.run_id": run.run_id,
            "hierplan.strategy": settings.strategy,
            "hierplan.max_depth": settings.max_depth,
            "hierplan.concurrency": settings.concurrency,
            "hierplan.seed": settings.seed,
            "hierplan.planner_model": run.planner_model.name,
            "hierplan.executor_model": run.executor_model.name,
            "hierplan.price_table": run.pricing.version,
        }
        if run.planner_model.simulated or run.executor_model.simulated:
            attributes["hierplan.simulated"] = True
        span = self.tracing.tracer.start_span(
            "invoke_workflow hierplan", kind=SpanKind.INTERNAL, attributes=attributes
        )
        self.state = _RunTrace(run, span)
        self.tracing.runs[run] = self.state
        # Span events of a trace that is not recorded (no SDK, or sampled out) go nowhere: no
        # listener then, so that the run does not build its events for nothing.
        self.unsubscribe = (
            run.bus.subscribe(_listener(self.tracing, self.state)) if span.is_recording() else None
        )
        return span

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.unsubscribe is not None:
            self.unsubscribe()
        del self.tracing.runs[self.run]
        await super().__aexit__(exc_type, exc, tb)

    def finish(self, span: Span, exc: BaseException | None) -> None:
        super().finish(span, exc)
        root = self.state.root
        if root is None:
            return
        span.set_attributes(_workflow_rollups(root, self.run))
        if self.tracing.capture_content:
            span.set_attribute("hierplan.goal", self.tracing.content(root.goal))
        if root.status in FAILED_STATUSES:
            _set_failed(span, root.error or root.status)


class _NodeScope(_SpanScope):
    __slots__ = ("node", "state")

    def __init__(self, tracing: Tracing, node: NodeContext) -> None:
        super().__init__(tracing)
        self.node = node

    def start(self) -> Span:
        node = self.node
        record = node.record
        tracing = self.tracing
        state = self.state = tracing.runs.get(node.run)
        attributes = _agent_attributes(node, state)
        if tracing.capture_content:
            attributes["hierplan.goal"] = tracing.content(record.goal)
        span = tracing.tracer.start_span(
            f"invoke_agent {record.kind}", kind=SpanKind.INTERNAL, attributes=attributes
        )
        if state is not None:
            state.spans[record.path] = span
            if node.parent is None:
                state.root = record
        return span

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.state is not None:
            self.state.spans.pop(self.node.record.path, None)
        await super().__aexit__(exc_type, exc, tb)

    def finish(self, span: Span, exc: BaseException | None) -> None:
        record = self.node.record
        status = record.status
        # One set_attributes call: the SDK takes its lock and checks every value per call.
        attributes = _node_rollups(record)
        if exc is not None:
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                status = "cancelled"
            else:
                # node_lifecycle marks the record failed only after this scope has closed
                status = "failed" if status == "running" else status
                attributes["error.type"] = type(exc).__qualname__
        attributes["hierplan.node.status"] = status
        if self.tracing.capture_content and record.output:
            attributes["hierplan.output"] = self.tracing.content(record.output)
        span.set_attributes(attributes)
        if status in FAILED_STATUSES:
            _set_failed(span, record.error or status)


class _PlanScope(_SpanScope):
    __slots__ = ("before", "node", "reason")

    def __init__(self, tracing: Tracing, node: NodeContext, reason: str) -> None:
        super().__init__(tracing)
        self.node = node
        self.reason = reason

    def start(self) -> Span:
        node = self.node
        record = node.record
        self.before = _call_totals(record, "planning")
        base: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "plan",
            "openinference.span.kind": "CHAIN",
            "gen_ai.agent.name": record.kind,
        }
        attributes = _identity(base, node.run.run_id, record.path, record.depth)
        attributes["hierplan.plan.reason"] = self.reason
        attributes["hierplan.plan.version"] = len(record.plan_versions) + 1
        return self.tracing.tracer.start_span(
            f"plan {record.kind}", kind=SpanKind.INTERNAL, attributes=attributes
        )

    def finish(self, span: Span, exc: BaseException | None) -> None:
        super().finish(span, exc)
        span.set_attributes(_delta_rollups(self.before, _call_totals(self.node.record, "planning")))


class _ToolScope(_SpanScope):
    __slots__ = ("call", "node")

    def __init__(self, tracing: Tracing, node: NodeContext, call: ToolCall) -> None:
        super().__init__(tracing)
        self.node = node
        self.call = call

    def start(self) -> Span:
        call = self.call
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id,
            "gen_ai.tool.type": "function",
            "hierplan.node.path": self.node.path,
        }
        if self.tracing.capture_content:
            attributes["gen_ai.tool.call.arguments"] = self.tracing.content(_json(call.arguments))
        return self.tracing.tracer.start_span(
            f"execute_tool {call.name}", kind=SpanKind.INTERNAL, attributes=attributes
        )


class TracedModel:
    """A model wrapped by :class:`Tracing`: one ``chat`` CLIENT span per call (per attempt)."""

    __slots__ = ("_metric_base", "_node", "_request_model", "_span_base", "_tracing", "inner")

    def __init__(self, inner: Model, tracing: Tracing, node: NodeContext) -> None:
        self.inner = inner
        self._tracing = tracing
        self._node = node
        self._request_model = _request_model(inner.name)
        # What every call of this node's model shares, built once per node.
        self._metric_base: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": inner.provider,
            "gen_ai.request.model": self._request_model,
        }
        self._span_base: dict[str, AttributeValue] = {
            **self._metric_base,
            "hierplan.node.path": node.path,
            "hierplan.priced_as": inner.priced_as,
        }
        if inner.simulated:
            self._span_base["hierplan.simulated"] = True

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

    def _start_attributes(self, request: ModelRequest) -> dict[str, AttributeValue]:
        attributes: dict[str, AttributeValue] = {
            **self._span_base,
            "gen_ai.request.max_tokens": request.max_tokens,
            "gen_ai.output.type": "json" if request.output_schema is not None else "text",
            "hierplan.phase": request.phase,
            "hierplan.purpose": request.purpose,
        }
        if request.temperature is not None:
            attributes["gen_ai.request.temperature"] = request.temperature
        if self._tracing.capture_content:
            attributes.update(_input_messages(request.messages, self._tracing.content))
        return attributes

    async def request(self, request: ModelRequest) -> ModelResponse:
        """Call the wrapped model inside a ``chat`` span; record usage, cost and metrics."""
        span = self._tracing.tracer.start_span(
            f"chat {self._request_model}",
            kind=SpanKind.CLIENT,
            attributes=self._start_attributes(request),
        )
        started = time.perf_counter()
        token = context.attach(trace.set_span_in_context(span))
        try:
            try:
                response = await self.inner.request(request)
            finally:
                context.detach(token)
        except BaseException as exc:
            usage = exc.usage if isinstance(exc, ModelError) else None
            self._finish(span, request, started, usage, None, exc)
            raise
        self._finish(span, request, started, response.usage, response.model, None, response)
        return response

    def _finish(
        self,
        span: Span,
        request: ModelRequest,
        started: float,
        usage: Usage | None,
        response_model: str | None,
        error: BaseException | None,
        response: ModelResponse | None = None,
    ) -> None:
        try:
            attributes = self._record(span, request, started, usage, response_model, error)
            if response is not None:
                attributes["gen_ai.response.finish_reasons"] = [response.finish_reason]
                if response.flags:
                    attributes["hierplan.flags"] = list(response.flags)
                if self._tracing.capture_content:
                    attributes["gen_ai.output.messages"] = _output_messages(
                        response, self._tracing.content
                    )
            span.set_attributes(attributes)
        except Exception:  # tracing must never break a run
            _log.exception("hierplan tracing: could not record a model call")
        finally:
            span.end()

    def _record(
        self,
        span: Span,
        request: ModelRequest,
        started: float,
        usage: Usage | None,
        response_model: str | None,
        error: BaseException | None,
    ) -> dict[str, AttributeValue]:
        """Record the call's metrics; return the attributes its span ends with."""
        tracing = self._tracing
        attributes: dict[str, AttributeValue] = {}
        metric_attributes = self._metric_base
        if response_model:
            # adapters report "provider:model"; the conventions want the provider's model name
            response_model = response_model.removeprefix(f"{self.inner.provider}:")
            attributes["gen_ai.response.model"] = response_model
            metric_attributes = {**metric_attributes, "gen_ai.response.model": response_model}
        if error is not None:
            _error_attributes(span, error, attributes)
            metric_attributes = {**metric_attributes, "error.type": type(error).__qualname__}
        tracing.duration.record(time.perf_counter() - started, metric_attributes)
        if usage is None:
            return attributes
        attributes["gen_ai.usage.input_tokens"] = usage.input_tokens
        attributes["gen_ai.usage.output_tokens"] = usage.output_tokens
        if usage.cached_input_tokens:
            attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cached_input_tokens
        if usage.reasoning_tokens:
            attributes["gen_ai.usage.reasoning.output_tokens"] = usage.reasoning_tokens
        for kind, tokens in (("input", usage.input_tokens), ("output", usage.output_tokens)):
            tracing.token_usage.record(tokens, {**metric_attributes, "gen_ai.token.type": kind})
        # The run record prices each attempt the same way, so chat spans add up to its totals.
        node = self._node
        cost = node.run.pricing.cost(self.inner.priced_as, usage)
        if cost is None:
            return attributes
        attributes["gen_ai.usage.cost"] = cost
        attributes["llm.cost.total"] = cost
        tracing.cost.add(
            cost,
            {
                "hierplan.node.depth": node.depth,
                "hierplan.phase": request.phase,
                "gen_ai.provider.name": self._metric_base["gen_ai.provider.name"],
                "gen_ai.request.model": self._request_model,
            },
        )
        return attributes


# -- attribute helpers ---------------------------------------------------------------------


def _agent_base(run: RunContext, kind: str, names_model: bool) -> dict[str, AttributeValue]:
    """What every agent span of ``kind`` in ``run`` starts with; ``names_model`` when the node
    calls a model."""
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": kind,
        "hierplan.strategy": run.settings.strategy,
    }
    if names_model:
        model = run.planner_model if kind == "planner" else run.executor_model
        attributes["gen_ai.provider.name"] = model.provider
        attributes["gen_ai.request.model"] = _request_model(model.name)
    if run.planner_model.simulated or run.executor_model.simulated:
        attributes["hierplan.simulated"] = True
    return attributes


def _agent_attributes(node: NodeContext, state: _RunTrace | None) -> dict[str, AttributeValue]:
    record = node.record
    kind = record.kind
    step = node.step
    # A step with a tool and its arguments runs without a model: no model to name.
    names_model = step is None or step.tool is None or step.args is None or kind == "planner"
    if state is None:
        base = _agent_base(node.run, kind, names_model)
    else:
        base = state.agent_base(kind, names_model)
    path = record.path
    attributes = _identity(base, node.run.run_id, path, record.depth)
    if step is not None:
        attributes["hierplan.step.id"] = step.id
        if step.tool is not None:
            attributes["hierplan.step.tool"] = step.tool
    return attributes


def _identity(
    base: dict[str, AttributeValue], run_id: str, path: str, depth: int
) -> dict[str, AttributeValue]:
    """``base`` and the attributes naming the node of an agent or plan span."""
    return {
        **base,
        "gen_ai.agent.id": f"{run_id}:{path}",
        "hierplan.node.path": path,
        "hierplan.node.depth": depth,
    }


def _request_model(name: str) -> str:
    """The provider's model name of a ``provider:model`` name, as the conventions want it."""
    return name.partition(":")[2] or name


@dataclass(slots=True)
class _Totals:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float = 0.0
    planning_cost_usd: float = 0.0
    execution_cost_usd: float = 0.0
    calls: int = 0
    unpriced_calls: int = 0
    nodes: int = 0

    def add(self, record: NodeRecord) -> None:
        self.nodes += 1
        usage = record.usage
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.cached_input_tokens += usage.cached_input_tokens
        self.reasoning_tokens += usage.reasoning_tokens
        self.cost_usd += record.cost_usd
        self.planning_cost_usd += record.planning_cost_usd
        self.execution_cost_usd += record.execution_cost_usd
        self.calls += len(record.calls)
        self.unpriced_calls += record.unpriced_calls

    def aggregated(self) -> dict[str, AttributeValue]:
        return {
            "gen_ai.aggregated_usage.input_tokens": self.input_tokens,
            "gen_ai.aggregated_usage.output_tokens": self.output_tokens,
            "gen_ai.aggregated_usage.cache_read.input_tokens": self.cached_input_tokens,
            "gen_ai.aggregated_usage.reasoning.output_tokens": self.reasoning_tokens,
            "gen_ai.aggregated_usage.cost": self.cost_usd,
            "hierplan.cost.subtree_usd": self.cost_usd,
            "hierplan.cost.planning_usd": self.planning_cost_usd,
            "hierplan.cost.execution_usd": self.execution_cost_usd,
            "hierplan.calls": self.calls,
            "hierplan.unpriced_calls": self.unpriced_calls,
        }


def _subtree_rollups(record: NodeRecord) -> dict[str, AttributeValue]:
    totals = _Totals()
    for node in record.walk():
        totals.add(node)
    return _rollups(record, totals)


def _rollups(record: NodeRecord, totals: _Totals) -> dict[str, AttributeValue]:
    """The rollups of ``record``'s span: ``totals`` of its subtree, children and budget."""
    attributes = totals.aggregated()
    if record.children:
        attributes["hierplan.children"] = len(record.children)
    for key, value in (record.budget or {}).items():
        converted = _attribute_value(value)
        if converted is not None:
            attributes[f"hierplan.budget.{key}"] = converted
    return attributes


def _node_rollups(record: NodeRecord) -> dict[str, AttributeValue]:
    """What an agent span ends with. A leaf that made no model call (a direct tool step) gets
    no usage rollups: all of them would be zero, and leaves are the hot path."""
    if record.calls or record.children:
        attributes = _subtree_rollups(record)
        attributes["hierplan.cost.node_usd"] = record.cost_usd
    else:
        attributes = {"hierplan.calls": 0}
        if record.budget:
            attributes.update(_subtree_rollups(record))
    if record.attempts > 1:
        attributes["hierplan.node.attempts"] = record.attempts
    if record.plan_versions:
        attributes["hierplan.plan.versions"] = len(record.plan_versions)
    return attributes


def _workflow_rollups(root: NodeRecord, run: RunContext) -> dict[str, AttributeValue]:
    totals = _Totals()
    levels: dict[int, _Totals] = {}
    for node in root.walk():  # one walk for the whole tree and every level
        totals.add(node)
        levels.setdefault(node.depth, _Totals()).add(node)
    attributes = _rollups(root, totals)
    # One list per figure, index i for depth i + 1: backends such as Phoenix read numeric key
    # segments ("hierplan.level.1.cost") as list indexes and would show them shifted.
    ordered = [levels[d] for d in sorted(levels)]
    attributes["hierplan.level.cost_usd"] = [t.cost_usd for t in ordered]
    attributes["hierplan.level.input_tokens"] = [t.input_tokens for t in ordered]
    attributes["hierplan.level.output_tokens"] = [t.output_tokens for t in ordered]
    attributes["hierplan.level.nodes"] = [t.nodes for t in ordered]
    attributes["hierplan.nodes"] = totals.nodes
    attributes["hierplan.node.status"] = root.status
    attributes["hierplan.peak_concurrent_leaves"] = run.peak_leaves
    return attributes


def _call_totals(record: NodeRecord, phase: str) -> tuple[int, int, float, int]:
    inp = out = calls = 0
    cost = 0.0
    for call in record.calls:
        if call.phase == phase:
            inp += call.usage.input_tokens
            out += call.usage.output_tokens
            cost += call.cost_usd or 0.0
            calls += 1
    return inp, out, cost, calls


def _delta_rollups(
    before: tuple[int, int, float, int], after: tuple[int, int, float, int]
) -> dict[str, AttributeValue]:
    return {
        "gen_ai.aggregated_usage.input_tokens": after[0] - before[0],
        "gen_ai.aggregated_usage.output_tokens": after[1] - before[1],
        "gen_ai.aggregated_usage.cost": after[2] - before[2],
        "hierplan.calls": after[3] - before[3],
    }


def _set_error(span: Span, exc: BaseException) -> None:
    attributes: dict[str, AttributeValue] = {}
    _error_attributes(span, exc, attributes)
    span.set_attributes(attributes)


def _error_attributes(
    span: Span, exc: BaseException, attributes: dict[str, AttributeValue]
) -> None:
    """Add what ``exc`` ended ``span`` with to ``attributes``; mark the span failed unless it
    was cancelled."""
    if isinstance(exc, anyio.get_cancelled_exc_class()):
        attributes["hierplan.cancelled"] = True
        return
    attributes["error.type"] = type(exc).__qualname__
    _set_failed(span, str(exc))


def _set_failed(span: Span, message: str) -> None:
    span.set_status(Status(StatusCode.ERROR, redact(message)[:1000]))


def _attribute_value(value: Any) -> AttributeValue | None:
    """``value`` as an OpenTelemetry attribute, or ``None`` when it is not a scalar or a list
    of strings (those are content, recorded only on opt-in)."""
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return [str(v) for v in value]
    return None


def _json(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False, sort_keys=True)


def _input_messages(
    messages: Sequence[Message], content: Callable[[str], str]
) -> dict[str, AttributeValue]:
    """``gen_ai.system_instructions`` and ``gen_ai.input.messages`` in the conventions' JSON."""
    system: list[dict[str, Any]] = []
    chat: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            system.append({"type": "text", "content": message.content})
            continue
        parts: list[dict[str, Any]] = []
        if message.role == "tool":
            parts.append(
                {
                    "type": "tool_call_response",
                    "id": message.tool_call_id,
                    "response": message.content,
                }
            )
        elif message.content:
            parts.append({"type": "text", "content": message.content})
        parts.extend(_tool_call_parts(message.tool_calls))
        chat.append({"role": message.role, "parts": parts})
    out: dict[str, AttributeValue] = {"gen_ai.input.messages": content(_json(chat))}
    if system:
        out["gen_ai.system_instructions"] = content(_json(system))
    return out


def _tool_call_parts(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    return [
        {"type": "tool_call", "id": c.id, "name": c.name, "arguments": dict(c.arguments)}
        for c in calls
    ]


def _output_messages(response: ModelResponse, content: Callable[[str], str]) -> str:
    parts: list[dict[str, Any]] = []
    text = response.text if response.output is None else _json(response.output)
    if text:
        parts.append({"type": "text", "content": text})
    parts.extend(_tool_call_parts(response.tool_calls))
    message = {"role": "assistant", "parts": parts, "finish_reason": response.finish_reason}
    return content(_json([message]))
