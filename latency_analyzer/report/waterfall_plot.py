"""One request as a Gantt chart (``latency-analyzer[plots]``).

``plot_waterfall(wf)``: one row per client stage, the server spans merge placed inside a stage
on indented rows right under it, one row per profiled thread at the bottom; token arrivals as
ticks over the decode row; every bar labelled with its duration; a dashed line at TTFT.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..timeline import Span, Waterfall
from ._figure import LABEL_BOX, label_text, new_axes
from .palette import colour, profile_colour

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["plot_waterfall"]


@dataclass(frozen=True)
class _Row:
    label: str
    lane: str  # client | server | profile
    spans: tuple[Span, ...]
    gid: str


def _rows(wf: Waterfall) -> list[_Row]:
    rows: list[_Row] = []
    for stage in wf.root.children:
        rows.append(_Row(stage.name, "client", (stage,), f"stage:{stage.name}"))
        server: dict[str, list[Span]] = {}
        for child in stage.children:
            if child.source == "server":
                server.setdefault(child.name, []).append(child)
        for name, spans in server.items():
            rows.append(_Row(f"↳ {name} (server)", "server", tuple(spans), f"server:{name}"))
    threads: dict[str, list[Span]] = {}
    for span in wf.root.walk():
        if span.source == "profile":
            threads.setdefault(str(span.attributes.get("thread", "main")), []).append(span)
    for thread, spans in threads.items():
        rows.append(_Row(f"profile: {thread}", "profile", tuple(spans), f"profile:{thread}"))
    return rows


def _draw_row(ax: Axes, y: int, row: _Row, t0: int, index: int) -> None:
    height = 0.62 if row.lane == "client" else 0.42
    for span in row.spans:
        left, width = (span.start_ns - t0) / 1e6, span.duration_ns / 1e6
        fill = profile_colour(index) if row.lane == "profile" else colour(span.name)
        ax.barh(
            y,
            width,
            left=left,
            height=height,
            color=fill,
            edgecolor="#333333",
            linewidth=0.4,
            gid=row.gid,
            hatch="///" if row.lane == "server" else None,
        )
    if row.lane == "profile":
        return
    total = sum(s.duration_ns for s in row.spans) / 1e6
    end = (max(s.end_ns for s in row.spans) - t0) / 1e6
    ax.annotate(
        label_text(total),
        (end, y),
        xytext=(4, 0),
        textcoords="offset points",
        va="center",
        fontsize=8,
        color="#222222",
        gid=f"label:{row.gid}",
        bbox=LABEL_BOX,  # lines (TTFT, grid) pass behind the text, not through it
    )


def _draw_tokens(ax: Axes, wf: Waterfall, y: float) -> None:
    """Token arrivals as short ticks just above the decode bar, so they never hide it."""
    xs = [(t - wf.start_ns) / 1e6 for t in wf.chunk_times_ns]
    if xs:
        ax.vlines(xs, y - 0.47, y - 0.33, colors="#222222", linewidth=0.7, gid="tokens")


def _title(wf: Waterfall) -> str:
    url = wf.url if len(wf.url) <= 70 else wf.url[:67] + "…"
    how = "reused connection" if wf.connection.reused else "new connection"
    version = f"HTTP/{wf.http_version}" if wf.http_version else "no response"
    status = f"error: {wf.error_type}" if wf.error else f"status {wf.status}"
    return f"{wf.method} {url}\n{status}, {version}, {how}, e2e {wf.e2e * 1e3:.1f} ms"


def plot_waterfall(wf: Waterfall, ax: Axes | None = None) -> Axes:
    """Draw one request as a waterfall; returns the Axes (``ax.figure`` is the figure).

    Bars carry ``gid`` ``stage:<name>`` (client), ``server:<name>``, ``profile:<thread>``;
    the token ticks are one ``LineCollection`` with gid ``tokens``.

    Raises:
        UsageError: matplotlib is not installed.
    """
    rows = _rows(wf)
    if ax is None:
        ax = new_axes((10.0, 1.4 + 0.36 * max(len(rows), 3)))
    for y, row in enumerate(rows):
        _draw_row(ax, y, row, wf.start_ns, y)
    gids = [r.gid for r in rows]
    # ticks over decode; a one-chunk answer has no decode, so its token sits on first_token
    for gid in ("stage:decode", "stage:first_token"):
        if gid in gids:
            _draw_tokens(ax, wf, gids.index(gid))
            break
    _decorate(ax, wf, rows)
    return ax


def _decorate(ax: Axes, wf: Waterfall, rows: Sequence[_Row]) -> None:
    e2e_ms = wf.e2e * 1e3
    ax.set_yticks(range(len(rows)), [r.label for r in rows], fontsize=9)
    for tick, row in zip(ax.get_yticklabels(), rows, strict=True):
        tick.set_color("#555555" if row.lane != "client" else "#000000")
    ax.set_ylim(len(rows) - 0.4, -0.7)  # top to bottom in path order, room for token ticks
    ax.set_xlim(0, max(e2e_ms, 1e-3) * 1.16)  # room for the last bar's label
    ax.set_xlabel("ms since the request started")
    ax.grid(axis="x", color="#DDDDDD", linewidth=0.6)
    ax.set_axisbelow(True)
    if wf.ttft is not None:
        ttft = wf.ttft * 1e3
        ax.axvline(ttft, color="#666666", linestyle="--", linewidth=0.8, gid="ttft")
        ax.annotate(
            f"TTFT {ttft:.1f} ms",
            (ttft, -0.62),
            xytext=(3, 0),
            textcoords="offset points",
            fontsize=8,
            color="#444444",
            va="top",
        )
    ax.axvline(e2e_ms, color="#999999", linewidth=0.8, gid="e2e")
    ax.set_title(_title(wf), fontsize=9, loc="left")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
