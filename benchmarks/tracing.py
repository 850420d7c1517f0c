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
- ``sdk``: as ``sdk-traces`` plus an SDK meter provider (periodic reader, no-op exporter).

Target: the ``sdk`` overhead at most 60 µs per leaf.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

sys.path.insert(0, str(Path(__file__).resolve().parent))
import perfkit

import hierplan
from hierplan import FunctionModel, Instrument, ModelRequest, ModelResponse, RunSettings, Usage
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


async def _one(leaves: int, setup: Setup) -> float:
    instruments, close = setup()
    options = _options(leaves)
    gc.collect()
    started = time.perf_counter()
    result = await hierplan.run(instruments=instruments, **options)
    elapsed = time.perf_counter() - started
    close()  # after the clock: exporting happens off the run's path
    assert result.status == "succeeded", result.error
    completed = sum(1 for c in result.tree.children if c.status == "succeeded")
    assert completed == leaves, f"{completed} of {leaves} leaves completed"
    return elapsed


async def measure(leaves: int, repeats: int) -> dict[str, list[float]]:
    """Run every configuration ``repeats`` times, alternating; seconds per run."""
    times: dict[str, list[float]] = {name: [] for name in CONFIGS}
    for setup in CONFIGS.values():  # warm-up: imports, caches
        await _one(min(leaves, 50), setup)
    for _ in range(repeats):
        for name, setup in CONFIGS.items():
            times[name].append(await _one(leaves, setup))
    return times


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
    base = statistics.median(times["off"])
    summary: dict[str, Any] = {"leaves": args.leaves, "repeats": args.repeats}
    print(f"{args.leaves} leaves per run, median of {args.repeats} runs per configuration")
    print(f"{'config':<11} {'run ms':>9} {'µs/leaf':>9} {'overhead µs/leaf':>17} {'ratio':>7}")
    for name, values in times.items():
        median = statistics.median(values)
        per_leaf = median / args.leaves * 1e6
        overhead = (median - base) / args.leaves * 1e6
        ratio = median / base
        print(f"{name:<11} {median * 1e3:>9.1f} {per_leaf:>9.1f} {overhead:>17.1f} {ratio:>7.2f}")
        summary[name] = {
            "run_s": median,
            "per_leaf_us": per_leaf,
            "overhead_us_per_leaf": overhead,
            "ratio": ratio,
            "samples_s": values,
        }
    target = 60.0
    sdk = summary["sdk"]["overhead_us_per_leaf"]
    print(f"sdk overhead {sdk:.1f} µs per leaf (target ≤ {target:.0f} µs)")
    data = {
        "benchmark": "tracing",
        "command": "python benchmarks/tracing.py " + " ".join(argv or sys.argv[1:]),
        "machine": details,
        **summary,
    }
    perfkit.write_results("tracing", data, None if args.no_out else args.out)
    return data


if __name__ == "__main__":
    main()
