"""HTTP/2 isolation: one bad stream fails alone; a broken, draining or silent connection leaves
the pool and releases its socket."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
from conftest import assert_exact, chat_body, open_sockets

import latency_analyzer as la
from latency_analyzer.testing import H2LLMServer


@pytest.fixture
def no_leak() -> Iterator[None]:
    """Fails the test if a socket opened during it is still open at its end.

    The servers run in this process too; each test stops its server before it returns.
    """
    before = open_sockets()
    yield
    assert open_sockets() - before == set()


@pytest.fixture
def loop_errors(caplog: pytest.LogCaptureFixture) -> Iterator[list[str]]:
    """asyncio's logged errors ("Fatal error on transport", exceptions in callbacks)."""
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        errors: list[str] = []
        yield errors
        errors += [r.getMessage() for r in caplog.records if r.name == "asyncio"]
        assert errors == []


@pytest.mark.parametrize(
    ("fault", "kind"), [("bad_status", "protocol"), ("nested_500", None)], ids=["2x0", "500["]
)
async def test_a_response_that_breaks_its_parser_fails_only_its_stream(
    fault: str, kind: str | None, no_leak: None, loop_errors: list[str]
) -> None:
    """The bad stream fails with an error; its neighbours on the connection complete."""
    opened: list[str] = []
    neighbours_open = asyncio.Event()

    def on_event(name: str, info: object) -> None:
        if name == "capture.send.started":  # a stream is opened on the connection
            opened.append(name)
            if len(opened) == 3:
                neighbours_open.set()

    async with H2LLMServer(decode=0.004, tokens=8) as server:
        async with la.Client(server.url, http2=True, trace=on_event) as client:
            good = [
                asyncio.ensure_future(client.request("/v1/chat/completions", json=chat_body()))
                for _ in range(3)
            ]
            await neighbours_open.wait()
            bad = await client.request("/v1/chat/completions", json=chat_body(h2_fault=fault))
            neighbours = await asyncio.gather(*good)
            after = await client.request("/v1/chat/completions", json=chat_body())
    for wf in (bad, *neighbours, after):
        assert_exact(wf)
    assert not bad.ok
    if kind is not None:
        assert bad.error_type == kind, bad.error
    assert [wf.error for wf in neighbours] == [None] * 3
    assert all(wf.output_tokens == 8 for wf in neighbours)
    assert after.ok and after.connection.reused  # the connection itself was fine
    assert server.connections == 1


async def test_goaway_connections_close_and_none_outlives_the_client(no_leak: None) -> None:
    """30 requests, each answered and followed by a GOAWAY: every drained connection closes
    once its last stream ends, and close() leaves no socket behind."""
    async with H2LLMServer(tokens=2) as server:
        open_during: list[int] = []
        base = open_sockets()
        async with la.Client(server.url, http2=True) as client:
            for _ in range(30):
                wf = await client.request(
                    "/v1/chat/completions", json=chat_body(h2_fault="goaway", fault_after=0)
                )
                assert_exact(wf)
                assert wf.ok, wf.error
                # drained by the GOAWAY, the connection closes by itself: wait for it
                for conn in list(client._h2._live):
                    await asyncio.wait_for(conn.closed, 1.0)
                open_during.append(len(open_sockets() - base))
        assert server.connections == 30
        # our end and the server's end of the connection in flight: at most one pair open
        assert max(open_during) <= 2, open_during


async def test_a_server_that_never_sends_settings_is_dropped_from_the_pool(
    no_leak: None,
) -> None:
    """The connection waits a bounded time for SETTINGS, then closes; its streams fail with
    ``h2_setup``, and the next request dials again instead of queueing on it."""
    async with H2LLMServer(send_settings=False) as server:
        async with la.Client(server.url, http2=True, timeout=5, h2_settle_timeout=0.2) as client:
            first, second = await asyncio.gather(
                client.request("/v1/chat/completions", json=chat_body()),
                client.request("/v1/chat/completions", json=chat_body()),
            )
            later = await client.request("/v1/chat/completions", json=chat_body())
    for wf in (first, second, later):
        assert_exact(wf)
        assert wf.error_type == "h2_setup", wf.error
        assert "SETTINGS" in (wf.error or "")
        assert 0.2 <= wf.e2e < 1.0  # the settle bound, not the 5 s request timeout
    assert server.connections == 2  # first and second shared a dial; later dialled anew


async def test_a_connection_that_errs_leaves_the_pool(no_leak: None) -> None:
    """A connection closed by the server under a stream is replaced by a new dial."""
    async with H2LLMServer(decode=0.002, tokens=4) as server:
        async with la.Client(server.url, http2=True) as client:
            broken = await client.request(
                "/v1/chat/completions", json=chat_body(h2_fault="close", fault_after=1)
            )
            pooled_after_fault = dict(client._h2._conns)
            after = await client.request("/v1/chat/completions", json=chat_body())
            pooled = list(client._h2._conns.values())
            assert len(pooled) == 1 and pooled[0].usable
    assert_exact(broken)
    assert_exact(after)
    assert broken.error_type == "reset" and after.ok and not after.connection.reused
    assert pooled_after_fault == {}  # the broken connection left the pool at once
