"""The four field scenarios as presets: cold-start storm, long tail, mixed load, fault injection.

Each preset is a function returning a :class:`Scenario` (override any field with keywords), so
it runs from Python (``run_sync(long_tail(url))``) and the CLI (``--preset long_tail``).
Fault injection also needs a proxy in front of the target: :func:`run_fault_injection`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from ..analysis import WaterfallSet
from ..errors import UsageError
from ._dists import dist
from ._faults import FaultProxy, OutageReport, outage_report
from ._runner import RunResult, run
from ._scenario import Scenario, Template

__all__ = [
    "LENGTH_EDGES",
    "PRESETS",
    "FaultResult",
    "Restartable",
    "cold_start_storm",
    "fault_injection",
    "length_buckets",
    "long_tail",
    "mixed_load",
    "preset_scenario",
    "run_fault_injection",
]

#: Prompt-length bucket edges (tokens) for the long-tail report.
LENGTH_EDGES = (1024, 4096, 16384, 65536, 131072)


def _scenario(defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> Scenario:
    # checked as a file is: an unknown or mistyped override is a UsageError naming its key
    mode = overrides.get("mode", defaults.get("mode"))
    if mode != defaults.get("mode"):  # the preset's keys of its own loop do not carry over
        drop = ("concurrency",) if mode == "open" else ("rate", "arrival", "max_in_flight")
        defaults = {k: v for k, v in defaults.items() if k not in drop}
    return Scenario.from_dict({**defaults, **overrides})


def cold_start_storm(url: str, **overrides: Any) -> Scenario:
    """100 requests at t = 0, each on a new connection (dns, connect, tls every time)."""
    defaults: dict[str, Any] = {
        "url": url,
        "name": "cold_start_storm",
        "mode": "open",
        "arrival": "burst",
    }
    defaults |= {"requests": 100, "new_connections": True}
    return _scenario(defaults, overrides)


def long_tail(url: str, **overrides: Any) -> Scenario:
    """1,000 requests with prompts uniform over 512–131,072 tokens, 8 concurrent users.

    Report with :func:`length_buckets` (P99 and errors/timeouts per length bucket).
    """
    template = Template("long_tail", prompt_tokens=dist({"uniform": [512, 131072]}), max_tokens=128)
    defaults: dict[str, Any] = {"url": url, "name": "long_tail", "mode": "closed", "concurrency": 8}
    defaults |= {"requests": 1000, "templates": (template,), "timeout": 300.0}
    return _scenario(defaults, overrides)


def mixed_load(url: str, **overrides: Any) -> Scenario:
    """70% short chat, 20% code generation, 10% long-document summary; Poisson at 10 req/s."""
    mix = (
        Template("short_chat", 0.7, dist({"uniform": [50, 500]}), max_tokens=128),
        Template("code_generation", 0.2, dist({"uniform": [500, 2000]}), max_tokens=1024),
        Template("long_summary", 0.1, dist({"uniform": [8000, 32000]}), max_tokens=512),
    )
    defaults: dict[str, Any] = {"url": url, "name": "mixed_load", "mode": "open", "rate": 10.0}
    defaults |= {"arrival": "poisson", "duration": 60.0, "templates": mix}
    return _scenario(defaults, overrides)


def fault_injection(url: str, **overrides: Any) -> Scenario:
    """Constant 50 req/s for 10 s; run it with :func:`run_fault_injection` (outage at 3 s)."""
    defaults: dict[str, Any] = {"url": url, "name": "fault_injection", "mode": "open", "rate": 50.0}
    defaults |= {"arrival": "constant", "duration": 10.0, "timeout": 5.0}
    return _scenario(defaults, overrides)


PRESETS: dict[str, Callable[..., Scenario]] = {
    "cold_start_storm": cold_start_storm,
    "long_tail": long_tail,
    "mixed_load": mixed_load,
    "fault_injection": fault_injection,
}


def preset_scenario(name: str, **fields: Any) -> Scenario:
    """A preset by name, with ``fields`` (``url`` required) overriding its defaults.

    Raises:
        UsageError: unknown preset or no url.
    """
    if name not in PRESETS:
        raise UsageError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
    if "url" not in fields:
        raise UsageError(f"scenario key 'url' is required (preset {name!r} has none)")
    return PRESETS[name](fields.pop("url"), **fields)


def length_buckets(
    ws: WaterfallSet, edges: tuple[int, ...] = LENGTH_EDGES
) -> dict[str, dict[str, Any]]:
    """Per prompt-length bucket: requests, P99 ttft/e2e (s, with CI), errors and timeouts."""
    out: dict[str, dict[str, Any]] = {}
    for label, part in ws.group_by("prompt_tokens", bins=list(edges)).items():
        errors = part.counts()["errors_by_type"]
        out[str(label)] = {
            "requests": len(part),
            "ttft_p99": part.percentiles("ttft", (99,))["p99"],
            "e2e_p99": part.percentiles("e2e", (99,))["p99"],
            "errors": sum(errors.values()),
            "timeouts": errors.get("timeout", 0),
        }
    return dict(sorted(out.items(), key=lambda kv: _lower_edge(kv[0])))


def _lower_edge(label: str) -> float:
    return float(label.strip("(>] ").split(",")[0])


class Restartable(Protocol):
    """A server the runner can kill and start again: ``start()`` returns its (host, port)."""

    def start(self) -> tuple[str, int]: ...

    def kill(self) -> None: ...


@dataclass(frozen=True)
class FaultResult:
    """A fault-injection run and what it saw of the outage."""

    run: RunResult
    outage: OutageReport


async def run_fault_injection(
    scenario: Scenario,
    *,
    outage_at: float = 3.0,
    outage_s: float = 1.0,
    server: Restartable | None = None,
    **run_kwargs: Any,
) -> FaultResult:
    """Run ``scenario`` through a :class:`FaultProxy` that fails for a window.

    Without ``server``: the proxy drops every connection and refuses new ones from
    ``outage_at`` for ``outage_s`` seconds. With ``server``: the runner kills that server at
    ``outage_at`` (its connections die with it), waits ``outage_s``, starts it again and points
    the proxy at it; the injected outage is then kill → restarted.
    """
    parts = urlsplit(scenario.url)
    if parts.scheme != "http":
        raise UsageError("fault injection proxies plain http targets")
    upstream = server.start() if server is not None else (parts.hostname or "", parts.port or 80)
    async with FaultProxy(*upstream) as proxy:
        proxied = urlunsplit(parts._replace(netloc=f"{proxy.host}:{proxy.port}"))
        span: list[tuple[int, int]] = []

        async def inject(t0: int) -> None:
            at = t0 + round(outage_at * 1e9)
            if server is None:
                span.append(await proxy.outage(outage_s, at_ns=at))
            else:
                span.append(await _kill_restart(proxy, server, at, outage_s))

        result = await run(scenario.replace(url=proxied), hooks=[inject], **run_kwargs)
    if not span:
        raise UsageError("the run ended before the outage began; lengthen duration")
    return FaultResult(result, outage_report(result.set, *span[0]))


async def _kill_restart(
    proxy: FaultProxy, server: Restartable, at_ns: int, seconds: float
) -> tuple[int, int]:
    import asyncio
    import time

    await asyncio.sleep(max(0.0, (at_ns - time.perf_counter_ns()) / 1e9))
    down = time.perf_counter_ns()
    server.kill()
    proxy.down()  # connections through the proxy die with the server
    await proxy.up()
    await asyncio.sleep(seconds)
    proxy.upstream = await asyncio.to_thread(server.start)
    return down, time.perf_counter_ns()
