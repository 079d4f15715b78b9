"""The ``dns`` stage as the wire sees it, against a packet capture of the same lookups.

Truth is tcpdump on ``lo``: its stamps are the kernel's, taken as each datagram crosses the
interface, so neither a busy client nor a busy DNS server can move them. The DNS server runs
in its own process and answers after an injected delay.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import dns.flags
import dns.message
import dns.rcode
import dns.rrset
import pytest
from conftest import assert_exact
from wire_bounds import LOOPBACK_NS, Steal, hold_each

import latency_analyzer as la
from latency_analyzer.capture import _dnswire
from latency_analyzer.capture.resolver import DnsResolver
from latency_analyzer.testing import DNSServer, LLMServer
from latency_analyzer.testing.pcap import require_tcpdump
from latency_analyzer.testing.tcpdump import Packet, TcpDump
from latency_analyzer.timeline import process_anchor

DNS_DELAY = 0.020
N = 20

_DNS_CHILD = """
import sys
from latency_analyzer.testing import DNSServer
with DNSServer(delay=float(sys.argv[1])).run_in_thread() as dns:
    print(dns.port, flush=True)
    sys.stdin.read()
"""


@pytest.fixture(scope="module")
def dns_port() -> Iterator[int]:
    args = [sys.executable, "-c", _DNS_CHILD, str(DNS_DELAY)]
    with subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdin is not None and child.stdout is not None
        yield int(child.stdout.readline())
        child.stdin.close()


@dataclass
class Errors:
    """Stage boundary − capture instant, per lookup (ns), and the recorded read lags."""

    start: list[int]
    end: list[int]
    read_lag: list[int]


async def _cold_lookups(port: int, n: int) -> tuple[list[la.Waterfall], list[Packet]]:
    async with LLMServer() as llm:
        url = f"http://llm.test:{llm.port}/health"
        with TcpDump(f"udp port {port}") as capture:
            wfs = [await la.aprobe(url, resolver=f"127.0.0.1:{port}") for _ in range(n)]
    return wfs, capture.packets()


def _errors(wfs: list[la.Waterfall], packets: list[Packet], port: int) -> Errors:
    out = Errors([], [], [])
    for wf in wfs:
        assert wf.ok, wf.error
        assert_exact(wf)
        dns = wf.stages["dns"]
        assert dns.attributes["clock_source"] == "kernel"
        assert dns.attributes["queries"] == 2  # A and AAAA, no resend
        inside = [p for p in packets if wf.start_ns <= _perf(p) <= wf.end_ns]
        queries = [_perf(p) for p in inside if p.dport == port]
        answers = [_perf(p) for p in inside if p.sport == port]
        assert len(queries) == 2 and len(answers) == 2, (queries, answers)
        assert max(answers) - min(queries) >= DNS_DELAY * 1e9  # the server did wait
        out.start.append(dns.start_ns - min(queries))
        out.end.append(dns.end_ns - max(answers))
        lag = dns.attributes["read_lag_ns"]
        assert isinstance(lag, int)
        out.read_lag.append(lag)
    return out


def _perf(packet: Packet) -> int:
    return process_anchor().to_perf_ns(packet.epoch_ns)


def _median_abs(values: list[int]) -> float:
    return statistics.median(abs(v) for v in values)


async def test_dns_stage_matches_the_capture_on_a_quiet_host(dns_port: int) -> None:
    """Within 0.1 ms of the capture at the median, 0.5 ms each, as every pair of kernel
    stamps is held (:func:`wire_bounds.hold_each`): a host stall between the two moves one
    now and then, a query's start early (our instant before its send), an answer's end late."""
    require_tcpdump()
    with Steal() as steal:
        wfs, packets = await _cold_lookups(dns_port, N)
    err = _errors(wfs, packets, dns_port)
    for name, values in (("start", err.start), ("end", err.end)):
        assert _median_abs(values) <= 100_000, (name, values)
        hold_each(f"dns {name}", values, LOOPBACK_NS, steal, early=name == "start")


_BURNER = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
if sys.argv[2] == "fifo":  # holds the CPU 9 ms in every 10 whatever the client's claim on it
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    while True:
        end = time.perf_counter() + 0.009
        while time.perf_counter() < end:
            pass
        time.sleep(0.001)
os.nice(-5)
while True:
    pass
"""


def _burners(cpu: int) -> list[subprocess.Popen[bytes]]:
    """Two processes spinning on ``cpu`` (we run as root): one at a real-time priority for 9 ms
    in every 10, which no wake of our client can preempt, so a reply that comes in its turn
    waits for the turn's end; one at a higher nice level than ours, sharing the rest. (With
    only fair-share burners the scheduler lets a waking client run at once, and a busy CPU that
    never idles wakes it sooner than a quiet one: a CI run read the busy lag's median lower.)"""
    return [
        subprocess.Popen([sys.executable, "-c", _BURNER, str(cpu), kind])
        for kind in ("fifo", "nice")
    ]


async def test_dns_stage_holds_while_the_client_host_is_busy(dns_port: int) -> None:
    """Two CPU burners share the client's CPU: the kernel-stamped boundaries stay, read lag grows.

    The client and both burners are pinned to one CPU, the burners at a higher priority, so the
    client gets a small share of it and its reads fall behind the arrivals; the capture's stamps
    and the kernel's stamps do not move.
    """
    require_tcpdump()
    quiet = _errors(*await _cold_lookups(dns_port, N), dns_port)
    allowed = os.sched_getaffinity(0)
    cpu = min(allowed)
    burners = _burners(cpu)
    try:
        os.sched_setaffinity(0, {cpu})
        await asyncio.sleep(0.2)  # the burners are spinning
        busy = _errors(*await _cold_lookups(dns_port, N), dns_port)
    finally:
        os.sched_setaffinity(0, allowed)
        for proc in burners:
            proc.kill()
            proc.wait()
    for name, values in (("start", busy.start), ("end", busy.end)):
        assert _median_abs(values) <= 200_000, (name, values)
    assert statistics.median(busy.read_lag) > statistics.median(quiet.read_lag), (
        quiet.read_lag,
        busy.read_lag,
    )


async def test_a_refused_or_failed_lookup_names_the_rcode() -> None:
    """SERVFAIL and REFUSED are the server's failure, not an absence of records."""
    for rcode in ("SERVFAIL", "REFUSED"):
        with _Responder(rcode=rcode) as responder:
            resolver = DnsResolver(f"127.0.0.1:{responder.port}", timeout=2.0)
            with pytest.raises(OSError, match=f"answered {rcode} for 'x.test'"):
                await resolver.resolve("x.test", 0, 0)
    with DNSServer(default_a=None, default_aaaa=None).run_in_thread() as empty:
        resolver = DnsResolver(empty.nameserver, timeout=2.0)
        with pytest.raises(OSError, match=r"no A/AAAA records for 'x\.test'"):
            await resolver.resolve("x.test", 0, 0)


async def test_a_truncated_answer_is_asked_again_over_tcp() -> None:
    with _Responder(truncate=True) as responder:
        resolver = DnsResolver(f"127.0.0.1:{responder.port}", timeout=2.0)
        results = await resolver.resolve("big.test", 0, socket.AF_INET)
        lookup = resolver.wire_lookup("big.test", 0)
    assert [r["host"] for r in results] == ["10.1.2.3"]
    assert responder.seen == ["udp", "tcp"]
    assert lookup is not None and lookup.transport == "tcp" and lookup.queries == 2
    assert lookup.clock_source == "kernel"


async def test_a_lost_query_is_resent_and_the_stage_spans_the_wait() -> None:
    with _Responder(drop=1) as responder:
        resolver = DnsResolver(f"127.0.0.1:{responder.port}", timeout=3.0)
        results = await resolver.resolve("lossy.test", 0, socket.AF_INET)
        lookup = resolver.wire_lookup("lossy.test", 0)
    assert [r["host"] for r in results] == ["10.1.2.3"]
    assert responder.seen == ["dropped", "udp"]
    assert lookup is not None and lookup.queries == 2 and lookup.transport == "udp"
    # from the lost query on the wire to the answer to its resend: the 1 s resend timer inside
    waited = lookup.answered_ns - lookup.first_sent_ns
    assert 1.0e9 <= waited < 1.2e9, waited


class _Responder:
    """Answers A queries on UDP and TCP (one port) from threads of this process.

    ``rcode``: every answer carries it; ``truncate``: UDP answers are empty with TC set, so the
    resolver must ask again over TCP, which answers 10.1.2.3; ``drop``: that many UDP queries
    are ignored first, as if lost.
    """

    def __init__(self, rcode: str = "NOERROR", truncate: bool = False, drop: int = 0) -> None:
        self.rcode, self.truncate, self.drop = rcode, truncate, drop
        self.seen: list[str] = []
        self._stop = threading.Event()
        self._udp, self._tcp = _udp_and_tcp_on_one_port()
        self.port = int(self._udp.getsockname()[1])
        for sock in (self._udp, self._tcp):
            sock.settimeout(0.1)
        self._threads = [
            threading.Thread(target=self._serve_udp, daemon=True),
            threading.Thread(target=self._serve_tcp, daemon=True),
        ]

    def _reply(self, data: bytes, transport: str) -> bytes:
        self.seen.append(transport)
        query = dns.message.from_wire(data)
        reply = dns.message.make_response(query)
        reply.set_rcode(dns.rcode.from_text(self.rcode))
        if self.truncate and transport == "udp":
            reply.flags |= dns.flags.TC
        elif self.rcode == "NOERROR":
            name = query.question[0].name
            reply.answer.append(dns.rrset.from_text(name, 60, "IN", "A", "10.1.2.3"))
        return reply.to_wire()

    def _serve_udp(self) -> None:
        while not self._stop.is_set():
            try:
                data, addr = self._udp.recvfrom(4096)
            except TimeoutError:
                continue
            if self.drop > 0:
                self.drop -= 1
                self.seen.append("dropped")
                continue
            self._udp.sendto(self._reply(data, "udp"), addr)

    def _serve_tcp(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._tcp.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                size = int.from_bytes(conn.recv(2), "big")
                answer = self._reply(conn.recv(size), "tcp")
                conn.sendall(len(answer).to_bytes(2, "big") + answer)

    def __enter__(self) -> _Responder:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self._udp.close()
        self._tcp.close()


async def test_where_the_kernel_refuses_stamps_the_lookup_says_userspace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with DNSServer().run_in_thread() as server:
        stamped = DnsResolver(server.nameserver, timeout=2.0)
        await stamped.resolve("a.test", 0, 0)
        monkeypatch.setattr(_dnswire, "stamp_receives", lambda sock: False)
        refused = DnsResolver(server.nameserver, timeout=2.0)
        await refused.resolve("a.test", 0, 0)
    kernel, user = stamped.wire_lookup("a.test", 0), refused.wire_lookup("a.test", 0)
    assert kernel is not None and kernel.clock_source == "kernel"
    assert user is not None and user.clock_source == "userspace" and user.read_lag_ns == 0
    assert user.answered_ns == user.read_ns  # no kernel instant: the read is the boundary


def _udp_and_tcp_on_one_port() -> tuple[socket.socket, socket.socket]:
    """A free UDP port that is free for TCP too (another test may hold it for TCP)."""
    for _ in range(20):
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("127.0.0.1", 0))
        try:
            return udp, socket.create_server(("127.0.0.1", udp.getsockname()[1]))
        except OSError:
            udp.close()
    raise OSError("no port free for both UDP and TCP")


def test_dnspython_is_warmed_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """What dnspython loads lazily is loaded by the first resolver; a Client made per request
    does not pay for it again."""
    DnsResolver("127.0.0.1:53")
    made: list[str] = []
    real = dns.message.make_query

    def counted(*args: object, **kwargs: object) -> dns.message.QueryMessage:
        made.append(str(args[0]))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(dns.message, "make_query", counted)
    for _ in range(3):
        DnsResolver("127.0.0.1:53")
    assert made == []
