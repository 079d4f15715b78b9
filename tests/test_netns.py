"""The loopback-only network namespace the Ray tests run in (``nox -s ray``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from latency_analyzer.testing.netns import isolated_command, main

PROBE = (
    "import socket\n"
    "from latency_analyzer.testing.netns import only_loopback\n"
    "s = socket.create_server(('127.0.0.1', 0)); port = s.getsockname()[1]\n"
    "c = socket.create_connection(('127.0.0.1', port), timeout=2)\n"
    "print(only_loopback(), sorted(n for _, n in socket.if_nameindex()))\n"
)


def _need_tools() -> None:
    missing = [t for t in ("unshare", "ip") if shutil.which(t) is None]
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"missing in CI: {missing}")
        pytest.skip(f"needs {missing}")


def test_the_namespace_has_only_loopback_and_loopback_works() -> None:
    _need_tools()
    out = subprocess.run(
        isolated_command([sys.executable, "-c", PROBE]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "Operation not permitted" in out.stderr and os.environ.get("CI") != "true":
        pytest.skip(f"this host forbids new namespaces: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True ['lo']"


def test_exit_status_is_passed_through_and_usage_is_explained(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _need_tools()
    assert main(["--", sys.executable, "-c", "raise SystemExit(7)"]) == 7
    assert main(["--"]) == 2
    assert "usage" in capsys.readouterr().err
