"""Server metrics beside the waterfalls: Prometheus / OpenMetrics scraping during runs.

::

    from latency_analyzer.metrics import Scraper, join, explain, summary_text

    scraper = Scraper(["http://gpu-1:8000/metrics", "http://gpu-1:9400/metrics"], interval=0.5)
    result = await load.run(scenario, hooks=[scraper.hook])
    cols = join(result.set, scraper.series, ["vllm", "dcgm"])
    result.set.where(cols["vllm_waiting@start"] > 8).percentiles("ttft")["p99"]
    print(explain(result.set, cols))
    print(summary_text(scraper.series))

Layers: ``_parse`` (sans-IO, prometheus_client's parsers) ← ``_series`` (columnar storage,
rates, per-interval histogram quantiles) ← ``_scraper`` (aiohttp, background tasks) and
``_join`` (per-request values, correlations).
"""

from ._join import POINTS, Correlation, correlate, explain, join, request_instants
from ._parse import MetricsParseError, ParsedSample, is_openmetrics, parse
from ._presets import DCGM, LLAMACPP, PRESETS, TESTBED, VLLM, Metric, resolve, specs
from ._scraper import MIN_INTERVAL_S, Scraper, Target
from ._series import METRICS_SCHEMA, Gap, MetricSeries, SeriesKey
from ._table import summary_rows, summary_text
from ._timeseries import TimeSeries

__all__ = [
    "DCGM",
    "LLAMACPP",
    "METRICS_SCHEMA",
    "MIN_INTERVAL_S",
    "POINTS",
    "PRESETS",
    "TESTBED",
    "VLLM",
    "Correlation",
    "Gap",
    "Metric",
    "MetricSeries",
    "MetricsParseError",
    "ParsedSample",
    "Scraper",
    "SeriesKey",
    "Target",
    "TimeSeries",
    "correlate",
    "explain",
    "is_openmetrics",
    "join",
    "parse",
    "request_instants",
    "resolve",
    "specs",
    "summary_rows",
    "summary_text",
]
