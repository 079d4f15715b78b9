"""The timeline model: exact attribution, derived response stages, token metrics, clock anchor."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from latency_analyzer.errors import UsageError
from latency_analyzer.timeline import (
    Recorder,
    Span,
    distribute_tokens,
    exclusive_ns,
    per_token_gaps_ns,
    take_anchor,
)

MS = 1_000_000


def _streamed(chunks: list[int], *, usage: int | None = None, weights: list[int] | None = None):
    rec = Recorder("POST", "http://x/v1/chat/completions", start_ns=0)
    rec.add("dns", 1 * MS, 3 * MS)
    rec.add("connect", 3 * MS, 4 * MS)
    rec.add("send", 5 * MS, 6 * MS)
    rec.response_headers(10 * MS, 200)
    for i, t in enumerate(chunks):
        rec.chunk(t, weight=(weights[i] if weights else 5))
    if usage is not None:
        rec.usage(7, usage)
    return rec.finish(chunks[-1] + 2 * MS if chunks else 12 * MS)


def test_streamed_request_stages_and_exact_attribution() -> None:
    wf = _streamed([20 * MS, 25 * MS, 30 * MS])
    att = wf.attribution_ns()
    assert att == {
        "dns": 2 * MS,
        "connect": 1 * MS,
        "send": 1 * MS,
        "wait": 4 * MS,
        "first_token": 10 * MS,
        "decode": 10 * MS,
        "tail": 2 * MS,
        "other": 2 * MS,  # 0-1 ms before dns and 4-5 ms between connect and send
    }
    assert sum(att.values()) == wf.e2e_ns == 32 * MS
    assert math.fsum(wf.attribution().values()) == pytest.approx(wf.e2e, abs=1e-12)
    assert wf.ttft == pytest.approx(0.020)
    assert wf.tpot == pytest.approx(0.005)
    assert wf.output_tokens == 3 and wf.output_tokens_source == "chunks"
    assert wf.itl == pytest.approx((0.005, 0.005))
    assert wf.chunk_gaps == pytest.approx((0.005, 0.005))


def test_usage_total_is_split_over_chunks_by_text_length() -> None:
    wf = _streamed([20 * MS, 24 * MS, 30 * MS], usage=6, weights=[5, 10, 15])
    assert wf.output_tokens == 6 and wf.output_tokens_source == "usage"
    assert wf.chunk_tokens == (1, 2, 3)  # equal-width tokens: exact
    # tpot over tokens: (30 - 20) ms / 5; itl: 2 gaps of 2 ms, then 3 gaps of 2 ms
    assert wf.tpot == pytest.approx(0.002)
    assert wf.itl == pytest.approx((0.002,) * 5)
    assert sum(wf.itl) / len(wf.itl) == pytest.approx(wf.tpot)


def test_first_chunk_with_several_tokens_gives_zero_gaps_so_mean_itl_is_tpot() -> None:
    assert per_token_gaps_ns([0, 9], [3, 3]) == [0.0, 0.0, 3.0, 3.0, 3.0]


def test_distribute_tokens_is_exact_for_equal_width_tokens() -> None:
    assert distribute_tokens(4, [5, 15]) == [1, 3]
    assert distribute_tokens(9, [10, 50, 30]) == [1, 5, 3]
    assert distribute_tokens(2, [1, 1, 1]) is None
    assert distribute_tokens(4, [0, 0]) == [2, 2]


@given(st.lists(st.integers(0, 50), min_size=1, max_size=20), st.integers(0, 400))
def test_distribute_tokens_adds_up_with_at_least_one_each(weights: list[int], extra: int) -> None:
    counts = distribute_tokens(len(weights) + extra, weights)
    assert counts is not None
    assert sum(counts) == len(weights) + extra and min(counts) >= 1


def test_usage_smaller_than_chunks_keeps_chunk_count_and_notes_it() -> None:
    wf = _streamed([20 * MS, 25 * MS, 30 * MS], usage=2)
    assert wf.output_tokens == 3 and wf.output_tokens_source == "chunks"
    assert "usage_mismatch" in wf.attributes


def test_failure_mid_stream_keeps_every_stage_that_happened() -> None:
    rec = Recorder("POST", "http://x/", start_ns=0)
    rec.add("connect", 0, 1 * MS)
    rec.add("send", 1 * MS, 2 * MS)
    rec.response_headers(5 * MS, 200)
    rec.chunk(8 * MS, 3)
    rec.chunk(9 * MS, 3)
    rec.fail("reset", "connection reset by peer", 15 * MS)
    wf = rec.finish(15 * MS)
    assert wf.error == "connection reset by peer" and wf.error_type == "reset"
    assert [s.name for s in wf.root.children] == [
        "connect",
        "send",
        "wait",
        "first_token",
        "decode",
        "tail",
    ]
    assert wf.stages["tail"].attributes["interrupted"] is True
    assert wf.stages["tail"].duration_ns == 6 * MS
    assert sum(wf.attribution_ns().values()) == wf.e2e_ns


def test_failure_before_headers_ends_wait_at_the_failure_and_interrupts_open_stages() -> None:
    rec = Recorder("GET", "http://x/", start_ns=0)
    rec.begin("tls", 1 * MS)
    rec.fail("tls", "certificate verify failed", 4 * MS)
    wf = rec.finish(4 * MS)
    assert wf.stages["tls"].duration_ns == 3 * MS
    assert wf.stages["tls"].attributes["interrupted"] is True
    assert "wait" not in wf.stages and wf.ttft is None and wf.tpot is None

    rec = Recorder("GET", "http://x/", start_ns=0)
    rec.add("send", 0, 1 * MS)
    rec.fail("timeout", "no response headers in 0.2 s", 200 * MS)
    wf = rec.finish(200 * MS)
    assert wf.stages["wait"].duration_ns == 199 * MS


def test_intended_start_adds_schedule_lag_and_counts_in_e2e() -> None:
    rec = Recorder("GET", "http://x/", start_ns=5 * MS, intended_start_ns=2 * MS)
    rec.add("send", 5 * MS, 6 * MS)
    rec.response_headers(8 * MS, 200)
    wf = rec.finish(9 * MS)
    assert wf.attribution_ns()["schedule_lag"] == 3 * MS
    assert wf.e2e_ns == 7 * MS


def test_server_children_turn_the_client_residual_into_network() -> None:
    server = (
        Span("server_queue", 11, 14, "server"),
        Span("prefill", 14, 18, "server"),
    )
    wait = Span("wait", 10, 20, "client", children=server)
    root = Span("request", 0, 25, children=(Span("send", 5, 10), wait))
    att = exclusive_ns(root)
    assert att == {"send": 5, "network": 3, "server_queue": 3, "prefill": 4, "other": 10}


@st.composite
def _trees(draw: st.DrawFn, depth: int = 0) -> Span:
    start = draw(st.integers(0, 1_000))
    end = start + draw(st.integers(0, 1_000))
    kids = draw(st.lists(_trees(depth + 1), max_size=3)) if depth < 3 else []
    name = draw(st.sampled_from(["dns", "tls", "wait", "prefill", "decode"]))
    source = draw(st.sampled_from(["client", "server"]))
    return Span(name, start, end, source, children=tuple(kids))


@given(_trees())
def test_attribution_sums_to_root_duration_for_any_tree(root: Span) -> None:
    """Overlapping, out-of-bounds and nested children never double count or drop time."""
    att = exclusive_ns(root)
    assert sum(att.values()) == root.duration_ns
    assert all(v >= 0 for v in att.values())


def test_span_is_immutable_and_validated() -> None:
    span = Span("dns", 0, 5, attributes={"k": 1})
    with pytest.raises(AttributeError):
        span.name = "tls"  # type: ignore[misc]  # frozen: the point of the check
    with pytest.raises(TypeError):
        span.attributes["k"] = 2  # type: ignore[index]  # read-only mapping: the point of the check
    with pytest.raises(UsageError):
        Span("dns", 5, 1)


def test_recorder_misuse_is_a_usage_error() -> None:
    rec = Recorder("GET", "http://x/", start_ns=0)
    with pytest.raises(UsageError):
        rec.end("dns", 1)
    rec.begin("dns", 0)
    with pytest.raises(UsageError):
        rec.begin("dns", 1)
    rec.finish(2)
    with pytest.raises(UsageError):
        rec.finish(3)


def test_anchor_picks_the_tightest_bracket() -> None:
    perf = iter([0, 100, 1_000, 1_004, 2_000, 2_050]).__next__
    wall = iter([7_000, 8_000, 9_000]).__next__
    anchor = take_anchor(reads=3, perf=perf, wall=wall)
    assert (anchor.perf_ns, anchor.epoch_ns, anchor.uncertainty_ns) == (1_002, 8_000, 2)
    assert anchor.to_epoch_ns(2_002) == 9_000 and anchor.to_perf_ns(9_000) == 2_002


def test_json_round_trip_is_exact() -> None:
    import json

    from latency_analyzer import Waterfall

    rec = Recorder("POST", "http://x/v1/chat/completions", start_ns=10)
    rec.add("dns", 11, 20, addresses="127.0.0.1")
    rec.add("send", 21, 22)
    rec.response_headers(30, 200)
    rec.chunk(40, 5, reasoning=True)
    rec.chunk(50, 5)
    rec.usage(3, 4)
    rec.fail("truncated", "stream ended without [DONE]", 55, terminal=False)
    wf = rec.finish(60)
    again = Waterfall.from_dict(json.loads(json.dumps(wf.to_dict())))
    assert again == wf
    assert again.attribution_ns() == wf.attribution_ns() and again.itl == wf.itl
    with pytest.raises(UsageError):
        Waterfall.from_dict({**wf.to_dict(), "schema": 99})


def test_a_request_started_before_its_intended_start_still_spans_its_stages() -> None:
    rec = Recorder("GET", "http://x/", start_ns=1_000, intended_start_ns=1_500)
    rec.add("send", 1_100, 1_200)
    rec.response_headers(1_300, 200)
    wf = rec.finish(2_000)
    assert wf.start_ns == 1_000 and wf.e2e_ns == 1_000
    assert wf.attribution_ns()["schedule_lag"] == 0
    assert sum(wf.attribution_ns().values()) == wf.e2e_ns
