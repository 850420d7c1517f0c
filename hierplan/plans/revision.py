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

from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from hierplan.plans.plan import Plan, Step


@dataclass(frozen=True, slots=True)
class DoneSteps:
    """The done steps of a plan being revised (in plan order), and which of them the plan
    answered with (no step of the plan built on them)."""

    steps: tuple[Step, ...] = ()
    answers: frozenset[str] = frozenset()

    @classmethod
    def of(cls, plan: Plan, done: Collection[str], *, answers: bool = True) -> DoneSteps:
        """The steps of ``plan`` whose ids are in ``done``; ``answers``: those nothing built
        on are the plan's answers (not for a plan cut short while it was written, whose
        steps that would have built on them were never written)."""
        sinks = set(plan.sinks()) if answers else set()
        steps = tuple(s for s in plan.steps if s.id in done)
        return cls(steps, frozenset(s.id for s in steps if s.id in sinks))

    def redone_after_use(self, written: Sequence[Step]) -> str | None:
        """Why ``written`` cannot be read in order, or ``None``: a line that redoes a done step
        must come before the lines that use its result (those refer to the done one)."""
        was = {s.id: s for s in self.steps}
        used: set[str] = set()
        for step in written:
            if step.id in used and step.id in was and not was[step.id].same_work(step):
                return f"step {step.id!r} is redone after steps that use its result: redo it first"
            used.update(step.depends_on)
        return None

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
        if not self.steps:
            return set()
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
    was made from the old input). In ``new``'s order. ``new`` need not be valid yet (the gate
    has not seen it): a step in a cycle or with a dangling dependency does not stand."""
    before = old.step_map()
    after = new.step_map()
    candidates = {
        step_id
        for step_id, step in after.items()
        if step_id in done and (was := before.get(step_id)) is not None and was.same_work(step)
    }
    # Kahn's order over the candidates: one stands once every dependency of it stands.
    waiting: dict[str, int] = {}
    dependents: dict[str, list[str]] = {step_id: [] for step_id in candidates}
    for step_id in candidates:
        deps = set(after[step_id].depends_on)
        if deps <= candidates:
            waiting[step_id] = len(deps)
            for dep in deps:
                dependents[dep].append(step_id)
    ready = deque(step_id for step_id, count in waiting.items() if count == 0)
    standing: set[str] = set()
    while ready:
        step_id = ready.popleft()
        standing.add(step_id)
        for later in dependents[step_id]:
            waiting[later] -= 1
            if waiting[later] == 0:
                ready.append(later)
    return [s.id for s in new.steps if s.id in standing and after[s.id] is s]


def written_steps(plan: Plan, carried: Iterable[str]) -> list[Step]:
    """The steps of ``plan`` a revision writes: all but those ``carried`` over."""
    skip = set(carried)
    return [s for s in plan.steps if s.id not in skip]
