"""Shared fixtures: the test CA, loopback servers, and the exact-attribution check."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from latency_analyzer import Waterfall
from latency_analyzer.testing import TestCA


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
