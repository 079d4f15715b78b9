"""Schema mappings (vLLM, SGLang, TGI, GenAI, generic), Server-Timing / TGI headers and
traceparent propagation. vLLM is checked on real recorded spans; the others on span fixtures
written from the servers' documented attribute and span names."""

from __future__ import annotations

from pathlib import Path

import pytest

from latency_analyzer.capture.propagation import inject
from latency_analyzer.errors import UsageError
from latency_analyzer.server import (
    ServerSpan,
    SpanStore,
    decode_otlp,
    map_request,
    parse_duration,
    parse_server_timing,
    server_timing_stages,
    tgi_header_stages,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "real-servers"
MS = 1_000_000
T0 = 1_800_000_000_000_000_000
TRACE = "ab" * 16
CLIENT = "cd" * 8


def _span(
    name: str, start_ms: float, end_ms: float, span_id: str, parent: str = CLIENT, **attrs: object
) -> ServerSpan:
    return ServerSpan(
        TRACE,
        span_id,
        parent,
        name,
        T0 + round(start_ms * MS),
        T0 + round(end_ms * MS),
        "server",
        attrs,
    )  # type: ignore[arg-type]  # test attributes given as **object


def _layout(stages: object) -> list[tuple[str, int, int]]:
    return [(s.name, s.start_ns - T0, s.end_ns - T0) for s in stages.stages]  # type: ignore[attr-defined]  # whichever schema's result, all have .stages


def test_vllm_real_spans_derive_the_five_stages() -> None:
    spans = decode_otlp(
        (FIXTURES / "vllm-0.32-otlp-request-spans.pb").read_bytes(), "application/x-protobuf"
    )
    st = map_request([s for s in spans if s.trace_id == "1" * 32], "2" * 16)
    assert st is not None and st.schema == "vllm" and st.span_id == "52829667cfbb85df"
    a = st.arrival_ns
    got = {s.name: (s.start_ns - a, s.duration_ns) for s in st.stages}
    ttft, queue, prefill = 27_453_899, 33_930, 12_037_124
    assert got["preprocess"] == (0, ttft - queue - prefill)
    assert got["server_queue"] == (ttft - queue - prefill, queue)
    assert got["prefill"] == (ttft - prefill, prefill)
    # vLLM's e2e < ttft + decode here (two processes' clocks): decode (25_806_360 ns in the
    # engine) is clipped to end at e2e, the overshoot kept; no postprocess, no last token
    e2e = 52_633_047
    assert got["decode"] == (ttft, e2e - ttft)
    assert st.attributes["server.decode_clipped_ns"] == 25_806_360 - (e2e - ttft)
    assert "postprocess" not in got and st.last_token_ns is None
    assert (st.first_token_ns, st.done_ns) == (a + ttft, a + 52_633_047)
    assert st.attributes["gen_ai.request.id"] == "chatcmpl-aad140f8ab2da499"


def test_vllm_postprocess_is_the_rest_of_e2e() -> None:
    root = _span(
        "llm_request",
        0,
        200,
        "01" * 8,
        **{
            "gen_ai.latency.time_in_queue": 0.015,
            "gen_ai.latency.time_to_first_token": 0.060,
            "gen_ai.latency.time_in_model_prefill": 0.040,
            "gen_ai.latency.time_in_model_decode": 0.095,
            "gen_ai.latency.e2e": 0.160,
        },
    )
    st = map_request([root], CLIENT)
    assert st is not None
    assert _layout(st) == [
        ("preprocess", 0, 5 * MS),
        ("server_queue", 5 * MS, 20 * MS),
        ("prefill", 20 * MS, 60 * MS),
        ("decode", 60 * MS, 155 * MS),
        ("postprocess", 155 * MS, 160 * MS),
    ]
    assert st.last_token_ns == T0 + 155 * MS


def test_sglang_slices_union_nested_decode() -> None:
    root_id = "0a" * 8
    spans = [
        _span("Req abc", 0, 100, root_id, **{"gen_ai.latency.time_to_first_token": 0.030}),
        _span("tokenize", 0, 2, "01" * 8, root_id),
        _span("request_process", 2, 3, "02" * 8, root_id),
        _span("prefill_waiting", 3, 10, "03" * 8, root_id),
        _span("prefill_forward", 10, 28, "04" * 8, root_id),
        _span("decode_loop", 28, 98, "05" * 8, root_id),
        _span("decode_forward", 30, 31, "06" * 8, "05" * 8),
    ]
    st = map_request(spans, CLIENT)
    assert st is not None and st.schema == "sglang"
    assert _layout(st) == [
        ("preprocess", 0, 3 * MS),
        ("server_queue", 3 * MS, 10 * MS),
        ("prefill", 10 * MS, 28 * MS),
        ("decode", 28 * MS, 98 * MS),
    ]
    assert st.first_token_ns == T0 + 30 * MS and st.done_ns == T0 + 98 * MS


def test_tgi_debug_durations_and_linked_batch_prefill() -> None:
    parse = parse_duration
    assert (parse("12.3ms"), parse("450µs"), parse("1.5s"), parse("7ns")) == (
        12_300_000,
        450_000,
        1_500_000_000,
        7,
    )
    assert parse("12 parsecs") is None and parse(12) is None
    root_id = "0b" * 8
    root = _span(
        "generate_stream",
        0,
        120,
        root_id,
        validation_time="1.5ms",
        queue_time="10ms",
        inference_time="100ms",
        time_per_token="5ms",
    )
    infer = ServerSpan(
        TRACE,
        "0c" * 8,
        root_id,
        "infer",
        T0 + 12 * MS,
        T0 + 111 * MS,
        links=(("ee" * 16, "0d" * 8),),
    )
    batch = ServerSpan("ee" * 16, "0d" * 8, None, "prefill", T0 + 11 * MS, T0 + 30 * MS)
    store = SpanStore()
    store.add([root, infer, batch])
    st = map_request(store.trace(TRACE), CLIENT, lookup=store.span)
    assert st is not None and st.schema == "tgi"
    assert _layout(st) == [
        ("preprocess", 0, 1_500_000),
        ("server_queue", 1_500_000, 11_500_000),
        ("prefill", 11_500_000, 30 * MS),
        ("decode", 30 * MS, 111_500_000),
    ]
    alone = map_request([root], CLIENT)  # no batch spans: prefill and decode not separable
    assert alone is not None and [s.name for s in alone.stages][-1] == "inference"


def test_genai_semconv_and_generic_names() -> None:
    chat = _span(
        "chat m",
        0,
        50,
        "0e" * 8,
        **{"gen_ai.operation.name": "chat", "gen_ai.server.time_to_first_token": 0.020},
    )
    st = map_request([chat], CLIENT)
    assert st is not None and st.schema == "genai"
    assert _layout(st) == [("prefill", 0, 20 * MS), ("decode", 20 * MS, 50 * MS)]
    root_id = "0f" * 8
    spans = [
        _span("handler", 0, 40, root_id),
        _span("wait_gpu", 1, 9, "10" * 8, root_id),
        _span("forward", 9, 39, "11" * 8, root_id),
    ]
    assert map_request(spans, CLIENT) is None  # nothing known by name
    st = map_request(spans, CLIENT, names={"wait_gpu": "server_queue", "forward": "prefill"})
    assert st is not None and _layout(st) == [
        ("server_queue", 1 * MS, 9 * MS),
        ("prefill", 9 * MS, 39 * MS),
    ]
    with pytest.raises(UsageError):
        map_request(spans, CLIENT, schema="nope")


def test_spans_of_other_requests_in_the_same_trace_are_left_out() -> None:
    mine = _span(
        "llm_request",
        0,
        10,
        "12" * 8,
        **{"gen_ai.latency.time_to_first_token": 0.005, "gen_ai.latency.e2e": 0.010},
    )
    other = _span(
        "llm_request",
        0,
        90,
        "13" * 8,
        parent="99" * 8,
        **{"gen_ai.latency.time_to_first_token": 0.05, "gen_ai.latency.e2e": 0.09},
    )
    st = map_request([other, mine], CLIENT)
    assert st is not None and st.span_id == "12" * 8


def test_server_timing_parsing_follows_w3c() -> None:
    value = 'miss, db;dur=53, app;dur=47.2;desc="a, b \\"c\\"", bad;;x, cache;desc=hit;dur=0.1'
    got = [(m.name, m.dur_ms, m.desc) for m in parse_server_timing(value)]
    assert got == [
        ("miss", None, None),
        ("db", 53.0, None),
        ("app", 47.2, 'a, b "c"'),
        ("cache", 0.1, "hit"),
    ]
    assert parse_server_timing(["a;dur=1", "b;dur=2;dur=3"])[1].dur_ms == 2.0  # first wins
    assert parse_server_timing("") == [] and parse_server_timing(",,;") == []
    st = server_timing_stages("queue;dur=15, prefill;dur=40, total;dur=60")
    assert st is not None and not st.timed
    assert [(s.name, s.duration_ns) for s in st.stages] == [
        ("server_queue", 15 * MS),
        ("prefill", 40 * MS),
    ]
    assert st.attributes["server_timing.total_ms"] == 60.0


def test_tgi_headers_are_integer_milliseconds() -> None:
    st = tgi_header_stages(
        {
            "X-Validation-Time": "2",
            "x-queue-time": "15",
            "x-inference-time": "130",
            "x-time-per-token": "5",
            "x-other": "1",
        }
    )
    assert st is not None
    assert [(s.name, s.duration_ns) for s in st.stages] == [
        ("preprocess", 2 * MS),
        ("server_queue", 15 * MS),
        ("inference", 130 * MS),
    ]
    assert st.attributes == {"x-time-per-token": 5}
    assert tgi_header_stages({"x-queue-time": "abc"}) is None


def test_inject_new_trace_keeps_a_callers_parent_and_replaces_garbage() -> None:
    headers: dict[str, str] = {}
    ctx = inject(headers)
    assert headers["traceparent"] == ctx.traceparent == f"00-{ctx.trace_id}-{ctx.span_id}-01"
    assert len(ctx.trace_id) == 32 and len(ctx.span_id) == 16 and ctx.parent_span_id is None
    assert inject({}).trace_id != ctx.trace_id
    caller = {"TraceParent": f"00-{'1' * 32}-{'2' * 16}-00", "tracestate": "k=v"}
    ctx = inject(caller)
    assert (ctx.trace_id, ctx.parent_span_id, ctx.sampled) == ("1" * 32, "2" * 16, False)
    assert ctx.span_id != "2" * 16 and caller["traceparent"] == ctx.traceparent
    assert caller["tracestate"] == "k=v" and "TraceParent" not in caller
    garbage = {"traceparent": "00-zz-yy-01"}
    ctx = inject(garbage)
    assert ctx.parent_span_id is None and garbage["traceparent"] == ctx.traceparent
