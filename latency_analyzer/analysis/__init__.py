"""Many waterfalls: a columnar set, percentiles with CIs, filters, comparisons, fingerprints.

::

    from latency_analyzer.analysis import WaterfallSet, compare, check_claim

    ws = WaterfallSet.load("run.jsonl")
    ws.percentiles("ttft")["p95"]            # Estimate(value, low, high, n, confidence)
    print(ws.summary().to_text())
    print(check_claim(base, cand, claimed=15.0, metric="ttft_p95"))

Diagnosis (findings, what-ifs) is the subpackage ``latency_analyzer.analysis.diagnose``,
imported on first use.
"""

from ._columns import Tags
from ._compare import ClaimCheck, Comparison, Speedup, check_claim, compare, gpu_cost
from ._fingerprint import base_rtt, fingerprint
from ._set import SET_SCHEMA, WaterfallSet
from ._stats import (
    PERCENTILES,
    Estimate,
    LogHistogram,
    mean_ci,
    percentile,
    percentile_ci,
    percentiles_ci,
)
from ._summary import Row, Summary

__all__ = [
    "PERCENTILES",
    "SET_SCHEMA",
    "ClaimCheck",
    "Comparison",
    "Estimate",
    "LogHistogram",
    "Row",
    "Speedup",
    "Summary",
    "Tags",
    "WaterfallSet",
    "base_rtt",
    "check_claim",
    "compare",
    "fingerprint",
    "gpu_cost",
    "mean_ci",
    "percentile",
    "percentile_ci",
    "percentiles_ci",
]
