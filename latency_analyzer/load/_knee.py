"""Load points and the knee of a latency-against-load curve.

A :class:`LoadPoint` is one run of a sweep or of a search, reduced to what a curve needs: the
offered load (open-loop rate or closed-loop concurrency), the achieved request rate, P50, P95
and P99 of TTFT, TPOT and end-to-end latency, and, with SLOs, goodput and the verdict.

The knee (:func:`knee`) is the point of **maximum curvature** in the sense of the Kneedle
method (Satopää et al., 2011): both axes are scaled to [0, 1] over the points measured, and the
knee is the point that lies furthest below the straight line from the lightest to the heaviest
load, i.e. where latency stops growing in proportion to load and starts to climb. It is a
property of the range swept (a wider range moves it): read it as "where, in this sweep, the
curve bends".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..analysis import WaterfallSet, percentile
from ..errors import UsageError
from ._slo import Slo, SloReport, slo_report

__all__ = ["KNEE_METRICS", "LoadPoint", "knee", "load_point"]

#: Metrics a point keeps, and the percentiles of each.
_METRICS = {"ttft": "ttft_ns", "tpot": "tpot_ns", "e2e": "e2e_ns"}
_PERCENTILES = (50, 95, 99)
#: Curves the knee may be found on: ``metric_pNN``.
KNEE_METRICS = tuple(f"{m}_p{p}" for m in _METRICS for p in _PERCENTILES)
#: A point is saturated when it completes less than this share of what was offered.
_FOLLOWS = 0.9


@dataclass(frozen=True)
class LoadPoint:
    """One run of a sweep or search.

    Attributes:
        step: the run's ``step`` tag in the run file.
        key: ``"rate"`` (open loop, req/s offered) or ``"concurrency"`` (closed loop, users).
        level: the offered rate or the concurrency.
        requests: requests counted (warm-up rows left out).
        errors: failed requests among them.
        achieved_rps: ok requests completed per second over the run's span.
        latency_ns: ``{"e2e_p95": ns, ...}`` (NaN where no request had the metric).
        slo: the run against the SLOs, when some were given.
        client_note: the client's own health note when it lagged during the run (its event
            loop, pacer or reads late: the latencies include client delay), else None.
    """

    step: int
    key: str
    level: float
    requests: int
    errors: int
    achieved_rps: float
    latency_ns: dict[str, float] = field(default_factory=dict)
    slo: SloReport | None = None
    client_note: str | None = None

    @property
    def met(self) -> bool | None:
        """Every SLO met (None without SLOs)."""
        if self.slo is None:
            return None
        return all(self.slo.met(i) for i in range(len(self.slo.slos)))

    @property
    def goodput_rps(self) -> float | None:
        return None if self.slo is None else self.slo.goodput_rps

    @property
    def follows(self) -> bool:
        """The achieved rate keeps up with the offered one (open loop; always True closed)."""
        return self.key != "rate" or self.achieved_rps >= _FOLLOWS * self.level

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "step": self.step,
            self.key: self.level,
            "requests": self.requests,
            "errors": self.errors,
            "achieved_rps": _finite(self.achieved_rps),
            "latency_s": {k: _finite(v / 1e9) for k, v in self.latency_ns.items()},
        }
        if self.slo is not None:
            out["slo"] = self.slo.to_dict()
            out["met"] = self.met
            out["goodput_rps"] = _finite(self.slo.goodput_rps)
        if self.client_note is not None:
            out["client_note"] = self.client_note
        return out


def _finite(x: float) -> float | None:
    return None if math.isnan(x) else x


def load_point(
    ws: WaterfallSet,
    *,
    step: int,
    key: str,
    level: float,
    slos: Sequence[Slo] = (),
    client_note: str | None = None,
) -> LoadPoint:
    """Reduce one run's set to a point (warm-up rows left out, as in every statistic).

    ``client_note``: the run's client health note (``RunResult.client.note()``), kept on the point.
    """
    keep = ~ws.warmup
    ok = ws.ok & keep
    latency: dict[str, float] = {}
    for name, column in _METRICS.items():
        values = ws.column(column)[ok].astype(float)
        values = values[~np.isnan(values)]
        for p in _PERCENTILES:
            latency[f"{name}_p{p}"] = percentile(values, p)
    rps = float(ws.throughput()["requests_per_s"])
    report = slo_report(ws, list(slos)) if slos else None
    counted = int(keep.sum())
    errors = counted - int(ok.sum())
    return LoadPoint(step, key, level, counted, errors, rps, latency, report, client_note)


def knee(points: Sequence[LoadPoint], metric: str = "e2e_p95") -> LoadPoint | None:
    """The point of maximum curvature of ``metric`` against load (see the module's text).

    None when there is no bend to find: fewer than three points with the metric, latency that
    does not grow from the lightest to the heaviest load, or no point below the chord.

    Raises:
        UsageError: ``metric`` is not one of :data:`KNEE_METRICS`.
    """
    if metric not in KNEE_METRICS:
        raise UsageError(f"knee metric {metric!r}: expected one of {', '.join(KNEE_METRICS)}")
    usable = sorted(
        (p for p in points if not math.isnan(p.latency_ns.get(metric, math.nan))),
        key=lambda p: p.level,
    )
    if len(usable) < 3:
        return None
    x = np.array([p.level for p in usable], dtype=float)
    y = np.array([p.latency_ns[metric] for p in usable], dtype=float)
    if x[-1] <= x[0] or y[-1] <= y[0]:
        return None
    xn = (x - x[0]) / (x[-1] - x[0])
    yn = (y - y[0]) / (y[-1] - y[0])
    below = xn - yn  # how far each point lies under the chord from first to last
    best = int(np.argmax(below[1:-1])) + 1
    return usable[best] if below[best] > 0 else None
