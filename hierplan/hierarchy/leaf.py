"""A node's life, and a leaf step's run.

:class:`NodeLifecycle` marks a node running, opens every instrument's node scope, and closes
the record whatever happens (success, failure, cancellation). :func:`run_task_node` runs one
step as an executor node: each attempt under the run-wide leaf limit and the step's deadline,
retried with backoff while the failure says that trying again may help.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from types import TracebackType
from typing import Any

import anyio
import anyio.lowlevel

from hierplan.agents.executor import DecidedCall, may_decide_again
from hierplan.core.events import NodeFinished, NodeStarted, StepRetried
from hierplan.core.results import StepResult
from hierplan.errors import (
    BudgetExceeded,
    BudgetTooSmall,
    HierplanError,
    ModelAuthError,
    RunSkipped,
    StepFailed,
    ToolBlocked,
    ToolError,
    UnexpectedModelCall,
)
from hierplan.hierarchy.context import NodeContext
from hierplan.plans.plan import Step

OUTPUT_LIMIT = 2000


class NodeLifecycle:
    """Marks the node running, opens every instrument's node scope (then emits
    ``node_started``, which carries what the scopes gave the node), and closes the record
    whatever happens (success, failure, cancellation). Use it as ``async with
    node_lifecycle(node):``. A node scope cannot suppress the node's exception; one that
    raises :class:`~hierplan.errors.RunSkipped` at the root ends the node ``skipped``."""

    __slots__ = ("node", "scope")

    def __init__(self, node: NodeContext) -> None:
        self.node = node
        self.scope: AbstractAsyncContextManager[Any] | None = None

    async def __aenter__(self) -> None:
        node = self.node
        record = node.record
        run = node.run
        record.status = "running"
        record.started_at = time.time()
        try:
            scopes = []
            for instrument in run.instruments:
                scope = instrument.node_scope(node)
                if scope is not None:
                    scopes.append(scope)
            self.scope = await _enter_all(scopes)
        except BaseException as exc:
            self._started()
            self._failed(exc)
            self._ended()
            raise
        self._started()

    def _started(self) -> None:
        """Say that the node started, once its scopes are open: with the allocation a budget's
        scope gave it (its account opens there)."""
        node = self.node
        run = node.run
        if run.bus.wants("node_started"):
            record = node.record
            allocation = node.allocation
            run.bus.emit(
                NodeStarted(
                    run_id=run.run_id,
                    path=record.path,
                    kind=record.kind,
                    goal=record.goal,
                    step_id=record.step_id,
                    limit_tokens=None if allocation is None else allocation.tokens,
                    limit_usd=None if allocation is None else allocation.usd,
                )
            )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        node = self.node
        try:
            try:
                if self.scope is not None:
                    await self.scope.__aexit__(exc_type, exc, tb)
            except BaseException as inner:
                self._failed(inner)
                raise
            if exc is not None:
                self._failed(exc)
            elif node.parent is None:
                try:
                    # A cancel() that came during the run's last synchronous steps ends it here.
                    await anyio.lowlevel.checkpoint_if_cancelled()
                except BaseException as late:
                    self._failed(late)
                    raise
        finally:
            self._ended()

    def _failed(self, exc: BaseException) -> None:
        node = self.node
        record = node.record
        run = node.run
        if isinstance(exc, anyio.get_cancelled_exc_class()):
            if run.pause.pausing:
                record.status = "paused"
            else:
                record.status = "cancelled"
                record.error = record.error or "cancelled"
        elif isinstance(exc, RunSkipped):
            record.status = "skipped"  # the run did not start: its root's scope declined it
            record.error = str(exc)
        elif node.parent is None and run.cancel_requested:
            record.status = "cancelled"  # the root failed after the run was cancelled
            record.error = record.error or "cancelled"
        elif record.status == "running":
            record.status = "failed"
            record.error = record.error or f"{type(exc).__name__}: {exc}"

    def _ended(self) -> None:
        node = self.node
        record = node.record
        run = node.run
        record.finished_at = time.time()
        node.forget_model()
        if node.parent is None:
            run.nodes_finished = True  # from here on, cancel() changes nothing
        if run.bus.wants("node_finished"):
            run.bus.emit(
                NodeFinished(
                    run_id=run.run_id,
                    path=record.path,
                    status=record.status,
                    cost_usd=record.cost_usd,
                    subtree_cost_usd=record.subtree_cost_usd,
                    error=record.error,
                )
            )


node_lifecycle = NodeLifecycle


async def _enter_all(
    scopes: list[AbstractAsyncContextManager[None]],
) -> AbstractAsyncContextManager[Any] | None:
    """Enter ``scopes`` in order, as one scope (``None`` when there are none)."""
    if not scopes:
        return None
    if len(scopes) == 1:
        # The usual case (a budget's scope): entered as it is, not through an exit stack,
        # which costs a leaf about 4 % of its instructions (benchmarks/instructions.py).
        await scopes[0].__aenter__()
        return scopes[0]
    stack = AsyncExitStack()
    try:
        for scope in scopes:
            await stack.enter_async_context(scope)
    except BaseException as exc:
        await stack.__aexit__(type(exc), exc, exc.__traceback__)
        raise
    return stack


def _as_step_failure(exc: Exception) -> StepFailed:
    if isinstance(exc, StepFailed):
        return exc
    if isinstance(exc, BudgetExceeded):
        return StepFailed(str(exc), status="budget_exhausted")
    retryable = bool(getattr(exc, "retryable", False))
    return StepFailed(str(exc), retryable=retryable, blocked=isinstance(exc, ToolBlocked))


def _finish(
    node: NodeContext, status: str, *, output: str | None = None, error: str | None = None
) -> None:
    record = node.record
    record.status = status  # type: ignore[assignment]
    if output is not None:
        record.output = output[:OUTPUT_LIMIT]
    if error is not None:
        record.error = error


def _execute_step(
    node: NodeContext, step: Step, inputs: Mapping[str, StepResult], react: bool
) -> Coroutine[Any, Any, StepResult]:
    """Do the step: run an executor's tool-calling loop, or call its tool directly (see
    :func:`_call_planned_tool`)."""
    if step.tool is None or step.args is None:
        # The executor's coroutine itself, not one around it (see NodeContext.call_model).
        return node.run.llm_executor.execute(
            node, step.instruction, inputs, context=node.context, only_tool=step.tool, react=react
        )
    return _call_planned_tool(node, step, inputs)


async def _call_planned_tool(
    node: NodeContext, step: Step, inputs: Mapping[str, StepResult]
) -> StepResult:
    """Call the step's tool with the plan's arguments, or the call decided again after the
    tool refused the plan's (see :class:`~hierplan.agents.executor.DecidedCall`)."""
    run = node.run
    assert step.tool is not None and step.args is not None
    decided = node.decided_call
    if decided is None:
        refusal = node.refusal
        if refusal is None:
            try:
                return await run.tool_executor.execute(node, step.tool, step.args, inputs)
            except ToolError as error:
                if not (run.settings.redecide_tool_calls and may_decide_again(error)):
                    raise
                # Kept: when the model that decides again fails for a while, the step's next
                # attempt asks it again without making the refused call a second time.
                refusal = node.refusal = error
        decided = node.decided_call = await DecidedCall.decide(node, step, inputs, refusal)
    return await decided.run(node)


async def run_task_node(
    node: NodeContext,
    step: Step,
    inputs: Mapping[str, StepResult],
    *,
    react: bool = False,
    max_retries: int | None = None,
) -> StepResult:
    """Run one step as an executor node: retries with backoff, a deadline, the leaf limit."""
    run = node.run
    settings = run.settings
    retries = settings.max_retries if max_retries is None else max_retries
    if run.pause.pausing:
        await run.pause.wait_if_paused()
    with run.pause.working():
        async with NodeLifecycle(node):
            attempt = 0
            while True:
                attempt += 1
                node.record.attempts = attempt
                try:
                    result = await _attempt(node, step, inputs, react)
                except StepFailed as failure:
                    if not failure.retryable or attempt > retries:
                        _finish(node, failure.status, error=str(failure))
                        if failure.blocked:  # its plan may run the step again, as a new node
                            node.record.flags.append("blocked")
                        raise
                    await _before_retry(node, attempt, failure)
                    continue
                _finish(node, "succeeded", output=result.text)
                run.pause.finished(node.path, result)
                return result


async def _attempt(
    node: NodeContext, step: Step, inputs: Mapping[str, StepResult], react: bool
) -> StepResult:
    """One attempt at the step, holding a slot of the run-wide leaf limit, under the step's
    deadline; a failure is a :class:`StepFailed` that says whether to try again."""
    run = node.run
    timeout = run.settings.step_timeout_s
    await run.leaf_limiter.acquire()
    run.leaf_started()
    try:
        if timeout is None:
            return await _execute_step(node, step, inputs, react)
        with anyio.CancelScope(deadline=anyio.current_time() + timeout):
            return await _execute_step(node, step, inputs, react)
        # Only a deadline that passed gets here: the scope swallowed its cancellation.
        raise StepFailed(f"step timed out after {timeout:g} s", retryable=True)
    except TimeoutError as exc:
        # A timeout of the executor's own (a model client's), not the step's deadline: it
        # fails the attempt with its own message, which may also come when the step has no
        # deadline at all.
        raise StepFailed(f"TimeoutError: {exc}", retryable=True) from exc
    except (UnexpectedModelCall, ModelAuthError, StepFailed, BudgetTooSmall):
        raise
    except HierplanError as exc:
        raise _as_step_failure(exc) from exc
    finally:
        run.leaf_finished()
        run.leaf_limiter.release()


async def _before_retry(node: NodeContext, attempt: int, failure: StepFailed) -> None:
    """Wait before the next attempt: the backoff doubles with each one, up to a cap (with many
    retries the doubling would otherwise reach hours)."""
    run = node.run
    settings = run.settings
    delay = min(settings.retry_max_delay_s, settings.retry_backoff_s * 2.0 ** (attempt - 1))
    if run.bus.wants("step_retried"):
        run.bus.emit(
            StepRetried(
                run_id=run.run_id,
                path=node.path,
                attempt=attempt,
                error=str(failure),
                delay_s=delay,
            )
        )
    await anyio.sleep(delay)
