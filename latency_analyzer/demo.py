"""``latency-analyzer demo``: known delays injected on loopback, measured, then diagnosed.

Starts a :class:`~latency_analyzer.testing.TestBed` in a child process (so the servers share
neither this process's GIL nor its event loop): a DNS server answering ``llm.test`` after a
delay, a proxy adding a one-way network delay, and an OpenAI-compatible SSE server behind TLS
that offers HTTP/2 and HTTP/1.1. Probes it twice on one HTTP/1.1-only client, cold (DNS, TCP,
TLS) and warm (reused connection), prints each waterfall, holds each measured stage against
what the servers logged and what was injected, and ends with the diagnosis of the cold request
and its what-if.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from typing import Any

from .analysis.diagnose import diagnose, format_findings, what_if
from .capture.alpn import aprobe_alpn
from .capture.client import Client
from .report.waterfall_text import render_waterfall
from .testing import TestBed
from .timeline import Waterfall

__all__ = ["run_demo"]

DNS_DELAY = 0.023
ONE_WAY = 0.020
PREFILL, DECODE, TOKENS = 0.018, 0.002, 16


def _tolerance(expected_s: float) -> float:
    """What the timing tests hold a recovered delay to: max(0.5 ms, 3 %)."""
    return max(0.0005, 0.03 * expected_s)


async def _probe(bed: TestBed) -> tuple[list[Waterfall], str | None]:
    body = {
        "model": "testbed-model",
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": TOKENS,
        "messages": [{"role": "user", "content": "Where did the time go?"}],
    }
    async with Client(resolver=bed.resolver, ssl=bed.client_context(), http2=False) as client:
        wfs = [await client.request(bed.url, json=body) for _ in range(2)]
    alpn = await aprobe_alpn(bed.url, resolver=bed.resolver, ssl=bed.client_context())
    return wfs, alpn


def _injected() -> str:
    return (
        f"injected: dns {DNS_DELAY * 1e3:.0f} ms · network {ONE_WAY * 1e3:.0f} ms each way (a "
        f"TLS 1.3 handshake and a request each take one {2 * ONE_WAY * 1e3:.0f} ms round trip)"
        f" · prefill {PREFILL * 1e3:.0f} ms before the first token · decode "
        f"{DECODE * 1e3:.0f} ms/token × {TOKENS} tokens · the server offers h2 and http/1.1; "
        "the client offers only http/1.1"
    )


def run_demo(*, as_json: bool = False, colour: bool = False) -> int:
    """Run the demo; returns 0 when both probes succeeded."""
    bed = TestBed(
        dns_delay=DNS_DELAY, one_way=ONE_WAY, prefill=PREFILL, decode=DECODE, tokens=TOKENS
    )
    with bed:
        (cold, warm), alpn = asyncio.run(_probe(bed))
        truth = bed.truth()
    findings = diagnose(cold, server_alpn=alpn)
    ok = 0 if cold.ok and warm.ok else 1
    if as_json:
        for wf in (cold, warm):
            print(json.dumps(wf.summary()))
        dx = {"findings": [f.to_dict() for f in findings]}
        print(json.dumps({**dx, "what_if": what_if(cold, findings).to_dict(), "alpn": alpn}))
        return ok
    print(_injected() + "\n")
    for title, wf in (
        ("cold: first request, new connection", cold),
        ("warm: same client, reused connection", warm),
    ):
        print(f"== {title}\n{render_waterfall(wf, colour=colour)}\n")
    print(_checks(cold, warm, truth) + "\n")
    print(f"== diagnosis of the cold request (the server's ALPN choice: {alpn})")
    print(format_findings(findings))
    print(what_if(cold, findings))
    return ok


def _server_dns(truth: Mapping[str, Any]) -> float | None:
    """The cold lookup as the DNS server saw it: first query in, last answer out."""
    queries = truth["dns"][:2]
    if len(queries) < 2 or any(q[1] is None for q in queries):
        return None
    return float(max(q[1] for q in queries) - min(q[0] for q in queries)) / 1e9


def _server_warm(truth: Mapping[str, Any]) -> dict[str, float | None]:
    """The warm request as the test bed logged it: its wait at the proxy's side of the wire
    facing this client, the rest as the LLM server wrote its chunks."""
    records = truth["h1"]
    if len(records) < 2 or not records[1]["chunk_ns"] or records[1]["headers_ns"] is None:
        return {"wait": None, "first_token": None, "tpot": None}
    r = records[1]
    chunks = r["chunk_ns"]
    tokens = sum(r["chunk_tokens"])
    return {
        "wait": _proxied_wait(truth["relays"], r["received_ns"], r["headers_ns"]),
        "first_token": (chunks[0] - r["headers_ns"]) / 1e9,
        "tpot": (chunks[-1] - chunks[0]) / (tokens - 1) / 1e9 if tokens > 1 else None,
    }


def _proxied_wait(
    relays: list[Mapping[str, Any]], received_ns: int, headers_ns: int
) -> float | None:
    """From the proxy's kernel arrival of the request's last bytes (the last it forwarded
    before the server had the request) to its write of the response headers to this client
    (the first it took from the server after the server wrote them): the wait the wire shows
    at this client's side. The server's own log leaves out its TLS and parsing on both sides
    of it, and the proxy's sends."""
    sent = [x for x in relays if x["upstream"] and x["sent_ns"] <= received_ns]
    back = [x for x in relays if not x["upstream"] and x["received_ns"] >= headers_ns]
    if not sent or not back:
        return None
    request = max(sent, key=lambda x: x["sent_ns"])
    headers = min(back, key=lambda x: x["received_ns"])
    return float(headers["sent_ns"] - request["received_ns"]) / 1e9


def _checks(cold: Waterfall, warm: Waterfall, truth: Mapping[str, Any]) -> str:
    """Injected vs what the servers logged vs measured, stage by stage: what the demo is for."""
    server = _server_warm(truth)
    rows: list[tuple[str, float | None, float | None, float, str]] = [
        ("dns (cold)", cold.attribution().get("dns"), _server_dns(truth), DNS_DELAY, "lookup"),
        ("tls (cold)", cold.attribution().get("tls"), None, 2 * ONE_WAY, "one RTT + crypto"),
        ("wait (warm)", warm.attribution().get("wait"), server["wait"], 2 * ONE_WAY, "one RTT"),
        ("first_token", warm.attribution().get("first_token"), server["first_token"], PREFILL, ""),
        ("tpot (warm)", warm.tpot, server["tpot"], DECODE, "decode per token"),
    ]
    lines = [
        "== injected vs measured (servers in a child process; a stage is held to what the",
        "   test bed logged, within max(0.5 ms, 3 %) as the timing tests hold it)",
        f"  {'stage':<12} {'measured':>10} {'bed log':>11} {'injected':>10}  verdict",
    ]
    for name, measured, logged, injected, what in rows:
        lines.append(_row(name, measured, logged, injected, what))
    lines.append(_load_note())
    return "\n".join(line for line in lines if line)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


def _row(
    name: str, measured: float | None, logged: float | None, injected: float, what: str
) -> str:
    if measured is None:
        verdict = "not measured"
    elif logged is None:
        # nothing on the server side times a handshake from the client's view: the injected
        # round trip is a floor, the crypto comes on top
        verdict = "ok (≥ injected" + (f": {what})" if what else ")")
        if measured < injected:
            verdict = "below the injected floor: a measurement fault"
    else:
        off = measured - logged
        tol = _tolerance(logged)
        verdict = (
            f"ok ({off * 1e3:+.2f} ms)"
            if abs(off) <= tol
            else (
                f"off by {off * 1e3:+.2f} ms (tolerance {tol * 1e3:.2f}): this process's own time"
            )
        )
    return f"  {name:<12} {_ms(measured):>10} {_ms(logged):>11} {_ms(injected):>10}  {verdict}"


def _load_note() -> str:
    """Say when the host is busy: the client's own time grows with other processes' load."""
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        return ""
    cpus = os.cpu_count() or 1
    if load1 <= cpus:
        return ""
    return (
        f"  note: load average {load1:.1f} on {cpus} CPUs: other processes kept this client "
        "from running at times, and that time lands in the stage being measured"
    )
