"""The HTTP/2 connection's state and its write side: what goes out, when, and who waits.

:class:`H2Base` is the bottom of :class:`~.http2.H2Connection`: the fields every part uses,
the writes (stamped at the send syscall), the backlog edges of ``pause_writing`` /
``resume_writing`` and the waiters for flow-control room and stream slots. Streams are opened
in :mod:`._h2stream`; frames are read and the connection's lifecycle kept in :mod:`.http2`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..timeline import TlsInfo
from ._h2frames import PreparedStart, _GoAwayFilter, _machine
from ._state import RequestState, now_ns
from ._wire import wire_of

if TYPE_CHECKING:
    from ._h2stream import H2Stream
    from .http2 import H2Connection

__all__ = ["H2Base"]


class H2Base(asyncio.Protocol):
    """State and writes of one HTTP/2 connection (see :class:`~.http2.H2Connection`)."""

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

    def _preface_written(self, t: int) -> None:
        """The preface goes out in the write about to happen: ``h2_setup`` starts."""
        if self._preface_queued:
            self._preface_queued = False
            self._preface_ns = t
            if self._setup_state is not None:
                self._setup_state.begin("h2_setup", t)

    @property
    def max_streams(self) -> int:
        return int(self._h2.remote_settings.max_concurrent_streams)

    @property
    def usable(self) -> bool:
        return self.closing is None and not self.transport.is_closing()

    # -- writing --
    def _flush(self, stream: H2Stream | None = None, head: bytes = b"") -> None:
        """Write what the machine queued (after ``head``, bytes encoded earlier)."""
        data = self._h2.data_to_send()
        if head:
            data = head + data
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

    def _close_if_drained(self) -> None:
        """A connection no stream may start on closes once its last stream has ended."""
        if self.closing is not None and not self._streams and not self.transport.is_closing():
            self.transport.close()
