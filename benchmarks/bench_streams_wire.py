"""Many paced streams over local workers, every token stamp held to a packet capture.

``latency-analyzer run``'s engine (``run_workers``: N processes, kernel receive stamps) drives
``--streams`` concurrent streamed chats of ``--tokens`` tokens each, ``--decode`` seconds apart,
against one test-bed server; tcpdump on ``lo`` records the same run. Each request's
``traceparent`` header carries the trace id its waterfall keeps, so its TCP flow in the capture
is found by its own bytes. For every token the capture's arrival of the SSE event's last
byte is the truth; the report gives P50/P99/max of |stamp − capture| over all tokens and over
the tokens whose read did not also carry later bytes, the count of tokens flagged as sharing a
read, and the run's own health (loop lag, read lag, CPU) as the run reported it.

    python benchmarks/bench_streams_wire.py --out bench-results/streams_wire.json \
        [--streams 1000] [--tokens 256] [--decode 0.1] [--workers 2] [--quick]

Needs root for tcpdump; without it the JSON says why and stops.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import latency_analyzer as la
from latency_analyzer.load import Scenario
from latency_analyzer.load.distributed import run_workers
from latency_analyzer.testing import LLMServer
from latency_analyzer.testing.pcap import Flow, PacketCapture, tcpdump_missing
from latency_analyzer.timeline import ClockAnchor

_TRACE = re.compile(rb"traceparent: 00-([0-9a-f]{32})-", re.IGNORECASE)


def _pct(ordered: list[int], q: float) -> float | None:
    return ordered[int(q * (len(ordered) - 1))] / 1e3 if ordered else None


def _compare(rows: list[dict[str, Any]], flows: dict[str, Flow]) -> dict[str, Any]:
    errors: list[int] = []
    clean: list[int] = []
    flagged = unmatched = incomplete = 0
    for row in rows:
        wf = row["wf"]
        flow = flows.get(wf["attributes"].get("trace_id", ""))
        if flow is None or not wf.get("chunk_times_ns"):
            unmatched += 1
            continue
        anchor = ClockAnchor(**wf["anchor"])
        truth = [anchor.to_perf_ns(e) for e in flow.content_event_ns()]
        if len(truth) != len(wf["chunk_times_ns"]):  # the capture missed some of its packets
            incomplete += 1
            continue
        shared = set(wf.get("shared_read_chunks") or ())
        for k, (ours, t) in enumerate(zip(wf["chunk_times_ns"], truth, strict=True)):
            errors.append(abs(ours - t))
            if k not in shared:
                clean.append(abs(ours - t))
        flagged += len(shared)
    errors.sort()
    clean.sort()
    return {
        "tokens": len(errors),
        "requests_unmatched": unmatched,
        "requests_capture_incomplete": incomplete,
        "abs_error_p50_us": _pct(errors, 0.5),
        "abs_error_p99_us": _pct(errors, 0.99),
        "abs_error_max_us": errors[-1] / 1e3 if errors else None,
        "tokens_flagged_shared_read": flagged,
        "unflagged_abs_error_p99_us": _pct(clean, 0.99),
        "within_1ms_p99": (_pct(errors, 0.99) or 1e9) <= 1000.0,
    }


async def measure(streams: int, tokens: int, decode: float, workers: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.jsonl"
        server = LLMServer(prefill=0.040, decode=decode, tokens=tokens)
        # a small snap length: the ring then holds more of a run's ~2 packets per token
        with server.run_in_subprocess() as llm, PacketCapture(llm.port, snaplen=1024) as cap:
            sc = Scenario.from_dict(
                {
                    "url": llm.url + "/v1/chat/completions",
                    "mode": "closed",
                    "concurrency": streams,
                    "requests": streams,
                    "timeout": 2 * (0.040 + tokens * decode) + 30,  # a stream's whole length
                }
            )
            started = time.perf_counter()
            result = await run_workers(sc, workers=workers, path=out)
            wall = time.perf_counter() - started
        rows = [row for row in map(json.loads, out.read_text().splitlines()) if row["kind"] == "wf"]
    flows = {}
    for flow in cap.flows():
        found = _TRACE.search(flow.data("out"))
        if found:
            flows[found.group(1).decode().lower()] = flow
    summary = result.summary().to_dict()
    return {
        "streams": streams,
        "tokens_per_stream": tokens,
        "decode_s": decode,
        "workers": workers,
        "wall_s": round(wall, 2),
        "requests": len(rows),
        "errors": result.set.counts()["errors"],
        "error_types": sorted(set(result.set.labels("error_type")) - {None, ""}),
        "capture_dropped": cap.dropped,
        "vs_capture": _compare(rows, flows),
        "client": result.client.to_dict(),
        "notes": result.notes,
        "read_lag": {k: v for k, v in summary.items() if "read_lag" in k},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="bench-results/streams_wire.json")
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--decode", type=float, default=0.1, help="seconds between tokens")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--quick", action="store_true", help="100 streams of 16 tokens")
    args = parser.parse_args()
    if args.quick:
        args.streams, args.tokens = 100, 16
    report: dict[str, Any] = {
        "schema": 1,
        "library_version": la.__version__,
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    missing = tcpdump_missing()
    if missing is not None:
        report["skipped"] = missing
    else:
        report["run"] = asyncio.run(measure(args.streams, args.tokens, args.decode, args.workers))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report.get("run", report), indent=2))


if __name__ == "__main__":
    main()
