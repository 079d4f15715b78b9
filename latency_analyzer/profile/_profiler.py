"""Run py-spy beside a probe or a load run: attach to a pid or launch a command under it.

::

    with Profiler(pid=server_pid, rate=200) as prof:      # or: async with Profiler(...)
        wf = probe(url, ...)
    result = prof.result                                   # ProfileResult, never raises
    profiled = attach(wf, result)                          # stages gain profile.* attributes

py-spy is called as a subprocess (``record --format chrometrace --idle --threads``) and
stopped with SIGINT, on which it writes its trace. Nothing that goes wrong here raises into
the measurement: a missing binary, a refused ptrace, a target that does not exist or exits,
py-spy crashing, all end as a :class:`ProfileResult` whose ``note`` says why and how to fix it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from ..errors import LatencyAnalyzerError, UsageError
from ..timeline._clock import ProfileAnchor
from ._pyspy import Lines, find_py_spy, reap
from ._result import (
    FAILED,
    INSTALL_REMEDY,
    PROFILED,
    PTRACE_REMEDY,
    REFUSED,
    UNAVAILABLE,
    ProfileResult,
    diagnose_failure,
)
from ._trace import IDLE_FRAMES, read_chrometrace

__all__ = [
    "FAILED",
    "MAX_RATE",
    "PROFILED",
    "PTRACE_REMEDY",
    "REFUSED",
    "UNAVAILABLE",
    "ProfileResult",
    "Profiler",
    "find_py_spy",
]

#: py-spy accepts any rate, but above ~1 kHz its blocking reads dominate the target.
MAX_RATE = 1000

_START_TIMEOUT_S = 15.0


class Profiler:
    """py-spy over a running process (``pid``) or a command it launches (``command``).

    Use as ``with`` or ``async with``; read :attr:`result` afterwards. Never raises for a
    profiling failure (only for misuse): the result's ``note`` says what went wrong.

    Args:
        pid: process to attach to.
        command: program to launch under py-spy (mutually exclusive with ``pid``).
        subprocesses: also sample the target's child processes (vLLM's EngineCore).
        rate: samples per second, 1..1000 (default 100).
        idle: keep samples of waiting threads (needed to see waits; default on).
        nonblocking: do not pause the target while reading it (default). Measured at
            200 Hz on the busy test server: blocking mode (py-spy's own default) saw
            idle→CPU transitions 2-3 ms later at the median and cost the target more; a few
            non-blocking samples per thousand fail or read a torn stack. False: py-spy's
            blocking sampling, exact stacks.
        native: include native (C/C++) frames (slower; needs symbols).
        py_spy: path of the py-spy binary (default: :func:`find_py_spy`).
        output: where to keep the chrometrace (default: a temporary file, deleted).
        idle_frames: leaf frames that mean "waiting" (default :data:`IDLE_FRAMES`).
        start_timeout: seconds to wait for py-spy to start sampling.

    Raises:
        UsageError: neither or both of ``pid``/``command``, or a rate outside 1..1000.
    """

    def __init__(
        self,
        pid: int | None = None,
        *,
        command: Sequence[str] | None = None,
        subprocesses: bool = False,
        rate: int = 100,
        idle: bool = True,
        nonblocking: bool = True,
        native: bool = False,
        py_spy: str | os.PathLike[str] | None = None,
        output: str | os.PathLike[str] | None = None,
        idle_frames: Sequence[tuple[str, str]] = IDLE_FRAMES,
        start_timeout: float = _START_TIMEOUT_S,
    ) -> None:
        if (pid is None) == (command is None):
            raise UsageError("give exactly one of pid= (attach) or command= (launch)")
        if not 1 <= int(rate) <= MAX_RATE:
            raise UsageError(f"rate must be 1..{MAX_RATE} Hz, not {rate}")
        self.pid = pid
        self.command = tuple(command) if command is not None else None
        self.subprocesses = subprocesses
        self.rate = int(rate)
        self.idle = idle
        self.nonblocking = nonblocking
        self.native = native
        self.idle_frames = tuple(idle_frames)
        self.start_timeout = start_timeout
        self._binary = find_py_spy(py_spy)
        self._keep = output is not None
        self._output = Path(output) if output is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._stdout: Lines | None = None
        self._stderr: Lines | None = None
        self._spawn: tuple[int, int] = (0, 0)
        self._result: ProfileResult | None = None

    # -- public -------------------------------------------------------------------------------
    @property
    def result(self) -> ProfileResult:
        """The outcome; available once the profiler stopped.

        Raises:
            UsageError: the profiler has not been stopped yet.
        """
        if self._result is None:
            raise UsageError("the profiler has not run yet (use it as a context manager)")
        return self._result

    @property
    def target_pid(self) -> int | None:
        """The profiled process: ``pid``, or the program py-spy launched (once it runs)."""
        if self.pid is not None:
            return self.pid
        if self._proc is None:
            return None
        children = Path(f"/proc/{self._proc.pid}/task/{self._proc.pid}/children")
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int(children.read_text().split()[0])
        return None

    @property
    def running(self) -> bool:
        """py-spy is sampling."""
        return self._proc is not None and self._proc.poll() is None

    def argv(self) -> list[str]:
        """The py-spy command line this profiler runs."""
        assert self._output is not None
        args = [self._binary or "py-spy", "record", "--format", "chrometrace"]
        args += ["--rate", str(self.rate), "--output", str(self._output), "--threads"]
        args += ["--idle"] * self.idle + ["--subprocesses"] * self.subprocesses
        args += ["--nonblocking"] * self.nonblocking + ["--native"] * self.native
        if self.pid is not None:
            return [*args, "--pid", str(self.pid)]
        assert self.command is not None
        return [*args, "--", *self.command]

    def start(self) -> Profiler:
        """Start py-spy and wait until it samples (or failed). Never raises for py-spy trouble."""
        if self._proc is not None:
            raise UsageError("this profiler is already running")
        self._result = None
        if self._binary is None or not Path(self._binary).is_file():
            where = "" if self._binary is None else f" at {self._binary}"
            self._result = ProfileResult(
                UNAVAILABLE, f"py-spy not found{where}: {INSTALL_REMEDY}", rate=self.rate
            )
            return self
        if self._output is None:
            fd, name = tempfile.mkstemp(prefix="latency-analyzer-", suffix=".json")
            os.close(fd)
            self._output = Path(name)
        self._launch()
        return self

    def stop(self) -> ProfileResult:
        """Stop py-spy (SIGINT: it writes its trace), read the trace, and return the result."""
        if self._result is not None and self._proc is None:
            return self._result
        try:
            self._result = self._finish()
        finally:
            self._proc = None
            if not self._keep and self._output is not None:
                with contextlib.suppress(OSError):
                    self._output.unlink()
        return self._result

    # -- context managers -----------------------------------------------------------------------
    def __enter__(self) -> Profiler:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Profiler:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType
    ) -> None:
        await asyncio.to_thread(self.stop)

    # -- internals ------------------------------------------------------------------------------
    def _launch(self) -> None:
        argv = self.argv()
        before = time.perf_counter_ns()
        try:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        except OSError as exc:  # not executable, wrong architecture, ...
            note = f"py-spy could not be started ({exc}): {INSTALL_REMEDY}"
            self._result = ProfileResult(UNAVAILABLE, note, rate=self.rate, command=tuple(argv))
            return
        # Popen returns once exec succeeded; py-spy's zero follows within its start-up.
        self._spawn = (before, time.perf_counter_ns())
        self._stdout = Lines(self._proc.stdout)
        self._stderr = Lines(self._proc.stderr)
        self._stdout.ready.wait(self.start_timeout)

    def _finish(self) -> ProfileResult:
        if self._proc is None:
            return self._result or ProfileResult(FAILED, "the profiler never started")
        proc, out, err = self._proc, self._stdout, self._stderr
        assert out is not None and err is not None
        stop_ns = time.perf_counter_ns()
        sampling = out.ready_ns is not None
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        cpu_s, killed = reap(proc)
        out.join(2.0)
        err.join(2.0)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        base = {
            "rate": self.rate,
            "command": tuple(self.argv()),
            "stderr": err.text()[-4000:],
            "nonblocking": self.nonblocking,
            "sampler_cpu_s": cpu_s,
            "wall_s": (stop_ns - self._spawn[1]) / 1e9,
        }
        if not sampling:
            status, note = diagnose_failure(err.text() + "\n" + out.text(), self.pid)
            return ProfileResult(status, note, **base)  # type: ignore[arg-type]  # base: fields by name
        return self._read(out, killed, base)

    def _read(self, out: Lines, killed: bool, base: dict[str, object]) -> ProfileResult:
        assert self._output is not None and out.ready_ns is not None
        text = out.text()
        counts = re.search(r"Samples: (\d+) Errors: (\d+)", text)
        exited = "process exited" in text or "process ended" in text
        try:
            trace = read_chrometrace(self._output, self.idle_frames)
        except (OSError, LatencyAnalyzerError) as exc:
            why = "was killed after not stopping" if killed else f"left no readable trace ({exc})"
            return ProfileResult(FAILED, f"py-spy {why}", **base)  # type: ignore[arg-type]  # as above
        anchor = ProfileAnchor(perf_ns=self._spawn[1], lo_ns=self._spawn[0], hi_ns=out.ready_ns)
        note = None
        if exited:
            note = "the target exited while being profiled: later stages have no samples"
        return ProfileResult(
            PROFILED,
            note,
            trace=trace,
            anchor=anchor,
            samples=int(counts[1]) if counts else None,
            errors=int(counts[2]) if counts else None,
            target_exited=exited,
            output=self._output if self._keep else None,
            **base,  # type: ignore[arg-type]  # the common fields, each of its own type
        )
