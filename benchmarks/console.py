"""What listening to a run costs it: the CLI's progress display, and a listener that takes every
event and does nothing, against the same run with no listener, in one process.

    .venv/bin/python benchmarks/console.py [--leaves 2000] [--repeats 7] [--no-out]

The workload is that of ``benchmarks/overhead.py`` (a three-level hierplan tree of model-call
leaves, budgets on, tracing off, concurrency not limited) with zero-latency leaves, so that
almost all of a run's time is orchestration, which is what a listener adds to. Configurations:

- ``none``: no listener (the baseline, where no event is built at all);
- ``every-event``: a listener that takes every event and does nothing (what building and
  delivering the events costs);
- ``console``: the display of ``hierplan run`` (:class:`hierplan.view.console.RunConsole`), on a
  console that is a terminal writing to ``/dev/null``: the progress line and what it prints.

Configurations alternate run by run; each figure is the median over ``--repeats`` runs of the
process's CPU time per leaf (every thread: the progress line's refresh thread too), with the
CPU time each adds per leaf over ``none`` and the ratio to it.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console

sys.path.append(str(Path(__file__).resolve().parent))  # overhead, perfkit; last
import overhead
import perfkit

from hierplan.core.events import Listener, RunEvent
from hierplan.view.console import RunConsole

Setup = Callable[[], tuple[list[Listener], Callable[[], None]]]


def _none() -> tuple[list[Listener], Callable[[], None]]:
    return [], lambda: None


def _every_event() -> tuple[list[Listener], Callable[[], None]]:
    def listener(event: RunEvent) -> None:
        return None

    return [listener], lambda: None


def _console() -> tuple[list[Listener], Callable[[], None]]:
    sink = open(os.devnull, "w")  # noqa: SIM115 - closed by the returned function
    display = RunConsole(Console(file=sink, force_terminal=True, width=100), simulated=True)

    def close() -> None:
        display.stop()
        sink.close()

    return [display], close


CONFIGS: dict[str, Setup] = {"none": _none, "every-event": _every_event, "console": _console}


async def _one(leaves: int, setup: Setup) -> float:
    """CPU seconds of one run with the listeners ``setup`` makes."""
    listeners, close = setup()
    gc.collect()
    started = time.process_time()
    try:
        result = await overhead.hierplan_result(leaves, 0.0, listeners=listeners)
        cpu = time.process_time() - started
    finally:
        close()
    completed = overhead.count_leaves(result.tree)
    if completed != leaves:
        raise RuntimeError(f"the run went wrong: {completed} of {leaves} leaves completed")
    return cpu


async def measure(leaves: int, repeats: int) -> dict[str, Any]:
    """The median CPU µs per leaf of each configuration, and what each adds over ``none``."""
    for setup in CONFIGS.values():  # warm-up: imports, caches
        await _one(min(leaves, 50), setup)
    samples: dict[str, list[float]] = {name: [] for name in CONFIGS}
    for _ in range(repeats):
        for name, setup in CONFIGS.items():
            samples[name].append(await _one(leaves, setup) / leaves * 1e6)
    medians = {name: perfkit.median(values) for name, values in samples.items()}
    base = medians["none"]
    return {
        "leaves": leaves,
        "repeats": repeats,
        "cpu_us_per_leaf": medians,
        "added_us_per_leaf": {name: medians[name] - base for name in CONFIGS},
        "ratio": {name: medians[name] / base for name in CONFIGS},
        "samples_us_per_leaf": samples,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure, print, write ``console.json``; returns the figures."""
    args = perfkit.leaves_parser(__doc__, 2000, 7).parse_args(argv)
    details = perfkit.machine()
    perfkit.print_machine(details)
    data = {"machine": details, **anyio.run(measure, args.leaves, args.repeats)}
    print(f"\n{args.leaves} leaves, median of {args.repeats} runs per configuration, CPU time")
    rows = [
        (
            name,
            data["cpu_us_per_leaf"][name],
            data["added_us_per_leaf"][name],
            data["ratio"][name],
        )
        for name in CONFIGS
    ]
    print(perfkit.table(["listener", "µs/leaf", "added µs/leaf", "ratio"], rows))
    perfkit.write_results("console", data, args.out)
    return data


if __name__ == "__main__":
    main()
