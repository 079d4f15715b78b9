"""What a diagnosis says: ``Finding``, ``WhatIf``, the ``Thresholds`` rules fire at, and text.

Plain data with no logic beyond formatting: the rules (``_rules_*``) build findings, the engine
(``_engine``) restates and ranks them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class Thresholds:
    """When a rule speaks. Shares are fractions; times are seconds (means per request).

    Attributes:
        min_time_s: a finding with less time at stake per request than this stays silent.
        dns_slow_s: a lookup slower than this is slow (a cache or ``/etc/hosts`` answers in
            well under a millisecond; a nearby resolver in a few).
        dns_cached_s: a lookup faster than this was answered by a cache (it is not counted).
        dns_every_fraction: in a set, real lookups on at least this share of requests means
            no cache.
        setup_share: one request: connect + tls + h2_setup above this share of TTFT (a
            stream) or e2e, less the client's own ``other`` time in it.
        new_connection_fraction: in a set, new connections on more than this share of requests
            (not counting the first per origin) means no keep-alive or a pool too small.
        pool_wait_share: pool_wait above this share of e2e (in a set, the pool_wait spent
            while the pool was full: as many connections in use as the set ever held).
        schedule_lag_share: schedule_lag above this share of e2e.
        queue_share: server_queue above this share of TTFT.
        prefill_share, prefill_slow_s: prefill above this share of TTFT *and* this long.
        decode_share, tpot_slow_s: decode above this share of e2e *and* TPOT above this.
        network_share: the ``network`` residual above this share of e2e.
        itl_jitter_ratio: P95 gap between chunks above this multiple of the median gap.
        itl_min_gaps: fewer gaps than this say nothing about jitter.
        path_share: the round trips a request paid (path RTT × their number) above this share
            of e2e: the path, not the server, is what is slow.
        connect_rtts: a TCP connect longer than this many path RTTs (plus ``min_time_s``)
            waited for more than the handshake: a lost SYN or a full accept queue.
        itl_burst_s: a median gap below this means the tokens came in one burst (a server
            that sends everything at once): there is no decoding pace to be jittery about.
        min_requests: set rules about "every request" need at least this many requests.
        ttfc_gap_s: TTFT (first visible text) later than TTFC (first token chunk, empty text
            included) by more than this, on average.
    """

    min_time_s: float = 0.002
    dns_slow_s: float = 0.010
    dns_cached_s: float = 0.0005
    dns_every_fraction: float = 0.5
    setup_share: float = 0.25
    new_connection_fraction: float = 0.5
    pool_wait_share: float = 0.10
    schedule_lag_share: float = 0.10
    queue_share: float = 0.5
    prefill_share: float = 0.5
    prefill_slow_s: float = 0.100
    decode_share: float = 0.6
    tpot_slow_s: float = 0.030
    network_share: float = 0.2
    itl_jitter_ratio: float = 3.0
    itl_min_gaps: int = 8
    path_share: float = 0.25
    connect_rtts: float = 2.0
    min_requests: int = 3
    itl_burst_s: float = 0.0005
    ttfc_gap_s: float = 0.005


@dataclass(frozen=True)
class Finding:
    """One diagnosis.

    Attributes:
        rule: the rule's id (``dns``, ``new_connection``, ``pool_wait`` ...: ``RULES``).
        title: one line for a person.
        evidence: the numbers that made the rule fire.
        cause: the likely cause.
        remedy: what to change.
        time_at_stake_s: mean seconds of ``metric`` per request the cause costs now (sort
            key). A rule states it in e2e terms; ranking restates it in ``metric`` terms.
        requests: how many requests the evidence covers.
        data: the evidence as numbers (seconds, shares, counts).
        stages: the stages whose time the remedy removes (empty: the rule says so itself).
        metric: what ``time_at_stake_s`` and ``what_if_s`` measure: ``"ttft"`` for streamed
            requests, ``"e2e"`` otherwise.
        e2e_at_stake_s: mean e2e seconds per request at stake (for a stream, beside TTFT).
        ttft_at_stake_s: mean TTFT seconds at stake; a rule about what happens after the first
            token sets 0.0; None: derived from ``stages`` (or, without them, e2e).
        baseline_s: ``metric`` now (mean per request).
        what_if_s: ``metric`` with this remedy: ``baseline_s - time_at_stake_s``.
    """

    rule: str
    title: str
    evidence: str
    cause: str
    remedy: str
    time_at_stake_s: float
    requests: int = 1
    data: Mapping[str, float] = field(default_factory=dict)
    stages: tuple[str, ...] = ()
    metric: str = "e2e"
    e2e_at_stake_s: float | None = None
    ttft_at_stake_s: float | None = None
    baseline_s: float | None = None
    what_if_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", MappingProxyType(dict(self.data)))

    def __str__(self) -> str:
        metric = self.metric.upper() if self.metric == "ttft" else self.metric
        text = (
            f"[{self.rule}] {self.title} ({_ms(self.time_at_stake_s)} of {metric} per request "
            f"at stake)\n  evidence: {self.evidence}\n  cause:    {self.cause}\n"
            f"  remedy:   {self.remedy}"
        )
        if self.baseline_s is not None and self.what_if_s is not None:
            text += (
                f"\n  what-if:  {metric} {_ms(self.what_if_s)} with the remedy, "
                f"{_ms(self.baseline_s)} now"
            )
        return text

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every field, times in seconds."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["data"] = dict(self.data)
        out["stages"] = list(self.stages)
        return out


#: Rules whose remedy is on the client's side and removes the named stages outright (a DNS
#: cache, connection reuse, HTTP/2, a bigger pool, a client with CPU to spare): the combined
#: what-if applies these. Server-side remedies only bound what could be saved.
CLIENT_REMEDIES = frozenset(
    {"dns", "new_connection", "tls_resumption", "http1", "pool_wait", "schedule_lag"}
)


@dataclass(frozen=True)
class WhatIf:
    """The metric with several remedies applied at once, from the requests' own stages.

    Attributes:
        metric: ``"ttft"`` or ``"e2e"``.
        now_s: the metric today (mean per request).
        then_s: the metric with the remedies (mean per request).
        rules: the findings applied, by rule id.
        stages: the stages removed (each counted once, however many findings name it).
    """

    metric: str
    now_s: float
    then_s: float
    rules: tuple[str, ...]
    stages: tuple[str, ...]

    def __str__(self) -> str:
        metric = self.metric.upper() if self.metric == "ttft" else self.metric
        if not self.rules:
            return f"what-if: nothing to remove; {metric} {_ms(self.now_s)}"
        return (
            f"what-if: with {', '.join(_REMEDY_NAMES.get(r, r) for r in self.rules)}: "
            f"{metric} {_ms(self.then_s)} instead of {_ms(self.now_s)} "
            f"(removes {' + '.join(self.stages)})"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: seconds, rule ids and stage names."""
        out = dataclasses.asdict(self)
        out["rules"], out["stages"] = list(self.rules), list(self.stages)
        return out


_REMEDY_NAMES = {
    "dns": "a DNS cache",
    "new_connection": "connection reuse",
    "tls_resumption": "TLS resumption",
    "http1": "HTTP/2",
    "pool_wait": "a pool sized to the load",
    "schedule_lag": "a client that keeps up",
}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def format_findings(findings: Sequence[Finding]) -> str:
    """The findings as text, one block each; a line saying so when there are none."""
    if not findings:
        return "no findings: nothing stands out"
    return "\n".join(f"{i}. {f}" for i, f in enumerate(findings, start=1))
