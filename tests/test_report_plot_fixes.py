"""What the plots and the text waterfall say must be true: every ITL gap counted, labels that
say what a bar is, the legend in path order, a visible warm-up, text rows that add up."""

from __future__ import annotations

import re

import numpy as np
import pytest

from latency_analyzer.analysis import Tags, WaterfallSet
from latency_analyzer.report.waterfall_text import render_waterfall
from latency_analyzer.testing.waterfalls import synthetic

pytest.importorskip("matplotlib")

from latency_analyzer.report.plot import plot_attribution, plot_over_time, plot_set


def test_zero_itl_gaps_are_counted_and_said() -> None:
    # 10 requests x 20 gaps, 5 of each request's gaps 0 ms (tokens that came in one chunk)
    wfs = [
        synthetic(start_ms=100.0 * i, send=0.1, wait=5.0, first_token=10.0,
                  gaps=[0.0] * 5 + [4.0 + i % 3] * 15)
        for i in range(10)
    ]  # fmt: skip
    cdf = plot_set(wfs).axes[2]
    line = next(x for x in cdf.get_lines() if x.get_gid() == "ITL (per token)")
    assert line.get_ydata()[0] == pytest.approx(51 / 200)  # 50 zeros and the first gap
    assert line.get_ydata()[-1] == pytest.approx(1.0)
    text = next(
        t.get_text() for t in cdf.get_legend().get_texts() if t.get_text().startswith("ITL")
    )
    assert "n=200" in text and "50 of 0 ms (25%)" in text


def _set(n: int = 60) -> WaterfallSet:
    ws = WaterfallSet()
    for i in range(n):
        slow = i >= n - 3  # the three slowest looked the name up and shook hands
        extra = {"dns": 40.0, "tls": 30.0} if slow else {}
        wf = synthetic(start_ms=50.0 * i, send=0.1, wait=20.0 + i, first_token=10.0, **extra)
        ws.add(wf, Tags(warmup=i < 4))
    return ws


def test_the_band_label_says_mean_and_percentile_and_ticks_the_percentile() -> None:
    ws = _set()
    ax = plot_attribution(ws)
    kept = np.sort(ws.column("e2e_ns")[~ws.warmup]) / 1e6
    labels = {t.get_gid(): t.get_text() for t in ax.texts}
    p99 = float(np.percentile(kept, 99, method="inverted_cdf"))
    mean, stated = re.findall(r"[\d.]+(?= ms)", labels["label:P99"])
    assert float(stated) == pytest.approx(p99, abs=0.05)
    assert labels["label:P99"].startswith("mean ") and "\nP99 " in labels["label:P99"]
    ticks = [c for c in ax.collections if c.get_gid() == "percentile"]
    assert len(ticks) == 3
    assert float(mean) != pytest.approx(p99, abs=0.05)  # the bar is a mean, not the P99


def test_legend_lists_stages_in_path_order() -> None:
    ws = _set()  # dns and tls only in the P99 band, drawn after P50's stages
    ax = plot_attribution(ws)
    names = [t.get_text() for t in ax.get_legend().get_texts()]
    assert names == [s for s in ws.stages if s in names]
    assert names.index("dns") < names.index("send") < names.index("wait")


def test_warmup_shading_reaches_the_first_measured_request() -> None:
    ws = _set()
    ax = plot_over_time(ws)
    (patch,) = [p for p in ax.patches if p.get_gid() == "warmup"]
    x0, x1 = patch.get_x(), patch.get_x() + patch.get_width()
    first_measured = float(ws.elapsed_s()[~ws.warmup].min())
    assert x0 == 0 and x1 == pytest.approx(first_measured)
    assert "warm-up (4 requests)" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_text_rows_of_a_merged_waterfall_add_up_and_show_the_server() -> None:
    wf = synthetic(
        dns=12.5, connect=3.25, tls=8.0, send=0.2, wait=30.0, first_token=45.0,
        gaps=[10.0, 12.0, 9.5, 10.5], tail=1.5, http_version="2",
        server=[("wait", "server_queue", 5.0, 20.0), ("first_token", "prefill", 2.0, 40.0),
                ("decode", "decode", 0.0, 41.0)],
    )  # fmt: skip
    lines = render_waterfall(wf).splitlines()
    body = lines[3 : next(i for i, x in enumerate(lines) if x.lstrip().startswith("e2e"))]
    # the self column: a number per row, brackets (a stage told by its sub-rows) not counted
    selfs = [float(m) for x in body if (m := _self(x)) is not None]
    assert sum(selfs) == pytest.approx(wf.e2e * 1e3, abs=0.02)
    text = "\n".join(lines)
    for row in ("↳ server_queue (server)", "↳ prefill (server)", "↳ decode (server)"):
        assert row in text
    assert text.count("↳ network") == 3
    assert "(30.00 ms)" in text  # the wait stage's own length, in brackets


def _self(line: str) -> str | None:
    m = re.match(r"\s+(?:↳ )?[\w ()]+?\s+(\(?)([\d.]+) ms\)?", line)
    return None if m is None or m.group(1) == "(" else m.group(2)
