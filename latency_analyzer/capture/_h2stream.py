"""HTTP/2 request streams: opened, sent under flow control, and their responses received.

:class:`H2Streams` is the stream side of :class:`~.http2.H2Connection`: a stream's HEADERS
and body go out (``send`` and ``flow_control_wait_ms``), its HEADERS, DATA, END_STREAM and
RST_STREAM come in and feed the ``ResponseConsumer``; a response it cannot take fails that
stream alone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence

import h2.errors
import h2.events
import h2.exceptions

from ._consume import ResponseConsumer, note_server_headers
from ._h2base import H2Base
from ._h2frames import _BadResponse, _code_name, _queue_body, _request_fields
from ._state import RequestState, now_ns

__all__ = ["H2Stream", "H2Streams"]


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


def _flow(stream: H2Stream) -> Mapping[str, float]:
    return {"flow_control_wait_ms": stream.flow_wait_ns / 1e6} if stream.flow_wait_ns else {}


class H2Streams(H2Base):
    """Opening, sending and receiving the request streams of one HTTP/2 connection."""

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
            sent = prepared.sent_ns  # the handshake's thread sent the flight (._tlsthread)
            t = sent or now_ns()
            self._preface_written(t)
            state.begin("send", t)
            if sent:  # what the kernel did not take yet is in the transport's buffer
                stream.last_write_ns = sent
                self.backlog = self.transport.get_write_buffer_size() > 0
            self._flush(stream, b"" if sent else prepared.flight)
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

    def _note_read(self, stream: H2Stream, t: int) -> None:
        """The stream got bytes from the read being processed: its lag is noted once per read."""
        wire, user = self._wire, self._read_user_ns
        if wire is not None and user and stream.read_ns != user:
            stream.read_ns = user
            stream.state.recorder.read(t, user, wire.read_stamped, wire.refused)

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
            rec = stream.state.recorder
            if rec.headers_ns == t:  # the headers' read brought body bytes too: one stamp
                rec.attributes["headers_read_with_body"] = True
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
