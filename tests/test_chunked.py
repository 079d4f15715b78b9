"""Chunked bodies decoded in the protocol (``capture._chunked``): the same body, tokens and
times as aiohttp's parser gives, however the reads cut the framing; broken framing fails the
request with what came, and the connection is not reused."""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import random
import socket
from collections.abc import Sequence

import pytest
from conftest import assert_exact
from hypothesis import given, settings
from hypothesis import strategies as st

import latency_analyzer as la
from latency_analyzer.capture._chunked import MAX_SIZE_LINE, ChunkedBody, ChunkedBodyError


def _framed(chunks: Sequence[bytes], *, ext: bytes = b"", upper: bool = False) -> bytes:
    size = b"%X" if upper else b"%x"
    return b"".join(size % len(c) + ext + b"\r\n" + c + b"\r\n" for c in chunks)


def _decode(wire: bytes, cuts: Sequence[int]) -> tuple[bytes, bytes | None]:
    """``wire`` fed in the pieces ``cuts`` make: the body, and what the decoder gave back
    from the last chunk on (the pieces after it appended, as the parser would get them)."""
    bounds = [0, *sorted(set(cuts)), len(wire)]
    decoder, body, end = ChunkedBody(), b"", None
    for a, b in itertools.pairwise(bounds):
        piece = wire[a:b]
        if end is not None:
            end += piece
            continue
        got, end = decoder.feed(piece)
        body += got
    assert decoder.received == len(body)
    return body, end


@settings(max_examples=300, deadline=None)
@given(
    chunks=st.lists(st.binary(min_size=1, max_size=40), max_size=6),
    cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=12),
    ext=st.sampled_from([b"", b";a=b", b" ;x", b';q="v"']),
    upper=st.booleans(),
)
def test_any_cut_of_the_framing_gives_the_body_and_the_end(
    chunks: list[bytes], cuts: list[int], ext: bytes, upper: bool
) -> None:
    end = b"0\r\nX-Trailer: 1\r\n\r\nNEXT"
    wire = _framed(chunks, ext=ext, upper=upper) + end
    body, rest = _decode(wire, [c for c in cuts if c < len(wire)])
    assert body == b"".join(chunks)
    assert rest == end


@pytest.mark.parametrize(
    ("wire", "why"),
    [
        (b"zz\r\nab\r\n", "bad chunk size line"),
        (b"-1\r\n", "bad chunk size line"),
        (b"0x2\r\nab\r\n", "bad chunk size line"),
        (b"1_0\r\n", "bad chunk size line"),
        (b"\r\n", "bad chunk size line"),
        (b"1" * 17 + b"\r\n", "bad chunk size line"),
        (b"2\r\nabXY", "did not end with CRLF"),
        (b"2\r\nab\rX", "did not end with CRLF"),
        (b"5;a\x00\r\n", "bad chunk size line"),
        (b"5;a\nb\r\n", "bad chunk size line"),
        (b"1" * (MAX_SIZE_LINE + 1), "longer than"),
        (b"1;" + b"e" * MAX_SIZE_LINE + b"\r\n", "longer than"),
    ],
)
def test_broken_framing_is_refused_with_where(wire: bytes, why: str) -> None:
    with pytest.raises(ChunkedBodyError, match=why):
        ChunkedBody().feed(wire)
    decoder = ChunkedBody()
    with pytest.raises(ChunkedBodyError, match=why):  # and however the reads cut it
        for i in range(len(wire)):
            decoder.feed(wire[i : i + 1])


def test_what_aiohttp_accepts_is_accepted_and_a_break_keeps_what_came() -> None:
    # a bare LF after a chunk's data, and leading zeros past sixteen digits
    assert _decode(b"5\r\nhello\n%017x\r\nab\r\n0\r\n\r\n" % 2, []) == (
        b"helloab",
        b"0\r\n\r\n",
    )
    decoder = ChunkedBody()
    with pytest.raises(ChunkedBodyError) as broken:
        decoder.feed(b"5\r\nhello\r\n3\r\nab")  # fine so far
        decoder.feed(b"c\r\n2\r\nxy\r\nzz\r\n")
    assert broken.value.body == b"cxy"  # the read's whole chunks and parts, before the break
    assert decoder.received == 10


def test_a_size_the_server_claims_sizes_nothing() -> None:
    decoder = ChunkedBody()
    body, end = decoder.feed(b"ffffffffffffffff\r\nabc")
    assert body == b"abc" and end is None
    assert decoder.received == 3


# --- against a server that writes the framing in the pieces a test gives ---------------


def _event(text: str) -> bytes:
    chunk = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


TOKENS = ["a", " b", " c", " d", " e"]
EVENTS = [_event(t) for t in TOKENS] + [b"data: [DONE]\n\n"]
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class ScriptServer:
    """Answers each request on a connection with the next script: (bytes, seconds to wait
    after writing them) pieces, each its own segment (TCP_NODELAY and a pause between)."""

    def __init__(self, scripts: list[list[tuple[bytes, float]]]) -> None:
        self.scripts = scripts
        self.connections = 0
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> ScriptServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while self.scripts:
                head = await reader.readuntil(b"\r\n\r\n")
                length = [
                    ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")
                ]
                if length:
                    await reader.readexactly(int(length[0].split(b":")[1]))
                for data, pause in self.scripts.pop(0):
                    writer.write(data)
                    await writer.drain()
                    if pause:
                        await asyncio.sleep(pause)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client went, or the test ended first
        finally:
            writer.close()


def _split(data: bytes, rng: random.Random, pause: float) -> list[tuple[bytes, float]]:
    cuts = sorted(rng.sample(range(1, len(data)), 12))
    bounds = [0, *cuts, len(data)]
    return [(data[a:b], pause) for a, b in itertools.pairwise(bounds)]


BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


async def _ask(client: la.Client) -> la.Waterfall:
    wf = await client.request("/v1/chat/completions", json=BODY, timeout=10)
    assert_exact(wf)
    return wf


async def test_framing_cut_across_reads_gives_the_same_tokens_and_reuses_the_connection() -> None:
    rng = random.Random(20261205)
    whole = [(HEAD + _framed(EVENTS) + b"0\r\n\r\n", 0.0)]
    body = _framed(EVENTS, ext=b";x=1", upper=True) + b"0\r\nX-Checksum: 1\r\n\r\n"
    cut = [(HEAD[:30], 0.003), (HEAD[30:], 0.003), *_split(body, rng, 0.003)]
    async with ScriptServer([whole, cut, whole]) as server, la.Client(server.url) as client:
        first, second, third = [await _ask(client) for _ in range(3)]
    for wf in (first, second, third):
        assert wf.ok, wf.error
        assert wf.output_tokens == len(TOKENS)
    assert second.connection.reused and third.connection.reused
    assert server.connections == 1
    # every token at the read that completed it (held to a packet capture in test_batching)
    assert list(second.chunk_times_ns) == sorted(second.chunk_times_ns)


async def test_headers_and_body_in_one_read_are_marked_and_read() -> None:
    whole = [(HEAD + _framed(EVENTS) + b"0\r\n\r\n", 0.0)]
    async with ScriptServer([whole]) as server, la.Client(server.url) as client:
        wf = await _ask(client)
    assert wf.ok and wf.output_tokens == len(TOKENS)
    assert wf.attributes.get("headers_read_with_body") is True


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (b"zz\r\n", "bad chunk size line"),
        (b"5\r\nabcdeXX", "did not end with CRLF"),
        (b"1" * (MAX_SIZE_LINE + 10), "longer than"),
    ],
)
async def test_broken_framing_mid_stream_keeps_the_tokens_and_the_connection_is_dropped(
    bad: bytes, why: str
) -> None:
    broken = [(HEAD + _framed(EVENTS[:2]), 0.01), (bad, 0.2)]
    whole = [(HEAD + _framed(EVENTS) + b"0\r\n\r\n", 0.0)]
    async with ScriptServer([broken, whole]) as server, la.Client(server.url) as client:
        failed = await _ask(client)
        after = await _ask(client)
    assert failed.error_type == "protocol", failed.error
    assert why in (failed.error or "")
    assert failed.status == 200 and len(failed.chunk_times_ns) == 2
    assert after.ok and not after.connection.reused
    assert server.connections == 2


@pytest.mark.parametrize(
    "end", [b"0\r\nnot a field\r\n\r\n", b"zz\r\n"], ids=["bad-trailer", "bad-size"]
)
async def test_a_break_in_the_read_of_the_last_tokens_keeps_them_and_fails_at_once(
    end: bytes,
) -> None:
    broken = [(HEAD + _framed(EVENTS[:1]), 0.01), (_framed(EVENTS[1:3]) + end, 0.0)]
    async with ScriptServer([broken]) as server, la.Client(server.url) as client:
        wf = await client.request("/v1/chat/completions", json=BODY, timeout=30)
    assert_exact(wf)
    # a bad trailer is aiohttp's parser's to refuse: its pure-Python one fails the body
    # itself (a cut body, "reset"); for its C one, which fails only its queue, we do
    assert wf.error_type == "protocol" or (end.startswith(b"0") and wf.error_type == "reset")
    assert len(wf.chunk_times_ns) == 3  # the two that came with the break too
    assert wf.e2e < 5.0  # failed when it broke, not at the request's timeout (30 s)


async def test_a_cut_connection_mid_chunk_is_a_cut_body() -> None:
    cut = [(HEAD + _framed(EVENTS[:2]) + b"ffffffffffffffff\r\ndata: ", 0.0)]
    async with ScriptServer([cut]) as server, la.Client(server.url) as client:
        wf = await _ask(client)
    assert wf.error_type == "reset", wf.error
    assert len(wf.chunk_times_ns) == 2


async def test_compressed_and_non_streamed_chunked_bodies_read_as_before() -> None:
    raw = b"".join(EVENTS)
    zipped = gzip.compress(raw)
    gz_head = HEAD.replace(b"\r\n\r\n", b"\r\nContent-Encoding: gzip\r\n\r\n")
    gz = [(gz_head + _framed([zipped[:40], zipped[40:]]) + b"0\r\n\r\n", 0.0)]
    completion = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "a b"}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
    }
    doc = json.dumps(completion).encode()
    js_head = HEAD.replace(b"text/event-stream", b"application/json")
    js = [(js_head + _framed([doc[:10]]), 0.005), (_framed([doc[10:]]) + b"0\r\n\r\n", 0.0)]
    async with ScriptServer([gz, js]) as server, la.Client(server.url) as client:
        zipped_wf = await _ask(client)
        plain = await client.request(
            "/v1/chat/completions", json={**BODY, "stream": False}, timeout=10
        )
    assert zipped_wf.ok and zipped_wf.output_tokens == len(TOKENS), zipped_wf.error
    assert plain.ok and plain.output_tokens == 2, plain.error
    assert plain.connection.reused
