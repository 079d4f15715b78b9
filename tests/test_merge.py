"""Merging server stages into a waterfall: placement, residual ``network``, exact attribution,
"no server data", "no offset fits", clamping, Server-Timing placement, the in-process
SpanProcessor and the grace period."""

from __future__ import annotations

import dataclasses
import time

import pytest
from conftest import assert_exact, tolerance
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import latency_analyzer as la
from latency_analyzer.capture.propagation import inject
from latency_analyzer.merge import MERGED, NO_OFFSET_FITS, NO_SERVER_DATA, amerge, merge
from latency_analyzer.server import (
    ClockOffset,
    ServerSpan,
    SpanStore,
    bracket,
    map_request,
    server_timing_stages,
)
from latency_analyzer.server.inprocess import StoreSpanProcessor
from latency_analyzer.testing import LLMServer
from latency_analyzer.timeline import ClockAnchor, Recorder

MS = 1_000_000
EPOCH = 1_800_000_000_000_000_000
ANCHOR = ClockAnchor(perf_ns=0, epoch_ns=EPOCH, uncertainty_ns=0)
TRACE, CLIENT = "ab" * 16, "cd" * 8


def _waterfall() -> la.Waterfall:
    """Send 10→11 ms, headers at 30 ms, tokens at 80, 85, ..., 175 ms, end 176 ms (perf ns)."""
    rec = Recorder("POST", "http://x/v1/chat/completions", start_ns=0, anchor=ANCHOR)
    rec.add("connect", 1 * MS, 10 * MS)
    rec.add("send", 10 * MS, 11 * MS)
    rec.response_headers(30 * MS, 200)
    for i in range(20):
        rec.chunk(80 * MS + i * 5 * MS, 8)
    return rec.finish(176 * MS)


def _vllm(skew_ms: float, e2e: float = 0.160) -> ServerSpan:
    """A vLLM span for the waterfall above as seen by a server whose clock is ``skew`` ahead:
    arrival 12 ms, queue 15, prefill 40 (first token 79.5 ms), decode 95 ms."""
    attrs = {
        "gen_ai.latency.time_in_queue": 0.015,
        "gen_ai.latency.time_to_first_token": 0.0675,
        "gen_ai.latency.time_in_model_prefill": 0.040,
        "gen_ai.latency.time_in_model_decode": 0.095,
        "gen_ai.latency.e2e": e2e,
    }
    start = EPOCH + round((12 + skew_ms) * MS)
    return ServerSpan(
        TRACE, "01" * 8, CLIENT, "llm_request", start, start + round(e2e * 1e9), "server", attrs
    )


@pytest.mark.parametrize("skew_ms", [0.0, 250.0, -3000.0])
def test_stages_land_in_the_client_stages_they_fall_in(skew_ms: float) -> None:
    wf = _waterfall()
    stages = map_request([_vllm(skew_ms)], CLIENT)
    merged = merge(wf, stages)
    assert merged is not wf and wf.attributes.get("server.status") is None  # new waterfall
    assert merged.attributes["server.status"] == MERGED
    assert_exact(merged)
    b = bracket(wf, stages)  # type: ignore[arg-type]  # map_request gave stages for this request
    assert b is not None and b.lo_ns <= round(skew_ms * MS) <= b.hi_ns
    a = merged.attribution()
    for name, expected in (("server_queue", 0.015), ("prefill", 0.040), ("decode", 0.095)):
        assert abs(a[name] - expected) <= tolerance(expected), (name, a)
    assert "network" in a and "wait" not in a  # the client's wait holds server time now
    assert a["connect"] == pytest.approx(0.009)


def test_no_spans_is_no_server_data_not_zero() -> None:
    merged = merge(_waterfall(), None)
    assert merged.attributes["server.status"] == NO_SERVER_DATA
    assert "server_queue" not in merged.attribution()
    assert merged.root == _waterfall().root


def test_a_server_done_later_than_the_client_saw_degrades_the_merge() -> None:
    wf = _waterfall()
    merged = merge(wf, map_request([_vllm(0.0, e2e=0.400)], CLIENT))
    a = merged.attributes
    assert a["server.status"] == MERGED and a["server.contradicted"] == "done"
    # first-token bound −0.5 ms, arrival +2 ms: offset +0.75 ms; done at 412 ms vs 176 ms
    assert a["server.offset_ns"] == 750_000
    assert a["server.contradicted.done_ns"] == 236 * MS - 750_000
    assert a["server.offset_uncertainty_ns"] == a["server.contradicted.done_ns"]
    assert a["server.unplaced_ns"] > 0  # type: ignore[operator]  # postprocess past the end
    assert_exact(merged)


def test_a_server_longer_than_the_client_saw_at_every_bound_fits_no_offset() -> None:
    wf = _waterfall()
    span = _vllm(0.0, e2e=0.400)
    late = {**span.attributes, "gen_ai.latency.time_to_first_token": 0.300}
    merged = merge(wf, map_request([dataclasses.replace(span, attributes=late)], CLIENT))
    assert merged.attributes["server.status"] == NO_OFFSET_FITS
    assert merged.root == wf.root  # nothing shifted outside its bracket
    assert merged.attributes["server.bracket_lo_ns"] > merged.attributes["server.bracket_hi_ns"]  # type: ignore[operator]  # attribute values are a union
    assert "contradicts every later bound" in str(merged.attributes["server.reason"])


def test_a_shared_offset_outside_the_requests_bracket_is_clamped_and_said() -> None:
    stages = map_request([_vllm(0.0)], CLIENT)
    far = ClockOffset(offset_ns=50 * MS, uncertainty_ns=10, lo_ns=50 * MS, hi_ns=50 * MS)
    merged = merge(_waterfall(), stages, far)
    assert merged.attributes["server.offset_clamped"] is True
    b = bracket(_waterfall(), stages)  # type: ignore[arg-type]  # map_request gave stages for this request
    assert b is not None and merged.attributes["server.offset_ns"] == b.hi_ns
    assert_exact(merged)


def test_server_timing_is_centred_between_send_and_headers() -> None:
    wf = _waterfall()  # send starts at 10 ms, headers at 30 ms: 20 ms window
    merged = merge(wf, server_timing_stages("queue;dur=4, prefill;dur=10"), source="server-timing")
    assert merged.attributes["server.status"] == MERGED
    assert merged.attributes["server.placement_uncertainty_ns"] == 3 * MS
    kids = [c for s in merged.root.children for c in s.children]
    assert [(c.name, c.start_ns, c.end_ns) for c in kids] == [
        ("server_queue", 13 * MS, 17 * MS),
        ("prefill", 17 * MS, 27 * MS),
    ]
    assert_exact(merged)
    too_long = merge(wf, server_timing_stages("prefill;dur=25"), source="server-timing")
    assert too_long.attributes["server.status"] == NO_OFFSET_FITS


async def test_server_timing_from_the_test_bed() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    knobs = {"queue": 0.015, "prefill": 0.040, "decode": 0.005, "tokens": 20}
    with LLMServer(server_timing=True, **knobs).run_in_subprocess() as llm:  # type: ignore[arg-type]  # knobs: a dict of floats for keyword arguments of mixed types
        async with la.Client(llm.url) as client:
            wf = await client.request("/v1/chat/completions", json=body)
        header = llm.records[0].server_timing
    assert header is not None
    merged = merge(wf, server_timing_stages(header), source="server-timing")
    a = merged.attribution()
    for name, expected in (("server_queue", 0.015), ("prefill", 0.040), ("decode", 0.095)):
        assert abs(a[name] - expected) <= tolerance(expected), (name, a)
    assert_exact(merged)


async def test_in_process_spans_and_the_grace_period() -> None:
    store = SpanStore()
    provider = TracerProvider()
    provider.add_span_processor(StoreSpanProcessor(store))
    tracer = provider.get_tracer("vllm.tracing.otel")
    wf = _waterfall()
    headers: dict[str, str] = {}
    ctx = inject(headers)
    wf = dataclasses.replace(wf, attributes={"trace_id": ctx.trace_id, "span_id": ctx.span_id})
    template = _vllm(0.0)
    span = tracer.start_span(
        "llm_request",
        TraceContextTextMapPropagator().extract(headers),
        kind=SpanKind.SERVER,
        start_time=template.start_ns,
    )
    span.set_attributes(dict(template.attributes))  # type: ignore[arg-type]  # OTel's attribute type is narrower than ours
    span.end(end_time=template.end_ns)
    started = time.perf_counter()
    [merged] = await amerge([wf], store, grace=5.0)
    assert time.perf_counter() - started < 1.0  # the span was there: no waiting
    assert merged.attributes["server.status"] == MERGED
    assert merged.attributes["server.span_id"] == f"{span.get_span_context().span_id:016x}"
    started = time.perf_counter()
    other = dataclasses.replace(wf, attributes={"trace_id": "ee" * 16, "span_id": "ff" * 8})
    [missing] = await amerge([other], store, grace=0.2)
    assert 0.2 <= time.perf_counter() - started < 1.0
    assert missing.attributes["server.status"] == NO_SERVER_DATA
