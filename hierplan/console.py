"""What ``hierplan run`` and ``demo`` show while a run goes: plans, replans, progress.

:class:`RunConsole` is an event listener: it prints the root plan when it is proposed, one line per
sub-plan and replan, and a progress line for the executor steps. :class:`ConfirmRootPlan` is the
simple console approver: it asks once, for the root plan; sub-plans are approved automatically.
"""

from __future__ import annotations

from functools import partial

import anyio.to_thread
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.prompt import Confirm

from hierplan.hierarchy.events import (
    ModelCalled,
    NodeFinished,
    NodeStarted,
    PlanDecided,
    PlanProposed,
    Replanned,
    RunEvent,
)
from hierplan.hierarchy.gate import Approve, Decision, GateContext, Reject
from hierplan.hierarchy.plan import Plan
from hierplan.tracing.report import money, plan_tree, short


class RunConsole:
    """Prints a run as it happens (an :class:`~hierplan.hierarchy.events.EventBus` listener)."""

    def __init__(self, console: Console, *, simulated: bool) -> None:
        self.console = console
        self.simulated = simulated
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]steps"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self.task = self.progress.add_task("steps", total=0, info="")
        self.started = 0
        self.finished = 0
        self.running = 0
        self.cost = 0.0
        self.executors: set[str] = set()
        self.live = False

    def __call__(self, event: RunEvent) -> None:
        """Handle one event."""
        out = self.progress.console
        if isinstance(event, PlanProposed) and event.path == "1" and event.version == 1:
            tag = " [SIMULATED]" if self.simulated else ""
            out.print(plan_tree(Plan.model_validate(event.plan), title=f"plan for node 1{tag}"))
        elif isinstance(event, PlanDecided):
            self._decided(event)
        elif isinstance(event, Replanned):
            out.print(
                f"[yellow]replan[/] node {event.path} v{event.version}: {event.diff}",
                markup=True,
                highlight=False,
            )
        elif isinstance(event, NodeStarted) and event.kind == "executor":
            self.executors.add(event.path)
            self.started += 1
            self.running += 1
            if not self.live:
                self.progress.start()
                self.live = True
        elif isinstance(event, NodeFinished):
            self._finished(event)
        elif isinstance(event, ModelCalled) and event.cost_usd:
            self.cost += event.cost_usd
        self.progress.update(
            self.task,
            total=max(self.started, 1),
            completed=self.finished,
            info=f"running {self.running}  cost {money(self.cost)}",
        )

    def _decided(self, event: PlanDecided) -> None:
        out = self.progress.console
        if event.decision in ("invalid", "rejected"):
            why = "; ".join(event.problems) or event.note
            out.print(
                f"  plan {event.path} v{event.version} {event.decision}: {short(why, 150)}",
                style="yellow",
                markup=False,
                highlight=False,
            )
        elif event.path != "1":
            out.print(
                f"  plan {event.path} v{event.version} {event.decision} by {event.decided_by}",
                style="dim",
                markup=False,
                highlight=False,
            )

    def _finished(self, event: NodeFinished) -> None:
        if event.status in ("failed", "budget_exhausted") and event.error:
            self.progress.console.print(
                f"  node {event.path} {event.status}: {short(event.error, 140)}",
                style="red",
                markup=False,
                highlight=False,
            )
        if event.path in self.executors:
            self.executors.discard(event.path)
            self.finished += 1
            self.running -= 1

    def stop(self) -> None:
        """Stop the progress display."""
        if self.live:
            self.progress.stop()
            self.live = False


class ConfirmRootPlan:
    """Asks on the console before the root plan runs; sub-plans are approved automatically."""

    def __init__(self, console: Console) -> None:
        self.console = console

    async def review(self, plan: Plan, ctx: GateContext) -> Decision:
        """Ask "Run this plan?" for the root; approve the rest."""
        if ctx.path != "1":
            return Approve(by="auto (sub-plan)")
        ok = await anyio.to_thread.run_sync(
            partial(Confirm.ask, "Run this plan?", console=self.console, default=False)
        )
        return Approve(by="console") if ok else Reject("declined at the console", by="console")
