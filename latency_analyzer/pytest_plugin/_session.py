"""``BudgetSession``: the plugin's state and logic; the pytest hooks only hand over to it.

One session lives in ``config.stash``. Per test it keeps the parsed budgets (``item.stash``,
set at collection, only for marked tests) and the fixture object (``item.stash``, only for
tests that use ``latency``): a test with neither costs two failed stash look-ups.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pytest

from ..errors import UsageError
from ._budgets import Budget, BudgetSpec, merge_specs, parse_marker_kwargs
from ._check import evaluate
from ._output import failure_text, no_waterfalls_text, result_dict

if TYPE_CHECKING:  # the fixture pulls in the HTTP client (aiohttp): only tests that use it pay
    from ._fixture import LatencyFixture

__all__ = [
    "FIXTURE_KEY",
    "MARKER",
    "SPEC_KEY",
    "SUMMARY_SCHEMA",
    "BudgetSession",
    "worker_path",
]

MARKER = "latency_budget"
SUMMARY_SCHEMA = 1
SPEC_KEY = pytest.StashKey[BudgetSpec]()
FIXTURE_KEY = pytest.StashKey["LatencyFixture"]()


def worker_path(path: Path, worker: str) -> Path:
    """``report.jsonl`` -> ``report.gw0.jsonl``: one file per xdist worker, merged later."""
    return path.with_name(f"{path.stem}.{worker}{path.suffix}")


def _summary_path(path: Path) -> Path:
    return path.with_name(path.name + ".summary.json")


def _utc_now() -> str:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass
class BudgetSession:
    """Budgets of a pytest run: parse at collection, check after each test, report at the end.

    Attributes:
        defaults: budgets from the ``latency_budgets`` ini option.
        scale: ``--latency-budget-scale``.
        report: ``--latency-report`` (absolute), or None.
        no_fail: ``--latency-no-fail``: check and report, never fail a test.
        worker: the xdist worker id (``gw0``) in a worker, else None.
        results: one ``result_dict`` per checked test (on the controller: every worker's too).
    """

    defaults: Mapping[str, Budget]
    scale: float = 1.0
    report: Path | None = None
    no_fail: bool = False
    worker: str | None = None
    results: list[dict[str, Any]] = field(default_factory=list)
    waterfalls_written: int = 0
    _parts: list[str] = field(default_factory=list)
    _file: IO[str] | None = None

    # -- collection ------------------------------------------------------------------------------
    def spec_for(self, item: pytest.Item) -> BudgetSpec | None:
        """Parse the item's ``latency_budget`` markers into ``item.stash`` (None: unmarked).

        Raises:
            UsageError: a marker with an unknown key, a bad duration or positional arguments.
        """
        markers = list(item.iter_markers(MARKER))  # closest first
        if not markers:
            return None
        try:
            parsed = [parse_marker_kwargs(m.args, m.kwargs) for m in reversed(markers)]
        except UsageError as exc:
            raise UsageError(f"{item.nodeid}: @pytest.mark.{MARKER}: {exc}") from None
        spec = item.stash[SPEC_KEY] = merge_specs(self.defaults, parsed)
        return spec

    def check_collected(self, collected: Iterable[pytest.Item | pytest.Collector]) -> str | None:
        """Parse the markers of every collected item; the error text, or None if all are fine."""
        errors = []
        for node in collected:
            if isinstance(node, pytest.Item):
                try:
                    self.spec_for(node)
                except UsageError as exc:
                    errors.append(str(exc))
        return "\n".join(errors) or None

    # -- one test ---------------------------------------------------------------------------------
    def fixture_for(self, item: pytest.Item) -> LatencyFixture:
        """Create the ``latency`` fixture object of ``item`` and remember it."""
        from ._fixture import LatencyFixture

        spec = item.stash.get(SPEC_KEY, None) or self.spec_for(item)  # late markers too
        budgets = spec.budgets if spec is not None else self.defaults
        fixture = item.stash[FIXTURE_KEY] = LatencyFixture(item.nodeid, budgets, self.scale)
        return fixture

    def check(self, item: pytest.Item, report: pytest.TestReport) -> None:
        """After a passed call: fail ``report`` when the test broke a budget."""
        spec = item.stash.get(SPEC_KEY, None)
        fixture = item.stash.get(FIXTURE_KEY, None)
        if spec is None and fixture is None:
            return  # neither marked nor measured: nothing to do
        if not report.passed or hasattr(report, "wasxfail"):
            return  # only a passing test can break its budget
        failure = self._failure(item.nodeid, spec, fixture)
        if failure is not None and not self.no_fail:
            report.outcome = "failed"
            report.longrepr = failure
        elif failure is not None:
            report.sections.append(("latency budget (not enforced)", failure))

    def _failure(
        self, nodeid: str, spec: BudgetSpec | None, fixture: LatencyFixture | None
    ) -> str | None:
        waterfalls = fixture.waterfalls if fixture is not None else ()
        if spec is None:
            if not waterfalls or not self.defaults:
                return None  # measured without any budget: nothing to check
            spec = BudgetSpec(self.defaults)
        elif not waterfalls:
            self.results.append(_empty_result(nodeid, spec))
            return no_waterfalls_text(nodeid, [f"{k}={_fmt(b)}" for k, b in spec.budgets.items()])
        ev = evaluate(nodeid, spec, waterfalls, self.scale)
        self.results.append(result_dict(ev))
        return None if ev.passed else failure_text(ev)

    def finish_item(self, item: pytest.Item) -> None:
        """After teardown: write the item's waterfalls to the report, then let them go."""
        fixture = item.stash.get(FIXTURE_KEY, None)
        if fixture is None:
            return
        del item.stash[FIXTURE_KEY]
        if self.report is None:
            return
        out = self._open()
        for index, wf in enumerate(fixture.waterfalls):
            out.write(json.dumps({"test": item.nodeid, "index": index, **wf.to_dict()}) + "\n")
            self.waterfalls_written += 1

    # -- files -----------------------------------------------------------------------------------
    @property
    def own_report(self) -> Path | None:
        """Where this process writes: the report, or a worker's part of it."""
        if self.report is None or self.worker is None:
            return self.report
        return worker_path(self.report, self.worker)

    def _open(self) -> IO[str]:
        if self._file is None:
            path = self.own_report
            assert path is not None
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("w", encoding="utf-8")
        return self._file

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def finish(self) -> None:
        """At session end: close the report, merge workers' parts, write the summary."""
        if self.report is None:
            return
        self._open()  # an empty report still says "nothing recorded"
        self.close()
        if self._parts:
            self._merge_parts()
        path = self.own_report
        assert path is not None
        _summary_path(path).write_text(json.dumps(self.summary(path), indent=2) + "\n")

    def summary(self, path: Path) -> dict[str, Any]:
        """The ``PATH.summary.json`` object (versioned; pinned by the plugin's tests)."""
        from .. import __version__

        return {
            "schema": SUMMARY_SCHEMA,
            "generator": "latency_analyzer.pytest_plugin",
            "version": __version__,
            "created_utc": _utc_now(),
            "report": str(path),
            "budget_scale": self.scale,
            "enforced": not self.no_fail,
            "waterfalls": self.waterfalls_written,
            "tests_checked": len(self.results),
            "tests_failed": sum(not r["passed"] for r in self.results),
            "results": self.results,
        }

    # -- xdist -----------------------------------------------------------------------------------
    def worker_output(self) -> dict[str, Any]:
        """What a worker sends to the controller when it finishes (plain JSON types)."""
        own = self.own_report
        return {
            "results": self.results,
            "waterfalls": self.waterfalls_written,
            "part": None if own is None else str(own),
        }

    def add_worker_output(self, data: Mapping[str, Any]) -> None:
        """Controller: take a finished worker's results and remember its report part."""
        self.results.extend(data.get("results", ()))
        self.waterfalls_written += int(data.get("waterfalls", 0))
        if data.get("part"):
            self._parts.append(str(data["part"]))

    def _merge_parts(self) -> None:
        assert self.report is not None
        with self.report.open("a", encoding="utf-8") as merged:
            for part in sorted(self._parts):
                part_path = Path(part)
                if part_path.exists():
                    merged.write(part_path.read_text(encoding="utf-8"))
                    part_path.unlink()
                _summary_path(part_path).unlink(missing_ok=True)
        self._parts.clear()


def _fmt(budget: Budget) -> str:
    from .._units import format_ns

    return format_ns(budget.limit_ns)


def _empty_result(nodeid: str, spec: BudgetSpec) -> dict[str, Any]:
    return {
        "test": nodeid,
        "passed": False,
        "requests": 0,
        "failed_requests": 0,
        "allow_errors": bool(spec.allow_errors),
        "budgets": [],
    }


def worker_id(config: pytest.Config) -> str | None:
    """The xdist worker id of this process (``gw0``), or None in a plain run / the controller."""
    workerinput = getattr(config, "workerinput", None)
    if isinstance(workerinput, dict) and "workerid" in workerinput:
        return str(workerinput["workerid"])
    return os.environ.get("PYTEST_XDIST_WORKER") or None
