"""Budgets that plan: what a run does with a budget below what it would spend.

    python benchmarks/budget_planning.py [--percents 30,50,70,100] [--repeats 5] [--seed 7]
        [--seeds 1-9] [--ks 1,2,4,8,16,32] [--allocations need,equal,on-demand]
        [--out DIR | --no-out]

1. ``data_migration``, hierarchical, concurrency 64, seed 7 (``--seed``: the targets are
   set at seed 7; other seeds show how much one seed's noise decides), no simulated latency:
   first the unbudgeted run (its cost is the baseline, measured in this run), then the same
   run with a USD budget of each percentage of that cost, ``--repeats`` times (see
   :func:`migration_table` for why the same seed may vary). For each: the run's status, the
   share of the budget it spent, and the tables migrated and verified (``run.json``'s
   verification). Targets: at least 80 % of the budget spent, never more than 100 %, tables
   done growing with the budget, at least half of the tables at 70 %. With ``--seeds``, the
   same percents once at each of those seeds, summarized (see :func:`seeds_summary`). The
   model is the offline simulator: **SIMULATED**.
2. K-delegation: a plan of K parallel steps (as many as its prompt's budget line says fit,
   the rest left out), each an executor that calls a tool and answers
   (up to 20 model calls: tool calls, then an answer), every call using all of its
   ``max_tokens`` and none lowered
   (``min_output_fraction=1``: a call is all or nothing, as a call limit), under a token limit
   worth the planning call and 20 executor calls. For each K and allocation: calls made ÷ 20.
   Targets with the default allocation (``need``): at least 0.8 at every K, never above 1.00.
   Scripted models, no simulator.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

import hierplan
from hierplan.agents.prompts import parse_plan_prompt, parse_step_prompt
from hierplan.budgets.budget import Budget
from hierplan.budgets.instrument import BudgetInstrument
from hierplan.core.settings import RunSettings
from hierplan.errors import BudgetTooSmall
from hierplan.models.base import ModelRequest, ModelResponse, ToolCall
from hierplan.models.scripted import FunctionModel
from hierplan.models.tokens import estimate_request_tokens
from hierplan.pricing import Price, PriceTable
from hierplan.simulator.profiles import Simulator
from hierplan.tools.base import tool
from hierplan.units import Usage

OUT = Path(__file__).parent / "results"
PRICING = PriceTable({"bench:model": Price(1.0, 4.0)})
CALLS_WORTH = 20
TABLES = range(14)  # the sample shop database's tables
EXECUTOR_MAX_TOKENS = 400
CALL_INPUT = 100
PLAN_CALL = 300  # the planner's usage: 200 in, 100 out


# -- 1. data_migration under a budget ------------------------------------------------------


async def migration(usd: float | None, workdir: Path, seed: int = 7) -> dict[str, Any]:
    """One hierarchical data_migration run (concurrency 64) with ``usd``."""
    settings = RunSettings(strategy="hierarchical", concurrency=64, seed=seed)
    try:
        result = await hierplan.run(
            hierplan.RunSpec(
                scenario="data_migration",
                settings=settings,
                model=Simulator(latency_scale=0),
                budget=None if usd is None else hierplan.BudgetSpec(usd=usd),
                workdir=workdir,
            )
        )
    except BudgetTooSmall as exc:  # refused before any call: nothing spent, nothing done
        return {"status": "refused", "spent_usd": 0.0, "tables_done": 0, "error": str(exc)}
    totals = result.totals()
    details = (result.verification or {}).get("details", {})
    return {
        "status": result.status,
        "spent_usd": totals["cost_usd"],
        "tables_done": details.get("tables_done"),
        "tables": details.get("tables"),
    }


def migration_table(percents: list[int], repeats: int = 1, seed: int = 7) -> list[dict[str, Any]]:
    """The unbudgeted run, then ``repeats`` runs at each percentage of its cost.

    The same seed does not make the same run under a budget: sixty-four nodes run at once,
    and what each planner's prompt says is left depends on what its siblings have spent by
    then, which is a different prompt, so a different simulated answer. Hence the repeats."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = anyio.run(migration, None, Path(tmp) / "unbudgeted", seed)
        rows.append({"percent": None, "budget_usd": None, "repeat": 0, **base})
        for pct in percents:
            usd = round(base["spent_usd"] * pct / 100, 6)
            for repeat in range(repeats):
                row = anyio.run(migration, usd, Path(tmp) / f"at{pct}-{repeat}", seed)
                row.update(percent=pct, budget_usd=usd, repeat=repeat, used=row["spent_usd"] / usd)
                rows.append(row)
    return rows


def seeds_table(percents: list[int], seeds: list[int]) -> list[dict[str, Any]]:
    """:func:`migration_table` once at each of ``seeds``: how much one seed's draws decide
    (each row is a run, with its ``seed``; the tables themselves are left out)."""
    return [
        {"seed": seed, **{k: v for k, v in row.items() if k != "tables"}}
        for seed in seeds
        for row in migration_table(percents, 1, seed)
    ]


def seeds_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the seeds of :func:`seeds_table`: for each percent, the tables done (mean, least,
    most) and the share of the budget spent (least, most); and at how many seeds the tables
    done never fall as the budget grows."""
    seeds = sorted({r["seed"] for r in rows})
    percents = sorted({r["percent"] for r in rows if r["percent"] is not None})
    by_percent: dict[str, Any] = {}
    for pct in percents:
        runs = [r for r in rows if r["percent"] == pct]
        tables = [r["tables_done"] or 0 for r in runs]
        used = [r["used"] for r in runs]
        by_percent[str(pct)] = {
            "tables_mean": sum(tables) / len(tables),
            "tables_least": min(tables),
            "tables_most": max(tables),
            "used_least": min(used),
            "used_most": max(used),
        }
    growing = 0
    for seed in seeds:
        done = {r["percent"]: r["tables_done"] or 0 for r in rows if r["seed"] == seed}
        series = [done[p] for p in percents if p in done]
        growing += all(a <= b for a, b in itertools.pairwise(series))
    return {"seeds": seeds, "by_percent": by_percent, "seeds_growing": growing}


def parse_seeds(text: str) -> list[int]:
    """``"1-9"`` or ``"1,4,7"`` (or a mix) as a list of seeds."""
    seeds: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        try:
            seeds.extend(range(int(first), int(last or first) + 1))
        except ValueError:
            raise SystemExit(
                f"--seeds takes numbers and ranges such as 1-9,12; got {part!r}"
            ) from None
    return seeds


# -- 2. K-delegation ------------------------------------------------------------------------


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


def _planner(k: int) -> FunctionModel:
    """K delegations, or as many as the budget line of the prompt says fit (each at least one
    executor call), the rest left out: what a planner told its budget writes."""

    def respond(request: ModelRequest) -> ModelResponse:
        prompt = parse_plan_prompt(request.messages)
        assert prompt is not None
        count = k
        budget = prompt.budget
        while budget is not None and count > 1 and not budget.fits(0, count, 100):
            count -= 1
        steps = [
            {"id": f"d{i}", "title": f"Delegation {i}", "instruction": f"Delegation {i}"}
            for i in range(1, count + 1)
        ]
        data: dict[str, Any] = {"goal": prompt.goal, "steps": steps}
        if count < k:
            data["left_out"] = f"delegations {count + 1} to {k}: the budget does not cover them"
        return ModelResponse(text=json.dumps(data), output=data, usage=Usage(200, PLAN_CALL - 200))

    model = FunctionModel(respond, name="planner")
    model.priced_as = "bench:model"
    return model


def _executor(calls: list[str]) -> FunctionModel:
    """A delegation: tool calls until its last turn, then an answer; every call uses all of
    its ``max_tokens``."""

    async def respond(request: ModelRequest) -> ModelResponse:
        prompt = parse_step_prompt(request.messages)
        assert prompt is not None
        calls.append(prompt.instruction)
        await anyio.sleep(0.005)  # the calls of parallel steps overlap
        # Every call costs the same: CALL_INPUT tokens of input (no more than any call's
        # estimate, so never above what was reserved) and all of its max_tokens.
        assert estimate_request_tokens(request) >= CALL_INPUT
        usage = Usage(CALL_INPUT, request.max_tokens)
        done = sum(1 for m in request.messages if m.role == "tool")
        if done < CALLS_WORTH - 1:
            call = ToolCall(f"c{len(calls)}", "lookup", {"key": f"{prompt.instruction} {done}"})
            return ModelResponse(tool_calls=(call,), usage=usage)
        return ModelResponse(text=f"found {prompt.instruction}", usage=usage)

    model = FunctionModel(respond, name="executor")
    model.priced_as = "bench:model"
    return model


async def delegation(
    k: int, allocation: str | None, limit: int | None
) -> tuple[int, int, int, int]:
    """Executor calls made, tokens spent, the planning call's tokens and the largest executor
    call's, by K delegations under ``limit`` (``None``: no budget)."""
    calls: list[str] = []
    instruments = []
    if limit is not None and allocation is not None:
        instruments.append(
            BudgetInstrument(
                Budget(tokens=limit),
                allocation=allocation,
                on_demand_fraction=1.0,
                min_output_fraction=1.0,
            )
        )
    settings = RunSettings(
        strategy="dag",
        concurrency=64,
        executor_max_tokens=EXECUTOR_MAX_TOKENS,
        executor_max_turns=CALLS_WORTH,
        planner_max_tokens=1_000,
        max_replans=0,
        max_retries=0,
    )
    result = await hierplan.run(
        hierplan.RunSpec(
            goal=f"Ask {k} helpers in parallel",
            model=_planner(k),
            executor_model=_executor(calls),
            settings=settings,
            pricing=PRICING,
        ),
        tools=[lookup],
        instruments=instruments,
    )
    sizes = [c.usage.total_tokens for n in result.nodes() for c in n.calls if n.path != "1"]
    plan = sum(c.usage.total_tokens for c in result.tree.calls)
    return len(calls), plan + sum(sizes), plan, max(sizes, default=0)


def delegation_table(ks: list[int], allocations: list[str]) -> list[dict[str, Any]]:
    """Calls made ÷ the calls the limit is worth, for each K and allocation: the limit is the
    planning call and 20 executor calls, each of which costs the same."""
    rows = []
    limit = PLAN_CALL + CALLS_WORTH * (CALL_INPUT + EXECUTOR_MAX_TOKENS)
    for k in ks:
        for allocation in allocations:
            made, spent, _, _ = anyio.run(delegation, k, allocation, limit)
            rows.append(
                {
                    "k": k,
                    "allocation": allocation,
                    "limit_tokens": limit,
                    "calls": made,
                    "calls_per_limit": made / CALLS_WORTH,
                    "spent_per_limit": spent / limit,
                }
            )
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run both parts and print their tables; write ``results/budget_planning.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--percents", default="30,50,70,100")
    parser.add_argument("--repeats", type=int, default=5, help="budgeted runs at each percent")
    parser.add_argument("--seed", type=int, default=7, help="the simulator's seed")
    parser.add_argument(
        "--seeds",
        default="",
        help="also run each percent once at each of these seeds (1-9) and summarize them",
    )
    parser.add_argument("--ks", default="1,2,4,8,16,32")
    parser.add_argument("--allocations", default="need,equal,on-demand")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--no-out", action="store_true")
    args = parser.parse_args(argv)
    percents = [int(p) for p in args.percents.split(",") if p]
    ks = [int(k) for k in args.ks.split(",") if k]
    allocations = [a for a in args.allocations.split(",") if a]
    report: dict[str, Any] = {
        "simulated": True,
        "seed": args.seed,
        "migration": migration_table(percents, args.repeats, args.seed),
        "delegation": delegation_table(ks, allocations),
    }
    seeds = parse_seeds(args.seeds)
    if seeds:
        runs = seeds_table(percents, seeds)
        report["seeds"] = {**seeds_summary(runs), "runs": runs}
    print(f"data_migration, hierarchical, c=64, seed {args.seed} [SIMULATED]")
    print(f"{'budget':>10} {'run':>4} {'status':>10} {'spent':>10} {'used':>6} {'tables':>7}")
    for row in report["migration"]:
        label = "none" if row["percent"] is None else f"{row['percent']}%"
        used = "" if row["percent"] is None else f"{row['used']:.2f}"
        print(
            f"{label:>10} {row['repeat'] + 1:>4} {row['status']:>10} {row['spent_usd']:>10.6f} "
            f"{used:>6} {row['tables_done']!s:>4}/{len(row.get('tables') or TABLES)}"
        )
    print(f"\nK-delegation: a limit worth {CALLS_WORTH} calls (calls made / {CALLS_WORTH})")
    print(f"{'K':>4} " + " ".join(f"{a:>10}" for a in allocations))
    for k in ks:
        cells = [r for r in report["delegation"] if r["k"] == k]
        print(f"{k:>4} " + " ".join(f"{r['calls_per_limit']:>10.2f}" for r in cells))
    if seeds:
        _print_seeds(report["seeds"])
    if not args.no_out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "budget_planning.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _print_seeds(summary: dict[str, Any]) -> None:
    seeds = summary["seeds"]
    print(
        f"\ndata_migration at {len(seeds)} seeds ({seeds[0]}..{seeds[-1]}), "
        "one run each [SIMULATED]"
    )
    print(f"{'budget':>7} {'tables mean':>12} {'least':>6} {'most':>5} {'used':>11}")
    for pct, cell in summary["by_percent"].items():
        used = f"{cell['used_least']:.2f}-{cell['used_most']:.2f}"
        print(
            f"{pct + '%':>7} {cell['tables_mean']:>12.1f} {cell['tables_least']:>6} "
            f"{cell['tables_most']:>5} {used:>11}"
        )
    print(
        f"tables done never fall as the budget grows at {summary['seeds_growing']} "
        f"of {len(seeds)} seeds"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
