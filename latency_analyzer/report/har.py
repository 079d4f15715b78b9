"""HAR 1.2 export: opens in Chrome DevTools' network panel (and any HAR viewer).

HAR's seven timings come from the client stages (their exclusive times, ignoring server
children), following HAR 1.2's rules:

=========== ============================================================================
HAR         stages
=========== ============================================================================
blocked     ``schedule_lag`` + ``pool_wait`` + ``other`` (client time outside stages)
dns         ``dns``; −1 when there was no lookup (reused connection, IP literal)
connect     ``connect`` + ``tls`` + ``h2_setup``; −1 on a reused connection
ssl         ``tls`` (also inside ``connect``, as HAR requires); −1 without TLS
send        ``send``
wait        ``wait`` (request sent → response headers)
receive     ``first_token`` + ``decode`` + ``tail`` (headers → end of stream)
=========== ============================================================================

``entry.time`` is the end-to-end time and equals the sum of the timings except ``ssl`` and
those that are −1. LLM metrics (TTFT, TPOT, ITL, tokens, the full attribution including
server stages, token arrival offsets) sit in the custom field ``_latency_analyzer`` of each
entry; the version stamp in ``log._latency_analyzer``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from .._version import __version__
from ..timeline import Span, Waterfall, exclusive_ns
from ._common import export_meta, is_secret_name, scrub

__all__ = ["har_entry", "to_har", "write_har"]

_HAR_GROUPS = {
    "blocked": ("schedule_lag", "pool_wait", "other"),
    "dns": ("dns",),
    "connect": ("connect", "tls", "h2_setup"),
    "send": ("send",),
    "wait": ("wait",),
    "receive": ("first_token", "decode", "tail"),
}
_OPTIONAL = {"dns": ("dns",), "connect": ("connect",), "ssl": ("tls",)}


def _ms(ns: int | float) -> float:
    return round(ns / 1e6, 6)


def client_exclusive_ns(root: Span) -> dict[str, int]:
    """Exclusive time of the client stages alone (server children folded back into them)."""
    flat = dataclasses.replace(
        root, children=tuple(dataclasses.replace(c, children=()) for c in root.children)
    )
    return exclusive_ns(flat)


def _timings(wf: Waterfall) -> dict[str, float]:
    own = client_exclusive_ns(wf.root)
    out: dict[str, float] = {}
    for har, stages in _HAR_GROUPS.items():
        out[har] = _ms(sum(own.get(s, 0) for s in stages))
    for har, needs in _OPTIONAL.items():
        if not any(s in own for s in needs):
            out[har] = -1
    if "ssl" not in out:
        out["ssl"] = _ms(own["tls"])
    if out["connect"] == -1 and "tls" in own:  # a TLS span without a TCP one: still a connect
        out["connect"] = _ms(own["tls"])
    return out


def _http_version(wf: Waterfall) -> str:
    return {"2": "HTTP/2.0", None: ""}.get(wf.http_version, f"HTTP/{wf.http_version}")


def _response_headers(wf: Waterfall) -> list[dict[str, str]]:
    """Response headers the client recorded as ``http.<name>`` attributes (never secrets)."""
    return [
        {"name": k[5:], "value": str(v)}
        for k, v in wf.attributes.items()
        if k.startswith("http.") and not is_secret_name(k)
    ]


def _llm_fields(wf: Waterfall) -> dict[str, Any]:
    start = wf.start_ns

    def ms(x: float | None) -> float | None:
        return None if x is None else round(x * 1e3, 6)

    ttfc = {} if wf.first_chunk_ns is None else {"ttfc_ms": ms(wf.ttfc)}
    fields: dict[str, Any] = {
        "ttft_ms": ms(wf.ttft),
        **ttfc,
        "tpot_ms": ms(wf.tpot),
        "itl_ms": [round(g * 1e3, 6) for g in wf.itl],
        "output_tokens": wf.output_tokens,
        "output_tokens_source": wf.output_tokens_source,
        "input_tokens": wf.input_tokens,
        "chunk_offsets_ms": [_ms(t - start) for t in wf.chunk_times_ns],
        "chunk_tokens": list(wf.chunk_tokens),
        "stages_ms": {k: _ms(v) for k, v in wf.attribution_ns().items()},
        "e2e_ns": wf.e2e_ns,
        "error": wf.error,
        "error_type": wf.error_type,
        "connection_reused": wf.connection.reused,
        "connection_id": wf.connection.connection_id,
        "tls": None if wf.tls is None else dataclasses.asdict(wf.tls),
        "server_status": wf.attributes.get("server.status"),
    }
    for key in ("tcp_connect", "tcp_end"):  # the kernel's TCP_INFO, only where it was read
        reading = getattr(wf, key)
        if reading is not None:
            fields[key] = dataclasses.asdict(reading)
    return fields


def _started(wf: Waterfall) -> str:
    epoch = wf.start_epoch_ns if wf.start_epoch_ns is not None else wf.start_ns
    when = datetime.fromtimestamp(epoch // 1_000_000_000, timezone.utc)
    when = when.replace(microsecond=(epoch % 1_000_000_000) // 1000)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def har_entry(wf: Waterfall) -> dict[str, Any]:
    """One HAR 1.2 ``entry`` for ``wf`` (already scrubbed of secrets by the caller)."""
    version = _http_version(wf)
    entry: dict[str, Any] = {
        "startedDateTime": _started(wf),
        "time": _ms(wf.e2e_ns),
        "request": {
            "method": wf.method,
            "url": wf.url,
            "httpVersion": version,
            "cookies": [],
            "headers": [],  # request headers are never recorded (they hold credentials)
            "queryString": [
                {"name": k, "value": v}
                for k, v in parse_qsl(urlsplit(wf.url).query, keep_blank_values=True)
            ],
            "headersSize": -1,
            "bodySize": -1,
        },
        "response": {
            "status": wf.status or 0,  # 0: no response, as browsers write a failed request
            "statusText": "" if wf.error is None else wf.error,
            "httpVersion": version,
            "cookies": [],
            "headers": _response_headers(wf),
            "content": {"size": -1, "mimeType": str(wf.attributes.get("http.content-type", ""))},
            "redirectURL": "",
            "headersSize": -1,
            "bodySize": -1,
        },
        "cache": {},
        "timings": _timings(wf),
        "_latency_analyzer": _llm_fields(wf),
    }
    if wf.connection.connection_id is not None:
        entry["connection"] = str(wf.connection.connection_id)
    if wf.error is not None:
        entry["_error"] = wf.error
    return entry


def to_har(waterfalls: Iterable[Waterfall], *, created: datetime | None = None) -> dict[str, Any]:
    """A HAR 1.2 document with one entry per waterfall (secrets scrubbed).

    Args:
        waterfalls: the requests, in any order (entries are sorted by start time).
        created: the export time to stamp (default: now, UTC).
    """
    clean = sorted((scrub(wf) for wf in waterfalls), key=lambda w: w.start_epoch_ns or w.start_ns)
    return {
        "log": {
            "version": "1.2",
            "creator": {"name": "latency_analyzer", "version": __version__},
            "pages": [],
            "entries": [har_entry(wf) for wf in clean],
            "_latency_analyzer": export_meta("har", created),
        }
    }


def write_har(
    waterfalls: Iterable[Waterfall], path: str | Path, *, created: datetime | None = None
) -> Path:
    """Write ``to_har`` as JSON to ``path`` (``.har``); returns the path."""
    out = Path(path)
    out.write_text(json.dumps(to_har(waterfalls, created=created), indent=1), encoding="utf-8")
    return out
