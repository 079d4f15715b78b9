"""The Locust side of the capture engine: a child process and a socket pair, gevent-friendly.

``EngineProcess.start()`` spawns :mod:`latency_analyzer.locust._engine`; requests go out as
JSON lines and a reader greenlet hands each answer to the greenlet waiting for it (a gevent
``AsyncResult``), after ``on_waterfall`` has seen it. Every wait is a gevent wait on a gevent
socket, so a Locust user blocks only itself. The callback runs in the reader greenlet, not
in the user's: a user killed mid-request (Locust's stop) still gets its waterfall recorded.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any

import gevent
from gevent.event import AsyncResult
from gevent.lock import Semaphore

from ..errors import UsageError
from ..timeline import Waterfall

__all__ = ["EngineError", "EngineProcess", "OnWaterfall"]

log = logging.getLogger(__name__)

#: Called in the reader greenlet with the request's ``meta`` and its waterfall.
OnWaterfall = Callable[[Mapping[str, Any], Waterfall], None]


class EngineError(RuntimeError):
    """The engine process is gone; requests in flight then have no waterfall."""


class EngineProcess:
    """One capture engine for one Locust process (every user shares it)."""

    def __init__(
        self, on_waterfall: OnWaterfall, on_exit: Callable[[str], None] | None = None
    ) -> None:
        self.on_waterfall = on_waterfall
        self.on_exit = on_exit  # called (with why) when the engine dies before stop()
        self._stopping = False
        self.proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._ids = itertools.count(1)
        self._users = itertools.count(1)
        self._pending: dict[int, tuple[AsyncResult, Mapping[str, Any]]] = {}
        self._send_lock = Semaphore()
        self._reader: gevent.Greenlet | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def start(self) -> None:
        """Spawn the engine (a fresh interpreter: no gevent, no patched modules in it)."""
        ours, theirs = socket.socketpair()
        env = {k: v for k, v in os.environ.items() if not k.startswith("GEVENT")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "latency_analyzer.locust._engine", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env=env,
        )
        theirs.close()
        self._sock = ours
        self._reader = gevent.spawn(self._read)

    def open_user(self, options: Mapping[str, Any]) -> int:
        """A new client (connection pool) in the engine; its handle."""
        user = next(self._users)
        self._send({"op": "open", "user": user, "options": dict(options)})
        return user

    def close_user(self, user: int) -> None:
        if self.running:
            self._send({"op": "close", "user": user})

    def request(self, user: int, spec: Mapping[str, Any], meta: Mapping[str, Any]) -> Waterfall:
        """Send one request through the engine and wait (cooperatively) for its waterfall.

        Raises:
            UsageError: the request could not be sent at all (e.g. not an http(s) URL).
            EngineError: the engine process died.
        """
        if not self.running:
            raise EngineError("the capture engine is not running")
        rid = next(self._ids)
        result: AsyncResult = AsyncResult()
        self._pending[rid] = (result, meta)
        try:
            self._send({**spec, "op": "req", "id": rid, "user": user})
        except OSError:
            self._pending.pop(rid, None)
            raise EngineError("the capture engine is gone") from None
        answer = result.get()
        if isinstance(answer, BaseException):
            raise answer
        wf: Waterfall = answer
        return wf

    def drain(self, timeout: float) -> int:
        """Wait up to ``timeout`` s for requests in flight; how many are still pending."""
        with gevent.Timeout(timeout, False):
            while self._pending:
                gevent.sleep(0.005)
        return len(self._pending)

    def stop(self, timeout: float = 5.0) -> None:
        """Let in-flight requests finish (up to ``timeout``), then end the engine."""
        self._stopping = True
        self.drain(timeout)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._reader is not None:
            self._reader.kill(block=False)

    def _send(self, obj: Mapping[str, Any]) -> None:
        if self._sock is None:
            raise EngineError("the capture engine is not running")
        line = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
        with self._send_lock:  # one greenlet writes at a time on the shared socket
            self._sock.sendall(line)

    def _read(self) -> None:
        assert self._sock is not None
        stream = self._sock.makefile("rb")
        try:
            for line in stream:
                self._answer(json.loads(line))
        except (OSError, ValueError) as exc:
            log.error("capture engine connection lost: %s", exc)
        finally:
            code = None
            if self.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    code = self.proc.wait(5.0)
            lost = len(self._pending)
            gone = EngineError(f"the capture engine exited (status {code})")
            for result, _ in self._pending.values():
                result.set(gone)
            self._pending.clear()
            if not self._stopping and self.on_exit is not None:
                self.on_exit(f"{gone}; {lost} requests in flight have no waterfall")

    def _answer(self, msg: Mapping[str, Any]) -> None:
        if "id" not in msg:  # an ``open`` refused: its user's requests will say so
            log.error("capture engine: %s", msg.get("usage"))
            return
        entry = self._pending.pop(int(msg["id"]), None)
        if entry is None:
            return
        result, meta = entry
        if "usage" in msg:
            result.set(UsageError(str(msg["usage"])))
            return
        wf = Waterfall.from_dict(msg["wf"])
        try:
            self.on_waterfall(meta, wf)
        except Exception:  # a failing listener must not stop the reader: log, keep going
            log.exception("recording a waterfall failed")
        result.set(wf)
