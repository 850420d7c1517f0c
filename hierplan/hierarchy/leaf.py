"""hierplan.hierarchy.leaf."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from types import TracebackType
from typing import Any

import anyio
import anyio.lowlevel

from hierplan.core.events import NodeFinished, NodeStarted, StepRetried
from hierplan.core.results import StepResult
from hierplan.errors import (
    BudgetExceeded,
    HierplanError,
    ModelAuthError,
    StepFailed,
    UnexpectedModelCall,
)
from hierplan.hierarchy.context import NodeContext
from hierplan.plans.plan import Step

OUTPUT_LIMIT = 2000


class NodeLifecycle:
    """Marks the node running, opens every instrument's node scope, and closes the record
    whatever happens (success, failure, cancellation). Use it as ``async with
    node_lifecycle(node):``. A node scope cannot suppress the node's exception."""

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
        if run.bus.wants("node_started"):
            run.bus.emit(
                NodeStarted(
                    run_id=run.run_id,
                    path=record.path,
                    kind=record.kind,
                    goal=record.goal,
                    step_id=record.step_id,
                )
            )
        try:
            scopes = []
            for instrument in run.instruments:
                scope = instrument.node_scope(node)
                if scope is not None:
                    scopes.append(scope)
            if len(scopes) == 1:  # the common case (a budget, say) without an exit stack's cost
                await scopes[0].__aenter__()
                self.scope = scopes[0]
            elif scopes:
                self.scope = await _enter_all(scopes)
        except BaseException as exc:
            self._failed(exc)
            self._ended()
            raise

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


async def _enter_all(scopes: list[AbstractAsyncContextManager[None]]) -> AsyncExitStack:
    stack = AsyncExitStack()
    try:
        for scope in scopes:
            await stack.enter_async_context(scope)
    except BaseException as exc:
        await stack.__aexit__(type(exc), exc, exc.__traceback__)
        raise
    return stack


class _DeadlinePassed(Exception):
    """The step's own deadline passed (told apart from a TimeoutError the executor raises)."""


def _as_step_failure(exc: Exception) -> StepFailed:
    if isinstance(exc, StepFailed):
        return exc
    if isinstance(exc, BudgetExceeded):
        return StepFailed(str(exc), status="budget_exhausted")
    retryable = bool(getattr(exc, "retryable", False))
    return StepFailed(str(exc), retryable=retryable)


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
) -> Awaitable[StepResult]:
    """The executor's coroutine for the step (returned, not awaited here: one frame less)."""
    run = node.run
    if step.tool is not None and step.args is not None:
        return run.tool_executor.execute(node, step.tool, step.args, inputs)
    context = "" if node.parent is None else node.parent.record.goal
    return run.llm_executor.execute(
        node, step.instruction, inputs, context=context, only_tool=step.tool, react=react
    )


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
    timeout = settings.step_timeout_s
    limiter = run.leaf_limiter
    pause = run.pause
    if pause.pausing:
        await pause.wait_if_paused()
    pause.work_started()  # not a `with pause.working()`: this runs for every leaf
    try:
        async with NodeLifecycle(node):
            attempt = 0
            while True:
                attempt += 1
                node.record.attempts = attempt
                # Each attempt holds a slot of the run-wide leaf limit, under the step's
                # deadline. Inline rather than in a helper coroutine, which would stay on
                # every waiting leaf's stack (memory at 100,000 leaves in flight).
                await limiter.acquire()
                run.leaf_started()
                try:
                    if timeout is None:
                        result = await _execute_step(node, step, inputs, react)
                    else:
                        with anyio.CancelScope(deadline=anyio.current_time() + timeout) as scope:
                            result = await _execute_step(node, step, inputs, react)
                        if scope.cancelled_caught:  # the deadline passed
                            raise _DeadlinePassed
                except _DeadlinePassed:
                    failure = StepFailed(f"step timed out after {timeout:g} s", retryable=True)
                except TimeoutError as exc:
                    # A timeout of the executor's own (a model client's), not the step's
                    # deadline: it fails the attempt with its own message, which may also come
                    # when the step has no deadline at all.
                    failure = StepFailed(f"TimeoutError: {exc}", retryable=True)
                except (UnexpectedModelCall, ModelAuthError):
                    raise
                except HierplanError as exc:
                    failure = _as_step_failure(exc)
                else:
                    _finish(node, "succeeded", output=result.text)
                    pause.finished(node.path, result)
                    return result
                finally:
                    run.leaf_finished()
                    limiter.release()
                if not failure.retryable or attempt > retries:
                    _finish(node, failure.status, error=str(failure))
                    raise failure
                # Capped: with many retries the doubling would otherwise reach hours.
                delay = min(
                    settings.retry_max_delay_s, settings.retry_backoff_s * 2.0 ** (attempt - 1)
                )
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
    finally:
        pause.work_ended()
