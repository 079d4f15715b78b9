"""Diagnosis end to end: real requests to the loopback test bed, each told what is wrong."""

from __future__ import annotations

import asyncio
from typing import Any

import latency_analyzer as la
from latency_analyzer.capture.alpn import aprobe_alpn, probe_alpn
from latency_analyzer.diagnose import diagnose, diagnose_set, format_findings
from latency_analyzer.testing import DelayProxy, DNSServer, H2LLMServer, LLMServer, TestCA

BODY: dict[str, Any] = {
    "model": "m",
    "stream": True,
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "hi"}],
}


async def _run(client: la.Client, url: str, n: int) -> list[la.Waterfall]:
    return [await client.request(url, json=BODY) for _ in range(n)]


async def test_keepalive_off_is_told_so_and_keepalive_on_is_clean(ca: TestCA) -> None:
    # 2 ms each way makes a TLS handshake cost a few RTTs, as it would across a network
    async with LLMServer(ssl=ca.server_context(), decode=0.002) as llm:
        async with DelayProxy("127.0.0.1", llm.port, delay=0.002) as proxy:
            url = f"https://127.0.0.1:{proxy.port}/v1/chat/completions"
            async with la.Client(keepalive=False, ssl=ca.client_context()) as off:
                cold = await _run(off, url, 5)
            async with la.Client(keepalive=True, ssl=ca.client_context()) as on:
                warm = await _run(on, url, 5)
    assert all(wf.ok for wf in cold + warm)
    found = diagnose_set(cold)
    assert [f.rule for f in found][:1] == ["new_connection"], format_findings(found)
    assert "5 of 5 requests opened a new connection" in found[0].evidence
    assert "keep-alive" in found[0].cause
    assert diagnose_set(warm) == [], format_findings(diagnose_set(warm))


async def test_a_pool_too_small_is_told_so() -> None:
    async with LLMServer(decode=0.004, tokens=8) as llm:
        url = llm.url + "/v1/chat/completions"
        async with la.Client(limit=1) as small:
            queued = await asyncio.gather(*(small.request(url, json=BODY) for _ in range(4)))
        async with la.Client(limit=4) as enough:
            free = await asyncio.gather(*(enough.request(url, json=BODY) for _ in range(4)))
    found = diagnose_set(queued)
    pool = next((f for f in found if f.rule == "pool_wait"), None)
    assert pool is not None, format_findings(found)
    assert pool.time_at_stake_s > 0.020  # 3 of 4 requests waited ~1, 2 and 3 responses (≥ 28 ms)
    assert diagnose_set(free) == [], format_findings(diagnose_set(free))


async def test_slow_dns_is_told_so() -> None:
    async with DNSServer(delay=0.030) as dns, LLMServer() as llm:
        url = f"http://llm.test:{llm.port}/v1/chat/completions"
        async with la.Client(resolver=dns.nameserver) as client:
            wf = await client.request(url, json=BODY)
    found = diagnose(wf)
    assert found and found[0].rule == "dns", format_findings(found)
    assert found[0].title == "slow DNS lookup" and found[0].time_at_stake_s >= 0.030


async def test_probe_alpn_tells_what_the_server_picks(ca: TestCA) -> None:
    async with H2LLMServer(ssl=ca.server_context()) as h2, LLMServer(ssl=ca.server_context()) as h1:
        picked = await asyncio.gather(
            *(
                asyncio.to_thread(
                    probe_alpn, f"https://127.0.0.1:{port}/", context=ca.client_context()
                )
                for port in (h2.port, h1.port)
            )
        )
    assert picked[0] == "h2"
    assert picked[1] != "h2"
    assert probe_alpn("http://127.0.0.1:1/") is None  # nothing is negotiated in clear text


async def test_probe_alpn_resolves_a_name_through_the_given_resolver(ca: TestCA) -> None:
    # a name only the test's DNS server knows: the system resolver would fail (gaierror)
    async with H2LLMServer(ssl=ca.server_context()) as h2, DNSServer() as dns:
        url = f"https://llm.test:{h2.port}/"
        picked = await aprobe_alpn(url, resolver=dns.nameserver, ssl=ca.client_context())
        assert picked == "h2"
        assert {name for name, _ in dns.queries} == {"llm.test"}
