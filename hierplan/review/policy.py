"""Which plans a person reviews, and the approvers that send plans to them or pause the run.

>>> policy = ReviewPolicy.parse("tokens>5000")
>>> str(policy)
'tokens>5000'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from hierplan.errors import UserInputError
from hierplan.hierarchy.gate import Approver, GateContext
from hierplan.plans.decisions import Approve, Decision, Defer
from hierplan.plans.plan import Plan

PolicyScope = Literal["root", "all", "usd", "tokens", "destructive"]
POLICY_HELP = "root, all, destructive, usd>AMOUNT or tokens>COUNT"


@dataclass(slots=True, frozen=True)
class ReviewPolicy:
    """Which plans go to the reviewer: the root plan only, every level, or costly sub-goals.

    ``root``: the root plan (and its replans). ``all``: every plan at every level.
    ``destructive``: every plan, at any level, that may use a destructive tool (see
    :func:`destructive_tools`), and no other. ``usd>X`` or ``tokens>N``: the root plan and
    every sub-goal whose budget exceeds the threshold. A
    sub-goal's budget is its node's allocated budget when a budget instrument set one, else the
    planner's estimate on its step (``estimate_usd``, ``estimate_tokens``); for ``usd>X``, an
    estimate in tokens only is read at the dearest per-token price of the run's models. A
    sub-goal whose budget is unknown is reviewed: an unknown cost is not known to be small.
    """

    scope: PolicyScope = "root"
    threshold: float = 0.0

    @classmethod
    def parse(cls, text: str) -> ReviewPolicy:
        """``root``, ``all``, ``usd>0.05`` or ``tokens>20000``; a clear
        :class:`UserInputError` otherwise (a USD amount must be finite and not negative, a
        token count a whole number)."""
        spec = text.strip().lower().replace(" ", "")
        if spec in ("root", "all", "destructive"):
            return cls(spec)  # type: ignore[arg-type]
        unit, sep, number = spec.partition(">")
        if sep and unit in ("usd", "tokens"):
            try:
                value = float(number.lstrip("$"))
            except ValueError:
                pass
            else:
                problem = _threshold_problem(unit, value)
                if problem is None:
                    return cls(unit, value)  # type: ignore[arg-type]
                raise UserInputError(
                    f"review policy {text!r}: {problem}; use {POLICY_HELP} "
                    "(e.g. usd>0.05, tokens>20000)"
                )
        raise UserInputError(
            f"unknown review policy {text!r}: use {POLICY_HELP} (e.g. usd>0.05, tokens>20000)"
        )

    def __str__(self) -> str:
        if self.scope in ("root", "all", "destructive"):
            return self.scope
        if self.scope == "tokens":
            return f"tokens>{int(self.threshold)}"
        short = f"{self.threshold:g}"
        # The short form unless it loses digits: the text must parse back to this policy.
        return f"usd>{short if float(short) == self.threshold else repr(self.threshold)}"

    def wants(self, ctx: GateContext, plan: Plan | None = None) -> bool:
        """Whether ``plan`` (the plan in ``ctx``) goes to the reviewer; the ``destructive``
        policy needs the plan (without it, every plan goes)."""
        if self.scope == "destructive":
            return plan is None or bool(destructive_tools(plan, ctx))
        if ctx.is_root or self.scope == "all":
            return True
        if self.scope == "root":
            return False
        value = subgoal_budget(ctx, self.scope)
        return value is None or value > self.threshold


def plan_tools(plan: Plan, ctx: GateContext) -> dict[str, list[str]]:
    """The tools each task step of ``plan`` may call, by step id: its own ``tool``, else its
    ``tools`` allowlist within the node's, else every tool of the node. A sub-goal's steps
    are not counted: its own plan is reviewed when it comes."""
    found: dict[str, list[str]] = {}
    for step in plan.steps:
        if step.kind == "subgoal":
            continue
        if step.tool is not None:
            found[step.id] = [step.tool]
        elif step.tools is not None:
            found[step.id] = sorted(set(step.tools) & ctx.allowed_tools)
        else:
            found[step.id] = sorted(ctx.allowed_tools)
    return found


def destructive_tools(plan: Plan, ctx: GateContext) -> list[str]:
    """The tools ``plan`` may use that may be destructive (:attr:`ToolHints.may_destroy`: MCP's
    ``destructiveHint``, or a tool that does not say it is read-only or not destructive)."""
    names = {name for tools in plan_tools(plan, ctx).values() for name in tools}
    return sorted(n for n in names if n in ctx.toolbox and ctx.toolbox.get(n).hints.may_destroy)


def _threshold_problem(unit: str, value: float) -> str | None:
    """What is wrong with a policy's threshold (``float`` reads ``nan``, ``inf`` and numbers
    too large as such), or ``None``."""
    what = "USD amount" if unit == "usd" else "token count"
    if not math.isfinite(value):
        return f"the {what} must be a finite number (not nan, inf or too large to read)"
    if value < 0:
        return f"the {what} must not be negative"
    if unit == "tokens" and not value.is_integer():
        return "the token count must be a whole number"
    return None


def subgoal_budget(ctx: GateContext, unit: Literal["usd", "tokens"]) -> float | None:
    """A node's budget in ``unit``: allocated if known, else its step's estimate, else None."""
    allocated = _allocated(ctx.budget, unit)
    if allocated is not None:
        return allocated
    step = ctx.step
    if step is None:
        return None
    if unit == "tokens":
        return None if step.estimate_tokens is None else float(step.estimate_tokens)
    if step.estimate_usd is not None:
        return float(step.estimate_usd)
    if step.estimate_tokens is not None and ctx.usd_per_token is not None:
        return step.estimate_tokens * ctx.usd_per_token
    return None


def _allocated(budget: dict[str, Any] | None, unit: str) -> float | None:
    """What a node may spend by its budget record, whichever common shape it has: its limit
    first (an ``on-demand`` node is allocated nothing up front but may draw up to its cap),
    else what it was allocated."""
    if not budget:
        return None
    candidates: list[Any] = [
        budget.get(f"limit_{unit}"),
        budget.get(f"allocated_{unit}"),
        budget.get(f"{unit}_allocated"),
        budget.get(f"{unit}_limit"),
    ]
    nested = budget.get(unit)
    if isinstance(nested, dict):
        candidates += [nested.get("allocated"), nested.get("limit")]
    else:
        candidates.append(nested)
    allocated = budget.get("allocated")
    if isinstance(allocated, dict):
        candidates.append(allocated.get(unit))
    for value in candidates:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


class PolicyApprover:
    """Sends the plans ``policy`` selects to ``reviewer`` and approves the others itself."""

    def __init__(self, reviewer: Approver, policy: ReviewPolicy | str = "root") -> None:
        self.reviewer = reviewer
        self.policy = ReviewPolicy.parse(policy) if isinstance(policy, str) else policy

    async def review(self, plan: Plan, ctx: GateContext) -> Decision:
        """Ask the reviewer, or approve with the policy named as the decider."""
        if self.policy.wants(ctx, plan):
            return await self.reviewer.review(plan, ctx)
        return Approve(by=f"auto (review policy {self.policy})")


class PauseForReview:
    """Defers every plan: the run pauses and waits for ``hierplan resume`` (reviews elsewhere)."""

    async def review(self, plan: Plan, ctx: GateContext) -> Decision:
        """Defer."""
        return Defer(by="pause", note="waiting for a decision from hierplan resume")
