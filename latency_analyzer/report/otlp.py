"""OTLP JSON export: the client's stages as OpenTelemetry spans, beside the server's own.

Each waterfall becomes one ``CLIENT`` span named after the HTTP method, with one ``INTERNAL``
child per client stage. When the request carried a W3C ``traceparent`` (``wf.attributes``
``trace_id`` / ``span_id``), the client span uses exactly those ids: the server made that span
its parent, so in Jaeger or Tempo the server's spans nest under it. Without them, ids are
derived from the request (stable: the same waterfall always exports the same ids).

Token arrivals are span events named ``token`` on the client span. Server spans placed by
merge and profile samples are left out by default (the server exports its own);
``include_server=True`` adds them. The version stamp is in the resource attributes
(``latency_analyzer.export.*``).

``to_otlp_json`` gives the ``ExportTraceServiceRequest`` JSON of the OTLP/HTTP protocol (hex
ids, 64-bit integers as strings); ``send_otlp`` POSTs it to a collector's ``/v1/traces``.
"""

from __future__ import annotations

import hashlib
import json
import urllib.request
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import RequestError, UsageError
from ..timeline import AttrValue, Span, Waterfall
from ._common import export_meta, scrub

__all__ = ["send_otlp", "to_otlp_json", "write_otlp_json"]

_KIND_INTERNAL, _KIND_CLIENT = 1, 3
_STATUS_ERROR = 2


def _any_value(v: AttrValue) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}  # protobuf JSON spells int64 as a string
    if isinstance(v, float):
        return {"doubleValue": v}
    return {"stringValue": "" if v is None else str(v)}


def _attributes(attrs: Mapping[str, AttrValue]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _any_value(v)} for k, v in attrs.items() if v is not None]


def _hex_id(seed: str, digits: int) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:digits]


def _ids(wf: Waterfall) -> tuple[str, str]:
    """(trace id, client span id): the propagated ones, else derived from the request."""
    trace_id, span_id = wf.attributes.get("trace_id"), wf.attributes.get("span_id")
    seed = f"{wf.method} {wf.url} {wf.start_epoch_ns} {wf.start_ns}"
    if not isinstance(trace_id, str) or len(trace_id) != 32:
        trace_id = _hex_id("trace " + seed, 32)
    if not isinstance(span_id, str) or len(span_id) != 16:
        span_id = _hex_id("span " + seed, 16)
    return trace_id, span_id


def _root_attributes(wf: Waterfall) -> dict[str, AttrValue]:
    attrs: dict[str, AttrValue] = {
        "http.request.method": wf.method,
        "url.full": wf.url,
        "http.response.status_code": wf.status,
        "network.protocol.version": wf.http_version,
        "error.type": wf.error_type,
        "latency_analyzer.e2e_ns": wf.e2e_ns,
        "latency_analyzer.ttft_ns": wf.ttft_ns,
        "gen_ai.usage.output_tokens": wf.output_tokens,
        "gen_ai.usage.input_tokens": wf.input_tokens,
        "latency_analyzer.connection_reused": wf.connection.reused,
    }
    if wf.tls is not None:
        attrs.update({"tls.protocol.version": wf.tls.version, "tls.alpn": wf.tls.alpn})
    tpot = wf.tpot
    if tpot is not None:
        attrs["latency_analyzer.tpot_ns"] = round(tpot * 1e9)
    tcp = wf.tcp_end
    if tcp is not None:  # the kernel's view of the connection at the request's end
        attrs.update(
            {
                "latency_analyzer.tcp.rtt_us": tcp.rtt_us,
                "latency_analyzer.tcp.min_rtt_us": tcp.min_rtt_us,
                "latency_analyzer.tcp.total_retrans": tcp.total_retrans,
                "latency_analyzer.tcp.lost": tcp.lost,
            }
        )
    if wf.first_chunk_ns is not None:  # else equal to ttft
        attrs["latency_analyzer.ttfc_ns"] = wf.ttfc_ns
    return attrs


def _span_json(
    span: Span, ids: tuple[str, str, str | None], epoch: int, kind: int, name: str
) -> dict[str, Any]:
    trace_id, span_id, parent = ids
    out: dict[str, Any] = {
        "traceId": trace_id,
        "spanId": span_id,
        "name": name,
        "kind": kind,
        "startTimeUnixNano": str(span.start_ns + epoch),
        "endTimeUnixNano": str(span.end_ns + epoch),
        "attributes": _attributes(
            {**span.attributes, "latency_analyzer.stage": span.name, "source": span.source}
        ),
    }
    if parent is not None:
        out["parentSpanId"] = parent
    return out


def _spans_of(wf: Waterfall, include_server: bool) -> list[dict[str, Any]]:
    if wf.anchor is None:
        raise UsageError("OTLP needs epoch times: this waterfall has no clock anchor")
    shift = wf.anchor.to_epoch_ns(0)  # perf ns + shift = epoch ns
    trace_id, root_id = _ids(wf)
    root = _span_json(wf.root, (trace_id, root_id, None), shift, _KIND_CLIENT, wf.method)
    root["attributes"] = _attributes(_root_attributes(wf))
    root["events"] = [
        {"timeUnixNano": str(t + shift), "name": "token", "attributes": _attributes({"tokens": k})}
        for t, k in zip(wf.chunk_times_ns, wf.chunk_tokens, strict=False)
    ]
    if wf.error is not None:
        root["status"] = {"code": _STATUS_ERROR, "message": wf.error}
    out = [root]

    def visit(span: Span, parent_id: str, path: str) -> None:
        for i, child in enumerate(span.children):
            if child.source != "client" and not include_server:
                continue
            child_id = _hex_id(f"{trace_id} {root_id} {path}.{i}", 16)
            ids = (trace_id, child_id, parent_id)
            out.append(_span_json(child, ids, shift, _KIND_INTERNAL, child.name))
            visit(child, child_id, f"{path}.{i}")

    visit(wf.root, root_id, "0")
    return out


def to_otlp_json(
    waterfalls: Iterable[Waterfall],
    *,
    service_name: str = "latency-analyzer-client",
    include_server: bool = False,
    created: datetime | None = None,
) -> dict[str, Any]:
    """An OTLP ``ExportTraceServiceRequest`` (JSON form) holding the waterfalls' client spans.

    Args:
        waterfalls: the requests (each needs its clock anchor, for epoch times).
        service_name: ``service.name`` of the resource.
        include_server: also export the server spans merge placed and profile samples
            (normally the server exports its own).
        created: the export time to stamp (default: now, UTC).

    Raises:
        UsageError: a waterfall without a clock anchor.
    """
    meta = export_meta("otlp-json", created)
    resource = {
        "service.name": service_name,
        "telemetry.sdk.name": "latency_analyzer",
        "telemetry.sdk.version": __version__,
        **{f"latency_analyzer.export.{k}": v for k, v in meta.items()},
    }
    spans = [s for wf in waterfalls for s in _spans_of(scrub(wf), include_server)]
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes(resource)},
                "scopeSpans": [
                    {"scope": {"name": "latency_analyzer", "version": __version__}, "spans": spans}
                ],
            }
        ]
    }


def write_otlp_json(waterfalls: Iterable[Waterfall], path: str | Path, **kwargs: Any) -> Path:
    """Write ``to_otlp_json`` as one JSON line (the OTLP file exporter's format)."""
    out = Path(path)
    doc = to_otlp_json(waterfalls, **kwargs)
    out.write_text(json.dumps(doc, separators=(",", ":")) + "\n", encoding="utf-8")
    return out


def send_otlp(
    waterfalls: Iterable[Waterfall], endpoint: str, *, timeout: float = 10.0, **kwargs: Any
) -> int:
    """POST the spans to an OTLP/HTTP collector (``http://host:4318/v1/traces``), as JSON.

    OTLP/HTTP accepts JSON bodies, so this needs no OpenTelemetry SDK. Returns the HTTP
    status.

    Raises:
        RequestError: the collector could not be reached or answered with an error status.
    """
    body = json.dumps(to_otlp_json(waterfalls, **kwargs)).encode()
    req = urllib.request.Request(
        endpoint, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # the caller's collector URL
            return int(resp.status)
    except OSError as exc:  # URLError and HTTPError are OSErrors
        raise RequestError("otlp_export", f"OTLP export to {endpoint} failed: {exc}") from exc
