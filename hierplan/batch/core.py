"""A batch: many goals under one global budget, journaled in ``DIR``, resumable.

:func:`run_batch` validates the goals file, opens (or, with ``resume``, reopens) the journal,
and runs the goals on a backend: ``local`` (anyio, in this process) or ``celery`` (workers, see
:mod:`hierplan.batch.celery_backend`). Per goal it writes ``DIR/goals/<id>/run.json``; at the
end ``DIR/summary.json``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio

from hierplan.batch.budget import (
    BatchBudget,
    GoalLedger,
    check_keys,
    check_prices,
    goal_cap,
    goal_minimum,
    grant_goal,
)
from hierplan.batch.display import BatchDisplay, Tally
from hierplan.batch.goals import BatchGoal, GoalsFile, goals_digest, load_goals
from hierplan.batch.journal import (
    FINAL_STATES,
    LARGEST_AMOUNT,
    WITHHELD,
    Journal,
    damaged_journal,
    open_journal,
    url_as_journaled,
)
from hierplan.batch.runner import GoalOutcome, RunFunction, RunOptions, inner_budget, run_goal
from hierplan.batch.toolsets import SharedToolsets, check_goal_toolsets
from hierplan.budgets.budget import Fixed
from hierplan.budgets.ledger import LocalLedger
from hierplan.core.instrument import Instrument
from hierplan.errors import UserInputError
from hierplan.files import write_atomic
from hierplan.models.base import parse_model_string
from hierplan.pricing import PriceTable
from hierplan.runner.models import SIMULATOR_ONLY, is_simulated
from hierplan.runner.run import run
from hierplan.units import PICO_PER_USD, pico_to_usd

Backend = Literal["local", "celery"]
SUMMARY = "summary.json"


@dataclass(slots=True)
class BatchConfig:
    """What to run, with what budget, where, and how."""

    goals_path: Path
    out: Path
    budget: BatchBudget
    options: RunOptions = field(default_factory=RunOptions)
    backend: Backend = "local"
    resume: bool = False
    broker: str | None = None
    visibility_timeout: float = 3600.0
    # Seconds a running Celery goal's lease lasts without its worker's heartbeat before the goal
    # is queued again; None: $HIERPLAN_BATCH_LEASE_S, else 30 (see celery_backend.lease).
    lease_s: float | None = None
    instruments: Sequence[Instrument] = ()
    run_fn: RunFunction = run  # how one goal runs (local backend): hierplan.run, or a wrapper
    # The flags given on the command line (``--concurrency``...), which a resume checks against
    # the batch's own; None where that is not known (a value at its default counts as not given).
    given: frozenset[str] | None = None


@dataclass(slots=True)
class Batch:
    """A batch ready to run: its config, goals, journal and the settings it was started with."""

    config: BatchConfig
    goals: GoalsFile
    journal: Journal
    meta: dict[str, Any]
    display: BatchDisplay | None = None
    # What running goals hold and have spent where the journal does not see it (on Celery
    # workers, until they end), in tokens and pico-dollars: the panel counts it.
    running_elsewhere: tuple[int, int] = (0, 0)

    @property
    def budget(self) -> BatchBudget:
        """The batch's budget, as it was started."""
        b = self.meta["budget"]
        return BatchBudget(
            b["tokens"], b["pico"], b["concurrency"], b["goal_tokens"], b["goal_pico"]
        )

    @property
    def options(self) -> RunOptions:
        """The goals' defaults, as the batch was started."""
        return RunOptions.from_dict(self.meta["options"])

    def tally(self) -> Tally:
        """The batch's figures now, from the journal."""
        spent_t, spent_p = self.journal.spent()
        spent_t += self.running_elsewhere[0]
        spent_p += self.running_elsewhere[1]
        return Tally(
            total=len(self.goals.goals),
            counts=self.journal.counts(),
            spent_tokens=spent_t,
            spent_pico=spent_p,
            limit_tokens=self.budget.tokens,
            limit_pico=self.budget.pico,
        )

    def goal_dir(self, goal_id: str) -> Path:
        """Where a goal's files go."""
        return self.config.out / "goals" / goal_id

    def record_finished(
        self,
        goal: BatchGoal,
        outcome: GoalOutcome,
        spent: tuple[int, int],
        prior: tuple[int, int] | None = None,
    ) -> None:
        """Journal a finished goal, then write its ``run.json`` (the journal is the truth: a
        crash between the two is repaired by :meth:`write_records`)."""
        self.journal.finish(
            goal.id,
            state=outcome.state,
            status=outcome.status,
            reason=outcome.reason,
            spent=spent,
            record=outcome.record,
            prior=prior,
        )
        if outcome.record is not None:
            path = self.goal_dir(goal.id) / "run.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, outcome.record)
        self.refresh(goal.id, outcome, spent)

    def refresh_panel(self, finished: int = 0) -> None:
        """Give the display (if any) the journal's figures now: goals running, what they hold
        and have spent; ``finished`` goals more were finished by this process."""
        if self.display is None:
            return
        tally = self.tally()
        tally.started = self.display.tally.started
        tally.finished_now = self.display.tally.finished_now + finished
        self.display.tally = tally
        self.display.refresh()

    def refresh(self, goal_id: str, outcome: GoalOutcome, spent: tuple[int, int]) -> None:
        """Tell the display (if any) about a finished goal."""
        if self.display is None:
            return
        self.refresh_panel(finished=1)
        detail = f"${pico_to_usd(spent[1]):.4f}, {spent[0]:,} tokens"
        if outcome.reason:
            detail += f"  {outcome.reason[:100]}"
        self.display.goal_done(goal_id, outcome.state, outcome.status, detail)

    def write_records(self) -> None:
        """Write any ``run.json`` the journal has and the directory lacks."""
        for row in self.journal.rows():
            if row.record is not None:
                path = self.goal_dir(row.id) / "run.json"
                if not path.exists():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    write_atomic(path, row.record)


# The journal keeps amounts as SQLite integers (64-bit): pico-dollars reach that at about
# $9.2 million.
_MOST = LARGEST_AMOUNT


def _check_amounts(budget: BatchBudget, goals: Sequence[BatchGoal]) -> None:
    amounts = [("--budget-tokens", budget.tokens), ("--budget-usd", budget.pico)]
    amounts += [
        ("--goal-budget-tokens", budget.goal_tokens),
        ("--goal-budget-usd", budget.goal_pico),
    ]
    for goal in goals:
        tokens, pico = goal_cap(goal, budget)
        amounts += [(f"the budget_tokens of goal {goal.id!r}", tokens)]
        amounts += [(f"the budget_usd of goal {goal.id!r}", pico)]
    for name, amount in amounts:
        if amount is not None and amount > _MOST:
            most = f"{_MOST:,} tokens" if "tokens" in name else f"${pico_to_usd(_MOST):,.0f}"
            raise UserInputError(f"{name} is too large: at most {most}")


DEFAULT_CONCURRENCY = 4
"""Goals running at once unless ``--concurrency`` says otherwise."""


def _changed_on_resume(config: BatchConfig, meta: dict[str, Any]) -> list[str]:
    """The flags given with ``--resume`` whose values differ from those the batch was started
    with (without :attr:`BatchConfig.given`, a value left at its default is not counted: it
    may not have been given)."""

    def differs(flag: str, value: Any, default: Any, stored: Any) -> bool:
        flags = ("--tools", "--mcp") if flag == "--tools/--mcp" else (flag,)
        given = config.given
        named = any(f in given for f in flags) if given is not None else value != default
        return named and value != stored

    stored, given = meta.get("budget", {}), config.budget
    changed = [
        flag
        for flag, key, value in (
            ("--budget-tokens", "tokens", given.tokens),
            ("--budget-usd", "pico", given.pico),
            ("--goal-budget-tokens", "goal_tokens", given.goal_tokens),
            ("--goal-budget-usd", "goal_pico", given.goal_pico),
            ("--concurrency", "concurrency", given.concurrency),
        )
        if differs(
            flag, value, DEFAULT_CONCURRENCY if key == "concurrency" else None, stored.get(key)
        )
    ]
    defaults, options = RunOptions().to_dict(), meta.get("options", {})
    for key, value in config.options.to_dict().items():
        flag = "--set" if key == "run_settings" else "--" + key.replace("_", "-")
        flag = "--tools/--mcp" if key == "tools" else flag
        if key == "base_url":  # the journal keeps it without credentials, which may change
            value = url_as_journaled(value)
        if differs(flag, value, defaults[key], options.get(key, defaults[key])):
            changed.append(flag)
    return changed


def prepare(config: BatchConfig, pricing: PriceTable | None = None) -> Batch:
    """Validate everything and open the journal; nothing is written if anything is wrong."""
    if config.budget.concurrency < 1:
        raise UserInputError("--concurrency must be at least 1")
    if config.backend == "celery":
        from hierplan.batch.celery_backend.lease import lease_seconds

        lease_seconds(config.lease_s)  # a bad lease is refused before anything is written
    if config.resume:
        return _reopen(config, pricing or PriceTable())
    goals = load_goals(config.goals_path, default_model=config.options.model)
    _check_amounts(config.budget, goals.goals)
    _check_model_flags(goals.goals, config.options)
    _check_toolsets(goals.goals, config)
    pricing = config.options.pricing(goals.goals, pricing)
    check_prices(goals.goals, config.options.model, pricing, _usd(config))
    # hierplan.run resolves the goals' provider models here (Celery workers read their keys
    # from their own environment; another run function brings its own models).
    if config.backend == "local" and config.run_fn is run:
        check_keys(goals.goals, config.options.model)
    meta = {
        "goals_path": str(config.goals_path),
        "goals_digest": goals.digest,
        "backend": config.backend,
        "namespace": f"hierplan-batch-{uuid.uuid4().hex[:12]}",
        "created_at": time.time(),
        "budget": {
            "tokens": config.budget.tokens,
            "pico": config.budget.pico,
            "concurrency": config.budget.concurrency,
            "goal_tokens": config.budget.goal_tokens,
            "goal_pico": config.budget.goal_pico,
        },
        "options": config.options.to_dict(),
    }
    _check_caps(goals.goals, config, pricing)
    journal = open_journal(config.out, resume=False)
    journal.create(meta, goals.goals)
    return Batch(config, goals, journal, meta)


def _reopen(config: BatchConfig, pricing: PriceTable) -> Batch:
    """A batch to resume: its journal, and its goals file checked against the settings the
    batch was started with (a goal without a model of its own takes the batch's, which
    ``--resume`` need not repeat)."""
    journal = open_journal(config.out, resume=True)
    try:
        meta = journal.meta()
        if meta.get("goals_digest") != goals_digest(config.goals_path):
            raise UserInputError(
                f"cannot resume {config.out}: {config.goals_path} changed since the batch "
                "started (resume with the same goals file, or start a new batch with another "
                "--out)"
            )
        if meta.get("backend") != config.backend:
            started = meta.get("backend")
            given = config.given
            default = " (the default)" if given is not None and "--backend" not in given else ""
            needs = " and the --broker it was started with" if started == "celery" else ""
            raise UserInputError(
                f"cannot resume {config.out} with --backend {config.backend}{default}: it was "
                f"started with --backend {started}; give --backend {started}{needs}"
            )
        changed = _changed_on_resume(config, meta)
        if changed:
            raise UserInputError(
                f"cannot resume {config.out} with {', '.join(changed)}: a batch goes on with the "
                "budget and options it was started with (kept in its journal); leave them out, "
                "or start a new batch with another --out"
            )
        _give_back_withheld(config, meta)
        options = _journal_options(journal, meta)
        model = options.model
        goals = load_goals(config.goals_path, default_model=model)
        _check_journal_goals(journal, goals, config.goals_path)
        budget = meta["budget"]
        usd = budget["pico"] is not None or budget["goal_pico"] is not None
        check_prices(goals.goals, model, options.pricing(goals.goals, pricing), usd)
        if config.backend == "local" and config.run_fn is run:
            check_keys(goals.goals, model)
    except BaseException:
        journal.close()
        raise
    return Batch(config, goals, journal, meta)


def _give_back_withheld(config: BatchConfig, meta: dict[str, Any]) -> None:
    """Put the ``--base-url`` given to a resume in the batch's settings (in memory) where the
    journal kept it without its credentials; without one, the resume is refused."""
    withheld = meta.get(WITHHELD)
    if not isinstance(withheld, list) or "--base-url" not in withheld:
        return
    if config.options.base_url is None:
        raise UserInputError(
            f"cannot resume {config.out} without --base-url: its URL held credentials, which "
            "the journal does not keep; give --base-url again, as the batch was started"
        )
    meta["options"] = {**meta["options"], "base_url": config.options.base_url}


def _journal_options(journal: Journal, meta: dict[str, Any]) -> RunOptions:
    """The goals' defaults the journal holds, or the error for a journal holding others."""
    try:
        return RunOptions.from_dict(meta["options"])
    except TypeError:
        raise damaged_journal(journal.path, "its options are not ones a batch writes") from None


def _check_journal_goals(journal: Journal, goals: GoalsFile, goals_path: Path) -> None:
    """The journal holds a row for each goal of the goals file (whose digest it matched): a
    journal that lost rows would otherwise resume as a batch with nothing left to do."""
    ids = [row.id for row in journal.rows()]
    expected = [goal.id for goal in goals.goals]
    if ids != expected:
        problem = (
            f"it holds {len(ids)} goal(s) where {goals_path} has {len(expected)}"
            if len(ids) != len(expected)
            else f"its goals are not those of {goals_path}"
        )
        raise damaged_journal(journal.path, problem)


def _check_toolsets(goals: Sequence[BatchGoal], config: BatchConfig) -> None:
    """Every goal's toolsets, before anything starts: locally in full (each distinct entry
    opened once); on Celery their form only, since workers open them in their own
    environment (a worker that cannot fails that goal with the reason)."""
    batch_tools = config.options.toolsets()
    entries = {goal.id: goal.tools(batch_tools) for goal in goals}
    check_goal_toolsets(goals, entries, local=config.backend == "local")


def _check_model_flags(goals: Sequence[BatchGoal], options: RunOptions) -> None:
    """``--base-url`` and ``--timeout`` need a goal on a provider model to apply to."""
    given = options.base_url is not None or options.timeout is not None
    if given and all(is_simulated(goal.spec.model or options.model) for goal in goals):
        raise UserInputError(
            f"{SIMULATOR_ONLY}: no goal of the batch runs on one (give --model, or a goal's model)"
        )


def _usd(config: BatchConfig) -> bool:
    b = config.budget
    return b.pico is not None or b.goal_pico is not None


def _check_caps(goals: Sequence[BatchGoal], config: BatchConfig, pricing: PriceTable) -> None:
    """A goal whose cap is below its minimum could never start: say so before anything does."""
    problems = []
    for goal in goals:
        cap_t, cap_p = goal_cap(goal, config.budget)
        min_t, min_p = goal_minimum(
            goal, config.options.model, pricing, config.options.settings(goal)
        )
        if (cap_t is not None and cap_t < min_t) or (cap_p is not None and cap_p < min_p):
            problems.append(
                f"line {goal.line}: its budget cap ({_amounts(cap_t, cap_p)}) is below the "
                f"least one planning call needs ({_amounts(min_t, min_p)})"
            )
    if problems:
        raise UserInputError(
            f"{len(problems)} goal(s) could never start; raise their budget_usd/budget_tokens "
            "(or --goal-budget-usd/--goal-budget-tokens, --budget-usd/--budget-tokens):\n  "
            + "\n  ".join(problems[:20])
        )


def _amounts(tokens: int | None, pico: int | None) -> str:
    parts = []
    if pico is not None:
        parts.append(f"${pico / PICO_PER_USD:.6f}")
    if tokens is not None:
        parts.append(f"{tokens:,} tokens")
    return " and ".join(parts) or "unlimited"


# -- the local backend -----------------------------------------------------------------------


class _Changes:
    """Wakes the scheduler when a goal ends (its grant's rest is free again)."""

    def __init__(self) -> None:
        self.event = anyio.Event()

    def notify(self) -> None:
        self.event.set()
        self.event = anyio.Event()

    async def wait(self) -> None:
        await self.event.wait()


async def run_local(batch: Batch) -> None:
    """Run the batch's pending goals in this process, ``concurrency`` at a time."""
    journal = batch.journal
    budget = batch.budget
    options = batch.options
    pricing = options.pricing(batch.goals.goals)
    spent_t, spent_p = journal.spent()
    ledger = LocalLedger()
    root = ledger.open_now(
        "batch",
        None,
        Fixed(
            None if budget.tokens is None else max(0, budget.tokens - spent_t),
            None if budget.pico is None else max(0, budget.pico - spent_p),
        ),
    )
    pending = [r.goal for r in journal.rows() if r.state == "pending"]
    changes = _Changes()
    running = 0
    shared = SharedToolsets()  # servers the goals share, open until the batch ends

    async def one(goal: BatchGoal, account: Any, grant: tuple[int | None, int | None]) -> None:
        nonlocal running
        try:
            goal_ledger = GoalLedger(
                ledger, account, lambda held, spent: journal.progress(goal.id, held, spent)
            )
            cap = goal_cap(goal, budget)
            outcome = await run_goal(
                goal,
                options,
                goal_ledger,
                inner_budget(grant, cap),
                batch.goal_dir(goal.id),
                batch.config.instruments,
                batch.config.run_fn,
                shared,
            )
            balance = await ledger.close(account)
            batch.record_finished(goal, outcome, (balance.spent_tokens, balance.spent_pico))
        finally:
            running -= 1
            changes.notify()

    async with anyio.create_task_group() as tg:
        await tg.start(shared.serve)
        if batch.display is not None:
            tg.start_soon(_keep_panel_fresh, batch)
        index = 0
        while index < len(pending):
            if running >= budget.concurrency:
                await changes.wait()
                continue
            goal = pending[index]
            cap = goal_cap(goal, budget)
            minimum = goal_minimum(goal, options.model, pricing, options.settings(goal))
            decision, account, grant = await grant_goal(ledger, root, goal.id, cap, minimum)
            if decision == "wait":
                await changes.wait()
                continue
            index += 1
            if decision == "skip":
                batch.record_finished(goal, _skipped(minimum), (0, 0))
                continue
            journal.start(goal.id, grant)
            running += 1
            tg.start_soon(one, goal, account, grant)
        while running:
            await changes.wait()
        shared.close()
        tg.cancel_scope.cancel()  # every goal has ended: the panel's refresher too


PANEL_REFRESH_S = 0.25
"""How often the panel takes the journal's figures while goals run (their calls reserve and
settle between the moments a goal starts or ends)."""


async def _keep_panel_fresh(batch: Batch) -> None:
    while True:
        await anyio.sleep(PANEL_REFRESH_S)
        batch.refresh_panel()


def _skipped(minimum: tuple[int, int]) -> GoalOutcome:
    return GoalOutcome(
        "skipped",
        "not_started",
        f"budget: what the batch has left cannot cover the goal's minimum "
        f"({_amounts(minimum[0], minimum[1])})",
        None,
    )


# -- the whole batch -------------------------------------------------------------------------


def summarize(batch: Batch, wall_time_s: float, finished_now: int) -> dict[str, Any]:
    """The summary: counts by state and by run status, spend, tokens, time, throughput."""
    rows = batch.journal.rows()
    counts = dict.fromkeys(("succeeded", "failed", "skipped", "pending", "running"), 0)
    statuses: dict[str, int] = {}
    for row in rows:
        counts[row.state] = counts.get(row.state, 0) + 1
        if row.status:
            statuses[row.status] = statuses.get(row.status, 0) + 1
    spent_t, spent_p = batch.journal.spent()
    prior_t = sum(r.prior_tokens for r in rows)
    prior_p = sum(r.prior_pico for r in rows)
    budget = batch.budget
    default_model = batch.options.model
    simulated = sum(
        1
        for goal in batch.goals.goals
        if parse_model_string(goal.spec.model or default_model).provider == "sim"
    )
    return {
        "goals": len(rows),
        # Goals answered by the offline simulator: their figures are simulated, not measured.
        "simulated_goals": simulated,
        "counts": counts,
        "statuses": statuses,
        "spent_usd": pico_to_usd(spent_p),
        "spent_pico": spent_p,
        "spent_tokens": spent_t,
        "retried_spent_usd": pico_to_usd(prior_p),
        "retried_spent_tokens": prior_t,
        "budget": {
            "usd": None if budget.pico is None else pico_to_usd(budget.pico),
            "pico": budget.pico,
            "tokens": budget.tokens,
        },
        "attempts": sum(r.attempts for r in rows),
        "wall_time_s": round(wall_time_s, 3),
        "goals_per_s": round(finished_now / wall_time_s, 3) if wall_time_s > 0 else 0.0,
        "finished_by_this_run": finished_now,
    }


async def execute(batch: Batch) -> dict[str, Any]:
    """Run a prepared batch on its backend and write its summary."""
    started = time.monotonic()
    # Locally, goals that were running died with the process that ran them. On Celery their
    # messages are still with the broker: they are delivered again and followed as they are.
    local = batch.config.backend == "local"
    recovered = batch.journal.recover() if batch.config.resume and local else []
    before = sum(batch.journal.counts()[s] for s in FINAL_STATES)
    batch.write_records()
    if batch.config.backend == "celery":
        from hierplan.batch.celery_backend import run_celery

        await run_celery(batch)
    else:
        await run_local(batch)
    after = sum(batch.journal.counts()[s] for s in FINAL_STATES)
    summary = summarize(batch, time.monotonic() - started, after - before)
    summary["resumed_running_goals"] = recovered
    write_atomic(batch.config.out / SUMMARY, json.dumps(summary, indent=1))
    return summary


async def run_batch(config: BatchConfig, display: BatchDisplay | None = None) -> dict[str, Any]:
    """Validate, journal and run a batch; returns its summary (also in ``DIR/summary.json``).

    >>> import anyio  # doctest: +SKIP
    >>> config = BatchConfig(Path("goals.jsonl"), Path("runs/b"), BatchBudget(None, 10**12, 4))
    >>> summary = anyio.run(run_batch, config)  # doctest: +SKIP
    """
    batch = prepare(config)
    batch.display = display
    try:
        return await execute(batch)
    finally:
        batch.journal.close()
