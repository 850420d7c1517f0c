"""Span names' and attributes' building blocks: the GenAI conventions' attributes of agent and
plan spans, attribute values, and how a span records an error."""

from __future__ import annotations

from typing import Any

import anyio
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from hierplan.core.views import NodeView, RunView
from hierplan.redact import redact

INSTRUMENTATION_NAME = "hierplan"
CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
ANTHROPIC_SPANS_ENV = "ANTHROPIC_OPEN_TELEMETRY"

FAILED_STATUSES = frozenset({"failed", "partial", "rejected", "budget_exhausted"})
"""Node and run statuses that give a span the ERROR status."""

STATUS_TEXT_LIMIT = 1000


def attribute_value(value: Any) -> AttributeValue | None:
    """``value`` as an OpenTelemetry attribute, or ``None`` when it is not a scalar or a list
    of strings (those are content, recorded only on opt-in)."""
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return [str(v) for v in value]
    return None


def request_model(name: str) -> str:
    """The provider's model name of a ``provider:model`` name, as the conventions want it."""
    return name.partition(":")[2] or name


def names_model(node: NodeView) -> bool:
    """Whether ``node``'s agent span names a model: a step with a tool and its arguments runs
    without one."""
    work = node.work
    return work is None or not work.direct or node.record.kind == "planner"


def agent_base(run: RunView, kind: str, with_model: bool) -> dict[str, AttributeValue]:
    """What every agent span of ``kind`` in ``run`` starts with (the same for the whole run);
    ``with_model`` when the node calls a model (see :func:`names_model`)."""
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": kind,
        "hierplan.strategy": run.settings.strategy,
    }
    if with_model:
        model = run.planner_model if kind == "planner" else run.executor_model
        attributes["gen_ai.provider.name"] = model.provider
        attributes["gen_ai.request.model"] = request_model(model.name)
    if run.planner_model.simulated or run.executor_model.simulated:
        attributes["hierplan.simulated"] = True
    return attributes


def agent_attributes(node: NodeView, base: dict[str, AttributeValue]) -> dict[str, AttributeValue]:
    """The attributes an agent span of ``node`` starts with, from its run-wide ``base``."""
    attributes = node_identity(base, node)
    work = node.work
    if work is not None:
        attributes["hierplan.step.id"] = work.step_id
        if work.tool is not None:
            attributes["hierplan.step.tool"] = work.tool
    return attributes


def plan_attributes(node: NodeView, reason: str) -> dict[str, AttributeValue]:
    """The attributes of the ``plan`` span of ``node``'s planning round for ``reason``."""
    record = node.record
    base: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "plan",
        "openinference.span.kind": "CHAIN",
        "gen_ai.agent.name": record.kind,
    }
    attributes = node_identity(base, node)
    attributes["hierplan.plan.reason"] = reason
    attributes["hierplan.plan.version"] = len(record.plan_versions) + 1
    return attributes


def node_identity(base: dict[str, AttributeValue], node: NodeView) -> dict[str, AttributeValue]:
    """``base`` and the attributes naming ``node``, as agent and plan spans carry them."""
    record = node.record
    path = record.path
    return {
        **base,
        "gen_ai.agent.id": f"{node.run.run_id}:{path}",
        "hierplan.node.path": path,
        "hierplan.node.depth": record.depth,
    }


def set_all(span: Span, attributes: dict[str, AttributeValue]) -> None:
    """Set ``attributes`` on ``span``. A few go one by one: the SDK's ``set_attributes`` first
    checks the mapping itself, which costs about as much as three ``set_attribute`` calls."""
    if len(attributes) > 3:
        span.set_attributes(attributes)
        return
    for key, value in attributes.items():
        span.set_attribute(key, value)


def set_error(span: Span, exc: BaseException) -> None:
    """Record on ``span`` that ``exc`` ended it (see :func:`error_attributes`)."""
    attributes: dict[str, AttributeValue] = {}
    error_attributes(span, exc, attributes)
    set_all(span, attributes)


def error_attributes(span: Span, exc: BaseException, attributes: dict[str, AttributeValue]) -> None:
    """Add what ``exc`` ended ``span`` with to ``attributes`` (which the caller sets); mark the
    span failed unless it was cancelled."""
    if isinstance(exc, anyio.get_cancelled_exc_class()):
        attributes["hierplan.cancelled"] = True
        return
    attributes["error.type"] = type(exc).__qualname__
    set_failed(span, str(exc))


def set_failed(span: Span, message: str) -> None:
    """Give ``span`` the ERROR status with ``message``, redacted and cut short."""
    span.set_status(Status(StatusCode.ERROR, redact(message)[:STATUS_TEXT_LIMIT]))
