"""pytest plugin: latency budgets per stage as a marker, requests recorded through a fixture.

::

    @pytest.mark.latency_budget(ttft_p95="300ms", tls="20ms", e2e_max=1.5)
    def test_chat_is_fast(latency):
        for _ in range(20):
            latency.probe(URL, json=BODY)

A test that passes but breaks a budget fails with every broken budget (measured vs budget,
``n``), the percentile table and the waterfall of the worst request. Installing the package
enables the plugin (``pytest11`` entry point ``latency_analyzer``; ``-p no:latency_analyzer``
turns it off). Options: ``--latency-budget-scale``, ``--latency-report``,
``--latency-no-fail``; ini: ``latency_budgets`` (defaults, overridden by the marker).

Hooks stay thin: each hands over to the ``BudgetSession`` in ``config.stash``.
"""

from __future__ import annotations

import argparse
import pathlib
import typing

import pytest

from .. import _budget_keys, errors
from . import _budgets, _output, _session
from ._session import BudgetSession
from ._stats import percentile

if typing.TYPE_CHECKING:
    from collections.abc import Generator
    from typing import Any

    from ._fixture import LatencyFixture, RecordingClient

__all__ = ["BudgetSession", "LatencyFixture", "RecordingClient", "latency", "percentile"]


def __getattr__(name: str) -> object:
    """``LatencyFixture`` and ``RecordingClient`` load the HTTP client: only on first use."""
    if name in ("LatencyFixture", "RecordingClient"):
        from . import _fixture

        return getattr(_fixture, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_SESSION = pytest.StashKey[BudgetSession]()


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text!r}")
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("latency", "latency budgets (latency_analyzer)")
    group.addoption(
        "--latency-budget-scale",
        metavar="FACTOR",
        type=_positive_float,
        default=1.0,
        help="Multiply every latency budget by FACTOR (1.5 loosens them by half, for noisy CI). "
        "Default: %(default)r",
    )
    group.addoption(
        "--latency-report",
        metavar="PATH",
        type=str,
        default=None,
        help="Write every waterfall recorded through the `latency` fixture to PATH (JSONL, one "
        "per line with its test id) and the budget results to PATH.summary.json. Under xdist "
        "each worker writes PATH with its id inserted and the controller merges them. "
        "Default: %(default)r",
    )
    group.addoption(
        "--latency-no-fail",
        action="store_true",
        default=False,
        help="Check and report latency budgets, but do not fail the tests that break them. "
        "Default: %(default)r",
    )
    parser.addini(
        "latency_budgets",
        type="linelist",
        default=[],
        help="Default latency budgets for every test that records waterfalls, as key=value "
        "items (e.g. tls=20ms ttft_p95=300ms); @pytest.mark.latency_budget overrides them.",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{_session.MARKER}(**budgets, allow_errors=False): fail a passing test whose requests, "
        "recorded through the `latency` fixture, break a budget, e.g. ttft_p95='300ms', "
        "tls='20ms'. " + _budget_keys.valid_keys_text(),
    )
    try:
        defaults = _budgets.parse_budget_lines(config.getini("latency_budgets"))
    except errors.UsageError as exc:
        raise pytest.UsageError(f"latency_budgets (ini): {exc}") from None
    report = config.getoption("latency_report")
    config.stash[_SESSION] = BudgetSession(
        defaults=defaults,
        scale=config.getoption("latency_budget_scale"),
        report=None if report is None else config.invocation_params.dir / pathlib.Path(report),
        no_fail=config.getoption("latency_no_fail"),
        worker=_session.worker_id(config),
    )


def _budgets_of(config: pytest.Config) -> BudgetSession:
    return config.stash[_SESSION]


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, Any]:
    report: pytest.CollectReport = yield
    if report.passed:  # a bad budget fails its file's collection, like an unknown marker
        error = _budgets_of(collector.config).check_collected(report.result)
        if error is not None:
            report.outcome = "failed"
            report.longrepr = error
            report.result = []
    return report


@pytest.fixture
def latency(request: pytest.FixtureRequest) -> LatencyFixture:
    """Record requests for the test's latency budgets: ``latency.probe(url, ...)``,
    ``await latency.aprobe(...)``, ``async with latency.client(base_url) as c``,
    ``latency.record(wf)``, ``latency.run(scenario)`` (with the load runner)."""
    item = request.node
    if not isinstance(item, pytest.Item):
        raise errors.UsageError("the latency fixture is function-scoped: use it in a test")
    return _budgets_of(request.config).fixture_for(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if call.when == "call":
        _budgets_of(item.config).check(item, report)
    elif call.when == "teardown":
        _budgets_of(item.config).finish_item(item)
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    budgets = _budgets_of(session.config)
    budgets.finish()
    workeroutput = getattr(session.config, "workeroutput", None)
    if isinstance(workeroutput, dict):  # an xdist worker: hand results to the controller
        workeroutput["latency_analyzer"] = budgets.worker_output()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: a worker finished; take its budget results and report part."""
    data = getattr(node, "workeroutput", {}).get("latency_analyzer")
    if data:
        _budgets_of(node.config).add_worker_output(data)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    budgets = _budgets_of(config)
    if budgets.results:
        scale = "" if budgets.scale == 1 else f" (limits × {budgets.scale:g})"
        terminalreporter.write_sep("=", f"latency budgets{scale}")
        for line in _output.table_lines(budgets.results):
            terminalreporter.write_line(line)
    if budgets.report is not None:
        terminalreporter.write_line(
            f"latency report: {budgets.report} ({budgets.waterfalls_written} waterfalls), "
            f"summary in {budgets.report.name}.summary.json"
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    budgets = config.stash.get(_SESSION, None)
    if budgets is not None:
        budgets.close()
