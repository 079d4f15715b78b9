"""``latency-analyzer demo``: known delays injected on loopback, then measured.

Starts, on 127.0.0.1 only: a DNS server answering ``llm.test`` after a delay, an
OpenAI-compatible SSE server behind TLS with header/queue/prefill/decode delays, and a TCP proxy
adding a one-way delay (the RTT a real network would add). Probes it twice on one client: cold
(DNS, TCP, TLS) and warm (reused connection), and prints each waterfall with what was injected.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import ExitStack

from .capture.client import Client
from .report.text import render_waterfall
from .testing import DelayProxy, DNSServer, LLMServer, TestCA
from .timeline import Waterfall

__all__ = ["run_demo"]

DNS_DELAY = 0.015
ONE_WAY = 0.002
HEADER_DELAY = 0.005
QUEUE, PREFILL, DECODE, TOKENS = 0.010, 0.040, 0.008, 24


async def _probe_twice(url: str, resolver: str, ca: TestCA) -> list[Waterfall]:
    body = {
        "model": "testbed-model",
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": TOKENS,
        "messages": [{"role": "user", "content": "Where did the time go?"}],
    }
    async with Client(resolver=resolver, ssl=ca.client_context()) as client:
        return [await client.request(url, json=body) for _ in range(2)]


def _injected() -> str:
    return (
        f"injected: dns {DNS_DELAY * 1e3:.0f} ms · network {ONE_WAY * 1e3:.0f} ms each way "
        f"(so TLS and wait gain ≥ {2 * ONE_WAY * 1e3:.0f} ms per round trip) · headers after "
        f"{HEADER_DELAY * 1e3:.0f} ms · queue {QUEUE * 1e3:.0f} ms + prefill "
        f"{PREFILL * 1e3:.0f} ms before the first token · decode {DECODE * 1e3:.0f} ms/token "
        f"× {TOKENS} tokens"
    )


def run_demo(*, as_json: bool = False, colour: bool = False) -> int:
    """Run the demo; returns 0 when both probes succeeded."""
    ca = TestCA()
    server = LLMServer(
        ssl=ca.server_context(),
        header_delay=HEADER_DELAY,
        queue=QUEUE,
        prefill=PREFILL,
        decode=DECODE,
        tokens=TOKENS,
    )
    with ExitStack() as stack:
        llm = stack.enter_context(server.run_in_thread())
        proxy = stack.enter_context(DelayProxy(llm.host, llm.port, ONE_WAY).run_in_thread())
        dns = stack.enter_context(DNSServer(delay=DNS_DELAY).run_in_thread())
        url = f"https://llm.test:{proxy.port}/v1/chat/completions"
        cold, warm = asyncio.run(_probe_twice(url, dns.nameserver, ca))
    if as_json:
        for wf in (cold, warm):
            print(json.dumps(wf.summary()))
        return 0 if cold.ok and warm.ok else 1
    print(_injected() + "\n")
    for title, wf in (
        ("cold: first request, new connection", cold),
        ("warm: same client, reused connection", warm),
    ):
        print(f"== {title}\n{render_waterfall(wf, colour=colour)}\n")
    print(_checks(cold, warm))
    return 0 if cold.ok and warm.ok else 1


def _checks(cold: Waterfall, warm: Waterfall) -> str:
    """Injected vs measured, stage by stage: what the demo is for."""
    rtt = 2 * ONE_WAY
    rows = [
        ("dns (cold)", cold.attribution().get("dns"), DNS_DELAY, "+ resolver work, GIL shared"),
        ("tls (cold)", cold.attribution().get("tls"), rtt, "one round trip + crypto"),
        ("wait (warm)", warm.attribution().get("wait"), HEADER_DELAY + rtt, "headers + one RTT"),
        ("first_token", warm.attribution().get("first_token"), QUEUE + PREFILL, "queue + prefill"),
        ("tpot", warm.tpot, DECODE, "decode per token"),
    ]
    lines = [
        "== injected vs measured (the demo's servers run in threads of this process and share",
        "   its GIL with the client; the tests run them apart and hold each stage to max(0.5 ms,",
        "   3%) of what was injected)",
    ]
    for name, measured, injected, what in rows:
        got = "-" if measured is None else f"{measured * 1e3:7.2f} ms"
        lines.append(f"  {name:<12} {got}   injected {injected * 1e3:6.2f} ms  ({what})")
    return "\n".join(lines)
