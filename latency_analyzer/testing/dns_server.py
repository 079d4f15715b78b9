"""A tiny authoritative DNS server (UDP and TCP) with a precisely injected answer delay."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import ipaddress
import time
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dns.exception
import dns.flags
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

from ._timing import Service, check_loopback, deadline_after, sleep_until

__all__ = ["DNSQuery", "DNSServer"]

_BIND_ATTEMPTS = 20


@dataclass(frozen=True)
class DNSQuery:
    """Ground truth for one query; instants are ``time.perf_counter_ns()`` values.

    Attributes:
        name: queried name, lower case, without the trailing dot.
        rdtype: record type, e.g. ``"A"``, ``"AAAA"``.
        transport: ``"udp"`` or ``"tcp"``.
        received_ns: query datagram (or TCP message) received.
        answered_ns: just before the answer was written, or None if dropped.
    """

    name: str
    rdtype: str
    transport: str
    received_ns: int
    answered_ns: int | None


def _normalize(name: str) -> str:
    return name.lower().rstrip(".")


class DNSServer(Service):
    """Answers A/AAAA queries for any name, after ``delay`` seconds.

    Args:
        delay: seconds between receiving a query and sending its answer (precise).
        records: name -> IPv4/IPv6 address strings; A queries get the IPv4 ones, AAAA
            queries the IPv6 ones. Names not listed get the defaults.
        default_a: the A answer for names not in ``records`` (None: empty answer).
        default_aaaa: the AAAA answer for names not in ``records`` (None: empty answer).
        nxdomain: names answered NXDOMAIN.
        drop: names never answered (to provoke resolver timeouts).
        ttl: TTL of every answer, in seconds.
        host: loopback address to bind (UDP and TCP on the same port).
        port: leave 0 to let the OS pick.

    Attributes:
        queries: (name, rdtype) of every query received, in order.
        log: one :class:`DNSQuery` per query, with timestamps.
    """

    def __init__(
        self,
        *,
        delay: float = 0.0,
        records: Mapping[str, Sequence[str]] | None = None,
        default_a: str | None = "127.0.0.1",
        default_aaaa: str | None = "::1",
        nxdomain: Iterable[str] = (),
        drop: Iterable[str] = (),
        ttl: int = 60,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.delay = delay
        self.records = {_normalize(k): list(v) for k, v in (records or {}).items()}
        self.default_a = default_a
        self.default_aaaa = default_aaaa
        self.nxdomain = {_normalize(n) for n in nxdomain}
        self.drop = {_normalize(n) for n in drop}
        self.ttl = ttl
        self._host = check_loopback(host)
        self._port = port
        self.queries: list[tuple[str, str]] = []
        self.log: list[DNSQuery] = []
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._bound_port = 0

    @property
    def address(self) -> str:
        """The bound address, e.g. ``"127.0.0.1"`` (the same as :attr:`host`)."""
        return self._host

    @property
    def nameserver(self) -> str:
        """``"127.0.0.1:PORT"`` (``"[::1]:PORT"`` for IPv6), as a resolver option takes it.

        The port is the same for UDP and TCP (0 until started).
        """
        return self._authority()

    async def start(self) -> None:
        """Bind UDP and TCP on one free port and start answering."""
        for _ in range(_BIND_ATTEMPTS):
            await self._bind_udp()
            try:
                await self._bind_tcp()
                return
            except OSError as exc:  # the UDP port is taken for TCP: try another one
                if exc.errno != errno.EADDRINUSE or self._port != 0:
                    raise
                self._close_udp()
        raise OSError(errno.EADDRINUSE, "no port free for both UDP and TCP")

    async def stop(self) -> None:
        """Stop answering, cancel pending (delayed) answers, close the sockets."""
        self._close_udp()
        if self._tcp is not None:
            self._tcp.close()
            self._tcp = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _bind_udp(self) -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _UDPProtocol(self), local_addr=(self._host, self._port)
        )
        self._udp = transport
        self._bound_port = int(transport.get_extra_info("sockname")[1])

    async def _bind_tcp(self) -> None:
        self._tcp = await asyncio.start_server(self._serve_tcp, self._host, self._bound_port)
        self._port = self._bound_port

    def _close_udp(self) -> None:
        if self._udp is not None:
            self._udp.close()
            self._udp = None

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer_udp(self, data: bytes, addr: Any, received_ns: int) -> None:
        index, answer = await self._answer(data, "udp", received_ns)
        if answer is not None and self._udp is not None:
            self._stamp_answer(index)
            self._udp.sendto(answer, addr)

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:  # so that stop() cancels it, and the socket is closed
            self._tasks.add(task)
        try:
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                await self._answer_tcp(reader, writer)
        finally:
            writer.close()
            self._tasks.discard(task)

    async def _answer_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer length-prefixed queries on one TCP connection until EOF."""
        while True:
            size = int.from_bytes(await reader.readexactly(2), "big")
            data = await reader.readexactly(size)
            index, answer = await self._answer(data, "tcp", time.perf_counter_ns())
            if answer is not None:
                self._stamp_answer(index)
                writer.write(len(answer).to_bytes(2, "big") + answer)
                await writer.drain()

    async def _answer(
        self, data: bytes, transport: str, received_ns: int
    ) -> tuple[int, bytes | None]:
        """Log the query; at ``received_ns + delay`` return (log index, wire answer or None)."""
        try:
            query = dns.message.from_wire(data)
            question = query.question[0]
        except (dns.exception.DNSException, IndexError):
            return -1, None
        name = _normalize(question.name.to_text())
        rdtype = dns.rdatatype.to_text(question.rdtype)
        self.queries.append((name, rdtype))
        self.log.append(DNSQuery(name, rdtype, transport, received_ns, None))
        index = len(self.log) - 1
        if name in self.drop:
            return index, None
        answer = self._response(query, name, question.rdtype).to_wire()  # before the deadline
        await sleep_until(deadline_after(received_ns, self.delay))
        return index, answer

    def _stamp_answer(self, index: int) -> None:
        """Record that the answer to ``log[index]`` is being written: stamped just before the
        write, so that a pause of this process after it cannot put the stamp after the answer
        reached the client (the log is a lower bound of the lookup on the wire)."""
        self.log[index] = dataclasses.replace(self.log[index], answered_ns=time.perf_counter_ns())

    def _response(
        self, query: dns.message.Message, name: str, rdtype: dns.rdatatype.RdataType
    ) -> dns.message.Message:
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        if name in self.nxdomain:
            response.set_rcode(dns.rcode.NXDOMAIN)
            return response
        addresses = self._addresses(name, rdtype)
        if addresses:
            qname = query.question[0].name
            rrset = dns.rrset.from_text_list(qname, self.ttl, dns.rdataclass.IN, rdtype, addresses)
            response.answer.append(rrset)
        return response

    def _addresses(self, name: str, rdtype: dns.rdatatype.RdataType) -> list[str]:
        """The answer addresses for ``name`` and an A or AAAA ``rdtype`` (else none)."""
        version = {dns.rdatatype.A: 4, dns.rdatatype.AAAA: 6}.get(rdtype)
        if version is None:
            return []
        if name in self.records:
            return [a for a in self.records[name] if ipaddress.ip_address(a).version == version]
        default = self.default_a if version == 4 else self.default_aaaa
        return [default] if default else []


class _UDPProtocol(asyncio.DatagramProtocol):
    def __init__(self, server: DNSServer) -> None:
        self._server = server

    def datagram_received(self, data: bytes, addr: Any) -> None:
        received_ns = time.perf_counter_ns()
        self._server._spawn(self._server._answer_udp(data, addr, received_ns))
