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
from collections.abc import Sequence
from typing import Any

import h2.events
import h2.exceptions

from ._h2frames import (
    HTTP2Refused,
    HTTP2SettleTimeout,
    PreparedStart,
    _code_name,
    _error_code,
    prepare_first_stream,
)
from ._h2pool import H2Pool, HandoffToHTTP2
from ._h2stream import H2Stream, H2Streams
from ._state import RequestState, now_ns

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


class H2Connection(H2Streams):
    """One HTTP/2 connection carrying many concurrent request streams.

    Its layers, bottom up: state and writes (:class:`~._h2base.H2Base`), request streams
    (:class:`~._h2stream.H2Streams`), and here the set-up, the read path and the
    connection-level events (SETTINGS, GOAWAY, loss).
    """

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

    async def ready(self) -> None:
        """Wait until the server's SETTINGS arrived (max concurrent streams known)."""
        await asyncio.shield(self._settings)

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

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._settle_timer is not None:
            self._settle_timer.cancel()
            self._settle_timer = None
        reason = f"connection closed ({exc})" if exc else "connection closed by the server"
        self._lose(reason, now_ns())
        if not self.closed.done():
            self.closed.set_result(None)
        # h2's state machine keeps a table of its own bound methods, a cycle holding all its
        # state; nothing is read after the connection is lost, so the table goes, and the
        # machine is freed when the last reference goes instead of in a collector's pass
        # during a later request
        vars(self._h2).pop("_frame_dispatch_table", None)

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
                state = stream.state
                if state.client_closed:  # our Client's close ended the connection
                    state.fail_closed(t)
                else:
                    got_headers = state.recorder.headers_ns is not None
                    stream_kind = kind or ("reset" if got_headers else "disconnected")
                    state.fail(stream_kind, f"HTTP/2 {reason}", t)
                stream.finish()
        self._wake_windows()
        for waiter in self._slot_waiters:
            if not waiter.done():
                waiter.set_result(None)
