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
on Linux, shared by every process). The arithmetic (:class:`ProfileAnchor`, the edge matching)
is the timeline's, beside every other clock offset (``timeline._clock``); here a recording's
runs are fed to it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..timeline._clock import ProfileAnchor, marker_zero
from ._trace import Trace

__all__ = ["ProfileAnchor", "refine_anchor"]


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
    # A run py-spy closed only because the recording ended has no true end: skip it.
    runs = [run for run in trace.frame_windows(marker) if run[1] < trace.end_us]
    found = marker_zero(anchor, runs, windows, rate)
    if found is None:
        return anchor
    mid, p10, p90, used = found
    return dataclasses.replace(
        anchor,
        perf_ns=mid,
        lo_ns=min(p10, mid),
        hi_ns=max(p90, mid),
        method="marker",
        markers=used,
    )
