"""Runs at several loads in one run file: a sweep over levels, and a search for the highest
open-loop rate that meets a set of SLOs.

Each point is a complete run (its own header line with the scenario and fingerprint, its rows
tagged ``step`` 0, 1 …, its ``result`` note), appended to one file as it finishes:
``WaterfallSet.load(path).group_by("step")`` gives the points back. A point is written to
``<file>.part`` while it runs, so an interrupted point leaves the finished ones intact.

The search (:func:`search`) probes ``rate_max`` first; if it fails, it halves the rate until a
probe passes (or ``rate_min`` is passed), then bisects the bracket geometrically (the midpoint
of ``lo`` and ``hi`` is ``sqrt(lo·hi)``) until ``hi / lo - 1 <= resolution``. A probe passes
when every SLO is met and no request failed. What it reports is the last passing rate: the
highest rate shown to meet the SLOs, within the resolution of the first rate shown not to.

A failing probe during which the client itself lagged (its health note: event loop, pacer or
reads late, whether from its own load or a busy host) says nothing sure about the target: its
latencies include the client's delay. The search runs such a probe again, at most
``repeat_lagged`` times (default 1), and the last run decides; every run stays in the file
and in ``points``, each with its note. A passing probe is kept as it is (without the client's
delay its latencies could only be lower).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ._api import run
from ._knee import LoadPoint, load_point
from ._scenario import Scenario
from ._slo import Slo

__all__ = ["SearchResult", "parse_resolution", "search", "sweep_points"]

#: Called with each point as it finishes (e.g. to print it).
OnPoint = Callable[[LoadPoint], None]


class _RunFile:
    """One file that collects complete runs, each appended once it has finished."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = None if path is None else Path(path)
        self.part = None if self.path is None else self.path.with_name(self.path.name + ".part")
        self.runs = 0

    def append_part(self) -> None:
        """Move the finished run in ``<file>.part`` to the end of the file."""
        if self.path is None or self.part is None:
            return
        with self.part.open("rb") as src, self.path.open("wb" if self.runs == 0 else "ab") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        self.part.unlink()
        self.runs += 1


async def _point(
    scenario: Scenario,
    file: _RunFile,
    *,
    step: int,
    key: str,
    level: float,
    slos: Sequence[Slo],
    kwargs: dict[str, Any],
) -> LoadPoint:
    sc = scenario.replace(**{key: level, "name": f"{scenario.name}@{key}={level:g}"})
    result = await run(sc, path=file.part, step=step, **kwargs)
    file.append_part()
    return load_point(
        result.set, step=step, key=key, level=level, slos=slos, client_note=result.client.note()
    )


async def sweep_points(
    scenario: Scenario,
    *,
    rate: Sequence[float] = (),
    concurrency: Sequence[int] = (),
    path: str | Path | None = None,
    slos: Sequence[Slo] = (),
    on_point: OnPoint | None = None,
    **kwargs: Any,
) -> list[LoadPoint]:
    """One run per rate (open loop) or concurrency (closed loop), all in the file ``path``.

    Args:
        scenario: the run at every level (its ``rate`` or ``concurrency`` replaced).
        rate, concurrency: the levels, exactly one of the two.
        path: the run file (None: memory only).
        slos: checked at every point (goodput, met or not).
        on_point: called with each point as it finishes.
        kwargs: passed to :func:`latency_analyzer.load.run` (``headers``, ``progress`` ...).

    Raises:
        UsageError: neither or both of ``rate`` and ``concurrency``, a level that is not
            finite and positive, or a loop that does not match (rates need ``mode="open"``).
    """
    if bool(rate) == bool(concurrency):
        raise UsageError("a sweep is over rates or concurrencies: give exactly one of the two")
    key, levels = ("rate", list(rate)) if rate else ("concurrency", list(concurrency))
    want = "open" if key == "rate" else "closed"
    if scenario.mode != want:
        why = "rates pace an open loop" if rate else "users are a closed loop"
        raise UsageError(
            f"a sweep over {key} needs mode = {want!r} (the scenario's mode is "
            f"{scenario.mode!r}): {why}"
        )
    if any(not (math.isfinite(v) and v > 0) for v in levels):  # an infinite rate: no pacing
        raise UsageError(f"every {key} of a sweep must be a finite number > 0, got {levels}")
    file = _RunFile(path)
    points = []
    for step, level in enumerate(levels):
        point = await _point(
            scenario, file, step=step, key=key, level=level, slos=slos, kwargs=kwargs
        )
        points.append(point)
        if on_point is not None:
            on_point(point)
    return points


@dataclass(frozen=True)
class SearchResult:
    """What :func:`search` found.

    Attributes:
        rate: the highest rate shown to meet the SLOs (None: no rate probed met them).
        passing: the probe at ``rate``.
        failing: the lowest rate shown not to meet them (None: ``rate_max`` met them).
        points: every probe, in the order run (repeated probes included).
        resolution: the relative bracket width the search stopped at.
        repeated: probes run again because the client lagged while they failed.
    """

    rate: float | None
    passing: LoadPoint | None
    failing: LoadPoint | None
    points: list[LoadPoint] = field(default_factory=list)
    resolution: float = 0.05
    repeated: int = 0

    def lines(self) -> list[str]:
        """The verdict, then the last passing and the first failing probe."""
        out = []
        if self.rate is None:
            out.append("no rate probed met the SLO")
        elif self.failing is None:
            out.append(f"the SLO is met at the highest rate allowed, {self.rate:g} req/s")
        else:
            out.append(
                f"highest rate meeting the SLO: {self.rate:.4g} req/s (within "
                f"{self.resolution:.1%} of the first failing rate, {self.failing.level:.4g} req/s)"
            )
        for name, p in (("last passing", self.passing), ("first failing", self.failing)):
            if p is not None:
                out.append(f"{name}: {_probe_text(p)}")
        probes = f"probes: {len(self.points)}"
        if self.repeated:
            probes += f" ({self.repeated} run again: the client lagged while they failed)"
        out.append(probes)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "resolution": self.resolution,
            "passing": None if self.passing is None else self.passing.to_dict(),
            "failing": None if self.failing is None else self.failing.to_dict(),
            "points": [p.to_dict() for p in self.points],
            "repeated": self.repeated,
        }


def _probe_text(p: LoadPoint) -> str:
    goodput = p.goodput_rps
    shown = "n/a" if goodput is None or math.isnan(goodput) else f"{goodput:.2f} req/s"
    verdict = "met" if p.met else "NOT met"
    text = (
        f"{p.level:.4g} req/s offered, {p.achieved_rps:.4g} achieved, goodput {shown}, "
        f"SLO {verdict}, {p.errors} errors (step {p.step})"
    )
    return text if p.client_note is None else f"{text}; {p.client_note}"


def _passes(p: LoadPoint) -> bool:
    return bool(p.met) and p.errors == 0


def parse_resolution(text: str) -> float:
    """``"5%"`` or ``"0.05"``: a relative bracket width in (0, 1).

    Raises:
        UsageError: not a number, or outside (0, 1).
    """
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise UsageError(f"resolution {text!r}: expected a share such as 5% or 0.05") from None
    if not 0 < value < 1:
        raise UsageError(f"resolution {text!r}: must lie between 0 and 100%")
    return value


async def search(
    scenario: Scenario,
    slos: Sequence[Slo],
    *,
    rate_max: float,
    rate_min: float | None = None,
    resolution: float = 0.05,
    path: str | Path | None = None,
    on_point: OnPoint | None = None,
    repeat_lagged: int = 1,
    **kwargs: Any,
) -> SearchResult:
    """The highest open-loop rate at which ``scenario`` meets every SLO (see the module's text).

    Args:
        scenario: an open loop; each probe replaces its ``rate``.
        slos: the objectives (at least one).
        rate_max: the first probe, and the highest rate reported.
        rate_min: the lowest rate probed while bracketing (default: ``rate_max / 16``).
        resolution: stop once the failing rate is within this share above the passing one.
        path: the run file every probe is appended to (None: memory only).
        on_point: called with each probe as it finishes.
        repeat_lagged: how many times a failing probe whose client lagged is run again (0:
            never; see the module's text).
        kwargs: passed to :func:`latency_analyzer.load.run`.

    Raises:
        UsageError: no SLO, a closed loop, rates that are not positive and ordered, or a
            negative ``repeat_lagged``.
    """
    if not slos:
        raise UsageError("a search needs an SLO to meet (e.g. ttft_p95=800ms)")
    if scenario.mode != "open":
        raise UsageError(
            'a search varies the rate of an open loop (mode = "open"); a closed loop\'s load is '
            "its concurrency: sweep that instead"
        )
    low = rate_max / 16 if rate_min is None else rate_min
    if not 0 < low < rate_max:
        raise UsageError(f"rates: need 0 < rate_min ({low:g}) < rate_max ({rate_max:g})")
    if not 0 < resolution < 1:
        raise UsageError(f"resolution must lie between 0 and 1, got {resolution:g}")
    if repeat_lagged < 0:
        raise UsageError(f"repeat_lagged must be 0 or more, got {repeat_lagged}")
    file = _RunFile(path)
    points: list[LoadPoint] = []
    repeated = 0

    async def probe(rate: float) -> LoadPoint:
        nonlocal repeated
        for attempt in range(repeat_lagged + 1):
            if attempt:
                repeated += 1
            p = await _point(
                scenario, file, step=len(points), key="rate", level=rate, slos=slos, kwargs=kwargs
            )
            points.append(p)
            if on_point is not None:
                on_point(p)
            if _passes(p) or p.client_note is None:
                break
        return p

    def result(passing: LoadPoint | None, failing: LoadPoint | None) -> SearchResult:
        rate = None if passing is None else passing.level
        return SearchResult(rate, passing, failing, points, resolution, repeated)

    hi = await probe(rate_max)
    if _passes(hi):
        return result(hi, None)
    lo: LoadPoint | None = None
    rate = rate_max / 2
    while lo is None:  # bracket: halve until a probe passes
        p = await probe(max(rate, low))
        if _passes(p):
            lo = p
        elif p.level <= low:
            return result(None, p)
        else:
            hi, rate = p, rate / 2
    while hi.level / lo.level - 1 > resolution:  # bisect the bracket
        p = await probe(math.sqrt(lo.level * hi.level))
        lo, hi = (p, hi) if _passes(p) else (lo, p)
    return result(lo, hi)
