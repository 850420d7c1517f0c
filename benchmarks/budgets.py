"""Budget benchmarks: ledger throughput and what the budget wrapper costs per model call.

    python benchmarks/budgets.py [--pairs 200000] [--calls 20000] [--leaves 1000] [--repeats 5]

1. Reserve+settle pairs per second on the local ledger: through the async contract (what the
   model wrapper awaits), through the synchronous core, and for an on-demand account three
   levels deep (each reservation also checks its ancestors).
2. The model wrapper alone: ``node.call_model`` on a zero-latency model, with and without a
   budget instrument, per call and as a ratio.
3. The same whole run with and without a budget (a flat plan of ``--leaves`` executor steps,
   one zero-latency model call each): wall time per leaf and the ratio.

Every comparison is measured in this process, alternating the two sides, best of ``--repeats``.
Times are CPU time of this process (``time.process_time``): every side is CPU-bound (the models
answer at once), and CPU time is not disturbed by other programs sharing the machine.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

import hierplan
from hierplan.agents.prompts import parse_plan_prompt
from hierplan.budgets.budget import Budget, Draw, Fixed
from hierplan.budgets.instrument import BudgetInstrument
from hierplan.budgets.ledger import LocalLedger
from hierplan.core.settings import RunSettings
from hierplan.hierarchy.context import NodeContext, RunContext
from hierplan.models.base import Message, ModelRequest, ModelResponse
from hierplan.models.scripted import FunctionModel
from hierplan.pricing import Price, PriceTable
from hierplan.records import NodeRecord
from hierplan.tools.base import Toolbox
from hierplan.units import Usage

PRICING = PriceTable({"bench:model": Price(1.0, 4.0)})
REQUEST = ModelRequest(
    messages=(Message("system", "You execute one step."), Message("user", "STEP: do it")),
    max_tokens=256,
)


def best(samples: list[float]) -> float:
    """The least of the timings: the run least disturbed by the rest of the machine."""
    return min(samples)


async def ledger_pairs(pairs: int) -> dict[str, float]:
    """Reserve+settle pairs per second, three ways."""
    ledger = LocalLedger()
    root = ledger.open_now("1", None, Fixed(10**12, 10**15))
    started = time.process_time()
    for _ in range(pairs):
        held = await ledger.reserve(root, 1_000, 1_000_000, "execution")
        assert held is not None
        await ledger.settle(held, 500, 500_000)
    contract = pairs / (time.process_time() - started)

    started = time.process_time()
    for _ in range(pairs):
        held = ledger.reserve_now(root, 1_000, 1_000_000, "execution")
        assert held is not None
        ledger.settle_now(held, 500, 500_000)
    core = pairs / (time.process_time() - started)

    leaf = root
    for depth in range(3):
        leaf = ledger.open_now(f"1.{depth}", leaf, Draw(0.9))
    started = time.process_time()
    for _ in range(pairs):
        held = await ledger.reserve(leaf, 1_000, 1_000_000, "execution")
        assert held is not None
        await ledger.settle(held, 500, 500_000)
    drawing = pairs / (time.process_time() - started)
    return {"contract": contract, "sync core": core, "3-deep on-demand": drawing}


def _respond(request: ModelRequest) -> ModelResponse:
    return ModelResponse(text="done", usage=Usage(30, 5))


async def wrapper_calls(calls: int, repeats: int) -> dict[str, float]:
    """Seconds per ``call_model`` with and without the budget wrapper."""

    async def measure(budgeted: bool) -> float:
        model = FunctionModel(_respond, priced_as="bench:model")
        instruments = []
        if budgeted:
            instruments.append(BudgetInstrument(Budget(tokens=10**12, usd=10**6)))
        ctx = RunContext(
            run_id="bench",
            settings=RunSettings(),
            toolbox=Toolbox(),
            planner_model=model,
            executor_model=model,
            pricing=PRICING,
            instruments=instruments,
        )
        node = NodeContext(ctx, NodeRecord("1", "executor", "g", 1), allowed_tools=frozenset())
        for instrument in instruments:
            instrument.run_scope(ctx)
        scope = instruments[0].node_scope(node) if instruments else None
        if scope is not None:
            await scope.__aenter__()
        started = time.process_time()
        for _ in range(calls):
            await node.call_model(REQUEST)
        elapsed = time.process_time() - started
        if scope is not None:
            await scope.__aexit__(None, None, None)
        return elapsed / calls

    plain: list[float] = []
    budgeted: list[float] = []
    for _ in range(repeats):
        plain.append(await measure(False))
        budgeted.append(await measure(True))
    return {"plain": best(plain), "budgeted": best(budgeted)}


def _flat_plan_model(leaves: int) -> FunctionModel:
    def respond(request: ModelRequest) -> ModelResponse:
        if request.phase == "execution":
            return ModelResponse(text="done", usage=Usage(60, 5))
        prompt = parse_plan_prompt(request.messages)
        assert prompt is not None
        steps = [
            {"id": f"s{i}", "title": f"step {i}", "instruction": f"Do part {i}"}
            for i in range(leaves)
        ]
        data = {"goal": prompt.goal, "steps": steps}
        return ModelResponse(text="plan", output=data, usage=Usage(500, 100))

    return FunctionModel(respond, priced_as="bench:model")


async def whole_run(leaves: int, repeats: int) -> dict[str, float]:
    """Seconds per leaf of the same run without and with a budget."""
    settings = RunSettings(
        strategy="dag", max_steps=leaves, concurrency=64, plan_concurrency=64, max_retries=0
    )

    async def measure(budget: bool) -> float:
        options: dict[str, Any] = {}
        if budget:
            options = {"budget": {"tokens": 10**12, "usd": 10**6.0}}
        started = time.process_time()
        result = await hierplan.run(
            hierplan.RunSpec(
                goal="A flat plan",
                model=_flat_plan_model(leaves),
                settings=settings,
                pricing=PRICING,
            ),
            **options,
        )
        elapsed = time.process_time() - started
        assert result.status == "succeeded", result.error
        assert (result.budget is not None) == budget
        return elapsed / leaves

    plain: list[float] = []
    budgeted: list[float] = []
    for _ in range(repeats):
        plain.append(await measure(False))
        budgeted.append(await measure(True))
    return {"plain": best(plain), "budgeted": best(budgeted), "spread": _spread(plain)}


def _spread(samples: list[float]) -> float:
    return statistics.pstdev(samples) / statistics.mean(samples) if len(samples) > 1 else 0.0


def machine() -> str:
    """What the figures were measured on."""
    return (
        f"{platform.platform()}, Python {platform.python_version()}, {os.cpu_count()} CPU(s), "
        f"anyio {importlib.metadata.version('anyio')}"
    )


def run(fn: Callable[..., Awaitable[dict[str, float]]], *args: Any) -> dict[str, float]:
    """Run one benchmark in a fresh event loop."""
    return anyio.run(fn, *args)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmarks, print a table, return the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=200_000)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--leaves", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    args = parser.parse_args(argv)

    pairs = run(ledger_pairs, args.pairs)
    calls = run(wrapper_calls, args.calls, args.repeats)
    leaves = run(whole_run, args.leaves, args.repeats)
    figures: dict[str, Any] = {
        "machine": machine(),
        "reserve_settle_pairs_per_s": pairs,
        "call_model_us": {k: v * 1e6 for k, v in calls.items()},
        "call_overhead_us": (calls["budgeted"] - calls["plain"]) * 1e6,
        "call_ratio": calls["budgeted"] / calls["plain"],
        "run_us_per_leaf": {k: leaves[k] * 1e6 for k in ("plain", "budgeted")},
        "run_ratio": leaves["budgeted"] / leaves["plain"],
        "run_spread": leaves["spread"],
    }
    if args.json:
        print(json.dumps(figures, indent=1))
        return figures
    print(f"machine: {figures['machine']}")
    print(f"reserve+settle pairs per second ({args.pairs:,} pairs):")
    for name, rate in pairs.items():
        print(f"  {name:<18} {rate:>12,.0f}")
    print(f"call_model on a zero-latency model ({args.calls:,} calls, best of {args.repeats}):")
    print(
        f"  without budget {figures['call_model_us']['plain']:.2f} us, with budget "
        f"{figures['call_model_us']['budgeted']:.2f} us: +{figures['call_overhead_us']:.2f} us "
        f"per call, ratio {figures['call_ratio']:.2f}x"
    )
    print(f"the same run, {args.leaves:,} leaves of one call each (best of {args.repeats}):")
    print(
        f"  without budget {figures['run_us_per_leaf']['plain']:.1f} us/leaf, with budget "
        f"{figures['run_us_per_leaf']['budgeted']:.1f} us/leaf: ratio {figures['run_ratio']:.3f}x"
    )
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
