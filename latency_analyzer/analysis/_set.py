"""WaterfallSet: many waterfalls as columns, streamed to JSONL, with percentiles and filters.

::

    with WaterfallSet(path="run.jsonl", meta={"scenario": ...}) as ws:
        ws.add(wf, Tags(scenario="chat"))        # a row in memory + a line on disk (batched)
    ws = WaterfallSet.load("run.jsonl")          # the same columns, rebuilt from the file
    ws.percentiles("ttft")                       # {"p50": Estimate(s), ...} with 95% CIs
    ws.filter(scenario="chat", cold=False).group_by("template")

Statistics exclude warm-up rows and failed requests unless asked (``include_warmup``,
``include_errors``); the rows stay in the set, marked.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .._jsonl import JsonlWriter, Streamed
from .._redact import redact_obj
from ..errors import UsageError
from ..timeline import Waterfall
from ..timeline._display import present
from ._columns import CATEGORICAL, TIME_METRICS, Columns, Tags, row_of, stage_order
from ._select import (
    criteria_mask,
    group_values,
    mark_warmup,
    metric_values,
    row_mask,
    stats_mask,
)
from ._stats import PERCENTILES, Estimate, mean_ci, p_key, percentiles_ci
from ._summary import Summary  # it names WaterfallSet only for typing

__all__ = ["SET_SCHEMA", "WaterfallSet"]

SET_SCHEMA = 1
_GROUP_KEYS = (
    *("scenario", "template", "status", "error_type", "http_version", "cold", "ok"),
    *("worker", "step", "warmup", "prompt_tokens"),
)


class WaterfallSet(Streamed):
    """Many waterfalls stored as columns; optionally streamed to a JSONL file as they come.

    Args:
        path: JSONL file to stream to (created/truncated); None keeps the set in memory only.
        meta: run metadata (scenario definition, environment fingerprint) for the header line.
        flush_every: rows buffered before a write + flush, so a crash loses at most this many.
        fsync: also ``os.fsync`` at each flush (survives a machine crash, costs a disk sync).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        meta: Mapping[str, Any] | None = None,
        flush_every: int = 256,
        fsync: bool = False,
    ) -> None:
        # the header holds the scenario's URL: its userinfo and keys never reach the file
        self.meta: dict[str, Any] = redact_obj(dict(meta or {}))
        self.runs: list[dict[str, Any]] = [self.meta] if meta else []
        self.path = None if path is None else Path(path)
        self.damaged_lines = 0
        self._cols = Columns()
        self._out = None
        if self.path is not None:
            self._out = JsonlWriter(self.path, flush_every=flush_every, fsync=fsync)
            self._out.write_now({"kind": "run", "schema": SET_SCHEMA, "meta": self.meta})

    # -- building -------------------------------------------------------------------------
    def add(self, wf: Waterfall, tags: Tags | None = None) -> None:
        """Add one waterfall as a row (and a JSONL line, when streaming)."""
        tags = tags or Tags()
        self._cols.append(*row_of(wf, tags))
        if self._out is not None:
            self._out.append_row({"kind": "wf", "tags": tags.to_dict(), "wf": wf.to_dict()})

    def extend(self, wfs: Iterable[Waterfall], tags: Tags | None = None) -> None:
        for wf in wfs:
            self.add(wf, tags)

    def note(self, kind: str, data: Mapping[str, Any]) -> None:
        """Record run-level data (e.g. the end-of-run summary) in ``meta`` and the file."""
        clean: dict[str, Any] = redact_obj(dict(data))
        self.meta[kind] = clean
        if self._out is not None:
            self._out.write_now({"kind": "note", "name": kind, "data": clean})

    # -- loading and merging --------------------------------------------------------------
    @classmethod
    def load(cls, *paths: str | os.PathLike[str]) -> WaterfallSet:
        """Rebuild a set from one or more JSONL files (several files merge, in order).

        A damaged line (a run that crashed mid-write) is skipped and counted in
        ``damaged_lines``; everything before it is kept.

        Raises:
            UsageError: a file is not a WaterfallSet file, or of an unknown schema.
        """
        parts = [cls._load_one(Path(p)) for p in paths]
        return parts[0] if len(parts) == 1 else cls.merge(*parts)

    @classmethod
    def _load_one(cls, path: Path) -> WaterfallSet:
        out = cls()
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f):
                try:
                    obj = json.loads(line)
                except ValueError:
                    out.damaged_lines += 1
                    continue
                out._read_line(obj, number, path)
        return out

    def _read_line(self, obj: Mapping[str, Any], number: int, path: Path) -> None:
        kind = obj.get("kind")
        if number == 0 and (kind != "run" or obj.get("schema") != SET_SCHEMA):
            raise UsageError(f"{path}: not a WaterfallSet file of schema {SET_SCHEMA}")
        if kind == "run":
            self.meta = dict(obj.get("meta", {}))
            self.runs.append(self.meta)
        elif kind == "note":
            self.meta[obj["name"]] = obj["data"]
        elif kind == "wf":
            self._cols.append(*row_of(Waterfall.from_dict(obj["wf"]), Tags.from_dict(obj["tags"])))

    @classmethod
    def merge(cls, *sets: WaterfallSet) -> WaterfallSet:
        """One set holding every row of ``sets`` (exact: raw columns are concatenated)."""
        out = cls()
        out._cols = Columns.concat([s._cols for s in sets])
        out.runs = [run for s in sets for run in s.runs]
        out.meta = dict(sets[0].meta) if sets else {}
        out.damaged_lines = sum(s.damaged_lines for s in sets)
        return out

    def __add__(self, other: WaterfallSet) -> WaterfallSet:
        return WaterfallSet.merge(self, other)

    @classmethod
    def _from_columns(cls, cols: Columns, like: WaterfallSet | None = None) -> WaterfallSet:
        out = cls()
        out._cols = cols
        if like is not None:
            out.meta, out.runs = like.meta, like.runs
        return out

    # -- columns --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._cols)

    def column(self, name: str) -> npt.NDArray[Any]:
        """The raw column ``name``: a fixed column, ``"stage:<name>"`` or a categorical's codes."""
        self._cols.pack()
        try:
            return self._cols.arrays[name]
        except KeyError:
            raise UsageError(f"no column {name!r}; have {sorted(self._cols.arrays)}") from None

    def labels(self, name: str) -> list[str | None]:
        """A categorical column (``error_type``, ``http_version``, ``scenario``, ``template``)."""
        if name not in CATEGORICAL:
            raise UsageError(f"{name!r} is not categorical; expected one of {CATEGORICAL}")
        return self._cols.labelled(name)

    @property
    def stages(self) -> list[str]:
        """Stage names that occur in the set, in path order."""
        self._cols.pack()
        return stage_order(self._cols.stages)

    @property
    def nbytes(self) -> int:
        """Bytes held by the columns."""
        self._cols.pack()
        return sum(a.nbytes for a in self._cols.arrays.values())

    @property
    def ok(self) -> npt.NDArray[np.bool_]:
        return np.asarray(self.column("error_type") == 0, dtype=bool)  # code 0: label None

    @property
    def warmup(self) -> npt.NDArray[np.bool_]:
        return np.asarray(self.column("warmup"), dtype=bool)

    @property
    def cold(self) -> npt.NDArray[np.bool_]:
        return ~self.column("reused")

    def elapsed_s(self) -> npt.NDArray[np.float64]:
        """Each row's (intended) start in seconds since the earliest start in the set."""
        epoch = self.column("epoch_ns")
        if epoch.size == 0:
            return np.zeros(0)
        return np.asarray((epoch - epoch.min()) / 1e9, dtype=np.float64)

    def values(
        self,
        name: str,
        *,
        include_warmup: bool = False,
        include_errors: bool = False,
        present_only: bool = False,
    ) -> npt.NDArray[np.float64]:
        """Values of a metric or stage, NaN-free: seconds for times, counts for tokens.

        Args:
            name: a metric (``e2e``, ``ttft``, ``ttfc``, ``tpot``, ``output_tokens``,
                ``input_tokens``) or a stage (its exclusive time; 0 for a request that did not
                have the stage).
            include_warmup: keep rows marked as warm-up.
            include_errors: keep failed requests.
            present_only: for a stage, only the requests that had it.

        Raises:
            UsageError: an unknown name.
        """
        keep = stats_mask(self, include_warmup, include_errors)
        return metric_values(self, name, keep, present_only, self._cols.stages)

    # -- statistics -----------------------------------------------------------------------
    def percentiles(
        self,
        name: str,
        ps: Sequence[float] = PERCENTILES,
        *,
        confidence: float = 0.95,
        resamples: int = 2000,
        seed: int = 0,
        **select: bool,
    ) -> dict[str, Estimate]:
        """``{"p50": Estimate, ...}`` for a metric or stage, with bootstrap CIs.

        ``select`` takes ``values()``'s keyword arguments (``include_warmup`` ...).
        """
        vals = self.values(name, **select)
        est = percentiles_ci(vals, ps, confidence=confidence, resamples=resamples, seed=seed)
        return {p_key(p): e for p, e in est.items()}

    def mean(
        self, name: str, *, confidence: float = 0.95, seed: int = 0, **select: bool
    ) -> Estimate:
        """Mean of a metric or stage with a bootstrap CI."""
        return mean_ci(self.values(name, **select), confidence=confidence, seed=seed)

    def metric_names(self) -> list[str]:
        """Metrics and stages with at least one value, metrics first, stages in path order."""
        names = [m for m in TIME_METRICS if np.isfinite(self.column(TIME_METRICS[m])).any()]
        return names + self.stages

    def counts(self) -> dict[str, Any]:
        """Requests in total, ok, failed by error type, and warm-up rows."""
        err = self.labels("error_type")
        by_type: dict[str, int] = {}
        for e in err:
            if e is not None:
                by_type[e] = by_type.get(e, 0) + 1
        return {
            "requests": len(self),
            "ok": int(self.ok.sum()),
            "errors": sum(by_type.values()),
            "errors_by_type": by_type,
            "warmup": int(self.warmup.sum()),
        }

    def throughput(self, *, include_warmup: bool = False) -> dict[str, float]:
        """Completed ok requests and output tokens per second over the set's span."""
        keep = stats_mask(self, include_warmup, include_errors=False)
        start = self.column("epoch_ns")[keep]
        if start.size == 0:
            return {"requests_per_s": math.nan, "output_tokens_per_s": math.nan, "span_s": 0.0}
        end = start + self.column("e2e_ns")[keep]
        span = float(end.max() - start.min()) / 1e9
        tokens = self.column("output_tokens")[keep]
        total_tokens = float(tokens[tokens > 0].sum())

        def rate(x: float) -> float:
            return x / span if span > 0 else math.nan

        return {
            "requests_per_s": rate(float(start.size)),
            "output_tokens_per_s": rate(total_tokens),
            "span_s": span,
        }

    # -- presentation: registered by the layers that draw and diagnose --
    def plot(self, **kwargs: Any) -> Any:
        """Attribution bars, TTFT/ITL distributions and latency over time (``[plots]``)."""
        return present("set.plot", self, **kwargs)

    def diagnose(self, **kwargs: Any) -> list[Any]:
        """Findings over the whole set, most time at stake first."""
        result: list[Any] = present("set.diagnose", self, **kwargs)
        return result

    def _repr_html_(self) -> str:
        html: str = present("set.html", self)
        return html

    def summary(self, **kwargs: Any) -> Summary:
        """Percentiles with CIs for every metric and stage, counts and throughput."""
        return Summary.of(self, **kwargs)

    # -- selecting ------------------------------------------------------------------------
    def where(self, mask: npt.NDArray[np.bool_]) -> WaterfallSet:
        """The rows where ``mask`` is True, as a new (in-memory) set."""
        if mask.shape != (len(self),):
            raise UsageError(f"mask has shape {mask.shape}, the set has {len(self)} rows")
        return WaterfallSet._from_columns(self._cols.take(mask), like=self)

    def filter(
        self,
        *,
        scenario: str | None = None,
        template: str | None = None,
        status: int | None = None,
        ok: bool | None = None,
        error_type: str | None = None,
        cold: bool | None = None,
        http_version: str | None = None,
        warmup: bool | None = None,
        worker: int | None = None,
        step: int | None = None,
        window: tuple[float, float] | None = None,
    ) -> WaterfallSet:
        """Rows matching every given criterion.

        ``window=(t0, t1)``: requests whose (intended) start lies in [t0, t1) seconds after
        the set's first start.
        """
        labels = {
            "scenario": scenario,
            "template": template,
            "error_type": error_type,
            "http_version": http_version,
        }
        numbers = {"status": status, "worker": worker, "step": step}
        flags = {"ok": ok, "cold": cold, "warmup": warmup}
        mask = criteria_mask(self, labels, numbers, flags, window)
        return self.where(mask)

    def group_by(self, key: str, *, bins: Sequence[float] | None = None) -> dict[Any, WaterfallSet]:
        """Split by a tag or column: ``scenario``, ``template``, ``status``, ``error_type``,
        ``http_version``, ``cold``, ``ok``, ``worker``, ``step``, ``warmup``, ``prompt_tokens``.

        Args:
            key: what to group by.
            bins: upper bucket edges for a numeric key (e.g. ``prompt_tokens``): a row with
                value v joins the first bucket whose edge is >= v; the label is
                ``"(lo, hi]"``. Values above the last edge form a last ``"> hi"`` bucket.
        """
        if key not in _GROUP_KEYS:
            raise UsageError(f"cannot group by {key!r}; expected one of {_GROUP_KEYS}")
        keys = group_values(self, key, bins)
        groups: dict[Any, list[int]] = {}
        for i, k in enumerate(keys):
            groups.setdefault(k, []).append(i)
        return {k: self.where(row_mask(len(self), idx)) for k, idx in groups.items()}

    def trim_warmup(
        self, *, count: int | None = None, seconds: float | None = None
    ) -> WaterfallSet:
        """A copy whose first ``count`` requests, or those starting within the first
        ``seconds``, are marked warm-up (per sweep step): kept, but out of the statistics."""
        cols = mark_warmup(self._cols.take(np.arange(len(self))), count, seconds)
        return WaterfallSet._from_columns(cols, like=self)

    def __iter__(self) -> Iterator[int]:  # pragma: no cover - guard against misuse
        raise TypeError("a WaterfallSet holds columns, not waterfalls: use WaterfallSet.load")

    def __repr__(self) -> str:
        c = self.counts()
        return (
            f"<WaterfallSet {c['requests']} requests, {c['errors']} errors, {c['warmup']} warm-up>"
        )
