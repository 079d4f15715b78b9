"""Shared fixtures and helpers: the test CA, the LLM test servers and the request bodies they
read, and the exact-attribution check."""

from __future__ import annotations

import contextlib
import gc
import math
import os
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from latency_analyzer import Waterfall
from latency_analyzer.capture._wire import StampedSocket
from latency_analyzer.testing import LLMServer, SubprocessLLMServer, TestCA
from latency_analyzer.testing._priority import realtime as go_realtime

_COLLECT_EVERY = 20  # tests between collections of what the suite's own process holds
_tests_since_collect = 0


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Every 20 tests, collect and freeze what this long-lived process holds, before the
    test's fixtures start. Unfrozen, its full (generation 2) collections took 230-370 ms
    each, 104 of them over 20 ms in half a suite run (a ``gc.callbacks`` timer): a pause of
    any test that serves and measures on its own loop, which timed out a scrape of a test
    server that answers at once."""
    global _tests_since_collect
    _tests_since_collect += 1
    if _tests_since_collect >= _COLLECT_EVERY:
        _tests_since_collect = 0
        gc.collect()
        gc.freeze()


def assert_exact(wf: Waterfall) -> None:
    """Every waterfall in every test: the attribution adds up to e2e, to the nanosecond."""
    assert sum(wf.attribution_ns().values()) == wf.e2e_ns
    assert math.isclose(math.fsum(wf.attribution().values()), wf.e2e, abs_tol=1e-9)


def open_sockets() -> set[str]:
    """This process's open sockets (``/proc/self/fd`` links to ``socket:[inode]``).

    The capture layer keeps one socket open for the life of the process (it holds the kernel's
    receive timestamps on) from the first stamped socket on: it is opened here first, so a
    test that compares two readings never counts it as its own.
    """
    StampedSocket(socket.AF_INET, socket.SOCK_STREAM).close()
    fds = "/proc/self/fd"
    links = []
    for fd in os.listdir(fds):
        with contextlib.suppress(FileNotFoundError):  # the listing's own fd, closed by now
            links.append(os.readlink(f"{fds}/{fd}"))
    return {link for link in links if link.startswith("socket:")}


def tolerance(expected_s: float) -> float:
    """The acceptance tolerance for a recovered injected delay: max(0.5 ms, 3%)."""
    return max(0.0005, 0.03 * expected_s)


def chat_body(
    *, stream: bool = True, include_usage: bool = True, content: str = "hi", **testbed: object
) -> dict[str, Any]:
    """A chat-completions request for the test servers.

    Args:
        stream: ask for a streamed response.
        include_usage: ask for the closing usage chunk (``stream_options.include_usage``).
        content: the user's message (the server counts its words as prompt tokens).
        testbed: this request's overrides of the server's behaviour (``prefill=0.05``,
            ``fault="reset"``, ...), sent as the body's ``testbed`` object.
    """
    body: dict[str, Any] = {
        "model": "m",
        "stream": stream,
        "messages": [{"role": "user", "content": content}],
    }
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    if testbed:
        body["testbed"] = dict(testbed)
    return body


def _knobs(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The test module's ``LLM_KNOBS``: keyword arguments of its ``LLMServer``."""
    return dict(getattr(request.module, "LLM_KNOBS", {}))


@pytest.fixture(scope="module")
def llm(request: pytest.FixtureRequest) -> Iterator[SubprocessLLMServer]:
    """The module's LLM test server in its own process, so nothing this process does can make
    it late; configured by the module's ``LLM_KNOBS``."""
    with LLMServer(**_knobs(request)).run_in_subprocess() as server:
        yield server


@pytest.fixture
async def llm_in_process(request: pytest.FixtureRequest) -> AsyncIterator[LLMServer]:
    """A fresh LLM test server on this test's event loop (its connection count and records are
    this test's alone); configured by the module's ``LLM_KNOBS``."""
    async with LLMServer(**_knobs(request)) as server:
        yield server


@pytest.fixture(scope="session")
def ca() -> TestCA:
    return TestCA()


@pytest.fixture(scope="session")
def server_pem(ca: TestCA, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield ca.server_pem_path(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def realtime() -> Iterator[None]:
    """This test's process at real-time priority while the test runs (where the OS allows).

    For the test bed's own precision tests, whose server and measuring client share this
    process: ordinary processes elsewhere on a busy host then cannot delay either of them.
    Refused (not root), the test runs at normal priority.

    What the suite's earlier tests left in this process is collected and frozen first, as the
    hook above does every 20 tests: a priority keeps other processes off the CPU, not this
    one's own collector, whose full collection over up to 19 tests' objects can stop the
    server mid-stream for tens of ms. (One burner run had token writes 18-26 ms late with no
    steal at real-time priority: a stall of this process's own.)
    """
    gc.collect()
    gc.freeze()
    before = os.sched_getscheduler(0), os.sched_getparam(0)
    go_realtime()
    try:
        yield
    finally:
        os.sched_setscheduler(0, before[0], before[1])
