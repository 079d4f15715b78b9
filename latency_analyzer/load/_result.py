"""What a finished run reports: its set, its self-check, and the notes a reader must see
(interrupted, target saturated, spans dropped, client health)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..analysis import Summary, WaterfallSet
from ..errors import UsageError
from ..metrics import MetricSeries
from ..server.store import SpanStore
from ._length_report import length_report
from ._monitor import ClientHealth, LoopMonitor, Pacer
from ._run_state import RunState
from ._scenario import Scenario

__all__ = ["RunResult", "completed_in_window", "result_of", "spans_dropped"]

_SATURATION_RATIO = 0.9


@dataclass
class RunResult:
    """A finished run.

    Attributes:
        set: every request as a row (warm-up rows marked).
        scenario: what was run.
        issued: requests started; equals ``len(set)`` (none lost).
        client: the client's self-check (loop lag, pacer lag, CPU, peak RSS).
        offered_rps: the open loop's rate (None in a closed loop).
        completed_in_window_rps: requests completed while arrivals were still being issued,
            per second of that window (the target keeps up when this ≈ ``offered_rps``).
        target_saturated: the target could not keep up with an open loop's rate.
        notes: sentences for the summary.
    """

    set: WaterfallSet
    scenario: Scenario
    issued: int
    client: ClientHealth
    wall_s: float
    offered_rps: float | None = None
    completed_in_window_rps: float | None = None
    latency_growth: float | None = None
    target_saturated: bool = False
    notes: list[str] = field(default_factory=list)
    metrics: MetricSeries | None = None  # server metrics scraped during the run, if any
    interrupted: bool = False  # cancelled (Ctrl-C): in-flight requests stored as cancelled
    spans_dropped: int | None = None  # server spans the run's span store evicted or refused

    def summary(self, **kwargs: Any) -> Summary:
        """The set's summary with this run's notes (saturation, client health) added."""
        base = self.set.summary(**kwargs)
        base.notes[:0] = self.notes
        return base

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario.name,
            "issued": self.issued,
            "stored": len(self.set),
            "wall_s": self.wall_s,
            "offered_rps": self.offered_rps,
            "completed_in_window_rps": self.completed_in_window_rps,
            "latency_growth": self.latency_growth,
            "target_saturated": self.target_saturated,
            "client": self.client.to_dict(),
            "notes": self.notes,
            "interrupted": self.interrupted,
            "spans_dropped": self.spans_dropped,
        }


def result_of(
    r: RunState, mon: LoopMonitor, pacer: Pacer | None, *, interrupted: bool
) -> RunResult:
    if r.issued != r.stored:  # the invariant every report rests on
        raise UsageError(f"{r.issued} requests issued but {r.stored} stored")
    lags = (list(r.ws.values("read_lag")), list(r.ws.values("read_lag_max")))
    health = mon.health(pacer, lags)
    res = RunResult(r.ws, r.sc, r.issued, health, mon.wall_s, interrupted=interrupted)
    lines, lengths = length_report(r.ws, r.sc)
    res.notes.extend(lines)
    r.ws.note("lengths", lengths)
    if interrupted:
        n = r.ws.labels("error_type").count("cancelled")
        res.notes.append(f"the run was INTERRUPTED: {n} requests in flight stored as cancelled")
    _http_tls(r.ws, r.tls_versions)
    if r.sc.mode == "open" and r.sc.arrival != "burst":
        _target_check(r, res)
    note = health.note()
    if note:
        res.notes.append(note)
    return res


def spans_dropped(res: RunResult, store: SpanStore, dropped: int) -> None:
    res.spans_dropped = dropped
    if dropped:
        res.notes.append(
            f"the span store dropped {dropped} server spans (over its caps: {store.max_spans} "
            f"spans, {store.max_bytes} bytes, {store.max_traces} traces); requests whose "
            "spans were dropped merge as 'no server data'"
        )


def _http_tls(ws: WaterfallSet, tls_versions: set[str]) -> None:
    versions = sorted({v for v in ws.labels("http_version") if v})
    ws.meta.setdefault("fingerprint", {})["http_versions"] = versions
    ws.meta["fingerprint"]["tls_versions"] = sorted(tls_versions)
    ws.note("fingerprint", ws.meta["fingerprint"])  # the file's header was written before


#: The target is judged on a window at least this many of its early latencies long: in a
#: shorter one the requests still in flight as the arrivals stop (by Little's law, a share of
#: about mean latency / window) are more than the 10 % tolerated.
_JUDGED_LATENCIES = 10


def completed_in_window(
    start_ns: np.ndarray[Any, Any], e2e_ns: np.ndarray[Any, Any], issue_end_ns: int
) -> int | None:
    """Requests done by the end of the arrivals, that end shifted by the early requests' mean
    latency (the first completion comes a latency after the first arrival, and the last
    arrivals, finishing in the usual time, count); None when the window is shorter than
    :data:`_JUDGED_LATENCIES` of those latencies, too short for completions to tell."""
    order = np.argsort(start_ns)
    first = e2e_ns[order][: max(1, len(order) // 4)]
    early = float(first.mean())
    window = issue_end_ns - int(start_ns.min())
    if window < _JUDGED_LATENCIES * early:
        return None
    return int(np.count_nonzero(start_ns + e2e_ns <= issue_end_ns + early))


def _target_check(r: RunState, res: RunResult) -> None:
    """Did the target keep up with the offered rate? Completions while arrivals were still
    coming (:func:`completed_in_window`, per second of that window) against the rate, and
    latency's growth over the run."""
    ws = r.ws
    start = ws.column("start_ns")
    window = (r.issue_end_ns - r.t0) / 1e9
    if window <= 0 or len(ws) < 20:
        return
    offered = len(ws) / window
    e2e = ws.column("e2e_ns")
    completed = completed_in_window(start, e2e, r.issue_end_ns)
    if completed is None:
        return
    done = completed / window
    e2e = e2e[np.argsort(start)]
    quarter = max(1, len(e2e) // 4)
    growth = float(np.median(e2e[-quarter:]) / max(1.0, float(np.median(e2e[:quarter]))))
    res.offered_rps, res.completed_in_window_rps, res.latency_growth = offered, done, growth
    if done < _SATURATION_RATIO * offered:
        res.target_saturated = True
        res.notes.append(
            f"the TARGET is saturated: {done:.1f} req/s completed while {offered:.1f} req/s "
            f"arrived; latency (median, last vs first quarter of the run) grew {growth:.1f}×"
        )
