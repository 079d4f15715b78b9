"""Where py-spy's time zero lies on this process's ``perf_counter_ns`` clock.

py-spy's ``ts`` counts microseconds from the ``Instant`` its recorder took at start-up, before
it attaches to the target and before it prints ``Sampling process ...``. So that zero ``Z``
is bracketed by two readings of our own clock, with no help from the target:

* ``lo``: ``perf_counter_ns()`` just before py-spy is spawned (``Z`` cannot precede it);
* ``hi``: the instant we read py-spy's ``Sampling process`` line (printed after ``Z``).

The estimate is the instant the spawn returned (``exec`` has happened; a static Rust binary
reaches its recorder within a fraction of a millisecond), and the hard bracket is kept.

That bracket is for the zero itself. py-spy stamps each sample when its main thread records
it, after the capture; on a loaded host that delivery lag is several milliseconds (3–15 ms
measured on 2 shared cores with the target spinning), so samples land later than they
happened. :func:`refine_anchor` measures zero and lag together from a marker: a function the
target runs at instants it reports on the same clock (``perf_counter_ns`` is CLOCK_MONOTONIC
on Linux, shared by every process).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from .._rank import nearest_rank
from ._trace import Trace

__all__ = ["ProfileAnchor", "refine_anchor"]


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


def _rank(values: Sequence[int], percent: int) -> int:
    """Nearest-rank percentile of sorted ``values`` (the definition WaterfallSet uses), in
    integers so no float rounding moves it by a rank."""
    return values[nearest_rank(percent, len(values))]


def refine_anchor(
    anchor: ProfileAnchor,
    trace: Trace,
    marker: str,
    windows: Sequence[tuple[int, int]],
    rate: int,
) -> ProfileAnchor:
    """Re-anchor on the runs of function ``marker``, whose calls the target timed itself.

    Each run has two edges: its first sample (after the window opened) and the first sample
    after it (after the window closed). Each edge's stamp is late by up to a period plus
    py-spy's stamping delay and any stall of its sampler, the same lateness every stage edge
    suffers. So ``window edge − stamp`` over all edges, its median, is the zero that puts a
    typical edge where it happened (half a period is added back because the attribution
    centres every sample on its interval). The 10th and 90th percentiles of the edge
    estimates are kept as ``lo_ns``/``hi_ns``: how far single edges may still be off.

    Args:
        anchor: the spawn anchor (under it each run edge is matched to the nearest window
            edge of its kind: starts with starts, ends with ends).
        trace: the recording.
        marker: the function's name as py-spy shows it.
        windows: ``(start, end)`` ``perf_counter_ns`` of the marker's calls.
        rate: the sampling rate of the recording (Hz).

    Returns:
        ``anchor`` unchanged if no run edge lay near a window edge, else the marker anchor.
    """
    half = 500_000_000 // max(1, rate)
    # A run py-spy closed only because the recording ended has no true end: skip it.
    runs = [run for run in trace.frame_windows(marker) if run[1] < trace.end_us]
    # First pass under the spawn anchor, with room for its uncertainty and for py-spy's
    # delivery lag; second pass under the first's estimate, where edges lie within a few
    # periods of their calls (more than 8 periods late is a sampler stall, left out).
    zero, reach = anchor.perf_ns, anchor.uncertainty_ns + 8 * half + 50_000_000
    used = 0
    for _ in range(2):
        edges, used = _edge_estimates(runs, windows, zero, reach, half)
        if not edges:
            return anchor
        edges.sort()
        zero = _rank(edges, 50) - half  # the stamps' own zero: a typical edge on time
        reach = 16 * half
    mid, p10, p90 = (_rank(edges, q) for q in (50, 10, 90))
    return dataclasses.replace(
        anchor,
        perf_ns=mid,
        lo_ns=min(p10, mid),
        hi_ns=max(p90, mid),
        method="marker",
        markers=used,
    )
