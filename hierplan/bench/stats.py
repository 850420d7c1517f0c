"""Small, exact statistics for benchmark tables (no scipy).

- :func:`mean_ci`: mean with a Student-t confidence interval.
- :func:`wilson`: a proportion with the Wilson score interval (sound at 0% and 100%, where the
  normal approximation collapses to a zero-width interval).
- :func:`paired_difference`: mean difference of paired observations (same task, same seed)
  with a t interval on the differences.
- :func:`paired_proportion_difference`: the difference of two paired success rates with
  Newcombe's interval (method 10 of Newcombe 1998, built from the two Wilson intervals), which
  stays within [-1, 1] and never collapses to zero width, as a t interval on 0/1 data does.
- :func:`t_quantile`: quantiles of Student's t from its CDF (regularised incomplete beta,
  Lentz's continued fraction) by bisection.
- :func:`cluster_bootstrap`: percentile intervals of a paired difference of means and of a
  ratio of means, resampling whole clusters (a task's seeds together), since runs of one task
  are not independent of each other.
- :func:`mcnemar_exact`: McNemar's exact test of paired successes (a two-sided binomial test on
  the discordant pairs), and :func:`holm`: Holm's step-down adjustment of a family of p-values.

>>> round(t_quantile(0.975, 10), 4)
2.2281
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

BOOTSTRAP_REPS = 2000
"""Resamples of a bootstrap interval: enough for the 2.5% and 97.5% percentiles to move by
well under a tenth of the interval's width from one seed to another."""


@dataclass(slots=True, frozen=True)
class Estimate:
    """A mean (or proportion) with the bounds of its confidence interval and its sample size.

    The bounds are ``nan`` when there are too few observations for an interval.
    """

    mean: float
    low: float
    high: float
    n: int

    @property
    def has_interval(self) -> bool:
        """Whether the bounds are known."""
        return not (math.isnan(self.low) or math.isnan(self.high))

    def excludes_zero(self) -> bool:
        """Whether the interval lies wholly above or below zero."""
        return self.has_interval and (self.low > 0 or self.high < 0)


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


@lru_cache(maxsize=256)
def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be between 0 and 1, got {p}")
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, high * 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
    return (low + high) / 2.0


def mean_ci(values: Sequence[float], level: float = 0.95) -> Estimate:
    """The mean of ``values`` with a two-sided t interval at ``level``."""
    n = len(values)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    mean = math.fsum(values) / n
    if n < 2:
        return Estimate(mean, math.nan, math.nan, n)
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    half = t_quantile(1.0 - (1.0 - level) / 2.0, n - 1) * math.sqrt(var / n)
    return Estimate(mean, mean - half, mean + half, n)


def wilson(successes: int, n: int, level: float = 0.95) -> Estimate:
    """The proportion ``successes / n`` with its Wilson score interval at ``level``."""
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be between 0 and n={n}, got {successes}")
    z = NormalDist().inv_cdf(1.0 - (1.0 - level) / 2.0)
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Estimate(p, low, high, n)


def paired_difference(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Estimate:
    """Mean of ``a[i] - b[i]`` with a t interval; ``a`` and ``b`` are paired observations."""
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} and {len(b)}")
    return mean_ci([x - y for x, y in zip(a, b, strict=True)], level)


def paired_proportion_difference(
    a: Sequence[bool | float], b: Sequence[bool | float], level: float = 0.95
) -> Estimate:
    """The success rate of ``a`` minus that of ``b`` (paired outcomes, each 0 or 1), with
    Newcombe's method 10 interval: each rate's Wilson interval, combined with the correlation
    (phi) of the pairs."""
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} and {len(b)}")
    n = len(a)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    both = sum(1 for x, y in zip(a, b, strict=True) if x and y)
    only_a = sum(1 for x, y in zip(a, b, strict=True) if x and not y)
    only_b = sum(1 for x, y in zip(a, b, strict=True) if y and not x)
    neither = n - both - only_a - only_b
    wa, wb = wilson(both + only_a, n, level), wilson(both + only_b, n, level)
    pa, pb = wa.mean, wb.mean
    margins = (both + only_a) * (only_b + neither) * (both + only_b) * (only_a + neither)
    phi = 0.0 if margins == 0 else (both * neither - only_a * only_b) / math.sqrt(margins)
    d_low_a, d_high_a = pa - wa.low, wa.high - pa
    d_low_b, d_high_b = pb - wb.low, wb.high - pb
    low = (pa - pb) - math.sqrt(max(0.0, d_low_a**2 - 2 * phi * d_low_a * d_high_b + d_high_b**2))
    high = (pa - pb) + math.sqrt(max(0.0, d_high_a**2 - 2 * phi * d_high_a * d_low_b + d_low_b**2))
    return Estimate(pa - pb, max(-1.0, low), min(1.0, high), n)


def binomial_cdf_half(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), exactly (integer arithmetic, then one division)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    favourable: int = sum(math.comb(n, i) for i in range(k + 1))
    return favourable / (1 << n)


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """McNemar's exact two-sided p-value for paired successes: ``only_a`` pairs where only the
    first succeeded, ``only_b`` where only the second did (the concordant pairs carry no
    information). Under the null each discordant pair goes either way with chance 1/2."""
    if only_a < 0 or only_b < 0:
        raise ValueError(f"counts must be 0 or more, got {only_a} and {only_b}")
    n = only_a + only_b
    if n == 0:
        return 1.0
    return min(1.0, 2.0 * binomial_cdf_half(min(only_a, only_b), n))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the ``i``-th smallest p-value
    times ``m - i`` (``i`` from 0), made monotone, at most 1. It controls the family-wise error
    rate of the ``m`` comparisons whatever their dependence."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


Sums = tuple[float, float, int]
"""One cluster's paired observations: the sum of the first, of the second, and their count."""


def resamples(clusters: int, reps: int, seed: int | str) -> list[list[int]]:
    """``reps`` resamples of ``clusters`` cluster indices, with replacement (seeded)."""
    rng = random.Random(seed)
    indices = range(clusters)
    return [rng.choices(indices, k=clusters) for _ in range(reps)]


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0 to 1) of sorted values, interpolated linearly (as numpy's)."""
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def cluster_bootstrap(
    sums: Sequence[Sums], draws: Sequence[Sequence[int]], level: float = 0.95
) -> tuple[Estimate, Estimate]:
    """The paired difference of means and the ratio of means, each with a percentile interval
    from the ``draws`` (:func:`resamples` over the same clusters as ``sums``).

    A cluster without observations (``n`` 0) adds nothing to a resample. The estimates are
    those of all observations; a resample whose second mean is 0 has no ratio. Fewer than two
    clusters with observations give no interval.
    """
    total_a = math.fsum(a for a, _, _ in sums)
    total_b = math.fsum(b for _, b, _ in sums)
    count = sum(n for _, _, n in sums)
    if count == 0:
        nan = Estimate(math.nan, math.nan, math.nan, 0)
        return nan, nan
    difference = (total_a - total_b) / count
    ratio = total_a / total_b if total_b else math.nan
    if sum(1 for _, _, n in sums if n) < 2:
        return (
            Estimate(difference, math.nan, math.nan, count),
            Estimate(ratio, math.nan, math.nan, count),
        )
    a_of, b_of, n_of = ([s[i] for s in sums] for i in range(3))
    differences: list[float] = []
    ratios: list[float] = []
    for draw in draws:
        n = sum(map(n_of.__getitem__, draw))
        if not n:
            continue
        # Plain sums: a few dozen terms of one sign, where fsum's exactness costs twice the time.
        a = sum(map(a_of.__getitem__, draw))
        b = sum(map(b_of.__getitem__, draw))
        differences.append((a - b) / n)
        if b:
            ratios.append(a / b)
    return _interval(difference, differences, count, level), _interval(ratio, ratios, count, level)


def _interval(estimate: float, replicates: list[float], n: int, level: float) -> Estimate:
    """``estimate`` with the percentile interval of its bootstrap ``replicates``."""
    if math.isnan(estimate) or len(replicates) < 2:
        return Estimate(estimate, math.nan, math.nan, n)
    replicates.sort()
    tail = (1.0 - level) / 2.0
    return Estimate(estimate, percentile(replicates, tail), percentile(replicates, 1 - tail), n)
