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
import importlib.metadata
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from ..errors import LatencyAnalyzerError, UsageError
from ._anchor import ProfileAnchor
from ._trace import IDLE_FRAMES, Trace, read_chrometrace

__all__ = [
    "FAILED",
    "MAX_RATE",
    "PROFILED",
    "REFUSED",
    "UNAVAILABLE",
    "ProfileResult",
    "Profiler",
    "find_py_spy",
]

PROFILED = "profiled"
UNAVAILABLE = "unavailable"  # no py-spy binary
REFUSED = "refused"  # ptrace not permitted, or no such process
FAILED = "failed"  # py-spy ran but gave no usable trace

#: py-spy accepts any rate, but above ~1 kHz its blocking reads dominate the target.
MAX_RATE = 1000

_READY = "Sampling process"
_START_TIMEOUT_S = 15.0
_STOP_TIMEOUT_S = 15.0

PTRACE_REMEDY = (
    "py-spy needs ptrace on the target: run as root or as the target's user, in Docker add "
    "--cap-add SYS_PTRACE, in Kubernetes add SYS_PTRACE to securityContext.capabilities, or "
    "allow it host-wide with sysctl kernel.yama.ptrace_scope=0"
)
INSTALL_REMEDY = "install it with `pip install py-spy` or pass py_spy='/path/to/py-spy'"


@dataclass(frozen=True)
class ProfileResult:
    """What one profiling run produced (or why it produced nothing).

    Attributes:
        status: ``profiled``, ``unavailable``, ``refused`` or ``failed``.
        note: why there is no (or only partial) profile data and how to fix it; None if clean.
        trace: the replayed chrometrace (None unless profiled).
        anchor: py-spy's zero on the client clock (None unless profiled).
        rate: the requested sampling rate (Hz).
        samples: py-spy's own count of samples taken (None if it did not say).
        errors: py-spy's count of failed samples.
        target_exited: the target exited before the profiler stopped.
        wall_s: seconds from py-spy's start to its stop.
        sampler_cpu_s: CPU seconds py-spy used; in blocking mode the target is paused while
            py-spy reads its memory, so ``sampler_cpu_s / wall_s`` bounds the pause share.
        nonblocking: sampled without pausing the target.
        output: the chrometrace file, when kept.
        command: the py-spy command line.
        stderr: the tail of py-spy's stderr (for diagnosis).
    """

    status: str
    note: str | None = None
    trace: Trace | None = None
    anchor: ProfileAnchor | None = None
    rate: int = 100
    samples: int | None = None
    errors: int | None = None
    target_exited: bool = False
    wall_s: float | None = None
    sampler_cpu_s: float | None = None
    nonblocking: bool = True
    output: Path | None = None
    command: tuple[str, ...] = ()
    stderr: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        """True when there is a trace to attribute."""
        return self.status == PROFILED and self.trace is not None and self.anchor is not None

    @property
    def sampler_cpu_share(self) -> float | None:
        """py-spy's CPU seconds per wall second (an upper bound on the target's pause share)."""
        if self.sampler_cpu_s is None or not self.wall_s:
            return None
        return self.sampler_cpu_s / self.wall_s

    @property
    def effective_rate(self) -> float | None:
        """Samples per second py-spy actually took (below ``rate`` when it fell behind)."""
        if self.samples is None or not self.wall_s:
            return None
        return self.samples / self.wall_s


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


def _diagnose(stderr: str, pid: int | None) -> tuple[str, str]:
    """(status, note) for a py-spy that stopped before sampling."""
    text = stderr.lower()
    last = next((ln for ln in reversed(stderr.strip().splitlines()) if "error" in ln.lower()), "")
    detail = f" (py-spy: {last.strip()})" if last else ""
    if "permission denied" in text or "operation not permitted" in text:
        return REFUSED, f"ptrace not permitted{detail}; {PTRACE_REMEDY}"
    if pid is not None and not Path(f"/proc/{pid}").exists():
        return REFUSED, f"no process {pid} to profile (did it exit?){detail}"
    if "failed to find python version" in text or "executable name" in text:
        return REFUSED, f"py-spy could not read the target as a Python process{detail}"
    return FAILED, f"py-spy stopped before sampling{detail}"


class _Lines:
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
            if self.ready_ns is None and _READY in line:
                self.ready_ns = now
                self.ready.set()
            self.lines.append((now, line.rstrip("\n")))
            del self.lines[: -self._keep]
        self.ready.set()  # EOF: py-spy is gone

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


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
        self._stdout: _Lines | None = None
        self._stderr: _Lines | None = None
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
        self._stdout = _Lines(self._proc.stdout)
        self._stderr = _Lines(self._proc.stderr)
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
        cpu_s, killed = _reap(proc)
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
            status, note = _diagnose(err.text() + "\n" + out.text(), self.pid)
            return ProfileResult(status, note, **base)  # type: ignore[arg-type]  # base: fields by name
        return self._read(out, killed, base)

    def _read(self, out: _Lines, killed: bool, base: dict[str, object]) -> ProfileResult:
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


def _reap(proc: subprocess.Popen[bytes]) -> tuple[float | None, bool]:
    """Wait for py-spy (kill it if it hangs); return its CPU seconds and whether it was killed."""
    deadline = time.monotonic() + _STOP_TIMEOUT_S
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
