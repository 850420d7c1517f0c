"""A run's nodes, from the root down: the strategy run inside every instrument's run scope,
the run's status, answer and error worked out, and its record and last event made."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from hierplan.core.events import RunFinished, RunStarted
from hierplan.core.instrument import enter_scopes
from hierplan.errors import ModelAuthError, RunSkipped, StepFailed, UserInputError
from hierplan.hierarchy.context import NodeContext, RunContext
from hierplan.hierarchy.strategies import Strategy
from hierplan.records import NodeRecord, RunResult, RunStatus
from hierplan.tools.base import tool_threads

if TYPE_CHECKING:
    from hierplan.runner.prepare import Prepared


async def execute_run(
    ctx: RunContext,
    chosen: Strategy,
    prepared: Prepared,
    opened: Callable[[], object] | None = None,
) -> RunResult:
    """Run the strategy from the root, inside every instrument's run scope; the run's record.
    ``opened`` is called once the run's toolsets are open, before anything else runs (a resume
    checks its decisions against the tools then)."""
    restore = ctx.restore
    if restore is not None:
        record = restore.record.tree
    else:
        record = NodeRecord(path="1", kind=chosen.root_kind, goal=prepared.goal, depth=1)
    started = restore.record.started_at if restore else time.time()
    async with AsyncExitStack() as stack:
        await _open_toolsets(ctx, prepared, stack)
        if opened is not None:
            opened()
        root = NodeContext(ctx, record, allowed_tools=ctx.toolbox.names())
        await enter_scopes(stack, [i.run_scope(ctx) for i in ctx.instruments])
        if ctx.bus.wants("run_started"):
            ctx.bus.emit(_run_started(ctx, prepared.goal))
        try:
            status, answer, error, reason = await _run_nodes(ctx, chosen, root)
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
        reason=reason,
    )
    if prepared.env is not None and status not in ("paused", "cancelled", "skipped"):
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
                reason=reason,
            )
        )
    return result


async def _open_toolsets(ctx: RunContext, prepared: Prepared, stack: AsyncExitStack) -> None:
    """Open the run's toolsets (each closed with ``stack``) and add their tools to its
    toolbox; one that cannot be opened, or two tools of one name, is refused naming where
    each came from."""
    for openable in prepared.toolsets:
        try:
            found = await stack.enter_async_context(openable.toolset.open())
        except UserInputError as exc:
            raise UserInputError(f"{openable.label}: {openable.hide(str(exc))}") from None
        for tool in found:
            prepared.add_source(tool.name, openable.label)
            ctx.toolbox.add(tool)


async def _run_nodes(
    ctx: RunContext, chosen: Strategy, root: NodeContext
) -> tuple[RunStatus, str, str | None, str | None]:
    """Run the strategy from ``root``; the run's status, answer, error, and why it was
    skipped (a root's scope that declined to start it: a budget that could not be granted)."""
    record = root.record
    status: RunStatus = "succeeded"
    answer = ""
    error: str | None = None
    reason: str | None = None
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
                if record.status == "partial":  # done, but the plan left part of the goal out
                    status, error = "partial", record.error
            except StepFailed as exc:
                status = _run_status(record)
                answer = record.output or ""
                error = str(exc)
            except RunSkipped as exc:
                status, error, reason = "skipped", str(exc), exc.reason
            except BaseExceptionGroup as group:
                # What the run lets through (a refused API key, a scripted model used up,
                # Ctrl-C, a bug) leaves it as itself, whatever the strategy and however deep
                # the task groups it came through: not as a group that `except` misses.
                raise _escaping(group) from None
    ctx.nodes_finished = True
    ctx.cancel_scope = None
    if cancel_scope.cancelled_caught or status == "cancelled":
        _retire_pending(record)
        return "cancelled", record.output or "", "cancelled by the caller", None
    if ctx.pause.paused:
        return "paused", "", None, None
    return status, answer, error, reason


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


def _run_status(root: NodeRecord) -> RunStatus:
    if root.status == "rejected":
        return "rejected"
    if root.status == "cancelled":
        return "cancelled"
    if root.status in ("partial", "budget_exhausted"):
        return "partial"
    leaves_done = any(n.status == "succeeded" and n.kind == "executor" for n in root.walk())
    return "partial" if leaves_done else "failed"
