"""Durations a server puts in response headers: W3C ``Server-Timing`` and TGI's ``x-*-time``.

Both give durations, not instants, so they need no clock alignment: the merge places them
between the client's first request byte and the response headers (``merge._merge_untimed``).

``Server-Timing: queue;dur=15.2, prefill;dur=40;desc="model forward", cache;desc=hit``

Both parsers take whatever the server sent and never raise: an entry whose duration is not a
finite, non-negative number of milliseconds (``dur=1e400``, ``dur=nan``) is malformed and
skipped; a TGI value that is not plain ASCII digits (``"²"``, ``"-1"``, ``"1.5"``) or has more
than 18 of them is ignored. The Server-Timing parser runs in time linear in the header's length.
"""

from __future__ import annotations

import math
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
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"', re.DOTALL)  # DOTALL: fails only at the end
_OWS = re.compile(r"[ \t]*")
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)
#: TGI's integer milliseconds: ASCII digits only (``str.isdigit`` also takes ``"²"``), at most
#: 18 of them (a duration of 31 million years; more digits are a server's noise).
_TGI_MS = re.compile(r"[0-9]{1,18}")


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
        # No '"' at or after this position closes a quoted string. If the one opening here
        # finds no unescaped closing quote, neither does any later one (their scans line up
        # with this one's after the escaped pair), so each failed scan is done once: linear.
        self.unclosed_from = len(text) + 1

    def quoted(self) -> re.Match[str] | None:
        """A quoted string at ``pos`` (no whitespace skipped), or None."""
        if self.pos >= self.unclosed_from or not self.text.startswith('"', self.pos):
            return None
        match = _QUOTED.match(self.text, self.pos)
        if match is None:
            self.unclosed_from = self.pos
        return match

    def ows(self) -> None:
        self.pos = _OWS.match(self.text, self.pos).end()  # type: ignore[union-attr]  # always matches

    def take(self, pattern: re.Pattern[str]) -> re.Match[str] | None:
        self.ows()
        match = self.quoted() if pattern is _QUOTED else pattern.match(self.text, self.pos)
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
            if m := self.quoted():
                self.pos = m.end()
            else:
                self.pos += 1


def _value(cur: _Cursor) -> str | None:
    if quoted := cur.take(_QUOTED):
        return _ESCAPE.sub(r"\1", quoted.group(1))
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
    try:
        dur = _duration(params.get("dur"))
    except _Malformed:
        return None
    return ServerTimingMetric(name.group(0), dur, params.get("desc"))


class _Malformed(Exception):
    """An entry the W3C grammar allows but whose value cannot be a duration."""


def _duration(text: str | None) -> float | None:
    """``dur`` in ms; None if absent or not a number. Raises _Malformed for a number that is
    negative, NaN, or infinite in ms or in ns (``1e400``, ``1e305``: no finite span fits it)."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    if not (value >= 0 and math.isfinite(value * 1e6)):
        raise _Malformed(text)
    return value


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


def _tgi_ms(value: str | None) -> int | None:
    if value is None or not (match := _TGI_MS.fullmatch(value.strip(" \t"))):
        return None
    return int(match.group(0))


def tgi_header_stages(headers: Mapping[str, str]) -> ServerStages | None:
    """Stages from TGI's ``x-validation-time`` / ``x-queue-time`` / ``x-inference-time``
    (integer milliseconds); ``x-time-per-token`` and the token counts are kept as attributes."""
    lower = {k.lower(): v for k, v in headers.items()}
    parts = []
    for header, stage in TGI_HEADERS.items():
        if (ms := _tgi_ms(lower.get(header))) is not None:
            parts.append((stage, ms * 1_000_000, header))
    if not parts:
        return None
    attrs: dict[str, AttrValue] = {
        k: v for k in _TGI_KEPT if (v := _tgi_ms(lower.get(k))) is not None
    }
    return ServerStages("tgi-headers", _sequence(parts), attributes=attrs, timed=False)
