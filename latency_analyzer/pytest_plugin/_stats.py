"""Per-request samples of a stage or metric, and the statistics budgets bound (pure Python).

Percentiles are nearest-rank (``latency_analyzer._rank``, the definition run summaries use):
P(q) is the ``ceil(q/100 · n)``-th smallest value, an observed one, with the rank computed in
exact arithmetic, so ``p95`` of a few hand-written values can be checked by hand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from .._budget_keys import METRIC_NAMES, SERVER_ONLY_STAGES
from .._rank import nearest_rank
from ..errors import UsageError
from ..timeline import Waterfall

__all__ = ["Samples", "percentile", "samples", "statistic"]


def percentile(values: Sequence[float], q: Fraction | float) -> float:
    """The ``q``-th percentile (0-100) of ``values`` by nearest rank: an observed value.

    The same definition as ``latency_analyzer.analysis`` (run summaries, comparisons), so a
    budget and a run report never disagree about what "p95" was. Exact for decimal ``q``.

    Raises:
        UsageError: no values, or ``q`` outside 0-100.
    """
    if not values:
        raise UsageError("percentile of no values")
    ordered = sorted(values)
    return float(ordered[nearest_rank(q, len(ordered))])


def statistic(values: Sequence[float], stat: str, quantile: Fraction | None) -> float:
    """``max``, ``min``, ``mean`` or the ``pNN`` percentile (``quantile``) of ``values``."""
    if stat == "max":
        return float(max(values))
    if stat == "min":
        return float(min(values))
    if stat == "mean":
        return math.fsum(values) / len(values)
    if quantile is None:
        raise UsageError(f"statistic {stat!r} needs a quantile")
    return percentile(values, quantile)


@dataclass(frozen=True, slots=True)
class Samples:
    """The values (ns) of one stage or metric, each with the index of the request it came from.

    Attributes:
        values: nanoseconds; one per request (stages, ttft, tpot, e2e) or per token (itl).
        owners: for each value, the index of its waterfall in the test's recording order.
        unmeasured: requests that have no value (no token for ttft, fewer than two tokens for
            tpot and itl, no server spans for a server-only stage).
    """

    values: tuple[float, ...]
    owners: tuple[int, ...]
    unmeasured: int


def _metric_ns(wf: Waterfall, name: str) -> list[float]:
    if name == "e2e":
        return [float(wf.e2e_ns)]
    if name == "ttft":
        return [] if wf.ttft_ns is None else [float(wf.ttft_ns)]
    if name == "tpot":
        return [] if wf.tpot is None else [wf.tpot * 1e9]
    return [g * 1e9 for g in wf.itl]  # itl: every per-token gap


def _has_server_spans(wf: Waterfall) -> bool:
    return any(span.source == "server" for span in wf.root.walk())


def _values_ns(wf: Waterfall, name: str, attribution: dict[str, int]) -> list[float]:
    if name in METRIC_NAMES:
        return _metric_ns(wf, name)
    if name in SERVER_ONLY_STAGES and not _has_server_spans(wf):
        return []
    # a request without the stage spent 0 ns in it (a reused connection has no dns/connect/tls)
    return [float(attribution.get(name, 0))]


def samples(
    name: str, waterfalls: Sequence[Waterfall], attributions: Sequence[dict[str, int]]
) -> Samples:
    """Collect ``name`` over ``waterfalls`` (``attributions[i]`` is ``waterfalls[i]``'s)."""
    values: list[float] = []
    owners: list[int] = []
    unmeasured = 0
    for index, (wf, attribution) in enumerate(zip(waterfalls, attributions, strict=True)):
        got = _values_ns(wf, name, attribution)
        if not got:
            unmeasured += 1
        values.extend(got)
        owners.extend([index] * len(got))
    return Samples(tuple(values), tuple(owners), unmeasured)
