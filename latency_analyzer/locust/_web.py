"""Our page in Locust's web UI: stage percentiles and the waterfalls of the slowest requests.

``/latency`` is a plain HTML page built with ``report.html`` (the notebook views: the P50/P95/
P99 table with 95% intervals, and each slow request as an SVG waterfall). A "Latency" tab in
Locust's own UI shows the same percentiles, refreshed with Locust's statistics, and links to
the page.
"""

from __future__ import annotations

import html
import json
from typing import Any

import numpy as np

from ..analysis._columns import COUNT_METRICS
from ..report.html import set_html, waterfall_html
from ._run import LocustRun

__all__ = ["PATH", "add_page", "page_html", "tab_rows"]

PATH = "/latency"
_TAB = "latency-analyzer"
_PS = ("p50", "p95", "p99")


def page_html(run: LocustRun) -> str:
    """The whole page (a fresh snapshot of the run so far)."""
    ws = run.set
    body = ["<h1>latency_analyzer: where the milliseconds went</h1>"]
    if ws is None or len(ws) == 0:
        body.append("<p>No requests recorded yet.</p>")
    else:
        out = f" · run file: <code>{html.escape(str(ws.path))}</code>" if ws.path else ""
        body.append(f"<h2>Percentiles (ok requests; stages are self time){out}</h2>")
        body.append(set_html(ws))
        body.append("<h2>Slowest requests</h2>")
        body.extend(waterfall_html(wf) for wf in run.slowest())
    return (
        '<!doctype html><html><head><meta charset="utf-8"><title>latency_analyzer</title>'
        '<meta http-equiv="refresh" content="10"></head>'
        f'<body style="font-family:sans-serif">{"".join(body)}</body></html>'
    )


def tab_rows(run: LocustRun) -> list[dict[str, Any]]:
    """Rows of the Latency tab: metric or stage, n, P50/P95/P99 in ms."""
    ws = run.set
    if ws is None or len(ws) == 0:
        return []
    rows = []
    for name in ws.metric_names():
        vals = ws.values(name)
        if vals.size == 0:
            continue
        # plain percentiles: the tab is refreshed every 2 s, the page has the intervals
        p50, p95, p99 = np.percentile(vals, (50, 95, 99))
        scale = 1e3 if name not in COUNT_METRICS else 1.0
        row: dict[str, Any] = {"name": name, "n": int(vals.size)}
        row.update(
            {k: round(float(v) * scale, 3) for k, v in zip(_PS, (p50, p95, p99), strict=True)}
        )
        rows.append(row)
    return rows


def add_page(web_ui: Any, run: LocustRun) -> None:
    """Add ``/latency`` and the Latency tab to Locust's Flask app."""
    from flask import Response, request

    app = web_ui.app

    def latency_page() -> Response:
        return Response(page_html(run), mimetype="text/html")

    app.add_url_rule(PATH, "latency_analyzer", latency_page)

    web_ui.template_args["extended_tabs"] = [{"title": "Latency", "key": _TAB}]
    columns = [("name", "metric / stage"), ("n", "n"), ("p50", "P50 ms")]
    columns += [("p95", "P95 ms"), ("p99", "P99 ms")]
    web_ui.template_args["extended_tables"] = [
        {"key": _TAB, "structure": [{"key": k, "title": t} for k, t in columns]}
    ]

    def add_tab_rows(response: Response) -> Response:
        if request.path != "/stats/requests" or response.mimetype != "application/json":
            return response
        data = json.loads(response.get_data())
        data["extended_stats"] = [{"key": _TAB, "data": tab_rows(run)}]
        response.set_data(json.dumps(data))
        return response

    app.after_request(add_tab_rows)
