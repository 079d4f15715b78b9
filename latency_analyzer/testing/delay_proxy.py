"""A userspace TCP proxy that delays every chunk, in both directions, by a fixed one-way time.

On loopback the client's TCP handshake completes against the proxy's own listening socket,
so a client-side ``connect`` stays ~0 however large the delay: the delay shows up on the
first data exchanged instead. Each round trip through the proxy costs at least
``2 * delay``: a TLS handshake takes >= 2 x delay per handshake round trip, a request to its
response >= 2 x delay. The proxy connects to the target without delay.

A chunk's delay runs from the kernel's receive time of the read that brought it (see
:mod:`._rx`), not from when the proxy's loop got round to it: on a busy host loopback delivery
can wait hundreds of microseconds, and that wait is then inside the delay rather than added to
it, as it is inside a delay a network emulator adds to a packet.

It logs each chunk it relays (:class:`Relay`: the kernel's receive time, the instant of its
write), so an interval a client measures across the proxy has a truth of its own, the wire at
the client's side: the server's log leaves out the server's own work around it (its TLS,
its parsing) and the proxy's send path.

There is no back-pressure beyond pausing a reader while more than 4 MiB wait in its queue; it
is meant for request/response-sized traffic, not bulk transfers.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import enum
import socket
import time

from ._rx import RxSocket, rx_socket_of
from ._timing import Service, abort_with_rst, check_loopback, deadline_after, sleep_until

__all__ = ["DelayProxy", "Relay"]

_PAUSE_BYTES = 4 * 1024 * 1024
RELAYS_KEPT = 4096  # the proxy's log keeps the latest chunks: a bounded record


class _End(enum.Enum):
    EOF = "eof"
    RESET = "reset"


@dataclasses.dataclass(frozen=True)
class Relay:
    """One chunk the proxy relayed: ``upstream`` (client to target) or not, on which
    connection (its accept count), the kernel's receive time of the read that brought it,
    and the instant just before the proxy's write of it (``perf_counter_ns``)."""

    upstream: bool
    connection: int
    received_ns: int
    sent_ns: int
    size: int


class _Direction:
    """One direction of a proxied connection: chunks queued with deadlines, written in order."""

    def __init__(
        self,
        delay_ns: int,
        upstream: bool = True,
        connection: int = 0,
        log: collections.deque[Relay] | None = None,
    ) -> None:
        self.delay_ns = delay_ns
        self.upstream, self.connection = upstream, connection
        self.log = log
        self.queue: asyncio.Queue[tuple[int, bytes | _End]] = asyncio.Queue()
        self.source: asyncio.Transport | None = None
        self.pending = 0
        self.ended = False

    def push(self, item: bytes | _End, arrival_ns: int | None = None) -> None:
        """Queue ``item`` to be written ``delay`` after ``arrival_ns`` (default: now); only
        the first end counts."""
        if self.ended:
            return
        self.ended = isinstance(item, _End)
        arrival = time.perf_counter_ns() if arrival_ns is None else arrival_ns
        self.queue.put_nowait((arrival + self.delay_ns, item))
        if isinstance(item, bytes):
            self.pending += len(item)
            if self.pending > _PAUSE_BYTES and self.source is not None:
                self.source.pause_reading()

    async def pump(self, sink: asyncio.Transport) -> _End:
        """Write queued chunks to ``sink`` at their deadlines until the end; return it."""
        while True:
            deadline, item = await self.queue.get()
            await sleep_until(deadline)
            if isinstance(item, _End):
                _finish(sink, item)
                return item
            sent = time.perf_counter_ns()
            sink.write(item)
            if self.log is not None:
                received = deadline - self.delay_ns
                self.log.append(Relay(self.upstream, self.connection, received, sent, len(item)))
            self._drained(len(item))

    def _drained(self, size: int) -> None:
        was_paused = self.pending > _PAUSE_BYTES
        self.pending -= size
        if was_paused and self.pending <= _PAUSE_BYTES and self.source is not None:
            self.source.resume_reading()


def _finish(sink: asyncio.Transport, end: _End) -> None:
    """Propagate an end: a half-close (FIN) where possible, else a close; or an RST."""
    if sink.is_closing():
        return
    if end is _End.RESET:
        abort_with_rst(sink)
    elif sink.can_write_eof():
        try:
            sink.write_eof()
        except OSError:  # the peer reset the socket before its end was due (ENOTCONN)
            sink.close()
    else:
        sink.close()


class _Side(asyncio.Protocol):
    """Either socket of a proxied connection; what it reads goes to ``outgoing``."""

    def __init__(self, outgoing: _Direction) -> None:
        self.outgoing = outgoing
        self.transport: asyncio.Transport | None = None
        self.sock: RxSocket | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.sock = rx_socket_of(transport)
        self.outgoing.source = transport

    def data_received(self, data: bytes) -> None:
        self.outgoing.push(data, None if self.sock is None else self.sock.rx_ns)

    def eof_received(self) -> bool:
        self.outgoing.push(_End.EOF)
        return True  # keep our write side open: the other direction may still flow

    def connection_lost(self, exc: Exception | None) -> None:
        self.outgoing.push(_End.RESET if isinstance(exc, ConnectionError) else _End.EOF)


class DelayProxy(Service):
    """TCP proxy on loopback adding ``delay`` seconds to every chunk, each way.

    A chunk read from one side is written to the other at exactly ``arrival + delay``,
    ``arrival`` the kernel's receive time of the read that brought it (absolute deadlines,
    order kept per direction). EOF is propagated as a half-close and a
    reset as a reset. See the module docstring for what this does to client-side stages.

    Args:
        target_host: where to forward connections.
        target_port: port there.
        delay: one-way delay in seconds, applied in both directions.
        host: loopback address to listen on.
        port: leave 0 to let the OS pick.
        scheme: only used to build :attr:`url` ("https" when the target speaks TLS).

    Attributes:
        connections: client connections accepted.
        relays: the latest chunks relayed (:class:`Relay`, up to ``RELAYS_KEPT``): when each
            came and when it left, the wire's account of every delay the proxy added.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        delay: float = 0.005,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        scheme: str = "http",
    ) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.delay = delay
        self.scheme = scheme
        self._host = check_loopback(host)
        self._port = port
        self.connections = 0
        self.relays: collections.deque[Relay] = collections.deque(maxlen=RELAYS_KEPT)
        self._tasks: set[asyncio.Task[None]] = set()
        self._transports: set[asyncio.Transport] = set()

    @property
    def url(self) -> str:
        """``scheme://host:port`` of the proxy."""
        return self._base_url(self.scheme)

    async def start(self) -> None:
        """Start listening (on an :class:`RxSocket`: its connections are stamped too)."""
        await self._listen(self._accept, stamped=True)

    async def stop(self) -> None:
        """Stop listening and abort every proxied connection."""
        self._close_listener()
        for transport in list(self._transports):
            transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _accept(self) -> _Side:
        self.connections += 1
        delay_ns = deadline_after(0, self.delay)
        number, log = self.connections, self.relays
        upstream = _Direction(delay_ns, True, number, log)
        downstream = _Direction(delay_ns, False, number, log)
        client = _Side(upstream)
        task = asyncio.get_running_loop().create_task(self._relay(client, upstream, downstream))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return client

    async def _relay(self, client: _Side, upstream: _Direction, downstream: _Direction) -> None:
        """Connect to the target, then pump both directions until both have ended."""
        await asyncio.sleep(0)  # connection_made has run: client.transport is set
        assert client.transport is not None
        try:
            target = await self._connect(downstream)
        except OSError:
            abort_with_rst(client.transport)
            return
        transports = {client.transport, target}
        self._transports |= transports
        try:
            await self._pump_both(client.transport, target, upstream, downstream)
        finally:
            for transport in transports:
                transport.close()
            self._transports -= transports

    async def _connect(self, downstream: _Direction) -> asyncio.Transport:
        """A connection to the target over an :class:`RxSocket`, read by ``_Side(downstream)``."""
        loop = asyncio.get_running_loop()
        family, kind, proto, _, address = (
            await loop.getaddrinfo(self.target_host, self.target_port, type=socket.SOCK_STREAM)
        )[0]
        sock = RxSocket(family, kind, proto)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
            target, _ = await loop.create_connection(lambda: _Side(downstream), sock=sock)
        except BaseException:
            sock.close()
            raise
        return target

    async def _pump_both(
        self,
        client: asyncio.Transport,
        target: asyncio.Transport,
        upstream: _Direction,
        downstream: _Direction,
    ) -> None:
        up = asyncio.ensure_future(upstream.pump(target))
        down = asyncio.ensure_future(downstream.pump(client))
        try:
            done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            if any(t.result() is _End.RESET for t in done):
                return  # the RST was forwarded; the other direction dies with the sockets
            await asyncio.gather(up, down)
        finally:
            up.cancel()
            down.cancel()
