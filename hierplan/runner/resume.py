"""``resume(run_dir, decision) -> RunResult``: continue a run that paused for a review.

A paused run's directory holds ``checkpoint.json`` (the run record, finished step results, how
the run was started, the ids of its workflow span when traced: the resumed run's trace links to
it) and ``pending/<node>.yaml`` for each plan waiting for a decision.
:func:`resume` applies the decision (approve, edit, reject), rebuilds the run without planning
or running again what was done, and goes on. The run may pause again at a later gate.

A checkpoint is used once: while a resume runs it is renamed ``checkpoint.resuming.json``; the
resumed run writes a new checkpoint if it pauses again. If the resume stops before the run
started (bad input, files that cannot be opened again, an interrupt), the checkpoint is put back.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypedDict, Unpack

import anyio
from pydantic import ValidationError

from hierplan.core.events import Listener
from hierplan.core.instrument import Instrument
from hierplan.core.settings import RunSettings
from hierplan.core.views import RunView
from hierplan.durable.checkpoint import (
    CHECKPOINT_FILE,
    RESUMING_FILE,
    Checkpoint,
    check_edit_goals,
    checkpoint_run_id,
    clear_checkpoint,
    load_checkpoint,
    pending_versions,
)
from hierplan.durable.lock import holding_run_directory
from hierplan.errors import UserInputError, first_problem
from hierplan.files import StrPath
from hierplan.hierarchy.gate import Approver
from hierplan.models.provider import one_line
from hierplan.plans.decisions import Approve, Decision, Defer, Edit, Reject
from hierplan.plans.plan import Plan
from hierplan.records import NodeRecord, RunResult
from hierplan.runner.handle import RunHandle
from hierplan.runner.run import execute, refuse_unknown_options, run_spec
from hierplan.runner.spec import BudgetSpec, ModelChoice, RunSpec, loaded_choice
from hierplan.scenarios import Scenario
from hierplan.tools.base import Tool, Toolset


def decisions_for(
    checkpoint: Checkpoint, decision: Decision | None, node: str | None
) -> dict[str, Decision]:
    """The decision per pending node: for ``node`` only, or for every pending plan."""
    pending = checkpoint.pending
    if not pending:
        raise UserInputError("the checkpoint has no pending plan: nothing to decide")
    if node is not None:
        if node not in pending:
            raise UserInputError(f"node {node} has no pending plan; pending: {', '.join(pending)}")
        return {} if decision is None else {node: decision}
    if decision is None:
        return {}
    if isinstance(decision, Edit) and len(pending) > 1:
        raise UserInputError(
            f"{len(pending)} plans are pending ({', '.join(pending)}): say which one the edited "
            "plan is for (--node PATH)"
        )
    return dict.fromkeys(pending, decision)


def _check_decision(decision: object) -> None:
    """Refuse a decision of another type (``"approve"``, an ``Edit`` of plain data) before the
    run directory is touched: it would fail only once the resumed run had started."""
    if decision is not None and not isinstance(decision, Approve | Edit | Reject | Defer):
        raise TypeError(
            "resume takes Approve(), Edit(plan), Reject(reason) or Defer() as its decision, or "
            f"None to ask the approver again, not {decision!r}"
        )
    if isinstance(decision, Edit) and not isinstance(decision.plan, Plan):
        raise TypeError(
            f"Edit needs a Plan, not {type(decision.plan).__name__}: Edit(Plan(...)), or "
            "Edit(hierplan.load_plan(path)) for a plan file"
        )


def _check_version(tree: NodeRecord, node: str | None, version: int) -> None:
    """Refuse a decision made on another version of the plan than the one waiting."""
    waiting = {n.path: v.version for n, v in pending_versions(tree)}
    if node is None:
        if len(waiting) > 1:
            raise UserInputError(
                f"{len(waiting)} plans are pending ({', '.join(waiting)}): say which one the "
                "version is of (--node PATH)"
            )
        node = next(iter(waiting))
    if waiting.get(node) != version:
        raise UserInputError(
            f"node {node} waits on plan version {waiting.get(node)}, not {version}: the run went "
            f"on since; read pending/{node}.yaml again and decide on that version"
        )


def resumed_spec(checkpoint: Checkpoint, options: Mapping[str, Any], run_dir: Path) -> RunSpec:
    """The spec that continues the checkpoint's run, saved in ``run_dir`` (a relative work
    directory is taken from there), with the run ``options`` given to the resume laid over it
    (model objects, which a checkpoint cannot keep, among them)."""
    saved = checkpoint.spec
    model = loaded_choice(saved.get("model"))
    executor = loaded_choice(saved.get("executor_model"))
    if model is None and options.get("model") is None:
        raise UserInputError("the paused run used a model object, not a name: pass model=")
    if (
        executor is None
        and saved.get("executor_model") is not None
        and options.get("executor_model") is None
    ):
        raise UserInputError("the paused run used an executor model object: pass executor_model=")
    workdir = saved.get("workdir")
    try:
        base = RunSpec(
            goal=saved.get("goal"),
            scenario=saved.get("scenario"),
            settings=_saved_settings(saved.get("settings")),
            model=model or "sim",
            executor_model=executor,
            budget=saved.get("budget"),  # the same budget, less what was spent before
            price_in=saved.get("price_in"),
            price_out=saved.get("price_out"),
            workdir=None if workdir is None else run_dir / str(workdir),
            tools=saved.get("toolsets") or (),
        )
    except ValidationError as exc:
        raise UserInputError(
            f"the checkpoint's run is invalid ({first_problem(exc, 'spec')}); was "
            f"{CHECKPOINT_FILE} edited by hand?"
        ) from None
    return run_spec(base, **options)


def _saved_settings(saved: Any) -> RunSettings:
    try:
        return RunSettings.model_validate(saved or {})
    except ValidationError as exc:
        raise UserInputError(
            f"the checkpoint's run settings are invalid ({first_problem(exc, 'settings')}); was "
            f"{CHECKPOINT_FILE} edited by hand?"
        ) from None


class ResumeOptions(TypedDict, total=False):
    """The keyword options of :func:`hierplan.resume` and :func:`hierplan.resume_sync`:
    ``node``, ``version``, ``drop_checkpoint`` and ``extra`` (see :func:`hierplan.resume`), and
    the
    :func:`hierplan.run` options a resumed run takes (all but ``checkpoint_dir``: the
    checkpoint decides it). A misspelt option raises :class:`TypeError` naming the nearest
    one, before the checkpoint is touched."""

    node: str | None
    version: int | None
    drop_checkpoint: bool
    extra: dict[str, Any]
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
    workdir: StrPath | None


RESUME_OPTIONS: frozenset[str] = ResumeOptions.__optional_keys__


async def resume(
    run_dir: StrPath,
    decision: Decision | None = None,
    **options: Unpack[ResumeOptions],
) -> RunResult:
    """Continue the paused run in ``run_dir`` with ``decision`` on its pending plan(s).

    ``decision`` is :class:`~hierplan.Approve`, :class:`~hierplan.Edit` or
    :class:`~hierplan.Reject` (its reason goes to the planner); it applies to every pending
    plan, or to node ``node``'s only. ``version``: decide only if the plan waiting is that
    version (the one in ``pending/<node>.yaml`` the decision was made on): a run resumed by
    someone else and paused again waits on a newer one. With no decision the pending plans go
    to the approver again. The other ``options`` (:class:`~hierplan.ResumeOptions`) are
    :func:`hierplan.run` arguments that cannot be saved (an ``approver``, ``tools``, model
    objects, ``listeners``, ``instruments``); the rest comes from the checkpoint. An option
    resume does not take raises :class:`TypeError` before ``run_dir`` is touched. As in
    :func:`hierplan.run`, plans are approved automatically unless an ``approver`` is given:
    pass the same approver to keep reviewing later plans.

    The resume holds ``run_dir``'s lock (``run.lock``, see :mod:`hierplan.durable.lock`) from before
    it reads the checkpoint until it returns: while another run or resume holds it (in this
    process or another, ``hierplan resume`` included) this raises
    :class:`~hierplan.errors.UserInputError` at once and changes nothing.

    When the run ends without pausing again, the checkpoint it resumed from is deleted, unless
    ``drop_checkpoint`` is ``False``: then it stays as ``checkpoint.resuming.json`` until the
    caller has saved the run's record and calls :func:`drop_used_checkpoint` (a record that
    cannot be saved does not lose the run). ``extra`` is kept with the checkpoint if the run
    pauses again (by default, what the paused run kept).

    >>> result = await hierplan.resume(Path("runs/mig"), Approve(by="alice"))  # doctest: +SKIP
    """
    # Before the lock is taken: a misspelt option must leave the directory as it was.
    refuse_unknown_options("resume", options, RESUME_OPTIONS)
    _check_decision(decision)
    return await _resumed(Path(run_dir), decision, options)


def start_resume(
    run_dir: StrPath, decision: Decision | None = None, **options: Unpack[ResumeOptions]
) -> RunHandle:
    """:func:`resume`, with a handle on the resumed run as :func:`hierplan.start` gives one
    on a new run: its events, its result, and a way to cancel it.

    >>> async with hierplan.start_resume("runs/mig", Approve()) as handle:  # doctest: +SKIP
    ...     result = await handle.result()
    """
    refuse_unknown_options("start_resume", options, RESUME_OPTIONS)
    _check_decision(decision)

    async def launch(listener: Listener, instrument: Instrument) -> RunResult:
        return await _resumed(Path(run_dir), decision, options, listener, instrument)

    return RunHandle(launch, checkpoint_run_id(Path(run_dir)))


async def _resumed(
    run_dir: Path,
    decision: Decision | None,
    options: Mapping[str, Any],
    listener: Listener | None = None,
    instrument: Instrument | None = None,
) -> RunResult:
    """The resume itself (see :func:`resume`), with a handle's listener and instrument."""
    node = options.get("node")
    version = options.get("version")
    drop_checkpoint = options.get("drop_checkpoint", True)
    overrides: dict[str, Any] = {
        k: v for k, v in options.items() if k not in ("node", "version", "drop_checkpoint", "extra")
    }
    # Held before the checkpoint is read: a run or resume writing the directory may replace it.
    with holding_run_directory(run_dir):
        checkpoint = load_checkpoint(run_dir)
        restore = checkpoint.restore(decisions_for(checkpoint, decision, node))
        check_edit_goals(restore.record.tree, restore.decisions)
        if version is not None:
            _check_version(restore.record.tree, node, version)
        spec = resumed_spec(checkpoint, overrides, run_dir)
        saved = run_dir / CHECKPOINT_FILE
        resuming = run_dir / RESUMING_FILE
        try:
            # The rename is what claims the checkpoint: of two resumes started together, one wins.
            saved.replace(resuming)
        except FileNotFoundError:
            raise UserInputError(
                f"another resume of {run_dir} started at the same time and took its checkpoint "
                "first; this one changed nothing"
            ) from None
        started = _Started()
        added = [started] if instrument is None else [started, instrument]
        try:
            result = await execute(
                spec,
                tools=overrides.get("tools", ()),
                approver=overrides.get("approver"),
                instruments=[*overrides.get("instruments", ()), *added],
                listeners=[
                    *overrides.get("listeners", ()),
                    *([] if listener is None else [listener]),
                ],
                checkpoint_dir=run_dir,
                checkpoint_extra=options.get("extra", checkpoint.extra),
                restore=restore,
            )
        except BaseException as exc:
            if started.started and not isinstance(exc, UserInputError):
                raise  # steps may have run: the checkpoint is not valid as it was
            resuming.replace(saved)  # nothing ran: the checkpoint is as good as before
            if isinstance(exc, OSError | sqlite3.Error):  # a scenario's files, reopened
                raise UserInputError(
                    f"the paused run in {run_dir} could not be set up again "
                    f"({type(exc).__name__}: {one_line(str(exc))}); were its files changed "
                    "or damaged since it paused? Nothing ran and the run is still paused"
                ) from exc
            raise
        if result.status == "paused" or drop_checkpoint:
            drop_used_checkpoint(run_dir, result)
        return result


class _Started(Instrument):
    """Notes that the run has started: before that, nothing ran and the checkpoint still holds."""

    def __init__(self) -> None:
        self.started = False

    def run_scope(self, run: RunView) -> None:
        """Note the start of the run (no scope around it)."""
        self.started = True


def drop_used_checkpoint(run_dir: Path, result: RunResult) -> None:
    """Delete the checkpoint a resume in ``run_dir`` used, now that it ended with ``result``
    (and the caller saved its record): all of the paused run, unless it paused again."""
    (run_dir / RESUMING_FILE).unlink(missing_ok=True)
    if result.status != "paused":
        clear_checkpoint(run_dir)


def resume_sync(
    run_dir: StrPath, decision: Decision | None = None, **kwargs: Unpack[ResumeOptions]
) -> RunResult:
    """:func:`resume` for sync callers (starts its own event loop)."""
    refuse_unknown_options("resume_sync", kwargs, RESUME_OPTIONS)
    return anyio.run(partial(resume, run_dir, decision, **kwargs))
