"""Distributed load on Ray: the same scenario, spread over async actors on many machines.

::

    from latency_analyzer.load import Scenario
    from latency_analyzer.load._ray import run_ray_sync

    sc = Scenario(url, mode="open", rate=400, arrival="poisson", duration=60)
    result = run_ray_sync(sc, workers=8, address="auto", path="run.jsonl")
    print(result.summary().to_text())       # one merged set; per-worker identity kept

How a run goes:

1. The driver splits the scenario (:func:`split_scenario`): an open loop's rate R becomes R/N
   per worker with its own seed (independent Poisson streams add up to a Poisson stream of
   rate R), a closed loop's users and any request count are shared out as evenly as possible.
2. Each worker is a Ray async actor running the ordinary asyncio runner
   (:func:`latency_analyzer.load.run`). It first reports who it is: host, Ray node, pid, its
   monotonic→epoch clock anchor, its environment fingerprint with the base RTT to the target,
   and its wall clock as seen from the driver (Cristian: offset ± half the call's round trip).
3. The driver picks a start instant ``start_delay`` seconds ahead, as epoch ns; each worker
   maps it to its own ``perf_counter_ns`` through its anchor and uses it as the run's t0.
4. Workers stream their rows back in batches (one string of JSONL lines per batch, at most
   ``batch_interval`` seconds old), not one object per request; the driver adds them to one
   ``WaterfallSet`` (and its file) as they come. The rows keep their ``worker`` tag, and the
   header's ``meta["workers"]`` holds each worker's identity, so a slow worker shows as such.
5. A worker that dies keeps what it streamed: its rows are in the set, its status is
   ``died`` and the share it did not deliver is reported as ``lost`` (an estimate: its share
   of the schedule minus what arrived). A stop (:meth:`RayRun.request_stop`, Ctrl-C in
   :func:`run_ray_sync`) stops issuing everywhere; in-flight requests finish and are kept.

Needs the ``[ray]`` extra; ray is imported only when a run starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis import Tags, WaterfallSet, fingerprint
from ..errors import UsageError
from ..timeline import Waterfall, process_anchor
from ._monitor import ClientHealth
from ._runner import RunResult, run
from ._scenario import Scenario

__all__ = [
    "RTT_WARN_RATIO",
    "RTT_WARN_S",
    "DistributedResult",
    "RayRun",
    "WorkerReport",
    "cristian_offset",
    "expected_requests",
    "phase_ns",
    "rtt_note",
    "run_ray",
    "run_ray_sync",
    "split_scenario",
]

#: Workers' base RTTs to the target differ "too much" when max - min exceeds both of these.
RTT_WARN_S = 0.001
RTT_WARN_RATIO = 1.5
_CLOCK_WARN_S = 0.005  # a worker's wall clock off the driver's by more than this (beyond error)
_CLOCK_PROBES = 5  # round trips to a worker; the tightest bounds its clock offset best
_SATURATION_RATIO = 0.9  # as the local runner: completions below 90% of arrivals


# -- splitting -----------------------------------------------------------------------------
def _share(total: int, n: int, i: int) -> int:
    """Worker i's part of ``total`` split as evenly as possible (the first ones get one more)."""
    return total // n + (1 if i < total % n else 0)


def split_scenario(sc: Scenario, workers: int) -> list[Scenario]:
    """The scenario each of ``workers`` runs; together they offer ``sc``'s load.

    Open loop: rate / N each, seeds ``seed·1000 + i`` (independent streams). Closed loop:
    ``concurrency`` users shared out. ``requests``, ``warmup_requests`` and ``max_in_flight``
    are shared out too; ``duration``, ``warmup_seconds`` and ``ramp_up`` are the same for all.

    Raises:
        UsageError: fewer than one worker, or fewer users / requests than workers.
    """
    if workers < 1:
        raise UsageError("workers must be >= 1")
    if sc.mode == "closed" and sc.concurrency < workers:
        raise UsageError(f"{sc.concurrency} users cannot be shared by {workers} workers")
    if sc.requests is not None and sc.requests < workers:
        raise UsageError(f"{sc.requests} requests cannot be shared by {workers} workers")
    return [_part(sc, workers, i) for i in range(workers)]


def _part(sc: Scenario, n: int, i: int) -> Scenario:
    changes: dict[str, Any] = {
        "seed": sc.seed * 1000 + i,  # same seeds would make N copies of one stream: bursts
        "warmup_requests": _share(sc.warmup_requests, n, i),
    }
    if sc.mode == "open" and sc.rate is not None:
        changes["rate"] = sc.rate / n
    if sc.mode == "closed":
        changes["concurrency"] = _share(sc.concurrency, n, i)
    if sc.requests is not None:
        changes["requests"] = _share(sc.requests, n, i)
    if sc.max_in_flight is not None:
        changes["max_in_flight"] = max(1, _share(sc.max_in_flight, n, i))
    return sc.replace(**changes)


def phase_ns(sc: Scenario, workers: int, i: int) -> int:
    """Worker i's offset from the common start: ``i / rate`` for constant arrivals, so the
    merged schedule is the one-process schedule (every 1/R), not N requests at once every
    N/R; 0 otherwise (independent random streams need no phase)."""
    if sc.mode == "open" and sc.arrival == "constant" and sc.rate:
        return round(i / sc.rate * 1e9)
    return 0


def expected_requests(sc: Scenario) -> float | None:
    """Requests a (worker's) scenario is expected to issue, if the scenario fixes it."""
    if sc.mode == "open" and sc.arrival == "burst":
        return sc.requests
    by_time = None
    if sc.mode == "open" and sc.duration is not None and sc.rate and sc.ramp_up == 0:
        by_time = sc.rate * sc.duration
    counts = [c for c in (by_time, sc.requests) if c is not None]
    return float(min(counts)) if counts else None


def cristian_offset(samples: list[tuple[int, int, int]]) -> tuple[float, float]:
    """A remote wall clock's offset from ours, from ``(sent, remote, back)`` epoch-ns triples.

    The remote clock was read somewhere in [sent, back] (Cristian): the offset is ``remote -
    (sent + back) / 2`` within ± half the round trip. The tightest round trip wins.

    Returns:
        ``(offset_s, error_s)``; ``(0.0, inf)`` without samples.
    """
    offset, error = 0.0, math.inf
    for sent, remote, back in samples:
        if (back - sent) / 2e9 < error:
            offset, error = (remote - (sent + back) / 2) / 1e9, (back - sent) / 2e9
    return offset, error


# -- the worker (a Ray async actor) --------------------------------------------------------
class _Worker:
    """One load-generating process. Wrapped with ``ray.remote`` when a run starts."""

    def __init__(self, index: int, scenario: Scenario, options: Mapping[str, Any]) -> None:
        self.index, self.sc, self.options = index, scenario, dict(options)
        self.lines: list[str] = []  # rows not yet fetched by the driver
        self.rows = 0
        self.done = False
        self._ready: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None

    async def identity(self) -> dict[str, Any]:
        """Host, node, pid, clock anchor, fingerprint (with base RTT) and the wall clock now."""
        import ray

        rtt = int(self.options.get("rtt_samples", 5))
        fp = await asyncio.to_thread(fingerprint, self.sc.url, rtt_samples=rtt)
        return {
            "worker": self.index,
            "host": socket.gethostname(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "anchor": asdict(process_anchor()),
            "fingerprint": fp,
        }

    async def wall_ns(self) -> int:
        """This host's wall clock now (the driver brackets the call to estimate the offset)."""
        return time.time_ns()

    async def run(self, start_epoch_ns: int) -> dict[str, Any]:
        """Run the scenario from the common start; returns the run's report."""
        if self.options.get("switch_interval"):
            # Ray's own threads in this process hold the GIL for up to the default 5 ms
            # interval: measured +0.4-0.8 ms of client time at the first token. Handing it
            # back sooner makes an actor measure like a plain process (docs/ray.md).
            sys.setswitchinterval(self.options["switch_interval"])
        self._ready, self._stop = asyncio.Event(), asyncio.Event()
        t0 = process_anchor().to_perf_ns(start_epoch_ns)
        late_ns = time.perf_counter_ns() - t0
        opts = self.options
        try:
            result = await run(
                self.sc,
                path=opts.get("path"),
                worker=self.index,
                headers=opts.get("headers"),
                rtt_samples=0,  # measured in identity(), before the common start
                start_ns=t0,
                on_row=self._on_row,
                stop=self._stop,
            )
        finally:
            self.done = True
            self._ready.set()
        return {"result": result.to_dict(), "t0_perf_ns": t0, "late_at_start_ns": late_ns}

    def _on_row(self, wf: Waterfall, tags: Tags) -> None:
        line = {"kind": "wf", "tags": tags.to_dict(), "wf": wf.to_dict()}
        self.lines.append(json.dumps(line, separators=(",", ":")))
        self.rows += 1
        if self._ready is not None and len(self.lines) >= self.options["batch_rows"]:
            self._ready.set()

    async def batch(self, wait_s: float) -> tuple[str, bool]:
        """Rows stored since the last call, as JSONL (waits up to ``wait_s`` for a full batch),
        and whether the run is over (then this was the last batch)."""
        if self._ready is None:  # run() not started yet: nothing to send
            await asyncio.sleep(wait_s)
        elif not self.done:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), wait_s)
            self._ready.clear()
        lines, self.lines = self.lines, []
        return "\n".join(lines), self.done

    async def stop(self) -> None:
        """Issue nothing more; in-flight requests finish and are stored."""
        if self._stop is not None:
            self._stop.set()


# -- reports -------------------------------------------------------------------------------
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
    """

    workers: list[WorkerReport] = field(default_factory=list)
    lost: int = 0
    achieved_rps: float | None = None
    start_epoch_ns: int = 0
    interrupted: bool = False

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["backend"] = "ray"
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


def _worker_notes(reports: list[WorkerReport]) -> list[str]:
    notes = []
    for r in reports:
        if r.status in ("died", "failed"):
            notes.append(
                f"worker {r.worker} ({r.host}) {r.status.upper()}: {r.rows} requests kept, "
                f"about {r.lost} "
                f"of its share lost ({r.error})"
            )
        if r.client and r.client.get("saturated"):
            lag = r.client["loop_lag"]["p99_s"] * 1e3
            notes.append(f"worker {r.worker} ({r.host}) was saturated: loop lag P99 {lag:.1f} ms")
        if abs(r.clock_offset_s) > r.clock_error_s + _CLOCK_WARN_S:
            notes.append(
                f"worker {r.worker} ({r.host}) wall clock is {r.clock_offset_s * 1e3:+.1f} ms "
                "off the driver's: its start and epoch timestamps are off by as much"
            )
        if r.start_late_s is not None and r.start_late_s > 0:
            notes.append(f"worker {r.worker} reached the common start {r.start_late_s:.3f} s late")
    return notes


# -- the driver ----------------------------------------------------------------------------
class RayRun:
    """One distributed run: ``await start()``, then ``await wait()`` for the merged result.

    Args:
        scenario: what to run, as on one machine; :func:`split_scenario` shares it out.
        workers: actors to start (each needs ``worker_cpus`` CPUs of the cluster).
        address: a Ray cluster (``"auto"``, ``"ray://head:10001"``); None starts a local
            one bound to loopback (``ray.init(num_cpus=workers)``). When Ray is already
            initialised in this process, that cluster is used and ``address`` ignored.
        path: the merged set's JSONL file, written as batches arrive.
        worker_dir: each worker also writes its own JSONL here (on its own host:
            ``worker<i>.jsonl``), e.g. a shared file system.
        headers: sent with every request (never stored).
        rtt_samples: TCP connects per worker for its base RTT to the target.
        start_delay: seconds between the driver's choice of the start and the start: enough
            for the start call to reach every worker.
        batch_rows, batch_interval: a worker sends its rows when it has ``batch_rows`` of
            them or ``batch_interval`` seconds have passed, whichever comes first.
        worker_cpus: CPUs each actor reserves.
        runtime_env: passed to the actors (e.g. ``{"pip": ["latency-analyzer"]}``).
        switch_interval: ``sys.setswitchinterval`` in each actor process (None: Python's
            5 ms); short, so Ray's threads do not delay the event loop's reads.

    Raises:
        UsageError: ray is not installed, or the scenario cannot be split.
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        workers: int,
        address: str | None = None,
        path: str | os.PathLike[str] | None = None,
        worker_dir: str | None = None,
        headers: Mapping[str, str] | None = None,
        rtt_samples: int = 5,
        start_delay: float = 1.0,
        batch_rows: int = 256,
        batch_interval: float = 0.2,
        worker_cpus: float = 1.0,
        runtime_env: Mapping[str, Any] | None = None,
        switch_interval: float | None = 0.0002,
    ) -> None:
        self.scenario, self.parts = scenario, split_scenario(scenario, workers)
        self.address, self.path = address, path
        self.worker_dir, self.headers, self.rtt_samples = worker_dir, headers, rtt_samples
        self.start_delay, self.batch_rows, self.batch_interval = (
            start_delay,
            batch_rows,
            batch_interval,
        )
        self.worker_cpus, self.runtime_env = worker_cpus, runtime_env
        self.switch_interval = switch_interval
        self.actors: list[Any] = []
        self.reports = [WorkerReport(i) for i in range(workers)]
        self.start_epoch_ns = 0
        self.set: WaterfallSet | None = None
        self._stop_requested = False
        self._t_start = 0.0

    # -- starting --
    async def start(self) -> None:
        """Connect to Ray, start the actors, learn who they are, and start them together."""
        ray = _import_ray()
        if not ray.is_initialized():
            await asyncio.to_thread(_init_ray, ray, self.address, len(self.parts))
        cls = ray.remote(_Worker).options(
            num_cpus=self.worker_cpus,
            scheduling_strategy="SPREAD",  # one per node while nodes last: the point of it
            runtime_env=dict(self.runtime_env) if self.runtime_env else None,
        )
        self.actors = [cls.remote(i, sc, self._options(i)) for i, sc in enumerate(self.parts)]
        await asyncio.gather(*(self._identify(i) for i in range(len(self.actors))))
        self.set = WaterfallSet(self.path, meta=self._meta())
        self._t_start = time.perf_counter()
        self.start_epoch_ns = time.time_ns() + round(self.start_delay * 1e9)
        n = len(self.actors)
        self._runs = [
            a.run.remote(self.start_epoch_ns + phase_ns(self.scenario, n, i))
            for i, a in enumerate(self.actors)
        ]

    def _options(self, i: int) -> dict[str, Any]:
        path = None if self.worker_dir is None else str(Path(self.worker_dir, f"worker{i}.jsonl"))
        return {
            "path": path,
            "headers": dict(self.headers or {}),
            "rtt_samples": self.rtt_samples,
            "batch_rows": self.batch_rows,
            "switch_interval": self.switch_interval,
        }

    async def _identify(self, i: int) -> None:
        ident = await self.actors[i].identity.remote()
        r = self.reports[i]
        r.host, r.node_id, r.pid = ident["host"], ident["node_id"], ident["pid"]
        r.anchor, r.fingerprint = ident["anchor"], ident["fingerprint"]
        r.expected = expected_requests(self.parts[i])
        samples = []
        for _ in range(_CLOCK_PROBES):  # Cristian: the worker read its clock in [sent, back]
            sent = time.time_ns()
            wall = await self.actors[i].wall_ns.remote()
            samples.append((sent, wall, time.time_ns()))
        r.clock_offset_s, r.clock_error_s = cristian_offset(samples)

    def _meta(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario.to_dict(),
            "fingerprint": fingerprint(self.scenario.url, rtt_samples=0),  # the driver's
            "backend": "ray",
            "workers": [r.to_dict() for r in self.reports],
        }

    # -- running --
    def request_stop(self) -> None:
        """Stop issuing on every worker; in-flight requests finish; ``wait()`` returns."""
        self._stop_requested = True
        for a in self.actors:
            a.stop.remote()

    async def wait(self) -> DistributedResult:
        """Collect every worker's rows until all have finished or died; the merged result."""
        if self.set is None:
            raise UsageError("call start() first")
        # not closed on cancellation: a second wait() after request_stop() adds the rest
        outs = await asyncio.gather(*(self._collect(i) for i in range(len(self.actors))))
        result = self._result([o for o in outs if o is not None])
        self.set.close()
        self._release()
        return result

    def _release(self) -> None:
        """End the actors now rather than when their handles are collected: their CPUs are
        reserved until then, and the next run may need them."""
        ray = _import_ray()
        for a in self.actors:
            ray.kill(a)

    async def _collect(self, i: int) -> dict[str, Any] | None:
        """Fetch worker i's batches until its run ends; its run report (None if it died)."""
        ray = _import_ray()
        actor, report = self.actors[i], self.reports[i]
        try:
            done = False
            while not done:
                text, done = await actor.batch.remote(self.batch_interval)
                self._add(text, report)
            out: dict[str, Any] = await self._runs[i]
        except ray.exceptions.RayError as exc:  # keep what arrived, say what is missing
            # RayActorError: the process is gone; RayTaskError: the run raised
            dead = isinstance(exc, ray.exceptions.RayActorError)
            report.status = "died" if dead else "failed"
            report.error = f"{type(exc).__name__}: {_first_line(exc)}"
            report.lost = max(0, round((report.expected or report.rows) - report.rows))
            return None
        report.status = "stopped" if self._stop_requested else "finished"
        report.client = out["result"]["client"]
        report.start_late_s = max(0.0, out["late_at_start_ns"] / 1e9)
        return out

    def _add(self, text: str, report: WorkerReport) -> None:
        assert self.set is not None
        for line in text.splitlines():
            obj = json.loads(line)
            self.set.add(Waterfall.from_dict(obj["wf"]), Tags.from_dict(obj["tags"]))
            report.rows += 1

    # -- the merged result --
    def _result(self, outs: list[dict[str, Any]]) -> DistributedResult:
        assert self.set is not None
        ws, sc = self.set, self.scenario
        res = DistributedResult(
            set=ws,
            scenario=sc,
            issued=sum(r.rows for r in self.reports),
            client=_worst_client(outs),
            wall_s=time.perf_counter() - self._t_start,
            workers=self.reports,
            lost=sum(r.lost for r in self.reports),
            start_epoch_ns=self.start_epoch_ns,
            interrupted=self._stop_requested,
        )
        _rates(res)
        res.notes.extend(_worker_notes(self.reports))
        note = rtt_note(self.reports)
        if note:
            res.notes.append(note)
        if self._stop_requested:
            res.notes.append(f"stopped on request after {res.wall_s:.1f} s: {len(ws)} kept")
        # the header's meta["workers"] is who they were at the start; this is how they ended
        ws.note("worker_reports", {"workers": [r.to_dict() for r in self.reports]})
        ws.note("result", res.to_dict())
        return res


def _worst_client(outs: list[dict[str, Any]]) -> ClientHealth:
    """The most loaded worker's self-check (the one that decides whether a client saturated)."""
    if not outs:
        return ClientHealth({"p50_s": 0.0, "p99_s": 0.0, "max_s": 0.0}, None, 0.0, 0)
    c = max((o["result"]["client"] for o in outs), key=lambda c: c["loop_lag"]["p99_s"])
    return ClientHealth(c["loop_lag"], c["pacer_lag"], c["cpu_cores"], c["peak_rss_bytes"])


def _rates(res: DistributedResult) -> None:
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
    end = start + ws.column("e2e_ns")
    res.offered_rps = len(ws) / window
    res.completed_in_window_rps = float(np.count_nonzero(end <= start.max())) / window
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""


# -- Ray itself ----------------------------------------------------------------------------
def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("the ray backend needs Ray: pip install 'latency-analyzer[ray]'") from None
    return ray


def _init_ray(ray: Any, address: str | None, workers: int) -> None:
    """Connect to ``address``, or start a local Ray bound to loopback when it is None."""
    if address is not None:
        ray.init(address=address, log_to_driver=False)
        return
    ray.init(
        num_cpus=max(1, workers),
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )


# -- entry points --------------------------------------------------------------------------
async def run_ray(scenario: Scenario, *, workers: int, **options: Any) -> DistributedResult:
    """Run ``scenario`` over ``workers`` Ray actors; ``options`` are :class:`RayRun`'s.

    Cancelled (Ctrl-C under ``asyncio.run``), it stops the workers, collects what they
    recorded into ``path`` and re-raises.

    Raises:
        UsageError: ray is missing or the scenario cannot be split.
    """
    rr = RayRun(scenario, workers=workers, **options)
    await rr.start()
    try:
        result = await rr.wait()
    except asyncio.CancelledError:
        rr.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.shield(rr.wait())
        raise
    finally:
        if rr.set is not None:
            rr.set.close()
    return result


def run_ray_sync(scenario: Scenario, *, workers: int, **options: Any) -> DistributedResult:
    """:func:`run_ray` from synchronous code. The first Ctrl-C stops the run cleanly (in-flight
    requests finish, everything recorded is kept and returned); a second one aborts."""

    async def main() -> DistributedResult:
        rr = RayRun(scenario, workers=workers, **options)
        await rr.start()
        task = asyncio.ensure_future(rr.wait())
        loop = asyncio.get_running_loop()

        def on_sigint() -> None:
            if rr._stop_requested:
                task.cancel()
            else:
                rr.request_stop()

        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(signal.SIGINT, on_sigint)
        try:
            return await task
        except asyncio.CancelledError:  # the second Ctrl-C
            raise KeyboardInterrupt from None
        finally:
            if rr.set is not None:
                rr.set.close()
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)

    return asyncio.run(main())
