"""The canonical JSON form of a Waterfall (one object per JSONL line), and back.

Versioned with ``schema``; integers stay integers (nanoseconds), so a round trip is exact.
Request headers are never part of a waterfall, so they cannot leak through this form.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ._clock import ClockAnchor
from ._info import ConnectionInfo, TlsInfo
from ._span import Span
from ._tcpinfo import TcpInfo

if TYPE_CHECKING:  # the model imports this module; it only names the model
    from ._waterfall import Waterfall

__all__ = [
    "SCHEMA_VERSION",
    "span_from_dict",
    "span_to_dict",
    "waterfall_from_dict",
    "waterfall_to_dict",
]

SCHEMA_VERSION = 1


def span_to_dict(span: Span) -> dict[str, Any]:
    out: dict[str, Any] = {"name": span.name, "start_ns": span.start_ns, "end_ns": span.end_ns}
    if span.source != "client":
        out["source"] = span.source
    if span.attributes:
        out["attributes"] = dict(span.attributes)
    if span.children:
        out["children"] = [span_to_dict(c) for c in span.children]
    return out


def span_from_dict(data: Mapping[str, Any]) -> Span:
    return Span(
        name=data["name"],
        start_ns=int(data["start_ns"]),
        end_ns=int(data["end_ns"]),
        source=data.get("source", "client"),
        attributes=data.get("attributes", {}),
        children=tuple(span_from_dict(c) for c in data.get("children", ())),
    )


_SCALARS = (
    "method",
    "url",
    "status",
    "http_version",
    "error",
    "error_type",
    "first_reasoning_ns",
    "first_answer_ns",
    "output_tokens",
    "output_tokens_source",
    "input_tokens",
)

#: Written only when set (absent from files of earlier versions).
_OPTIONAL = ("first_chunk_ns", "last_chunk_ns")


_READ_FIELDS = (
    "clock_source",
    "read_lag_p50_ns",
    "read_lag_max_ns",
    "reads",
    "multi_event_reads",
    "shared_read_chunks",
)


def waterfall_to_dict(wf: Waterfall) -> dict[str, Any]:
    """A JSON-ready dict holding everything in ``wf``."""
    out: dict[str, Any] = {"schema": SCHEMA_VERSION, "root": span_to_dict(wf.root)}
    out.update({name: getattr(wf, name) for name in _SCALARS})
    out["chunk_times_ns"] = list(wf.chunk_times_ns)
    out["chunk_tokens"] = list(wf.chunk_tokens)
    out["tls"] = None if wf.tls is None else _fields(wf.tls)
    out["connection"] = _fields(wf.connection)
    out["anchor"] = None if wf.anchor is None else _fields(wf.anchor)
    out["attributes"] = dict(wf.attributes)
    for key in ("tcp_connect", "tcp_end"):  # only when read: older readers see no new keys
        reading = getattr(wf, key)
        if reading is not None:
            out[key] = _fields(reading)
    for name in _READ_FIELDS:  # written only when reads were recorded
        if wf.reads:
            value = getattr(wf, name)
            out[name] = list(value) if isinstance(value, tuple) else value
    for name in _OPTIONAL:
        if getattr(wf, name) is not None:
            out[name] = getattr(wf, name)
    return out


def waterfall_from_dict(data: Mapping[str, Any], cls: type[Waterfall]) -> Waterfall:
    """Rebuild a Waterfall from ``waterfall_to_dict`` output.

    Raises:
        UsageError: the schema version is not one this library reads.
    """
    if data.get("schema") != SCHEMA_VERSION:
        raise UsageError(
            f"unknown waterfall schema {data.get('schema')!r} (this library reads {SCHEMA_VERSION})"
        )
    scalars: dict[str, Any] = {name: data.get(name) for name in _SCALARS}
    return cls(
        root=span_from_dict(data["root"]),
        chunk_times_ns=tuple(data.get("chunk_times_ns", ())),
        chunk_tokens=tuple(data.get("chunk_tokens", ())),
        tls=TlsInfo(**data["tls"]) if data.get("tls") else None,
        connection=ConnectionInfo(**data.get("connection", {})),
        anchor=ClockAnchor(**data["anchor"]) if data.get("anchor") else None,
        attributes=data.get("attributes", {}),
        tcp_connect=TcpInfo(**data["tcp_connect"]) if data.get("tcp_connect") else None,
        tcp_end=TcpInfo(**data["tcp_end"]) if data.get("tcp_end") else None,
        **scalars,
        **_read_fields(data),
        **{name: data[name] for name in _OPTIONAL if data.get(name) is not None},
    )


def _read_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    return {
        name: tuple(data[name]) if isinstance(data[name], list) else data[name]
        for name in _READ_FIELDS
        if name in data
    }


def _fields(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__dataclass_fields__}
