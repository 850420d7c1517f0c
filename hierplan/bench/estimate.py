"""What a benchmark on a real model will cost, estimated before anything is paid for.

The estimate is tasks x seeds x strategies x a per-run estimate. The per-run estimate of each
suite and strategy is the mean cost of the offline simulator's runs (``typical`` profile, no
latency) of the same strategy on up to :data:`SAMPLE_TASKS` of the same tasks, priced as the
real model: the same prompts, plans and tool results a competent model would meet, counted and
priced as the model's would be. A real model may well spend more (hidden reasoning, longer
answers, more turns), so ``--budget-usd`` is what bounds the spend.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hierplan.bench.harness import BenchConfig, BenchRun, run_one
from hierplan.bench.records import model_price
from hierplan.runner.models import priced_as_of
from hierplan.simulator.model import SimulatedModel
from hierplan.simulator.profiles import PROFILES

SAMPLE_TASKS = 3
"""Tasks per suite and strategy the simulator runs for the per-run estimate."""


def usd_text(amount: float) -> str:
    """``$12.34``, or two significant digits below a cent (``$0.0048``): an estimate of
    ``$0.00`` would say nothing."""
    if amount <= 0 or amount >= 0.01:
        return f"${amount:.2f}"
    return f"${amount:.{1 - math.floor(math.log10(amount))}f}"


@dataclass(slots=True, frozen=True)
class SuiteEstimate:
    """One suite's share: its runs (tasks x seeds x strategies) and their estimated cost."""

    suite: str
    tasks: int
    seeds: int
    strategies: int
    runs: int
    per_run_usd: float | None
    usd: float | None


@dataclass(slots=True, frozen=True)
class CostEstimate:
    """The estimated cost of a benchmark's runs on ``model``, priced as ``priced_as``."""

    model: str
    priced_as: str
    price_in: float | None
    price_out: float | None
    suites: tuple[SuiteEstimate, ...]

    @property
    def runs(self) -> int:
        """Every run about to start."""
        return sum(s.runs for s in self.suites)

    @property
    def usd(self) -> float | None:
        """The total, ``None`` when the model has no known price."""
        parts = [s.usd for s in self.suites]
        return None if any(p is None for p in parts) else math.fsum(p or 0.0 for p in parts)

    def lines(self) -> list[str]:
        """The estimate as lines of text, a line a suite, then the total."""
        price = (
            "no known price"
            if self.price_in is None
            else f"${self.price_in:g} / ${self.price_out:g} per 1M input / output tokens"
        )
        out = [f"This bench makes {self.runs:,} runs on {self.model} ({price}):"]
        for s in self.suites:
            cost = (
                "cost unknown"
                if s.usd is None or s.per_run_usd is None
                else f"~{usd_text(s.per_run_usd)} a run, ~{usd_text(s.usd)}"
            )
            out.append(
                f"  {s.suite}: {s.tasks} tasks × {s.seeds} seeds × {s.strategies} strategies "
                f"= {s.runs:,} runs, {cost}"
            )
        total = self.usd
        out.append(
            "Estimated cost: unknown (no price for " + self.priced_as + ")"
            if total is None
            else f"Estimated cost: ~{usd_text(total)} (per-run figures from the offline "
            f"simulator's runs of the same tasks, priced as {self.priced_as}; a real model may "
            "spend more, e.g. on hidden reasoning: --budget-usd caps the whole bench)"
        )
        return out


async def estimate_cost(config: BenchConfig, runs: Sequence[BenchRun]) -> CostEstimate:
    """The estimated cost of ``runs`` on ``config.model`` (see the module's description)."""
    priced = priced_as_of(config.model)
    price = model_price(config.model, config)
    known = price["price_in_per_mtok"] is not None
    by_cell: dict[tuple[str, str], list[BenchRun]] = defaultdict(list)
    for spec in runs:
        by_cell[(spec.suite.name, spec.strategy)].append(spec)
    per_run: dict[tuple[str, str], float | None] = {}
    for cell, specs in by_cell.items():
        per_run[cell] = await _per_run(config, priced, specs) if known else None
    suites = []
    for suite in dict.fromkeys(s.suite.name for s in runs):
        mine = [s for s in runs if s.suite.name == suite]
        costs = [per_run[(s.suite.name, s.strategy)] for s in mine]
        usd = None if any(c is None for c in costs) else math.fsum(c or 0.0 for c in costs)
        suites.append(
            SuiteEstimate(
                suite=suite,
                tasks=len({s.task.task_id for s in mine}),
                seeds=len({s.seed for s in mine}),
                strategies=len({s.strategy for s in mine}),
                runs=len(mine),
                per_run_usd=None if usd is None else usd / len(mine),
                usd=usd,
            )
        )
    return CostEstimate(
        config.model,
        priced,
        price["price_in_per_mtok"],
        price["price_out_per_mtok"],
        tuple(suites),
    )


async def _per_run(config: BenchConfig, priced: str, specs: Sequence[BenchRun]) -> float | None:
    """The mean cost of simulated runs of up to :data:`SAMPLE_TASKS` of ``specs``' tasks."""
    sample = list({s.task.task_id: s for s in specs}.values())[:SAMPLE_TASKS]
    simulated = replace(
        config,
        model="sim",
        profile=PROFILES["typical"],
        latency_scale=0.0,
        base_url=None,
        timeout_s=None,
        save_runs=False,
    )
    model = SimulatedModel(None, profile=PROFILES["typical"], latency_scale=0, priced_as=priced)
    costs = []
    for spec in sample:
        record = await run_one(replace(spec, seed=0), simulated, model)
        cost = record.get("cost_usd")
        if cost is not None:
            costs.append(float(cost))
    return math.fsum(costs) / len(costs) if costs else None
