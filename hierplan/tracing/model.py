"""The model wrapper of :class:`~hierplan.tracing.otel.Tracing`: a ``chat`` CLIENT span and the
call metrics for every model call (every attempt), with the call's usage and cost."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from anyio import get_cancelled_exc_class
from opentelemetry import context, trace
from opentelemetry.trace import Span, SpanKind
from opentelemetry.util.types import AttributeValue

from hierplan.errors import ModelError
from hierplan.hierarchy.context import NodeContext
from hierplan.models.base import Model, ModelRequest, ModelResponse, Usage
from hierplan.models.tokens import failed_usage, usage_counted, worst_case
from hierplan.tracing.attributes import error_attributes, request_model
from hierplan.tracing.content import input_messages, output_messages

if TYPE_CHECKING:
    from hierplan.tracing.otel import Tracing

_log = logging.getLogger(__name__)


class TracedModel:
    """A model wrapped by :class:`Tracing`: one ``chat`` CLIENT span per call (per attempt)."""

    __slots__ = ("_metric_base", "_node", "_request_model", "_span_base", "_tracing", "inner")

    def __init__(self, inner: Model, tracing: Tracing, node: NodeContext) -> None:
        self.inner = inner
        self._tracing = tracing
        self._node = node
        self._request_model = request_model(inner.name)
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
            attributes.update(input_messages(request.messages, self._tracing.content))
        return attributes

    async def request(self, request: ModelRequest) -> ModelResponse:
        """Call the wrapped model inside a ``chat`` span; record usage, cost and metrics."""
        # The current context read once, as the scopes do (see SpanScope.__aenter__).
        current = context.get_current()
        span = self._tracing.tracer.start_span(
            f"chat {self._request_model}", current, SpanKind.CLIENT, self._start_attributes(request)
        )
        started = time.perf_counter()
        token = context.attach(trace.set_span_in_context(span, current))
        try:
            try:
                response = await self.inner.request(request)
            finally:
                context.detach(token)
        except BaseException as exc:
            usage, flag = self._failed_usage(request, exc, self._node.base_model)
            self._finish(span, request, started, usage, None, exc, flag=flag)
            raise
        self._finish(span, request, started, None, response.model, None, response)
        return response

    @staticmethod
    def _failed_usage(
        request: ModelRequest, exc: BaseException, model: Model
    ) -> tuple[Usage | None, str | None]:
        """What a call that raised ``exc`` counts for, as the record and the budget count it: a
        call cut short at its worst case on ``model`` (the provider may have billed it)."""
        if isinstance(exc, ModelError):
            return failed_usage(exc, request, model=model)
        if isinstance(exc, get_cancelled_exc_class()):
            return worst_case(request, model=model), "cut_short"
        return None, None

    def _finish(
        self,
        span: Span,
        request: ModelRequest,
        started: float,
        usage: Usage | None,
        response_model: str | None,
        error: BaseException | None,
        response: ModelResponse | None = None,
        *,
        flag: str | None = None,
    ) -> None:
        try:
            flags: list[str] = [] if flag is None else [flag]
            if response is not None:
                # Counted as the run record counts it once this wrapper has returned (a reply
                # without usage at its worst case, impossible usage as the nearest possible),
                # so that chat spans add up to the record's totals and the rollups.
                usage, flag = usage_counted(response, request, model=self._node.base_model)
                flags = list(response.flags)
                if flag is not None and flag not in flags:
                    flags.append(flag)
            attributes = self._record(span, request, started, usage, response_model, error)
            if response is not None:
                attributes["gen_ai.response.finish_reasons"] = [response.finish_reason]
            if flags:
                attributes["hierplan.flags"] = flags
            if response is not None and self._tracing.capture_content:
                attributes["gen_ai.output.messages"] = output_messages(
                    response, self._tracing.content
                )
            span.set_attributes(attributes)  # one call: the SDK locks and checks per call
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
        attributes: dict[str, AttributeValue] = {}
        metric_attributes = self._metric_base
        if response_model:
            # adapters report "provider:model"; the conventions want the provider's model name
            response_model = response_model.removeprefix(f"{self.inner.provider}:")
            attributes["gen_ai.response.model"] = response_model
            metric_attributes = {**metric_attributes, "gen_ai.response.model": response_model}
        if error is not None:
            error_attributes(span, error, attributes)
            metric_attributes = {**metric_attributes, "error.type": type(error).__qualname__}
        metrics = self._tracing.metrics
        metrics.record(metric_attributes, time.perf_counter() - started, usage)
        if usage is None:
            return attributes
        attributes["gen_ai.usage.input_tokens"] = usage.input_tokens
        attributes["gen_ai.usage.output_tokens"] = usage.output_tokens
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
        # The run record prices each attempt the same way, so chat spans add up to its totals.
        node = self._node
        cost = node.run.pricing.cost(self.inner.priced_as, usage)
        if cost is None:
            return attributes
        attributes["gen_ai.usage.cost"] = cost
        attributes["llm.cost.total"] = cost
        metrics.cost.add(
            cost,
            {
                "hierplan.node.depth": node.depth,
                "hierplan.phase": request.phase,
                "gen_ai.provider.name": self.inner.provider,
                "gen_ai.request.model": self._request_model,
            },
        )
        return attributes
