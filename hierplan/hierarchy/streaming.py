"""Plans that start running while they are written (streamed dispatch).

When nothing asked to see a plan whole before it runs, a node's first plan streams: each step
is read as soon as its line is complete, passes the per-step checks of the gate (its tool
allowed for this node, its arguments valid against the tool's schema, dependencies on earlier
steps only, the step limit, every other check :func:`~hierplan.plans.plan.validate_plan` makes
of the steps written so far) and is scheduled at once; it starts when its dependencies are done.

A replan streams too: the planner writes only the steps still to do, which may build on the
done ones (see :mod:`hierplan.plans.revision`), and each runs as soon as it is accepted. A first
plan's replan is asked for as soon as the plan is written and one of its steps has failed
(:class:`Failing`), with its steps still to end shown as running; the replan's steps start once
they have ended (:class:`Revision`).

A plan is gated whole, as before, when an approver other than the automatic one is set (a
review policy, a reviewer, a callback), when the gate has validators beyond the default ones,
when a budget limits the node (its least cost is a whole-plan check), in a resumed run, for
strategies that run one step at a time, with ``stream_plans`` off, for a repair after a
refused step, and for a replan after a step ran out of budget.

A step that fails its checks ends the stream: the planning call is cancelled and counts for
what it wrote. The node asks at once for a repaired plan, gated whole, while the steps already
dispatched run to their end: the repair's prompt shows them as running, its lines may build
on them as on done steps, and their results stand where it keeps them (see
:func:`~hierplan.hierarchy.nodes.execute_plan`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from hierplan.agents.planner import Revising
from hierplan.core.results import StepResult
from hierplan.errors import (
    ModelAuthError,
    ModelError,
    PlanParseError,
    SimulatorCoverageError,
    StepFailed,
    UnexpectedModelCall,
)
from hierplan.hierarchy.context import NodeContext
from hierplan.hierarchy.gate import (
    DEFAULT_VALIDATORS,
    AutoApprove,
    GateContext,
    GateOutcome,
    step_args_problems,
    structure_validator,
)
from hierplan.hierarchy.planning import PlanPolicy, add_version, announce_replan, decide
from hierplan.hierarchy.scheduler import DagOutcome, RunStep, Watch, run_streamed_dag
from hierplan.plans.plan import Plan, Step, diff_plans
from hierplan.plans.problems import PlanProblem
from hierplan.plans.revision import DoneSteps
from hierplan.records import PlanVersion

STREAMED_BY = "stream"
"""Who decided a streamed plan, in its version's ``decided_by``: its steps were checked one by
one as they were written, and no one saw it whole before it ran."""
STREAMED_NOTE = "checked step by step as it was written"


class StepRefused(Exception):
    """A streamed step that failed its checks (the message says why); ``step`` is the step,
    ``None`` when the plan as a whole was refused (it had no steps)."""

    def __init__(self, message: str, step: Step | None = None) -> None:
        super().__init__(message)
        self.step = step


@dataclass(slots=True)
class Failing:
    """A streamed plan written to its end whose steps still run, one of which has failed: what
    a replan asked for at once starts from. ``outcome`` is the live one of the plan's steps;
    ``watch`` (see :class:`~hierplan.hierarchy.scheduler.Watch`) lets the replan keep a step
    it redoes from starting; ``ended`` is set once all have ended."""

    plan: Plan
    outcome: DagOutcome
    watch: Watch
    ended: anyio.Event

    def running(self) -> list[str]:
        """The steps that may still succeed (running, or waiting for dependencies that may),
        in plan order: not those built on a step that failed, whether or not the scheduler
        has cancelled them yet."""
        o = self.outcome
        lost = o.failed.keys() | o.cancelled.keys()
        out = []
        for step in self.plan.steps:
            if step.id in o.results or step.id in lost:
                continue
            if any(d in lost for d in step.depends_on):
                lost.add(step.id)
            else:
                out.append(step.id)
        return out


@dataclass(slots=True)
class Streamed:
    """What a streamed plan came to: the plan (the whole plan as written, or the steps
    accepted before the stream stopped, with a revision's done steps), what its steps did,
    and ``problem``, why the stream stopped early (``None`` when the plan was written to its
    end)."""

    plan: Plan
    outcome: DagOutcome
    problem: str | None
    failed: StepFailed | None = None
    """The planning call's own failure (after its retries), when that stopped the stream."""
    accepted: int = 0
    """How many written steps were accepted to run (a done step written again unchanged
    is not)."""


async def can_stream(node: NodeContext, policy: PlanPolicy) -> bool:
    """Whether ``node``'s plans may stream (see the module docstring)."""
    run = node.run
    if not run.settings.stream_plans or run.restore is not None:
        return False
    if policy.sequential or policy.replan_each_step or policy.as_needed:
        return False
    gate = run.gate
    if not isinstance(gate.approver, AutoApprove):
        return False
    if any(v not in DEFAULT_VALIDATORS for v in gate.validators):
        return False
    return await node.spending() is None


@dataclass(frozen=True, slots=True)
class Revision:
    """A replan to stream: the running ``plan``, the results that stand (``done``) and what
    failed. The planner writes the steps still to do; the done steps stay.

    A replan asked for while some of the plan's steps still run (``running``: the outcome
    they go to, ``watch`` the scheduler's) shows each of them in ``done`` as running; a step
    the revision redoes does not start there, the revision's steps start once the others
    have all ended (``ended``), and a kept one that did not succeed fails in it too."""

    plan: Plan
    done: Mapping[str, StepResult]
    failure: str | None
    running: DagOutcome | None = None
    watch: Watch | None = None
    ended: anyio.Event | None = None

    @property
    def kept(self) -> DoneSteps:
        """The done steps, as the revision's lines refer to them."""
        return DoneSteps.of(self.plan, self.done)

    def results(self) -> dict[str, StepResult]:
        """The results of the steps in ``done``, once those running have ended: the ones
        that failed meanwhile have none."""
        if self.running is None:
            return dict(self.done)
        made = self.running.results
        return {k: made[k] for k in self.done if k in made}


def _checks(node: NodeContext, policy: PlanPolicy, reason: str) -> GateContext:
    settings = node.run.settings
    return GateContext(
        path=node.path,
        goal=node.record.goal,
        depth=node.depth,
        max_depth=node.depth if policy.flat else settings.max_depth,
        max_steps=settings.max_steps,
        allowed_tools=node.allowed_tools,
        toolbox=node.run.toolbox,
        version=len(node.record.plan_versions) + 1,
        reason=reason,
        step=node.step,
        simulated=node.run.planner_model.simulated,
    )


class _Intake:
    """The steps of a plan being streamed, as they are accepted: each checked against the
    steps before it, recorded in the plan's version and sent to the scheduler (unless it is a
    done step written again unchanged)."""

    def __init__(
        self,
        node: NodeContext,
        ctx: GateContext,
        revision: Revision | None,
        prepare: Callable[[Step], NodeContext],
        send: MemoryObjectSendStream[Step],
    ) -> None:
        self.node = node
        self.ctx = ctx
        self.revision = revision
        self.prepare = prepare
        self.send = send
        self.kept = DoneSteps() if revision is None else revision.kept
        self.accepted: list[Step] = []
        self.sent = 0
        self.version: PlanVersion | None = None

    def accept(self, step: Step) -> None:
        """Check ``step`` against the steps before it and run it; raises
        :class:`StepRefused` if it fails its checks."""
        node, ctx = self.node, self.ctx
        prefix = Plan(goal=node.goal, steps=self.kept.merged([*self.accepted, step]))
        ids = {s.id for s in prefix.steps}
        problems = structure_validator(prefix, ctx) + step_args_problems(step, ids, ctx)
        why = self.kept.redone_after_use([*self.accepted, step]) if self.kept.steps else None
        if why is not None:
            problems.append(PlanProblem("redone_after_use", why, step.id))
        if problems:
            raise StepRefused("; ".join(str(p) for p in problems), step)
        self.accepted.append(step)
        if self.version is None:
            # Proposed and approved with its first step, before that step can start: a
            # plan's steps run after its approval, for whoever follows the run's events.
            self.version = add_version(node, prefix, ctx.reason, self.previous)
            decide(node, self.version, GateOutcome("approved", prefix, STREAMED_BY, STREAMED_NOTE))
        else:
            self.version.plan = prefix
        if self.kept.steps and step.id in self.kept.copies(self.accepted):
            return  # a done step written again unchanged: its result stands
        if self.revision is not None and self.revision.watch is not None:
            self.revision.watch.skip.add(step.id)  # redone here: not where it was running
        self.prepare(step).record.parsed_at = time.time()
        self.sent += 1
        self.send.send_nowait(step)

    @property
    def previous(self) -> Plan | None:
        """The plan a revision replaces."""
        return None if self.revision is None else self.revision.plan

    def close(self, whole: Plan | None, problem: str | None, refused: list[Step]) -> Plan:
        """The plan the stream came to (``whole``, as the planner read it, or the steps
        accepted), with its version set to the plan as written: up to and with the refused
        step, if one was, and decided invalid if the stream stopped early."""
        node = self.node
        plan = whole or Plan(goal=node.goal, steps=self.kept.merged(self.accepted))
        revision = self.revision
        if problem is None and revision is not None and revision.watch is not None:
            # written whole: a step of the plan revised that it dropped is not to start there
            ids = {s.id for s in plan.steps}
            revision.watch.skip.update(s.id for s in revision.plan.steps if s.id not in ids)
        written = Plan(goal=node.goal, steps=[*plan.steps, *refused]) if refused else plan
        version = self.version
        if version is None and refused:  # the first step written was refused
            version = add_version(node, written, self.ctx.reason, self.previous)
        if version is not None:
            version.plan = written
            if self.previous is not None:
                version.diff = diff_plans(self.previous, written)
            if problem is not None:
                outcome = GateOutcome("invalid", written, STREAMED_BY, problems=[problem])
                decide(node, version, outcome)
            elif self.previous is not None:
                announce_replan(node, version, self.previous)
        return plan


async def stream_plan(
    node: NodeContext,
    policy: PlanPolicy,
    inputs: Mapping[str, StepResult],
    run_step: RunStep,
    prepare: Callable[[Step], NodeContext],
    *,
    max_running: int | None,
    revision: Revision | None = None,
    stopped: Callable[[Streamed], Awaitable[None]] | None = None,
    failing: Callable[[Failing], Awaitable[None]] | None = None,
) -> Streamed:
    """Plan ``node``'s goal as a stream and run each step as it is accepted (``revision``: a
    replan, whose steps may build on the done ones). ``prepare`` makes a step's child node (its
    record) when the step is accepted. The plan is recorded as a version with its first step,
    approved by ``stream``; once the stream ends the version holds the plan as written, and is
    decided invalid (with the problem) if a step was refused.

    ``stopped`` is awaited as soon as a stream stops early, while the steps already dispatched
    still run, with what the stream came to so far (its outcome a copy of the results and
    failures at that moment): the node asks for its repair then, rather than after them.
    ``failing`` is awaited once the plan is written to its end and one of its steps has
    failed while others still run (see :class:`Failing`): the node may replan then."""
    ctx = _checks(node, policy, "initial" if revision is None else "replan")
    send, receive = anyio.create_memory_object_stream[Step](max_buffer_size=float("inf"))
    intake = _Intake(node, ctx, revision, prepare, send)
    outcome = DagOutcome()
    watch = Watch()
    ended = anyio.Event()
    result: Streamed | None = None

    async def write() -> None:
        nonlocal result
        with send:
            whole, problem, failed, refused = await _read(node, policy, inputs, intake)
        # The channel is closed: the steps sent run to their end while the plan is recorded
        # as written (and any repair or replan is asked for).
        plan = intake.close(whole, problem, refused)
        result = Streamed(plan, outcome, problem, failed, intake.sent)
        if problem is not None and stopped is not None:
            so_far = DagOutcome(
                dict(outcome.results), dict(outcome.failed), dict(outcome.cancelled)
            )
            await stopped(Streamed(plan, so_far, problem, failed, intake.sent))
        elif problem is None and failing is not None:
            await watch.failed.wait()  # also set once the steps have ended
            if not ended.is_set():
                await failing(Failing(plan, outcome, watch, ended))

    def dispatched(step: Step) -> None:
        prepare(step).record.dispatched_at = time.time()

    with node.run.pause.working(), receive:
        async with anyio.create_task_group() as tg:
            tg.start_soon(write)
            if revision is not None and revision.ended is not None:
                await revision.ended.wait()  # the steps of the plan it revises have ended
            standing, lost = ({}, {}) if revision is None else _standing(revision)
            outcome.failed.update(lost)
            await run_streamed_dag(
                receive,
                run_step,
                max_running=max_running,
                dispatched=dispatched,
                done=standing,
                outcome=outcome,
                watch=watch,
            )
            ended.set()
            watch.failed.set()  # no step fails any more: a writer waiting for one goes on
    assert result is not None  # write() sets it before its task ends
    return result


async def _read(
    node: NodeContext, policy: PlanPolicy, inputs: Mapping[str, StepResult], intake: _Intake
) -> tuple[Plan | None, str | None, StepFailed | None, list[Step]]:
    """Read the planner's streamed plan into ``intake``: the plan as the planner read it
    whole (``None`` if the stream stopped early), why it stopped early, the planning call's
    failure that stopped it, and the step refused."""
    try:
        whole = await _written(node, policy, inputs, intake.accept, intake.revision)
    except StepRefused as exc:
        return None, str(exc), None, [] if exc.step is None else [exc.step]
    except PlanParseError as exc:
        # no step taken: the node fails, as for a plan gated whole that does not read
        return None, str(exc), None if intake.accepted else StepFailed(str(exc)), []
    except StepFailed as exc:
        return None, str(exc), exc, []
    return whole, None, None, []


def _standing(revision: Revision) -> tuple[dict[str, StepResult], dict[str, StepFailed]]:
    """The results a streamed revision's steps may build on (those of the done steps), and
    the failures of kept steps that were running when it was asked for and did not succeed
    (its steps that build on them are cancelled)."""
    results = revision.results()
    standing = {s.id: results[s.id] for s in revision.kept.steps if s.id in results}
    lost: dict[str, StepFailed] = {}
    if revision.running is not None:
        failed, cancelled = revision.running.failed, revision.running.cancelled
        for step in revision.kept.steps:
            if step.id in failed:
                lost[step.id] = failed[step.id]
            elif step.id not in results:
                lost[step.id] = StepFailed(cancelled.get(step.id, "it did not run"))
    return standing, lost


async def _written(
    node: NodeContext,
    policy: PlanPolicy,
    inputs: Mapping[str, StepResult],
    accept: Callable[[Step], None],
    revision: Revision | None,
) -> Plan:
    """The planner's streamed plan inside every instrument's planning scope; a failed
    planning call as :class:`StepFailed`, as :func:`~hierplan.hierarchy.planning.obtain_plan`
    reports it."""
    run = node.run
    texts = {k: v.text for k, v in inputs.items()}
    revising = None
    if revision is not None:
        progress = {k: v.text for k, v in revision.done.items()}
        revising = Revising(revision.plan, progress, revision.failure)
    async with AsyncExitStack() as stack:
        for instrument in run.instruments:
            scope = instrument.planning_scope(node, "initial" if revision is None else "replan")
            if scope is not None:
                await stack.enter_async_context(scope)
        try:
            plan = await run.planner.stream_plan(
                node, accept, inputs=texts, flat=policy.flat, revising=revising
            )
        except SimulatorCoverageError as exc:
            raise StepFailed(str(exc)) from None
        except (ModelAuthError, UnexpectedModelCall):
            raise
        except ModelError as exc:
            raise StepFailed(f"planning failed: {exc}") from None
    if not plan.steps:
        raise StepRefused("the plan has no steps")  # as the gate's structure check says
    return plan
