"""Runs one plan's DAG under one anyio task group.

A step starts the moment its last dependency finishes: there is no level-by-level barrier, so the
makespan follows the critical path. A per-plan limit bounds how many of the plan's steps run at
once (the run-wide leaf limit is applied by the executor nodes); a ready step past the limit
waits in a queue and gets its task when a slot frees, so a wide plan holds as many tasks as its
limit allows, not one per step. Every task belongs to the task group, so none outlives the plan.

A step whose tool was blocked (:class:`~hierplan.errors.ToolBlocked`: it needs work not done yet)
is parked, not failed: once no other step runs or can start, and the plan has no more steps to
come, the parked steps run again (the work they needed may have been done meanwhile by steps
the plan did not make them wait for): the first time in any case, and after that only when
some step succeeded since they were last sent to run; when none did, their failures are for
good. When a step fails for good, either its dependents are cancelled (transitively) and
independent branches go on, or, with ``stop_on_failure`` (the node is about to replan), no new
step starts and the steps already running finish. A plan that streams always goes on with its
independent branches, unless a replan asked for meanwhile redoes a step (:class:`Watch`).
Bookkeeping is O(1) per step and per dependency edge.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup

from hierplan.core.results import StepResult
from hierplan.errors import StepFailed
from hierplan.plans.plan import Plan, Step

RunStep = Callable[[Step, dict[str, StepResult]], Awaitable[StepResult]]


class Slots:
    """A capacity limiter for the tasks of one event loop: ``total`` slots, first come first
    served.

    Unlike ``anyio.CapacityLimiter`` it keeps no set of borrowers and takes a free slot without
    a checkpoint, so the common case (a slot is free) is an integer test; a task that must wait
    waits on an event, and a released slot goes straight to the first waiter.
    """

    __slots__ = ("_waiters", "free", "total")

    def __init__(self, total: int) -> None:
        if total < 1:
            raise ValueError(f"a limiter needs at least one slot, not {total}")
        self.total = total
        self.free = total
        self._waiters: deque[anyio.Event] = deque()

    async def acquire(self) -> None:
        """Take a slot, waiting for one if none is free."""
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return
        event = anyio.Event()
        self._waiters.append(event)
        try:
            await event.wait()
        except BaseException:
            if event.is_set():
                self.release()  # the slot was handed over as this task was cancelled: pass it on
            else:
                self._waiters.remove(event)
            raise

    def release(self) -> None:
        """Give a slot back: to the first waiter, if any."""
        if self._waiters:
            self._waiters.popleft().set()
        else:
            self.free += 1


class Watch:
    """A streamed DAG as its caller follows it: an event set when a step ``failed`` for good,
    and ``skip``, the ids of steps the caller no longer wants started, nor the steps built on
    them (a step already running goes on; one skipped ends as not started)."""

    __slots__ = ("failed", "skip")

    def __init__(self) -> None:
        self.failed = anyio.Event()
        self.skip: set[str] = set()


@dataclass(slots=True)
class DagOutcome:
    """What became of each step of a plan."""

    results: dict[str, StepResult] = field(default_factory=dict)
    failed: dict[str, StepFailed] = field(default_factory=dict)
    cancelled: dict[str, str] = field(default_factory=dict)
    not_started: list[str] = field(default_factory=list)
    blocked: set[str] = field(default_factory=set)
    """Of ``failed``, the steps whose tool was blocked and that were still parked when the
    plan stopped: they may pass if run again."""

    @property
    def complete(self) -> bool:
        """True when every step has a result."""
        return not (self.failed or self.cancelled or self.not_started)


async def run_dag(
    plan: Plan,
    run_step: RunStep,
    *,
    done: Mapping[str, StepResult] | None = None,
    failed: Mapping[str, StepFailed] | None = None,
    max_running: int | None = None,
    stop_on_failure: bool = False,
) -> DagOutcome:
    """Run every step of ``plan`` not already in ``done`` or ``failed``, each after its
    dependencies, at most ``max_running`` at once (no limit when ``None``).

    ``run_step(step, inputs)`` gets the results of the step's dependencies and raises
    :class:`StepFailed` when the step fails for good. Steps in ``failed`` (failed in an
    earlier run of the same plan) do not run again, and neither do their dependents.
    ``plan`` must be valid (acyclic, no dangling dependencies): the gate sees to that.
    """
    if max_running is not None and max_running < 1:
        raise ValueError(f"max_running must be at least 1, not {max_running}")
    outcome = DagOutcome(results=dict(done or {}), failed=dict(failed or {}))
    results = outcome.results
    graph = _Graph(plan, outcome)
    async with anyio.create_task_group() as tg:
        start_ready = _dispatcher(
            tg,
            run_step,
            outcome,
            graph,
            lambda step_id: graph.cancel_dependents(step_id, f"dependency {step_id!r} failed"),
            max_running=max_running,
            stop_on_failure=stop_on_failure,
        )
        start_ready()
    graph.unpark(outcome)
    outcome.not_started = [
        s.id
        for s in plan.steps
        if s.id not in results and s.id not in outcome.failed and s.id not in outcome.cancelled
    ]
    return outcome


@dataclass(slots=True)
class _Links:
    """Who waits on whom: each step by id, how many unfinished dependencies each waiting step
    has, the steps that depend on each, and the steps ready to start (past the limit, they wait
    here as entries rather than as tasks). ``parked``: blocked steps waiting for the rest of
    the plan, with their failure; ``closed``: no more steps will join."""

    steps: dict[str, Step] = field(default_factory=dict)
    waiting: dict[str, int] = field(default_factory=dict)
    dependents: dict[str, list[str]] = field(default_factory=dict)
    ready: deque[Step] = field(default_factory=deque)
    parked: dict[str, StepFailed] = field(default_factory=dict)
    closed: bool = True

    def unpark(self, outcome: DagOutcome) -> None:
        """The parked steps' failures stand: the plan stopped before they ran again."""
        outcome.failed.update(self.parked)
        outcome.blocked.update(self.parked)
        self.parked.clear()


class _Graph(_Links):
    """The links of one run of a whole plan: every step not done yet waits on its unfinished
    dependencies, and those with none are ready."""

    __slots__ = ("outcome",)

    def __init__(self, plan: Plan, outcome: DagOutcome) -> None:
        results = outcome.results
        self.outcome = outcome
        waiting: dict[str, int] = {}
        dependents: dict[str, list[str]] = {s.id: [] for s in plan.steps}
        for s in plan.steps:
            if s.id in results:
                continue
            waiting[s.id] = sum(1 for d in s.depends_on if d not in results)
            for d in s.depends_on:
                dependents[d].append(s.id)
        # Ready steps past the limit wait here, as entries rather than as tasks: a plan of
        # 100,000 steps under a limit of 8 holds 8 tasks, not 100,000 waiting ones.
        ready: deque[Step] = deque(
            s
            for s in plan.steps
            if s.id not in results and waiting[s.id] == 0 and s.id not in outcome.failed
        )
        super().__init__({s.id: s for s in plan.steps}, waiting, dependents, ready)
        for step_id in outcome.failed:
            self.cancel_dependents(step_id, f"dependency {step_id!r} failed")

    def cancel_dependents(self, step_id: str, reason: str) -> None:
        """Every step that depends on ``step_id``, directly or not, will not run."""
        outcome = self.outcome
        stack = list(self.dependents[step_id])
        while stack:
            sid = stack.pop()
            if sid not in outcome.cancelled and sid not in outcome.results:
                outcome.cancelled[sid] = reason
                stack.extend(self.dependents[sid])


def _dispatcher(
    tg: TaskGroup,
    run_step: RunStep,
    outcome: DagOutcome,
    links: _Links,
    cancel_dependents: Callable[[str], None],
    *,
    max_running: int | None,
    stop_on_failure: bool,
    watch: Watch | None = None,
) -> Callable[[], None]:
    """What starts ``links``' ready steps in ``tg``, at most ``max_running`` at once: call it
    whenever steps may have become ready. Each step's result goes to ``outcome``, and its
    dependents become ready when it was the last they waited on. A step that fails for good
    goes to ``outcome.failed`` and stops every new start (``stop_on_failure``) or has its
    dependents cancelled (``cancel_dependents(step_id)``). ``watch``: see :class:`Watch`."""
    results, failed, cancelled = outcome.results, outcome.failed, outcome.cancelled
    steps, waiting, dependents, ready = links.steps, links.waiting, links.dependents, links.ready
    parked = links.parked
    running = 0
    stopping = False
    succeeded = 0  # steps that succeeded: a parked step runs again only after progress
    released_at = -1  # ``succeeded`` when the parked steps were last sent to run again

    # A step's start and end, the hot path, are closures: as methods of a class they cost a
    # leaf 1.1 % more instructions (benchmarks/instructions.py).
    def start_ready() -> None:
        nonlocal running
        if parked and not running and not ready and not stopping and links.closed:
            release_parked()
        while ready and not stopping and (max_running is None or running < max_running):
            running += 1
            step = ready.popleft()
            # The step's id names the task: anyio would otherwise build the same long
            # qualified name anew for every one of (possibly 100,000) tasks.
            tg.start_soon(run_one, step, name=step.id)

    def release_parked() -> None:
        # Nothing else can run: the parked steps run again if some step succeeded since they
        # last ran (it may have done what they need); if none did, they would only fail again.
        nonlocal released_at
        if succeeded > released_at:
            released_at = succeeded
            ready.extend(steps[step_id] for step_id in parked)
            parked.clear()
            return
        blocked = list(parked.items())
        parked.clear()
        for step_id, exc in blocked:
            fail(step_id, exc)

    def fail(step_id: str, exc: StepFailed) -> None:
        nonlocal stopping
        failed[step_id] = exc
        if watch is not None:
            watch.failed.set()
        if stop_on_failure:
            stopping = True
        else:
            cancel_dependents(step_id)

    async def run_one(step: Step) -> None:
        nonlocal running, succeeded
        try:
            if stopping:  # a step failed before this task's first turn
                return
            if watch is not None and (
                step.id in watch.skip or any(d in watch.skip for d in step.depends_on)
            ):
                watch.skip.add(step.id)  # redone, or built on a redone step: stale here
                return
            result = await run_step(step, {d: results[d] for d in step.depends_on})
        except StepFailed as exc:
            if exc.blocked:
                parked[step.id] = exc  # runs again when nothing else can (release_parked)
            else:
                fail(step.id, exc)
        else:
            results[step.id] = result
            succeeded += 1
            if not stopping:  # once stopping, nothing starts: no step need become ready
                for sid in dependents[step.id]:
                    waiting[sid] -= 1
                    if waiting[sid] == 0 and sid not in cancelled and sid not in failed:
                        ready.append(steps[sid])
        finally:
            running -= 1
        start_ready()  # nothing starts once stopping

    return start_ready


async def run_streamed_dag(
    source: AsyncIterable[Step],
    run_step: RunStep,
    *,
    max_running: int | None = None,
    dispatched: Callable[[Step], None] | None = None,
    done: Mapping[str, StepResult] | None = None,
    outcome: DagOutcome | None = None,
    watch: Watch | None = None,
) -> DagOutcome:
    """Run the steps of a plan as ``source`` gives them (a plan being written), each after its
    dependencies, at most ``max_running`` at once; ``dispatched`` is told of each step as it
    joins. When ``source`` ends, the steps already given run to their end. ``done``: results
    of steps that ran before (a revised plan's), which steps may depend on; a step given with
    the id of one of them runs again. ``outcome``: the outcome to fill in and return, which
    the caller may read while the steps run; steps in its ``failed`` do not run, and their
    dependents are cancelled. ``watch``: see :class:`Watch`.

    Each step may depend only on steps given before it (the per-step checks of a streamed plan
    see to that), so the graph grows without ever waiting on a step not yet written. A step
    that fails has its dependents cancelled, and the independent steps go on (as in
    :func:`run_dag` without ``stop_on_failure``): a replan waits for the plan's last line
    anyway, and what they do is work it need not write again.
    """
    if max_running is not None and max_running < 1:
        raise ValueError(f"max_running must be at least 1, not {max_running}")
    outcome = DagOutcome() if outcome is None else outcome
    outcome.results.update(done or {})
    results, failed, cancelled = outcome.results, outcome.failed, outcome.cancelled
    order: list[str] = []
    links = _Links(dependents={step_id: [] for step_id in results})
    waiting, dependents, ready = links.waiting, links.dependents, links.ready

    def cancel_dependents(step_id: str) -> None:
        stack = [(d, step_id) for d in dependents[step_id]]
        while stack:
            sid, cause = stack.pop()
            if sid not in cancelled and sid not in results:
                cancelled[sid] = f"dependency {cause!r} failed"
                stack.extend((d, sid) for d in dependents[sid])

    def add(step: Step) -> None:
        results.pop(step.id, None)  # given again: it runs again
        failed.pop(step.id, None)
        links.parked.pop(step.id, None)
        order.append(step.id)
        dependents[step.id] = []
        lost = [d for d in step.depends_on if d in failed or d in cancelled]
        if lost:
            cancelled[step.id] = f"dependency {lost[0]!r} failed"
            return
        blocked = [d for d in step.depends_on if d not in results]
        for d in blocked:
            dependents[d].append(step.id)
        waiting[step.id] = len(blocked)
        if not blocked:
            ready.append(step)

    links.closed = False
    async with anyio.create_task_group() as tg:
        start_ready = _dispatcher(
            tg,
            run_step,
            outcome,
            links,
            cancel_dependents,
            max_running=max_running,
            stop_on_failure=False,
            watch=watch,
        )
        async for step in source:
            links.steps[step.id] = step
            add(step)
            if dispatched is not None:
                dispatched(step)
            start_ready()
        links.closed = True
        start_ready()  # the plan is whole: a blocked step may run again
    links.unpark(outcome)
    outcome.not_started = [
        s for s in order if s not in results and s not in failed and s not in cancelled
    ]
    return outcome
