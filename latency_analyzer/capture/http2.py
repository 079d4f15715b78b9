"""HTTP/2 over asyncio with the ``h2`` state machine: preface, SETTINGS, multiplexed streams.

aiohttp speaks only HTTP/1.1, so the connection is dialled by the same timed aiohttp
connector (DNS, TCP, TLS with ALPN) and, when ALPN settles on ``h2`` (or for prior-knowledge
``h2c``), handed over to an ``H2Connection``: the transport gets a new protocol. Stages:

* ``h2_setup``: client preface + SETTINGS written → the server's SETTINGS received (the ACK of
  ours is kept as the attribute ``settings_ack_ms``). Only the stream that opened the
  connection has it, with dns/connect/tls. That stream does not wait for the server's
  SETTINGS: its HEADERS follow our preface at once (RFC 9113 §3.4 allows it, as curl and
  browsers do), so ``h2_setup`` overlaps its ``send`` and ``wait`` and is attributed only the
  time no other stage covers. The request goes out under the protocol's initial settings;
  SETTINGS that then lower the stream window are applied by ``h2`` to the open stream (its
  window may go negative: we wait for WINDOW_UPDATE), the frame size cannot go below the
  initial 16 KiB, and other streams wait for the SETTINGS before they open, so the server's
  stream limit is known first.
* ``pool_wait``: a stream waiting for the connection to be ready or for a free stream slot
  under the server's ``SETTINGS_MAX_CONCURRENT_STREAMS``.
* ``send``: HEADERS written → the last DATA frame written and out of our buffer; time blocked
  on flow control is kept as ``flow_control_wait_ms``.
* response: HEADERS, DATA and END_STREAM stamped with the kernel's receive time of the read
  that brought them (the socket's stamp, read in ``data_received``) and fed to the same
  ``ResponseConsumer`` as HTTP/1.1; each stream with an event in a read notes its read lag.

GOAWAY ends the streams the server will not process (``last_stream_id`` and above) with an
error and refuses new ones; RST_STREAM ends its stream only.

Isolation: a response that breaks our handling of it (a ``:status`` that is not a number, a
body its parser cannot take) fails its own stream, which is reset; the other streams go on.
A connection that GOAWAYs, errs, closes or sends no SETTINGS within the settle bound leaves
the pool at once, and closes as soon as it carries no stream (at once when it never settled).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

from ..timeline import TlsInfo
from ._consume import ResponseConsumer, note_server_headers
from ._state import RequestState, now_ns
from ._wire import wire_of

__all__ = [
    "H2Connection",
    "H2Pool",
    "H2Stream",
    "HTTP2Refused",
    "HTTP2SettleTimeout",
    "HandoffToHTTP2",
    "PreparedStart",
    "prepare_first_stream",
]

_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "host",
}


class HandoffToHTTP2(Exception):
    """Raised by the connector once a connection is ready for HTTP/2 (never leaves capture).

    When the dialling request could be opened on it before the raise (``RequestState.h2_open``),
    ``conn`` and ``stream`` are that connection and the request's stream, already sent.
    """

    def __init__(
        self,
        transport: asyncio.Transport,
        tls: TlsInfo | None,
        peer: str | None,
        early: list[tuple[bytes, int]],
    ) -> None:
        super().__init__("connection negotiated HTTP/2")
        self.transport = transport
        self.tls = tls
        self.peer = peer
        self.early = early  # (bytes, arrival ns) received before the hand-over
        self.conn: H2Connection | None = None
        self.stream: H2Stream | None = None


class HTTP2Refused(Exception):
    """``http2=True`` but the server's ALPN choice was not ``h2``."""


class HTTP2SettleTimeout(ConnectionError):
    """The server sent no SETTINGS within the settle bound: the connection was closed."""


class _GoAwayFilter:
    """Takes GOAWAY frames out of the received bytes before ``h2`` sees them.

    ``h2`` closes its whole state machine on GOAWAY, so streams the server promised to finish
    (ids up to ``last_stream_id``) would be lost; RFC 9113 §6.8 says they complete. Only frame
    headers are read: 9 bytes each, payloads pass through untouched.
    """

    __slots__ = ("_goaway", "_head", "_left")

    def __init__(self) -> None:
        self._head = b""  # a partial 9-byte frame header
        self._left = 0  # payload bytes of the current frame still to come
        self._goaway: bytearray | None = None  # the GOAWAY payload being collected

    def feed(self, data: bytes) -> tuple[bytes, list[tuple[int, int]]]:
        """Bytes for ``h2`` and the (last_stream_id, error_code) of each GOAWAY completed."""
        out, goaways, pos = bytearray(), [], 0
        while pos < len(data):
            if self._left:
                take = min(self._left, len(data) - pos)
                piece = data[pos : pos + take]
                if self._goaway is None:
                    out += piece
                else:
                    self._goaway += piece
                self._left -= take
                pos += take
            else:
                need = 9 - len(self._head)
                self._head += data[pos : pos + need]
                pos += min(need, len(data) - pos)
                if len(self._head) < 9:
                    break
                length, kind = int.from_bytes(self._head[:3], "big"), self._head[3]
                self._goaway = bytearray() if kind == 0x7 else None
                if self._goaway is None:
                    out += self._head
                self._head, self._left = b"", length
            if self._goaway is not None and not self._left and len(self._goaway) >= 8:
                last = int.from_bytes(self._goaway[:4], "big") & 0x7FFFFFFF
                goaways.append((last, int.from_bytes(self._goaway[4:8], "big")))
                self._goaway = None
        return bytes(out), goaways


class H2Stream:
    """One request stream: opened (HEADERS sent) by ``open_stream``, then ``run_stream``."""

    __slots__ = (
        "body",
        "consumer",
        "done",
        "ended",
        "flow_wait_ns",
        "last_write_ns",
        "read_ns",
        "running",
        "state",
        "stream_id",
    )

    def __init__(
        self, state: RequestState, loop: asyncio.AbstractEventLoop, stream_id: int
    ) -> None:
        self.state = state
        self.stream_id = stream_id
        self.body = memoryview(b"")  # request body bytes not sent yet
        self.consumer: ResponseConsumer | None = None
        self.done: asyncio.Future[None] = loop.create_future()
        self.ended = False
        self.running = False
        self.last_write_ns = 0
        self.flow_wait_ns = 0
        self.read_ns = 0  # userspace instant of the last read noted on this stream

    def finish(self) -> None:
        self.ended = True
        if not self.done.done():
            self.done.set_result(None)


def _request_fields(
    method: str, target: tuple[str, str, str], headers: Sequence[tuple[str, str]]
) -> list[tuple[str, str]]:
    scheme, authority, path = target
    pseudo = [(":method", method), (":scheme", scheme), (":authority", authority), (":path", path)]
    lowered = ((k.lower(), v) for k, v in headers)
    return pseudo + [(k, v) for k, v in lowered if k not in _HOP_BY_HOP]


_CONFIG = h2.config.H2Configuration(client_side=True, header_encoding=None)  # read-only: shared


def _machine() -> h2.connection.H2Connection:
    return h2.connection.H2Connection(config=_CONFIG)


def _queue_body(
    machine: h2.connection.H2Connection, stream_id: int, body: memoryview
) -> memoryview:
    """Queue DATA frames of ``body`` while the flow-control window has room; the rest."""
    while body:
        room = min(machine.local_flow_control_window(stream_id), machine.max_outbound_frame_size)
        if room <= 0:
            break
        chunk, body = body[:room], body[room:]
        machine.send_data(stream_id, bytes(chunk), end_stream=not body)
    return body


class PreparedStart:
    """A new connection's first flight, encoded before the connection is there.

    The client preface, our SETTINGS and the first stream's HEADERS (and what the initial
    window takes of its body) depend only on the request, so they can be built while the TLS
    handshake's round trip leaves the event loop idle: once ALPN says ``h2`` they are
    encrypted and written at once, which is when a C client would write them.
    """

    __slots__ = ("machine", "rest", "stream_id")

    def __init__(self, machine: h2.connection.H2Connection, stream_id: int, rest: memoryview):
        self.machine, self.stream_id, self.rest = machine, stream_id, rest


def prepare_first_stream(
    method: str, target: tuple[str, str, str], headers: Sequence[tuple[str, str]], body: bytes
) -> PreparedStart:
    """Encode a connection's preface and its first request stream (see :class:`PreparedStart`)."""
    machine = _machine()
    machine.initiate_connection()
    stream_id = machine.get_next_available_stream_id()
    machine.send_headers(stream_id, _request_fields(method, target, headers), end_stream=not body)
    return PreparedStart(machine, stream_id, _queue_body(machine, stream_id, memoryview(body)))


class H2Connection(asyncio.Protocol):
    """One HTTP/2 connection carrying many concurrent request streams."""

    def __init__(
        self,
        transport: asyncio.Transport,
        tls: TlsInfo | None,
        peer: str | None,
        settle_timeout: float = 10.0,
        prepared: PreparedStart | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self.transport = transport
        self.tls = tls
        self.peer = peer
        self.connection_id = id(self)
        self.requests_served = 0
        self._prepared = prepared
        self._h2 = prepared.machine if prepared is not None else _machine()
        self._streams: dict[int, H2Stream] = {}
        self._goaways = _GoAwayFilter()
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._window_waiters: list[asyncio.Future[None]] = []
        self._settings: asyncio.Future[None] = self._loop.create_future()
        self._setup_state: RequestState | None = None
        self._preface_queued = False
        self._preface_ns = 0
        self._settle_timeout = settle_timeout
        self._settle_timer: asyncio.TimerHandle | None = None
        self.backlog = False
        self._wire = wire_of(transport)
        self._read_user_ns = 0  # when the read being processed was made (0: not a socket read)
        self.closing: str | None = None  # why no new stream may start (GOAWAY, lost)
        self.on_closing: Callable[[H2Connection], None] | None = None  # the pool lets it go
        self.closed: asyncio.Future[None] = self._loop.create_future()  # connection_lost
        transport.set_protocol(self)
        transport.set_write_buffer_limits(high=1, low=0)  # resume_writing = backlog drained

    # -- setup --
    def start(self, state: RequestState) -> None:
        """Queue the client preface and SETTINGS; ``state`` gets ``h2_setup`` from when they
        are written: with the first stream's HEADERS (one write) or by :meth:`resume`."""
        self._setup_state = state
        if self._prepared is None:  # else: the preface is queued in the prepared machine
            self._h2.initiate_connection()
        self._preface_queued = True
        self._settle_timer = self._loop.call_later(self._settle_timeout, self._never_settled)

    def resume(self, early: Sequence[tuple[bytes, int]] = ()) -> None:
        """Write what is queued, take the bytes that came before the hand-over, read on."""
        self._preface_written(now_ns())
        self._flush()
        for data, t in early:  # the server's SETTINGS may have come with the handshake
            self._receive(data, t)
        self.transport.resume_reading()

    def _preface_written(self, t: int) -> None:
        """The preface goes out in the write about to happen: ``h2_setup`` starts."""
        if self._preface_queued:
            self._preface_queued = False
            self._preface_ns = t
            if self._setup_state is not None:
                self._setup_state.begin("h2_setup", t)

    async def ready(self) -> None:
        """Wait until the server's SETTINGS arrived (max concurrent streams known)."""
        await asyncio.shield(self._settings)

    @property
    def max_streams(self) -> int:
        return int(self._h2.remote_settings.max_concurrent_streams)

    @property
    def usable(self) -> bool:
        return self.closing is None and not self.transport.is_closing()

    # -- streams --
    async def acquire_slot(self) -> None:
        """Wait for a free stream slot (the server's SETTINGS_MAX_CONCURRENT_STREAMS)."""
        while len(self._streams) >= self.max_streams and self.usable:
            waiter = self._loop.create_future()
            self._slot_waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_slot()  # we were handed a slot but cannot take it: pass it on
                raise
            finally:
                if waiter in self._slot_waiters:
                    self._slot_waiters.remove(waiter)
        if not self.usable:
            raise ConnectionResetError(f"HTTP/2 connection unusable: {self.closing}")

    async def request(
        self,
        state: RequestState,
        method: str,
        target: tuple[str, str, str],
        headers: Sequence[tuple[str, str]],
        body: bytes,
    ) -> None:
        """Run one request stream to its end; marks go to ``state``'s recorder."""
        await self.run_stream(self.open_stream(state, method, target, headers, body))

    def open_stream(
        self,
        state: RequestState,
        method: str,
        target: tuple[str, str, str],
        headers: Sequence[tuple[str, str]],
        body: bytes,
    ) -> H2Stream:
        """Open a stream and write its HEADERS and what the window takes of its body, now.

        A preface still queued goes in the same write. :meth:`run_stream` does the rest.
        """
        stream = H2Stream(state, self._loop, self._h2.get_next_available_stream_id())
        self._streams[stream.stream_id] = stream
        try:
            fields = _request_fields(method, target, headers)
            t = now_ns()
            self._preface_written(t)
            state.begin("send", t)
            self._h2.send_headers(stream.stream_id, fields, end_stream=not body)
            stream.body = memoryview(body)
            self._send_window(stream)
            self._flush(stream)
        except BaseException:
            self._drop(stream)
            raise
        return stream

    def open_prepared(self, state: RequestState) -> H2Stream:
        """Write the first stream that :func:`prepare_first_stream` encoded, with the preface."""
        prepared, self._prepared = self._prepared, None
        assert prepared is not None, "no prepared stream on this connection"
        stream = H2Stream(state, self._loop, prepared.stream_id)
        self._streams[stream.stream_id] = stream
        stream.body = prepared.rest
        try:
            t = now_ns()
            self._preface_written(t)
            state.begin("send", t)
            self._flush(stream)
        except BaseException:
            self._drop(stream)
            raise
        return stream

    async def run_stream(self, stream: H2Stream) -> None:
        """Send the rest of an opened stream's body and wait until its response ends."""
        stream.running = True
        state = stream.state
        try:
            await self._send_rest(stream)
            if state.recorder.is_open("send"):  # every byte is out: the request is sent
                state.end("send", stream.last_write_ns or now_ns(), **_flow(stream))
            await stream.done
        except BaseException:
            self._cancel(stream.stream_id)
            raise
        finally:
            self._drop(stream)

    def abandon(self, stream: H2Stream) -> None:
        """An opened stream whose :meth:`run_stream` never ran (its caller was cancelled)."""
        if not stream.running and self._streams.get(stream.stream_id) is stream:
            self._cancel(stream.stream_id)
            self._drop(stream)

    def _drop(self, stream: H2Stream) -> None:
        if self._streams.pop(stream.stream_id, None) is not None:
            self.requests_served += 1
            self._wake_slot()
            self._close_if_drained()

    def _send_window(self, stream: H2Stream) -> None:
        """Queue DATA frames of the body while the flow-control window has room."""
        if not stream.ended:
            stream.body = _queue_body(self._h2, stream.stream_id, stream.body)

    async def _send_rest(self, stream: H2Stream) -> None:
        """The body left after :meth:`open_stream`, as windows open and our buffer drains."""
        while stream.body and not stream.ended:
            shut = self._h2.local_flow_control_window(stream.stream_id) <= 0
            if shut or self.backlog:
                blocked = now_ns()
                await self._wait_for_room()
                if shut:  # time the peer's flow control held us, not our own send buffer
                    stream.flow_wait_ns += now_ns() - blocked
                continue
            self._send_window(stream)
            self._flush(stream)

    def _cancel(self, stream_id: int) -> None:
        stream = self._streams.get(stream_id)
        if stream is not None and not stream.ended and self.usable:
            try:
                self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
                self._flush()
            except h2.exceptions.H2Error:
                pass

    # -- writing --
    def _flush(self, stream: H2Stream | None = None) -> None:
        data = self._h2.data_to_send()
        if data and not self.transport.is_closing():
            self.transport.write(data)
            self.backlog = self.transport.get_write_buffer_size() > 0
            if stream is not None:
                stream.last_write_ns = self._sent_ns()

    async def _wait_for_room(self) -> None:
        """Until a WINDOW_UPDATE arrives or our write backlog drains (either may let us send)."""
        waiter = self._loop.create_future()
        self._window_waiters.append(waiter)
        await waiter

    def _sent_ns(self) -> int:
        """When the latest send syscall was entered (the socket's stamp), else now.

        The kernel has the bytes from the syscall's start (on loopback they are delivered
        inside it), while its return can be late by however long we were descheduled."""
        wire = self._wire
        return wire.send_start_ns if wire is not None and wire.send_start_ns else now_ns()

    def resume_writing(self) -> None:
        drained = self._sent_ns()
        self.backlog = False
        for stream in self._streams.values():
            if stream.state.recorder.is_open("send"):
                stream.last_write_ns = drained
        self._wake_windows()

    def pause_writing(self) -> None:
        self.backlog = True

    def _wake_windows(self) -> None:
        waiters, self._window_waiters = self._window_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _wake_slot(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    # -- reading --
    def data_received(self, data: bytes) -> None:
        wire = self._wire
        if wire is None or not wire.read_user_ns:
            self._receive(data, now_ns())
            return
        self._read_user_ns = wire.read_user_ns
        try:
            self._receive(data, wire.read_kernel_ns)
        finally:
            self._read_user_ns = 0

    def _note_read(self, stream: H2Stream, t: int) -> None:
        """The stream got bytes from the read being processed: its lag is noted once per read."""
        wire, user = self._wire, self._read_user_ns
        if wire is not None and user and stream.read_ns != user:
            stream.read_ns = user
            stream.state.recorder.read(t, user, wire.read_stamped, wire.refused)

    def _receive(self, data: bytes, t: int) -> None:
        try:
            data, goaways = self._goaways.feed(data)
            for last_stream_id, code in goaways:
                self._on_goaway(last_stream_id, code, t)
            try:
                events = self._h2.receive_data(data)
            except h2.exceptions.ProtocolError as exc:
                self._lose(f"HTTP/2 protocol error: {exc}", t)
                self.transport.close()
                return
            for event in events:
                try:
                    self._on_event(event, t)
                except Exception as exc:  # a response we cannot handle fails its stream alone
                    self._stream_failed(getattr(event, "stream_id", None), exc, t)
            self._flush()
        except Exception as exc:  # our own bug: end this connection, not the event loop's
            self._lose(f"HTTP/2 client error: {type(exc).__name__}: {exc}", t)
            self.transport.abort()

    def _stream_failed(self, stream_id: int | None, exc: Exception, t: int) -> None:
        """Handling a frame of ``stream_id`` raised: fail and reset that stream only."""
        if not stream_id:  # connection-level: nothing on it can be trusted any more
            raise exc
        stream = self._streams.get(stream_id)
        if stream is None or stream.ended:
            return
        if isinstance(exc, _BadResponse):
            stream.state.fail("protocol", f"invalid HTTP/2 response: {exc}", t)
        else:
            stream.state.fail("error", f"{type(exc).__name__}: {exc}", t)
        stream.finish()
        with contextlib.suppress(h2.exceptions.H2Error):  # it may have ended on the wire
            self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.PROTOCOL_ERROR)

    def _on_event(self, event: h2.events.Event, t: int) -> None:
        if isinstance(event, h2.events.DataReceived):
            self._on_data(event, t)
        elif isinstance(event, h2.events.ResponseReceived):
            self._on_headers(event, t)
        elif isinstance(event, h2.events.StreamEnded):
            self._on_end(event.stream_id, t)
        elif isinstance(event, h2.events.StreamReset):
            self._on_reset(event, t)
        elif isinstance(event, h2.events.WindowUpdated):
            self._wake_windows()
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self._on_settings(t)
        elif isinstance(event, h2.events.SettingsAcknowledged):
            self._on_settings_ack(t)

    def _on_headers(self, event: h2.events.ResponseReceived, t: int) -> None:
        stream = self._streams.get(event.stream_id)
        if stream is None:
            return
        fields = {bytes(k).lower(): bytes(v) for k, v in event.headers or ()}
        raw_status = fields.get(b":status", b"")
        if len(raw_status) != 3 or not raw_status.isdigit():
            raise _BadResponse(f":status {raw_status[:16]!r} is not a three-digit status code")
        status = int(raw_status)
        rec = stream.state.recorder
        self._note_read(stream, t)
        if rec.is_open("send"):
            backlog = {"backlog_at_headers": True} if self.backlog else {}
            stream.state.end("send", stream.last_write_ns or t, **_flow(stream), **backlog)
        rec.response_headers(t, status)
        note_server_headers(
            stream.state, ((k.decode("latin-1"), v.decode("latin-1")) for k, v in fields.items())
        )
        content_type = fields.get(b"content-type", b"").split(b";")[0].strip().decode("latin-1")
        stream.consumer = ResponseConsumer(stream.state, status, content_type.lower())

    def _on_data(self, event: h2.events.DataReceived, t: int) -> None:
        self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        stream = self._streams.get(event.stream_id)
        if stream is not None and stream.consumer is not None and event.data:
            self._note_read(stream, t)
            stream.consumer.feed(bytes(event.data), t)

    def _on_end(self, stream_id: int, t: int) -> None:
        stream = self._streams.get(stream_id)
        if stream is None or stream.ended:
            return
        stream.state.body_end_ns = t
        if stream.consumer is not None:
            stream.consumer.close(t)
        stream.finish()

    def _on_reset(self, event: h2.events.StreamReset, t: int) -> None:
        stream = self._streams.get(event.stream_id)
        if stream is None or stream.ended:
            return
        code = _code_name(event.error_code)
        stream.state.fail("reset", f"stream reset by the server (RST_STREAM {code})", t)
        stream.finish()

    def _on_settings(self, t: int) -> None:
        if self._settle_timer is not None:
            self._settle_timer.cancel()
            self._settle_timer = None
        state = self._setup_state
        if state is not None and state.recorder.is_open("h2_setup"):
            state.end("h2_setup", t, max_concurrent_streams=self.max_streams)
        if not self._settings.done():
            self._settings.set_result(None)
        self._wake_slot()

    def _on_settings_ack(self, t: int) -> None:
        state, self._setup_state = self._setup_state, None
        if state is not None:
            state.recorder.attributes["settings_ack_ms"] = (t - self._preface_ns) / 1e6

    def _on_goaway(self, last: int, error_code: Any, t: int) -> None:
        code = _code_name(_error_code(error_code))
        self._set_closing(f"server sent GOAWAY ({code}, last stream {last})")
        for stream_id, stream in list(self._streams.items()):
            if stream_id > last and not stream.ended:
                stream.state.fail("goaway", f"{self.closing}: this stream was not processed", t)
                stream.finish()
        for waiter in self._slot_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._close_if_drained()

    def _never_settled(self) -> None:
        """The settle bound passed without the server's SETTINGS: give the connection up."""
        self._settle_timer = None
        reason = f"server sent no SETTINGS within {self._settle_timeout:g} s"
        self._lose(reason, now_ns(), HTTP2SettleTimeout(f"HTTP/2 {reason}"), "h2_setup")
        self.transport.abort()  # a peer that never spoke will not answer a TLS close either

    def _set_closing(self, reason: str) -> None:
        """No new stream may start here; the first reason is kept and the pool lets go."""
        if self.closing is None:
            self.closing = reason
            if self.on_closing is not None:
                self.on_closing(self)

    def _close_if_drained(self) -> None:
        """A connection no stream may start on closes once its last stream has ended."""
        if self.closing is not None and not self._streams and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._settle_timer is not None:
            self._settle_timer.cancel()
            self._settle_timer = None
        reason = f"connection closed ({exc})" if exc else "connection closed by the server"
        self._lose(reason, now_ns())
        if not self.closed.done():
            self.closed.set_result(None)

    def _lose(
        self, reason: str, t: int, error: Exception | None = None, kind: str | None = None
    ) -> None:
        """End every stream (``kind``, or reset / disconnected by whether headers came)."""
        self._set_closing(reason)
        if not self._settings.done():
            self._settings.set_exception(error or ConnectionResetError(reason))
            self._settings.exception()  # retrieved here: nobody may be waiting yet
        for stream in list(self._streams.values()):
            if not stream.ended:
                got_headers = stream.state.recorder.headers_ns is not None
                stream_kind = kind or ("reset" if got_headers else "disconnected")
                stream.state.fail(stream_kind, f"HTTP/2 {reason}", t)
                stream.finish()
        self._wake_windows()
        for waiter in self._slot_waiters:
            if not waiter.done():
                waiter.set_result(None)


class _BadResponse(Exception):
    """A response a stream cannot carry (its ``:status`` is not a status code)."""


def _flow(stream: H2Stream) -> Mapping[str, float]:
    return {"flow_control_wait_ms": stream.flow_wait_ns / 1e6} if stream.flow_wait_ns else {}


def _error_code(code: Any) -> Any:
    try:
        return h2.errors.ErrorCodes(code)
    except ValueError:
        return code


def _code_name(code: Any) -> str:
    return getattr(code, "name", str(code))


class H2Pool:
    """One HTTP/2 connection per origin, shared by every stream to it.

    Requests to an origin whose first connection is still being dialled wait for it (their
    ``pool_wait``) instead of dialling their own; ``None`` as the outcome means the server chose
    HTTP/1.1, and they go the HTTP/1.1 way.
    """

    def __init__(self) -> None:
        self._conns: dict[str, H2Connection] = {}  # the connection new streams to an origin use
        self._live: set[H2Connection] = set()  # every connection not yet closed, pooled or not
        self._dialling: dict[str, asyncio.Future[H2Connection | None]] = {}
        self._abandoned: set[str] = set()  # dials still running when the pool was closed
        self.http1_origins: set[str] = set()

    def get(self, origin: str) -> H2Connection | None:
        conn = self._conns.get(origin)
        if conn is not None and not conn.usable:  # closed under us: it cannot stay
            self._release(conn, origin)
            return None
        return conn

    def dialling(self, origin: str) -> asyncio.Future[H2Connection | None] | None:
        return self._dialling.get(origin)

    def begin_dial(self, origin: str) -> None:
        self._abandoned.discard(origin)
        self._dialling[origin] = asyncio.get_running_loop().create_future()

    def end_dial(self, origin: str, conn: H2Connection | None, http1: bool = False) -> None:
        """The dial for ``origin`` ended: with a connection, with HTTP/1.1, or failed.

        A connection from a dial that outlived :meth:`close` is closed, not pooled: its
        request fails as any request in flight at close does.
        """
        if conn is not None and origin in self._abandoned:
            self._abandoned.discard(origin)
            conn.transport.close()
        elif conn is not None:
            self._conns[origin] = conn
            self._live.add(conn)
            conn.on_closing = functools.partial(self._release, origin=origin)
            conn.closed.add_done_callback(lambda _: self._live.discard(conn))
        elif http1:
            self.http1_origins.add(origin)
        future = self._dialling.pop(origin, None)
        if future is not None and not future.done():
            future.set_result(conn)

    def _release(self, conn: H2Connection, origin: str) -> None:
        """``conn`` takes no new streams (GOAWAY, error, never settled): out of the pool."""
        if self._conns.get(origin) is conn:
            del self._conns[origin]

    async def close(self, timeout: float = 2.0) -> None:
        """Close every connection and wait until each is closed (its socket released).

        A TLS connection closes only after the peer answers our close_notify; a peer that
        does not answer within ``timeout`` seconds has its connection aborted. Without the
        wait, a loop that ends right after ``close`` would never release the socket.
        """
        conns = list(self._live | set(self._conns.values()))
        self._conns.clear()
        for conn in conns:
            conn.transport.close()
        self._abandoned.update(self._dialling)
        for future in self._dialling.values():
            if not future.done():
                future.set_result(None)
        self._dialling.clear()
        try:
            pending = [conn.closed for conn in conns if not conn.closed.done()]
            if pending:
                await asyncio.wait(pending, timeout=timeout)
        finally:  # also when cancelled: nothing is left half closed
            stragglers = [conn for conn in conns if not conn.closed.done()]
            for conn in stragglers:
                conn.transport.abort()  # connection_lost follows on the next loop step
        if stragglers:
            await asyncio.wait([conn.closed for conn in stragglers], timeout=1.0)
