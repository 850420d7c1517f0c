"""Paired comparisons: each strategy against a baseline on the same tasks and seeds.

For every metric, the difference of means and the ratio of means (strategy / baseline) come
with task-clustered bootstrap intervals: a resample draws whole tasks, all seeds of a task
together, because runs of one task are not independent. Paired success also gets McNemar's
exact test, and the p-values of one suite's table are adjusted with Holm's method for its
several comparisons. Cost and latency are compared on every pair of runs and on the pairs both
strategies solved (a strategy that fails early looks fast and cheap on all runs).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hierplan.bench.records import counts_as_success
from hierplan.bench.stats import (
    BOOTSTRAP_REPS,
    Estimate,
    Sums,
    cluster_bootstrap,
    holm,
    mcnemar_exact,
    resamples,
)

ALL = "all"
BOTH_SOLVED = "both solved"

PAIRED_METRICS: tuple[tuple[str, str], ...] = (
    ("success", ALL),
    ("cost_usd", ALL),
    ("cost_usd", BOTH_SOLVED),
    ("latency_s", ALL),
    ("latency_s", BOTH_SOLVED),
    ("tokens", ALL),
)
"""The (metric, pairs compared) of every paired row, in table order."""


@dataclass(slots=True, frozen=True)
class McNemar:
    """McNemar's exact test of paired success: the discordant pairs and the p-values."""

    only_strategy: int
    only_baseline: int
    p_value: float
    p_holm: float


@dataclass(slots=True, frozen=True)
class PairedRow:
    """``strategy`` against ``baseline`` on the same tasks and seeds, for one metric on
    ``subset`` of the pairs: the difference of means and the ratio of means, each with its
    task-clustered bootstrap interval; ``tasks`` is the number of clusters."""

    suite: str
    strategy: str
    baseline: str
    metric: str
    subset: str
    difference: Estimate
    ratio: Estimate
    tasks: int
    mcnemar: McNemar | None = None


def metric_value(
    record: Mapping[str, Any], metric: str, count_gave_up: bool = False
) -> float | None:
    """A record's value of ``metric`` (success as 0 or 1), ``None`` when it is unknown."""
    if metric == "success":
        return 1.0 if counts_as_success(record, count_gave_up) else 0.0
    value = record.get(metric)
    if value is None or (metric == "cost_usd" and record.get("unpriced_calls")):
        return None  # unknown (records written before unpriced runs were recorded so)
    return float(value)


Pair = tuple[Mapping[str, Any], Mapping[str, Any]]


def _pairs(
    runs: Sequence[Mapping[str, Any]], base_runs: Sequence[Mapping[str, Any]]
) -> dict[str, list[Pair]]:
    """The pairs (strategy's run, baseline's run) of the same task and seed, by task."""
    base = {(r["task_id"], r["seed"]): r for r in base_runs}
    by_task: dict[str, list[Pair]] = defaultdict(list)
    for r in runs:
        other = base.get((r["task_id"], r["seed"]))
        if other is not None:
            by_task[r["task_id"]].append((r, other))
    return by_task


def _sums(
    by_task: Mapping[str, list[Pair]], metric: str, subset: str, count_gave_up: bool
) -> list[Sums]:
    """Each task's sums of ``metric`` over its pairs in ``subset`` (known values only)."""
    out: list[Sums] = []
    for pairs in by_task.values():
        a = b = 0.0
        n = 0
        for x, y in pairs:
            if subset == BOTH_SOLVED and not (
                counts_as_success(x, count_gave_up) and counts_as_success(y, count_gave_up)
            ):
                continue
            vx = metric_value(x, metric, count_gave_up)
            vy = metric_value(y, metric, count_gave_up)
            if vx is not None and vy is not None:
                a, b, n = a + vx, b + vy, n + 1
        out.append((a, b, n))
    return out


def compare(
    suite: str,
    strategy: str,
    baseline: str,
    runs: Sequence[Mapping[str, Any]],
    base_runs: Sequence[Mapping[str, Any]],
    *,
    count_gave_up: bool = False,
    reps: int = BOOTSTRAP_REPS,
) -> list[PairedRow]:
    """Every paired row of ``strategy`` against ``baseline`` in one suite (Holm's adjustment
    is made later, across the suite's comparisons: ``p_holm`` is the raw p-value here)."""
    by_task = _pairs(runs, base_runs)
    if not by_task:
        return []
    # One set of resampled tasks for every metric of the comparison: the same draws.
    draws = resamples(len(by_task), reps, f"{suite}|{strategy}|{baseline}")
    rows = []
    for metric, subset in PAIRED_METRICS:
        sums = _sums(by_task, metric, subset, count_gave_up)
        difference, ratio = cluster_bootstrap(sums, draws)
        if difference.n == 0:
            continue
        tasks = sum(1 for *_, n in sums if n)
        test = None
        if metric == "success":
            test = _mcnemar(by_task, count_gave_up)
        rows.append(
            PairedRow(suite, strategy, baseline, metric, subset, difference, ratio, tasks, test)
        )
    return rows


def _mcnemar(by_task: Mapping[str, list[Pair]], count_gave_up: bool) -> McNemar:
    only_a = only_b = 0
    for pairs in by_task.values():
        for x, y in pairs:
            a, b = counts_as_success(x, count_gave_up), counts_as_success(y, count_gave_up)
            only_a += a and not b
            only_b += b and not a
    p = mcnemar_exact(only_a, only_b)
    return McNemar(only_a, only_b, p, p)


def with_holm(rows: Sequence[PairedRow]) -> list[PairedRow]:
    """``rows`` with each suite's McNemar p-values adjusted by Holm's method across the
    comparisons of that suite's table."""
    out = list(rows)
    by_suite: dict[str, list[int]] = defaultdict(list)
    for i, row in enumerate(out):
        if row.mcnemar is not None:
            by_suite[row.suite].append(i)
    for indices in by_suite.values():
        tests = [out[i].mcnemar for i in indices]
        adjusted = holm([t.p_value for t in tests if t is not None])
        for i, p in zip(indices, adjusted, strict=True):
            test = out[i].mcnemar
            assert test is not None
            out[i] = replace(out[i], mcnemar=replace(test, p_holm=p))
    return out


def show_p(p: float) -> str:
    """A p-value as text: ``0.003``, ``<0.001``."""
    if math.isnan(p):
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3f}"
