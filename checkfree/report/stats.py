"""Small statistics for multi-seed comparisons: Student-t confidence intervals and the sign test.

No SciPy: the t quantiles come from a table (two-sided 95 %, i.e. the 0.975 quantile, as printed in any statistics
textbook, e.g. NIST/SEMATECH e-Handbook §1.3.6.7.2), and the sign test is an exact binomial tail.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

T_975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    25: 2.060,
    30: 2.042,
    40: 2.021,
    60: 2.000,
    120: 1.980,
}
"""0.975 quantile of Student's t by degrees of freedom (two-sided 95 % intervals)."""


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom.

    Between table entries the next smaller df is used (a slightly wider, conservative interval); above 120 the
    normal quantile 1.960.

    Raises:
        ValueError: ``df`` < 1.
    """
    if df < 1:
        raise ValueError(f"degrees of freedom {df} must be ≥ 1.")
    if df > 120:
        return 1.960
    return T_975[max(k for k in T_975 if k <= df)]


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
    """One-sided exact sign test: P(X ≥ ``holds``) for X ~ Binomial(n, 1/2).

    The chance that an ordering holds in at least ``holds`` of ``n`` independent seeds if each seed were a coin
    flip. With 3 of 3 seeds it is 0.125: three seeds alone cannot reach p < 0.05.

    Raises:
        ValueError: n < 1 or holds outside 0..n.
    """
    if n < 1 or not 0 <= holds <= n:
        raise ValueError(f"sign test needs 0 ≤ holds ≤ n and n ≥ 1; got holds {holds}, n {n}.")
    return sum(math.comb(n, i) for i in range(holds, n + 1)) / 2**n
