"""The model-call scope of :class:`~hierplan.tracing.otel.Tracing`: a ``chat`` CLIENT span and
the call metrics for every model call (every attempt), with the usage and cost its
:class:`~hierplan.core.calls.CallOutcome` counts."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from opentelemetry import context, trace
from opentelemetry.trace import Span, SpanKind
from opentelemetry.util.types import AttributeValue

from hierplan.core.calls import CallOutcome
from hierplan.core.instrument import CallScope
from hierplan.core.views import NodeView
from hierplan.models.base import ModelRequest
from hierplan.tracing.attributes import error_attributes, request_model
from hierplan.tracing.content import input_messages, output_messages
from hierplan.units import PICO_PER_USD

if TYPE_CHECKING:
    from hierplan.tracing.otel import Tracing

_log = logging.getLogger(__name__)


class TracedCall(CallScope):
    """One ``chat`` CLIENT span around one attempt of a model call, current while the call is
    out (a provider's own spans nest below it)."""

    __slots__ = ("_span", "_started", "_token", "node", "tracing")

    def __init__(self, tracing: Tracing, node: NodeView) -> None:
        self.tracing = tracing
        self.node = node
        self._span: Span | None = None
        self._token: object = None
        self._started = 0.0

    async def start(self, request: ModelRequest, estimate: int) -> ModelRequest:
        """Start the span (the current context read once, as the other scopes do)."""
        model = self.node.base_model
        current = context.get_current()
        span = self._span = self.tracing.tracer.start_span(
            f"chat {request_model(model.name)}",
            current,
            SpanKind.CLIENT,
            self._start_attributes(request),
        )
        self._started = time.perf_counter()
        self._token = context.attach(trace.set_span_in_context(span, current))
        return request

    def _start_attributes(self, request: ModelRequest) -> dict[str, AttributeValue]:
        model = self.node.base_model
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": model.provider,
            "gen_ai.request.model": request_model(model.name),
            "hierplan.node.path": self.node.path,
            "hierplan.priced_as": model.priced_as,
            "gen_ai.request.max_tokens": request.max_tokens,
            "gen_ai.output.type": "json" if request.output_schema is not None else "text",
            "hierplan.phase": request.phase,
            "hierplan.purpose": request.purpose,
        }
        if model.simulated:
            attributes["hierplan.simulated"] = True
        if request.temperature is not None:
            attributes["gen_ai.request.temperature"] = request.temperature
        if self.tracing.capture_content:
            attributes.update(input_messages(request.messages, self.tracing.content))
        return attributes

    async def end(self, outcome: CallOutcome) -> None:
        """End the span with what the outcome counts; record the call's metrics."""
        span = self._span
        if span is None:
            return
        context.detach(self._token)  # type: ignore[arg-type]
        try:
            span.set_attributes(self._end_attributes(span, outcome))
        except Exception:  # tracing must never break a run
            _log.exception("hierplan tracing: could not record a model call")
        finally:
            span.end()

    def _end_attributes(self, span: Span, outcome: CallOutcome) -> dict[str, AttributeValue]:
        model = self.node.base_model
        response = outcome.response
        metric_attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": model.provider,
            "gen_ai.request.model": request_model(model.name),
        }
        attributes: dict[str, AttributeValue] = {}
        if response is not None and response.model:
            # adapters report "provider:model"; the conventions want the provider's model name
            name = response.model.removeprefix(f"{model.provider}:")
            attributes["gen_ai.response.model"] = name
            metric_attributes["gen_ai.response.model"] = name
        error = outcome.error
        if error is not None:
            error_attributes(span, error, attributes)
            metric_attributes["error.type"] = type(error).__qualname__
        usage = outcome.usage
        self.tracing.metrics.record(metric_attributes, time.perf_counter() - self._started, usage)
        if response is not None:
            attributes["gen_ai.response.finish_reasons"] = [response.finish_reason]
        flags = [f for f in outcome.flags if f not in ("failed", "not_made")]
        if flags:
            attributes["hierplan.flags"] = flags
        if response is not None and self.tracing.capture_content:
            attributes["gen_ai.output.messages"] = output_messages(response, self.tracing.content)
        if usage is not None:
            attributes.update(_usage_attributes(outcome))
            self._cost(outcome, attributes)
        return attributes

    def _cost(self, outcome: CallOutcome, attributes: dict[str, AttributeValue]) -> None:
        """The call's cost (as the run record prices it, so chat spans add up to its totals)."""
        if outcome.cost_pico is None:
            return
        cost = outcome.cost_pico / PICO_PER_USD
        attributes["gen_ai.usage.cost"] = cost
        attributes["llm.cost.total"] = cost
        model = self.node.base_model
        self.tracing.metrics.cost.add(
            cost,
            {
                "hierplan.node.depth": self.node.depth,
                "hierplan.phase": outcome.request.phase,
                "gen_ai.provider.name": model.provider,
                "gen_ai.request.model": request_model(model.name),
            },
        )


def _usage_attributes(outcome: CallOutcome) -> dict[str, AttributeValue]:
    usage = outcome.usage
    assert usage is not None
    attributes: dict[str, AttributeValue] = {
        "gen_ai.usage.input_tokens": usage.input_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
    }
    if usage.cached_input_tokens:
        attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cached_input_tokens
    if usage.cache_write_tokens:
        attributes["gen_ai.usage.cache_creation.input_tokens"] = usage.cache_write_tokens
        if usage.cache_write_1h_tokens:
            # No GenAI convention splits writes by lifetime; the hour-long ones cost more.
            attributes["hierplan.usage.cache_creation_1h.input_tokens"] = (
                usage.cache_write_1h_tokens
            )
    if usage.reasoning_tokens:
        attributes["gen_ai.usage.reasoning.output_tokens"] = usage.reasoning_tokens
    return attributes
