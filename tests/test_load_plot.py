"""The sweep plot draws the numbers it is given: each latency curve's points are the points'
values in ms, the knee's line stands at the knee's load; a sweep whose every request failed
still draws (no legend of nothing: with filterwarnings = error its warning would fail here)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("matplotlib", reason="needs matplotlib: pip install 'latency-analyzer[plots]'")

from latency_analyzer.report.load_plot import LoadCurve, plot_load_curve

LEVELS = [10.0, 20.0, 40.0]


def test_the_curves_are_the_points_values_and_the_knee_its_load() -> None:
    e2e_p95 = [5e6, 6e6, 50e6]
    curve = LoadCurve(
        key="rate",
        levels=LEVELS,
        latency_ns={"e2e_p95": e2e_p95, "ttft_p95": [1e6, math.nan, 3e6]},
        achieved_rps=[10.0, 19.5, 30.0],
        knee=20.0,
        knee_rule="max. curvature of e2e_p95",
    )
    left, right = plot_load_curve(curve).axes
    lines = {line.get_label(): line for line in left.get_lines()}
    assert list(lines["e2e P95"].get_xdata()) == LEVELS
    assert list(lines["e2e P95"].get_ydata()) == [v / 1e6 for v in e2e_p95]
    assert list(lines["TTFT P95"].get_xdata()) == [10.0, 40.0]  # the NaN point left out
    knee = [line for line in left.get_lines() if line.get_linestyle() == "--"]
    assert len(knee) == 1 and list(knee[0].get_xdata()) == [20.0, 20.0]
    achieved = {line.get_label(): line for line in right.get_lines()}["achieved"]
    assert list(achieved.get_ydata()) == [10.0, 19.5, 30.0]


def test_a_sweep_without_one_success_still_draws() -> None:
    nan = [math.nan] * len(LEVELS)
    curve = LoadCurve(
        key="rate",
        levels=LEVELS,
        latency_ns={"e2e_p50": nan, "e2e_p95": nan, "e2e_p99": nan, "ttft_p95": nan},
        achieved_rps=nan,
    )
    left, _ = plot_load_curve(curve).axes
    assert left.get_legend() is None
    assert [t.get_text() for t in left.texts] == ["no latency: no request succeeded"]
