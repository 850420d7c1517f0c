"""Revisions: a replan writes only what is left to do.

A replan's prompt shows the current plan and the results of its done steps. The planner does
not write the done steps again: their results stand, and the steps it writes refer to them by
id (``$3``) as if they were lines above. :class:`DoneSteps` turns what the planner wrote into
the whole plan the gate checks and the run executes: the done steps the revision builds on, or
that the plan already answered with, then the lines written.

A line that uses a done step's id writes that step again: it is redone (when its work
changed, or a step it builds on is redone) or kept (when it is the same line). A done step left
out of the revision is kept only if a step builds on it or it was one of the old plan's answers
(a step nothing built on), so that a result the revision no longer needs does not become part
of the answer.

>>> from hierplan.plans.plan import Plan, Step
>>> old = Plan(goal="g", steps=[
...     Step(id="1", title="a", instruction="a", tool="lookup", args={"key": "a"}),
...     Step(id="2", title="b", instruction="b", tool="lookup", args={"key": "b"}),
...     Step(id="3", title="s", instruction="s", tool="add", args={"a": "$1", "b": "$2"},
...          depends_on=["1", "2"])])
>>> done = DoneSteps.of(old, {"1"})
>>> written = [
...     Step(id="4", title="b", instruction="b", tool="lookup", args={"key": "B"}),
...     Step(id="5", title="s", instruction="s", tool="add", args={"a": "$1", "b": "$4"},
...          depends_on=["1", "4"])]
>>> [s.id for s in done.merged(written)]
['1', '4', '5']
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from hierplan.plans.plan import Plan, Step, topological_order


@dataclass(frozen=True, slots=True)
class DoneSteps:
    """The done steps of a plan being revised (in plan order), and which of them the plan
    answered with (no step of the plan built on them)."""

    steps: tuple[Step, ...] = ()
    answers: frozenset[str] = frozenset()

    @classmethod
    def of(cls, plan: Plan, done: Collection[str]) -> DoneSteps:
        """The steps of ``plan`` whose ids are in ``done``."""
        sinks = set(plan.sinks())
        steps = tuple(s for s in plan.steps if s.id in done)
        return cls(steps, frozenset(s.id for s in steps if s.id in sinks))

    @property
    def ids(self) -> list[str]:
        """The done steps' ids, in plan order: what a revision's lines may refer to."""
        return [s.id for s in self.steps]

    def merged(self, written: Sequence[Step]) -> list[Step]:
        """The revised plan's steps: the done steps kept, then the rest of ``written`` in
        order.

        A done step is kept when none of the steps it was built on is redone (its result was
        made from what runs again), it is not redone itself, and the revision wrote it again
        unchanged, a step builds on it, or the old plan answered with it."""
        if not self.steps:
            return list(written)
        copies = self.copies(written)
        rest = [s for s in written if s.id not in copies]
        latest = {s.id: s for s in written if s.id in copies}  # a copy may be reworded
        stale = self._stale(written)
        needed = copies | {d for s in rest for d in s.depends_on}
        kept: list[Step] = []
        for step in reversed(self.steps):
            if step.id in stale or not (step.id in needed or step.id in self.answers):
                continue
            kept.append(latest.get(step.id, step))
            needed.update(step.depends_on)
        return [*reversed(kept), *rest]

    def copies(self, written: Sequence[Step]) -> set[str]:
        """Ids of the done steps ``written`` holds again unchanged, on inputs that stand:
        their results stand, and they do not run again."""
        stale = self._stale(written)
        ids = {s.id for s in self.steps}
        return {s.id for s in written if s.id in ids and s.id not in stale}

    def _stale(self, written: Sequence[Step]) -> set[str]:
        """Ids of the done steps whose results do not stand: written again with other work,
        or built on such a step."""
        was = {s.id: s for s in self.steps}
        stale = {s.id for s in written if s.id in was and not was[s.id].same_work(s)}
        for step in self.steps:  # plan order: a step's dependencies come before it
            if any(d in stale for d in step.depends_on):
                stale.add(step.id)
        return stale


def carried_over(old: Plan, new: Plan, done: Mapping[str, object] | Collection[str]) -> list[str]:
    """Ids of the steps of ``new`` whose results from ``old`` stand: done there, the same work
    here, on inputs that stand too (a step whose dependency runs again runs again: its result
    was made from the old input). In ``new``'s dependency order."""
    before = old.step_map()
    after = new.step_map()
    kept: list[str] = []
    standing: set[str] = set()
    for step_id in topological_order(new):
        step, was = after[step_id], before.get(step_id)
        if (
            step_id in done
            and was is not None
            and was.same_work(step)
            and all(d in standing for d in step.depends_on)
        ):
            kept.append(step_id)
            standing.add(step_id)
    return kept


def written_steps(plan: Plan, carried: Iterable[str]) -> list[Step]:
    """The steps of ``plan`` a revision writes: all but those ``carried`` over."""
    skip = set(carried)
    return [s for s in plan.steps if s.id not in skip]
