"""Trace replay: a request log sent again at its own inter-arrival times, scaled by a speed.

The intended starts are the trace's instants / speed exactly, at speed 1 and 4, and every
request's lateness is on its waterfall: the kernel's stamp of its first bytes crossing lo (a
packet capture) is never before the intended start plus its schedule_lag, nor before the
send the client recorded. How close to the file the bytes leave on a given host is the
benchmark's figure (``benchmarks/bench_load.py``), not a bound here: a busy host delays the
client's own work before each send. Each row's prompt (or its length) and output length
reach the server.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from latency_analyzer.analysis import WaterfallSet
from latency_analyzer.cli import main as cli_main
from latency_analyzer.errors import UsageError
from latency_analyzer.load import Scenario
from latency_analyzer.load._trace import load_trace
from latency_analyzer.testing import LLMServer
from latency_analyzer.testing.pcap import PacketCapture, require_tcpdump
from latency_analyzer.timeline import process_anchor

CHAT = "/v1/chat/completions"


def _trace(path: Path, n: int = 40, seed: int = 5) -> list[dict[str, Any]]:
    """n rows, gaps of 20-80 ms, epoch-second timestamps; every row a distinct output length
    (so the server's record says which row it served); odd rows carry text, even a length."""
    rng = random.Random(seed)
    t = 1_764_000_000.0
    rows = []
    for i in range(n):
        row: dict[str, Any] = {"timestamp": round(t, 6), "output_tokens": i + 1}
        if i % 2:
            row["prompt"] = f"trace row {i} " + "x " * i
        else:
            row["input_tokens"] = 3 + i
        rows.append(row)
        t += rng.uniform(0.020, 0.080)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


#: The replaying client in its own process at real-time priority (as the test bed's servers
#: are, where the OS allows it): the schedule under test, not other processes' load, then
#: decides when each request leaves.
_CLIENT = """
import sys
from latency_analyzer.testing._priority import realtime
realtime()
from latency_analyzer.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("speed", [1.0, 4.0])
def test_a_trace_replays_at_its_own_gaps_times_speed(tmp_path: Path, speed: float) -> None:
    require_tcpdump()
    rows = _trace(tmp_path / "trace.jsonl")
    stamps = np.array([r["timestamp"] for r in rows])
    want = np.diff(stamps) / speed * 1e9  # ns between consecutive arrivals
    out = tmp_path / "run.jsonl"
    with LLMServer(tokens=1, record_requests=True).run_in_subprocess() as s:
        with PacketCapture(port=s.port) as cap:
            argv = ["run", "--url", s.url + CHAT, "--trace", str(tmp_path / "trace.jsonl")]
            argv += ["--speed", str(speed), "--out", str(out), "--json"]
            proc = subprocess.run(
                [sys.executable, "-c", _CLIENT, *argv], capture_output=True, text=True, timeout=60
            )
        records = s.records
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["run"]["issued"] == len(records) == len(rows)
    ws = WaterfallSet.load(out)
    intended = np.sort(ws.column("start_ns"))
    # the schedule is the trace: exact but for rounding to the ns
    assert np.max(np.abs(np.diff(intended) - want)) <= 2
    # a late send is never hidden: its lateness is measured, from the intended start on, and
    # the kernel saw the request's first bytes no earlier than the client says it sent them
    # (its stamp just before the send call), which is no earlier than schedule_lag ends
    rows_out = [json.loads(x) for x in out.read_text().splitlines()[1:]]
    wfs = [r["wf"] for r in rows_out if r.get("kind") == "wf"]
    spans = [{c["name"]: c for c in wf["root"]["children"]} for wf in wfs]
    lag = ws.column("stage:schedule_lag")
    assert (lag >= 0).all()
    send = np.sort([sp["send"]["start_ns"] for sp in spans])
    anchor = process_anchor()
    wire = np.sort(
        [
            anchor.to_perf_ns(p.time_ns)
            for flow in cap.flows()
            for p in flow.segments("out")
            if p.payload.startswith(b"POST ")
        ]
    )
    assert len(wire) == len(rows)
    # sorted, each of these dominates the one before rank by rank (as it does request by
    # request); the capture's stamps map onto this clock to the anchor's bracket
    assert (np.sort(ws.column("start_ns") + lag) <= send).all()
    assert (send <= wire + anchor.uncertainty_ns).all()
    # every row went out once, with its own prompt (or length) and output length
    by_output = {r.output_tokens: r for r in records}
    assert sorted(by_output) == [row["output_tokens"] for row in rows]
    for row in rows:
        rec = by_output[row["output_tokens"]]
        content = (rec.body or {})["messages"][0]["content"]
        if "prompt" in row:
            assert content == row["prompt"]
        else:
            assert rec.prompt_tokens == row["input_tokens"]
    tags = [json.loads(x)["tags"] for x in out.read_text().splitlines()[1:] if '"wf"' in x]
    assert sorted(int(t["sample"]) for t in tags) == list(range(1, len(rows) + 1))


def test_a_csv_trace_in_ms_from_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text("ms,n,out\n0,5,1\n20,6,2\n30,7,3\n")
    toml = tmp_path / "s.toml"
    toml.write_text(
        'mode = "open"\n'
        'trace = {path = "t.csv", time_unit = "ms", timestamp = "ms", input_tokens = "n", '
        'output_tokens = "out"}\n'
    )
    with LLMServer(tokens=1, record_requests=True).run_in_subprocess() as s:
        argv = ["run", str(toml), "--url", s.url + CHAT, "--speed", "2", "--out", "o.jsonl"]
        assert cli_main([*argv, "--workers", "1"]) == 0
        records = sorted(s.records, key=lambda r: r.received_ns)
    assert [r.prompt_tokens for r in records] == [5, 6, 7]
    assert [r.output_tokens for r in records] == [1, 2, 3]
    starts = np.sort(WaterfallSet.load(tmp_path / "o.jsonl").column("start_ns"))
    assert np.allclose(np.diff(starts), [10e6, 5e6], atol=2)  # 20 ms and 10 ms at speed 2
    # --trace on the command line picks the open loop itself
    with LLMServer(tokens=1).run_in_subprocess() as s:
        argv = ["run", "--url", s.url + CHAT, "--trace", "t.csv", "--out", "p.jsonl"]
        assert cli_main(argv) == 2  # the csv's columns are not the default names
        assert cli_main([*argv, "--rate", "5"]) == 2


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"mode": "closed"}, "open loop"),
        ({"rate": 5.0}, "'rate'"),
        ({"ramp_up": 1.0}, "'ramp_up'"),
        ({"arrival": "constant"}, "'arrival'"),
    ],
)
def test_what_cannot_apply_to_a_trace_is_an_error(extra: dict[str, Any], match: str) -> None:
    with pytest.raises(UsageError, match=match):
        Scenario("http://x/", **{"mode": "open", "trace": {"path": "t.jsonl"}, **extra})


@pytest.mark.parametrize(
    ("text", "spec", "match"),
    [
        ('{"timestamp": 2}\n{"timestamp": 1, "prompt": "a"}\n', {}, "neither"),
        ('{"timestamp": 2, "prompt": "a"}\n{"timestamp": 1, "prompt": "a"}\n', {}, "back in"),
        ('{"prompt": "a"}\n', {}, "'timestamp' missing"),
        ('{"timestamp": 1, "input_tokens": 0.5}\n', {}, "whole number"),
        ('{"timestamp": 1, "prompt": "a"}\n', {"speed": 0}, "'speed'"),
        ('{"timestamp": 1, "prompt": "a"}\n', {"bogus": 1}, "'bogus'"),
    ],
)
def test_bad_traces_name_the_row_and_key(
    tmp_path: Path, text: str, spec: dict[str, Any], match: str
) -> None:
    (tmp_path / "t.jsonl").write_text(text)
    with pytest.raises(UsageError, match=match):
        load_trace({"path": str(tmp_path / "t.jsonl"), **spec})
