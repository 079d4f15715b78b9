"""The sweep plot reads on its own: the knee named in the legend and ringed on its curve, and
the log latency axis ticked in plain milliseconds."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import numpy as np
import pytest

from latency_analyzer.report.load_plot import LoadCurve, plot_load_curve

if TYPE_CHECKING:
    from matplotlib.axes import Axes

LEVELS = [20.0, 60.0, 100.0, 130.0, 150.0]
E2E_P95_MS = [30.0, 29.0, 60.0, 94.0, 230.0]


def _curve(knee_metric: str = "e2e_p95") -> LoadCurve:
    p95 = [v * 1e6 for v in E2E_P95_MS]
    return LoadCurve(
        key="rate",
        levels=LEVELS,
        latency_ns={
            "e2e_p50": [v / 2 for v in p95],
            "e2e_p95": p95,
            "e2e_p99": [v * 1.2 for v in p95],
            "ttft_p95": p95,
        },
        achieved_rps=[19.6, 58.7, 97.0, 120.0, 123.0],
        knee=130.0,
        knee_rule="max. curvature of e2e_p95",
        title="sweep of rate: s.jsonl",
        passed=[True, True, False, False, False],
        knee_metric=knee_metric,
    )


def _drawn(curve: LoadCurve) -> Axes:
    fig = plot_load_curve(curve)
    fig.savefig(io.BytesIO(), format="png")  # lays the ticks and the legend out
    return fig.axes[0]


def test_the_knee_is_in_the_legend_with_its_load_and_rule() -> None:
    ax = _drawn(_curve())
    legend = ax.get_legend()
    assert legend is not None
    labels = [t.get_text() for t in legend.get_texts()]
    assert "knee: 130 req/s (max. curvature of e2e_p95)" in labels
    assert {"e2e P50", "e2e P95", "e2e P99", "TTFT P95"} <= set(labels)
    assert not ax.texts  # no label drawn over the curves


def test_the_knee_is_ringed_on_the_curve_it_was_found_on() -> None:
    ax = _drawn(_curve())
    rings = [ln for ln in ax.lines if ln.get_markerfacecolor() == "none"]
    assert len(rings) == 1
    assert np.asarray(rings[0].get_xdata()).tolist() == [130.0]
    assert np.asarray(rings[0].get_ydata()).tolist() == pytest.approx([94.0])
    # A knee metric that is not drawn (tpot_p95) has no ring, only the line.
    ax = _drawn(_curve("tpot_p95"))
    assert not [ln for ln in ax.lines if ln.get_markerfacecolor() == "none"]


def test_latency_ticks_are_plain_milliseconds() -> None:
    ax = _drawn(_curve())
    lo, hi = ax.get_ylim()
    shown = [
        t.get_text()
        for t in ax.yaxis.get_ticklabels(which="both")
        if t.get_text() and lo <= t.get_position()[1] <= hi
    ]
    assert shown and all(x.replace(".", "").isdigit() for x in shown), shown
    assert {"20", "50", "100", "200"} <= set(shown)


def test_a_narrow_latency_axis_labels_every_tick_and_users_come_whole() -> None:
    p95 = [10e6, 15e6, 27e6]
    curve = LoadCurve(
        key="concurrency",
        levels=[1, 2, 4],
        latency_ns={"e2e_p50": [7e6, 13e6, 24e6], "e2e_p95": p95},
        achieved_rps=[119.0, 143.0, 138.0],
        knee=2,
        knee_metric="e2e_p95",
    )
    ax = _drawn(curve)
    lo, hi = ax.get_ylim()
    shown = {
        t.get_text()
        for t in ax.yaxis.get_ticklabels(which="both")
        if t.get_text() and lo <= t.get_position()[1] <= hi
    }
    assert {"10", "20"} < shown and len(shown) >= 4, shown  # 8, 9, 10, 20 ... not just 10, 20
    for axes in (ax, _drawn(curve).figure.axes[1]):
        xs = [t for t in axes.get_xticks() if axes.get_xlim()[0] <= t <= axes.get_xlim()[1]]
        assert all(float(t).is_integer() for t in xs), xs
