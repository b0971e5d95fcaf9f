"""Statistics for multi-seed comparisons: Student-t confidence intervals, the sign test and the Wilcoxon
signed-rank test, all from ``scipy.stats`` (statistics is not what checkfree exists for).

scipy is imported when a statistic is computed, not with this module: a single-seed report, and every other
command of checkfree, runs where scipy is not installed (e.g. a GPU image); a multi-seed report there raises
:class:`StatisticsUnavailable` with one sentence.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class StatisticsUnavailable(ValueError):
    """scipy is not installed; the message says how to install it."""


def _scipy_stats() -> Any:
    try:
        from scipy import stats
    except ImportError:
        raise StatisticsUnavailable(
            "multi-seed statistics need scipy (requirements.txt pins it): run ./setup.sh, or pip install scipy."
        ) from None
    return stats


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (``scipy.stats.t.ppf``).

    Raises:
        ValueError: ``df`` < 1.
    """
    if df < 1:
        raise ValueError(f"degrees of freedom {df} must be ≥ 1.")
    return float(_scipy_stats().t.ppf(0.975, df))


@dataclass(frozen=True)
class Interval:
    """Mean of ``n`` values with a two-sided 95 % Student-t confidence interval [low, high].

    With n = 1 there is no spread to estimate: low and high are NaN and :attr:`single` is True.
    """

    mean: float
    low: float
    high: float
    n: int

    @property
    def single(self) -> bool:
        return self.n == 1

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def overlaps(self, other: Interval) -> bool:
        """Whether the two intervals share a point (True when either has no interval: nothing is separated)."""
        if self.single or other.single:
            return True
        return self.low <= other.high and other.low <= self.high

    def format(self, spec: str = ".4f") -> str:
        """``mean ± half-width``; a sign option in ``spec`` (``+.4f``) signs the mean only."""
        if self.single:
            return f"{format(self.mean, spec)} (1 seed)"
        return f"{format(self.mean, spec)} ± {format(self.half_width, spec.lstrip('+- '))}"


def mean_ci(values: Sequence[float]) -> Interval:
    """Mean and 95 % confidence interval ``mean ± t_{0.975, n−1} · s / √n`` (s: sample standard deviation).

    Raises:
        ValueError: no values, or a value that is not finite.
    """
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("a confidence interval needs at least one value.")
    if not all(math.isfinite(x) for x in xs):
        raise ValueError(f"values {xs} must all be finite.")
    mean = statistics.fmean(xs)
    if len(xs) == 1:
        return Interval(mean, math.nan, math.nan, 1)
    half = t_quantile_975(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return Interval(mean, mean - half, mean + half, len(xs))


def sign_test_p(holds: int, n: int) -> float:
    """One-sided exact sign test: P(X ≥ ``holds``) for X ~ Binomial(n, 1/2) (``scipy.stats.binomtest``).

    The chance that an ordering holds in at least ``holds`` of ``n`` independent seeds if each seed were a coin
    flip. With 3 of 3 seeds it is 0.125: three seeds alone cannot reach p < 0.05.

    Raises:
        ValueError: n < 1 or holds outside 0..n.
    """
    if n < 1 or not 0 <= holds <= n:
        raise ValueError(f"sign test needs 0 ≤ holds ≤ n and n ≥ 1; got holds {holds}, n {n}.")
    return float(_scipy_stats().binomtest(holds, n, 0.5, alternative="greater").pvalue)


def wilcoxon_p(differences: Sequence[float]) -> float | None:
    """One-sided Wilcoxon signed-rank test that the paired ``differences`` are centred above 0
    (``scipy.stats.wilcoxon``, exact distribution for small samples, zero differences dropped).

    For paired hours to target, ``differences`` = slower candidate − faster candidate per seed: a small p says
    the ordering holds beyond what the seeds' spread explains. None when fewer than one non-zero difference.

    Raises:
        ValueError: a difference that is not finite.
    """
    xs = [float(d) for d in differences]
    if not all(math.isfinite(x) for x in xs):
        raise ValueError(f"differences {xs} must all be finite.")
    if not any(xs):
        return None
    return float(_scipy_stats().wilcoxon(xs, alternative="greater", zero_method="wilcox").pvalue)
