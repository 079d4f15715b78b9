"""Percentiles with bootstrap confidence intervals, and a mergeable log histogram.

Percentiles use the nearest-rank definition (numpy's ``inverted_cdf``, HdrHistogram's): P(p) of
``n`` values is the ``ceil(p/100 · n)``-th smallest, so every reported value was observed.

The bootstrap of such an order statistic needs no resampling of the data. In a resample of
``n`` draws from the sorted sample, the k-th smallest is ``x[ceil(n · U) - 1]`` where
``U ~ Beta(k, n - k + 1)`` (the k-th order statistic of n uniforms). So ``resamples`` Beta draws
give the exact bootstrap distribution of the percentile in O(resamples), whatever ``n`` is, and
its percentile-method interval needs only two more order statistics.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .._rank import nearest_rank
from ..errors import UsageError

__all__ = [
    "BOOTSTRAP_MAX",
    "PERCENTILES",
    "Estimate",
    "LogHistogram",
    "bootstrap_indices",
    "interval",
    "mean_ci",
    "mean_samples",
    "means_ci",
    "means_samples",
    "order_stats",
    "p_key",
    "percentile",
    "percentile_ci",
    "percentile_samples",
    "percentiles_ci",
]

#: The percentiles every summary reports.
PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0, 99.9)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Estimate:
    """A statistic with its confidence interval.

    Attributes:
        value: the point estimate (NaN when there were no values).
        low, high: the interval's bounds (NaN without values).
        n: values it was computed from.
        confidence: nominal coverage of ``[low, high]``, e.g. 0.95.
    """

    value: float
    low: float
    high: float
    n: int
    confidence: float = 0.95

    def scaled(self, factor: float) -> Estimate:
        """The same estimate in other units (e.g. ``1e-9`` for ns → s)."""
        return Estimate(
            self.value * factor, self.low * factor, self.high * factor, self.n, self.confidence
        )

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high

    def format(self, spec: str = ".3g", unit: str = "") -> str:
        """E.g. ``"5.7× [5.2, 6.1]"`` for ``format(".2g", "×")``."""
        if math.isnan(self.value):
            return "n/a"
        return f"{self.value:{spec}}{unit} [{self.low:{spec}}, {self.high:{spec}}]"

    def __str__(self) -> str:
        return self.format()


def order_stats(values: npt.NDArray[np.generic], indices: IntArray) -> FloatArray:
    """The order statistics of ``values`` at 0-based ``indices`` without a full sort.

    One ``np.partition`` on the lowest and highest index, then a sort of the window between
    them: O(n) plus the window, which for percentile bootstraps is a few thousand values.
    """
    n = len(values)
    if n == 0:
        return np.full(len(indices), np.nan)
    wanted = np.unique(indices)
    if len(wanted) <= 64:  # a few ranks: one multi-kth partition puts each one in place
        return np.partition(values, wanted)[indices].astype(np.float64)
    lo, hi = int(wanted[0]), int(wanted[-1])
    part = np.partition(values, (lo, hi)) if hi > lo else np.partition(values, lo)
    window = np.sort(part[lo : hi + 1])
    return window[indices - lo].astype(np.float64)


def percentile(values: npt.ArrayLike, p: float) -> float:
    """Nearest-rank P(p) of ``values`` (NaN when empty)."""
    arr = np.asarray(values)
    if arr.size == 0:
        return math.nan
    return float(order_stats(arr, np.array([nearest_rank(p, arr.size)]))[0])


def bootstrap_indices(n: int, p: float, resamples: int, rng: np.random.Generator) -> IntArray:
    """0-based indices of P(p) in ``resamples`` bootstrap resamples of n sorted values."""
    k = nearest_rank(p, n) + 1
    u = rng.beta(k, n - k + 1, size=resamples)
    return np.clip(np.ceil(u * n).astype(np.int64) - 1, 0, n - 1)


def percentile_samples(
    values: npt.ArrayLike, p: float, resamples: int = 2000, seed: int | np.random.Generator = 0
) -> FloatArray:
    """The bootstrap distribution of P(p): one value per resample (for ratios and sums)."""
    arr = np.asarray(values)
    if arr.size == 0:
        return np.full(resamples, np.nan)
    rng = np.random.default_rng(seed)
    return order_stats(arr, bootstrap_indices(arr.size, p, resamples, rng))


def p_key(p: float) -> str:
    """The key a percentile goes by in results and summaries: ``p50``, ``p99.9``."""
    return f"p{p:g}"


def percentiles_ci(
    values: npt.ArrayLike,
    ps: Sequence[float] = PERCENTILES,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int | np.random.Generator = 0,
) -> dict[float, Estimate]:
    """``percentile_ci`` for several percentiles with one partition of the data."""
    arr = np.asarray(values)
    n = arr.size
    if n == 0:
        return {p: Estimate(math.nan, math.nan, math.nan, 0, confidence) for p in ps}
    if isinstance(seed, int | np.integer) and not isinstance(seed, bool):
        ranks = _ci_ranks_of_seed(n, tuple(ps), confidence, resamples, int(seed))
    else:  # a generator (its draws go on from where they are), None, a sequence: as given
        ranks = _ci_ranks(n, tuple(ps), confidence, resamples, np.random.default_rng(seed))
    stats = order_stats(arr, np.array(ranks, dtype=np.int64))
    return {
        p: Estimate(
            float(stats[3 * i]), float(stats[3 * i + 1]), float(stats[3 * i + 2]), n, confidence
        )
        for i, p in enumerate(ps)
    }


def _ci_ranks(
    n: int, ps: tuple[float, ...], confidence: float, resamples: int, rng: np.random.Generator
) -> tuple[int, ...]:
    """Per percentile: its rank and its interval's two ranks in n sorted values. They depend
    on n alone, not on the values: a summary's columns of one size share them."""
    alpha = (1 - confidence) / 2
    i_lo = math.floor(alpha * (resamples - 1))
    i_hi = math.ceil((1 - alpha) * (resamples - 1))
    ranks: list[int] = []
    for p in ps:
        boot = np.sort(bootstrap_indices(n, p, resamples, rng))
        ranks += [nearest_rank(p, n), int(boot[i_lo]), int(boot[i_hi])]
    return tuple(ranks)


@functools.lru_cache(maxsize=256)
def _ci_ranks_of_seed(
    n: int, ps: tuple[float, ...], confidence: float, resamples: int, seed: int
) -> tuple[int, ...]:
    return _ci_ranks(n, ps, confidence, resamples, np.random.default_rng(seed))


def percentile_ci(
    values: npt.ArrayLike,
    p: float,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int | np.random.Generator = 0,
) -> Estimate:
    """Nearest-rank P(p) with a bootstrap percentile-method confidence interval.

    Args:
        values: the sample (any numeric array).
        p: percentile in [0, 100].
        confidence: nominal coverage of the interval.
        resamples: bootstrap resamples (cheap: Beta draws, not data copies).
        seed: seed or generator, so a report is reproducible.
    """
    return percentiles_ci(values, (p,), confidence=confidence, resamples=resamples, seed=seed)[p]


#: Above this many values the mean's bootstrap is its normal approximation (see
#: :func:`mean_samples`).
BOOTSTRAP_MAX = 20_000


def mean_samples(
    values: npt.ArrayLike, resamples: int = 2000, seed: int | np.random.Generator = 0
) -> FloatArray:
    """Bootstrap distribution of the mean: one value per resample (for ratios and sums).

    Small samples are resampled (see :func:`means_samples`); above :data:`BOOTSTRAP_MAX` values
    the normal approximation N(mean, s²/n) is used, which the bootstrap converges to there.
    """
    return means_samples([np.asarray(values, dtype=np.float64)], resamples, seed)[0]


def means_samples(
    columns: Sequence[FloatArray], resamples: int = 2000, seed: int | np.random.Generator = 0
) -> list[FloatArray]:
    """:func:`mean_samples` of several columns, resampled together where their sizes agree.

    A resample of n values is a row of n draws; what the mean needs of it is how often each
    value was drawn. Those counts, one row per resample, times the values gives every
    resample's sum, for all the columns of that size at once: one set of draws and one
    product, where resampling each column's values by index costs a draw and a gather per
    column. With a seed (an int), the draws are the ones a column alone would get from it, so
    a column's distribution does not depend on what it is summarised with; a generator's draws
    go on from size to size. The product is ``einsum``'s own loop: a BLAS call would start
    threads that go on spinning on the cores a run's traffic needs.
    """
    out: list[FloatArray] = [np.full(resamples, np.nan) for _ in columns]
    by_size: dict[int, list[int]] = {}
    for i, col in enumerate(columns):
        by_size.setdefault(int(col.size), []).append(i)
    for n, which in by_size.items():
        if n == 0:
            continue
        if n > BOOTSTRAP_MAX:  # each column its own draws, as alone
            for i in which:
                sd = float(columns[i].std(ddof=1)) / math.sqrt(n)
                rng = np.random.default_rng(seed)
                out[i] = np.asarray(rng.normal(float(columns[i].mean()), sd, size=resamples))
            continue
        rng = np.random.default_rng(seed)
        values = np.stack([np.asarray(columns[i], dtype=np.float64) for i in which], axis=1)
        sums = np.empty((resamples, len(which)))
        block = max(1, 2_000_000 // n)
        for start in range(0, resamples, block):
            m = min(block, resamples - start)
            draws = rng.integers(0, n, size=(m, n))
            draws += np.arange(0, m * n, n)[:, None]  # row r's draws count into row r
            counts = np.bincount(draws.ravel(), minlength=m * n).reshape(m, n)
            sums[start : start + m] = np.einsum("mn,nk->mk", counts.astype(np.float64), values)
        for j, i in enumerate(which):
            out[i] = sums[:, j] / n
    return out


def mean_ci(
    values: npt.ArrayLike,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int | np.random.Generator = 0,
) -> Estimate:
    """The mean with a bootstrap percentile-method interval."""
    return means_ci([values], confidence=confidence, resamples=resamples, seed=seed)[0]


def means_ci(
    columns: Sequence[npt.ArrayLike],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int | np.random.Generator = 0,
) -> list[Estimate]:
    """:func:`mean_ci` of several columns, their resamples drawn together (see
    :func:`means_samples`): what a summary of every stage asks for."""
    arrays = [np.asarray(c, dtype=np.float64) for c in columns]
    samples = means_samples(arrays, resamples, seed)
    out = []
    for arr, boot in zip(arrays, samples, strict=True):
        if arr.size == 0:
            out.append(Estimate(math.nan, math.nan, math.nan, 0, confidence))
            continue
        lo, hi = interval(boot, confidence)
        out.append(Estimate(float(arr.mean()), lo, hi, int(arr.size), confidence))
    return out


def interval(samples: FloatArray, confidence: float) -> tuple[float, float]:
    """Percentile-method bounds of a bootstrap distribution."""
    finite = samples[np.isfinite(samples)]  # a ratio over a zero-length stage is inf/NaN
    if finite.size < samples.size / 2:
        return math.nan, math.nan
    alpha = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(finite, [alpha, 100 - alpha])
    return float(lo), float(hi)


class LogHistogram:
    """Counts in log-spaced buckets: fixed memory, exact merge, bounded relative error.

    For runs too long to keep raw columns: each runner process keeps one per metric and the
    merged histogram is the histogram of the union (counts add). A value ``v >= 1`` lands in
    bucket ``floor(log(v) / log(1 + rel_error) )``; a percentile read back is the bucket's
    midpoint, within ``rel_error / 2`` of a value that was observed. Values below 1 (e.g.
    0 ns) are counted in bucket 0.

    Args:
        rel_error: bucket width as a fraction (0.01: 1%).
        max_value: the largest value expected (larger ones go to the last bucket).
    """

    def __init__(self, rel_error: float = 0.01, max_value: float = 1e13) -> None:
        if not 0 < rel_error < 1:
            raise UsageError("rel_error must be within (0, 1)")
        self.rel_error = rel_error
        self._log_base = math.log1p(rel_error)
        self.counts = np.zeros(int(math.log(max_value) / self._log_base) + 2, dtype=np.int64)

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def add(self, values: Iterable[float] | npt.ArrayLike) -> None:
        """Count ``values``."""
        arr = np.asarray(values, dtype=np.float64)
        arr = arr[~np.isnan(arr)]
        buckets = np.zeros(arr.shape, dtype=np.int64)
        big = arr >= 1
        buckets[big] = np.floor(np.log(arr[big]) / self._log_base).astype(np.int64) + 1
        np.add.at(self.counts, np.minimum(buckets, len(self.counts) - 1), 1)

    def merge(self, other: LogHistogram) -> LogHistogram:
        """A new histogram holding both (exact: counts add).

        Raises:
            UsageError: the two were built with different bucket widths.
        """
        if other.rel_error != self.rel_error or len(other.counts) != len(self.counts):
            raise UsageError("only histograms with the same rel_error and max_value merge")
        out = LogHistogram.__new__(LogHistogram)
        out.rel_error, out._log_base = self.rel_error, self._log_base
        out.counts = self.counts + other.counts
        return out

    def percentile(self, p: float) -> float:
        """Nearest-rank P(p), as the midpoint of its bucket (NaN when empty)."""
        total = self.total
        if total == 0:
            return math.nan
        bucket = int(np.searchsorted(np.cumsum(self.counts), nearest_rank(p, total) + 1))
        if bucket == 0:
            return 0.0
        lo = math.exp((bucket - 1) * self._log_base)
        return lo * (1 + self.rel_error / 2)

    def percentiles(self, ps: Sequence[float] = PERCENTILES) -> dict[float, float]:
        return {p: self.percentile(p) for p in ps}
