"""Rules about the client and connection setup: DNS, new connections, TLS resumption, HTTP/1.1
where h2 is offered, pool queueing and a client that cannot keep up."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from ._facts import _Context, _Req, _share, _share_rule
from ._findings import Finding, _ms


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


def _client_own_s(r: _Req, metric: str) -> float:
    """The client's own time (``other``) inside ``metric``: before the first token for TTFT."""
    return r.before_first_token("other") if metric == "ttft" else r.stages.get("other", 0.0)


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
    own = 0.0
    if c.single:
        # judged against the metric that matters: 41 ms of TLS is 22 % of a long stream's e2e
        # but 37 % of its time to first token; less the client's own unexplained time
        # (`other`: its scheduling, which a busy host stretches), so that the verdict on the
        # connection does not move with the measuring host's load
        own = _client_own_s(fresh[0], c.metric)
        share = _share(setup, c.base - own)
        if share < c.th.setup_share or setup < c.th.min_time_s:
            return None
        parts = " + ".join(
            f"{s} {_ms(fresh[0].stages[s])}" for s in _SETUP if fresh[0].stages.get(s, 0.0) > 0
        )
        evidence = f"{parts} = {_ms(setup)}, {share:.0%} of {c.metric} {_ms(c.base)}"
        if own >= 0.00005:  # shown where it is a tenth of a millisecond or more
            evidence += f" less the client's own {_ms(own)}"
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
    data = {"setup_s": setup, "new_connections": len(fresh), "tls_s": tls}
    if c.single:
        data["client_own_s"] = own
    return Finding(
        "new_connection",
        title,
        evidence,
        cause,
        "keep one long-lived client (HTTP keep-alive, e.g. Client(keepalive=True)); size the "
        "pool to the concurrency; prefer HTTP/2, which multiplexes on one connection",
        at_stake,
        len(fresh),
        data,
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


_POOL_TEXT = (
    "requests queue for a connection",
    "the connection pool is smaller than the number of requests in flight",
    "raise the pool limit (Client(limit=...)) to the concurrency, or use HTTP/2",
)
_pool_wait_share = _share_rule("pool_wait", "pool_wait", "e2e", lambda t: t.pool_wait_share,
                               _POOL_TEXT)  # fmt: skip


def _full_pool(reqs: Sequence[_Req]) -> tuple[int, list[tuple[int, int]]]:
    """The most connections the requests held at once, and the intervals they held that many.

    A request holds its connection (an HTTP/2 stream slot) from the end of its pool wait to
    its end. A pool whose limit the requests reached holds that many while others wait, so
    the set shows the limit as its peak. A pool with connections to spare reaches its peak
    only when every request in flight holds one, and then none of them is waiting.
    """
    edges = sorted([(r.pool_ns[1], 1) for r in reqs] + [(r.span_ns[1], -1) for r in reqs])
    peak = now = 0
    for _, step in edges:  # at equal instants an end (-1) sorts before a start (+1)
        now += step
        peak = max(peak, now)
    full: list[tuple[int, int]] = []
    now = began = 0
    for t, step in edges:
        if step < 0 and now == peak:
            full.append((began, t))
        now += step
        if step > 0 and now == peak:
            began = t
    return peak, [(a, b) for a, b in full if b > a]


def _overlap_ns(a: int, b: int, intervals: Sequence[tuple[int, int]]) -> int:
    return sum(max(0, min(b, hi) - max(a, lo)) for lo, hi in intervals)


def _pool_wait(c: _Context) -> Finding | None:
    """Requests that queued for a connection: one request, by its pool_wait's share of e2e;
    a set, by the pool_wait spent while the pool was full.

    A request waits for a pooled connection only while other requests hold them all. The
    stage alone also grows when our event loop wakes late (a busy host), with no other
    request in flight, so in a set only the waiting that coincides with the most connections
    the requests ever held at once counts: sequential requests never queued, however long
    their pool_wait, and requests beside a pool they never filled did not either.
    """
    if c.single:  # no other request to see: the stage's share is all the evidence there is
        return _pool_wait_share(c)
    peak, full = _full_pool(c.reqs)
    queued = [_overlap_ns(*r.pool_ns, full) / 1e9 for r in c.reqs]
    part = statistics.fmean(queued)
    share = _share(part, c.e2e)
    if share <= c.th.pool_wait_share or part < c.th.min_time_s:
        return None
    waited = sum(q > 0 for q in queued)
    title, cause, remedy = _POOL_TEXT
    evidence = (
        f"pool_wait {_ms(part)} is {share:.0%} of e2e {_ms(c.e2e)}{c.per()}, spent while "
        f"{peak} connection{'s were' if peak != 1 else ' was'} in use, the most these "
        f"requests held at once; {waited} of {c.n} requests queued"
    )
    data = {
        "share": share,
        "pool_wait_s": c.stage("pool_wait"),
        "queued_requests": waited,
        "connections_in_use": peak,
    }
    return Finding("pool_wait", title, evidence, cause, remedy, part, waited, data,
                   stages=("pool_wait",))  # fmt: skip


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
