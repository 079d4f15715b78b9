"""The hot path's shortcuts give what the checked, general constructions give.

The Recorder builds spans and waterfalls without ``Span.__post_init__`` / ``Waterfall()``,
traceparent is formatted without OpenTelemetry's context objects, the OpenAI parser reads SSE
data strings without ``SSEEvent`` objects, a redacted URL is reused until a new secret is
remembered. Each test compares the shortcut with the general path on the same input.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path

import pytest
from aiohttp.helpers import HeadersMixin
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from latency_analyzer._redact import forget_all, redact_url, remember
from latency_analyzer.capture import _consume
from latency_analyzer.capture._consume import note_server_headers, notes_any
from latency_analyzer.capture._state import RequestState
from latency_analyzer.capture._transport import _content_type
from latency_analyzer.capture._wire import WireStamps
from latency_analyzer.capture.connector import TimedProtocol
from latency_analyzer.capture.openai import ChunkReceived, OpenAIStreamParser
from latency_analyzer.capture.propagation import inject
from latency_analyzer.capture.sse import SSEParser
from latency_analyzer.errors import UsageError
from latency_analyzer.timeline import Recorder, Span, Waterfall
from latency_analyzer.timeline._build import prechecked_waterfall

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "real-servers"


def _recorded() -> Waterfall:
    rec = Recorder("POST", "http://h/v1/chat/completions", start_ns=1_000, intended_start_ns=900)
    rec.begin("pool_wait", 1_000)
    rec.end("pool_wait", 1_100)
    rec.begin("send", 1_200)
    rec.end("send", 1_900, backlog_at_headers=False)  # after the headers: clipped to them
    rec.response_headers(1_800, 200)
    for i, t in enumerate((2_000, 2_100, 2_400)):
        rec.chunk(t, weight=3, reasoning=i == 0)
    rec.usage(7, 3)
    rec.read(1_790, 1_800)
    rec.attributes["trace_id"] = "ab" * 16
    return rec.finish(2_500)


def _rebuilt(span: Span) -> Span:
    """The same span through the checked constructor, children too."""
    kids = tuple(_rebuilt(c) for c in span.children)
    return Span(span.name, span.start_ns, span.end_ns, span.source, dict(span.attributes), kids)


def test_recorder_waterfall_equals_the_checked_construction() -> None:
    wf = _recorded()
    root = _rebuilt(wf.root)
    assert wf.root == root
    assert all(
        type(s.attributes) is type(r.attributes)
        for s, r in zip(wf.root.walk(), root.walk(), strict=True)
    )
    values = {f.name: getattr(wf, f.name) for f in dataclasses.fields(Waterfall)}
    values["attributes"] = dict(wf.attributes)
    checked = Waterfall(**values)
    assert wf == checked and wf.attributes == checked.attributes
    assert sum(wf.attribution_ns().values()) == wf.e2e_ns
    assert wf.stage("send") is not None and wf.stage("send").end_ns == 1_800  # clipped
    assert wf.first_reasoning_ns == 2_000 and wf.first_answer_ns == 2_100
    with pytest.raises(TypeError, match="missing fields: method, url"):
        prechecked_waterfall({"root": root})
    with pytest.raises(TypeError, match="not its fields: nope"):
        prechecked_waterfall({"root": root, "method": "GET", "url": "u", "nope": 1})


def test_recorder_still_refuses_a_stage_that_ends_before_it_starts() -> None:
    rec = Recorder("GET", "http://h/", start_ns=0)
    with pytest.raises(UsageError, match="ends before it starts"):
        rec.add("send", 10, 5)
    rec = Recorder("GET", "http://h/", start_ns=0)
    rec.add("send", 1, 2)
    rec.response_headers(10)
    rec.chunk(8, 1)  # a chunk stamped before its headers: first_token would run backwards
    with pytest.raises(UsageError, match="'first_token' ends before it starts"):
        rec.finish(20)


def test_recorder_attributes_after_finish_do_not_leak_into_the_waterfall() -> None:
    rec = Recorder("GET", "http://h/", start_ns=0)
    rec.attributes["a"] = 1
    wf = rec.finish(5)
    rec.attributes["b"] = 2
    assert dict(wf.attributes) == {"a": 1}


def test_traceparent_of_a_new_trace_reads_back_through_opentelemetry() -> None:
    random.seed(17)
    headers: dict[str, str] = {"accept": "*/*"}
    ctx = inject(headers)
    assert set(headers) == {"accept", "traceparent"}  # no tracestate for a new trace
    assert headers["traceparent"] == ctx.traceparent
    parsed = trace.get_current_span(
        TraceContextTextMapPropagator().extract(headers)
    ).get_span_context()
    assert parsed.is_valid and parsed.trace_flags.sampled
    assert (f"{parsed.trace_id:032x}", f"{parsed.span_id:016x}") == (ctx.trace_id, ctx.span_id)
    assert ctx.parent_span_id is None and ctx.sampled
    # a caller's own context is still the parent (trace id, flags and tracestate kept)
    caller = {"TraceParent": f"00-{ctx.trace_id}-{ctx.span_id}-00", "tracestate": "k=v"}
    child = inject(caller)
    assert (child.trace_id, child.parent_span_id, child.sampled) == (
        ctx.trace_id,
        ctx.span_id,
        False,
    )
    assert caller["tracestate"] == "k=v" and child.span_id != ctx.span_id


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 4000), max_size=12), st.sampled_from(sorted(FIXTURES.glob("*.sse"))))
def test_sse_data_shortcut_matches_the_events(points: list[int], fixture: Path) -> None:
    raw = fixture.read_bytes()
    cuts = sorted({min(p, len(raw)) for p in points})
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    events, datas = SSEParser(), SSEParser()
    assert [e.data for p in pieces for e in events.feed(p, 0)] == [
        d for p in pieces for d in datas.feed_data(p)
    ]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 400), max_size=40),
    st.lists(st.integers(0, 4000), max_size=3),
    st.sampled_from(sorted(FIXTURES.glob("*.sse"))),
)
def test_sse_raw_data_of_whole_events_matches_the_events(
    events_at: list[int], points: list[int], fixture: Path
) -> None:
    """Reads of one or more whole events (the raw shortcut), mixed with reads cut anywhere."""
    raw = fixture.read_bytes()
    ends = [i + 2 for i in range(len(raw)) if raw.startswith(b"\n\n", i)]
    cuts = sorted({ends[i % len(ends)] for i in events_at} | {min(p, len(raw)) for p in points})
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    events, datas = SSEParser(), SSEParser()
    assert [e.data for p in pieces for e in events.feed(p, 0)] == [
        d if isinstance(d, str) else d.decode("utf-8", "replace")
        for p in pieces
        for d in datas.feed_raw(p)
    ]


def test_openai_chunks_built_directly_equal_the_dataclass() -> None:
    parser = OpenAIStreamParser()
    body = b'data: {"choices":[{"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
    (event,) = parser.feed(body, 5)
    assert event == ChunkReceived(5, "hi", "", None, None, False)
    assert hash(event) == hash(ChunkReceived(5, "hi", "", None, None, False))
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.content = "x"  # type: ignore[misc]  # frozen: the point of the check


def test_redacted_url_is_reused_only_until_a_secret_is_remembered() -> None:
    forget_all()
    url = "http://h/v1/s3cr3t-path-token-value/chat?x=1"
    assert redact_url(url) == url
    remember(["s3cr3t-path-token-value"])
    assert "s3cr3t" not in redact_url(url)
    forget_all()
    assert redact_url(url) == url


class _Headers(HeadersMixin):
    def __init__(self, headers: CIMultiDictProxy[str]) -> None:
        self._headers = headers


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "text/event-stream",
        "text/event-stream; charset=utf-8",
        "Application/JSON",
        "application/json;charset=UTF-8",
        "",
        "garbage",
        "text/plain; q",
    ],
)
def test_content_type_shortcut_matches_the_response_property(raw: str | None) -> None:
    headers = CIMultiDict[str]() if raw is None else CIMultiDict({"Content-Type": raw})
    proxy = CIMultiDictProxy(headers)
    assert _content_type(proxy) == _Headers(proxy).content_type


@pytest.mark.parametrize(
    "names",
    [
        ("Content-Type", "Content-Length", "Date", "Server"),
        ("content-type", "Server-Timing"),
        ("SERVER-TIMING",),
        ("Location", "Date"),
        ("x-Queue-Time",),
        ("X-Prompt-Tokens", "x-generated-tokens"),
        ("Server-Timings", "Locations", "x-queue"),
        (),
    ],
)
@pytest.mark.parametrize("caseless_set_ops", [True, False])
def test_header_prefilter_says_what_the_per_header_loop_notes(
    names: tuple[str, ...], caseless_set_ops: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both ways of asking: the keys view's set test, and (for a multidict older than 6.3
    without its C extension, whose view compares names as written) one test per name."""
    monkeypatch.setattr(_consume, "_CASELESS_SET_OPS", caseless_set_ops)
    headers = CIMultiDictProxy(CIMultiDict([(name, "1") for name in names]))
    state = RequestState(Recorder("GET", "http://h/", start_ns=0))
    note_server_headers(state, headers.items())
    noted = bool(state.recorder.attributes) or state.location is not None
    assert notes_any(headers) is noted


async def test_a_parser_resume_is_not_counted_as_a_read() -> None:
    """aiohttp calls ``data_received(b"")`` after the reader takes each chunk: not a read."""
    proto = TimedProtocol(asyncio.get_running_loop())
    rec = Recorder("GET", "http://h/", start_ns=0)
    proto.wire = WireStamps()
    proto.wire.read_kernel_ns, proto.wire.read_user_ns, proto.wire.read_stamped = 5, 7, True
    proto.state = RequestState(rec)
    proto.data_received(b"")
    proto.data_received(b"")
    assert rec.finish(10).reads == 0
