"""An asyncio transport over a connected socket whose TLS state is an ``SSLObject`` in memory.

asyncio cannot take over a TLS session that was set up elsewhere: its TLS transport runs the
handshake itself, inside the event loop. :mod:`._tlsthread` runs it in a worker thread
instead, and this transport carries the session from there on: ciphertext read from the
socket goes into the session's incoming buffer and the plaintext out of it to the protocol;
what the protocol writes is encrypted into the outgoing buffer and sent.

The socket is one of ours (:class:`~._wire.StampedSocket`): every read is a ``recvmsg`` with
the kernel's receive stamp and every send is stamped, so the protocols on top read their
stamps exactly as they do over asyncio's transports (the ``socket`` extra names the socket).

Semantics follow asyncio's TLS transport: ``connection_lost`` is called once, on the next
loop step, after ``close`` has flushed what was written and TLS's close_notify and the peer
answered it (or closed), or at once on ``abort``, an error and the peer's own close;
``pause_writing`` / ``resume_writing`` follow the write buffer's limits, counted in
ciphertext bytes not yet handed to the kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
from asyncio import trsock
from typing import Any, cast

from ._wire import StampedSocket

__all__ = ["TlsTransport"]

# what one read may take from the socket; plaintext of it is never longer than the ciphertext
_READ = 256 * 1024
_HIGH = 64 * 1024  # asyncio's default write buffer limits
_WANT = (ssl.SSLWantReadError, ssl.SSLWantWriteError)
_SHUTDOWN_TIMEOUT = 30.0  # seconds a close waits for the peer's answer (asyncio's default)


class _Buffers(threading.local):
    """Where reads land before they are copied out: one pair per thread (a loop runs in
    one), not per connection, since a read's bytes leave them within its callback."""

    def __init__(self) -> None:
        self.cipher = bytearray(_READ)
        self.cipher_view = memoryview(self.cipher)
        self.plain = bytearray(_READ)
        self.plain_view = memoryview(self.plain)


_BUFFERS = _Buffers()


class TlsTransport(asyncio.Transport):
    """A TLS session (``obj`` over ``incoming`` / ``outgoing``) on a connected socket.

    ``early`` is plaintext the session decrypted before the transport existed (records that
    came with the handshake's last read); the protocol gets it as its first read, and an end
    of stream after it when ``ended`` (the peer's close_notify came with them). ``unsent`` is
    ciphertext of ours the kernel has not taken yet: it is sent first.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: StampedSocket,
        obj: ssl.SSLObject,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        context: ssl.SSLContext,
        early: bytes = b"",
        unsent: bytes = b"",
        ended: bool = False,
    ) -> None:
        super().__init__()
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._obj, self._incoming, self._outgoing = obj, incoming, outgoing
        self._protocol: asyncio.BaseProtocol | None = None
        # ciphertext not yet taken by the kernel, the handshake's own first: sent once the loop
        # turns, after start(); buffered before the protocol sets its limits, it sees the backlog
        self._buffer = bytearray(unsent)
        if unsent:
            loop.add_writer(self._fd, self._write_ready)
        self._high, self._low = _HIGH, _HIGH // 4
        self._writing_paused = False
        self._paused = True  # until start(): nothing is read before the protocol is there
        self._pending = early  # plaintext not yet handed to the protocol
        self._ended = ended  # the peer's close_notify came with the handshake
        self._plain_reads = 0  # reads that handed the protocol plaintext
        self._closing = False
        self._lost = False  # connection_lost scheduled (it runs once)
        self._timer: asyncio.TimerHandle | None = None  # the bound on waiting for the peer
        self._extra: dict[str, Any] = {
            "socket": trsock.TransportSocket(sock),
            "ssl_object": obj,
            "sslcontext": context,
        }
        for name, get in (("sockname", sock.getsockname), ("peername", sock.getpeername)):
            try:
                self._extra[name] = get()
            except OSError:
                self._extra[name] = None

    def start(self, protocol: asyncio.BaseProtocol) -> None:
        """Give the connection to ``protocol`` (``connection_made`` now) and start reading,
        unless the protocol paused reading inside ``connection_made``."""
        self._protocol = protocol
        self._paused = False
        protocol.connection_made(self)
        if not self._paused and not self._closing:
            self._loop.add_reader(self._fd, self._read_ready)
            if self._pending or self._ended:
                self._loop.call_soon(self._deliver_pending)

    # -- extras --
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name not in self._extra:
            # the peer's certificate is parsed only when asked for (it costs ~60 µs)
            if name == "peercert":
                self._extra[name] = self._obj.getpeercert()
            elif name == "cipher":
                self._extra[name] = self._obj.cipher()
            elif name == "compression":
                self._extra[name] = self._obj.compression()
        return self._extra.get(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def is_closing(self) -> bool:
        return self._closing

    # -- reading --
    def is_reading(self) -> bool:
        return not self._paused and not self._closing

    def pause_reading(self) -> None:
        if self._closing or self._paused:
            return
        self._paused = True
        self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        if self._closing or not self._paused:
            return
        self._paused = False
        self._loop.add_reader(self._fd, self._read_ready)
        if self._pending or self._ended:
            self._loop.call_soon(self._deliver_pending)

    def _deliver_pending(self) -> None:
        if self._paused or self._closing:
            return
        if self._pending:
            data, self._pending = self._pending, b""
            self._data_received(data)
        if self._ended and not self._closing:
            self._eof()

    def _read_ready(self) -> None:
        if self._closing:
            self._read_closing()
            return
        bufs = _BUFFERS
        try:
            # the kernel's stamp of this read is on the socket
            n = self._sock.recv_into(bufs.cipher, _READ)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._force_close(exc)
            return
        if not n:
            self._eof()
            return
        self._incoming.write(bufs.cipher_view[:n])
        chunks: list[bytes] = []
        ended = False
        read, plain, view = self._obj.read, bufs.plain, bufs.plain_view
        try:
            while True:
                m = cast(int, read(_READ, plain))  # into the buffer: the count
                if not m:  # the peer's close_notify (no data yet raises SSLWantReadError)
                    ended = True
                    break
                chunks.append(view[:m].tobytes())
        except _WANT:
            pass
        except ssl.SSLZeroReturnError:  # the peer's close_notify, as some versions say it
            ended = True
        except ssl.SSLError as exc:
            self._force_close(exc)
            return
        if self._outgoing.pending:  # a post-handshake message of ours (a key update)
            self._send_cipher(self._outgoing.read())
        if self._pending:  # early plaintext not yet delivered goes first
            chunks.insert(0, self._pending)
            self._pending = b""
        if chunks:
            self._data_received(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        if ended and not self._closing:
            self._eof()

    def read_idle(self) -> bool:
        """Read an idle connection whose socket polled readable (a pooled connection at
        checkout): True when that brought the peer's close, an error or application bytes;
        False when it held only TLS's own records (a TLS 1.3 session ticket arrives after
        the handshake), which leave the connection as good as it was."""
        before = self._plain_reads
        self._read_ready()
        return self._closing or self._plain_reads != before

    def _data_received(self, data: bytes) -> None:
        protocol = self._protocol
        assert protocol is not None
        self._plain_reads += 1
        try:
            protocol.data_received(data)  # type: ignore[attr-defined]
        except Exception as exc:
            self._force_close(exc)

    def _eof(self) -> None:
        protocol = self._protocol
        try:
            if protocol is not None:
                protocol.eof_received()  # type: ignore[attr-defined]
        finally:
            # TLS has no half-close: the connection ends with its reading side. Our
            # close_notify answers the peer's, in one try (a peer that waits for it is done)
            if not self._lost and not self._buffer:
                with contextlib.suppress(ssl.SSLError, ValueError, OSError):
                    self._obj.unwrap()
                with contextlib.suppress(OSError):
                    if self._outgoing.pending:
                        self._sock.send(self._outgoing.read())
            self._force_close(None)

    # -- writing --
    def get_write_buffer_size(self) -> int:
        return len(self._buffer)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = _HIGH if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high, self._low = high, low
        self._maybe_pause()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data or self._closing:
            return
        try:
            self._obj.write(data)
        except ssl.SSLError as exc:
            self._force_close(exc)
            return
        self._send_cipher(self._outgoing.read())

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        raise NotImplementedError("TLS has no half-close")

    def _send_cipher(self, cipher: bytes) -> None:
        if not cipher or self._lost:
            return
        if not self._buffer:
            try:
                n = self._sock.send(cipher)  # stamped at the syscall
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as exc:
                self._force_close(exc)
                return
            if n == len(cipher):
                return
            cipher = cipher[n:]
            self._loop.add_writer(self._fd, self._write_ready)
        self._buffer += cipher
        self._maybe_pause()

    def _write_ready(self) -> None:
        try:
            n = self._sock.send(self._buffer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._force_close(exc)
            return
        del self._buffer[:n]
        if self._writing_paused and len(self._buffer) <= self._low:
            self._writing_paused = False
            self._call_protocol("resume_writing")
        if not self._buffer:
            self._loop.remove_writer(self._fd)
            if self._closing:
                self._written_out()

    def _maybe_pause(self) -> None:
        if not self._writing_paused and len(self._buffer) > self._high:
            self._writing_paused = True
            self._call_protocol("pause_writing")

    def _call_protocol(self, name: str) -> None:
        try:
            getattr(self._protocol, name)()
        except Exception as exc:
            self._force_close(exc)

    # -- closing --
    def close(self) -> None:
        """Close as a TLS peer should: what is buffered, then our close_notify, then a FIN;
        the connection is lost once the peer's close_notify or FIN came (what it sends
        meanwhile is read and dropped: closing a socket with unread bytes would reset the
        connection, and the peer could lose what we sent last), or after
        ``_SHUTDOWN_TIMEOUT`` seconds without either."""
        if self._closing:
            return
        self._closing = True
        self._loop.add_reader(self._fd, self._read_ready)  # read on, paused or not
        with contextlib.suppress(ssl.SSLError, ValueError, OSError):
            self._obj.unwrap()  # queues our close_notify; the peer's is read for below
        if self._outgoing.pending:
            self._send_cipher(self._outgoing.read())
        if not self._buffer and not self._lost:
            self._written_out()

    def _written_out(self) -> None:
        """Closing, and all of ours (close_notify last) is with the kernel: FIN, then wait."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)
        self._timer = self._loop.call_later(_SHUTDOWN_TIMEOUT, self._force_close, None)

    def _read_closing(self) -> None:
        """A read while closing: dropped, until the peer's close_notify or FIN."""
        bufs = _BUFFERS
        try:
            n = self._sock.recv_into(bufs.cipher, _READ)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset: the peer is gone, which is what we waited for
            self._force_close(None)
            return
        if n:
            self._incoming.write(bufs.cipher_view[:n])
            try:
                while self._obj.read(_READ, bufs.plain):
                    pass
            except _WANT:
                return
            except ssl.SSLError:  # garbage, or its close_notify as some versions say it
                pass
            # fell through: b"" read, the peer's close_notify
        self._force_close(None)

    def abort(self) -> None:
        self._force_close(None)

    def _force_close(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._closing = True
        self._buffer.clear()
        self._schedule_lost(exc)

    def _schedule_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._loop.remove_reader(self._fd)
        self._loop.remove_writer(self._fd)
        self._loop.call_soon(self._connection_lost, exc)

    def _connection_lost(self, exc: Exception | None) -> None:
        protocol, self._protocol = self._protocol, None
        try:
            if protocol is not None:
                protocol.connection_lost(exc)
        finally:
            self._sock.close()

    def __del__(self) -> None:
        sock = getattr(self, "_sock", None)
        if sock is not None and sock.fileno() != -1:
            sock.close()
