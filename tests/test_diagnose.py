"""Diagnosis rules: each fires on its synthetic case, and a healthy baseline gets no finding."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from latency_analyzer import Waterfall
from latency_analyzer.analysis import Tags, WaterfallSet
from latency_analyzer.diagnose import (
    RULES,
    Finding,
    Thresholds,
    diagnose,
    diagnose_set,
    format_findings,
)
from latency_analyzer.testing.waterfalls import synthetic
from latency_analyzer.timeline import ConnectionInfo, TcpInfo, TlsInfo

TLS_FULL = TlsInfo("TLSv1.3", "TLS_AES_128_GCM_SHA256", "http/1.1", False, "llm.test")
TLS_RESUMED = TlsInfo("TLSv1.3", "TLS_AES_128_GCM_SHA256", "http/1.1", True, "llm.test")


def healthy(i: int = 1, **over: Any) -> Waterfall:
    """A warm streamed request with merged server data and nothing wrong with it."""
    args: dict[str, Any] = {
        "start_ms": 300.0 * i, "reused": i > 0, "send": 0.1, "wait": 8.0, "first_token": 20.0,
        "gaps": [10.0] * 20, "tail": 0.5,
        "server": [("wait", "server_queue", 1.0, 0.5), ("first_token", "prefill", 0.5, 18.0),
                   ("decode", "decode", 0.0, 199.0)],
    }  # fmt: skip
    args.update(over)
    if "gaps" in over and "server" not in over:  # the server decodes while tokens stream
        decode = ("decode", "decode", 0.0, sum(over["gaps"]) - 1.0)
        args["server"] = [*args["server"][:2], decode]
    return synthetic(**args)


def cold(i: int = 0, **over: Any) -> Waterfall:
    base: dict[str, Any] = {"dns": 0.3, "connect": 0.2, "tls": 2.0, "tls_info": TLS_FULL}
    return healthy(i, reused=False, **{**base, **over})


def rules(findings: list[Finding]) -> list[str]:
    return [f.rule for f in findings]


# -- the baseline -------------------------------------------------------------------------------
def test_healthy_request_and_set_get_no_findings() -> None:
    assert diagnose(healthy()) == []
    assert diagnose(cold()) == []  # a cheap cold start is not a problem either
    run = [cold(), *(healthy(i) for i in range(1, 20))]
    assert diagnose_set(run) == []
    ws = WaterfallSet()
    ws.extend(run)
    assert diagnose_set(ws) == []
    assert format_findings([]) == "no findings: nothing stands out"


def test_every_rule_has_a_case_below() -> None:
    assert set(RULES) == {
        "dns", "new_connection", "tls_resumption", "http1", "pool_wait", "schedule_lag",
        "server_queue", "prefill", "decode", "network", "itl_jitter", "tcp_loss", "path_rtt",
        "slow_connect",
        "ttfc_gap",  # its case, against the test bed's log: tests/test_ttfc.py
    }  # fmt: skip


# -- connection setup ---------------------------------------------------------------------------
def test_slow_dns_on_one_request() -> None:
    found = diagnose(cold(dns=40.0))
    dns = next(f for f in found if f.rule == "dns")
    assert dns.title == "slow DNS lookup"
    assert "40.0 ms per lookup" in dns.evidence
    assert dns.time_at_stake_s == pytest.approx(0.040)
    assert "resolver" in dns.cause and "/etc/hosts" in dns.remedy


def test_dns_on_every_request_in_a_set() -> None:
    run = [cold(i, dns=4.0) for i in range(6)]  # not slow, but every request looks up
    dns = next(f for f in diagnose_set(run) if f.rule == "dns")
    assert dns.title == "DNS on every request"
    assert dns.evidence.startswith("6 of 6 requests looked the name up")
    # cached lookups (tens of µs) are not lookups
    assert "dns" not in rules(diagnose_set([cold(0, dns=4.0), *(cold(i, dns=0.02) for i in
                                                                 range(1, 6))]))  # fmt: skip


def test_new_connection_per_request() -> None:
    run = [cold(i, connect=2.0, tls=6.0) for i in range(6)]
    found = diagnose_set(run)
    new = next(f for f in found if f.rule == "new_connection")
    assert new.title == "a new TCP+TLS connection per request"
    assert "6 of 6 requests opened a new connection" in new.evidence
    assert new.time_at_stake_s == pytest.approx(0.008)
    assert "keep-alive" in new.cause
    warm = [cold(0, connect=2.0, tls=6.0), *(healthy(i) for i in range(1, 6))]
    assert "new_connection" not in rules(diagnose_set(warm))


def test_new_connection_dominating_one_request() -> None:
    found = diagnose(cold(connect=40.0, tls=60.0))
    assert "new_connection" in rules(found)
    assert diagnose(cold(connect=1.0, tls=2.0)) == []


def test_tls_without_session_resumption() -> None:
    full = [cold(i, tls=6.0) for i in range(5)]
    tls = next(f for f in diagnose_set(full) if f.rule == "tls_resumption")
    assert tls.evidence == "4 repeated handshakes to the same origin, none resumed, 6.0 ms each"
    resumed = [cold(0, tls=6.0), *(cold(i, tls=6.0, tls_info=TLS_RESUMED) for i in range(1, 5))]
    assert "tls_resumption" not in rules(diagnose_set(resumed))
    ws = WaterfallSet()
    ws.extend(full)
    assert "tls_resumption" not in rules(diagnose_set(ws))  # a set keeps no TLS facts


def test_http1_where_the_server_offers_h2() -> None:
    mixed = [healthy(i, http_version="2") for i in range(3)]
    mixed += [cold(i, http_version="1.1", pool_wait=5.0) for i in range(3, 6)]
    h1 = next(f for f in diagnose_set(mixed) if f.rule == "http1")
    assert "3 of 6 requests used HTTP/1.1" in h1.evidence
    assert "negotiated HTTP/2" in h1.evidence
    one = cold(pool_wait=5.0)
    assert "http1" in rules(diagnose(one, server_alpn="h2"))
    assert "http1" not in rules(diagnose(one))  # nothing says the server speaks h2
    assert "http1" not in rules(diagnose(one, server_alpn="http/1.1"))
    other_origin = [healthy(0, http_version="2", url="https://a.test/v1"), cold(1, pool_wait=5.0)]
    assert "http1" not in rules(diagnose_set(other_origin))


# -- client and server time ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("rule", "over", "words"),
    [
        ("pool_wait", {"pool_wait": 40.0}, "pool"),
        ("schedule_lag", {"schedule_lag": 40.0}, "client"),
        (
            "server_queue",
            {"wait": 70.0, "server": [("wait", "server_queue", 1.0, 66.0),
                                      ("first_token", "prefill", 0.5, 18.0)]},
            "capacity",
        ),
        (
            "prefill",
            {"first_token": 320.0, "server": [("first_token", "prefill", 0.5, 310.0)]},
            "prompt",
        ),
        ("decode", {"gaps": [50.0] * 20}, "time per output token"),
        ("network", {"wait": 90.0}, "distance"),
        ("itl_jitter", {"gaps": [10.0] * 18 + [80.0, 90.0]}, "batch"),
    ],
)  # fmt: skip
def test_rule_fires_on_its_case(rule: str, over: dict[str, Any], words: str) -> None:
    found = diagnose(healthy(**over))
    assert rule in rules(found), format_findings(found)
    finding = next(f for f in found if f.rule == rule)
    assert words in finding.cause + finding.title
    assert finding.time_at_stake_s > 0.002 and " ms" in finding.evidence
    # the same requests as a set: the rule still fires, on means. Requests that queue for a
    # connection are in flight together: five one after another never did (see
    # test_pool_wait_in_a_set_needs_a_full_pool), so that set is one connection handed on
    run = handed_on(5, **over) if rule == "pool_wait" else [healthy(i, **over) for i in range(1, 6)]
    assert rule in rules(diagnose_set(run))


def handed_on(n: int, pool_wait: float, late: float = 0.0, pool: int = 1) -> list[Waterfall]:
    """``n`` requests started together on a pool of ``pool`` connections: each waits for one
    (``pool_wait`` ms longer per round, ``late`` ms beyond the moment it was free: a loop
    that woke late) and then holds it for the same exchange as ``healthy``."""
    exchange = healthy(0).e2e * 1e3
    waits = [k // pool * (exchange + late) for k in range(n)]
    if pool_wait:  # the first round waits too, the stage's own length, for nothing held
        waits = [w + pool_wait for w in waits]
    return [healthy(k + 1, start_ms=0.0, pool_wait=w) for k, w in enumerate(waits)]


def test_pool_wait_in_a_set_needs_a_full_pool() -> None:
    """In a set, pool_wait counts only while the pool was full: a request waits for a pooled
    connection while others hold them all, not when the stage grew because our event loop
    woke late with nothing else in flight."""
    # one after another, 40 ms of pool_wait each (15% of e2e): nobody held a connection
    seq = [healthy(i, pool_wait=40.0) for i in range(1, 6)]
    assert all(a.start_ns + a.e2e_ns <= b.start_ns for a, b in itertools.pairwise(seq))
    assert "pool_wait" not in rules(diagnose_set(seq))
    ws = WaterfallSet()
    ws.extend(seq)
    assert "pool_wait" not in rules(diagnose_set(ws))  # from the columns too
    assert all("pool_wait" in rules(diagnose(wf)) for wf in seq)  # alone, each still is told
    # four in flight together, each 40 ms late to its connection: the pool was never full
    burst = [healthy(i, start_ms=i * 1.0, pool_wait=40.0) for i in range(1, 5)]
    assert "pool_wait" not in rules(diagnose_set(burst))

    # six requests at once on a pool of two: four queue, for one exchange and for two, and
    # each takes its connection 3 ms after it was free (a late loop, not the pool's doing)
    queued = handed_on(6, 0.0, late=3.0, pool=2)
    exchange = healthy(0).e2e
    assert [wf.attribution()["pool_wait"] for wf in queued[::2]] == pytest.approx(
        [0.0, exchange + 0.003, 2 * (exchange + 0.003)], abs=1e-9
    )
    for run in (queued, ws_of(queued)):
        pool = next(f for f in diagnose_set(run) if f.rule == "pool_wait")
        # ground truth: the full pool's time inside the waits, (0+0+1+1+2+2)/6 exchanges
        assert pool.e2e_at_stake_s == pytest.approx(exchange, abs=1e-9)
        assert pool.data["pool_wait_s"] == pytest.approx(exchange + 0.003, abs=1e-9)
        assert pool.data["connections_in_use"] == 2
        assert pool.data["queued_requests"] == pool.requests == 4
        assert "2 connections were in use, the most these requests held" in pool.evidence


def ws_of(wfs: list[Waterfall]) -> WaterfallSet:
    ws = WaterfallSet()
    ws.extend(wfs)
    return ws


def test_decode_dominated_but_fast_is_not_a_finding() -> None:
    assert diagnose(healthy(gaps=[12.0] * 200)) == []


def test_findings_are_ranked_by_time_at_stake() -> None:
    found = diagnose(healthy(pool_wait=50.0, schedule_lag=90.0))
    assert rules(found)[:2] == ["schedule_lag", "pool_wait"]
    assert [f.time_at_stake_s for f in found] == sorted(
        (f.time_at_stake_s for f in found), reverse=True
    )
    text = format_findings(found)
    assert text.startswith("1. [schedule_lag]") and "remedy:" in text


def test_thresholds_are_configurable_and_rules_selectable() -> None:
    wf = healthy(pool_wait=40.0)
    assert "pool_wait" in rules(diagnose(wf))
    assert "pool_wait" not in rules(diagnose(wf, thresholds=Thresholds(pool_wait_share=0.5)))
    assert rules(diagnose(wf, rules=["dns"])) == []


def test_failed_and_warmup_requests_are_left_out() -> None:
    failed = healthy(pool_wait=40.0, error_type="reset", status=None)
    assert diagnose(failed) == []
    ws = WaterfallSet()
    for i in range(5):
        ws.add(healthy(i + 1, pool_wait=40.0), Tags(warmup=True))
    ws.add(healthy(9), Tags())
    assert diagnose_set(ws) == []
    assert diagnose_set([]) == []


def test_a_concurrent_burst_needs_its_connections() -> None:
    """Four requests in flight together open four connections: that is no finding."""
    burst = [cold(0, connect=2.0, tls=6.0, start_ms=i * 1.0) for i in range(4)]
    assert "new_connection" not in rules(diagnose_set(burst))
    again = burst + [cold(0, connect=2.0, tls=6.0, start_ms=1000.0 + 300 * i) for i in range(4)]
    assert "new_connection" in rules(diagnose_set(again))  # ... but doing it again is


# -- the kernel's view of the connection (TCP_INFO) --------------------------------------------
def tcp(rtt_ms: float, retrans: int = 0, out_of_order: int = 0) -> TcpInfo:
    rtt = round(rtt_ms * 1000)
    return TcpInfo(
        at_ns=0, rtt_us=rtt, rttvar_us=rtt // 4, min_rtt_us=rtt, rto_us=200_000 + rtt,
        retransmits=0, total_retrans=retrans, lost=0, reordering=3, snd_cwnd=10,
        rcv_ooopack=out_of_order,
    )  # fmt: skip


def with_tcp(
    wf: Waterfall, end: TcpInfo, at_connect: TcpInfo | None = None, conn: int = 1
) -> Waterfall:
    connection = ConnectionInfo(reused=wf.connection.reused, connection_id=conn)
    return dataclasses.replace(
        wf, tcp_connect=at_connect or end, tcp_end=end, connection=connection
    )


def test_a_loopback_connection_with_no_loss_gets_no_tcp_finding() -> None:
    assert diagnose(with_tcp(cold(), tcp(0.05))) == []
    assert diagnose(with_tcp(healthy(), tcp(0.05))) == []


def test_round_trips_on_a_long_path_are_told_from_server_time() -> None:
    wf = with_tcp(
        cold(connect=20.3, tls=20.6, wait=21.5, first_token=2.0, gaps=[1.0] * 5), tcp(20.0)
    )
    found = diagnose(wf)
    path = next(f for f in found if f.rule == "path_rtt")
    assert path.data["round_trips"] == 3  # connect, the TLS 1.3 handshake, the request
    assert path.time_at_stake_s == pytest.approx(0.060)
    assert path.data["server_s"] == pytest.approx(0.0015)
    assert "path RTT 20.0 ms" in path.evidence and "1.5 ms of server time" in path.evidence
    # the same request with a slow server instead: the round trips are a small share
    slow_server = with_tcp(cold(wait=400.0, gaps=[1.0] * 5), tcp(0.05))
    assert "path_rtt" not in rules(diagnose(slow_server))


def test_retransmits_and_out_of_order_arrivals_are_loss() -> None:
    found = diagnose(with_tcp(cold(connect=20.3, tls=20.6), tcp(20.0, retrans=3, out_of_order=2)))
    loss = next(f for f in found if f.rule == "tcp_loss")
    assert "3 segments retransmitted, 2 received out of order" in loss.evidence
    assert loss.time_at_stake_s == pytest.approx(5 * 0.020)
    # counters are per connection: three requests on one connection count it once
    run = [with_tcp(healthy(i), tcp(20.0, retrans=2 + (i == 2))) for i in range(3)]
    loss = next(f for f in diagnose_set(run) if f.rule == "tcp_loss")
    assert loss.data["retransmits"] == 3


def test_a_connect_far_beyond_the_rtt_is_named_with_its_retransmits() -> None:
    wf = with_tcp(cold(connect=1020.0), tcp(20.0, retrans=1), at_connect=tcp(20.0, retrans=1))
    slow = next(f for f in diagnose(wf) if f.rule == "slow_connect")
    assert "1 segments were retransmitted while connecting" in slow.evidence
    assert slow.time_at_stake_s == pytest.approx(1.0)
    queue = with_tcp(cold(connect=300.0), tcp(20.0))
    slow = next(f for f in diagnose(queue) if f.rule == "slow_connect")
    assert "accept queue is full" in slow.evidence
