"""What a handful of seeds can tell: a paired difference over seeds with its 95% t-interval on n − 1 degrees of
freedom (the seeds' draws of data order and initialisation are the sample; the methods share them, so the
per-seed differences are paired). With two seeds the interval is wide (t = 12.7), and it says so.

A run that diverged or failed has loss +inf (worse than any loss). A difference that contains an infinity
says only its signs: when every per-seed difference has the same sign the interval runs from the one nearest 0
to the infinity, else it is the whole line; two runs that both failed tie (a difference of 0)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Optional

# Student's t, 97.5% quantile, for 1..30 degrees of freedom (scipy.stats.t.ppf(0.975, df); tests/test_compare.py
# checks the table against it)
T975 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139,
        2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922, 2.093024, 2.085963,
        2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272)
Z975 = 1.959964

BELOW, ABOVE, OVERLAPS = "below 0", "above 0", "includes 0"


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (past 30, its Cornish-Fisher expansion
    around the normal's, within 1e-4)."""
    if df < 1:
        raise ValueError("a t-interval needs at least two values")
    if df <= len(T975):
        return T975[df - 1]
    z = Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class Interval:
    mean: float
    low: Optional[float]  # None with one seed (or none in common): nothing to tell the spread by
    high: Optional[float]
    n: int  # the seeds paired; 0 for an unpaired difference
    unpaired: Optional[tuple[int, int]] = None  # the two arms' seeds, for a difference of means (:func:`unpaired`)

    @property
    def verdict(self) -> Optional[str]:
        """Where the interval lies: wholly below 0, wholly above 0, or across it (None: one seed)."""
        if self.low is None:
            return None
        return BELOW if self.high < 0 else ABOVE if self.low > 0 else OVERLAPS

    def text(self, digits: int = 4) -> str:
        seeds = (f"unpaired, {self.unpaired[0]} and {self.unpaired[1]} seeds" if self.unpaired else
                 f"{self.n} seeds" if self.n > 1 else "1 seed" if self.n else "no seed in common")
        if self.low is None:
            return f"{self.mean:+.{digits}f} ({seeds})"
        return f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}] ({seeds})"


def interval(values: list[float]) -> Optional[Interval]:
    """The mean of ``values`` (per-seed differences) with its 95% t-interval; None for no value."""
    if not values:
        return None
    values = [0.0 if math.isnan(v) else v for v in values]  # inf - inf: both failed, a tie
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Interval(mean, None, None, 1)
    if not all(map(math.isfinite, values)):
        if min(values) > 0:
            return Interval(mean, min(values), math.inf, len(values))
        if max(values) < 0:
            return Interval(mean, -math.inf, max(values), len(values))
        return Interval(mean, -math.inf, math.inf, len(values))
    half = t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return Interval(mean, mean - half, mean + half, len(values))


def unpaired(a: list[float], b: list[float]) -> Interval:
    """mean(b) − mean(a) for arms that share fewer than two seeds (a method run on one seed against one run on
    several): the two-sample t-interval with the variance pooled over the arms that have several values, on
    Σ(n − 1) degrees of freedom. It assumes both arms vary alike (the same model under another residual
    method); no interval when neither arm has two values. A divergence (+inf) is decided by the signs: every
    value of one arm infinite and none of the other's is shown; anything else with an infinity is not."""
    mean = statistics.fmean(b) - statistics.fmean(a)
    sizes = (len(a), len(b))
    inf_a, inf_b = (sum(not math.isfinite(v) for v in x) for x in (a, b))
    if inf_a or inf_b:
        if inf_b == len(b) and not inf_a:
            return Interval(math.inf, math.inf, math.inf, 0, sizes)
        if inf_a == len(a) and not inf_b:
            return Interval(-math.inf, -math.inf, -math.inf, 0, sizes)
        return Interval(mean, -math.inf, math.inf, 0, sizes)
    df = len(a) + len(b) - 2
    if df < 1 or (len(a) < 2 and len(b) < 2):
        return Interval(mean, None, None, 0, sizes)
    pooled = sum((len(x) - 1) * statistics.variance(x) for x in (a, b) if len(x) > 1) / df
    half = t975(df) * math.sqrt(pooled * (1 / len(a) + 1 / len(b)))
    return Interval(mean, mean - half, mean + half, 0, sizes)


@dataclass(frozen=True)
class Spread:
    """Two arms' rates measured side by side in rounds (benchmarks/): the ratio of their medians and the 10th
    and 90th percentiles of the per-round ratios, between which 8 rounds in 10 fall. A goal on the ratio is met
    when the percentile on its far side clears it (at least: ``low``; at most: ``high``), not the median."""

    ratio: float
    low: float
    high: float

    @classmethod
    def of(cls, numerator: list[float], denominator: list[float]) -> "Spread":
        if len(numerator) != len(denominator) or not numerator:
            raise ValueError("a spread needs as many rounds of both arms, at least one")
        ratios = [a / b for a, b in zip(numerator, denominator)]
        deciles = statistics.quantiles(ratios, n=10, method="inclusive") if len(ratios) > 1 else ratios * 9
        return cls(statistics.median(numerator) / statistics.median(denominator), deciles[0], deciles[-1])

    def text(self) -> str:
        return f"{self.ratio:.3f} ({self.low:.3f} to {self.high:.3f})"
