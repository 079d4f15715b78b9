"""Samples × stage windows: what each stage of a request spent its time on, per the profiler.

Every constant-stack segment of the trace is placed on the client clock through the anchor
(each sample stands for the interval centred on it, so a transition seen at a sample is moved
back half a period: the expected error of a stage edge is then zero instead of half a period).
Its overlap with a stage's window is charged to that stage: the leaf frame gets self time,
every distinct frame on the stack inclusive time, idle stacks count as idle.

Profile results never become spans: a child of another source would turn the stage's self
time into ``network`` in ``attribution()``. They are attributes (``profile.*``) of the stages
and of the waterfall, plus the :class:`StageProfile` objects :func:`attribute` returns.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field

from ..timeline import AttrValue, Span, Waterfall
from ._anchor import ProfileAnchor
from ._result import ProfileResult
from ._trace import Frame, Segment

__all__ = ["MIN_SAMPLES", "FrameTime", "StageProfile", "attach", "attribute", "stage_paths"]

#: Below this many samples a stage's shares are noise; its profile carries a note.
MIN_SAMPLES = 5


@dataclass(frozen=True, slots=True)
class FrameTime:
    """One frame's time in a stage: ``ns`` and ``share`` of the stage's sampled thread time."""

    frame: Frame
    ns: int
    share: float

    @property
    def label(self) -> str:
        return self.frame.label


@dataclass(frozen=True)
class StageProfile:
    """What the profiler saw during one stage window.

    Attributes:
        path: ``stage`` or ``stage/child`` (e.g. ``first_token/prefill``).
        start_ns, end_ns: the window (client ``perf_counter_ns``).
        thread_ns: sampled thread time inside the window, summed over threads.
        idle_ns: the part of it spent waiting.
        samples: thread-samples that time stands for (``thread_ns`` × rate).
        self_ns / self_cpu_ns / inclusive_ns: per frame.
        stacks: thread time per distinct stack (root first), for flamegraphs.
        pids: processes that contributed samples.
        note: why the numbers are thin, if they are.
    """

    path: str
    start_ns: int
    end_ns: int
    thread_ns: int = 0
    idle_ns: int = 0
    samples: int = 0
    self_ns: Mapping[Frame, int] = field(default_factory=dict)
    self_cpu_ns: Mapping[Frame, int] = field(default_factory=dict)
    inclusive_ns: Mapping[Frame, int] = field(default_factory=dict)
    stacks: Mapping[tuple[Frame, ...], int] = field(default_factory=dict)
    pids: tuple[int, ...] = ()
    note: str | None = None

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def idle_share(self) -> float | None:
        """Waiting share of the sampled thread time (None without samples)."""
        return self.idle_ns / self.thread_ns if self.thread_ns else None

    @property
    def cpu_ns(self) -> int:
        return self.thread_ns - self.idle_ns

    def top_self(self, n: int = 5, *, cpu_only: bool = False) -> list[FrameTime]:
        """Frames by self time; ``cpu_only`` ranks on-CPU time and shares it by on-CPU time."""
        table, total = (
            (self.self_cpu_ns, self.cpu_ns) if cpu_only else (self.self_ns, self.thread_ns)
        )
        return _top(table, total, n)

    def top_inclusive(self, n: int = 5) -> list[FrameTime]:
        """Frames by inclusive time (ties: the deeper frame first, it says more)."""
        return _top(self.inclusive_ns, self.thread_ns, n)


def _top(table: Mapping[Frame, int], total: int, n: int) -> list[FrameTime]:
    ranked = sorted(table.items(), key=lambda kv: -kv[1])[:n]
    return [FrameTime(frame, ns, ns / total if total else 0.0) for frame, ns in ranked]


def stage_paths(root: Span) -> Iterator[tuple[str, Span]]:
    """``(path, span)`` for every span under the root, depth first; repeated names get ``#2``."""

    def walk(span: Span, prefix: str) -> Iterator[tuple[str, Span]]:
        seen: dict[str, int] = {}
        for child in span.children:
            seen[child.name] = seen.get(child.name, 0) + 1
            suffix = f"#{seen[child.name]}" if seen[child.name] > 1 else ""
            path = f"{prefix}{child.name}{suffix}"
            yield path, child
            yield from walk(child, path + "/")

    yield from walk(root, "")


@dataclass
class _Placed:
    """The trace's segments on the client clock, sorted by start, for window queries."""

    starts: list[int]
    ends: list[int]
    segments: list[Segment]
    longest: int

    @classmethod
    def build(
        cls, result: ProfileResult, pids: Collection[int] | None, anchor: ProfileAnchor | None
    ) -> _Placed:
        anchor = anchor or result.anchor
        assert result.trace is not None and anchor is not None
        half = 500_000_000 // max(1, result.rate)
        zero = anchor.perf_ns - half
        rows = sorted(
            (zero + s.start_us * 1000, zero + s.end_us * 1000, s)
            for s in result.trace.segments
            if pids is None or s.pid in pids
        )
        longest = max((e - s for s, e, _ in rows), default=0)
        return cls([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], longest)

    def overlapping(self, lo: int, hi: int) -> Iterator[tuple[int, Segment]]:
        """(overlap ns, segment) for every segment overlapping [lo, hi)."""
        first = bisect.bisect_left(self.starts, lo - self.longest)
        last = bisect.bisect_left(self.starts, hi)
        for i in range(first, last):
            overlap = min(self.ends[i], hi) - max(self.starts[i], lo)
            if overlap > 0:
                yield overlap, self.segments[i]


def _profile(path: str, span: Span, placed: _Placed, rate: int, min_samples: int) -> StageProfile:
    self_ns: dict[Frame, int] = {}
    self_cpu: dict[Frame, int] = {}
    inclusive: dict[Frame, int] = {}
    stacks: dict[tuple[Frame, ...], int] = {}
    total = idle = 0
    pids: dict[int, None] = {}
    for ns, seg in placed.overlapping(span.start_ns, span.end_ns):
        total += ns
        pids[seg.pid] = None
        stacks[seg.stack] = stacks.get(seg.stack, 0) + ns
        if seg.idle:
            idle += ns
        if seg.stack:
            leaf = seg.stack[-1]
            self_ns[leaf] = self_ns.get(leaf, 0) + ns
            if not seg.idle:
                self_cpu[leaf] = self_cpu.get(leaf, 0) + ns
        for frame in set(seg.stack):
            inclusive[frame] = inclusive.get(frame, 0) + ns
    samples = round(total * rate / 1e9)
    return StageProfile(
        path,
        span.start_ns,
        span.end_ns,
        total,
        idle,
        samples,
        self_ns,
        self_cpu,
        _deeper_first(inclusive, stacks),
        stacks,
        tuple(pids),
        _thin(span, samples, rate, min_samples),
    )


def _deeper_first(
    inclusive: dict[Frame, int], stacks: Mapping[tuple[Frame, ...], int]
) -> dict[Frame, int]:
    """Order equal inclusive times deepest first, so a stable sort by time keeps that order."""
    depth: dict[Frame, int] = {}
    for stack in stacks:
        for index, frame in enumerate(stack):
            depth[frame] = max(depth.get(frame, 0), index)
    return dict(sorted(inclusive.items(), key=lambda kv: (-kv[1], -depth.get(kv[0], 0))))


def _thin(span: Span, samples: int, rate: int, min_samples: int) -> str | None:
    if samples >= min_samples:
        return None
    seconds = span.duration_ns / 1e9
    if samples == 0 and seconds > 0 and seconds * rate >= min_samples:
        return "no samples in this window: it lies outside the recording or the process"
    needed = math.ceil(min_samples / seconds) if seconds > 0 else None
    hint = (
        f"raise the rate to ≥ {needed} Hz"
        if needed and needed <= 1000
        else "aggregate more requests"
    )
    return f"only {samples} samples in {seconds * 1e3:.1f} ms at {rate} Hz: {hint}"


def attribute(
    wf: Waterfall,
    result: ProfileResult,
    *,
    pids: Collection[int] | None = None,
    min_samples: int = MIN_SAMPLES,
    anchor: ProfileAnchor | None = None,
) -> dict[str, StageProfile]:
    """Per stage (client stages and the server spans under them), what the profile saw.

    Args:
        wf: a waterfall on this process's clock (merged server stages included, if any).
        result: a profiling run that covered the request.
        pids: only these processes' samples (default: all the recording holds).
        min_samples: below this, a stage's profile carries a note.
        anchor: use this anchor instead of ``result.anchor`` (e.g. one ``refine_anchor``
            made from this request's own marker).

    Returns:
        ``{path: StageProfile}``; empty when ``result`` holds no trace.
    """
    if not result.ok:
        return {}
    placed = _Placed.build(result, pids, anchor)
    return {
        path: _profile(path, span, placed, result.rate, min_samples)
        for path, span in stage_paths(wf.root)
    }


def _stage_attributes(profile: StageProfile) -> dict[str, AttrValue]:
    out: dict[str, AttrValue] = {"profile.samples": profile.samples}
    if profile.idle_share is not None:
        out["profile.idle_share"] = round(profile.idle_share, 4)
    for key, top in (
        ("top_self", profile.top_self(1)),
        ("top_cpu_self", profile.top_self(1, cpu_only=True)),
        ("top_inclusive", profile.top_inclusive(1)),
    ):
        if top:
            out[f"profile.{key}"] = top[0].label
            out[f"profile.{key}_share"] = round(top[0].share, 4)
    if profile.note:
        out["profile.note"] = profile.note
    return out


def _rebuild(span: Span, prefix: str, profiles: Mapping[str, StageProfile]) -> Span:
    seen: dict[str, int] = {}
    children = []
    for child in span.children:
        seen[child.name] = seen.get(child.name, 0) + 1
        path = prefix + child.name + (f"#{seen[child.name]}" if seen[child.name] > 1 else "")
        rebuilt = _rebuild(child, path + "/", profiles)
        if path in profiles:
            attrs = {**rebuilt.attributes, **_stage_attributes(profiles[path])}
            rebuilt = dataclasses.replace(rebuilt, attributes=attrs)
        children.append(rebuilt)
    return dataclasses.replace(span, children=tuple(children))


def _result_attributes(
    result: ProfileResult, anchor: ProfileAnchor | None, thin: list[str]
) -> dict[str, AttrValue]:
    out: dict[str, AttrValue] = {"profile.status": result.status, "profile.rate_hz": result.rate}
    notes = [result.note] if result.note else []
    if thin:
        notes.append(f"too few samples in {', '.join(thin)}: raise the rate (max 1000 Hz)")
    if notes:
        out["profile.note"] = "; ".join(notes)
    if anchor is not None and result.ok:
        out["profile.anchor_uncertainty_ns"] = anchor.uncertainty_ns
        out["profile.anchor_method"] = anchor.method
    if result.samples is not None:
        out["profile.samples"] = result.samples
    if result.sampler_cpu_share is not None:
        out["profile.sampler_cpu_share"] = round(result.sampler_cpu_share, 4)
    if result.target_exited:
        out["profile.target_exited"] = True
    return out


def attach(
    wf: Waterfall,
    result: ProfileResult,
    *,
    pids: Collection[int] | None = None,
    min_samples: int = MIN_SAMPLES,
    anchor: ProfileAnchor | None = None,
) -> Waterfall:
    """A new waterfall whose stages carry ``profile.*`` attributes (samples, idle share, top
    self/inclusive frame and share, a note when thin) and whose own attributes say how the
    profile went (``profile.status``, ``profile.note``, anchor uncertainty, sampler CPU).

    The span tree keeps its shape, so ``attribution()`` is unchanged. When ``result`` has no
    trace the waterfall is returned complete, with ``profile.status`` and ``profile.note``.
    """
    profiles = attribute(wf, result, pids=pids, min_samples=min_samples, anchor=anchor)
    thin = [p.path for p in profiles.values() if p.note]
    root = _rebuild(wf.root, "", profiles) if profiles else wf.root
    attrs = {**wf.attributes, **_result_attributes(result, anchor or result.anchor, thin)}
    return dataclasses.replace(wf, root=root, attributes=attrs)
