"""What a distributed run reports: per-worker reports, the merged result, and its notes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ...analysis import WaterfallSet
from ...errors import UsageError
from ...timeline._clock import cristian_offset  # the estimate is the timeline's; named here too
from .._monitor import LOOP_LAG_LIMIT_S, ClientHealth
from .._result import completed_in_window
from .._runner import RunResult

__all__ = [
    "RTT_WARN_RATIO",
    "RTT_WARN_S",
    "DistributedResult",
    "WorkerReport",
    "cristian_offset",
    "rates",
    "rtt_note",
    "worker_notes",
    "worst_client",
]

#: Workers' base RTTs to the target differ "too much" when max - min exceeds both of these.
RTT_WARN_S = 0.001
RTT_WARN_RATIO = 1.5
_CLOCK_WARN_S = 0.005  # a worker's wall clock off the driver's by more than this (beyond error)
_SATURATION_RATIO = 0.9  # as the local runner: completions below 90% of arrivals


@dataclass
class WorkerReport:
    """What the driver knows about one worker.

    Attributes:
        worker: its index (the ``worker`` column of its rows).
        host, node_id, pid: where it ran.
        anchor: its monotonic→epoch clock anchor (``perf_ns``, ``epoch_ns``, ``uncertainty_ns``).
        fingerprint: its environment fingerprint; ``base_rtt_s`` is its RTT to the target.
        clock_offset_s: its wall clock minus the driver's, ± ``clock_error_s``.
        status: ``finished``, ``stopped`` (a requested stop), ``died`` (its process is
            gone) or ``failed`` (its run raised; see ``error``).
        rows: rows received from it.
        expected: rows its share of the schedule called for, when the scenario fixes it.
        lost: for a dead or failed worker, ``expected - rows`` (0 when unknown).
        start_late_s: how late it reached the common start (a late worker issues its first
            arrivals late; their lateness is in ``schedule_lag``).
        client: its self-check (loop lag, pacer lag, CPU, peak RSS), when it finished.
        error: why it died.
    """

    worker: int
    host: str = "?"
    node_id: str = "?"
    pid: int = 0
    anchor: dict[str, int] = field(default_factory=dict)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    clock_offset_s: float = 0.0
    clock_error_s: float = 0.0
    status: str = "running"
    rows: int = 0
    expected: float | None = None
    lost: int = 0
    start_late_s: float | None = None
    client: dict[str, Any] | None = None
    error: str | None = None

    @property
    def base_rtt_s(self) -> float | None:
        rtt = self.fingerprint.get("base_rtt_s")
        return None if rtt is None else float(rtt)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["base_rtt_s"] = self.base_rtt_s
        return out


@dataclass
class DistributedResult(RunResult):
    """A run over several workers: the merged set plus what each worker did.

    Attributes:
        workers: one report per worker, by index.
        lost: requests the dead workers' shares called for but never delivered (estimate).
        achieved_rps: requests actually started (intended start + schedule_lag) within the
            run's duration, per second of it (open loops with a duration).
        start_epoch_ns: the common start.
        interrupted: the run was stopped before its end (``request_stop``, Ctrl-C).
        backend: where the workers ran: ``"processes"`` (this machine) or ``"ray"``.
    """

    workers: list[WorkerReport] = field(default_factory=list)
    lost: int = 0
    achieved_rps: float | None = None
    start_epoch_ns: int = 0
    interrupted: bool = False
    backend: str = "processes"

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["backend"] = self.backend
        out["workers"] = [w.to_dict() for w in self.workers]
        out["lost"], out["achieved_rps"] = self.lost, self.achieved_rps
        out["start_epoch_ns"], out["interrupted"] = self.start_epoch_ns, self.interrupted
        return out


def rtt_note(
    reports: list[WorkerReport], *, warn_s: float = RTT_WARN_S, ratio: float = RTT_WARN_RATIO
) -> str | None:
    """A warning when workers' base RTTs to the target differ by more than ``warn_s`` and by a
    factor above ``ratio`` (both: 30 vs 60 µs on loopback is no concern, nor 50 vs 51 ms)."""
    rtts = [(r.base_rtt_s, r.worker) for r in reports if r.base_rtt_s is not None]
    if len(rtts) < 2:
        return None
    (lo, lo_w), (hi, hi_w) = min(rtts), max(rtts)
    if hi - lo <= warn_s or hi <= ratio * lo:
        return None
    return (
        f"workers see the target at different distances: base RTT {hi * 1e3:.2f} ms "
        f"(worker {hi_w}) vs {lo * 1e3:.2f} ms (worker {lo_w}); compare per-worker "
        "percentiles (ws.group_by('worker')) before pooling them"
    )


def _lags(client: dict[str, Any]) -> str:
    """The lags a worker's saturation is judged on, each P99: the loop's (sampled), the
    pacer's and the reads' (the kernel-stamped one, which decides when there is one)."""
    shown = [
        f"{name} lag P99 {client[key]['p99_s'] * 1e3:.1f} ms"
        for name, key in (("loop", "loop_lag"), ("pacer", "pacer_lag"), ("read", "read_lag"))
        if client.get(key)
    ]
    return ", ".join(shown) + f" (limit {LOOP_LAG_LIMIT_S * 1e3:g} ms)"


def worker_notes(reports: list[WorkerReport]) -> list[str]:
    notes = []
    for r in reports:
        if r.status in ("died", "failed"):
            notes.append(
                f"worker {r.worker} ({r.host}) {r.status.upper()}: {r.rows} requests kept, "
                f"about {r.lost} "
                f"of its share lost ({r.error})"
            )
        if r.client and r.client.get("saturated"):
            notes.append(f"worker {r.worker} ({r.host}) was saturated: {_lags(r.client)}")
        if abs(r.clock_offset_s) > r.clock_error_s + _CLOCK_WARN_S:
            notes.append(
                f"worker {r.worker} ({r.host}) wall clock is {r.clock_offset_s * 1e3:+.1f} ms "
                "off the driver's: its start and epoch timestamps are off by as much"
            )
        if r.start_late_s is not None and r.start_late_s > 0:
            notes.append(f"worker {r.worker} reached the common start {r.start_late_s:.3f} s late")
    return notes


def worst_client(outs: list[dict[str, Any]]) -> ClientHealth:
    """The most loaded worker's self-check (the one that decides whether a client saturated)."""
    if not outs:
        return ClientHealth({"p50_s": 0.0, "p99_s": 0.0, "max_s": 0.0}, None, 0.0, 0)
    c = max((o["result"]["client"] for o in outs), key=lambda c: c["loop_lag"]["p99_s"])
    return ClientHealth(
        c["loop_lag"],
        c["pacer_lag"],
        c["cpu_cores"],
        c["peak_rss_bytes"],
        steal=c.get("steal"),
        load_avg=c.get("load_avg"),
        cpus=c.get("cpus"),
        read_lag=c.get("read_lag"),
        host_busy=c.get("host_busy"),
        cpu_wait=c.get("cpu_wait"),
    )


def rates(res: DistributedResult) -> None:
    """Achieved, offered and completed rates of an open loop with a duration, merged."""
    sc, ws = res.scenario, res.set
    if sc.mode != "open" or sc.arrival == "burst" or not sc.duration or len(ws) < 20:
        return
    start = ws.column("epoch_ns")
    lag = _stage(ws, "schedule_lag")
    t0, dur_ns = res.start_epoch_ns, round(sc.duration * 1e9)
    actual = start + lag
    res.achieved_rps = float(np.count_nonzero((actual >= t0) & (actual < t0 + dur_ns))) / (
        sc.duration
    )
    window = (int(start.max()) - t0) / 1e9
    if window <= 0:
        return
    completed = completed_in_window(start, ws.column("e2e_ns"), int(start.max()))
    if completed is None:
        return  # too short for completions to tell (see completed_in_window)
    res.offered_rps = len(ws) / window
    res.completed_in_window_rps = completed / window
    if res.completed_in_window_rps < _SATURATION_RATIO * res.offered_rps:
        res.target_saturated = True
        res.notes.append(
            f"the TARGET is saturated: {res.completed_in_window_rps:.1f} req/s completed "
            f"while {res.offered_rps:.1f} req/s arrived"
        )


def _stage(ws: WaterfallSet, name: str) -> np.ndarray[Any, Any]:
    try:
        return ws.column(f"stage:{name}")
    except UsageError:  # no row had the stage
        return np.zeros(len(ws), dtype=np.int64)
