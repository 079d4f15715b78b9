"""Text waterfall for terminals, in the spirit of httpstat: a bar per stage, offsets to scale."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from ..timeline import Span, Waterfall
from ._common import scrub
from .palette import STAGE_COLOURS, ansi256

__all__ = ["render_waterfall"]

_BAR_WIDTH = 40
# ANSI 256-colour codes derived from the plots' Okabe-Ito palette (report/palette.py); black
# (``send``) would vanish on a dark terminal, so it is drawn light grey there.
_COLOURS = {
    stage: 250 if hex_colour == "#000000" else ansi256(hex_colour)
    for stage, hex_colour in STAGE_COLOURS.items()
}


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


def _paint(text: str, stage: str, colour: bool) -> str:
    if not colour:
        return text
    return f"\x1b[38;5;{_COLOURS.get(stage, 250)}m{text}\x1b[0m"


def _bar(offset_ns: int, length_ns: int, total_ns: int) -> str:
    scale = _BAR_WIDTH / total_ns if total_ns else 0.0
    lead = min(_BAR_WIDTH - 1, int(offset_ns * scale))
    size = max(1, math.ceil(length_ns * scale)) if length_ns else 0
    return " " * lead + ("█" * min(size, _BAR_WIDTH - lead) if size else "▏")


def _headline(wf: Waterfall) -> str:
    conn = wf.connection
    how = "reused connection" if conn.reused else "new connection"
    peer = f" to {conn.peer}" if conn.peer else ""
    tls = f", {wf.tls.version} ALPN {wf.tls.alpn or '-'}" if wf.tls and wf.tls.version else ""
    version = f"HTTP/{wf.http_version}" if wf.http_version else "no response"
    status = wf.status if wf.status is not None else "-"
    return f"{wf.method} {wf.url}\n  {status} {version}, {how}{peer}{tls}"


@dataclass
class _Node:
    """A span's share of the request: its self time and its children's, clipped as the
    attribution clips them (so every nanosecond is counted once)."""

    span: Span
    self_ns: int
    children: list[_Node] = field(default_factory=list)


def _tree(span: Span, lo: int, hi: int) -> _Node:
    start, end = max(span.start_ns, lo), min(span.end_ns, hi)
    node = _Node(span, 0)
    if end <= start:
        return node
    cursor, covered = start, 0
    for child in span.children:
        c_start, c_end = max(child.start_ns, cursor), min(child.end_ns, end)
        if c_end < c_start:
            continue
        node.children.append(_tree(child, c_start, c_end))
        covered += c_end - c_start
        cursor = c_end
    node.self_ns = (end - start) - covered
    return node


def _total(node: _Node) -> int:
    return node.self_ns + sum(_total(c) for c in node.children)


def _sub_rows(node: _Node) -> list[tuple[str, int]]:
    """Inside a stage: each inner span by name (summed), then the stage's own residual."""
    by_name: dict[str, int] = {}
    for child in node.children:
        source = child.span.source
        label = child.span.name + ("" if source == "client" else f" ({source})")
        by_name[label] = by_name.get(label, 0) + _total(child)
    residual = "network" if any(c.span.source != node.span.source for c in node.children) else ""
    rows = list(by_name.items())
    if node.self_ns or residual:
        rows.append((residual or f"{node.span.name} (self)", node.self_ns))
    return rows


def _rows(wf: Waterfall, colour: bool) -> list[str]:
    total = wf.e2e_ns
    root = _tree(wf.root, wf.root.start_ns, wf.root.end_ns)
    subs = {id(n): _sub_rows(n) for n in root.children if n.children}
    width = max([12, *(len(label) + 4 for rows in subs.values() for label, _ in rows)])
    rows = [f"  {'stage':<{width}} {'self':>10} {'ends at':>10}  |{'':<{_BAR_WIDTH}}|"]
    for node in root.children:
        span = node.span
        offset = span.start_ns - wf.start_ns
        mark = " (interrupted)" if span.attributes.get("interrupted") else ""
        bar = _paint(_bar(offset, span.duration_ns, total).ljust(_BAR_WIDTH), span.name, colour)
        ends = _ms((span.end_ns - wf.start_ns) / 1e9)
        # a stage with spans inside (server spans merged in) shows its length in brackets:
        # the rows under it tell its time, so the self column still adds up to e2e
        own = f"({_ms(_total(node) / 1e9)})" if node.children else _ms(node.self_ns / 1e9)
        rows.append(f"  {span.name:<{width}} {own:>10} {ends:>10}  |{bar}|{mark}")
        for label, ns in subs.get(id(node), []):
            rows.append(f"    ↳ {label:<{width - 4}} {_ms(ns / 1e9):>10}")
    if root.self_ns:
        rows.append(f"  {'other':<{width}} {_ms(root.self_ns / 1e9):>10}")
    rows.append(f"  {'e2e':<{width}} {_ms(wf.e2e):>10}   (the self times above add up to it)")
    return rows


def _metrics(wf: Waterfall) -> list[str]:
    if wf.ttft is None:
        return []
    line = f"  TTFT {_ms(wf.ttft)}"
    if wf.ttfrt is not None:
        line += f" (reasoning {_ms(wf.ttfrt)}, answer {_ms(wf.ttfat)})"
    if wf.first_chunk_ns is not None:
        line += f" (first token chunk, empty text: {_ms(wf.ttfc)})"
    line += f" · TPOT {_ms(wf.tpot)} · {wf.output_tokens} output tokens ({wf.output_tokens_source})"
    itl = wf.itl
    if len(itl) >= 2:
        line += f" · ITL median {_ms(statistics.median(itl))}, max {_ms(max(itl))}"
    return [line, *_clock(wf)]


def _clock(wf: Waterfall) -> list[str]:
    """Where the arrival stamps came from and how late our loop read them."""
    if wf.clock_source is None:
        return []
    line = f"  clock {wf.clock_source}"
    if wf.ttft_wire is not None:
        line = f"  TTFT on the wire {_ms(wf.ttft_wire)} · clock {wf.clock_source}"
    if wf.read_lag_p50 is not None and wf.read_lag_max is not None:
        line += f" · read lag median {_ms(wf.read_lag_p50)}, max {_ms(wf.read_lag_max)}"
    if wf.shared_read_chunks:
        n = len(wf.shared_read_chunks)
        line += f" · {n} chunk{'' if n == 1 else 's'} read with later bytes"
    return [line]


def render_waterfall(wf: Waterfall, *, colour: bool = False) -> str:
    """The waterfall as lines of text; ``colour`` adds ANSI colours (for a TTY).

    The URL and messages are scrubbed of credentials like every export (``report._common``).
    """
    wf = scrub(wf)
    lines = [_headline(wf), *_rows(wf, colour), *_metrics(wf)]
    if wf.error:
        lines.append(f"  error ({wf.error_type}): {wf.error}")
    return "\n".join(lines)
