"""Findings judged against the metric that matters, with what-ifs from the request's stages."""

from __future__ import annotations

import dataclasses
import math

import pytest

from latency_analyzer import Span, Waterfall
from latency_analyzer.diagnose import WhatIf, diagnose, format_findings, what_if
from latency_analyzer.testing.waterfalls import synthetic

# the story: a "123 ms" TTFT that is 23 ms DNS + 41 ms TLS + a 40 ms round trip + 18 ms prefill
STORY = {"dns": 23.0, "connect": 0.2, "tls": 41.0, "send": 0.1, "wait": 40.5, "first_token": 18.0}
LONG_STREAM = [10.0] * 20  # 200 ms of decoding after the first token: e2e ~ 323 ms


def test_tls_is_judged_against_ttft_for_a_stream() -> None:
    wf = synthetic(gaps=LONG_STREAM, **STORY)
    assert wf.ttft is not None and wf.ttft == pytest.approx(0.1228, abs=1e-6)
    setup = 0.0412
    assert setup / wf.e2e < 0.25 < setup / wf.ttft  # 13 % of e2e, 34 % of TTFT
    found = {f.rule: f for f in diagnose(wf, server_alpn="h2")}
    assert set(found) == {"dns", "new_connection", "http1"}, format_findings(list(found.values()))
    tls = found["new_connection"]
    assert tls.metric == "ttft" and "34% of ttft" in tls.evidence
    assert tls.time_at_stake_s == pytest.approx(setup, abs=1e-9)
    assert tls.what_if_s == pytest.approx(wf.ttft - setup, abs=1e-9)
    assert found["dns"].what_if_s == pytest.approx(wf.ttft - 0.023, abs=1e-9)


def test_findings_are_ranked_by_ttft_at_stake_and_decode_follows_in_e2e() -> None:
    wf = synthetic(gaps=[60.0] * 20, **STORY)  # slow decode: 1.2 s after the first token
    found = diagnose(wf, server_alpn="h2")
    # http1 and new_connection put the same 41.2 ms of setup at stake
    assert [f.rule for f in found][2:] == ["dns", "decode"]
    assert {f.rule for f in found[:2]} == {"http1", "new_connection"}
    decode = found[-1]
    assert decode.metric == "e2e" and decode.ttft_at_stake_s == 0.0
    assert decode.time_at_stake_s == pytest.approx(1.2, abs=1e-9)


def test_combined_what_if_removes_each_stage_once() -> None:
    wf = synthetic(gaps=LONG_STREAM, **STORY)
    found = diagnose(wf, server_alpn="h2")
    w = what_if(wf, found)
    assert isinstance(w, WhatIf) and w.metric == "ttft"
    assert set(w.rules) == {"dns", "new_connection", "http1"}
    assert w.stages == ("dns", "connect", "tls")  # http1 and new_connection both name tls
    # 122.8 ms - 23 - 0.2 - 41 = 58.6 ms: the request's own send, wait and first_token
    assert w.then_s == pytest.approx(0.0586, abs=1e-9)
    assert "a DNS cache" in str(w) and "HTTP/2" in str(w) and "58.6 ms" in str(w)


def test_unary_requests_are_judged_in_e2e() -> None:
    wf = synthetic(dns=23.0, connect=0.2, tls=41.0, send=0.1, wait=60.0, tail=1.0)
    found = diagnose(wf)
    assert {f.metric for f in found} == {"e2e"}
    w = what_if(wf, found)
    assert w.metric == "e2e" and w.then_s == pytest.approx(wf.e2e - 0.0642, abs=1e-9)


def test_a_burst_streaming_server_is_not_blamed_for_pausing() -> None:
    # every token in one burst (gaps ~ 0) and then one late chunk: no pace, no jitter finding
    burst = synthetic(send=0.1, wait=5.0, first_token=10.0, gaps=[0.0] * 30 + [4.0])
    assert diagnose(burst) == [], format_findings(diagnose(burst))
    # a real pacing stream with pauses still is
    paced = synthetic(send=0.1, wait=5.0, first_token=10.0, gaps=[10.0] * 18 + [80.0, 90.0])
    jitter = [f for f in diagnose(paced) if f.rule == "itl_jitter"]
    assert jitter and math.isfinite(jitter[0].data["p95_over_median"])


def test_finding_to_dict_is_json_ready() -> None:
    import json

    f = diagnose(synthetic(gaps=LONG_STREAM, **STORY))[0]
    out = json.loads(json.dumps(f.to_dict()))
    assert out["rule"] == f.rule and out["what_if_s"] == pytest.approx(f.what_if_s)
    assert out["stages"] == list(f.stages)


def _shifted(span: Span, ns: int) -> Span:
    kids = tuple(_shifted(k, ns) for k in span.children)
    return dataclasses.replace(
        span, start_ns=span.start_ns + ns, end_ns=span.end_ns + ns, children=kids
    )


def _with_client_time(wf: Waterfall, before: str, ms: float) -> Waterfall:
    """``wf`` with ``ms`` of the client's own time (no stage: ``other``) before stage ``before``."""
    shift = round(ms * 1e6)
    spans, moved = [], False
    for span in wf.root.children:
        moved = moved or span.name == before
        spans.append(_shifted(span, shift) if moved else span)
    root = dataclasses.replace(wf.root, end_ns=wf.root.end_ns + shift, children=tuple(spans))
    chunks = tuple(t + shift for t in wf.chunk_times_ns)
    return dataclasses.replace(wf, root=root, chunk_times_ns=chunks)


def test_the_clients_own_time_does_not_move_the_verdict_on_a_new_connection() -> None:
    # a busy client: 50 ms of its own scheduling before the request went out. The handshake's
    # 41.2 ms is 25 % of the 172.8 ms TTFT but 34 % of what the network and server took; the
    # finding stays and says what it set aside
    wf = _with_client_time(synthetic(gaps=LONG_STREAM, **STORY), "send", 50.0)
    assert wf.attribution()["other"] == pytest.approx(0.050, abs=1e-9)
    assert wf.ttft is not None and 0.0412 / wf.ttft < 0.25
    found = {f.rule: f for f in diagnose(wf, server_alpn="h2")}
    assert set(found) == {"dns", "new_connection", "http1"}, format_findings(list(found.values()))
    tls = found["new_connection"]
    assert tls.data["client_own_s"] == pytest.approx(0.050, abs=1e-9)
    assert "34% of ttft 172.8 ms less the client's own 50.0 ms" in tls.evidence
    assert tls.time_at_stake_s == pytest.approx(0.0412, abs=1e-9)
