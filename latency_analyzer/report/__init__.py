"""See it and act on it: plots, notebook display, terminal text and exports.

::

    from latency_analyzer import report

    report.plot_waterfall(wf)                      # matplotlib Axes (latency-analyzer[plots])
    report.plot_set(ws)                            # Figure: attribution, TTFT/ITL, over time
    report.waterfall_html(wf)                      # table + inline SVG, no JavaScript
    report.write_har([wf], "run.har")              # Chrome DevTools → Network → import
    report.write_chrome_trace(wfs, "trace.json")   # ui.perfetto.dev
    report.to_otlp_json(wfs)                       # beside the server's spans in Jaeger/Tempo
    report.report_page([report.Run("a", wfs, ws)]) # one self-contained HTML page
    report.write_jsonl(wfs, "run.jsonl"); report.to_dataframe(wfs)

Everything loads on first use, so ``import latency_analyzer.report.waterfall_text`` (the CLI)
pulls in neither numpy nor matplotlib. Every export is versioned and scrubbed of credentials.
"""

from __future__ import annotations

import importlib
import typing

if typing.TYPE_CHECKING:
    from ._common import EXPORT_SCHEMA, scrub
    from .chrome_trace import to_chrome_trace, write_chrome_trace
    from .har import to_har, write_har
    from .html import set_html, waterfall_html, waterfall_png, waterfall_svg
    from .otlp import send_otlp, to_otlp_json, write_otlp_json
    from .page import Run, report_page
    from .palette import STAGE_COLOURS, colour
    from .row_exports import (
        read_jsonl,
        to_csv,
        to_dataframe,
        write_csv,
        write_jsonl,
        write_parquet,
    )
    from .set_plots import plot_attribution, plot_distributions, plot_over_time, plot_set
    from .summary_table import set_table
    from .waterfall_plot import plot_waterfall
    from .waterfall_text import render_waterfall

_WHERE = {
    "EXPORT_SCHEMA": "_common",
    "scrub": "_common",
    "to_chrome_trace": "chrome_trace",
    "write_chrome_trace": "chrome_trace",
    "to_har": "har",
    "write_har": "har",
    "set_html": "html",
    "waterfall_html": "html",
    "waterfall_png": "html",
    "waterfall_svg": "html",
    "send_otlp": "otlp",
    "to_otlp_json": "otlp",
    "write_otlp_json": "otlp",
    "Run": "page",
    "report_page": "page",
    "STAGE_COLOURS": "palette",
    "colour": "palette",
    "plot_attribution": "set_plots",
    "plot_distributions": "set_plots",
    "plot_over_time": "set_plots",
    "plot_set": "set_plots",
    "plot_waterfall": "waterfall_plot",
    "read_jsonl": "row_exports",
    "to_csv": "row_exports",
    "to_dataframe": "row_exports",
    "write_csv": "row_exports",
    "write_jsonl": "row_exports",
    "write_parquet": "row_exports",
    "set_table": "summary_table",
    "render_waterfall": "waterfall_text",
}

__all__ = [
    "EXPORT_SCHEMA",
    "STAGE_COLOURS",
    "Run",
    "colour",
    "plot_attribution",
    "plot_distributions",
    "plot_over_time",
    "plot_set",
    "plot_waterfall",
    "read_jsonl",
    "render_waterfall",
    "report_page",
    "scrub",
    "send_otlp",
    "set_html",
    "set_table",
    "to_chrome_trace",
    "to_csv",
    "to_dataframe",
    "to_har",
    "to_otlp_json",
    "waterfall_html",
    "waterfall_png",
    "waterfall_svg",
    "write_chrome_trace",
    "write_csv",
    "write_har",
    "write_jsonl",
    "write_otlp_json",
    "write_parquet",
]


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
