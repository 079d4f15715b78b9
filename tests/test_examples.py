"""The example scripts run as a user would run them (each starts its own loopback servers)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# locustfiles are run by Locust (tests/test_locust.py), not as scripts
_ALL = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py"))
EXAMPLES = [p for p in _ALL if not p.name.startswith("locustfile")]


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"probe_one.py", "cold_vs_warm.py", "small_load.py"}


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(script: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "e2e" in done.stdout or "ms" in done.stdout  # it printed measurements
