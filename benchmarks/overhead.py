"""Per-leaf overhead of hierplan against a bare anyio task group and LangGraph's ``Send``
fan-out, with each one's peak memory, side by side in the same run of this script.

    .venv/bin/python benchmarks/overhead.py [--leaves 1000,5000,10000] [--repeats 5]
        [--impls hierplan,anyio,langgraph] [--out benchmarks/results]

The workload: N independent leaves, each waiting 10 ms (``anyio.sleep(0.01)``), concurrency
not limited. Per-leaf overhead is ``(wall time - 10 ms) / N``: with every leaf running at
once, 10 ms is the ideal makespan, and what is left is what the framework spends per leaf.
The CPU time of the process during the run, divided by N, is reported beside it: it is what
the same work costs without the time other programs on a shared machine take from it.

- ``hierplan``: ``hierplan.run`` with the ``hierarchical`` strategy on a zero-latency
  :class:`~hierplan.FunctionModel`. The tree has three planner levels, as a planner would
  build it within the default limits (50 steps per plan, depth 3): a root plan of sub-goals,
  each planning up to 50 sub-goals, each planning up to 50 leaf tasks. A leaf is an executor
  step making one model call, which waits the 10 ms and answers (one planning call per 50
  leaves, amortised into the per-leaf figure). A token and USD budget is on (too large to
  bind), tracing is off, and ``concurrency``/``plan_concurrency`` are N.
- ``anyio``: one task group starting N tasks that each sleep 10 ms.
- ``langgraph``: a ``StateGraph`` whose start fans out N ``Send``s to a node that sleeps 10 ms
  and appends to a list (``operator.add`` reducer); ``ainvoke`` on asyncio. Reported as
  unavailable when LangGraph is not installed (``pip install -e '.[bench]'``).

Each configuration runs in a fresh interpreter (so peak RSS is its own): a 50-leaf warm-up,
then the measured run; configurations alternate and each figure is the median over
``--repeats`` processes. Peak RSS is ``ru_maxrss`` of that process (imports included; the RSS
before the measured run is reported too). Every run checks that all N leaves completed.
"""

from __future__ import annotations

import argparse
import gc
import json
import operator
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

import anyio

sys.path.append(str(Path(__file__).resolve().parent))  # perfkit; last, to shadow nothing
import perfkit

import hierplan
from hierplan import (
    FunctionModel,
    ModelRequest,
    ModelResponse,
    NodeRecord,
    RunResult,
    RunSettings,
    Tool,
    Usage,
    tool,
)
from hierplan.core.events import Listener
from hierplan.models.scripted import plan_response

LEAF_S = 0.010
PLAN_LIMIT = 50  # hierplan's default steps per plan
WARMUP_LEAVES = 50
IMPLS = ("hierplan", "anyio", "langgraph")
# A budget no run here comes near: budgets are on (reserve and settle every call) but never bind.
BUDGET_USD = 1_000_000.0
BUDGET_TOKENS = 10**13
# Each step's deadline: RunSettings' own unless a caller asks for another (or None, no deadline).
STEP_TIMEOUT_S = RunSettings.model_fields["step_timeout_s"].default


def tree_shape(leaves: int) -> list[list[int]]:
    """Leaves per bottom plan, grouped by middle plan: ``shape[k][j]`` leaves under ``1.k.j``."""
    if leaves < 1:
        raise ValueError(f"leaves must be at least 1, not {leaves}")
    bottoms = [min(PLAN_LIMIT, leaves - i) for i in range(0, leaves, PLAN_LIMIT)]
    middles = [bottoms[i : i + PLAN_LIMIT] for i in range(0, len(bottoms), PLAN_LIMIT)]
    if len(middles) > PLAN_LIMIT:
        raise ValueError(f"at most {PLAN_LIMIT**3} leaves fit three levels, not {leaves}")
    return middles


def _subgoals(count: int, what: str) -> dict[str, Any]:
    steps = [
        {"id": f"g{i}", "title": f"{what} {i}", "instruction": f"{what} {i}", "kind": "subgoal"}
        for i in range(count)
    ]
    return {"goal": what, "steps": steps}


def _tasks(count: int, direct: bool = False, first: int = 0) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [
        {"id": f"t{i}", "title": f"leaf {i}", "instruction": f"leaf {i}"} for i in range(count)
    ]
    if direct:  # a tool and its arguments: the step calls the tool, no model call
        for i, step in enumerate(steps):
            step.update(tool=WAIT_TOOL, args={"n": first + i})
    return {"goal": "leaves", "steps": steps}


WAIT_TOOL = "wait"


def wait_tool(leaf_s: float = LEAF_S) -> Tool:
    """The tool of a tool-only leaf: waits ``leaf_s``, as a model leaf's answer does."""

    async def wait(n: int) -> int:
        """Wait a moment, then give ``n`` back."""
        await anyio.sleep(leaf_s)
        return n

    return tool(wait, name=WAIT_TOOL)


def hierplan_model(leaves: int, leaf_s: float = LEAF_S, direct: bool = False) -> FunctionModel:
    """Planner and executor in one zero-latency function model: plans by node path, and a leaf
    answer after ``leaf_s``. Plans are built once, so the model costs next to nothing. With
    ``direct`` every leaf is a tool-only step (:func:`wait_tool`), which makes no model call."""
    shape = tree_shape(leaves)
    root = plan_response(_subgoals(len(shape), "part"))
    middles = [plan_response(_subgoals(len(m), "chunk")) for m in shape]
    if direct:
        # Each leaf's arguments its own ("n": the leaf's number in the run), as a real plan's
        # would be: a tool remembers arguments that passed its check, and plans repeating the
        # same ones would count fewer checks than a real run makes.
        bottoms = {
            (k, j): plan_response(_tasks(size, True, PLAN_LIMIT * (PLAN_LIMIT * k + j)))
            for k, m in enumerate(shape)
            for j, size in enumerate(m)
        }
    else:  # one plan per size: the model leaves' plans differ by nothing else
        by_size = {size: plan_response(_tasks(size)) for m in shape for size in m}
        bottoms = {(k, j): by_size[size] for k, m in enumerate(shape) for j, size in enumerate(m)}
    usage = Usage(200, 20)

    async def respond(request: ModelRequest) -> ModelResponse:
        if request.phase == "execution":
            await anyio.sleep(leaf_s)
            return ModelResponse(text="done", usage=usage)
        parts = [int(p) for p in request.node_path.split(".")]
        if len(parts) == 1:
            found = root
        elif len(parts) == 2:
            found = middles[parts[1] - 1]
        else:
            found = bottoms[(parts[1] - 1, parts[2] - 1)]
        return ModelResponse(text=found.text, output=found.output, usage=usage)

    return FunctionModel(respond, priced_as="openai:gpt-5-mini")


def count_leaves(record: NodeRecord) -> int:
    """Executor nodes of a run tree that succeeded."""
    own = int(record.kind == "executor" and record.status == "succeeded")
    return own + sum(count_leaves(child) for child in record.children)


def sample_tools(count: int) -> list[Tool]:
    """``count`` tools of four arguments (for a run whose executors have tools to choose from:
    the model here answers without calling them)."""

    def make(i: int) -> Tool:
        def read_rows(table: str, limit: int = 10, where: str = "", order: str = "") -> str:
            """Read rows of a table of the database, filtered and ordered."""
            return table

        return tool(read_rows, name=f"read_rows_{i}")

    return [make(i) for i in range(count)]


async def hierplan_result(
    leaves: int,
    leaf_s: float = LEAF_S,
    tools: Sequence[Tool] = (),
    listeners: Sequence[Listener] = (),
    direct: bool = False,
    step_timeout_s: float | None = STEP_TIMEOUT_S,
) -> RunResult:
    """One hierplan run of ``leaves`` leaves (``tools`` available to every executor, its events
    to ``listeners``; with ``direct``, tool-only leaves; each step under ``step_timeout_s``);
    raises unless it succeeded."""
    result = await hierplan.run(
        "many leaves",
        strategy="hierarchical",
        model=hierplan_model(leaves, leaf_s, direct),
        tools=[*tools, wait_tool(leaf_s)] if direct else tools,
        settings=RunSettings(
            concurrency=leaves,
            plan_concurrency=max(leaves, PLAN_LIMIT),
            step_timeout_s=step_timeout_s,
        ),
        listeners=listeners,
        budget={"usd": BUDGET_USD, "tokens": BUDGET_TOKENS},
    )
    if result.status != "succeeded":
        raise RuntimeError(f"hierplan run ended {result.status}: {result.error}")
    return result


async def run_hierplan(
    leaves: int,
    leaf_s: float = LEAF_S,
    tools: Sequence[Tool] = (),
    step_timeout_s: float | None = STEP_TIMEOUT_S,
) -> int:
    """One hierplan run of ``leaves`` leaves (``tools`` available to every executor, each step
    under ``step_timeout_s``); returns how many completed."""
    result = await hierplan_result(leaves, leaf_s, tools, step_timeout_s=step_timeout_s)
    return count_leaves(result.tree)


async def run_hierplan_direct(
    leaves: int, leaf_s: float = LEAF_S, step_timeout_s: float | None = STEP_TIMEOUT_S
) -> int:
    """One hierplan run of ``leaves`` tool-only leaves (a tool and its arguments, no model
    call; each step under ``step_timeout_s``); returns how many completed."""
    result = await hierplan_result(leaves, leaf_s, direct=True, step_timeout_s=step_timeout_s)
    return count_leaves(result.tree)


async def run_anyio(leaves: int, leaf_s: float = LEAF_S) -> int:
    """N tasks in one task group, each sleeping ``leaf_s``; returns how many completed."""
    done = 0

    async def leaf() -> None:
        nonlocal done
        await anyio.sleep(leaf_s)
        done += 1

    async with anyio.create_task_group() as tg:
        for _ in range(leaves):
            tg.start_soon(leaf)
    return done


def langgraph_available() -> bool:
    """Whether LangGraph can be imported here."""
    return perfkit.version("langgraph") is not None


class _FanOut(TypedDict):
    leaves: int
    done: Annotated[list[int], operator.add]


class _Leaf(TypedDict):
    i: int


def _langgraph_graph(leaf_s: float) -> Any:
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Send

    def fan_out(state: _FanOut) -> list[Any]:  # Sends (hints must resolve at module level)
        return [Send("leaf", {"i": i}) for i in range(state["leaves"])]

    async def leaf(state: _Leaf) -> dict[str, list[int]]:
        await anyio.sleep(leaf_s)
        return {"done": [state["i"]]}

    graph = StateGraph(_FanOut)
    graph.add_node("leaf", leaf)
    graph.add_conditional_edges(START, fan_out, ["leaf"])
    graph.add_edge("leaf", END)
    return graph.compile()


async def run_langgraph(leaves: int, leaf_s: float = LEAF_S, graph: Any = None) -> int:
    """LangGraph's ``Send`` fan-out of ``leaves`` nodes; returns how many completed. The graph
    is built and compiled in the run unless a compiled one (``_langgraph_graph``) is given."""
    if graph is None:
        graph = _langgraph_graph(leaf_s)
    state = await graph.ainvoke({"leaves": leaves, "done": []})
    return len(set(state["done"]))


RUNNERS: dict[str, Callable[[int], Coroutine[Any, Any, int]]] = {
    "hierplan": run_hierplan,
    "hierplan-direct": run_hierplan_direct,  # instructions.py's tool-only leaves
    "anyio": run_anyio,
    "langgraph": run_langgraph,
}


async def measure_once(impl: str, leaves: int) -> dict[str, Any]:
    """A warm-up, then one timed run of ``impl``: wall time, leaves completed, memory."""
    runner = RUNNERS[impl]
    await runner(min(leaves, WARMUP_LEAVES))  # imports, caches, first-call costs
    gc.collect()
    before = perfkit.current_rss_mb()
    started, cpu_started = time.perf_counter(), time.process_time()
    completed = await runner(leaves)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return {
        "impl": impl,
        "leaves": leaves,
        "wall_s": wall,
        "cpu_s": cpu,
        "leaves_completed": completed,
        "rss_before_mb": before,
        "peak_rss_mb": perfkit.peak_rss_mb(),
    }


def worker(spec: dict[str, Any]) -> None:
    """The fresh-process side: measure one configuration and print it as JSON."""
    print(json.dumps(anyio.run(measure_once, spec["impl"], int(spec["leaves"]))))


def per_leaf_us(wall_s: float, leaves: int) -> float:
    """Per-leaf overhead: the wall time beyond the one ideal 10 ms wait, divided by N."""
    return (wall_s - LEAF_S) / leaves * 1e6


def sample(impl: str, leaves: int, isolate: bool) -> dict[str, Any]:
    """One measurement, in a fresh process (``isolate``) or in this one."""
    if isolate:
        return perfkit.run_worker(Path(__file__).resolve(), {"impl": impl, "leaves": leaves})
    return anyio.run(measure_once, impl, leaves)


def summarise(impl: str, leaves: int, samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of one configuration's samples (the samples are kept as they were)."""
    for s in samples:
        if s["leaves_completed"] != leaves:
            raise RuntimeError(f"{impl}: {s['leaves_completed']} of {leaves} leaves completed")
    wall = perfkit.median([s["wall_s"] for s in samples])
    cpu = perfkit.median([s["cpu_s"] for s in samples])
    return {
        "impl": impl,
        "leaves": leaves,
        "available": True,
        "wall_s": wall,
        "per_leaf_us": per_leaf_us(wall, leaves),
        "cpu_s": cpu,
        "cpu_per_leaf_us": cpu / leaves * 1e6,
        "peak_rss_mb": perfkit.median([s["peak_rss_mb"] for s in samples]),
        "rss_before_mb": perfkit.median([s["rss_before_mb"] or 0.0 for s in samples]),
        "leaves_completed": min(s["leaves_completed"] for s in samples),
        "samples": samples,
    }


def measure(
    sizes: Sequence[int], impls: Sequence[str], repeats: int, isolate: bool = True
) -> list[dict[str, Any]]:
    """Every size and implementation, ``repeats`` times, alternating; one row each."""
    rows: list[dict[str, Any]] = []
    for leaves in sizes:
        present = [i for i in impls if i != "langgraph" or langgraph_available()]
        samples: dict[str, list[dict[str, Any]]] = {i: [] for i in present}
        for _ in range(repeats):
            for impl in present:
                samples[impl].append(sample(impl, leaves, isolate))
        for impl in impls:
            if impl in samples:
                rows.append(summarise(impl, leaves, samples[impl]))
            else:
                rows.append({"impl": impl, "leaves": leaves, "available": False})
    return rows


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per size: hierplan against anyio, and LangGraph against hierplan, by wall time and by
    CPU time (``None``: one side was not run)."""

    def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, key: str) -> float | None:
        return None if a is None or b is None else float(a[key] / b[key])

    out = []
    for leaves in sorted({r["leaves"] for r in rows}):
        at = {r["impl"]: r for r in rows if r["leaves"] == leaves and r.get("available")}
        hp, base, lg = at.get("hierplan"), at.get("anyio"), at.get("langgraph")
        out.append(
            {
                "leaves": leaves,
                "hierplan_vs_anyio": ratio(hp, base, "per_leaf_us"),
                "langgraph_vs_hierplan": ratio(lg, hp, "per_leaf_us"),
                "hierplan_vs_anyio_cpu": ratio(hp, base, "cpu_per_leaf_us"),
                "langgraph_vs_hierplan_cpu": ratio(lg, hp, "cpu_per_leaf_us"),
            }
        )
    return out


def report(rows: list[dict[str, Any]], compared: list[dict[str, Any]], repeats: int) -> None:
    """Print the table, the ratios and the targets."""
    print(f"Per-leaf overhead, (wall - {LEAF_S * 1e3:g} ms) / N; median of {repeats} process(es)")
    body = [
        [
            r["impl"],
            r["leaves"],
            r.get("per_leaf_us"),
            r.get("cpu_per_leaf_us"),
            r.get("wall_s"),
            r.get("peak_rss_mb"),
        ]
        for r in rows
    ]
    print(perfkit.table(["impl", "N", "µs/leaf", "CPU µs/leaf", "wall s", "peak RSS MB"], body))
    print()
    body = [
        [
            c["leaves"],
            c["hierplan_vs_anyio"],
            c["hierplan_vs_anyio_cpu"],
            c["langgraph_vs_hierplan"],
            c["langgraph_vs_hierplan_cpu"],
        ]
        for c in compared
    ]
    headers = ["N", "hierplan/anyio", "(CPU)", "langgraph/hierplan", "(CPU)"]
    print(perfkit.table(headers, body))
    print("targets: hierplan/anyio ≤ 1.5; langgraph/hierplan ≥ 10 at N=5,000")


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--leaves", default="1000,5000,10000", help="comma-separated sizes N")
    parser.add_argument("--repeats", type=int, default=5, help="processes per configuration")
    parser.add_argument(
        "--impls", default=",".join(IMPLS), help="comma-separated, of " + ",".join(IMPLS)
    )
    parser.add_argument(
        "--out", type=Path, default=perfkit.RESULTS, help="where overhead.json goes"
    )
    parser.add_argument("--no-out", action="store_true", help="write no JSON")
    parser.add_argument("--in-process", action="store_true", help="no fresh process per run")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = set(args.impls.split(",")) - set(IMPLS)
    if unknown:
        parser.error(f"unknown --impls {sorted(unknown)}: choose from {', '.join(IMPLS)}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure, print, and write ``overhead.json``; returns what it wrote."""
    args = parse(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return {}
    details = perfkit.machine()
    perfkit.print_machine(details)
    sizes = [int(n) for n in args.leaves.split(",")]
    rows = measure(sizes, args.impls.split(","), args.repeats, isolate=not args.in_process)
    compared = ratios(rows)
    report(rows, compared, args.repeats)
    data = {
        "benchmark": "overhead",
        "command": "python benchmarks/overhead.py " + " ".join(argv or sys.argv[1:]),
        "machine": details,
        "repeats": args.repeats,
        "isolated": not args.in_process,
        "leaf_s": LEAF_S,
        "rows": rows,
        "ratios": compared,
    }
    perfkit.write_results("overhead", data, None if args.no_out else args.out)
    return data


if __name__ == "__main__":
    main()
