"""Precise sleeping, loopback checks and the background-loop runner shared by the test bed.

``asyncio.sleep(d)`` is not precise enough to inject known delays: the selector rounds its
timeout up to whole milliseconds, so a 10 ms sleep often lasts 10.9 ms. :func:`sleep_until`
sleeps on the event loop until shortly before an absolute deadline, then spins (yielding the
GIL and the loop) until the deadline has passed; a real-time server naps in short steps instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import socket
import ssl as ssl_module
import struct
import time
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

from .._threads import ThreadRunner
from ._rx import rx_listener

__all__ = [
    "SPIN_NS",
    "Service",
    "ThreadRunner",
    "abort_with_rst",
    "check_loopback",
    "deadline_after",
    "sleep_until",
]

#: How long before a deadline :func:`sleep_until` stops sleeping on the loop and starts
#: spinning. The selector rounds timeouts up to whole milliseconds (twice, so 8.5 ms can become
#: 10 ms) and a VM adds a few hundred microseconds of wake-up latency: 1.5 ms was measured to
#: overshoot by ~0.3 ms at the median, 3 ms lands within ~5 us.
SPIN_NS = 3_000_000

#: Below this much remaining time the spin stops calling ``time.sleep(0)``, which itself can
#: take ~80 us (timer slack), and only yields to the event loop.
_TIGHT_SPIN_NS = 200_000

#: At a real-time policy the spin naps instead, in steps of at most this long: a real-time
#: thread has no timer slack, so a short sleep ends on time, and the CPU goes back to ordinary
#: processes (a spinning real-time server would starve the client it serves on a small host,
#: which then reads many tokens in one late read). Other tasks on the loop wait at most one
#: step; the last step's worth is spun.
_NAP_NS = 100_000
_REALTIME_POLICIES = {getattr(os, n) for n in ("SCHED_RR", "SCHED_FIFO") if hasattr(os, n)}

S = TypeVar("S", bound="Service")


async def sleep_until(deadline_ns: int) -> None:
    """Return as soon as ``time.perf_counter_ns()`` has reached ``deadline_ns``.

    Sleeps on the event loop until :data:`SPIN_NS` before the deadline, then spins. Each spin
    step calls ``asyncio.sleep(0)`` (lets other tasks on this loop run) and, until the last
    200 us, ``time.sleep(0)`` (lets other threads take the GIL), so a server and a client
    sharing one loop or one process both keep making progress. At a real-time policy the
    steps are naps of at most 100 us until the last 100 us, which leave the CPU to others. A
    deadline in the past returns after a single yield to the loop.
    """
    remaining = deadline_ns - time.perf_counter_ns()
    if remaining > SPIN_NS:
        await asyncio.sleep((remaining - SPIN_NS) / 1e9)
    await asyncio.sleep(0)
    realtime = _realtime()
    while (remaining := deadline_ns - time.perf_counter_ns()) > 0:
        if realtime and remaining > _NAP_NS:
            time.sleep(min(remaining - _NAP_NS, _NAP_NS) / 1e9)
        elif remaining > _TIGHT_SPIN_NS:
            time.sleep(0)
        await asyncio.sleep(0)


def _realtime() -> bool:
    """This thread runs at a real-time policy (a test-bed server child, ``_priority``)."""
    policy = getattr(os, "sched_getscheduler", None)
    return policy is not None and policy(0) in _REALTIME_POLICIES


def deadline_after(start_ns: int, seconds: float) -> int:
    """Return the absolute ``perf_counter_ns`` deadline ``seconds`` after ``start_ns``."""
    return start_ns + round(seconds * 1e9)


#: Set by :mod:`.netline` for the processes it starts: the namespace it created for them.
NETNS_ENV = "LATENCY_ANALYZER_NETNS"


def check_loopback(host: str) -> str:
    """Return ``host`` if it is a loopback IP literal (127.0.0.0/8 or ::1), else raise.

    Inside a network namespace that the test bed created (:mod:`.netline` names it in
    ``LATENCY_ANALYZER_NETNS``) any IP literal is allowed: nothing there reaches the host's
    networks.

    Raises:
        ValueError: ``host`` is a name or a non-loopback address; the test bed never binds
            anything but loopback.
    """
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"test bed servers bind loopback IP literals only, got {host!r}") from None
    if not address.is_loopback and not _in_test_netns():
        raise ValueError(f"test bed servers bind loopback addresses only, got {host!r}")
    return host


def _in_test_netns() -> bool:
    """True when this process is in the network namespace the test bed made and named."""
    made = os.environ.get(NETNS_ENV)
    try:
        return made is not None and os.readlink("/proc/self/ns/net") == made
    except OSError:  # not Linux
        return False


def abort_with_rst(transport: asyncio.BaseTransport) -> None:
    """Close ``transport`` with a TCP RST (SO_LINGER 0) instead of a FIN."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # already closed: nothing left to reset
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    if isinstance(transport, asyncio.WriteTransport):
        transport.abort()
    else:
        transport.close()


class Service:
    """Base of the loopback servers: ``start()``/``stop()`` plus both runner styles.

    ``async with server:`` runs it on the current event loop; ``with server.run_in_thread():``
    runs it on a private event loop in a daemon thread (for synchronous callers).
    """

    _host: str = "127.0.0.1"
    _port: int = 0  # the bound port once started
    _server: asyncio.Server | None = None  # the listener, while listening

    @property
    def host(self) -> str:
        """The bound address."""
        return self._host

    @property
    def port(self) -> int:
        """The bound port (0 until started)."""
        return self._port

    def _authority(self) -> str:
        """``host:port``, an IPv6 host in brackets."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{host}:{self._port}"

    def _base_url(self, scheme: str) -> str:
        """``scheme://host:port``, an IPv6 host in brackets."""
        return f"{scheme}://{self._authority()}"

    async def _listen(
        self,
        factory: Callable[[], asyncio.BaseProtocol],
        ssl: ssl_module.SSLContext | None = None,
        *,
        stamped: bool = False,
    ) -> None:
        """Listen on TCP ``host:port`` (port 0: a free one, then kept) with ``factory``;
        ``stamped``: on an :class:`~._rx.RxSocket`, whose connections know the kernel's
        receive time of their last read (``rx_socket_of``)."""
        loop = asyncio.get_running_loop()
        if stamped:
            listener = rx_listener(self._host, self._port)
            self._server = await loop.create_server(factory, sock=listener, ssl=ssl)
        else:
            self._server = await loop.create_server(factory, self._host, self._port, ssl=ssl)
        self._port = int(self._server.sockets[0].getsockname()[1])

    def _close_listener(self) -> asyncio.Server | None:
        """Stop accepting connections; return the closed listener (None if there was none)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        return server

    async def start(self) -> None:
        """Bind and start serving."""
        raise NotImplementedError

    async def stop(self) -> None:
        """Stop serving and close every connection."""
        raise NotImplementedError

    async def __aenter__(self: S) -> S:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def run_in_thread(self: S) -> ThreadRunner[S]:
        """Return a sync context manager running this server on its own loop in a thread."""
        return ThreadRunner(self)
