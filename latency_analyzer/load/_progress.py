"""A one-line progress display for a load run: count, elapsed, ETA, and the rate for open loops.

Drawn on a terminal only (``\\r`` then the line), at most every ``interval`` seconds, and
cleared at the end. A count-bounded run shows ``done/total``; a duration-bounded one shows
elapsed out of the duration; an open loop adds the achieved rate beside the offered one.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from ._scenario import Scenario

__all__ = ["ProgressLine"]


def _clock(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}:{secs:02d}"
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


class ProgressLine:
    """Call as ``progress(done, total)`` after each request; ``close()`` at the end.

    Args:
        scenario: the run (its ``requests``, ``duration``, ``mode`` and ``rate``).
        stream: where to draw (default: stderr); nothing is drawn unless it is a terminal
            or ``force`` is set.
        interval: seconds between redraws.
        force: draw even when ``stream`` is not a terminal.
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        stream: TextIO | None = None,
        interval: float = 0.2,
        force: bool = False,
    ) -> None:
        self.sc = scenario
        self.stream = sys.stderr if stream is None else stream
        self.enabled = force or self.stream.isatty()
        self.interval = interval
        self.t0 = time.monotonic()
        self._last = -1e9
        self._width = 0

    def line(self, done: int, total: int | None, now: float) -> str:
        """The text for ``done`` requests stored ``now - t0`` seconds into the run."""
        elapsed = now - self.t0
        parts = [f"{done}/{total} requests" if total else f"{done} requests"]
        duration = self.sc.duration
        if total:
            parts.append(f"{_clock(elapsed)} elapsed")
            if done:
                parts.append(f"ETA {_clock(elapsed / done * (total - done))}")
        elif duration:
            parts.append(f"{_clock(elapsed)} of {_clock(duration)}")
            parts.append(f"ETA {_clock(duration - elapsed)}")
        else:
            parts.append(f"{_clock(elapsed)} elapsed")
        if self.sc.mode == "open" and elapsed > 0:
            offered = "" if self.sc.rate is None else f" (offered {self.sc.rate:g}/s)"
            parts.append(f"{done / elapsed:.1f} req/s{offered}")  # a trace has no one rate
        return " · ".join(parts)

    def __call__(self, done: int, total: int | None) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < self.interval and done != total:
            return
        self._last = now
        self._draw(self.line(done, total, now))

    def _draw(self, text: str) -> None:
        pad = max(0, self._width - len(text))
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._width = len(text)

    def close(self) -> None:
        """Clear the line (the summary follows)."""
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0
