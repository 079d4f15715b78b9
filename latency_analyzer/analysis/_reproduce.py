"""Do several runs of one setup reproduce each other within a tolerance?

The rule, per metric and statistic (``ttft_p95`` ...): k runs **reproduce within X** when every
run is within a factor ``1 + X`` of every other, i.e. the largest run's statistic over the
smallest is at most ``1 + X``, and the data show it. Each pair of runs (i, j) has the ratio
``s_i / s_j`` with its confidence interval from independent bootstraps of both runs (the
machinery of :func:`~latency_analyzer.analysis.compare`, ratio taken resample by resample):

* a pair **agrees** when its whole interval lies inside ``[1/(1+X), 1+X]``;
* a pair **differs** when its whole interval lies outside that band;
* otherwise the pair is **inconclusive** (more requests per run would decide).

The pairs' intervals hold together at the confidence asked (Bonferroni: with m pairs, each is
a ``1 − (1 − confidence)/m`` interval; 98.3 % each for three runs at 95 %), so a verdict is
wrong at most 5 % of the time however many runs are compared, as far as the bootstrap is
accurate for the sample sizes at hand.

A statistic **reproduces** when every pair agrees, **does not reproduce** when a pair differs,
and is **inconclusive** otherwise; **n/a** when a run has no value, or a value of 0 (a stage
that did not happen), for it. The ratios are signed (not folded into max / min resample by
resample, whose bootstrap leans high), so equal runs with noisy tails come out "inconclusive",
not "does not reproduce". The spread shown is max / min of the runs' statistics, with the CI of
that pair's ratio.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import UsageError
from ._compare import _DEFAULT_STATS, _point_and_samples
from ._set import WaterfallSet
from ._stats import Estimate, FloatArray, interval

__all__ = ["Pair", "Reproduction", "Spread", "parse_tolerance", "reproduce", "spread_of"]

#: The verdicts, in the order the verdict line lists them.
REPRODUCES, DOES_NOT, INCONCLUSIVE, NOT_APPLICABLE = (
    "reproduces",
    "does not reproduce",
    "inconclusive",
    "n/a",
)
_VERDICTS = (REPRODUCES, DOES_NOT, INCONCLUSIVE, NOT_APPLICABLE)
_WANTED = ("ttft", "tpot", "e2e", "wait", "first_token", "decode")


def parse_tolerance(text: str) -> float:
    """``"5%"`` or ``"0.05"`` → 0.05.

    Raises:
        UsageError: not a number, not above 0, or a bare number of 1 or more (``5`` is
            ambiguous: write ``5%`` or ``0.05``).
    """
    raw = text.strip()
    percent = raw.endswith("%")
    try:
        value = float(raw[:-1] if percent else raw)
    except ValueError:
        raise UsageError(f"{text!r} is not a tolerance: write e.g. 5% or 0.05") from None
    if percent:
        value /= 100
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"the tolerance must be above 0, got {text!r}")
    if not percent and value >= 1:
        raise UsageError(
            f"{text!r} is ambiguous as a tolerance: write {raw}% for percent, or a fraction "
            "below 1 such as 0.05"
        )
    return value


def _triple(e: Estimate) -> list[float | None]:
    """``[value, low, high]`` for JSON (null where there is no number)."""
    return [x if math.isfinite(x) else None for x in (e.value, e.low, e.high)]


@dataclass(frozen=True)
class Pair:
    """Run ``i`` over run ``j`` for one statistic: the ratio with its CI, and its verdict."""

    i: int
    j: int
    ratio: Estimate
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        r = self.ratio
        ratio = _triple(r)
        return {"runs": [self.i, self.j], "ratio": ratio, "verdict": self.verdict}


@dataclass(frozen=True)
class Spread:
    """One statistic across the runs.

    Attributes:
        name, stat: metric or stage and statistic (``"ttft"``, ``"p95"``).
        runs: each run's statistic (seconds) with its CI, in the runs' order.
        spread: max / min of the runs' statistics, with the CI of that pair's ratio.
        verdict: ``"reproduces"``, ``"does not reproduce"``, ``"inconclusive"`` or ``"n/a"``.
        pairs: every pair of runs (i < j) with its ratio and verdict.
    """

    name: str
    stat: str
    runs: list[Estimate]
    spread: Estimate
    verdict: str
    pairs: list[Pair]

    @property
    def metric(self) -> str:
        return f"{self.name}_{self.stat}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "runs": [_triple(e) for e in self.runs],
            "spread": _triple(self.spread),
            "verdict": self.verdict,
            "pairs": [p.to_dict() for p in self.pairs],
        }


@dataclass(frozen=True)
class Reproduction:
    """Every :class:`Spread` of a set of runs, with the tolerance they were held to."""

    names: list[str]
    within: float
    confidence: float
    rows: list[Spread]

    def get(self, metric: str) -> Spread:
        for r in self.rows:
            if r.metric == metric:
                return r
        raise KeyError(metric)

    def by_verdict(self) -> dict[str, list[str]]:
        """Verdict → the metrics that got it (every verdict present, possibly empty)."""
        out: dict[str, list[str]] = {v: [] for v in _VERDICTS}
        for r in self.rows:
            out[r.verdict].append(r.metric)
        return out

    @property
    def reproduces(self) -> bool:
        """True when no statistic was shown not to reproduce."""
        return not self.by_verdict()[DOES_NOT]

    def rule(self) -> str:
        """The definition the verdicts follow, in one sentence."""
        band = f"[{1 / (1 + self.within):.4g}, {1 + self.within:.4g}]"
        each = pair_confidence(self.confidence, len(self.names))
        joint = f"{self.confidence:.0%} for all pairs together"
        if len(self.names) > 2:
            joint += f": {each:.1%} each"
        return (
            f"reproduces within {_pct(self.within)}: for every pair of runs, the bootstrap CI "
            f"of their ratio ({joint}) lies inside {band}; does not: some pair's CI lies "
            "wholly outside it; else inconclusive. spread = largest run / smallest run, with "
            "that pair's CI"
        )

    def verdict_line(self) -> str:
        """E.g. "reproduces within 5%: ttft_p50, e2e_p50; does not: tpot_p50; ..."."""
        groups = self.by_verdict()
        parts = [f"reproduces within {_pct(self.within)}: {_names(groups[REPRODUCES])}"]
        parts.append(f"does not: {_names(groups[DOES_NOT])}")
        if groups[INCONCLUSIVE]:
            parts.append(f"inconclusive (more requests needed): {_names(groups[INCONCLUSIVE])}")
        if groups[NOT_APPLICABLE]:
            parts.append(f"n/a: {_names(groups[NOT_APPLICABLE])}")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": list(self.names),
            "within": self.within,
            "confidence": self.confidence,
            "rule": self.rule(),
            "rows": [r.to_dict() for r in self.rows],
            "verdict": self.by_verdict(),
            "reproduces": self.reproduces,
        }

    def to_text(self) -> str:
        width = max(20, *(len(n) + 3 for n in self.names))
        head = f"{'metric':18}" + "".join(f"{n + ' ms':>{width}}" for n in self.names)
        lines = [
            f"{len(self.names)} runs held to {_pct(self.within)}: {', '.join(self.names)}",
            head + f"{'spread':>22}  verdict",
        ]
        for r in self.rows:
            cells = "".join(f"{e.scaled(1e3).format('.3g'):>{width}}" for e in r.runs)
            lines.append(f"{r.metric:18}{cells}{r.spread.format('.3g', '×'):>22}  {r.verdict}")
        lines.append(f"run cells: the statistic in ms [{self.confidence:.0%} bootstrap CI]")
        lines += [self.rule(), self.verdict_line()]
        return "\n".join(lines)


def _pct(x: float) -> str:
    return f"{x * 100:g}%"


def _names(metrics: list[str]) -> str:
    return ", ".join(metrics) if metrics else "none"


def reproduce(
    runs: Sequence[WaterfallSet],
    *,
    within: float,
    names: Sequence[str] | None = None,
    metrics: Sequence[str] | None = None,
    stats: Sequence[str] = _DEFAULT_STATS,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Reproduction:
    """Whether ``runs`` (two or more of one setup) reproduce within ``within`` (0.05: 5%).

    Args:
        runs: the runs, whole (every scenario of a run together; warm-up rows and errors
            left out).
        within: the tolerance, a fraction above 0.
        names: one per run (default ``run1``, ``run2`` ...).
        metrics: metric and stage names; default: those of ``ttft``, ``tpot``, ``e2e``,
            ``wait``, ``first_token``, ``decode`` that every run has.
        stats: ``p50``, ``p95``, ``p99.9``, ``mean`` ...
        confidence, resamples, seed: of the bootstrap (run i uses ``seed + i``).

    Raises:
        UsageError: fewer than two runs, a tolerance not above 0, names that do not match,
            a run without requests, or (``metrics`` None) no metric every run has.
    """
    if len(runs) < 2:
        raise UsageError(f"reproduction needs two runs or more, got {len(runs)}")
    if not (math.isfinite(within) and within > 0):
        raise UsageError(f"the tolerance must be above 0, got {within!r}")
    labels = list(names) if names is not None else [f"run{i + 1}" for i in range(len(runs))]
    if len(labels) != len(runs):
        raise UsageError(f"{len(labels)} names for {len(runs)} runs")
    empty = [label for label, r in zip(labels, runs, strict=True) if len(r) == 0]
    if empty:  # else nothing is compared, and "none does not reproduce" would pass
        raise UsageError(f"{', '.join(empty)}: no requests (not a run file, or an empty run)")
    if metrics is None:
        have = set.intersection(*(set(r.metric_names()) for r in runs))
        metrics = [m for m in _WANTED if m in have]
        if not metrics:
            raise UsageError(f"the runs have none of {', '.join(_WANTED)} in common")
    rows = []
    for name in metrics:
        values = [r.values(name) for r in runs]
        rows += [
            spread_of(values, name, stat, within, confidence, resamples, seed) for stat in stats
        ]
    return Reproduction(labels, within, confidence, rows)


def spread_of(
    values: Sequence[FloatArray],
    name: str,
    stat: str,
    within: float,
    conf: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Spread:
    """The :class:`Spread` of one statistic over runs given as arrays of values (seconds)."""
    estimates: list[Estimate] = []
    samples: list[FloatArray] = []
    for i, vals in enumerate(values):
        point, boot = _point_and_samples(vals, stat, resamples, seed + i)
        samples.append(boot)
        lo, hi = interval(boot, conf) if vals.size else (math.nan, math.nan)
        estimates.append(Estimate(point, lo, hi, int(vals.size), conf))
    points = [e.value for e in estimates]
    if not all(math.isfinite(v) and v > 0 for v in points):
        nan = Estimate(math.nan, math.nan, math.nan, 0, conf)
        return Spread(name, stat, estimates, nan, NOT_APPLICABLE, [])
    pairs: list[Pair] = []
    pair_conf = pair_confidence(conf, len(values))
    for i, j in itertools.combinations(range(len(values)), 2):
        with np.errstate(divide="ignore", invalid="ignore"):  # a resample of a mostly-0 stage
            lo, hi = interval(samples[i] / samples[j], pair_conf)
        ratio = Estimate(points[i] / points[j], lo, hi, 0, pair_conf)
        pairs.append(Pair(i, j, ratio, _pair_verdict(ratio, within)))
    top, bottom = int(np.argmax(points)), int(np.argmin(points))
    spread = next(_oriented(p, top, bottom) for p in pairs if {p.i, p.j} == {top, bottom})
    verdicts = {p.verdict for p in pairs}
    if DOES_NOT in verdicts:
        verdict = DOES_NOT
    elif verdicts == {REPRODUCES}:
        verdict = REPRODUCES
    elif NOT_APPLICABLE in verdicts:
        verdict = NOT_APPLICABLE
    else:
        verdict = INCONCLUSIVE
    return Spread(name, stat, estimates, spread, verdict, pairs)


def pair_confidence(confidence: float, runs: int) -> float:
    """Each pair's confidence, so that all ``runs·(runs−1)/2`` pairs hold together at
    ``confidence`` (Bonferroni): 1 − (1 − confidence) / pairs."""
    pairs = runs * (runs - 1) // 2
    return 1 - (1 - confidence) / max(pairs, 1)


def _pair_verdict(ratio: Estimate, within: float) -> str:
    lo, hi, band = ratio.low, ratio.high, 1 + within
    if math.isnan(lo) or math.isnan(hi):
        return NOT_APPLICABLE
    if 1 / band <= lo and hi <= band:
        return REPRODUCES
    if lo > band or hi < 1 / band:
        return DOES_NOT
    return INCONCLUSIVE


def _oriented(pair: Pair, top: int, bottom: int) -> Estimate:
    """The pair's ratio as run ``top`` over run ``bottom`` (>= 1 at the point)."""
    r = pair.ratio
    if (pair.i, pair.j) == (top, bottom):
        return r
    return Estimate(1 / r.value, 1 / r.high, 1 / r.low, 0, r.confidence)
