"""``run(goal, ...) -> RunResult``: wires planner, executors, gate, instruments and strategy.

One async code path; :func:`run_sync` is a thin wrapper for sync callers. Nothing here is
module-level state: every run builds its own context, so many runs can share a process and an
event loop.
"""

from __future__ import annotations

import difflib
import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, AsyncExitStack, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypedDict, Unpack

import anyio
import anyio.to_thread
from pydantic import ValidationError

from hierplan.budgets.instrument import BudgetInstrument, prepare_budget
from hierplan.core.events import EventBus, Listener, RunFinished, RunStarted
from hierplan.core.instrument import Instrument, enter_scopes
from hierplan.core.settings import RunSettings
from hierplan.durable.lock import holding_run_directory
from hierplan.errors import ModelAuthError, StepFailed, UserInputError
from hierplan.files import StrPath, make_directory
from hierplan.hierarchy.context import NodeContext, RunContext
from hierplan.hierarchy.gate import Approver, Gate
from hierplan.hierarchy.pause import (
    Restore,
    check_decisions,
    clear_checkpoint,
    write_checkpoint,
)
from hierplan.hierarchy.strategies import Strategy, get_strategy
from hierplan.models.base import Model, parse_model_string
from hierplan.plans.plan import MAX_GOAL_CHARS
from hierplan.pricing import PriceTable
from hierplan.records import NodeRecord, RunResult, RunStatus
from hierplan.runner.models import _Models, priced_as_of, with_price
from hierplan.scenarios import Scenario, ScenarioEnv, get_scenario
from hierplan.simulator.oracle import COVERAGE_HINT, Oracle
from hierplan.simulator.profiles import NoiseProfile, check_latency_scale
from hierplan.tools.base import Tool, Toolbox, Toolset, tool_threads


class ResumableRunOptions(TypedDict, total=False):
    """The keyword options of :func:`run` that a resumed run takes too (see
    :class:`RunOptions`, where each is described, and :class:`~hierplan.ResumeOptions`)."""

    scenario: str | Scenario | None
    strategy: str | None
    model: str | Model
    executor_model: str | Model | None
    tools: Iterable[Tool | Toolset]
    settings: RunSettings | None
    max_depth: int | None
    concurrency: int | None
    seed: int | None
    approver: Approver | None
    gate: Gate | None
    instruments: Sequence[Instrument]
    listeners: Sequence[Listener]
    oracle: Oracle | None
    sim_profile: NoiseProfile | str
    sim_latency_scale: float
    pricing: PriceTable | None
    workdir: StrPath | None
    model_options: dict[str, Any] | None
    checkpoint_extra: Mapping[str, Any] | None
    budget_usd: float | None
    budget_tokens: int | None
    allocation: str
    price_in: float | None
    price_out: float | None


class RunOptions(ResumableRunOptions, total=False):
    """The keyword options of :func:`hierplan.run`, for the functions that pass them on
    (:func:`hierplan.run_sync`, :func:`hierplan.start`): a type checker then catches a
    misspelt one, and at run time it raises :class:`TypeError` naming the nearest option.
    :func:`hierplan.run` describes each.

    >>> options: hierplan.RunOptions = {"strategy": "dag", "budget_usd": 0.5}  # doctest: +SKIP
    >>> hierplan.run_sync("greet the user", **options)  # doctest: +SKIP
    """

    run_id: str | None
    checkpoint_dir: StrPath | None
    restore: Restore | None


RUN_OPTIONS: frozenset[str] = RunOptions.__optional_keys__


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


@dataclass(slots=True)
class _Prepared:
    goal: str
    tools: list[Tool]
    oracle: Oracle | None
    env: ScenarioEnv | None
    scenario: str | None
    workdir: Path | None = None
    toolsets: list[Toolset] = field(default_factory=list)


def _refuse_own_goal_for_simulated_scenario(
    goal: str | None, scenario: str | Scenario | None, model: str | Model, oracle: Oracle | None
) -> None:
    """A scenario's oracle knows the scenario's own goal only: on the simulator, another goal
    text could never be planned, so it is refused before the scenario is set up."""
    if scenario is None or not goal or not goal.strip() or oracle is not None:
        return
    provider = parse_model_string(model).provider if isinstance(model, str) else model.provider
    if provider == "sim":
        raise UserInputError(
            "a goal and a scenario were both given, but the simulator knows only the scenario's "
            "own goal: leave the goal out, or give the goal text with a real model "
            "(--model openai:<model> or anthropic:<model>) on the scenario's tools"
        )


async def _prepare(
    goal: str | None,
    scenario: str | Scenario | None,
    tools: Iterable[Tool | Toolset],
    oracle: Oracle | None,
    workdir: Path | None,
    seed: int,
    run_id: str,
    reopen: bool = False,
) -> _Prepared:
    extra: list[Tool] = []
    toolsets: list[Toolset] = []
    for item in tools:
        if isinstance(item, Toolset):
            toolsets.append(item)
        elif isinstance(item, Tool):
            extra.append(item)
        else:
            raise UserInputError(
                f"tools= takes hierplan tools (@hierplan.tool) and toolsets (MCP servers), "
                f"not {type(item).__name__}"
            )
    if goal is not None and len(goal.strip()) > MAX_GOAL_CHARS:
        raise UserInputError(
            f"the goal is {len(goal.strip()):,} characters long; at most {MAX_GOAL_CHARS:,} fit "
            "a plan: put the material in a file or tool the run can read, and name it in the goal"
        )
    if scenario is None:
        if not goal or not goal.strip():
            raise UserInputError("no goal given: pass a goal, or a scenario (--scenario NAME)")
        return _Prepared(goal.strip(), extra, oracle, None, None, toolsets=toolsets)
    found = get_scenario(scenario) if isinstance(scenario, str) else scenario
    # One directory per run: concurrent runs of a scenario must not share its files.
    where = workdir or Path("runs") / "scenarios" / found.name / run_id
    make_directory(where, "the run directory")
    make_env = found.reopen if reopen else found.setup
    env = await anyio.to_thread.run_sync(partial(make_env, where, seed=seed))
    return _Prepared(
        goal.strip() if goal else env.goal,
        [*env.tools, *extra],
        oracle or env.oracle,
        env,
        found.name,
        where,
        toolsets,
    )


def _settings(settings: RunSettings | None, overrides: dict[str, Any]) -> RunSettings:
    if settings is not None and not isinstance(settings, RunSettings):
        raise TypeError(
            f"settings must be a hierplan.RunSettings, not {type(settings).__name__}: "
            "e.g. settings=hierplan.RunSettings(seed=1)"
        )
    base = settings or RunSettings()
    given = {k: v for k, v in overrides.items() if v is not None}
    if "strategy" in given:
        get_strategy(given["strategy"])  # a clear error naming the known strategies
    if not given:
        return base
    try:
        return RunSettings.model_validate({**base.model_dump(), **given})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise UserInputError(
            f"invalid run settings: {problems}; give each a value in its range "
            "(hierplan.RunSettings describes them; on the command line: --set NAME=VALUE)"
        ) from None


async def run(
    goal: str | None = None,
    *,
    scenario: str | Scenario | None = None,
    strategy: str | None = None,
    model: str | Model = "sim",
    executor_model: str | Model | None = None,
    tools: Iterable[Tool | Toolset] = (),
    settings: RunSettings | None = None,
    max_depth: int | None = None,
    concurrency: int | None = None,
    seed: int | None = None,
    approver: Approver | None = None,
    gate: Gate | None = None,
    instruments: Sequence[Instrument] = (),
    listeners: Sequence[Listener] = (),
    oracle: Oracle | None = None,
    sim_profile: NoiseProfile | str = "typical",
    sim_latency_scale: float = 1.0,
    pricing: PriceTable | None = None,
    workdir: StrPath | None = None,
    run_id: str | None = None,
    model_options: dict[str, Any] | None = None,
    checkpoint_dir: StrPath | None = None,
    checkpoint_extra: Mapping[str, Any] | None = None,
    restore: Restore | None = None,
    budget_usd: float | None = None,
    budget_tokens: int | None = None,
    allocation: str = "equal",
    price_in: float | None = None,
    price_out: float | None = None,
) -> RunResult:
    """Run ``goal`` (or a scenario's goal) with a strategy and return the run record.

    >>> import hierplan
    >>> result = hierplan.run_sync(scenario="data_migration", sim_latency_scale=0)  # doctest: +SKIP
    >>> result.status
    'succeeded'

    Failures of the agent (a step that cannot be done, a plan rejected too often) end in a
    ``partial``, ``failed`` or ``rejected`` result, never an exception. Bad input (an unknown
    scenario or strategy, an empty goal, a free-text goal for the simulator) raises
    :class:`~hierplan.errors.UserInputError` before anything runs.

    ``tools`` takes tools and toolsets (MCP servers, opened for this run and closed after).
    A scenario without ``workdir`` works in ``runs/scenarios/<name>/<run id>``. To watch or
    cancel a run while it goes, use :func:`hierplan.start`. ``listeners`` get the run's events
    as they happen (:mod:`hierplan.core.events`); one with an ``event_types`` attribute
    gets only those types, and a type no listener takes is not built.

    When an approver defers a plan (:class:`~hierplan.Defer`), the run pauses: the result's
    status is ``paused``, and with ``checkpoint_dir`` the run is saved there for
    :func:`hierplan.resume` (``checkpoint_extra`` is kept with it). ``restore`` is how
    :func:`hierplan.resume` continues a paused run.

    With ``checkpoint_dir`` the run holds that directory's lock (``run.lock``, see
    :mod:`hierplan.durable.lock`) until it returns: a run or resume there meanwhile, in this process
    or another (``hierplan run``, ``demo``, ``resume``), raises
    :class:`~hierplan.errors.UserInputError` at once, naming the process that holds it. A caller
    holding the lock itself (:func:`hierplan.durable.lock.holding_run_directory`) may run there.

    ``budget_usd`` and ``budget_tokens`` cap the whole run (see :mod:`hierplan.budgets`);
    ``allocation`` (``equal``, ``weighted``, ``on-demand``) splits a planner's budget among its
    plan's steps; ``price_in``/``price_out`` (USD per million tokens) price the run's models.
    A run stopped by its budget ends ``partial``; ``RunResult.not_done()`` says what is left.
    """
    # A str is a path as well as a Path is: every use below wants a Path.
    workdir = None if workdir is None else Path(workdir)
    checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
    given = {"strategy": strategy, "max_depth": max_depth, "concurrency": concurrency}
    run_settings = _settings(settings, {**given, "seed": seed})
    check_latency_scale(sim_latency_scale)  # before a scenario's files are made
    chosen = get_strategy(run_settings.strategy)
    budget_options = {
        "budget_usd": budget_usd,
        "budget_tokens": budget_tokens,
        "allocation": allocation,
        "price_in": price_in,
        "price_out": price_out,
    }
    pricing, instruments = _with_budget(
        model, executor_model, model_options, pricing, budget_options, instruments
    )
    models = _Models(
        profile=sim_profile,
        seed=run_settings.seed,
        latency_scale=sim_latency_scale,
        **(model_options or {}),
    )
    if restore is None:  # a checkpoint saves the scenario's own goal beside the scenario
        _refuse_own_goal_for_simulated_scenario(goal, scenario, model, oracle)
    with _holding(checkpoint_dir):
        try:
            # Provider models first: a missing API key fails before the scenario is set up.
            models.open_providers(model, executor_model)
            rid = restore.record.run_id if restore else run_id or uuid.uuid4().hex[:12]
            prepared = await _prepare(
                goal,
                scenario,
                tools,
                oracle,
                workdir,
                run_settings.seed,
                rid,
                reopen=restore is not None,
            )
            ctx = _run_context(
                models.get(model, prepared.oracle),
                None if executor_model is None else models.get(executor_model, prepared.oracle),
                prepared,
                rid,
                run_settings,
                pricing,
                instruments,
                listeners,
                gate or Gate(approver),
                restore,
            )
            if restore is not None:
                policy = getattr(chosen, "policy", None)
                check_decisions(ctx, restore, flat=bool(policy is not None and policy.flat))
            elif checkpoint_dir is not None:
                clear_checkpoint(checkpoint_dir)  # a new run in the same directory
            result = await _execute(ctx, chosen, prepared)
        finally:
            await models.aclose()
        _add_budget_summary(ctx, result)
        if result.status == "paused":
            invocation = {
                "model": model if isinstance(model, str) else None,
                "executor_model": executor_model if isinstance(executor_model, str) else None,
                "executor_model_object": not isinstance(executor_model, str | None),
                "sim_profile": sim_profile,
                "sim_latency_scale": sim_latency_scale,
                "model_options": _saved_options(model_options),
                "budget": budget_options,
            }
            _save_paused(ctx, prepared, result, checkpoint_dir, invocation, checkpoint_extra)
        return result


def _add_budget_summary(ctx: RunContext, result: RunResult) -> None:
    """Put the budget's summary (per level, planning against execution) on the result."""
    for instrument in ctx.instruments:
        if isinstance(instrument, BudgetInstrument):
            result.budget = instrument.for_run(ctx).summary(result.tree)
            return


def _holding(checkpoint_dir: Path | None) -> AbstractContextManager[None]:
    """Hold the run directory's lock (:mod:`hierplan.durable.lock`) while the run sets up its files
    there, runs and saves its checkpoint, unless the caller holds it already (the command line
    does, and writes run.json there after); without a ``checkpoint_dir`` there is none."""
    if checkpoint_dir is None:
        return nullcontext()
    return holding_run_directory(
        checkpoint_dir, otherwise=", or give this run another checkpoint_dir"
    )


def _with_budget(
    model: str | Model,
    executor_model: str | Model | None,
    model_options: dict[str, Any] | None,
    pricing: PriceTable | None,
    budget: dict[str, Any],
    instruments: Sequence[Instrument],
) -> tuple[PriceTable, Sequence[Instrument]]:
    """The run's price table (with ``price_in``/``price_out``) and its instruments, with a
    budget instrument added when the run has a budget (checked before anything runs)."""
    option = (model_options or {}).get("priced_as")
    priced = [
        priced_as_of(model, option),
        priced_as_of(model if executor_model is None else executor_model, option),
    ]
    pricing = with_price(pricing or PriceTable(), budget["price_in"], budget["price_out"], priced)
    budgeting = prepare_budget(
        budget_usd=budget["budget_usd"],
        budget_tokens=budget["budget_tokens"],
        allocation=budget["allocation"],
        pricing=pricing,
        models=priced,
    )
    given = sum(isinstance(i, BudgetInstrument) for i in instruments)
    if budgeting is not None and given:
        # Two budgets would both cut the run, and the record would show only one of them.
        raise UserInputError(
            "the run has two budgets: give budget_usd/budget_tokens or a BudgetInstrument in "
            "instruments, not both"
        )
    if given > 1:
        raise UserInputError(
            f"instruments holds {given} BudgetInstruments: a run takes one budget (put both "
            "caps in one Budget(tokens=..., usd=...))"
        )
    if budgeting is None:
        return pricing, instruments
    return pricing, [*instruments, budgeting]


def _run_context(
    planner_model: Model,
    executor_model: Model | None,
    prepared: _Prepared,
    run_id: str,
    settings: RunSettings,
    pricing: PriceTable,
    instruments: Sequence[Instrument],
    listeners: Sequence[Listener],
    gate: Gate,
    restore: Restore | None,
) -> RunContext:
    """The run's context; a free-text goal for the simulator is refused here."""
    if planner_model.provider == "sim" and prepared.oracle is None:
        raise UserInputError(f"the goal {prepared.goal[:120]!r} is free text. {COVERAGE_HINT}")
    bus = EventBus(run_id)
    for listener in listeners:
        bus.subscribe(listener)
    return RunContext(
        run_id=run_id,
        settings=settings,
        toolbox=Toolbox(prepared.tools),
        planner_model=planner_model,
        executor_model=planner_model if executor_model is None else executor_model,
        pricing=pricing,
        instruments=instruments,
        bus=bus,
        gate=gate,
        restore=restore,
    )


def _save_paused(
    ctx: RunContext,
    prepared: _Prepared,
    result: RunResult,
    checkpoint_dir: Path | None,
    invocation: dict[str, Any],
    checkpoint_extra: Mapping[str, Any] | None,
) -> None:
    """Write a paused run's checkpoint, or say in the result why it cannot be resumed."""
    if checkpoint_dir is None:
        result.error = "paused for a review, but no checkpoint_dir was given to resume from"
        return
    write_checkpoint(
        checkpoint_dir,
        result,
        ctx.pause,
        _invocation(ctx, prepared, invocation, checkpoint_dir),
        checkpoint_extra,
        ctx.workflow_span,
    )


def _invocation(
    ctx: RunContext, prepared: _Prepared, given: dict[str, Any], checkpoint_dir: Path
) -> dict[str, Any]:
    """How to start this run again (for ``resume``): what can be saved, and nothing secret."""
    profile = given["sim_profile"]
    return {
        **given,
        "goal": prepared.goal,
        "scenario": prepared.scenario,
        "settings": ctx.settings.model_dump(mode="json"),
        "sim_profile": profile if isinstance(profile, str) else profile.model_dump(),
        "workdir": None
        if prepared.workdir is None
        else _saved_workdir(prepared.workdir, checkpoint_dir),
        "tools": sorted(ctx.toolbox.names()),
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


async def _execute(ctx: RunContext, chosen: Strategy, prepared: _Prepared) -> RunResult:
    restore = ctx.pause.restore
    if restore is not None:
        record = restore.record.tree
    else:
        record = NodeRecord(path="1", kind=chosen.root_kind, goal=prepared.goal, depth=1)
    started = restore.record.started_at if restore else time.time()
    async with AsyncExitStack() as stack:
        for toolset in prepared.toolsets:
            for found in await stack.enter_async_context(toolset.open()):
                try:
                    ctx.toolbox.add(found)
                except ValueError as exc:
                    raise UserInputError(str(exc)) from None
        root = NodeContext(ctx, record, allowed_tools=ctx.toolbox.names())
        await enter_scopes(stack, [i.run_scope(ctx) for i in ctx.instruments])
        if ctx.bus.wants("run_started"):
            ctx.bus.emit(_run_started(ctx, prepared.goal))
        try:
            status, answer, error = await _run_nodes(ctx, chosen, root)
            ctx.status = status  # before the run's scopes close: the trace says it
        except BaseException as exc:
            # The run raises (a refused API key, a scripted model used up, Ctrl-C) or its caller
            # cancels it: its event stream still ends with run_finished, saying which.
            if ctx.bus.wants("run_finished"):
                ctx.bus.emit(_run_failed(ctx.run_id, record, exc))
            raise
    models = {ctx.planner_model.name, ctx.executor_model.name}
    result = RunResult(
        run_id=ctx.run_id,
        goal=prepared.goal,
        strategy=ctx.settings.strategy,
        model=" + ".join(sorted(models)),
        simulated=ctx.planner_model.simulated or ctx.executor_model.simulated,
        status=status,
        answer=answer,
        answer_complete=status == "succeeded",
        tree=record,
        started_at=started,
        finished_at=time.time(),
        scenario=prepared.scenario,
        seed=ctx.settings.seed,
        error=error,
        settings=ctx.settings.model_dump(mode="json"),
        stats={
            "peak_concurrent_leaves": ctx.peak_leaves,
            "priced_as": sorted({ctx.planner_model.priced_as, ctx.executor_model.priced_as}),
        },
        price_table=ctx.pricing.version,
    )
    if prepared.env is not None and status not in ("paused", "cancelled"):
        verdict = await anyio.to_thread.run_sync(prepared.env.verify)
        result.verification = verdict.to_dict()
    if ctx.bus.wants("run_finished"):
        totals = result.totals()
        ctx.bus.emit(
            RunFinished(
                run_id=ctx.run_id,
                path="1",
                status=status,
                cost_usd=totals["cost_usd"],
                answer=answer[:2000],
                input_tokens=totals["input_tokens"],
                output_tokens=totals["output_tokens"],
                error=error,
            )
        )
    return result


async def _run_nodes(
    ctx: RunContext, chosen: Strategy, root: NodeContext
) -> tuple[RunStatus, str, str | None]:
    """Run the strategy from ``root``; the run's status, answer and error."""
    record = root.record
    status: RunStatus = "succeeded"
    answer = ""
    error: str | None = None
    # cancel() from outside (a run handle) cancels this scope: the run ends "cancelled".
    with tool_threads(ctx.settings.concurrency), anyio.CancelScope() as cancel_scope:
        ctx.cancel_scope = cancel_scope
        if ctx.cancel_requested:
            cancel_scope.cancel()
        # A deferred plan pauses the run: the pause control cancels this scope once no step
        # and no planning round is running any more.
        with anyio.CancelScope() as pause_scope:
            ctx.pause.scope = pause_scope
            try:
                answer = (await chosen.run(root)).text
            except StepFailed as exc:
                status = _run_status(record)
                answer = record.output or ""
                error = str(exc)
            except BaseExceptionGroup as group:
                # What the run lets through (a refused API key, a scripted model used up,
                # Ctrl-C, a bug) leaves it as itself, whatever the strategy and however deep
                # the task groups it came through: not as a group that `except` misses.
                raise _escaping(group) from None
    ctx.nodes_finished = True
    ctx.cancel_scope = None
    if cancel_scope.cancelled_caught or status == "cancelled":
        _retire_pending(record)
        return "cancelled", record.output or "", "cancelled by the caller"
    if ctx.pause.paused:
        return "paused", "", None
    return status, answer, error


def _run_failed(run_id: str, record: NodeRecord, exc: BaseException) -> RunFinished:
    """The last event of a run that raised, or that its caller cancelled."""
    usage = [call.usage for node in record.walk() for call in node.calls]
    cancelled = isinstance(exc, anyio.get_cancelled_exc_class())
    return RunFinished(
        run_id=run_id,
        path="1",
        status="cancelled" if cancelled else "error",
        cost_usd=record.subtree_cost_usd,
        answer="",
        input_tokens=sum(u.input_tokens for u in usage),
        output_tokens=sum(u.output_tokens for u in usage),
        error="cancelled by the caller" if cancelled else f"{type(exc).__name__}: {exc}",
    )


def _run_started(ctx: RunContext, goal: str) -> RunStarted:
    models = {ctx.planner_model.name, ctx.executor_model.name}
    return RunStarted(
        run_id=ctx.run_id,
        path="1",
        goal=goal,
        strategy=ctx.settings.strategy,
        model=" + ".join(sorted(models)),
        settings=ctx.settings.model_dump(mode="json"),
    )


def _retire_pending(root: NodeRecord) -> None:
    """Nodes that never started when the run was cancelled are cancelled too."""
    for node in root.walk():
        if node.status in ("pending", "running"):
            node.status = "cancelled"
            node.error = node.error or "not run: the run was cancelled"


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def _escaping(group: BaseExceptionGroup[Any]) -> BaseException:
    """The one exception a run raises for a group of them: a refused API key first (the user
    must act on it), then an interrupt (Ctrl-C must stop the program), then the first other
    error; cancellations of sibling tasks, which only follow from it, are left out. Any other
    errors are named in a note on it."""
    leaves = _leaves(group)
    real = [e for e in leaves if not isinstance(e, anyio.get_cancelled_exc_class())] or leaves
    chosen = next(
        (
            e
            for kind in (ModelAuthError, KeyboardInterrupt, SystemExit)
            for e in real
            if isinstance(e, kind)
        ),
        real[0],
    )
    others = [e for e in real if e is not chosen]
    if others:
        named = "; ".join(f"{type(e).__name__}: {e}" for e in others[:3])
        more = f" and {len(others) - 3} more" if len(others) > 3 else ""
        chosen.add_note(f"other errors of the run at the same time: {named}{more}")
    return chosen


_SECRET = re.compile(r"key|token|secret|password|auth|header|cookie", re.I)


def _saved_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """Provider options a checkpoint may keep: never keys or other secrets (they come from the
    environment again on resume), only plain values."""
    return {
        k: v
        for k, v in (options or {}).items()
        if not _SECRET.search(k) and isinstance(v, str | int | float | bool)
    }


def _run_status(root: NodeRecord) -> RunStatus:
    if root.status == "rejected":
        return "rejected"
    if root.status == "cancelled":
        return "cancelled"
    if root.status in ("partial", "budget_exhausted"):
        return "partial"
    leaves_done = any(n.status == "succeeded" and n.kind == "executor" for n in root.walk())
    return "partial" if leaves_done else "failed"


def run_sync(goal: str | None = None, **kwargs: Unpack[RunOptions]) -> RunResult:
    """:func:`run` for sync callers (starts its own event loop)."""
    refuse_unknown_options("run_sync", kwargs, RUN_OPTIONS)
    return anyio.run(partial(run, goal, **kwargs))
