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
from functools import partial
from pathlib import Path
from typing import Any, Unpack

import anyio
from pydantic import ValidationError

from hierplan.core.instrument import Instrument
from hierplan.core.settings import RunSettings
from hierplan.core.views import RunView
from hierplan.durable.lock import holding_run_directory
from hierplan.errors import UserInputError, first_problem
from hierplan.files import StrPath
from hierplan.hierarchy.gate import Approve, Decision, Defer, Edit, Reject
from hierplan.hierarchy.pause import (
    CHECKPOINT_FILE,
    RESUMING_FILE,
    Checkpoint,
    check_edit_goals,
    clear_checkpoint,
    load_checkpoint,
    pending_versions,
)
from hierplan.models.provider import one_line
from hierplan.plans.plan import Plan
from hierplan.records import NodeRecord, RunResult
from hierplan.runner.run import ResumableRunOptions, refuse_unknown_options, run


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


def run_arguments(
    checkpoint: Checkpoint, overrides: dict[str, Any], run_dir: Path
) -> dict[str, Any]:
    """The arguments of :func:`hierplan.run` that continue the checkpoint's run, saved in
    ``run_dir`` (a relative work directory is taken from there)."""
    inv = checkpoint.invocation
    if inv.get("model") is None and "model" not in overrides:
        raise UserInputError("the paused run used a model object, not a name: pass model=")
    if inv.get("executor_model_object") and "executor_model" not in overrides:
        raise UserInputError("the paused run used an executor model object: pass executor_model=")
    workdir = inv.get("workdir")
    kwargs: dict[str, Any] = {
        "goal": inv.get("goal"),
        "scenario": inv.get("scenario"),
        "model": inv.get("model"),
        "executor_model": inv.get("executor_model"),
        "settings": _saved_settings(inv.get("settings")),
        "sim_profile": inv.get("sim_profile", "typical"),
        "sim_latency_scale": inv.get("sim_latency_scale", 1.0),
        "workdir": None if workdir is None else run_dir / str(workdir),
        "model_options": inv.get("model_options") or None,
        **_saved_budget(inv.get("budget")),  # the same budget, less what was spent before
    }
    kwargs.update(overrides)
    return kwargs


# What a checkpoint's invocation may say about the budget (hierplan.run's own arguments).
_BUDGET_KEYS = frozenset({"budget_usd", "budget_tokens", "allocation", "price_in", "price_out"})


def _saved_settings(saved: Any) -> RunSettings:
    try:
        return RunSettings.model_validate(saved or {})
    except ValidationError as exc:
        raise UserInputError(
            f"the checkpoint's run settings are invalid ({first_problem(exc, 'settings')}); was "
            f"{CHECKPOINT_FILE} edited by hand?"
        ) from None


def _saved_budget(saved: Any) -> dict[str, Any]:
    if saved is None:
        return {}
    if not isinstance(saved, dict) or not set(saved) <= _BUDGET_KEYS:
        unknown = sorted(set(saved) - _BUDGET_KEYS) if isinstance(saved, dict) else saved
        raise UserInputError(
            f"the checkpoint's budget has what a run does not take ({unknown}); was "
            f"{CHECKPOINT_FILE} edited by hand?"
        )
    return dict(saved)


class ResumeOptions(ResumableRunOptions, total=False):
    """The keyword options of :func:`hierplan.resume` and :func:`hierplan.resume_sync`:
    ``node``, ``version`` and ``drop_checkpoint`` (see :func:`hierplan.resume`), and the
    :func:`hierplan.run` options a resumed run takes. ``run_id``, ``checkpoint_dir`` and
    ``restore`` are not among them: the checkpoint decides those. A misspelt option raises
    :class:`TypeError` naming the nearest one, before the checkpoint is touched."""

    node: str | None
    version: int | None
    drop_checkpoint: bool


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
    cannot be saved does not lose the run).

    >>> result = await hierplan.resume(Path("runs/mig"), Approve(by="alice"))  # doctest: +SKIP
    """
    # Before the lock is taken: a misspelt option must leave the directory as it was.
    refuse_unknown_options("resume", options, RESUME_OPTIONS)
    _check_decision(decision)
    run_dir = Path(run_dir)
    node = options.get("node")
    version = options.get("version")
    drop_checkpoint = options.get("drop_checkpoint", True)
    overrides = {
        k: v for k, v in options.items() if k not in ("node", "version", "drop_checkpoint")
    }
    # Held before the checkpoint is read: a run or resume writing the directory may replace it.
    with holding_run_directory(run_dir):
        checkpoint = load_checkpoint(run_dir)
        restore = checkpoint.restore(decisions_for(checkpoint, decision, node))
        check_edit_goals(restore.record.tree, restore.decisions)
        if version is not None:
            _check_version(restore.record.tree, node, version)
        kwargs = run_arguments(checkpoint, overrides, run_dir)
        kwargs.setdefault("checkpoint_extra", checkpoint.extra)
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
        kwargs["instruments"] = [*(kwargs.get("instruments") or ()), started]
        try:
            result = await run(checkpoint_dir=run_dir, restore=restore, **kwargs)
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
