"""Checks that a scenario's options can all apply to it, and its request headers.

An option that the chosen loop cannot honour is an error, never ignored: a closed loop has no
rate to keep, an open loop no users to count. Each message names the key as written in a
scenario file and as a ``latency-analyzer run`` flag, and says why.

Header values may be secrets: no message here echoes one.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import UsageError

if TYPE_CHECKING:
    from ._scenario import Scenario

__all__ = ["check_headers", "check_modes", "check_warmup", "flag_name", "request_headers"]

# RFC 9110 field names: a token
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def flag_name(key: str) -> str:
    """The ``run`` flag of a scenario key: ``max_in_flight`` → ``--max-in-flight``."""
    return "--" + key.replace("_", "-")


def _named(key: str) -> str:
    return f"{key!r} ({flag_name(key)})"


def check_modes(sc: Scenario) -> None:
    """Raise when a key was given that the scenario's loop (or trace) cannot apply.

    Raises:
        UsageError: e.g. ``rate`` on a closed loop, ``concurrency`` on an open loop.
    """
    given: dict[str, bool] = {
        "rate": sc.rate is not None,
        "max_in_flight": sc.max_in_flight is not None,
        "burstiness": sc.burstiness != 1.0,
        "concurrency": sc.concurrency != 1,
        "think_time": sc.think_time is not None,
    }
    if sc.mode == "closed":
        why = "a closed loop's users send as their responses come back"
        for key in ("rate", "max_in_flight", "burstiness"):
            if given[key]:
                raise UsageError(
                    f'{_named(key)} applies only to an open loop (mode = "open", --mode '
                    f"open): {why}, with no schedule to keep; this scenario is a closed loop"
                )
        if sc.trace is not None:
            raise UsageError(
                "'trace' (--trace) replays its own arrival instants: it needs an open loop "
                '(mode = "open", --mode open)'
            )
    else:
        for key in ("concurrency", "think_time"):
            if given[key]:
                raise UsageError(
                    f'{_named(key)} applies only to a closed loop (mode = "closed"): an open '
                    "loop's arrivals follow its schedule, not its users' responses; use rate "
                    "and max_in_flight (--rate, --max-in-flight)"
                )
        if sc.trace is not None:
            fixed = {"rate": given["rate"], "burstiness": given["burstiness"]}
            for key, set_ in {**fixed, "ramp_up": sc.ramp_up > 0}.items():
                if set_:
                    raise UsageError(
                        f"{_named(key)} cannot apply to a trace replay: the trace's own "
                        "timestamps set the arrivals (its 'speed' scales them)"
                    )
            if sc.arrival != "poisson":
                raise UsageError(
                    "'arrival' (--arrival) cannot apply to a trace replay: the trace's own "
                    "timestamps set the arrivals"
                )
    if sc.burstiness != 1.0 and sc.arrival != "gamma":
        raise UsageError(
            f'{_named("burstiness")} shapes gamma arrivals only (arrival = "gamma"); '
            f"this scenario's arrivals are {sc.arrival!r}"
        )
    _check_sources(sc)


def check_warmup(sc: Scenario) -> None:
    """Raise when the warm-up would take every request, leaving the statistics empty.

    Checked on the scenario a user gave, not on a worker's share of it (whose request count
    and warm-up are rounded separately).

    Raises:
        UsageError: ``warmup_seconds`` not below ``duration``, or ``warmup_requests`` not
            below ``requests``.
    """
    for warm, bound, unit in (
        ("warmup_seconds", "duration", "s"),
        ("warmup_requests", "requests", ""),
    ):
        w, b = getattr(sc, warm), getattr(sc, bound)
        if w and b and w >= b:
            raise UsageError(
                f"{_named(warm)} is {w:g}{unit}, not below {_named(bound)}, {b:g}{unit}: every "
                "request would be warm-up, left out of the statistics; shorten the warm-up "
                "(0 for none) or lengthen the run"
            )


def check_headers(headers: Mapping[str, Any], header_env: Mapping[str, Any]) -> None:
    """Header names must be tokens, values strings without line breaks, env names valid.

    Raises:
        UsageError: naming the header (never its value).
    """
    for key, table in (("headers", headers), ("header_env", header_env)):
        for name, value in table.items():
            if not isinstance(name, str) or not _TOKEN.fullmatch(name):
                raise UsageError(f"scenario key {key!r}: {name!r} is not a header name")
            if not isinstance(value, str):
                raise UsageError(f"scenario key {key!r}: header {name!r} needs a string value")
            if key == "headers" and ("\r" in value or "\n" in value):
                raise UsageError(f"scenario key 'headers': header {name!r} holds a line break")
            if key == "header_env" and not _env_names(value):
                raise UsageError(
                    f"scenario key 'header_env': header {name!r}: {value!r} is neither an "
                    "environment variable's name nor text with ${NAME} in it"
                )
    both = {n.lower() for n in headers} & {n.lower() for n in header_env}
    if both:
        raise UsageError(f"header {sorted(both)[0]!r} is given in both headers and header_env")


def _check_sources(sc: Scenario) -> None:
    """A request comes from one place: a trace row, a dataset row or a template's synthetic
    prompt."""
    if sc.dataset is not None and sc.trace is not None:
        raise UsageError("give 'dataset' or 'trace', not both: a trace row is its own request")
    source = "dataset" if sc.dataset is not None else "trace" if sc.trace is not None else None
    synthetic = [t.name for t in sc.templates if t.prompt_tokens is not None]
    if source is not None and synthetic:
        raise UsageError(
            f"template {synthetic[0]!r}: 'prompt_tokens' cannot apply with a {source}, whose "
            "rows are the prompts; leave it out (max_tokens and body still apply)"
        )


def _env_names(value: str) -> list[str]:
    """The variables a ``header_env`` value reads: itself, or each ``${NAME}`` in it."""
    if _ENV_NAME.fullmatch(value):
        return [value]
    if "\r" in value or "\n" in value:
        return []
    return _REFERENCE.findall(value)


def _value_of(values: Mapping[str, str], match: re.Match[str]) -> str:
    return values[match.group(1)]


def request_headers(sc: Scenario) -> dict[str, str]:
    """The scenario's headers, ``header_env`` ones read from the environment now: a value
    that is a variable's name is that variable's text; ``"Bearer ${OPENAI_API_KEY}"`` puts
    the variable's text in its place.

    Raises:
        UsageError: an environment variable ``header_env`` names is not set (or holds a line
            break).
    """
    out = dict(sc.headers)
    for name, spec in sc.header_env.items():
        values = {}
        for var in _env_names(spec):
            value = os.environ.get(var)
            if value is None:
                raise UsageError(
                    f"header_env: header {name!r} is read from the environment variable "
                    f"{var}, which is not set: export {var}=..., or drop {name!r} from "
                    "header_env (--header-env)"
                )
            if "\r" in value or "\n" in value:
                raise UsageError(f"header_env: the environment variable {var} holds a line break")
            values[var] = value
        if _ENV_NAME.fullmatch(spec):
            out[name] = values[spec]
        else:
            out[name] = _REFERENCE.sub(functools.partial(_value_of, values), spec)
    return out
