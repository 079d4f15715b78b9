"""What a run prints: aligned rows with a unit each, the conditions, whose limit a lag was,
a progress line, and ``compare`` of runs whose scenarios are named differently."""

from __future__ import annotations

import asyncio
import io
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from latency_analyzer.analysis import Tags, WaterfallSet, compare
from latency_analyzer.errors import UsageError
from latency_analyzer.load import ClientHealth, Scenario
from latency_analyzer.load._monitor import (
    LoopMonitor,
    ThreadSchedstat,
    busy_share,
    cpu_times,
    host_times,
    schedstat,
    steal_share,
)
from latency_analyzer.load._progress import ProgressLine
from latency_analyzer.testing.waterfalls import synthetic

LAG = {"p50_s": 0.001, "p99_s": 0.030, "max_s": 0.040}
CALM = {"p50_s": 0.0001, "p99_s": 0.001, "max_s": 0.002}


def _set(name: str, wait_ms: float, n: int = 30, **meta: object) -> WaterfallSet:
    ws = WaterfallSet(meta=dict(meta) or None)
    for i in range(n):
        wf = synthetic(start_ms=10.0 * i, send=0.1, wait=wait_ms + i % 3, first_token=5.0)
        ws.add(wf, Tags(scenario=name))
    return ws


def test_rows_are_aligned_with_a_unit_each_and_no_scientific_notation() -> None:
    ws = _set("a", wait_ms=2090.0)  # e2e ~2.1 s: once printed as 2.09e+03
    text = ws.summary().to_text()
    assert not re.search(r"\de[+-]\d", text), text
    table = [line for line in text.splitlines() if line.startswith(("e2e ", "send ", " "))]
    header = next(line for line in text.splitlines() if line.lstrip().startswith("unit"))
    e2e = next(line for line in text.splitlines() if line.startswith("e2e "))
    send = next(line for line in text.splitlines() if line.startswith("send "))
    assert table and len(header) == len(e2e) == len(send)  # one width for every row
    assert e2e.split()[1] == "ms" and send.split()[1] == "µs"  # each row picks its unit
    assert "2098 [" in e2e or "2097 [" in e2e  # e2e mean in ms, fixed notation
    assert "errors" not in text  # no "errors 0 {}"


def test_errors_are_listed_by_kind_only_when_there_are_some() -> None:
    ws = _set("a", wait_ms=5.0, n=5)
    ws.add(synthetic(send=0.1, wait=1.0, status=None, error_type="timeout"), Tags(scenario="a"))
    line = next(x for x in ws.summary().to_text().splitlines() if x.startswith("requests "))
    assert line.startswith("requests 6 · ok 5 · errors 1 (timeout 1) · ")


def test_conditions_show_the_target_the_versions_and_the_client() -> None:
    fp = {"target_host": "llm.test:443", "base_rtt_s": 0.0123, "http_versions": ["2"]}
    fp |= {"tls_versions": ["TLSv1.3"], "cpu_count": 2, "os": "Linux", "python": "3.11.7"}
    client = ClientHealth(CALM, None, 0.2, 50 * 2**20, 0.0, 0.5, 2).to_dict()
    ws = _set("a", 5.0, fingerprint=fp, scenario={"mode": "closed"}, result={"client": client})
    text = ws.summary().to_text()
    assert "target llm.test:443 · base RTT 12.3 ms · HTTP/2 · TLSv1.3 · closed loop" in text
    assert "client:     loop lag P99 1.00 ms · CPU 20% of a core" in text
    assert "pacer lag" not in text  # a closed loop has no schedule to lag behind
    assert ws.summary().to_dict()["conditions"]["base_rtt_s"] == 0.0123


def test_a_lagging_loop_is_told_host_contention_or_the_clients_own_limit() -> None:
    busy_host = ClientHealth(LAG, None, 0.15, 0, steal=0.0, load_avg=6.7, cpus=2)
    note = busy_host.note()
    assert note and note.startswith("the HOST was contended") and "load average 6.7" in note
    assert "pacer" not in note
    stolen = ClientHealth(LAG, LAG, 0.3, 0, steal=0.12, load_avg=1.0, cpus=2)
    assert "12% of the host's CPU time (steal)" in str(stolen.note())
    own = ClientHealth(LAG, LAG, 0.97, 0, steal=0.0, load_avg=1.2, cpus=2)
    assert str(own.note()).startswith("the CLIENT was saturated") and "pacer lag P99" in str(
        own.note()
    )
    assert ClientHealth(CALM, None, 0.97, 0).note() is None


def test_a_host_that_turned_busy_with_the_run_is_told_apart_from_the_clients_limit() -> None:
    """The load average (a one-minute mean) still reads low when others' work began with the
    run; the CPUs' busy share over the run says it: busy all through, and mostly not by us."""
    turned_busy = ClientHealth(LAG, None, 0.7, 0, steal=0.0, load_avg=1.3, cpus=2, host_busy=0.97)
    assert turned_busy.host_contended
    note = str(turned_busy.note())
    assert note.startswith("the HOST was contended") and "97% busy" in note, note
    # the client and its server alone keep two CPUs 65% busy: not others' work
    alone = ClientHealth(LAG, None, 0.7, 0, steal=0.0, load_avg=1.3, cpus=2, host_busy=0.65)
    assert not alone.host_contended
    # the client at its own limit is its own limit, however busy the host
    own = ClientHealth(LAG, None, 0.95, 0, steal=0.0, load_avg=1.3, cpus=2, host_busy=0.99)
    assert not own.host_contended and str(own.note()).startswith("the CLIENT was saturated")
    # busy, but all of it ours and a sliver of someone else's
    ours = ClientHealth(LAG, None, 0.75, 0, steal=0.0, load_avg=1.0, cpus=1, host_busy=0.95)
    assert not ours.host_contended
    assert turned_busy.to_dict()["host_busy"] == 0.97


def test_a_lag_spent_waiting_for_a_cpu_is_the_hosts_whatever_the_averages() -> None:
    """A host busy in bursts: averages over the run read low, but the loop's lagging samples
    would have been within the limit but for its thread's wait on a run queue. Waiting is
    the host's; blocking, or a client at its own limit, is the client's."""
    waited = {"total_s": 0.08, "lagging": 3, "lagging_by_wait": 2}
    burst = ClientHealth(LAG, LAG, 0.3, 0, load_avg=0.4, cpus=2, host_busy=0.23, cpu_wait=waited)
    assert burst.lag_waited_for_cpu and burst.host_contended
    note = str(burst.note())
    assert note.startswith("the HOST was contended") and "2 of the loop's 3 lagging" in note, note
    blocked = {"total_s": 0.002, "lagging": 3, "lagging_by_wait": 0}
    own = ClientHealth(LAG, LAG, 0.3, 0, load_avg=0.4, cpus=2, host_busy=0.23, cpu_wait=blocked)
    assert not own.lag_waited_for_cpu and not own.host_contended
    assert "something blocked the loop" in str(own.note())
    assert own.to_dict()["cpu_wait"] == blocked
    # at its own limit the client is its own limit, whatever it waited
    full = ClientHealth(LAG, LAG, 0.86, 0, load_avg=0.4, cpus=2, host_busy=0.9, cpu_wait=waited)
    assert full.lag_waited_for_cpu and not full.host_contended
    assert str(full.note()).startswith("the CLIENT was saturated")


def _monitored(work: Callable[[], None]) -> ClientHealth:
    """The self-check of a loop on which ``work`` runs as a callback every 60 ms, 8 times."""

    async def main() -> ClientHealth:
        async with LoopMonitor() as mon:
            for _ in range(8):
                await asyncio.sleep(0.06)
                work()
        return mon.health(None)

    return asyncio.run(main())


@pytest.mark.skipif(schedstat() is None, reason="the kernel gives no run-queue delay here")
def test_the_sampler_reads_its_own_threads_schedstat_from_one_descriptor() -> None:
    """The sampler's reader gives what ``schedstat()`` gives, of the thread that opened it
    (read from another thread too), fresh on every read; nothing once closed."""
    reader = ThreadSchedstat()
    try:
        first, plain = reader.read(), schedstat()
        assert first is not None and plain is not None
        assert 0 <= plain[0] - first[0] < 50_000_000  # the same thread's CPU time, read later
        deadline = time.thread_time() + 0.05
        while time.thread_time() < deadline:  # 50 ms of this thread's CPU
            pass
        after = reader.read()
        assert after is not None and after[0] - first[0] >= 40_000_000
        seen: list[tuple[int, int] | None] = []
        other = threading.Thread(target=lambda: seen.append(reader.read()))
        other.start()
        other.join()
        assert seen[0] is not None and seen[0][0] >= after[0]  # this thread's, not the other's
    finally:
        reader.close()
    assert reader.read() is None


@pytest.mark.skipif(schedstat() is None, reason="the kernel gives no run-queue delay here")
def test_the_self_check_tells_a_cpu_taken_by_others_from_a_blocked_loop() -> None:
    """Ground truth injected both ways: three processes spinning on the loop's CPU (all
    pinned to one, so the loop's thread has a quarter of it and waits on the run queue the
    rest), then a loop blocked by a synchronous sleep (it waits for nothing but itself)."""
    cpu = min(os.sched_getaffinity(0))
    spins = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    mask = os.sched_getaffinity(0)
    try:
        for spin in spins:
            os.sched_setaffinity(spin.pid, {cpu})
        os.sched_setaffinity(0, {cpu})

        def compute() -> None:  # CPU work the scheduler shares with the spinner
            deadline = time.thread_time() + 0.03
            while time.thread_time() < deadline:
                pass

        shared = _monitored(compute)
    finally:
        os.sched_setaffinity(0, mask)
        for spin in spins:
            spin.kill()
            spin.wait()
    assert shared.cpu_wait is not None and shared.cpu_wait["lagging"] > 0, shared
    assert shared.lag_waited_for_cpu, shared
    blocked = _monitored(lambda: time.sleep(0.2))
    assert blocked.cpu_wait is not None and blocked.cpu_wait["lagging"] >= 4, blocked
    assert not blocked.lag_waited_for_cpu, blocked


def test_the_busy_share_is_read_from_proc_stat(tmp_path: Path) -> None:
    def stat(busy: int, idle: int, iowait: int) -> tuple[int, int, int] | None:
        path = tmp_path / "stat"
        path.write_text(f"cpu  {busy} 0 0 {idle} {iowait} 0 0 0 0 0\ncpu0 1 2 3\n")
        return host_times(path)

    assert busy_share(stat(100, 800, 100), stat(250, 840, 110)) == pytest.approx(150 / 200)
    assert busy_share(stat(1, 1, 1), None) is None
    assert host_times(tmp_path / "missing") is None


def test_steal_is_read_from_proc_stat(tmp_path: Path) -> None:
    def stat(steal: int, rest: int) -> tuple[int, int] | None:
        path = tmp_path / "stat"
        path.write_text(f"cpu  {rest} 0 0 0 0 0 0 {steal} 0 0\ncpu0 1 2 3\n")
        return cpu_times(path)

    assert steal_share(stat(100, 900), stat(150, 1350)) == pytest.approx(50 / 500)
    assert steal_share(None, stat(1, 1)) is None
    assert cpu_times(tmp_path / "missing") is None


def test_progress_line_has_count_elapsed_eta_and_rate() -> None:
    out = io.StringIO()
    closed = ProgressLine(Scenario("http://x/", requests=200), stream=out, force=True)
    assert closed.line(50, 200, closed.t0 + 10.0) == "50/200 requests · 10 s elapsed · ETA 30 s"
    timed = ProgressLine(Scenario("http://x/", mode="open", rate=20, duration=120), stream=out)
    assert timed.line(400, None, timed.t0 + 20.0) == (
        "400 requests · 20 s of 2:00 · ETA 1:40 · 20.0 req/s (offered 20/s)"
    )
    closed(200, 200)
    closed.close()
    assert out.getvalue().startswith("\r200/200 requests") and out.getvalue().endswith("\r")


def test_compare_pairs_runs_whatever_their_scenario_names() -> None:
    slow, fast = _set("vendor-a", wait_ms=40.0), _set("vendor-b", wait_ms=10.0)
    comp = compare(slow, fast)  # auto: no shared name, so first with first
    speedup = comp.get("e2e_p50").ratio.value
    assert speedup == pytest.approx(46.1 / 16.1, rel=0.05)
    with pytest.raises(UsageError, match=r"share no scenario name.*vendor-a.*vendor-b"):
        compare(slow, fast, pair_by="name")
    two = _set("x", 5.0) + _set("y", 6.0)
    with pytest.raises(UsageError, match="cannot pair by position"):
        compare(two, fast, pair_by="position")
