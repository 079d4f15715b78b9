"""Read py-spy's ``chrometrace`` output into constant-stack segments per thread.

py-spy writes one JSON array of Chrome trace events. It does not write one event per sample:
for each thread it compares the new sample's stack with the previous one and emits ``E`` for
the frames that left and ``B`` for the frames that came (compared by name and file; the
``line`` kept is the first one seen). ``ts`` is integer microseconds since py-spy created its
recorder, with no wall-clock anchor. So between two consecutive events of a thread the stack
was the same in every sample taken; that interval is a :class:`Segment`.

``--threads`` and ``--subprocesses`` add synthetic bottom frames (empty filename, line 0):
``thread (TID): NAME`` and ``process PID:"CMDLINE"``; they name the thread and are removed
from the stack. Newer py-spy versions also emit ``M`` (metadata) ``thread_name`` events and
remap ``tid`` to small integers; both are accepted.

py-spy does not say which samples were idle (``--idle`` only keeps them). :func:`is_idle`
applies py-spy's own heuristic for Python-only stacks (a leaf waiting in ``selectors`` /
``threading`` / ``multiprocessing``), extendable with ``idle_frames``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import RequestError

__all__ = ["IDLE_FRAMES", "Frame", "Segment", "Trace", "is_idle", "read_chrometrace"]

#: (function name, file-name suffix) of leaf frames that mean "this thread is waiting".
#: The first two are py-spy's own ``_heuristic_is_thread_idle``; the rest are the blocking
#: waits of the standard library a server's threads sit in.
IDLE_FRAMES: tuple[tuple[str, str], ...] = (
    ("select", "selectors.py"),
    ("wait", "threading.py"),
    ("poll", "selectors.py"),
    ("_wait_for_tstate_lock", "threading.py"),
    ("_recv", "connection.py"),
    ("_recv_bytes", "connection.py"),
    ("poll", "connection.py"),
    ("_poll", "connection.py"),
    ("wait", "connection.py"),
    ("accept", "socket.py"),
    ("_worker", "thread.py"),
    ("get", "queue.py"),
    ("sleep", "tasks.py"),
)


@dataclass(frozen=True, slots=True)
class Frame:
    """One Python frame: function ``name`` in ``filename`` (``line``: first line seen)."""

    name: str
    filename: str
    line: int | None = field(default=None, compare=False, hash=False)

    @property
    def label(self) -> str:
        """``name (file.py)``, the form tables and flamegraphs show."""
        return f"{self.name} ({os.path.basename(self.filename)})" if self.filename else self.name


@dataclass(frozen=True, slots=True)
class Segment:
    """An interval of one thread during which every sample had the same stack.

    Attributes:
        pid: process id.
        tid: py-spy's thread id (pthread id, or a small remapped number in newer versions).
        start_us: py-spy time (µs since its start) of the first sample with this stack.
        end_us: py-spy time of the first sample with another stack (or of the recording's end).
        stack: root first, leaf last; synthetic thread/process frames removed.
        idle: the thread was waiting (see :func:`is_idle`).
    """

    pid: int
    tid: int
    start_us: int
    end_us: int
    stack: tuple[Frame, ...]
    idle: bool


@dataclass(frozen=True, slots=True)
class Trace:
    """A whole recording: its segments in time order plus thread names and py-spy's extent."""

    segments: tuple[Segment, ...]
    thread_names: Mapping[tuple[int, int], str]
    start_us: int
    end_us: int

    @property
    def pids(self) -> tuple[int, ...]:
        """Every process that produced samples, in order of first appearance."""
        return tuple(dict.fromkeys(seg.pid for seg in self.segments))

    def frame_windows(self, name: str) -> list[tuple[int, int]]:
        """[start_us, end_us) of every maximal run in which a frame called ``name`` is on the
        stack of the same thread (used to anchor on a marker function)."""
        runs: list[tuple[int, int]] = []
        open_runs: dict[tuple[int, int], int] = {}
        for seg in self.segments:
            key = (seg.pid, seg.tid)
            inside = any(f.name == name or f.name.endswith("." + name) for f in seg.stack)
            if inside and key not in open_runs:
                open_runs[key] = seg.start_us
            elif not inside and key in open_runs:
                runs.append((open_runs.pop(key), seg.start_us))
        runs += [(start, self.end_us) for start in open_runs.values()]
        return sorted(runs)


def is_idle(stack: Sequence[Frame], idle_frames: Collection[tuple[str, str]] = IDLE_FRAMES) -> bool:
    """True when the leaf frame is a known blocking wait, or the thread has no Python frame."""
    if not stack:
        return True
    leaf = stack[-1]
    # py-spy ≥ 0.4 qualifies methods (``EpollSelector.select``): compare the last part.
    short = leaf.name.rsplit(".", 1)[-1]
    return any(short == name and leaf.filename.endswith(suffix) for name, suffix in idle_frames)


def _synthetic(event: Mapping[str, Any]) -> bool:
    args = event.get("args") or {}
    name = str(event.get("name", ""))
    return not args.get("filename") and name.startswith(("thread (", "process "))


class _ThreadState:
    """The open stack of one thread while its events are replayed."""

    def __init__(self) -> None:
        self.stack: list[Frame] = []
        self.synthetic = 0
        self.since: int | None = None


def _events(source: str | os.PathLike[str] | bytes | Sequence[Any]) -> Sequence[Any]:
    if isinstance(source, (str, os.PathLike)):
        source = Path(source).read_bytes()
    if isinstance(source, bytes):
        try:
            source = json.loads(source)
        except ValueError as exc:
            raise RequestError("profile", f"py-spy chrometrace is not JSON: {exc}") from exc
    if isinstance(source, Mapping):  # the object form {"traceEvents": [...]}
        source = source.get("traceEvents", [])
    if not isinstance(source, Sequence):
        raise RequestError("profile", "py-spy chrometrace is not a list of events")
    return source


def read_chrometrace(
    source: str | os.PathLike[str] | bytes | Sequence[Any],
    idle_frames: Collection[tuple[str, str]] = IDLE_FRAMES,
) -> Trace:
    """Replay py-spy's B/E events into constant-stack segments.

    Args:
        source: a path, the file's bytes, or the already-decoded event list.
        idle_frames: leaf frames that mean waiting (see :data:`IDLE_FRAMES`).

    Raises:
        RequestError: the data is not a chrometrace event list.
    """
    states: dict[tuple[int, int], _ThreadState] = {}
    names: dict[tuple[int, int], str] = {}
    segments: list[Segment] = []
    first: int | None = None
    last = 0
    for event in _events(source):
        if not isinstance(event, Mapping) or event.get("ph") not in ("B", "E", "M"):
            continue
        key = (int(event.get("pid", 0)), int(event.get("tid", 0)))
        if event["ph"] == "M":
            _metadata(event, key, names)
            continue
        ts = int(event.get("ts", 0))
        first = ts if first is None else min(first, ts)
        last = max(last, ts)
        state = states.setdefault(key, _ThreadState())
        _close(state, key, ts, segments, idle_frames)
        _apply(event, state, key, names)
        state.since = ts if (state.stack or state.synthetic) else None
    segments.sort(key=lambda s: (s.start_us, s.pid, s.tid))
    return Trace(tuple(segments), names, first or 0, last)


def _metadata(event: Mapping[str, Any], key: tuple[int, int], names: dict[Any, str]) -> None:
    if event.get("name") == "thread_name":
        label = str((event.get("args") or {}).get("name", ""))
        names.setdefault(key, label.split(": ", 1)[-1])


def _close(
    state: _ThreadState,
    key: tuple[int, int],
    ts: int,
    out: list[Segment],
    idle_frames: Collection[tuple[str, str]],
) -> None:
    """End the thread's current segment at ``ts`` (events at one instant share a segment)."""
    if state.since is None or ts <= state.since:
        return
    stack = tuple(state.stack)
    out.append(Segment(key[0], key[1], state.since, ts, stack, is_idle(stack, idle_frames)))
    state.since = ts


def _apply(
    event: Mapping[str, Any], state: _ThreadState, key: tuple[int, int], names: dict[Any, str]
) -> None:
    if _synthetic(event):
        name = str(event["name"])
        state.synthetic += 1 if event["ph"] == "B" else -1
        if name.startswith("thread (") and "): " in name:
            names.setdefault(key, name.split("): ", 1)[1])
        return
    args = event.get("args") or {}
    frame = Frame(str(event.get("name", "")), str(args.get("filename", "")), args.get("line"))
    if event["ph"] == "B":
        state.stack.append(frame)
        return
    # E closes the innermost open frame of that name (py-spy closes leaf first).
    for index in range(len(state.stack) - 1, -1, -1):
        if state.stack[index] == frame:
            del state.stack[index:]
            return
