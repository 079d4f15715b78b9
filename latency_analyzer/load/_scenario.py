"""What a load run does: a :class:`Scenario` (loop, rate or concurrency, bounds, request mix).

Built from Python, from a TOML file (:func:`load_scenario`) or from CLI flags. ``to_dict()`` is
stored with every run; request headers are never part of it (they may hold secrets).
"""

from __future__ import annotations

import dataclasses
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ._dists import ARRIVALS, Dist, dist, synthetic_prompt

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser from PyPI
    import tomli as tomllib

__all__ = ["Scenario", "Template", "load_scenario", "scenario_preset"]

_MODES = ("closed", "open")
_APIS = ("chat", "completions")


@dataclass(frozen=True)
class Template:
    """One kind of request in a mix.

    Attributes:
        name: label stored with each request (``template`` column).
        weight: relative share of requests (normalised over the mix).
        prompt_tokens: synthetic prompt length distribution (None: a one-word prompt).
        max_tokens: the ``max_tokens`` asked for (None: not sent).
        body: extra JSON fields merged into the request body (e.g. ``{"temperature": 0}``).
    """

    name: str = "default"
    weight: float = 1.0
    prompt_tokens: Dist | None = None
    max_tokens: int | None = None
    body: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Template:
        fields = dict(data)
        if fields.get("prompt_tokens") is not None:
            fields["prompt_tokens"] = dist(fields["prompt_tokens"])
        _check_keys(cls, fields, "template")
        return cls(**fields)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["prompt_tokens"] = self.prompt_tokens.to_spec() if self.prompt_tokens else None
        return out


@dataclass(frozen=True)
class Scenario:
    """A load run.

    Attributes:
        url: the endpoint, e.g. ``http://host:8000/v1/chat/completions``.
        name: stored in the ``scenario`` column.
        mode: ``"closed"`` (``concurrency`` users, each waits for its response and
            ``think_time``) or ``"open"`` (arrivals at ``rate`` whatever the responses do).
        concurrency: closed-loop users.
        rate: open-loop arrivals per second (ignored by ``arrival="burst"``).
        arrival: ``constant``, ``poisson``, ``gamma`` (see ``burstiness``) or ``burst``
            (every request at t = 0).
        burstiness: gamma arrivals' 1/shape (1: Poisson, > 1: burstier).
        max_in_flight: open-loop client cap; a request waiting for its turn shows that wait
            as ``schedule_lag`` (its intended start stays the scheduled instant).
        think_time: closed loop: pause after each response (a :class:`Dist`).
        duration: seconds during which requests are issued (then in-flight ones finish).
        requests: at most this many requests; at least one of duration/requests is needed.
        ramp_up: seconds over which closed-loop users start, or the open-loop rate rises
            linearly from 0 to ``rate``.
        warmup_requests, warmup_seconds: the first requests (by count, or issued within the
            first seconds) are marked warm-up: stored, excluded from statistics.
        templates: the request mix.
        api: ``chat`` (messages) or ``completions`` (prompt).
        model, stream: request body fields.
        new_connections: a new connection for every request (no keep-alive).
        timeout: seconds per request.
        seed: for the mix, prompt lengths, think times and arrivals.
    """

    url: str
    name: str = "run"
    mode: str = "closed"
    concurrency: int = 1
    rate: float | None = None
    arrival: str = "poisson"
    burstiness: float = 1.0
    max_in_flight: int | None = None
    think_time: Dist | None = None
    duration: float | None = None
    requests: int | None = None
    ramp_up: float = 0.0
    warmup_requests: int = 0
    warmup_seconds: float = 0.0
    templates: tuple[Template, ...] = (Template(),)
    api: str = "chat"
    model: str = "model"
    stream: bool = True
    new_connections: bool = False
    timeout: float = 60.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise UsageError(f"mode must be one of {_MODES}, got {self.mode!r}")
        if self.api not in _APIS:
            raise UsageError(f"api must be one of {_APIS}, got {self.api!r}")
        if self.arrival not in ARRIVALS:
            raise UsageError(f"arrival must be one of {ARRIVALS}, got {self.arrival!r}")
        if self.duration is None and self.requests is None:
            raise UsageError("give duration=, requests= or both")
        if self.mode == "open" and self.arrival != "burst" and not (self.rate or 0) > 0:
            raise UsageError("an open loop needs rate > 0 (or arrival='burst')")
        if self.mode == "open" and self.arrival == "burst" and self.requests is None:
            raise UsageError("a burst needs requests=")
        if self.concurrency < 1 or (self.max_in_flight is not None and self.max_in_flight < 1):
            raise UsageError("concurrency and max_in_flight must be >= 1")
        if not self.templates or sum(t.weight for t in self.templates) <= 0:
            raise UsageError("the mix needs at least one template with a positive weight")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Scenario:
        """Build from a mapping (TOML table); ``templates`` is a list of tables.

        Raises:
            UsageError: unknown keys or bad values.
        """
        fields = dict(data)
        fields.pop("sweep", None)
        if "templates" in fields:
            fields["templates"] = tuple(Template.from_dict(t) for t in fields["templates"])
        if fields.get("think_time") is not None:
            fields["think_time"] = dist(fields["think_time"])
        _check_keys(cls, fields, "scenario")
        return cls(**fields)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["templates"] = [t.to_dict() for t in self.templates]
        out["think_time"] = self.think_time.to_spec() if self.think_time else None
        return out

    def replace(self, **changes: Any) -> Scenario:
        return dataclasses.replace(self, **changes)

    def pick(self, rng: random.Random) -> Template:
        """A template drawn by weight."""
        weights = [t.weight for t in self.templates]
        return rng.choices(self.templates, weights)[0]

    def body(
        self, template: Template, rng: random.Random, index: int
    ) -> tuple[dict[str, Any], int]:
        """The JSON body of one request and its synthetic prompt length (-1 if unset)."""
        length = -1
        prompt = "hi"
        if template.prompt_tokens is not None:
            length = max(1, round(template.prompt_tokens.sample(rng)))
            prompt = synthetic_prompt(length, offset=index)
        body: dict[str, Any] = {"model": self.model, "stream": self.stream}
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        if template.max_tokens is not None:
            body["max_tokens"] = template.max_tokens
        body.update(template.body)
        return body, length


def _check_keys(cls: type, fields: Mapping[str, Any], what: str) -> None:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise UsageError(f"unknown {what} keys {unknown}; expected some of {sorted(known)}")


def load_scenario(path: str | Path, **overrides: Any) -> tuple[Scenario, dict[str, Sequence[Any]]]:
    """Read a scenario TOML file; returns the scenario and its ``[sweep]`` table (may be empty).

    A ``preset = "NAME"`` key starts from that preset (its other keys override it).

    Raises:
        UsageError: the file is not valid TOML or holds unknown keys.
    """
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: {exc}") from None
    data.update({k: v for k, v in overrides.items() if v is not None})
    sweep = dict(data.pop("sweep", {}))
    preset = data.pop("preset", None)
    if preset is not None:
        from ._presets import preset_scenario

        return preset_scenario(preset, **data), sweep
    return Scenario.from_dict(data), sweep


def scenario_preset(path: str | Path) -> str | None:
    """The ``preset = "NAME"`` of a scenario file, or None (no preset, or not readable TOML:
    :func:`load_scenario` says what is wrong with it)."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return None
    preset = data.get("preset")
    return preset if isinstance(preset, str) else None
