"""A speedup in money: the model is gpu_cost's, the CI follows the speedup's."""

from __future__ import annotations

import math

import pytest

from latency_analyzer import UsageError
from latency_analyzer.analysis import Estimate, gpu_cost, money_case, monthly_saving


def test_saving_is_todays_cost_minus_gpu_cost_at_the_new_throughput() -> None:
    # a fleet: 40 req/s of demand at 2.5 req/s per 2-GPU replica, 3.0 per GPU-hour
    today = gpu_cost(demand_rps=40, throughput_rps=2.5, price_per_gpu_hour=3.0, gpus_per_replica=2)
    faster = gpu_cost(
        demand_rps=40, throughput_rps=2.5 * 4, price_per_gpu_hour=3.0, gpus_per_replica=2
    )
    cost = today["cost_per_month"]
    assert monthly_saving(cost, 4.0) == pytest.approx(cost - faster["cost_per_month"])
    assert monthly_saving(cost, 4.0) == pytest.approx(cost * 0.75)
    assert monthly_saving(cost, 1.0) == 0.0
    assert monthly_saving(cost, 0.5) == pytest.approx(-cost)  # twice as slow: twice the GPUs
    assert math.isnan(monthly_saving(cost, math.nan))


def test_a_claimed_and_a_measured_speedup_of_a_1_2_m_fleet() -> None:
    case = money_case(
        metric="ttft_p95",
        cost_per_month=1.2e6,
        claimed=15.0,
        measured=Estimate(5.7, 5.2, 6.1, 400),
        migration_cost=2e6,
        months=12,
    )
    lines = case.lines()
    assert lines[1] == "claimed 15× saves 1.12 M/month"
    assert lines[2] == "measured 5.7× [5.2, 6.1] saves 0.99 M [0.97, 1.00]/month"
    # 12 × 1.2e6 × (1 − 1/15) − 2e6 = 11.44e6; measured: 12 × 1.2e6 × (1 − 1/5.7) − 2e6
    net = case.net("measured")
    assert net is not None
    assert net.value == pytest.approx(12 * 1.2e6 * (1 - 1 / 5.7) - 2e6)
    assert (net.low, net.high) == pytest.approx(
        (12 * 1.2e6 * (1 - 1 / 5.2) - 2e6, 12 * 1.2e6 * (1 - 1 / 6.1) - 2e6)
    )
    assert lines[3] == (
        "net of migration (2.00 M) over 12 months: claimed 11.44 M; measured 9.87 M [9.63, 10.04]"
    )
    payback = case.payback_months("measured")
    assert payback is not None
    assert payback.value == pytest.approx(2e6 / (1.2e6 * (1 - 1 / 5.7)))
    assert payback.low < payback.value < payback.high  # the faster end pays back sooner
    d = case.to_dict()
    assert d["claimed"]["saving_per_month"] == pytest.approx(1.12e6)
    assert d["measured"]["saving_per_month"][0] == pytest.approx(1.2e6 * (1 - 1 / 5.7))


def test_a_slower_candidate_never_pays_back() -> None:
    case = money_case(
        metric="e2e_p50",
        cost_per_month=5000,
        measured=Estimate(0.8, 0.7, 1.2, 100),
        migration_cost=1000,
    )
    assert case.lines()[1] == "measured 0.8× [0.7, 1.2] saves -1.25 k [-2.14, 0.83]/month"
    assert case.lines()[2] == "migration (1.00 k) pays back in: measured never [1.2, never] months"
    assert case.to_dict()["measured"]["payback_months"] == [None, pytest.approx(1.2), None]


@pytest.mark.parametrize(
    ("key", "value"),
    [("cost_per_month", 0.0), ("migration_cost", -1.0), ("months", 0.0), ("claimed", -2.0)],
)
def test_money_inputs_must_be_above_zero(key: str, value: float) -> None:
    kwargs = {"metric": "ttft_p95", "cost_per_month": 100.0, "claimed": 2.0, key: value}
    with pytest.raises(UsageError, match=f"{key} must be above 0"):
        money_case(**kwargs)  # type: ignore[arg-type]


def test_money_needs_a_speedup() -> None:
    with pytest.raises(UsageError, match="a claimed or a measured speedup"):
        money_case(metric="ttft_p95", cost_per_month=100.0)


def test_money_needs_a_measured_speedup_that_is_a_number() -> None:
    nan = Estimate(math.nan, math.nan, math.nan, 0)
    with pytest.raises(UsageError, match="no measured speedup of connect_p50"):
        money_case(metric="connect_p50", cost_per_month=100.0, measured=nan)
    wide = money_case(
        metric="ttft_p99", cost_per_month=100.0, measured=Estimate(2.0, math.nan, math.nan, 3)
    )
    assert wide.lines()[1] == "measured 2× [nan, nan] saves 50.00 [n/a, n/a]/month"
