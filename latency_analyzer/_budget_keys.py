"""Budget and SLO keys (``ttft_p95``): a stage or metric name with an optional statistic.

The one vocabulary of the pytest budgets (:mod:`latency_analyzer.pytest_plugin`) and of a load
run's SLOs (``latency-analyzer run --slo``); see the plugin's ``_budgets`` for what each
statistic means.
"""

from __future__ import annotations

import difflib
import re
from fractions import Fraction

from .errors import UsageError
from .timeline import CLIENT_STAGES, RESIDUALS, SERVER_STAGES

__all__ = [
    "METRIC_NAMES",
    "NAMES",
    "OPTIONS",
    "SERVER_ONLY_STAGES",
    "STAGE_NAMES",
    "parse_key",
    "valid_keys_text",
]

#: Attribution names a budget can bound: client stages, residuals, then server-only stages.
STAGE_NAMES: tuple[str, ...] = tuple(dict.fromkeys((*CLIENT_STAGES, *RESIDUALS, *SERVER_STAGES)))
#: Stages only the server's own spans can show (``decode`` is also a client stage).
SERVER_ONLY_STAGES: frozenset[str] = frozenset(SERVER_STAGES) - frozenset(CLIENT_STAGES)
#: Per-request (or per-token, ``itl``) metrics; token counts are not durations and are left out.
METRIC_NAMES: tuple[str, ...] = ("ttft", "tpot", "itl", "e2e")
NAMES: tuple[str, ...] = STAGE_NAMES + METRIC_NAMES
#: Marker keywords that are not budgets.
OPTIONS: tuple[str, ...] = ("allow_errors",)

_NAMED_STATS = ("max", "min", "mean", "median")
_PERCENTILE = re.compile(r"p([1-9]\d?|99\d+)")


def _stat(suffix: str) -> tuple[str, Fraction | None] | None:
    if suffix in _NAMED_STATS:
        return ("p50", Fraction(50)) if suffix == "median" else (suffix, None)
    match = _PERCENTILE.fullmatch(suffix)
    if match is None:
        return None
    digits = match.group(1)  # "95" -> 95; "999" -> 99.9; "9999" -> 99.99
    return suffix, Fraction(f"{digits[:2]}.{digits[2:] or 0}")


def parse_key(key: str) -> tuple[str, str, Fraction | None]:
    """Split ``key`` into (name, stat, quantile); a bare name means ``max``.

    Raises:
        UsageError: the name or the statistic is unknown (the message lists the valid ones).
    """
    if key in NAMES:
        return key, "max", None
    name, sep, suffix = key.rpartition("_")
    stat = _stat(suffix) if sep and name in NAMES else None
    if stat is None:
        raise UsageError(f"unknown budget key {key!r}{_suggestion(key)}. {valid_keys_text()}")
    return name, stat[0], stat[1]


def _suggestion(key: str) -> str:
    candidates = [*NAMES, *(f"{n}_{s}" for n in NAMES for s in ("p50", "p90", "p95", "p99"))]
    close = difflib.get_close_matches(key, candidates, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def valid_keys_text() -> str:
    """What a budget key may be, for error messages and ``--help``."""
    return (
        f"A key is a stage or metric name: {', '.join(NAMES)}; with an optional statistic "
        "suffix: none (every request, i.e. the max), _max, _min, _mean, _median, _p50, _pNN "
        "(_p90, _p95, _p99; _p999 = 99.9th). Other keywords: "
        f"{', '.join(OPTIONS)}. Values: seconds, or a string with a unit ns, us, µs, ms, s."
    )
