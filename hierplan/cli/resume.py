"""``hierplan resume``: continue a paused run with a decision on its pending plan(s)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from hierplan.cli.options import (
    PauseOpt,
    ReviewOpt,
    TraceContentOpt,
    TraceOpt,
    YesOpt,
    fail,
)
from hierplan.cli.review import resume_decision, review_setup, saved_mode
from hierplan.cli.running import Launcher, execute_command, holding
from hierplan.core.instrument import Instrument
from hierplan.durable.checkpoint import Checkpoint, load_checkpoint
from hierplan.errors import HierplanError, UserInputError
from hierplan.hierarchy.gate import Approver
from hierplan.plans.decisions import Decision
from hierplan.review.console import reviewer_name
from hierplan.review.policy import POLICY_HELP
from hierplan.runner.handle import RunHandle
from hierplan.runner.resume import start_resume
from hierplan.runner.spec import is_simulated, loaded_choice
from hierplan.view.console import RunConsole


def resume_command(
    run_dir: Annotated[Path, typer.Argument(help="The directory of a paused run.")],
    approve: Annotated[
        bool, typer.Option("--approve", help="Approve the pending plan(s) as they are.")
    ] = False,
    reject: Annotated[
        str | None,
        typer.Option("--reject", metavar="REASON", help="Reject; the reason goes to the planner."),
    ] = None,
    plan_file: Annotated[
        Path | None,
        typer.Option("--plan", metavar="FILE", help="Run this edited plan (YAML or JSON) instead."),
    ] = None,
    node: Annotated[
        str | None,
        typer.Option("--node", metavar="PATH", help="Decide for this node only (e.g. 1.3)."),
    ] = None,
    version: Annotated[
        int | None,
        typer.Option(
            "--version",
            metavar="N",
            help="Decide only if the plan waiting is version N (as in pending/<node>.yaml).",
        ),
    ] = None,
    by: Annotated[
        str | None, typer.Option("--by", help="Who decides, for the audit trail.")
    ] = None,
    yes: YesOpt = False,
    review: ReviewOpt = False,
    pause_for_review: PauseOpt = False,
    review_policy: Annotated[
        str | None,
        typer.Option("--review-policy", help=f"{POLICY_HELP}; default: as the run was started."),
    ] = None,
    trace: TraceOpt = None,
    trace_content: TraceContentOpt = False,
) -> None:
    """Continue a paused run with a decision on its pending plan(s).

    Later plans are reviewed the way the run was started, unless --yes, --review or
    --pause-for-review says otherwise.
    """
    try:
        who = by or f"{reviewer_name()} via hierplan resume"
        decision = resume_decision(approve, reject, plan_file, who, review=review)
    except HierplanError as exc:
        fail(str(exc))
    if run_dir.exists() and not run_dir.is_dir():
        fail(
            f"{run_dir} is a file: hierplan resume takes the paused run's directory (the --out "
            f"it ran with), e.g. {shlex.quote(str(run_dir.parent))}"
        )
    # Held before the checkpoint is read: a run or resume writing the directory may replace it.
    with holding(run_dir, otherwise=""):
        try:
            checkpoint = load_checkpoint(run_dir)
            simulated = _saved_model_simulated(checkpoint, run_dir)
            saved = checkpoint.extra
            flagged = yes or review or pause_for_review
            setup = review_setup(
                yes=yes,
                review=review,
                pause=pause_for_review,
                policy=review_policy or str(saved.get("review_policy", "root")),
                default=None if flagged else saved_mode(saved),
            )
        except HierplanError as exc:
            fail(str(exc))
        execute_command(
            Console(),
            run_dir,
            setup,
            _launcher(run_dir, decision, node, version, setup.saved()),
            simulated=simulated,
            trace=trace,
            trace_content=trace_content,
            resumed=True,
        )


def _launcher(
    run_dir: Path,
    decision: Decision | None,
    node: str | None,
    version: int | None,
    extra: dict[str, str],
) -> Launcher:
    def launch(display: RunConsole, approver: Approver, traced: list[Instrument]) -> RunHandle:
        return start_resume(
            run_dir,
            decision,
            node=node,
            version=version,
            drop_checkpoint=False,  # dropped once the record is saved
            listeners=[display],
            approver=approver,
            instruments=traced,
            extra=extra,
        )

    return launch


def _saved_model_simulated(checkpoint: Checkpoint, run_dir: Path) -> bool:
    """Whether the paused run's model is the simulator; a run started in Python with a model
    object cannot go on from the command line (it would go on on another model)."""
    saved = checkpoint.spec
    if loaded_choice(saved.get("model")) is None or (
        saved.get("executor_model") is not None
        and loaded_choice(saved.get("executor_model")) is None
    ):
        raise UserInputError(
            f"the run paused in {run_dir} was started in Python with a model object, not a "
            "model name, so the command line cannot go on with that model: resume it in "
            "Python with hierplan.resume(run_dir, decision, model=..., executor_model=...)"
        )
    return is_simulated(loaded_choice(saved.get("model")))
