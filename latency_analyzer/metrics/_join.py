"""Per-request join: the server's gauges at each request's start and first token.

::

    cols = join(ws, scraper.series, "vllm")     # {"vllm_waiting@start": array, ...}
    busy = ws.where(cols["vllm_waiting@start"] > 8)
    busy.percentiles("ttft")["p99"]             # P99 TTFT when more than 8 requests waited
    print(explain(ws, cols, metric="ttft"))     # "ttft grew with vllm_waiting@start (ρ = 0.91 …)"

Both sides meet on one clock: a set's rows carry epoch ns (through their process's clock anchor)
and the series carries its own anchor, so a loaded run joins as a live one does; in one process
both anchors are the same and the join is exact on ``perf_counter_ns``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..analysis import WaterfallSet
from ..errors import UsageError
from ._presets import Metric, resolve
from ._series import MetricSeries
from ._timeseries import F64, TimeSeries

__all__ = ["POINTS", "Correlation", "correlate", "explain", "join", "request_instants"]

#: Instants of a request a value can be joined at.
POINTS = ("intended_start", "start", "first_token", "end")
_NETWORK = ("dns", "connect", "tls", "send")


def request_instants(ws: WaterfallSet, point: str, ms: MetricSeries) -> F64:
    """Each row's ``point`` on ``ms``'s perf clock (NaN where the request had none).

    ``start`` is when the request was really sent (the intended start plus ``schedule_lag``);
    ``intended_start`` the open-loop schedule's instant; ``first_token`` is NaN for a request
    that produced none.

    Raises:
        UsageError: an unknown point.
    """
    if point not in POINTS:
        raise UsageError(f"unknown point {point!r}; expected one of {POINTS}")
    a = ms.anchor
    base = (ws.column("epoch_ns") - a.epoch_ns + a.perf_ns).astype(np.float64)
    if point == "start" and "schedule_lag" in ws.stages:
        return np.asarray(base + ws.column("stage:schedule_lag"), dtype=np.float64)
    if point == "first_token":
        return np.asarray(base + ws.column("ttft_ns"), dtype=np.float64)
    if point == "end":
        return np.asarray(base + ws.column("e2e_ns"), dtype=np.float64)
    return base


def join(
    ws: WaterfallSet,
    ms: MetricSeries,
    metrics: str | Metric | Iterable[str | Metric] = ("vllm", "dcgm", "testbed"),
    *,
    at: Sequence[str] = ("start", "first_token"),
    target: str | None = None,
    max_age_s: float | None = None,
) -> dict[str, F64]:
    """For each request (row of ``ws``), each metric's value at each instant in ``at``.

    Args:
        ws: the requests.
        ms: the scraped series of the same run.
        metrics: preset names (``"vllm"``, ``"dcgm"``, ``"testbed"``; their metrics that were
            not scraped are skipped), metric names (gauges) or :class:`Metric` specs.
        at: instants from :data:`POINTS`.
        target: the target to read, when a name is scraped from several.
        max_age_s: a gauge's last value counts only this long (default: two scrape
            intervals), so a request inside a run of failed scrapes gets NaN, not a stale value.

    Returns:
        ``"<label>@<point>"`` → one float per row (NaN: unknown), in the set's row order.
    """
    series = resolve(ms, metrics, target)
    instants = {p: request_instants(ws, p, ms) for p in at}
    out: dict[str, F64] = {}
    for label, ts in series.items():
        age = _max_age_ns(ts, max_age_s)
        for p, t in instants.items():
            out[f"{label}@{p}"] = ts.at(t, max_age_ns=age)
    return out


def _max_age_ns(ts: TimeSeries, max_age_s: float | None) -> int | None:
    if max_age_s is not None:
        return round(max_age_s * 1e9)
    if len(ts) < 2:
        return None
    return int(2 * np.median(np.diff(ts.t_ns)))


@dataclass(frozen=True, slots=True)
class Correlation:
    """Spearman's rank correlation of a request metric with one joined column."""

    column: str
    rho: float
    n: int


def correlate(
    ws: WaterfallSet,
    joined: Mapping[str, F64],
    metric: str = "ttft",
    *,
    network: bool = True,
    include_warmup: bool = False,
) -> list[Correlation]:
    """How strongly ``metric`` moves with each joined column (and, with ``network``, with the
    client's network stages dns + connect + tls + send), strongest first. Ok rows only."""
    keep = ws.ok & (include_warmup | ~ws.warmup)
    y = _metric(ws, metric)
    cols = dict(joined)
    if network:
        present = [s for s in _NETWORK if s in ws.stages]
        net = sum((ws.column(f"stage:{s}").astype(np.float64) for s in present), np.zeros(len(ws)))
        cols["network(" + "+".join(_NETWORK) + ")"] = net
    out = []
    for name, x in cols.items():
        m = keep & np.isfinite(x) & np.isfinite(y)
        out.append(Correlation(name, _spearman(x[m], y[m]), int(m.sum())))
    return sorted(out, key=lambda c: -abs(c.rho) if np.isfinite(c.rho) else 0.0)


def explain(
    ws: WaterfallSet, joined: Mapping[str, F64], metric: str = "ttft", **kwargs: bool
) -> str:
    """One sentence: what ``metric`` grew with, and how little it did with the network."""
    corr = correlate(ws, joined, metric, **kwargs)
    if not corr or not np.isfinite(corr[0].rho):
        return f"{metric}: not enough data to say what it grew with"
    top = corr[0]
    text = f"{metric} grew with {top.column} (Spearman ρ = {top.rho:.2f}, n = {top.n})"
    net = [c for c in corr if c.column.startswith("network(") and c is not top]
    if net and np.isfinite(net[0].rho):
        text += f", not with the network (ρ = {net[0].rho:.2f})"
    return text


def _metric(ws: WaterfallSet, name: str) -> F64:
    cols = {"ttft": "ttft_ns", "e2e": "e2e_ns", "tpot": "tpot_ns"}
    if name not in cols:
        raise UsageError(f"correlate metric {name!r}; expected one of {sorted(cols)}")
    return np.asarray(ws.column(cols[name]), dtype=np.float64)


def _ranks(x: F64) -> F64:
    """Ranks 1..n, ties sharing their average rank."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    upper = np.cumsum(counts)
    return np.asarray((upper - (counts - 1) / 2.0)[inverse], dtype=np.float64)


def _spearman(x: F64, y: F64) -> float:
    if x.size < 3:
        return float("nan")
    rx, ry = _ranks(x), _ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")  # a constant column says nothing
    return float(np.corrcoef(rx, ry)[0, 1])
