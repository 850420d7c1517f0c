"""Pausing a run at the gate.

When an approver answers :class:`~hierplan.plans.decisions.Defer`, the node keeps its plan as
``pending`` and the run starts no new step: steps that have not started wait, and the steps
already running finish (their results are kept). Planning that is due goes on to its gate, so
that every plan that can wait for a decision at that moment is saved at once (sub-goals that
became ready together are decided together); no tool runs for them. Once no step and no planning
round runs any more, the run stops with status ``paused``, and the runner saves its checkpoint
(:mod:`hierplan.durable.checkpoint`); a resume continues it (:mod:`hierplan.durable.restore`).

Only leaf steps and planning rounds count as running work (:meth:`PauseControl.working`); a step
records its result before it stops counting. When the count reaches zero, the pause waits until
every task of the loop is blocked (tasks just scheduled get to start their work or reach a wait),
checks the count again, and only then stops the run.
"""

from __future__ import annotations

import anyio

from hierplan.core.results import StepResult

# How long to wait for every task to block before a pause checks its count anyway (a host
# application may have tasks that never block).
SETTLE_TIMEOUT_S = 5.0


class PauseControl:
    """One run's pause state, and the results of its finished nodes (which a checkpoint
    keeps). See the module docstring."""

    def __init__(self, results: dict[str, StepResult] | None = None) -> None:
        self.pausing = False
        self.busy = 0
        self.scope: anyio.CancelScope | None = None
        self.results: dict[str, StepResult] = dict(results or {})
        self._idle: anyio.Event | None = None  # made inside the event loop, when first needed
        self._draining = False

    @property
    def paused(self) -> bool:
        """Whether the run stopped to wait for a decision."""
        return self.pausing and self.scope is not None and self.scope.cancel_called

    def working(self) -> PauseControl:
        """Count a leaf step or a planning round as running work: ``with pause.working():``
        (a plain, not async, scope; a class of its own rather than a generator, which costs a
        leaf about 3 % of its instructions, benchmarks/instructions.py)."""
        return self

    def __enter__(self) -> None:
        self.busy += 1

    def __exit__(self, *exc: object) -> None:
        self.busy -= 1
        self._stop_if_idle()

    async def wait_if_paused(self) -> None:
        """Called before a step starts: while the run pauses, wait to be cancelled."""
        if self.pausing:
            await anyio.sleep_forever()

    async def hold(self) -> None:
        """A plan waits for an outside decision: pause the run and wait to be cancelled.

        The first plan held also watches the run and stops it once nothing runs any more.
        """
        if self.scope is None:
            raise RuntimeError("a plan was deferred outside a run: use hierplan.run()")
        self.pausing = True
        if self._idle is None:
            self._idle = anyio.Event()
        self._stop_if_idle()
        if not self._draining:
            self._draining = True
            await self._drain(self.scope)
        await anyio.sleep_forever()

    async def _drain(self, scope: anyio.CancelScope) -> None:
        while True:
            assert self._idle is not None
            await self._idle.wait()
            with anyio.move_on_after(SETTLE_TIMEOUT_S):
                await anyio.wait_all_tasks_blocked()
            if self.busy == 0:
                scope.cancel()
                return
            self._idle = anyio.Event()

    def finished(self, path: str, result: StepResult) -> None:
        """Keep a finished node's result for the checkpoint."""
        self.results[path] = result

    def _stop_if_idle(self) -> None:
        if self.pausing and self.busy == 0 and self._idle is not None:
            self._idle.set()
