"""Columnar storage for many waterfalls: one numpy array per stage, metric and tag.

A waterfall becomes one row: its exclusive stage times (``attribution_ns``, 0 when a stage is
absent, with a presence bit), its metrics and a few small categorical columns. About 130 bytes a
row for a warm streamed request, instead of kilobytes of objects.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import UsageError
from ..timeline import CLIENT_STAGES, RESIDUALS, SERVER_STAGES, Waterfall

__all__ = ["CATEGORICAL", "NUMERIC", "TIME_METRICS", "Columns", "Tags", "row_of"]

#: Fixed numeric columns and their dtypes. Times are ns; missing floats are NaN, ints -1.
NUMERIC: dict[str, type[np.generic]] = {
    "start_ns": np.int64,  # the request's start on the perf clock (its intended start, if any)
    "epoch_ns": np.int64,  # the same instant as Unix epoch ns (comparable across processes)
    "e2e_ns": np.int64,
    "ttft_ns": np.float64,
    "ttft_wire_ns": np.float64,  # first request byte to the kernel → first token's arrival
    "read_lag_ns": np.float64,  # the waterfall's median read lag (kernel stamp → our read)
    "read_lag_max_ns": np.float64,  # its worst read lag
    "tpot_ns": np.float64,
    "output_tokens": np.int32,
    "input_tokens": np.int32,
    "prompt_tokens": np.int32,  # the prompt's length as sent: tokens, or words (-1: unsized)
    "status": np.int16,  # HTTP status, 0 when none arrived
    "worker": np.int16,  # runner process that produced the row (merged sets)
    "step": np.int16,  # sweep step (concurrency or rate level)
    "reused": np.bool_,
    "warmup": np.bool_,
    "stage_mask": np.int32,  # bit i set: stage ``stages[i]`` happened
    "ttfc_ns": np.float64,  # to the first token chunk, empty text included (``Waterfall.ttfc``)
    "max_tokens": np.int32,  # the output tokens the request asked for (-1: not asked)
}

#: Columns stored as small integer codes into a list of labels (None allowed).
CATEGORICAL = ("error_type", "http_version", "scenario", "template")

#: Metric names a set knows, with their column: time metrics are in ns.
TIME_METRICS = {
    "e2e": "e2e_ns",
    "ttft": "ttft_ns",
    "ttfc": "ttfc_ns",
    "ttft_wire": "ttft_wire_ns",
    "tpot": "tpot_ns",
    "read_lag": "read_lag_ns",
    "read_lag_max": "read_lag_max_ns",
}
COUNT_METRICS = {"output_tokens": "output_tokens", "input_tokens": "input_tokens"}

_KNOWN_STAGES = tuple(dict.fromkeys((*CLIENT_STAGES, *SERVER_STAGES, *RESIDUALS)))


@dataclass(frozen=True, slots=True)
class Tags:
    """What the load generator knows about a request beyond its waterfall."""

    scenario: str | None = None
    template: str | None = None
    prompt_tokens: int = -1
    worker: int = 0
    step: int = 0
    warmup: bool = False
    sample: str | None = None  # the dataset row or trace line the request was built from
    max_tokens: int = -1  # the body's max_tokens (-1: none)
    min_tokens: int = -1  # the body's min_tokens (-1: none)

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        for key, unset in (("sample", None), ("max_tokens", -1), ("min_tokens", -1)):
            if out[key] == unset:
                del out[key]  # rows that do not have them keep their old shape
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Tags:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def _opt(x: float | None, missing: float) -> float:
    return missing if x is None else x


def row_of(wf: Waterfall, tags: Tags) -> tuple[dict[str, Any], dict[str, int]]:
    """The numeric and categorical values of one row, and its stage times."""
    epoch = wf.start_epoch_ns
    tpot = wf.tpot
    values: dict[str, Any] = {
        "start_ns": wf.start_ns,
        "epoch_ns": wf.start_ns if epoch is None else epoch,
        "e2e_ns": wf.e2e_ns,
        "ttft_ns": _opt(wf.ttft_ns, math.nan),
        "ttft_wire_ns": _opt(wf.ttft_wire_ns, math.nan),
        "read_lag_ns": _opt(wf.read_lag_p50_ns, math.nan),
        "read_lag_max_ns": _opt(wf.read_lag_max_ns, math.nan),
        "tpot_ns": math.nan if tpot is None else tpot * 1e9,
        "output_tokens": _opt(wf.output_tokens, -1),
        "input_tokens": _opt(wf.input_tokens, -1),
        "prompt_tokens": tags.prompt_tokens,
        "status": wf.status or 0,
        "worker": tags.worker,
        "step": tags.step,
        "reused": wf.connection.reused,
        "warmup": tags.warmup,
        "error_type": wf.error_type,
        "http_version": wf.http_version,
        "scenario": tags.scenario,
        "template": tags.template,
        "ttfc_ns": _opt(wf.ttfc_ns, math.nan),
        "max_tokens": tags.max_tokens,
    }
    return values, wf.attribution_ns()


@dataclass
class Columns:
    """Growable columns. Rows are buffered as Python values and packed into arrays in batches.

    Attributes:
        arrays: column name → array (``n`` rows once ``pack()`` ran).
        stages: stage names in column order; bit i of ``stage_mask`` is ``stages[i]``.
        labels: categorical column → its labels; code i means ``labels[i]``.
    """

    arrays: dict[str, npt.NDArray[Any]] = field(default_factory=dict)
    stages: list[str] = field(default_factory=list)
    labels: dict[str, list[str | None]] = field(default_factory=dict)
    _pending: list[tuple[dict[str, Any], dict[str, int]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name, dtype in NUMERIC.items():
            self.arrays.setdefault(name, np.zeros(0, dtype=dtype))
        for name in CATEGORICAL:
            self.arrays.setdefault(name, np.zeros(0, dtype=np.int16))
            self.labels.setdefault(name, [None])

    def __len__(self) -> int:
        return len(self.arrays["e2e_ns"]) + len(self._pending)

    def append(self, values: dict[str, Any], stages: dict[str, int]) -> None:
        self._pending.append((values, stages))
        if len(self._pending) >= 4096:
            self.pack()

    def stage_bit(self, name: str) -> int:
        """The presence bit of stage ``name``, adding a zero-filled column for a new stage."""
        if name not in self.stages:
            if len(self.stages) >= 31:
                raise UsageError("a WaterfallSet holds at most 31 distinct stage names")
            self.stages.append(name)
            self.arrays[f"stage:{name}"] = np.zeros(len(self.arrays["e2e_ns"]), dtype=np.int64)
        return 1 << self.stages.index(name)

    def code(self, column: str, label: str | None) -> int:
        labels = self.labels[column]
        try:
            return labels.index(label)
        except ValueError:
            labels.append(label)
            return len(labels) - 1

    def pack(self) -> None:
        """Move buffered rows into the arrays."""
        if not self._pending:
            return
        rows, self._pending = self._pending, []
        for _, stages in rows:
            for name in stages:
                self.stage_bit(name)
        new: dict[str, list[Any]] = {name: [] for name in self.arrays}
        for values, stages in rows:
            mask = 0
            for name in self.stages:
                ns = stages.get(name)
                new[f"stage:{name}"].append(ns or 0)
                if ns is not None:
                    mask |= 1 << self.stages.index(name)
            values = {**values, "stage_mask": mask}
            for name in NUMERIC:
                new[name].append(values[name])
            for name in CATEGORICAL:
                new[name].append(self.code(name, values[name]))
        for name, column in new.items():
            old = self.arrays[name]
            self.arrays[name] = np.concatenate([old, np.asarray(column, dtype=old.dtype)])

    def take(self, index: npt.NDArray[Any]) -> Columns:
        """A new Columns holding the rows at ``index`` (an int index or a boolean mask)."""
        self.pack()
        arrays = {name: arr[index] for name, arr in self.arrays.items()}
        labels = {name: list(v) for name, v in self.labels.items()}
        return Columns(arrays, list(self.stages), labels)

    def labelled(self, column: str) -> list[str | None]:
        """A categorical column as labels, one per row."""
        self.pack()
        labels = self.labels[column]
        return [labels[c] for c in self.arrays[column]]

    @classmethod
    def concat(cls, parts: Sequence[Columns]) -> Columns:
        """Rows of every part, in order: exact (raw values, codes remapped)."""
        out = cls()
        for part in parts:
            part.pack()
            for name in part.stages:
                out.stage_bit(name)
        chunks: dict[str, list[npt.NDArray[Any]]] = {name: [] for name in out.arrays}
        for part in parts:
            n = len(part.arrays["e2e_ns"])
            for name in NUMERIC:
                chunks[name].append(part.arrays[name])
            for name in CATEGORICAL:
                remap = np.array([out.code(name, lab) for lab in part.labels[name]], np.int16)
                chunks[name].append(remap[part.arrays[name]])
            bits = np.array([out.stage_bit(s) for s in part.stages], dtype=np.int32)
            mask = np.zeros(n, dtype=np.int32)
            for i, bit in enumerate(bits):
                mask |= np.where(part.arrays["stage_mask"] & (1 << i), bit, 0).astype(np.int32)
            chunks["stage_mask"][-1] = mask
            for stage in out.stages:
                col = part.arrays.get(f"stage:{stage}")
                chunks[f"stage:{stage}"].append(np.zeros(n, np.int64) if col is None else col)
        for name, pieces in chunks.items():
            out.arrays[name] = np.concatenate([out.arrays[name], *pieces])
        return out


def stage_order(names: Sequence[str]) -> list[str]:
    """Stage names in path order (the vocabulary's order, unknown names last)."""
    rank = {name: i for i, name in enumerate(_KNOWN_STAGES)}
    return sorted(names, key=lambda n: (rank.get(n, len(rank)), n))
