"""The one percentile definition of the project: nearest rank, in exact arithmetic.

P(p) of ``n`` sorted values is the ``ceil(p/100 · n)``-th smallest (numpy's ``inverted_cdf``,
HdrHistogram's), so every reported percentile is a value that was observed. The rank is computed
with fractions, and a float ``p`` is read as the decimal it prints as: ``99.9`` is 999/10, not
the binary float just above it, so P99.9 of 1,000 values is the 999th and not the maximum.
Run summaries, comparisons, pytest budgets and profile anchors all take their rank from here.
"""

from __future__ import annotations

import math
from fractions import Fraction

from .errors import UsageError

__all__ = ["nearest_rank"]


def _exact(p: float | int | Fraction) -> Fraction:
    if isinstance(p, float):
        if not math.isfinite(p):
            raise UsageError(f"percentile must be within [0, 100], got {p}")
        return Fraction(repr(p))  # the decimal the caller wrote, not the binary float
    return Fraction(p)


def nearest_rank(p: float | int | Fraction, n: int) -> int:
    """0-based index of the nearest-rank P(``p``) among ``n`` sorted values (``n`` ≥ 1).

    Raises:
        UsageError: ``p`` outside 0-100.
    """
    q = _exact(p)
    if not 0 <= q <= 100:
        raise UsageError(f"percentile must be within [0, 100], got {p}")
    return min(n - 1, max(0, math.ceil(q * n / 100) - 1))
