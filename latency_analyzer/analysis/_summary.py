"""The end-of-run summary: percentiles with CIs per metric and stage, counts, throughput."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._columns import COUNT_METRICS
from ._stats import PERCENTILES, Estimate

if TYPE_CHECKING:
    from ._set import WaterfallSet

__all__ = ["Row", "Summary"]


@dataclass(frozen=True)
class Row:
    """One metric or stage: its mean and percentiles (seconds, or a count for tokens)."""

    name: str
    unit: str
    n: int
    mean: Estimate
    percentiles: dict[str, Estimate]

    def to_dict(self) -> dict[str, Any]:
        est = {"mean": self.mean, **self.percentiles}
        return {
            "name": self.name,
            "unit": self.unit,
            "n": self.n,
            **{k: [e.value, e.low, e.high] for k, e in est.items()},
        }


@dataclass(frozen=True)
class Summary:
    """What a run says: counts, throughput, and a :class:`Row` per metric and stage.

    Attributes:
        notes: sentences a reader must see (a saturated target or client, few samples).
    """

    counts: dict[str, Any]
    throughput: dict[str, float]
    rows: list[Row]
    confidence: float
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        ws: WaterfallSet,
        *,
        names: Sequence[str] | None = None,
        ps: Sequence[float] = PERCENTILES,
        confidence: float = 0.95,
        seed: int = 0,
    ) -> Summary:
        rows = []
        for name in names or ws.metric_names():
            vals = ws.values(name)
            pct = ws.percentiles(name, ps, confidence=confidence, seed=seed)
            mean = ws.mean(name, confidence=confidence, seed=seed)
            unit = "tokens" if name in COUNT_METRICS else "s"
            rows.append(Row(name, unit, int(vals.size), mean, pct))
        notes = []
        n = rows[0].n if rows else 0
        top = max(ps) if ps else 0
        if n and n * (1 - top / 100) < 10:
            notes.append(f"P{top:g} rests on fewer than 10 samples above it (n={n})")
        return cls(ws.counts(), ws.throughput(), rows, confidence, notes)

    def row(self, name: str) -> Row:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "counts": self.counts,
            "throughput": self.throughput,
            "confidence": self.confidence,
            "rows": [r.to_dict() for r in self.rows],
            "notes": list(self.notes),
        }

    def to_text(self) -> str:
        """A plain-text table: ms for times, with the CI of each percentile under it."""
        if not self.rows:
            return "no requests"
        keys = ["mean", *self.rows[0].percentiles]
        lines = [f"{'':14}" + "".join(f"{k:>20}" for k in keys)]
        for r in self.rows:
            scale, unit = (1e3, "ms") if r.unit == "s" else (1.0, "")
            cells = [r.mean, *r.percentiles.values()]
            lines.append(f"{r.name + ' ' + unit:14}" + "".join(_cell(e, scale) for e in cells))
        c, t = self.counts, self.throughput
        lines.append(
            f"requests {c['requests']}  ok {c['ok']}  errors {c['errors']} {c['errors_by_type']}"
            f"  warm-up excluded {c['warmup']}  {t['requests_per_s']:.1f} req/s"
            f"  {t['output_tokens_per_s']:.0f} tok/s"
        )
        lines.append(f"[brackets]: {self.confidence:.0%} bootstrap confidence interval")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _cell(e: Estimate, scale: float) -> str:
    if math.isnan(e.value):
        return f"{'n/a':>20}"
    text = f"{e.value * scale:.3g} [{e.low * scale:.3g},{e.high * scale:.3g}]"
    return f"{text:>20}"
