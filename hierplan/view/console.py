"""What ``hierplan run`` and ``demo`` show while a run goes: plans, replans, progress.

:class:`RunConsole` is an event listener: it prints the root plan when it is proposed, one line per
sub-plan and replan, and a progress line for the executor steps, with what the run has spent and,
under a budget, what it has left. While a plan is reviewed at the
console (:class:`hierplan.review.ConsoleReviewer`) it stands aside: the progress line stops and
its output is held back until the review ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from hierplan.core.events import (
    ModelCalled,
    NodeFinished,
    NodeStarted,
    PlanDecided,
    PlanProposed,
    Replanned,
    RunEvent,
)
from hierplan.plans.plan import Plan
from hierplan.view.tree import money, plain, plan_tree, short


class _Progress(Progress):
    """A progress display that asks for its figures (``before_draw``) each time it is drawn."""

    before_draw: Callable[[], None] | None = None

    def get_renderables(self) -> Iterable[RenderableType]:
        """The progress table, with the figures as they are now."""
        if self.before_draw is not None:
            self.before_draw()
        return super().get_renderables()


class RunConsole:
    """Prints a run as it happens (an :class:`~hierplan.core.events.EventBus` listener)."""

    # The events it shows: the run builds no other event for it (the budget's two a call).
    event_types = frozenset(
        {
            "plan_proposed",
            "plan_decided",
            "replanned",
            "node_started",
            "node_finished",
            "model_called",
        }
    )

    def __init__(self, console: Console, *, simulated: bool, show_root_plan: bool = True) -> None:
        self.console = console
        self.simulated = simulated
        self.show_root_plan = show_root_plan
        self._held: list[tuple[tuple[Any, ...], dict[str, Any]]] | None = None
        self.progress = _Progress(
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
        self.tokens = 0
        # The run's budget, as its root's node_started says (None: no limit in that dimension).
        self.limit_tokens: int | None = None
        self.limit_usd: float | None = None
        self.executors: set[str] = set()
        self.live = False
        self.progress.before_draw = self._update

    def __call__(self, event: RunEvent) -> None:
        """Handle one event."""
        out = self
        if (
            isinstance(event, PlanProposed)
            and event.path == "1"
            and event.version == 1
            and self.show_root_plan
        ):
            tag = " [SIMULATED]" if self.simulated else ""
            out.print(plan_tree(Plan.model_validate(event.plan), title=f"plan for node 1{tag}"))
        elif isinstance(event, PlanDecided):
            self._decided(event)
        elif isinstance(event, Replanned):
            line = Text("replan", style="yellow")
            line.append(f" node {event.path} v{event.version}: {plain(event.diff)}")
            out.print(line, highlight=False)
        elif isinstance(event, NodeStarted) and event.kind == "executor":
            if event.path == "1":
                self._budget(event)
            self.executors.add(event.path)
            self.started += 1
            self.running += 1
            if not self.live:
                self.live = True
                if self._held is None:
                    self.progress.start()
        elif isinstance(event, NodeStarted) and event.path == "1":
            self._budget(event)
        elif isinstance(event, NodeFinished):
            self._finished(event)
        elif isinstance(event, ModelCalled):
            # What the budget counts the call for: the events' figures are the settlements'.
            self.tokens += event.input_tokens + event.output_tokens
            if event.cost_usd:
                self.cost += event.cost_usd

    def _budget(self, root: NodeStarted) -> None:
        """Take the run's budget from its root's start (what the root was granted)."""
        self.limit_tokens = root.limit_tokens
        self.limit_usd = root.limit_usd

    def left(self) -> str:
        """What the run's budget has left, as the progress line shows it (``""`` without a
        budget): its allocation less what its calls have spent so far."""
        parts = []
        if self.limit_usd is not None:
            parts.append(money(max(0.0, self.limit_usd - self.cost)))
        if self.limit_tokens is not None:
            parts.append(f"{max(0, self.limit_tokens - self.tokens):,} tok")
        return f"  left {' / '.join(parts)}" if parts else ""

    def _update(self) -> None:
        """Give the progress line its figures: when it is drawn (ten times a second), not on
        every event, of which a run has several per step."""
        self.progress.update(
            self.task,
            total=max(self.started, 1),
            completed=self.finished,
            info=f"running {self.running}  cost {money(self.cost)}{self.left()}",
        )

    def print(self, *objects: Any, **options: Any) -> None:
        """Print above the progress line, or hold it back while a review is on screen."""
        if self._held is not None:
            self._held.append((objects, options))
        else:
            self.progress.console.print(*objects, **options)

    @contextmanager
    def suspended(self) -> Iterator[None]:
        """Stop the progress line and hold output back (a plan review is on screen)."""
        if self._held is not None:
            yield
            return
        self._held = []
        if self.live:
            self.progress.stop()
        try:
            yield
        finally:
            held, self._held = self._held, None
            for objects, options in held:
                self.progress.console.print(*objects, **options)
            if self.live:
                self.progress.start()

    def _decided(self, event: PlanDecided) -> None:
        out = self
        if event.decision == "pending":
            out.print(
                f"  plan {event.path} v{event.version} waits for a decision "
                f"({plain(event.decided_by)})",
                style="yellow",
                markup=False,
                highlight=False,
            )
        elif event.decision in ("invalid", "rejected"):
            why = "; ".join(event.problems) or event.note
            out.print(
                f"  plan {event.path} v{event.version} {event.decision}: {short(why, 150)}",
                style="yellow",
                markup=False,
                highlight=False,
            )
        elif event.path != "1":
            out.print(
                f"  plan {event.path} v{event.version} {event.decision} by "
                f"{plain(event.decided_by)}",
                style="dim",
                markup=False,
                highlight=False,
            )

    def _finished(self, event: NodeFinished) -> None:
        if event.status in ("failed", "budget_exhausted") and event.error:
            self.print(
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
