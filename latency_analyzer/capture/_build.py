"""What a Client's request is made of: its URL's parts, body and header fields, and the TLS
context it dials with. Pure helpers, no I/O (the CA store is read once per setting).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json as _json
import ssl as _ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import SplitResult, urlsplit

import aiohttp

from .._version import __version__
from ..errors import UsageError
from ..timeline import Waterfall
from ..timeline._unfrozen import unfrozen
from ._state import now_ns

_STREAM_BODY_OVER = 512 * 1024


def _tls_context(
    context: _ssl.SSLContext | None, insecure: bool, http2: bool | None
) -> _ssl.SSLContext:
    """The TLS context to dial with, its ALPN list matching the HTTP/2 choice."""
    if context is not None and insecure:
        raise UsageError("give either ssl= (a context) or insecure=True, not both")
    if context is None:
        return _default_context(insecure, http2)
    context.set_alpn_protocols(_ALPN[http2])
    return context


_ALPN: dict[bool | None, list[str]] = {False: ["http/1.1"], True: ["h2"], None: ["h2", "http/1.1"]}


@functools.cache
def _default_context(insecure: bool, http2: bool | None) -> _ssl.SSLContext:
    """One context per setting and process: loading the system's CA store costs ~20 ms of CPU,
    which every ``probe()`` (a new Client each time) would otherwise pay again."""
    context = _ssl.create_default_context()
    if insecure:
        context.check_hostname = False
        context.verify_mode = _ssl.CERT_NONE
    context.set_alpn_protocols(_ALPN[http2])
    return context


def _too_many_redirects(wf: Waterfall, limit: int) -> Waterfall:
    message = f"more than {limit} redirects (the last to {wf.url})"
    return dataclasses.replace(wf, error=message, error_type="redirect")


# a load run asks for the same few URLs on every request: what they tell is kept
@functools.lru_cache(maxsize=256)
def _is_http_url(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


@functools.lru_cache(maxsize=256)
def _origin(url: str) -> tuple[str, str]:
    """``(scheme, "scheme://host:port")``; a bad port raises ``ValueError`` (not kept)."""
    parts = urlsplit(url)
    return parts.scheme, f"{parts.scheme}://{(parts.hostname or '').lower()}:{parts.port or ''}"


def _left(deadline_ns: int) -> float:
    return max(0.0, (deadline_ns - now_ns()) / 1e9)


_OpenClientTimeout = unfrozen(aiohttp.ClientTimeout)


def _client_timeout(total: float) -> aiohttp.ClientTimeout:
    """``ClientTimeout(total=total, ceil_threshold=1e9)``: aiohttp's own timer for the time a
    request has left, exact (above ``ceil_threshold`` aiohttp rounds a timeout up to the next
    whole second). Built in its slots: the frozen attrs ``__init__`` sets its five fields one
    call at a time, and every request needs one of its own."""
    timer = object.__new__(_OpenClientTimeout)
    timer.total = total
    timer.connect = timer.sock_read = timer.sock_connect = None
    timer.ceil_threshold = 1e9
    timer.__class__ = aiohttp.ClientTimeout
    built: aiohttp.ClientTimeout = timer
    return built


def _connect_timeout(left: float) -> aiohttp.ClientTimeout:
    """aiohttp's timer for a dial (its ``connect``: a slot in the pool, then the connection)
    in the time a request has left. Never 0, which aiohttp reads as no limit at all."""
    return aiohttp.ClientTimeout(connect=max(left, 1e-6), ceil_threshold=1e9)


def _path(parts: SplitResult) -> str:
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _h2_target(url: str) -> tuple[str, str, str]:
    """``(:scheme, :authority, :path)`` of an HTTP/2 request (user info left out)."""
    parts = urlsplit(url)
    return parts.scheme, parts.netloc.rsplit("@", 1)[-1], _path(parts)


def _h2_request_parts(
    defaults: Mapping[str, str],
    headers: Mapping[str, str] | None,
    json: Any,
    data: bytes | str | None,
) -> tuple[bytes, list[tuple[str, str]]]:
    """Body bytes and header fields of an HTTP/2 request (names lowercased later)."""
    merged = {"user-agent": f"latency-analyzer/{__version__}", "accept": "*/*"}
    merged.update({k.lower(): v for k, v in defaults.items()})
    merged.update({k.lower(): v for k, v in (headers or {}).items()})
    if json is not None:
        body = _json.dumps(json).encode()
        merged.setdefault("content-type", "application/json")
    else:
        body = data.encode() if isinstance(data, str) else (data or b"")
    if body:
        merged["content-length"] = str(len(body))
    return body, list(merged.items())


def _json_body(
    obj: Any, headers: Mapping[str, str] | None
) -> tuple[bytes | io.BytesIO, Mapping[str, str]]:
    """Serialise a JSON body; large ones go as a stream (aiohttp warns on raw bytes > 1 MiB)."""
    raw = _json.dumps(obj).encode()
    merged = dict(headers or {})
    if not any(k.lower() == "content-type" for k in merged):
        merged["Content-Type"] = "application/json"
    return (io.BytesIO(raw) if len(raw) > _STREAM_BODY_OVER else raw), merged


def _http_version(version: aiohttp.HttpVersion | None) -> str | None:
    if version is None:
        return None
    spelled = _VERSIONS.get(version)
    if spelled is None:
        spelled = "2" if version.major == 2 else f"{version.major}.{version.minor}"
    return spelled


# what nearly every response says, spelled once
_VERSIONS = {aiohttp.HttpVersion11: "1.1", aiohttp.HttpVersion10: "1.0"}
