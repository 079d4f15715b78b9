"""Shared fixtures: the test CA, loopback servers, and the exact-attribution check."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from latency_analyzer import Waterfall
from latency_analyzer.testing import TestCA
from latency_analyzer.testing._priority import realtime as go_realtime


def assert_exact(wf: Waterfall) -> None:
    """Every waterfall in every test: the attribution adds up to e2e, to the nanosecond."""
    assert sum(wf.attribution_ns().values()) == wf.e2e_ns
    assert math.isclose(math.fsum(wf.attribution().values()), wf.e2e, abs_tol=1e-9)


def tolerance(expected_s: float) -> float:
    """The acceptance tolerance for a recovered injected delay: max(0.5 ms, 3%)."""
    return max(0.0005, 0.03 * expected_s)


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
    """
    before = os.sched_getscheduler(0), os.sched_getparam(0)
    go_realtime()
    try:
        yield
    finally:
        os.sched_setscheduler(0, before[0], before[1])
