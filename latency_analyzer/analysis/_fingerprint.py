"""The environment a run was measured in, stored with every run.

OS and kernel, CPU model and count, Python and library versions, GPUs (``nvidia-smi`` when on
PATH), the target host, its base RTT (median TCP connect time), start time in UTC and the
scenario definition. The runner adds the HTTP and TLS versions it saw.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import shutil
import socket
import statistics
import subprocess
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

__all__ = ["base_rtt", "fingerprint"]

_LIBRARIES = ("latency-analyzer", "aiohttp", "numpy", "dnspython")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in _LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _gpus() -> list[dict[str, str]]:
    """``nvidia-smi`` rows (name, memory); empty when there is no such tool or GPU."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    query = ["--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
    try:
        out = subprocess.run([exe, *query], capture_output=True, text=True, timeout=5, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    rows = [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line]
    return [{"name": r[0], "memory": r[1], "driver": r[2]} for r in rows if len(r) >= 3]


def base_rtt(host: str, port: int, samples: int = 5, timeout: float = 2.0) -> float | None:
    """Median TCP connect time to ``host:port`` in seconds (None if no connect succeeded).

    A TCP handshake is one round trip, so on an idle path its median is the base RTT plus
    the kernel's accept work.
    """
    times = []
    for _ in range(samples):
        t0 = time.perf_counter_ns()
        try:
            with socket.create_connection((host, port), timeout=timeout):
                times.append((time.perf_counter_ns() - t0) / 1e9)
        except OSError:
            continue
    return statistics.median(times) if times else None


def fingerprint(
    url: str | None = None,
    *,
    scenario: Mapping[str, Any] | None = None,
    rtt_samples: int = 5,
) -> dict[str, Any]:
    """A JSON-ready description of this machine, the target and the scenario.

    Args:
        url: the target; its host and base RTT are recorded (None: no target fields).
        scenario: the scenario definition, stored as given.
        rtt_samples: TCP connects for the base RTT (0: do not measure).
    """
    uname = platform.uname()
    out: dict[str, Any] = {
        "start_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "os": uname.system,
        "kernel": uname.release,
        "machine": uname.machine,
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "libraries": _versions(),
        "gpus": _gpus(),
        "scenario": dict(scenario) if scenario is not None else None,
    }
    if url is not None:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        out["target_host"] = f"{parts.hostname}:{port}"
        rtt = base_rtt(parts.hostname or "", port, rtt_samples) if rtt_samples else None
        out["base_rtt_s"] = rtt
    return out
