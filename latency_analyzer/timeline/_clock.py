"""Clocks: every offset between two clocks that the package estimates, as pure arithmetic.

* this process: client intervals are ``perf_counter_ns``; one :class:`ClockAnchor` maps them
  to epoch ns (:func:`take_anchor`, :func:`process_anchor`);
* a server's clock: :class:`Bracket` of causal bounds from one request (NTP-style), the
  brackets of many intersected into one :class:`ClockOffset` (:func:`combine`); the bounds
  are read from a waterfall and the server's stages by ``server.align``;
* a profiler's zero: :class:`ProfileAnchor`, refined from the edges of marker calls
  (:func:`marker_zero`; ``profile.refine_anchor`` feeds it a recording);
* a worker's wall clock: :func:`cristian_offset` over round trips to it.

No I/O: the readings come from the callers.
"""

from __future__ import annotations

import bisect
import functools
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .._rank import nearest_rank

__all__ = [
    "Bracket",
    "ClockAnchor",
    "ClockOffset",
    "ProfileAnchor",
    "bracket_of",
    "combine",
    "cristian_offset",
    "marker_zero",
    "process_anchor",
    "take_anchor",
]


@dataclass(frozen=True, slots=True)
class ClockAnchor:
    """A pair of simultaneous readings of the monotonic and the wall clock.

    Attributes:
        perf_ns: ``time.perf_counter_ns()`` at the midpoint of the tightest read.
        epoch_ns: ``time.time_ns()`` read between the two monotonic reads.
        uncertainty_ns: half the width of the bracket the wall read sat in.
    """

    perf_ns: int
    epoch_ns: int
    uncertainty_ns: int

    def to_epoch_ns(self, perf_ns: int) -> int:
        """Map a monotonic timestamp of this process to Unix epoch nanoseconds."""
        return self.epoch_ns + (perf_ns - self.perf_ns)

    def to_perf_ns(self, epoch_ns: int) -> int:
        """Map epoch nanoseconds (same host clock) back to this process's monotonic clock."""
        return self.perf_ns + (epoch_ns - self.epoch_ns)


def take_anchor(
    reads: int = 9,
    perf: Callable[[], int] = time.perf_counter_ns,
    wall: Callable[[], int] = time.time_ns,
) -> ClockAnchor:
    """Read both clocks ``reads`` times and keep the tightest bracket.

    A preemption between the reads widens one bracket; taking the narrowest of several keeps
    the anchor's error near the cost of one clock read.
    """
    best: ClockAnchor | None = None
    for _ in range(max(1, reads)):
        before = perf()
        epoch = wall()
        after = perf()
        half = (after - before) // 2
        if best is None or half < best.uncertainty_ns:
            best = ClockAnchor(perf_ns=before + half, epoch_ns=epoch, uncertainty_ns=half)
    assert best is not None
    return best


@functools.lru_cache(maxsize=1)
def process_anchor() -> ClockAnchor:
    """The one anchor of this process, taken on first use and shared by every waterfall."""
    return take_anchor()


# --- a server's clock: causal brackets (NTP-style) ------------------------------------------


@dataclass(frozen=True, slots=True)
class Bracket:
    """Bounds on ``offset_ns`` (server − client, ns) from one request: ``lo ≤ offset ≤ hi``.

    Attributes:
        lo_ns, hi_ns: the bracket of the bounds that agree.
        contradicted: ``(bound name, ns above hi_ns)`` of each lower bound left out because
            it lies above the upper bound; when every lower bound does, none is left out and
            the bracket does not fit.
        lows: ``(bound name, value ns)`` of every lower bound, contradicted ones included.
    """

    lo_ns: int
    hi_ns: int
    contradicted: tuple[tuple[str, int], ...] = ()
    lows: tuple[tuple[str, int], ...] = ()

    @property
    def fits(self) -> bool:
        """False when no offset satisfies both bounds (the server took longer than the
        client saw: a mismatched span, or clocks running at different rates)."""
        return self.lo_ns <= self.hi_ns

    @property
    def width_ns(self) -> int:
        return self.hi_ns - self.lo_ns

    def offset(self, requests: int = 1) -> ClockOffset:
        """The midpoint estimate of this bracket."""
        mid = self.lo_ns + self.width_ns // 2
        return ClockOffset(
            mid, max(0, self.width_ns - self.width_ns // 2), self.lo_ns, self.hi_ns, requests
        )

    def contains(self, offset_ns: int) -> bool:
        return self.lo_ns <= offset_ns <= self.hi_ns


@dataclass(frozen=True, slots=True)
class ClockOffset:
    """An estimated server clock offset.

    Attributes:
        offset_ns: server clock minus the client's epoch clock.
        uncertainty_ns: half the width of the bracket it came from.
        lo_ns, hi_ns: that bracket.
        requests: how many requests' brackets were intersected.
        consistent: False when the brackets did not intersect and the tightest single one
            was used instead.
    """

    offset_ns: int
    uncertainty_ns: int
    lo_ns: int
    hi_ns: int
    requests: int = 1
    consistent: bool = True


def bracket_of(hi_ns: int, lows: Sequence[tuple[str, int]]) -> Bracket | None:
    """The bracket of one request's bounds: ``hi_ns`` the upper bound, ``lows`` the named
    lower bounds (None without any).

    A lower bound above the upper bound contradicts the client's observations (a server
    instant stamped late, in another process than the one that sent the bytes). Such a bound
    is left out and kept in ``Bracket.contradicted`` with the amount by which it overshoots;
    the others still bound the offset. Only when every lower bound contradicts the upper one
    does the bracket not fit (``Bracket.fits`` is False).
    """
    if not lows:
        return None
    agreeing = [value for _, value in lows if value <= hi_ns]
    if not agreeing:  # the upper bound against every lower one: nothing to trust over it
        return Bracket(max(value for _, value in lows), hi_ns, (), tuple(lows))
    against = tuple((name, value - hi_ns) for name, value in lows if value > hi_ns)
    return Bracket(max(agreeing), hi_ns, against, tuple(lows))


def combine(brackets: Iterable[Bracket | None]) -> ClockOffset | None:
    """One offset from many requests: the intersection of their brackets.

    Returns None without any bracket that fits. When the fitting brackets do not intersect,
    the narrowest one is used and the result is marked ``consistent=False``.
    """
    fitting = [b for b in brackets if b is not None and b.fits]
    if not fitting:
        return None
    joint = Bracket(max(b.lo_ns for b in fitting), min(b.hi_ns for b in fitting))
    if joint.fits:
        return joint.offset(len(fitting))
    tightest = min(fitting, key=lambda b: b.width_ns).offset(1)
    return ClockOffset(
        tightest.offset_ns, tightest.uncertainty_ns, tightest.lo_ns, tightest.hi_ns, 1, False
    )


# --- a profiler's zero ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProfileAnchor:
    """py-spy's zero on the client clock.

    Attributes:
        perf_ns: estimate of ``perf_counter_ns()`` at py-spy's ``ts == 0``.
        lo_ns: hard lower bound of that instant.
        hi_ns: hard upper bound.
        method: ``spawn`` (bracketed by the spawn and py-spy's first line) or ``marker``.
        markers: marker calls (windows) at least one of whose edges was seen.
    """

    perf_ns: int
    lo_ns: int
    hi_ns: int
    method: str = "spawn"
    markers: int = 0

    @property
    def uncertainty_ns(self) -> int:
        """The largest distance from the estimate to either hard bound."""
        return max(self.perf_ns - self.lo_ns, self.hi_ns - self.perf_ns)

    def to_perf_ns(self, ts_us: int) -> int:
        """Map a py-spy ``ts`` (µs) to this process's ``perf_counter_ns``."""
        return self.perf_ns + ts_us * 1000


def _edge_estimates(
    runs: Sequence[tuple[int, int]],
    windows: Sequence[tuple[int, int]],
    zero_ns: int,
    reach_ns: int,
    half: int,
) -> tuple[list[int], int]:
    """Zero estimates from run edges, each matched to the nearest window edge of its kind.

    Starts are matched with starts and ends with ends, independently: two marker calls closer
    than a sampling period show up as one run, whose start belongs to the first call and whose
    end to the second; matching whole runs to whole windows would pair one of those edges with
    the wrong call. An edge farther than ``reach_ns`` from every window edge is left out.

    Each window edge keeps one run edge, the earliest start or the latest end matched to it:
    a call py-spy saw as two runs (a torn sample cut it) gives its outer edges, the first
    sample inside it and the first after it, not the cut's.

    Returns:
        the estimates (``window edge − stamp + half``) and how many windows contributed.
    """
    kinds = (sorted((w[0], i) for i, w in enumerate(windows)),
             sorted((w[1], i) for i, w in enumerate(windows)))  # fmt: skip
    # (kind, window) -> the run edge kept for it: the earliest start, the latest end
    kept: dict[tuple[int, int], int] = {}
    for run in runs:
        for kind, edges in enumerate(kinds):
            seen = zero_ns + run[kind] * 1000
            j = bisect.bisect_left(edges, (seen, -1))
            near = [edges[k] for k in (j - 1, j) if 0 <= k < len(edges)]
            if not near:
                continue
            edge, index = min(near, key=lambda e: abs(e[0] - seen))
            if abs(edge - seen) > reach_ns:
                continue
            old = kept.get((kind, index))
            if old is None or (run[kind] < old if kind == 0 else run[kind] > old):
                kept[(kind, index)] = run[kind]
    estimates = [windows[i][kind] - ts * 1000 + half for (kind, i), ts in kept.items()]
    return estimates, len({index for _, index in kept})


def marker_zero(
    anchor: ProfileAnchor,
    runs: Sequence[tuple[int, int]],
    windows: Sequence[tuple[int, int]],
    rate: int,
) -> tuple[int, int, int, int] | None:
    """The profiler's zero from the edges of marker calls, in two passes.

    Args:
        anchor: the first estimate (its uncertainty bounds how far edges are matched).
        runs: ``(start, end)`` profiler stamps (µs) of the runs of samples inside the marker.
        windows: ``(start, end)`` ``perf_counter_ns`` of the marker's calls.
        rate: the sampling rate (Hz).

    Returns:
        ``(median, p10, p90, windows used)`` of the edges' zero estimates, or None if no run
        edge lay near a window edge.
    """
    half = 500_000_000 // max(1, rate)
    # First pass under the first anchor, with room for its uncertainty and for the profiler's
    # delivery lag; second pass under the first's estimate, where edges lie within a few
    # periods of their calls (more than 8 periods late is a sampler stall, left out).
    zero, reach = anchor.perf_ns, anchor.uncertainty_ns + 8 * half + 50_000_000
    used = 0
    edges: list[int] = []
    for _ in range(2):
        edges, used = _edge_estimates(runs, windows, zero, reach, half)
        if not edges:
            return None
        edges.sort()
        zero = edges[nearest_rank(50, len(edges))] - half  # the stamps' own zero: an edge on time
        reach = 16 * half
    mid, p10, p90 = (edges[nearest_rank(q, len(edges))] for q in (50, 10, 90))
    return mid, p10, p90, used


# --- a worker's wall clock -----------------------------------------------------------------


def cristian_offset(samples: Iterable[tuple[int, int, int]]) -> tuple[float, float]:
    """A remote wall clock's offset from ours, from ``(sent, remote, back)`` epoch-ns triples.

    The remote clock was read somewhere in [sent, back] (Cristian): the offset is ``remote -
    (sent + back) / 2`` within ± half the round trip. The tightest round trip wins.

    Returns:
        ``(offset_s, error_s)``; ``(0.0, inf)`` without samples.
    """
    offset, error = 0.0, math.inf
    for sent, remote, back in samples:
        if (back - sent) / 2e9 < error:
            # in integers until the one division: epoch ns lose hundreds of ns as floats
            offset, error = (2 * remote - sent - back) / 2e9, (back - sent) / 2e9
    return offset, error
