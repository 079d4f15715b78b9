"""A short open loop against a target with room to spare is not called saturated: the requests
that arrived last finish one latency after the arrivals stop, and are counted."""

from __future__ import annotations

from latency_analyzer.load import Scenario, run_sync
from latency_analyzer.testing import LLMServer

CHAT = "/v1/chat/completions"


def test_a_short_open_loop_on_an_idle_target_is_not_saturated() -> None:
    # 25 arrivals 10 ms apart, each served in 40 ms with no limit on requests at once: the
    # server keeps up (its own log says each waited for nothing), yet at the last arrival four
    # requests are still in flight, 16% of the run: a count that stopped there said saturated.
    with LLMServer(header_delay=0.040, tokens=1).run_in_subprocess() as server:
        sc = Scenario(
            server.url + CHAT, mode="open", rate=100.0, requests=25, stream=False, name="short"
        )
        result = run_sync(sc, rtt_samples=0)
        records = server.records
    assert len(records) == 25 and all(r.slot_wait_ns == 0 for r in records)
    assert result.set.counts()["ok"] == 25
    assert result.offered_rps is not None and result.completed_in_window_rps is not None
    assert result.completed_in_window_rps >= 0.9 * result.offered_rps, result.notes
    assert not result.target_saturated
    assert not any("TARGET is saturated" in n for n in result.summary().notes)
