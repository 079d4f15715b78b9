"""When a test-bed socket's bytes reached this host: the kernel's receive time of each read.

A delay that starts when userspace reads the bytes starts late by however long the host took
to deliver them: on a busy host loopback delivery itself waits (softirq work deferred to
``ksoftirqd``, an ordinary thread, which a real-time test-bed process cannot hurry), by
hundreds of microseconds at a time. The kernel stamps each segment as it is queued for
delivery (``SO_TIMESTAMPNS``, software receive time), which on loopback is the instant the
sender handed it over; :class:`RxSocket` reads that stamp with every ``recv`` so a delay can
start from it instead. Where the kernel gives none (another OS, the option refused) the read's
own instant stands in.

asyncio's socket transports read with the socket object's ``recv`` (``recv_into`` under
TLS), and a listening
:class:`RxSocket` accepts :class:`RxSocket` connections, so a server started on one (and a
connection made over one) reads through it with no private asyncio API.
"""

from __future__ import annotations

import socket
import struct
import sys
import time
from typing import Any

from .._sockets import SocketRegistry

__all__ = ["RxSocket", "rx_listener", "rx_socket_of"]

_SO_TIMESTAMPNS = 35  # <asm-generic/socket.h>; SCM_TIMESTAMPNS has the same value
_ANC_SIZE = socket.CMSG_SPACE(16)
_TIMESPEC = {16: struct.Struct("@qq"), 8: struct.Struct("@ii")}
_ours: SocketRegistry[RxSocket] = SocketRegistry()


class RxSocket(socket.socket):
    """A TCP socket whose last read's kernel receive time is ``rx_ns`` (perf-counter ns).

    ``stamped`` says whether the kernel gives the stamps; when it does not, ``rx_ns`` is the
    instant the read returned.
    """

    __slots__ = ("rx_ns", "stamped")

    def __init__(
        self,
        family: int = -1,
        type: int = -1,  # socket.socket's own parameter names
        proto: int = -1,
        fileno: int | None = None,
    ) -> None:
        super().__init__(family, type, proto, fileno)
        self.rx_ns = time.perf_counter_ns()
        self.stamped = False
        if sys.platform.startswith("linux"):
            try:
                self.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                self.stamped = True
            except OSError:
                pass
        _ours.add(self)

    def accept(self) -> tuple[socket.socket, Any]:
        """``socket.accept``, the connection an :class:`RxSocket` too."""
        fd, addr = self._accept()  # type: ignore[attr-defined]
        conn = RxSocket(self.family, self.type, self.proto, fileno=fd)
        if socket.getdefaulttimeout() is None and self.gettimeout():
            conn.setblocking(True)
        return conn, addr

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if not self.stamped:
            data = super().recv(bufsize, flags)
            self.rx_ns = time.perf_counter_ns()
            return data
        data, ancdata, _, _ = self.recvmsg(bufsize, _ANC_SIZE, flags)
        self.rx_ns = _kernel_ns(ancdata)
        return data

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        """``socket.recv_into``, stamped as :meth:`recv` is (asyncio's TLS reads this way)."""
        if not self.stamped:
            n = super().recv_into(buffer, nbytes, flags)
            self.rx_ns = time.perf_counter_ns()
            return n
        view = memoryview(buffer).cast("B")
        if nbytes:
            view = view[:nbytes]
        n, ancdata, _, _ = self.recvmsg_into([view], _ANC_SIZE, flags)
        self.rx_ns = _kernel_ns(ancdata)
        return n


def _kernel_ns(ancdata: list[tuple[int, int, bytes]]) -> int:
    """The read's ``SCM_TIMESTAMPNS`` on the perf-counter clock; now when there is none (an
    end of stream carries no data, so no stamp)."""
    now = time.perf_counter_ns()
    for level, kind, data in ancdata:
        unpack = _TIMESPEC.get(len(data))
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and unpack is not None:
            sec, nsec = (int(v) for v in unpack.unpack(data))
            epoch_minus_perf = time.time_ns() - time.perf_counter_ns()
            return min(sec * 1_000_000_000 + nsec - epoch_minus_perf, now)
    return now


def rx_socket_of(transport: Any) -> RxSocket | None:
    """The :class:`RxSocket` under an asyncio transport, if it is one."""
    return _ours.of(transport)


def rx_listener(host: str, port: int, backlog: int = 128) -> RxSocket:
    """A listening, non-blocking :class:`RxSocket` on ``host:port`` (0: a free port): the
    connections it accepts are stamped too, for ``loop.create_server(sock=...)``."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    listener = RxSocket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(backlog)
        listener.setblocking(False)
    except OSError:
        listener.close()
        raise
    return listener
