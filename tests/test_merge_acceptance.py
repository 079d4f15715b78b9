"""Acceptance: the test bed's real OpenTelemetry spans (vLLM schema, OTLP/HTTP protobuf + gzip,
through the SDK's exporter) merged into the client's waterfalls.

Injected: queue 15 ms, prefill 40 ms, decode 5 ms × 20 tokens (the server's decode, first to
last token, is 19 × 5 = 95 ms). Tolerance: ``conftest.tolerance`` = max(0.5 ms, 3%). The server
runs in its own process (precise delays); ``perf_counter_ns`` is one clock across processes on
Linux, so the clock offset's ground truth is the injected skew, up to the two processes' clock
anchors (a few microseconds).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from conftest import assert_exact, tolerance
from wire_bounds import Steal, strays_allowed

import latency_analyzer as la
from latency_analyzer.merge import MERGED, amerge
from latency_analyzer.server import OTLPHttpReceiver, SpanStore
from latency_analyzer.testing import LLMServer, RequestRecord
from latency_analyzer.testing._timing import deadline_after

BODY = {
    "model": "m",
    "stream": True,
    "stream_options": {"include_usage": True},
    "messages": [{"role": "user", "content": "hi"}],
}
REQUESTS = 10
ANCHOR_SLACK_NS = 20_000  # two processes' perf↔epoch anchors, each good to a few µs


async def _run(
    skew: float,
) -> tuple[list[la.Waterfall], list[la.Waterfall], list[RequestRecord], OTLPHttpReceiver]:
    store = SpanStore()
    with OTLPHttpReceiver(store).run_in_thread() as receiver:
        server = LLMServer(
            queue=0.015,
            prefill=0.040,
            decode=0.005,
            tokens=20,
            otlp_endpoint=receiver.endpoint,
            clock_skew=skew,
        )
        with server.run_in_subprocess() as llm:
            waterfalls = await _requests(llm.url)
            merged = await amerge(waterfalls, store, grace=5.0)
            records = llm.records
    return waterfalls, merged, records, receiver


async def _requests(url: str) -> list[la.Waterfall]:
    """The client sends a traceparent with each request and records its ids on the waterfall."""
    waterfalls = []
    async with la.Client(url) as client:
        for _ in range(REQUESTS):
            wf = await client.request("/v1/chat/completions", json=BODY)
            assert len(str(wf.attributes["trace_id"])) == 32
            assert len(str(wf.attributes["span_id"])) == 16
            waterfalls.append(wf.raise_for_error())
    return waterfalls


def _floor_half_width(wfs: Sequence[la.Waterfall], records: Sequence[RequestRecord]) -> int:
    """Half the tightest causal bracket the instants allow, from ground truth (perf ns)."""
    his, los = [], []
    for wf, r in zip(wfs, records, strict=True):
        send = wf.stage("send")
        assert send is not None and wf.first_token_ns and wf.last_token_ns
        his.append(r.received_ns - send.start_ns)
        los.append(
            max(
                r.chunk_ns[0] - wf.first_token_ns,
                r.chunk_ns[-1] - wf.last_token_ns,
                r.end_ns - wf.end_ns,
            )
        )
    return (min(his) - max(los) + 1) // 2


def _check_stages(
    merged: Sequence[la.Waterfall], records: Sequence[RequestRecord], steal: Steal
) -> None:
    """The merged server stages: the injected delays, and each request's what
    the server's log says it took (its spans carry its own instants: a server whose loop ran
    late wrote a first token well after its prefill deadline, and said so). Each stage is
    within the tolerance of the injected delay, but for those
    :func:`wire_bounds.strays_allowed` and each stolen jiffy let past: a server the
    hypervisor stopped is late by more than real-time priority can keep out."""
    for wf in merged:
        assert wf.attributes["server.status"] == MERGED
        assert wf.attributes["server.schema"] == "vllm"
        assert_exact(wf)
    logged: dict[str, list[float]] = {"server_queue": [], "prefill": [], "decode": []}
    for r in sorted(records, key=lambda r: r.received_ns):  # the requests' order
        queued = deadline_after(r.received_ns, r.behavior.header_delay)
        scheduled = deadline_after(queued, r.behavior.queue)
        logged["server_queue"].append((scheduled - queued) / 1e9)
        logged["prefill"].append((r.chunk_ns[0] - scheduled) / 1e9)
        logged["decode"].append((r.chunk_ns[-1] - r.chunk_ns[0]) / 1e9)
    for stage, expected in (("server_queue", 0.015), ("prefill", 0.040), ("decode", 0.095)):
        values = [wf.attribution()[stage] for wf in merged]
        bound = tolerance(expected)
        past = [v for v in values if abs(v - expected) > bound]
        assert len(past) <= strays_allowed(len(values)) + steal.jiffies, (stage, values, steal)
        for value, truth in zip(values, logged[stage], strict=True):
            assert abs(value - truth) <= 2 * tolerance(expected), (stage, value, truth)


@pytest.mark.parametrize("skew", [0.0, 0.250], ids=["same-clock", "skew+250ms"])
async def test_testbed_spans_merge_into_the_waterfall(skew: float) -> None:
    with Steal() as steal:
        waterfalls, merged, records, receiver = await _run(skew)
    assert receiver.rejected == 0 and receiver.accepted >= 1
    _check_stages(merged, records, steal)
    records = sorted(records, key=lambda r: r.received_ns)
    offset = merged[0].attributes["server.offset_ns"]
    uncertainty = merged[0].attributes["server.offset_uncertainty_ns"]
    assert isinstance(offset, int) and isinstance(uncertainty, int)
    assert merged[0].attributes["server.offset_requests"] == REQUESTS
    # the skew is detected: the true offset (the skew) lies inside the reported bracket
    assert abs(offset - round(skew * 1e9)) <= uncertainty + ANCHOR_SLACK_NS
    # and the bracket is the tightest the instants allow (ground truth from the records)
    floor = _floor_half_width(waterfalls, records)
    assert abs(uncertainty - floor) <= ANCHOR_SLACK_NS, (uncertainty, floor)


async def test_the_merged_tree_nests_server_stages_in_client_stages() -> None:
    _, merged, records, _ = await _run(0.0)
    wf = merged[-1]
    first_token, decode = wf.stage("first_token"), wf.stage("decode")
    assert first_token is not None and decode is not None
    assert {c.name for c in first_token.children} >= {"server_queue", "prefill"}
    assert any(c.name == "decode" and c.source == "server" for c in decode.children)
    for stage in wf.root.children:
        for child in stage.children:
            assert stage.start_ns <= child.start_ns <= child.end_ns <= stage.end_ns
    # the server decode sits where the server produced it: within the uncertainty (+ slack)
    record = max(records, key=lambda r: r.received_ns)
    server_decode = [c for s in wf.root.children for c in s.children if c.name == "decode"]
    margin = int(wf.attributes["server.offset_uncertainty_ns"]) + ANCHOR_SLACK_NS  # type: ignore[arg-type]  # attribute values are a union
    assert abs(server_decode[0].start_ns - record.chunk_ns[0]) <= margin
    assert abs(server_decode[-1].end_ns - record.chunk_ns[-1]) <= margin
