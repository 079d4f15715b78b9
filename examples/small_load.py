"""A small closed-loop load run against the test bed: summary table, diagnosis, set plot.

    python examples/small_load.py [--out DIR]

4 users, 40 requests, a server with 2 batch slots (so requests queue): the summary shows the
percentiles with confidence intervals (the queueing lands in ``wait``: without server spans
the client cannot tell queue from network, so the diagnosis names no server cause), and
``set.png`` shows attribution by percentile, latency over time and the TTFT/TPOT
distributions.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from rich.console import Console

from latency_analyzer import report
from latency_analyzer.analysis.diagnose import diagnose, format_findings
from latency_analyzer.load import Scenario, run_sync
from latency_analyzer.testing import LLMServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="la-load-")))
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    server = LLMServer(prefill=0.010, decode=0.002, tokens=16, slots=2)
    with server.run_in_thread() as llm:
        sc = Scenario(llm.url + "/v1/chat/completions", mode="closed", concurrency=4,
                      requests=40, warmup_requests=4)  # fmt: skip
        result = run_sync(sc, path=out / "run.jsonl")
    Console().print(report.set_table(result.set))
    print(format_findings(diagnose(result.set)))
    report.plot_set(result.set).savefig(out / "set.png", dpi=100)
    print(f"wrote run.jsonl and set.png to {out}")


if __name__ == "__main__":
    main()
