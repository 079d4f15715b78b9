"""The connector is the one dialer: it returns what a connection became, HTTP/1.1 or HTTP/2.

Truth: what the servers saw (their logs: one TCP connection per client port), the sockets
the client dialled (counted where the connector makes them), and whether aiohttp's request
path ever ran for a request that went out on HTTP/2.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import aiohttp
import pytest
from conftest import assert_exact, chat_body

import latency_analyzer as la
from latency_analyzer.capture import connector as connector_module
from latency_analyzer.testing import H2LLMServer, LLMServer, TestCA

CHAT = "/v1/chat/completions"


def _count_requests_in_aiohttp(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The methods of every request that entered aiohttp's own request path."""
    entered: list[str] = []
    real = aiohttp.ClientSession._request

    async def counting(self: aiohttp.ClientSession, method: str, *args: Any, **kw: Any) -> Any:
        entered.append(method)
        return await real(self, method, *args, **kw)

    monkeypatch.setattr(aiohttp.ClientSession, "_request", counting)
    return entered


def _count_dials(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The address family of every socket the connector makes (one per dial attempt)."""
    dials: list[int] = []
    real = connector_module._socket_factory

    def counting(addr_info: tuple[Any, ...]) -> socket.socket:
        dials.append(addr_info[0])
        return real(addr_info)

    monkeypatch.setattr(connector_module, "_socket_factory", counting)
    return dials


@pytest.mark.parametrize("http2", [None, True], ids=["preferred", "required"])
async def test_an_http2_dial_never_enters_aiohttp(
    ca: TestCA, monkeypatch: pytest.MonkeyPatch, http2: bool | None
) -> None:
    """ALPN chose h2: the dial returns the HTTP/2 connection with the request's stream on it,
    and aiohttp's request path, which speaks HTTP/1.1, never runs for it."""
    entered = _count_requests_in_aiohttp(monkeypatch)
    dials = _count_dials(monkeypatch)
    server = H2LLMServer(ssl=ca.server_context(alpn=("h2",)), tokens=3)
    async with server, la.Client(server.url, ssl=ca.client_context(), http2=http2) as client:
        wfs = [await client.request(CHAT, json=chat_body(tokens=3)) for _ in range(2)]
    for wf in wfs:
        assert wf.ok and wf.http_version == "2", wf.error
        assert_exact(wf)
        assert wf.output_tokens == 3
    assert entered == []
    assert len(dials) == 1  # the second request is a stream on the first one's connection
    assert [wf.connection.reused for wf in wfs] == [False, True]
    assert {"connect", "tls", "send", "h2_setup"} <= set(wfs[0].stages)
    assert "connect" not in wfs[1].stages


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
async def test_an_http11_dial_is_the_connection_its_exchange_uses(
    ca: TestCA, monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    """ALPN chose HTTP/1.1: aiohttp's exchange takes the connection the dial opened, dials
    no other, and pools it for the next request (IPv6 too: the dial's origin is the URL's,
    brackets and all)."""
    entered = _count_requests_in_aiohttp(monkeypatch)
    dials = _count_dials(monkeypatch)
    server = LLMServer(host=host, ssl=ca.server_context(alpn=("http/1.1",)), tokens=2)
    async with server:
        async with la.Client(server.url, ssl=ca.client_context()) as client:
            wfs = [await client.request(CHAT, json=chat_body(tokens=2)) for _ in range(2)]
        peers = [r.peer for r in server.records]
    for wf in wfs:
        assert wf.ok and wf.http_version == "1.1", wf.error
        assert_exact(wf)
    assert entered == ["POST", "POST"]
    assert dials == [socket.AF_INET6 if ":" in host else socket.AF_INET]
    assert len(peers) == 2 and peers[0] == peers[1]  # one TCP connection, by the server's log
    assert wfs[0].tls is not None and wfs[0].tls.alpn == "http/1.1"
    assert [wf.connection.reused for wf in wfs] == [False, True]
    assert wfs[0].connection.connection_id == wfs[1].connection.connection_id


async def test_a_request_that_fails_after_its_dial_gives_the_connection_back(
    ca: TestCA, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body that cannot be encoded fails the request after its connection was dialled:
    the waterfall keeps the dial's stages and the error, and the connection goes back to
    the pool, where the next request finds it."""
    dials = _count_dials(monkeypatch)
    async with LLMServer(ssl=ca.server_context(alpn=("http/1.1",)), tokens=2) as server:
        async with la.Client(server.url, ssl=ca.client_context()) as client:
            bad = await client.request(CHAT, json={"not json": object()})
            good = await client.request(CHAT, json=chat_body(tokens=2))
        served = len(server.records)
    assert_exact(bad)
    assert not bad.ok and bad.error_type == "error" and "JSON" in (bad.error or "")
    assert {"connect", "tls"} <= set(bad.stages)
    assert good.ok, good.error
    assert_exact(good)
    assert good.connection.reused
    assert good.connection.connection_id == bad.connection.connection_id
    assert len(dials) == 1 and served == 1


async def test_a_dial_that_cannot_finish_times_out_in_tls(ca: TestCA) -> None:
    """A server that accepts and never answers the ClientHello: the dial is bounded by the
    request's timeout, and the waterfall says where it stood."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        t0 = time.perf_counter()
        url = f"https://127.0.0.1:{port}{CHAT}"
        wf = await la.aprobe(url, json=chat_body(), ssl=ca.client_context(), timeout=0.3)
        took = time.perf_counter() - t0
    assert_exact(wf)
    assert wf.error_type == "timeout" and "during tls" in (wf.error or ""), wf.error
    assert wf.stages["tls"].attributes["interrupted"] is True
    assert took < 1.0  # no hang
    assert wf.e2e == pytest.approx(0.3, abs=0.05)
