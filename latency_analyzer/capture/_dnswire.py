"""DNS messages over sockets of our own, with the kernel's receive time of every answer.

dnspython builds and parses the wire format; the sockets are ours so that each read comes
with the instant the kernel received its bytes (``SO_TIMESTAMPNS``, read from ``recvmsg``
ancillary data). That stamp is on ``CLOCK_REALTIME``; the process clock anchor maps it onto
the waterfall's ``perf_counter_ns`` clock. Beside it we keep when our code got the bytes: the
difference is the client's read lag. Where the option is refused (another OS, a sandbox) the
userspace instant is the only one, and :attr:`Arrival.kernel_ns` is None.

A query's send instant is the kernel's too where it can give one: ``SO_TIMESTAMPING`` with
software TX stamps reports, on the socket's error queue, when the datagram was handed to the
network device. Otherwise it is read just before the datagram is handed to the kernel.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
from dataclasses import dataclass

from ..timeline import process_anchor
from ._state import now_ns

__all__ = ["Arrival", "DatagramChannel", "kernel_stamp_ns", "stamp_receives", "tcp_exchange"]

#: ``SO_TIMESTAMPNS`` (Linux; Python's socket module does not name it). Its control message
#: has the same number and carries a ``struct timespec`` of two native longs.
SO_TIMESTAMPNS = 35
#: ``SO_TIMESTAMPING`` (``_OLD``: native timespecs) and its flags: software TX stamps, reported,
#: without the packet echoed back.
SO_TIMESTAMPING = 37
_TX_FLAGS = (1 << 1) | (1 << 4) | (1 << 11)  # TX_SOFTWARE | SOFTWARE | OPT_TSONLY
_TIMESPEC = struct.Struct("@ll")
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size * 3) * 3
_MSG_ERRQUEUE = getattr(socket, "MSG_ERRQUEUE", 0x2000)
MAX_MESSAGE = 65535  # the largest DNS message either transport can carry


@dataclass(frozen=True, slots=True)
class Arrival:
    """Bytes read from a socket and when.

    Attributes:
        data: what the read returned.
        kernel_ns: the kernel's receive time (``perf_counter_ns`` clock), None if unstamped.
        user_ns: when the read returned to our code.
    """

    data: bytes
    kernel_ns: int | None
    user_ns: int

    @property
    def wire_ns(self) -> int:
        """The best instant for the arrival: the kernel's, else ours."""
        return self.user_ns if self.kernel_ns is None else self.kernel_ns


def stamp_receives(sock: socket.socket) -> bool:
    """Ask the kernel to stamp what ``sock`` receives; False where that is refused."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def stamp_sends(sock: socket.socket) -> bool:
    """Ask the kernel to report when each datagram ``sock`` sends reached the device."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, _TX_FLAGS)
    except OSError:
        return False
    return True


def kernel_stamp_ns(
    ancdata: list[tuple[int, int, bytes]], kind: int = SO_TIMESTAMPNS
) -> int | None:
    """A kernel stamp in ``recvmsg`` ancillary data, on the ``perf_counter_ns`` clock.

    ``kind`` is ``SO_TIMESTAMPNS`` (a receive stamp) or ``SO_TIMESTAMPING`` (the first of its
    three timespecs, the software one: a send stamp from the error queue).
    """
    for level, got, data in ancdata:
        if level == socket.SOL_SOCKET and got == kind and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            if sec or nsec:
                return process_anchor().to_perf_ns(sec * 1_000_000_000 + nsec)
    return None


async def _readable(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


async def _read(sock: socket.socket, size: int) -> Arrival:
    """One ``recvmsg`` of at most ``size`` bytes, waiting for readability as needed."""
    while True:
        try:
            data, ancdata, _, _ = sock.recvmsg(size, _ANCILLARY)
        except (BlockingIOError, InterruptedError):
            await _readable(sock)
            continue
        user = now_ns()
        return Arrival(data, kernel_stamp_ns(ancdata), user)


class DatagramChannel:
    """A connected UDP socket to one nameserver (the kernel drops datagrams from elsewhere).

    Args:
        server: (address, port) of the nameserver.
    """

    def __init__(self, server: tuple[str, int]) -> None:
        family = socket.AF_INET6 if ":" in server[0] else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        self.stamped = stamp_receives(self._sock)
        self._tx_stamped = stamp_sends(self._sock)
        #: the kernel's instant the last datagram reached the device (None: not reported yet)
        self.sent_kernel_ns: int | None = None
        try:
            self._sock.connect(server)
        except OSError:
            self._sock.close()
            raise

    def send(self, payload: bytes) -> int:
        """Send one datagram; returns the instant just before it was handed to the kernel.

        The kernel's own send instant, where reported, lands in :attr:`sent_kernel_ns` (on
        loopback at once; a real device may report it a little later, read with the answer).
        """
        t = now_ns()
        self._sock.send(payload)
        self.sent_kernel_ns = None
        self._drain_send_stamps()
        return t

    def _drain_send_stamps(self) -> None:
        """Read the error queue: send stamps (an unread one would keep the socket readable)."""
        if not self._tx_stamped:
            return
        while True:
            try:
                _, ancdata, _, _ = self._sock.recvmsg(1, _ANCILLARY, _MSG_ERRQUEUE)
            except OSError:  # empty (EAGAIN), or no error queue on this system
                return
            stamp = kernel_stamp_ns(ancdata, SO_TIMESTAMPING)
            if stamp is not None and self.sent_kernel_ns is None:
                self.sent_kernel_ns = stamp

    async def receive(self) -> Arrival:
        """The next datagram from the server (``ConnectionRefusedError``: nobody listens)."""
        while True:
            try:
                data, ancdata, _, _ = self._sock.recvmsg(MAX_MESSAGE, _ANCILLARY)
            except (BlockingIOError, InterruptedError):
                self._drain_send_stamps()
                await _readable(self._sock)
                continue
            user = now_ns()
            self._drain_send_stamps()
            return Arrival(data, kernel_stamp_ns(ancdata), user)

    def close(self) -> None:
        self._sock.close()


async def tcp_exchange(server: tuple[str, int], payload: bytes) -> tuple[int, Arrival, bool]:
    """One length-prefixed query over TCP (RFC 1035 4.2.2).

    Returns:
        The instant the query was handed to the kernel, the whole answer (stamped by its last
        read) and whether the kernel stamped the reads.
    """
    loop = asyncio.get_running_loop()
    family = socket.AF_INET6 if ":" in server[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setblocking(False)
        stamped = stamp_receives(sock)
        await loop.sock_connect(sock, server)
        sent = now_ns()
        await loop.sock_sendall(sock, len(payload).to_bytes(2, "big") + payload)
        buffer = bytearray()
        size: int | None = None
        last: Arrival | None = None
        while size is None or len(buffer) < size + 2:
            want = 2 - len(buffer) if size is None else size + 2 - len(buffer)
            last = await _read(sock, want)
            if not last.data:
                raise ConnectionResetError("the nameserver closed the TCP connection mid-answer")
            buffer += last.data
            if size is None and len(buffer) >= 2:
                size = int.from_bytes(buffer[:2], "big")
        assert last is not None
        return sent, Arrival(bytes(buffer[2:]), last.kernel_ns, last.user_ns), stamped
