"""py-spy profiles of the server process, attributed to the stages of each request.

::

    from latency_analyzer.profile import Profiler, attach, attribute, export_stages

    with Profiler(pid=server_pid, rate=200, subprocesses=True) as prof:
        wf = probe(url, json=body)
    profiled = attach(wf, prof.result)      # stages gain profile.* attributes
    stages = attribute(wf, prof.result)     # {"first_token/prefill": StageProfile, ...}
    stages["first_token/prefill"].top_self(3)
    export_stages(stages.values(), "flame/", fmt="speedscope")

A failed profile (py-spy missing, ptrace refused, no such process) never breaks the
measurement: ``prof.result.status`` / ``.note`` say why, and ``attach`` returns the complete
waterfall with ``profile.status`` and ``profile.note``. See docs/profiles.md.
"""

from ._anchor import ProfileAnchor, refine_anchor
from ._attribute import MIN_SAMPLES, FrameTime, StageProfile, attach, attribute, stage_paths
from ._export import collapsed, export_stages, speedscope
from ._profiler import (
    FAILED,
    MAX_RATE,
    PROFILED,
    PTRACE_REMEDY,
    REFUSED,
    UNAVAILABLE,
    Profiler,
    ProfileResult,
    find_py_spy,
)
from ._trace import IDLE_FRAMES, Frame, Segment, Trace, is_idle, read_chrometrace

__all__ = [
    "FAILED",
    "IDLE_FRAMES",
    "MAX_RATE",
    "MIN_SAMPLES",
    "PROFILED",
    "PTRACE_REMEDY",
    "REFUSED",
    "UNAVAILABLE",
    "Frame",
    "FrameTime",
    "ProfileAnchor",
    "ProfileResult",
    "Profiler",
    "Segment",
    "StageProfile",
    "Trace",
    "attach",
    "attribute",
    "collapsed",
    "export_stages",
    "find_py_spy",
    "is_idle",
    "read_chrometrace",
    "refine_anchor",
    "speedscope",
    "stage_paths",
]
