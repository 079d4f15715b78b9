"""matplotlib plots of one request and of many (``latency-analyzer[plots]``).

* ``plot_waterfall(wf)``: a Gantt chart of one request. One row per client stage, the server
  spans merge placed inside a stage on indented rows right under it, one row per profiled
  thread at the bottom; token arrivals as ticks over the decode row; every bar labelled with
  its duration; a dashed line at TTFT.
* ``plot_set(data)``: a 2×2 figure of many requests: what P50/P95/P99 requests are made of,
  latency over time with warm-up shaded, and TTFT/ITL distributions (CDF and histogram).

Figures are built with ``matplotlib.figure.Figure`` (no pyplot, no GUI, no global state), so
they render headless; ``fig.savefig("x.png")`` / ``.svg`` works. Colours: ``report.palette``.
One request is drawn by ``waterfall_plot``, many by ``set_plots``; both are here.
"""

from .set_plots import plot_attribution, plot_distributions, plot_over_time, plot_set
from .waterfall_plot import plot_waterfall

__all__ = [
    "plot_attribution",
    "plot_distributions",
    "plot_over_time",
    "plot_set",
    "plot_waterfall",
]
