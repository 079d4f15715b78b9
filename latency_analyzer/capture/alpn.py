"""Ask a server which protocol it picks when offered ``h2`` and ``http/1.1`` (TLS ALPN).

The probe resolves the name the way the requests did (the same ``resolver=``, ``/etc/hosts``
first in system mode), trusts the same CA (``ssl=`` / ``insecure=``) and so reaches the same
server; it opens one TLS connection, reads the selected protocol, and closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import ssl as _ssl
from urllib.parse import urlsplit

from .resolver import DnsResolver

__all__ = ["aprobe_alpn", "probe_alpn"]

_OFFER = ["h2", "http/1.1"]  # what Client(http2=None) offers


def _context(context: _ssl.SSLContext | None, insecure: bool) -> _ssl.SSLContext:
    if context is None:
        context = _ssl.create_default_context()
        if insecure:
            context.check_hostname = False
            context.verify_mode = _ssl.CERT_NONE
    # a context passed in gets the offer set on it, as Client(ssl=) sets its own choice
    context.set_alpn_protocols(_OFFER)
    return context


async def _address(host: str, resolver: str | None, timeout: float) -> str:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return host
    found = await DnsResolver(resolver, timeout=timeout).resolve(host, 0, 0)
    return str(found[0]["host"])


async def aprobe_alpn(
    url: str,
    *,
    resolver: str | None = None,
    ssl: _ssl.SSLContext | None = None,
    insecure: bool = False,
    timeout: float = 5.0,
) -> str | None:
    """The protocol the server of ``url`` selects when offered ``h2,http/1.1``.

    Args:
        url: an ``https://`` URL (anything else returns None: nothing is negotiated).
        resolver: ``"HOST:PORT"`` of the DNS server to ask, as ``Client(resolver=)``.
        ssl: the context that verifies the server (its ALPN list is set to ``h2,http/1.1``).
        insecure: skip certificate verification (``curl -k``).
        timeout: seconds for the lookup and for the handshake, each.

    Returns:
        ``"h2"``, ``"http/1.1"``, or None when the server selects nothing.

    Raises:
        OSError: the name did not resolve, the server was unreachable or the handshake failed.
    """
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        return None
    host = parts.hostname
    address = await _address(host, resolver, timeout)
    context = _context(ssl, insecure)
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(address, parts.port or 443, ssl=context, server_hostname=host),
            timeout,
        )
    except asyncio.TimeoutError:
        raise OSError(f"ALPN probe: no TLS handshake with {host!r} within {timeout} s") from None
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        return None if ssl_object is None else ssl_object.selected_alpn_protocol()
    finally:
        writer.close()
        # the answer is already read: a slow or rude close changes nothing
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), timeout)


def probe_alpn(
    url: str,
    *,
    resolver: str | None = None,
    context: _ssl.SSLContext | None = None,
    insecure: bool = False,
    timeout: float = 5.0,
) -> str | None:
    """Blocking :func:`aprobe_alpn` (``context`` is its ``ssl``); not inside a running loop."""
    if urlsplit(url).scheme != "https":
        return None
    return asyncio.run(
        aprobe_alpn(url, resolver=resolver, ssl=context, insecure=insecure, timeout=timeout)
    )
