"""Probe one streamed request against the loopback test bed; print, diagnose, plot, export.

    python examples/probe_one.py [--out DIR]

Starts an OpenAI-compatible SSE server on 127.0.0.1 with known delays (5 ms to headers,
10 ms queue + 40 ms prefill, 24 tokens x 8 ms), probes it once, and writes ``waterfall.png``,
``request.har`` (Chrome DevTools -> Network -> import) and ``trace.json`` (ui.perfetto.dev).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import latency_analyzer as la
from latency_analyzer import report
from latency_analyzer.analysis.diagnose import diagnose, format_findings
from latency_analyzer.testing import LLMServer

BODY = {"model": "m", "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="la-probe-")))
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    server = LLMServer(header_delay=0.005, queue=0.010, prefill=0.040, decode=0.008, tokens=24)
    with server.run_in_thread() as llm:
        wf = la.probe(llm.url + "/v1/chat/completions", json=BODY)
    print(report.render_waterfall(wf))
    print(format_findings(diagnose(wf)))
    ax = report.plot_waterfall(wf)
    ax.figure.savefig(out / "waterfall.png", dpi=120)
    report.write_har([wf], out / "request.har")
    report.write_chrome_trace([wf], out / "trace.json")
    print(f"wrote waterfall.png, request.har, trace.json to {out}")


if __name__ == "__main__":
    main()
