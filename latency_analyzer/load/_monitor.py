"""The client watching itself: pacer lag, event-loop lag, read lag, CPU and peak memory.

A load generator that cannot keep up reports the wrong latency (coordinated omission) or a
throughput that is its own limit. So a run samples the event loop's lag all along (a task
that asks to sleep 50 ms and measures how late it wakes), the process's CPU time and its peak
RSS, and the summary says when the client, not the target, was the bottleneck. The sampler
wakes an otherwise idle loop, and on a virtual machine each such wake-up costs 0.25-0.35 ms
of CPU (measured on 2 shared cores: a 5 ms sampler used 46 ms of CPU per second, as much as
the rest of the client at 10 paced streams); 20 samples a second still catch any stall that
matters (the saturation limit is a 10 ms P99).

A lagging loop has two different causes with different remedies: the client itself used its
core (more processes help), or the host's CPUs were taken by others: other processes (the
load average well above what this client used) or the hypervisor (CPU steal in
``/proc/stat``), where more client processes only add to the contention. Averages over the
run miss a host that was busy in bursts, so each sample also reads how long the loop's thread
waited for a CPU while it slept (``/proc/thread-self/schedstat``, the kernel's run-queue
delay): a lag that is mostly that wait was the host's, whatever the averages say. The read lag
is measured, not sampled: every waterfall carries how long after the kernel's receive stamp
our loop read each response's bytes (its median and worst), and the run reports their P50,
P99 and max.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = [
    "LOOP_LAG_LIMIT_S",
    "ClientHealth",
    "LoopMonitor",
    "Pacer",
    "ThreadSchedstat",
    "cpu_times",
    "load_average",
    "peak_rss_bytes",
    "steal_share",
]

#: Event-loop lag P99 above which a run says its client was saturated.
LOOP_LAG_LIMIT_S = 0.010

_TICK_S = 0.050


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (``getrusage``)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports KiB


class Pacer:
    """Waits until absolute ``perf_counter_ns`` instants, as closely as the loop allows.

    It sleeps on the event loop until ``spin_s`` before the instant, then yields
    (``asyncio.sleep(0)``) until it has passed: the selector rounds timeouts up to whole
    milliseconds, which alone would make every arrival up to 1 ms late. The lateness of every
    wake-up is kept (``lags_ns``) and reported.
    """

    def __init__(self, spin_s: float = 0.0015) -> None:
        self.spin_ns = round(spin_s * 1e9)
        self.lags_ns: list[int] = []

    async def wait_until(self, deadline_ns: int) -> int:
        """Return the time of waking (>= ``deadline_ns``); records the lag."""
        remaining = deadline_ns - time.perf_counter_ns()
        if remaining > self.spin_ns:
            await asyncio.sleep((remaining - self.spin_ns) / 1e9)
        now = time.perf_counter_ns()
        while now < deadline_ns:
            await asyncio.sleep(0)
            now = time.perf_counter_ns()
        self.lags_ns.append(now - deadline_ns)
        return now


def cpu_times(path: str | Path = "/proc/stat") -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs since boot, from ``/proc/stat`` (None elsewhere)."""
    times = host_times(path)
    return None if times is None else (times[0], times[2])


def host_times(path: str | Path = "/proc/stat") -> tuple[int, int, int] | None:
    """(steal, idle, total) jiffies of all CPUs since boot, from ``/proc/stat`` (None
    elsewhere); idle counts I/O wait, when a CPU had nothing to run either."""
    try:
        with open(path, encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return values[7], values[3] + values[4], sum(values)


def busy_share(
    before: tuple[int, int, int] | None, after: tuple[int, int, int] | None
) -> float | None:
    """The share of all CPUs' time in use (by any process) between two :func:`host_times`
    readings."""
    if before is None or after is None or after[2] <= before[2]:
        return None
    return 1.0 - (after[1] - before[1]) / (after[2] - before[2])


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of CPU time the hypervisor took between two :func:`cpu_times` readings."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def schedstat() -> tuple[int, int] | None:
    """The calling thread's time on a CPU and on a run queue waiting for one, in all, in ns
    (``/proc/thread-self/schedstat``; None where the kernel does not say): one reading of a
    :class:`ThreadSchedstat` made for it."""
    reader = ThreadSchedstat()
    try:
        return reader.read()
    finally:
        reader.close()


class ThreadSchedstat:
    """:func:`schedstat` of the thread that made it, read again and again from one open
    descriptor: a ``pread`` from its start makes the kernel write the figures afresh, one
    system call a reading where opening the file each time takes three. The sampler reads
    it on every wake, when nothing it runs is in a cache."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None

    def read(self) -> tuple[int, int] | None:
        """(on a CPU, waiting for one) in ns, as :func:`schedstat`; None once closed."""
        if self._fd is None:
            return None
        try:
            on_cpu, waited = os.pread(self._fd, 128, 0).split()[:2]
            return int(on_cpu), int(waited)
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def load_average() -> float | None:
    """The host's 1-minute load average (runnable processes), None where unknown."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


@dataclass
class LoopMonitor:
    """Samples event-loop lag every 50 ms while running (``async with``)."""

    lags_ns: list[int] = field(default_factory=list)
    #: per sample, how long the loop's thread waited for a CPU during it (-1: not known)
    waits_ns: list[int] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _cpu0: float = 0.0
    _wall0: int = 0
    _stat0: tuple[int, int, int] | None = None

    async def __aenter__(self) -> LoopMonitor:
        self._cpu0, self._wall0 = time.process_time(), time.perf_counter_ns()
        self._stat0 = host_times()
        self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.cpu_s = time.process_time() - self._cpu0
        self.wall_s = (time.perf_counter_ns() - self._wall0) / 1e9
        before, stat = self._stat0, host_times()
        self.steal = None
        if before is not None and stat is not None:
            self.steal = steal_share((before[0], before[2]), (stat[0], stat[2]))
        self.busy = busy_share(before, stat)
        self.load = load_average()

    async def _sample(self) -> None:
        tick = round(_TICK_S * 1e9)
        reader = ThreadSchedstat()  # opened here: the loop's thread is the one it reads
        try:
            stat = reader.read()
            while True:
                t = time.perf_counter_ns()
                await asyncio.sleep(_TICK_S)
                self.lags_ns.append(max(0, time.perf_counter_ns() - t - tick))
                before, stat = stat, reader.read()
                # -1: not known (the lists stay in step, sample by sample)
                waited = -1 if before is None or stat is None else stat[1] - before[1]
                self.waits_ns.append(waited)
        finally:
            reader.close()

    def health(
        self, pacer: Pacer | None, read_lags_s: tuple[list[float], list[float]] | None = None
    ) -> ClientHealth:
        return ClientHealth.of(self, pacer, read_lags_s)


def _cpu_wait(lags_ns: list[int], waits_ns: list[int]) -> dict[str, float] | None:
    # in step sample by sample; a monitor made without waits (lags given by hand) has none
    known = [(lag, wait) for lag, wait in zip(lags_ns, waits_ns, strict=False) if wait >= 0]
    if not known:
        return None
    limit = LOOP_LAG_LIMIT_S * 1e9
    lagging = [(lag, wait) for lag, wait in known if lag > limit]
    return {
        "total_s": sum(wait for _, wait in known) / 1e9,
        "lagging": len(lagging),
        # samples that would have been within the limit but for the wait
        "lagging_by_wait": sum(1 for lag, wait in lagging if lag - wait <= limit),
    }


def _pcts(ns: list[int]) -> dict[str, float]:
    if not ns:
        return {"p50_s": 0.0, "p99_s": 0.0, "max_s": 0.0}
    arr = np.asarray(ns, dtype=np.float64) / 1e9
    p50, p99 = np.percentile(arr, [50, 99])
    return {"p50_s": float(p50), "p99_s": float(p99), "max_s": float(arr.max())}


#: CPU steal above this share of the run says the hypervisor took the client's CPU.
STEAL_LIMIT = 0.05

#: This client using more than this share of a core means its own limit was reached.
OWN_CPU_LIMIT = 0.8

#: The host's CPUs busy for at least this share of the run, with other processes using half
#: a core or more of it, say they were contended: the load average, a one-minute mean, is
#: slow to see a host that turned busy as the run began.
HOST_BUSY_LIMIT = 0.9


@dataclass(frozen=True)
class ClientHealth:
    """How the client fared. ``cpu`` is CPU seconds per wall second (1.0: one full core).

    Attributes:
        loop_lag, pacer_lag: P50, P99 and max of how late the loop (and, in an open loop, the
            pacer) woke up; ``pacer_lag`` is None in a closed loop, which has no schedule.
        cpu: this process's CPU use, in cores.
        peak_rss_bytes: its peak memory.
        steal: share of the host's CPU time the hypervisor took during the run (None: not
            known, e.g. not Linux).
        load_avg: the host's 1-minute load average at the end of the run.
        cpus: the host's CPU count.
        host_busy: share of all the host's CPU time in use during the run, by any process,
            this one included (None: not known).
        cpu_wait: the loop's thread on a run queue, waiting for a CPU: ``total_s`` (seconds
            over the run), ``lagging`` (loop-lag samples over :data:`LOOP_LAG_LIMIT_S`) and
            ``lagging_by_wait`` (those of them whose lag less that wait is within the limit:
            the wait made them lag). None: the kernel does not say.
    """

    loop_lag: dict[str, float]
    pacer_lag: dict[str, float] | None
    cpu: float
    peak_rss_bytes: int
    steal: float | None = None
    load_avg: float | None = None
    cpus: int | None = None
    read_lag: dict[str, float] | None = None
    """P50/P99 of the waterfalls' median read lags, and the worst read (seconds)."""
    host_busy: float | None = None
    cpu_wait: dict[str, float] | None = None

    @classmethod
    def of(
        cls,
        mon: LoopMonitor,
        pacer: Pacer | None,
        read_lags_s: tuple[list[float], list[float]] | None = None,
    ) -> ClientHealth:
        """``read_lags_s``: the waterfalls' (median, worst) read lags, when they have them."""
        cpu = mon.cpu_s / mon.wall_s if mon.wall_s > 0 else 0.0
        pacer_lag = _pcts(pacer.lags_ns) if pacer is not None else None
        read_lag = None
        if read_lags_s is not None and read_lags_s[0]:
            medians, worst = read_lags_s
            p50, p99 = np.percentile(np.asarray(medians), [50, 99])
            read_lag = {"p50_s": float(p50), "p99_s": float(p99), "max_s": float(max(worst))}
        steal, load = getattr(mon, "steal", None), getattr(mon, "load", None)
        return cls(
            _pcts(mon.lags_ns),
            pacer_lag,
            cpu,
            peak_rss_bytes(),
            steal=steal,
            load_avg=load,
            cpus=os.cpu_count(),
            read_lag=read_lag,
            host_busy=getattr(mon, "busy", None),
            cpu_wait=_cpu_wait(mon.lags_ns, mon.waits_ns),
        )

    @property
    def host_contended(self) -> bool:
        """Others took the CPUs: steal, the loop's lag mostly spent waiting for a CPU,
        runnable processes beyond the CPUs we left free, or the CPUs busy all through the
        run with others' work."""
        if self.steal is not None and self.steal >= STEAL_LIMIT:
            return True
        if not self.cpus or self.cpu >= OWN_CPU_LIMIT:
            return False
        if self.lag_waited_for_cpu:
            return True
        if self.load_avg is not None and self.load_avg - self.cpu >= self.cpus:
            return True
        if self.host_busy is None:
            return False
        others = self.host_busy * self.cpus - self.cpu  # cores
        return self.host_busy >= HOST_BUSY_LIMIT and others >= 0.5

    @property
    def lag_waited_for_cpu(self) -> bool:
        """At least half the loop's lagging samples (over :data:`LOOP_LAG_LIMIT_S`) would
        have been within it but for their thread's wait on a run queue: the host gave the
        CPU to others, in bursts an average over the run can miss."""
        w = self.cpu_wait
        return bool(w and w["lagging"] and w["lagging_by_wait"] >= 0.5 * w["lagging"])

    @property
    def saturated(self) -> bool:
        """Pacer lag, or how late the loop was, P99 beyond :data:`LOOP_LAG_LIMIT_S`.

        How late the loop was is the measured read lag when the waterfalls carry it (the
        kernel stamped each arrival); the loop-sleep sampler's estimate otherwise.
        """
        loop = self.read_lag if self.read_lag is not None else self.loop_lag
        worst = max(loop["p99_s"], (self.pacer_lag or {}).get("p99_s", 0.0))
        return worst > LOOP_LAG_LIMIT_S

    def note(self) -> str | None:
        """A sentence for the summary when the client lagged: whose limit it was."""
        if not self.saturated:
            return None
        lag = f"event-loop lag P99 {self.loop_lag['p99_s'] * 1e3:.1f} ms"
        if self.pacer_lag is not None:
            lag += f", pacer lag P99 {self.pacer_lag['p99_s'] * 1e3:.1f} ms"
        if self.read_lag is not None:
            lag += f", read lag P99 {self.read_lag['p99_s'] * 1e3:.1f} ms"
        own = f"this client used {self.cpu:.0%} of a core"
        if self.host_contended:
            if self.steal is not None and self.steal >= STEAL_LIMIT:
                why = f"the hypervisor took {self.steal:.0%} of the host's CPU time (steal)"
            elif self.lag_waited_for_cpu and self.cpu_wait is not None:
                w = self.cpu_wait
                why = (
                    f"{w['lagging_by_wait']:.0f} of the loop's {w['lagging']:.0f} lagging "
                    "samples lagged because its thread waited for a CPU that other processes "
                    "held"
                )
            else:
                busy = "" if self.host_busy is None else f", {self.host_busy:.0%} busy"
                load = "" if self.load_avg is None else f"load average {self.load_avg:.1f} on "
                why = f"other processes kept the host busy ({load}{self.cpus} CPUs{busy})"
            return (
                f"the HOST was contended: {lag}; {why} while {own}: latencies include time "
                "this client waited for a CPU; run on a quieter host (more client processes "
                "would add to the contention)"
            )
        if self.cpu >= OWN_CPU_LIMIT:
            return (
                f"the CLIENT was saturated: {lag}; {own}: latencies include client delay; "
                "use more processes (run --ray, workers) or a lower load"
            )
        return (
            f"the client's event loop lagged: {lag}, though {own} and the host was not busy: "
            "something blocked the loop (a slow callback, synchronous I/O, a large response "
            "parsed at once)"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "loop_lag": self.loop_lag,
            "pacer_lag": self.pacer_lag,
            "cpu_cores": self.cpu,
            "peak_rss_bytes": self.peak_rss_bytes,
            "read_lag": self.read_lag,
            "saturated": self.saturated,
            "steal": self.steal,
            "load_avg": self.load_avg,
            "cpus": self.cpus,
            "host_busy": self.host_busy,
            "host_contended": self.host_contended,
            "cpu_wait": self.cpu_wait,
        }
