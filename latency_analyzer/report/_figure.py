"""matplotlib plumbing the plots share: the Figure class (no pyplot, no GUI, no global state,
so figures render headless), a new Axes, and how a bar's duration label looks."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ..errors import UsageError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["LABEL_BOX", "figure_class", "label_text", "new_axes"]

#: Behind a bar's label: lines (TTFT, grid) pass behind the text, not through it.
LABEL_BOX = {
    "boxstyle": "square,pad=0.1",
    "facecolor": "white",
    "edgecolor": "none",
    "alpha": 0.85,
}


def figure_class() -> type[Figure]:
    try:
        module = importlib.import_module("matplotlib.figure")
    except ImportError as exc:
        raise UsageError("plots need matplotlib: pip install 'latency-analyzer[plots]'") from exc
    cls: type[Figure] = module.Figure
    return cls


def new_axes(figsize: tuple[float, float]) -> Axes:
    fig = figure_class()(figsize=figsize, layout="constrained")
    return fig.add_subplot()


def label_text(ms: float) -> str:
    return f"{ms:.2f} ms" if ms < 10 else f"{ms:.1f} ms"
