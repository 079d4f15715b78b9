"""Root-cause diagnosis: findings with evidence, likely cause and remedy, ranked by time.

::

    from latency_analyzer.diagnose import diagnose, diagnose_set, probe_alpn

    for finding in diagnose(wf):             # one request
        print(finding)
    diagnose_set(waterfalls)                 # many: a list of waterfalls or a WaterfallSet
    diagnose(wf, server_alpn=probe_alpn(url))   # lets the HTTP/1.1-vs-h2 rule speak
    what_if(wf, diagnose(wf))                # the TTFT with every client-side remedy

Each rule looks at the requests' exclusive stage times (their attribution), connection and
TLS facts, and token gaps. Findings are judged against the metric that matters: TTFT when the
requests stream tokens, e2e otherwise. A finding's ``time_at_stake_s`` is the mean time of that
metric per request that the named cause costs today (an upper bound on what the remedy saves),
``what_if_s`` the metric with the remedy applied to the requests' own stages; findings are
sorted by time at stake. Every threshold is a field of ``Thresholds``. Statistics use
successful, non-warm-up requests only. A ``WaterfallSet`` keeps columns, not waterfalls, so
the rules that need TLS resumption, ALPN, per-origin grouping or token gaps speak only when
given waterfalls.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from .analysis import WaterfallSet
from .capture.alpn import aprobe_alpn, probe_alpn
from .timeline import CLIENT_STAGES, Waterfall, exclusive_ns

__all__ = [
    "CLIENT_REMEDIES",
    "RULES",
    "Finding",
    "Thresholds",
    "WhatIf",
    "aprobe_alpn",
    "diagnose",
    "diagnose_set",
    "format_findings",
    "probe_alpn",
    "what_if",
]


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
        setup_share: one request: connect + tls + h2_setup above this share of e2e.
        new_connection_fraction: in a set, new connections on more than this share of requests
            (not counting the first per origin) means no keep-alive or a pool too small.
        pool_wait_share: pool_wait above this share of e2e.
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


# -- the facts the rules read ------------------------------------------------------------------
@dataclass(frozen=True)
class _Req:
    """One request, reduced to what the rules read (seconds)."""

    stages: Mapping[str, float]
    present: frozenset[str]
    e2e: float
    ttft: float | None
    tpot: float | None
    reused: bool
    http_version: str | None
    origin: str | None = None
    tls_handshake: bool = False
    session_reused: bool | None = None
    chunk_gaps: tuple[float, ...] = ()
    span_ns: tuple[int, int] = (0, 0)  # (start, end) in epoch ns, to count overlap
    detailed: bool = False  # built from a Waterfall (TLS, ALPN, gaps and origin known)
    tcp: _Tcp | None = None  # the kernel's TCP_INFO of the request's connection
    pre_token: Mapping[str, float] | None = None  # stage seconds before the first token
    ttfc: float | None = None

    def before_first_token(self, stage: str) -> float:
        """Seconds of ``stage`` spent before the first token (a request without one: 0)."""
        if self.ttft is None:
            return 0.0
        if self.pre_token is not None:
            return self.pre_token.get(stage, 0.0)
        # from columns, without the tree: what follows the first token is decode and tail
        return 0.0 if stage in _AFTER_FIRST_TOKEN else self.stages.get(stage, 0.0)


@dataclass(frozen=True)
class _Tcp:
    """What TCP_INFO says about one request's connection (RTTs in seconds)."""

    connection: int | None
    rtt: float
    min_rtt: float
    retrans: int  # segments we retransmitted since the connection was set up
    out_of_order: int  # segments that arrived out of order (the peer's losses, reordering)
    connect_retrans: int  # retransmitted while connecting (SYN, TLS handshake)
    tls_version: str | None
    wait: float  # the whole wait stage (request sent → headers), server spans inside included


def _tcp(wf: Waterfall) -> _Tcp | None:
    end = wf.tcp_end
    if end is None:
        return None
    first = wf.tcp_connect
    min_rtt = end.min_rtt_us if end.min_rtt_us else end.rtt_us
    wait = wf.stage("wait")
    return _Tcp(
        connection=wf.connection.connection_id,
        rtt=end.rtt_us / 1e6,
        min_rtt=min_rtt / 1e6,
        retrans=end.total_retrans,
        out_of_order=end.rcv_ooopack or 0,
        connect_retrans=0 if first is None else first.total_retrans,
        tls_version=None if wf.tls is None else wf.tls.version,
        wait=0.0 if wait is None else wait.duration,
    )


_AFTER_FIRST_TOKEN = frozenset({"decode", "tail"})


def _origin(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
    return f"{parts.scheme}://{parts.hostname}:{port}"


def _epoch(wf: Waterfall) -> int:
    return wf.start_ns if wf.start_epoch_ns is None else wf.start_epoch_ns


def _pre_token(wf: Waterfall) -> dict[str, float] | None:
    """The attribution of the time from the start to the first token."""
    first = wf.first_token_ns
    if first is None:
        return None
    clipped = dataclasses.replace(wf.root, end_ns=max(wf.root.start_ns, first))
    return {name: ns / 1e9 for name, ns in exclusive_ns(clipped).items()}


def _from_waterfall(wf: Waterfall) -> _Req:
    stages = wf.attribution()
    return _Req(
        stages=stages,
        present=frozenset(s.name for s in wf.root.walk()) & frozenset(stages),
        e2e=wf.e2e,
        ttft=wf.ttft,
        tpot=wf.tpot,
        reused=wf.connection.reused,
        http_version=wf.http_version,
        origin=_origin(wf.url),
        tls_handshake=wf.stage("tls") is not None,
        session_reused=None if wf.tls is None else wf.tls.session_reused,
        chunk_gaps=wf.chunk_gaps,
        span_ns=(_epoch(wf), _epoch(wf) + wf.e2e_ns),
        detailed=True,
        tcp=_tcp(wf),
        pre_token=_pre_token(wf),
        ttfc=wf.ttfc,
    )


def _from_set(ws: WaterfallSet) -> list[_Req]:
    keep = ws.ok & ~ws.warmup
    names = ws.stages
    cols = {s: ws.column(f"stage:{s}") / 1e9 for s in names}
    e2e, ttft, tpot, ttfc = (
        ws.column(c) / 1e9 for c in ("e2e_ns", "ttft_ns", "tpot_ns", "ttfc_ns")
    )
    epoch, e2e_ns = ws.column("epoch_ns"), ws.column("e2e_ns")
    reused, versions = ws.column("reused"), ws.labels("http_version")
    out = []
    for i in map(int, keep.nonzero()[0]):
        # a stage that took 0 ns counts as absent here: columns keep no per-row presence list
        present = frozenset(s for s in names if cols[s][i] > 0)
        out.append(
            _Req(
                stages={s: float(cols[s][i]) for s in present},
                present=present,
                e2e=float(e2e[i]),
                ttft=None if ttft[i] != ttft[i] else float(ttft[i]),  # NaN: no token
                tpot=None if tpot[i] != tpot[i] else float(tpot[i]),
                reused=bool(reused[i]),
                http_version=versions[i],
                span_ns=(int(epoch[i]), int(epoch[i] + e2e_ns[i])),
                ttfc=None if ttfc[i] != ttfc[i] else float(ttfc[i]),
            )
        )
    return out


@dataclass(frozen=True)
class _Context:
    reqs: Sequence[_Req]
    th: Thresholds
    single: bool
    server_alpn: str | None

    def mean(self, get: Callable[[_Req], float | None]) -> float:
        vals = [v for v in map(get, self.reqs) if v is not None]
        return statistics.fmean(vals) if vals else 0.0

    def stage(self, name: str) -> float:
        """Mean exclusive seconds of ``name`` per request (0 where absent)."""
        return self.mean(lambda r: r.stages.get(name, 0.0))

    @property
    def e2e(self) -> float:
        return self.mean(lambda r: r.e2e)

    @property
    def ttft(self) -> float:
        return self.mean(lambda r: r.ttft)

    @property
    def n(self) -> int:
        return len(self.reqs)

    @property
    def metric(self) -> str:
        """``"ttft"`` when most requests streamed a token, else ``"e2e"``."""
        streamed = sum(r.ttft is not None for r in self.reqs)
        return "ttft" if streamed * 2 > self.n else "e2e"

    @property
    def base(self) -> float:
        """The metric that matters, mean per request."""
        return self.ttft if self.metric == "ttft" else self.e2e

    def per(self) -> str:
        return "" if self.single else f" (mean of {self.n} requests)"


Rule = Callable[[_Context], "Finding | None"]


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


# -- rules -------------------------------------------------------------------------------------
def _dns(c: _Context) -> Finding | None:
    with_dns = [r for r in c.reqs if r.stages.get("dns", 0.0) > c.th.dns_cached_s]
    if not with_dns:
        return None
    per_lookup = statistics.fmean(r.stages.get("dns", 0.0) for r in with_dns)
    fraction = len(with_dns) / c.n
    every = not c.single and c.n >= c.th.min_requests and fraction >= c.th.dns_every_fraction
    slow = per_lookup >= c.th.dns_slow_s
    at_stake = c.stage("dns")
    if not (every or slow) or at_stake < c.th.min_time_s:
        return None
    lookups = f"{len(with_dns)} of {c.n} requests looked the name up" if not c.single else ""
    evidence = ", ".join(filter(None, [lookups, f"{_ms(per_lookup)} per lookup"]))
    return Finding(
        "dns",
        "DNS on every request" if every else "slow DNS lookup",
        evidence,
        "no DNS cache in the client, no local caching resolver, and no hosts entry"
        + ("; every request opens a new connection and resolves again" if every else ""),
        "reuse connections (keep-alive) so lookups happen once; run a local caching resolver "
        "(systemd-resolved, dnsmasq, nscd) or pin the name in /etc/hosts",
        at_stake,
        len(with_dns),
        {"fraction": fraction, "per_lookup_s": per_lookup},
        stages=("dns",),
    )


_SETUP = ("connect", "tls", "h2_setup")


def _setup_s(r: _Req) -> float:
    """Connection setup without DNS (the ``dns`` rule speaks for that)."""
    return sum(r.stages.get(s, 0.0) for s in _SETUP)


def _peak_overlap(reqs: Sequence[_Req]) -> int:
    """Most requests in flight at one instant."""
    edges = sorted([(a, 1) for a, _ in (r.span_ns for r in reqs)] +
                   [(b, -1) for _, b in (r.span_ns for r in reqs)])  # fmt: skip
    peak = now = 0
    for _, step in edges:  # at equal instants an end (-1) sorts before a start (+1)
        now += step
        peak = max(peak, now)
    return peak


def _new_connection(c: _Context) -> Finding | None:
    fresh = [r for r in c.reqs if not r.reused and ("connect" in r.present or "tls" in r.present)]
    if not fresh:
        return None
    setup = statistics.fmean(_setup_s(r) for r in fresh)
    if c.single:
        # judged against the metric that matters: 41 ms of TLS is 22 % of a long stream's e2e
        # but 37 % of its time to first token
        share = _share(setup, c.base)
        if share < c.th.setup_share or setup < c.th.min_time_s:
            return None
        parts = " + ".join(
            f"{s} {_ms(fresh[0].stages[s])}" for s in _SETUP if fresh[0].stages.get(s, 0.0) > 0
        )
        evidence = f"{parts} = {_ms(setup)}, {share:.0%} of {c.metric} {_ms(c.base)}"
        title = "a new connection (TCP + TLS handshake) cost much of this request"
        cause = "no connection was reused: the handshake's round trips come before the request"
    else:
        # requests in flight together need a connection each: only new connections beyond
        # the peak overlap (or one per origin) say that connections were not kept
        needed = max(_peak_overlap(c.reqs), len({r.origin for r in c.reqs}))
        fraction = (len(fresh) - needed) / max(1, c.n - needed)
        if c.n < c.th.min_requests or fraction <= c.th.new_connection_fraction:
            return None
        evidence = (
            f"{len(fresh)} of {c.n} requests opened a new connection, {_ms(setup)} of "
            "connect+tls each"
        )
        title = "a new TCP+TLS connection per request"
        cause = "keep-alive is off (or the server closes), or the pool is smaller than the load"
    at_stake = setup * len(fresh) / c.n
    tls = statistics.fmean(r.stages.get("tls", 0.0) for r in fresh)
    if at_stake < c.th.min_time_s:
        return None
    return Finding(
        "new_connection",
        title,
        evidence,
        cause,
        "keep one long-lived client (HTTP keep-alive, e.g. Client(keepalive=True)); size the "
        "pool to the concurrency; prefer HTTP/2, which multiplexes on one connection",
        at_stake,
        len(fresh),
        {"setup_s": setup, "new_connections": len(fresh), "tls_s": tls},
        stages=_SETUP,
    )


def _tls_resumption(c: _Context) -> Finding | None:
    by_origin: dict[str | None, list[_Req]] = {}
    for r in c.reqs:
        if r.detailed and r.tls_handshake:
            by_origin.setdefault(r.origin, []).append(r)
    repeats = [r for group in by_origin.values() for r in group[1:]]
    if c.single or len(repeats) < 1 or any(r.session_reused for r in repeats):
        return None
    tls = statistics.fmean(r.stages.get("tls", 0.0) for r in repeats)
    at_stake = tls * len(repeats) / c.n
    if at_stake < c.th.min_time_s:
        return None
    return Finding(
        "tls_resumption",
        "TLS without session resumption",
        f"{len(repeats)} repeated handshakes to the same origin, none resumed, {_ms(tls)} each",
        "the client does not keep TLS sessions/tickets, or the server does not issue them",
        "reuse connections first; otherwise keep one SSLContext for all connections and enable "
        "session tickets on the server (TLS 1.3 PSK resumption)",
        at_stake,
        len(repeats),
        {"handshakes": len(repeats), "tls_s": tls},
        stages=("tls",),
    )


def _http1(c: _Context) -> Finding | None:
    h1 = [r for r in c.reqs if r.http_version == "1.1"]
    if not h1:
        return None
    if c.server_alpn == "h2":
        why = "the server selects h2 when offered (ALPN probe)"
    else:
        h2_origins = {r.origin for r in c.reqs if r.http_version == "2" and r.detailed}
        h1 = [r for r in h1 if r.origin in h2_origins]
        if not h1:
            return None
        why = "other requests to the same origin negotiated HTTP/2"
    cost = statistics.fmean(r.stages.get("pool_wait", 0.0) + _setup_s(r) for r in h1)
    at_stake = max(cost * len(h1) / c.n, 0.0)
    if at_stake < c.th.min_time_s:
        return None  # warm requests on a kept connection: HTTP/2 would save them nothing
    return Finding(
        "http1",
        "HTTP/1.1 where the server offers HTTP/2",
        f"{len(h1)} of {c.n} requests used HTTP/1.1; {why}; pool_wait+setup {_ms(cost)} each",
        "the client offers only http/1.1 in ALPN (HTTP/2 disabled or unsupported)",
        "enable HTTP/2 in the client (Client(http2=None) offers h2 over TLS): one multiplexed "
        "connection removes per-request connection setup and pool queueing",
        at_stake,
        len(h1),
        {"requests_http1": len(h1), "cost_s": cost},
        stages=("pool_wait", *_SETUP),
    )


def _share_rule(
    rule: str, stage: str, whole: str, limit: Callable[[Thresholds], float], text: tuple[str, ...]
) -> Rule:
    """A rule that fires when ``stage`` takes more than a share of e2e or TTFT."""
    title, cause, remedy = text

    def check(c: _Context) -> Finding | None:
        part = c.stage(stage)
        base = c.e2e if whole == "e2e" else c.ttft
        share = _share(part, base)
        if share <= limit(c.th) or part < c.th.min_time_s:
            return None
        evidence = f"{stage} {_ms(part)} is {share:.0%} of {whole} {_ms(base)}{c.per()}"
        data = {"share": share}
        return Finding(rule, title, evidence, cause, remedy, part, c.n, data, stages=(stage,))

    return check


_pool_wait = _share_rule(
    "pool_wait",
    "pool_wait",
    "e2e",
    lambda t: t.pool_wait_share,
    (
        "requests queue for a connection",
        "the connection pool is smaller than the number of requests in flight",
        "raise the pool limit (Client(limit=...)) to the concurrency, or use HTTP/2",
    ),
)
_schedule_lag = _share_rule(
    "schedule_lag",
    "schedule_lag",
    "e2e",
    lambda t: t.schedule_lag_share,
    (
        "requests start late: the client is saturated",
        "the load generator could not send on schedule (CPU, event-loop lag, max_in_flight)",
        "give the client more CPU or processes, lower the rate, or raise max_in_flight; the "
        "latency measured here includes the client's own backlog",
    ),
)
_server_queue = _share_rule(
    "server_queue",
    "server_queue",
    "ttft",
    lambda t: t.queue_share,
    (
        "time to first token is spent queueing in the server",
        "the server is at capacity: requests wait for a batch slot",
        "add replicas or GPUs, raise max batch size / max_num_seqs, or lower the load",
    ),
)
_network = _share_rule(
    "network",
    "network",
    "e2e",
    lambda t: t.network_share,
    (
        "much time between client and server is unexplained by either",
        "distance (RTT), proxies or gateways in the path, or server work outside its spans",
        "move the client nearer the server, bypass proxies/load balancers, check for Nagle or "
        "buffering proxies that delay streamed chunks",
    ),
)


def _prefill(c: _Context) -> Finding | None:
    prefill, ttft = c.stage("prefill"), c.ttft
    share = _share(prefill, ttft)
    if share <= c.th.prefill_share or prefill < max(c.th.prefill_slow_s, c.th.min_time_s):
        return None
    return Finding(
        "prefill",
        "time to first token is dominated by prefill",
        f"prefill {_ms(prefill)} is {share:.0%} of TTFT {_ms(ttft)}{c.per()}",
        "long prompts: prefill time grows with the number of input tokens",
        "shorten prompts, enable prefix caching for shared system prompts, use chunked "
        "prefill so long prompts do not block others",
        prefill,
        c.n,
        {"share": share},
        stages=("prefill",),
    )


def _decode(c: _Context) -> Finding | None:
    decode, e2e = c.stage("decode"), c.e2e
    tpot = c.mean(lambda r: r.tpot)
    share = _share(decode, e2e)
    if share <= c.th.decode_share or tpot <= c.th.tpot_slow_s or decode < c.th.min_time_s:
        return None
    return Finding(
        "decode",
        "the request is dominated by slow decoding",
        f"decode {_ms(decode)} is {share:.0%} of e2e {_ms(e2e)}, TPOT {_ms(tpot)} "
        f"({1 / tpot:.0f} tokens/s){c.per()}",
        "slow time per output token: large batches, a large model, or memory-bound decoding",
        "cap max_tokens, use a smaller or quantized model, speculative decoding, or smaller "
        "batches for latency-sensitive traffic",
        decode,
        c.n,
        {"share": share, "tpot_s": tpot},
        ttft_at_stake_s=0.0,
    )


def _jitter(c: _Context) -> Finding | None:
    ratios, medians, p95s, excess = [], [], [], []
    for r in c.reqs:
        gaps = sorted(r.chunk_gaps)
        if len(gaps) < c.th.itl_min_gaps:
            continue
        median = statistics.median(gaps)
        if median < c.th.itl_burst_s:
            continue  # all tokens at once: no pace to judge, and a ratio over ~0 means nothing
        p95 = gaps[min(len(gaps) - 1, round(0.95 * (len(gaps) - 1)))]
        medians.append(median)
        p95s.append(p95)
        ratios.append(p95 / median)
        excess.append(sum(g - median for g in gaps if g > 2 * median))
    n = len(ratios)
    if not n:
        return None
    ratio, at_stake = statistics.median(ratios), sum(excess) / c.n
    p95, median = statistics.median(p95s), statistics.median(medians)
    if ratio <= c.th.itl_jitter_ratio or at_stake < c.th.min_time_s:
        return None
    return Finding(
        "itl_jitter",
        "tokens arrive in bursts (high inter-token jitter)",
        f"P95 gap between chunks {_ms(p95)} is {ratio:.1f}× the median {_ms(median)}"
        + ("" if c.single else f" (median over {n} requests)"),
        "the server pauses decoding (new requests' prefill in the same batch, preemption) or a "
        "proxy buffers the stream",
        "enable chunked prefill, limit batch size, disable proxy buffering for text/event-stream",
        at_stake,
        n,
        {"p95_over_median": ratio},
        ttft_at_stake_s=0.0,
    )


# -- rules that read the kernel's TCP_INFO ---------------------------------------------------
def _with_tcp(c: _Context) -> list[tuple[_Req, _Tcp]]:
    return [(r, r.tcp) for r in c.reqs if r.tcp is not None]


def _losses(t: _Tcp) -> int:
    return t.retrans + t.out_of_order


def _tcp_loss(c: _Context) -> Finding | None:
    pairs = _with_tcp(c)
    last: dict[object, _Tcp] = {}  # counters are per connection: its latest reading
    for i, (_, t) in enumerate(pairs):
        key = t.connection if t.connection is not None else ("request", i)
        if key not in last or t.retrans + t.out_of_order >= _losses(last[key]):
            last[key] = t
    retrans = sum(t.retrans for t in last.values())
    out_of_order = sum(t.out_of_order for t in last.values())
    if not retrans and not out_of_order:
        return None
    rtt = statistics.fmean(t.rtt for _, t in pairs)
    at_stake = (retrans + out_of_order) * rtt / c.n  # each loss costs at least a round trip
    if at_stake < c.th.min_time_s:
        return None
    return Finding(
        "tcp_loss",
        "packet loss on the path: TCP retransmits",
        f"{retrans} segments retransmitted, {out_of_order} received out of order, on "
        f"{len(last)} connection{'s' if len(last) != 1 else ''} (kernel TCP_INFO); RTT {_ms(rtt)}",
        "packets are lost (or reordered) between client and server: a congested or lossy "
        "link, a saturated NIC or queue, Wi-Fi; every loss costs at least one round trip",
        "check the path for loss (mtr, interface drop counters), move the client nearer the "
        "server, avoid lossy links; long streams suffer most",
        at_stake,
        len(pairs),
        {"retransmits": retrans, "out_of_order": out_of_order, "rtt_s": rtt},
    )


def _round_trips(r: _Req, t: _Tcp) -> int:
    """Round trips the request paid: TCP connect, the TLS handshake, the request itself."""
    trips = 1
    if "connect" in r.present:
        trips += 1
    if "tls" in r.present:
        trips += 1 if t.tls_version in (None, "TLSv1.3") else 2
    return trips


def _path_rtt(c: _Context) -> Finding | None:
    pairs = _with_tcp(c)
    if not pairs:
        return None
    rtt = statistics.fmean(t.min_rtt for _, t in pairs)
    trips = statistics.fmean(_round_trips(r, t) for r, t in pairs)
    path = rtt * trips
    e2e = statistics.fmean(r.e2e for r, _ in pairs)
    share = _share(path, e2e)
    if share <= c.th.path_share or path < c.th.min_time_s:
        return None
    wait = statistics.fmean(t.wait for _, t in pairs)
    server = max(0.0, wait - rtt)
    return Finding(
        "path_rtt",
        "a slow path, not a slow server: round trips dominate",
        f"path RTT {_ms(rtt)} (kernel min_rtt) × {trips:.1f} round trips = {_ms(path)}, "
        f"{share:.0%} of e2e {_ms(e2e)}; wait {_ms(wait)} is one RTT plus {_ms(server)} of "
        f"server time{c.per()}",
        "distance or a slow link between client and server: every round trip (TCP connect, "
        "TLS handshake, the request) costs one RTT, whatever the server does",
        "reuse connections (keep-alive, HTTP/2) and TLS sessions to drop the setup round "
        "trips; run the client (or an edge/proxy) nearer the server",
        path,
        len(pairs),
        {"rtt_s": rtt, "round_trips": trips, "server_s": server, "share": share},
    )


def _slow_connect(c: _Context) -> Finding | None:
    slow = [
        (r, t)
        for r, t in _with_tcp(c)
        if "connect" in r.present
        and r.stages.get("connect", 0.0) > c.th.connect_rtts * t.min_rtt + c.th.min_time_s
    ]
    if not slow:
        return None
    connect = statistics.fmean(r.stages.get("connect", 0.0) for r, _ in slow)
    rtt = statistics.fmean(t.min_rtt for _, t in slow)
    at_stake = sum(r.stages.get("connect", 0.0) - t.min_rtt for r, t in slow) / c.n
    if at_stake < c.th.min_time_s:
        return None
    resent = sum(t.connect_retrans for _, t in slow)
    why = (
        f"{resent} segments were retransmitted while connecting: a SYN or SYN-ACK was lost"
        if resent
        else "nothing was retransmitted: the server's SYN or accept queue is full, or a "
        "firewall/load balancer holds the handshake"
    )
    return Finding(
        "slow_connect",
        "TCP connect took longer than the path's round trip",
        f"connect {_ms(connect)} against a path RTT of {_ms(rtt)} ({connect / rtt:.1f} RTTs); "
        f"{why}",
        "the handshake waited beyond one round trip: SYN loss (each costs the initial RTO, "
        "1 s) or a server that cannot accept connections fast enough",
        "check for loss on the path; on the server raise the listen backlog (somaxconn, "
        "tcp_max_syn_backlog) and accept faster; reuse connections",
        at_stake,
        len(slow),
        {"connect_s": connect, "rtt_s": rtt, "connect_retrans": resent},
    )


def _ttfc_gap(c: _Context) -> Finding | None:
    pairs = [(r.ttft, r.ttfc) for r in c.reqs if r.ttft is not None and r.ttfc is not None]
    if not pairs:
        return None
    ttft = statistics.fmean(t for t, _ in pairs)
    ttfc = statistics.fmean(f for _, f in pairs)
    gap, at_stake = ttft - ttfc, sum(t - f for t, f in pairs) / c.n
    if gap <= c.th.ttfc_gap_s or at_stake < c.th.min_time_s:
        return None
    later = sum(1 for t, f in pairs if t > f)
    return Finding(
        "ttfc_gap",
        "the first tokens had empty text: TTFT reads later than the server's first token",
        f"TTFT (first visible text) {_ms(ttft)}, TTFC (first token chunk, empty text included) "
        f"{_ms(ttfc)}: {_ms(gap)} apart{c.per()}; empty-text tokens came first on {later} of "
        f"{len(pairs)} requests",
        "the server streamed tokens whose text is empty (a byte-level tokenizer's partial UTF-8 "
        "pieces); the server's own TTFT and most benchmark tools count them, the user sees "
        "nothing until the first visible text",
        "compare TTFC (Waterfall.ttfc, the ttfc metric) with the server's TTFT and TTFT with "
        "what users see; a model or tokenizer that emits whole characters closes the gap",
        at_stake,
        len(pairs),
        {"ttft_s": ttft, "ttfc_s": ttfc, "gap_s": gap},
    )


#: Every rule by id, in no particular order (findings are ranked by time at stake).
RULES: Mapping[str, Rule] = MappingProxyType(
    {
        "dns": _dns,
        "new_connection": _new_connection,
        "tls_resumption": _tls_resumption,
        "http1": _http1,
        "pool_wait": _pool_wait,
        "schedule_lag": _schedule_lag,
        "server_queue": _server_queue,
        "prefill": _prefill,
        "decode": _decode,
        "network": _network,
        "itl_jitter": _jitter,
        "tcp_loss": _tcp_loss,
        "path_rtt": _path_rtt,
        "slow_connect": _slow_connect,
        "ttfc_gap": _ttfc_gap,
    }
)


def _ttft_at_stake(f: Finding, c: _Context) -> float:
    """A rule's e2e time at stake, restated as time to first token."""
    if f.ttft_at_stake_s is not None:
        return f.ttft_at_stake_s
    if not f.stages:
        return f.time_at_stake_s  # a rule that does not say: before the first token
    whole = sum(r.stages.get(s, 0.0) for r in c.reqs for s in f.stages)
    before = sum(r.before_first_token(s) for r in c.reqs for s in f.stages)
    return f.time_at_stake_s * (before / whole if whole > 0 else 1.0)


def _restate(f: Finding, c: _Context) -> Finding:
    """The finding in terms of the context's metric, with its what-if."""
    e2e = f.time_at_stake_s
    ttft = _ttft_at_stake(f, c)
    # a cause that only acts after the first token (slow decoding, jitter) is told in e2e
    metric = "ttft" if c.metric == "ttft" and ttft > 0 else "e2e"
    at_stake, base = (ttft, c.ttft) if metric == "ttft" else (e2e, c.e2e)
    return dataclasses.replace(
        f,
        time_at_stake_s=at_stake,
        metric=metric,
        e2e_at_stake_s=e2e,
        ttft_at_stake_s=ttft if c.metric == "ttft" else f.ttft_at_stake_s,
        baseline_s=base,
        what_if_s=max(0.0, base - at_stake),
    )


def _rank(f: Finding, metric: str) -> tuple[int, float, float]:
    """The metric that matters first, then milliseconds at stake."""
    return (f.metric != metric, -f.time_at_stake_s, -(f.e2e_at_stake_s or 0.0))


def _run(context: _Context, rules: Iterable[str] | None) -> list[Finding]:
    if not context.reqs:
        return []
    chosen = RULES if rules is None else {k: RULES[k] for k in rules}
    found = [_restate(f, context) for rule in chosen.values() if (f := rule(context)) is not None]
    return sorted(found, key=lambda f: _rank(f, context.metric))


def diagnose(
    wf: Waterfall,
    *,
    thresholds: Thresholds | None = None,
    server_alpn: str | None = None,
    rules: Iterable[str] | None = None,
) -> list[Finding]:
    """Findings for one request, most time at stake first (empty for a failed request).

    Args:
        wf: the request.
        thresholds: when rules fire (defaults: ``Thresholds()``).
        server_alpn: what the server selects when offered h2 (``probe_alpn(url)``); lets the
            HTTP/1.1 rule speak about a single request.
        rules: ids from ``RULES`` to run (default: all).
    """
    reqs = [_from_waterfall(wf)] if wf.ok else []
    return _run(_Context(reqs, thresholds or Thresholds(), True, server_alpn), rules)


def diagnose_set(
    data: WaterfallSet | Iterable[Waterfall],
    *,
    thresholds: Thresholds | None = None,
    server_alpn: str | None = None,
    rules: Iterable[str] | None = None,
) -> list[Finding]:
    """Findings for many requests (means per request), most time at stake first.

    Args:
        data: waterfalls (every rule can speak), or a ``WaterfallSet`` (the rules that need
            TLS, ALPN, origins or token gaps stay silent: a set keeps only columns). Failed
            and warm-up requests are left out.
        thresholds: when rules fire (defaults: ``Thresholds()``).
        server_alpn: what the server selects when offered h2 (``probe_alpn(url)``).
        rules: ids from ``RULES`` to run (default: all).
    """
    if isinstance(data, WaterfallSet):
        reqs = _from_set(data)
    else:
        reqs = [_from_waterfall(wf) for wf in data if wf.ok]
    single = len(reqs) == 1
    return _run(_Context(reqs, thresholds or Thresholds(), single, server_alpn), rules)


def what_if(
    data: Waterfall | Iterable[Waterfall],
    findings: Sequence[Finding],
    *,
    rules: Iterable[str] | None = None,
) -> WhatIf:
    """The metric the requests would have had with several remedies at once.

    Each request's own stages named by the chosen findings are removed (a stage named by two
    findings counts once), so the answer is the requests' TTFT (streams) or e2e without them.

    Args:
        data: the request, or the requests the findings came from.
        findings: from :func:`diagnose` or :func:`diagnose_set`.
        rules: the findings to apply, by rule id (default: ``CLIENT_REMEDIES``, the remedies
            that remove their stages outright).
    """
    wfs = [data] if isinstance(data, Waterfall) else list(data)
    context = _Context([_from_waterfall(wf) for wf in wfs if wf.ok], Thresholds(), True, None)
    allowed = CLIENT_REMEDIES if rules is None else frozenset(rules)
    chosen = [f for f in findings if f.rule in allowed and f.stages]
    named = set(s for f in chosen for s in f.stages)
    order = {name: i for i, name in enumerate(CLIENT_STAGES)}
    stages = tuple(sorted(named, key=lambda s: (order.get(s, len(order)), s)))  # path order
    if not context.reqs:
        return WhatIf("e2e", 0.0, 0.0, (), ())
    if context.metric == "ttft":
        then = context.mean(
            lambda r: (
                None if r.ttft is None else r.ttft - sum(r.before_first_token(s) for s in stages)
            )
        )
    else:
        then = context.mean(lambda r: r.e2e - sum(r.stages.get(s, 0.0) for s in stages))
    present = tuple(s for s in stages if any(r.stages.get(s, 0.0) > 0 for r in context.reqs))
    rule_ids = tuple(dict.fromkeys(f.rule for f in chosen))
    return WhatIf(context.metric, context.base, max(0.0, then), rule_ids, present)


def format_findings(findings: Sequence[Finding]) -> str:
    """The findings as text, one block each; a line saying so when there are none."""
    if not findings:
        return "no findings: nothing stands out"
    return "\n".join(f"{i}. {f}" for i, f in enumerate(findings, start=1))
