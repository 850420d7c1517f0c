"""Summaries of benchmark records, and their CSV files (the terminal tables and Markdown are in
:mod:`hierplan.bench.tables`, the plot in :mod:`hierplan.bench.plot`).

Per suite and strategy, every metric is a mean with a 95% confidence interval over runs (Wilson
for the success rate, Student t otherwise). Paired comparisons against a baseline
(:mod:`hierplan.bench.paired`) give differences and ratios of means with task-clustered
bootstrap intervals, and McNemar's exact test of paired success with Holm's adjustment. A suite
of a public task set shows the published figures for its tasks beside its table, with the
setting each was measured in.

Everything made from simulated runs says SIMULATED, in the tables, the files and the plot.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hierplan.bench.base import Published
from hierplan.bench.harness import suites_of
from hierplan.bench.paired import BOTH_SOLVED, PairedRow, compare, metric_value, with_holm
from hierplan.bench.provenance import describe_version
from hierplan.bench.records import OUTCOMES, counts_as_success, latest_records, started
from hierplan.bench.stats import BOOTSTRAP_REPS, Estimate, mean_ci, wilson
from hierplan.bench.suites import get_suite
from hierplan.core.settings import strategy_names
from hierplan.errors import UserInputError
from hierplan.files import write_atomic

__all__ = [
    "CPU_ONLY_NOTE",
    "ERRORED_NOTE",
    "METRICS",
    "Cell",
    "Summary",
    "errored_runs",
    "not_started_runs",
    "number",
    "show",
    "show_difference",
    "show_ratio",
    "summarize",
    "unpriced_runs",
    "write_csv",
]

# (key, label); "success" is a proportion, the rest are means. "latency_solved" is the
# latency of the runs that succeeded only.
METRICS: tuple[tuple[str, str], ...] = (
    ("success", "success"),
    ("cost_usd", "cost USD"),
    ("latency_s", "latency s"),
    ("latency_solved", "latency s, solved runs"),
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
# A run that raised has no usage to report: left out of the means, it would make a strategy
# that often errs look cheap and fast, so the tables say how many there were.
ERRORED_NOTE = (
    "runs that ended in an error: {}. They count as failures, but their cost, tokens and "
    "latency are unknown and left out of those figures."
)
CPU_ONLY_NOTE = (
    "latencies are CPU time only: the latency scale was 0, so no simulated model or tool time "
    "was waited for"
)


@dataclass(slots=True)
class Cell:
    """One suite x strategy: its runs, an estimate per metric and a count per outcome."""

    suite: str
    strategy: str
    runs: int
    estimates: dict[str, Estimate] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)


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
    not_started: int = 0
    count_gave_up: bool = False
    versions: list[str] = field(default_factory=list)
    cpu_only: bool = False
    details: list[str] = field(default_factory=list)
    """What the records say they were made with: the model's price, the simulator's knobs."""
    published: dict[str, tuple[Published, ...]] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)
    splits: dict[str, str | None] = field(default_factory=dict)

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


def unpriced_runs(records: Iterable[Mapping[str, Any]]) -> int:
    """How many runs made calls of no known price (their cost is left out of the figures)."""
    return sum(1 for r in records if r.get("unpriced_calls"))


def errored_runs(records: Iterable[Mapping[str, Any]]) -> int:
    """How many runs raised instead of ending (they count as failures, and have no cost,
    tokens or latency to put in the figures)."""
    return sum(1 for r in records if r.get("status") == "error")


def not_started_runs(records: Iterable[Mapping[str, Any]]) -> int:
    """How many runs the bench's budget could not start (in no figure)."""
    return sum(1 for r in latest_records(records) if not started(r))


def _strategies(records: Iterable[Mapping[str, Any]]) -> list[str]:
    present = {r["strategy"] for r in records}
    order = strategy_names()
    return [s for s in order if s in present] + sorted(present - set(order))


def _cell(suite: str, strategy: str, runs: Sequence[Mapping[str, Any]], gave_up: bool) -> Cell:
    cell = Cell(suite, strategy, len(runs))
    solved = [r for r in runs if counts_as_success(r, gave_up)]
    for metric, _ in METRICS:
        source, key = (solved, "latency_s") if metric == "latency_solved" else (runs, metric)
        values = [v for r in source if (v := metric_value(r, key, gave_up)) is not None]
        if metric == "success":
            cell.estimates[metric] = wilson(int(sum(values)), len(values))
        else:
            cell.estimates[metric] = mean_ci(values)
    outcomes = Counter(str(r.get("outcome") or ("success" if r.get("success") else "failed"))
                       for r in runs)  # fmt: skip
    cell.outcomes = {o: outcomes[o] for o in OUTCOMES if outcomes[o]}
    return cell


def summarize(
    records: Sequence[Mapping[str, Any]],
    baseline: str | None = "react",
    *,
    count_gave_up: bool = False,
    reps: int = BOOTSTRAP_REPS,
) -> Summary:
    """Estimates per suite and strategy, and paired comparisons against ``baseline``.

    ``count_gave_up`` counts a run that gave up with the goal reached as a success (by default
    a failure). Runs the budget could not start are left out of every figure.
    """
    if not records:
        raise UserInputError("no benchmark records to summarise")
    latest = latest_records(records)
    ran = [r for r in latest if started(r)]
    if not ran:
        raise UserInputError("no benchmark run started: nothing to summarise")
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for r in ran:
        groups[(r["suite"], r["strategy"])].append(r)
    cells = [
        _cell(suite, strategy, groups[(suite, strategy)], count_gave_up)
        for suite in suites_of(ran)
        for strategy in _strategies(ran)
        if groups.get((suite, strategy))
    ]
    paired = [] if baseline is None else _paired(groups, baseline, count_gave_up, reps)
    first = ran[0]
    summary = Summary(
        cells=cells,
        paired=paired,
        baseline=baseline,
        simulated=any(bool(r.get("simulated")) for r in ran),
        profile=first.get("profile"),
        model=str(first.get("model", "")),
        errored=errored_runs(ran),
        not_started=len(latest) - len(ran),
        count_gave_up=count_gave_up,
        versions=sorted({describe_version(r) for r in ran if "hierplan_version" in r}),
        cpu_only=any(bool(r.get("latency_cpu_only")) for r in ran),
        details=made_with(ran),
    )
    _add_suite_facts(summary, ran)
    return summary


def made_with(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The model's price and the simulator's knobs and latency scale the records name (each
    different one once)."""
    lines: dict[str, None] = {}
    for r in records:
        if "price_model" in r:
            price = (
                "no known price"
                if r.get("price_in_per_mtok") is None
                else f"${r['price_in_per_mtok']:g} / ${r['price_out_per_mtok']:g} per 1M input "
                f"/ output tokens (as of {r.get('price_as_of')}, price table "
                f"{r.get('price_table')})"
            )
            lines[f"Model {r.get('model')} priced as {r['price_model']}: {price}."] = None
        knobs = {k.removeprefix("sim_"): v for k, v in r.items() if k.startswith("sim_")}
        knobs.pop("seed", None)
        if r.get("profile") is not None and knobs:
            shown = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                              for k, v in knobs.items())  # fmt: skip
            lines[
                f"Simulator profile {r['profile']}: {shown}; latency scale "
                f"{r.get('latency_scale')}."
            ] = None
    return list(lines)


def _add_suite_facts(summary: Summary, records: Sequence[Mapping[str, Any]]) -> None:
    """Each suite's published figures, setting and split (a suite no longer installed has
    none)."""
    for name in suites_of(records):
        split = next((r.get("split") for r in records if r["suite"] == name), None)
        summary.splits[name] = split
        try:
            suite = get_suite(name)
        except UserInputError:
            continue
        summary.published[name] = suite.published
        summary.settings[name] = suite.setting


def _paired(
    groups: Mapping[tuple[str, str], list[Mapping[str, Any]]],
    baseline: str,
    count_gave_up: bool,
    reps: int,
) -> list[PairedRow]:
    rows: list[PairedRow] = []
    for (suite, strategy), runs in groups.items():
        base_runs = groups.get((suite, baseline))
        if strategy == baseline or not base_runs:
            continue
        rows += compare(
            suite, strategy, baseline, runs, base_runs, count_gave_up=count_gave_up, reps=reps
        )
    order = {s: i for i, s in enumerate(strategy_names())}
    rows.sort(key=lambda r: (r.suite, order.get(r.strategy, len(order))))  # stable: metrics
    return with_holm(rows)


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


def show_ratio(ratio: Estimate, *, interval: bool = True) -> str:
    """A ratio of means as text, e.g. ``2.10× [1.80, 2.50]`` (``-`` when unknown)."""
    if ratio.n == 0 or math.isnan(ratio.mean):
        return "-"
    text = f"{ratio.mean:.2f}×"
    if interval and ratio.has_interval:
        text += f" [{ratio.low:.2f}, {ratio.high:.2f}]"
    return text


def row_label(row: PairedRow) -> str:
    """``latency_s`` or ``latency_s, both solved``."""
    return row.metric if row.subset != BOTH_SOLVED else f"{row.metric}, both solved"


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
        [*head, "suite", "strategy", "baseline", "metric", "pairs", "n", "tasks",
         "mean_difference", "ci_low", "ci_high", "ratio_of_means", "ratio_ci_low",
         "ratio_ci_high", "only_strategy", "only_baseline", "p_mcnemar", "p_holm"]
    )  # fmt: skip
    for r in summary.paired:
        test = r.mcnemar
        tested = ["", "", "", ""] if test is None else [
            test.only_strategy, test.only_baseline, repr(test.p_value), repr(test.p_holm)
        ]  # fmt: skip
        writer.writerow(
            [*meta, r.suite, r.strategy, r.baseline, r.metric, r.subset, r.difference.n,
             r.tasks, *_floats(r.difference), *_floats(r.ratio), *tested]
        )  # fmt: skip
    write_atomic(paired_path, buffer.getvalue())


def _floats(e: Estimate) -> list[str]:
    return ["" if math.isnan(x) else repr(x) for x in (e.mean, e.low, e.high)]
