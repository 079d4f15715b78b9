"""llama.cpp server's ``timings``: read from the stream, mapped to ``prefill`` / ``decode``
durations and placed in the client's bracket (no clock offset to estimate).

Ground truth is the test bed's log: with ``timings=True`` it closes a stream as llama.cpp's
server does, its ``prompt_ms`` / ``predicted_ms`` taken from its own write stamps
(``RequestRecord.chunk_ns``, ``perf_counter_ns``: one clock for both processes).
"""

from __future__ import annotations

import json

from conftest import assert_exact

import latency_analyzer as la
from latency_analyzer.capture.openai import OpenAIStreamParser, TimingsReceived
from latency_analyzer.merge import MERGED, NO_OFFSET_FITS, PLACED_BY_CLIENT, merge_timings
from latency_analyzer.server.llamacpp import SCHEMA, timings_stages
from latency_analyzer.testing import LLMServer
from latency_analyzer.timeline import Recorder

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
        prompt = round(float(a["timings.prompt_ms"]) * 1e6)  # type: ignore[arg-type]
        predicted = round(float(a["timings.predicted_ms"]) * 1e6)  # type: ignore[arg-type]
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
