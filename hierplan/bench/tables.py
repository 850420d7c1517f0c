"""A summary as text: the terminal's tables (each fits its width) and ``summary.md``.

Each suite gets its table of means, its paired table against the baseline (ratios and
differences with task-clustered bootstrap intervals, McNemar p-values with Holm's adjustment)
and, for a public task set, the published figures with the setting each was measured in.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from types import MappingProxyType

from rich.console import Console
from rich.table import Table

from hierplan.bench.base import Published
from hierplan.bench.paired import ALL, BOTH_SOLVED, PairedRow, show_p
from hierplan.bench.report import (
    CPU_ONLY_NOTE,
    ERRORED_NOTE,
    Summary,
    row_label,
    show,
    show_difference,
    show_ratio,
)
from hierplan.redact import redact

TABLE_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    # (metric, header, with interval)
    ("success", "success [95% CI]", True),
    ("cost_usd", "cost USD [95% CI]", True),
    ("latency_s", "latency s [95% CI]", True),
    ("latency_solved", "latency s, solved", False),
    ("critical_path_s", "crit. path s", False),
    ("planner_input_tokens", "planner in", False),
    ("planner_output_tokens", "planner out", False),
    ("executor_input_tokens", "executor in", False),
    ("executor_output_tokens", "executor out", False),
    ("model_calls", "calls", False),
    ("tool_calls", "tools", False),
    ("replans", "replans", False),
    ("depth", "depth", False),
)

TERMINAL_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("success", "success [95% CI]", True),
    ("cost_usd", "USD/run", False),
    ("latency_s", "latency s", False),
    ("latency_solved", "lat. solved", False),
    ("tokens", "tokens", False),
    ("model_calls", "calls", False),
    ("tool_calls", "tools", False),
    ("replans", "replans", False),
    ("depth", "depth", False),
)

# The paired table's columns: (metric, subset, what, header).
PAIRED_COLUMNS: tuple[tuple[str, str, str, str], ...] = (
    ("success", ALL, "difference", "Δ success [95% CI]"),
    ("success", ALL, "p", "p (Holm)"),
    ("cost_usd", ALL, "ratio", "cost × [95% CI]"),
    ("latency_s", ALL, "ratio", "latency × [95% CI]"),
    ("latency_s", BOTH_SOLVED, "ratio", "latency ×, both solved"),
    ("cost_usd", BOTH_SOLVED, "ratio", "cost ×, both solved"),
    ("tokens", ALL, "ratio", "tokens ×"),
)

OUTCOME_LABELS: Mapping[str, str] = MappingProxyType(
    {
        "success": "success",
        "goal_reached_gave_up": "goal reached but gave up",
        "claimed_success": "claimed success, goal not reached",
        "failed": "failed",
        "error": "error",
    }
)


def _fitted(build: Callable[[int], Table], count: int, width: int | None) -> Table:
    """The table ``build(shown)`` with the most of its ``count`` columns that fits ``width``
    (every column when ``width`` is ``None``)."""
    shown = count
    table = build(shown)
    while width is not None and shown > 1 and natural_width(table) > width:
        shown -= 1
        table = build(shown)
    return table


PUBLISHED_WIDTH = 100
"""The width a published figures' table wraps its text to, even when piped."""


def rich_tables(summary: Summary, width: int | None = None) -> list[Table]:
    """Per suite: its table, its paired table and its published figures (Markdown has every
    column). ``width``: a terminal's width, which each table fits by leaving out its last
    columns (its caption names them); ``None`` keeps every column, however wide."""
    tables = []
    for suite in dict.fromkeys(c.suite for c in summary.cells):
        suite_table = partial(_suite_table, summary, suite)
        tables.append(_fitted(suite_table, len(TERMINAL_COLUMNS), width))
        rows = [r for r in summary.paired if r.suite == suite]
        if rows:
            paired_table = partial(_paired_table, suite, rows, summary)
            tables.append(_fitted(paired_table, len(PAIRED_COLUMNS), width))
        if summary.published.get(suite):
            tables.append(_published_table(summary, suite))
    return tables


def _left_out(headers: Sequence[str]) -> str | None:
    if not headers:
        return None
    return f"not shown at this width: {', '.join(headers)} (summary.md has every column)"


def _suite_table(summary: Summary, suite: str, shown: int) -> Table:
    """``suite``'s table with the first ``shown`` of :data:`TERMINAL_COLUMNS`; no cell wraps
    (a figure cut in two reads as two figures)."""
    columns, left_out = TERMINAL_COLUMNS[:shown], TERMINAL_COLUMNS[shown:]
    table = Table(
        title=f"{suite}: {summary.label()}",
        title_justify="left",
        caption=_left_out([header for _, header, _ in left_out]),
        caption_justify="left",
    )
    table.add_column("strategy", no_wrap=True)
    table.add_column("runs", justify="right", no_wrap=True)
    for _, header, _ in columns:
        table.add_column(header, justify="right", no_wrap=True)
    for cell in (c for c in summary.cells if c.suite == suite):
        table.add_row(
            cell.strategy,
            str(cell.runs),
            *(show(cell.estimates[m], m, interval=i) for m, _, i in columns),
        )
    return table


def natural_width(table: Table) -> int:
    """The columns ``table`` takes when nothing in it is squeezed."""
    return Console(width=_UNLIMITED).measure(table).maximum


_UNLIMITED = 10_000


def print_tables(summary: Summary, console: Console) -> None:
    """Print :func:`rich_tables`: on a terminal each fits its width; piped (to a file, a pager,
    a CI log) each keeps every column at full width, nothing cut or wrapped."""
    if console.is_terminal:
        for table in rich_tables(summary, console.width):
            console.print(table)
        return
    width = console.width
    for table in rich_tables(summary):
        # Figures are never cut or wrapped; a published figure's prose may wrap.
        wraps = table.title is not None and "published figures" in str(table.title)
        console.width = max(width, PUBLISHED_WIDTH if wraps else natural_width(table))
        try:
            console.print(table)
        finally:
            console.width = width


def _paired_cell(
    rows: dict[tuple[str, str], PairedRow], metric: str, subset: str, what: str
) -> str:
    row = rows.get((metric, subset))
    if row is None:
        return "-"
    if what == "difference":
        return show_difference(row)
    if what == "p":
        test = row.mcnemar
        return "-" if test is None else show_p(test.p_holm)
    return show_ratio(row.ratio, interval=metric != "tokens")


def _paired_table(suite: str, rows: Sequence[PairedRow], summary: Summary, shown: int) -> Table:
    columns, left_out = PAIRED_COLUMNS[:shown], PAIRED_COLUMNS[shown:]
    table = Table(
        title=f"{suite}: vs {summary.baseline} on the same tasks and seeds ({summary.label()})",
        title_justify="left",
        caption=_left_out([header for *_, header in left_out]),
        caption_justify="left",
    )
    table.add_column("strategy", no_wrap=True)
    for *_, header in columns:
        table.add_column(header, justify="right", no_wrap=True)
    for strategy in dict.fromkeys(r.strategy for r in rows):
        by_metric = {(r.metric, r.subset): r for r in rows if r.strategy == strategy}
        table.add_row(strategy, *(_paired_cell(by_metric, m, s, w) for m, s, w, _ in columns))
    return table


def published_note(summary: Summary, suite: str, figure: Published) -> str:
    """How ``figure`` compares with this bench's runs of ``suite``: the same tasks (split) or
    not, the same setting or not."""
    split = summary.splits.get(suite)
    tasks = "same tasks"
    if figure.split is not None and split is not None and figure.split != split:
        tasks = f"other tasks (this bench ran the {split} split)"
    if figure.suite == suite:
        return f"{tasks}, same setting"
    return f"{tasks}, other setting"


def _published_table(summary: Summary, suite: str) -> Table:
    figures = summary.published[suite]
    sources = "; ".join(dict.fromkeys(f"{f.tasks} ({f.source})" for f in figures))
    table = Table(
        title=f"{suite}: published figures on its tasks (not run here)",
        title_justify="left",
        caption=f"Measured on {sources}. This bench ran {suite}: "
        f"{summary.settings.get(suite, 'its own setting')}.",
        caption_justify="left",
    )
    table.add_column("model, method")
    table.add_column("success", justify="right", no_wrap=True)
    table.add_column("measured in")
    table.add_column("vs this bench")
    for figure in figures:
        table.add_row(
            f"{figure.model}, {figure.method}",
            f"{figure.success * 100:.1f}%",
            figure.setting,
            published_note(summary, suite, figure),
        )
    return table


def _notes(summary: Summary) -> list[str]:
    notes = list(summary.details)
    if summary.versions:
        notes.append("Code: " + "; ".join(summary.versions) + ".")
    if summary.cpu_only:
        notes.append(CPU_ONLY_NOTE[0].upper() + CPU_ONLY_NOTE[1:] + ".")
    rule = "count as successes" if summary.count_gave_up else "count as failures"
    notes.append(
        "Success: the verifier found the goal reached and the agent reported success. Runs "
        f"that reached the goal but gave up {rule}."
    )
    if summary.errored:
        note = ERRORED_NOTE.format(summary.errored)
        notes.append(note[0].upper() + note[1:])
    if summary.not_started:
        notes.append(
            f"Runs the budget could not start: {summary.not_started}. They are in no figure."
        )
    return notes


def markdown(summary: Summary, command: str | None = None) -> str:
    """The summary as Markdown: per suite its table, paired comparisons, published figures,
    after the ``command`` that reproduces it, if given (redacted: ``--base-url`` may hold a
    password)."""
    out = io.StringIO()
    out.write(f"# Strategy benchmark — {summary.label()}\n\n")
    if summary.simulated:
        # Only the simulator has a noise profile; other simulated answers come from a test double.
        source = "the offline simulator" if summary.profile is not None else "a test double"
        out.write(
            f"All figures come from {source}: token counts, costs and latencies "
            "are simulated, not measured on a real model.\n\n"
        )
    if command:
        out.write(f"Command:\n\n```\n{redact(command)}\n```\n\n")
    out.write(
        "Means over runs with 95% confidence intervals (Wilson for success, Student t "
        "otherwise). Cost is USD per run; tokens are per run, planner = planning-phase calls, "
        "executor = execution-phase calls.\n\n"
    )
    out.write("\n\n".join(_notes(summary)) + "\n")
    for suite in dict.fromkeys(c.suite for c in summary.cells):
        out.write(f"\n## {suite}\n\n")
        _suite_markdown(out, summary, suite)
        rows = [r for r in summary.paired if r.suite == suite]
        if rows:
            _paired_markdown(out, summary, rows)
        if summary.published.get(suite):
            _published_markdown(out, summary, suite)
    return out.getvalue()


def _suite_markdown(out: io.StringIO, summary: Summary, suite: str) -> None:
    headers = ["strategy", "runs", *(h for _, h, _ in TABLE_COLUMNS)]
    out.write("| " + " | ".join(headers) + " |\n")
    out.write("|" + "---|" * len(headers) + "\n")
    cells = [c for c in summary.cells if c.suite == suite]
    for cell in cells:
        values = [show(cell.estimates[m], m, interval=i) for m, _, i in TABLE_COLUMNS]
        out.write("| " + " | ".join([cell.strategy, str(cell.runs), *values]) + " |\n")
    out.write("\nOutcomes:\n\n")
    for cell in cells:
        counts = ", ".join(f"{OUTCOME_LABELS.get(k, k)} {v}" for k, v in cell.outcomes.items())
        out.write(f"- {cell.strategy}: {counts}\n")


def _paired_markdown(out: io.StringIO, summary: Summary, rows: Sequence[PairedRow]) -> None:
    out.write(
        f"\nPaired with {summary.baseline} on the same tasks and seeds: difference of means "
        "and ratio of means (strategy / baseline), each with a 95% task-clustered bootstrap "
        "interval (a task's seeds resampled together); success with McNemar's exact test, "
        "p-values adjusted with Holm's method across this table's comparisons:\n\n"
    )
    out.write(
        "| strategy | metric | pairs | tasks | difference [95% CI] | ratio [95% CI] "
        "| discordant | McNemar p | Holm p |\n|---|---|---|---|---|---|---|---|---|\n"
    )
    for r in rows:
        test = r.mcnemar
        tested = (
            ["", "", ""]
            if test is None
            else [f"{test.only_strategy} / {test.only_baseline}", show_p(test.p_value),
                  show_p(test.p_holm)]
        )  # fmt: skip
        cells = [r.strategy, row_label(r), str(r.difference.n), str(r.tasks),
                 show_difference(r), show_ratio(r.ratio), *tested]  # fmt: skip
        out.write("| " + " | ".join(cells) + " |\n")


def _published_markdown(out: io.StringIO, summary: Summary, suite: str) -> None:
    out.write("\nPublished figures on the same tasks (not run here):\n\n")
    out.write("| model | method | success | measured in | tasks | source | vs this bench |\n")
    out.write("|---|---|---|---|---|---|---|\n")
    for f in summary.published[suite]:
        cells = [f.model, f.method, f"{f.success * 100:.1f}%", f.setting, f.tasks, f.source,
                 published_note(summary, suite, f)]  # fmt: skip
        out.write("| " + " | ".join(cells) + " |\n")
