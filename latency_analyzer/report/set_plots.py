"""Many requests in one figure (``latency-analyzer[plots]``).

``plot_set(data)``: a 2×2 figure: what P50/P95/P99 requests are made of
(``plot_attribution``), latency over time with warm-up shaded (``plot_over_time``), and
TTFT/ITL distributions, CDF and histogram (``plot_distributions``).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ..analysis import WaterfallSet
from ..errors import UsageError
from ..timeline import Waterfall
from ._figure import figure_class, label_text, new_axes
from .palette import colour

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["plot_attribution", "plot_distributions", "plot_over_time", "plot_set"]

_BANDS = (50.0, 95.0, 99.0)
_BAND_HALF_WIDTH = 2.5  # percentile points either side of P50/P95/P99 averaged into its bar


def _as_set(data: WaterfallSet | Iterable[Waterfall]) -> tuple[WaterfallSet, list[float] | None]:
    """The set, and per-token ITLs in seconds when waterfalls were given (a set has none)."""
    if isinstance(data, WaterfallSet):
        return data, None
    wfs = list(data)
    ws = WaterfallSet()
    ws.extend(wfs)
    return ws, [g for wf in wfs if wf.ok for g in wf.itl]


def _kept(ws: WaterfallSet) -> npt.NDArray[np.bool_]:
    return np.asarray(ws.ok & ~ws.warmup, dtype=bool)


def _bands(ws: WaterfallSet) -> list[tuple[str, int, dict[str, float], float]]:
    """Per band: its name, how many requests it averages, their mean attribution (ms, path
    order) and the percentile's own e2e (ms, nearest rank)."""
    keep = _kept(ws)
    e2e = ws.column("e2e_ns")[keep]
    if e2e.size == 0:
        return []
    ranks = 100.0 * (np.argsort(np.argsort(e2e, kind="stable")) + 0.5) / e2e.size
    stages = {s: ws.column(f"stage:{s}")[keep] / 1e6 for s in ws.stages}
    out = []
    for p in _BANDS:
        near = np.abs(ranks - p) <= _BAND_HALF_WIDTH
        if not near.any():
            near = np.abs(ranks - p) == np.abs(ranks - p).min()
        means = {s: float(v[near].mean()) for s, v in stages.items() if v[near].any()}
        value = float(np.percentile(e2e, p, method="inverted_cdf")) / 1e6
        out.append((f"P{p:g}", int(near.sum()), means, value))
    return out


def plot_attribution(ws: WaterfallSet, ax: Axes | None = None) -> Axes:
    """Stacked bars: what a P50, P95 and P99 request (by e2e) spends in each stage.

    Each bar is the mean attribution of the requests whose e2e lies within ±2.5 percentile
    points of that percentile, so its segments add up to about that percentile's e2e, not
    exactly: the label says both (the bar's mean and the percentile), and a black tick marks
    the percentile itself on the bar. The legend lists stages in path order.
    """
    ax = ax if ax is not None else new_axes((9.0, 3.2))
    bands = _bands(ws)
    seen: list[str] = []
    for y, (name, _, means, value) in enumerate(bands):
        left = 0.0
        for stage, ms in means.items():
            ax.barh(
                y,
                ms,
                left=left,
                color=colour(stage),
                edgecolor="white",
                linewidth=0.5,
                height=0.6,
                gid=f"band:{stage}",
                label=None if stage in seen else stage,
            )
            seen.append(stage)
            left += ms
        ax.vlines(value, y - 0.38, y + 0.38, colors="#000000", linewidth=1.6, gid="percentile")
        ax.annotate(
            f"mean {label_text(left)}\n{name} {label_text(value)}",
            (max(left, value), y),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
            gid=f"label:{name}",
        )
    ax.set_yticks(range(len(bands)), [f"{name} (n={n})" for name, n, _, _ in bands])
    ax.set_ylim(len(bands) - 0.4, -0.6)
    widest = max((max(sum(m.values()), v) for *_, m, v in bands), default=1.0)
    ax.set_xlim(0, widest * 1.3)  # room for the labels
    ax.set_xlabel("ms: each bar is the mean attribution of the n requests around the percentile")
    ax.set_title("Where the time goes, by e2e percentile (| = the percentile)", fontsize=10,
                 loc="left")  # fmt: skip
    handles, labels = ax.get_legend_handles_labels()
    order = {name: i for i, name in enumerate(ws.stages)}
    pairs = sorted(zip(handles, labels, strict=True), key=lambda hl: order.get(hl[1], len(order)))
    ax.legend(
        [h for h, _ in pairs],
        [label for _, label in pairs],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
        frameon=False,
    )
    return ax


def plot_over_time(ws: WaterfallSet, ax: Axes | None = None) -> Axes:
    """TTFT and e2e of each request against its start time; warm-up requests shaded."""
    ax = ax if ax is not None else new_axes((9.0, 3.2))
    t = ws.elapsed_s()
    ok = np.asarray(ws.ok, dtype=bool)
    e2e = ws.column("e2e_ns") / 1e6
    ttft = ws.column("ttft_ns") / 1e6
    ax.scatter(t[ok], e2e[ok], s=10, color=colour("decode"), label="e2e", gid="e2e")
    ax.scatter(
        t[ok], ttft[ok], s=10, color=colour("first_token"), marker="^", label="TTFT", gid="ttft"
    )
    if (~ok).any():
        ax.scatter(t[~ok], e2e[~ok], s=18, color=colour("wait"), marker="x", label="failed")
    warm = np.asarray(ws.warmup, dtype=bool)
    if warm.any():
        # up to the first measured request (not the last warm-up start: that leaves a sliver),
        # and never narrower than 2 % of the axis, so a short warm-up is still seen
        rest = t[~warm]
        end = float(rest.min()) if rest.size else float(t.max())
        end = max(end, float(t[warm].max()), 0.02 * float(t.max() or 1.0))
        ax.axvspan(
            0, end, facecolor="#F0E0B0", edgecolor="#B08830", hatch="//", alpha=0.5,
            linewidth=0.8, zorder=0, gid="warmup", label=f"warm-up ({int(warm.sum())} requests)",
        )  # fmt: skip
    ax.set_xlabel("s since the first request")
    ax.set_ylabel("ms")
    ax.set_ylim(bottom=0)
    ax.set_title("Latency over time", fontsize=10, loc="left")
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax


def _log_bins(*samples: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    vals = np.concatenate([s[s > 0] for s in samples]) if samples else np.zeros(0)
    if vals.size == 0:
        return np.array([0.1, 1.0])
    lo, hi = float(vals.min()), float(vals.max())
    return np.geomspace(lo * 0.9, hi * 1.1, 30)


def _plain_log_ticks(ax: Axes) -> None:
    """Ticks at 1-2-5 steps labelled as plain numbers: matplotlib's default labels every
    minor tick of a short log axis as 2×10⁰, 3×10⁰ ..., which collide."""
    ticker = importlib.import_module("matplotlib.ticker")
    ax.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())


def plot_distributions(
    ws: WaterfallSet, ax_cdf: Axes, ax_hist: Axes, itl_s: Sequence[float] | None = None
) -> tuple[Axes, Axes]:
    """TTFT and ITL (per-token, from waterfalls) or TPOT (per request, from a set): their
    CDFs and histograms on a log time axis (they differ by orders of magnitude)."""
    ttft = ws.values("ttft") * 1e3
    if itl_s is not None:
        other, name = np.asarray(itl_s, dtype=np.float64) * 1e3, "ITL (per token)"
    else:
        other, name = ws.values("tpot") * 1e3, "TPOT (per request)"
    series = [("TTFT", ttft, colour("first_token")), (name, other, colour("decode"))]
    bins = _log_bins(ttft, other)
    for label, vals, fill in series:
        if vals.size == 0:
            continue
        # a log axis has no 0: gaps of 0 (tokens that came in one chunk) stay in the counts,
        # so the CDF starts at their share, and the legend says how many there are
        zeros = int(np.count_nonzero(vals <= 0))
        xs = np.sort(vals[vals > 0])
        ys = (zeros + np.arange(1, xs.size + 1)) / vals.size
        text = f"{label}, n={vals.size}"
        if zeros:
            text += f"; {zeros} of 0 ms ({zeros / vals.size:.0%}): the curve starts there"
        ax_cdf.step(xs, ys, where="post", color=fill, label=text, gid=label)
        # as fractions: thousands of ITL samples would flatten a hundred TTFTs to nothing
        weights = np.full(xs.size, 1.0 / vals.size)
        hist_label = label + (f" ({zeros} of 0 ms: no bin on a log axis)" if zeros else "")
        ax_hist.hist(
            xs, bins=list(bins), weights=weights, color=fill, alpha=0.6, label=hist_label, gid=label
        )
    for ax, title, ylabel in (
        (ax_cdf, "Distribution (CDF)", "fraction of samples ≤ x"),
        (ax_hist, "Histogram", "fraction of samples"),
    ):
        ax.set_xscale("log")
        _plain_log_ticks(ax)
        ax.set_xlabel("ms (log scale)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10, loc="left")
        ax.legend(fontsize=8, frameon=False, loc="best")
        ax.grid(color="#EEEEEE", linewidth=0.6)
    return ax_cdf, ax_hist


def plot_set(data: WaterfallSet | Iterable[Waterfall], *, title: str | None = None) -> Figure:
    """A 2×2 summary figure of many requests; returns the Figure.

    Axes (``fig.axes``): attribution by percentile, latency over time, CDF, histogram.
    Given waterfalls, the distributions show per-token ITL; given a ``WaterfallSet`` (which
    keeps no token gaps), per-request TPOT.

    Raises:
        UsageError: matplotlib is not installed, or there are no requests.
    """
    ws, itl = _as_set(data)
    if len(ws) == 0:
        raise UsageError("nothing to plot: the set is empty")
    fig = figure_class()(figsize=(13.0, 8.0), layout="constrained")
    grid = fig.subplots(2, 2)
    plot_attribution(ws, grid[0][0])
    plot_over_time(ws, grid[0][1])
    plot_distributions(ws, grid[1][0], grid[1][1], itl)
    counts = ws.counts()
    fig.suptitle(
        title
        or f"{counts['requests']} requests, {counts['errors']} failed, "
        f"{counts['warmup']} warm-up (left out of the statistics)",
        fontsize=11,
    )
    return fig
