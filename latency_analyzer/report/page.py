"""One self-contained HTML page for one run, or two runs side by side.

``report_page(runs)`` returns the page: the conditions of each run, its percentile table with
confidence intervals, percentile and CDF plots (PNG, inline as ``data:`` URIs), the slowest
requests' waterfalls (inline SVG), the diagnosis with its what-if and, for two runs, the
comparison. It needs nothing at view time: CSS is inline, images are data URIs, and a
Content-Security-Policy forbids every fetch (a page that tried would show an error in the
browser's console). A four-line inline script marks the page rendered once every image has
decoded (``<body data-rendered="ok N">``), which is what the browser test reads.

Needs matplotlib (``latency-analyzer[plots]``).
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._version import __version__
from ..analysis import WaterfallSet, compare
from ..timeline import Waterfall
from ._figure import figure_class
from .html import waterfall_svg
from .palette import colour

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["Run", "report_page"]

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;color:#222;margin:24px auto;max-width:1200px;
padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 6px}.muted{color:#666}.cond{font-family:ui-monospace,monospace;
font-size:12px;white-space:pre-wrap;background:#f6f6f6;padding:8px;border-radius:4px}
table{border-collapse:collapse;font-size:12px;font-variant-numeric:tabular-nums}
td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
td:first-child,th:first-child{text-align:left}img{max-width:100%}
.finding{border-left:4px solid #c0392b;padding:4px 10px;margin:8px 0;background:#fdf3f2}
.finding b{font-size:14px}.whatif{border-left:4px solid #27ae60;padding:4px 10px;background:#f0faf3}
pre{font-size:12px;background:#f6f6f6;padding:8px;overflow-x:auto}
"""

_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"

_SCRIPT = """
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.every(function (i) { return i.complete && i.naturalWidth > 0; });
  document.body.setAttribute("data-rendered", (ok ? "ok " : "broken ") + imgs.length);
});
"""


@dataclass(frozen=True)
class Run:
    """One run for the page: a name, its waterfalls and its set (warm-up rows marked)."""

    name: str
    waterfalls: Sequence[Waterfall]
    set: WaterfallSet
    warmup: Sequence[bool] = ()

    def measured(self) -> list[Waterfall]:
        """The requests the statistics use: not warm-up."""
        flags = list(self.warmup) or [False] * len(self.waterfalls)
        return [wf for wf, warm in zip(self.waterfalls, flags, strict=True) if not warm]


def _esc(x: object) -> str:
    return html.escape(str(x), quote=True)


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _img(fig: Figure, alt: str) -> str:
    return f'<img alt="{_esc(alt)}" src="{_png(fig)}">'


def _values_ms(ws: WaterfallSet, metric: str) -> np.ndarray[Any, np.dtype[np.float64]]:
    vals = np.asarray(ws.values(metric), dtype=np.float64) * 1e3
    return vals[~np.isnan(vals)]


_NINES = np.array([50, 75, 90, 95, 99, 99.9])


def _percentile_plot(runs: Sequence[Run], metric: str) -> str:
    """``metric`` at each percentile, on an axis that spreads the tail (1 / (1 - p))."""
    fig = figure_class()(figsize=(6.0, 3.6), layout="constrained")
    ax = fig.subplots()
    xs = 1.0 / (1.0 - _NINES / 100.0)
    for i, run in enumerate(runs):
        vals = _values_ms(run.set.where(~run.set.warmup), metric)
        if vals.size == 0:
            continue
        ys = np.percentile(vals, _NINES, method="inverted_cdf")
        ax.plot(xs, ys, marker="o", label=f"{run.name} (n={vals.size})", color=_run_colour(i))
    ax.set_xscale("log")
    ax.set_xticks(list(xs), [f"P{p:g}" for p in _NINES])
    ax.minorticks_off()
    ax.set_ylabel(f"{metric} (ms)")
    ax.set_title(f"{metric}: percentiles", fontsize=10, loc="left")
    ax.grid(color="#EEEEEE", linewidth=0.6)
    ax.legend(fontsize=8, frameon=False)
    return _img(fig, f"{metric} percentiles")


def _cdf_plot(runs: Sequence[Run], metric: str) -> str:
    fig = figure_class()(figsize=(6.0, 3.6), layout="constrained")
    ax = fig.subplots()
    for i, run in enumerate(runs):
        vals = np.sort(_values_ms(run.set.where(~run.set.warmup), metric))
        if vals.size == 0:
            continue
        ys = np.arange(1, vals.size + 1) / vals.size
        ax.step(vals, ys, where="post", label=f"{run.name} (n={vals.size})", color=_run_colour(i))
    ax.set_xlabel(f"{metric} (ms)")
    ax.set_ylabel("fraction of requests ≤ x")
    ax.set_title(f"{metric}: distribution (CDF)", fontsize=10, loc="left")
    ax.grid(color="#EEEEEE", linewidth=0.6)
    ax.legend(fontsize=8, frameon=False, loc="lower right")
    return _img(fig, f"{metric} CDF")


def _run_colour(i: int) -> str:
    return (colour("first_token"), colour("tls"), colour("decode"))[i % 3]


def _table(run: Run) -> str:
    summary = run.set.summary()
    cells = summary.table()
    if not cells:
        return "<p>no requests</p>"
    head = "".join(f"<th>{_esc(c)}</th>" for c in cells[0])
    body = "".join(
        "<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in row) + "</tr>" for row in cells[1:]
    )
    notes = "".join(f"<li>{_esc(n)}</li>" for n in summary.notes)
    conditions = "\n".join(summary.conditions_lines()) or "no conditions recorded"
    return (
        f'<div class="cond">{_esc(conditions)}</div>'
        f"<p>{_esc(summary.counts_line())}. Cells: value [low–high], the "
        f"{summary.confidence:.0%} bootstrap confidence interval.</p>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        + (f"<ul>{notes}</ul>" if notes else "")
    )


def _slowest(run: Run, count: int) -> str:
    wfs = sorted(run.measured(), key=lambda wf: -wf.e2e_ns)[:count]
    if not wfs:
        return "<p>no requests</p>"
    parts = []
    for wf in wfs:
        ttft = "" if wf.ttft is None else f", TTFT {wf.ttft * 1e3:.1f} ms"
        error = "" if wf.ok else f", failed: {wf.error_type}"
        parts.append(f"<h3>e2e {wf.e2e * 1e3:.1f} ms{ttft}{_esc(error)}</h3>{waterfall_svg(wf)}")
    return "".join(parts)


def _diagnosis(run: Run) -> str:
    from ..analysis.diagnose import diagnose, what_if

    wfs = [wf for wf in run.measured() if wf.ok]
    findings = diagnose(wfs)
    if not findings:
        return "<p>no findings: nothing stands out</p>"
    blocks = []
    for f in findings:
        metric = "TTFT" if f.metric == "ttft" else "e2e"
        after = "" if f.what_if_s is None else f"; {metric} {f.what_if_s * 1e3:.1f} ms with it"
        blocks.append(
            f'<div class="finding"><b>{_esc(f.title)}</b> '
            f'<span class="muted">[{_esc(f.rule)}] {f.time_at_stake_s * 1e3:.1f} ms of '
            f"{metric} per request at stake{_esc(after)}</span><br>"
            f"evidence: {_esc(f.evidence)}<br>cause: {_esc(f.cause)}<br>"
            f"remedy: {_esc(f.remedy)}</div>"
        )
    blocks.append(f'<div class="whatif">{_esc(what_if(wfs, findings))}</div>')
    return "".join(blocks)


def _comparison(a: Run, b: Run) -> str:
    comp = compare(a.set, b.set)
    return (
        f"<p>baseline <b>{_esc(a.name)}</b>, candidate <b>{_esc(b.name)}</b>; speedup = "
        f"baseline / candidate.</p><pre>{_esc(comp.to_text())}</pre>"
    )


def report_page(
    runs: Sequence[Run],
    *,
    title: str | None = None,
    slowest: int = 3,
    sections: Sequence[tuple[str, str]] = (),
) -> str:
    """The page for one run or two (the second is compared with the first).

    ``sections``: more (heading, HTML) sections, placed after the comparison (the CLI's
    claim and money verdict is one).

    Raises:
        UsageError: matplotlib is not installed, or a run has no requests.
    """
    if not 1 <= len(runs) <= 2:
        raise ValueError("report_page takes one run or two")
    created = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    name = title or " vs ".join(r.name for r in runs)
    parts = [
        f"<h1>{_esc(name)}</h1>",
        f'<p class="muted">latency-analyzer {_esc(__version__)} · made {created}</p>',
        "<h2>Percentiles</h2>",
        _percentile_plot(runs, "ttft") + _percentile_plot(runs, "e2e"),
        "<h2>Distributions</h2>",
        _cdf_plot(runs, "ttft") + _cdf_plot(runs, "e2e"),
    ]
    if len(runs) == 2:
        parts += ["<h2>Comparison</h2>", _comparison(runs[0], runs[1])]
    for heading, body in sections:
        parts += [f"<h2>{_esc(heading)}</h2>", body]
    for run in runs:
        parts += [
            f'<h2 id="run-{_esc(run.name)}">{_esc(run.name)}: conditions and percentiles</h2>',
            _table(run),
            f"<h2>{_esc(run.name)}: diagnosis</h2>",
            _diagnosis(run),
            f"<h2>{_esc(run.name)}: the {slowest} slowest requests</h2>",
            _slowest(run, slowest),
        ]
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        f"<title>{_esc(name)}</title><style>{_CSS}</style>"
        f"<script>{_SCRIPT}</script></head><body>" + "\n".join(parts) + "</body></html>\n"
    )
