"""What a load run does: a :class:`Scenario` (loop, rate or concurrency, bounds, request mix).

Built from Python, from a TOML file (:func:`load_scenario`) or from CLI flags. ``to_dict()`` is
stored with every run; request headers are never part of it (they may hold secrets).

A file or mapping is checked before anything is built: every key must be known and hold a value
of its field's type (``concurrency = "4"`` is an error, not a string compared with an int), a
key without a default (``url``) must be there, numbers must be finite. Every problem is a
:class:`~latency_analyzer.errors.UsageError` whose message names the file, the key and the
reason; the CLI prints it and exits 2.
"""

from __future__ import annotations

import dataclasses
import math
import random
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..capture.batching import DEFAULT_WINDOW
from ..errors import UsageError
from ._checks import check_headers, check_modes
from ._dists import ARRIVALS, Dist, dist, synthetic_prompt
from ._monitor import LOOP_LAG_LIMIT_S

__all__ = ["Scenario", "Template", "kind_of"]

_MODES = ("closed", "open")
_APIS = ("chat", "completions")
_READ_BATCHING_MAX = LOOP_LAG_LIMIT_S / 2  # a wait alone never makes the reads lag past it


@dataclass(frozen=True)
class Template:
    """One kind of request in a mix.

    Attributes:
        name: label stored with each request (``template`` column).
        weight: relative share of requests (normalised over the mix).
        prompt_tokens: synthetic prompt length distribution (None: a one-word prompt).
        max_tokens: the ``max_tokens`` asked for (None: not sent).
        body: extra JSON fields merged into the request body (e.g. ``{"temperature": 0}``).
        min_tokens: sent as ``min_tokens`` (vLLM's and SGLang's extra field: no end of
            sequence before that many tokens); capped at the request's ``max_tokens``.
        ignore_eos: sent as ``ignore_eos`` (vLLM, SGLang: generate up to ``max_tokens``
            whatever the model's end-of-sequence token says).
        output_tokens: a distribution of ``max_tokens``, drawn per request (instead of the
            one number ``max_tokens``).
    """

    name: str = "default"
    weight: float = 1.0
    prompt_tokens: Dist | None = None
    max_tokens: int | None = None
    body: Mapping[str, Any] = field(default_factory=dict)
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    output_tokens: Dist | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise UsageError(f"template {self.name!r}: max_tokens must be >= 1")
        if self.min_tokens is not None and self.min_tokens < 0:
            raise UsageError(f"template {self.name!r}: min_tokens must be >= 0")
        if self.output_tokens is not None and self.max_tokens is not None:
            raise UsageError(
                f"template {self.name!r}: give max_tokens (one number) or output_tokens (a "
                "distribution of it), not both"
            )
        fixed = self.max_tokens
        if self.min_tokens is not None and fixed is not None and self.min_tokens > fixed:
            raise UsageError(
                f"template {self.name!r}: min_tokens ({self.min_tokens}) is above max_tokens "
                f"({fixed})"
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | Template) -> Template:
        """Build from a mapping (a TOML table); a Template is returned as it is.

        Raises:
            UsageError: not a table, unknown keys or bad values.
        """
        if isinstance(data, Template):
            return data
        if not isinstance(data, Mapping):
            raise UsageError(f"a template must be a table, got {_kind(data)}")
        fields = dict(data)
        _check_keys(cls, fields, "template")
        for key in ("prompt_tokens", "output_tokens"):
            if fields.get(key) is not None:
                fields[key] = _dist_field(fields[key], key)
        _check_types(cls, fields, "template")
        return cls(**fields)

    def output_fields(self, rng: random.Random, row_max: int | None = None) -> dict[str, Any]:
        """The output-length fields of one request's body: ``max_tokens`` (``row_max``, a
        dataset or trace row's own, else a draw of ``output_tokens``, else ``max_tokens``),
        ``min_tokens`` (capped at ``max_tokens``) and ``ignore_eos``, each only when set."""
        out: dict[str, Any] = {}
        if row_max is not None:
            out["max_tokens"] = row_max
        elif self.output_tokens is not None:
            out["max_tokens"] = max(1, round(self.output_tokens.sample(rng)))
        elif self.max_tokens is not None:
            out["max_tokens"] = self.max_tokens
        if self.min_tokens is not None:
            out["min_tokens"] = min(self.min_tokens, out.get("max_tokens", self.min_tokens))
        if self.ignore_eos is not None:
            out["ignore_eos"] = self.ignore_eos
        return out

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["prompt_tokens"] = self.prompt_tokens.to_spec() if self.prompt_tokens else None
        out["output_tokens"] = self.output_tokens.to_spec() if self.output_tokens else None
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
        headers: sent with every request (e.g. ``Authorization``). Never stored: the run
            file's scenario lists their names only.
        header_env: header name → environment variable its value is read from at run time
            (``{Authorization = "OPENAI_API_KEY"}`` sends the variable's text as it is).
        body_extra: JSON fields merged into every request body (a template's ``body`` goes
            on top of them).
        dataset: prompts from a file (see :mod:`latency_analyzer.load._datasets`).
        trace: a request log replayed at its own instants (an open loop; see
            :mod:`latency_analyzer.load._trace`).
        tokenizer: a local ``tokenizer.json`` or tokenizer folder: prompt lengths are then
            built and measured in tokens (see :mod:`latency_analyzer.load._tokenizer`);
            None: in words, marked approximate.
        read_batching: the longest, in seconds, that the run's event loop lets a stream's
            read wait while other streams are busy, so that it takes their arrivals in one
            wake-up instead of one each (see :mod:`latency_analyzer.capture.batching`). The
            arrival times are the kernel's stamps either way; 0 reads each at once, as
            asyncio does. At most half the self-check's read-lag limit (0.005 of 0.010).
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
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    header_env: Mapping[str, str] = field(default_factory=dict)
    body_extra: Mapping[str, Any] = field(default_factory=dict)
    dataset: Mapping[str, Any] | None = None
    trace: Mapping[str, Any] | None = None
    tokenizer: str | None = None
    read_batching: float = DEFAULT_WINDOW

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise UsageError(f"mode must be one of {_MODES}, got {self.mode!r}")
        if self.api not in _APIS:
            raise UsageError(f"api must be one of {_APIS}, got {self.api!r}")
        if self.arrival not in ARRIVALS:
            raise UsageError(f"arrival must be one of {ARRIVALS}, got {self.arrival!r}")
        if self.duration is None and self.requests is None and self.trace is None:
            raise UsageError(
                "a run needs a bound: 'duration' (--duration SECONDS), 'requests' (--requests "
                "N) or both"
            )
        check_modes(self)
        check_headers(self.headers, self.header_env)
        timed = self.trace is None and self.arrival != "burst"  # a trace is its own schedule
        if self.mode == "open" and timed and not (self.rate or 0) > 0:
            raise UsageError("an open loop needs rate > 0 (or arrival='burst')")
        if self.mode == "open" and self.arrival == "burst" and self.requests is None:
            raise UsageError("a burst needs requests=")
        if self.concurrency < 1 or (self.max_in_flight is not None and self.max_in_flight < 1):
            raise UsageError("concurrency and max_in_flight must be >= 1")
        if not self.templates or sum(t.weight for t in self.templates) <= 0:
            raise UsageError("the mix needs at least one template with a positive weight")
        if not 0 <= self.read_batching <= _READ_BATCHING_MAX:
            raise UsageError(
                f"read_batching must be between 0 and {_READ_BATCHING_MAX} seconds, got "
                f"{self.read_batching!r}"
            )
        if self.think_time is not None and self.think_time.source is not None:
            raise UsageError("think_time: an empirical file gives lengths; list the seconds")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Scenario:
        """Build from a mapping (TOML table); ``templates`` is a list of tables.

        Raises:
            UsageError: unknown keys or bad values.
        """
        fields = dict(data)
        fields.pop("sweep", None)
        fields.pop("header_names", None)  # to_dict's record of the headers sent, not an input
        _check_keys(cls, fields, "scenario")
        if "templates" in fields:
            fields["templates"] = _templates(fields["templates"])
        if fields.get("think_time") is not None:
            fields["think_time"] = _dist_field(fields["think_time"], "think_time")
        _check_types(cls, fields, "scenario")
        return cls(**fields)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["templates"] = [t.to_dict() for t in self.templates]
        out["think_time"] = self.think_time.to_spec() if self.think_time else None
        out["header_names"] = sorted([*self.headers, *self.header_env])
        del out["headers"]  # values may be secrets
        out["header_env"] = dict(self.header_env)
        out["body_extra"] = dict(self.body_extra)
        out["dataset"] = None if self.dataset is None else dict(self.dataset)
        out["trace"] = None if self.trace is None else dict(self.trace)
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
        """The JSON body of one request and its synthetic prompt length in words (-1 if
        unset); a run builds its bodies with its tokenizer, if any, instead."""
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
        body.update(template.output_fields(rng, None))
        body.update(self.body_extra)
        body.update(template.body)
        return body, length


def _check_keys(cls: type, fields: Mapping[str, Any], what: str) -> None:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        keys = ", ".join(repr(k) for k in unknown)
        raise UsageError(f"unknown {what} key {keys}; expected some of {sorted(known)}")
    for f in dataclasses.fields(cls):
        no_default = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if no_default and f.name not in fields:
            raise UsageError(f"{what} key {f.name!r} is required")


def _templates(value: Any) -> tuple[Template, ...]:
    if not isinstance(value, list | tuple):
        raise UsageError(f"scenario key 'templates': expected a list of tables, got {_kind(value)}")
    out = []
    for i, item in enumerate(value):
        try:
            out.append(Template.from_dict(item))
        except UsageError as exc:
            raise UsageError(f"templates[{i}]: {exc}") from None
    return tuple(out)


def _dist_field(value: Any, key: str) -> Dist:
    try:
        return dist(value)
    except UsageError as exc:
        raise UsageError(f"key {key!r}: {exc}") from None


_NAMES: dict[Any, str] = {
    str: "a string",
    int: "an integer",
    float: "a finite number",
    bool: "true or false",
    Mapping: "a table",
    tuple: "an array of tables",
}


def _kind(value: Any) -> str:
    """What a value is, in TOML's words; strings are not echoed (a value may be a secret)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list | tuple):
        return "an array"
    return type(value).__name__


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` has the field type ``hint`` (bool is not an int here; int is a float)."""
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(_fits(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is Any:
        return True
    if origin is not None:
        return isinstance(value, origin)  # tuple[Template, ...], Mapping[str, Any]: built above
    if hint is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if hint is float:
        return isinstance(value, int | float) and math.isfinite(value)
    return isinstance(value, hint)


def _check_types(cls: type, fields: Mapping[str, Any], what: str) -> None:
    hints = typing.get_type_hints(cls)
    for key, value in fields.items():
        hint = hints[key]
        if _fits(value, hint):
            continue
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        wanted = [a for a in (typing.get_args(hint) if union else (hint,)) if a is not type(None)]
        want = " or ".join(_NAMES.get(typing.get_origin(a) or a, str(a)) for a in wanted)
        raise UsageError(f"{what} key {key!r}: expected {want}, got {_kind(value)}")


def kind_of(value: Any) -> str:
    """How a value from a file is named in an error message (``a string``, ``a table``)."""
    return _kind(value)
