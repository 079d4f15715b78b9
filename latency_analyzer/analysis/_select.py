"""Choosing rows of a WaterfallSet: what the statistics count, masks by tag, column and time,
groups, warm-up marks; and a metric's values over the rows chosen."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..errors import UsageError
from ._columns import CATEGORICAL, COUNT_METRICS, TIME_METRICS, Columns

if TYPE_CHECKING:
    from ._set import WaterfallSet

__all__ = [
    "criteria_mask",
    "group_values",
    "mark_warmup",
    "metric_values",
    "row_mask",
    "stats_mask",
]

#: Stages a set may lack entirely and still be asked for (their values are zeros).
_KNOWN_STAGES = ("schedule_lag", "pool_wait", "dns", "connect", "tls", "send", "wait")


def stats_mask(
    ws: WaterfallSet, include_warmup: bool, include_errors: bool
) -> npt.NDArray[np.bool_]:
    """The rows statistics count: without warm-up rows and failed requests unless asked."""
    keep = np.ones(len(ws), dtype=bool)
    if not include_warmup:
        keep &= ~ws.warmup
    if not include_errors:
        keep &= ws.ok
    return keep


def metric_values(
    ws: WaterfallSet,
    name: str,
    keep: npt.NDArray[np.bool_],
    present_only: bool,
    stages: Sequence[str],
) -> npt.NDArray[np.float64]:
    """``WaterfallSet.values`` over the rows ``keep`` (see there); ``stages`` are the set's
    stage columns in the order of their ``stage_mask`` bits."""
    if name in TIME_METRICS:
        vals = ws.column(TIME_METRICS[name]).astype(np.float64) / 1e9
    elif name in COUNT_METRICS:
        raw = ws.column(COUNT_METRICS[name])
        vals, keep = raw.astype(np.float64), keep & (raw >= 0)
    elif name in stages:
        vals = ws.column(f"stage:{name}").astype(np.float64) / 1e9
        if present_only:
            bit = 1 << stages.index(name)
            keep = keep & (ws.column("stage_mask") & bit).astype(bool)
    elif name in _KNOWN_STAGES:
        vals = np.zeros(len(ws))  # a known stage that no request in the set had
    else:
        raise UsageError(f"unknown metric or stage {name!r}")
    vals = vals[keep]
    return vals[~np.isnan(vals)]


def criteria_mask(
    ws: WaterfallSet,
    labels: Mapping[str, str | None],
    numbers: Mapping[str, int | None],
    flags: Mapping[str, bool | None],
    window: tuple[float, float] | None,
) -> npt.NDArray[np.bool_]:
    """Rows matching every given criterion (None: not a criterion): a categorical's label, a
    numeric column's value, a flag (``ok``, ``cold``, ``warmup``), a window of seconds after
    the set's first start ``[t0, t1)``."""
    mask = np.ones(len(ws), dtype=bool)
    for name, want in labels.items():
        if want is not None:
            mask &= np.array([v == want for v in ws.labels(name)], dtype=bool)
    for name, num in numbers.items():
        if num is not None:
            mask &= ws.column(name) == num
    columns = {"ok": ws.ok, "cold": ws.cold, "warmup": ws.warmup}
    for name, flag in flags.items():
        if flag is not None:
            mask &= columns[name] == flag
    if window is not None:
        t = ws.elapsed_s()
        mask &= (t >= window[0]) & (t < window[1])
    return mask


def group_values(ws: WaterfallSet, key: str, bins: Sequence[float] | None) -> list[Any]:
    """Each row's group under ``key``: its label, its value, or its bucket of ``bins``."""
    if key in CATEGORICAL:
        return list(ws.labels(key))
    col = {"cold": ws.cold, "ok": ws.ok}.get(key)
    col = ws.column(key) if col is None else col
    if bins is None:
        return [v.item() for v in col]
    edges = list(bins)
    where = np.searchsorted(np.asarray(edges), col, side="left")
    labels = [f"({lo:g}, {hi:g}]" for lo, hi in zip([0.0, *edges[:-1]], edges, strict=True)]
    labels.append(f"> {edges[-1]:g}")
    return [labels[i] for i in where]


def row_mask(n: int, idx: list[int]) -> npt.NDArray[np.bool_]:
    """A mask of ``n`` rows, True at ``idx``."""
    m = np.zeros(n, dtype=bool)
    m[idx] = True
    return m


def mark_warmup(cols: Columns, count: int | None, seconds: float | None) -> Columns:
    """``cols`` with the first ``count`` requests of each sweep step, or those starting within
    its first ``seconds``, marked warm-up (``cols`` is changed: pass a copy)."""
    warm = cols.arrays["warmup"].copy()
    epoch, step = cols.arrays["epoch_ns"], cols.arrays["step"]
    for s in np.unique(step):
        rows = np.flatnonzero(step == s)
        order = rows[np.argsort(epoch[rows], kind="stable")]
        if count:
            warm[order[:count]] = True
        if seconds:
            t0 = epoch[order[0]]
            warm[rows[epoch[rows] < t0 + round(seconds * 1e9)]] = True
    cols.arrays["warmup"] = warm
    return cols
