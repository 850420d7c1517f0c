"""OpenTelemetry spans and metrics of a run, per the GenAI semantic conventions.

:class:`Tracing` is an :class:`~hierplan.core.instrument.Instrument`: it wraps each node's
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
planning and execution cost, budget). The workflow span also says how the run ended
(``hierplan.run.status``, as ``RunResult.status``); a resumed run's links to the paused run's
(with ``hierplan.link.reason``), whose ids the checkpoint keeps.

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

The pieces: :mod:`~hierplan.tracing.scopes` (the spans around the run, its nodes, planning
rounds and tool calls, and the run events on them), :mod:`~hierplan.tracing.model` (``chat``
spans), :mod:`~hierplan.tracing.attributes` (the conventions' attributes),
:mod:`~hierplan.tracing.rollups`, :mod:`~hierplan.tracing.metrics` and
:mod:`~hierplan.tracing.content` (recorded content and redaction).
"""

from __future__ import annotations

import os
from contextlib import AbstractAsyncContextManager
from importlib import metadata

from opentelemetry import metrics, trace
from opentelemetry.util.types import AttributeValue

from hierplan.core.events import RunEvent
from hierplan.core.instrument import CallScope, Instrument
from hierplan.core.views import NodeView, RunView
from hierplan.models.base import ModelRequest, ToolCall
from hierplan.redact import redact
from hierplan.tracing.attributes import (
    ANTHROPIC_SPANS_ENV,
    CONTENT_ENV,
    INSTRUMENTATION_NAME,
    attribute_value,
)
from hierplan.tracing.content import clip, to_json
from hierplan.tracing.metrics import COST_METRIC, DURATION_BUCKETS, TOKEN_BUCKETS, CallMetrics
from hierplan.tracing.model import TracedCall
from hierplan.tracing.scopes import NodeScope, PlanScope, RunScope, RunTrace, ToolScope

__all__ = [
    "COST_METRIC",
    "DURATION_BUCKETS",
    "TOKEN_BUCKETS",
    "TracedCall",
    "Tracing",
    "redact",
]

_EVENT_BASE_FIELDS = frozenset({"type", "run_id", "path", "at"})
EVENT_TEXT_LIMIT = 2000


def _version() -> str:
    try:
        return metadata.version("hierplan")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


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
        self.metrics = CallMetrics(
            metrics.get_meter(INSTRUMENTATION_NAME, version, meter_provider=meter_provider)
        )
        self.capture_content = (
            _env_flag(CONTENT_ENV) if capture_content is None else capture_content
        )
        self.content_limit = content_limit
        self.runs: dict[RunView, RunTrace] = {}
        if not provider_spans:
            os.environ.setdefault(ANTHROPIC_SPANS_ENV, "false")

    # -- the Instrument seam ---------------------------------------------------------------

    def call_scope(self, node: NodeView, request: ModelRequest) -> CallScope:
        """A ``chat`` span with usage, cost and metrics around every model call (attempt)."""
        return TracedCall(self, node)

    def run_scope(self, run: RunView) -> AbstractAsyncContextManager[None]:
        """The ``invoke_workflow hierplan`` span around the whole run."""
        return RunScope(self, run)

    def node_scope(self, node: NodeView) -> AbstractAsyncContextManager[None]:
        """The ``invoke_agent planner|executor`` span around one node."""
        return NodeScope(self, node)

    def planning_scope(self, node: NodeView, reason: str) -> AbstractAsyncContextManager[None]:
        """The ``plan <agent>`` span around one planning round."""
        return PlanScope(self, node, reason)

    def tool_scope(self, node: NodeView, call: ToolCall) -> AbstractAsyncContextManager[None]:
        """The ``execute_tool <tool>`` span around one tool call."""
        return ToolScope(self, node, call)

    # -- events and content ----------------------------------------------------------------

    def attach_event(self, state: RunTrace, event: RunEvent) -> None:
        """Add ``event`` to the span of the node it names (or its nearest open ancestor)."""
        attributes: dict[str, AttributeValue] = {"hierplan.node.path": event.path}
        for name, value in event:
            if name in _EVENT_BASE_FIELDS or value is None:
                continue
            converted = attribute_value(value)
            if isinstance(converted, str):
                converted = redact(converted)[:EVENT_TEXT_LIMIT]
            elif isinstance(converted, list):
                # Lists of text (the gate's problems, which quote plan arguments) are event
                # text too: redacted and cut like a string.
                converted = [redact(str(item))[:EVENT_TEXT_LIMIT] for item in converted]
            if converted is not None:
                attributes[f"hierplan.{name}"] = converted
            elif self.capture_content:
                attributes[f"hierplan.{name}"] = self.content(to_json(value))
        state.span_for(event.path).add_event(
            f"hierplan.{event.type}", attributes, timestamp=int(event.at * 1e9)
        )

    def content(self, text: str) -> str:
        """``text`` as recorded content: redacted and cut to ``content_limit``."""
        return clip(text, self.content_limit)
