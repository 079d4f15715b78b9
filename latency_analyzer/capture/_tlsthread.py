"""A new connection's TLS handshake, run in a worker thread, and the request that leaves with it.

A handshake driven by the event loop pays, at the moment that counts (the server's flight has
arrived, the client's Finished and the request are due), for the loop's wake-up, its
callbacks and asyncio's TLS protocol before OpenSSL even starts; measured beside curl on a
cold HTTP/2 request through a 10 ms round trip (``benchmarks/bench_h2_cold.py``), that path
alone was 0.6-0.8 ms behind curl. A thread blocked in ``recvmsg`` wakes straight into OpenSSL.

So :func:`handshake_in_thread` sends the ClientHello from the loop (an ``SSLObject`` over two
memory buffers, as asyncio's own TLS uses) and hands the socket to a worker thread, which
waits for the server with blocking calls, completes the session and, when ALPN chose ``h2``,
sends the request's first flight (preface, SETTINGS, HEADERS) in the same ``send`` as its
Finished. The loop encodes that flight meanwhile, in the round trip (:class:`FirstFlight`: the
thread takes it if it is there in time, else the loop writes it after the hand-back). The
thread then gives the socket back, non-blocking, for :class:`~._tlstransport.TlsTransport` to
carry.

The socket is ours (:class:`~._wire.StampedSocket`): the thread's reads carry the kernel's
receive stamps and its sends are stamped, as the loop's would be. A cancelled dial (a timeout,
a closed Client) shuts the socket down, which wakes the thread; the socket is closed once the
thread let go of it. The thread waits at most ``bound`` seconds for any one socket call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import socket
import ssl
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ._state import now_ns as _now
from ._wire import StampedSocket

__all__ = ["FirstFlight", "Handshaken", "handshake_in_thread"]

_READ = 256 * 1024
_BOUND = 300.0  # seconds any one of the thread's socket calls may block, when no timeout says
_IDLE = 60.0  # seconds a worker with nothing to do waits before it ends


class FirstFlight:
    """Request bytes the loop offers the handshaking thread, to leave with the Finished.

    Either the thread takes them (:meth:`take`, which closes the offer whether or not
    anything was there) or they were offered too late (:meth:`offer` says False) and stay
    the loop's to write.
    """

    __slots__ = ("_closed", "_data", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: bytes | None = None
        self._closed = False

    def offer(self, data: bytes) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._data = data
            return True

    def take(self) -> bytes | None:
        with self._lock:
            self._closed = True
            data, self._data = self._data, None
            return data


class Handshaken:
    """A session set up by the thread: the ``SSLObject``, its buffers, the plaintext that came
    with the handshake's last read (``early``) and whether the peer's close_notify came with it
    (``ended``), the ciphertext the kernel did not take at once (``unsent``: the transport
    sends it), and when the send carrying the first flight was entered (``flight_sent_ns``;
    0 when the thread did not take the flight)."""

    __slots__ = ("early", "ended", "flight_sent_ns", "incoming", "obj", "outgoing", "unsent")

    def __init__(
        self,
        obj: ssl.SSLObject,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        early: bytes,
        ended: bool,
        unsent: bytes,
        flight_sent_ns: int,
    ) -> None:
        self.obj, self.incoming, self.outgoing = obj, incoming, outgoing
        self.early, self.ended, self.unsent = early, ended, unsent
        self.flight_sent_ns = flight_sent_ns


class _Workers:
    """Daemon threads for handshakes, one per handshake under way: a dial never waits for
    another's (each blocks its thread for a round trip, or until its timeout against a
    server that does not answer), and none keeps the interpreter from exiting. An idle
    worker takes the next handshake; one idle for ``_IDLE`` seconds ends."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]]
        self._jobs = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        job: Future[Any] = Future()
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1  # that worker is spoken for
        self._jobs.put((job, fn, args))
        if start:
            threading.Thread(target=self._work, name="latency-analyzer-tls", daemon=True).start()
        return job

    def _work(self) -> None:
        while True:
            try:
                job, fn, args = self._jobs.get(timeout=_IDLE)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # no job was handed to this worker: it may go
                        self._idle -= 1
                        return
                continue  # a job is on its way to this worker
            if job.set_running_or_notify_cancel():
                try:
                    job.set_result(fn(*args))
                except BaseException as exc:
                    job.set_exception(exc)
            with self._lock:
                self._idle += 1


_workers: _Workers | None = None


def _executor() -> _Workers:
    global _workers
    if _workers is None:
        _workers = _Workers()
    return _workers


def _forget_workers() -> None:
    """A forked child has none of its parent's threads: it starts workers of its own."""
    global _workers
    _workers = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers)


async def handshake_in_thread(
    sock: StampedSocket,
    context: ssl.SSLContext,
    server_hostname: str | None,
    bound: float | None,
    encode: Callable[[], bytes | None] | None = None,
) -> Handshaken:
    """Set up TLS on the connected ``sock``, the wait for the server in a worker thread.

    The ClientHello is built and sent here, in the loop, so the thread's start-up falls in
    the round trip it then waits out; ``encode``, when given, is called next (still in that
    round trip), and the bytes it returns are sent with the Finished if ALPN chose ``h2`` and
    they are there in time. On any failure or cancellation the socket is closed (once the
    thread let go of it).
    """
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    flight = FirstFlight() if encode is not None else None
    try:
        obj = context.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
        with contextlib.suppress(ssl.SSLWantReadError):
            obj.do_handshake()  # the ClientHello, into ``outgoing``
        hello = memoryview(outgoing.read())
        with contextlib.suppress(BlockingIOError, InterruptedError):
            hello = hello[sock.send(hello) :]  # a new socket takes it whole: else the thread
    except BaseException:
        sock.close()
        raise
    job = _executor().submit(
        _handshake, sock, obj, incoming, outgoing, bytes(hello), bound or _BOUND, flight
    )
    try:
        if encode is not None and flight is not None:
            data = encode()
            if data:
                flight.offer(data)
        return await asyncio.wrap_future(job)
    except BaseException:
        if not job.done():  # cancelled while the thread blocks: wake it, close once it let go
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            job.add_done_callback(_closer(sock))
        else:
            sock.close()
        raise


def _closer(sock: socket.socket) -> Callable[[Future[Handshaken]], None]:
    def close(_: Future[Handshaken]) -> None:
        sock.close()

    return close


def _handshake(
    sock: StampedSocket,
    obj: ssl.SSLObject,
    incoming: ssl.MemoryBIO,
    outgoing: ssl.MemoryBIO,
    unsent: bytes,
    bound: float,
    flight: FirstFlight | None,
) -> Handshaken:
    """The worker thread's part, from the ClientHello on (``unsent``: what of it the loop's
    non-blocking send left): blocking socket calls, each at most ``bound`` seconds."""
    sock.settimeout(bound)
    try:
        if unsent:
            _send_all(sock, unsent)
        while True:
            try:
                obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                pass
            if outgoing.pending:  # a HelloRetryRequest's second ClientHello, TLS 1.2's
                _send_all(sock, outgoing.read())
            data = sock.recv(_READ)  # stamped: the last one is the handshake's end
            if not data:
                raise ConnectionResetError("the server closed the connection in the TLS handshake")
            incoming.write(data)
        request = None
        if flight is not None:
            request = flight.take()
            if request is not None and obj.selected_alpn_protocol() == "h2":
                obj.write(request)
            else:
                request = None
        # the Finished (and the flight) in one send, of which the kernel takes what it has room
        # for now: the rest is the transport's to send, as any write's (a flight may carry up
        # to 64 KiB of body, which must not hold the thread or end ``send`` early)
        sock.setblocking(False)
        unsent, sent_ns = outgoing.read(), _now()
        with contextlib.suppress(BlockingIOError, InterruptedError):
            unsent = unsent[sock.send(unsent) :]
            sent_ns = sock.wire.send_start_ns
        early: list[bytes] = []
        ended = False
        try:
            while chunk := obj.read(_READ):
                early.append(chunk)
            ended = True  # b"": the peer's close_notify came with the handshake
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLZeroReturnError:
            ended = True
        flight_ns = sent_ns if request else 0
        return Handshaken(obj, incoming, outgoing, b"".join(early), ended, unsent, flight_ns)
    finally:
        sock.setblocking(False)


def _send_all(sock: StampedSocket, data: bytes) -> None:
    """Send all of ``data`` (the socket blocks, for at most its timeout per call)."""
    view = memoryview(data)
    while view:
        view = view[sock.send(view) :]
