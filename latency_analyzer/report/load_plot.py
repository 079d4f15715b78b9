"""A sweep's plot: latency percentiles against load, the knee marked, and the achieved rate.

``plot_load_curve(curve)`` draws two panels side by side. Left: P50, P95 and P99 of the
end-to-end latency and P95 of TTFT against the offered load (log latency axis, ticks in plain
milliseconds), with the knee as a dashed vertical line named in the legend with its load and
the rule that found it, and ringed on the curve it was found on. Right: the
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
        passed: per point, whether it met its SLOs (None: no SLO given).
        knee_metric: the curve the knee was found on (``e2e_p95`` ...): ringed at the knee
            when it is drawn.
    """

    key: str
    levels: Sequence[float]
    latency_ns: Mapping[str, Sequence[float]]
    achieved_rps: Sequence[float]
    knee: float | None = None
    knee_rule: str = ""
    title: str = ""
    passed: Sequence[bool | None] = field(default_factory=tuple)
    knee_metric: str = ""


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
        unit = "req/s" if curve.key == "rate" else "users"
        text = f"knee: {curve.knee:g} {unit}"
        if curve.knee_rule:
            text += f" ({curve.knee_rule})"
        # In the legend, not over the curves: latency climbs where the knee is.
        ax.axvline(
            curve.knee, color=OKABE_ITO["vermillion"], linestyle="--", linewidth=1.4, label=text
        )
        at = _knee_latency_ms(curve)
        if at is not None:
            ax.plot(
                [curve.knee], [at], marker="o", markersize=13, markerfacecolor="none",
                markeredgecolor=OKABE_ITO["vermillion"], markeredgewidth=2, linestyle="none",
            )  # fmt: skip
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter, MaxNLocator  # the figure is made: it is there

    def plain(value: float, _pos: float) -> str:
        low, high = ax.get_ylim()
        return _plain_ms(value, narrow=high < 12 * low)

    ax.yaxis.set_major_formatter(FuncFormatter(plain))  # "200", not "2 × 10²"
    ax.yaxis.set_minor_formatter(FuncFormatter(plain))
    if curve.key == "concurrency":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # users come whole
    ax.set_xlabel(_axis_label(curve.key))
    ax.set_ylabel("latency (ms, log scale)")
    ax.set_title("latency percentiles against load")
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        # below the panel: wherever it sits inside, some sweep's curves pass under it
        ax.legend(
            loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize=9, frameon=False
        )
    else:  # every request failed at every level
        ax.text(0.5, 0.5, "no latency: no request succeeded", transform=ax.transAxes, ha="center")


def _knee_latency_ms(curve: LoadCurve) -> float | None:
    """The knee metric's value at the knee, in ms, where that curve is drawn."""
    drawn = {name for name, *_ in _LINES}
    if curve.knee is None or curve.knee_metric not in drawn:
        return None
    values = curve.latency_ns.get(curve.knee_metric, ())
    for level, v in zip(curve.levels, values, strict=False):
        if level == curve.knee and not math.isnan(v) and v > 0:
            return v / 1e6
    return None


def _plain_ms(value: float, *, narrow: bool) -> str:
    """A log axis' tick as a plain number: on an axis spanning about a decade or less every
    tick is labelled, on a wider one the 1, 2 and 5 of each decade."""
    if value <= 0:
        return ""
    mantissa = round(value / 10 ** math.floor(math.log10(value) + 1e-9), 6)
    if not narrow and mantissa not in (1.0, 2.0, 5.0):
        return ""
    return f"{value:g}"


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
    if curve.key == "concurrency":
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
