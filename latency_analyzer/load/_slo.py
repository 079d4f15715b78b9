"""SLOs of a load run and its goodput: ``--slo ttft_p95=800ms,tpot_p99=50ms``.

Keys are the pytest budgets' (:mod:`latency_analyzer._budget_keys`): a metric (``ttft``,
``tpot``, ``e2e``) or a stage (``connect``, ``server_queue``, ...) with an optional statistic
(``_p95``, ``_p99``, ``_mean``, ``_max``, none: every request). Values are durations with a unit,
read as the budgets read them (``800ms``, ``0.8s``, ``500us``).

Each SLO is checked twice:

* over the run: the statistic of the requests' values (nearest-rank percentiles, as every
  percentile here) against the limit: met or not;
* per request, for goodput: a request is *good* when it succeeded and each of its values is
  within every SLO's limit (the statistic names how many must be; each request is held to the
  limit itself). A request without a value (no TTFT from a failed stream, no TPOT with one
  output token) does not meet that SLO.

Goodput is good requests per second over the span throughput uses (first start to last end of
the ok requests); warm-up rows are left out of both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from .._budget_keys import METRIC_NAMES, STAGE_NAMES, parse_key
from .._units import format_ns, is_number, parse_duration_ns
from ..analysis import WaterfallSet, percentile
from ..errors import UsageError

__all__ = ["Slo", "SloReport", "parse_slos", "slo_report"]

_COLUMNS = {"ttft": "ttft_ns", "tpot": "tpot_ns", "e2e": "e2e_ns"}


@dataclass(frozen=True)
class Slo:
    """One objective: ``stat`` of ``name`` within ``limit_ns``."""

    key: str
    name: str
    stat: str
    quantile: Fraction | None
    limit_ns: int

    @property
    def column(self) -> str:
        return _COLUMNS.get(self.name, f"stage:{self.name}")


def parse_slos(text: str) -> list[Slo]:
    """Parse ``"ttft_p95=800ms,tpot_p99=50ms"``.

    Raises:
        UsageError: an unknown key, a value that is not a duration or has no unit, a
            per-token metric (``itl``: goodput counts requests), a key given twice.
    """
    out: list[Slo] = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise UsageError(f"SLO {item!r}: expected KEY=DURATION, e.g. ttft_p95=800ms")
        name, stat, quantile = parse_key(key)
        if name not in (*METRIC_NAMES, *STAGE_NAMES) or name == "itl":
            raise UsageError(f"SLO {key!r}: itl is per token and goodput counts requests; use tpot")
        if is_number(value):  # 800 would be read as 800 s: the unit is the user's to say
            raise UsageError(f"SLO {key!r}: {value!r} has no unit; write {value}ms or {value}s")
        try:
            limit = parse_duration_ns(value)
        except UsageError as exc:
            raise UsageError(f"SLO {key!r}: {exc}") from None
        if any(s.key == key for s in out):
            raise UsageError(f"SLO {key!r} is given twice")
        out.append(Slo(key, name, stat, quantile, limit))
    if not out:
        raise UsageError("no SLO given; expected e.g. ttft_p95=800ms,tpot_p99=50ms")
    return out


@dataclass(frozen=True)
class SloReport:
    """The run against its SLOs: each one's measured statistic, and goodput."""

    slos: list[Slo]
    measured_ns: list[float]  # the statistic over the run (nan: no values)
    good: int  # requests that met every SLO
    counted: int  # requests counted (not warm-up)
    span_s: float

    @property
    def goodput_rps(self) -> float:
        return self.good / self.span_s if self.span_s > 0 else math.nan

    def met(self, i: int) -> bool:
        return bool(self.measured_ns[i] <= self.slos[i].limit_ns)

    def lines(self) -> list[str]:
        """One line per SLO, then goodput."""
        out = []
        for i, s in enumerate(self.slos):
            m = self.measured_ns[i]
            shown = "no values" if math.isnan(m) else format_ns(m)
            verdict = "met" if self.met(i) else "NOT met"
            out.append(f"SLO {s.key} <= {format_ns(s.limit_ns)}: {shown}, {verdict}")
        out.append(
            f"goodput: {self.goodput_rps:.2f} req/s ({self.good} of {self.counted} requests "
            "met every SLO)"
        )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "slos": [
                {
                    "key": s.key,
                    "limit_s": s.limit_ns / 1e9,
                    "measured_s": None if math.isnan(m) else m / 1e9,
                    "met": self.met(i),
                }
                for i, (s, m) in enumerate(zip(self.slos, self.measured_ns, strict=True))
            ],
            "goodput_rps": None if math.isnan(self.goodput_rps) else self.goodput_rps,
            "good": self.good,
            "requests": self.counted,
            "span_s": self.span_s,
        }


def slo_report(ws: WaterfallSet, slos: list[Slo]) -> SloReport:
    """Check ``ws`` (warm-up rows left out) against ``slos``."""
    keep = ~ws.warmup
    ok = ws.ok & keep
    good = ok.copy()
    measured = []
    for s in slos:
        values = ws.column(s.column).astype(float)
        good &= ~np.isnan(values) & (values <= s.limit_ns)
        measured.append(_statistic(values[ok & ~np.isnan(values)], s))
    span = ws.throughput()["span_s"]
    return SloReport(slos, measured, int(good.sum()), int(keep.sum()), float(span))


def _statistic(x: npt.NDArray[np.float64], s: Slo) -> float:
    if x.size == 0:
        return math.nan
    if s.stat == "max":
        return float(x.max())
    if s.stat == "min":
        return float(x.min())
    if s.stat == "mean":
        return float(x.mean())
    return percentile(x, float(s.quantile or 0))  # nearest rank: a value that was observed
