"""``run(goal, ...) -> RunResult``: a run from its :class:`~hierplan.RunSpec`.

:func:`run` takes a spec (or a goal and a few keywords that make one), checks it once, sets up
the run (models, scenario, budget, gate, instruments), runs the strategy and returns the record;
a run paused for a review is saved as a checkpoint. One async code path; :func:`run_sync` is a
thin wrapper for sync callers. Nothing here is module-level state: every run builds its own
context, so many runs can share a process and an event loop.
"""

from __future__ import annotations

import difflib
import uuid
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any, TypedDict, Unpack

import anyio
from pydantic import ValidationError

from hierplan.budgets.instrument import BudgetInstrument
from hierplan.core.events import Listener
from hierplan.core.instrument import Instrument
from hierplan.core.settings import RunSettings
from hierplan.durable.checkpoint import clear_checkpoint, write_checkpoint
from hierplan.durable.lock import holding_run_directory
from hierplan.durable.restore import Restore
from hierplan.errors import UserInputError, field_problems
from hierplan.files import StrPath
from hierplan.hierarchy.context import RunContext
from hierplan.hierarchy.gate import Approver, check_decisions
from hierplan.hierarchy.strategies import get_strategy
from hierplan.records import RunResult
from hierplan.runner.execute import execute_run
from hierplan.runner.models import Models, run_pricing
from hierplan.runner.prepare import (
    Prepared,
    prepare,
    refuse_own_goal_for_simulated_scenario,
    run_context,
    run_gate,
    with_budget,
)
from hierplan.runner.spec import BudgetSpec, ModelChoice, RunSpec, saved_choice, settings_with
from hierplan.scenarios import Scenario
from hierplan.tools.base import Tool, Toolset


class RunOptions(TypedDict, total=False):
    """The keyword options of :func:`hierplan.run`, for the functions that pass them on
    (:func:`hierplan.run_sync`, :func:`hierplan.start`): a type checker then catches a
    misspelt one, and at run time it raises :class:`TypeError` naming the nearest option.
    :func:`hierplan.run` describes each; everything else a run can be told is a field of
    :class:`~hierplan.RunSpec`.

    >>> options: hierplan.RunOptions = {"strategy": "dag", "budget": {"usd": 0.5}}  # doctest: +SKIP
    >>> hierplan.run_sync("greet the user", **options)  # doctest: +SKIP
    """

    scenario: str | Scenario | None
    strategy: str | None
    model: ModelChoice | None
    executor_model: ModelChoice | None
    tools: Iterable[Tool | Toolset]
    settings: RunSettings | Mapping[str, Any] | None
    budget: BudgetSpec | Mapping[str, Any] | None
    approver: Approver | None
    instruments: Sequence[Instrument]
    listeners: Sequence[Listener]
    checkpoint_dir: StrPath | None
    workdir: StrPath | None


RUN_OPTIONS: frozenset[str] = RunOptions.__optional_keys__
# The options that describe the run (the others are objects given beside the spec).
_SPEC_OPTIONS = ("scenario", "model", "executor_model", "workdir")


def refuse_unknown_options(function: str, given: Iterable[str], known: frozenset[str]) -> None:
    """Raise :class:`TypeError` for a keyword of ``given`` that ``function`` does not take,
    suggesting the nearest one it does take. Called before anything runs: a misspelt option
    is found at the call, not when the run starts (or, for a resume, after the checkpoint has
    been claimed)."""
    for name in given:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = (
                f"did you mean {close[0]!r}?" if close else f"it takes {', '.join(sorted(known))}"
            )
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}: {hint}")


def run_spec(goal: str | RunSpec | None = None, **options: Any) -> RunSpec:
    """The spec :func:`hierplan.run` runs: ``goal`` (a spec, or the goal of a new one) with
    the keyword options that describe a run (``scenario``, ``strategy``, ``model``,
    ``executor_model``, ``settings``, ``budget``, ``workdir``) laid over it. Bad values raise
    :class:`UserInputError`; the spec is not checked for running yet (see
    :meth:`RunSpec.checked`)."""
    base = goal if isinstance(goal, RunSpec) else RunSpec(goal=goal)
    data = {name: getattr(base, name) for name in RunSpec.model_fields}
    data |= {k: options[k] for k in _SPEC_OPTIONS if options.get(k) is not None}
    budget = options.get("budget")
    if budget is not None:
        data["budget"] = budget
    data["settings"] = settings_with(
        base.settings if options.get("settings") is None else options["settings"],
        {"strategy": options.get("strategy")},
    )
    try:
        return RunSpec.model_validate(data)
    except ValidationError as exc:
        raise UserInputError(f"invalid run: {field_problems(exc, 'the run')}") from None


async def run(goal: str | RunSpec | None = None, **options: Unpack[RunOptions]) -> RunResult:
    """Run ``goal`` (free text, a :class:`~hierplan.RunSpec`, or ``None`` for a scenario's own
    goal) and return the run record.

    >>> fast = hierplan.Simulator(latency_scale=0)  # doctest: +SKIP
    >>> hierplan.run_sync(scenario="data_migration", model=fast).status  # doctest: +SKIP
    'succeeded'

    The options: ``scenario`` (a built-in scenario: its world, tools and goal), ``strategy``,
    ``model`` (a model string such as ``sim`` or ``openai:gpt-5-mini``, a
    :class:`~hierplan.ModelSpec`, the :class:`~hierplan.Simulator` with its knobs, or a model
    object) and ``executor_model`` (the executors', when not the planner's), ``tools`` (tools
    and toolsets such as MCP servers, opened for this run and closed after), ``settings`` (a
    :class:`~hierplan.RunSettings` or a mapping of its fields), ``budget`` (a
    :class:`~hierplan.BudgetSpec` or a mapping of its fields), ``approver`` (who decides on
    each plan: automatic approval by default), ``instruments`` (budgets, tracing, your own),
    ``listeners`` (the run's events as they happen; one with an ``event_types`` attribute gets
    only those types, and a type no listener takes is not built), ``checkpoint_dir`` and
    ``workdir`` (a scenario's working directory, default ``runs/scenarios/<name>/<run id>``).
    Given with a spec, an option replaces the spec's field.

    Failures of the agent (a step that cannot be done, a plan rejected too often, a budget
    spent) end in a ``partial``, ``failed`` or ``rejected`` result, never an exception. Bad
    input (an unknown scenario or strategy, an empty goal, a free-text goal for the simulator)
    raises :class:`~hierplan.errors.UserInputError` before anything runs. To watch or cancel a
    run while it goes, use :func:`hierplan.start`.

    When an approver defers a plan (:class:`~hierplan.Defer`), the run pauses: the result's
    status is ``paused``, and with ``checkpoint_dir`` the run is saved there for
    :func:`hierplan.resume`. With ``checkpoint_dir`` the run holds that directory's lock
    (``run.lock``, see :mod:`hierplan.durable.lock`) until it returns: a run or resume there
    meanwhile, in this process or another, raises :class:`~hierplan.errors.UserInputError` at
    once, naming the process that holds it.
    """
    refuse_unknown_options("run", options, RUN_OPTIONS)
    spec = run_spec(goal, **options)
    return await execute(
        spec,
        tools=options.get("tools", ()),
        approver=options.get("approver"),
        instruments=options.get("instruments", ()),
        listeners=options.get("listeners", ()),
        checkpoint_dir=options.get("checkpoint_dir"),
    )


async def execute(
    spec: RunSpec,
    *,
    tools: Iterable[Tool | Toolset] = (),
    approver: Approver | None = None,
    instruments: Sequence[Instrument] = (),
    listeners: Sequence[Listener] = (),
    checkpoint_dir: StrPath | None = None,
    checkpoint_extra: Mapping[str, Any] | None = None,
    restore: Restore | None = None,
) -> RunResult:
    """Run ``spec`` (see :func:`run`); ``restore`` continues a paused run (see
    :func:`hierplan.resume`), ``checkpoint_extra`` is kept with a checkpoint (the spec's
    ``extra`` by default)."""
    spec.checked()
    where = None if checkpoint_dir is None else Path(checkpoint_dir)
    chosen = get_strategy(spec.settings.strategy)
    pricing = run_pricing(spec)
    instruments = with_budget(spec, pricing, instruments)
    gate = run_gate(spec, approver)
    models = Models(spec.settings.seed)
    if restore is None:  # a checkpoint saves the scenario's own goal beside the scenario
        refuse_own_goal_for_simulated_scenario(spec)
    with _holding(where):
        try:
            # Provider models first: a missing API key fails before the scenario is set up.
            models.open_providers(spec.model, spec.executor_model)
            rid = restore.record.run_id if restore else spec.run_id or uuid.uuid4().hex[:12]
            prepared = await prepare(spec, tools, rid, reopen=restore is not None)
            executor = spec.executor_model
            pair = (
                models.get(spec.model, prepared.oracle),
                None if executor is None else models.get(executor, prepared.oracle),
            )
            ctx = run_context(
                pair, prepared, rid, spec.settings, pricing, instruments, listeners, gate, restore
            )
            opened = None
            if restore is not None:
                policy = getattr(chosen, "policy", None)
                # Once the toolsets are open: their tools are among those the paused run had.
                opened = partial(
                    check_decisions, ctx, restore, flat=bool(policy is not None and policy.flat)
                )
            elif where is not None:
                clear_checkpoint(where)  # a new run in the same directory
            result = await execute_run(ctx, chosen, prepared, opened)
        finally:
            await models.aclose()
        _add_budget_summary(ctx, result)
        if result.status == "paused":
            extra = spec.extra if checkpoint_extra is None else checkpoint_extra
            _save_paused(ctx, spec, prepared, result, where, extra)
        return result


def _add_budget_summary(ctx: RunContext, result: RunResult) -> None:
    """Put the run budget's summary (limits, spend, levels, planning against execution) on
    the result."""
    for instrument in ctx.instruments:
        if isinstance(instrument, BudgetInstrument):
            result.budget = instrument.for_run(ctx).summary(result.tree)
            return


def _holding(checkpoint_dir: Path | None) -> AbstractContextManager[None]:
    """Hold the run directory's lock (:mod:`hierplan.durable.lock`) while the run sets up its
    files there, runs and saves its checkpoint, unless the caller holds it already (the command
    line does, and writes run.json there after); without a ``checkpoint_dir`` there is none."""
    if checkpoint_dir is None:
        return nullcontext()
    return holding_run_directory(
        checkpoint_dir, otherwise=", or give this run another checkpoint_dir"
    )


def _save_paused(
    ctx: RunContext,
    spec: RunSpec,
    prepared: Prepared,
    result: RunResult,
    checkpoint_dir: Path | None,
    checkpoint_extra: Mapping[str, Any] | None,
) -> None:
    """Write a paused run's checkpoint, or say in the result why it cannot be resumed."""
    if checkpoint_dir is None:
        result.error = "paused for a review, but no checkpoint_dir was given to resume from"
        return
    write_checkpoint(
        checkpoint_dir,
        result,
        ctx.pause.results,
        _saved_spec(ctx, spec, prepared, checkpoint_dir),
        checkpoint_extra,
        ctx.workflow_span,
    )


def _saved_spec(
    ctx: RunContext, spec: RunSpec, prepared: Prepared, checkpoint_dir: Path
) -> dict[str, Any]:
    """How to start this run again (for a resume): what can be saved, and nothing secret."""
    budget = spec.budget
    return {
        "goal": prepared.goal,
        "scenario": prepared.scenario,
        "settings": ctx.settings.model_dump(mode="json"),
        "model": saved_choice(spec.model),
        "executor_model": saved_choice(spec.executor_model),
        "budget": None if budget is None else budget.model_dump(mode="json"),
        "price_in": spec.price_in,
        "price_out": spec.price_out,
        "workdir": None
        if prepared.workdir is None
        else _saved_workdir(prepared.workdir, checkpoint_dir),
        "tools": sorted(ctx.toolbox.names()),
        # As written: a resume reads their ${VAR} from its own environment again.
        "toolsets": [entry.saved() for entry in spec.tools],
    }


def _saved_workdir(workdir: Path, checkpoint_dir: Path) -> str:
    """The work directory as the checkpoint keeps it: relative to the checkpoint's directory
    when inside it (so that a run directory moved or copied elsewhere resumes on its own
    files, never on those of the place it came from), else absolute."""
    absolute = workdir.resolve()
    try:
        return absolute.relative_to(checkpoint_dir.resolve()).as_posix()
    except ValueError:
        return str(absolute)


def run_sync(goal: str | RunSpec | None = None, **options: Unpack[RunOptions]) -> RunResult:
    """:func:`run` for sync callers (starts its own event loop)."""
    refuse_unknown_options("run_sync", options, RUN_OPTIONS)
    return anyio.run(partial(run, goal, **options))
