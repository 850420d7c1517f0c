"""The benchmark's figure: per suite, cost against success (with the Pareto frontier) and latency
against success, each point with its 95% intervals on both axes.

A strategy has one colour in every panel and every figure, whatever else ran: its place among
the installed strategies (the built-in ones first, in their fixed order) picks it. Needs
matplotlib (``pip install 'hierplan[bench]'``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hierplan.bench.stats import Estimate
from hierplan.core.settings import strategy_names
from hierplan.errors import UserInputError

if TYPE_CHECKING:
    from hierplan.bench.report import Cell, Summary

PALETTE = 10
"""matplotlib's default colour cycle (``C0`` ... ``C9``)."""


def strategy_colour(strategy: str) -> str:
    """The colour of ``strategy`` in every figure: ``C<i>`` for its place among the installed
    strategies (an unknown one gets a colour from its name, the same every time)."""
    names = strategy_names()
    if strategy in names:
        return f"C{names.index(strategy) % PALETTE}"
    return f"C{sum(strategy.encode()) % PALETTE}"


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


def _error(e: Estimate) -> list[list[float]] | None:
    """An error bar's lengths below and above the mean (none without an interval)."""
    if not e.has_interval:
        return None
    return [[max(0.0, e.mean - e.low)], [max(0.0, e.high - e.mean)]]


def _point(ax: Any, cell: Cell, metric: str) -> None:
    """``cell``'s mean ``metric`` against its success rate, with both intervals."""
    x, y = cell.estimates[metric], cell.estimates["success"]
    ax.errorbar(
        [x.mean],
        [y.mean],
        xerr=_error(x),
        yerr=_error(y),
        fmt="o",
        capsize=3,
        color=strategy_colour(cell.strategy),
        label=cell.strategy,
    )


def _cost_panel(ax: Any, suite: str, cells: list[Cell]) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    # Unknown (nan) or free: no place on a log axis.
    shown = [c for c in cells if c.estimates["cost_usd"].mean > 0]
    ax.set_title(f"{suite}: cost")
    if not shown:
        ax.text(0.5, 0.5, "no run with a known cost", ha="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    for cell in shown:
        _point(ax, cell, "cost_usd")
    points = {
        c.strategy: (c.estimates["cost_usd"].mean, c.estimates["success"].mean) for c in shown
    }
    front = pareto_frontier(points)
    xs, ys = [points[n][0] for n in front], [points[n][1] for n in front]
    ax.plot(xs, ys, "k--", lw=1, drawstyle="steps-post", label="Pareto frontier")
    ax.scatter(xs, ys, s=160, facecolors="none", edgecolors="k", linewidths=1)
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.2g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("mean cost per run (USD, log scale, 95% CI)")


def _latency_panel(ax: Any, suite: str, cells: list[Cell], cpu_only: bool) -> None:
    shown = [c for c in cells if not math.isnan(c.estimates["latency_s"].mean)]
    ax.set_title(f"{suite}: latency")
    if not shown:
        ax.text(0.5, 0.5, "no run with a known latency", ha="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    for cell in shown:
        _point(ax, cell, "latency_s")
    clock = "CPU time only" if cpu_only else "wall clock"
    ax.set_xlabel(f"mean latency per run (s, {clock}, 95% CI)")


def plot_cost_success(summary: Summary, path: Path) -> Path:
    """A PNG with, per suite, cost against success and latency against success."""
    if not any(c.estimates["cost_usd"].mean > 0 for c in summary.cells):
        raise UserInputError("no cost-vs-success plot: no run has a known cost above zero")
    figure = cost_latency_figure(summary)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path


def cost_latency_figure(summary: Summary) -> Any:
    """The figure (a matplotlib ``Figure``): a row per suite, cost and latency panels."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise UserInputError(
            "the cost-vs-success plot needs matplotlib: pip install 'hierplan[bench]' "
            "(or pass --no-plot)"
        ) from None
    suites = list(dict.fromkeys(c.suite for c in summary.cells))
    figure = Figure(figsize=(12.0, 4.2 * len(suites) + 0.8), layout="constrained")
    axes = figure.subplots(len(suites), 2, squeeze=False)
    for row, suite in zip(axes, suites, strict=True):
        cells = [c for c in summary.cells if c.suite == suite]
        _cost_panel(row[0], suite, cells)
        _latency_panel(row[1], suite, cells, summary.cpu_only)
        for ax in row:
            ax.set_ylabel("success rate (95% CI)")
            ax.set_ylim(-0.05, 1.05)
            ax.grid(alpha=0.3)
    handles: dict[str, Any] = {}
    for ax in axes.flat:  # every strategy once, whichever panels it has points in
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    figure.legend(
        list(handles.values()),
        list(handles),
        loc="outside lower center",
        ncol=min(len(handles), 8),
    )
    figure.suptitle(f"Cost and latency vs success — {summary.label()}")
    return figure
