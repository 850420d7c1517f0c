"""The validation gate every plan and replan passes before any of its steps runs.

First the validators (structure: ids, dependencies, cycles, size, depth; tools allowed for this
node; tool arguments against each tool's schema), then the approver. The approver's decision is
one of :class:`Approve`, :class:`Edit` (a replacement plan, validated again) or :class:`Reject`
(the reason goes back to the planner). :class:`AutoApprove` approves everything;
:class:`CallbackApprover` asks a function (sync or async), for platforms that review elsewhere.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from hierplan.agents.tools import Toolbox
from hierplan.errors import ToolArgsError
from hierplan.hierarchy.plan import Plan, PlanDiff, PlanProblem, Step, validate_plan

REF_PATTERN = re.compile(r"\$([A-Za-z0-9_][A-Za-z0-9_.\-]{0,63})")


@dataclass(slots=True, frozen=True)
class GateContext:
    """What the gate and the approver know about the plan under review."""

    path: str
    goal: str
    depth: int
    max_depth: int
    max_steps: int
    allowed_tools: frozenset[str]
    toolbox: Toolbox
    version: int
    reason: str
    previous: Plan | None = None
    diff: PlanDiff | None = None
    budget: dict[str, Any] | None = None
    problems: tuple[str, ...] = ()


@dataclass(slots=True, frozen=True)
class Approve:
    """Run the plan as proposed."""

    by: str = "auto"
    note: str = ""


@dataclass(slots=True, frozen=True)
class Edit:
    """Run ``plan`` instead (it is validated again)."""

    plan: Plan
    by: str = "callback"
    note: str = ""


@dataclass(slots=True, frozen=True)
class Reject:
    """Do not run the plan; ``reason`` goes back to the planner."""

    reason: str
    by: str = "callback"


Decision = Approve | Edit | Reject


class Approver(Protocol):
    """Decides on a valid plan. ``review`` may take as long as a human needs."""

    async def review(self, plan: Plan, ctx: GateContext) -> Decision:
        """Approve, edit or reject ``plan``."""
        ...


class AutoApprove:
    """Approves every valid plan."""

    async def review(self, plan: Plan, ctx: GateContext) -> Decision:
        """Approve."""
        return Approve(by="auto")


ReviewFunction = Callable[[Plan, GateContext], Decision | Awaitable[Decision]]


class CallbackApprover:
    """Asks a function (sync or async) for each decision.

    >>> async def review(plan, ctx):
    ...     return Approve(by="ticket-123") if len(plan.steps) < 10 else Reject("too long")
    >>> approver = CallbackApprover(review)
    """

    def __init__(self, function: ReviewFunction, *, name: str = "callback") -> None:
        self.function = function
        self.name = name

    async def review(self, plan: Plan, ctx: GateContext) -> Decision:
        """Call the function and return its decision."""
        result = self.function(plan, ctx)
        decision = await result if inspect.isawaitable(result) else result
        if not isinstance(decision, Approve | Edit | Reject):
            raise TypeError(
                f"review callback {self.name!r} returned {decision!r}; return Approve(), "
                "Edit(plan) or Reject(reason)"
            )
        return decision


Validator = Callable[[Plan, GateContext], list[PlanProblem]]


def structure_validator(plan: Plan, ctx: GateContext) -> list[PlanProblem]:
    """Ids, dependencies, cycles, size, depth, and tools allowed for this node."""
    return validate_plan(
        plan,
        tools=ctx.allowed_tools,
        max_steps=ctx.max_steps,
        depth=ctx.depth,
        max_depth=ctx.max_depth,
    )


def args_validator(plan: Plan, ctx: GateContext) -> list[PlanProblem]:
    """Tool arguments match the tool's schema; ``$id`` references name a dependency."""
    problems: list[PlanProblem] = []
    for step in plan.steps:
        if step.tool is None or step.args is None or step.tool not in ctx.toolbox:
            continue
        refs = step_refs(step)
        for ref in sorted(refs - set(step.depends_on)):
            problems.append(
                PlanProblem(
                    "bad_reference",
                    f"step {step.id!r} uses ${ref} but does not depend on {ref!r}",
                    step.id,
                )
            )
        problems.extend(_args_problems(step, ctx.toolbox, has_refs=bool(refs)))
    return problems


def _args_problems(step: Step, toolbox: Toolbox, *, has_refs: bool) -> list[PlanProblem]:
    assert step.tool is not None and step.args is not None
    target = toolbox.get(step.tool)
    if not has_refs:
        try:
            target.validate(step.args)
        except ToolArgsError as exc:
            return [PlanProblem("bad_args", f"step {step.id!r}: {exc}", step.id)]
        return []
    # With references the values are only known at run time: check the names alone.
    props = target.parameters.get("properties", {})
    required = set(target.parameters.get("required", []))
    out = [
        PlanProblem("bad_args", f"step {step.id!r}: tool {step.tool!r} has no arg {k!r}", step.id)
        for k in step.args
        if props and k not in props
    ]
    out.extend(
        PlanProblem("bad_args", f"step {step.id!r}: missing arg {k!r} of {step.tool!r}", step.id)
        for k in sorted(required - set(step.args))
    )
    return out


def step_refs(step: Step) -> set[str]:
    """Step ids referenced as ``$id`` in a step's string arguments."""
    refs: set[str] = set()
    for value in (step.args or {}).values():
        if isinstance(value, str):
            refs.update(REF_PATTERN.findall(value))
    return refs


DEFAULT_VALIDATORS: tuple[Validator, ...] = (structure_validator, args_validator)


@dataclass(slots=True)
class GateOutcome:
    """What the gate decided, and on which plan."""

    kind: Literal["approved", "edited", "rejected", "invalid"]
    plan: Plan
    by: str
    note: str = ""
    problems: list[str] = field(default_factory=list)


class Gate:
    """Validators, then the approver; see the module docstring."""

    def __init__(
        self,
        approver: Approver | None = None,
        *,
        validators: Sequence[Validator] = DEFAULT_VALIDATORS,
        max_edit_rounds: int = 3,
    ) -> None:
        self.approver: Approver = approver or AutoApprove()
        self.validators = tuple(validators)
        self.max_edit_rounds = max_edit_rounds

    def with_validator(self, validator: Validator) -> Gate:
        """A gate with one more validator (budgets add a feasibility check this way)."""
        return Gate(
            self.approver,
            validators=(*self.validators, validator),
            max_edit_rounds=self.max_edit_rounds,
        )

    def validate(self, plan: Plan, ctx: GateContext) -> list[PlanProblem]:
        """Every problem every validator finds."""
        problems: list[PlanProblem] = []
        for validator in self.validators:
            problems.extend(validator(plan, ctx))
        return problems

    async def review(self, plan: Plan, ctx: GateContext) -> GateOutcome:
        """Validate, then ask the approver; an invalid edit is sent back to the approver."""
        problems = self.validate(plan, ctx)
        if problems:
            return GateOutcome("invalid", plan, "validators", problems=[str(p) for p in problems])
        for _ in range(self.max_edit_rounds):
            decision = await self.approver.review(plan, ctx)
            if isinstance(decision, Approve):
                return GateOutcome("approved", plan, decision.by, decision.note)
            if isinstance(decision, Reject):
                return GateOutcome("rejected", plan, decision.by, decision.reason)
            edit_problems = [str(p) for p in self.validate(decision.plan, ctx)]
            if not edit_problems:
                return GateOutcome("edited", decision.plan, decision.by, decision.note)
            ctx = _with_problems(ctx, edit_problems)
        return GateOutcome(
            "rejected",
            plan,
            "validators",
            f"no valid edit after {self.max_edit_rounds} rounds: {'; '.join(ctx.problems)}",
        )


def _with_problems(ctx: GateContext, problems: list[str]) -> GateContext:
    return replace(ctx, problems=tuple(problems))
