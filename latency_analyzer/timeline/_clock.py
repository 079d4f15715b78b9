"""Clock domains: client intervals are ``perf_counter_ns``; one anchor maps them to epoch ns."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ClockAnchor", "process_anchor", "take_anchor"]


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
