"""How close a kernel stamp of ours must be to a packet capture's stamp of the same segment.

On ``lo`` both are the kernel's: tcpdump's as the sender hands the segment to the interface,
the socket's as the receiving stack delivers it. Nothing a process does moves either, so
``LOOPBACK_NS`` holds with room to spare, on a quiet host and beside CPU burners, for all
but a few segments.

Those few are late, never early, by up to about a millisecond, and the kernel makes them
so. TCP marks each segment it sends with its departure time, which loopback keeps, so the
receive stamp is not taken as loopback queues the segment but as the network softirq
delivers it to IP (``skb_clear_delivery_time``). That work normally runs at once, in the
sender's own send call; when softirq work piles up the kernel hands it to ``ksoftirqd``, an
ordinary thread, and the segment waits, its bytes not readable, its stamp not yet taken.
(One such token, 1.03 ms after its capture stamp: our ACK of it left 24 us after our stamp,
so the client read it as soon as it was there.) A virtual machine adds the same kind of
delay when the hypervisor stops a vCPU between the two stamps (``steal`` in
``/proc/stat``). Neither can be seen per segment from user space, so :func:`hold_each`
holds every boundary to the bound but lets one in twenty of a large enough sample past it
(printed), each on the side these delays move it: a received segment's stamp late; a sent
segment's early, as our instant before the send call is early when the process was
preempted before the call. Steal is counted while the block runs, and each jiffy the
hypervisor took lets one more past, on the same side (seen here: 200 jiffies in one 10 s
test, 7 of 40 header stamps 0.5-2 ms after their capture).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from latency_analyzer.load._monitor import cpu_times

LOOPBACK_NS = 500_000  # a packet's capture stamp to its receive stamp on lo, with room
MIN_SAMPLE = 10  # below this, no boundary is let past the bound: one stray is the sample
ANCHOR_NS = 20_000  # a capture's epoch stamp on this process's perf_counter clock, give or take


def read_end_error(
    ours_ns: int, own_ns: int, arrivals_ns: Iterable[int], slack_ns: int = ANCHOR_NS
) -> int:
    """Our stamp of a read's end minus the captured arrival that ended the read.

    A read that returned several segments carries the kernel's stamp of the last of them, so
    that arrival is the latest from the boundary's own segment (``own_ns``) to our stamp,
    give or take the anchor (``slack_ns``). The nearest either side would pair a late stamp
    with a segment that came after it and call it early. With none, the stamp is early,
    held against the boundary's own segment."""
    took = [t for t in arrivals_ns if own_ns <= t <= ours_ns + slack_ns]
    return ours_ns - (max(took) if took else own_ns)


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


def strays_allowed(n: int) -> int:
    """How many of ``n`` boundaries may pass the worst-case bound, late: none in a sample
    under ``MIN_SAMPLE``; else one in twenty, at least one (the 95th percentile)."""
    return 0 if n < MIN_SAMPLE else max(1, n // 20)


def hold_each(
    name: str,
    errors_ns: Sequence[int],
    bound_ns: int,
    steal: Steal | None,
    early: bool = False,
    delivered_ns: Sequence[int | None] | None = None,
) -> None:
    """Every ``|error|`` (ours - the capture's) within ``bound_ns``, but for the strays
    :func:`strays_allowed`: late ones for a received segment's stamp; early ones with
    ``early``, for a sent segment, whose stamp is our instant before the send call (a process
    preempted there sends later than it stamped). ``steal`` (the hypervisor's share
    meanwhile) is printed with them, and each of its jiffies lets one more stray past.

    ``delivered_ns``, per error: how long after our stamp the capture saw the receiving
    kernel answer the segment (its ACK, sent as it delivered the bytes), or None. A late
    stamp the answer follows within ``bound_ns`` is the kernel's late delivery, seen on the
    wire from both sides: it is printed, and not counted as a stray."""
    answers = list(delivered_ns) if delivered_ns is not None else [None] * len(errors_ns)
    assert len(answers) == len(errors_ns), name
    shown = [
        e
        for e, after in zip(errors_ns, answers, strict=True)
        if e > bound_ns and after is not None and 0 <= after <= bound_ns
    ]
    if shown:
        print(f"{name}: delivered late by the kernel, its ACK right after: {shown} ns")
    ranked = sorted((e for e in errors_ns if e not in shown), key=abs)
    assert ranked or shown, name
    # the hypervisor stopping a vCPU delays the kernel's own work between the two stamps: a
    # jiffy of steal in the block excuses one stray on the side it moves (printed above)
    stolen = steal.jiffies if steal is not None else 0
    strays = strays_allowed(len(errors_ns)) + stolen
    past = [e for e in ranked if abs(e) > bound_ns]
    if past:
        took = "unknown" if steal is None else f"{steal.jiffies} jiffies"
        print(
            f"{name}: {len(past)} of {len(ranked)} past {bound_ns / 1e3:.0f} us: "
            f"{[round(e / 1e3, 1) for e in past]} us (steal meanwhile: {took})"
        )
    side = all(e < 0 for e in past) if early else all(e > 0 for e in past)
    assert len(past) <= strays and side, (name, strays, ranked)
