"""The target check of an open loop holds its verdict to what the run can show: the requests
that arrived last finish one latency after the arrivals stop and are counted, and a run only a
few latencies long (the trace example at speed 4) is not judged at all."""

from __future__ import annotations

from latency_analyzer.load import Scenario, run_sync
from latency_analyzer.testing import LLMServer

CHAT = "/v1/chat/completions"


def _open(url: str, requests: int) -> Scenario:
    return Scenario(url, mode="open", rate=100.0, requests=requests, stream=False, name="o")


def test_an_open_loop_on_a_target_with_room_to_spare_is_judged_and_not_saturated() -> None:
    # 150 arrivals 10 ms apart, each served in 40 ms with no limit on requests at once: the
    # server keeps up (its log: no request waited for a slot), the window is about 35
    # latencies long (still over ten when a busy host doubles the client's latency), and the
    # four requests in flight at the last arrival count once done.
    with LLMServer(header_delay=0.040, tokens=1).run_in_subprocess() as server:
        result = run_sync(_open(server.url + CHAT, 150), rtt_samples=0)
        records = server.records
    assert len(records) == 150 and all(r.slot_wait_ns == 0 for r in records)
    assert result.offered_rps is not None and result.completed_in_window_rps is not None
    assert result.completed_in_window_rps >= 0.9 * result.offered_rps, result.notes
    assert not result.target_saturated


def test_a_run_a_few_latencies_long_is_not_judged() -> None:
    # 25 arrivals over 0.24 s, each 100 ms long: a quarter of them are still in flight when
    # the arrivals stop, whatever the target's capacity, so throughput cannot tell.
    with LLMServer(header_delay=0.100, tokens=1).run_in_subprocess() as server:
        result = run_sync(_open(server.url + CHAT, 25), rtt_samples=0)
    assert result.set.counts()["ok"] == 25
    assert result.offered_rps is None and result.completed_in_window_rps is None
    assert not result.target_saturated
    assert not any("TARGET is saturated" in n for n in result.summary().notes)


def test_a_short_run_over_worker_processes_is_not_judged_either() -> None:
    # The CLI's default (--workers auto) merges the workers' rows and checks them apart.
    with LLMServer(header_delay=0.100, tokens=1).run_in_subprocess() as server:
        sc = Scenario(
            server.url + CHAT, mode="open", rate=100.0, duration=0.25, stream=False, name="o"
        )
        result = run_sync(sc, workers=2, rtt_samples=0)
    assert result.set.counts()["ok"] >= 20
    assert result.completed_in_window_rps is None
    assert not result.target_saturated
    assert not any("TARGET is saturated" in n for n in result.summary().notes)
