"""One derived time series (a gauge, a counter's rate, a histogram's quantile) and lookups in it.

Instants are ``perf_counter_ns`` of the scraping process; the series' clock anchor maps them to
epoch ns, so a series loaded from a file still lines up with a loaded WaterfallSet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ..timeline import ClockAnchor

__all__ = ["Kind", "TimeSeries"]

Kind = Literal["gauge", "rate", "quantile"]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class TimeSeries:
    """Values over time, one per scrape (gauge) or per interval between scrapes (rate, quantile).

    Attributes:
        name: what it shows, e.g. ``"vllm:num_requests_waiting"`` or ``"...seconds:p99"``.
        kind: ``gauge`` (an instant value), ``rate`` (a counter's increase per second over an
            interval) or ``quantile`` (a histogram's quantile over the observations made in an
            interval).
        t_ns: the scrape instant (midpoint of request sent / response read) of a gauge, or the
            end of an interval, on the scraping process's ``perf_counter_ns`` clock.
        values: one value per instant (NaN: no observation in that interval).
        uncertainty_ns: half the width of the scrape's send/response bracket.
        start_ns: each interval's start (the previous scrape); equals ``t_ns`` for a gauge.
        anchor: the scraping process's clock anchor (perf ↔ epoch).
    """

    name: str
    kind: Kind
    t_ns: I64
    values: F64
    uncertainty_ns: I64
    start_ns: I64
    anchor: ClockAnchor

    def __len__(self) -> int:
        return int(self.t_ns.size)

    @property
    def epoch_ns(self) -> I64:
        """``t_ns`` as Unix epoch ns."""
        return np.asarray(self.t_ns - self.anchor.perf_ns + self.anchor.epoch_ns, dtype=np.int64)

    def elapsed_s(self, origin_ns: int | None = None) -> F64:
        """Seconds since ``origin_ns`` (perf clock; default: the first instant)."""
        if origin_ns is None:
            origin_ns = int(self.t_ns[0]) if len(self) else 0
        return np.asarray((self.t_ns - origin_ns) / 1e9, dtype=np.float64)

    def at(self, t_ns: npt.ArrayLike, *, max_age_ns: int | None = None) -> F64:
        """The value in force at each instant (perf ns); NaN where none is known.

        A gauge holds its last scraped value (Prometheus' instant-query rule): the sample at or
        before ``t``, if it is at most ``max_age_ns`` old. A rate or quantile gives the value of
        the interval ``(start, end]`` holding ``t``.
        """
        t = np.asarray(t_ns, dtype=np.float64)
        out = np.full(t.shape, np.nan)
        if len(self) == 0:
            return out
        if self.kind == "gauge":
            i = np.searchsorted(self.t_ns, t, side="right") - 1
            ok = i >= 0
            if max_age_ns is not None:
                ok &= t - self.t_ns[np.maximum(i, 0)] <= max_age_ns
        else:
            i = np.searchsorted(self.t_ns, t, side="left")
            ok = (i < len(self)) & (t > self.start_ns[np.minimum(i, len(self) - 1)])
        out[ok] = self.values[i[ok]]
        return out

    def at_epoch(self, epoch_ns: npt.ArrayLike, *, max_age_ns: int | None = None) -> F64:
        """:meth:`at` for instants given as Unix epoch ns (e.g. a loaded set's ``epoch_ns``)."""
        e = np.asarray(epoch_ns)
        shift = self.anchor.perf_ns - self.anchor.epoch_ns
        if np.issubdtype(e.dtype, np.integer):  # exact: subtract before going to float
            return self.at((e.astype(np.int64) + shift).astype(np.float64), max_age_ns=max_age_ns)
        return self.at(e.astype(np.float64) + shift, max_age_ns=max_age_ns)

    def stats(self) -> dict[str, float]:
        """``n``, ``min``, ``p50``, ``p95``, ``max``, ``last`` over the finite values."""
        v = self.values[np.isfinite(self.values)]
        if v.size == 0:
            return {"n": 0.0, "min": np.nan, "p50": np.nan, "p95": np.nan, "max": np.nan}
        p50, p95 = np.percentile(v, [50, 95], method="inverted_cdf")
        return {
            "n": float(v.size),
            "min": float(v.min()),
            "p50": float(p50),
            "p95": float(p95),
            "max": float(v.max()),
            "last": float(v[-1]),
        }

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (epoch ns, so another process can read it)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "epoch_ns": self.epoch_ns.tolist(),
            "values": [None if not np.isfinite(v) else float(v) for v in self.values],
            "uncertainty_ns": self.uncertainty_ns.tolist(),
        }
