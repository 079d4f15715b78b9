"""Translate what aiohttp, asyncio and ssl raise into a (kind, message) for the waterfall."""

from __future__ import annotations

import asyncio
import ssl

import aiohttp

from ..timeline import Recorder
from ._chunked import ChunkedBodyError
from ._state import open_stage
from .http2 import HTTP2Refused, HTTP2SettleTimeout

__all__ = ["classify"]


def _handshake_failure(exc: aiohttp.ClientConnectorError) -> str:
    """What broke a TLS handshake, in words (aiohttp's text reads "ssl:default [None]" when
    the server just closed: an old server that will not speak any version we offer does so)."""
    cause = exc.os_error
    where = f"TLS handshake with {exc.host}:{exc.port} failed"
    if isinstance(cause, ssl.SSLError):
        return f"{where}: {cause.reason or type(cause).__name__}: {cause}"
    said = cause.strerror or str(cause) or "the connection was closed"
    if said == "None":
        said = "the connection was closed"
    return (
        f"{where}: {type(cause).__name__}: {said} (the server may offer only TLS versions or "
        "ciphers this client refuses, e.g. TLS 1.0)"
    )


def classify(exc: BaseException, recorder: Recorder, timeout: float | None) -> tuple[str, str]:
    """Name the failure (``Waterfall.error_type``) and describe it for a person."""
    if isinstance(exc, HTTP2Refused):
        return "alpn", str(exc)
    if isinstance(exc, HTTP2SettleTimeout):
        return "h2_setup", str(exc)
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "dns", str(exc.os_error)
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return "tls", str(exc)
    if isinstance(exc, aiohttp.ClientConnectorError) and recorder.is_open("tls"):
        return "tls", _handshake_failure(exc)
    if isinstance(exc, aiohttp.ClientSSLError):
        return "tls", str(exc)
    if isinstance(exc, ssl.SSLError):
        return "tls", f"{type(exc).__name__}: {exc}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect", str(exc)
    if isinstance(exc, asyncio.TimeoutError):
        where = open_stage(recorder)
        return "timeout", f"no complete response within {timeout} s (timed out during {where})"
    if isinstance(exc, aiohttp.ServerDisconnectedError) and recorder.headers_ns is None:
        return "disconnected", "server closed the connection before sending response headers"
    if isinstance(exc, aiohttp.ClientPayloadError) and isinstance(exc.__cause__, ChunkedBodyError):
        return "protocol", f"invalid HTTP response: {exc}"
    if isinstance(exc, (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError)):
        cause = exc.__cause__ or exc.__context__
        detail = f" ({type(cause).__name__}: {cause})" if cause else ""
        return "reset", f"response body cut short: {exc}{detail}"
    if isinstance(exc, (aiohttp.ClientOSError, ConnectionError)):
        return "reset", f"{type(exc).__name__}: {exc}"
    if isinstance(exc, aiohttp.ClientResponseError):
        return "protocol", f"invalid HTTP response: {exc}"
    return "error", f"{type(exc).__name__}: {exc}"
