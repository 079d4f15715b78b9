"""What one profiling run produced, or why it produced nothing, and how to fix that."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..timeline._clock import ProfileAnchor
from ._trace import Trace

__all__ = [
    "FAILED",
    "INSTALL_REMEDY",
    "PROFILED",
    "PTRACE_REMEDY",
    "REFUSED",
    "UNAVAILABLE",
    "ProfileResult",
    "diagnose_failure",
]

PROFILED = "profiled"
UNAVAILABLE = "unavailable"  # no py-spy binary
REFUSED = "refused"  # ptrace not permitted, or no such process
FAILED = "failed"  # py-spy ran but gave no usable trace

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


def diagnose_failure(stderr: str, pid: int | None) -> tuple[str, str]:
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
