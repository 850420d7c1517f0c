"""What writing a run's record (``run.json``) and printing its summary cost next to the run
itself, and the record's JSON text against the standard library's encoder, in one process.

    .venv/bin/python benchmarks/record.py [--leaves 10000] [--repeats 5] [--no-out]

The record is that of one run of the ``benchmarks/overhead.py`` workload (a three-level tree,
budgets on) with zero-latency leaves. Each figure is the median over ``--repeats`` of the CPU
time per leaf of:

- ``run``: the run itself, for scale;
- ``to_dict``: the record as JSON-ready data (``RunResult.to_dict``);
- ``to_json``: the record's text (``RunResult.to_json``: the data and its encoding);
- ``json.dumps``: the same data encoded by ``json.dumps(data, indent=1)``, the baseline (with an
  indent, the standard library encodes in pure Python);
- ``write``: ``RunResult.write``, what ``hierplan run`` does at the end (the text, a temporary
  file, ``fsync`` and a rename);
- ``print``: what ``hierplan run`` prints then (``print_run``: the run tree, cost tables and
  summary), to a 120-column terminal console writing to ``/dev/null``.

The text of ``to_json`` and of ``json.dumps`` are checked to hold the same JSON.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console

sys.path.append(str(Path(__file__).resolve().parent))  # overhead, perfkit; last
import overhead
import perfkit

from hierplan import RunResult
from hierplan.view.tree import print_run


async def _run(leaves: int) -> tuple[RunResult, float]:
    started = time.process_time()
    result = await overhead.hierplan_result(leaves, 0.0)
    cpu = time.process_time() - started
    if overhead.count_leaves(result.tree) != leaves:
        raise RuntimeError(f"the run went wrong: not all {leaves} leaves completed")
    return result, cpu


def _cpu(work: Callable[[], object]) -> float:
    started = time.process_time()
    work()
    return time.process_time() - started


def measure(leaves: int, repeats: int) -> dict[str, Any]:
    """The median CPU µs per leaf of the run and of each way of writing its record."""
    anyio.run(_run, min(leaves, 50))  # warm-up: imports, caches
    result, run_cpu = anyio.run(_run, leaves)
    data = result.to_dict()
    if json.loads(result.to_json()) != json.loads(json.dumps(data, indent=1)):
        raise RuntimeError("to_json and json.dumps disagree")
    samples: dict[str, list[float]] = {
        "to_dict": [],
        "to_json": [],
        "json.dumps": [],
        "write": [],
        "print": [],
    }
    with tempfile.TemporaryDirectory() as where, open(os.devnull, "w") as sink:
        path = Path(where) / "run.json"
        screen = Console(file=sink, force_terminal=True, width=120)
        for _ in range(repeats):
            samples["to_dict"].append(_cpu(result.to_dict))
            samples["to_json"].append(_cpu(result.to_json))
            samples["json.dumps"].append(_cpu(lambda: json.dumps(data, indent=1)))
            samples["write"].append(_cpu(lambda: result.write(path)))
            samples["print"].append(_cpu(lambda: print_run(result, screen)))
        size = path.stat().st_size
    per_leaf = {name: perfkit.median(v) / leaves * 1e6 for name, v in samples.items()}
    return {
        "leaves": leaves,
        "repeats": repeats,
        "run_us_per_leaf": run_cpu / leaves * 1e6,
        "us_per_leaf": per_leaf,
        "bytes_per_leaf": size / leaves,
        "dumps_over_to_json": encoder_ratio(per_leaf),
        "samples_s": samples,
    }


def encoder_ratio(per_leaf: dict[str, float]) -> float | None:
    """``json.dumps`` of the data over ``to_json`` less ``to_dict``: the encoders alone
    (``None`` when the difference is below the clock's resolution, as at a few leaves)."""
    encoding = per_leaf["to_json"] - per_leaf["to_dict"]
    return per_leaf["json.dumps"] / encoding if encoding > 0 else None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure, print, write ``record.json``; returns the figures."""
    args = perfkit.leaves_parser(__doc__, 10_000, 5).parse_args(argv)
    details = perfkit.machine()
    perfkit.print_machine(details)
    data = {"machine": details, **measure(args.leaves, args.repeats)}
    per_leaf = data["us_per_leaf"]
    print(f"\n{args.leaves} leaves, {data['bytes_per_leaf']:,.0f} bytes of run.json a leaf")
    rows = [("run", data["run_us_per_leaf"]), *per_leaf.items()]
    print(perfkit.table(["CPU µs per leaf", ""], rows))
    ratio = data["dumps_over_to_json"]
    if ratio is not None:
        print(f"encoding alone: json.dumps / to_json = {ratio:.1f}")
    perfkit.write_results("record", data, args.out)
    return data


if __name__ == "__main__":
    main()
