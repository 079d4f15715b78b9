"""Many waterfalls: a columnar set, percentiles with CIs, filters, comparisons, fingerprints.

::

    from latency_analyzer.analysis import WaterfallSet, compare, check_claim

    ws = WaterfallSet.load("run.jsonl")
    ws.percentiles("ttft")["p95"]            # Estimate(value, low, high, n, confidence)
    print(ws.summary().to_text())
    print(check_claim(base, cand, claimed=15.0, metric="ttft_p95"))
    print(reproduce([day1, day2, day3], within=0.05).verdict_line())

Diagnosis (findings, what-ifs) is the subpackage ``latency_analyzer.analysis.diagnose``,
imported on first use.
"""

from ._columns import Tags
from ._compare import ClaimCheck, Comparison, Speedup, check_claim, compare, gpu_cost
from ._fingerprint import base_rtt, fingerprint
from ._money import MoneyCase, money_case, monthly_saving
from ._reproduce import Reproduction, Spread, parse_tolerance, reproduce
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
    "MoneyCase",
    "Reproduction",
    "Row",
    "Speedup",
    "Spread",
    "Summary",
    "Tags",
    "WaterfallSet",
    "base_rtt",
    "check_claim",
    "compare",
    "fingerprint",
    "gpu_cost",
    "mean_ci",
    "money_case",
    "monthly_saving",
    "parse_tolerance",
    "percentile",
    "percentile_ci",
    "percentiles_ci",
    "reproduce",
]
