"""Tracing overhead per leaf: the OpenTelemetry SDK (batch processor, no-op exporter) against
tracing off, in one process, as a ratio.

    .venv/bin/python benchmarks/tracing.py [--leaves 1000] [--repeats 7] [--out benchmarks/results]

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

Each figure is given by wall time and by the process's CPU time (every thread, the batch
processor's included), which other programs on a shared machine do not inflate.

Target: the ``sdk`` overhead at most 60 µs per leaf.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
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

sys.path.append(str(Path(__file__).resolve().parent))  # perfkit; last, to shadow nothing
import perfkit

import hierplan
from hierplan import (
    FunctionModel,
    Instrument,
    ModelRequest,
    ModelResponse,
    RunSettings,
    ToolCall,
    Usage,
)
from hierplan.core.views import NodeView, RunView
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

    def run_scope(self, run: RunView) -> AbstractAsyncContextManager[None]:
        """The workflow span."""
        return ReplayScope(self.tracer, self.tree)

    def node_scope(self, node: NodeView) -> AbstractAsyncContextManager[None]:
        """The node's agent span."""
        return ReplayScope(self.tracer, self.shapes[("invoke_agent", node.path)])

    def planning_scope(self, node: NodeView, reason: str) -> AbstractAsyncContextManager[None]:
        """The node's plan span."""
        return ReplayScope(self.tracer, self.shapes[("plan", node.path)])

    def tool_scope(self, node: NodeView, call: ToolCall) -> AbstractAsyncContextManager[None]:
        """The node's tool span."""
        return ReplayScope(self.tracer, self.shapes[("execute_tool", node.path)])


def _replaying(tree: SpanShape) -> Setup:
    def setup() -> tuple[list[Instrument], Callable[[], None]]:
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(NoOpSpanExporter()))
        return [ReplayInstrument(provider.get_tracer("replay"), tree)], provider.shutdown

    return setup


async def _one(leaves: int, setup: Setup) -> tuple[float, float]:
    """One run: wall seconds and CPU seconds (all threads of this process, the span
    processor's included)."""
    instruments, close = setup()
    options = _options(leaves)
    gc.collect()
    started, cpu_started = time.perf_counter(), time.process_time()
    result = await hierplan.run(instruments=instruments, **options)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    close()  # after the clock: exporting happens off the run's path
    assert result.status == "succeeded", result.error
    completed = sum(1 for c in result.tree.children if c.status == "succeeded")
    assert completed == leaves, f"{completed} of {leaves} leaves completed"
    return elapsed, cpu


def _floor(tree: SpanShape) -> tuple[float, float]:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(NoOpSpanExporter()))
    tracer = provider.get_tracer("floor")
    gc.collect()
    started, cpu_started = time.perf_counter(), time.process_time()
    replay(tracer, tree)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    provider.shutdown()
    return elapsed, cpu


async def measure(leaves: int, repeats: int) -> dict[str, dict[str, list[float]]]:
    """Run every configuration ``repeats`` times, alternating; wall and CPU seconds per run."""
    tree = await capture(leaves)
    configs = {**CONFIGS, "sdk-replay": _replaying(tree)}
    times: dict[str, dict[str, list[float]]] = {
        name: {"wall": [], "cpu": []} for name in [*configs, "sdk-floor"]
    }
    for setup in CONFIGS.values():  # warm-up: imports, caches
        await _one(min(leaves, 50), setup)
    _floor(tree)
    for _ in range(repeats):
        for name, setup in configs.items():
            wall, cpu = await _one(leaves, setup)
            times[name]["wall"].append(wall)
            times[name]["cpu"].append(cpu)
        wall, cpu = _floor(tree)
        times["sdk-floor"]["wall"].append(wall)
        times["sdk-floor"]["cpu"].append(cpu)
    return times


def _summarise(
    name: str, values: dict[str, list[float]], base: float, base_cpu: float, leaves: int
) -> dict[str, Any]:
    median = statistics.median(values["wall"])
    cpu = statistics.median(values["cpu"])
    if name == "sdk-floor":  # not a run: all of its time is tracing
        added, cpu_added = median, cpu
    else:
        added, cpu_added = median - base, cpu - base_cpu
    return {
        "run_s": median,
        "per_leaf_us": median / leaves * 1e6,
        "overhead_us_per_leaf": added / leaves * 1e6,
        "ratio": (base + added) / base,
        "cpu_s": cpu,
        "cpu_overhead_us_per_leaf": cpu_added / leaves * 1e6,
        "cpu_ratio": (base_cpu + cpu_added) / base_cpu,
        "samples_s": values["wall"],
        "cpu_samples_s": values["cpu"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Print the table, and write ``tracing.json``; returns what it wrote."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--leaves", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=perfkit.RESULTS, help="tracing.json's folder")
    parser.add_argument("--no-out", action="store_true", help="write no JSON")
    args = parser.parse_args(argv)
    details = perfkit.machine()
    perfkit.print_machine(details)
    times = anyio.run(measure, args.leaves, args.repeats)
    base = statistics.median(times["off"]["wall"])
    base_cpu = statistics.median(times["off"]["cpu"])
    summary: dict[str, Any] = {"leaves": args.leaves, "repeats": args.repeats}
    rows = []
    for name, values in times.items():
        row = summary[name] = _summarise(name, values, base, base_cpu, args.leaves)
        rows.append(
            [
                name,
                row["run_s"] * 1e3,
                row["per_leaf_us"],
                row["overhead_us_per_leaf"],
                row["ratio"],
                row["cpu_overhead_us_per_leaf"],
                row["cpu_ratio"],
            ]
        )
    print(f"{args.leaves} leaves per run, median of {args.repeats} runs per configuration")
    headers = ["config", "run ms", "µs/leaf", "added µs/leaf", "ratio", "CPU added", "CPU ratio"]
    print(perfkit.table(headers, rows))
    _print_breakdown(summary)
    data = {
        "benchmark": "tracing",
        "command": "python benchmarks/tracing.py " + " ".join(argv or sys.argv[1:]),
        "machine": details,
        **summary,
    }
    perfkit.write_results("tracing", data, None if args.no_out else args.out)
    return data


def _print_breakdown(summary: dict[str, Any]) -> None:
    """The ``sdk`` overhead as SDK floor + hierplan's own part, by wall and by CPU time."""
    target = 60.0
    for clock, key in (("wall", "overhead_us_per_leaf"), ("CPU", "cpu_overhead_us_per_leaf")):
        sdk, floor, replayed = (summary[c][key] for c in ("sdk", "sdk-floor", "sdk-replay"))
        summary.setdefault("hierplan_us_per_leaf", {})[clock.lower()] = sdk - floor
        print(
            f"{clock}: sdk adds {sdk:.1f} µs per leaf (target ≤ {target:.0f} µs) = SDK floor "
            f"{floor:.1f} + hierplan {sdk - floor:.1f} (of which seam and SDK in a run "
            f"{replayed - floor:.1f}, Tracing's own work and the run events it listens to "
            f"{sdk - replayed:.1f})"
        )


if __name__ == "__main__":
    main()
