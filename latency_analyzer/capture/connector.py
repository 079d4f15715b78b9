"""aiohttp connector and protocol that time pool wait, DNS, TCP connect, TLS and the bytes.

Where each instant comes from:

* ``pool_wait``: ``connect()`` entry → a pooled connection handed over, or a slot free to
  open one (aiohttp's limit reached: the request queues here).
* ``dns``: the whole ``_resolve_host`` call of *this* request, so a request that waits on
  another's lookup (aiohttp throttles concurrent lookups) shows the time it really waited.
* ``connect``: ``_wrap_create_connection`` entry → the protocol factory call. asyncio calls the
  factory once the socket is connected and before any TLS byte, so this splits TCP from TLS.
  Sockets come from :func:`_socket_factory`, whose ``connect`` reports a handshake the kernel
  finished inside the syscall (loopback, a local proxy) at once, instead of after asyncio's
  two loop iterations for writability (~60-80 µs that are not TCP time).
* ``tls``: factory call → ``connection_made``, which asyncio calls after the handshake.
* ``send``: first ``transport.write`` of the request → the moment its last byte left our
  buffer (write buffer limits high=1/low=0, so ``resume_writing`` tells when a backlog
  drained).
* response headers and body bytes: stamped in ``data_received`` before aiohttp parses them;
  body bytes are stamped by offset, so a reader that falls behind still gets arrival times.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import socket
from collections.abc import Iterator
from typing import Any, cast

from aiohttp import ClientPayloadError, ClientRequest, ClientTimeout, TCPConnector
from aiohttp.client_proto import ResponseHandler
from aiohttp.connector import Connection
from aiohttp.helpers import is_ip_address
from aiohttp.tracing import Trace

from ..timeline import ConnectionInfo, TlsInfo
from ._state import CURRENT, RequestState, now_ns
from .http2 import HandoffToHTTP2, HTTP2Refused

__all__ = ["TimedConnector", "TimedProtocol"]

_connection_ids = itertools.count(1)


class _TimedTransport:
    """Delegates to the real transport; notes when request bytes are written."""

    __slots__ = ("_proto", "_transport")

    def __init__(self, transport: asyncio.Transport, proto: TimedProtocol) -> None:
        self._transport = transport
        self._proto = proto

    def write(self, data: Any) -> None:
        self._proto.before_write()
        self._transport.write(data)
        self._proto.after_write(self._transport.get_write_buffer_size())

    def writelines(self, chunks: Any) -> None:
        self._proto.before_write()
        self._transport.writelines(chunks)
        self._proto.after_write(self._transport.get_write_buffer_size())

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
        self.state: RequestState | None = None
        # Bytes that came before the first request was attached: an HTTP/2 server's SETTINGS
        # may arrive with the end of the TLS handshake, before the hand-over to HTTP/2.
        self.early: list[tuple[bytes, int]] | None = []
        self.tls: TlsInfo | None = None  # what the handshake settled, for every request it carries
        self.last_write_ns = 0
        self.backlog = False
        self._marks: list[tuple[int, int]] = []  # (body bytes received so far, arrival ns)
        self._marked_payload: object = None

    # -- connection --
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made_ns = now_ns()
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

    def detach(self) -> None:
        self.state = None
        self.requests_served += 1

    # -- request bytes --
    def before_write(self) -> None:
        state = self.state
        if (
            state is not None
            and not state.recorder.has("send")
            and not state.recorder.is_open("send")
        ):
            state.begin("send", now_ns())

    def after_write(self, buffered: int) -> None:
        self.last_write_ns = now_ns()
        self.backlog = buffered > 0

    def resume_writing(self) -> None:
        if self.backlog:  # the last request bytes just left our buffer
            self.last_write_ns = now_ns()
            self.backlog = False
        super().resume_writing()

    def close_send(self) -> None:
        """End ``send`` at the last write that left nothing buffered (called at headers)."""
        state = self.state
        if state is not None and state.recorder.is_open("send"):
            state.end("send", self.last_write_ns or now_ns(), backlog_at_headers=self.backlog)

    # -- response bytes --
    def data_received(self, data: bytes) -> None:
        t = now_ns()
        state = self.state
        if state is None:
            if self.early is not None:  # before the first request: only HTTP/2 talks first
                self.early.append((data, t))
            else:
                super().data_received(data)
            return
        before = self._payload
        super().data_received(data)
        payload = self._payload
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


class _PromptSocket(socket.socket):
    """A socket whose non-blocking ``connect`` says so when the handshake is already done.

    A non-blocking ``connect`` returns EINPROGRESS even when the kernel completed the handshake
    within the call, as it does on loopback. asyncio then waits for writability, two event-loop
    iterations that the connect stage would count as TCP time (60-80 µs measured here). One
    ``getpeername`` tells a finished handshake from a pending one; a pending one (any real
    network) is left to asyncio exactly as before.
    """

    __slots__ = ()

    def connect(self, address: Any) -> None:
        try:
            super().connect(address)
        except BlockingIOError as pending:
            try:
                self.getpeername()
            except OSError:
                raise pending from None


def _socket_factory(addr_info: tuple[Any, ...]) -> socket.socket:
    family, type_, proto = addr_info[:3]
    return _PromptSocket(family, type_, proto)


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
        state.begin("dns", now_ns(), host=host)
        result = await super()._resolve_host(host, port, traces)
        addresses = ",".join(str(r["host"]) for r in result)
        state.end("dns", now_ns(), addresses=addresses)
        return result

    async def _wrap_create_connection(
        self, *args: Any, req: ClientRequest, **kwargs: Any
    ) -> tuple[asyncio.Transport, ResponseHandler]:
        state = CURRENT.get()
        if state is None:
            return await super()._wrap_create_connection(*args, req=req, **kwargs)
        factory, *rest = args
        tls = bool(kwargs.get("ssl"))

        def timed_factory() -> ResponseHandler:
            t = now_ns()
            if state.recorder.is_open("connect"):
                state.end("connect", t)
                if tls:
                    state.begin("tls", t)
            return cast(ResponseHandler, factory())

        state.begin("connect", now_ns())
        transport, proto = await super()._wrap_create_connection(
            timed_factory, *rest, req=req, **kwargs
        )
        info: TlsInfo | None = None
        if tls and state.recorder.is_open("tls"):
            made = cast(TimedProtocol, proto).made_ns or now_ns()
            info = _tls_info(transport, kwargs.get("server_hostname"))
            cast(TimedProtocol, proto).tls = info
            state.end(
                "tls", made, version=info.version, alpn=info.alpn, resumed=info.session_reused
            )
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
    if alpn == "h2" or (not tls and state.h2_mode == "require"):
        transport.pause_reading()  # nothing more for aiohttp's parser; the new owner resumes
        early = cast(TimedProtocol, proto).early or []
        raise HandoffToHTTP2(transport, info, _peer(proto), early)


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
    transport = proto.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    if not peer:
        return None
    host, port = peer[0], peer[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
