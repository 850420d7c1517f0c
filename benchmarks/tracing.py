"""Tracing overhead per leaf: the OpenTelemetry SDK (batch processor, no-op exporter) against
tracing off, in one process, as a ratio.

    .venv/bin/python benchmarks/tracing.py [--leaves 1000] [--repeats 7] [--out benchmarks/results]

The workload is one flat DAG plan of ``--leaves`` tool steps (a tool that returns at once), run
with the ``dag`` strategy on a function model: almost all of the time is per-leaf orchestration,
which is what tracing adds to. Configurations alternate run by run so that drift hits all alike;
each figure is the median over ``--repeats`` runs, by wall time and by the process's CPU time
(which other programs on a shared machine do not inflate).

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

sys.path.append(str(Path(__file__).resolve().parent))  # perfkit; last, to shadow nothing
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


async def measure(leaves: int, repeats: int) -> dict[str, dict[str, list[float]]]:
    """Run every configuration ``repeats`` times, alternating; wall and CPU seconds per run."""
    times: dict[str, dict[str, list[float]]] = {n: {"wall": [], "cpu": []} for n in CONFIGS}
    for setup in CONFIGS.values():  # warm-up: imports, caches
        await _one(min(leaves, 50), setup)
    for _ in range(repeats):
        for name, setup in CONFIGS.items():
            wall, cpu = await _one(leaves, setup)
            times[name]["wall"].append(wall)
            times[name]["cpu"].append(cpu)
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
    base = statistics.median(times["off"]["wall"])
    base_cpu = statistics.median(times["off"]["cpu"])
    summary: dict[str, Any] = {"leaves": args.leaves, "repeats": args.repeats}
    rows = []
    for name, values in times.items():
        median = statistics.median(values["wall"])
        cpu = statistics.median(values["cpu"])
        summary[name] = {
            "run_s": median,
            "per_leaf_us": median / args.leaves * 1e6,
            "overhead_us_per_leaf": (median - base) / args.leaves * 1e6,
            "ratio": median / base,
            "cpu_s": cpu,
            "cpu_overhead_us_per_leaf": (cpu - base_cpu) / args.leaves * 1e6,
            "cpu_ratio": cpu / base_cpu,
            "samples_s": values["wall"],
            "cpu_samples_s": values["cpu"],
        }
        row = summary[name]
        rows.append(
            [
                name,
                median * 1e3,
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
    target = 60.0
    sdk = summary["sdk"]
    print(
        f"sdk adds {sdk['overhead_us_per_leaf']:.1f} µs per leaf "
        f"({sdk['cpu_overhead_us_per_leaf']:.1f} µs of CPU; target ≤ {target:.0f} µs)"
    )
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
