"""Acceptance: py-spy on a live server whose stages burn known CPU in named functions.

The busy server (``latency_analyzer.testing.busy_server``, its own process) spends 20 ms idle
in ``await asyncio.sleep`` (``server_queue``), 30 ms in ``tokenize`` (``preprocess``), 60 ms in
``prefill`` and 20 × 4 ms in ``decode_step`` (``decode``), and reports each request's stage
windows on ``perf_counter_ns`` (CLOCK_MONOTONIC, shared by processes). Those windows become
server spans inside the client's waterfall exactly as ``merge.place`` puts them. At 200 Hz,
summed over the profiled requests, each stage's top self-time frame must be its function
with ≥ 80% of the stage's sampled time, and the queue must be ≥ 80% idle. The client leaves
40 ms between requests, so the server idles before each arrival as it would between real
ones; the server's clock marker runs once per request, after the response.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import assert_exact

from latency_analyzer import Client, Span, Waterfall
from latency_analyzer.merge import place
from latency_analyzer.profile import (
    PROFILED,
    ProfileAnchor,
    Profiler,
    ProfileResult,
    StageProfile,
    attach,
    attribute,
    refine_anchor,
)

RATE = 200
SERVED = ("server_queue", "preprocess", "prefill", "decode")
EXPECTED = {"preprocess": "tokenize", "prefill": "prefill", "decode": "decode_step"}
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
SERVER = [sys.executable, "-m", "latency_analyzer.testing.busy_server"]


def _wait_for(port_file: Path, timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_file.exists():
            return dict(json.loads(port_file.read_text()))
        time.sleep(0.02)
    raise TimeoutError("busy server did not start")


@pytest.fixture
def busy(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    port_file = tmp_path / "port.json"
    extra = getattr(request, "param", [])
    proc = subprocess.Popen([*SERVER, "--port-file", str(port_file), *extra])
    try:
        yield _wait_for(port_file)
    finally:
        proc.terminate()
        proc.wait(10)


GAP = 0.04  # s between requests: the server idles before each arrival, as between real ones


async def _run(port: int, n: int) -> tuple[list[Waterfall], list[dict[str, Any]]]:
    url = f"http://127.0.0.1:{port}"
    wfs = []
    async with Client(url) as client:
        for _ in range(n):
            wfs.append(await client.request("/v1/chat/completions", json=BODY))
            await asyncio.sleep(GAP)
    async with aiohttp.ClientSession() as session, session.get(f"{url}/stages") as resp:
        records = await resp.json()
    return wfs, records[-n:]


def _with_server(wf: Waterfall, record: dict[str, Any]) -> Waterfall:
    spans = [
        Span(name, start, end, "server")
        for name, (start, end) in record["stages"].items()
        if name in SERVED
    ]
    root, unplaced = place(wf.root, spans)
    assert unplaced == 0  # the server's windows lie inside the client's request
    return dataclasses.replace(wf, root=root)


def _by_server_stage(profiles: Sequence[dict[str, StageProfile]]) -> dict[str, dict[str, Any]]:
    """Sum over requests (and over split pieces) per server stage name."""
    out: dict[str, dict[str, Any]] = {}
    for per_request in profiles:
        for path, prof in per_request.items():
            if "/" not in path:
                continue  # a client stage
            acc = out.setdefault(prof.name, {"thread": 0, "idle": 0, "self": {}, "samples": 0})
            acc["thread"] += prof.thread_ns
            acc["idle"] += prof.idle_ns
            acc["samples"] += prof.samples
            for frame, ns in prof.self_ns.items():
                acc["self"][frame.name] = acc["self"].get(frame.name, 0) + ns
    return out


def _sampler_realtime(prof: Profiler) -> None:
    """py-spy's threads at real-time priority, like the busy server (we run as root here and
    in CI): on a busy host an ordinary process is woken milliseconds after its timer, which
    would make every stage edge py-spy sees late by that much more. What the bar measures is
    the sampling itself (random intervals, stack changes only), not the host's load."""
    assert prof._proc is not None  # the py-spy child the Profiler started
    for tid in os.listdir(f"/proc/{prof._proc.pid}/task"):
        with contextlib.suppress(OSError):  # refused (not root): it samples at normal priority
            os.sched_setscheduler(int(tid), os.SCHED_RR, os.sched_param(1))


def _profiled_run(
    busy: dict[str, Any], n: int, **kwargs: Any
) -> tuple[ProfileResult, list[Waterfall], list[dict[str, Any]]]:
    asyncio.run(_run(busy["port"], 1))  # warm: imports and the first connection
    with Profiler(busy["pid"], rate=RATE, **kwargs) as prof:
        _sampler_realtime(prof)
        wfs, records = asyncio.run(_run(busy["port"], n))
    return prof.result, [_with_server(w, r) for w, r in zip(wfs, records, strict=True)], records


def _marker_anchor(result: ProfileResult, records: list[dict[str, Any]]) -> ProfileAnchor:
    assert result.anchor is not None and result.trace is not None
    windows = [tuple(m) for r in records for m in r["markers"]]
    return refine_anchor(result.anchor, result.trace, "mark_clock", windows, result.rate)


def _share(acc: dict[str, Any], function: str | None) -> float:
    """``function``'s self share of the stage (None: the idle share)."""
    part = acc["idle"] if function is None else acc["self"].get(function, 0)
    return float(part / acc["thread"]) if acc["thread"] else 0.0


def _assert_stages(profiles: Sequence[dict[str, StageProfile]], anchor: ProfileAnchor) -> None:
    """Over all requests, the top self-time frame of each stage is the stage's own function."""
    totals = _by_server_stage(profiles)
    for stage, function in EXPECTED.items():
        top = max(totals[stage]["self"].items(), key=lambda kv: kv[1])[0]
        assert top == function, (stage, totals[stage]["self"])
    assert anchor.hi_ns >= anchor.lo_ns  # a bracket, not a point: its width is reported


def _assert_shares(profiles: Sequence[dict[str, StageProfile]]) -> None:
    """Issue 5's bar at 200 Hz: each stage's function holds >= 80 % of the stage's sampled
    time, summed over the requests, and the queue is >= 80 % idle.

    The Profiler samples without pausing the target (its default): in py-spy's blocking
    mode, 14 runs gave tokenize 0.79-0.88, because idle→CPU transitions (the queue's end) were
    seen 2.6-3.4 ms late at the median (2 runs) where non-blocking saw them -0.1..+1.5 ms.

    What limits it is py-spy's sampling itself: it samples at random (exponential) intervals
    of mean 1/rate and its chrometrace records only stack changes, so each stage edge is seen
    a random Exp(5 ms) late. After the marker anchor takes off the median lateness, an edge is
    off by 0.69 periods on average (3.5 ms): 88 % expected for the 30 ms tokenize. Measured
    over 60 requests (9 non-blocking runs, 2 shared cores): tokenize 0.856-0.891, prefill
    0.92-0.95, decode 0.92-0.95, queue idle 0.91-0.96. Over 20 requests the spread is twice
    as wide, hence 60.
    """
    totals = _by_server_stage(profiles)
    shares = {stage: _share(totals[stage], function) for stage, function in EXPECTED.items()}
    shares["server_queue (idle)"] = _share(totals["server_queue"], None)
    print("\nshares at", RATE, "Hz:", {k: round(v, 3) for k, v in shares.items()})
    assert all(v >= 0.80 for v in shares.values()), shares


def test_attach_mode_attributes_every_stage_to_its_function(busy: dict[str, Any]) -> None:
    n = 60
    result, wfs, records = _profiled_run(busy, n)
    assert result.status == PROFILED, result.note
    marker = _marker_anchor(result, records)
    spawn = result.anchor
    # a 15 ms marker at 200 Hz: py-spy misses a call now and then (e^-3 of them), or sees
    # one only after a stall, so not every call counts
    assert spawn is not None and marker.method == "marker" and marker.markers >= n // 2
    # The marker zero includes py-spy's typical stamping delay, so it lies before the spawn
    # bracket by that delay (measured 2-8 ms here) and never after it.
    assert spawn.lo_ns - 20_000_000 <= marker.perf_ns <= spawn.hi_ns
    profiles = [attribute(wf, result, anchor=marker) for wf in wfs]
    # One server thread: the evidence is the windows' length at 200 Hz (±10%, rounding).
    samples = sum(t["samples"] for t in _by_server_stage(profiles).values())
    windows = sum(e - s for r in records for k, (s, e) in r["stages"].items() if k in SERVED)
    assert 0.9 * windows * RATE / 1e9 <= samples <= 1.1 * windows * RATE / 1e9 + n * 4

    profiled = attach(wfs[0], result, anchor=marker)
    assert_exact(profiled)
    assert profiled.attribution_ns() == wfs[0].attribution_ns()
    prefill = profiled.root.find("prefill", "server")
    assert prefill is not None and "profile.top_self" in prefill.attributes
    assert profiled.attributes["profile.anchor_method"] == "marker"
    assert result.sampler_cpu_share is not None and 0 < result.sampler_cpu_share < 1
    _assert_stages(profiles, marker)
    _assert_shares(profiles)


def test_launch_mode_profiles_the_command_it_starts(tmp_path: Path) -> None:
    port_file = tmp_path / "port.json"
    command = [*SERVER, "--port-file", str(port_file)]
    with Profiler(command=command, rate=RATE) as prof:
        _sampler_realtime(prof)
        info = _wait_for(port_file)
        assert prof.target_pid == info["pid"]
        asyncio.run(_run(info["port"], 1))
        wfs, records = asyncio.run(_run(info["port"], 3))
    result = prof.result
    assert result.status == PROFILED, result.note
    marker = _marker_anchor(result, records)
    merged = [_with_server(w, r) for w, r in zip(wfs, records, strict=True)]
    _assert_stages([attribute(wf, result, anchor=marker) for wf in merged], marker)


@pytest.mark.parametrize("busy", [["--engine", "process"]], indirect=True)
def test_subprocesses_attribute_the_engine_process_samples(busy: dict[str, Any]) -> None:
    # 8 requests, about 100 samples in their prefill windows: with 3 (36 samples), one window
    # whose edge py-spy saw late weighed enough to put the share at 0.77 in one CI run
    result, wfs, records = _profiled_run(busy, 8, subprocesses=True)
    assert result.status == PROFILED, result.note
    assert result.trace is not None and busy["engine_pid"] in result.trace.pids
    marker = _marker_anchor(result, records)
    engine_only = [attribute(wf, result, pids={busy["engine_pid"]}, anchor=marker) for wf in wfs]
    totals = _by_server_stage(engine_only)
    top, ns = max(totals["prefill"]["self"].items(), key=lambda kv: kv[1])
    assert top == "prefill" and ns / totals["prefill"]["thread"] >= 0.80, totals["prefill"]
    # Server's own thread meanwhile waits on the pipe in the selector: idle, not prefill.
    server_only = _by_server_stage(
        [attribute(wf, result, pids={busy["pid"]}, anchor=marker) for wf in wfs]
    )
    assert server_only["prefill"]["idle"] / server_only["prefill"]["thread"] >= 0.80
