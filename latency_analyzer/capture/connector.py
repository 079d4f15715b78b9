"""aiohttp connector and protocol that time pool wait, DNS, TCP connect, TLS and the bytes.

Where each instant comes from:

* ``pool_wait``: ``connect()`` entry → a pooled connection handed over, or a slot free to
  open one (aiohttp's limit reached: the request queues here).
* ``dns``: from the first query handed to the kernel (or this request's ``_resolve_host``
  call, if it came to wait on a lookup already under way: aiohttp shares concurrent ones) to
  the kernel's arrival of the last answer the lookup needed (:mod:`.resolver`). Building and
  parsing messages, and the loop's delay in reading an answer, fall outside it (``other``).
* ``connect``: just before the socket's ``connect`` syscall (the SYN leaves inside it) → that
  instant plus the kernel's handshake RTT (``TCP_INFO``'s first sample is SYN → SYN-ACK, read
  before any byte is sent), so neither a late return from the syscall nor a late wake-up of
  our loop moves it; ``clock_source`` says ``kernel``. Sockets come from
  :func:`_socket_factory`, whose ``connect`` reports a handshake the kernel finished inside
  the syscall (loopback, a local proxy) at once; a handshake still pending (any real network)
  is read at the protocol factory call, which asyncio makes once the socket is writable and
  before any TLS byte. Without a clean sample (a retransmitted SYN, another OS) the end is
  the userspace instant and ``clock_source`` says ``userspace``.
* ``tls``: factory call → the kernel's arrival time of the read that completed the handshake
  (asyncio calls ``connection_made`` inside that read's callback). A dial that offers ``h2``
  runs its handshake in a worker thread instead (:mod:`._tlsthread`: the request's first
  flight leaves with the Finished, as a C client sends it); the thread's last read is that
  read, and :class:`~._tlstransport.TlsTransport` carries the session from there. What we did
  after that arrival (certificate checks, key schedule, the read lag, the thread's hand-back)
  is client time: it is the ``tls`` attribute ``client_finish_ms`` and falls in ``other``.
* ``send``: just before the first send syscall that handed the kernel request bytes → just
  before the one that left nothing buffered (write buffer limits high=1/low=0, so
  ``resume_writing`` tells when a backlog drained).
* response headers and body bytes: the kernel's receive timestamp of the read that brought
  them (:mod:`._wire`), taken in ``data_received`` before aiohttp parses them; body bytes are
  stamped by offset, so a reader that falls behind still gets arrival times. Each read also
  notes its userspace instant: the difference is the client's read lag.
* ``TCP_INFO``: read once the connection is set up (after TLS), kept for every request the
  connection carries; the client reads it again at each request's end.

The connector is the one dialer: :meth:`TimedConnector.dial` opens a request's connection
(socket, TLS, ALPN) before any HTTP is spoken on it and returns it as what it became: an
aiohttp ``Connection`` for HTTP/1.1, which the request's exchange then takes (``connect``
hands it over instead of looking for one), or a :class:`~.http2.HandoffToHTTP2` carrying the
HTTP/2 connection and the request's stream, already sent.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import Callable
from typing import Any, cast

import aiohappyeyeballs
from aiohttp import ClientConnectionError, ClientRequest, ClientTimeout, TCPConnector
from aiohttp.client_exceptions import (
    ClientConnectorCertificateError,
    ClientConnectorError,
    ClientConnectorSSLError,
    cert_errors,
    ssl_errors,
)
from aiohttp.client_proto import ResponseHandler
from aiohttp.connector import Connection
from aiohttp.helpers import ceil_timeout, is_ip_address
from aiohttp.tracing import Trace
from yarl import URL

from ..timeline import TlsInfo
from ..timeline._info import connection_info
from ._dial import _pending_handshake_end, _seen, _socket_factory
from ._handover import _hand_over_at_once, _maybe_hand_over, _peer, _tls_info
from ._protocol import TimedProtocol
from ._stale import note_discarded, peer_closed
from ._state import CURRENT, RequestState, now_ns
from ._tcpinfo import tcp_info_of
from ._tlsthread import handshake_in_thread
from ._tlstransport import TlsTransport
from ._wire import StampedSocket
from .http2 import HandoffToHTTP2, PreparedStart
from .resolver import DnsResolver

__all__ = ["TimedConnector", "TimedProtocol"]

_DIAL_REQUESTS_KEPT = 64  # origins whose dial request is kept built
# per origin, what a dial hands aiohttp's connect: it reads only the request's URL, TLS
# setting and connection key (its loop only on a proxy's path, which a dial never takes),
# so one serves every connector in the process; a new Client's first dial does not build it
# again (~35 µs)
_DIAL_REQUESTS: dict[str, ClientRequest] = {}


class TimedConnector(TCPConnector):
    """A TCPConnector whose connection work is recorded on the current request."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("socket_factory", _socket_factory)
        super().__init__(**kwargs)
        loop = self._loop
        factory: Any = functools.partial(TimedProtocol, loop)
        self._factory = factory

    async def dial(
        self, state: RequestState, origin: str, url: str, timeout: ClientTimeout
    ) -> Connection | HandoffToHTTP2:
        """A connection to ``url``'s origin (``origin`` names it) for the request ``state``,
        from the pool or dialled, before any HTTP is spoken on it: HTTP/1.1 as aiohttp's
        ``Connection`` (left on ``state.ready`` for the exchange to take), or what ALPN gave
        to HTTP/2. aiohttp's pool, limits and errors apply as for any of its connects."""
        req = _DIAL_REQUESTS.get(origin)
        if req is None:  # only its URL, TLS and key are read, so one serves every dial
            if len(_DIAL_REQUESTS) >= _DIAL_REQUESTS_KEPT:  # redirects choose origins
                _DIAL_REQUESTS.clear()
            where = URL(url).origin()  # scheme, host and port: no user info, path or query
            req = _DIAL_REQUESTS[origin] = ClientRequest("GET", where, loop=self._loop)
        conn = await self._connect(state, req, [], timeout)
        handoff, state.handoff = state.handoff, None
        if handoff is None:
            state.ready = conn
            return conn
        self._forget(conn)
        return cast(HandoffToHTTP2, handoff)

    def _forget(self, conn: Connection) -> None:
        """Let go of ``conn`` without closing it (HTTP/2 owns its transport now): out of the
        pool's count, as aiohttp's own release takes it out, and out of the Connection."""
        proto = conn.protocol
        if proto is not None:
            self._release_acquired(conn._key, proto)
            conn._protocol = None

    async def connect(
        self, req: ClientRequest, traces: list[Trace], timeout: ClientTimeout
    ) -> Connection:
        state = CURRENT.get()
        if state is None:
            return await super().connect(req, traces, timeout)
        ready, state.ready = state.ready, None
        if ready is not None:  # the dialer opened it for this request: set up already
            return cast(Connection, ready)
        conn = await self._connect(state, req, traces, timeout)
        handoff, state.handoff = state.handoff, None
        if handoff is not None:  # HTTP/2 on a connection opened to resend HTTP/1.1 (._stale)
            self._forget(conn)
            cast(HandoffToHTTP2, handoff).transport.close()
            raise ClientConnectionError("the server chose HTTP/2 on a connection for HTTP/1.1")
        return conn

    async def _connect(
        self, state: RequestState, req: ClientRequest, traces: list[Trace], timeout: ClientTimeout
    ) -> Connection:
        if not state.recorder.is_open("pool_wait"):  # else: already waiting on another's dial
            state.begin("pool_wait", now_ns())
        conn = await super().connect(req, traces, timeout)
        proto: Any = conn.protocol  # a TimedProtocol: this connector's factory makes them
        stale = 0
        # a pooled connection the server closed while idle, its FIN not read yet (._stale):
        # closed unused, the next one taken; each turn takes one out of the pool
        while state.handoff is None and proto.requests_served and peer_closed(proto):
            stale += 1
            conn.close()
            conn = await super().connect(req, traces, timeout)
            proto = conn.protocol
        if stale:
            note_discarded(state, stale)
        if state.handoff is not None:  # HTTP/2's now: nothing of aiohttp's to set up
            return conn
        rec = state.recorder
        if rec.is_open("pool_wait"):  # reused: no new connection was opened
            state.end("pool_wait", now_ns())
        peer = proto.peer
        if peer is None:  # once per connection, not per request
            proto.peer = peer = _peer(proto)
        rec.connection = connection_info(
            not rec.has("connect"), proto.connection_id, peer, proto.requests_served
        )
        if proto.tls is not None:
            rec.tls = proto.tls  # reused connections report the TLS they travel on
        rec.tcp_connect = proto.tcp_connect
        proto.attach(state)
        state.protocol = proto
        return conn

    async def _create_connection(
        self, req: ClientRequest, traces: list[Trace], timeout: ClientTimeout
    ) -> ResponseHandler:
        state = CURRENT.get()
        if state is not None and state.hold is not None and not state.hold.released:
            await state.hold.wait()  # prepared ahead: a new connection is dialled at the instant
        if state is not None and state.recorder.is_open("pool_wait"):
            state.end("pool_wait", now_ns())
        return await super()._create_connection(req, traces, timeout)

    async def _dial_tls_in_thread(
        self,
        factory: Callable[[], ResponseHandler],
        flight: _Flight,
        *,
        addr_infos: list[Any],
        req: ClientRequest,
        timeout: ClientTimeout,
        ssl: Any,
        server_hostname: str | None = None,
        client_error: type[Exception] = ClientConnectorError,
        **_: Any,
    ) -> tuple[asyncio.Transport, ResponseHandler]:
        """aiohttp's ``_wrap_create_connection`` with the TLS handshake in a worker thread:
        the same socket dial (happy eyeballs, our socket factory), bound and error mapping;
        then :func:`~._tlsthread.handshake_in_thread` and a :class:`~._tlstransport.TlsTransport`
        in place of asyncio's TLS transport."""
        try:
            async with ceil_timeout(timeout.sock_connect, ceil_threshold=timeout.ceil_threshold):
                if len(addr_infos) == 1 and not self._local_addr_infos:
                    sock = await self._connect_one(addr_infos[0])
                else:
                    sock = await aiohappyeyeballs.start_connection(
                        addr_infos=addr_infos,
                        local_addr_infos=self._local_addr_infos,
                        happy_eyeballs_delay=self._happy_eyeballs_delay,
                        interleave=self._interleave,
                        loop=self._loop,
                        socket_factory=self._socket_factory,
                    )
                if not isinstance(sock, StampedSocket):  # not made by our factory
                    return await self._loop.create_connection(
                        factory, ssl=ssl, server_hostname=server_hostname, sock=sock
                    )
                try:
                    proto = factory()  # before the ClientHello, as asyncio calls it
                except BaseException:
                    sock.close()
                    raise
                bound = timeout.sock_connect or timeout.total
                done = await handshake_in_thread(sock, ssl, server_hostname, bound, flight.encode)
                transport = TlsTransport(
                    self._loop,
                    sock,
                    done.obj,
                    done.incoming,
                    done.outgoing,
                    ssl,
                    done.early,
                    done.unsent,
                    done.ended,
                )
                flight.settle(done.flight_sent_ns)
                transport.start(proto)
                return transport, proto
        except cert_errors as exc:
            raise ClientConnectorCertificateError(req.connection_key, exc) from exc
        except ssl_errors as exc:
            raise ClientConnectorSSLError(req.connection_key, exc) from exc
        except OSError as exc:
            if exc.errno is None and isinstance(exc, asyncio.TimeoutError):
                raise
            raise client_error(req.connection_key, exc) from exc

    async def _connect_one(self, addr_info: Any) -> socket.socket:
        """One address to dial (no race to run): the socket's ``connect`` straight away, as
        asyncio's ``sock_connect`` would make it, without its future and address checks
        when the handshake completes inside the call (loopback, a local proxy)."""
        sock = (self._socket_factory or socket.socket)(addr_info)
        address = addr_info[4]
        try:
            sock.setblocking(False)
            try:
                sock.connect(address)
            except BlockingIOError:  # under way: asyncio's wait for writability
                loop = self._loop
                fd = sock.fileno()
                writable: asyncio.Future[None] = loop.create_future()
                loop.add_writer(fd, _settle, writable)
                try:
                    await writable
                finally:
                    loop.remove_writer(fd)
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, f"Connect call failed {address}") from None
        except BaseException:
            sock.close()
            raise
        return sock

    async def _resolve_host(self, host: str, port: int, traces: Any = None) -> Any:
        state = CURRENT.get()
        if state is None or is_ip_address(host):
            return await super()._resolve_host(host, port, traces)
        began = now_ns()
        state.begin("dns", began, host=host)
        result = await super()._resolve_host(host, port, traces)
        addresses = ",".join(str(r["host"]) for r in result)
        resolver = self._resolver
        lookup = resolver.wire_lookup(host, began) if isinstance(resolver, DnsResolver) else None
        if lookup is None:  # a cached or hosts-file answer: no query went out
            state.end("dns", now_ns(), addresses=addresses, clock_source="userspace", queries=0)
            return result
        state.recorder.move_start("dns", max(began, lookup.first_sent_ns))
        state.end("dns", lookup.answered_ns, addresses=addresses, **lookup.attributes())
        return result

    async def _wrap_create_connection(
        self, *args: Any, req: ClientRequest, **kwargs: Any
    ) -> tuple[asyncio.Transport, ResponseHandler]:
        state = CURRENT.get()
        if state is None:
            return await super()._wrap_create_connection(*args, req=req, **kwargs)
        factory, *rest = args
        tls = bool(kwargs.get("ssl"))

        entry = now_ns()
        # a dial that may become HTTP/2: its handshake runs in a worker thread, and the
        # request's first flight leaves with the Finished (._tlsthread)
        threaded: _Flight | None = None
        if tls and state.h2_prepare is not None:
            threaded = _Flight(state.h2_prepare)
            state.h2_prepare = None

        def timed_factory() -> ResponseHandler:
            t = now_ns()
            if not _seen(state, "connect"):  # a socket not of ours
                state.begin("connect", entry)
            if state.recorder.is_open("connect"):  # a handshake asyncio waited for
                end, source = _pending_handshake_end(state, t)
                state.end("connect", end, clock_source=source)
            if tls and not _seen(state, "tls"):
                state.begin("tls", t)
            proto = cast(TimedProtocol, factory())
            prepare, state.h2_prepare = state.h2_prepare, None
            if tls and prepare is not None:
                # after asyncio's own callbacks that send the ClientHello, queued next
                loop = asyncio.get_running_loop()
                loop.call_soon(loop.call_soon, prepare)
            if state.h2_open is not None:
                hostname = kwargs.get("server_hostname")
                proto.on_made = functools.partial(_hand_over_at_once, state, tls, hostname)
            return proto

        try:
            if threaded is not None:
                transport, proto = await self._dial_tls_in_thread(
                    timed_factory, threaded, req=req, **kwargs
                )
            else:
                transport, proto = await super()._wrap_create_connection(
                    timed_factory, *rest, req=req, **kwargs
                )
        except BaseException:
            if not _seen(state, "connect"):
                state.begin("connect", entry)  # failed before a socket connected: still shown
            raise
        info: TlsInfo | None = None
        if tls and state.recorder.is_open("tls"):
            timed = cast(TimedProtocol, proto)
            made = timed.made_ns or now_ns()
            info = _tls_info(transport, kwargs.get("server_hostname"))
            timed.tls = info
            # our own handshake work after the server's last flight arrived (certificate
            # checks, key schedule) plus the read lag: client time, left to ``other``
            after = (timed.made_user_ns or made) - made
            state.end(
                "tls",
                made,
                version=info.version,
                alpn=info.alpn,
                resumed=info.session_reused,
                client_finish_ms=after / 1e6,
            )
        cast(TimedProtocol, proto).tcp_connect = state.recorder.tcp_connect = tcp_info_of(transport)
        _maybe_hand_over(state, transport, proto, info, tls)
        return transport, proto


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Flight:
    """An HTTP/2 dial's first flight: encoded by ``prepare`` (``RequestState.h2_prepare``)
    while the handshake runs in its thread, and marked sent if the thread sent it."""

    __slots__ = ("prepare", "prepared")

    def __init__(self, prepare: Callable[[], PreparedStart | None]) -> None:
        self.prepare = prepare
        self.prepared: PreparedStart | None = None

    def encode(self) -> bytes | None:
        prepared = self.prepared = self.prepare()
        if prepared is None:
            return None
        prepared.flight = prepared.machine.data_to_send()  # the loop's to write, unless sent
        return prepared.flight

    def settle(self, sent_ns: int) -> None:
        if self.prepared is not None and sent_ns:
            self.prepared.sent_ns = sent_ns
