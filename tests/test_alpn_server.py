"""One TLS port, HTTP/2 or HTTP/1.1 by ALPN, and a delay before each handshake."""

from __future__ import annotations

from typing import Any

import latency_analyzer as la
from latency_analyzer.testing import ALPNLLMServer, TestCA

BODY: dict[str, Any] = {"model": "m", "stream": True, "max_tokens": 4, "messages": []}


async def test_each_client_gets_the_protocol_it_offers(ca: TestCA) -> None:
    async with ALPNLLMServer(ssl=ca.server_context(alpn=()), tokens=4) as server:
        url = f"{server.url}/v1/chat/completions"
        versions = []
        for http2 in (None, False, True):
            async with la.Client(ssl=ca.client_context(), http2=http2) as client:
                wf = await client.request(url, json=BODY)
                assert wf.ok and wf.output_tokens == 4, wf.error
                versions.append(wf.http_version)
    assert versions == ["2", "1.1", "2"]
    assert [h.alpn for h in server.handshakes] == ["h2", "http/1.1", "h2"]
    assert len(server.h2.records) == 2 and len(server.h1.records) == 1


async def test_tls_delay_is_spent_before_the_server_reads_the_client_hello(ca: TestCA) -> None:
    delay = 0.030
    async with ALPNLLMServer(ssl=ca.server_context(alpn=()), tls_delay=delay) as server:
        async with la.Client(ssl=ca.client_context(), http2=False) as client:
            wf = await client.request(f"{server.url}/v1/chat/completions", json=BODY)
    assert wf.ok, wf.error
    (h,) = server.handshakes
    assert h.tls_start_ns - h.accepted_ns >= delay * 1e9  # the server's own record
    tls = wf.stages["tls"]
    # the client's handshake holds the server's wait: it cannot end before the server started
    # reading the ClientHello, and it lasted at least the wait
    assert tls.end_ns >= h.tls_start_ns
    assert tls.duration >= delay
