"""The benchmark statistics against values computed by hand (and published t tables)."""

from __future__ import annotations

import math

import pytest

from hierplan.bench.plot import pareto_frontier
from hierplan.bench.stats import (
    Estimate,
    incomplete_beta,
    mean_ci,
    paired_difference,
    paired_proportion_difference,
    t_cdf,
    t_quantile,
    wilson,
)


@pytest.mark.parametrize(
    ("df", "expected"),
    # two-sided 95% critical values from any t table
    [(1, 12.706), (2, 4.303), (3, 3.182), (5, 2.571), (10, 2.228), (29, 2.045), (120, 1.980)],
)
def test_t_quantile_matches_the_table(df: int, expected: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=5e-4)


def test_t_quantile_other_levels_and_symmetry() -> None:
    assert t_quantile(0.995, 3) == pytest.approx(5.841, abs=5e-4)  # 99% two-sided, df 3
    assert t_quantile(0.95, 8) == pytest.approx(1.860, abs=5e-4)  # 90% two-sided, df 8
    assert t_quantile(0.025, 4) == pytest.approx(-t_quantile(0.975, 4))
    assert t_quantile(0.975, 10**6) == pytest.approx(1.95996, abs=1e-4)  # the normal limit


def test_t_cdf_and_incomplete_beta() -> None:
    assert t_cdf(0.0, 7) == pytest.approx(0.5)
    # df = 1 is the Cauchy distribution: CDF(1) = 3/4
    assert t_cdf(1.0, 1) == pytest.approx(0.75)
    # I_x(1, 1) = x, and I_x(a, b) = 1 - I_{1-x}(b, a)
    assert incomplete_beta(1, 1, 0.3) == pytest.approx(0.3)
    assert incomplete_beta(2.5, 0.5, 0.4) == pytest.approx(1 - incomplete_beta(0.5, 2.5, 0.6))


def test_t_quantile_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        t_quantile(1.0, 5)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile(0.9, 0)


def test_mean_ci_by_hand() -> None:
    # mean 3, sample sd sqrt(2.5), se sqrt(0.5), t(0.975, 4) = 2.776445 -> half width 1.963243
    e = mean_ci([1, 2, 3, 4, 5])
    assert (e.mean, e.n) == (3.0, 5)
    assert e.low == pytest.approx(3 - 1.963243, abs=1e-5)
    assert e.high == pytest.approx(3 + 1.963243, abs=1e-5)
    # two values 10 and 14: mean 12, sd 2*sqrt(2), se 2, t(0.975, 1) = 12.7062 -> 12 +- 25.4124
    e = mean_ci([10, 14])
    assert e.low == pytest.approx(12 - 25.4124, abs=1e-3)
    assert e.high == pytest.approx(12 + 25.4124, abs=1e-3)


def test_mean_ci_with_too_few_values() -> None:
    one = mean_ci([4.0])
    assert one.mean == 4.0 and one.n == 1 and not one.has_interval
    none = mean_ci([])
    assert none.n == 0 and math.isnan(none.mean)


def test_wilson_by_hand() -> None:
    # 8/10: z = 1.959964, centre (0.8 + z^2/20) / (1 + z^2/10) = 0.716741,
    # half z * sqrt(0.016 + z^2/400) / (1 + z^2/10) = 0.226579
    e = wilson(8, 10)
    assert e.mean == 0.8
    assert e.low == pytest.approx(0.716741 - 0.226579, abs=1e-5)
    assert e.high == pytest.approx(0.716741 + 0.226579, abs=1e-5)
    # all successes: the interval still has width (the normal approximation would not)
    assert wilson(10, 10).low == pytest.approx(0.722467, abs=1e-5)
    assert wilson(10, 10).high == 1.0
    assert wilson(0, 10).low == 0.0
    with pytest.raises(ValueError, match="between 0 and n"):
        wilson(11, 10)


def test_paired_difference_by_hand() -> None:
    # differences 1, 2, 3: mean 2, sd 1, se 1/sqrt(3), t(0.975, 2) = 4.302653 -> 2 +- 2.484138
    e = paired_difference([3, 5, 7], [2, 3, 4])
    assert e.mean == pytest.approx(2.0)
    assert e.low == pytest.approx(2 - 2.484138, abs=1e-5)
    assert e.excludes_zero() is False
    e = paired_difference([10, 11, 12, 13], [1, 1, 2, 2])
    assert e.excludes_zero()
    with pytest.raises(ValueError, match="differ in length"):
        paired_difference([1.0], [1.0, 2.0])


def test_paired_success_difference_by_hand() -> None:
    # b never succeeds, so phi = 0 and the interval combines the two Wilson intervals
    # (z = 1.959964): Wilson(2/4) = 0.5 -0.349961 +0.349961, Wilson(0/4) = [0, z^2/(4 + z^2)]
    # = [0, 0.489891]; low = 0.5 - hypot(0.349961, 0.489891), high = 0.5 + 0.349961
    e = paired_proportion_difference([1, 0, 1, 0], [0, 0, 0, 0])
    assert e.mean == 0.5
    assert e.low == pytest.approx(0.5 - math.hypot(0.349961, 0.489891), abs=1e-5)
    assert e.high == pytest.approx(0.849961, abs=1e-5)


def test_paired_success_difference_agrees_with_the_normal_interval_for_many_pairs() -> None:
    both, only_a, only_b, neither = 3000, 1500, 1000, 4500
    a = [1] * both + [1] * only_a + [0] * only_b + [0] * neither
    b = [1] * both + [0] * only_a + [1] * only_b + [0] * neither
    n = len(a)
    d = (only_a - only_b) / n
    se = math.sqrt((only_a + only_b) - (only_a - only_b) ** 2 / n) / n
    e = paired_proportion_difference(a, b)
    assert e.mean == pytest.approx(d)
    assert e.low == pytest.approx(d - 1.959964 * se, abs=2e-4)
    assert e.high == pytest.approx(d + 1.959964 * se, abs=2e-4)


def test_paired_success_difference_stays_possible_and_never_collapses() -> None:
    # a t interval on these 0/1 differences says [-585, +685] pp, or [+100, +100]
    for a, b in (([1, 0], [0, 0]), ([1, 1], [0, 0]), ([1] * 5, [1] * 5), ([0] * 3, [1] * 3)):
        e = paired_proportion_difference(a, b)
        assert -1.0 <= e.low <= e.mean <= e.high <= 1.0
        assert e.high - e.low > 0.1
    same = paired_proportion_difference([1] * 5, [1] * 5)
    assert same.low == pytest.approx(-same.high) and not same.excludes_zero()
    assert paired_proportion_difference([], []).n == 0
    with pytest.raises(ValueError, match="differ in length"):
        paired_proportion_difference([1], [1, 0])


def test_estimate_without_interval_excludes_nothing() -> None:
    assert not Estimate(1.0, math.nan, math.nan, 1).excludes_zero()


def test_pareto_frontier() -> None:
    points = {
        "cheap": (1.0, 0.5),
        "better": (2.0, 0.9),
        "dominated": (3.0, 0.8),  # costs more than "better" and succeeds less
        "same_cost_worse": (2.0, 0.7),
        "best": (5.0, 1.0),
    }
    assert pareto_frontier(points) == ["cheap", "better", "best"]
    assert pareto_frontier({"a": (1.0, 1.0), "b": (1.0, 1.0)}) == ["a", "b"]  # ties both stay
