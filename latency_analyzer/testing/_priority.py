"""Real-time scheduling for test-bed server processes, where the OS allows it.

A test bed's servers are the ground truth a timing test compares with: the delays they inject
must hold when the host is busy (a laptop doing other work, a shared CI runner). A process in
``SCHED_RR`` runs as soon as its timer fires, ahead of every ordinary process, so other
processes' load cannot make it late. Only a privileged process may ask for it (root, or
``CAP_SYS_NICE``); elsewhere the server runs at normal priority and says so. The kernel keeps
5 % of each second for ordinary processes (``sched_rt_runtime_us``), so a server that spun
could not take the machine.
"""

from __future__ import annotations

import os

__all__ = ["realtime"]

_PRIORITY = 1  # the lowest real-time priority: above every ordinary process, below the kernel's


def realtime() -> str | None:
    """Move this process to real-time round-robin scheduling; None, or why it stayed normal."""
    policy = getattr(os, "SCHED_RR", None)
    if policy is None or not hasattr(os, "sched_setscheduler"):
        return "this platform has no real-time scheduling"
    try:
        os.sched_setscheduler(0, policy, os.sched_param(_PRIORITY))
    except OSError as exc:
        return f"real-time scheduling refused ({exc.strerror})"
    return None
