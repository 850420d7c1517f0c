"""What one leaf holds in memory while it waits, and what stays of it after the run: the
evidence behind the 100,000-leaf peak RSS of ``benchmarks/scale.py``.

    .venv/bin/python benchmarks/memory.py [--leaves 10000] [--top 25] [--queued 20000]
        [--out DIR | --no-out]

The workload is that of ``benchmarks/overhead.py`` (a three-level hierplan tree, budgets on,
tracing off, concurrency not limited), except that every leaf's model call waits for the
last leaf to arrive rather than for 10 ms: so the snapshot is taken with every leaf in flight
at once, as happens at 100,000 leaves, where all of them start before the first one's timer
fires. Beside it, a bare anyio task group whose N tasks wait the same way.

Reported, per leaf:

- ``tracemalloc``: bytes allocated by the run and alive with every leaf in flight, and still
  alive after the run (the run record, which a run exists to keep), against the bare task
  group's bytes in flight;
- the objects the garbage collector tracks alive in flight, against the bare task group's
  (what each collector pass walks, in proportion), and their types (shallow sizes, so a
  type's figure excludes what its objects point to): which objects each leaf costs;
- the chain of coroutines one waiting leaf is suspended in, with each frame's size;
- with ``--queued N``: the traced peak of one plan of N one-millisecond steps under the default
  per-plan limit, where the steps that cannot start yet wait in the scheduler's queue.

The figures per leaf (not the type listing) are written to ``<out>/memory.json`` (``--out``,
by default ``benchmarks/results``; ``--no-out`` writes nothing), which ``report.py`` puts in
the README's tables.
"""

from __future__ import annotations

import argparse
import collections
import gc
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import anyio

sys.path.append(str(Path(__file__).resolve().parent))  # overhead; last, to shadow nothing
import overhead
import perfkit

import hierplan
from hierplan import FunctionModel, ModelRequest, ModelResponse, RunSettings
from hierplan.core.results import StepResult
from hierplan.hierarchy.scheduler import run_dag
from hierplan.plans.plan import Plan, Step

Histogram = dict[str, tuple[int, int]]  # type name -> (count, shallow bytes)


def _histogram() -> Histogram:
    counts: collections.Counter[str] = collections.Counter()
    sizes: collections.Counter[str] = collections.Counter()
    for obj in gc.get_objects():
        kind = type(obj)
        name = f"{getattr(kind, '__module__', '')}.{kind.__qualname__}"
        counts[name] += 1
        sizes[name] += sys.getsizeof(obj)
    return {name: (counts[name], sizes[name]) for name in counts}


def _coroutine_chain(task_coro: Any) -> list[tuple[str, int]]:
    chain: list[tuple[str, int]] = []
    coro = task_coro
    while coro is not None and hasattr(coro, "cr_frame"):
        chain.append((coro.__qualname__, sys.getsizeof(coro)))
        coro = coro.cr_await
    return chain


class _Gate:
    """Holds every leaf until the last one arrives, and takes the snapshots then."""

    def __init__(self, leaves: int) -> None:
        self.leaves = leaves
        self.arrived = 0
        self.open = anyio.Event()
        self.traced: tracemalloc.Snapshot | None = None
        self.types: Histogram = {}
        self.chain: list[tuple[str, int]] = []

    async def wait(self) -> None:
        self.arrived += 1
        if self.arrived == self.leaves:
            gc.collect()
            # The object census before the snapshot (whose traces are objects themselves);
            # what the census keeps is a few hundred entries, nothing per leaf.
            self.types = _histogram()
            self.chain = self._one_leaf_chain()
            self.traced = tracemalloc.take_snapshot()
            self.open.set()
        await self.open.wait()

    @staticmethod
    def _one_leaf_chain() -> list[tuple[str, int]]:
        import asyncio  # the chain is read off asyncio's tasks: anyio has no such view

        for task in asyncio.all_tasks():
            chain = _coroutine_chain(task.get_coro())
            if any(name.endswith("LLMExecutor.execute") for name, _ in chain):
                return chain
        return []


def _model(leaves: int, gate: _Gate) -> FunctionModel:
    planner = overhead.hierplan_model(leaves, leaf_s=0.0)

    async def respond(request: ModelRequest) -> ModelResponse:
        if request.phase == "execution":
            await gate.wait()
        return await planner.request(request)

    return FunctionModel(respond, priced_as="openai:gpt-5-mini")


def _bytes(snapshot: tracemalloc.Snapshot, base: tracemalloc.Snapshot) -> int:
    return sum(stat.size_diff for stat in snapshot.compare_to(base, "filename"))


async def measure_hierplan(leaves: int) -> dict[str, Any]:
    """Snapshots of one hierplan run with every leaf in flight, and after it."""
    await overhead.run_hierplan(50, 0.0)  # warm-up: imports, caches
    gate = _Gate(leaves)
    gc.collect()
    base_types = _histogram()
    tracemalloc.start()
    base = tracemalloc.take_snapshot()
    result = await hierplan.run(
        "many leaves",
        strategy="hierarchical",
        model=_model(leaves, gate),
        settings=RunSettings(concurrency=leaves, plan_concurrency=max(leaves, 50)),
        budget={"usd": overhead.BUDGET_USD, "tokens": overhead.BUDGET_TOKENS},
    )
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    if result.status != "succeeded" or overhead.count_leaves(result.tree) != leaves:
        raise RuntimeError(f"the run went wrong: {result.status} {result.error}")
    assert gate.traced is not None
    types = {
        name: (count - base_types.get(name, (0, 0))[0], size - base_types.get(name, (0, 0))[1])
        for name, (count, size) in gate.types.items()
    }
    return {
        "in_flight_bytes": _bytes(gate.traced, base) / leaves,
        "after_bytes": _bytes(after, base) / leaves,
        "objects": sum(count for count, _ in types.values()) / leaves,
        "types": {name: (c / leaves, s / leaves) for name, (c, s) in types.items() if s > 0},
        "chain": gate.chain,
    }


async def measure_anyio(leaves: int) -> tuple[float, float]:
    """Bytes and GC-tracked objects per task of a bare task group whose tasks all wait at
    once."""
    arrived = 0
    every = anyio.Event()
    in_flight: list[int] = []

    async def leaf() -> None:
        nonlocal arrived
        arrived += 1
        if arrived == leaves:
            gc.collect()
            in_flight.append(_bytes(tracemalloc.take_snapshot(), base))
            in_flight.append(len(gc.get_objects()) - objects)
            every.set()
        await every.wait()

    gc.collect()
    objects = len(gc.get_objects())
    tracemalloc.start()
    base = tracemalloc.take_snapshot()
    async with anyio.create_task_group() as tg:
        for _ in range(leaves):
            tg.start_soon(leaf)
    tracemalloc.stop()
    return in_flight[0] / leaves, in_flight[1] / leaves


async def measure_queued(steps: int) -> float:
    """Traced peak bytes per step of one plan of ``steps`` independent one-millisecond steps
    run under the default per-plan limit."""
    plan = Plan.model_construct(
        goal="queued", steps=[Step(id=f"s{i}", title="s", instruction="s") for i in range(steps)]
    )

    async def step_run(step: Step, inputs: dict[str, StepResult]) -> StepResult:
        await anyio.sleep(0.001)
        return StepResult("done", "done")

    gc.collect()
    tracemalloc.start()
    outcome = await run_dag(plan, step_run, max_running=RunSettings().plan_concurrency)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    if not outcome.complete:
        raise RuntimeError("the queued plan went wrong")
    return peak / steps


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure and print; returns the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--leaves", type=int, default=10_000)
    parser.add_argument("--top", type=int, default=25, help="object types to list")
    parser.add_argument(
        "--queued", type=int, default=0, help="also measure one plan of this many steps"
    )
    parser.add_argument("--out", type=Path, default=perfkit.RESULTS)
    parser.add_argument("--no-out", dest="out", action="store_const", const=None)
    args = parser.parse_args(argv)
    details = perfkit.machine()
    perfkit.print_machine(details)
    ours = anyio.run(measure_hierplan, args.leaves)
    bare, bare_objects = anyio.run(measure_anyio, args.leaves)
    ours["anyio_in_flight_bytes"] = bare
    ours["anyio_objects"] = bare_objects
    print(f"{args.leaves:,} leaves, every one in flight at once; bytes per leaf (tracemalloc)")
    print(f"  hierplan in flight {ours['in_flight_bytes']:>8,.0f}")
    print(f"  hierplan after run {ours['after_bytes']:>8,.0f}  (the run record)")
    print(f"  bare anyio task    {bare:>8,.0f}")
    print("GC-tracked objects alive per leaf in flight")
    print(f"  hierplan {ours['objects']:6.1f}")
    print(f"  anyio    {bare_objects:6.1f}  (hierplan {ours['objects'] / bare_objects:.2f}x)")
    print("object types alive in flight, per leaf (count, shallow bytes):")
    rows = sorted(ours["types"].items(), key=lambda item: -item[1][1])[: args.top]
    for name, (count, size) in rows:
        print(f"  {count:6.2f} {size:8,.0f}  {name}")
    print("coroutines one waiting leaf is suspended in (bytes each):")
    for name, size in ours["chain"]:
        print(f"  {size:6,}  {name}")
    print(f"  {sum(size for _, size in ours['chain']):6,}  total")
    if args.queued:
        ours["queued_peak_bytes"] = anyio.run(measure_queued, args.queued)
        print(
            f"one plan of {args.queued:,} steps, {RunSettings().plan_concurrency} at once: "
            f"traced peak {ours['queued_peak_bytes']:,.0f} bytes a step"
        )
    kept = ("objects", "anyio_objects", "in_flight_bytes", "after_bytes", "anyio_in_flight_bytes")
    data = {
        "benchmark": "memory",
        "command": "python benchmarks/memory.py " + " ".join(argv or sys.argv[1:]),
        "machine": details,
        "leaves": args.leaves,
        **{name: ours[name] for name in (*kept, "chain")},
        "objects_over_anyio": ours["objects"] / ours["anyio_objects"],
        "queued_peak_bytes": ours.get("queued_peak_bytes"),
    }
    perfkit.write_results("memory", data, args.out)
    return ours


if __name__ == "__main__":
    main()
