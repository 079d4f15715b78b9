"""How close a kernel stamp of ours must be to a packet capture's stamp of the same segment.

On ``lo`` both are the kernel's: tcpdump's as the segment is handed to the interface, the
socket's as it is received. Between the two there is only the kernel's own loopback path, so
no load on a process inside the machine can move them apart by much: ``LOOPBACK_NS`` holds
with room to spare, on a quiet host and beside CPU burners.

A virtual machine adds one thing no process inside it can prevent: the hypervisor stops a
vCPU to run something else (``steal`` in ``/proc/stat``). A vCPU stopped between the two
stamps moves that one boundary by up to about a millisecond. It moves a few boundaries, not
most, so :func:`hold_each` keeps the worst-case bound where the hypervisor took nothing and,
where it took something, lets the few worst of a large enough sample past it (printed).
"""

from __future__ import annotations

from collections.abc import Sequence

from latency_analyzer.load._monitor import cpu_times

LOOPBACK_NS = 500_000  # a packet's capture stamp to its receive stamp on lo, with room
MIN_SAMPLE = 10  # below this, no boundary is let past the bound: one stray is the sample


class Steal:
    """CPU time the hypervisor took from this virtual machine during the block (jiffies)."""

    def __enter__(self) -> Steal:
        self.jiffies = 0
        self._start = cpu_times()
        return self

    def __exit__(self, *exc: object) -> None:
        end = cpu_times()
        if self._start is not None and end is not None:
            self.jiffies = end[0] - self._start[0]


def strays_allowed(n: int, steal: Steal | None) -> int:
    """How many of ``n`` boundaries may pass the worst-case bound: none without steal or in a
    sample under ``MIN_SAMPLE``; else one in twenty, at least one (the 95th percentile)."""
    if steal is None or not steal.jiffies or n < MIN_SAMPLE:
        return 0
    return max(1, n // 20)


def hold_each(name: str, errors_ns: Sequence[int], bound_ns: int, steal: Steal | None) -> None:
    """Every ``|error|`` within ``bound_ns``, but for the strays :func:`strays_allowed`."""
    ranked = sorted(abs(e) for e in errors_ns)
    assert ranked, name
    strays = strays_allowed(len(ranked), steal)
    if strays and ranked[-1] > bound_ns:
        assert steal is not None
        print(
            f"{name}: the hypervisor took {steal.jiffies} jiffies; worst "
            f"{[round(e / 1e3, 1) for e in ranked[-strays:]]} us of {len(ranked)}"
        )
    assert ranked[len(ranked) - 1 - strays] <= bound_ns, (name, strays, ranked)
