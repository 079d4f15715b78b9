"""Plots, notebook HTML/SVG/PNG, terminal tables and the palette: structure, not just "no error"."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest

from latency_analyzer import UsageError, Waterfall
from latency_analyzer.analysis import Tags, WaterfallSet
from latency_analyzer.report import (
    STAGE_COLOURS,
    plot_set,
    plot_waterfall,
    set_html,
    set_table,
    waterfall_html,
    waterfall_png,
    waterfall_svg,
)
from latency_analyzer.report.palette import OKABE_ITO, ansi256
from latency_analyzer.report.waterfall_text import render_waterfall
from latency_analyzer.testing.waterfalls import synthetic

pytest.importorskip("matplotlib")
from matplotlib.collections import LineCollection
from matplotlib.patches import Rectangle

GAPS = [10.0, 12.0, 9.5, 10.5, 11.0, 10.0]


def merged() -> Waterfall:
    return synthetic(
        dns=12.5, connect=3.25, tls=8.0, send=0.2, wait=30.0, first_token=45.0, gaps=GAPS,
        tail=1.5, http_version="2",
        server=[("wait", "server_queue", 5.0, 20.0), ("first_token", "prefill", 2.0, 40.0),
                ("decode", "decode", 0.0, 62.0)],
        profile=[("engine", "forward", 75.0, 20.0), ("api", "detokenize", 110.0, 4.0)],
    )  # fmt: skip


def _bars(ax: Any, prefix: str) -> list[Rectangle]:
    return [p for p in ax.patches if (p.get_gid() or "").startswith(prefix)]


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=60)
    return buf.getvalue()


# -- one request ------------------------------------------------------------------------------
def test_waterfall_plot_has_one_bar_per_stage_and_server_lanes() -> None:
    wf = merged()
    ax = plot_waterfall(wf)
    stages = _bars(ax, "stage:")
    assert [b.get_gid() for b in stages] == [f"stage:{s.name}" for s in wf.root.children]
    for bar, span in zip(stages, wf.root.children, strict=True):  # to scale, in ms from start
        assert bar.get_x() == pytest.approx((span.start_ns - wf.start_ns) / 1e6)
        assert bar.get_width() == pytest.approx(span.duration_ns / 1e6)
        assert bar.get_facecolor()[:3] == pytest.approx(_rgb(STAGE_COLOURS[span.name]))
    assert [b.get_gid() for b in _bars(ax, "server:")] == [
        "server:server_queue", "server:prefill", "server:decode"
    ]  # fmt: skip
    assert {b.get_gid() for b in _bars(ax, "profile:")} == {"profile:engine", "profile:api"}
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[:7] == ["dns", "connect", "tls", "send", "wait", "↳ server_queue (server)",
                          "first_token"]  # fmt: skip
    assert labels[-2:] == ["profile: engine", "profile: api"]


def test_waterfall_plot_labels_durations_and_ticks_tokens() -> None:
    wf = merged()
    ax = plot_waterfall(wf)
    texts = {t.get_gid(): t.get_text() for t in ax.texts}
    assert texts["label:stage:dns"] == "12.5 ms" and texts["label:stage:decode"] == "63.0 ms"
    assert texts["label:server:prefill"] == "40.0 ms"
    ticks = [c for c in ax.collections if c.get_gid() == "tokens"]
    assert len(ticks) == 1 and isinstance(ticks[0], LineCollection)
    segments = ticks[0].get_segments()
    assert len(segments) == len(wf.chunk_times_ns) == 7
    decode_row = labels_index(ax, "decode")
    for seg, t in zip(segments, wf.chunk_times_ns, strict=True):
        assert seg[0][0] == pytest.approx((t - wf.start_ns) / 1e6)
        assert seg[0][1] < decode_row - 0.31  # above the bar (rows run top to bottom)
    assert "TTFT" in " ".join(texts.values())
    assert ax.get_xlim()[1] > wf.e2e * 1e3  # room for the last label


def labels_index(ax: Any, name: str) -> int:
    return [t.get_text() for t in ax.get_yticklabels()].index(name)


def test_waterfall_plot_renders_png_and_svg_headless(tmp_path: Any) -> None:
    ax = plot_waterfall(merged())
    png = _png(ax.figure)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    ax.figure.savefig(tmp_path / "wf.svg")
    assert (tmp_path / "wf.svg").read_text().lstrip().startswith("<?xml")


def test_waterfall_plot_of_a_failed_request_and_a_given_axes() -> None:
    from matplotlib.figure import Figure

    failed = synthetic(dns=2.0, connect=1.0, send=0.1, wait=50.0, status=None, error_type="reset")
    fig = Figure()
    ax = fig.add_subplot()
    assert plot_waterfall(failed, ax) is ax
    assert "error: reset" in ax.get_title(loc="left")
    assert not [c for c in ax.collections if c.get_gid() == "tokens"]


def test_missing_matplotlib_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(UsageError, match=r"pip install 'latency-analyzer\[plots\]'"):
        plot_waterfall(merged())


# -- many requests ----------------------------------------------------------------------------
def run(n: int = 60) -> list[Waterfall]:
    return [
        synthetic(
            start_ms=i * 50.0,
            pool_wait=(i % 7) * 3.0,
            send=0.1,
            wait=20.0 + i % 5,
            first_token=30.0 + (i * 7) % 40,
            gaps=[8.0 + i % 3] * 20,
            tail=1.0,
            reused=i > 0,
        )
        for i in range(n)
    ]


def test_set_plot_structure() -> None:
    wfs = run()
    fig = plot_set(wfs)
    attribution, over_time, cdf, hist = fig.axes[:4]
    # documented: the requests within ±2.5 percentile points (rank (k + 0.5) / n)
    expect = [sum(abs(100 * (k + 0.5) / 60 - p) <= 2.5 for k in range(60)) for p in (50, 95, 99)]
    assert [t.get_text() for t in attribution.get_yticklabels()] == [
        f"P{p} (n={n})" for p, n in zip((50, 95, 99), expect, strict=True)
    ]
    # each bar's segments add up to (about) that percentile of e2e
    e2e = sorted(wf.e2e * 1e3 for wf in wfs)
    for y, p in enumerate((50, 95, 99)):
        total = sum(b.get_width() for b in attribution.patches if round(b.get_y() + 0.3) == y)
        assert abs(total - e2e[min(59, round(p / 100 * 59))]) < 25.0
    assert {b.get_gid() for b in attribution.patches} == {
        f"band:{s}" for s in ("pool_wait", "send", "wait", "first_token", "decode", "tail")
    }
    points = {c.get_gid(): len(c.get_offsets()) for c in over_time.collections}
    assert points["e2e"] == points["ttft"] == 60
    lines = {line.get_gid(): len(line.get_xdata()) for line in cdf.get_lines()}
    assert lines == {"TTFT": 60, "ITL (per token)": 60 * 20}
    assert cdf.get_xscale() == "log" and hist.get_xscale() == "log"
    assert len(_png(fig)) > 10000


def test_set_plot_from_a_waterfall_set_marks_warmup_and_failures() -> None:
    ws = WaterfallSet()
    for i, wf in enumerate(run(30)):
        ws.add(wf, Tags(warmup=i < 5))
    ws.add(synthetic(start_ms=2000.0, dns=1.0, connect=1.0, send=0.1, wait=9.0,
                     error_type="reset", status=None), Tags())  # fmt: skip
    fig = plot_set(ws)
    over_time, cdf = fig.axes[1], fig.axes[2]
    assert [p.get_gid() for p in over_time.patches] == ["warmup"]
    assert "failed" in [t.get_text() for t in over_time.get_legend().get_texts()]
    assert {line.get_gid() for line in cdf.get_lines()} == {"TTFT", "TPOT (per request)"}
    assert "31 requests, 1 failed, 5 warm-up" in fig.get_suptitle()


def test_empty_set_cannot_be_plotted() -> None:
    with pytest.raises(UsageError, match="empty"):
        plot_set([])


# -- notebook, terminal, palette --------------------------------------------------------------
def test_waterfall_html_is_a_table_and_an_inline_svg() -> None:
    wf = synthetic(send=0.1, wait=5.0, first_token=8.0, gaps=[2.0] * 4, tail=0.3,
                   url="https://llm.test/v1?q=<script>")  # fmt: skip
    html = waterfall_html(wf)
    assert "<table" in html and "<svg" in html and "<script>" not in html
    assert "&lt;script&gt;" in html  # shown, escaped
    svg = waterfall_svg(wf)
    assert svg.count("<rect") == len(wf.root.children)
    assert svg.count("<line") == len(wf.chunk_times_ns)
    assert "5.00 ms" in svg


def test_set_html_and_png_fallback() -> None:
    ws = WaterfallSet()
    ws.extend(run(20))
    html = set_html(ws)
    assert "20 requests" in html and "<th>P95</th>" in html and "ttft" in html
    assert waterfall_png(merged())[:4] == b"\x89PNG"


def test_rich_set_table() -> None:
    from rich.console import Console

    ws = WaterfallSet()
    ws.extend(run(20))
    table = set_table(ws)
    assert table.row_count == len(ws.metric_names())
    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(table)
    out = console.file.getvalue()  # type: ignore[attr-defined]  # the console's file is the StringIO given above
    assert "P95 ms" in out and "P99 ms" in out and "first_token" in out
    assert len(table.columns) == 7 and all(len(c._cells) == table.row_count for c in table.columns)


def test_terminal_colours_come_from_the_plot_palette() -> None:
    text = render_waterfall(merged(), colour=True)
    assert f"\x1b[38;5;{ansi256(STAGE_COLOURS['dns'])}m" in text
    assert ansi256("#000000") == 16 and ansi256("#FFFFFF") == 231
    assert ansi256("#999999") == 246  # greys go to the grey ramp
    assert set(STAGE_COLOURS.values()) - set(OKABE_ITO.values()) <= {
        "#999999", "#BBBBBB", "#DDDDDD", "#A6D8F5"
    }  # fmt: skip


def _rgb(hex_colour: str) -> tuple[float, float, float]:
    r, g, b = (int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return (r, g, b)
