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
  (asyncio calls ``connection_made`` inside that read's callback). What we did after that
  arrival (certificate checks, key schedule, the read lag) is client time: it is the ``tls``
  attribute ``client_finish_ms`` and falls in ``other``.
* ``send``: just before the first send syscall that handed the kernel request bytes → just
  before the one that left nothing buffered (write buffer limits high=1/low=0, so
  ``resume_writing`` tells when a backlog drained).
* response headers and body bytes: the kernel's receive timestamp of the read that brought
  them (:mod:`._wire`), taken in ``data_received`` before aiohttp parses them; body bytes are
  stamped by offset, so a reader that falls behind still gets arrival times. Each read also
  notes its userspace instant: the difference is the client's read lag.
* ``TCP_INFO``: read once the connection is set up (after TLS), kept for every request the
  connection carries; the client reads it again at each request's end.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import socket
from collections.abc import Callable, Iterator
from typing import Any, cast

from aiohttp import ClientPayloadError, ClientRequest, ClientTimeout, TCPConnector
from aiohttp.client_proto import ResponseHandler
from aiohttp.connector import Connection
from aiohttp.helpers import is_ip_address
from aiohttp.tracing import Trace

from ..timeline import ConnectionInfo, TcpInfo, TlsInfo
from ._stale import note_discarded, peer_closed
from ._state import CURRENT, RequestState, now_ns
from ._tcpinfo import tcp_info_of
from ._wire import StampedSocket, WireStamps, wire_of
from .http2 import HandoffToHTTP2, HTTP2Refused
from .resolver import DnsResolver

__all__ = ["TimedConnector", "TimedProtocol"]

_connection_ids = itertools.count(1)


class _TimedTransport:
    """Delegates to the real transport; notes when request bytes are written."""

    __slots__ = ("_proto", "_transport")

    def __init__(self, transport: asyncio.Transport, proto: TimedProtocol) -> None:
        self._transport = transport
        self._proto = proto

    def write(self, data: Any) -> None:
        before = now_ns()
        self._transport.write(data)
        self._proto.after_write(before, self._transport.get_write_buffer_size())

    def writelines(self, chunks: Any) -> None:
        before = now_ns()
        self._transport.writelines(chunks)
        self._proto.after_write(before, self._transport.get_write_buffer_size())

    # aiohttp calls these on every read or release: direct methods, not __getattr__ lookups
    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class TimedProtocol(ResponseHandler):
    """aiohttp's response protocol, stamping request writes and response bytes."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.connection_id = next(_connection_ids)
        self.requests_served = 0
        self.made_ns: int | None = None
        self.made_user_ns: int | None = None
        self.state: RequestState | None = None
        # Bytes that came before the first request was attached: an HTTP/2 server's SETTINGS
        # may arrive with the end of the TLS handshake, before the hand-over to HTTP/2.
        self.early: list[tuple[bytes, int]] | None = []
        self.tls: TlsInfo | None = None  # what the handshake settled, for every request it carries
        self.tcp_connect: TcpInfo | None = None  # the kernel's TCP_INFO once set up
        self.wire: WireStamps | None = None  # the socket's read and send stamps
        self.last_write_ns = 0
        self.backlog = False
        self._marks: list[tuple[int, int]] = []  # (body bytes received so far, arrival ns)
        self._marked_payload: object = None
        # HTTP/2 hand-over at connection_made (the handshake's end), before asyncio and
        # aiohttp return the connection to the connector: the request leaves ~0.4 ms sooner
        self.on_made: Callable[[TimedProtocol, asyncio.Transport], None] | None = None
        self.handoff: HandoffToHTTP2 | BaseException | None = None

    # -- connection --
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.wire = wire = wire_of(transport)
        self.made_user_ns = now_ns()
        # over TLS, the read whose callback completed the handshake is the last one
        stamped = wire is not None and wire.read_user_ns
        self.made_ns = wire.read_kernel_ns if wire is not None and stamped else self.made_user_ns
        if self.on_made is not None:  # HTTP/2: its first flight leaves before our bookkeeping
            self.on_made(self, cast(asyncio.Transport, transport))
        super().connection_made(transport)
        transport = cast(asyncio.Transport, transport)
        # pause_writing as soon as a byte stays buffered, resume_writing when all left: the
        # edges of a send backlog. (high=0 would make asyncio's TLS transport pause while
        # empty and resume only on the next received record.)
        transport.set_write_buffer_limits(high=1, low=0)
        self.transport = cast(asyncio.Transport, _TimedTransport(transport, self))

    def attach(self, state: RequestState) -> None:
        """Pin the request now using this connection (protocol callbacks cannot see ContextVars)."""
        self.state = state
        # the previous response's payload may be aiohttp's shared empty one (HEAD, 204),
        # which the next bodiless response reuses: forget it, so new headers are seen as new
        self._payload = None
        early, self.early = self.early, None
        for data, _ in early or ():  # an HTTP/1.1 server that spoke first: let aiohttp judge
            super().data_received(data)
        self.last_write_ns = 0
        self.backlog = False
        self._marks = []
        self._marked_payload = None
        if self.wire is not None:
            self.wire.mark_request()

    def detach(self) -> None:
        self.state = None
        self.requests_served += 1

    # -- request bytes --
    def after_write(self, before_ns: int, buffered: int) -> None:
        """A request write returned; ``before_ns`` was read just before it was made."""
        state, wire = self.state, self.wire
        rec = state.recorder if state is not None else None
        if (
            state is not None
            and rec is not None
            and not rec.has("send")
            and not rec.is_open("send")
        ):
            first = wire.first_send_ns if wire is not None else None
            state.begin("send", before_ns if first is None else first)
        self.backlog = buffered > 0
        self.last_write_ns = _sent_ns(wire)

    def resume_writing(self) -> None:
        if self.backlog:  # the last request bytes just left our buffer
            wire = self.wire
            self.last_write_ns = _sent_ns(wire)
            self.backlog = False
        super().resume_writing()

    def close_send(self) -> None:
        """End ``send`` at the last write that left nothing buffered (called at headers)."""
        state = self.state
        if state is not None and state.recorder.is_open("send"):
            state.end("send", self.last_write_ns or now_ns(), backlog_at_headers=self.backlog)

    # -- response bytes --
    def data_received(self, data: bytes) -> None:
        wire = self.wire
        t = wire.read_kernel_ns if wire is not None and wire.read_user_ns else now_ns()
        state = self.state
        if state is None:
            if self.early is not None:  # before the first request: only HTTP/2 talks first
                self.early.append((data, t))
            else:
                super().data_received(data)
            return
        if wire is not None and data:  # b"": aiohttp resuming its parser, not a read
            state.recorder.read(t, wire.read_user_ns, wire.read_stamped, wire.refused)
        before = self._payload
        super().data_received(data)
        # a response that ended in this read on a connection that closes after it has had
        # its payload dropped already (aiohttp's close()): its last bytes still need a mark
        payload = self._payload if self._payload is not None else before
        if payload is None:
            return
        if payload is not before and state.recorder.headers_ns is None:
            self.close_send()
            state.recorder.response_headers(t)
        if payload is not self._marked_payload:
            self._marked_payload, self._marks = payload, []
        received = payload.total_bytes
        if not self._marks or received > self._marks[-1][0]:
            self._marks.append((received, t))
        if state.body_end_ns is None and payload.is_eof():
            state.body_end_ns = t

    def connection_lost(self, exc: BaseException | None) -> None:
        # A body without length framing is read until the connection ends, and aiohttp ends it
        # as complete however the connection went: an RST would record a cut body as a success.
        payload = self._payload
        if exc is not None and payload is not None and not payload.is_eof():
            cut = ClientPayloadError(f"connection lost before the body ended: {exc!r}")
            payload.set_exception(cut, exc)
        super().connection_lost(exc)

    def arrivals(self, offset: int, data: bytes) -> Iterator[tuple[bytes, int]]:
        """Split body bytes read at ``offset`` into pieces with the time each piece arrived."""
        end, pos = offset + len(data), offset
        for received, t in self._marks:
            if received <= pos:
                continue
            cut = min(received, end)
            yield data[pos - offset : cut - offset], t
            pos = cut
            if pos >= end:
                return
        if pos < end:  # bytes no data_received stamped (cannot happen): the read time is next best
            yield data[pos - offset :], now_ns()

    def forget_marks_before(self, offset: int) -> None:
        """Drop marks fully consumed, so a long stream keeps the list short."""
        keep = 0
        while keep < len(self._marks) - 1 and self._marks[keep][0] <= offset:
            keep += 1
        if keep:
            del self._marks[:keep]


class _PromptSocket(StampedSocket):
    """A socket whose non-blocking ``connect`` says so when the handshake is already done.

    A non-blocking ``connect`` returns EINPROGRESS even when the kernel completed the handshake
    within the call, as it does on loopback. asyncio then waits for writability, two event-loop
    iterations that the connect stage would count as TCP time (60-80 µs measured here). One
    ``getpeername`` tells a finished handshake from a pending one; a pending one (any real
    network) is left to asyncio exactly as before.

    The request that dials it (``state``, from the dialling task's context) gets its
    ``connect`` stage from here: begun just before the syscall, ended at the SYN-ACK as the
    kernel timed it (:func:`_handshake_end`), at once for a prompt handshake, at the
    protocol factory call for a pending one.
    """

    __slots__ = ("state",)

    def __init__(self, family: int, type_: int, proto: int, fileno: int | None = None) -> None:
        super().__init__(family, type_, proto, fileno)
        self.state: RequestState | None = None

    def connect(self, address: Any) -> None:
        state, self.state = self.state, None  # not kept: the socket outlives the request
        opens = state is not None and not _seen(state, "connect")  # a dial's first socket
        wire = self.wire
        # Nothing between the stamp and the syscall that could allocate (a garbage
        # collection would run there) or wait: the SYN leaves inside the call.
        t = now_ns()
        try:
            _socket_connect(self, address)
        except BlockingIOError as pending:
            done = now_ns()
            try:
                self.getpeername()
            except OSError:
                wire.connect_ns = t
                if state is not None:
                    if opens:
                        state.begin("connect", t)
                    state.dialled = [*(state.dialled or ()), self]
                raise pending from None
        else:
            done = now_ns()
        wire.connect_ns, wire.connected_ns = t, done
        if state is None:
            return
        if opens:
            state.begin("connect", t)
        if state.recorder.is_open("connect"):
            end, source = _handshake_end(self, t, done)
            state.end("connect", end, clock_source=source)


_socket_connect = socket.socket.connect  # the C method itself: no super() object to build


def _handshake_end(sock: StampedSocket, connect_ns: int, now: int) -> tuple[int, str]:
    """When the SYN-ACK came: the connect's start plus the kernel's handshake RTT.

    ``TCP_INFO``'s ``tcpi_rtt`` before any data has been sent is the connection's first RTT
    sample, SYN → SYN-ACK in µs (the smoothed RTT starts at the first sample), taken by the
    kernel whenever our loop got round to the socket. A retransmitted SYN gives no clean
    sample (Karn): then, or without a reading, the end is ``now`` and says ``userspace``.
    """
    rtt = sock.handshake_rtt_ns()
    if rtt is None or not connect_ns + rtt <= now:
        return now, "userspace"
    return connect_ns + rtt, "kernel"


def _pending_handshake_end(state: RequestState, now: int) -> tuple[int, str]:
    """The end of a handshake asyncio waited for: the connected socket's SYN-ACK, as the
    kernel timed it, read before any byte is sent on it (``now``: the factory call)."""
    dialled, state.dialled = state.dialled or [], None
    for sock in dialled:
        if sock.fileno() == -1 or sock.wire.connect_ns is None:  # a happy-eyeballs loser
            continue
        try:
            sock.getpeername()
        except OSError:
            continue
        return _handshake_end(sock, sock.wire.connect_ns, now)
    return now, "userspace"


def _sent_ns(wire: WireStamps | None) -> int:
    """Entry of the latest send syscall: the kernel holds the bytes from there on (its return
    can be late by however long we were descheduled inside it)."""
    return wire.send_start_ns if wire is not None and wire.send_start_ns else now_ns()


def _seen(state: RequestState, stage: str) -> bool:
    """The stage is open or done on this request."""
    return state.recorder.is_open(stage) or state.recorder.has(stage)


def _socket_factory(addr_info: tuple[Any, ...]) -> socket.socket:
    family, type_, proto = addr_info[:3]
    sock = _PromptSocket(family, type_, proto)
    sock.state = CURRENT.get()
    return sock


class TimedConnector(TCPConnector):
    """A TCPConnector whose connection work is recorded on the current request."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("socket_factory", _socket_factory)
        super().__init__(**kwargs)
        loop = self._loop
        factory: Any = functools.partial(TimedProtocol, loop)
        self._factory = factory

    async def connect(
        self, req: ClientRequest, traces: list[Trace], timeout: ClientTimeout
    ) -> Connection:
        state = CURRENT.get()
        if state is None:
            return await super().connect(req, traces, timeout)
        if not state.recorder.is_open("pool_wait"):  # else: already waiting on another's dial
            state.begin("pool_wait", now_ns())
        conn = await super().connect(req, traces, timeout)
        stale = 0
        # a pooled connection the server closed while idle, its FIN not read yet (._stale):
        # closed unused, the next one taken; each turn takes one out of the pool
        while cast(TimedProtocol, conn.protocol).requests_served and peer_closed(conn.protocol):
            stale += 1
            conn.close()
            conn = await super().connect(req, traces, timeout)
        if stale:
            note_discarded(state, stale)
        if state.recorder.is_open("pool_wait"):  # reused: no new connection was opened
            state.end("pool_wait", now_ns())
        proto = cast(TimedProtocol, conn.protocol)
        state.recorder.connection = ConnectionInfo(
            reused=not state.recorder.has("connect"),
            connection_id=proto.connection_id,
            peer=_peer(proto),
            requests_before=proto.requests_served,
        )
        if proto.tls is not None:
            state.recorder.tls = proto.tls  # reused connections report the TLS they travel on
        state.recorder.tcp_connect = proto.tcp_connect
        proto.attach(state)
        state.protocol = proto
        return conn

    async def _create_connection(
        self, req: ClientRequest, traces: list[Trace], timeout: ClientTimeout
    ) -> ResponseHandler:
        state = CURRENT.get()
        if state is not None and state.recorder.is_open("pool_wait"):
            state.end("pool_wait", now_ns())
        return await super()._create_connection(req, traces, timeout)

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


def _maybe_hand_over(
    state: RequestState,
    transport: asyncio.Transport,
    proto: ResponseHandler,
    info: TlsInfo | None,
    tls: bool,
) -> None:
    """Leave aiohttp for HTTP/2 when ALPN chose ``h2`` (or ``h2c`` by prior knowledge)."""
    if state.h2_mode is None:
        return
    alpn = info.alpn if info is not None else None
    if tls and state.h2_mode == "require" and alpn != "h2":
        transport.close()
        chosen = repr(alpn) if alpn else "no protocol"
        raise HTTP2Refused(f"HTTP/2 required but the server's ALPN chose {chosen} (we offered h2)")
    if tls and alpn != "h2" and state.alpn_settled is not None:  # HTTP/1.1: tell the waiters
        state.alpn_settled()
        state.alpn_settled = None
    done = cast(TimedProtocol, proto).handoff
    if isinstance(done, BaseException):  # HandoffToHTTP2 (ready to raise) or what h2_open raised
        raise done
    if alpn == "h2" or (not tls and state.h2_mode == "require"):
        transport.pause_reading()  # nothing more for aiohttp's parser; the new owner resumes
        early = cast(TimedProtocol, proto).early or []
        handoff = HandoffToHTTP2(transport, info, _peer(proto), early)
        if state.h2_open is not None:  # the request goes out now, not after the unwinding
            state.h2_open(handoff)
        raise handoff


def _hand_over_at_once(
    state: RequestState,
    tls: bool,
    server_hostname: object,
    proto: TimedProtocol,
    transport: asyncio.Transport,
) -> None:
    """At ``connection_made``: when this is an HTTP/2 connection, open it and send now.

    What ``_maybe_hand_over`` would do once the connection is back in the connector, minus
    the failure cases, which are left to it (HTTP/1.1 chosen, ``h2`` required and refused).
    """
    info = _tls_info(transport, server_hostname) if tls else None
    alpn = info.alpn if info is not None else None
    if state.h2_open is None or not (alpn == "h2" or (not tls and state.h2_mode == "require")):
        return
    transport.pause_reading()
    handoff = HandoffToHTTP2(transport, info, _peer_of(transport), [])
    try:
        state.h2_open(handoff)
    except Exception as exc:  # raised from the connector, not inside asyncio's callback
        proto.handoff = exc
        return
    state.h2_open = None
    proto.handoff = handoff


def _tls_info(transport: asyncio.BaseTransport, server_hostname: object) -> TlsInfo:
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return TlsInfo(server_hostname=str(server_hostname) if server_hostname else None)
    cipher = ssl_object.cipher()
    return TlsInfo(
        version=ssl_object.version(),
        cipher=cipher[0] if cipher else None,
        alpn=ssl_object.selected_alpn_protocol(),
        session_reused=ssl_object.session_reused,
        server_hostname=str(server_hostname) if server_hostname else None,
    )


def _peer(proto: ResponseHandler) -> str | None:
    return _peer_of(proto.transport)


def _peer_of(transport: asyncio.BaseTransport | None) -> str | None:
    peer = transport.get_extra_info("peername") if transport is not None else None
    if not peer:
        return None
    host, port = peer[0], peer[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
