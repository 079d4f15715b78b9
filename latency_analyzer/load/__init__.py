"""Load generation: closed and open loops, request mixes, field scenarios, fault injection.

::

    from latency_analyzer.load import Scenario, Template, run_sync

    sc = Scenario(url, mode="open", rate=20, arrival="poisson", duration=60,
                  warmup_seconds=10)
    result = run_sync(sc, path="run.jsonl")     # streamed to disk as it goes
    print(result.summary().to_text())           # P50…P99.9 with CIs; saturation notes
"""

from ._api import run, run_sync
from ._dists import ARRIVALS, Dist, arrival_gaps, dist, synthetic_prompt
from ._faults import FaultProxy, OutageReport, outage_report
from ._files import load_scenario
from ._knee import LoadPoint, knee
from ._monitor import ClientHealth, Pacer
from ._presets import (
    PRESETS,
    FaultResult,
    Restartable,
    cold_start_storm,
    fault_injection,
    length_buckets,
    long_tail,
    mixed_load,
    run_fault_injection,
)
from ._runner import Hook, RunResult, sweep
from ._scenario import Scenario, Template
from ._search import SearchResult, search, sweep_points
from ._slo import parse_slos

__all__ = [
    "ARRIVALS",
    "PRESETS",
    "ClientHealth",
    "Dist",
    "FaultProxy",
    "FaultResult",
    "Hook",
    "LoadPoint",
    "OutageReport",
    "Pacer",
    "Restartable",
    "RunResult",
    "Scenario",
    "SearchResult",
    "Template",
    "arrival_gaps",
    "cold_start_storm",
    "dist",
    "fault_injection",
    "knee",
    "length_buckets",
    "load_scenario",
    "long_tail",
    "mixed_load",
    "outage_report",
    "parse_slos",
    "run",
    "run_fault_injection",
    "run_sync",
    "search",
    "sweep",
    "sweep_points",
    "synthetic_prompt",
]
