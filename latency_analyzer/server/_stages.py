"""ServerStages: what a server says about one request, and the pieces mappings build it from.

A mapping returns ``ServerStages``: stage spans (``source="server"``, epoch ns of the
*server's* clock) plus the instants the clock alignment may rely on (``arrival_ns`` happened
after the client began sending; ``first_token_ns`` and ``done_ns`` happened before the client
received the first token and the last byte).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from .._units import parse_duration_ns
from ..errors import UsageError
from ..timeline import AttrValue, Span
from .spans import ServerSpan

__all__ = [
    "Lookup",
    "ServerStages",
    "children_stages",
    "float_attr",
    "lay_end_to_end",
    "make_stage",
    "merge_overlaps",
    "parse_duration",
    "to_ns",
]

#: Finds a linked span by (trace id, span id), e.g. ``SpanStore.span``.
Lookup = Callable[[str, str], ServerSpan | None]


@dataclass(frozen=True, slots=True)
class ServerStages:
    """What the server says about one request, on the server's clock (epoch ns).

    Attributes:
        schema: which mapping produced it (``vllm``, ``sglang``, ``tgi``, ``genai``,
            ``generic``, ``server-timing``, ``tgi-headers``).
        stages: the stage spans, in start order (``source="server"``).
        arrival_ns: a server instant after the client started sending (None: unknown).
        first_token_ns: a server instant before the client saw the first token.
        done_ns: a server instant before the client saw the last byte.
        last_token_ns: a server instant before the client saw the last token.
        span_id: the server's request span id, when spans were the source.
        attributes: server-reported facts worth keeping (request id, token counts).
        timed: False when only durations are known (Server-Timing): the merge places them.
        token_anchored: with ``timed`` False, the stages are ``prefill`` then ``decode``, the
            prefill ending at the first token and the decode by the last byte (llama.cpp's
            ``timings``): the merge places them by the client's token instants.
    """

    schema: str
    stages: tuple[Span, ...]
    arrival_ns: int | None = None
    first_token_ns: int | None = None
    done_ns: int | None = None
    span_id: str | None = None
    attributes: Mapping[str, AttrValue] = field(default_factory=dict, hash=False)
    timed: bool = True
    last_token_ns: int | None = None
    token_anchored: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.attributes, MappingProxyType):
            object.__setattr__(self, "attributes", MappingProxyType(dict(self.attributes)))


def to_ns(seconds: float) -> int:
    return round(seconds * 1e9)


def float_attr(attrs: Mapping[str, AttrValue], key: str) -> float | None:
    value = attrs.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value >= 0 else None


def make_stage(name: str, start: int, end: int, raw: str, **attrs: AttrValue) -> Span:
    return Span(name, start, max(start, end), "server", {"server.span": raw, **attrs})


def lay_end_to_end(
    start: int, parts: Sequence[tuple[str, int]], raw: str
) -> tuple[list[Span], int]:
    """Lay ``(stage, duration_ns)`` parts end to end from ``start``; zero-length parts skipped."""
    out, t = [], start
    for name, duration in parts:
        if duration > 0:
            out.append(make_stage(name, t, t + duration, raw))
            t += duration
    return out, t


def merge_overlaps(stages: Sequence[Span]) -> list[Span]:
    """Merge overlapping spans of the same stage (nested slices: ``decode_forward`` in a loop)."""
    out: list[Span] = []
    for span in sorted(stages, key=lambda s: (s.name, s.start_ns, s.end_ns)):
        last = out[-1] if out else None
        if last is not None and last.name == span.name and span.start_ns <= last.end_ns:
            out[-1] = Span(
                last.name, last.start_ns, max(last.end_ns, span.end_ns), "server", last.attributes
            )
        else:
            out.append(span)
    return sorted(out, key=lambda s: (s.start_ns, s.end_ns))


def children_stages(
    root: ServerSpan, spans: Sequence[ServerSpan], table: Mapping[str, str], schema: str
) -> ServerStages | None:
    """Stages from the spans below ``root`` whose names ``table`` maps to a stage (overlaps
    of one stage merged); the request arrived at ``root``'s start."""
    mapped = [
        make_stage(table[s.name], s.start_ns, s.end_ns, s.name)
        for s in spans
        if s.name in table and s.span_id != root.span_id
    ]
    if not mapped:
        return None
    stages = merge_overlaps(mapped)
    firsts = [s.end_ns for s in stages if s.name == "prefill"]
    return ServerStages(
        schema,
        tuple(stages),
        arrival_ns=root.start_ns,
        first_token_ns=max(firsts) if firsts else None,
        done_ns=max(s.end_ns for s in stages),
        span_id=root.span_id,
    )


def parse_duration(text: AttrValue) -> int | None:
    """Nanoseconds of a Rust ``Debug`` duration string (``"12.3ms"``, ``"450µs"``, ``"1.2s"``);
    None for anything else. A Debug duration always carries its unit, so a bare number is not
    one; the number itself is read by the project's one duration parser (``_units``)."""
    if not isinstance(text, str) or not text.rstrip()[-1:].isalpha():
        return None
    try:
        return parse_duration_ns(text)
    except UsageError:
        return None
