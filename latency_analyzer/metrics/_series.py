"""MetricSeries: every scraped sample as columns, per target, metric and label set.

::

    ms = MetricSeries(path="run.metrics.jsonl")    # streamed, like a WaterfallSet
    ms.add_target("vllm", "http://gpu-1:8000/metrics", interval_s=1.0)
    ms.add_scrape("vllm", send_ns, done_ns, parse(text))
    ms.add_gap("vllm", send_ns, done_ns, "timeout after 1.0 s")
    ms.gauge("vllm:num_requests_waiting")          # TimeSeries, summed over label sets
    ms.rate("vllm:generation_tokens_total")        # per second, per scrape interval
    ms.quantile("vllm:time_to_first_token_seconds", 0.99)   # per interval

Each scrape is stamped with the client's ``perf_counter_ns`` just before the request and just
after the response was read; the sample's instant is the midpoint, its uncertainty half the width.
A failed scrape is a :class:`Gap` with its reason, never a silent hole.

File format (JSONL, schema 1): a ``metrics`` header (clock anchor), then ``target``, ``series``
(an id for a target + sample name + labels, written on first sight), ``scrape`` (the bracket
and ``[id, value]`` pairs) and ``gap`` lines, flushed every ``flush_every`` scrapes.
"""

from __future__ import annotations

import json
import os
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .._jsonl import JsonlWriter, Streamed
from ..errors import UsageError
from ..timeline import ClockAnchor, process_anchor
from ._parse import ParsedSample
from ._timeseries import F64, I64, TimeSeries

__all__ = ["METRICS_SCHEMA", "Gap", "MetricSeries", "SeriesKey"]

METRICS_SCHEMA = 1
_AGG: dict[str, Callable[..., Any]] = {
    "sum": np.nansum,
    "mean": np.nanmean,
    "max": np.nanmax,
    "min": np.nanmin,
}
Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class SeriesKey:
    """One stored series: a target's sample name and label set, with its family and type."""

    target: str
    name: str
    labels: Labels
    family: str
    type: str


@dataclass(frozen=True, slots=True)
class Gap:
    """A scrape that failed: endpoint down, timeout, HTTP error or malformed text.

    Attributes:
        target: the target's name.
        start_ns, end_ns: the scrape's bracket (``perf_counter_ns``).
        reason: what went wrong, e.g. ``"timeout after 1.0 s"``, ``"http 500"``.
    """

    target: str
    start_ns: int
    end_ns: int
    reason: str


@dataclass
class _Scrapes:
    """The scrapes of one target, in time order."""

    url: str
    interval_s: float
    send: array[int]
    done: array[int]
    ok: array[int]


class MetricSeries(Streamed):
    """Scraped samples as columns: per target, per series, one value per successful scrape.

    Args:
        path: JSONL file to stream to (created/truncated); None keeps memory only.
        anchor: the clock anchor of the scraping process (default: this process's).
        flush_every: scrapes buffered before a write + flush.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        anchor: ClockAnchor | None = None,
        flush_every: int = 16,
    ) -> None:
        self.anchor = anchor or process_anchor()
        self.path = None if path is None else Path(path)
        self.gaps: list[Gap] = []
        self.damaged_lines = 0
        self._targets: dict[str, _Scrapes] = {}
        self._keys: list[SeriesKey] = []
        self._ids: dict[tuple[str, str, Labels], int] = {}
        self._rows: list[array[int]] = []  # per series: indexes into its target's scrapes
        self._vals: list[array[float]] = []
        self._out = None
        if self.path is not None:
            self._out = JsonlWriter(self.path, flush_every=flush_every)
            a = self.anchor
            anchor_d = {"perf_ns": a.perf_ns, "epoch_ns": a.epoch_ns, "unc_ns": a.uncertainty_ns}
            self._out.write_now({"kind": "metrics", "schema": METRICS_SCHEMA, "anchor": anchor_d})

    # -- building -------------------------------------------------------------------------
    def add_target(self, name: str, url: str, interval_s: float) -> None:
        """Declare a scraped endpoint (``url`` already redacted)."""
        if name in self._targets:
            raise UsageError(f"target {name!r} declared twice")
        self._targets[name] = _Scrapes(url, interval_s, array("q"), array("q"), array("b"))
        self._emit({"kind": "target", "name": name, "url": url, "interval_s": interval_s})

    def add_scrape(
        self, target: str, send_ns: int, done_ns: int, samples: Iterable[ParsedSample]
    ) -> None:
        """Store one successful scrape: its bracket and every sample."""
        row = self._new_scrape(target, send_ns, done_ns, True)
        pairs = []
        for s in samples:
            sid = self._series_id(target, s)
            self._rows[sid].append(row)
            self._vals[sid].append(s.value)
            pairs.append([sid, s.value])
        self._emit({"kind": "scrape", "target": target, "t": [send_ns, done_ns], "v": pairs})

    def add_gap(self, target: str, send_ns: int, done_ns: int, reason: str) -> None:
        """Store a failed scrape with its reason."""
        self._new_scrape(target, send_ns, done_ns, False)
        self.gaps.append(Gap(target, send_ns, done_ns, reason))
        line = {"kind": "gap", "target": target, "t": [send_ns, done_ns], "reason": reason}
        self._emit(line)

    def _new_scrape(self, target: str, send_ns: int, done_ns: int, ok: bool) -> int:
        sc = self._target(target)
        sc.send.append(send_ns)
        sc.done.append(done_ns)
        sc.ok.append(ok)
        return len(sc.send) - 1

    def _series_id(self, target: str, s: ParsedSample) -> int:
        k = (target, s.name, s.labels)
        sid = self._ids.get(k)
        if sid is None:
            sid = self._ids[k] = len(self._keys)
            self._keys.append(SeriesKey(target, s.name, s.labels, s.family, s.type))
            self._rows.append(array("q"))
            self._vals.append(array("d"))
            line = {"kind": "series", "id": sid, "target": target, "name": s.name}
            line.update(labels=dict(s.labels), family=s.family, type=s.type)
            self._emit(line)
        return sid

    def _target(self, name: str) -> _Scrapes:
        try:
            return self._targets[name]
        except KeyError:
            raise UsageError(f"no target {name!r}; have {sorted(self._targets)}") from None

    # -- file -----------------------------------------------------------------------------
    def _emit(self, obj: Mapping[str, Any]) -> None:
        if self._out is not None:  # a batch is flushed at scrape/gap lines, never mid-scrape
            self._out.append(obj, counts=obj["kind"] in ("scrape", "gap"))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> MetricSeries:
        """Rebuild the columns from a file (a damaged line is skipped and counted).

        Raises:
            UsageError: not a metrics file of a known schema.
        """
        p = Path(path)
        with p.open(encoding="utf-8") as f:
            lines = f.readlines()
        head = json.loads(lines[0]) if lines else {}
        if head.get("kind") != "metrics" or head.get("schema") != METRICS_SCHEMA:
            raise UsageError(f"{p}: not a metrics file of schema {METRICS_SCHEMA}")
        a = head["anchor"]
        out = cls(anchor=ClockAnchor(a["perf_ns"], a["epoch_ns"], a["unc_ns"]))
        ids: dict[int, ParsedSample] = {}
        for line in lines[1:]:
            try:
                out._replay(json.loads(line), ids)
            except (ValueError, KeyError, TypeError):
                out.damaged_lines += 1
        return out

    def _replay(self, obj: Mapping[str, Any], ids: dict[int, ParsedSample]) -> None:
        kind = obj["kind"]
        if kind == "target":
            self.add_target(obj["name"], obj["url"], obj["interval_s"])
        elif kind == "series":
            labels = tuple(sorted(obj["labels"].items()))
            ids[obj["id"]] = ParsedSample(obj["family"], obj["type"], obj["name"], labels, 0.0)
        elif kind == "scrape":
            send, done = obj["t"]
            samples = [_with_value(ids[i], v) for i, v in obj["v"]]
            self.add_scrape(obj["target"], send, done, samples)
        elif kind == "gap":
            send, done = obj["t"]
            self.add_gap(obj["target"], send, done, obj["reason"])

    # -- what is stored -------------------------------------------------------------------
    @property
    def targets(self) -> dict[str, str]:
        """Target name → URL (redacted)."""
        return {name: sc.url for name, sc in self._targets.items()}

    @property
    def keys(self) -> list[SeriesKey]:
        """Every stored series."""
        return list(self._keys)

    def names(self, target: str | None = None) -> list[str]:
        """Family names seen (a counter's without ``_total``), sorted."""
        return sorted({k.family for k in self._keys if target in (None, k.target)})

    def scrapes(self, target: str) -> dict[str, npt.NDArray[Any]]:
        """A target's scrape columns: ``send_ns``, ``done_ns``, ``t_ns`` (midpoint), ``ok``."""
        sc = self._target(target)
        send = np.frombuffer(sc.send, dtype=np.int64) if sc.send else np.zeros(0, np.int64)
        done = np.frombuffer(sc.done, dtype=np.int64) if sc.done else np.zeros(0, np.int64)
        ok = np.frombuffer(sc.ok, dtype=np.int8).astype(bool) if sc.ok else np.zeros(0, bool)
        return {"send_ns": send, "done_ns": done, "t_ns": send + (done - send) // 2, "ok": ok}

    def find(self, name: str, *, target: str | None = None, **labels: str) -> list[SeriesKey]:
        """Series whose sample name is ``name`` (a counter's family name finds its ``_total``),
        on ``target`` if given, carrying every given label value."""
        want = set(labels.items())
        out = []
        for k in self._keys:
            if target not in (None, k.target) or not want <= set(k.labels):
                continue
            if k.name == name or (k.type == "counter" and k.name == f"{name}_total"):
                out.append(k)
        return out

    # -- derived series -------------------------------------------------------------------
    def gauge(
        self, name: str, *, agg: str = "sum", target: str | None = None, **labels: str
    ) -> TimeSeries:
        """A gauge's value at each successful scrape, aggregated over matching label sets.

        Args:
            name: sample or family name.
            agg: ``sum``, ``mean``, ``max`` or ``min`` over label sets (e.g. GPUs, engines).
            target: which target, when the name is scraped from several.
            labels: only series carrying these label values.

        Raises:
            UsageError: the name is unknown, or found on several targets and none was chosen.
        """
        t, half, m = self._matrix(self.find(name, target=target, **labels), name)
        v = _aggregate(m, agg)
        keep = np.isfinite(v)
        return TimeSeries(name, "gauge", t[keep], v[keep], half[keep], t[keep], self.anchor)

    def rate(
        self, name: str, *, agg: str = "sum", target: str | None = None, **labels: str
    ) -> TimeSeries:
        """A counter's increase per second between consecutive successful scrapes.

        A value lower than the previous one is a counter reset (the server restarted): the
        interval's increase is then the new value, as Prometheus' ``rate()`` assumes.
        """
        t, half, m = self._matrix(self.find(name, target=target, **labels), name)
        inc = _increase(m)
        v = _aggregate(inc, agg) / ((t[1:] - t[:-1]) / 1e9)
        return TimeSeries(f"{name}:rate", "rate", t[1:], v, half[1:], t[:-1], self.anchor)

    def quantile(
        self, name: str, q: float, *, target: str | None = None, **labels: str
    ) -> TimeSeries:
        """A histogram's ``q``-quantile over the observations of each scrape interval.

        Bucket increases are summed over label sets, then interpolated linearly inside the
        bucket holding the rank (PromQL's ``histogram_quantile`` over ``increase``). NaN for an
        interval without observations; the highest finite edge when the rank falls in +Inf.

        Raises:
            UsageError: ``q`` outside [0, 1], or no ``<name>_bucket`` series.
        """
        if not 0.0 <= q <= 1.0:
            raise UsageError(f"quantile q={q} is outside [0, 1]")
        keys = [k for k in self.find(f"{name}_bucket", target=target, **labels)]
        edges = sorted({float(dict(k.labels)["le"]) for k in keys})
        t, half, m = self._matrix(keys, f"{name}_bucket")
        by_le = np.stack([_aggregate(m[:, _cols_with_le(keys, e)], "sum") for e in edges], axis=1)
        inc = _increase(by_le)
        v = _bucket_quantile(inc, np.asarray(edges), q)
        label = f"{name}:p{q * 100:g}"
        return TimeSeries(label, "quantile", t[1:], v, half[1:], t[:-1], self.anchor)

    def _matrix(self, keys: Sequence[SeriesKey], name: str) -> tuple[I64, I64, F64]:
        """(scrape instants, half-widths, values[scrape, series]) over ok scrapes."""
        if not keys:
            raise UsageError(f"no stored series named {name!r}")
        targets = sorted({k.target for k in keys})
        if len(targets) > 1:
            raise UsageError(f"{name!r} is scraped from {targets}: pass target=")
        cols = self.scrapes(targets[0])
        ok_rows = np.flatnonzero(cols["ok"])
        pos = np.full(cols["ok"].size, -1)
        pos[ok_rows] = np.arange(ok_rows.size)
        m = np.full((ok_rows.size, len(keys)), np.nan)
        for j, k in enumerate(keys):
            sid = self._ids[(k.target, k.name, k.labels)]
            rows = np.frombuffer(self._rows[sid], dtype=np.int64)
            m[pos[rows], j] = np.frombuffer(self._vals[sid], dtype=np.float64)
        half = (cols["done_ns"] - cols["send_ns"]) // 2
        return cols["t_ns"][ok_rows], half[ok_rows], m


def _with_value(s: ParsedSample, value: float) -> ParsedSample:
    return ParsedSample(s.family, s.type, s.name, s.labels, float(value))


def _aggregate(m: F64, agg: str) -> F64:
    """Aggregate each row over its finite values; NaN for a row with none."""
    if agg not in _AGG:
        raise UsageError(f"agg={agg!r}; expected one of {sorted(_AGG)}")
    if m.shape[1] == 0:
        return np.full(m.shape[0], np.nan)
    has = np.isfinite(m).any(axis=1)
    out = np.full(m.shape[0], np.nan)
    if has.any():
        out[has] = _AGG[agg](m[has], axis=1)  # rows with a finite value: no empty-slice warning
    return out


def _increase(m: F64) -> F64:
    """Per-interval increase of cumulative columns, a drop counted as a reset to zero."""
    d = m[1:] - m[:-1]
    reset = d < 0
    d[reset] = m[1:][reset]
    return np.asarray(d, dtype=np.float64)


def _cols_with_le(keys: Sequence[SeriesKey], edge: float) -> list[int]:
    return [j for j, k in enumerate(keys) if float(dict(k.labels)["le"]) == edge]


def _bucket_quantile(inc: F64, edges: npt.NDArray[np.float64], q: float) -> F64:
    """Quantile per row of cumulative bucket increases (columns in ``edges`` order)."""
    out = np.full(inc.shape[0], np.nan)
    if not edges.size or not np.isinf(edges[-1]):
        return out  # without +Inf there is no total count
    for r in range(inc.shape[0]):
        cum = np.maximum.accumulate(np.nan_to_num(inc[r]))  # buckets are cumulative
        total = cum[-1]
        if total <= 0:
            continue
        rank = q * total
        b = int(np.searchsorted(cum, rank, side="left"))
        if np.isinf(edges[b]):
            out[r] = edges[-2] if edges.size > 1 else np.nan
            continue
        lo = 0.0 if b == 0 else edges[b - 1]
        below = 0.0 if b == 0 else cum[b - 1]
        inside = cum[b] - below
        out[r] = edges[b] if inside <= 0 else lo + (edges[b] - lo) * (rank - below) / inside
    return out
