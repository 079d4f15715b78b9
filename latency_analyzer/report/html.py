"""Notebook display: a compact table plus an inline SVG waterfall, no JavaScript, no matplotlib.

``waterfall_html(wf)`` is what ``Waterfall._repr_html_`` returns, ``set_html(ws)`` what
``WaterfallSet._repr_html_`` returns; ``waterfall_png(wf)`` (matplotlib) backs ``_repr_png_``
for front-ends that show no HTML. The SVG is drawn by hand (rectangles and text), so it is
small, sharp at any zoom, and needs no optional dependency. Every string shown is escaped.
"""

from __future__ import annotations

import html
import io
from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

from ..analysis import WaterfallSet
from ..timeline import Span, Waterfall
from ._common import scrub
from .palette import colour

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["set_html", "waterfall_html", "waterfall_png", "waterfall_svg"]

_ROW_H, _LABEL_W, _BAR_W, _VALUE_W = 18, 150, 420, 70


def _esc(x: object) -> str:
    return html.escape(str(x), quote=True)


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:.2f} ms"


def _svg_rows(wf: Waterfall) -> list[tuple[str, Span, bool]]:
    rows: list[tuple[str, Span, bool]] = []
    for stage in wf.root.children:
        rows.append((stage.name, stage, False))
        rows += [(f"↳ {c.name}", c, True) for c in stage.children if c.source == "server"]
    return rows


def waterfall_svg(wf: Waterfall) -> str:
    """One request as an inline SVG: a bar per stage (server spans indented, hatched lighter),
    token arrivals as ticks over the decode bar, durations at the right, and the time between
    the stages (``other``, which no bar shows) in a last row."""
    rows = _svg_rows(wf)
    other = wf.attribution().get("other", 0.0)
    total = max(wf.e2e_ns, 1)
    scale = _BAR_W / total
    width, height = _LABEL_W + _BAR_W + _VALUE_W, _ROW_H * (len(rows) + 1 + (other > 0))
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11" role="img">'
    ]
    for i, (label, span, server) in enumerate(rows):
        y = _ROW_H * (i + 1)
        x = _LABEL_W + (span.start_ns - wf.start_ns) * scale
        w = max(span.duration_ns * scale, 0.8)
        h, dy = (8, 5) if server else (12, 3)
        fill = colour(span.name)
        opacity = ' fill-opacity="0.6"' if server else ""
        grey = ' fill="#666"' if server else ""
        out.append(
            f'<text x="{_LABEL_W - 6}" y="{y + 12}" text-anchor="end"'
            f"{grey}>{_esc(label)}</text>"
            f'<rect x="{x:.1f}" y="{y + dy}" width="{w:.1f}" height="{h}" fill="{fill}"{opacity}>'
            f"<title>{_esc(label)}: {_esc(_ms(span.duration))}</title></rect>"
            f'<text x="{_LABEL_W + _BAR_W + 4}" y="{y + 12}" fill="#333">'
            f"{_esc(_ms(span.duration))}</text>"
        )
        if span.name == "decode" and not server:
            out += [
                f'<line x1="{_LABEL_W + (t - wf.start_ns) * scale:.1f}" y1="{y}" '
                f'x2="{_LABEL_W + (t - wf.start_ns) * scale:.1f}" y2="{y + 3}" stroke="#222"/>'
                for t in wf.chunk_times_ns
            ]
    if other > 0:  # time between the stages: no bar of its own, so a row says how much
        y = _ROW_H * (len(rows) + 1)
        out.append(
            f'<text x="{_LABEL_W - 6}" y="{y + 12}" text-anchor="end" fill="#666">other</text>'
            f'<text x="{_LABEL_W + _BAR_W - 4}" y="{y + 12}" text-anchor="end" fill="#666">'
            "between the stages</text>"
            f'<text x="{_LABEL_W + _BAR_W + 4}" y="{y + 12}" fill="#333">'
            f"{_esc(_ms(other))}</text>"
        )
    out.append(
        f'<text x="{_LABEL_W}" y="12" fill="#333">0</text>'
        f'<text x="{_LABEL_W + _BAR_W}" y="12" text-anchor="end" fill="#333">'
        f"{_esc(_ms(wf.e2e))}</text></svg>"
    )
    return "".join(out)


def _table(rows: Iterable[tuple[str, str]]) -> str:
    cells = "".join(
        f'<tr><th style="text-align:left;padding-right:1em">{_esc(k)}</th>'
        f'<td style="text-align:right">{_esc(v)}</td></tr>'
        for k, v in rows
    )
    return f'<table style="font-size:12px;border-collapse:collapse">{cells}</table>'


def waterfall_html(wf: Waterfall) -> str:
    """A heading line, the attribution table (self time per stage) and the SVG waterfall."""
    wf = scrub(wf)
    status = f"error: {wf.error_type} ({wf.error})" if wf.error else f"status {wf.status}"
    how = "reused connection" if wf.connection.reused else "new connection"
    head = f"{wf.method} {wf.url} · {status} · HTTP/{wf.http_version or '–'} · {how}"
    metrics = [("e2e", _ms(wf.e2e)), ("TTFT", _ms(wf.ttft)), ("TPOT", _ms(wf.tpot))]
    if wf.first_chunk_ns is not None:
        metrics.insert(2, ("TTFC (empty text included)", _ms(wf.ttfc)))
    metrics.append(("output tokens", str(wf.output_tokens if wf.output_tokens else "–")))
    stages = [(name, _ms(s)) for name, s in wf.attribution().items() if s]
    return (
        f'<div class="latency-analyzer-waterfall"><div style="font-size:12px">{_esc(head)}</div>'
        '<div style="display:flex;gap:2em;align-items:flex-start">'
        f"{_table(stages)}{_table(metrics)}</div>{waterfall_svg(wf)}</div>"
    )


def set_html(ws: WaterfallSet) -> str:
    """Counts and a P50/P95/P99 table (with 95% intervals) for the set's metrics and stages."""
    counts = ws.counts()
    head = (
        f"{counts['requests']} requests · {counts['ok']} ok · {counts['errors']} failed · "
        f"{counts['warmup']} warm-up"
    )
    lines = ['<table style="font-size:12px"><tr><th style="text-align:left">name</th>']
    lines += [f"<th>{p}</th>" for p in ("n", "P50", "P95", "P99")]
    lines.append("</tr>")
    for name in ws.metric_names():
        est = ws.percentiles(name, (50, 95, 99), resamples=200)
        n = len(ws.values(name))
        cells = "".join(
            f'<td style="text-align:right" title="95% CI {_ms(e.low)} – {_ms(e.high)}">'
            f"{_esc(_ms(e.value))}</td>"
            for e in (est["p50"], est["p95"], est["p99"])
        )
        swatch = f'<span style="color:{colour(name)}">■</span> '
        lines.append(f"<tr><td>{swatch}{_esc(name)}</td><td>{n}</td>{cells}</tr>")
    lines.append("</table>")
    return f'<div class="latency-analyzer-set"><div>{_esc(head)}</div>{"".join(lines)}</div>'


def waterfall_png(wf: Waterfall) -> bytes:
    """The matplotlib waterfall as PNG bytes (``_repr_png_``; needs ``[plots]``).

    Raises:
        UsageError: matplotlib is not installed.
    """
    from .plot import plot_waterfall

    ax = plot_waterfall(scrub(wf))
    buf = io.BytesIO()
    figure = cast("Figure", ax.figure)  # plot_waterfall made a top-level Figure
    figure.savefig(buf, format="png", dpi=100)
    return buf.getvalue()
