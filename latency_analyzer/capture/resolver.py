"""A resolver for aiohttp timed on the wire: a chosen nameserver (``HOST:PORT``) or the system's.

Queries go over sockets of our own (:mod:`._dnswire`), so each lookup knows when its first
query was handed to the kernel and when the kernel received the last answer it needed;
dnspython only builds and parses the messages. A and AAAA are asked in parallel; a lost
datagram is resent (each configured server in turn), a truncated answer is asked again over TCP.

In system mode ``/etc/hosts`` is honoured first, as getaddrinfo would. IP literals never reach
a resolver (aiohttp skips it). Failures raise ``OSError`` with a readable message naming the
server's rcode (NXDOMAIN, SERVFAIL, REFUSED, ...), which aiohttp turns into
``ClientConnectorDNSError``; the connector times each request's wait.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
from dataclasses import dataclass, field
from pathlib import Path

import dns.exception
import dns.flags
import dns.message
import dns.rcode
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.resolver
from aiohttp.abc import AbstractResolver, ResolveResult

from ..errors import UsageError
from ..timeline import AttrValue
from ._dnswire import Arrival, DatagramChannel, tcp_exchange
from ._state import now_ns

__all__ = ["DnsResolver", "WireLookup", "parse_nameserver", "read_hosts_file"]


def parse_nameserver(spec: str) -> tuple[str, int]:
    """``"127.0.0.1:5354"``, ``"[::1]:53"`` or ``"10.0.0.2"`` → (address, port)."""
    host, port = spec, 53
    if spec.startswith("["):
        host, _, rest = spec[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") else 53
    elif spec.count(":") == 1:
        host, port_s = spec.split(":")
        port = int(port_s)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise UsageError(
            f"resolver must be an IP address with an optional port, got {spec!r}"
        ) from None
    return host, port


def read_hosts_file(path: str | Path = "/etc/hosts") -> dict[str, list[str]]:
    """Name → addresses from a hosts file (missing file: empty)."""
    table: dict[str, list[str]] = {}
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return table
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 2:
            for name in fields[1:]:
                table.setdefault(name.lower().rstrip("."), []).append(fields[0])
    return table


@dataclass(frozen=True, slots=True)
class WireLookup:
    """When one lookup was on the wire (``perf_counter_ns`` clock).

    Attributes:
        first_sent_ns: the first query of the lookup handed to the network device (the
            kernel's TX stamp), or our instant just before the send where none is reported.
        answered_ns: the kernel's arrival of the last answer the lookup needed (A and AAAA,
            after any retry or TCP fallback); our read instant where unstamped.
        read_ns: when our code read that answer.
        clock_source: ``"kernel"`` when the first sends and every needed answer carried kernel
            stamps, else ``"userspace"``.
        queries: messages sent (retries and TCP fallbacks included).
        transport: ``"udp"``, or ``"tcp"`` when an answer came over TCP.
        read_lag_ns: the largest read − kernel instant over the needed answers (0 unstamped).
    """

    first_sent_ns: int
    answered_ns: int
    read_ns: int
    clock_source: str
    queries: int
    transport: str
    read_lag_ns: int

    def attributes(self) -> dict[str, AttrValue]:
        """What the ``dns`` stage says about the lookup."""
        return {
            "clock_source": self.clock_source,
            "queries": self.queries,
            "transport": self.transport,
            "read_lag_ns": self.read_lag_ns,
        }


@dataclass(slots=True)
class _Answer:
    """One record type's answer: its addresses (or failure) and its wire instants."""

    rdtype: str
    sent_ns: int
    queries: int
    sent_kernel: bool = False  # sent_ns is the kernel's (a TX stamp), not ours before the send
    arrival: Arrival | None = None
    stamped: bool = True
    tcp: bool = False
    addresses: list[str] = field(default_factory=list)
    rcode: str | None = None  # a failure rcode (NXDOMAIN, SERVFAIL, REFUSED, ...)
    timed_out: bool = False


class DnsResolver(AbstractResolver):
    """Resolves over sockets of its own so every lookup is a real query timed on the wire.

    Each lookup's wire instants are kept (:meth:`wire_lookup`) for the connector's ``dns``
    stage; dnspython only builds and parses the messages.

    Args:
        nameserver: ``"HOST:PORT"`` to ask one server; None for the system's configuration.
        timeout: seconds before a lookup fails (``lifetime`` in dnspython terms).
        hosts_file: path of a hosts file consulted first in system mode (None: skip it).
    """

    def __init__(
        self,
        nameserver: str | None = None,
        *,
        timeout: float = 5.0,
        hosts_file: str | None = "/etc/hosts",
    ) -> None:
        if nameserver is None:
            system = dns.resolver.Resolver()
            self._servers = [(str(a), system.port) for a in system.nameservers if _is_ip(str(a))]
            self._hosts = read_hosts_file(hosts_file) if hosts_file else {}
        else:
            self._servers = [parse_nameserver(nameserver)]
            self._hosts = {}
        self.timeout = timeout
        self.nameserver = nameserver
        self._lookups: dict[str, WireLookup] = {}
        _warm_up()

    def wire_lookup(self, host: str, since_ns: int) -> WireLookup | None:
        """The last lookup of ``host`` whose answer was read after ``since_ns``, if any."""
        lookup = self._lookups.get(host)
        return lookup if lookup is not None and lookup.read_ns >= since_ns else None

    async def resolve(
        self, host: str, port: int = 0, family: int = socket.AF_INET
    ) -> list[ResolveResult]:
        name = host.lower().rstrip(".")
        if name in self._hosts:
            addresses = self._hosts[name]
        else:
            addresses = await self._query(host, family)
        results = [_result(host, a, port) for a in addresses if _family_ok(a, family)]
        if not results:
            raise OSError(f"DNS: no address for {host!r} of the requested family")
        return results

    async def _query(self, host: str, family: int) -> list[str]:
        """A and AAAA in parallel (as getaddrinfo does); A first, so IPv4 is tried first."""
        if not self._servers:
            raise OSError("DNS: the system configuration names no nameserver")
        by_family: dict[int, list[str]] = {socket.AF_INET: ["A"], socket.AF_INET6: ["AAAA"]}
        types = by_family.get(family, ["A", "AAAA"])
        deadline = now_ns() + int(self.timeout * 1e9)
        # Every message built and socket opened first, then the first queries sent back to back:
        # that work is ours, and the stage runs from the first query on the wire.
        queries = [dns.message.make_query(host, t) for t in types]
        wires = [q.to_wire() for q in queries]
        channels = [_open(self._servers[0]) for _ in types]
        answers = [_Answer(t, sent_ns=now_ns(), queries=0) for t in types]
        for answer, channel, wire in zip(answers, channels, wires, strict=True):
            _send(answer, channel, wire)
        asks = (
            self._ask(*job, deadline) for job in zip(queries, wires, answers, channels, strict=True)
        )
        await asyncio.gather(*asks)
        self._note(host, answers)
        addresses = [a for answer in answers for a in answer.addresses]
        if addresses:
            return addresses
        raise OSError(self._failure(host, answers))

    def _note(self, host: str, answers: list[_Answer]) -> None:
        arrived = [(a, a.arrival) for a in answers if a.arrival is not None]
        if not arrived:
            return
        kernel = [(t.user_ns - t.kernel_ns) for a, t in arrived if a.stamped and t.kernel_ns]
        sent_kernel = all(a.sent_kernel for a in answers)
        self._lookups[host] = WireLookup(
            first_sent_ns=min(a.sent_ns for a in answers),
            answered_ns=max(t.wire_ns for _, t in arrived),
            read_ns=max(t.user_ns for _, t in arrived),
            clock_source="kernel" if sent_kernel and len(kernel) == len(arrived) else "userspace",
            queries=sum(a.queries for a in answers),
            transport="tcp" if any(a.tcp for a in answers) else "udp",
            read_lag_ns=max(kernel, default=0),
        )

    def _failure(self, host: str, answers: list[_Answer]) -> str:
        rcodes = [a.rcode for a in answers if a.rcode]
        if "NXDOMAIN" in rcodes:
            return f"DNS: {host!r} does not exist (NXDOMAIN)"
        if rcodes:
            return f"DNS: the nameserver answered {rcodes[0]} for {host!r}"
        if any(a.timed_out for a in answers):
            return f"DNS: no answer for {host!r} within {self.timeout} s"
        return f"DNS: no A/AAAA records for {host!r}"

    async def _ask(
        self,
        query: dns.message.Message,
        wire: bytes,
        answer: _Answer,
        channel: DatagramChannel | None,
        deadline: int,
    ) -> None:
        """One record type: UDP with retries (each server in turn), TCP when truncated.

        ``channel`` carries the first attempt, already sent (None: it could not be opened).
        """
        for attempt in range(_MAX_ATTEMPTS):
            left = (deadline - now_ns()) / 1e9
            if left <= 0:
                break
            server = self._servers[attempt % len(self._servers)]
            if attempt > 0:
                channel = _open(server)
                _send(answer, channel, wire)
            wait = min(left, _ATTEMPT_TIMEOUT * 2 ** (attempt // len(self._servers)))
            response = await _receive(answer, channel, query, wait)
            if response is None:
                continue
            if response.flags & dns.flags.TC:
                response = await self._tcp(answer, server, wire, query, (deadline - now_ns()) / 1e9)
                if response is None:
                    continue
            rcode = dns.rcode.to_text(response.rcode())
            if rcode == "NOERROR":
                answer.rcode = None
                answer.addresses = _addresses(response, answer.rdtype)
                return
            answer.rcode = rcode
            if rcode == "NXDOMAIN" or len(self._servers) == 1:
                return  # a definite answer; several servers: ask the next one
        if channel is not None:  # the deadline passed before the first attempt was awaited
            channel.close()
        if answer.rcode is None:
            answer.timed_out = True

    async def _tcp(
        self,
        answer: _Answer,
        server: tuple[str, int],
        wire: bytes,
        query: dns.message.Message,
        wait: float,
    ) -> dns.message.Message | None:
        if wait <= 0:
            return None
        answer.queries += 1
        try:
            _, arrival, stamped = await asyncio.wait_for(tcp_exchange(server, wire), wait)
            response = dns.message.from_wire(arrival.data)
        except (OSError, TimeoutError, asyncio.TimeoutError, dns.exception.DNSException):
            return None
        if not query.is_response(response):
            return None
        answer.arrival, answer.stamped, answer.tcp = arrival, stamped, True
        return response

    async def close(self) -> None:
        return None


def _send(answer: _Answer, channel: DatagramChannel | None, wire: bytes) -> None:
    if channel is None:
        return
    try:
        sent = channel.send(wire)
    except OSError:
        channel.close()
        return
    if answer.queries == 0:
        answer.sent_ns = sent
    answer.queries += 1
    _settle_first_send(answer, channel)


def _settle_first_send(answer: _Answer, channel: DatagramChannel) -> None:
    """The lookup's first query: the device's instant, where the kernel reported it."""
    if answer.queries == 1 and not answer.sent_kernel and channel.sent_kernel_ns is not None:
        answer.sent_ns, answer.sent_kernel = channel.sent_kernel_ns, True


async def _receive(
    answer: _Answer, channel: DatagramChannel | None, query: dns.message.Message, wait: float
) -> dns.message.Message | None:
    """The answer to ``query`` on ``channel`` within ``wait`` seconds (None: none came)."""
    if channel is None:
        return None
    try:
        return await asyncio.wait_for(_matching(channel, query, answer), wait)
    except (OSError, TimeoutError, asyncio.TimeoutError):
        return None
    finally:
        _settle_first_send(answer, channel)  # a device may report its stamp late
        channel.close()


def _open(server: tuple[str, int]) -> DatagramChannel | None:
    try:
        return DatagramChannel(server)
    except OSError:
        return None


_MAX_ATTEMPTS = 8  # sends per record type, across servers, within the lookup's lifetime
_ATTEMPT_TIMEOUT = 1.0  # seconds before the first resend; doubled per round of servers


async def _matching(
    channel: DatagramChannel, query: dns.message.Message, answer: _Answer
) -> dns.message.Message:
    """The first datagram that answers ``query`` (others, malformed or stale, are skipped)."""
    while True:
        arrival = await channel.receive()
        try:
            response = dns.message.from_wire(arrival.data)
        except dns.exception.DNSException:
            continue
        if query.is_response(response):
            answer.arrival, answer.stamped = arrival, channel.stamped
            return response


def _addresses(response: dns.message.Message, rdtype: str) -> list[str]:
    wanted = dns.rdatatype.from_text(rdtype)
    return [str(r.address) for rrset in response.answer if rrset.rdtype == wanted for r in rrset]


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


@functools.cache
def _warm_up() -> None:
    """Load what dnspython loads lazily on first use (the message code, the A/AAAA record
    classes): otherwise the first request's lookup counts our imports. Once per process: what
    it loads stays loaded, and a Client made per request would pay ~0.1 ms again each time."""
    for rdtype in ("A", "AAAA"):
        query = dns.message.make_query("warm.up.", rdtype)
        response = dns.message.make_response(query)
        dns.message.from_wire(response.to_wire())
    for kind in (dns.rdatatype.A, dns.rdatatype.AAAA, dns.rdatatype.CNAME):
        dns.rdata.get_rdata_class(dns.rdataclass.IN, kind)  # type: ignore[no-untyped-call]  # dnspython leaves it untyped


def _family_ok(address: str, family: int) -> bool:
    version = ipaddress.ip_address(address).version
    return family in (0, socket.AF_UNSPEC) or (family == socket.AF_INET) == (version == 4)


def _result(host: str, address: str, port: int) -> ResolveResult:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    return {
        "hostname": host,
        "host": address,
        "port": port,
        "family": family,
        "proto": 0,
        "flags": socket.AI_NUMERICHOST,
    }
