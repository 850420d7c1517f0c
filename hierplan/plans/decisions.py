"""The decisions on a plan: approve it, run an edited version instead, reject it with a reason
for the planner, or defer it (the run pauses until someone decides)."""

from __future__ import annotations

from dataclasses import dataclass

from hierplan.plans.plan import Plan


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


@dataclass(slots=True, frozen=True)
class Defer:
    """No decision now: the run pauses, keeps the plan, and waits for ``hierplan resume``."""

    by: str = "pause"
    note: str = ""


Decision = Approve | Edit | Reject | Defer
"""What an approver returns for a plan: approve, edit, reject or defer it."""
