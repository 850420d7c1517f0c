"""The benchmark's intervals and tests of significance, checked against scipy and statsmodels:
McNemar's exact test, Holm's adjustment, the task-clustered bootstrap, t and Wilson intervals."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from scipy import stats as scipy_stats
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from hierplan.bench.paired import BOTH_SOLVED, compare, with_holm
from hierplan.bench.report import summarize
from hierplan.bench.stats import (
    Estimate,
    Sums,
    cluster_bootstrap,
    holm,
    mcnemar_exact,
    resamples,
    t_quantile,
    wilson,
)


@pytest.mark.parametrize("only_a", [0, 1, 2, 5, 9, 17, 30])
@pytest.mark.parametrize("only_b", [0, 1, 3, 8, 25])
def test_mcnemar_exact_matches_statsmodels(only_a: int, only_b: int) -> None:
    table = [[40, only_a], [only_b, 12]]
    expected = mcnemar(table, exact=True).pvalue
    assert mcnemar_exact(only_a, only_b) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_mcnemar_exact_refuses_negative_counts() -> None:
    with pytest.raises(ValueError, match="0 or more"):
        mcnemar_exact(-1, 2)


@pytest.mark.parametrize("seed", range(6))
def test_holm_matches_statsmodels(seed: int) -> None:
    rng = random.Random(seed)
    size = rng.randint(1, 12)
    pvalues = [rng.choice([rng.random(), rng.random() / 50, 1.0]) for _ in range(size)]
    pvalues[0] = pvalues[-1]  # a tie
    _, expected, _, _ = multipletests(pvalues, method="holm")
    assert holm(pvalues) == pytest.approx(list(expected), abs=1e-12)


@pytest.mark.parametrize("df", [1, 2, 4, 9, 29, 89, 500])
@pytest.mark.parametrize("p", [0.6, 0.9, 0.975, 0.995])
def test_t_quantile_matches_scipy(df: int, p: float) -> None:
    assert t_quantile(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), rel=1e-7)


@pytest.mark.parametrize(("successes", "n"), [(0, 5), (1, 10), (7, 9), (45, 90), (90, 90)])
def test_wilson_matches_statsmodels(successes: int, n: int) -> None:
    low, high = proportion_confint(successes, n, alpha=0.05, method="wilson")
    found = wilson(successes, n)
    assert (found.low, found.high) == pytest.approx((low, high), abs=1e-12)


def _close(found: Estimate, low: float, high: float, share: float = 0.05) -> None:
    """Bootstrap endpoints agree within ``share`` of the interval's width (Monte Carlo)."""
    width = high - low
    assert found.low == pytest.approx(low, abs=share * width)
    assert found.high == pytest.approx(high, abs=share * width)


REPS = 20_000


def test_the_bootstrap_of_single_runs_matches_scipy_s_paired_bootstrap() -> None:
    """With one run a task, the clustered bootstrap is the ordinary paired one."""
    rng = random.Random(3)
    a = [rng.lognormvariate(0.3, 0.4) for _ in range(40)]
    b = [x * rng.uniform(0.5, 1.1) for x in a]
    sums: list[Sums] = [(x, y, 1) for x, y in zip(a, b, strict=True)]
    difference, ratio = cluster_bootstrap(sums, resamples(len(sums), REPS, "single"))
    assert difference.mean == pytest.approx(np.mean(a) - np.mean(b))
    assert ratio.mean == pytest.approx(sum(a) / sum(b))

    def mean_difference(x: Any, y: Any, axis: int) -> Any:
        return np.mean(x, axis=axis) - np.mean(y, axis=axis)

    def ratio_of_means(x: Any, y: Any, axis: int) -> Any:
        return np.sum(x, axis=axis) / np.sum(y, axis=axis)

    for statistic, found in ((mean_difference, difference), (ratio_of_means, ratio)):
        expected = scipy_stats.bootstrap(
            (np.array(a), np.array(b)),
            statistic,
            paired=True,
            vectorized=True,
            n_resamples=REPS,
            method="percentile",
            random_state=np.random.default_rng(0),
        ).confidence_interval
        _close(found, expected.low, expected.high)


def _tasks(seed: int, tasks: int, seeds: int) -> list[list[tuple[float, float]]]:
    """Paired observations by task: tasks differ a lot, a task's seeds little."""
    rng = random.Random(seed)
    out = []
    for _ in range(tasks):
        level = rng.lognormvariate(0, 0.8)
        out.append([(level * rng.uniform(1.0, 1.3), level * rng.uniform(0.9, 1.0))
                    for _ in range(seeds)])  # fmt: skip
    return out


def test_the_clustered_bootstrap_matches_scipy_resampling_whole_tasks() -> None:
    """scipy's paired bootstrap of the tasks' sums is the task-clustered bootstrap."""
    grouped = _tasks(5, 25, 3)
    sums: list[Sums] = [
        (sum(x for x, _ in g), sum(y for _, y in g), len(g)) for g in grouped
    ]  # fmt: skip
    difference, ratio = cluster_bootstrap(sums, resamples(len(sums), REPS, "clusters"))
    sa, sb, n = (np.array([s[i] for s in sums], dtype=float) for i in range(3))

    def mean_difference(x: Any, y: Any, k: Any, axis: int) -> Any:
        return (np.sum(x, axis=axis) - np.sum(y, axis=axis)) / np.sum(k, axis=axis)

    def ratio_of_means(x: Any, y: Any, k: Any, axis: int) -> Any:
        return np.sum(x, axis=axis) / np.sum(y, axis=axis)

    for statistic, found in ((mean_difference, difference), (ratio_of_means, ratio)):
        expected = scipy_stats.bootstrap(
            (sa, sb, n),
            statistic,
            paired=True,
            vectorized=True,
            n_resamples=REPS,
            method="percentile",
            random_state=np.random.default_rng(1),
        ).confidence_interval
        _close(found, expected.low, expected.high)


def test_resampling_tasks_is_wider_than_resampling_runs_when_a_task_s_runs_agree() -> None:
    grouped = _tasks(8, 12, 5)
    by_task: list[Sums] = [(sum(x for x, _ in g), sum(y for _, y in g), len(g)) for g in grouped]
    by_run: list[Sums] = [(x, y, 1) for g in grouped for x, y in g]
    clustered, _ = cluster_bootstrap(by_task, resamples(len(by_task), 4000, 1))
    naive, _ = cluster_bootstrap(by_run, resamples(len(by_run), 4000, 1))
    assert clustered.mean == pytest.approx(naive.mean)
    assert clustered.high - clustered.low > 1.5 * (naive.high - naive.low)


def test_too_few_tasks_give_no_interval() -> None:
    difference, ratio = cluster_bootstrap([(3.0, 2.0, 2)], resamples(1, 100, 0))
    assert difference.mean == 0.5 and not difference.has_interval
    assert ratio.mean == 1.5 and not ratio.has_interval
    empty, _ = cluster_bootstrap([(0.0, 0.0, 0)], resamples(1, 10, 0))
    assert empty.n == 0


def _records(
    strategy: str, outcomes: Sequence[bool], latency: float, seeds: int = 2
) -> list[dict[str, Any]]:
    out = []
    for i, ok in enumerate(outcomes):
        task, seed = divmod(i, seeds)
        out.append(
            {"suite": "s", "strategy": strategy, "task_id": f"t{task}", "seed": seed,
             "success": ok, "outcome": "success" if ok else "failed",
             "cost_usd": 0.01 * (1 + task), "latency_s": latency * (1 + i % 3),
             "tokens": 100 + task}
        )  # fmt: skip
    return out


def test_paired_rows_test_success_and_adjust_across_the_table() -> None:
    rng = random.Random(2)
    base = [rng.random() < 0.5 for _ in range(40)]
    strategies = {
        "better": [True if rng.random() < 0.7 else b for b in base],
        "same": list(base),
        "worse": [False if rng.random() < 0.4 else b for b in base],
    }
    baseline = _records("react", base, 1.0)
    rows = []
    for name, outcomes in strategies.items():
        rows += compare("s", name, "react", _records(name, outcomes, 2.0), baseline, reps=500)
    rows = with_holm(rows)
    tests = {r.strategy: r.mcnemar for r in rows if r.metric == "success"}
    raw = []
    for name, outcomes in strategies.items():
        only_a = sum(a and not b for a, b in zip(outcomes, base, strict=True))
        only_b = sum(b and not a for a, b in zip(outcomes, base, strict=True))
        test = tests[name]
        assert test is not None
        assert (test.only_strategy, test.only_baseline) == (only_a, only_b)
        table = [[0, only_a], [only_b, 0]]
        assert test.p_value == pytest.approx(mcnemar(table, exact=True).pvalue)
        raw.append(test.p_value)
    _, adjusted, _, _ = multipletests(raw, method="holm")
    assert [t.p_holm for t in tests.values() if t] == pytest.approx(list(adjusted))
    # Latency on every pair and on the pairs both solved: 2x whichever pairs are compared.
    latency = {(r.strategy, r.subset): r for r in rows if r.metric == "latency_s"}
    both = latency[("better", BOTH_SOLVED)]
    assert both.difference.n == sum(
        a and b for a, b in zip(strategies["better"], base, strict=True)
    )
    assert latency[("same", "all")].ratio.mean == pytest.approx(2.0)
    assert latency[("same", "all")].tasks == 20


def test_the_summary_reports_the_same_tests_as_the_paired_rows() -> None:
    rng = random.Random(4)
    base = [rng.random() < 0.4 for _ in range(30)]
    other = [rng.random() < 0.8 for _ in range(30)]
    summary = summarize([*_records("react", base, 1.0), *_records("dag", other, 1.5)], reps=300)
    (success,) = [r for r in summary.paired if r.metric == "success"]
    assert success.mcnemar is not None and success.difference.has_interval
    assert success.mcnemar.p_holm == success.mcnemar.p_value  # one comparison: no adjustment
    assert {(r.metric, r.subset) for r in summary.paired} >= {
        ("latency_s", "all"),
        ("latency_s", BOTH_SOLVED),
        ("cost_usd", "all"),
        ("cost_usd", BOTH_SOLVED),
    }
