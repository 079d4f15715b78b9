"""Terminal summary tables for sets (rich, ``latency-analyzer[cli]``).

``set_table(ws)`` is a ``rich.table.Table``: one row per metric and stage with n, mean, P50,
P95 and P99 (ms) and the P95's 95% interval, each stage name in its plot colour. Print it with
``rich.console.Console().print(table)``; a console that is not a terminal drops the colours.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..analysis import WaterfallSet
from ..errors import UsageError
from .palette import colour

__all__ = ["set_table"]


def _ms(seconds: float) -> str:
    return "–" if seconds != seconds else f"{seconds * 1e3:.2f}"  # NaN: no samples


def set_table(ws: WaterfallSet, *, title: str | None = None) -> Any:
    """A rich ``Table`` summarising ``ws`` (times in ms; counts in the title).

    Raises:
        UsageError: rich is not installed.
    """
    try:
        rich_table = importlib.import_module("rich.table")
    except ImportError as exc:
        raise UsageError("tables need rich: pip install 'latency-analyzer[cli]'") from exc
    c = ws.counts()
    table = rich_table.Table(
        title=title or f"{c['requests']} requests, {c['errors']} failed, {c['warmup']} warm-up",
        title_justify="left",
    )
    table.add_column("name")
    for head in ("n", "mean ms", "P50 ms", "P95 ms", "P99 ms", "P95 95% CI"):
        table.add_column(head, justify="right")
    names = ws.metric_names()
    metrics = [m for m in names if m not in ws.stages]
    for name in names:
        n = len(ws.values(name))
        est = ws.percentiles(name, (50, 95, 99), resamples=200)
        mean = ws.mean(name).value
        p95 = est["p95"]
        table.add_row(
            f"[{colour(name)}]■[/] {name}",
            str(n),
            _ms(mean),
            _ms(est["p50"].value),
            _ms(p95.value),
            _ms(est["p99"].value),
            f"{_ms(p95.low)}–{_ms(p95.high)}",
            end_section=bool(metrics) and name == metrics[-1],  # a rule between metrics and stages
        )
    return table
