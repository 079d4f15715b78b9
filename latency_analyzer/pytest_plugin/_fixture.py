"""The ``latency`` fixture object: every request a test makes through it is recorded."""

from __future__ import annotations

import contextlib
import importlib
import json
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from ..capture.client import Client, aprobe, probe
from ..errors import UsageError
from ..timeline import Waterfall
from ._budgets import Budget

__all__ = ["LatencyFixture", "RecordingClient", "waterfalls_in_set_file"]

_LOAD_MODULE = "latency_analyzer.load"


class RecordingClient(Client):
    """A ``latency_analyzer.Client`` whose every request is recorded by the fixture."""

    def __init__(self, sink: Callable[[Waterfall], Waterfall], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sink = sink

    async def request(self, *args: Any, **kwargs: Any) -> Waterfall:
        """``Client.request``, and the waterfall is recorded for the test's budgets."""
        return self._sink(await super().request(*args, **kwargs))


class LatencyFixture:
    """What the ``latency`` fixture gives a test: measuring calls that record their waterfalls.

    After the test body, the plugin checks every recorded waterfall against the test's budgets
    (``@pytest.mark.latency_budget(...)`` over the ``latency_budgets`` ini defaults).

    Attributes:
        nodeid: the test's node id.
        budgets: the test's budgets in seconds (scaled by ``--latency-budget-scale``), by key.
    """

    def __init__(self, nodeid: str, budgets: Mapping[str, Budget], scale: float = 1.0) -> None:
        self.nodeid = nodeid
        self.budgets = {key: b.limit_ns * scale / 1e9 for key, b in budgets.items()}
        self._waterfalls: list[Waterfall] = []
        self._lock = threading.Lock()  # probe() may run in worker threads

    @property
    def waterfalls(self) -> tuple[Waterfall, ...]:
        """Every waterfall recorded so far, in recording order."""
        with self._lock:
            return tuple(self._waterfalls)

    def record(self, wf: Waterfall) -> Waterfall:
        """Record a waterfall measured elsewhere (``la.probe``, a load run, ``from_dict``).

        Returns:
            ``wf`` itself.

        Raises:
            UsageError: ``wf`` is not a ``Waterfall``.
        """
        if not isinstance(wf, Waterfall):
            raise UsageError(f"latency.record() takes a Waterfall, got {type(wf).__name__}")
        with self._lock:
            self._waterfalls.append(wf)
        return wf

    def probe(self, url: str, **kwargs: Any) -> Waterfall:
        """``latency_analyzer.probe`` (one request, fresh connection), recorded."""
        return self.record(probe(url, **kwargs))

    async def aprobe(self, url: str, **kwargs: Any) -> Waterfall:
        """``await latency_analyzer.aprobe(...)``, recorded."""
        return self.record(await aprobe(url, **kwargs))

    def client(self, base_url: str | None = None, **kwargs: Any) -> RecordingClient:
        """A ``latency_analyzer.Client`` (``async with``) whose requests are all recorded."""
        return RecordingClient(self.record, base_url, **kwargs)

    def run(self, scenario: Any, **kwargs: Any) -> Any:
        """``latency_analyzer.load.run_sync(scenario, **kwargs)``, every request recorded.

        Warm-up requests (``Scenario.warmup_requests`` / ``warmup_seconds``) are not recorded:
        the load runner marks them as outside its statistics, and so are they outside budgets.

        Returns:
            The runner's result (``RunResult``).

        Raises:
            UsageError: the load runner (``latency_analyzer.load``) is not installed.
        """
        runner = _load_runner("run_sync", "run")
        with _set_file(kwargs) as path:
            result = runner(scenario, path=path, **kwargs)
            self._record_set_file(path)
        return result

    async def arun(self, scenario: Any, **kwargs: Any) -> Any:
        """``await latency_analyzer.load.run(scenario, **kwargs)``, every request recorded.

        Raises:
            UsageError: the load runner (``latency_analyzer.load``) is not installed.
        """
        runner = _load_runner("run", "arun")
        with _set_file(kwargs) as path:
            result = await runner(scenario, path=path, **kwargs)
            self._record_set_file(path)
        return result

    def _record_set_file(self, path: Path) -> None:
        for wf in waterfalls_in_set_file(path):
            self.record(wf)

    def __repr__(self) -> str:
        return f"<LatencyFixture {self.nodeid} waterfalls={len(self._waterfalls)}>"


def _no_runner(name: str, method: str) -> UsageError:
    return UsageError(
        f"latency.{method}() needs the load runner ({_LOAD_MODULE}.{name}), which this "
        "installation does not have; record requests with latency.probe(), "
        "latency.aprobe() or latency.client() instead"
    )


def _load_runner(name: str, method: str) -> Callable[..., Any]:
    """``latency_analyzer.load.<name>``, imported on first use (numpy and friends)."""
    try:
        module: ModuleType | None = importlib.import_module(_LOAD_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != _LOAD_MODULE:
            raise  # the load runner exists but one of its own imports is missing
        module = None
    runner = getattr(module, name, None)
    if not callable(runner):  # absent, or a bare namespace package without the runner
        raise _no_runner(name, method) from None
    return runner  # type: ignore[no-any-return]  # reason: a module attribute is Any


@contextlib.contextmanager
def _set_file(kwargs: dict[str, Any]) -> Iterator[Path]:
    """The run's JSONL file: the caller's ``path=`` (kept), or a temporary one (removed)."""
    given = kwargs.pop("path", None)
    if given is not None:
        yield Path(given)
        return
    with tempfile.TemporaryDirectory(prefix="latency-run-") as tmp:
        yield Path(tmp) / "run.jsonl"


def waterfalls_in_set_file(path: Path) -> Iterator[Waterfall]:
    """The measured (not warm-up) waterfalls of a load run's JSONL file, in file order.

    The file is the load runner's ``WaterfallSet`` stream: ``{"kind": "wf", "tags": {...,
    "warmup": bool}, "wf": <Waterfall.to_dict()>}`` lines between run and note lines.
    """
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            obj = json.loads(line)
            if obj.get("kind") == "wf" and not obj.get("tags", {}).get("warmup", False):
                yield Waterfall.from_dict(obj["wf"])
