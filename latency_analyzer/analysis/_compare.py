"""Speedups with confidence intervals, claim checks and a GPU-cost translation.

A *speedup* is baseline / candidate for a latency statistic (2.0: the candidate takes half
the time). Its CI comes from independent bootstraps of both sides (the exact order-statistic
bootstrap of ``_stats`` for percentiles), ratio taken resample by resample.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._units import is_number
from ..errors import UsageError
from ._set import WaterfallSet
from ._stats import Estimate, FloatArray, interval, mean_samples, percentile, percentile_samples

__all__ = ["ClaimCheck", "Comparison", "Speedup", "check_claim", "compare", "gpu_cost"]

_DEFAULT_STATS = ("p50", "p95", "p99")


def _split(metric: str) -> tuple[str, str]:
    """``"ttft_p95"`` → ``("ttft", "p95")``; ``"wait_mean"`` → ``("wait", "mean")``."""
    name, sep, stat = metric.rpartition("_")
    if not sep or not (stat == "mean" or (stat.startswith("p") and is_number(stat[1:]))):
        raise UsageError(f"metric must look like 'ttft_p95' or 'e2e_mean', got {metric!r}")
    return name, stat


def _point_and_samples(
    values: FloatArray, stat: str, resamples: int, seed: int
) -> tuple[float, FloatArray]:
    if stat == "mean":
        point = float(values.mean()) if values.size else math.nan
        return point, mean_samples(values, resamples, seed)
    p = float(stat[1:])
    return percentile(values, p), percentile_samples(values, p, resamples, seed)


@dataclass(frozen=True)
class Speedup:
    """One statistic on both sides and their ratio.

    Attributes:
        name: metric or stage; ``stat``: ``p95``, ``mean`` ...; ``group``: the scenario, or
            ``"overall"`` for the weighted combination.
        baseline, candidate: the statistic (seconds) with its CI on each side.
        ratio: baseline / candidate with its CI (> 1: the candidate is faster).
    """

    group: str
    name: str
    stat: str
    baseline: Estimate
    candidate: Estimate
    ratio: Estimate

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "metric": f"{self.name}_{self.stat}",
            **{
                k: [e.value, e.low, e.high]
                for k, e in (("baseline", self.baseline), ("candidate", self.candidate))
            },
            "speedup": [self.ratio.value, self.ratio.low, self.ratio.high],
        }


@dataclass(frozen=True)
class Comparison:
    """Every :class:`Speedup` of a comparison, per scenario and overall."""

    rows: list[Speedup]
    confidence: float

    def get(self, metric: str, group: str = "overall") -> Speedup:
        name, stat = _split(metric)
        for r in self.rows:
            if (r.group, r.name, r.stat) == (group, name, stat):
                return r
        raise KeyError(f"{metric} in {group}")

    def to_dict(self) -> dict[str, Any]:
        return {"confidence": self.confidence, "rows": [r.to_dict() for r in self.rows]}

    def to_text(self) -> str:
        lines = [f"{'group':14}{'metric':22}{'baseline ms':>14}{'candidate ms':>14}  speedup"]
        for r in self.rows:
            lines.append(
                f"{r.group[:13]:14}{r.name + '_' + r.stat:22}"
                f"{r.baseline.value * 1e3:>14.3f}{r.candidate.value * 1e3:>14.3f}"
                f"  {r.ratio.format('.3g', '×')}"
            )
        lines.append(f"speedup = baseline / candidate; [{self.confidence:.0%} bootstrap CI]")
        return "\n".join(lines)


def _ratio(
    group: str,
    name: str,
    stat: str,
    base: WaterfallSet,
    cand: WaterfallSet,
    conf: float,
    resamples: int,
    seed: int,
) -> tuple[Speedup, FloatArray]:
    bv, cv = base.values(name), cand.values(name)
    b, bs = _point_and_samples(bv, stat, resamples, seed)
    c, cs = _point_and_samples(cv, stat, resamples, seed + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rs = bs / cs
    lo, hi = interval(rs, conf)
    b_est = Estimate(b, *interval(bs, conf), int(bv.size), conf) if bv.size else _nan(conf)
    c_est = Estimate(c, *interval(cs, conf), int(cv.size), conf) if cv.size else _nan(conf)
    value = b / c if c else math.nan  # a stage both sides lack has no speedup
    return Speedup(group, name, stat, b_est, c_est, Estimate(value, lo, hi, 0, conf)), rs


def _nan(conf: float) -> Estimate:
    return Estimate(math.nan, math.nan, math.nan, 0, conf)


def compare(
    baseline: WaterfallSet,
    candidate: WaterfallSet,
    *,
    metrics: Sequence[str] | None = None,
    stats: Sequence[str] = _DEFAULT_STATS,
    weights: Mapping[str, float] | None = None,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    pair_by: str = "auto",
) -> Comparison:
    """Speedup (baseline / candidate) per scenario, metric/stage and statistic, plus overall.

    Args:
        baseline, candidate: the two runs (warm-up rows and errors are left out).
        metrics: metric and stage names; default: the metrics both have and ``wait``,
            ``first_token``, ``decode`` when present.
        stats: ``p50``, ``p95``, ``p99.9``, ``mean`` ...
        weights: scenario → weight for the overall figure; default: the baseline's request
            share of each scenario. Overall = weighted geometric mean of the scenario
            speedups (resample by resample, so it has a CI too). With one scenario (or none
            named), overall is that scenario's speedup.
        confidence, resamples, seed: of the bootstrap.
        pair_by: how scenarios of the two runs are paired: ``"name"`` (the same scenario
            name), ``"position"`` (first with first, second with second, in the order they
            first appear; for two runs of one scenario under different names) or ``"auto"``
            (by name when the runs share one, else by position).

    Raises:
        UsageError: nothing to pair (no shared name; by position, different counts).
    """
    names = list(metrics or _default_metrics(baseline, candidate))
    bgroups, cgroups = _pair(_scenarios(baseline), _scenarios(candidate), pair_by)
    shared = list(bgroups)
    w = _weights(weights, {g: len(bgroups[g]) for g in shared})
    rows: list[Speedup] = []
    for name in names:
        for stat in stats:
            overall = np.zeros(resamples)
            per: list[Speedup] = []
            for g in shared:
                sp, rs = _ratio(g, name, stat, bgroups[g], cgroups[g], confidence, resamples, seed)
                per.append(sp)
                with np.errstate(divide="ignore", invalid="ignore"):  # a 0-length stage
                    overall += w[g] * np.log(rs)
            rows += per if len(shared) > 1 else []
            rows.append(_overall(name, stat, per, overall, w, baseline, candidate, confidence))
    return Comparison(rows, confidence)


def _overall(
    name: str,
    stat: str,
    per: list[Speedup],
    log_samples: FloatArray,
    w: Mapping[str, float],
    baseline: WaterfallSet,
    candidate: WaterfallSet,
    conf: float,
) -> Speedup:
    if len(per) == 1:
        one = per[0]
        return Speedup("overall", name, stat, one.baseline, one.candidate, one.ratio)
    logs = [w[s.group] * math.log(s.ratio.value) for s in per if s.ratio.value > 0]
    value = math.exp(sum(logs)) if len(logs) == len(per) else math.nan
    lo, hi = interval(np.exp(log_samples), conf)
    b, c = _nan(conf), _nan(conf)
    return Speedup("overall", name, stat, b, c, Estimate(value, lo, hi, 0, conf))


def _default_metrics(a: WaterfallSet, b: WaterfallSet) -> list[str]:
    have = set(a.metric_names()) & set(b.metric_names())
    wanted = ("ttft", "tpot", "e2e", "wait", "first_token", "decode")
    return [m for m in wanted if m in have]


def _scenarios(ws: WaterfallSet) -> dict[str, WaterfallSet]:
    """The set's scenarios by name, in the order they first appear."""
    labels = list(dict.fromkeys(ws.labels("scenario")))
    if len(labels) <= 1:
        return {str(next(iter(labels), None) or "all"): ws}
    groups = {str(k): v for k, v in ws.group_by("scenario").items()}
    return {str(k): groups[str(k)] for k in labels if str(k) in groups}


Groups = dict[str, WaterfallSet]


def _pair(b: Groups, c: Groups, pair_by: str) -> tuple[Groups, Groups]:
    """The scenarios to compare, under one label per pair."""
    if pair_by not in ("auto", "name", "position"):
        raise UsageError(f"pair_by must be 'auto', 'name' or 'position', not {pair_by!r}")
    shared = [g for g in b if g in c]
    if pair_by == "name" or (pair_by == "auto" and shared):
        if not shared:
            raise UsageError(
                f"the two sets share no scenario name (baseline: {', '.join(b)}; candidate: "
                f"{', '.join(c)}); pair them by position instead"
            )
        return {g: b[g] for g in shared}, {g: c[g] for g in shared}
    if len(b) != len(c):
        raise UsageError(
            f"cannot pair by position: the baseline has {len(b)} scenarios ({', '.join(b)}), "
            f"the candidate {len(c)} ({', '.join(c)})"
        )
    labels = [bn if bn == cn else f"{bn} vs {cn}" for bn, cn in zip(b, c, strict=True)]
    return dict(zip(labels, b.values(), strict=True)), dict(zip(labels, c.values(), strict=True))


def _weights(given: Mapping[str, float] | None, counts: Mapping[str, int]) -> dict[str, float]:
    raw = {g: float((given or counts).get(g, 0.0)) for g in counts}
    total = sum(raw.values())
    if total <= 0:
        raise UsageError("weights must add up to more than 0")
    return {g: v / total for g, v in raw.items()}


@dataclass(frozen=True)
class ClaimCheck:
    """A claimed speedup against the measured one.

    ``verdict``: ``"supported"`` (the whole CI is at or above the claim), ``"consistent"``
    (the claim lies inside the CI) or ``"not supported"`` (the claim is above the CI).
    """

    claimed: float
    metric: str
    measured: Estimate
    verdict: str

    def __str__(self) -> str:
        m = self.measured
        return (
            f"{self.metric}: claimed {self.claimed:g}×, measured {m.value:.2g}× "
            f"[{m.low:.2g}, {m.high:.2g}]: {self.verdict}"
        )


def check_claim(
    baseline: WaterfallSet,
    candidate: WaterfallSet,
    *,
    claimed: float,
    metric: str = "ttft_p95",
    confidence: float = 0.95,
    seed: int = 0,
    weights: Mapping[str, float] | None = None,
    pair_by: str = "auto",
) -> ClaimCheck:
    """Is "candidate is ``claimed``× faster on ``metric``" borne out by the measurements?

    ``str()`` of the result reads e.g. "ttft_p95: claimed 15×, measured 5.7× [5.2, 6.1]:
    not supported".
    """
    name, stat = _split(metric)
    comp = compare(
        baseline,
        candidate,
        metrics=[name],
        stats=[stat],
        confidence=confidence,
        seed=seed,
        weights=weights,
        pair_by=pair_by,
    )
    r = comp.get(metric).ratio
    if claimed <= r.low:
        verdict = "supported"
    elif claimed <= r.high:
        verdict = "consistent"
    else:
        verdict = "not supported"
    return ClaimCheck(claimed, metric, r, verdict)


def gpu_cost(
    *,
    demand_rps: float,
    throughput_rps: float,
    price_per_gpu_hour: float,
    gpus_per_replica: int = 1,
    hours_per_month: float = 730.0,
) -> dict[str, float]:
    """GPU-hours and cost per month to serve ``demand_rps`` at a measured throughput.

    Replicas are ``demand / throughput`` (fractional: an average, not a deployment plan).

    Raises:
        UsageError: a throughput that is not positive.
    """
    if not throughput_rps > 0:
        raise UsageError("throughput_rps must be > 0")
    replicas = demand_rps / throughput_rps
    hours = replicas * gpus_per_replica * hours_per_month
    return {
        "replicas": replicas,
        "gpu_hours_per_month": hours,
        "cost_per_month": hours * price_per_gpu_hour,
    }
