"""Watch a run while it goes, and stop it from outside: :func:`start` and :class:`RunHandle`.

>>> async def main():  # doctest: +SKIP
...     async with hierplan.start(scenario="data_migration") as handle:
...         async for event in handle.events():
...             print(event.type, event.path)
...         result = await handle.result()

**Buffering.** The handle keeps every event of its run in a list, in the order they happened.
The run appends to it from the event bus (an append: it never waits and never drops), and each
:meth:`RunHandle.events` iterator reads the list at its own pace, from the start or from
``since``. So a slow consumer never stalls the run and loses nothing, any number of consumers
each see every event, and a consumer that comes late (a browser that reconnects) catches up.
The price is memory: the log lives as long as the handle (``benchmarks/events.py`` measures the
bytes per event; plan events, which carry the whole plan, are the large ones). Drop the handle
to free it.

**Cancellation.** :meth:`RunHandle.cancel` cancels every task of the run at its next
checkpoint; the run ends with status ``cancelled`` and a record that keeps what finished.
Leaving the ``async with`` block waits for the run to end, unless the block raised or was
cancelled (a caller's deadline), in which case the run is cancelled first: a run never
outlives its block, and always ends with a record.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Unpack

import anyio
from anyio.abc import TaskGroup, TaskStatus

from hierplan.budgets.instrument import BudgetInstrument, RunBudget
from hierplan.budgets.snapshot import AccountSnapshot
from hierplan.core.events import Listener, RunEvent, RunFinished
from hierplan.core.instrument import Instrument
from hierplan.core.views import RunView
from hierplan.hierarchy.context import RunContext
from hierplan.records import NodeRecord, RunResult
from hierplan.runner.run import RUN_OPTIONS, RunOptions, execute, refuse_unknown_options, run_spec
from hierplan.runner.spec import RunSpec


class EventStream:
    """An async iterator over a run's events, from position ``since`` (see :class:`RunHandle`)."""

    __slots__ = ("_handle", "position")

    def __init__(self, handle: RunHandle, since: int) -> None:
        self._handle = handle
        self.position = since

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> RunEvent:
        handle = self._handle
        while True:
            log = handle._log
            if self.position < len(log):
                event = log[self.position]
                self.position += 1
                return event
            if handle._finished:
                raise StopAsyncIteration
            await handle._changed().wait()


class _Attach(Instrument):
    """Hands the run's context to its handle when the run starts."""

    def __init__(self, handle: RunHandle) -> None:
        self.handle = handle

    def run_scope(self, run: RunView) -> AbstractAsyncContextManager[None]:
        """Attach the run to the handle when the run starts."""
        assert isinstance(run, RunContext)  # the handle's own run: it may cancel it
        return self._scope(run)

    @asynccontextmanager
    async def _scope(self, run: RunContext) -> AsyncIterator[None]:
        self.handle._attach(run)
        yield


class RunHandle:
    """A run in progress: its events, its result, and a way to cancel it.

    Made by :func:`start`; use it as an async context manager. ``run_id`` is known at once.
    """

    def __init__(self, launch: Launch, run_id: str, goal: str = "", strategy: str = "") -> None:
        self.run_id = run_id
        self._launch = launch
        # What a run cancelled before it started is recorded with.
        self._goal = goal
        self._strategy = strategy
        self._log: list[RunEvent] = []
        self._wakeup: anyio.Event | None = None
        self._finished = False
        self._result: RunResult | None = None
        self._error: Exception | None = None
        self._error_seen = False
        self._done: anyio.Event | None = None
        self._ctx: RunContext | None = None
        self._attached = False
        self._budget: RunBudget | None = None
        self._cancel_requested = False
        self._outer: anyio.CancelScope | None = None
        self._started: TaskStatus[None] | None = None
        self._task_group: TaskGroup | None = None

    # -- what a consumer uses -------------------------------------------------------------
    def events(self, since: int = 0) -> EventStream:
        """Every event of the run from position ``since`` on, waiting for new ones until the
        run ends. Each call gives an independent iterator."""
        self._require_entered("events")
        if since < 0:
            raise ValueError(f"since must be 0 or more, not {since}")
        return EventStream(self, since)

    async def budget_snapshot(self) -> dict[str, AccountSnapshot]:
        """Every node's budget account now, by node path (parents before children): its
        allocation (``limit_*``), what it has spent, holds for calls in flight and could
        still reserve (``remaining_*``), and whether it has closed; see
        :class:`~hierplan.budgets.snapshot.AccountSnapshot`. Nodes that have no account of
        their own (a step that only calls a tool, a node not started) are left out.

        Empty for a run without a budget, and before the run's root has its account (a run
        waiting for its budget, one skipped for it). It works during the run and after it.
        A coroutine, as a ledger shared between processes answers over the network; on the
        usual local ledger the figures are all taken at one moment."""
        budget = self._budget
        if budget is None:
            return {}
        return await budget.snapshot()

    @property
    def event_count(self) -> int:
        """How many events the run has emitted so far."""
        return len(self._log)

    @property
    def started(self) -> bool:
        """Whether the run's nodes started (a run cancelled before that ran nothing)."""
        return self._attached

    @property
    def done(self) -> bool:
        """Whether the run has ended (its result, or its error, is ready)."""
        return self._finished

    @property
    def status(self) -> str:
        """``starting``, ``running``, or the run's final status."""
        if self._result is not None:
            return self._result.status
        if self._error is not None:
            return "error"
        return "running" if self._ctx is not None else "starting"

    async def result(self) -> RunResult:
        """Wait for the run to end and return its record (re-raises an error the run raised)."""
        self._require_entered("result")
        await self._done_event().wait()
        if self._error is not None:
            self._error_seen = True
            raise self._error
        assert self._result is not None
        return self._result

    def cancel(self) -> bool:
        """Cancel the run. Returns ``False`` if its nodes had already finished (the run then
        keeps its status), ``True`` if it will end ``cancelled``."""
        if self._finished:
            return False
        self._cancel_requested = True
        if self._ctx is not None:
            return self._ctx.cancel()
        if self._outer is not None:
            self._outer.cancel()
        return True

    def _require_entered(self, method: str) -> None:
        """Refuse a use of a handle whose run has not started: it would wait for ever."""
        if self._task_group is None:
            raise RuntimeError(
                f"RunHandle.{method}() was called before the run started: a handle runs "
                f"only inside its block, as in `async with hierplan.start(...) as handle:`; "
                f"call handle.{method}() inside the block (or after it)"
            )

    # -- lifecycle ------------------------------------------------------------------------
    async def __aenter__(self) -> RunHandle:
        if self._task_group is not None:
            raise RuntimeError("a RunHandle can be entered only once")
        group = anyio.create_task_group()
        await group.__aenter__()
        self._task_group = group
        try:
            await group.start(self._main)
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc_type is None:
                await self._done_event().wait()
        finally:
            await self._close()
        if self._error is not None and not self._error_seen and exc_type is None:
            self._error_seen = True
            raise self._error

    async def _close(self) -> None:
        """Cancel the run unless it ended, and wait (shielded) until it has wound down."""
        if not self._finished:
            self.cancel()
        assert self._task_group is not None
        with anyio.CancelScope(shield=True):
            await self._done_event().wait()
        await self._task_group.__aexit__(None, None, None)

    async def _main(self, *, task_status: TaskStatus[None]) -> None:
        self._started = task_status
        self._done_event()
        result: RunResult | None = None
        try:
            # Shielded: only cancel() stops the run, so that it always ends with a record
            # (a caller's deadline reaches the block, whose exit calls cancel()).
            with anyio.CancelScope(shield=True), anyio.CancelScope() as outer:
                self._outer = outer
                if self._cancel_requested:
                    outer.cancel()
                result = await self._launch(self._record, _Attach(self))
            if result is None:  # cancelled before its nodes started
                result = self._cancelled_before_start()
            self._result = result
        except Exception as exc:
            if self._started is not None:  # not started yet: raise from __aenter__
                raise
            self._error = exc
        finally:
            self._outer = None
            self._ctx = None  # the run's context (models, tools) is not needed any more
            self._finished = True
            self._wake()
            self._done_event().set()
        self._signal_started()

    def _attach(self, ctx: RunContext) -> None:
        self._ctx = ctx
        self._attached = True
        # The run's budget state, kept after the run (which drops its context) for snapshots.
        for instrument in ctx.instruments:
            if isinstance(instrument, BudgetInstrument):
                self._budget = instrument.for_run(ctx)
        self.run_id = ctx.run_id  # a resumed run's, read from its checkpoint
        if self._cancel_requested:
            ctx.cancel()
        self._signal_started()

    def _signal_started(self) -> None:
        started, self._started = self._started, None
        if started is not None:
            started.started()

    def _record(self, event: RunEvent) -> None:
        # The bus calls this synchronously: append and wake the readers, never wait.
        self._log.append(event)
        if self._wakeup is not None:
            self._wake()

    def _wake(self) -> None:
        wakeup = self._wakeup
        if wakeup is not None:
            self._wakeup = None
            wakeup.set()

    def _changed(self) -> anyio.Event:
        if self._wakeup is None:
            self._wakeup = anyio.Event()
        return self._wakeup

    def _done_event(self) -> anyio.Event:
        if self._done is None:
            self._done = anyio.Event()
        return self._done

    def _cancelled_before_start(self) -> RunResult:
        goal = self._goal
        now = time.time()
        tree = NodeRecord(
            path="1",
            kind="planner",
            goal=goal,
            depth=1,
            status="cancelled",
            error="not run: the run was cancelled before it started",
        )
        event = RunFinished(
            run_id=self.run_id,
            path="1",
            status="cancelled",
            cost_usd=0.0,
            answer="",
            error="cancelled by the caller before the run started",
        )
        self._log.append(event)
        return RunResult(
            run_id=self.run_id,
            goal=goal,
            strategy=self._strategy,
            model="",
            simulated=False,
            status="cancelled",
            answer="",
            tree=tree,
            answer_complete=False,
            started_at=now,
            finished_at=now,
            error=event.error,
        )


Launch = Callable[[Listener, Instrument], Awaitable[RunResult]]
"""How a handle starts its run: with its own listener and instrument added to the run's."""


def start(goal: str | RunSpec | None = None, **options: Unpack[RunOptions]) -> RunHandle:
    """Start a run and get a handle on it; takes the same arguments as :func:`hierplan.run`.

    >>> async with hierplan.start(scenario="data_migration") as handle:  # doctest: +SKIP
    ...     async for event in handle.events():
    ...         if event.type == "node_finished" and event.status == "failed":
    ...             handle.cancel()
    ...     result = await handle.result()

    Entering the context starts the run and returns once it has started (bad input raises
    there, as :func:`hierplan.run` would). See :mod:`hierplan.runner.handle` for how events
    are buffered and how cancellation works. A keyword :func:`hierplan.run` does not take
    raises :class:`TypeError` here, at once.
    """
    refuse_unknown_options("start", options, RUN_OPTIONS)
    given = goal.run_id if isinstance(goal, RunSpec) else None
    run_id = given or uuid.uuid4().hex[:12]

    async def launch(listener: Listener, instrument: Instrument) -> RunResult:
        spec = run_spec(goal, **options).model_copy(update={"run_id": run_id})
        return await execute(
            spec,
            tools=options.get("tools", ()),
            approver=options.get("approver"),
            instruments=[*options.get("instruments", ()), instrument],
            listeners=[*options.get("listeners", ()), listener],
            checkpoint_dir=options.get("checkpoint_dir"),
        )

    shown = goal.goal if isinstance(goal, RunSpec) else goal
    scenario = options.get("scenario") or (goal.scenario if isinstance(goal, RunSpec) else None)
    return RunHandle(
        launch,
        run_id,
        goal=shown or (str(getattr(scenario, "name", scenario or ""))),
        strategy=str(options.get("strategy") or ""),
    )
