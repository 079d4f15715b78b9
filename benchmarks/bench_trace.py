"""Trace replay fidelity (``python benchmarks/bench_trace.py [--out FILE] [--repeats N]``).

A 40-row trace (gaps 20-80 ms, the one ``tests/test_load_trace.py`` replays) is sent by
``latency-analyzer run --trace`` in a child process at real-time priority where the OS allows
it, against the test bed (its own process, also real-time), at speed 1 and 4. Per run: the
median over gaps of |actual gap - file gap / speed|, for the client's issues (intended start +
schedule_lag), for its sends (the stamp just before each send call, which a packet capture
finds within a fraction of a millisecond of the wire: the client's own work between the
schedule's instant and the send is in it) and for the arrivals the server logged; and the
schedule's largest deviation (intended starts, which should be exact). Target: medians under
1 ms.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_load_trace import _CLIENT, _trace

from latency_analyzer.analysis import WaterfallSet
from latency_analyzer.testing import LLMServer


def _one(trace: Path, stamps: Any, speed: float, out: Path) -> dict[str, float]:
    want = np.diff(stamps) / speed * 1e9
    with LLMServer(tokens=1).run_in_subprocess() as s:
        argv = ["run", "--url", s.url + "/v1/chat/completions", "--trace", str(trace)]
        argv += ["--speed", str(speed), "--out", str(out)]
        subprocess.run([sys.executable, "-c", _CLIENT, *argv], capture_output=True, check=True)
        received = np.sort([r.received_ns for r in s.records])
    ws = WaterfallSet.load(out)
    sends = np.sort(
        [
            next(c["start_ns"] for c in row["wf"]["root"]["children"] if c["name"] == "send")
            for row in map(json.loads, out.read_text().splitlines())
            if row.get("kind") == "wf"
        ]
    )
    intended = np.sort(ws.column("start_ns"))
    actual = np.sort(ws.column("start_ns") + ws.column("stage:schedule_lag"))
    return {
        "speed": speed,
        "client_gap_error_median_us": float(np.median(np.abs(np.diff(actual) - want))) / 1e3,
        "send_gap_error_median_us": float(np.median(np.abs(np.diff(sends) - want))) / 1e3,
        "server_gap_error_median_us": float(np.median(np.abs(np.diff(received) - want))) / 1e3,
        "schedule_error_max_ns": float(np.max(np.abs(np.diff(intended) - want))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.jsonl"
        stamps = np.array([r["timestamp"] for r in _trace(trace)])
        runs = [
            _one(trace, stamps, speed, Path(tmp) / f"run{speed}-{i}.jsonl")
            for speed in (1.0, 4.0)
            for i in range(args.repeats)
        ]
    text = json.dumps({"trace_replay": runs}, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
