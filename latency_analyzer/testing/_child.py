"""Test-bed servers in a child process: start, wait until ready, ask, stop.

A child is ``python -m latency_analyzer.testing NAME CONFIG_JSON`` (see ``__main__``): it
prints one JSON line once it serves (its port, its pid ...), answers each command line it
reads on stdin with one JSON line, and exits when its stdin closes. :class:`ChildServer` is
the parent's side of that exchange, :func:`serve_commands` the child's. A child shares neither
the caller's GIL nor its event loop, and its records stay comparable with the caller's clock
(``perf_counter_ns`` is CLOCK_MONOTONIC, shared by every process on the host).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = ["ChildServer", "serve_commands"]

#: How long a child may take to answer, or to exit once asked to.
CHILD_TIMEOUT_S = 10.0

C = TypeVar("C", bound="ChildServer")


class ChildServer:
    """Base of the test-bed servers that run in a child process; use as ``with``.

    Args:
        name: the child's verb in ``python -m latency_analyzer.testing NAME``.
        config: its configuration, sent as JSON on the command line.
        what: how errors name it ("the test bed", ...).

    Attributes:
        config: what the child serves.
        ready: the child's first line (``port``, ``pid``, ...), once started.
    """

    def __init__(self, name: str, config: Mapping[str, Any], what: str) -> None:
        self.config = dict(config)
        self.ready: dict[str, Any] = {}
        self._name, self._what = name, what
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def __enter__(self: C) -> C:
        args = [sys.executable, "-m", "latency_analyzer.testing", self._name]
        pipe = subprocess.PIPE
        self._proc = subprocess.Popen(
            [*args, json.dumps(self.config)], stdin=pipe, stdout=pipe, text=True
        )
        try:
            self.ready = self._reply()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        """The port the child serves on."""
        return int(self.ready["port"])

    @property
    def pid(self) -> int:
        """The child's process id."""
        if self._proc is None:
            raise RuntimeError(f"{self._what} is not running")
        return self._proc.pid

    def _ask(self, command: str) -> Any:
        """Send ``command`` and return the child's answer."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.poll() is not None:
            raise RuntimeError(f"{self._what} is not running")
        with self._lock:
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
            return self._reply()

    def kill(self) -> None:
        """SIGKILL the child at once; later connects are refused."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(CHILD_TIMEOUT_S)

    def close(self) -> None:
        """Ask the child to stop (close its stdin), kill it if it lingers, reap it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ValueError):
                proc.stdin.close()
        try:
            proc.wait(CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(CHILD_TIMEOUT_S)
        if proc.stdout is not None:
            proc.stdout.close()

    def _reply(self) -> Any:
        assert self._proc is not None and self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            code = self._proc.wait(CHILD_TIMEOUT_S)
            raise RuntimeError(f"{self._what} exited (status {code})")
        return json.loads(line)


async def serve_commands(
    ready: Mapping[str, Any], commands: Mapping[str, Callable[[], Any]]
) -> None:
    """The child's side: print ``ready``, then answer stdin's lines until it closes.

    Each line names one of ``commands``; the answer is what that function returns (an
    ``{"error": ...}`` object for a name it does not know).
    """
    print(json.dumps(ready), flush=True)
    loop = asyncio.get_running_loop()
    while command := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
        run = commands.get(command)
        reply = run() if run is not None else {"error": f"unknown command {command!r}"}
        print(json.dumps(reply), flush=True)
