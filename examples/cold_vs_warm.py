"""Cold vs warm: the same request on a new connection and on a reused one, over TLS.

    python examples/cold_vs_warm.py

A DNS server (15 ms delay), a TLS LLM server and a 2 ms-each-way delay proxy (a nearby
network) on 127.0.0.1. The first request pays dns + connect + tls; the next ones do not.
Then the same five requests with keep-alive off, and what ``diagnose`` says about them.
"""

from __future__ import annotations

import asyncio

import latency_analyzer as la
from latency_analyzer.analysis.diagnose import diagnose, format_findings
from latency_analyzer.testing import DelayProxy, DNSServer, LLMServer, TestCA

BODY = {
    "model": "m",
    "stream": True,
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "hi"}],
}


def row(label: str, wf: la.Waterfall) -> str:
    stages = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in wf.attribution().items() if v > 5e-5)
    return f"{label:<6} e2e {wf.e2e * 1e3:6.1f} ms  ttft {wf.ttft * 1e3:6.1f} ms  [{stages}]"


async def main() -> None:
    ca = TestCA()
    async with (
        DNSServer(delay=0.015) as dns,
        LLMServer(ssl=ca.server_context(), decode=0.002) as llm,
    ):
        async with DelayProxy("127.0.0.1", llm.port, delay=0.002) as proxy:
            url = f"https://llm.test:{proxy.port}/v1/chat/completions"
            for keepalive in (True, False):
                async with la.Client(resolver=dns.nameserver, ssl=ca.client_context(),
                                     keepalive=keepalive) as client:  # fmt: skip
                    wfs = [await client.request(url, json=BODY) for _ in range(5)]
                print(f"keep-alive {'on' if keepalive else 'off'}:")
                for wf in wfs:
                    print("  " + row("cold" if not wf.connection.reused else "warm", wf))
                print(format_findings(diagnose(wfs)), end="\n\n")


if __name__ == "__main__":
    asyncio.run(main())
