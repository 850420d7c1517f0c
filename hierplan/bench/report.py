"""Summaries of benchmark records: rich tables, Markdown, CSV, and the cost-vs-success plot.

Per suite and strategy, every metric is a mean with a 95% confidence interval over runs (Wilson
for the success rate, Student t otherwise). Paired differences compare each strategy with a
baseline on the same tasks and seeds (the success rates' difference with Newcombe's paired
interval; for the other metrics the mean difference with a t interval on the differences; and
the ratio of the means). Runs of one task share the task, so they are not independent; the
intervals treat runs as the unit and are therefore somewhat narrow when tasks differ a lot.

Everything made from simulated runs says SIMULATED, in the tables, the files and the plot.
"""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from hierplan.bench.harness import suites_of
from hierplan.bench.stats import (
    Estimate,
    mean_ci,
    paired_difference,
    paired_proportion_difference,
    wilson,
)
from hierplan.core.settings import STRATEGY_NAMES
from hierplan.errors import UserInputError
from hierplan.files import write_atomic
from hierplan.redact import redact

# (key, label); "success" is a proportion, the rest are means.
METRICS: tuple[tuple[str, str], ...] = (
    ("success", "success"),
    ("cost_usd", "cost USD"),
    ("latency_s", "latency s"),
    ("critical_path_s", "critical path s"),
    ("tokens", "tokens"),
    ("planner_input_tokens", "planner in"),
    ("planner_output_tokens", "planner out"),
    ("executor_input_tokens", "executor in"),
    ("executor_output_tokens", "executor out"),
    ("model_calls", "model calls"),
    ("tool_calls", "tool calls"),
    ("replans", "replans"),
    ("depth", "depth"),
)
PAIRED_METRICS: tuple[str, ...] = ("success", "cost_usd", "latency_s", "tokens")
# A run that raised has no usage to report: left out of the means, it would make a strategy
# that often errs look cheap and fast, so the tables say how many there were.
ERRORED_NOTE = (
    "runs that ended in an error: {}. They count as failures, but their cost, tokens and "
    "latency are unknown and left out of those figures."
)


@dataclass(slots=True)
class Cell:
    """One suite x strategy: its runs and an estimate per metric."""

    suite: str
    strategy: str
    runs: int
    estimates: dict[str, Estimate] = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class PairedRow:
    """``strategy`` minus ``baseline`` on the same tasks and seeds, for one metric."""

    suite: str
    strategy: str
    baseline: str
    metric: str
    difference: Estimate
    ratio: float | None


@dataclass(slots=True)
class Summary:
    """Everything the tables and the plot show."""

    cells: list[Cell]
    paired: list[PairedRow]
    baseline: str | None
    simulated: bool
    profile: str | None
    model: str
    errored: int = 0

    def label(self) -> str:
        """``SIMULATED (profile typical, model sim)``, ``SIMULATED (model function)`` for a test
        double (no noise profile shaped its answers) or ``model openai:...``."""
        if self.simulated and self.profile is not None:
            return f"SIMULATED (profile {self.profile}, model {self.model})"
        if self.simulated:
            return f"SIMULATED (model {self.model})"
        return f"model {self.model}"

    def cell(self, suite: str, strategy: str) -> Cell | None:
        """The cell of ``suite`` and ``strategy``, if it ran."""
        for c in self.cells:
            if c.suite == suite and c.strategy == strategy:
                return c
        return None


def _value(record: Mapping[str, Any], metric: str) -> float | None:
    value = record.get(metric)
    if metric == "success":
        return 1.0 if value else 0.0
    if value is None or (metric == "cost_usd" and record.get("unpriced_calls")):
        return None  # unknown (records written before unpriced runs were recorded so)
    return float(value)


def unpriced_runs(records: Iterable[Mapping[str, Any]]) -> int:
    """How many runs made calls of no known price (their cost is left out of the figures)."""
    return sum(1 for r in records if r.get("unpriced_calls"))


def errored_runs(records: Iterable[Mapping[str, Any]]) -> int:
    """How many runs raised instead of ending (they count as failures, and have no cost,
    tokens or latency to put in the figures)."""
    return sum(1 for r in records if r.get("status") == "error")


def _strategies(records: Iterable[Mapping[str, Any]]) -> list[str]:
    present = {r["strategy"] for r in records}
    return [s for s in STRATEGY_NAMES if s in present] + sorted(present - set(STRATEGY_NAMES))


def summarize(records: Sequence[Mapping[str, Any]], baseline: str | None = "react") -> Summary:
    """Estimates per suite and strategy, and paired differences against ``baseline``."""
    if not records:
        raise UserInputError("no benchmark records to summarise")
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(r["suite"], r["strategy"])].append(r)
    cells = []
    for suite in suites_of(records):
        for strategy in _strategies(records):
            runs = groups.get((suite, strategy))
            if not runs:
                continue
            cell = Cell(suite, strategy, len(runs))
            for metric, _ in METRICS:
                values = [v for r in runs if (v := _value(r, metric)) is not None]
                if metric == "success":
                    cell.estimates[metric] = wilson(int(sum(values)), len(values))
                else:
                    cell.estimates[metric] = mean_ci(values)
            cells.append(cell)
    paired = [] if baseline is None else _paired(groups, baseline)
    first = records[0]
    return Summary(
        cells=cells,
        paired=paired,
        baseline=baseline,
        simulated=any(bool(r.get("simulated")) for r in records),
        profile=first.get("profile"),
        model=str(first.get("model", "")),
        errored=errored_runs(records),
    )


def _paired(
    groups: Mapping[tuple[str, str], list[Mapping[str, Any]]], baseline: str
) -> list[PairedRow]:
    rows = []
    for (suite, strategy), runs in groups.items():
        base_runs = groups.get((suite, baseline))
        if strategy == baseline or not base_runs:
            continue
        base = {(r["task_id"], r["seed"]): r for r in base_runs}
        for metric in PAIRED_METRICS:
            a: list[float] = []
            b: list[float] = []
            for r in runs:
                other = base.get((r["task_id"], r["seed"]))
                if other is None:
                    continue
                x, y = _value(r, metric), _value(other, metric)
                if x is not None and y is not None:
                    a.append(x)
                    b.append(y)
            if not a:
                continue
            mean_b = math.fsum(b) / len(b)
            ratio = (math.fsum(a) / len(a)) / mean_b if mean_b else None
            difference = (
                paired_proportion_difference(a, b)
                if metric == "success"
                else paired_difference(a, b)
            )
            rows.append(PairedRow(suite, strategy, baseline, metric, difference, ratio))
    order = {s: i for i, s in enumerate(STRATEGY_NAMES)}
    rows.sort(key=lambda r: (r.suite, order.get(r.strategy, 99), PAIRED_METRICS.index(r.metric)))
    return rows


def number(value: float) -> str:
    """A compact number: 3 significant digits, thousands separated."""
    if math.isnan(value):
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def show(estimate: Estimate, metric: str, *, interval: bool = True) -> str:
    """An estimate as text: ``85% [72, 93]`` for success, ``1.2 [1.0, 1.4]`` otherwise."""
    if estimate.n == 0:
        return "-"
    if metric == "success":
        text = f"{estimate.mean * 100:.0f}%"
        if interval and estimate.has_interval:
            text += f" [{estimate.low * 100:.0f}, {estimate.high * 100:.0f}]"
        return text
    text = number(estimate.mean)
    if interval and estimate.has_interval:
        text += f" [{number(estimate.low)}, {number(estimate.high)}]"
    return text


def show_difference(row: PairedRow) -> str:
    """A paired difference as text, e.g. ``+12 pp [4, 20]`` or ``-0.31 [-0.4, -0.2]``."""
    d = row.difference
    if row.metric == "success":
        text = f"{d.mean * 100:+.0f} pp"
        if d.has_interval:
            text += f" [{d.low * 100:+.0f}, {d.high * 100:+.0f}]"
        return text
    text = f"{'+' if d.mean >= 0 else ''}{number(d.mean)}"
    if d.has_interval:
        text += f" [{number(d.low)}, {number(d.high)}]"
    return text


TABLE_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    # (metric, header, with interval)
    ("success", "success [95% CI]", True),
    ("cost_usd", "cost USD [95% CI]", True),
    ("latency_s", "latency s [95% CI]", True),
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
    ("tokens", "tokens", False),
    ("model_calls", "calls", False),
    ("tool_calls", "tools", False),
    ("replans", "replans", False),
    ("depth", "depth", False),
)


def rich_tables(summary: Summary, width: int | None = None) -> list[Table]:
    """One compact table per suite, then its paired differences (Markdown has every column).

    ``width``: a terminal's width, which each table fits by leaving out its last columns (its
    caption names them); ``None`` keeps every column, however wide the table is."""
    tables = []
    for suite in dict.fromkeys(c.suite for c in summary.cells):
        shown = len(TERMINAL_COLUMNS)
        table = _suite_table(summary, suite, shown)
        while width is not None and shown > 1 and natural_width(table) > width:
            shown -= 1
            table = _suite_table(summary, suite, shown)
        tables.append(table)
        rows = [r for r in summary.paired if r.suite == suite]
        if rows:
            tables.append(_paired_table(suite, rows, summary))
    return tables


def _suite_table(summary: Summary, suite: str, shown: int) -> Table:
    """``suite``'s table with the first ``shown`` of :data:`TERMINAL_COLUMNS`; no cell wraps
    (a figure cut in two reads as two figures)."""
    columns, left_out = TERMINAL_COLUMNS[:shown], TERMINAL_COLUMNS[shown:]
    caption = None
    if left_out:
        names = ", ".join(header for _, header, _ in left_out)
        caption = f"not shown at this width: {names} (summary.md has every column)"
    table = Table(
        title=f"{suite}: {summary.label()}",
        title_justify="left",
        caption=caption,
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
        console.width = max(width, natural_width(table))
        try:
            console.print(table)
        finally:
            console.width = width


def _paired_table(suite: str, rows: Sequence[PairedRow], summary: Summary) -> Table:
    table = Table(
        title=f"{suite}: vs {summary.baseline} on the same tasks and seeds ({summary.label()})",
        title_justify="left",
    )
    table.add_column("strategy")
    table.add_column("Δ success [95% CI]", justify="right")
    for metric in PAIRED_METRICS[1:]:
        table.add_column(f"{metric.split('_')[0]} ×", justify="right")
    for strategy in dict.fromkeys(r.strategy for r in rows):
        by_metric = {r.metric: r for r in rows if r.strategy == strategy}
        success = by_metric.get("success")
        cells = ["-" if success is None else show_difference(success)]
        for metric in PAIRED_METRICS[1:]:
            ratio = by_metric[metric].ratio if metric in by_metric else None
            cells.append("-" if ratio is None else f"{ratio:.2f}")
        table.add_row(strategy, *cells)
    return table


def markdown(summary: Summary, command: str | None = None) -> str:
    """The summary as Markdown: a table per suite and its paired differences, after the
    ``command`` that reproduces it, if given (redacted: ``--base-url`` may hold a password)."""
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
        "executor = execution-phase calls.\n"
    )
    if summary.errored:
        note = ERRORED_NOTE.format(summary.errored)
        out.write(f"\n{note[0].upper()}{note[1:]}\n")
    for suite in dict.fromkeys(c.suite for c in summary.cells):
        out.write(f"\n## {suite}\n\n")
        headers = ["strategy", "runs", *(h for _, h, _ in TABLE_COLUMNS)]
        out.write("| " + " | ".join(headers) + " |\n")
        out.write("|" + "---|" * len(headers) + "\n")
        for cell in (c for c in summary.cells if c.suite == suite):
            values = [show(cell.estimates[m], m, interval=i) for m, _, i in TABLE_COLUMNS]
            out.write("| " + " | ".join([cell.strategy, str(cell.runs), *values]) + " |\n")
        rows = [r for r in summary.paired if r.suite == suite]
        if rows:
            out.write(
                f"\nPaired with {summary.baseline} on the same tasks and seeds "
                "(difference [95% CI]; × is the ratio of means):\n\n"
            )
            out.write("| strategy | metric | difference | × |\n|---|---|---|---|\n")
            for r in rows:
                ratio = "" if r.ratio is None or r.metric == "success" else f"{r.ratio:.2f}"
                out.write(f"| {r.strategy} | {r.metric} | {show_difference(r)} | {ratio} |\n")
    return out.getvalue()


def write_csv(summary: Summary, summary_path: Path, paired_path: Path) -> None:
    """``summary.csv`` (one row per suite, strategy and metric) and ``paired.csv``."""
    head = ["simulated", "profile", "model"]
    meta = [str(summary.simulated).lower(), summary.profile or "", summary.model]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([*head, "suite", "strategy", "metric", "n", "mean", "ci_low", "ci_high"])
    for cell in summary.cells:
        for metric, _ in METRICS:
            e = cell.estimates[metric]
            writer.writerow([*meta, cell.suite, cell.strategy, metric, e.n, *_floats(e)])
    write_atomic(summary_path, buffer.getvalue())
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(
        [
            *head,
            "suite",
            "strategy",
            "baseline",
            "metric",
            "n",
            "mean_difference",
            "ci_low",
            "ci_high",
            "ratio_of_means",
        ]
    )
    for r in summary.paired:
        e = r.difference
        ratio = "" if r.ratio is None else repr(r.ratio)
        writer.writerow([*meta, r.suite, r.strategy, r.baseline, r.metric, e.n, *_floats(e), ratio])
    write_atomic(paired_path, buffer.getvalue())


def _floats(e: Estimate) -> list[str]:
    return ["" if math.isnan(x) else repr(x) for x in (e.mean, e.low, e.high)]


def pareto_frontier(points: Mapping[str, tuple[float, float]]) -> list[str]:
    """Names of the points (cost, success) no other point beats on both, cheapest first.

    A point is dominated when another costs no more and succeeds no less, and is strictly
    better in one of the two.
    """
    names = []
    for name, (cost, success) in points.items():
        dominated = any(
            c <= cost and s >= success and (c < cost or s > success)
            for other, (c, s) in points.items()
            if other != name
        )
        if not dominated:
            names.append(name)
    return sorted(names, key=lambda n: (points[n][0], -points[n][1]))


def plot_cost_success(summary: Summary, path: Path) -> Path:
    """A PNG of mean cost per run against success rate, per suite, with the Pareto frontier.

    Needs matplotlib (``pip install 'hierplan[bench]'``).
    """
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    except ImportError:
        raise UserInputError(
            "the cost-vs-success plot needs matplotlib: pip install 'hierplan[bench]' "
            "(or pass --no-plot)"
        ) from None
    suites = list(dict.fromkeys(c.suite for c in summary.cells))
    if not any(c.estimates["cost_usd"].mean > 0 for c in summary.cells):
        raise UserInputError("no cost-vs-success plot: no run has a known cost above zero")
    cols = min(2, len(suites))
    rows = math.ceil(len(suites) / cols)
    figure = Figure(figsize=(6.0 * cols, 4.2 * rows + 0.8), layout="constrained")
    axes = figure.subplots(rows, cols, squeeze=False)
    strategies = list(dict.fromkeys(c.strategy for c in summary.cells))
    colours = {s: f"C{i}" for i, s in enumerate(strategies)}
    for ax, suite in zip(axes.flat, suites, strict=False):
        cells = [c for c in summary.cells if c.suite == suite]
        points = {
            c.strategy: (c.estimates["cost_usd"].mean, c.estimates["success"].mean)
            for c in cells
            if c.estimates["cost_usd"].mean > 0  # unknown (nan) or free: no place on a log axis
        }
        ax.set_title(suite)
        if not points:
            ax.text(0.5, 0.5, "no run with a known cost", ha="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        for c in cells:
            if c.strategy not in points:
                continue
            cost, success = points[c.strategy]
            e = c.estimates["success"]
            err = [[success - e.low], [e.high - success]] if e.has_interval else None
            ax.errorbar(
                [cost],
                [success],
                yerr=err,
                fmt="o",
                capsize=3,
                color=colours[c.strategy],
                label=c.strategy,
            )
        front = pareto_frontier(points)
        xs, ys = [points[n][0] for n in front], [points[n][1] for n in front]
        ax.plot(xs, ys, "k--", lw=1, drawstyle="steps-post", label="Pareto frontier")
        ax.scatter(xs, ys, s=160, facecolors="none", edgecolors="k", linewidths=1)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.2g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("mean cost per run (USD, log scale)")
        ax.set_ylabel("success rate (95% CI)")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(suites) :]:
        ax.set_visible(False)
    handles, labels = [], []
    for ax in axes.flat:  # the first panel with points (another may have none)
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            break
    figure.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 4 * cols))
    figure.suptitle(f"Cost vs success — {summary.label()}")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path
