"""Timed spans and the exclusive-time attribution that sums exactly to the root's duration."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ..errors import UsageError
from ._stages import BACKGROUND_STAGES, Source
from ._unfrozen import unfrozen

__all__ = ["AttrValue", "Span", "exclusive_ns", "prechecked_span"]

AttrValue = str | int | float | bool | None

_NO_ATTRIBUTES: Mapping[str, AttrValue] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Span:
    """One timed interval of a request: a stage, a server span or a profile slice.

    Attributes:
        name: stage name from the vocabulary (``dns``, ``tls``, ...), or the server's own name.
        start_ns: start on the clock of ``source`` (client: ``perf_counter_ns``).
        end_ns: end on the same clock; never before ``start_ns``.
        source: who measured it: ``client``, ``server`` or ``profile``.
        attributes: read-only extra facts (TLS version, a server's raw span name, ...).
        children: spans inside this one, in start order.
    """

    name: str
    start_ns: int
    end_ns: int
    source: Source = "client"
    attributes: Mapping[str, AttrValue] = field(default_factory=dict, hash=False)
    children: tuple[Span, ...] = ()

    def __post_init__(self) -> None:
        if self.end_ns < self.start_ns:
            raise UsageError(
                f"span {self.name!r} ends before it starts ({self.start_ns} > {self.end_ns})"
            )
        if not isinstance(self.attributes, MappingProxyType):
            attrs = MappingProxyType(dict(self.attributes)) if self.attributes else _NO_ATTRIBUTES
            object.__setattr__(self, "attributes", attrs)
        kids = self.children
        if any(kids[i].start_ns > kids[i + 1].start_ns for i in range(len(kids) - 1)):
            ordered = tuple(sorted(kids, key=lambda s: (s.start_ns, s.end_ns)))
            object.__setattr__(self, "children", ordered)
        elif not isinstance(kids, tuple):
            object.__setattr__(self, "children", tuple(kids))

    @property
    def duration_ns(self) -> int:
        """Length in nanoseconds."""
        return self.end_ns - self.start_ns

    @property
    def duration(self) -> float:
        """Length in seconds."""
        return self.duration_ns / 1e9

    def walk(self) -> Iterator[Span]:
        """This span, then every descendant, depth first in start order."""
        yield self
        for child in self.children:
            yield from child.walk()

    def find(self, name: str, source: Source | None = None) -> Span | None:
        """The first descendant (or self) called ``name``, optionally from ``source``."""
        for span in self.walk():
            if span.name == name and (source is None or span.source == source):
                return span
        return None


_OpenSpan = unfrozen(Span)
_new = object.__new__


def prechecked_span(
    name: str,
    start_ns: int,
    end_ns: int,
    source: Source = "client",
    attributes: Mapping[str, AttrValue] = _NO_ATTRIBUTES,
    children: tuple[Span, ...] = (),
) -> Span:
    """A ``Span`` from a builder that already holds what ``Span()`` checks: ``end_ns >=
    start_ns``, ``attributes`` a read-only mapping no one else holds, ``children`` a tuple in
    start order. The Recorder builds every span of a waterfall this way from instants it
    checked as they came in; anything built from outside goes through ``Span()``."""
    span = _new(_OpenSpan)
    span.name = name
    span.start_ns = start_ns
    span.end_ns = end_ns
    span.source = source
    span.attributes = attributes
    span.children = children
    span.__class__ = Span
    built: Span = span
    return built


def _residual_name(span: Span, is_root: bool) -> str:
    if is_root:
        return "other"
    if any(child.source != span.source for child in span.children):
        return "network"
    return span.name


def _background(span: Span) -> bool:
    return span.source == "client" and span.name in BACKGROUND_STAGES


def _attribute(span: Span, lo: int, hi: int, is_root: bool, out: dict[str, int]) -> None:
    """Add the self time of ``span`` clipped to ``[lo, hi]``, then recurse.

    Children are clipped to their parent and to the end of the previous sibling (earlier start
    wins an overlap), so every nanosecond of the root is counted exactly once. Background
    stages (``BACKGROUND_STAGES``) are left out of that sweep and get only the gaps it leaves
    inside their own interval.
    """
    start, end = max(span.start_ns, lo), min(span.end_ns, hi)
    key = _residual_name(span, is_root)
    out.setdefault(key, 0)
    if end <= start:
        return
    cursor = start
    covered = 0
    taken: list[tuple[int, int]] = []  # disjoint, in time order: what the sweep gave out
    for child in span.children:
        if _background(child):
            continue
        c_start, c_end = max(child.start_ns, cursor), min(child.end_ns, end)
        if c_end < c_start:
            continue
        if child.children:
            _attribute(child, c_start, c_end, False, out)
        else:  # a leaf: what _attribute gives it, without the call (most stages are leaves)
            out[child.name] = out.get(child.name, 0) + (c_end - c_start)
        covered += c_end - c_start
        cursor = c_end
        taken.append((c_start, c_end))
    for child in span.children:
        if not _background(child):
            continue
        out.setdefault(child.name, 0)  # present (maybe 0) whenever the stage happened
        for g_start, g_end in _gaps(taken, max(child.start_ns, start), min(child.end_ns, end)):
            _attribute(child, g_start, g_end, False, out)
            covered += g_end - g_start
            taken.append((g_start, g_end))
        taken.sort()
    out[key] += (end - start) - covered


def _gaps(taken: list[tuple[int, int]], lo: int, hi: int) -> Iterator[tuple[int, int]]:
    """The parts of ``[lo, hi]`` outside every interval of ``taken`` (disjoint, sorted)."""
    cursor = lo
    for t_start, t_end in taken:
        if t_end <= cursor:
            continue
        if t_start >= hi:
            break
        if t_start > cursor:
            yield cursor, t_start
        cursor = max(cursor, t_end)
    if cursor < hi:
        yield cursor, hi


def exclusive_ns(root: Span) -> dict[str, int]:
    """Exclusive (self) time per name along the tree; values sum to ``root.duration_ns``.

    The root's own self time is named ``other``; a span holding children from another source
    (server spans inside a client stage) names its self time ``network``. A background stage
    (``h2_setup``) overlapping later stages is given only the time none of them covers.
    """
    out: dict[str, int] = {}
    _attribute(root, root.start_ns, root.end_ns, True, out)
    out["other"] = out.pop("other")  # residual last, so dicts read in path order
    return out
