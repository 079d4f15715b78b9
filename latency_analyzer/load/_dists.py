"""Distributions for think times, prompt lengths and arrival gaps; synthetic prompt text.

A distribution is written as a small mapping (from Python, TOML or the CLI) and parsed by
:func:`dist`: ``3`` or ``{"fixed": 3}``, ``{"uniform": [lo, hi]}``, ``{"exponential": mean}``,
``{"normal": [mean, sd]}`` (a draw below 0 is 0), ``{"lognormal": [median, sigma]}``,
``{"choice": [a, b, ...]}`` and ``{"empirical": [a, b, ...]}`` (a value drawn from the list,
each equally likely: the observed distribution). ``{"empirical": {"path": "prompts.jsonl",
"field": "prompt"}}`` names a file whose rows supply the values (prompt lengths measured, or
numbers read); it is read when a run starts (:mod:`latency_analyzer.load._lengths`). Every
draw comes from the run's seeded random stream, so a seed gives the same lengths again.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError

__all__ = ["ARRIVALS", "Dist", "arrival_gaps", "dist", "synthetic_prompt"]

ARRIVALS = ("constant", "poisson", "gamma", "burst")


@dataclass(frozen=True)
class Dist:
    """A distribution of non-negative numbers: ``kind`` and its parameters."""

    kind: str
    params: tuple[float, ...]
    #: an empirical distribution's file (``path``, ``field``) before it is read (params empty)
    source: tuple[tuple[str, str], ...] | None = None

    def sample(self, rng: random.Random) -> float:
        p = self.params
        if self.kind == "fixed":
            return p[0]
        if self.kind == "uniform":
            return rng.uniform(p[0], p[1])
        if self.kind == "exponential":
            return rng.expovariate(1 / p[0]) if p[0] > 0 else 0.0
        if self.kind == "normal":
            return max(0.0, rng.gauss(p[0], p[1]))
        if self.kind == "lognormal":
            return rng.lognormvariate(math.log(p[0]), p[1])
        if not p:  # an empirical file not read yet
            raise UsageError("an empirical distribution from a file is read when the run starts")
        return rng.choice(p)  # "choice", "empirical"

    def to_spec(self) -> dict[str, Any]:
        if self.source is not None:
            return {self.kind: dict(self.source)}
        if self.kind in ("fixed", "exponential"):
            return {self.kind: self.params[0]}
        return {self.kind: list(self.params)}


_ARITY = {"fixed": 1, "uniform": 2, "exponential": 1, "normal": 2, "lognormal": 2}
_SOURCE_KEYS = ("path", "field")


def dist(spec: float | Mapping[str, Any] | Dist) -> Dist:
    """Parse a distribution spec (see the module docstring).

    Raises:
        UsageError: an unknown kind, a wrong number of parameters or a negative value.
    """
    if isinstance(spec, Dist):
        return spec
    if isinstance(spec, int | float) and not isinstance(spec, bool):
        spec = {"fixed": spec}
    if not isinstance(spec, Mapping) or len(spec) != 1:
        raise UsageError(f"a distribution is a number or a table with one key (its kind): {spec!r}")
    ((kind, raw),) = spec.items()
    if kind == "empirical" and isinstance(raw, Mapping):
        return Dist(kind, (), _source(raw))
    values = raw if isinstance(raw, list | tuple) else [raw]
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in values):
        raise UsageError(f"the parameters of {kind!r} must be numbers, got {raw!r}")
    params = tuple(float(x) for x in values)
    if not all(math.isfinite(x) for x in params):
        raise UsageError(f"the parameters of {kind!r} must be finite, got {raw!r}")
    if kind in ("choice", "empirical"):
        if not params:
            raise UsageError(f"{kind} needs at least one value")
    elif _ARITY.get(kind) != len(params):
        raise UsageError(f"unknown distribution {kind!r} or wrong parameters {raw!r}")
    if any(x < 0 for x in params) or (kind == "uniform" and params[0] > params[1]):
        raise UsageError(f"bad parameters for {kind}: {raw!r}")
    return Dist(kind, params)


def _source(raw: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    unknown = sorted(set(raw) - set(_SOURCE_KEYS))
    if unknown:
        raise UsageError(
            f"empirical: unknown key {unknown[0]!r}; expected a list of values or a table "
            f"with some of {list(_SOURCE_KEYS)}"
        )
    path = raw.get("path")
    if not isinstance(path, str) or not path.strip():
        raise UsageError("empirical: 'path' (a .jsonl, a .csv or a folder of .txt) is required")
    if not isinstance(raw.get("field", ""), str):
        raise UsageError("empirical: 'field' must be a key or column name")
    return tuple(sorted(raw.items()))


def arrival_gaps(
    kind: str, rate: float, rng: random.Random, burstiness: float = 1.0
) -> Iterator[float]:
    """Seconds between consecutive arrivals at mean ``rate`` per second.

    ``constant``: exactly 1/rate. ``poisson``: exponential gaps. ``gamma``: gamma gaps with
    shape ``1 / burstiness`` (vLLM's ``--burstiness``: 1 is Poisson, > 1 burstier, < 1 more
    regular), same mean. ``burst``: every request at once (gap 0).

    Raises:
        UsageError: an unknown kind or a rate that is not positive.
    """
    if kind not in ARRIVALS:
        raise UsageError(f"unknown arrival process {kind!r}; expected one of {ARRIVALS}")
    if kind != "burst" and not rate > 0:
        raise UsageError("rate must be > 0")
    mean = 0.0 if kind == "burst" else 1 / rate
    shape = 1 / burstiness if burstiness > 0 else 1.0
    while True:
        if kind == "poisson":
            yield rng.expovariate(rate)
        elif kind == "gamma":
            yield rng.gammavariate(shape, mean / shape)
        else:
            yield mean


FILLER_CYCLE = 4096  # filler words before the text repeats; word i is filler_word(i)
FILLER_WORDS = 997  # distinct filler words


def filler_word(i: int) -> str:
    """Word ``i`` (from 0, within a cycle) of the filler text."""
    return f"w{i % FILLER_WORDS:03d}"


_WORDS = " ".join(filler_word(i) for i in range(FILLER_CYCLE)) + " "
_WORD_LEN = 5  # "w123 ": one whitespace-separated word (one to a few tokens, by tokenizer)


def synthetic_prompt(tokens: int, offset: int = 0) -> str:
    """``tokens`` whitespace-separated filler words (no dataset download; deterministic).

    ``offset`` rotates the text so that prompts of the same length differ (no prefix-cache
    hits between requests unless wanted).
    """
    if tokens <= 0:
        return ""
    start = (offset % FILLER_CYCLE) * _WORD_LEN
    need = tokens * _WORD_LEN
    reps = (start + need) // len(_WORDS) + 1
    return (_WORDS * reps)[start : start + need].rstrip()
