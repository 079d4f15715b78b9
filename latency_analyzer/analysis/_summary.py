"""The end-of-run summary: percentiles with CIs per metric and stage, counts, throughput."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._columns import COUNT_METRICS
from ._stats import (
    BOOTSTRAP_MAX,
    PERCENTILES,
    Estimate,
    mean_ci,
    means_ci,
    p_key,
    percentiles_ci,
)

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
        conditions: what the run was measured under, from the set's metadata: target, base
            RTT, HTTP and TLS versions, the machine, the client's health (empty when the set
            carries none).
    """

    counts: dict[str, Any]
    throughput: dict[str, float]
    rows: list[Row]
    confidence: float
    notes: list[str] = field(default_factory=list)
    conditions: dict[str, Any] = field(default_factory=dict)

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
        parts: list[tuple[str, int, dict[str, Estimate]]] = []
        means: dict[int, Estimate] = {}
        small: dict[int, Any] = {}  # the columns whose means are resampled together
        for i, name in enumerate(names or ws.metric_names()):
            vals = ws.values(name)  # once: what ws.percentiles and ws.mean would each select
            est = percentiles_ci(vals, ps, confidence=confidence, seed=seed)
            parts.append((name, int(vals.size), {p_key(p): e for p, e in est.items()}))
            if vals.size > BOOTSTRAP_MAX:  # a large column is not held past its own row
                means[i] = mean_ci(vals, confidence=confidence, seed=seed)
            else:
                small[i] = vals
        together = means_ci(list(small.values()), confidence=confidence, seed=seed)
        means.update(zip(small, together, strict=True))
        rows = [
            Row(name, "tokens" if name in COUNT_METRICS else "s", n, means[i], pct)
            for i, (name, n, pct) in enumerate(parts)
        ]
        notes = []
        n = rows[0].n if rows else 0
        top = max(ps) if ps else 0
        if n and n * (1 - top / 100) < 10:
            notes.append(f"P{top:g} rests on fewer than 10 samples above it (n={n})")
        return cls(ws.counts(), ws.throughput(), rows, confidence, notes, _conditions(ws.meta))

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
            "conditions": dict(self.conditions),
        }

    def to_text(self) -> str:
        """Plain text: the conditions, then one aligned row per metric and stage.

        Each row has its own unit (µs, ms or s, chosen from its values) and fixed decimals;
        every cell is ``value [low–high]``, the bracket being the percentile's confidence
        interval. Errors are listed only when there were some.
        """
        lines = self.conditions_lines()
        if not self.rows:
            return "\n".join([*lines, "no requests"])
        table = self.table()
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        for row in table:
            first = f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}"
            rest = "  ".join(f"{c:>{w}}" for c, w in zip(row[2:], widths[2:], strict=True))
            lines.append(f"{first}  {rest}".rstrip())
        lines.append(self._counts_line())
        lines.append(f"[low–high]: {self.confidence:.0%} bootstrap confidence interval")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def table(self) -> list[list[str]]:
        """The rows as text cells: a header (``"", "unit", "n", "mean", "p50" ...``), then one
        row per metric and stage with its unit and ``value [low–high]`` cells."""
        if not self.rows:
            return []
        table = [["", "unit", "n", "mean", *self.rows[0].percentiles]]
        for r in self.rows:
            cells = [r.mean, *r.percentiles.values()]
            scale, unit = _unit(r.unit, cells)
            table.append([r.name, unit, str(r.n), *(_cell(e, scale) for e in cells)])
        return table

    def conditions_lines(self) -> list[str]:
        """The conditions as lines of text (target and path, machine, client health)."""
        return _conditions_text(self.conditions)

    def counts_line(self) -> str:
        """Requests, ok, errors by kind (when there are some), warm-up, throughput."""
        return self._counts_line()

    def _counts_line(self) -> str:
        c, t = self.counts, self.throughput
        parts = [f"requests {c['requests']}", f"ok {c['ok']}"]
        if c["errors"]:
            kinds = ", ".join(f"{k} {v}" for k, v in sorted(c["errors_by_type"].items()))
            parts.append(f"errors {c['errors']} ({kinds})")
        if c["warmup"]:
            parts.append(f"warm-up excluded {c['warmup']}")
        parts.append(f"{t['requests_per_s']:.1f} req/s")
        if t.get("output_tokens_per_s"):
            parts.append(f"{t['output_tokens_per_s']:.0f} tok/s")
        return " · ".join(parts)


def _unit(kind: str, cells: Sequence[Estimate]) -> tuple[float, str]:
    """The scale and unit of one row: tokens as they are; times in µs, ms or s."""
    if kind != "s":
        return 1.0, kind
    finite = [abs(v) for e in cells for v in (e.value, e.high) if not math.isnan(v)]
    top = max(finite, default=0.0)
    if 0 < top < 1e-3:
        return 1e6, "µs"
    if top >= 10.0:
        return 1.0, "s"
    return 1e3, "ms"


def _num(x: float) -> str:
    """Fixed notation with three significant digits' worth of decimals, never ``e+03``."""
    if math.isnan(x):
        return "n/a"
    size = abs(float(f"{x:.3g}"))  # 99.9999 is printed as 100, like 100.0001
    decimals = 0 if size >= 100 else 1 if size >= 10 else 2 if size >= 1 else 3
    return f"{x:.{decimals}f}"


def _cell(e: Estimate, scale: float) -> str:
    if math.isnan(e.value):
        return "n/a"
    return f"{_num(e.value * scale)} [{_num(e.low * scale)}–{_num(e.high * scale)}]"


def _conditions(meta: dict[str, Any]) -> dict[str, Any]:
    """What the run was measured under, picked from a set's metadata."""
    fp = meta.get("fingerprint") or {}
    out: dict[str, Any] = {
        k: fp[k]
        for k in (
            *("target_host", "base_rtt_s", "http_versions", "tls_versions", "start_utc"),
            *("os", "kernel", "cpu_model", "cpu_count", "python"),
        )
        if fp.get(k) is not None
    }
    version = (fp.get("libraries") or {}).get("latency-analyzer")
    if version:
        out["latency_analyzer"] = version
    scenario = meta.get("scenario") or {}
    if scenario.get("mode"):
        out["mode"] = scenario["mode"]
    client = (meta.get("result") or {}).get("client")
    if client:
        out["client"] = client
    return out


def _conditions_text(c: dict[str, Any]) -> list[str]:
    """Two or three lines: the target and path, the machine, the client's health."""
    if not c:
        return []
    target = []
    if "target_host" in c:
        target.append(f"target {c['target_host']}")
    if c.get("base_rtt_s") is not None:
        target.append(f"base RTT {_num(c['base_rtt_s'] * 1e3)} ms")
    if c.get("http_versions"):
        target.append("HTTP/" + ", HTTP/".join(c["http_versions"]))
    if c.get("tls_versions"):
        target.append(", ".join(c["tls_versions"]))
    elif "http_versions" in c:
        target.append("no TLS")
    if "mode" in c:
        target.append(f"{c['mode']} loop")
    machine = [str(c[k]) for k in ("os", "kernel", "cpu_model") if k in c]
    if "cpu_count" in c:
        machine.append(f"{c['cpu_count']} CPUs")
    if "python" in c:
        machine.append(f"Python {c['python']}")
    if "latency_analyzer" in c:
        machine.append(f"latency-analyzer {c['latency_analyzer']}")
    lines = []
    if target:
        lines.append("conditions: " + " · ".join(target))
    if machine:
        lines.append("machine:    " + " · ".join(machine))
    client = c.get("client")
    if client:
        lines.append("client:     " + _client_text(client))
    return lines


def _client_text(client: dict[str, Any]) -> str:
    lag = client.get("loop_lag") or {}
    parts = [f"loop lag P99 {_num(lag.get('p99_s', 0.0) * 1e3)} ms"]
    pacer = client.get("pacer_lag")
    if pacer is not None:  # a closed loop has no schedule, hence no pacer lag
        parts.append(f"pacer lag P99 {_num(pacer.get('p99_s', 0.0) * 1e3)} ms")
    parts.append(f"CPU {client.get('cpu_cores', 0.0):.0%} of a core")
    if client.get("peak_rss_bytes"):
        parts.append(f"peak RSS {client['peak_rss_bytes'] / 2**20:.0f} MiB")
    if client.get("load_avg") is not None:
        parts.append(f"host load {client['load_avg']:.1f}")
    if client.get("steal") is not None:
        parts.append(f"steal {client['steal']:.1%}")
    return " · ".join(parts)
