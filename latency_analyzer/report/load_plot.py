"""A sweep's plot: latency percentiles against load, the knee marked, and the achieved rate.

``plot_load_curve(curve)`` draws two panels side by side. Left: P50, P95 and P99 of the
end-to-end latency and P95 of TTFT against the offered load (log latency axis), with the knee
as a dashed vertical line labelled with its load and the rule that found it. Right: the
achieved request rate against the load; for a rate sweep the line where achieved equals
offered is drawn, so the load at which the target stops following is seen where the points
leave it. Built on ``matplotlib.figure.Figure`` like the other plots (headless,
``fig.savefig("sweep.png")``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import UsageError
from ._figure import figure_class
from .palette import OKABE_ITO

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["LoadCurve", "plot_load_curve"]

_LINES = (  # (curve key, label, colour, marker)
    ("e2e_p50", "e2e P50", OKABE_ITO["sky_blue"], "o"),
    ("e2e_p95", "e2e P95", OKABE_ITO["blue"], "s"),
    ("e2e_p99", "e2e P99", OKABE_ITO["black"], "^"),
    ("ttft_p95", "TTFT P95", OKABE_ITO["reddish_purple"], "D"),
)


@dataclass(frozen=True)
class LoadCurve:
    """What the plot shows, as plain numbers.

    Attributes:
        key: ``"rate"`` (req/s offered) or ``"concurrency"`` (users).
        levels: the load of each point.
        latency_ns: curve key (``e2e_p95`` ...) → one value per point (NaN: none).
        achieved_rps: the achieved request rate of each point.
        knee: the knee's load (None: no knee found).
        knee_rule: how the knee was found, for its label.
        title: above both panels.
    """

    key: str
    levels: Sequence[float]
    latency_ns: Mapping[str, Sequence[float]]
    achieved_rps: Sequence[float]
    knee: float | None = None
    knee_rule: str = ""
    title: str = ""
    passed: Sequence[bool | None] = field(default_factory=tuple)


def plot_load_curve(curve: LoadCurve) -> Figure:
    """The two-panel figure (see the module's text).

    Raises:
        UsageError: matplotlib is not installed, or there are no points.
    """
    if not curve.levels:
        raise UsageError("nothing to plot: the sweep has no points")
    fig = figure_class()(figsize=(11.0, 4.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    _latency(left, curve)
    _achieved(right, curve)
    if curve.title:
        fig.suptitle(curve.title)
    return fig


def _axis_label(key: str) -> str:
    return "offered rate (req/s)" if key == "rate" else "concurrency (users)"


def _latency(ax: Axes, curve: LoadCurve) -> None:
    xs = list(curve.levels)
    for name, label, colour, marker in _LINES:
        ys = [v / 1e6 for v in curve.latency_ns.get(name, [math.nan] * len(xs))]
        pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if not math.isnan(y) and y > 0]
        if pairs:
            px, py = zip(*pairs, strict=True)
            ax.plot(px, py, marker=marker, color=colour, label=label, linewidth=1.6)
    if curve.knee is not None:
        ax.axvline(curve.knee, color=OKABE_ITO["vermillion"], linestyle="--", linewidth=1.4)
        unit = "req/s" if curve.key == "rate" else "users"
        text = f"knee: {curve.knee:g} {unit}"
        if curve.knee_rule:
            text += f"\n({curve.knee_rule})"
        right = curve.knee > (min(xs) + max(xs)) / 2  # past the middle: label to its left
        ax.annotate(
            text,
            xy=(curve.knee, 0.97),
            xycoords=("data", "axes fraction"),
            xytext=(-6 if right else 6, 0),
            textcoords="offset points",
            ha="right" if right else "left",
            va="top",
            color=OKABE_ITO["vermillion"],
            fontsize=9,
        )
    ax.set_yscale("log")
    ax.set_xlabel(_axis_label(curve.key))
    ax.set_ylabel("latency (ms, log scale)")
    ax.set_title("latency percentiles against load")
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # latency climbs to the right: the top is taken
        ax.legend(loc="lower right", fontsize=9)
    else:  # every request failed at every level
        ax.text(0.5, 0.5, "no latency: no request succeeded", transform=ax.transAxes, ha="center")


def _achieved(ax: Axes, curve: LoadCurve) -> None:
    xs = list(curve.levels)
    ax.plot(
        xs, list(curve.achieved_rps), marker="o", color=OKABE_ITO["bluish_green"], label="achieved"
    )
    if curve.key == "rate":
        top = max(xs)
        ax.plot([0, top], [0, top], color="#999999", linestyle=":", label="achieved = offered")
    for x, y, ok in zip(xs, curve.achieved_rps, curve.passed or [None] * len(xs), strict=True):
        if ok is not None:
            ax.annotate(
                "SLO met" if ok else "SLO missed",
                (x, y),
                xytext=(0, -14),
                textcoords="offset points",
                ha="center",
                fontsize=8,
                color=OKABE_ITO["bluish_green"] if ok else OKABE_ITO["vermillion"],
            )
    ax.set_xlabel(_axis_label(curve.key))
    ax.set_ylabel("achieved (req/s)")
    ax.set_title("throughput against load")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
