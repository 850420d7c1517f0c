"""Tracing overhead per leaf: the OpenTelemetry SDK (batch processor, no-op exporter) against
tracing off, in one process, as a ratio.

    .venv/bin/python benchmarks/tracing.py [--leaves 1000] [--repeats 7] [--clock wall|cpu]

The workload is one flat DAG plan of ``--leaves`` tool steps (a tool that returns at once), run
with the ``dag`` strategy on a function model: almost all of the time is per-leaf orchestration,
which is what tracing adds to. Configurations alternate run by run so that drift hits all alike;
each figure is the median over ``--repeats`` runs.

- ``off``: no instrument (the baseline);
- ``api``: :class:`Tracing` with no SDK installed (the API's no-op tracer and meter);
- ``sdk-traces``: SDK tracer provider, BatchSpanProcessor, no-op exporter; no-op meter;
- ``sdk``: as ``sdk-traces`` plus an SDK meter provider (periodic reader, no-op exporter);
- ``sdk-replay``: an instrument that emits the very spans of a traced run (the same names,
  kinds, attributes and nesting, captured from one traced run beforehand) through the same
  instrument seam, on the same tracer provider set-up, and does nothing else: no attributes
  to compute, no rollups, no run events, no metrics (and no ``chat`` span: the run has one);
- ``sdk-floor``: not a run: the SDK alone creating those spans (and the run's span events) in
  a bare loop. Its time per leaf is the least any instrumentation emitting these spans can
  add; ``sdk`` minus ``sdk-floor`` is hierplan's own part of the overhead, of which
  ``sdk-replay`` minus ``sdk-floor`` is the instrument seam's and what the SDK costs more in
  the middle of a run than in a tight loop.

``--clock cpu`` times the process's CPU time (every thread, the batch processor's included)
instead of the wall clock; on a shared machine it is less disturbed by other processes.

Target: the ``sdk`` overhead at most 60 µs per leaf.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, NamedTuple

import anyio
from opentelemetry import context, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.util.types import Attributes

import hierplan
from hierplan import (
    FunctionModel,
    Instrument,
    ModelRequest,
    ModelResponse,
    NodeContext,
    RunContext,
    RunSettings,
    ToolCall,
    Usage,
)
from hierplan.tracing.otel import Tracing


class NoOpSpanExporter(SpanExporter):
    """Takes spans and does nothing with them."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class NoOpMetricExporter(MetricExporter):
    """Takes metrics and does nothing with them."""

    def __init__(self) -> None:
        super().__init__(preferred_temporality={}, preferred_aggregation={})

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


def _plan(leaves: int) -> dict[str, Any]:
    steps = [
        {"id": f"s{i}", "title": f"step {i}", "instruction": "noop", "tool": "noop", "args": {}}
        for i in range(leaves)
    ]
    return {"goal": "many leaves", "steps": steps}


def _options(leaves: int) -> dict[str, Any]:
    plan = _plan(leaves)

    def answer(request: ModelRequest) -> ModelResponse:
        return ModelResponse(output=plan, usage=Usage(1000, 500))

    @hierplan.tool
    async def noop() -> str:
        """Returns at once."""
        return "ok"

    return {
        "goal": "many leaves",
        "strategy": "dag",
        "model": FunctionModel(answer, priced_as="openai:gpt-5-mini"),
        "tools": [noop],
        "settings": RunSettings(max_steps=leaves, concurrency=8, plan_concurrency=8),
    }


Setup = Callable[[], tuple[list[Instrument], Callable[[], None]]]


def _off() -> tuple[list[Instrument], Callable[[], None]]:
    return [], lambda: None


def _api() -> tuple[list[Instrument], Callable[[], None]]:
    return [Tracing()], lambda: None


def _sdk_traces() -> tuple[list[Instrument], Callable[[], None]]:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(NoOpSpanExporter()))
    return [Tracing(tracer_provider=provider)], provider.shutdown


def _sdk() -> tuple[list[Instrument], Callable[[], None]]:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(NoOpSpanExporter()))
    reader = PeriodicExportingMetricReader(NoOpMetricExporter(), export_interval_millis=60_000)
    meters = MeterProvider(metric_readers=[reader])

    def close() -> None:
        provider.shutdown()
        meters.shutdown()

    return [Tracing(tracer_provider=provider, meter_provider=meters)], close


CONFIGS: dict[str, Setup] = {"off": _off, "api": _api, "sdk-traces": _sdk_traces, "sdk": _sdk}
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


class SpanShape(NamedTuple):
    """One span of a traced run as the SDK received it, without ids and times."""

    name: str
    kind: SpanKind
    attributes: Attributes
    events: tuple[tuple[str, Attributes], ...]
    children: tuple[SpanShape, ...]


async def capture(leaves: int) -> SpanShape:
    """The span tree of one traced run of ``leaves`` leaves."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    await hierplan.run(instruments=[Tracing(tracer_provider=provider)], **_options(leaves))
    provider.shutdown()
    spans = exporter.get_finished_spans()
    below: dict[int | None, list[ReadableSpan]] = {}
    for span in sorted(spans, key=lambda s: s.start_time or 0):
        below.setdefault(span.parent.span_id if span.parent else None, []).append(span)

    def shape(span: ReadableSpan) -> SpanShape:
        assert span.context is not None
        return SpanShape(
            span.name,
            span.kind,
            dict(span.attributes or {}),
            tuple((e.name, dict(e.attributes or {})) for e in span.events),
            tuple(shape(c) for c in below.get(span.context.span_id, [])),
        )

    (root,) = below[None]
    return shape(root)


def replay(tracer: trace.Tracer, shape: SpanShape) -> None:
    """Create ``shape``'s span and its subtree with the SDK alone: the tracing floor."""
    span = tracer.start_span(shape.name, kind=shape.kind, attributes=shape.attributes)
    if shape.children:
        token = context.attach(trace.set_span_in_context(span))
        for child in shape.children:
            replay(tracer, child)
        context.detach(token)
    for name, attributes in shape.events:
        span.add_event(name, attributes)
    span.end()


class ReplayScope(AbstractAsyncContextManager[None]):
    """One captured span, started, made current and ended: nothing else."""

    __slots__ = ("_shape", "_span", "_token", "_tracer")

    def __init__(self, tracer: trace.Tracer, shape: SpanShape) -> None:
        self._tracer = tracer
        self._shape = shape

    async def __aenter__(self) -> None:
        shape = self._shape
        self._span = self._tracer.start_span(
            shape.name, kind=shape.kind, attributes=shape.attributes
        )
        self._token = context.attach(trace.set_span_in_context(self._span))

    async def __aexit__(self, *exc_info: object) -> None:
        context.detach(self._token)
        self._span.end()


class ReplayInstrument(Instrument):
    """Emits the captured spans of a run through the instrument seam, and nothing else."""

    def __init__(self, tracer: trace.Tracer, tree: SpanShape) -> None:
        self.tracer = tracer
        self.tree = tree
        self.shapes: dict[tuple[str, object], SpanShape] = {}  # by operation and node path
        stack = [tree]
        while stack:
            shape = stack.pop()
            stack.extend(shape.children)
            attributes = shape.attributes or {}
            operation = str(attributes.get("gen_ai.operation.name"))
            self.shapes[(operation, attributes.get("hierplan.node.path"))] = shape

    def run_scope(self, run: RunContext) -> AbstractAsyncContextManager[None]:
        """The workflow span."""
        return ReplayScope(self.tracer, self.tree)

    def node_scope(self, node: NodeContext) -> AbstractAsyncContextManager[None]:
        """The node's agent span."""
        return ReplayScope(self.tracer, self.shapes[("invoke_agent", node.path)])

    def planning_scope(self, node: NodeContext, reason: str) -> AbstractAsyncContextManager[None]:
        """The node's plan span."""
        return ReplayScope(self.tracer, self.shapes[("plan", node.path)])

    def tool_scope(self, node: NodeContext, call: ToolCall) -> AbstractAsyncContextManager[None]:
        """The node's tool span."""
        return ReplayScope(self.tracer, self.shapes[("execute_tool", node.path)])


def _replaying(tree: SpanShape) -> Setup:
    def setup() -> tuple[list[Instrument], Callable[[], None]]:
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(NoOpSpanExporter()))
        return [ReplayInstrument(provider.get_tracer("replay"), tree)], provider.shutdown

    return setup


async def _one(leaves: int, setup: Setup, clock: Callable[[], float]) -> float:
    instruments, close = setup()
    options = _options(leaves)
    gc.collect()
    started = clock()
    result = await hierplan.run(instruments=instruments, **options)
    elapsed = clock() - started
    close()  # after the clock: exporting happens off the run's path
    assert result.status == "succeeded", result.error
    assert len(result.tree.children) == leaves
    return elapsed


def _floor(tree: SpanShape, clock: Callable[[], float]) -> float:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(NoOpSpanExporter()))
    tracer = provider.get_tracer("floor")
    gc.collect()
    started = clock()
    replay(tracer, tree)
    elapsed = clock() - started
    provider.shutdown()
    return elapsed


async def measure(leaves: int, repeats: int, clock: str = "wall") -> dict[str, list[float]]:
    """Run every configuration ``repeats`` times, alternating; seconds per run."""
    tick = CLOCKS[clock]
    tree = await capture(leaves)
    configs = {**CONFIGS, "sdk-replay": _replaying(tree)}
    times: dict[str, list[float]] = {name: [] for name in [*configs, "sdk-floor"]}
    for setup in CONFIGS.values():  # warm-up: imports, caches
        await _one(min(leaves, 50), setup, tick)
    _floor(tree, tick)
    for _ in range(repeats):
        for name, setup in configs.items():
            times[name].append(await _one(leaves, setup, tick))
        times["sdk-floor"].append(_floor(tree, tick))
    return times


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Print the table and a JSON summary; return the summary."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--leaves", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    args = parser.parse_args(argv)
    times = anyio.run(measure, args.leaves, args.repeats, args.clock)
    base = statistics.median(times["off"])
    summary: dict[str, Any] = {"leaves": args.leaves, "repeats": args.repeats, "clock": args.clock}
    print(f"{args.leaves} leaves per run, median of {args.repeats} runs per configuration")
    print(f"{'config':<11} {'run ms':>9} {'µs/leaf':>9} {'overhead µs/leaf':>17} {'ratio':>7}")
    for name, values in times.items():
        median = statistics.median(values)
        per_leaf = median / args.leaves * 1e6
        if name == "sdk-floor":  # not a run: all of its time is tracing
            overhead, ratio = per_leaf, (median + base) / base
        else:
            overhead, ratio = (median - base) / args.leaves * 1e6, median / base
        print(f"{name:<11} {median * 1e3:>9.1f} {per_leaf:>9.1f} {overhead:>17.1f} {ratio:>7.2f}")
        summary[name] = {"run_s": median, "overhead_us_per_leaf": overhead, "ratio": ratio}
    target = 60.0
    sdk = summary["sdk"]["overhead_us_per_leaf"]
    floor = summary["sdk-floor"]["overhead_us_per_leaf"]
    replay = summary["sdk-replay"]["overhead_us_per_leaf"]
    summary["hierplan_us_per_leaf"] = sdk - floor
    print(
        f"sdk overhead {sdk:.1f} µs per leaf (target ≤ {target:.0f} µs) = SDK floor {floor:.1f}"
        f" + hierplan {sdk - floor:.1f} (of which seam and SDK in a run {replay - floor:.1f},"
        f" Tracing's own work and the run events it listens to {sdk - replay:.1f})"
    )
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
