"""Per-leaf overhead counted in CPU instructions (valgrind), which the machine's load does not
change: hierplan against a bare anyio task group and LangGraph, as ratios.

    .venv/bin/python benchmarks/instructions.py [--leaves 1000]
        [--impls hierplan,hierplan-direct,anyio,langgraph] [--tools 0]
        [--step-timeout SECONDS|none] [--tree DIR] [--out DIR | --no-out]

The workload is ``overhead.py``'s (a three-level hierplan tree on a zero-latency function
model, budgets on, tracing off, concurrency not limited; N tasks sleeping 10 ms in one anyio
task group; LangGraph's ``Send`` fan-out to a node sleeping 10 ms). Each implementation runs in
its own process under ``valgrind --tool=callgrind``, which counts the instructions the process
executes: after a 50-leaf warm-up (and LangGraph's graph compiled), the process calls
``os.getppid()`` before and after the measured run, and callgrind (``--dump-before=os_getppid``)
dumps its counters at each call, so the instructions between the two dumps are those of the
run alone, imports and warm-up excluded. Waiting (the 10 ms sleeps) executes no instruction:
the figure is what each implementation's own work costs, per leaf, on any machine and under any
load. Timings (``overhead.py``) on a shared machine move by tens of percent between runs;
these counts repeat within a fraction of a percent.

``hierplan-direct`` is the same tree whose leaves are tool-only steps (a tool and its
arguments: the step calls a tool that sleeps 10 ms, without a model call), so that what a leaf
costs without a model call shows beside a model leaf (``hierplan direct over hierplan``).

``--tools N`` gives hierplan's executors N tools to choose from (four arguments each; the
model answers without calling them), which a call's request then carries.
``--step-timeout`` sets hierplan's step deadline (``RunSettings.step_timeout_s``: its default,
300 s, unless given; ``none``, steps without a deadline, shows what the deadlines cost).
``--tree DIR``
measures the hierplan of another checkout (``DIR`` put first on ``PYTHONPATH``),
so that two commits compare without reinstalling. Needs valgrind (``apt-get install
valgrind``); the counts take a few minutes (valgrind runs a program about 50 times slower).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

sys.path.append(str(Path(__file__).resolve().parent))  # perfkit, overhead; last: shadow nothing
import overhead
import perfkit

VALGRIND = "valgrind"
MARKER = "os_getppid"  # the C function behind os.getppid(): callgrind dumps before each call
DEFAULT_IMPLS = ("hierplan", "hierplan-direct", "anyio", "langgraph")


async def _measured_run(impl: str, leaves: int, tools: int, step_timeout: float | None) -> int:
    """Warm up, then run ``leaves`` leaves between the two markers; returns those completed."""
    run: Callable[[int], Awaitable[int]] = overhead.RUNNERS[impl]
    if impl == "hierplan":
        available = overhead.sample_tools(tools)

        async def run_hierplan(n: int) -> int:
            return await overhead.run_hierplan(n, tools=available, step_timeout_s=step_timeout)

        run = run_hierplan
    elif impl == "hierplan-direct":

        async def run_direct(n: int) -> int:
            return await overhead.run_hierplan_direct(n, step_timeout_s=step_timeout)

        run = run_direct
    await run(overhead.WARMUP_LEAVES)
    if impl == "langgraph":  # compiled once, before the count: the fan-out is what is counted
        graph = overhead._langgraph_graph(overhead.LEAF_S)

        async def run_graph(n: int) -> int:
            return await overhead.run_langgraph(n, graph=graph)

        run = run_graph
    gc.collect()
    os.getppid()  # dump: everything before this is not counted
    completed = await run(leaves)
    os.getppid()  # dump: the instructions since the last one are the run's
    return completed


def child(impl: str, leaves: int, tools: int, step_timeout: float | None) -> None:
    """The process valgrind runs: the measured run, then what it measured, as JSON."""
    completed = anyio.run(_measured_run, impl, leaves, tools, step_timeout)
    print(json.dumps({"completed": completed, "source": perfkit.hierplan_source()}))


def _dumped_totals(folder: Path) -> list[int]:
    """The instruction totals of callgrind's dumps, in order (``cg.out.1``, ``cg.out.2``...)."""
    parts = sorted(folder.glob("cg.out.*"), key=lambda p: int(p.suffix[1:]))
    totals = []
    for part in parts:
        for line in part.read_text().splitlines():
            if line.startswith("totals:"):
                totals.append(int(line.split()[1]))
                break
    return totals


def count(
    impl: str,
    leaves: int,
    tree: Path | None,
    tools: int = 0,
    step_timeout: float | None = overhead.STEP_TIMEOUT_S,
) -> dict[str, Any]:
    """Run one implementation under callgrind; instructions of its measured run, per leaf."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="hierplan-instructions-") as tmp:
        command = [
            VALGRIND,
            "--tool=callgrind",
            f"--dump-before={MARKER}",
            f"--callgrind-out-file={tmp}/cg.out",
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            impl,
            "--leaves",
            str(leaves),
            "--tools",
            str(tools),
            "--step-timeout",
            _seconds_text(step_timeout),
        ]
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            tail = "\n".join(done.stderr.splitlines()[-15:])
            raise RuntimeError(f"{impl} under valgrind exited {done.returncode}:\n{tail}")
        totals = _dumped_totals(Path(tmp))
    if len(totals) != 2:
        # Something else called os.getppid() (or it was never reached): the split is unknown.
        raise RuntimeError(f"{impl}: expected 2 counter dumps at the markers, got {len(totals)}")
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    if measured["completed"] != leaves:
        raise RuntimeError(f"{impl}: {measured['completed']} of {leaves} leaves completed")
    return {
        "impl": impl,
        "leaves": leaves,
        "tools": tools if impl == "hierplan" else 0,
        "step_timeout_s": step_timeout if impl.startswith("hierplan") else None,
        "instructions": totals[1],
        "per_leaf": totals[1] / leaves,
        "leaves_completed": measured["completed"],
        "hierplan_source": measured["source"] if impl == "hierplan" else None,
    }


def ratios(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """hierplan / anyio, LangGraph / hierplan, and tool-only leaves over model leaves and over
    anyio, per leaf (``None`` without both sides)."""
    per = {r["impl"]: r["per_leaf"] for r in rows}
    hp = per.get("hierplan")
    direct = per.get("hierplan-direct")
    return {
        "hierplan_over_anyio": hp / per["anyio"] if hp and per.get("anyio") else None,
        "langgraph_over_hierplan": per["langgraph"] / hp if hp and per.get("langgraph") else None,
        "hierplan_direct_over_hierplan": direct / hp if direct and hp else None,
        "hierplan_direct_over_anyio": direct / per["anyio"]
        if direct and per.get("anyio")
        else None,
    }


def _seconds(text: str) -> float | None:
    """A step deadline from the command line: seconds more than 0, or ``none``."""
    if text == "none":
        return None
    seconds = float(text)
    if not 0 < seconds < float("inf"):
        raise ValueError(text)
    return seconds


def _seconds_text(seconds: float | None) -> str:
    return "none" if seconds is None else repr(seconds)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--leaves", type=int, default=1000)
    parser.add_argument("--impls", default=",".join(DEFAULT_IMPLS))
    parser.add_argument(
        "--tree", type=Path, default=None, help="a checkout whose hierplan to count"
    )
    parser.add_argument("--tools", type=int, default=0, help="tools available to hierplan's steps")
    parser.add_argument(
        "--step-timeout",
        type=_seconds,
        default=overhead.STEP_TIMEOUT_S,
        metavar="SECONDS|none",
        help="hierplan's step deadline (default: RunSettings' own; none: no deadline)",
    )
    parser.add_argument("--out", type=Path, default=perfkit.RESULTS)
    parser.add_argument("--no-out", action="store_true")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.leaves < 1:
        parser.error(f"--leaves must be at least 1, not {args.leaves}")
    if args.tools < 0:
        parser.error(f"--tools must be 0 or more, not {args.tools}")
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    unknown = sorted(set(impls) - set(DEFAULT_IMPLS))
    if unknown or not impls:
        parser.error(f"--impls takes some of {', '.join(DEFAULT_IMPLS)}; not {unknown or impls}")
    if args.tree is not None and not (args.tree / "hierplan" / "__init__.py").is_file():
        parser.error(f"--tree {args.tree}: no hierplan package there (hierplan/__init__.py)")
    args.impl_list = impls
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Count, print a table, write ``results/instructions.json``; return the figures."""
    args = _parse(argv)
    if args.child is not None:
        child(args.child, args.leaves, args.tools, args.step_timeout)
        return {}
    if shutil.which(VALGRIND) is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    details = perfkit.machine()
    perfkit.print_machine(details)
    rows, notes = [], []
    for impl in args.impl_list:
        if impl == "langgraph" and not overhead.langgraph_available():
            notes.append("langgraph: not installed (pip install -e '.[bench]')")
            continue
        print(f"counting {impl} at {args.leaves:,} leaves under valgrind...", flush=True)
        rows.append(count(impl, args.leaves, args.tree, args.tools, args.step_timeout))
    measured = next((r["hierplan_source"] for r in rows if r["hierplan_source"]), None)
    if measured is not None:  # the hierplan counted (``--tree``), not the one running this script
        details["hierplan_commit"] = measured["commit"]
        details["hierplan_package_commit"] = measured["package_commit"]
        details["hierplan_package_dirty"] = measured["package_dirty"]
    data = {
        "benchmark": "instructions",
        "command": "python benchmarks/instructions.py " + " ".join(argv or sys.argv[1:]),
        "machine": details,
        "tree": None if args.tree is None else str(args.tree),
        "hierplan_measured": measured,
        "leaves": args.leaves,
        "tools": args.tools,
        "step_timeout_s": args.step_timeout,
        "rows": rows,
        "ratios": ratios(rows),
        "notes": notes,
    }
    print(
        perfkit.table(
            ["impl", "leaves", "instructions", "per leaf"],
            [[r["impl"], r["leaves"], r["instructions"], round(r["per_leaf"])] for r in rows],
        )
    )
    for name, value in data["ratios"].items():
        print(f"{name.replace('_', ' ')}: {'—' if value is None else f'{value:.2f}'}")
    for note in notes:
        print(note)
    if measured is not None:
        dirty = ", with uncommitted changes" if measured["package_dirty"] else ""
        package = measured["package_commit"]
        print(f"hierplan measured: commit {measured['commit']} (package {package}{dirty})")
    perfkit.write_results("instructions", data, None if args.no_out else args.out)
    return data


if __name__ == "__main__":
    main()
