"""The dialer's socket: ``connect`` stamped at the syscall, ended at the kernel's SYN-ACK.

aiohttp makes its sockets through :func:`_socket_factory`; the request dialling (from the
task's context) gets its ``connect`` stage from the socket itself (see :mod:`.connector`).
"""

from __future__ import annotations

import socket
from typing import Any

from ._state import CURRENT, RequestState, now_ns
from ._wire import StampedSocket


class _PromptSocket(StampedSocket):
    """A socket whose non-blocking ``connect`` says so when the handshake is already done.

    A non-blocking ``connect`` returns EINPROGRESS even when the kernel completed the handshake
    within the call, as it does on loopback. asyncio then waits for writability, two event-loop
    iterations that the connect stage would count as TCP time (60-80 µs measured here). One
    ``getpeername`` tells a finished handshake from a pending one; a pending one (any real
    network) is left to asyncio exactly as before.

    The request that dials it (``state``, from the dialling task's context) gets its
    ``connect`` stage from here: begun just before the syscall, ended at the SYN-ACK as the
    kernel timed it (:func:`_handshake_end`), at once for a prompt handshake, at the
    protocol factory call for a pending one.
    """

    __slots__ = ("state",)

    def __init__(self, family: int, type_: int, proto: int, fileno: int | None = None) -> None:
        super().__init__(family, type_, proto, fileno)
        self.state: RequestState | None = None

    def connect(self, address: Any) -> None:
        state, self.state = self.state, None  # not kept: the socket outlives the request
        opens = state is not None and not _seen(state, "connect")  # a dial's first socket
        wire = self.wire
        # Nothing between the stamp and the syscall that could allocate (a garbage
        # collection would run there) or wait: the SYN leaves inside the call.
        t = now_ns()
        try:
            _socket_connect(self, address)
        except BlockingIOError as pending:
            done = now_ns()
            try:
                self.getpeername()
            except OSError:
                wire.connect_ns = t
                if state is not None:
                    if opens:
                        state.begin("connect", t)
                    state.dialled = [*(state.dialled or ()), self]
                raise pending from None
        else:
            done = now_ns()
        wire.connect_ns, wire.connected_ns = t, done
        if state is None:
            return
        if opens:
            state.begin("connect", t)
        if state.recorder.is_open("connect"):
            end, source = _handshake_end(self, t, done)
            state.end("connect", end, clock_source=source)


_socket_connect = socket.socket.connect  # the C method itself: no super() object to build


def _handshake_end(sock: StampedSocket, connect_ns: int, now: int) -> tuple[int, str]:
    """When the SYN-ACK came: the connect's start plus the kernel's handshake RTT.

    ``TCP_INFO``'s ``tcpi_rtt`` before any data has been sent is the connection's first RTT
    sample, SYN → SYN-ACK in µs (the smoothed RTT starts at the first sample), taken by the
    kernel whenever our loop got round to the socket. A retransmitted SYN gives no clean
    sample (Karn): then, or without a reading, the end is ``now`` and says ``userspace``.

    ``connect_ns`` is our instant before the syscall that sent the SYN: the span's length is
    the kernel's, and both of its edges precede the wire's by the time the syscall took to
    send the SYN (a preemption there shifts them together).
    """
    rtt = sock.handshake_rtt_ns()
    if rtt is None or not connect_ns + rtt <= now:
        return now, "userspace"
    return connect_ns + rtt, "kernel"


def _pending_handshake_end(state: RequestState, now: int) -> tuple[int, str]:
    """The end of a handshake asyncio waited for: the connected socket's SYN-ACK, as the
    kernel timed it, read before any byte is sent on it (``now``: the factory call)."""
    dialled, state.dialled = state.dialled or [], None
    for sock in dialled:
        if sock.fileno() == -1 or sock.wire.connect_ns is None:  # a happy-eyeballs loser
            continue
        try:
            sock.getpeername()
        except OSError:
            continue
        return _handshake_end(sock, sock.wire.connect_ns, now)
    return now, "userspace"


def _seen(state: RequestState, stage: str) -> bool:
    """The stage is open or done on this request."""
    return state.recorder.is_open(stage) or state.recorder.has(stage)


def _socket_factory(addr_info: tuple[Any, ...]) -> socket.socket:
    family, type_, proto = addr_info[:3]
    sock = _PromptSocket(family, type_, proto)
    sock.state = state = CURRENT.get()
    if state is not None:
        state.sockets = [*(state.sockets or ()), sock]
    return sock
