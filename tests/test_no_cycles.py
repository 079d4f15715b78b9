"""A closed connection is freed by reference counting, not left for the cyclic collector.

Whatever a connection leaves in reference cycles waits for the collector, whose generation-0
pass runs once enough such objects have piled up, in the middle of whatever request is
running then: a cold request's stages would carry a pass freeing earlier connections' state.
Each test makes cold requests (a Client per request) with the collector off, then collects
with ``DEBUG_SAVEALL`` and names what was unreachable. Nothing of ours, aiohttp's or h2's may
be there, except the socket under asyncio's selector transport, which asyncio's own cycle
(the transport and its bound read callback) keeps.

The servers run in child processes, so what their side leaves is not in this process.
"""

from __future__ import annotations

import gc
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import chat_body

import latency_analyzer as la
from latency_analyzer.capture._wire import WireStamps
from latency_analyzer.testing import H2LLMServer, LLMServer, TestCA

COLD_REQUESTS = 5


@pytest.fixture(scope="module")
def servers(ca: TestCA, server_pem: Path) -> Iterator[dict[str, str]]:
    h1 = LLMServer(prefill=0.0, decode=0.0, tokens=4)
    h2 = H2LLMServer(prefill=0.0, decode=0.0, tokens=4)
    with (
        h1.run_in_subprocess() as plain,
        h1.run_in_subprocess(tls_pem=str(server_pem)) as tls,
        h2.run_in_subprocess(tls_pem=str(server_pem)) as h2tls,
    ):
        yield {"http/1.1": plain.url, "http/1.1+tls": tls.url, "h2": h2tls.url}


def _left_in_cycles(garbage: list[Any]) -> list[str]:
    """The unreachable objects that belong to the client's stack (ours, aiohttp's, h2's)."""
    named = []
    for obj in garbage:
        kind = type(obj)
        if isinstance(obj, (socket.socket, WireStamps)):  # asyncio's transport cycle holds these
            continue
        module = kind.__module__.split(".")[0]
        if module in ("latency_analyzer", "aiohttp", "h2", "hpack", "hyperframe"):
            named.append(f"{kind.__module__}.{kind.__qualname__}")
    return sorted(set(named))


@pytest.mark.parametrize("kind", ["http/1.1", "http/1.1+tls", "h2"])
@pytest.mark.parametrize("streamed", [False, True], ids=["get", "stream"])
async def test_cold_requests_leave_nothing_for_the_collector(
    servers: dict[str, str], ca: TestCA, kind: str, streamed: bool
) -> None:
    ctx = ca.client_context()

    async def cold() -> la.Waterfall:
        async with la.Client(servers[kind], ssl=ctx, http2=kind == "h2") as client:
            if streamed:
                return await client.request("/v1/chat/completions", json=chat_body())
            return await client.request("/health")

    warm = await cold()  # imports and one-time set-up: not what a request leaves
    assert warm.ok, warm.error
    gc.collect()
    gc.disable()
    try:
        for _ in range(COLD_REQUESTS):
            wf = await cold()
            assert wf.ok, wf.error
            assert wf.connection.reused is False
            if kind == "h2":
                assert wf.http_version == "2"
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            unreachable = gc.collect()
            left = _left_in_cycles(gc.garbage)
        finally:
            gc.garbage.clear()
            gc.set_debug(0)
            gc.collect()
    finally:
        gc.enable()
    assert left == [], f"{unreachable} objects in cycles after {COLD_REQUESTS} cold requests"
