"""Continuing a paused run: :class:`Restore` holds its checkpoint (the record, finished step
results, the decisions given for its pending plans) and answers, for each node the resumed run
enters again, where it stands.

A node's approved plan is used again without calling the planner; finished steps keep their
results and do not run again (for a revision decided or written after the pause, those it
carries over: not a step it redoes, nor one built on a redone step); a sub-planner that had
started is entered again (it restores its own plan); a step that failed or was cancelled gets a
new node; a pending plan gets the decision given to :func:`hierplan.resume` (or goes to the
approver again). Each answer is given once per node: a node entered again later (after a replan)
plans and runs as usual.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from hierplan.agents.prompts import PLAN_INVALID, PLAN_REJECTED
from hierplan.core.results import StepResult
from hierplan.core.views import Resumed, SpanIds
from hierplan.plans.decisions import Decision
from hierplan.plans.plan import Plan
from hierplan.plans.revision import carried_over
from hierplan.records import NodeRecord, PlanVersion, RunResult
from hierplan.units import usd_to_pico

ENDED = frozenset({"failed", "cancelled", "rejected", "budget_exhausted", "partial"})


def rejection_feedback(reason: str) -> str:
    """What the planner is told about a rejected plan."""
    return f"{PLAN_REJECTED}: {reason}"


def invalid_feedback(problems: list[str]) -> str:
    """What the planner is told about an invalid plan."""
    return f"{PLAN_INVALID}: " + "; ".join(problems)


@dataclass(slots=True)
class PlanState:
    """Where a restored node's planning stands.

    ``approved``: the plan to run (no planning needed). ``pending``: a version waiting for a
    decision. Otherwise the node plans again, with ``feedback`` about its last proposal.
    ``previous`` is the last approved plan before the open proposal (for a replan's diff).
    """

    approved: Plan | None = None
    pending: PlanVersion | None = None
    previous: Plan | None = None
    feedback: str | None = None
    invalid: int = 0
    rejections: int = 0


@dataclass(slots=True)
class Restore:
    """A paused run to continue (see the module docstring): its record, finished step results
    by node path, the decisions made outside the run by node path, the spec it was started
    with, what the caller kept with it (``extra``) and its workflow span when it was traced."""

    record: RunResult
    results: dict[str, StepResult]
    decisions: dict[str, Decision] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    workflow_span: SpanIds | None = None
    _taken: set[tuple[str, str]] = field(default_factory=set)
    # By node path: the plan a node's children ran under before the pause, when the plan the
    # node goes on with is another one (a revision still to decide, or to write again).
    _ran_under: dict[str, Plan] = field(default_factory=dict)

    @property
    def resumed(self) -> Resumed:
        """What the resumed run carries over: what the paused part spent (its budget's exact
        figures, ``RunResult.budget["spent"]``) and its workflow span."""
        spent = (self.record.budget or {}).get("spent") or {}
        pico, usd = spent.get("pico"), spent.get("usd")
        return Resumed(
            int(spent.get("tokens") or 0),
            int(pico) if pico is not None else usd_to_pico(usd or 0.0),
            self.workflow_span,
        )

    def decision_for(self, path: str) -> Decision | None:
        """The decision made outside the run for the pending plan of node ``path``."""
        return self.decisions.get(path)

    def _take(self, kind: str, record: NodeRecord) -> bool:
        """True the first time ``kind`` is restored for the node of ``record``."""
        key = (kind, record.path)
        if key in self._taken:
            return False
        self._taken.add(key)
        return True

    def plan_state(self, record: NodeRecord) -> PlanState | None:
        """Where a restored node's planning stands, or ``None`` (plan as usual)."""
        if not self._take("plan", record) or not record.plan_versions:
            return None
        versions = record.plan_versions
        open_version = next(
            (v for v in reversed(versions) if not (v.reason == "edit" and v.decision == "invalid")),
            versions[-1],
        )
        if open_version.decision == "approved":
            return PlanState(approved=open_version.plan)
        state = PlanState(
            previous=next((v.plan for v in reversed(versions) if v.decision == "approved"), None)
        )
        if state.previous is not None:
            self._ran_under[record.path] = state.previous
        for v in reversed(versions):
            if v.decision == "approved":
                break
            if v.decision == "rejected":
                state.rejections += 1
            elif v.decision == "invalid" and v.reason != "edit":
                state.invalid += 1
        if open_version.decision in (None, "pending"):
            state.pending = open_version
        elif open_version.decision == "rejected":
            state.feedback = rejection_feedback(open_version.note)
        else:
            state.feedback = invalid_feedback(open_version.problems)
        return state

    def done_for(self, record: NodeRecord, plan: Plan) -> dict[str, StepResult]:
        """Results of ``plan``'s steps that finished before the pause."""
        return self._finished(_match_children(record, plan))

    def _finished(self, matched: dict[str, NodeRecord]) -> dict[str, StepResult]:
        return {
            sid: self.results[rec.path]
            for sid, rec in matched.items()
            if rec.status == "succeeded" and rec.path in self.results
        }

    def children(
        self, record: NodeRecord, plan: Plan
    ) -> tuple[dict[str, NodeRecord], dict[str, StepResult]] | None:
        """The records of ``plan``'s steps to go on with (set to ``pending`` again), and the
        results of the finished steps; ``None`` once asked for this node already."""
        if not self._take("children", record):
            return None
        matched = _match_children(record, plan)
        ran_under = self._ran_under.get(record.path)
        changed: set[str] = set()
        if ran_under is None:
            done = self._finished(matched)
        else:
            # The children ran under the plan approved before the pause. Of their results,
            # those stand that the revision carries over (not a step it redoes, nor one built
            # on a redone step), as when a replan is approved without a pause; such a step
            # keeps the record it ran as, even reworded (a direct call's wording is no work).
            ran = _match_children(record, ran_under)
            before = self._finished(ran)
            done = {sid: before[sid] for sid in carried_over(ran_under, plan, before)}
            matched.update({sid: ran[sid] for sid in done})
            same = carried_over(ran_under, plan, ran_under.step_map())
            changed = {s.id for s in plan.steps}.difference(same)
        again: dict[str, NodeRecord] = {}
        for step_id, rec in matched.items():
            if step_id not in done:
                if rec.status in ENDED and (rec.kind == "executor" or not rec.plan_versions):
                    continue  # ended for good: the step gets a new node
                if step_id in changed or (ran_under is not None and rec.status == "succeeded"):
                    # Its work or its inputs changed: a new node, not the old one's plan
                    # and results (a sub-planner's, made from the old input).
                    if rec.status in ("pending", "paused"):
                        rec.status = "cancelled"
                        rec.error = "replaced by the plan decided on resume"
                    continue
                rec.status = "pending"
                rec.error = None
            again[step_id] = rec
        kept = {rec.path for rec in matched.values()}
        for rec in record.children:
            if rec.status == "paused" and rec.path not in kept:
                rec.status = "cancelled"
                rec.error = "not resumed: the plan no longer has this step"
        return again, done

    def as_needed_start(
        self, record: NodeRecord
    ) -> tuple[Literal["attempt", "plan", "done"], StepResult | None]:
        """How a restored as-needed node goes on: attempt directly, decompose, or it is done."""
        if not self._take("as-needed", record):
            return "attempt", None
        if record.plan_versions:
            return "plan", None
        first = record.children[0] if record.children else None
        if first is None or first.kind != "executor":
            return "attempt", None
        if first.status == "succeeded" and first.path in self.results:
            return "done", self.results[first.path]
        if first.status in ENDED:
            return "plan", None
        record.children.remove(first)
        return "attempt", None


def _match_children(record: NodeRecord, plan: Plan) -> dict[str, NodeRecord]:
    """For each step of ``plan``, the latest child record made for that very step."""
    steps = plan.step_map()
    out: dict[str, NodeRecord] = {}
    for rec in record.children:
        step = steps.get(rec.step_id or "")
        if step is not None and rec.goal == step.instruction and rec.tool == step.tool:
            out[step.id] = rec
    return out
