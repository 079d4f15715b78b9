"""Durations as people write them (``"30ms"``, ``"1.5 s"``, ``0.2``) and as reports print them.

Parsing is exact: the number is read as a decimal, scaled to integer nanoseconds, so
``"0.035"`` is 35 000 000 ns and not 34 999 999 after a binary-float round trip.
"""

from __future__ import annotations

import datetime
import math
import re
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

from .errors import UsageError

__all__ = ["UNITS_NS", "format_ns", "is_number", "parse_duration_ns"]

#: Accepted unit suffixes and their size in nanoseconds. A bare number is seconds.
UNITS_NS: dict[str, int] = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 MICRO SIGN
    "μs": 1_000,  # U+03BC GREEK SMALL LETTER MU: what most keyboards produce
    "ms": 1_000_000,
    "s": 1_000_000_000,
}

_DURATION = re.compile(r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)\s*([a-zµμ]*)\s*", re.I)
_HINT = "a number of seconds, or a number with a unit ns, us, µs, ms or s (e.g. '30ms')"


def parse_duration_ns(value: object) -> int:
    """Read a duration and return whole nanoseconds (rounded half-even below 1 ns).

    Args:
        value: ``int``/``float`` seconds, a ``datetime.timedelta``, or a string: a number with
            an optional unit (``ns``, ``us``, ``µs``, ``ms``, ``s``; case-insensitive; spaces
            allowed), where no unit means seconds.

    Returns:
        The duration in nanoseconds, ``>= 0``.

    Raises:
        UsageError: a negative, infinite or NaN value, a bool, or text that is not a duration.
    """
    if isinstance(value, bool):  # bool is an int: True would silently mean 1 s
        raise UsageError(f"not a duration: {value!r}; expected {_HINT}")
    if isinstance(value, datetime.timedelta):
        return _checked(Decimal(value // datetime.timedelta(microseconds=1)) * 1000, value)
    if isinstance(value, int):
        return _checked(Decimal(value) * UNITS_NS["s"], value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UsageError(f"not a finite duration: {value!r}")
        return _checked(Decimal(repr(value)) * UNITS_NS["s"], value)  # repr: as the user wrote it
    if isinstance(value, str):
        return _parse_text(value)
    raise UsageError(f"not a duration: {value!r} ({type(value).__name__}); expected {_HINT}")


def _parse_text(text: str) -> int:
    match = _DURATION.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if match is None or (unit and unit not in UNITS_NS):
        raise UsageError(f"not a duration: {text!r}; expected {_HINT}")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation:  # pragma: no cover - the regex only lets decimals through
        raise UsageError(f"not a duration: {text!r}; expected {_HINT}") from None
    return _checked(number * UNITS_NS[unit or "s"], text)


def _checked(ns: Decimal, original: object) -> int:
    if ns < 0:
        raise UsageError(f"a duration cannot be negative: {original!r}")
    return int(ns.to_integral_value(rounding=ROUND_HALF_EVEN))


def format_ns(ns: float) -> str:
    """``1.234 s``, ``52.31 ms``, ``812.5 µs`` or ``0 ms``: about four figures, for people."""
    if ns == 0:
        return "0 ms"
    if abs(ns) >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if abs(ns) >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e3:.1f} µs"


def is_number(text: str) -> bool:
    """Whether ``text`` reads as a bare number (a duration or a metric without its unit)."""
    try:
        float(text)
    except ValueError:
        return False
    return True
