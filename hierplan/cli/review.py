"""How the CLI reviews plans: the review flags, the approver they make, and resume decisions.

``--yes`` approves every plan; ``--review`` asks at this console (:class:`ConsoleReviewer`);
``--pause-for-review`` pauses the run for ``hierplan resume`` (:class:`PauseForReview`); and
``--review-policy`` chooses which plans are reviewed (:class:`ReviewPolicy`).
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.text import Text

from hierplan.durable.checkpoint import PENDING_DIR, pending_versions
from hierplan.errors import UserInputError
from hierplan.hierarchy.gate import Approver, AutoApprove
from hierplan.plans.decisions import Approve, Decision, Edit, Reject
from hierplan.plans.plan import load_plan
from hierplan.records import RunResult
from hierplan.review.console import ConsoleReviewer
from hierplan.review.policy import PauseForReview, PolicyApprover, ReviewPolicy
from hierplan.review.render import diff_view
from hierplan.view.console import RunConsole

EXIT_PAUSED = 3
ReviewMode = Literal["auto", "console", "pause"]


@dataclass(slots=True, frozen=True)
class ReviewSetup:
    """How a CLI run reviews plans: not at all, at this console, or by pausing."""

    mode: ReviewMode
    policy: ReviewPolicy

    def approver(self, console: Console, display: RunConsole) -> Approver:
        """The approver for this setup."""
        if self.mode == "console":
            return PolicyApprover(ConsoleReviewer(console, display=display), self.policy)
        if self.mode == "pause":
            return PolicyApprover(PauseForReview(), self.policy)
        return AutoApprove()

    def saved(self) -> dict[str, str]:
        """What a checkpoint keeps, so that ``resume`` reviews the same way."""
        return {"review": self.mode, "review_policy": str(self.policy)}


def review_setup(
    *, yes: bool, review: bool, pause: bool, policy: str, default: ReviewMode | None
) -> ReviewSetup:
    """The review setup from the flags; ``default`` applies when none is given."""
    if yes + review + pause > 1:
        raise UserInputError("choose one of --yes, --review and --pause-for-review")
    chosen: ReviewMode | None = (
        "auto" if yes else "console" if review else "pause" if pause else default
    )
    if chosen is None:
        if not sys.stdin.isatty():
            raise UserInputError(
                "the plan needs approval before it runs: pass --yes to approve it "
                "automatically, --pause-for-review to decide later with hierplan resume, or "
                "run in a terminal to be asked"
            )
        if not sys.stdout.isatty():
            # The question would go where the output goes (a file, a pipe), unseen, and the
            # run would wait for an answer nobody knows is wanted.
            raise UserInputError(
                "the plan needs approval before it runs, and the output does not go to a "
                "terminal, where it would be asked: pass --review to be asked anyway, --yes to "
                "approve it automatically, or --pause-for-review to decide later with "
                "hierplan resume"
            )
        chosen = "console"
    if chosen == "console" and not sys.stdin.isatty():
        raise UserInputError(
            "reviewing at the console needs a terminal: use --pause-for-review to decide later "
            "with hierplan resume, or --yes"
        )
    return ReviewSetup(chosen, ReviewPolicy.parse(policy))


def print_paused(console: Console, result: RunResult, out: Path) -> None:
    """What waits for a decision (with the diff of a new proposal) and how to continue."""
    waiting = pending_versions(result.tree)
    for node, version in waiting:
        # A proposal replaces the plan before it, an approved edit included (that edit is what
        # ran); edits the validators refused never ran, so they are passed over.
        earlier = [
            v
            for v in node.plan_versions
            if v.version < version.version and not (v.reason == "edit" and v.decision == "invalid")
        ]
        if earlier:
            replaced = earlier[-1]
            console.print(
                Text(f"node {node.path}: plan v{version.version} replaces v{replaced.version}")
            )
            console.print(diff_view(replaced.plan, version.plan))
    pending = [node.path for node, _ in waiting]
    console.print(
        f"paused: {len(pending)} plan(s) wait for a decision: "
        + ", ".join(f"node {p} ({out / PENDING_DIR / (p + '.yaml')})" for p in pending),
        style="yellow",
        markup=False,
        highlight=False,
    )
    where = shlex.quote(str(out))  # to paste into a shell as it is
    console.print(
        f"continue with: hierplan resume {where} --approve | --reject REASON | --plan FILE "
        "[--node PATH]",
        markup=False,
        highlight=False,
    )


def saved_mode(saved: dict[str, Any]) -> ReviewMode:
    """The review mode a checkpoint's run was started with (``pause`` if unknown)."""
    mode = saved.get("review", "pause")
    return mode if mode in ("auto", "console", "pause") else "pause"


def resume_decision(
    approve: bool, reject: str | None, plan_file: Path | None, who: str, *, review: bool
) -> Decision | None:
    """The decision ``hierplan resume`` was given; ``None`` only with ``--review``."""
    given = approve + (reject is not None) + (plan_file is not None)
    if given > 1:
        raise UserInputError("give only one of --approve, --reject REASON and --plan FILE")
    if approve:
        return Approve(by=who)
    if reject is not None:
        if not reject.strip():
            raise UserInputError("--reject needs a reason: the planner uses it for the next plan")
        return Reject(reject.strip(), by=who)
    if plan_file is not None:
        return Edit(load_plan(plan_file), by=who, note=f"edited plan from {plan_file}")
    if not review:
        raise UserInputError(
            "give a decision: --approve, --reject REASON or --plan FILE (or --review to decide "
            "at the console)"
        )
    return None
