"""DNS messages over sockets of our own, with the kernel's receive time of every answer.

dnspython builds and parses the wire format; the sockets are ours so that each read comes
with the instant the kernel received its bytes (``SO_TIMESTAMPNS``, read from ``recvmsg``
ancillary data). That stamp is on ``CLOCK_REALTIME``; the process clock anchor maps it onto
the waterfall's ``perf_counter_ns`` clock. Beside it we keep when our code got the bytes: the
difference is the client's read lag. Where the option is refused (another OS, a sandbox) the
userspace instant is the only one, and :attr:`Arrival.kernel_ns` is None.

A query's send instant is read just before the datagram is handed to the kernel.
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
_TIMESPEC = struct.Struct("@ll")
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size) * 2
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


def kernel_stamp_ns(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    """The receive stamp in ``recvmsg`` ancillary data, on the ``perf_counter_ns`` clock."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
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
        try:
            self._sock.connect(server)
        except OSError:
            self._sock.close()
            raise

    def send(self, payload: bytes) -> int:
        """Send one datagram; returns the instant just before it was handed to the kernel."""
        t = now_ns()
        self._sock.send(payload)
        return t

    async def receive(self) -> Arrival:
        """The next datagram from the server (``ConnectionRefusedError``: nobody listens)."""
        return await _read(self._sock, MAX_MESSAGE)

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
