"""The facts the rules read: one request reduced to seconds, from a Waterfall or from a set's
columns, its connection's TCP_INFO, and the context (requests, thresholds) a rule is given.

A ``WaterfallSet`` keeps columns, not waterfalls: a request built from one knows its stages,
e2e, TTFT, TPOT, TTFC, reuse and HTTP version, not its TLS, ALPN, origin or token gaps
(``_Req.detailed`` says which).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import numpy as np

from ...timeline import Waterfall, exclusive_ns
from .._set import WaterfallSet
from ._findings import Finding, Thresholds, _ms


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
    # (start, end) of pool_wait in epoch ns: from the end of ``end`` on, the request held its
    # connection (or stream slot); a request that did not wait has start == end
    pool_ns: tuple[int, int] = (0, 0)
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


def _pool_ns(wf: Waterfall) -> tuple[int, int]:
    """The pool wait in epoch ns; without one, the instant the request set off (after any
    schedule lag), which is when it took its connection."""
    shift = _epoch(wf) - wf.start_ns
    span = wf.stage("pool_wait")
    if span is not None:
        return span.start_ns + shift, span.end_ns + shift
    lag = wf.stage("schedule_lag")
    began = wf.start_ns if lag is None else lag.end_ns
    return began + shift, began + shift


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
        pool_ns=_pool_ns(wf),
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
    # columns keep durations, not instants: the pool wait follows the schedule lag, in the
    # stage order every request has
    lag_ns, pool_ns = (
        ws.column(f"stage:{s}") if s in names else np.zeros(len(e2e_ns), np.int64)
        for s in ("schedule_lag", "pool_wait")
    )
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
                pool_ns=(
                    int(epoch[i] + lag_ns[i]),
                    int(epoch[i] + lag_ns[i] + pool_ns[i]),
                ),
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
