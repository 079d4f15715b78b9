"""The protocol aiohttp reads responses with, stamping request writes and response bytes.

``send`` runs from the first send syscall that handed the kernel request bytes to the one
that left nothing buffered; response headers and body bytes carry the kernel's receive stamp
of the read that brought them (see :mod:`.connector`). A stream's body is handed to its
consumer inside the callback of the read that brought it (:meth:`TimedProtocol.stream_to`),
so its reader is woken once, at the end, not for every chunk. A chunked body with no content
coding is decoded here (:mod:`._chunked`), not by aiohttp's parser, which is given the header
section and the last chunk only.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from collections.abc import Callable
from typing import Any, cast

from aiohttp import ClientPayloadError, StreamReader
from aiohttp.client_proto import ResponseHandler

from ..timeline import TcpInfo, TlsInfo
from ._chunked import ChunkedBody, ChunkedBodyError
from ._consume import ResponseConsumer
from ._hold import Hold
from ._state import RequestState, now_ns
from ._tcpinfo import read_tcp_info, tcp_info_of
from ._wire import StampedSocket, WireStamps, stamped_socket_of
from .http2 import HandoffToHTTP2

__all__ = ["TimedProtocol"]

_connection_ids = itertools.count(1)


class _TimedTransport:
    """Delegates to the real transport; notes when request bytes are written.

    It refers to its protocol weakly: the protocol holds it as its ``transport``, and a strong
    reference back would make every closed connection a reference cycle, left with all it
    refers to (its last request's state, recorder and stamps) for the cyclic garbage
    collector, whose pass then lands in the middle of a later request.
    """

    __slots__ = (
        "_proto",
        "_transport",
        "get_extra_info",
        "is_closing",
        "pause_reading",
        "resume_reading",
    )

    def __init__(self, transport: asyncio.Transport, proto: TimedProtocol) -> None:
        self._transport = transport
        self._proto: Callable[[], TimedProtocol | None] = weakref.ref(proto)
        # aiohttp calls these on every read or release: the transport's own bound methods,
        # so a call costs no frame of ours (nor a __getattr__ lookup)
        self.is_closing: Callable[[], bool] = transport.is_closing
        self.pause_reading: Callable[[], None] = transport.pause_reading
        self.resume_reading: Callable[[], None] = transport.resume_reading
        self.get_extra_info: Callable[..., Any] = transport.get_extra_info

    def write(self, data: Any) -> None:
        proto = self._proto()
        if proto is None:  # nobody reads what this connection would answer
            self._transport.write(data)
            return
        state = proto.state
        if state is not None and state.inline_body:  # the headers' write: the body joins it
            data = bytes(data) + state.inline_body
            state.inline_body = b""
        hold = proto.hold
        if hold is not None and not hold.released:  # prepared ahead: leaves at its instant
            hold.add(self, data)
            return
        before = now_ns()
        self._transport.write(data)
        proto.after_write(before, self._transport.get_write_buffer_size())

    # a request held until its instant (:mod:`._hold`): sent, then noted once all have left
    def send_held(self, data: bytes) -> int | None:
        if self._transport.is_closing():  # closed while the request was held: nothing to send
            return None
        before = now_ns()
        self._transport.write(data)
        return before

    def settle_held(self, before_ns: int) -> None:
        proto = self._proto()
        if proto is not None:
            proto.after_write(before_ns, self._transport.get_write_buffer_size())

    def writelines(self, chunks: Any) -> None:
        proto = self._proto()
        if proto is None:
            self._transport.writelines(chunks)
            return
        state = proto.state
        if state is not None and state.inline_body:  # as in write: the body joins the headers
            chunks = [*chunks, state.inline_body]
            state.inline_body = b""
        hold = proto.hold
        if hold is not None and not hold.released:
            hold.add(self, b"".join(chunks))
            return
        before = now_ns()
        self._transport.writelines(chunks)
        proto.after_write(before, self._transport.get_write_buffer_size())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class TimedProtocol(ResponseHandler):
    """aiohttp's response protocol, stamping request writes and response bytes."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.connection_id = next(_connection_ids)
        self.peer: str | None = None  # the server's address as waterfalls name it, once known
        self.requests_served = 0
        self.made_ns: int | None = None
        self.made_user_ns: int | None = None
        self.state: RequestState | None = None
        self.hold: Hold | None = None  # the attached request's held writes (._hold)
        # Bytes that came before the first request was attached: an HTTP/2 server's SETTINGS
        # may arrive with the end of the TLS handshake, before the hand-over to HTTP/2.
        self.early: list[tuple[bytes, int]] | None = []
        self.tls: TlsInfo | None = None  # what the handshake settled, for every request it carries
        self.tcp_connect: TcpInfo | None = None  # the kernel's TCP_INFO once set up
        self.wire: WireStamps | None = None  # the socket's read and send stamps
        self.sock: StampedSocket | None = None  # the socket under the transport, if ours
        self.idle_poll: tuple[int, Any] | None = None  # (fd, poll object) of ._stale, once made
        self.last_write_ns = 0
        self.backlog = False
        self._marks: list[tuple[int, int]] = []  # (body bytes received so far, arrival ns)
        self._marked_payload: object = None
        # a stream's consumer, fed from each read as it comes (stream_to)
        self._sink: ResponseConsumer | None = None
        self._sink_payload: object = None
        self._pushing = False  # inside _push: a read made re-entrantly is drained by it
        self._read_t = 0  # the latest read's arrival time
        # a response's header bytes so far, while its headers are awaited (None: not looked for)
        self._head: bytes | None = None
        self._chunks: ChunkedBody | None = None  # a chunked body decoded here (_body_read)
        # HTTP/2 hand-over at connection_made (the handshake's end), before asyncio and
        # aiohttp return the connection to the connector: the request leaves ~0.4 ms sooner
        self.on_made: Callable[[TimedProtocol, asyncio.Transport], None] | None = None
        self.handoff: HandoffToHTTP2 | BaseException | None = None

    # -- connection --
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.sock = sock = stamped_socket_of(transport)
        self.wire = wire = None if sock is None else sock.wire
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
        self.hold = state.hold
        # the previous response's payload may be aiohttp's shared empty one (HEAD, 204),
        # which the next bodiless response reuses: forget it, so new headers are seen as new
        self._payload = None
        early, self.early = self.early, None
        for data, _ in early or ():  # an HTTP/1.1 server that spoke first: let aiohttp judge
            super().data_received(data)
        self.last_write_ns = 0
        self.backlog = False
        self._forget_response()
        self._head, self._chunks = b"", None
        wire = self.wire
        if wire is not None:
            wire.first_send_ns = None  # WireStamps.mark_request, inline: every request

    def detach(self) -> None:
        hold, self.hold = self.hold, None
        if hold is not None and not hold.released:  # ended before its instant: nothing sent
            hold.drop()
        self.state = None
        self.requests_served += 1
        # the response was read: its payload refers back to this protocol, and a connection
        # closed after it would otherwise leave the two as a cycle for the collector
        self._forget_response()

    def _forget_response(self) -> None:
        self._marks = []
        self._marked_payload = None
        self._sink = self._sink_payload = None

    def tcp_info(self) -> TcpInfo | None:
        """A ``TCP_INFO`` reading of the connection now (None once it is closed, or once
        aiohttp let go of its transport: a connection closed after its response)."""
        transport, sock = self.transport, self.sock
        if transport is None or sock is None:
            return tcp_info_of(transport)
        return read_tcp_info(sock)

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
        # the entry of the latest send syscall (as _sent_ns, inline: every request writes)
        self.last_write_ns = (
            wire.send_start_ns if wire is not None and wire.send_start_ns else now_ns()
        )

    def resume_writing(self) -> None:
        if self.backlog:  # the last request bytes just left our buffer
            wire = self.wire
            self.last_write_ns = _sent_ns(wire)
            self.backlog = False
        super().resume_writing()

    def resume_reading(self, *args: Any, **kwargs: Any) -> None:
        """aiohttp's ``resume_reading``, only when reading is paused. Its body reader calls it
        after every read that leaves the buffer low, paused or not, and it answers with
        a parser resumption (``data_received(b"")``): a second callback per streamed
        chunk that has nothing to resume unless something paused the reading."""
        if getattr(self, "_reading_paused", True) or getattr(self, "_buffer_paused", False):
            super().resume_reading(*args, **kwargs)

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
                ResponseHandler.data_received(self, data)
            return
        if not data:  # aiohttp resuming its parser, not a read
            self._parse(data, t, state)
            return
        if wire is not None:
            state.recorder.read(t, wire.read_user_ns, wire.read_stamped, wire.refused)
        chunks = self._chunks
        if chunks is not None:  # a chunked body, decoded here: every read of a stream
            self._body_read(chunks, data, t, state)
            return
        if self._head is None:
            self._parse(data, t, state)
            return
        cut = self._header_end(data)
        if cut < 0:
            self._parse(data, t, state)
            return
        head, self._head = self._head, None
        if not _chunked_only(head):  # a body aiohttp reads, in the read's one call
            self._parse(data, t, state)
            return
        # a chunked body: the parser gets the headers alone, the body is decoded here, and
        # the parser is given its end only
        self._parse(data[:cut] if cut < len(data) else data, t, state)
        rest = data[cut:]
        if rest and state.recorder.headers_ns is not None:  # the stamp: maybe the body's
            state.recorder.attributes["headers_read_with_body"] = True
        payload = self._payload
        if (
            payload is not None
            and not payload.is_eof()
            and not getattr(self, "_read_timeout", None)  # aiohttp re-arms it on each read
        ):
            self._chunks = chunks = ChunkedBody()
            if rest:
                self._body_read(chunks, rest, t, state)
        elif rest:
            self._parse(rest, t, state)

    def _header_end(self, data: bytes) -> int:
        """Where in ``data`` the response's header section ends (-1: not in it). The section
        so far is kept in ``_head``, up to aiohttp's own limit on it: past that, or when
        an interim response (1xx) ends first, the parser is left to it alone."""
        head = self._head + data if self._head else data
        end = head.find(b"\r\n\r\n")
        if end < 0:
            self._head = head if len(head) <= _MAX_HEAD else None
            return -1
        if head[9:10] == b"1":  # "HTTP/1.1 1xx": what follows is another response's head
            self._head = None
            return -1
        self._head = head[: end + 4]
        return end + 4 - (len(head) - len(data))

    def _body_read(self, chunks: ChunkedBody, data: bytes, t: int, state: RequestState) -> None:
        """A read of a chunked body: its bytes to the stream's consumer, or to the response's
        reader until one is attached; the last chunk and what follows to aiohttp's parser."""
        payload = self._payload
        broken: ChunkedBodyError | None = None
        try:
            body, end = chunks.feed(data)
        except ChunkedBodyError as exc:  # what came before the break is kept
            broken, body, end = exc, exc.body, None
        if body and payload is not None:
            sink = self._sink
            if sink is not None and payload is self._sink_payload:
                self._read_t = t
                if payload.exception() is None:
                    try:
                        sink.feed(body, t)
                    except Exception as exc:  # fails the stream's reader, not this callback
                        payload.set_exception(exc)
            elif not payload.is_eof() and payload.exception() is None:
                # as aiohttp's parser would feed it: the reader counts chunks
                payload.begin_http_chunk_receiving()
                payload.feed_data(body)
                payload.end_http_chunk_receiving()
                self._mark(payload, t)
        if broken is not None:
            self._chunks = None
            self._broken_body(broken)
        elif end is not None:  # the last chunk: the parser ends the message (its trailers too)
            self._chunks = None
            self._parse(end, t, state)
            refused = self.exception()  # aiohttp's parser fails its queue, not the body
            if payload is not None and not payload.is_eof() and refused is not None:
                self._broken_body(ChunkedBodyError(f"the last chunk or its trailers: {refused}"))

    def _broken_body(self, exc: ChunkedBodyError) -> None:
        """A chunked body whose framing broke: its reader fails, the connection is closed."""
        cut = ClientPayloadError(f"malformed chunked body: {exc}")
        cut.__cause__ = exc
        payload = self._payload
        if payload is not None and not payload.is_eof() and payload.exception() is None:
            payload.set_exception(cut, exc)
        self.set_exception(cut, exc)  # and aiohttp no longer reuses the connection
        transport = self.transport
        if transport is not None:
            transport.close()

    def _parse(self, data: bytes, t: int, state: RequestState) -> None:
        """``data`` through aiohttp's parser; the headers' and the body's arrival noted."""
        rec = state.recorder
        before = self._payload
        ResponseHandler.data_received(self, data)  # one per read: not through super()
        # a response that ended in this read on a connection that closes after it has had
        # its payload dropped already (aiohttp's close()): its last bytes still need a mark
        payload = self._payload
        if payload is None:
            if before is None:
                return
            payload = before
        if payload is not before and rec.headers_ns is None:
            self.close_send()
            rec.response_headers(t)
            if payload.total_bytes:  # the stamp is the read's newest segment: maybe the body's
                rec.attributes["headers_read_with_body"] = True
        sink = self._sink
        if sink is not None and payload is self._sink_payload:
            self._read_t = t
            if not self._pushing:
                self._push(sink, payload)
        else:
            self._mark(payload, t)
        if state.body_end_ns is None and payload.is_eof():
            state.body_end_ns = t

    def _mark(self, payload: StreamReader, t: int) -> None:
        """Note that the body of ``payload`` received so far had all come at ``t``."""
        marks = self._marks
        if payload is not self._marked_payload:
            self._marked_payload, self._marks = payload, []
            marks = self._marks
        received = payload.total_bytes
        if not marks or received > marks[-1][0]:
            marks.append((received, t))

    def connection_lost(self, exc: BaseException | None) -> None:
        # A body without length framing is read until the connection ends, and aiohttp ends it
        # as complete however the connection went: an RST would record a cut body as a success.
        payload = self._payload
        if exc is not None and payload is not None and not payload.is_eof():
            cut = ClientPayloadError(f"connection lost before the body ended: {exc!r}")
            payload.set_exception(cut, exc)
        super().connection_lost(exc)

    def close(self) -> None:
        self._cut_body("the connection was closed before the body ended")
        super().close()

    def abort(self) -> None:
        self._cut_body("the connection was aborted before the body ended")
        super().abort()

    def _cut_body(self, why: str) -> None:
        # aiohttp forgets the payload as it closes the transport, before connection_lost could
        # fail it: a reader still waiting for the body (a Client closed mid-body) would wait on
        payload = self._payload
        if payload is not None and not payload.is_eof() and payload.exception() is None:
            payload.set_exception(ClientPayloadError(why))

    # -- a stream's body, fed to its consumer in the read that brought it --
    def stream_to(self, consumer: ResponseConsumer, payload: StreamReader) -> None:
        """Feed ``consumer`` the body of ``payload`` from now on: what it holds (none of it
        read yet), split by the arrival of each piece, then each read's bytes inside
        that read's callback. A stream's reader then waits for its end only, instead of
        being woken for every chunk, and no marks are kept."""
        self._pushing = True
        try:
            held = payload.read_nowait(-1)
            self._sink, self._sink_payload = consumer, payload
            self._read_t = self._marks[-1][1] if self._marks else now_ns()
            if held:
                for piece, t in self.arrivals(0, held):
                    consumer.feed(piece, t)
        finally:
            self._pushing = False
        self._marks, self._marked_payload = [], None
        self._push(consumer, payload)  # what reads made while it was held added

    def stop_streaming(self) -> None:
        """The stream's reader is done with it (ended, failed or cancelled)."""
        self._sink = self._sink_payload = None

    def _push(self, sink: ResponseConsumer, payload: StreamReader) -> None:
        """Hand ``sink`` what the latest read added to ``payload``. Reading from it can
        resume the transport and so feed it again from inside (aiohttp's flow control):
        those bytes are left to this loop, stamped with their own read. An error in here
        fails the stream's reader (raised where it waits), not the connection's callback."""
        self._pushing = True
        try:
            while payload.exception() is None:
                t = self._read_t
                data = payload.read_nowait(-1)
                if not data:
                    break
                sink.feed(data, t)
        except Exception as exc:
            payload.set_exception(exc)
        finally:
            self._pushing = False

    def arrivals(self, offset: int, data: bytes) -> list[tuple[bytes, int]]:
        """Split body bytes read at ``offset`` into pieces with the time each piece arrived."""
        end, pos = offset + len(data), offset
        pieces = []
        for received, t in self._marks:
            if received <= pos:
                continue
            if received >= end:  # the read that brought the last of these bytes
                pieces.append((data[pos - offset :] if pos > offset else data, t))
                return pieces
            pieces.append((data[pos - offset : received - offset], t))
            pos = received
        if pos < end:  # bytes no data_received stamped (cannot happen): the read time is next best
            pieces.append((data[pos - offset :], now_ns()))
        return pieces


_MAX_HEAD = 65536  # a header section's bytes kept while it comes: past this, aiohttp's limits rule


def _chunked_only(head: bytes) -> bool:
    """Whether a response's header section says its body is chunked, and only that: one
    ``Transfer-Encoding: chunked``, no content coding, no folded line (what aiohttp would
    decode otherwise is left to it)."""
    if b"hunked" not in head and b"HUNKED" not in head:  # most bodies: no need to look
        return False
    te: list[bytes] = []
    for line in head.lower().split(b"\r\n")[1:]:
        if line[:1] in (b" ", b"\t"):
            return False
        name, _, value = line.partition(b":")
        if name == b"transfer-encoding":
            te.append(value.strip(b" \t"))
        elif name == b"content-encoding" and value.strip(b" \t") not in (b"", b"identity"):
            return False
    return te == [b"chunked"]


def _sent_ns(wire: WireStamps | None) -> int:
    """Entry of the latest send syscall: the kernel holds the bytes from there on (its return
    can be late by however long we were descheduled inside it)."""
    return wire.send_start_ns if wire is not None and wire.send_start_ns else now_ns()
