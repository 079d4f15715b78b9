"""Two first tokens: TTFT (first visible text) and TTFC (first token chunk, empty text included).

Ground truth is the test bed's own log: ``RequestRecord.chunk_ns`` stamps each token chunk just
before its write, on ``perf_counter_ns`` (CLOCK_MONOTONIC, one clock for both processes). The
server sends 2 empty-text tokens first and 1 last, then 5 visible ones between, 10 ms apart:
a client stamp belongs to the chunk whose write precedes it by less than the 10 ms spacing.
That window is the tolerance throughout: each stamp is the kernel's arrival of the read that
brought the chunk, which follows its write by loopback latency, so which chunk each instant
names stays exact as long as each chunk has a read of its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import assert_exact

import latency_analyzer as la
from latency_analyzer.analysis import WaterfallSet
from latency_analyzer.capture.openai import ChunkReceived, OpenAIStreamParser
from latency_analyzer.diagnose import diagnose, diagnose_set
from latency_analyzer.merge import MERGED, amerge
from latency_analyzer.server import OTLPHttpReceiver, SpanStore
from latency_analyzer.testing import LLMServer
from latency_analyzer.timeline import Recorder

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "real-servers"
MS = 1_000_000
DECODE = 0.010
BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def _events(name: str) -> list[ChunkReceived]:
    parser = OpenAIStreamParser()
    events = parser.feed((FIXTURES / name).read_bytes(), 0)
    return [e for e in events if isinstance(e, ChunkReceived)]


def test_real_vllm_streams_empty_text_tokens_and_a_role_chunk_that_is_none() -> None:
    chat = _events("vllm-0.32-chat-stream-usage.sse")
    # the role chunk ({"role": "assistant", "content": ""}) is neither kind of token
    assert not chat[0].carries_token and not chat[0].empty_token
    tokens = [e for e in chat if e.carries_token or e.empty_token]
    assert len(tokens) == 16  # usage.completion_tokens of that response
    assert sum(e.empty_token for e in tokens) == 7
    completions = _events("vllm-0.32-completions-stream.sse")
    assert len(completions) == 12  # max_tokens 12, no role chunk
    assert [e.empty_token for e in completions][:2] == [True, True]  # the first two are empty
    assert completions[-1].empty_token and completions[-1].finish_reason == "length"
    # llama-cpp-python's closing chunk (empty delta, finish_reason) carries no token
    llama = _events("llama-cpp-python-0.3.36-chat-stream.sse")
    assert not llama[-1].carries_token and not llama[-1].empty_token


@pytest.mark.usefixtures("realtime")
async def test_ttfc_and_ttft_against_the_servers_log() -> None:
    """Which chunk each instant names. A client a busy host wakes late reads two chunks in one
    read, whose kernel stamp is the newer one's (tests/test_wire_capture.py is about that
    precision); this test is about the naming, so its client runs at real-time priority."""
    server = LLMServer(prefill=0.030, decode=DECODE, tokens=8, empty_tokens=2, empty_last_tokens=1)
    with server.run_in_subprocess() as llm:
        async with la.Client(llm.url) as client:
            wfs = [
                (await client.request("/v1/chat/completions", json=BODY)).raise_for_error()
                for _ in range(3)
            ]
        records = llm.records
    assert len(records) == 3
    spacing = round(DECODE * 1e9)
    for wf, rec in zip(wfs, records, strict=True):
        assert len(rec.chunk_ns) == 8
        # each client instant follows its own chunk's write and precedes the next one
        for client_ns, index in (
            (wf.first_token_chunk_ns, 0),
            (wf.first_token_ns, 2),
            (wf.last_token_ns, 6),
            (wf.last_token_chunk_ns, 7),
        ):
            assert client_ns is not None
            assert 0 <= client_ns - rec.chunk_ns[index] < spacing, index
        assert wf.first_chunk_ns == wf.first_token_chunk_ns
        assert len(wf.chunk_times_ns) == 5  # the visible chunks only, as before
        truth = rec.chunk_ns[2] - rec.chunk_ns[0]  # two decode steps
        assert wf.ttft_ns is not None and wf.ttfc_ns is not None
        assert abs((wf.ttft_ns - wf.ttfc_ns) - truth) < spacing
        assert wf.summary()["ttfc_s"] == wf.ttfc
        back = la.Waterfall.from_dict(wf.to_dict())
        assert (back.first_chunk_ns, back.last_chunk_ns) == (wf.first_chunk_ns, wf.last_chunk_ns)
        assert_exact(wf)
    # the diagnosis says so, on one request and on a set
    found = {f.rule: f for f in diagnose(wfs[0])}
    assert "ttfc_gap" in found
    gap = found["ttfc_gap"].data["gap_s"]
    assert abs(gap - 2 * DECODE) < DECODE
    ws = WaterfallSet()
    for wf in wfs:
        ws.add(wf)
    assert ws.column("ttfc_ns").tolist() == [wf.ttfc_ns for wf in wfs]
    assert "ttfc" in ws.metric_names()  # so in ws.summary() and its exports
    assert ws.values("ttfc").tolist() == [wf.ttfc for wf in wfs]
    assert "ttfc_gap" in {f.rule for f in diagnose_set(ws)}


def test_no_empty_tokens_no_second_first_token_and_no_finding() -> None:
    rec = Recorder("POST", "http://x/v1/chat/completions", start_ns=0)
    rec.add("send", 1 * MS, 2 * MS)
    rec.response_headers(10 * MS, 200)
    for i in range(8):
        rec.chunk(50 * MS + i * 10 * MS, 4)
    wf = rec.finish(130 * MS)
    assert wf.first_chunk_ns is None and wf.last_chunk_ns is None
    assert wf.ttfc == wf.ttft and "first_chunk_ns" not in wf.to_dict()
    assert "ttfc_gap" not in {f.rule for f in diagnose(wf)}
    # an empty-text token between visible ones changes neither first token
    rec = Recorder("POST", "http://x/v1/chat/completions", start_ns=0)
    rec.add("send", 1 * MS, 2 * MS)
    rec.response_headers(10 * MS, 200)
    rec.chunk(50 * MS, 4)
    rec.empty_chunk(60 * MS)
    rec.chunk(70 * MS, 4)
    assert rec.finish(80 * MS).first_chunk_ns is None


async def test_a_last_token_with_empty_text_no_longer_contradicts_the_merge() -> None:
    """The shape a real vLLM gave: its last token's text was empty, so the client's last
    *visible* chunk preceded the server's last token and that bound did not fit."""
    store = SpanStore()
    with OTLPHttpReceiver(store).run_in_thread() as receiver:
        server = LLMServer(
            prefill=0.020,
            decode=DECODE,
            tokens=8,
            empty_tokens=1,
            empty_last_tokens=2,
            otlp_endpoint=receiver.endpoint,
        )
        with server.run_in_subprocess() as llm:
            async with la.Client(llm.url) as client:
                wfs = [
                    (await client.request("/v1/chat/completions", json=BODY)).raise_for_error()
                    for _ in range(3)
                ]
            merged = await amerge(wfs, store, grace=5.0)
    for m in merged:
        assert m.attributes["server.status"] == MERGED
        assert "server.contradicted" not in m.attributes
        assert_exact(m)
    # the true offset is 0 (one host, one clock): inside the reported uncertainty
    offset, unc = (
        merged[0].attributes["server.offset_ns"],
        merged[0].attributes["server.offset_uncertainty_ns"],
    )
    assert isinstance(offset, int) and isinstance(unc, int)
    assert abs(offset) <= unc + 20_000  # the two processes' clock anchors, a few µs each
