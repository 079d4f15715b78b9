"""Sockets that read with the kernel's receive timestamp and note when bytes are sent.

asyncio's selector transports read a connected socket with ``sock.recv`` (a plain protocol)
or ``sock.recv_into`` (a buffered one, as its TLS protocol is), and write with ``sock.send``
(or ``sendmsg``). :class:`StampedSocket` overrides exactly those: ``SO_TIMESTAMPNS`` is
enabled when the socket is made, every read is a ``recvmsg_into`` (into the reading thread's
buffer) whose ancillary data carries the kernel's receive time of the last segment the read
returned, and every send notes the instant before its syscall and after it returned.

The stamps live in a :class:`WireStamps` owned by the socket. The protocol that sees the
bytes (aiohttp's, TLS's application protocol, the HTTP/2 connection) finds it with
:func:`wire_of` from the transport's ``socket`` extra (the descriptor names it) and reads the
last stamp inside ``data_received``: asyncio calls that in the same callback as the read, and
TLS decrypts synchronously there too, so the last ciphertext read is what completed the
plaintext handed over.

Precision: a stamp is the arrival of the newest segment in the read. While our loop keeps
up that is the segment itself (within a few µs of a packet capture). When it falls behind,
segments queue, the kernel merges them into one buffer (receive coalescing) and keeps the
newest stamp, so bytes read late carry the arrival of the last segment that joined them;
their own arrival lies after the socket's previous read began (the read lag does not bound
it). Reads that completed several content events are counted on the waterfall
(``multi_event_reads``).

The kernel stamps ``CLOCK_REALTIME``; the process's clock anchor maps it onto
``perf_counter_ns`` (``CLOCK_MONOTONIC``). Where the option is refused or the platform is not
Linux, reads fall back to the userspace instant and :attr:`WireStamps.kernel` says False, with
the reason in :attr:`WireStamps.refused`.
"""

from __future__ import annotations

import atexit
import platform
import socket
import struct
import sys
import threading
import time
from typing import Any

from .._sockets import SocketRegistry
from ..timeline import process_anchor

__all__ = [
    "StampedSocket",
    "WireStamps",
    "kernel_stamped_fd",
    "kernel_stamps_supported",
    "stamped_socket_of",
    "wire_of",
]

_now = time.perf_counter_ns

# SO_TIMESTAMPNS (the "old" value, a native struct timespec) of Linux's generic socket ABI:
# Python does not export it. Architectures with their own numbering are left to userspace.
_SO_TIMESTAMPNS = 35
_GENERIC_ABI = {"x86_64", "amd64", "aarch64", "arm64", "riscv64", "i686", "i386", "armv7l"}
_ANC_SIZE = socket.CMSG_SPACE(16)
_TCP_INFO = getattr(
    socket, "TCP_INFO", 11
)  # struct tcp_info: u32 tcpi_rtt at 68, total_retrans at 100
_TIMESPEC = {16: struct.Struct("@qq"), 8: struct.Struct("@ii")}
_SOL_SOCKET = socket.SOL_SOCKET


def kernel_stamps_supported() -> str | None:
    """None when this platform can stamp reads in the kernel, else why not."""
    if not sys.platform.startswith("linux"):
        return f"kernel receive timestamps are read on Linux only (this is {sys.platform})"
    machine = platform.machine().lower()
    if machine not in _GENERIC_ABI:
        return f"SO_TIMESTAMPNS numbering of {machine!r} is not known here"
    return None


_UNSUPPORTED = kernel_stamps_supported()
_keeper: list[socket.socket] = []


def _keep_stamping_on() -> None:
    """Hold one stamping socket open for the life of the process.

    The kernel timestamps arriving packets only while some socket wants it, and it switches
    that on through deferred work: the first reads of the first socket that asks would come
    without a stamp, and so would every first read after the last such socket closed. An
    idle, unbound UDP socket that asked once keeps it on.
    """
    if not _keeper:
        keeper = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        keeper.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        _keeper.append(keeper)
        atexit.register(keeper.close)


class WireStamps:
    """What one socket's last read and sends were stamped with (``perf_counter_ns``).

    Attributes:
        kernel: True once the kernel agreed to stamp this socket's reads.
        refused: why kernel stamps are not in use (None when they are).
        read_kernel_ns: the kernel's arrival time of the last read's last segment; the
            userspace instant when the kernel gave none.
        read_user_ns: when the last ``recvmsg`` returned (our event loop's instant).
        read_stamped: whether ``read_kernel_ns`` of the last read came from the kernel.
        first_send_ns: just before the first send syscall since :meth:`mark_request` that
            handed the kernel bytes (a refused one, EAGAIN, is not counted).
        send_start_ns: just before the latest send syscall that handed the kernel bytes.
        sent_ns: just after that syscall returned.
        connect_ns / connected_ns: just before ``connect`` was called / just after it returned
            with the handshake done (None while pending: asyncio waits for it then).
    """

    __slots__ = (
        "_perf_minus_epoch",
        "connect_ns",
        "connected_ns",
        "first_send_ns",
        "kernel",
        "read_kernel_ns",
        "read_stamped",
        "read_user_ns",
        "refused",
        "send_start_ns",
        "sent_ns",
    )

    def __init__(self) -> None:
        self.kernel = False
        self.refused: str | None = None
        self.read_kernel_ns = 0
        self.read_user_ns = 0
        self.read_stamped = False
        self.first_send_ns: int | None = None
        self.send_start_ns = 0
        self.sent_ns = 0
        self.connect_ns: int | None = None
        self.connected_ns: int | None = None
        # the process anchor's ``to_perf_ns`` as one addition (the same integers)
        anchor = process_anchor()
        self._perf_minus_epoch = anchor.perf_ns - anchor.epoch_ns

    def mark_request(self) -> None:
        """A new request starts on this socket: its first send is stamped afresh."""
        self.first_send_ns = None

    def _read(self, ancdata: list[tuple[int, int, bytes]], user_ns: int) -> None:
        self.read_user_ns = user_ns
        # the SCM_TIMESTAMPNS of the recvmsg, epoch ns, mapped through the process anchor
        # (inline: every read of every response comes through here)
        for level, kind, data in ancdata:
            if level == _SOL_SOCKET and kind == _SO_TIMESTAMPNS:
                unpack = _TIMESPEC.get(len(data))
                if unpack is not None:
                    sec, nsec = unpack.unpack(data)
                    epoch = sec * 1_000_000_000 + nsec
                    self.read_kernel_ns = epoch + self._perf_minus_epoch
                    self.read_stamped = True
                    return
        self.read_kernel_ns, self.read_stamped = user_ns, False  # the kernel gave none


_ours: SocketRegistry[StampedSocket] = SocketRegistry()
_READ_BUFFER_SIZE = 256 * 1024  # asyncio's own read size (``max_size`` of its transports)
_threads = threading.local()


def _read_buffer() -> memoryview:
    """The calling thread's buffer that :meth:`StampedSocket.recv` reads into (an event
    loop's thread, or the one that makes a TLS handshake)."""
    try:
        view: memoryview = _threads.read_buffer
    except AttributeError:
        view = _threads.read_buffer = memoryview(bytearray(_READ_BUFFER_SIZE))
    return view


def stamped_socket_of(transport: Any) -> StampedSocket | None:
    """The socket under ``transport`` (through TLS too), if it is ours: the object asyncio
    reads and writes, not the ``TransportSocket`` view the ``socket`` extra gives."""
    return _ours.of(transport)


def kernel_stamped_fd(fd: int) -> bool:
    """Whether descriptor ``fd`` is one of our sockets whose reads the kernel stamps."""
    sock = _ours.get(fd)
    return sock is not None and sock.wire.kernel and sock.fileno() == fd


def wire_of(transport: Any) -> WireStamps | None:
    """The stamps of the socket under ``transport`` (through TLS too), if it is ours."""
    found = stamped_socket_of(transport)
    return None if found is None else found.wire


class StampedSocket(socket.socket):
    """A TCP socket whose reads carry the kernel's receive time and whose sends are noted."""

    __slots__ = ("wire",)

    def __init__(
        self,
        family: int = -1,
        type: int = -1,  # socket.socket's own parameter names: dup() passes them
        proto: int = -1,
        fileno: int | None = None,
    ) -> None:
        super().__init__(family, type, proto, fileno)
        self.wire = WireStamps()
        if _UNSUPPORTED is not None:
            self.wire.refused = _UNSUPPORTED
        else:
            try:
                _keep_stamping_on()
                self.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                self.wire.kernel = self.getsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS) == 1
                if not self.wire.kernel:
                    self.wire.refused = "SO_TIMESTAMPNS did not stay enabled"
            except OSError as exc:
                self.wire.refused = f"SO_TIMESTAMPNS refused: {exc}"
        _ours.add(self)

    def handshake_rtt_ns(self) -> int | None:
        """The kernel's SYN → SYN-ACK time, right after a connect (``tcpi_rtt``, in µs).

        Before any data is sent, the kernel's only RTT sample is the handshake itself (its
        smoothed RTT starts at the first sample), so ``connect``'s start plus this is when
        the SYN-ACK came, however late our ``connect`` call returned. None when there is no
        sample, or when the SYN was retransmitted (no clean sample then: Karn's rule).
        """
        if not sys.platform.startswith("linux"):
            return None
        try:
            info = self.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 104)
        except OSError:
            return None
        if len(info) < 104:
            return None
        rtt_us = int.from_bytes(info[68:72], sys.byteorder)
        total_retrans = int.from_bytes(info[100:104], sys.byteorder)
        return rtt_us * 1000 if rtt_us and not total_retrans else None

    # -- reads: asyncio's transports call these --
    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        wire = self.wire
        if not wire.kernel:
            data = _recv(self, bufsize, flags)
            wire._read([], _now())
            return data
        # into this thread's buffer, and only what came is copied out: a ``recvmsg`` of
        # asyncio's 256 KiB makes a bytes object of that size for every read, and shrinks it
        view = _read_buffer()
        if bufsize < len(view):
            view = view[:bufsize]
        n, ancdata, _, _ = self.recvmsg_into((view,), _ANC_SIZE, flags)
        wire._read(ancdata, _now())
        return view[:n].tobytes()

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        wire = self.wire
        if not wire.kernel:
            n = _recv_into(self, buffer, nbytes, flags)
            wire._read([], _now())
            return n
        view = memoryview(buffer).cast("B")
        if nbytes:
            view = view[:nbytes]
        n, ancdata, _, _ = self.recvmsg_into([view], _ANC_SIZE, flags)
        wire._read(ancdata, _now())
        return n

    # -- sends: the instant before the syscall and after it returned, on WireStamps --
    def send(self, data: Any, flags: int = 0) -> int:
        t = _now()
        n = _send(self, data, flags)
        after, wire = _now(), self.wire
        if wire.first_send_ns is None:
            wire.first_send_ns = t
        wire.send_start_ns, wire.sent_ns = t, after
        return n

    def sendmsg(self, buffers: Any, *args: Any) -> int:
        t = _now()
        n = _sendmsg(self, buffers, *args)
        after, wire = _now(), self.wire
        if wire.first_send_ns is None:
            wire.first_send_ns = t
        wire.send_start_ns, wire.sent_ns = t, after
        return n


# the C methods StampedSocket's overrides call (what ``super()`` finds, without looking)
_recv, _recv_into = socket.socket.recv, socket.socket.recv_into
_send, _sendmsg = socket.socket.send, socket.socket.sendmsg
