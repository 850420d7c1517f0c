"""Orchestration overhead per leaf: hierplan.run on N zero-latency leaves next to a bare anyio
task group fanning out the same N model calls.

    python benchmarks/profile_leaves.py [--n 1000 10000] [--repeats 3] [--no-budget] [--no-gc]
                                        [--rss 100000] [--profile] [--gc-stats]

The run is a three-level tree (the root plans sub-goals, each plans sub-goals, each plans 50
leaf steps) so that no plan exceeds the default 50 steps; every leaf is one executor step with
one model call that answers at once. With a budget (the default) the ledger is active: every
node opens an account and every call reserves and settles. The bare side spawns one task per
leaf in one task group and makes the same model call.

Figures are microseconds per leaf, CPU time of this process (``time.process_time``) and wall
time, best of ``--repeats``, and the ratio hierplan / bare measured in the same process,
alternating the two sides. ``--rss N`` runs hierplan once at N leaves in a fresh process and
reports its peak RSS. ``--profile`` prints the top of a cProfile of one run at the first N.
``--no-gc`` switches the cyclic garbage collector off (to separate its cost, which grows with
the number of live objects, from the per-leaf work). ``--gc-stats`` times the collector's
passes during one run of each side at each N (``gc.callbacks``): collections per generation,
their time per leaf, and the CPU time per leaf without them, so that what grows with N can
be told apart: the collector's full passes over every live object, or the run's own work.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import pstats
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import anyio

import hierplan
from hierplan.core.settings import RunSettings
from hierplan.models.base import Message, ModelRequest, ModelResponse
from hierplan.models.scripted import FunctionModel
from hierplan.pricing import Price, PriceTable
from hierplan.units import Usage

PRICING = PriceTable({"bench:model": Price(1.0, 4.0)})
LEAVES_PER_PLAN = 50
STEP = (Message("system", "You execute one step."), Message("user", "STEP: do it"))


def shape(n: int) -> tuple[int, int, int]:
    """Fan-outs (root, middle, leaves per plan) whose product is ``n``."""
    root = max(1, n // (LEAVES_PER_PLAN * LEAVES_PER_PLAN))
    middle = n // (root * LEAVES_PER_PLAN)
    if root * middle * LEAVES_PER_PLAN != n:
        raise SystemExit(f"N={n} is not a tree of plans of {LEAVES_PER_PLAN} leaves: use e.g. 1000")
    return root, middle, LEAVES_PER_PLAN


def tree_model(n: int) -> FunctionModel:
    """Plans by depth (from the asking node's path); every executor call answers "done"."""
    root, middle, leaves = shape(n)
    fan = {1: (root, "subgoal"), 2: (middle, "subgoal"), 3: (leaves, "task")}
    plans: dict[int, dict[str, Any]] = {}
    for depth, (count, kind) in fan.items():
        steps = [
            {"id": f"s{i}", "title": f"step {i}", "instruction": f"Do part {i}", "kind": kind}
            for i in range(count)
        ]
        plans[depth] = {"goal": f"level {depth}", "steps": steps}

    def respond(request: ModelRequest) -> ModelResponse:
        if request.phase == "execution":
            return ModelResponse(text="done", usage=Usage(60, 5))
        depth = request.node_path.count(".") + 1
        return ModelResponse(text="plan", output=plans[depth], usage=Usage(500, 100))

    return FunctionModel(respond, priced_as="bench:model")


async def hierplan_side(n: int, budget: bool) -> tuple[float, float]:
    """CPU and wall seconds per leaf of one run."""
    settings = RunSettings(
        strategy="hierarchical", max_depth=3, concurrency=n, plan_concurrency=50, max_retries=0
    )
    options: dict[str, Any] = {"budget": {"tokens": 10**12, "usd": 10.0**6}} if budget else {}
    model = tree_model(n)
    if gc.isenabled():
        gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    result = await hierplan.run(
        hierplan.RunSpec(goal="A tree", model=model, settings=settings, pricing=PRICING), **options
    )
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    leaves = sum(1 for node in result.nodes() if node.kind == "executor")
    if result.status != "succeeded" or leaves != n or (result.budget is not None) != budget:
        raise RuntimeError(f"the run went wrong: {result.status} {result.error} ({leaves} leaves)")
    return cpu / n, wall / n


async def bare_side(n: int) -> tuple[float, float]:
    """CPU and wall seconds per leaf of a bare task group making the same calls."""
    model = tree_model(n)

    async def leaf(i: int) -> None:
        request = ModelRequest(
            messages=STEP, max_tokens=1024, phase="execution", node_path=f"1.{i}"
        )
        await model.request(request)

    if gc.isenabled():
        gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(leaf, i)
    return (time.process_time() - cpu) / n, (time.perf_counter() - wall) / n


def peak_rss_mib(n: int, budget: bool) -> float:
    """Peak RSS of a fresh process that runs hierplan once at ``n`` leaves."""
    args = [sys.executable, __file__, "--rss-child", str(n)] + ([] if budget else ["--no-budget"])
    out = subprocess.run(args, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


class GcTimer:
    """Times the cyclic garbage collector's passes, per generation, while installed."""

    def __init__(self) -> None:
        self.passes: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            self.passes[info["generation"]].append(time.process_time() - self._started)

    def run(self, side: Any, *args: Any) -> tuple[float, float]:
        """``anyio.run(side, *args)`` with only its own collections timed: the garbage of
        earlier runs is collected first, and the side's own ``gc.collect()`` is skipped."""
        gc.collect()
        gc.callbacks.append(self)
        try:
            with _no_explicit_collect():
                result: tuple[float, float] = anyio.run(side, *args)
                return result
        finally:
            gc.callbacks.remove(self)


@contextlib.contextmanager
def _no_explicit_collect() -> Iterator[None]:
    collect = gc.collect
    gc.collect = lambda *args: 0
    try:
        yield
    finally:
        gc.collect = collect


def gc_stats(sizes: list[int], budget: bool) -> list[dict[str, Any]]:
    """Per N and side: CPU µs per leaf, the collector's share of it by generation, the rest."""
    anyio.run(hierplan_side, min(sizes), budget)  # warm-up: imports, caches
    rows: list[dict[str, Any]] = []
    print("collector passes during one run; us per leaf (CPU)")
    head = ("N", "side", "cpu", "gc", "gen0", "gen1", "gen2", "full passes", "cpu - gc")
    print(" ".join(f"{h:>11}" for h in head))
    for n in sizes:
        for name, side, args in (
            ("hierplan", hierplan_side, (n, budget)),
            ("bare", bare_side, (n,)),
        ):
            timer = GcTimer()
            cpu, _ = timer.run(side, *args)
            per_gen = [sum(timer.passes[g]) / n * 1e6 for g in (0, 1, 2)]
            row: dict[str, Any] = {"n": n, "side": name, "cpu_us": cpu * 1e6, "gc_us": sum(per_gen),
                   "gen_us": per_gen, "passes": [len(timer.passes[g]) for g in (0, 1, 2)],
                   "full_passes": len(timer.passes[2])}  # fmt: skip
            rows.append(row)
            cells = (row["cpu_us"], row["gc_us"], *per_gen)
            line = f"{n:>11} {name:>11} " + " ".join(f"{c:>11.1f}" for c in cells)
            rest = row["cpu_us"] - row["gc_us"]
            print(f"{line} {row['full_passes']:>11} {rest:>11.1f}", flush=True)
    return rows


def profile(n: int, budget: bool, top: int) -> str:
    """The top of a cProfile of one run (after a warm-up run), by own time."""
    anyio.run(hierplan_side, n, budget)
    prof = cProfile.Profile()
    prof.enable()
    anyio.run(hierplan_side, n, budget)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure, print a table, return the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-budget", action="store_true")
    parser.add_argument("--no-gc", action="store_true")
    parser.add_argument("--rss", type=int, default=0, help="peak RSS of a fresh run at this N")
    parser.add_argument("--rss-child", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--gc-stats", action="store_true", help="time the collector's passes")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    budget = not args.no_budget
    if args.rss_child:
        anyio.run(hierplan_side, args.rss_child, budget)
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # KiB on Linux
        return {}
    if args.no_gc:
        gc.disable()
    if args.profile:
        print(profile(args.n[0], budget, args.top))
        return {}
    if args.gc_stats:
        return {"budget": budget, "gc_rows": gc_stats(args.n, budget)}
    figures: dict[str, Any] = {"budget": budget, "gc": not args.no_gc, "rows": []}
    print(f"budget {'on' if budget else 'off'}, gc {'off' if args.no_gc else 'on'}; "
          f"us per leaf, best of {args.repeats}")  # fmt: skip
    head = ("N", "cpu", "bare cpu", "ratio", "wall", "bare wall", "ratio")
    print(" ".join(f"{h:>9}" for h in head))
    for n in args.n:
        ours: list[tuple[float, float]] = []
        bare: list[tuple[float, float]] = []
        for _ in range(args.repeats):
            bare.append(anyio.run(bare_side, n))
            ours.append(anyio.run(hierplan_side, n, budget))
        cpu, wall = (min(s[i] for s in ours) * 1e6 for i in (0, 1))
        bcpu, bwall = (min(s[i] for s in bare) * 1e6 for i in (0, 1))
        row = {"n": n, "cpu_us": cpu, "bare_cpu_us": bcpu, "cpu_ratio": cpu / bcpu,
               "wall_us": wall, "bare_wall_us": bwall, "wall_ratio": wall / bwall}  # fmt: skip
        figures["rows"].append(row)
        cells = (cpu, bcpu, cpu / bcpu, wall, bwall, wall / bwall)
        print(f"{n:>9} " + " ".join(f"{c:>9.2f}" for c in cells), flush=True)
    if args.rss:
        figures["peak_rss_mib"] = peak_rss_mib(args.rss, budget)
        print(f"peak RSS of one run at N={args.rss}: {figures['peak_rss_mib']:.0f} MiB")
    return figures


if __name__ == "__main__":
    main()
