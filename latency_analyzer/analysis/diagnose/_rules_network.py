"""Rules about the path between client and server: the ``network`` residual, and what the
kernel's TCP_INFO says (losses, the path's round trips, a connect slower than its RTT)."""

from __future__ import annotations

import statistics

from ._facts import _Context, _Req, _share, _share_rule, _Tcp
from ._findings import Finding, _ms

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
