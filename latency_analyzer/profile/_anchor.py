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

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

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
        markers: marker runs that narrowed the bracket.
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


def _pairs(
    runs: Sequence[tuple[int, int]],
    anchor: ProfileAnchor,
    windows: Sequence[tuple[int, int]],
    half: int,
) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Pair each window with the run nearest to it (runs placed with the current estimate),
    when that run is near enough: within the anchor's uncertainty, the window's length, two
    periods and 50 ms of delivery lag. Each run serves one window at most."""
    pairs = []
    free = list(runs)
    for window in windows:
        w_mid = (window[0] + window[1]) // 2
        reach = anchor.uncertainty_ns + (window[1] - window[0]) + 4 * half + 50_000_000

        def distance(run: tuple[int, int], w_mid: int = w_mid) -> int:
            return abs(anchor.to_perf_ns((run[0] + run[1]) // 2) - w_mid)

        best = min(free, key=distance, default=None)
        if best is not None and distance(best) <= reach:
            pairs.append((best, window))
            free.remove(best)
    return pairs


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
        anchor: the spawn anchor (it pairs each window with the run nearest to it).
        trace: the recording.
        marker: the function's name as py-spy shows it.
        windows: ``(start, end)`` ``perf_counter_ns`` of the marker's calls.
        rate: the sampling rate of the recording (Hz).

    Returns:
        ``anchor`` unchanged if no run was paired with a window, else the marker anchor.
    """
    half = 500_000_000 // max(1, rate)
    # A run py-spy closed only because the recording ended has no true end: skip it.
    runs = [run for run in trace.frame_windows(marker) if run[1] < trace.end_us]
    pairs = _pairs(runs, anchor, windows, half)
    if not pairs:
        return anchor
    edges = sorted(w[i] - r[i] * 1000 + half for r, w in pairs for i in (0, 1))
    mid, p10, p90 = (edges[min(len(edges) - 1, int(q * len(edges)))] for q in (0.5, 0.1, 0.9))
    return dataclasses.replace(
        anchor,
        perf_ns=mid,
        lo_ns=min(p10, mid),
        hi_ns=max(p90, mid),
        method="marker",
        markers=len(pairs),
    )
