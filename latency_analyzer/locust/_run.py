"""What a Locust process does with each waterfall: Locust's events, our run file, the master.

One :class:`LocustRun` per Locust process, made at Locust's ``init`` event:

* **local** (plain ``locust``): fires Locust's ``request`` events, keeps every waterfall in a
  ``WaterfallSet`` streamed to ``--la-out``, serves the web UI page.
* **worker**: fires the events and buffers each row as a JSON line; the rows ride on the
  worker's own stats report (``report_to_master``), so the master receives a worker's rows in
  the same message as the counts Locust made of them: counted and written cannot drift apart.
* **master**: adds the workers' rows to one set (``--la-out``), each tagged with its worker's
  index, and records each worker's identity and wall-clock offset (Cristian's bracket over
  Locust's own message channel, ± half the round trip, as ``load/distributed`` does).
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import gevent
from gevent.event import AsyncResult

from ..analysis import Tags, WaterfallSet, fingerprint
from ..capture.client import redact_url
from ..load.distributed._results import WorkerReport, cristian_offset
from ..timeline import CLIENT_STAGES, RESIDUALS, SERVER_STAGES, Waterfall
from ._bridge import EngineProcess

__all__ = [
    "DEFAULT_STAGES",
    "METRIC_TYPES",
    "LocustRun",
    "WaterfallFailed",
    "parse_stages",
]

log = logging.getLogger(__name__)

#: Rows added to Locust's statistics for each ok request, by default.
DEFAULT_STAGES = ("dns", "connect", "tls", "wait", "ttft", "tpot")
#: Locust ``request_type`` of each added row; every other stage is a ``STAGE`` row.
METRIC_TYPES = {"ttft": "TTFT", "tpot": "TPOT"}
STAGE_TYPE = "STAGE"
_KNOWN = frozenset({*METRIC_TYPES, *CLIENT_STAGES, *SERVER_STAGES, *RESIDUALS})
_CLOCK_PROBES = 5
_SLOWEST = 5
_OPTIONS = (  # Locust options stored as the run's scenario (no custom ones: they may be keys)
    *("num_users", "spawn_rate", "run_time", "tags", "exclude_tags", "user_classes"),
    *("expect_workers", "stop_timeout", "headless", "la_stages"),
)


class WaterfallFailed(Exception):
    """The ``exception`` of a failed request's event: ``"<error_type>: <error>"``."""


def parse_stages(text: str) -> tuple[str, ...]:
    """``"dns,connect,ttft"`` → names, each a metric (ttft, tpot) or a stage of our vocabulary.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in _KNOWN]
    if bad:
        raise ValueError(f"unknown stage(s) {bad}; expected names from {sorted(_KNOWN)}")
    return names


def _role(runner: Any) -> str:
    from locust.runners import MasterRunner, WorkerRunner

    if isinstance(runner, MasterRunner):
        return "master"
    return "worker" if isinstance(runner, WorkerRunner) else "local"


class LocustRun:
    """The plugin's state in one Locust process (see the module docstring).

    Args:
        environment: Locust's environment (its runner exists).
        out: the run file (local and master); None keeps the set in memory.
        stages: the rows added per ok request (``parse_stages``).
        drain_s: at the test's stop, how long to wait for requests still in flight.
    """

    def __init__(
        self,
        environment: Any,
        *,
        out: str | None,
        stages: Sequence[str] = DEFAULT_STAGES,
        drain_s: float = 10.0,
    ) -> None:
        self.env = environment
        self.role = _role(environment.runner)
        self.out, self.stages, self.drain_s = out, tuple(stages), drain_s
        self.set: WaterfallSet | None = None
        self.engine: EngineProcess | None = None
        self.lines: list[str] = []  # a worker's rows not yet reported
        self.recorded = 0  # rows this process recorded (fired and stored or buffered)
        self.identity: dict[str, Any] | None = None
        self.workers: dict[str, WorkerReport] = {}
        self._probes: dict[tuple[str, int], AsyncResult] = {}
        self._slowest: list[tuple[int, int, Waterfall]] = []
        self._seq = itertools.count()

    # -- the engine (local and worker) --
    def engine_for_users(self) -> EngineProcess:
        """The process's capture engine, started on first use."""
        if self.engine is None:
            self.engine = EngineProcess(self.record, self._engine_died)
            self.engine.start()
        return self.engine

    def _engine_died(self, why: str) -> None:
        """No engine, no measurement: stop the test (exit status 1) rather than run blind.
        What was recorded is kept, and Locust counted exactly that."""
        log.error("%s: stopping the test", why)
        self.env.process_exit_code = 1
        gevent.spawn(self.env.runner.quit)

    # -- one waterfall --
    def record(self, meta: Mapping[str, Any], wf: Waterfall) -> None:
        """Fire Locust's events for ``wf`` and keep it (called once per waterfall)."""
        name = str(meta["name"])
        fire = self.env.events.request.fire
        context = meta.get("context") or {}
        error = None if wf.ok else WaterfallFailed(f"{wf.error_type}: {wf.error}")
        fire(
            request_type=meta.get("request_type") or wf.method,
            name=name,
            response_time=wf.e2e_ns / 1e6,
            response_length=wf.output_tokens or 0,
            response=wf,
            context=context,
            exception=error,
        )
        if wf.ok:
            for kind, row, ms in self._stage_rows(wf, name):
                fire(
                    request_type=kind,
                    name=row,
                    response_time=ms,
                    response_length=0,
                    response=wf,
                    context=context,
                    exception=None,
                )
        tags = Tags(
            scenario=self._scenario_name(),
            template=name,
            prompt_tokens=int(meta.get("prompt_tokens", -1)),
            worker=self._worker_index(),
        )
        self.recorded += 1
        if self.role == "worker":
            line = {"kind": "wf", "tags": tags.to_dict(), "wf": wf.to_dict()}
            self.lines.append(json.dumps(line, separators=(",", ":")))
            if self.identity is not None and not self.identity["anchor"] and wf.anchor:
                self.identity["anchor"] = asdict(wf.anchor)  # the engine's clock anchor
        else:
            self._store(wf, tags)

    def _stage_rows(self, wf: Waterfall, name: str) -> list[tuple[str, str, float]]:
        attribution = wf.attribution_ns()
        rows = []
        for stage in self.stages:
            if stage in METRIC_TYPES:
                ns = wf.ttft_ns if stage == "ttft" else _tpot_ns(wf)
            else:
                ns = attribution.get(stage)
            if ns is not None:
                rows.append((METRIC_TYPES.get(stage, STAGE_TYPE), f"{name} {stage}", ns / 1e6))
        return rows

    def _store(self, wf: Waterfall, tags: Tags) -> None:
        ws = self.open_set()
        ws.add(wf, tags)
        entry = (wf.e2e_ns, next(self._seq), wf)
        if len(self._slowest) < _SLOWEST:
            heapq.heappush(self._slowest, entry)
        elif entry[0] > self._slowest[0][0]:
            heapq.heapreplace(self._slowest, entry)

    def slowest(self) -> list[Waterfall]:
        """The slowest requests kept so far, slowest first."""
        return [wf for _, _, wf in sorted(self._slowest, reverse=True)]

    # -- the run file (local and master) --
    def open_set(self) -> WaterfallSet:
        if self.set is None:
            self.set = WaterfallSet(self.out, meta=self._meta())
        return self.set

    def _meta(self) -> dict[str, Any]:
        host = self.env.host or ""
        return {
            "scenario": self.scenario(),
            "fingerprint": fingerprint(host or None, rtt_samples=5 if host else 0),
            "backend": "locust",
            "locust_role": self.role,
        }

    def scenario(self) -> dict[str, Any]:
        """The locustfile (name and SHA-256) and the Locust options that shaped the load."""
        opts = self.env.parsed_options
        locustfile = str(getattr(opts, "locustfile", None) or self.env.locustfile or "")
        out: dict[str, Any] = {"name": self._scenario_name(), "locustfile": locustfile}
        path = Path(locustfile)
        if path.is_file():
            out["locustfile_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        out["host"] = redact_url(self.env.host) if self.env.host else None
        out["options"] = {k: _plain(getattr(opts, k, None)) for k in _OPTIONS}
        return out

    def _scenario_name(self) -> str:
        opts = self.env.parsed_options
        locustfile = str(getattr(opts, "locustfile", None) or self.env.locustfile or "locust")
        return Path(locustfile.split(",")[0]).stem

    def _worker_index(self) -> int:
        return int(getattr(self.env.runner, "worker_index", 0)) if self.role == "worker" else 0

    # -- the start and end of a test --
    def on_test_start(self) -> None:
        """Start the engine (local, worker), open the file (local, master), probe clocks."""
        if self.role != "master":
            self.engine_for_users()
        if self.role == "worker":
            if self.identity is None:
                self.identity = self._identity()
        else:
            self.open_set()
        if self.role == "master":
            self.probe_clocks()

    def on_test_stop(self) -> None:
        """Wait for requests still in flight, so Locust counts what our file keeps."""
        if self.engine is not None:
            left = self.engine.drain(self.drain_s)
            if left:
                log.error(
                    "%d requests still in flight after %.0f s: not counted", left, self.drain_s
                )
        if self.set is not None:
            self.set.flush()

    def on_quit(self) -> None:
        if self.engine is not None:
            self.engine.stop()
        if self.role != "worker" and getattr(self.env.parsed_options, "csv_prefix", None):
            # Locust rewrites its CSV once a second and not again at exit: give its writer
            # one more turn, so the CSV holds the requests counted since (the last ones)
            from locust.stats import CSV_STATS_INTERVAL_SEC

            gevent.sleep(CSV_STATS_INTERVAL_SEC * 1.5)
        if self.set is not None:
            if self.role == "master":
                reports = [r.to_dict() for r in self.workers.values()]
                self.set.note("worker_reports", {"workers": reports})
            self.set.note("result", {"stored": len(self.set), "recorded": self.recorded})
            self.set.close()

    # -- distributed mode: the worker's side --
    def _identity(self) -> dict[str, Any]:
        host = self.env.host or None
        return {
            "worker": self._worker_index(),
            "host": socket.gethostname(),
            "node_id": str(getattr(self.env.runner, "client_id", "?")),
            "pid": os.getpid(),
            "anchor": {},  # the engine's, from its first waterfall
            "fingerprint": fingerprint(host, rtt_samples=5 if host else 0),
        }

    def on_report_to_master(self, data: dict[str, Any]) -> None:
        """Put the rows recorded since the last report into this report (same message as
        Locust's counts of them)."""
        payload: dict[str, Any] = {"lines": "\n".join(self.lines), "rows": len(self.lines)}
        if self.identity is not None:
            payload["identity"] = self.identity
        self.lines = []
        data["latency_analyzer"] = payload

    def on_clock_probe(self, msg: Any) -> None:
        self.env.runner.send_message("la_clock_back", {"k": msg.data["k"], "wall": time.time_ns()})

    # -- distributed mode: the master's side --
    def on_worker_report(self, client_id: str, data: Mapping[str, Any]) -> None:
        payload = data.get("latency_analyzer")
        if not payload:
            return
        report = self._report(client_id)
        ident = payload.get("identity")
        if ident:
            for key in ("host", "node_id", "pid", "anchor", "fingerprint"):
                setattr(report, key, ident[key])
        for line in payload["lines"].splitlines():
            obj = json.loads(line)
            self._store(Waterfall.from_dict(obj["wf"]), Tags.from_dict(obj["tags"]))
            report.rows += 1
            self.recorded += 1

    def _report(self, client_id: str) -> WorkerReport:
        if client_id not in self.workers:
            index = self.env.runner.get_worker_index(client_id)
            self.workers[client_id] = WorkerReport(index, node_id=client_id, status="finished")
        return self.workers[client_id]

    def probe_clocks(self) -> None:
        """Estimate every connected worker's wall-clock offset (in the background)."""
        for client in list(self.env.runner.clients.all):
            gevent.spawn(self._probe, client.id)

    def _probe(self, client_id: str) -> None:
        samples = []
        for k in range(_CLOCK_PROBES):
            result: AsyncResult = AsyncResult()
            self._probes[(client_id, k)] = result
            sent = time.time_ns()
            self.env.runner.send_message("la_clock", {"k": k}, client_id=client_id)
            try:
                back, wall = result.get(timeout=2.0)
            except gevent.Timeout:
                continue
            finally:
                self._probes.pop((client_id, k), None)
            samples.append((sent, wall, back))
        if samples:
            report = self._report(client_id)
            report.clock_offset_s, report.clock_error_s = cristian_offset(samples)

    def on_clock_back(self, msg: Any) -> None:
        result = self._probes.get((msg.node_id, int(msg.data["k"])))
        if result is not None:
            result.set((time.time_ns(), int(msg.data["wall"])))


def _tpot_ns(wf: Waterfall) -> float | None:
    tpot = wf.tpot
    return None if tpot is None else tpot * 1e9


def _plain(value: Any) -> Any:
    """A JSON-ready copy of an option's value."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def exit_usage(message: str) -> None:
    """A bad option: say so on stderr and exit 2 (the CLI's convention)."""
    print(f"latency_analyzer.locust: {message}", file=sys.stderr)
    raise SystemExit(2)
