"""How a node runs: the pieces every strategy is built from.

- :func:`run_task_node`: an executor node; one step with retries, a deadline and the run-wide
  leaf limit.
- :func:`~hierplan.hierarchy.planning.obtain_plan` (in :mod:`hierplan.hierarchy.planning`):
  plan (or replan), then the gate; invalid or rejected plans go back to the planner.
- :func:`execute_plan`: run an approved plan's DAG; on a step's permanent failure, replan the rest
  (keeping finished steps) or finish partial (also when a step ran out of budget and the replan
  left the same work to do).
- :func:`run_planner_node` and :func:`run_as_needed_node`: planner nodes for the hierarchical and
  ADaPT-style strategies.

A :class:`PlanPolicy` says how a strategy uses them. Each node's life is wrapped by
:func:`node_lifecycle`, which opens every instrument's node scope and keeps the record right on
success, failure and cancellation. Pausing for a review and resuming from a checkpoint hook in
through ``run.pause`` (:mod:`hierplan.hierarchy.pause`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import NoReturn, TypeVar

from hierplan.agents.prompts import ATTEMPT_FAILED, RUNNING_RESULT
from hierplan.core.results import StepResult
from hierplan.durable.restore import Restore, invalid_feedback
from hierplan.errors import (
    BudgetExceeded,
    StepFailed,
)
from hierplan.hierarchy.context import NodeContext
from hierplan.hierarchy.leaf import (
    _finish,
    node_lifecycle,
    run_task_node,
)
from hierplan.hierarchy.planning import PlanPolicy, ask_joiner, obtain_plan
from hierplan.hierarchy.scheduler import DagOutcome, RunStep, run_dag
from hierplan.hierarchy.streaming import Failing, Revision, Streamed, can_stream, stream_plan
from hierplan.plans.plan import Plan, Step, topological_order
from hierplan.plans.revision import carried_over
from hierplan.records import NodeKind

_T = TypeVar("_T")


def _answer(plan: Plan, results: Mapping[str, StepResult]) -> str:
    sinks = [s for s in plan.sinks() if s in results]
    if not sinks:  # a partial result: what the finished steps reached, where they stopped
        built_on = {d for s in plan.steps if s.id in results for d in s.depends_on}
        sinks = [s.id for s in plan.steps if s.id in results and s.id not in built_on]
    if len(sinks) == 1:
        return results[sinks[0]].text
    return "\n".join(f"{s}: {results[s].text}" for s in sinks)


class _Children:
    """The child nodes of one planner node, one per step of the current plan version."""

    def __init__(self, node: NodeContext) -> None:
        self.node = node
        self.by_step: dict[str, NodeContext] = {}

    def sync(
        self, plan: Plan, done: Mapping[str, StepResult], version: int, policy: PlanPolicy
    ) -> None:
        """Create child records for new or changed steps; retire those the plan dropped."""
        keep: set[str] = set()
        for step in plan.steps:
            child = self.by_step.get(step.id)
            if (
                child is not None
                and child.step is not None
                and child.step.same_work(step)
                and (step.id in done or child.record.status == "pending")
            ):
                child.step = step  # a new title, say: the record shows the latest wording
                child.record.goal = step.instruction
                keep.add(step.id)
                continue
            if child is not None and child.record.status == "pending":
                _finish(child, "cancelled", error=f"replaced by plan version {version}")
            number = len(self.node.record.children) + 1
            kind: NodeKind = "planner" if _is_planner_step(step, self.node, policy) else "executor"
            self.by_step[step.id] = self.node.child(number, kind, step.instruction, step)
            keep.add(step.id)
        for step_id, child in list(self.by_step.items()):
            if step_id not in keep:
                if child.record.status == "pending":
                    _finish(child, "cancelled", error=f"dropped by plan version {version}")
                del self.by_step[step_id]

    def add(self, step: Step, policy: PlanPolicy, *, fresh: bool = False) -> NodeContext:
        """The child node of ``step`` of a plan being streamed, made on first sight (or now,
        if ``fresh``)."""
        child = None if fresh else self.by_step.get(step.id)
        if child is None:
            number = len(self.node.record.children) + 1
            kind: NodeKind = "planner" if _is_planner_step(step, self.node, policy) else "executor"
            child = self.by_step[step.id] = self.node.child(number, kind, step.instruction, step)
        return child

    def revised(self, step: Step, version: int, policy: PlanPolicy) -> NodeContext:
        """The child node of ``step`` of a revision being streamed: a pending child doing the
        same work goes on; any other is replaced (a pending one is cancelled)."""
        child = self.by_step.get(step.id)
        if child is not None and child.record.status == "pending":
            if child.step is not None and child.step.same_work(step):
                return child
            _finish(child, "cancelled", error=f"replaced by plan version {version}")
        return self.add(step, policy, fresh=True)

    def settle(self, plan: Plan, version: int) -> None:
        """After a streamed revision: the children of steps that stand show their latest
        wording; those of steps ``plan`` does not have are forgotten (cancelled if pending)."""
        steps = {s.id: s for s in plan.steps}
        for step_id, child in list(self.by_step.items()):
            step = steps.get(step_id)
            if step is not None and child.step is not None and child.step.same_work(step):
                child.step = step
                child.record.goal = step.instruction
            elif step_id not in steps:
                if child.record.status == "pending":
                    _finish(child, "cancelled", error=f"dropped by plan version {version}")
                del self.by_step[step_id]

    def restore(self, restore: Restore, plan: Plan) -> dict[str, StepResult]:
        """Go on with the children a paused run left for ``plan`` (see
        :meth:`~hierplan.durable.restore.Restore.children`); the results of those that
        finished."""
        found = restore.children(self.node.record, plan)
        if found is None:
            return {}
        node = self.node
        again, done = found
        for step_id, record in again.items():
            step = plan.step(step_id)
            allowed = node.allowed_tools
            if step.tools is not None:
                allowed = allowed & frozenset(step.tools)
            self.by_step[step_id] = NodeContext(
                node.run, record, parent=node, step=step, allowed_tools=allowed
            )
        return done

    def retire(self, ids: Mapping[str, str] | list[str], reason: str | None = None) -> None:
        """Mark children that will not run as cancelled, with why."""
        items = ids.items() if isinstance(ids, Mapping) else ((i, reason or "not run") for i in ids)
        for step_id, why in items:
            child = self.by_step.get(step_id)
            if child is not None and child.record.status == "pending":
                _finish(child, "cancelled", error=why)


def _is_planner_step(step: Step, node: NodeContext, policy: PlanPolicy) -> bool:
    if step.kind == "subgoal":
        return True
    direct = step.tool is not None and step.args is not None
    # A step's node is one level below its plan's; it may plan in turn down to max_depth, the
    # deepest plan level, as a hierarchical sub-goal may.
    return policy.as_needed and not direct and node.depth < node.run.settings.max_depth


async def run_child(
    child: NodeContext, step: Step, inputs: Mapping[str, StepResult], policy: PlanPolicy
) -> StepResult:
    """Run one step's child node the way the policy says."""
    if child.record.kind == "executor":
        return await run_task_node(child, step, inputs)
    if policy.as_needed:
        result = await run_as_needed_node(child, step, inputs, policy)
    else:
        result = await run_planner_node(child, policy, inputs)
    child.run.pause.finished(child.path, result)
    return result


@dataclass(frozen=True, slots=True)
class _Execution:
    """What running one node's plans needs, whichever plan or version runs: the node, how its
    strategy plans, its inputs, its children, how a step runs and how many run at once."""

    node: NodeContext
    policy: PlanPolicy
    inputs: Mapping[str, StepResult]
    children: _Children
    run_step: RunStep
    max_running: int


async def execute_plan(
    node: NodeContext, plan: Plan | None, policy: PlanPolicy, inputs: Mapping[str, StepResult]
) -> StepResult:
    """Run ``plan`` to the end, replanning on failure as the policy allows. A step that ran
    out of budget, answered by a revised plan with the same work left, ends the node: running
    it again would only spend the rest of the budget on the same failure.

    ``plan`` ``None``: the node's first plan streams (:mod:`hierplan.hierarchy.streaming`),
    its steps running as they are written, and so do its replans after a failed step."""
    settings = node.run.settings
    children = _Children(node)
    done: dict[str, StepResult] = {}
    if node.run.restore is not None and plan is not None:
        done = children.restore(node.run.restore, plan)
    max_running = 1 if policy.sequential else settings.plan_concurrency

    def run_step(step: Step, step_inputs: dict[str, StepResult]) -> Awaitable[StepResult]:
        # Returns the child's coroutine rather than awaiting it: no frame of its own stays on
        # each leaf's stack for the leaf's lifetime (memory and time at 100,000 leaves).
        child = children.by_step[step.id]
        if child.record.status != "pending":  # a blocked step run again: a node of its own
            ran = child
            child = children.add(step, policy, fresh=True)
            child.decided_call = ran.decided_call  # a call decided again is the step's for good
        if child.record.kind == "executor":
            return run_task_node(child, step, step_inputs)
        return run_child(child, step, step_inputs, policy)

    ex = _Execution(node, policy, inputs, children, run_step, max_running)
    streamed: DagOutcome | None = None
    # Only a node whose plan streamed has a joiner: no one saw that plan whole before it ran.
    # A plan gated whole was seen, and its results answer as they always have.
    joins = plan is None and settings.join and not policy.replan_each_step
    # Counted from the record, not from zero: replans made before a pause still count after
    # the run resumes (max_replans is per node, however many times the run was paused). Counted
    # before a first plan streams: a replan asked for while it runs is counted when used.
    replans = sum(1 for v in node.record.plan_versions if v.reason == "replan")
    early: _EarlyReplan | None = None
    if plan is None:
        early = _EarlyReplan(ex)
        first = await _stream(ex, failing=early.start)
        if early.gave_up is not None:
            raise early.gave_up
        assert not isinstance(first, StepFailed)  # a first plan's failure raises
        plan, streamed, done = first

    while True:
        if streamed is None:  # a streamed plan's children were made as its steps came
            children.sync(plan, done, len(node.record.plan_versions), policy)
        if policy.replan_each_step:
            return await _interleaved(node, plan, policy, inputs, children, done)
        can_replan = policy.replan_on_failure and replans < settings.max_replans
        if streamed is None:
            outcome = await run_dag(
                plan, run_step, done=done, max_running=max_running, stop_on_failure=can_replan
            )
        else:
            outcome, streamed = streamed, None
        done = outcome.results
        children.retire(outcome.cancelled)
        if outcome.complete:
            more = await _cover_left_out(node, policy, inputs, plan, done) if can_replan else None
            if more is None and joins:
                answer, more = await _join(node, policy, inputs, plan, done, can_replan)
                if more is None:
                    return _succeed(node, plan, done, answer)
            if more is None:
                return _succeed(node, plan, done)
            replans += 1
            done = _carry_over(plan, more, done)
            plan = more
            continue
        failure, budget = _failures(outcome)
        if not can_replan:
            children.retire(outcome.not_started, "not run: the node gave up")
            return _give_up(node, plan, done, failure, budget=budget)
        replans += 1
        revised = None if early is None else early.revised
        early = None
        plan, streamed, done = await _revise(ex, plan, outcome, revised)


async def _revise(
    ex: _Execution, plan: Plan, outcome: DagOutcome, revised: _Streamed | None = None
) -> tuple[Plan, DagOutcome | None, dict[str, StepResult]]:
    """A revised plan after ``outcome`` failed: streamed, its steps running as they are
    written, when the node's plans stream (and no step ran out of budget), else gated whole;
    ``revised``: the streamed one asked for as the failure came (see :class:`_EarlyReplan`).
    Returns as :func:`_stream` does. Without a revised plan (invalid proposals, rejections, a
    planning error, a budget too small for the replan) the approved plan goes on, as if
    replans were not allowed, so that finished work counts and independent branches still
    run, and the node gives up."""
    node, done = ex.node, outcome.results
    failure, budget = _failures(outcome)
    if revised is not None or (not budget and await can_stream(node, ex.policy)):
        streamed = revised or await _stream(ex, Revision(plan, done, failure))
        if isinstance(streamed, StepFailed):
            await _unrevised(ex, plan, outcome, f"replanning failed: {streamed}")
        return streamed
    try:
        new_plan = await obtain_plan(
            node, ex.policy, ex.inputs, previous=plan, progress=done, failure=failure
        )
    except BudgetExceeded as exc:
        # The steps that do not depend on the failure were approved and may cost nothing
        # (direct tool calls): a budget too small to replan does not throw them away.
        await _unrevised(ex, plan, outcome, f"cannot replan: {exc}", budget=True)
    except StepFailed as exc:
        await _unrevised(ex, plan, outcome, f"replanning failed: {exc}")
    if budget and _same_work_left(plan, new_plan, done):
        ex.children.retire(outcome.not_started, "not run: the revised plan changed nothing")
        _give_up(node, plan, done, _unchanged_after_budget(failure), budget=True)
    return new_plan, None, _carry_over(plan, new_plan, done)


async def _unrevised(
    ex: _Execution, plan: Plan, outcome: DagOutcome, why: str, *, budget: bool = False
) -> NoReturn:
    """No revised plan (``why`` says why not): ``plan`` goes on without the failed steps and
    what depends on them, as if replans were not allowed, then the node gives up (out of
    budget when ``budget`` or a step ran out)."""
    # A blocked step the stopped plan did not run again is not failed for good: it goes on too.
    failed = {k: v for k, v in outcome.failed.items() if k not in outcome.blocked}
    outcome = await run_dag(
        plan, ex.run_step, done=outcome.results, failed=failed, max_running=ex.max_running
    )
    ex.children.retire(outcome.cancelled)
    ex.children.retire(outcome.not_started, "not run: the node gave up")
    failure, short = _failures(outcome)
    _give_up(ex.node, plan, outcome.results, f"{failure}; {why}", budget=budget or short)


_Streamed = tuple[Plan, DagOutcome | None, dict[str, StepResult]] | StepFailed
"""What :func:`_stream` comes to."""


async def _stream(
    ex: _Execution,
    revision: Revision | None = None,
    failing: Callable[[Failing], Awaitable[None]] | None = None,
) -> _Streamed:
    """Stream the node's first plan, or the ``revision`` of its plan, its steps running as
    they come (see :mod:`hierplan.hierarchy.streaming`): the plan to go on with, what its
    streamed steps did (``None`` when the plan is a repair still to run) and the results that
    stand. ``failing``: see :func:`~hierplan.hierarchy.streaming.stream_plan`.

    A stream stopped by a refused step is answered by a repaired plan, gated whole, that keeps
    what ran (see :class:`_Repair`). A planning call that failed before any step was accepted
    fails the node, as a failed call of a plan gated whole does; for a revision, its failure
    is returned."""
    node, children = ex.node, ex.children
    repair = _Repair(ex, revision)
    streamed = await stream_plan(
        node,
        ex.policy,
        ex.inputs,
        ex.run_step,
        _preparer(ex, revision is not None),
        max_running=ex.max_running,
        revision=revision,
        stopped=repair.ask,
        failing=failing,
    )
    outcome, partial = streamed.outcome, streamed.plan
    # a done step the revision dropped (or built on a redone one): not this plan's result,
    # nor is the failure of a running one it dropped
    done = _written_results(partial, outcome.results)
    outcome.results = dict(done)
    outcome.failed = _written_results(partial, outcome.failed)
    if revision is not None and revision.running is not None:
        # the plan revised ran on meanwhile: its steps cancelled since say why, as when a
        # replan waits for them
        children.retire(revision.running.cancelled)
    if streamed.problem is None:
        if revision is not None:
            children.settle(partial, len(node.record.plan_versions))
        return partial, outcome, done
    if streamed.failed is not None and not streamed.accepted:
        if revision is not None:
            return streamed.failed
        _finish(node, streamed.failed.status, error=str(streamed.failed))
        raise streamed.failed
    answer = repair.answer
    if answer is None:
        # The refused step makes this plan an invalid proposal, as a plan gated whole with
        # that step would be: no second proposal when none is allowed.
        why = f"the planner proposed 1 invalid plan; last problems: {streamed.problem}"
        return _stream_ends(ex, revision, streamed, StepFailed(why))
    if not isinstance(answer, Plan):
        if revision is not None and not streamed.accepted and isinstance(answer, StepFailed):
            return answer  # as when a replan gated whole fails: the plan revised goes on
        failed = StepFailed(f"{streamed.problem}; no repaired plan: {answer}")
        return _stream_ends(ex, revision, streamed, failed, answer)
    previous = repair.previous
    if previous is not None and previous is not partial:  # a revision of which nothing ran
        assert revision is not None
        done = revision.results()
    return answer, None, _carry_over(previous or partial, answer, done)


def _written_results(plan: Plan, results: Mapping[str, _T]) -> dict[str, _T]:
    """The entries of ``results`` for ``plan``'s steps (a done step a revision dropped has
    none in it)."""
    steps = {s.id for s in plan.steps}
    return {k: v for k, v in results.items() if k in steps}


class _EarlyReplan:
    """A replan asked for as soon as a step of a streamed first plan fails, once the plan is
    written to its end, rather than after its other steps have ended: those still to end
    are shown to it as running (:data:`~hierplan.agents.prompts.RUNNING_RESULT`) and may be
    built on. The revision streams; a step it redoes does not start in the plan it revises,
    and its steps start once that plan's have ended. ``revised``: what it came to, for
    :func:`_revise`."""

    def __init__(self, ex: _Execution) -> None:
        self.ex = ex
        self.revised: _Streamed | None = None
        self.gave_up: StepFailed | None = None
        """The node's end, when it gave up during the replan (its record is finished)."""

    async def start(self, failing: Failing) -> None:
        """Replan from ``failing`` if the node may replan now, as :func:`_revise` would."""
        ex = self.ex
        if not ex.policy.replan_on_failure or ex.node.run.settings.max_replans < 1:
            return
        so_far = failing.outcome
        failure, budget = _failures(so_far)
        if budget or not await can_stream(ex.node, ex.policy):
            return
        done = _written_results(failing.plan, so_far.results)
        running = StepResult(None, RUNNING_RESULT)
        done.update((step_id, running) for step_id in failing.running())
        revision = Revision(failing.plan, done, failure, so_far, failing.watch, failing.ended)
        try:
            self.revised = await _stream(ex, revision)
        except StepFailed as exc:
            # Raised here it would leave the plan's task group as an exception group: the
            # node raises it once that has ended, as when it gives up anywhere else.
            self.gave_up = exc


class _Repair:
    """The repaired plan that answers a stream stopped by a refused step.

    It is asked for as soon as the stream stops, while the steps already dispatched run to
    their end, rather than after them: the prompt shows each of them as running
    (:data:`~hierplan.agents.prompts.RUNNING_RESULT`), and the repair may build on it as on a
    done step. Once they have all ended, their results stand where the repaired plan keeps
    their steps; one that failed meanwhile and is kept runs again with the repaired plan."""

    def __init__(self, ex: _Execution, revision: Revision | None) -> None:
        self.ex = ex
        self.revision = revision
        self.previous: Plan | None = None
        """The plan the repair was asked to fix."""
        self.answer: Plan | StepFailed | BudgetExceeded | None = None
        """The repaired plan, why there is none, or ``None`` when none was asked for."""

    async def ask(self, stopped: Streamed) -> None:
        """Ask for the repair of ``stopped`` (the stream as it stood when it stopped)."""
        ex, revision = self.ex, self.revision
        if stopped.failed is not None and not stopped.accepted:
            return  # no step was taken: the planning call's failure stands
        if ex.node.run.settings.max_invalid_plans < 1:
            return
        partial, so_far = stopped.plan, stopped.outcome
        done = _written_results(partial, so_far.results)
        failure = _failures(so_far)[0] if so_far.failed else None
        if failure is None and revision is not None:
            failure = revision.failure
        if stopped.accepted or revision is None:
            self.previous = partial if partial.steps else None
            if revision is not None:  # the done steps it kept, whose results its DAG may
                done = {**_written_results(partial, revision.results()), **done}  # not have
            ended = done.keys() | so_far.failed.keys() | so_far.cancelled.keys()
            running = StepResult(None, RUNNING_RESULT)
            done.update((s.id, running) for s in partial.steps if s.id not in ended)
        else:  # nothing of the revision was taken: the plan it revised is the one to repair
            self.previous, done = revision.plan, dict(revision.done)
        try:
            self.answer = await obtain_plan(
                ex.node,
                ex.policy,
                ex.inputs,
                previous=self.previous,
                progress=done,
                failure=failure,
                feedback=invalid_feedback([stopped.problem or ""]),
                reason="retry",
                invalid=1,
                # a plan cut short: its done steps whose consumers were not written yet are
                # no answers of it
                whole=self.previous is not partial,
            )
        except (StepFailed, BudgetExceeded) as exc:
            self.answer = exc
            return
        if revision is not None and revision.watch is not None:
            # an early replan's repair: the steps of the plan revised that it does not keep
            # as they stand are not to start there
            kept = set(carried_over(revision.plan, self.answer, revision.done))
            revision.watch.skip.update(s.id for s in revision.plan.steps if s.id not in kept)


def _stream_ends(
    ex: _Execution,
    revision: Revision | None,
    streamed: Streamed,
    failed: StepFailed,
    cause: Exception | None = None,
) -> StepFailed:
    """A stream that found no plan to go on with: a revision of which nothing was taken
    returns ``failed`` (its plan goes on without it); otherwise the node gives up with what
    its streamed steps did."""
    if revision is not None and not streamed.accepted:
        return failed
    outcome, partial = streamed.outcome, streamed.plan
    if revision is not None:
        ex.children.settle(partial, len(ex.node.record.plan_versions))
    ex.children.retire(outcome.cancelled)
    ex.children.retire(outcome.not_started, "not run: the node gave up")
    _give_up(
        ex.node, partial, outcome.results, str(failed), budget=isinstance(cause, BudgetExceeded)
    )


def _preparer(ex: _Execution, revising: bool) -> Callable[[Step], NodeContext]:
    """What makes a streamed step's child node: on first sight of the step, the child of a
    first plan; for a revision, a new child unless a pending one does the same work."""
    node, children, policy = ex.node, ex.children, ex.policy
    if not revising:
        return lambda step: children.add(step, policy)
    made: dict[str, NodeContext] = {}

    def prepare(step: Step) -> NodeContext:
        child = made.get(step.id)
        if child is None:
            version = len(node.record.plan_versions)
            child = made[step.id] = children.revised(step, version, policy)
        return child

    return prepare


async def _interleaved(
    node: NodeContext,
    plan: Plan,
    policy: PlanPolicy,
    inputs: Mapping[str, StepResult],
    children: _Children,
    done: dict[str, StepResult],
) -> StepResult:
    """The ``replan`` strategy: run the next ready step, then replan with what it brought."""
    settings = node.run.settings
    failures = 0
    for _ in range(settings.max_steps * 2):
        ready = [
            sid
            for sid in topological_order(plan)
            if sid not in done and all(d in done for d in plan.step(sid).depends_on)
        ]
        if not ready:
            return _succeed(node, plan, done)
        step = plan.step(ready[0])
        failure: str | None = None
        out_of_budget = False
        try:
            done[step.id] = await run_child(
                children.by_step[step.id], step, {d: done[d] for d in step.depends_on}, policy
            )
        except StepFailed as exc:
            failures += 1
            failure = f"step {step.id!r} failed: {exc}"
            out_of_budget = exc.status == "budget_exhausted"
            if failures > settings.max_replans:
                children.retire(
                    [s.id for s in plan.steps if s.id not in done], "not run: the node gave up"
                )
                return _give_up(node, plan, done, failure, budget=out_of_budget)
        if failure is None and all(s.id in done for s in plan.steps):
            return _succeed(node, plan, done)
        try:
            new_plan = await obtain_plan(
                node, policy, inputs, previous=plan, progress=done, failure=failure
            )
        except BudgetExceeded as exc:
            children.retire(
                [s.id for s in plan.steps if s.id not in done], "not run: no budget left to replan"
            )
            why = f"{failure}; cannot replan: {exc}" if failure else f"cannot replan: {exc}"
            return _give_up(node, plan, done, why, budget=True)
        except StepFailed as exc:
            # No new plan: what the finished steps brought is kept, the rest does not run.
            children.retire(
                [s.id for s in plan.steps if s.id not in done], "not run: replanning failed"
            )
            why = f"{failure}; replanning failed: {exc}" if failure else f"replanning failed: {exc}"
            return _give_up(node, plan, done, why)
        if failure is not None and out_of_budget and _same_work_left(plan, new_plan, done):
            children.retire(
                [s.id for s in plan.steps if s.id not in done],
                "not run: the revised plan changed nothing",
            )
            return _give_up(node, plan, done, _unchanged_after_budget(failure), budget=True)
        done = _carry_over(plan, new_plan, done)
        plan = new_plan
        children.sync(plan, done, len(node.record.plan_versions), policy)
    children.retire([s.id for s in plan.steps if s.id not in done], "not run: step limit")
    return _give_up(node, plan, done, f"no end after {settings.max_steps * 2} interleaved steps")


def _failures(outcome: DagOutcome) -> tuple[str, bool]:
    """What failed in ``outcome``, as one line, and whether a step ran out of budget."""
    failure = "; ".join(f"step {k!r} failed: {v}" for k, v in outcome.failed.items())
    return failure, any(f.status == "budget_exhausted" for f in outcome.failed.values())


def _same_work_left(old: Plan, new: Plan, done: Mapping[str, StepResult]) -> bool:
    """Whether ``new`` leaves to do exactly what ``old`` left: the same steps, doing the same
    work (a new title or estimate changes nothing that runs)."""
    left = {s.id: s for s in old.steps if s.id not in done}
    kept = _carry_over(old, new, done)
    to_do = {s.id: s for s in new.steps if s.id not in kept}
    return left.keys() == to_do.keys() and all(left[i].same_work(to_do[i]) for i in left)


def _unchanged_after_budget(failure: str) -> str:
    """Why a node stops when its planner answered a step that ran out of budget with the
    same work again: it would run out again, and each replan spends more of what is left."""
    return (
        f"{failure}; the revised plan left the same work to do, which would run out of budget "
        "again: give it a larger budget"
    )


def _carry_over(old: Plan, new: Plan, done: Mapping[str, StepResult]) -> dict[str, StepResult]:
    """The results of ``done`` that stand in ``new`` (see :func:`carried_over`)."""
    return {step_id: done[step_id] for step_id in carried_over(old, new, done)}


async def _cover_left_out(
    node: NodeContext,
    policy: PlanPolicy,
    inputs: Mapping[str, StepResult],
    plan: Plan,
    done: Mapping[str, StepResult],
) -> Plan | None:
    """A plan that does more of what ``plan`` (now done) left out, with what the node has
    left: its calls cost less than their least, which was reserved and came back. ``None``
    when the plan left nothing out, when no plan with more work fits, or the planner fails."""
    if not plan.left_out:
        return None
    feedback = (
        f"Every step of the plan is done, but it left out: {plan.left_out}. Revise the plan "
        "to do what it left out, as far as the budget left now covers; keep the steps done."
    )
    try:
        more = await obtain_plan(
            node, policy, inputs, previous=plan, progress=done, feedback=feedback
        )
    except (BudgetExceeded, StepFailed):
        return None
    if all(s.id in done for s in more.steps) or _same_work_left(plan, more, done):
        return None
    return more


async def _join(
    node: NodeContext,
    policy: PlanPolicy,
    inputs: Mapping[str, StepResult],
    plan: Plan,
    done: Mapping[str, StepResult],
    can_replan: bool,
) -> tuple[str | None, Plan | None]:
    """The joiner's word on a finished plan: its answer (``None``: the answer the results
    make), or a revised plan when it asks for one and the node may still replan. A replan it
    asks for that cannot be had (no replans left, no plan, no budget) leaves the answer from
    the results, flagged ``join_replan_refused``."""
    decision = await ask_joiner(node, done, _answer(plan, done))
    if decision is None:
        return None, None
    if decision.answers:
        return decision.text, None
    if can_replan:
        try:
            revised = await obtain_plan(
                node,
                policy,
                inputs,
                previous=plan,
                progress=done,
                failure=f"the joiner asked for a replan: {decision.text}",
            )
        except (BudgetExceeded, StepFailed):
            pass
        else:
            return None, revised
    node.record.flags.append("join_replan_refused")
    return None, None


def _succeed(
    node: NodeContext, plan: Plan, done: Mapping[str, StepResult], answer: str | None = None
) -> StepResult:
    if answer is None:
        answer = _answer(plan, done)
    left_out = _left_out(node, plan)
    if left_out:
        # Every step did its work, but the plan (or a sub-goal's) did not cover the whole goal:
        # the node is partial, and says what is missing; its parent goes on with the result.
        _finish(node, "partial", output=answer, error="left out: " + "; ".join(left_out))
    else:
        _finish(node, "succeeded", output=answer)
    return StepResult(answer, answer)


def _left_out(node: NodeContext, plan: Plan) -> list[str]:
    """What the plan says it leaves out, and what its sub-goals left out of theirs."""
    found = [plan.left_out] if plan.left_out else []
    latest = {c.step_id: c for c in node.record.children if c.step_id is not None}
    for step in plan.steps:
        child = latest.get(step.id)
        if child is not None and child.status == "partial" and child.error:
            found.append(f"{child.path}: {child.error.removeprefix('left out: ')}")
    return found


def _give_up(
    node: NodeContext,
    plan: Plan,
    done: Mapping[str, StepResult],
    failure: str,
    *,
    budget: bool = False,
) -> NoReturn:
    # A node stopped by its budget is budget_exhausted (or partial, with results): the run
    # then ends partial, not failed.
    status = "partial" if done else ("budget_exhausted" if budget else "failed")
    answer = _answer(plan, done)
    _finish(node, status, output=answer or None, error=failure)
    raise StepFailed(failure, status=status)


async def run_planner_node(
    node: NodeContext, policy: PlanPolicy, inputs: Mapping[str, StepResult]
) -> StepResult:
    """Plan the node's goal, pass the gate, and execute the plan."""
    async with node_lifecycle(node):
        if await can_stream(node, policy):
            return await execute_plan(node, None, policy, inputs)
        try:
            plan = await obtain_plan(node, policy, inputs)
        except StepFailed as exc:
            _finish(node, exc.status, error=str(exc))
            raise
        except BudgetExceeded as exc:
            raise _out_of_budget(node, exc) from None
        return await execute_plan(node, plan, policy, inputs)


def _out_of_budget(node: NodeContext, exc: BudgetExceeded) -> StepFailed:
    """The node could not pay for its plan: it ends budget_exhausted (no traceback)."""
    _finish(node, "budget_exhausted", error=str(exc))
    return StepFailed(str(exc), status="budget_exhausted")


async def run_as_needed_node(
    node: NodeContext, step: Step, inputs: Mapping[str, StepResult], policy: PlanPolicy
) -> StepResult:
    """ADaPT: attempt the step directly; decompose it into a plan only if the attempt fails."""
    async with node_lifecycle(node):
        restore = node.run.restore
        start, earlier = (
            ("attempt", None) if restore is None else restore.as_needed_start(node.record)
        )
        feedback: str | None = None
        if start == "plan" and not node.record.plan_versions:
            feedback = f"{ATTEMPT_FAILED}; decompose it into smaller steps."
        if start == "done" and earlier is not None:
            _finish(node, "succeeded", output=earlier.text)
            return earlier
        if start == "attempt":
            attempt = node.child(len(node.record.children) + 1, "executor", step.instruction, step)
            try:
                result = await run_task_node(attempt, step, inputs, max_retries=0)
            except StepFailed as exc:
                if exc.status == "budget_exhausted":
                    _finish(node, exc.status, error=str(exc))
                    raise
                feedback = f"{ATTEMPT_FAILED} ({exc}); decompose it into smaller steps."
            else:
                _finish(node, "succeeded", output=result.text)
                return result
        try:
            plan = await obtain_plan(node, policy, inputs, feedback=feedback)
        except StepFailed as exc:
            _finish(node, exc.status, error=str(exc))
            raise
        except BudgetExceeded as exc:
            raise _out_of_budget(node, exc) from None
        return await execute_plan(node, plan, policy, inputs)
