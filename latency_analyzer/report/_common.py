"""What every export shares: the version stamp and the secret scrub applied before writing.

Request headers are never stored in a waterfall, but an export must not trust that alone: a
waterfall may carry response headers (``http.set-cookie``) or attributes that someone else
added, a URL read back from an old file, or an error message quoting a key. ``scrub`` removes
all of them, and every exporter in ``report`` calls it first. What counts as a credential is
defined once, in ``latency_analyzer._redact``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from .._redact import is_secret_name, redact_text, redact_url
from .._version import __version__
from ..timeline import AttrValue, Span, Waterfall

__all__ = ["EXPORT_SCHEMA", "export_meta", "is_secret_name", "redact_text", "redact_url", "scrub"]

#: Version of the layout of every export format written by ``report`` (bumped on any change).
EXPORT_SCHEMA = 1


def export_meta(fmt: str, created: datetime | None = None) -> dict[str, Any]:
    """The version stamp every export carries: format, schema, library version, UTC time."""
    when = created or datetime.now(timezone.utc)
    return {
        "format": fmt,
        "schema": EXPORT_SCHEMA,
        "library": "latency_analyzer",
        "library_version": __version__,
        "created_utc": when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }


def _clean_attrs(attrs: Mapping[str, AttrValue]) -> dict[str, AttrValue]:
    return {
        k: redact_text(v) if isinstance(v, str) else v
        for k, v in attrs.items()
        if not is_secret_name(k)
    }


def _clean_span(span: Span) -> Span:
    return dataclasses.replace(
        span,
        attributes=_clean_attrs(span.attributes),
        children=tuple(_clean_span(c) for c in span.children),
    )


def scrub(wf: Waterfall) -> Waterfall:
    """``wf`` without credentials: secret attributes dropped, URL and messages redacted."""
    return dataclasses.replace(
        wf,
        url=redact_url(wf.url),
        error=None if wf.error is None else redact_text(wf.error),
        attributes=_clean_attrs(wf.attributes),
        root=_clean_span(wf.root),
    )
