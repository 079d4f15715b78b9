"""The py-spy process: where its binary is, its pipes read line by line, its exit reaped."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["READY", "STOP_TIMEOUT_S", "Lines", "find_py_spy", "reap"]

#: The line py-spy prints once it samples.
READY = "Sampling process"
STOP_TIMEOUT_S = 15.0


def _packaged_binary() -> str | None:
    """The ``py-spy`` script the ``py-spy`` wheel installs, wherever its files went."""
    try:
        files = importlib.metadata.files("py-spy") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in files:
        if entry.name in ("py-spy", "py-spy.exe"):
            path = Path(str(entry.locate()))
            if path.is_file():
                return str(path)
    return None


def find_py_spy(path: str | os.PathLike[str] | None = None) -> str | None:
    """The py-spy binary: ``path`` if given, else on PATH, beside ``sys.executable``, or in
    the installed wheel's files. None if there is none."""
    if path is not None:
        return os.fspath(path)
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return _packaged_binary()


class Lines:
    """Read a pipe on a daemon thread, timestamping each line (perf_counter_ns)."""

    def __init__(self, stream: object, keep: int = 200) -> None:
        self.lines: list[tuple[int, str]] = []
        self.ready = threading.Event()
        self.ready_ns: int | None = None
        self._keep = keep
        self._thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self._thread.start()

    def _run(self, stream: object) -> None:
        for raw in stream:  # type: ignore[attr-defined]  # a pipe: typed as object, iterable
            now = time.perf_counter_ns()
            line = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            if self.ready_ns is None and READY in line:
                self.ready_ns = now
                self.ready.set()
            self.lines.append((now, line.rstrip("\n")))
            del self.lines[: -self._keep]
        self.ready.set()  # EOF: py-spy is gone

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def reap(proc: subprocess.Popen[bytes]) -> tuple[float | None, bool]:
    """Wait for py-spy (kill it if it hangs); return its CPU seconds and whether it was killed."""
    deadline = time.monotonic() + STOP_TIMEOUT_S
    killed = False
    while True:
        try:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:  # already reaped by poll(): its usage is gone
            return None, killed
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime, killed
        if time.monotonic() > deadline and not killed:
            proc.kill()
            killed = True
        time.sleep(0.01)
