"""Per-stage flamegraph files: speedscope JSON and Brendan Gregg's collapsed stacks.

Both weigh stacks by the sampled thread time in microseconds (not sample counts), so stages
profiled at different rates compare directly. speedscope (https://www.speedscope.app) opens
the JSON; ``flamegraph.pl``, inferno and speedscope open the collapsed text.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from .._version import __version__
from ..errors import UsageError
from ._attribute import StageProfile
from ._trace import Frame

__all__ = ["collapsed", "export_stages", "speedscope"]

SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def collapsed(profile: StageProfile) -> str:
    """``root;...;leaf MICROSECONDS`` per stack, heaviest first."""
    lines = []
    for stack, ns in sorted(profile.stacks.items(), key=lambda kv: -kv[1]):
        us = round(ns / 1000)
        if us and stack:
            names = ";".join(f.label.replace(";", ":") for f in stack)
            lines.append(f"{names} {us}")
    return "\n".join(lines) + ("\n" if lines else "")


def speedscope(
    profiles: Iterable[StageProfile], name: str = "latency_analyzer"
) -> dict[str, object]:
    """One speedscope file with a ``sampled`` profile per stage (switch between them in the UI)."""
    frames: dict[Frame, int] = {}
    out = []
    for profile in profiles:
        samples, weights = [], []
        for stack, ns in sorted(profile.stacks.items(), key=lambda kv: -kv[1]):
            if stack and ns >= 1000:
                samples.append([frames.setdefault(f, len(frames)) for f in stack])
                weights.append(round(ns / 1000))
        out.append(
            {
                "type": "sampled",
                "name": profile.path,
                "unit": "microseconds",
                "startValue": 0,
                "endValue": sum(weights),
                "samples": samples,
                "weights": weights,
            }
        )
    shared = [{"name": f.name, "file": f.filename, "line": f.line} for f in frames]
    return {
        "$schema": SPEEDSCOPE_SCHEMA,
        "shared": {"frames": shared},
        "profiles": out,
        "name": name,
        "activeProfileIndex": 0,
        "exporter": f"latency_analyzer {__version__}",
    }


def _safe(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.#-]+", "__", path)


def export_stages(
    profiles: Iterable[StageProfile],
    directory: str | os.PathLike[str],
    fmt: str = "speedscope",
) -> list[Path]:
    """Write one file per stage (``<path>.speedscope.json`` or ``<path>.collapsed``) into
    ``directory`` (created if missing); stages without samples are skipped.

    Raises:
        UsageError: ``fmt`` is neither ``speedscope`` nor ``collapsed``.
    """
    if fmt not in ("speedscope", "collapsed"):
        raise UsageError(f"fmt must be 'speedscope' or 'collapsed', not {fmt!r}")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for profile in profiles:
        if not profile.stacks:
            continue
        if fmt == "collapsed":
            path = folder / f"{_safe(profile.path)}.collapsed"
            path.write_text(collapsed(profile))
        else:
            path = folder / f"{_safe(profile.path)}.speedscope.json"
            path.write_text(json.dumps(speedscope([profile], profile.path)))
        written.append(path)
    return written
