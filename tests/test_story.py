"""The story end to end: a "120 ms" TTFT that is 23 ms DNS + 41 ms TLS + a 40 ms round trip +
18 ms of inference, told by ``latency-analyzer probe --count N --diagnose --json``.

The servers (DNS, a 20 ms one-way delay proxy, one TLS port offering ``h2`` and ``http/1.1``)
run in a child process (:class:`TestBed`), the CLI in another, so neither shares the test's
GIL. Lower bounds come from where host load cannot move them: the DNS server's own log (query
received → answer sent) and the proxy's injected delays (a TLS 1.3 handshake is one round trip,
two one-way delays). Upper bounds say the number names the right stage at the right magnitude
(a stage counted twice or the wrong one breaks them); the precision of each stage against an
injected delay is held to max(0.5 ms, 3 %) by tests/test_capture_timing.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from latency_analyzer.testing import TestBed

DNS, ONE_WAY, PREFILL = 0.023, 0.020, 0.018
BODY = json.dumps({"model": "m", "stream": True, "max_tokens": 8, "messages": []})
CLI = str(Path(sys.executable).with_name("latency-analyzer"))
SETUP = ("dns", "connect", "tls")  # the cold request's connection set-up, in order
EPS = 0.0002  # two processes' clock anchors (perf_counter_ns <-> time_ns) differ by microseconds


def _probe(bed: TestBed, *flags: str, count: int = 3, url: str = "") -> dict[str, Any]:
    args = [CLI, "probe", url or bed.url, "--resolver", bed.resolver, "--cacert", bed.cafile]
    args += ["--count", str(count), "--diagnose", "--json", "-d", BODY, *flags]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def _epoch_s(truth: dict[str, Any], perf_ns: int) -> float:
    """A child's ``perf_counter_ns`` instant in epoch seconds, through the child's anchor."""
    perf, epoch = truth["anchor"]
    return (epoch + perf_ns - perf) / 1e9


def _server_dns_s(truth: dict[str, Any]) -> float:
    """The cold request's lookup as the DNS server saw it: first query in, last answer out."""
    a, aaaa = truth["dns"][:2]  # A and AAAA of the request (the ALPN probe's come after)
    return (max(a[1], aaaa[1]) - min(a[0], aaaa[0])) / 1e9


def test_the_story_names_dns_tls_and_http1_with_their_numbers() -> None:
    with TestBed(dns_delay=DNS, one_way=ONE_WAY, prefill=PREFILL, tokens=8) as bed:
        out = _probe(bed, "--http1.1")
        truth = bed.truth()
    assert out["server_alpn"] == "h2"  # asked through the bed's resolver and CA
    cold = out["requests"][0]
    stages = cold["stages"]
    found = {f["rule"]: f for f in out["cold"]["findings"]}
    assert set(found) == {"dns", "new_connection", "http1"}, found
    assert {f["metric"] for f in found.values()} == {"ttft"}

    # DNS: the number is the request's dns stage; it holds the server's 23 ms and ends before
    # the server accepted the connection (both processes read one CLOCK_MONOTONIC)
    dns = found["dns"]
    assert dns["data"]["per_lookup_s"] == dns["time_at_stake_s"] == stages["dns"]
    assert _server_dns_s(truth) >= DNS
    start = cold["start_epoch_ns"] / 1e9
    accepted = _epoch_s(truth, truth["handshakes"][0]["accepted_ns"])
    assert _server_dns_s(truth) <= stages["dns"] <= accepted - start - stages["pool_wait"] + EPS

    # TLS: one round trip through the proxy (2 x 20 ms) plus the handshake's crypto; it ends
    # before the client's Finished reached the server (one one-way delay before the server's
    # handshake was done) and starts after the lookup's last answer
    tls = found["new_connection"]
    assert tls["data"]["tls_s"] == stages["tls"]
    done = _epoch_s(truth, truth["handshakes"][0]["tls_done_ns"]) - ONE_WAY
    last_answer = _epoch_s(truth, max(q[1] for q in truth["dns"][:2]))
    assert 2 * ONE_WAY <= stages["tls"] <= done - last_answer - stages["connect"] + EPS
    setup = stages["connect"] + stages["tls"]
    assert tls["time_at_stake_s"] == pytest.approx(setup, abs=1e-9)
    assert f"of ttft {cold['ttft_s'] * 1e3:.1f} ms" in tls["evidence"]
    # judged against TTFT, not e2e, less the client's own time in it (which a busy host
    # stretches and no log bounds: it must not move the verdict)
    own = tls["data"]["client_own_s"]
    assert 0.0 <= own <= stages["other"]
    assert setup / (cold["ttft_s"] - own) > 0.25

    # HTTP/1.1 where the server (ALPN probe) prefers h2
    assert "selects h2 when offered" in found["http1"]["evidence"]
    assert len(truth["handshakes"]) == 2  # the request's connection and the ALPN probe's
    assert [h["alpn"] for h in truth["handshakes"]] == ["http/1.1", "h2"]

    # the what-if: with a DNS cache, reuse and HTTP/2, this request's own remaining stages
    what_if = out["cold"]["what_if"]
    assert set(what_if["rules"]) == {"dns", "new_connection", "http1"}
    assert {"dns", "connect", "tls"} <= set(what_if["stages"]) <= {"pool_wait", *SETUP}
    expected = cold["ttft_s"] - sum(stages.get(s, 0.0) for s in what_if["stages"])
    assert what_if["then_s"] == pytest.approx(expected, abs=1e-9)
    # It took away at least the set-up the servers logged (the lookup, the TLS round trip);
    # what remains is the request's own wire time, no less than a round trip through the proxy
    # and the prefill as the server's log has it, plus the client's own time before the first
    # token (`other`: a busy host stretches it, so nothing bounds it from above)
    server = truth["h1"][0]
    prefill = (server["chunk_ns"][0] - server["received_ns"]) / 1e9
    assert prefill >= PREFILL
    wire = stages["send"] + stages["wait"] + stages["first_token"]
    assert 2 * ONE_WAY + prefill - EPS <= wire <= what_if["then_s"] + 1e-9
    assert what_if["then_s"] <= cold["ttft_s"] - _server_dns_s(truth) - 2 * ONE_WAY + 1e-9

    # the warm requests reused the connection and have nothing to be told
    assert [r["connection_reused"] for r in out["requests"]] == [False, True, True]
    assert out["warm"]["findings"] == []


def test_healthy_baselines_give_no_finding() -> None:
    # HTTP/2, an address (no lookup, as with a DNS cache), no network delay
    with TestBed(prefill=0.018, tokens=32, decode=0.002) as bed:
        h2 = _probe(bed, url=bed.ip_url)
    assert [r["http_version"] for r in h2["requests"]] == ["2", "2", "2"]
    assert h2["server_alpn"] == "h2"
    assert h2["warm"]["findings"] == []  # warm, reused, HTTP/2
    cold_rules = {f["rule"] for f in h2["cold"]["findings"]}
    assert not cold_rules & {"dns", "http1", "itl_jitter", "decode"}, cold_rules
    # a server that sends all 40 tokens at once
    with TestBed(prefill=0.010, tokens=40, decode=0.0) as burst:
        out = _probe(burst, url=burst.ip_url)
    assert all(r["error"] is None for r in out["requests"])
    assert out["warm"]["findings"] == []  # no "pausing decoding" for a burst


@pytest.mark.skipif(sys.platform != "linux", reason="the test bed's clock is CLOCK_MONOTONIC")
def test_the_bed_runs_in_its_own_process() -> None:
    with TestBed() as bed:
        assert bed.pid != os.getpid()
        truth = bed.truth()
        assert {k: v for k, v in truth.items() if k != "anchor"} == {
            "dns": [],
            "handshakes": [],
            "h1": [],
            "h2": [],
            "relays": [],  # no delay proxy: no one-way delay was asked for
        }
