"""What ``hierplan batch`` shows while it runs, and the summary at the end."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from hierplan.units import pico_to_usd

STATE_STYLES = MappingProxyType({"succeeded": "green", "failed": "red", "skipped": "yellow"})


@dataclass(slots=True)
class Tally:
    """The batch's figures for the display and the summary."""

    total: int
    counts: dict[str, int]
    spent_tokens: int
    spent_pico: int
    limit_tokens: int | None
    limit_pico: int | None
    started: float = field(default_factory=time.monotonic)
    finished_now: int = 0  # goals finished by this process (for the throughput)

    def remaining(self) -> str:
        """What is left of the budget, as text."""
        parts = []
        if self.limit_pico is not None:
            parts.append(f"${pico_to_usd(max(0, self.limit_pico - self.spent_pico)):.4f}")
        if self.limit_tokens is not None:
            parts.append(f"{max(0, self.limit_tokens - self.spent_tokens):,} tokens")
        return " / ".join(parts) or "unlimited"

    def spent(self) -> str:
        """What was spent, as text."""
        return f"${pico_to_usd(self.spent_pico):.4f} / {self.spent_tokens:,} tokens"

    def throughput(self) -> float:
        """Goals finished per second by this process."""
        elapsed = time.monotonic() - self.started
        return self.finished_now / elapsed if elapsed > 0 else 0.0


class BatchDisplay:
    """A live panel: goals done / failed / skipped / running, spent and remaining budget, and
    throughput; one line per finished goal above it."""

    def __init__(self, console: Console, tally: Tally) -> None:
        self.console = console
        self.tally = tally
        self.progress = Progress(
            TextColumn("[bold]goals"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        done = sum(tally.counts.get(s, 0) for s in STATE_STYLES)
        self.task = self.progress.add_task("goals", total=tally.total, completed=done)
        # Drawn anew at every refresh, so the elapsed time and the throughput move on between
        # the moments the batch updates the tally.
        self.live = Live(
            console=console, refresh_per_second=4, transient=False, get_renderable=self._render
        )

    def __enter__(self) -> BatchDisplay:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.refresh()
        self.live.__exit__(None, None, None)
        if not self.console.is_terminal:
            # Rich leaves the last frame without a line end when it is not drawing in place:
            # what is printed next would run on from it.
            self.console.line()

    def _render(self) -> Group:
        t = self.tally
        c = t.counts
        line = Text.assemble(
            ("done ", "bold"),
            (str(c.get("succeeded", 0)), "green"),
            ("  failed ", "bold"),
            (str(c.get("failed", 0)), "red"),
            ("  skipped ", "bold"),
            (str(c.get("skipped", 0)), "yellow"),
            ("  running ", "bold"),
            str(c.get("running", 0)),
            ("  spent+held ", "bold"),  # what running goals hold counts until they settle
            t.spent(),
            ("  remaining ", "bold"),
            t.remaining(),
            ("  throughput ", "bold"),
            f"{t.throughput():.2f} goals/s",
        )
        return Group(self.progress, line)

    def refresh(self) -> None:
        """Redraw with the tally's current figures."""
        done = sum(self.tally.counts.get(s, 0) for s in STATE_STYLES)
        self.progress.update(self.task, completed=done)
        self.live.refresh()

    def goal_done(self, goal_id: str, state: str, status: str, detail: str) -> None:
        """Print one finished goal above the panel."""
        style = STATE_STYLES.get(state, "")
        shown = "" if status == state else f"{status}  "  # "failed  g1  partial", not twice
        self.console.print(
            Text.assemble((f"{state:9} ", style), f"{goal_id}  {shown}", (detail, "dim")),
            highlight=False,
        )
        self.refresh()


def summary_table(summary: dict[str, Any]) -> Table:
    """The end-of-batch summary as a table."""
    table = Table(title="batch summary", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    counts = summary["counts"]
    table.add_row(
        "goals",
        f"{summary['goals']} ({', '.join(f'{k} {v}' for k, v in counts.items() if v)})",
    )
    simulated = summary.get("simulated_goals", 0)
    if simulated:
        table.add_row(
            "model",
            f"offline simulator for {simulated} of {summary['goals']} goals [SIMULATED]",
        )
    table.add_row("spent", f"${summary['spent_usd']:.6f}, {summary['spent_tokens']:,} tokens")
    limit = summary["budget"]
    table.add_row(
        "budget",
        " / ".join(
            p
            for p in (
                f"${limit['usd']:g}" if limit["usd"] is not None else "",
                f"{limit['tokens']:,} tokens" if limit["tokens"] is not None else "",
            )
            if p
        )
        or "unlimited",
    )
    if summary["retried_spent_usd"] or summary["retried_spent_tokens"]:
        table.add_row(
            "of which by interrupted attempts",
            f"${summary['retried_spent_usd']:.6f}, {summary['retried_spent_tokens']:,} tokens",
        )
    table.add_row("wall time", f"{summary['wall_time_s']:.1f} s")
    table.add_row("throughput", f"{summary['goals_per_s']:.2f} goals/s")
    return table
