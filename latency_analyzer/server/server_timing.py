"""Durations a server puts in response headers: W3C ``Server-Timing`` and TGI's ``x-*-time``.

Both give durations, not instants, so they need no clock alignment: the merge places them
between the client's first request byte and the response headers (``merge._merge_untimed``).

``Server-Timing: queue;dur=15.2, prefill;dur=40;desc="model forward", cache;desc=hit``
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ..timeline import AttrValue, Span
from .schemas import ServerStages

__all__ = [
    "SERVER_TIMING_NAMES",
    "TGI_HEADERS",
    "ServerTimingMetric",
    "parse_server_timing",
    "server_timing_stages",
    "tgi_header_stages",
]

#: Server-Timing metric names → stages (other names are placed under their own name).
SERVER_TIMING_NAMES: Mapping[str, str] = MappingProxyType(
    {
        "tokenize": "preprocess",
        "validation": "preprocess",
        "preprocess": "preprocess",
        "queue": "server_queue",
        "server_queue": "server_queue",
        "prefill": "prefill",
        "decode": "decode",
        "detokenize": "postprocess",
        "postprocess": "postprocess",
    }
)
#: Metrics that cover the others (placing them too would count time twice).
_TOTALS = frozenset({"total", "total_time", "e2e", "request", "response"})

#: TGI response headers (integer milliseconds) → stages.
TGI_HEADERS: Mapping[str, str] = MappingProxyType(
    {
        "x-validation-time": "preprocess",
        "x-queue-time": "server_queue",
        "x-inference-time": "inference",
    }
)
_TGI_KEPT = ("x-time-per-token", "x-total-time", "x-generated-tokens", "x-prompt-tokens")

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_OWS = re.compile(r"[ \t]*")


@dataclass(frozen=True, slots=True)
class ServerTimingMetric:
    """One ``Server-Timing`` entry: ``name``, ``dur`` in milliseconds (None if absent),
    ``desc`` (None if absent)."""

    name: str
    dur_ms: float | None = None
    desc: str | None = None


class _Cursor:
    """A position in a header value; every method skips optional whitespace first."""

    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def ows(self) -> None:
        self.pos = _OWS.match(self.text, self.pos).end()  # type: ignore[union-attr]  # always matches

    def take(self, pattern: re.Pattern[str]) -> re.Match[str] | None:
        self.ows()
        match = pattern.match(self.text, self.pos)
        if match:
            self.pos = match.end()
        return match

    def char(self, wanted: str) -> bool:
        self.ows()
        if self.text.startswith(wanted, self.pos):
            self.pos += 1
            return True
        return False

    def skip_to_comma(self) -> None:
        """Recovery from a malformed entry: on to the next top-level comma."""
        while self.pos < len(self.text) and self.text[self.pos] != ",":
            if self.text[self.pos] == '"' and (m := _QUOTED.match(self.text, self.pos)):
                self.pos = m.end()
            else:
                self.pos += 1


def _value(cur: _Cursor) -> str | None:
    if quoted := cur.take(_QUOTED):
        return re.sub(r"\\(.)", r"\1", quoted.group(1))
    token = cur.take(_TOKEN)
    return token.group(0) if token else None


def _metric(cur: _Cursor) -> ServerTimingMetric | None:
    name = cur.take(_TOKEN)
    if name is None:
        return None
    params: dict[str, str | None] = {}
    while cur.char(";"):
        key = cur.take(_TOKEN)
        if key is None:
            return None
        value = _value(cur) if cur.char("=") else None
        params.setdefault(key.group(0).lower(), value)  # the first occurrence counts (W3C)
    return ServerTimingMetric(name.group(0), _duration(params.get("dur")), params.get("desc"))


def _duration(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and value >= 0 and value == value else None


def parse_server_timing(values: str | Iterable[str]) -> list[ServerTimingMetric]:
    """Parse ``Server-Timing`` header value(s); malformed entries are skipped (W3C)."""
    texts = [values] if isinstance(values, str) else list(values)
    out: list[ServerTimingMetric] = []
    for text in texts:
        cur = _Cursor(text)
        while cur.pos < len(text):
            metric = _metric(cur)
            cur.ows()
            if metric is not None and (cur.pos >= len(text) or text[cur.pos] == ","):
                out.append(metric)
            else:
                cur.skip_to_comma()
            cur.pos += 1  # past the comma
    return out


def _sequence(parts: list[tuple[str, int, str]]) -> tuple[Span, ...]:
    out, t = [], 0
    for name, duration, raw in parts:
        out.append(Span(name, t, t + duration, "server", {"server.metric": raw}))
        t += duration
    return tuple(out)


def server_timing_stages(
    values: str | Iterable[str], names: Mapping[str, str] = SERVER_TIMING_NAMES
) -> ServerStages | None:
    """Stages from ``Server-Timing``: entries with a ``dur``, in header order, mapped through
    ``names``; a ``total`` entry is kept as an attribute when others are present."""
    metrics = [m for m in parse_server_timing(values) if m.dur_ms is not None]
    parts = [m for m in metrics if m.name.lower() not in _TOTALS] or metrics
    if not parts:
        return None
    attrs: dict[str, AttrValue] = {
        f"server_timing.{m.name}_ms": m.dur_ms for m in metrics if m not in parts
    }
    stages = _sequence(
        [(names.get(m.name.lower(), m.name), round((m.dur_ms or 0) * 1e6), m.name) for m in parts]
    )
    return ServerStages("server-timing", stages, attributes=attrs, timed=False)


def tgi_header_stages(headers: Mapping[str, str]) -> ServerStages | None:
    """Stages from TGI's ``x-validation-time`` / ``x-queue-time`` / ``x-inference-time``
    (integer milliseconds); ``x-time-per-token`` and the token counts are kept as attributes."""
    lower = {k.lower(): v for k, v in headers.items()}
    parts = []
    for header, stage in TGI_HEADERS.items():
        value = lower.get(header, "").strip()
        if value.isdigit():
            parts.append((stage, int(value) * 1_000_000, header))
    if not parts:
        return None
    attrs: dict[str, AttrValue] = {
        k: int(v) for k in _TGI_KEPT if (v := lower.get(k, "")).isdigit()
    }
    return ServerStages("tgi-headers", _sequence(parts), attributes=attrs, timed=False)
