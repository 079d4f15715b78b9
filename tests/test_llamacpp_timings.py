"""llama.cpp server's ``timings``: read from the stream, mapped to ``prefill`` / ``decode``
durations and placed in the client's bracket (no clock offset to estimate).

Ground truth is the test bed's log: with ``timings=True`` it closes a stream as llama.cpp's
server does, its ``prompt_ms`` / ``predicted_ms`` taken from its own write stamps
(``RequestRecord.chunk_ns``, ``perf_counter_ns``: one clock for both processes).
"""

from __future__ import annotations

import json
from pathlib import Path

from conftest import assert_exact

import latency_analyzer as la
from latency_analyzer.capture.openai import ChunkReceived, OpenAIStreamParser, TimingsReceived
from latency_analyzer.merge import MERGED, NO_OFFSET_FITS, PLACED_BY_CLIENT, merge_timings
from latency_analyzer.metrics import LLAMACPP, MetricSeries, parse, resolve
from latency_analyzer.server.llamacpp import SCHEMA, timings_stages
from latency_analyzer.testing import LLMServer
from latency_analyzer.timeline import ClockAnchor, Recorder

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "real-servers"
MS = 1_000_000
BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def _closing(timings: object) -> bytes:
    chunk = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "timings": timings}
    return f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()


def test_the_timings_object_is_read_and_only_its_numbers_kept() -> None:
    timings = {
        "cache_n": 3,
        "prompt_n": 12,
        "prompt_ms": 30.5,
        "predicted_n": 8,
        "predicted_ms": 70.25,
        "predicted_per_second": 113.9,
        "flag": True,  # not a number
        "note": "x",  # not a number
        "unknown_ms": 5.0,  # not a llama.cpp field
    }
    events = OpenAIStreamParser().feed(_closing(timings), 7)
    got = [e for e in events if isinstance(e, TimingsReceived)]
    assert got == [
        TimingsReceived(
            7,
            {
                "cache_n": 3.0,
                "prompt_n": 12.0,
                "prompt_ms": 30.5,
                "predicted_n": 8.0,
                "predicted_ms": 70.25,
                "predicted_per_second": 113.9,
            },
        )
    ]
    assert not [
        e for e in OpenAIStreamParser().feed(_closing("30ms"), 7) if type(e) is TimingsReceived
    ]
    st = timings_stages(got[0].values)
    assert st is not None and st.schema == SCHEMA and not st.timed and st.token_anchored
    assert [(s.name, s.start_ns, s.end_ns) for s in st.stages] == [
        ("prefill", 0, 30_500_000),
        ("decode", 30_500_000, 100_750_000),
    ]
    assert dict(st.attributes) == {
        "llamacpp.prompt_n": 12,
        "llamacpp.predicted_n": 8,
        "llamacpp.cache_n": 3,
    }
    assert timings_stages({"prompt_ms": 1.0}) is None
    assert timings_stages({"prompt_ms": -1.0, "predicted_ms": 2.0}) is None


async def test_timings_from_the_test_bed_land_around_the_servers_first_token() -> None:
    server = LLMServer(queue=0.010, prefill=0.030, decode=0.005, tokens=10, timings=True)
    with server.run_in_subprocess() as llm:
        async with la.Client(llm.url) as client:
            wfs = [
                (await client.request("/v1/chat/completions", json=BODY)).raise_for_error()
                for _ in range(3)
            ]
        records = llm.records
    for wf, rec in zip(wfs, records, strict=True):
        assert wf.attributes["timings.predicted_n"] == 10.0
        merged = merge_timings(wf)
        a = merged.attributes
        assert a["server.status"] == MERGED and a["server.schema"] == SCHEMA
        assert a["server.placement"] == PLACED_BY_CLIENT
        assert_exact(merged)
        prompt = round(float(a["timings.prompt_ms"]) * 1e6)  # type: ignore[arg-type]  # attribute values are a union
        predicted = round(float(a["timings.predicted_ms"]) * 1e6)  # type: ignore[arg-type]  # attribute values are a union
        # the server's own durations, from its log, are what was merged
        assert predicted == rec.chunk_ns[-1] - rec.chunk_ns[0]
        assert prompt >= 30 * MS  # the first token is written no earlier than its deadline
        att = merged.attribution_ns()
        assert att["prefill"] + att["decode"] == prompt + predicted  # all placed
        # the true first-token instant lies within the placement's uncertainty
        server = {s.name: s for c in merged.root.children for s in c.children}
        prefill_end = max(s.end_ns for s in server.values() if s.name == "prefill")
        unc = a["server.placement_uncertainty_ns"]
        assert isinstance(unc, int)
        assert abs(prefill_end - rec.chunk_ns[0]) <= unc
        # and the sum fits within the client's interval
        send = wf.stage("send")
        assert send is not None and prompt + predicted <= wf.end_ns - send.start_ns


def test_durations_longer_than_the_client_saw_are_not_placed() -> None:
    rec = Recorder("POST", "http://x/v1/chat/completions", start_ns=0)
    rec.add("send", 1 * MS, 2 * MS)
    rec.response_headers(5 * MS, 200)
    for i in range(4):
        rec.chunk(40 * MS + i * 10 * MS, 4)
    rec.attributes.update({"timings.prompt_ms": 60.0, "timings.predicted_ms": 30.0})
    wf = rec.finish(80 * MS)
    merged = merge_timings(wf)
    assert merged.attributes["server.status"] == NO_OFFSET_FITS
    assert merged.root == wf.root
    assert "do not fit" in str(merged.attributes["server.reason"])
    # without timings: no server data, not zero
    rec = Recorder("POST", "http://x/v1/chat/completions", start_ns=0)
    rec.add("send", 1 * MS, 2 * MS)
    assert merge_timings(rec.finish(9 * MS)).attributes["server.status"] == "no server data"


def test_a_real_llama_server_stream_gives_its_timings_as_prefill_and_decode() -> None:
    raw = (FIXTURES / "llama-server-11434-chat-stream.sse").read_bytes()
    events = OpenAIStreamParser().feed(raw, 0)
    chunks = [e for e in events if isinstance(e, ChunkReceived)]
    tokens = [e for e in chunks if e.carries_token or e.empty_token]
    timings = [e for e in events if isinstance(e, TimingsReceived)]
    assert len(timings) == 1 and timings[0].values["predicted_n"] == len(tokens) == 12
    assert not chunks[0].carries_token  # the role chunk ({"content": null})
    assert not chunks[-1].carries_token and chunks[-1].finish_reason == "length"
    st = timings_stages(timings[0].values)
    assert st is not None
    assert [(s.name, s.duration_ns) for s in st.stages] == [
        ("prefill", 9_557_000),
        ("decode", 13_089_000),
    ]
    assert st.attributes["llamacpp.prompt_n"] == 52
    # the recorded timings in a client bracket that holds them: send 1 ms, first token chunk
    # at 12 ms, last at 24 ms, end 25 ms. The first token lies in [1 + 9.557, 25 − 13.089]
    # = [10.557, 11.911] ms: placed at its middle, ± half of it
    rec = Recorder("POST", "http://127.0.0.1/v1/chat/completions", start_ns=0)
    rec.add("send", 1 * MS, 1 * MS + 50_000)
    rec.response_headers(2 * MS, 200)
    for i in range(12):
        rec.chunk(12 * MS + i * MS, 1)
    rec.attributes.update({f"timings.{k}": v for k, v in timings[0].values.items()})
    merged = merge_timings(rec.finish(25 * MS))
    a = merged.attributes
    assert a["server.status"] == MERGED and a["server.placement"] == PLACED_BY_CLIENT
    assert a["server.placement_uncertainty_ns"] == 11_911_000 - (10_557_000 + 677_000)
    pieces = [s for c in merged.root.children for s in c.children if s.name == "prefill"]
    assert max(s.end_ns for s in pieces) == 10_557_000 + 677_000  # split at the headers
    assert merged.attribution_ns()["prefill"] == 9_557_000
    assert merged.attribution_ns()["decode"] == 13_089_000
    assert_exact(merged)


def test_the_llamacpp_preset_names_all_exist_in_the_recorded_metrics() -> None:
    anchor = ClockAnchor(perf_ns=0, epoch_ns=1_700_000_000_000_000_000, uncertainty_ns=0)
    ms = MetricSeries(anchor=anchor)
    ms.add_target("llama", "http://x/metrics", 1.0)
    samples = parse((FIXTURES / "llama-server-11434-metrics.prom").read_text())
    ms.add_scrape("llama", 0, 10 * MS, samples)
    ms.add_scrape("llama", 1_000 * MS, 1_010 * MS, samples)
    got = resolve(ms, "llamacpp")
    assert set(got) == {m.key for m in LLAMACPP}
    assert got["llamacpp_running"].values.tolist() == [0.0, 0.0]
