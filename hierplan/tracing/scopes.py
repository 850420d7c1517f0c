"""The spans around a run, its nodes, planning rounds and tool calls: scopes that
:class:`~hierplan.tracing.otel.Tracing` hands to the run, and the run events they attach."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING

import anyio
from opentelemetry import context, trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    Link,
    Span,
    SpanContext,
    SpanKind,
    TraceFlags,
    format_span_id,
    format_trace_id,
)
from opentelemetry.util.types import AttributeValue

from hierplan.core.events import RunEvent
from hierplan.core.views import NodeView, RunView, SpanIds
from hierplan.errors import RunSkipped
from hierplan.models.base import ToolCall
from hierplan.records import NodeRecord
from hierplan.tracing.attributes import (
    FAILED_STATUSES,
    agent_attributes,
    agent_base,
    names_model,
    plan_attributes,
    request_model,
    set_all,
    set_error,
    set_failed,
)
from hierplan.tracing.content import to_json
from hierplan.tracing.rollups import (
    Tree,
    node_rollups,
    planning_rollups,
    tree_totals,
    workflow_rollups,
)

if TYPE_CHECKING:
    from hierplan.tracing.otel import Tracing

# Why the workflow span of a resumed run links to another span (a link attribute).
RESUMED_FROM_PAUSE = "resumed from pause"

# Events that are already spans (or their ends): attaching them again would only add noise.
SPAN_LIKE_EVENTS = frozenset(
    {"run_started", "node_started", "node_finished", "model_called", "tool_called", "run_finished"}
)

_log = logging.getLogger(__name__)


@dataclass(slots=True)
class RunTrace:
    """What one run's spans share: the open node spans by path, the root record and the totals
    of its tree (once the root's span has ended), and the attributes every agent span of a kind
    starts with (the same for the whole run)."""

    run: RunView
    workflow: Span
    spans: dict[str, Span] = field(default_factory=dict)
    root: NodeRecord | None = None
    tree: Tree | None = None
    agent_bases: dict[tuple[str, bool], dict[str, AttributeValue]] = field(default_factory=dict)

    def agent_base(self, kind: str, with_model: bool) -> dict[str, AttributeValue]:
        """The run-wide attributes of ``kind``'s agent spans, built once per run."""
        key = (kind, with_model)
        base = self.agent_bases.get(key)
        if base is None:
            base = self.agent_bases[key] = agent_base(self.run, kind, with_model)
        return base

    def span_for(self, path: str) -> Span:
        """The open span of ``path``, of its nearest open ancestor, or the workflow span."""
        while path:
            found = self.spans.get(path)
            if found is not None:
                return found
            path = path.rpartition(".")[0]
        return self.workflow


def _listener(tracing: Tracing, state: RunTrace) -> Callable[[RunEvent], None]:
    """The bus listener of one run: events to span events."""

    def listener(event: RunEvent) -> None:
        try:
            tracing.attach_event(state, event)
        except Exception:  # tracing must never break a run
            _log.exception("hierplan tracing: could not record event %s", event.type)

    return listener


class SpanScope(AbstractAsyncContextManager[None]):
    """A span made current for the scope's duration. Subclasses say how it starts and ends.

    Small classes rather than ``@asynccontextmanager`` generators: these wrap every leaf, and a
    generator-based context manager costs several times more per use. For the same reason
    subclasses set ``tracing`` in their own ``__init__`` rather than through ``super()``.
    """

    __slots__ = ("_span", "_token", "tracing")

    tracing: Tracing

    def start(self, parent: Context) -> Span:
        """Start the span (when the scope is entered) as a child of ``parent``, the current
        context."""
        raise NotImplementedError

    def close(self) -> None:
        """Forget the span (when the scope is left, before the span ends)."""

    def finish(self, span: Span, exc: BaseException | None) -> None:
        """Add what is known at the end to a recorded span; ``exc`` is what ended the scope."""
        if exc is not None:
            set_error(span, exc)

    async def __aenter__(self) -> None:
        # The current context, read once: the SDK would otherwise look it up again for the
        # parent span, for the sampler and for the new span's context (same result, more work).
        current = context.get_current()
        span = self._span = self.start(current)
        self._token = context.attach(trace.set_span_in_context(span, current))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        context.detach(self._token)
        span = self._span
        try:
            self.close()
            if span.is_recording():
                self.finish(span, exc)
        except Exception:  # tracing must never break a run
            _log.exception("hierplan tracing: could not finish span %r", span)
        finally:
            span.end()


class RunScope(SpanScope):
    """``invoke_workflow hierplan``: the run, with the rollups of the whole tree."""

    __slots__ = ("run", "state", "unsubscribe")

    def __init__(self, tracing: Tracing, run: RunView) -> None:
        self.tracing = tracing
        self.run = run

    def start(self, parent: Context) -> Span:
        """Start the workflow span and listen to the run's events."""
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
            "invoke_workflow hierplan",
            parent,
            SpanKind.INTERNAL,
            attributes,
            links=_paused_run(run),
        )
        ids = span.get_span_context()
        # Only a span that goes to the exporters is worth linking to; with several tracing
        # instruments, the first one's.
        if ids.trace_flags.sampled and run.workflow_span is None:
            run.workflow_span = SpanIds(
                trace_id=format_trace_id(ids.trace_id), span_id=format_span_id(ids.span_id)
            )
        self.state = RunTrace(run, span)
        self.tracing.runs[run] = self.state
        # Span events of a trace that is not recorded (no SDK, or sampled out) go nowhere: no
        # listener then, so that the run does not build its events for nothing.
        self.unsubscribe = (
            run.bus.subscribe(_listener(self.tracing, self.state), ignore=SPAN_LIKE_EVENTS)
            if span.is_recording()
            else None
        )
        return span

    def close(self) -> None:
        """Stop listening; forget the run."""
        if self.unsubscribe is not None:
            self.unsubscribe()
        del self.tracing.runs[self.run]

    def finish(self, span: Span, exc: BaseException | None) -> None:
        """The whole tree's rollups and the run's status."""
        super().finish(span, exc)
        root = self.state.root
        if root is not None:
            span.set_attributes(workflow_rollups(root, self.run, self.state.tree))
            if self.tracing.capture_content:
                span.set_attribute("hierplan.goal", self.tracing.content(root.goal))
        # The run's status says whether it failed; when the run raised, its root's is all
        # there is (the error is on the span already).
        outcome: str | None = self.run.status
        if outcome is not None:
            span.set_attribute("hierplan.run.status", outcome)
        elif root is not None:
            outcome = root.status
        if outcome in FAILED_STATUSES:
            set_failed(span, (root.error if root is not None else None) or str(outcome))


def _paused_run(run: RunView) -> list[Link] | None:
    """The link of a resumed run's workflow span to the paused run's, when that was traced."""
    resumed = run.resumed
    saved = None if resumed is None else resumed.workflow_span
    if saved is None:
        return None
    paused = SpanContext(
        int(saved.trace_id, 16),
        int(saved.span_id, 16),
        is_remote=True,  # read from the checkpoint, not started in this process
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return [Link(paused, {"hierplan.link.reason": RESUMED_FROM_PAUSE})]


class NodeScope(SpanScope):
    """``invoke_agent planner|executor``: one node, with the rollups of its subtree."""

    __slots__ = ("node", "state")

    def __init__(self, tracing: Tracing, node: NodeView) -> None:
        self.tracing = tracing
        self.node = node

    def start(self, parent: Context) -> Span:
        """Start the agent span; register it as the node's span for events."""
        node = self.node
        record = node.record
        tracing = self.tracing
        state = self.state = tracing.runs.get(node.run)
        kind = record.kind
        with_model = names_model(node)
        if state is None:
            base = agent_base(node.run, kind, with_model)
        else:
            base = state.agent_base(kind, with_model)
        attributes = agent_attributes(node, base)
        if tracing.capture_content:
            attributes["hierplan.goal"] = tracing.content(record.goal)
        # No model call yet: set now, a leaf that makes none (most leaves) ends with one
        # attribute to set instead of two. The end rollups set it again after any call, and the
        # SDK moves a key that is set again to the end, so the attributes keep their order.
        attributes["hierplan.calls"] = 0
        span = tracing.tracer.start_span(
            f"invoke_agent {kind}", parent, SpanKind.INTERNAL, attributes
        )
        if state is not None:
            state.spans[record.path] = span
            if node.parent is None:
                state.root = record
                state.tree = None
        return span

    def close(self) -> None:
        """Events of this node go to its parent's span from here on."""
        if self.state is not None:
            self.state.spans.pop(self.node.record.path, None)

    def finish(self, span: Span, exc: BaseException | None) -> None:
        """The subtree's rollups and the node's status."""
        node = self.node
        record = node.record
        status: str = record.status
        tree = None
        if node.parent is None and self.state is not None:
            # The whole tree's totals, for this span and the workflow span alike: every node
            # has finished once the root's scope closes, and records only change their status
            # after that, so the totals stay what they are now.
            tree = self.state.tree = tree_totals(record)
        attributes = node_rollups(record, tree)
        if record.calls and not names_model(node):
            # A tool step whose call was decided again by the executor's model names it too.
            model = node.run.executor_model
            attributes["gen_ai.provider.name"] = model.provider
            attributes["gen_ai.request.model"] = request_model(model.name)
        if exc is not None:
            status = _status_after(node, exc)
            if not isinstance(exc, anyio.get_cancelled_exc_class()):
                attributes["error.type"] = type(exc).__qualname__
        attributes["hierplan.node.status"] = status
        if self.tracing.capture_content and record.output:
            attributes["hierplan.output"] = self.tracing.content(record.output)
        set_all(span, attributes)
        if status in FAILED_STATUSES:
            set_failed(span, record.error or status)


def _status_after(node: NodeView, exc: BaseException) -> str:
    """The status ``exc`` leaves ``node``'s record with: node_lifecycle sets it only after this
    scope has closed, so it is worked out here the same way (a run that pauses cancels its
    nodes, which are then ``paused``, not ``cancelled``)."""
    run = node.run
    if isinstance(exc, anyio.get_cancelled_exc_class()):
        return "paused" if run.pausing else "cancelled"
    if isinstance(exc, RunSkipped):
        return "skipped"  # the run did not start (its budget could not be granted)
    if node.parent is None and run.cancel_requested:
        return "cancelled"  # the root failed after the run was cancelled
    status = node.record.status
    return "failed" if status == "running" else status


class PlanScope(SpanScope):
    """``plan <agent>``: one planning round, with the rollups of its model calls."""

    __slots__ = ("first_call", "node", "reason")

    def __init__(self, tracing: Tracing, node: NodeView, reason: str) -> None:
        self.tracing = tracing
        self.node = node
        self.reason = reason

    def start(self, parent: Context) -> Span:
        """Start the plan span."""
        node = self.node
        self.first_call = len(node.record.calls)
        return self.tracing.tracer.start_span(
            f"plan {node.record.kind}",
            parent,
            SpanKind.INTERNAL,
            plan_attributes(node, self.reason),
        )

    def finish(self, span: Span, exc: BaseException | None) -> None:
        """The round's planning calls."""
        super().finish(span, exc)
        span.set_attributes(planning_rollups(self.node.record, self.first_call))


class ToolScope(SpanScope):
    """``execute_tool <tool>``: one tool call."""

    __slots__ = ("call", "node")

    def __init__(self, tracing: Tracing, node: NodeView, call: ToolCall) -> None:
        self.tracing = tracing
        self.node = node
        self.call = call

    def start(self, parent: Context) -> Span:
        """Start the tool span."""
        call = self.call
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id,
            "gen_ai.tool.type": "function",
            "hierplan.node.path": self.node.record.path,
        }
        if self.tracing.capture_content:
            attributes["gen_ai.tool.call.arguments"] = self.tracing.content(to_json(call.arguments))
        return self.tracing.tracer.start_span(
            f"execute_tool {call.name}", parent, SpanKind.INTERNAL, attributes
        )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            await super().__aexit__(exc_type, exc, tb)
            return
        # A tool call that returned (nearly all of them, one per leaf): a tool span has nothing
        # to forget and nothing to add then, so it skips the general path's steps.
        context.detach(self._token)
        self._span.end()
