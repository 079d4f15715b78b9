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

__all__ = ["RunResult", "result_of", "spans_dropped"]

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


#: The target is judged on a window at least this many unloaded latencies long: in a shorter
#: one the requests still in flight as the arrivals stop are more than the 10 % tolerated.
_JUDGED_LATENCIES = 10


def _target_check(r: RunState, res: RunResult) -> None:
    """Did the target keep up with the offered rate? Completions while arrivals were still
    coming, the window shifted by the first quarter's median latency (per second of that
    window), against the rate, and latency's growth over the run; not judged when the window
    is shorter than ten of those latencies."""
    ws = r.ws
    start = ws.column("start_ns")
    end = start + ws.column("e2e_ns")
    window = (r.issue_end_ns - r.t0) / 1e9
    if window <= 0 or len(ws) < 20:
        return
    offered = len(ws) / window
    order = np.argsort(start)
    e2e = ws.column("e2e_ns")[order]
    quarter = max(1, len(e2e) // 4)
    unloaded = float(np.median(e2e[:quarter]))
    if window * 1e9 < _JUDGED_LATENCIES * unloaded:
        return  # the requests in flight at the end, a share of about latency / window, decide
    # The first completion comes one latency after the first arrival, so the completions are
    # counted over the window shifted by that latency: the requests that arrived last and
    # finish in the usual time count, and a short run is not called saturated for them.
    done = float(np.count_nonzero(end <= r.issue_end_ns + unloaded)) / window
    growth = float(np.median(e2e[-quarter:]) / max(1.0, unloaded))
    res.offered_rps, res.completed_in_window_rps, res.latency_growth = offered, done, growth
    if done < _SATURATION_RATIO * offered:
        res.target_saturated = True
        res.notes.append(
            f"the TARGET is saturated: {done:.1f} req/s completed while {offered:.1f} req/s "
            f"arrived; latency (median, last vs first quarter of the run) grew {growth:.1f}×"
        )
