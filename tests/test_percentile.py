"""One percentile definition: run summaries, streaming histograms' ranks, pytest budgets and
profile anchors agree for every n and p, and decimal p is read as written (P99.9 of 1,000 values
is the 999th smallest, not the maximum)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from latency_analyzer._rank import nearest_rank
from latency_analyzer.analysis import percentile as set_percentile
from latency_analyzer.errors import UsageError
from latency_analyzer.pytest_plugin import percentile as budget_percentile

# p as users write it: up to three decimals, 0..100
decimal_p = st.integers(min_value=0, max_value=100_000).map(lambda k: k / 1000)


@given(n=st.integers(min_value=1, max_value=5000), p=decimal_p)
def test_every_user_of_the_rank_agrees(n: int, p: float) -> None:
    values = list(range(1, n + 1))  # the k-th smallest is k
    exact = math.ceil(Fraction(repr(p)) * n / 100)  # the definition, by hand, 1-based
    want = float(min(n, max(1, exact)))
    assert nearest_rank(p, n) + 1 == want
    assert set_percentile(np.array(values, dtype=float), p) == want
    assert budget_percentile(values, p) == want
    assert budget_percentile(values, Fraction(repr(p))) == want


@given(n=st.integers(min_value=1, max_value=5000))
def test_the_rank_is_numpys_inverted_cdf_on_integers(n: int) -> None:
    values = np.arange(1, n + 1, dtype=float)
    for p in (0, 1, 10, 25, 50, 75, 90, 95, 99, 100):  # integers: no decimal reading involved
        assert set_percentile(values, p) == np.percentile(values, p, method="inverted_cdf")


def test_p99_9_of_a_thousand_is_not_the_maximum() -> None:
    values = np.arange(1, 1001, dtype=float)
    assert set_percentile(values, 99.9) == 999.0  # float arithmetic gave 1000
    assert budget_percentile(list(values), 99.9) == 999.0
    assert nearest_rank(10, 30) == 2  # 0.1 * 30 in floats is 3.0000000000000004


@pytest.mark.parametrize("p", [-0.001, 100.001, float("nan"), float("inf")])
def test_outside_0_100_is_a_usage_error(p: float) -> None:
    with pytest.raises(UsageError):
        nearest_rank(p, 10)
