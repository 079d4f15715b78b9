"""The run summary's metrics table: each selected series' spread over the run, and the gaps."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

from ._presets import Metric, resolve
from ._series import MetricSeries

__all__ = ["summary_rows", "summary_text"]

_ALL_PRESETS = ("vllm", "dcgm", "testbed")


def summary_rows(
    ms: MetricSeries, metrics: str | Metric | Iterable[str | Metric] = _ALL_PRESETS
) -> list[dict[str, Any]]:
    """One row per selected series: ``label``, ``kind``, ``n``, ``min``, ``p50``, ``p95``,
    ``max``, ``last`` (NaN when no value)."""
    rows = []
    for label, ts in resolve(ms, metrics).items():
        rows.append({"label": label, "name": ts.name, "kind": ts.kind, **ts.stats()})
    return rows


def summary_text(
    ms: MetricSeries, metrics: str | Metric | Iterable[str | Metric] = _ALL_PRESETS
) -> str:
    """A plain-text table for the run summary, then a line per target with its gaps."""
    lines = [f"{'server metric':<32} {'n':>5} {'min':>10} {'p50':>10} {'p95':>10} {'max':>10}"]
    for r in summary_rows(ms, metrics):
        cells = " ".join(_fmt(r.get(k, math.nan)) for k in ("min", "p50", "p95", "max"))
        lines.append(f"{r['label']:<32} {int(r['n']):>5} {cells}")
    for target, url in ms.targets.items():
        ok = int(ms.scrapes(target)["ok"].sum())
        reasons = Counter(g.reason for g in ms.gaps if g.target == target)
        gaps = sum(reasons.values())
        text = f"{target} ({url}): {ok} scrapes, {gaps} gaps"
        if reasons:
            text += " — " + "; ".join(f"{n}× {why}" for why, n in reasons.most_common(3))
        lines.append(text)
    return "\n".join(lines)


def _fmt(x: float) -> str:
    if not math.isfinite(x):
        return f"{'-':>10}"
    return f"{x:>10.4g}"
