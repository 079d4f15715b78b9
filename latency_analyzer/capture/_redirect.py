"""Redirects, followed only when asked: the next hop, and what may travel to it.

A redirect is its own request (its own connection, dns, tls ...), so each hop is measured as
one waterfall and the returned waterfall (the last hop) names the hops before it. Credentials
are the caller's for one origin: when a hop changes scheme, host or port, every secret header
(``latency_analyzer._redact.is_secret_name``: Authorization, api-key, x-api-key, cookies, any
``*key*`` / ``*token*`` / ``*secret*`` / ``*auth*`` header) is dropped, and the URL's userinfo
never travels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple
from urllib.parse import urljoin, urlsplit, urlunsplit

from .._redact import is_secret_name, redact_url
from ..timeline import AttrValue, Waterfall

__all__ = ["REDIRECT_STATUSES", "Hop", "chain_attributes", "next_hop"]

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_BODY_HEADERS = ("content-type", "content-length", "content-encoding", "transfer-encoding")


class Hop(NamedTuple):
    """One request of a redirect chain, as it will be sent (a named tuple: every request
    makes one, and a tuple is built in one call where a frozen dataclass sets each field)."""

    method: str
    url: str
    json: Any
    data: bytes | str | None
    headers: Mapping[str, str]


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]))


def next_hop(hop: Hop, status: int | None, location: str | None) -> Hop | None:
    """The request a redirect response asks for, or None when ``status`` is no redirect.

    303 (and 301/302 after a POST, as browsers do) becomes a GET without a body; 307 and 308
    repeat the method and body.
    """
    if status not in REDIRECT_STATUSES or not location:
        return None
    target = urljoin(_without_userinfo(hop.url), location.strip())
    if urlsplit(target).scheme not in ("http", "https"):
        return None
    method, json, data = hop.method, hop.json, hop.data
    headers = dict(hop.headers)
    if (status == 303 and method != "HEAD") or (status in (301, 302) and method == "POST"):
        method, json, data = "GET", None, None
        headers = {k: v for k, v in headers.items() if k.lower() not in _BODY_HEADERS}
    if _origin(target) != _origin(hop.url):
        headers = {k: v for k, v in headers.items() if not is_secret_name(k)}
    return Hop(method, target, json, data, headers)


def chain_attributes(before: list[Waterfall]) -> dict[str, AttrValue]:
    """What the last hop's waterfall records of the hops before it (URLs redacted)."""
    out: dict[str, AttrValue] = {"redirects": len(before)}
    for i, wf in enumerate(before):
        out[f"redirect.{i}.method"] = wf.method
        out[f"redirect.{i}.url"] = redact_url(wf.url)
        out[f"redirect.{i}.status"] = wf.status
        out[f"redirect.{i}.e2e_ns"] = wf.e2e_ns
    return out


def with_chain(wf: Waterfall, before: list[Waterfall]) -> Waterfall:
    """``wf`` with the redirect chain that led to it in its attributes."""
    if not before:
        return wf
    return dataclasses.replace(wf, attributes={**wf.attributes, **chain_attributes(before)})
