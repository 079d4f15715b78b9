"""Closing a Client with requests in flight ends each of them at once: a waterfall with every
stage that happened and ``error_type="closed"``, whatever the request was waiting on (a TLS
handshake, the response headers, a pool slot, its instant). Without it a dial under way ran
on until the request's own timeout and then read as a timeout, and a request waiting for a
slot raised CancelledError into a caller that had cancelled nothing. A cancellation of the
caller's own still propagates.

"At once" is held against the requests' 60 s timeout and the server's 30 s delay: a bound
of seconds, which says the close ended them, not how fast a host runs."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from conftest import assert_exact, chat_body

import latency_analyzer as la
from latency_analyzer.testing import H2LLMServer, SubprocessLLMServer

LLM_KNOBS = {"header_delay": 30.0}
TIMEOUT = 60.0
PROMPT_S = 5.0

needs_cancelling = pytest.mark.skipif(
    sys.version_info < (3, 11),
    reason="Python 3.10 cannot tell a cancelled wait from a cancelled task (no cancelling())",
)


async def _until(check: Callable[[], bool], what: str) -> None:
    give_up = time.monotonic() + 10
    while not check():
        assert time.monotonic() < give_up, f"never saw {what}"
        await asyncio.sleep(0.005)


async def _closed_while(
    client: la.Client, *tasks: asyncio.Task[la.Waterfall]
) -> list[la.Waterfall]:
    began = time.monotonic()
    await client.close()
    wfs = await asyncio.wait_for(asyncio.gather(*tasks), PROMPT_S)
    assert time.monotonic() - began < PROMPT_S
    return list(wfs)


@pytest.fixture
def silent_tls_port() -> Iterator[int]:
    """A port whose kernel completes TCP handshakes and whose owner never speaks."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


@pytest.mark.parametrize("http2", [False, True])
async def test_a_dial_in_its_tls_handshake_ends_closed_at_once(
    silent_tls_port: int, http2: bool
) -> None:
    events: list[str] = []

    def hook(event: str, info: Mapping[str, object]) -> None:
        events.append(event)

    client = la.Client(timeout=TIMEOUT, insecure=True, http2=http2, trace=hook)
    try:
        task = asyncio.create_task(client.request(f"https://127.0.0.1:{silent_tls_port}/"))
        await _until(lambda: "capture.tls.started" in events, "the TLS handshake begin")
        (wf,) = await _closed_while(client, task)
    finally:
        await client.close()
    assert wf.error_type == "closed", wf.error
    assert "during tls" in (wf.error or "")
    assert_exact(wf)
    assert not wf.stages["connect"].attributes.get("interrupted")
    assert wf.stages["tls"].attributes.get("interrupted") is True


async def test_a_request_waiting_for_its_headers_ends_closed_not_disconnected(
    llm: SubprocessLLMServer,
) -> None:
    client = la.Client(llm.url, timeout=TIMEOUT)
    body = {"model": "m", "stream": True, "messages": []}
    before = llm.requests  # the server is the module's: earlier tests' requests count
    try:
        task = asyncio.create_task(client.request("/v1/chat/completions", json=body))
        await _until(lambda: llm.requests == before + 1, "the server receive the request")
        (wf,) = await _closed_while(client, task)
    finally:
        await client.close()
    assert wf.error_type == "closed", wf.error
    assert "during wait" in (wf.error or "")
    assert {"connect", "send", "wait"} <= set(wf.stages)
    assert_exact(wf)


@needs_cancelling
async def test_a_request_waiting_for_a_pool_slot_returns_its_waterfall(
    llm: SubprocessLLMServer,
) -> None:
    client = la.Client(llm.url, timeout=TIMEOUT, limit=1)
    body = {"model": "m", "stream": True, "messages": []}
    before = llm.requests
    try:
        first = asyncio.create_task(client.request("/v1/chat/completions", json=body))
        await _until(lambda: llm.requests == before + 1, "the server receive the first request")
        second = asyncio.create_task(client.request("/v1/chat/completions", json=body))
        await asyncio.sleep(0.05)  # queued behind the first: the only connection is in use
        wfs = await _closed_while(client, first, second)
    finally:
        await client.close()
    assert [wf.error_type for wf in wfs] == ["closed", "closed"], [wf.error for wf in wfs]
    assert "during wait" in (wfs[0].error or "")
    assert "during pool_wait" in (wfs[1].error or "")
    assert wfs[1].stages["pool_wait"].attributes.get("interrupted") is True
    for wf in wfs:
        assert_exact(wf)
    assert llm.requests == before + 1  # the queued one never reached the server


@needs_cancelling
async def test_a_request_held_for_its_instant_ends_closed_and_sends_nothing(
    llm: SubprocessLLMServer,
) -> None:
    client = la.Client(llm.url, timeout=TIMEOUT)
    body = {"model": "m", "stream": True, "messages": []}
    requests, connections = llm.requests, llm.connections
    try:
        due = time.perf_counter_ns() + 30 * 10**9
        task = asyncio.create_task(
            client.request("/v1/chat/completions", json=body, intended_start_ns=due)
        )
        await asyncio.sleep(0.1)
        (wf,) = await _closed_while(client, task)
    finally:
        await client.close()
    assert wf.error_type == "closed", wf.error
    # a new connection dials at its instant: none was opened
    assert (llm.requests, llm.connections) == (requests, connections)


async def test_a_callers_cancellation_during_the_close_still_propagates(
    llm: SubprocessLLMServer,
) -> None:
    client = la.Client(llm.url, timeout=TIMEOUT)
    body = {"model": "m", "stream": True, "messages": []}
    seen: list[la.Waterfall] = []
    before = llm.requests
    try:
        task = asyncio.create_task(
            client.request("/v1/chat/completions", json=body, on_cancel=seen.append)
        )
        await _until(lambda: llm.requests == before + 1, "the server receive the request")
        task.cancel()
        await client.close()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, PROMPT_S)
    finally:
        await client.close()
    assert [wf.error_type for wf in seen] == ["cancelled"]


def _cut_body_server(answer: bytes, requests: list[bytes]) -> Callable[..., Any]:
    """A server that sends ``answer`` (headers and the start of a body) and then says nothing
    until the client goes."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(answer)
        await writer.drain()
        with contextlib.suppress(ConnectionError):
            await reader.read()  # until the client goes
        writer.close()

    return serve


SSE_START = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'2f\r\ndata: {"choices":[{"delta":{"content":"a"}}]}\n\n\r\n'
)
SIZED_START = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhalf"


@pytest.mark.parametrize("answer", [SSE_START, SIZED_START], ids=["sse", "sized"])
async def test_a_body_in_flight_ends_closed_at_once(answer: bytes) -> None:
    """The body's reader is woken by the close (aiohttp forgets a payload as it closes its
    connection, so nothing else would wake it): a stream fed as it arrives and a sized body."""
    requests: list[bytes] = []
    server = await asyncio.start_server(_cut_body_server(answer, requests), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = la.Client(timeout=TIMEOUT)
    text: list[str] = []
    try:
        task = asyncio.create_task(client.request(f"http://127.0.0.1:{port}/", answer=text))
        await _until(lambda: len(requests) == 1, "the server receive the request")
        if answer is SSE_START:
            await _until(lambda: text == ["a"], "the first token")
        else:
            await asyncio.sleep(0.05)  # the headers and 4 of 100 bytes are read
        (wf,) = await _closed_while(client, task)
    finally:
        await client.close()
        server.close()
        await server.wait_closed()
    assert wf.error_type == "closed", wf.error
    assert wf.status == 200 and "wait" in wf.stages
    assert_exact(wf)


async def test_an_http2_stream_in_flight_ends_closed_at_once() -> None:
    async with H2LLMServer(prefill=0.0, decode=30.0, tokens=4) as server:
        client = la.Client(server.url, http2=True, timeout=TIMEOUT)
        text: list[str] = []
        try:
            task = asyncio.create_task(
                client.request("/v1/chat/completions", json=chat_body(), answer=text)
            )
            await _until(lambda: len(text) >= 1, "the first token")
            (wf,) = await _closed_while(client, task)
        finally:
            await client.close()
    assert wf.error_type == "closed", wf.error
    assert wf.status == 200 and "h2_setup" in wf.stages
    assert_exact(wf)


async def test_a_redirect_cut_by_the_close_is_not_followed() -> None:
    """A 302 whose body the close cut short ends there: its waterfall, ``closed``, and no
    next hop on a Client that is gone."""
    requests: list[bytes] = []
    answer = b"HTTP/1.1 302 Found\r\nLocation: /next\r\nContent-Length: 100\r\n\r\nhalf"
    server = await asyncio.start_server(_cut_body_server(answer, requests), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = la.Client(timeout=TIMEOUT, follow_redirects=True)
    try:
        task = asyncio.create_task(client.request(f"http://127.0.0.1:{port}/first"))
        await _until(lambda: len(requests) == 1, "the server receive the request")
        await asyncio.sleep(0.05)  # the headers are read; the body never completes
        (wf,) = await _closed_while(client, task)
    finally:
        await client.close()
        server.close()
        await server.wait_closed()
    assert wf.error_type == "closed", wf.error
    assert wf.status == 302 and "redirects" not in wf.attributes
    assert_exact(wf)
    assert len(requests) == 1
