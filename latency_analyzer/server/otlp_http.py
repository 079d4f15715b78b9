"""OTLP/HTTP trace receiver: ``POST /v1/traces`` (protobuf or JSON, optionally gzip).

::

    store = SpanStore()
    async with OTLPHttpReceiver(store) as receiver:      # 127.0.0.1, a free port
        receiver.endpoint                                # "http://127.0.0.1:PORT/v1/traces"
    with OTLPHttpReceiver(store).run_in_thread() as receiver:
        ...

Every bad request is answered and the receiver keeps serving: 413 for a body over
``max_body`` or a body that inflates past ``max_decompressed`` (inflated in bounded steps, so a
gzip bomb never gets allocated), 415 for another content type or encoding, 400 for a
malformed, truncated or undecodable payload.
"""

from __future__ import annotations

import zlib

from aiohttp import web

from ._runner import ThreadRunner
from .spans import JSON, PROTOBUF, PayloadError, decode_otlp
from .store import SpanStore

__all__ = ["OTLPHttpReceiver", "inflate"]

_READ_CHUNK = 64 * 1024
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_SHUTDOWN_TIMEOUT_S = 0.5


class BodyTooLarge(Exception):
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


class OTLPHttpReceiver:
    """Receives OTLP/HTTP trace exports into a :class:`SpanStore`.

    Args:
        store: where decoded spans go.
        host: address to bind; loopback by default (bind another address on purpose only).
        port: 0 picks a free port.
        max_body: largest accepted request body in bytes, as sent (16 MiB).
        max_decompressed: largest body after gunzip (64 MiB).

    Attributes:
        accepted: export requests stored.
        rejected: export requests answered with a 4xx.
    """

    def __init__(
        self,
        store: SpanStore,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body: int = 16 * 1024 * 1024,
        max_decompressed: int = 64 * 1024 * 1024,
    ) -> None:
        self.store = store
        self.host = host
        self.port = port
        self.max_body = max_body
        self.max_decompressed = max_decompressed
        self.accepted = 0
        self.rejected = 0
        self._runner: web.AppRunner | None = None

    @property
    def endpoint(self) -> str:
        """The URL exporters post to (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1/traces"

    async def start(self) -> None:
        """Bind and serve."""
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        # auto_decompress off: aiohttp would inflate without our cap; we inflate ourselves
        self._runner = web.AppRunner(
            app, access_log=None, auto_decompress=False, shutdown_timeout=_SHUTDOWN_TIMEOUT_S
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])  # the real port when port=0

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> OTLPHttpReceiver:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def run_in_thread(self) -> ThreadRunner[OTLPHttpReceiver]:
        """A sync context manager serving on a private loop in a daemon thread."""
        return ThreadRunner(self)

    async def _traces(self, request: web.Request) -> web.StreamResponse:
        try:
            media = self._media_type(request)
            body = await self._read_body(request)
            spans = decode_otlp(body, media)
        except BodyTooLarge as exc:
            return self._reject(413, str(exc))
        except _Unsupported as exc:
            return self._reject(415, str(exc))
        except PayloadError as exc:
            return self._reject(400, exc.message)
        self.store.add(spans)
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

    async def _read_body(self, request: web.Request) -> bytes:
        if request.content_length is not None and request.content_length > self.max_body:
            raise BodyTooLarge(f"body of {request.content_length} bytes over {self.max_body}")
        parts: list[bytes] = []
        size = 0
        while chunk := await request.content.read(_READ_CHUNK):
            size += len(chunk)
            if size > self.max_body:
                raise BodyTooLarge(f"body over {self.max_body} bytes")
            parts.append(chunk)
        body = b"".join(parts)
        if request.headers.get("Content-Encoding", "").strip().lower() == "gzip":
            return inflate(body, self.max_decompressed)
        return body

    def _reject(self, status: int, message: str) -> web.Response:
        self.rejected += 1
        # Connection: close so the rest of an unread oversized body is not parsed as a request
        return web.json_response(
            {"code": 3, "message": message}, status=status, headers={"Connection": "close"}
        )


class _Unsupported(Exception):
    """Content type or encoding the receiver does not speak."""
