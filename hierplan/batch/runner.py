"""Run one goal of a batch within its grant: the same code on the local backend and on Celery."""

from __future__ import annotations

import traceback
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hierplan.batch.budget import Amounts, GoalLedger
from hierplan.batch.goals import BatchGoal, goal_seed, suite_task
from hierplan.batch.toolsets import SharedToolsets
from hierplan.bench.base import TaskEnv
from hierplan.bench.suites import get_suite
from hierplan.budgets.budget import DEFAULT_ALLOCATION, Budget
from hierplan.budgets.instrument import BudgetInstrument
from hierplan.core.instrument import Instrument
from hierplan.core.settings import RunSettings
from hierplan.errors import HierplanError
from hierplan.models.base import parse_model_string
from hierplan.models.counting import DEFAULT_RESERVATION, Reservation
from hierplan.pricing import PriceTable
from hierplan.records import RunResult
from hierplan.redact import redact
from hierplan.runner.models import priced_as_of, with_price
from hierplan.runner.run import run
from hierplan.runner.spec import ModelChoice, ModelSpec, RunSpec, is_simulated
from hierplan.simulator.oracle import Oracle
from hierplan.simulator.profiles import Simulator
from hierplan.tools.base import Tool, Toolset
from hierplan.tools.config import ToolsetSpec, toolset_entries
from hierplan.units import pico_to_usd

RunFunction = Callable[..., Awaitable[RunResult]]


@dataclass(slots=True, frozen=True)
class RunOptions:
    """Batch-wide defaults of every goal (a goal's line overrides them)."""

    model: str = "sim"
    strategy: str = "hierarchical"
    allocation: str = DEFAULT_ALLOCATION
    reservation: Reservation = DEFAULT_RESERVATION
    """How a call's input is reserved (``--reservation``)."""
    seed: int = 0
    sim_profile: str = "typical"
    sim_latency_scale: float = 1.0
    run_settings: dict[str, Any] = field(default_factory=dict)
    """Other run settings of every goal (``--set``), checked; a goal's line overrides them."""
    base_url: str | None = None
    """The API base URL of the goals' provider models (``--base-url``)."""
    timeout: float | None = None
    """Seconds one model call of a provider model may wait (``--timeout``)."""
    price_in: float | None = None
    """USD per million input tokens of the goals' models (``--price-in``)."""
    price_out: float | None = None
    """USD per million output tokens of the goals' models (``--price-out``)."""
    tools: list[dict[str, Any]] = field(default_factory=list)
    """Toolsets of every goal (``--tools``, ``--mcp``), as written: each goal gets them and
    those of its line."""

    def toolsets(self) -> tuple[ToolsetSpec, ...]:
        """:attr:`tools` as entries."""
        return toolset_entries(self.tools)

    def to_dict(self) -> dict[str, Any]:
        """As plain data (for the journal and the Celery message)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunOptions:
        """The options :meth:`to_dict` wrote."""
        return cls(**data)

    def model_choice(self, model: str, oracle: Oracle | None) -> ModelChoice:
        """A goal's model: the simulator with the batch's knobs (on ``oracle``, a benchmark
        task's), or a provider's model with ``--base-url`` and ``--timeout`` (which reach
        provider models only: a goal on the simulator in a batch of provider goals keeps its
        simulator)."""
        if is_simulated(model):
            return Simulator(
                profile=self.sim_profile,
                latency_scale=self.sim_latency_scale,
                priced_as=parse_model_string(model).name or None,
                oracle=oracle,
            )
        return ModelSpec(name=model, base_url=self.base_url, timeout_s=self.timeout)

    def run_spec(
        self, goal: BatchGoal, workdir: Path, text: str | None, oracle: Oracle | None
    ) -> RunSpec:
        """The spec of ``goal``'s run (``text``: its goal, a benchmark task's when it names
        one), working in ``workdir``."""
        spec = goal.spec
        return RunSpec(
            goal=text,
            scenario=spec.scenario,
            model=self.model_choice(spec.model or self.model, oracle),
            settings=self.settings(goal),
            price_in=self.price_in,
            price_out=self.price_out,
            workdir=workdir / "work" if spec.scenario else None,
            run_id=goal.id,
            tools=goal.tools(self.toolsets()),
        )

    def pricing(self, goals: Iterable[BatchGoal], base: PriceTable | None = None) -> PriceTable:
        """``base`` (the built-in prices by default) with ``--price-in``/``--price-out`` set
        for the model of each of ``goals``, as a run sets them for its models."""
        models = [priced_as_of(goal.spec.model or self.model) for goal in goals]
        return with_price(base or PriceTable(), self.price_in, self.price_out, models)

    def settings(self, goal: BatchGoal) -> RunSettings:
        """The goal's run settings: its own, else these defaults. A goal without a seed of
        its own gets one derived from the batch's seed and its id (see :func:`goal_seed`)."""
        spec = goal.spec
        values: dict[str, Any] = {
            "strategy": spec.strategy or self.strategy,
            "seed": spec.seed if spec.seed is not None else goal_seed(self.seed, goal.id),
        }
        values |= self.run_settings
        if spec.max_depth is not None:
            values["max_depth"] = spec.max_depth
        if spec.concurrency is not None:
            values["concurrency"] = spec.concurrency
        return RunSettings.model_validate(values | (spec.settings or {}))


@dataclass(slots=True)
class GoalOutcome:
    """How a goal's attempt ended. ``state``: succeeded or failed; ``status``: the run's status
    (or ``error`` when it raised); ``record``: its ``run.json`` text, when it returned one."""

    state: str
    status: str
    reason: str | None
    record: str | None


GOAL_BUDGET_OPTIONS = (
    "the goal's budget_tokens / budget_usd, or --goal-budget-tokens / --goal-budget-usd "
    "(within the batch's --budget-tokens / --budget-usd)"
)
"""Where a batch's user sets a goal's budget, named when a goal's call is refused."""


def inner_budget(grant: Amounts, cap: Amounts) -> Budget:
    """The run's own budget: its grant where the batch is limited, else its own cap."""
    tokens = grant[0] if grant[0] is not None else cap[0]
    pico = grant[1] if grant[1] is not None else cap[1]
    return Budget(tokens, None if pico is None else pico_to_usd(pico))


async def run_goal(
    goal: BatchGoal,
    options: RunOptions,
    ledger: GoalLedger,
    budget: Budget,
    workdir: Path,
    instruments: Sequence[Instrument] = (),
    run_fn: RunFunction = run,
    shared: SharedToolsets | None = None,
) -> GoalOutcome:
    """Run ``goal`` with ``budget``, its calls reserved on ``ledger``; never raises for a
    failure of the goal itself (it is recorded as ``failed`` with the reason: a server of its
    toolsets that cannot start, say). ``run_fn`` is :func:`hierplan.run` unless a test or an
    embedding application wraps it; ``shared`` holds the servers goals share (entries marked
    ``shared``), which without it each goal opens for itself."""
    spec = goal.spec
    budgeting = BudgetInstrument(
        budget,
        allocation=spec.allocation or options.allocation,
        reservation=spec.reservation or options.reservation,
        ledger=ledger,
        budget_options=GOAL_BUDGET_OPTIONS,
    )
    task_env: TaskEnv | None = None
    oracle: Oracle | None = None
    try:
        if spec.suite is not None and spec.task is not None:
            suite = get_suite(spec.suite)
            task_env = suite.environment(
                suite_task(spec.suite, spec.task), latency_scale=options.sim_latency_scale
            )
            oracle = suite.oracle()
        text = task_env.goal if task_env is not None else spec.goal
        run_spec, borrowed = _shared_apart(options.run_spec(goal, workdir, text, oracle), shared)
        result = await run_fn(
            run_spec,
            tools=[*(() if task_env is None else task_env.tools), *borrowed],
            instruments=[*instruments, budgeting],
        )
        if task_env is not None:
            # The suite's verifier checks the world (or the gold answer), as the bench does.
            result.verification = task_env.verify(result.answer).to_dict()
    # A reason is journaled and shown: an error's text may quote a URL with its credentials.
    except HierplanError as exc:
        return GoalOutcome("failed", "error", redact(f"{type(exc).__name__}: {exc}"), None)
    except Exception as exc:  # a bug must not take the batch down: record it on the goal
        where = traceback.format_exception_only(exc)[-1].strip()
        return GoalOutcome("failed", "error", redact(where), None)
    return outcome_of(result)


def _shared_apart(
    spec: RunSpec, shared: SharedToolsets | None
) -> tuple[RunSpec, list[Tool | Toolset]]:
    """``spec`` without its ``shared`` entries, and those as toolsets that borrow the shared
    servers (none when nothing is shared)."""
    if shared is None or not any(entry.shared for entry in spec.tools):
        return spec, []
    own = tuple(entry for entry in spec.tools if not entry.shared)
    borrowed: list[Tool | Toolset] = [
        shared.borrow(entry, entry.named(index))
        for index, entry in enumerate(spec.tools, 1)
        if entry.shared
    ]
    return spec.model_copy(update={"tools": own}), borrowed


def outcome_of(result: RunResult) -> GoalOutcome:
    """A finished run as a goal outcome (a failed verification fails the goal)."""
    verified = result.verification is None or bool(result.verification.get("ok"))
    ok = result.status == "succeeded" and verified
    reason = None if result.error is None else redact(result.error)
    if result.status == "succeeded" and not verified and result.verification is not None:
        reason = f"verification failed: {result.verification.get('summary', '')}"
    return GoalOutcome("succeeded" if ok else "failed", result.status, reason, result.to_json())
