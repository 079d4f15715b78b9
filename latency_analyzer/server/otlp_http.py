"""OTLP/HTTP trace receiver: ``POST /v1/traces`` (protobuf or JSON, optionally gzip).

::

    store = SpanStore()
    async with OTLPHttpReceiver(store) as receiver:      # 127.0.0.1, a free port
        receiver.endpoint                                # "http://127.0.0.1:PORT/v1/traces"
    with OTLPHttpReceiver(store).run_in_thread() as receiver:
        ...

Every bad request is answered and the receiver keeps serving: 413 for a body over
``max_body``, a body that inflates past ``max_decompressed`` (inflated in bounded steps, so a
gzip bomb never gets allocated) or a payload over ``limits`` (spans, resource entries, items:
found by a bounded walk before anything is decoded), 415 for another content type or encoding,
400 for a malformed, truncated or undecodable payload, 408 for a body that does not arrive
within ``body_timeout``, 503 (``Retry-After``) while the decode lane for its size is full.

Budgets, so that one sender cannot stall or exhaust the others:

* inflating, checking and decoding run in a worker thread (:mod:`._pool`), never on the loop;
* a connection must complete each request's headers within ``header_timeout`` of opening or
  of its previous response (which also ends idle keep-alive connections), else it is closed;
* at most ``max_connections`` connections: at the cap a new one replaces the oldest that is
  still sending headers, or is refused when every connection is in a request.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from aiohttp import web

from ._pool import Busy, DecodePool
from ._runner import Receiver
from .spans import (
    DEFAULT_LIMITS,
    JSON,
    PROTOBUF,
    Limits,
    PayloadError,
    PayloadTooLarge,
    decode_otlp,
)
from .store import SpanStore

__all__ = ["OTLPHttpReceiver", "inflate"]

_READ_CHUNK = 64 * 1024
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_SHUTDOWN_TIMEOUT_S = 0.5
_HEADERS_END = b"\r\n\r\n"


class BodyTooLarge(PayloadTooLarge):
    """The body, or what it inflates to, is over the receiver's cap."""


def inflate(data: bytes, limit: int) -> bytes:
    """Gunzip ``data`` producing at most ``limit`` bytes.

    Raises:
        BodyTooLarge: it would inflate past ``limit``.
        PayloadError: not gzip, corrupt, or truncated.
    """
    inflater = zlib.decompressobj(_GZIP_WBITS)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise PayloadError(f"bad gzip body: {exc}") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise BodyTooLarge(f"body inflates past {limit} bytes")
    if not inflater.eof:
        raise PayloadError("truncated gzip body")
    return out


class OTLPHttpReceiver(Receiver):
    """Receives OTLP/HTTP trace exports into a :class:`SpanStore`.

    Args:
        store: where decoded spans go.
        host: address to bind; loopback by default (bind another address on purpose only).
        port: 0 picks a free port.
        max_body: largest accepted request body in bytes, as sent (16 MiB).
        max_decompressed: largest body after gunzip (16 MiB).
        limits: spans, resource entries and items per payload (:class:`Limits`).
        max_connections: connections held at once (256).
        header_timeout: seconds a connection has to send a request's headers (10).
        body_timeout: seconds a request has to send its body once its headers are in (30).

    Attributes:
        accepted: export requests stored.
        rejected: export requests answered with a 4xx.
        busy: export requests answered 503 (decode lane full).
        timed_out: connections closed for slow headers, and requests for a slow body.
        refused: connections closed at once, or replaced, at the connection cap.
        connections: connections open now.
    """

    def __init__(
        self,
        store: SpanStore,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body: int = 16 * 1024 * 1024,
        max_decompressed: int = 16 * 1024 * 1024,
        limits: Limits = DEFAULT_LIMITS,
        max_connections: int = 256,
        header_timeout: float = 10.0,
        body_timeout: float = 30.0,
    ) -> None:
        super().__init__(store, host, port, limits)
        self.max_body = max_body
        self.max_decompressed = max_decompressed
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.timed_out = 0
        self.refused = 0
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self._guards: dict[asyncio.BaseTransport, _Guard] = {}
        self._waiting: OrderedDict[_Guard, None] = OrderedDict()  # in their header phase

    @property
    def connections(self) -> int:
        return len(self._guards)

    @property
    def endpoint(self) -> str:
        """The URL exporters post to (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1/traces"

    async def start(self) -> None:
        """Bind and serve."""
        app = web.Application(middlewares=[self._rearm])
        app.router.add_post("/v1/traces", self._traces)
        # auto_decompress off: aiohttp would inflate without our cap; we inflate ourselves
        self._runner = web.AppRunner(
            app, access_log=None, auto_decompress=False, shutdown_timeout=_SHUTDOWN_TIMEOUT_S
        )
        await self._runner.setup()
        self._pool = DecodePool()
        handlers = self._runner.server
        assert handlers is not None  # set up above
        # our own listening server in front of aiohttp's handlers: each connection passes
        # through a guard that enforces the header timeout and the connection cap
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Guard(self, handlers()), self.host, self.port
        )
        self.port = int(self._server.sockets[0].getsockname()[1])  # the real port when 0

    async def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for guard in list(self._guards.values()):
            guard.close()
        await self._close_pool()

    # -- connections ---------------------------------------------------------------------------
    def _admit(self, guard: _Guard, transport: asyncio.BaseTransport) -> bool:
        if len(self._guards) >= self.max_connections:
            self.refused += 1
            if not self._waiting:
                return False
            oldest = next(iter(self._waiting))  # the longest still sending its headers
            oldest.close()
        self._guards[transport] = guard
        return True

    @web.middleware
    async def _rearm(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Every response restarts its connection's header clock (404s and 405s too)."""
        try:
            return await handler(request)
        finally:
            guard = self._guards.get(request.transport) if request.transport else None
            if guard is not None:
                guard.headers_due()

    # -- requests --------------------------------------------------------------------------------
    async def _traces(self, request: web.Request) -> web.StreamResponse:
        assert self._pool is not None  # serving
        if request.content_length is not None and self._pool.full(request.content_length):
            self._pool.refused()  # refused before its body is read: a flood costs us less
            return self._busy("the decode lane for this size is full; try later", close=True)
        try:
            media = self._media_type(request)
            body = await self._read_body(request)
            gzipped = request.headers.get("Content-Encoding", "").strip().lower() == "gzip"
            await self._pool.run(len(body), lambda: self._decode(body, gzipped, media))
        except PayloadTooLarge as exc:
            return self._reject(413, exc.message)
        except _Unsupported as exc:
            return self._reject(415, str(exc))
        except PayloadError as exc:
            return self._reject(400, exc.message)
        except _SlowBody as exc:
            self.timed_out += 1
            return self._reject(408, str(exc))
        except Busy as exc:
            return self._busy(str(exc), close=False)
        self.accepted += 1
        # an empty ExportTraceServiceResponse: full success
        if media == JSON:
            return web.Response(body=b"{}", content_type=JSON)
        return web.Response(body=b"", content_type=PROTOBUF)

    def _media_type(self, request: web.Request) -> str:
        media = request.content_type.lower()
        if media not in (PROTOBUF, JSON):
            raise _Unsupported(f"content type {media!r}; expected {PROTOBUF} or {JSON}")
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("gzip", "identity", ""):
            raise _Unsupported(f"content encoding {encoding!r}; expected gzip or none")
        return media

    def _decode(self, body: bytes, gzipped: bool, media: str) -> None:
        """In a decode lane: inflate, check, decode, store."""
        if gzipped:
            body = inflate(body, self.max_decompressed)
        self.store.add(decode_otlp(body, media, self.limits))

    async def _read_body(self, request: web.Request) -> bytes:
        if request.content_length is not None and request.content_length > self.max_body:
            raise BodyTooLarge(f"body of {request.content_length} bytes over {self.max_body}")
        parts: list[bytes] = []
        size = 0
        deadline = time.monotonic() + self.body_timeout
        while True:
            left = deadline - time.monotonic()
            try:
                chunk = await asyncio.wait_for(request.content.read(_READ_CHUNK), max(0, left))
            except asyncio.TimeoutError:
                raise _SlowBody(f"body not received within {self.body_timeout:g} s") from None
            if not chunk:
                return b"".join(parts)
            size += len(chunk)
            if size > self.max_body:
                raise BodyTooLarge(f"body over {self.max_body} bytes")
            parts.append(chunk)

    def _busy(self, message: str, *, close: bool) -> web.Response:
        """OTLP's retryable answer (gRPC status 14, UNAVAILABLE, in the body); ``close`` when
        the body was left unread."""
        headers = {"Retry-After": "1", **({"Connection": "close"} if close else {})}
        return web.json_response({"code": 14, "message": message}, status=503, headers=headers)

    def _reject(self, status: int, message: str) -> web.Response:
        self.rejected += 1
        # Connection: close so the rest of an unread oversized body is not parsed as a request
        return web.json_response(
            {"code": 3, "message": message}, status=status, headers={"Connection": "close"}
        )


class _Unsupported(Exception):
    """Content type or encoding the receiver does not speak."""


class _SlowBody(Exception):
    """The body did not arrive within ``body_timeout``."""


class _Guard(asyncio.Protocol):
    """In front of one aiohttp request handler: the connection cap and the header clock.

    While the connection owes a request's headers (from its opening, and again from each
    response), a timer runs; the bytes are scanned for the blank line that ends the headers
    (keeping the last three bytes across reads). The timer stops there and the body is the
    handler's to time. Everything else is handed to aiohttp's protocol unchanged.
    """

    def __init__(self, owner: OTLPHttpReceiver, inner: asyncio.Protocol) -> None:
        self.owner, self.inner = owner, inner
        self.transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if not self.owner._admit(self, transport):
            transport.abort()
            self.transport = None
            return
        self.inner.connection_made(transport)
        self.headers_due()

    def headers_due(self) -> None:
        """Start (again) the clock for the next request's headers."""
        if self.transport is None or self.transport.is_closing():
            return
        self._cancel_timer()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.owner.header_timeout, self._expired)
        self._tail = b""
        self.owner._waiting[self] = None

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return
        if self._timer is not None:
            if _HEADERS_END in self._tail + data[:3] or _HEADERS_END in data:
                self._headers_in()
            else:
                self._tail = (self._tail + data)[-3:]
        self.inner.data_received(data)

    def _headers_in(self) -> None:
        self._cancel_timer()
        self.owner._waiting.pop(self, None)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        self.owner.timed_out += 1
        self.close()

    def close(self) -> None:
        self.owner._waiting.pop(self, None)
        if self.transport is not None and not self.transport.is_closing():
            # it stops counting now, not when its loss runs a loop turn later: the cap holds
            # at every instant, also while the connection that replaces it is admitted
            self.owner._guards.pop(self.transport, None)
            self.transport.close()

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.transport is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self.owner._waiting.pop(self, None)
        if self.transport is not None:
            self.owner._guards.pop(self.transport, None)
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()
