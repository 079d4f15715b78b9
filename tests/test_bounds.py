"""A server's numbers never size our loops or allocations: token counts are capped at what the
received text can hold (the claim kept as an attribute), and nesting too deep for a parser is
a malformed chunk or an HTTP status error, with and without orjson."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import latency_analyzer as la
from latency_analyzer.capture import openai
from latency_analyzer.testing.hostile_server import HostileServer
from latency_analyzer.timeline import Recorder, distribute_tokens
from latency_analyzer.timeline._tokens import token_cap


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileServer]:
    with HostileServer().run_in_thread() as server:
        yield server


def _orjson_blocked(monkeypatch: pytest.MonkeyPatch) -> Callable[[str | bytes], Any]:
    monkeypatch.setitem(sys.modules, "orjson", None)  # import orjson now raises ImportError
    loads = openai._fastest_loads()
    assert loads is openai._stdlib_loads
    return loads


def _orjson() -> Callable[[str | bytes], Any]:
    orjson = pytest.importorskip("orjson")
    loads: Callable[[str | bytes], Any] = orjson.loads
    return loads


@pytest.fixture(params=["json", "orjson"])
def loads(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test once with each JSON decoder the parser may use."""
    chosen = _orjson_blocked(monkeypatch) if request.param == "json" else _orjson()
    monkeypatch.setattr(openai, "_loads", chosen)
    return str(request.param)


def test_a_claim_of_twenty_million_tokens_in_two_chunks_is_capped(
    hostile: HostileServer, loads: str
) -> None:
    wf = la.probe(f"{hostile.url}/claims?completion=20000000&prompt=7")
    assert wf.ok, wf.error
    cap = 2 * token_cap(len("tok0 "))
    assert wf.output_tokens == cap
    assert sum(wf.chunk_tokens) == cap and len(wf.itl) == cap - 1
    assert wf.attributes["usage_output_tokens_claimed"] == 20_000_000
    assert wf.input_tokens == 7
    assert len(json.dumps(wf.summary())) < 5_000  # probe --json prints this object


def test_a_claim_beyond_any_integer_type_ends_without_orjson(
    hostile: HostileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(openai, "_loads", _orjson_blocked(monkeypatch))
    done: list[la.Waterfall] = []
    url = f"{hostile.url}/claims?completion={10**25}&prompt={10**25}"
    worker = threading.Thread(target=lambda: done.append(la.probe(url, timeout=5)), daemon=True)
    worker.start()
    worker.join(10)  # today's float split loops forever on this count
    assert done, "the request did not end"
    wf = done[0]
    assert wf.output_tokens == 2 * token_cap(len("tok0 "))
    assert wf.attributes["usage_output_tokens_claimed"] == str(10**25)
    assert wf.input_tokens == 2**31 - 1
    assert wf.attributes["usage_input_tokens_claimed"] == str(10**25)


def test_the_recorder_caps_continuous_usage_per_chunk() -> None:
    rec = Recorder("GET", "http://h/", start_ns=0)
    rec.add("send", 0, 1)
    rec.response_headers(2)
    rec.chunk(3, weight=2, tokens=1)
    rec.chunk(4, weight=2, tokens=10**12)
    wf = rec.finish(5)
    assert wf.chunk_tokens == (1, token_cap(2))
    assert wf.attributes["usage_output_tokens_claimed"] == 1 + 10**12


def test_the_split_of_a_huge_count_is_exact_integer_arithmetic() -> None:
    counts = distribute_tokens(10**25, [5, 15])
    assert counts == [10**25 // 4, 3 * 10**25 // 4]


def test_deeply_nested_chunk_is_a_malformed_chunk(loads: str) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    parser = openai.OpenAIStreamParser()
    events = parser.feed(f"data: {deep}\n\ndata: [DONE]\n\n".encode(), 7)
    assert [type(e).__name__ for e in events] == ["MalformedChunk", "StreamDone"]
    assert events[0].time_ns == 7


def test_deeply_nested_stream_chunk_end_to_end(hostile: HostileServer, loads: str) -> None:
    wf = la.probe(f"{hostile.url}/nested-sse?depth=100000")
    assert wf.error_type == "malformed_chunk", (wf.error_type, wf.error)
    assert wf.output_tokens == 1  # the token before the bad chunk is kept


def test_deeply_nested_error_body_is_an_http_status_error(hostile: HostileServer) -> None:
    wf = la.probe(f"{hostile.url}/nested/500?depth=100000")
    assert wf.error_type == "http_status", (wf.error_type, wf.error)
    assert wf.status == 500
    assert wf.error is not None and wf.error.startswith("HTTP 500: [[[[")
