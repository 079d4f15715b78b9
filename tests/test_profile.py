"""Profiles without a live target: the chrometrace reader, anchoring, attribution, exports,
and every way a profiling run can fail (each must leave the waterfall complete, with a note)."""

from __future__ import annotations

import json
import math
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import assert_exact

from latency_analyzer import Recorder, Span, UsageError, Waterfall
from latency_analyzer.profile import (
    PROFILED,
    REFUSED,
    UNAVAILABLE,
    Frame,
    ProfileAnchor,
    Profiler,
    ProfileResult,
    attach,
    attribute,
    collapsed,
    export_stages,
    find_py_spy,
    is_idle,
    read_chrometrace,
    refine_anchor,
    speedscope,
)

MS = 1_000_000
FILE = "/srv/app.py"


def _ev(ph: str, name: str, ts: int, filename: str = FILE, tid: int = 7, pid: int = 1) -> dict:
    return {"args": {"filename": filename, "line": 3}, "cat": "py-spy", "name": name, "ph": ph,
            "pid": pid, "tid": tid, "ts": ts}  # fmt: skip


def _trace_events() -> list[dict]:
    """One thread: main→work for 0..10 ms, main→EpollSelector.select 10..30 ms, main→work
    30..40 ms (µs timestamps), under py-spy's synthetic thread frame."""
    return [
        _ev("B", "thread (7): MainThread", 0, ""),
        _ev("B", "main", 0),
        _ev("B", "work", 0),
        _ev("E", "work", 10_000),
        _ev("B", "EpollSelector.select", 10_000, "/usr/lib/python3.11/selectors.py"),
        _ev("E", "EpollSelector.select", 30_000, "/usr/lib/python3.11/selectors.py"),
        _ev("B", "work", 30_000),
        _ev("E", "work", 40_000),
        _ev("E", "main", 40_000),
        _ev("E", "thread (7): MainThread", 40_000, ""),
    ]


def _result(events: list[dict], zero_ns: int, rate: int = 100) -> ProfileResult:
    anchor = ProfileAnchor(perf_ns=zero_ns, lo_ns=zero_ns, hi_ns=zero_ns)
    return ProfileResult(PROFILED, trace=read_chrometrace(events), anchor=anchor, rate=rate)


def _waterfall(stages: list[tuple[str, int, int]], server: list[Span] = ()) -> Waterfall:
    root = Span("request", stages[0][1], stages[-1][2])
    kids = [Span(name, s, e) for name, s, e in stages]
    kids = [
        Span(k.name, k.start_ns, k.end_ns, children=tuple(
            x for x in server if k.start_ns <= x.start_ns and x.end_ns <= k.end_ns))
        for k in kids
    ]  # fmt: skip
    return Waterfall(root=Span(root.name, root.start_ns, root.end_ns, children=tuple(kids)),
                     method="POST", url="http://x/")  # fmt: skip


# --- the reader -----------------------------------------------------------------------------


def test_reader_replays_stack_changes_into_segments() -> None:
    trace = read_chrometrace(_trace_events())
    got = [(s.start_us, s.end_us, tuple(f.name for f in s.stack), s.idle) for s in trace.segments]
    assert got == [
        (0, 10_000, ("main", "work"), False),
        (10_000, 30_000, ("main", "EpollSelector.select"), True),
        (30_000, 40_000, ("main", "work"), False),
    ]
    assert trace.thread_names == {(1, 7): "MainThread"}
    assert (trace.start_us, trace.end_us) == (0, 40_000)
    assert trace.frame_windows("work") == [(0, 10_000), (30_000, 40_000)]


def test_reader_accepts_metadata_events_process_frames_and_bytes() -> None:
    events = [
        {"args": {"filename": "", "name": "7: Worker"}, "cat": "py-spy", "name": "thread_name",
         "ph": "M", "pid": 2, "tid": 0, "ts": 0},
        _ev("B", 'process 2:"python x.py"', 5, "", tid=0, pid=2),
        _ev("B", "run", 5, tid=0, pid=2),
        _ev("E", "run", 9, tid=0, pid=2),
        _ev("E", 'process 2:"python x.py"', 9, "", tid=0, pid=2),
    ]  # fmt: skip
    trace = read_chrometrace(json.dumps(events).encode())
    assert [(s.pid, s.start_us, s.end_us, s.stack) for s in trace.segments] == [
        (2, 5, 9, (Frame("run", FILE),))
    ]
    assert trace.thread_names[(2, 0)] == "Worker"
    assert trace.pids == (2,)


def test_idle_heuristic_matches_qualified_leaf_names_only_at_the_leaf() -> None:
    select = Frame("EpollSelector.select", "/x/selectors.py")
    wait = Frame("Condition.wait", "/x/threading.py")
    assert is_idle((Frame("main", FILE), select))
    assert is_idle((wait,))
    assert is_idle(())  # no Python frame at all
    assert not is_idle((select, Frame("work", FILE)))
    assert not is_idle((Frame("select", "/x/mymodule.py"),))


# --- attribution ----------------------------------------------------------------------------


def test_attribution_charges_overlap_with_half_period_centring() -> None:
    # rate 100 Hz: each sample stands for ±5 ms around it, so py-spy time t maps to
    # zero + t - 5 ms. Segments land at [-5, 5), [5, 25), [25, 35) ms after zero.
    zero = 1_000 * MS
    result = _result(_trace_events(), zero)
    wf = _waterfall([("wait", zero, zero + 15 * MS), ("decode", zero + 15 * MS, zero + 35 * MS)])
    got = attribute(wf, result)
    wait, decode = got["wait"], got["decode"]
    assert (wait.thread_ns, wait.idle_ns) == (15 * MS, 10 * MS)  # 5 ms work + 10 ms select
    assert wait.samples == 2  # 15 ms at 100 Hz, rounded
    assert [(t.label, t.ns) for t in wait.top_self(2)] == [
        ("EpollSelector.select (selectors.py)", 10 * MS),
        ("work (app.py)", 5 * MS),
    ]
    assert wait.top_self(1, cpu_only=True)[0].share == 1.0
    assert (decode.thread_ns, decode.idle_ns) == (20 * MS, 10 * MS)
    assert decode.idle_share == 0.5
    assert decode.top_inclusive(1)[0].frame == Frame("main", FILE)  # on every stack
    assert decode.inclusive_ns[Frame("work", FILE)] == 10 * MS


def test_attach_adds_attributes_and_leaves_attribution_exact() -> None:
    zero = 1_000 * MS
    server = [Span("prefill", zero + 26 * MS, zero + 34 * MS, "server")]
    wf = _waterfall(
        [("wait", zero, zero + 15 * MS), ("first_token", zero + 15 * MS, zero + 35 * MS)], server
    )
    profiled = attach(wf, _result(_trace_events(), zero))
    assert profiled.attribution_ns() == wf.attribution_ns()
    assert_exact(profiled)
    prefill = profiled.root.find("prefill", "server")
    assert prefill is not None
    assert prefill.attributes["profile.top_self"] == "work (app.py)"
    assert prefill.attributes["profile.top_self_share"] == 1.0
    assert prefill.attributes["profile.samples"] == 1
    assert "raise the rate to ≥ 625 Hz" in str(prefill.attributes["profile.note"])
    assert profiled.attributes["profile.status"] == PROFILED
    assert "first_token/prefill" in str(profiled.attributes["profile.note"])
    assert Waterfall.from_dict(profiled.to_dict()) == profiled


def test_refine_anchor_puts_the_median_marker_edge_where_it_happened() -> None:
    # Truth: py-spy's zero is at 1000 ms; the first marker's edges are stamped 0.3 ms late,
    # the second's 4 ms late. Each edge says: zero = window edge - stamp (+ 5 ms, half a
    # period at 100 Hz, which the attribution's centring takes off again).
    events = [
        _ev("B", "mark", 1_300), _ev("E", "mark", 11_300),  # window [1001, 1011) ms
        _ev("B", "other", 11_300), _ev("E", "other", 40_000),
        _ev("B", "mark", 44_000), _ev("E", "mark", 54_000),  # window [1040, 1050) ms
        _ev("B", "other", 54_000), _ev("E", "other", 60_000),
    ]  # fmt: skip
    trace = read_chrometrace(events)
    spawn = ProfileAnchor(perf_ns=995 * MS, lo_ns=990 * MS, hi_ns=1_020 * MS)
    windows = [(1_001 * MS, 1_011 * MS), (1_040 * MS, 1_050 * MS), (1_500 * MS, 1_510 * MS)]
    refined = refine_anchor(spawn, trace, "mark", windows, rate=100)
    assert refined.method == "marker" and refined.markers == 2  # the third window: no run
    # edges: 1001-1.3+5 = 1011-11.3+5 = 1004.7 ms; 1040-44+5 = 1050-54+5 = 1001 ms. Of the
    # four, nearest rank: median = the 2nd (1001), p10 = the 1st, p90 = the 4th.
    assert (refined.lo_ns, refined.perf_ns, refined.hi_ns) == (
        1_001 * MS,
        1_001 * MS,
        1_004_700_000,
    )
    assert refine_anchor(spawn, trace, "absent", windows, rate=100) == spawn


def test_refine_anchor_splits_two_marker_calls_seen_as_one_run() -> None:
    """Calls [1001, 1011) and [1012, 1022) ms, 1 ms apart: no sample fell between them, so
    py-spy shows one run. Its start belongs to the first call, its end to the second."""
    events = [
        _ev("B", "mark", 1_300), _ev("E", "mark", 22_300),  # both calls, 0.3 ms late
        _ev("B", "other", 22_300), _ev("E", "other", 40_300),
        _ev("B", "mark", 40_300), _ev("E", "mark", 50_300),  # [1040, 1050) ms, 0.3 ms late
        _ev("B", "other", 50_300), _ev("E", "other", 60_000),
    ]  # fmt: skip
    spawn = ProfileAnchor(perf_ns=995 * MS, lo_ns=990 * MS, hi_ns=1_020 * MS)
    windows = [(1_001 * MS, 1_011 * MS), (1_012 * MS, 1_022 * MS), (1_040 * MS, 1_050 * MS)]
    refined = refine_anchor(spawn, read_chrometrace(events), "mark", windows, rate=100)
    # every edge: window edge - stamp (0.3 ms late) + 5 ms of centring = 1004.7 ms. Pairing
    # the merged run with one call would have given 1011 - 22.3 + 5 = 993.7 ms for its end.
    assert refined.markers == 3
    assert (refined.lo_ns, refined.perf_ns, refined.hi_ns) == (1_004_700_000,) * 3


def test_refine_anchor_counts_a_call_seen_as_two_runs_once() -> None:
    """A torn sample (non-blocking py-spy) cuts one call's run in two: only the outer edges,
    the ones nearest the call's own edges, count."""
    events = [
        _ev("B", "mark", 1_300), _ev("E", "mark", 5_000),  # [1001, 1011) ms, cut at 5 ms
        _ev("B", "torn", 5_000), _ev("E", "torn", 5_200),
        _ev("B", "mark", 5_200), _ev("E", "mark", 11_300),
        _ev("B", "other", 11_300), _ev("E", "other", 60_000),
    ]  # fmt: skip
    spawn = ProfileAnchor(perf_ns=995 * MS, lo_ns=990 * MS, hi_ns=1_020 * MS)
    refined = refine_anchor(
        spawn, read_chrometrace(events), "mark", [(1_001 * MS, 1_011 * MS)], rate=100
    )
    assert refined.markers == 1
    # both outer edges 0.3 ms late: 1004.7 ms; the inner ones (1011-5+5, 1001-5.2+5) would
    # have widened the bracket to 1000.8..1011
    assert (refined.lo_ns, refined.perf_ns, refined.hi_ns) == (1_004_700_000,) * 3


# --- exports --------------------------------------------------------------------------------


def test_exports_speedscope_and_collapsed_per_stage(tmp_path: Path) -> None:
    zero = 1_000 * MS
    wf = _waterfall([("decode", zero + 5 * MS, zero + 35 * MS)])
    profile = attribute(wf, _result(_trace_events(), zero))["decode"]
    assert collapsed(profile).splitlines() == [
        "main (app.py);EpollSelector.select (selectors.py) 20000",
        "main (app.py);work (app.py) 10000",
    ]
    doc = speedscope([profile])
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    (prof,) = doc["profiles"]  # type: ignore[misc]  # the document's values are typed as object
    assert prof["type"] == "sampled" and prof["weights"] == [20_000, 10_000]
    frames = doc["shared"]["frames"]  # type: ignore[index]  # the document's values are typed as object
    assert [frames[i]["name"] for i in prof["samples"][1]] == ["main", "work"]
    files = export_stages([profile], tmp_path / "flame", fmt="collapsed")
    assert [f.name for f in files] == ["decode.collapsed"]
    (sc,) = export_stages([profile], tmp_path / "flame")
    assert json.loads(sc.read_text())["profiles"][0]["name"] == "decode"
    with pytest.raises(UsageError):
        export_stages([profile], tmp_path, fmt="svg")


# --- misuse and degradation -----------------------------------------------------------------


def test_profiler_rejects_misuse() -> None:
    with pytest.raises(UsageError):
        Profiler()
    with pytest.raises(UsageError):
        Profiler(1, command=["x"])
    with pytest.raises(UsageError):
        Profiler(1, rate=1001)
    with pytest.raises(UsageError):
        _ = Profiler(1).result


def test_find_py_spy_prefers_an_explicit_path_then_path_lookup() -> None:
    assert find_py_spy("/opt/py-spy") == "/opt/py-spy"
    found = find_py_spy()
    assert found is not None and os.access(found, os.X_OK)


def _client_waterfall() -> Waterfall:
    t = time.perf_counter_ns()
    rec = Recorder("GET", "http://127.0.0.1/", start_ns=t)
    rec.add("send", t, t + MS)
    return rec.finish(t + 2 * MS)


def _assert_degraded(result: ProfileResult, status: str, *needles: str) -> None:
    assert result.status == status and not result.ok
    assert result.note is not None
    for needle in needles:
        assert needle in result.note
    wf = _client_waterfall()
    profiled = attach(wf, result)
    assert_exact(profiled)
    assert profiled.root == wf.root  # complete and unchanged
    assert profiled.attributes["profile.status"] == status
    assert profiled.attributes["profile.note"] == result.note


def test_missing_py_spy_binary_degrades_with_install_hint(tmp_path: Path) -> None:
    with Profiler(os.getpid(), py_spy=tmp_path / "nope") as prof:
        pass
    _assert_degraded(prof.result, UNAVAILABLE, "py-spy not found", "pip install py-spy")


def test_refused_ptrace_degrades_with_sys_ptrace_remedy(tmp_path: Path) -> None:
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho 'Permission Denied: Try running again with elevated " +
                    "permissions' >&2\nexit 1\n")  # fmt: skip
    fake.chmod(0o755)
    with Profiler(os.getpid(), py_spy=fake) as prof:
        pass
    _assert_degraded(prof.result, REFUSED, "ptrace not permitted", "--cap-add SYS_PTRACE")


def test_missing_pid_degrades_with_a_note() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # a pid that existed and no longer does
    with Profiler(proc.pid, rate=50) as prof:
        pass
    _assert_degraded(prof.result, REFUSED, f"no process {proc.pid}")


def test_target_exiting_mid_run_is_noted(tmp_path: Path) -> None:
    """A target that spins 0.8 s and exits while py-spy samples it at 50 Hz.

    The target ran at least 0.8 s, 40 samples' worth. py-spy samples on its own timer: a host
    too busy to give it its turns on time loses some (half is the floor held here). Its timer
    draws each gap from an exponential distribution (against aliasing with the target's own
    period) and catches up on late ones, so the count over the run is Poisson with mean
    rate × its run: the ceiling held is that mean plus four of its standard deviations (about
    1.7 of them, the quarter held before, is passed by one run in twenty on any host).
    """
    spin, rate = 0.8, 50
    script = f"import time\nt=time.perf_counter()+{spin}\nwhile time.perf_counter()<t: pass\n"
    with Profiler(command=[sys.executable, "-c", script], rate=rate) as prof:
        target = prof.target_pid
        assert target is not None
        exited = os.pidfd_open(target)  # readable once the target has exited
        try:
            assert select.select([exited], [], [], 10)[0], "the target did not exit"
        finally:
            os.close(exited)
    result = prof.result
    assert result.ok and result.target_exited
    assert result.note is not None and "exited" in result.note
    assert result.samples is not None and result.wall_s is not None
    mean = rate * result.wall_s
    assert rate * spin / 2 <= result.samples <= mean + 4 * math.sqrt(mean) + 2, (mean, result)
