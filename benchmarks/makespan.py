"""Makespan of random layered DAGs against their critical-path bound, for hierplan and for a
bare anyio DAG runner, in the same run of this script.

    .venv/bin/python benchmarks/makespan.py [--widths 2,8,32] [--depths 3,6,12] [--repeats 3]
        [--seed 0] [--out benchmarks/results]

Each DAG has ``depth`` layers of ``width`` steps; a step of layer k > 0 depends on one to three
random steps of layer k - 1 (seeded). Each step is one model call with a simulated latency
drawn uniformly from 20-80 ms. The critical-path bound is the largest sum of latencies along a
dependency path: no scheduler can finish sooner. The figure is makespan / bound.

- ``hierplan``: ``hierplan.run`` with the ``dag`` strategy, the whole DAG as one plan (its step
  limit raised to fit), executor steps whose model call waits the step's latency; the plan
  comes from a zero-latency planner call, counted in the makespan. A budget is on (never
  binding), tracing off, concurrency not limited.
- ``anyio``: the same DAG run by a minimal event-driven scheduler (a task group; a step starts
  when its last dependency finishes), each step sleeping its latency: the same-run baseline.

Runs alternate between the two; each figure is the median over ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

sys.path.append(str(Path(__file__).resolve().parent))  # perfkit; last, to shadow nothing
import perfkit

import hierplan
from hierplan import FunctionModel, ModelRequest, ModelResponse, RunSettings, Usage
from hierplan.models.scripted import plan_response

LATENCY_S = (0.020, 0.080)
TARGET = 1.05


@dataclass(frozen=True, slots=True)
class Dag:
    """A layered DAG: step ``i`` waits ``latency[i]`` seconds after all of ``deps[i]``."""

    width: int
    depth: int
    latency: tuple[float, ...]
    deps: tuple[tuple[int, ...], ...]

    @property
    def bound(self) -> float:
        """The critical-path bound: the longest sum of latencies along a dependency path."""
        finish: list[float] = []
        for i, wait in enumerate(self.latency):
            finish.append(wait + max((finish[d] for d in self.deps[i]), default=0.0))
        return max(finish)


def layered_dag(width: int, depth: int, rng: random.Random) -> Dag:
    """A random layered DAG; steps are numbered layer by layer (a topological order)."""
    latency: list[float] = []
    deps: list[tuple[int, ...]] = []
    for layer in range(depth):
        for _ in range(width):
            latency.append(round(rng.uniform(*LATENCY_S), 4))
            if layer == 0:
                deps.append(())
            else:
                previous = range((layer - 1) * width, layer * width)
                deps.append(tuple(sorted(rng.sample(previous, rng.randint(1, min(3, width))))))
    return Dag(width, depth, tuple(latency), tuple(deps))


def _model(dag: Dag) -> FunctionModel:
    steps = [
        {
            "id": f"s{i}",
            "title": f"step {i}",
            "instruction": f"step {i}",
            "depends_on": [f"s{d}" for d in dag.deps[i]],
        }
        for i in range(len(dag.latency))
    ]
    plan = plan_response({"goal": "layered DAG", "steps": steps})
    usage = Usage(200, 20)

    async def respond(request: ModelRequest) -> ModelResponse:
        if request.phase == "planning":
            return ModelResponse(text=plan.text, output=plan.output, usage=usage)
        # Executor nodes are numbered in plan order: 1.<i + 1> runs step s<i>.
        await anyio.sleep(dag.latency[int(request.node_path.split(".")[1]) - 1])
        return ModelResponse(text="done", usage=usage)

    return FunctionModel(respond, priced_as="openai:gpt-5-mini")


async def run_hierplan(dag: Dag) -> tuple[float, int]:
    """Makespan of one hierplan run of ``dag``, and how many steps succeeded."""
    steps = len(dag.latency)
    started = time.perf_counter()
    result = await hierplan.run(
        "layered DAG",
        strategy="dag",
        model=_model(dag),
        settings=RunSettings(max_steps=steps, concurrency=steps, plan_concurrency=steps),
        budget={"usd": 1_000_000.0, "tokens": 10**13},
    )
    elapsed = time.perf_counter() - started
    if result.status != "succeeded":
        raise RuntimeError(f"hierplan run ended {result.status}: {result.error}")
    done = sum(1 for c in result.tree.children if c.status == "succeeded")
    return elapsed, done


async def run_anyio(dag: Dag) -> tuple[float, int]:
    """Makespan of a minimal event-driven anyio scheduler on ``dag``, and steps finished."""
    waiting = [len(d) for d in dag.deps]
    dependents: list[list[int]] = [[] for _ in dag.deps]
    for i, deps in enumerate(dag.deps):
        for d in deps:
            dependents[d].append(i)
    done = 0

    async def step(i: int) -> None:
        nonlocal done
        await anyio.sleep(dag.latency[i])
        done += 1
        for j in dependents[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                tg.start_soon(step, j)

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i, count in enumerate(waiting):
            if count == 0:
                tg.start_soon(step, i)
    return time.perf_counter() - started, done


RUNNERS = {"hierplan": run_hierplan, "anyio": run_anyio}


async def measure(
    widths: list[int], depths: list[int], repeats: int, seed: int
) -> list[dict[str, Any]]:
    """One row per (width, depth): the bound and each runner's median makespan and ratio."""
    await run_hierplan(layered_dag(2, 2, random.Random(seed)))  # warm-up: imports, caches
    rows = []
    for width in widths:
        for depth in depths:
            dag = layered_dag(width, depth, random.Random(f"{seed}-{width}-{depth}"))
            bound = dag.bound
            times: dict[str, list[float]] = {name: [] for name in RUNNERS}
            for _ in range(repeats):
                for name, runner in RUNNERS.items():
                    elapsed, done = await runner(dag)
                    if done != len(dag.latency):
                        raise RuntimeError(f"{name}: {done} of {len(dag.latency)} steps finished")
                    times[name].append(elapsed)
            row: dict[str, Any] = {
                "width": width,
                "depth": depth,
                "steps": len(dag.latency),
                "bound_s": bound,
                "steps_completed": len(dag.latency),
            }
            for name, values in times.items():
                row[name] = {
                    "makespan_s": perfkit.median(values),
                    "ratio": perfkit.median(values) / bound,
                    "samples_s": values,
                }
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure, print, and write ``makespan.json``; returns what it wrote."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--widths", default="2,8,32", help="comma-separated layer widths")
    parser.add_argument("--depths", default="3,6,12", help="comma-separated layer counts")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=perfkit.RESULTS, help="makespan.json's folder")
    parser.add_argument("--no-out", action="store_true", help="write no JSON")
    args = parser.parse_args(argv)
    details = perfkit.machine()
    perfkit.print_machine(details)
    widths = [int(w) for w in args.widths.split(",")]
    depths = [int(d) for d in args.depths.split(",")]
    rows = anyio.run(measure, widths, depths, args.repeats, args.seed)
    print(f"Makespan / critical-path bound, median of {args.repeats} run(s)")
    body = [
        [
            f"{r['width']}x{r['depth']}",
            r["steps"],
            r["bound_s"] * 1e3,
            r["hierplan"]["makespan_s"] * 1e3,
            r["hierplan"]["ratio"],
            r["anyio"]["ratio"],
        ]
        for r in rows
    ]
    headers = ["width x depth", "steps", "bound ms", "hierplan ms", "hierplan", "anyio"]
    print(perfkit.table(headers, body))
    worst = max(r["hierplan"]["ratio"] for r in rows)
    print(f"worst hierplan ratio {worst:.3f} (target ≤ {TARGET})")
    data = {
        "benchmark": "makespan",
        "command": "python benchmarks/makespan.py " + " ".join(argv or sys.argv[1:]),
        "machine": details,
        "repeats": args.repeats,
        "seed": args.seed,
        "latency_s": list(LATENCY_S),
        "rows": rows,
        "worst_hierplan_ratio": worst,
    }
    perfkit.write_results("makespan", data, None if args.no_out else args.out)
    return data


if __name__ == "__main__":
    main()
