"""A bound that contradicts the client degrades the merge instead of dropping it.

The server side is the recorded vLLM 0.32 export (``fixtures/real-servers``: three real
``llm_request`` spans). Each client waterfall is laid around its span at a known clock offset
(the server's clock 250 ms ahead), with the client's observations placed so that one chosen
bound contradicts them by a known amount: the shape a real vLLM gave when a server instant was
stamped in another process than the one that wrote the bytes. The expected figures follow from
the bracket arithmetic exactly (integer nanoseconds).
"""

from __future__ import annotations

from pathlib import Path

from conftest import assert_exact

import latency_analyzer as la
from latency_analyzer.merge import MERGED, NO_OFFSET_FITS, merge, merge_all
from latency_analyzer.server import ServerStages, bracket, decode_otlp, map_request
from latency_analyzer.timeline import ClockAnchor, Recorder

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "real-servers"
MS = 1_000_000
OFFSET = 250 * MS  # server clock − client epoch clock, the truth of every case here
SPANS = decode_otlp(
    (FIXTURES / "vllm-0.32-otlp-request-spans.pb").read_bytes(), "application/x-protobuf"
)


def _real(digit: str, parent: str) -> ServerStages:
    """The recorded request whose traceparent was ``00-<digit×32>-<parent×16>-01``."""
    stages = map_request([s for s in SPANS if s.trace_id == digit * 32], parent * 16)
    assert stages is not None and stages.schema == "vllm"
    return stages


CHAT = ("1", "2")  # 16 tokens, ttft 27.45 ms, e2e 52.63 ms
COMPLETIONS = ("3", "4")  # 12 tokens, ttft 12.67 ms, e2e 25.35 ms
NONSTREAM_CHAT = ("5", "6")


def _client(st: ServerStages, first_ns: int, end_ns: int, tokens: int) -> la.Waterfall:
    """A client waterfall around ``st``: sending began 0.3 ms before the server's arrival (on
    the true offset), the first chunk ``first_ns`` and the stream end ``end_ns`` after it
    (negative: before); tokens evenly between the first chunk and 0.5 ms before the end."""
    assert st.arrival_ns is not None
    epoch0 = st.arrival_ns - OFFSET - 10 * MS  # perf 0 on the client's clock
    anchor = ClockAnchor(perf_ns=0, epoch_ns=epoch0, uncertainty_ns=0)

    def perf(server_ns: int) -> int:
        return server_ns - OFFSET - epoch0

    arrival = perf(st.arrival_ns)
    rec = Recorder("POST", "http://127.0.0.1:8000/v1/completions", start_ns=0, anchor=anchor)
    rec.add("connect", 1 * MS, arrival - 400_000)
    rec.add("send", arrival - 300_000, arrival - 200_000)
    rec.response_headers(arrival + 1 * MS, 200)
    assert st.first_token_ns is not None and st.done_ns is not None
    first, end = perf(st.first_token_ns) + first_ns, perf(st.done_ns) + end_ns
    step = (end - 500_000 - first) // (tokens - 1)
    for i in range(tokens):
        rec.chunk(first + i * step, 4)
    return rec.finish(end)


def test_a_done_stamp_after_the_last_byte_keeps_the_stages_and_says_by_how_much() -> None:
    st = _real(*COMPLETIONS)
    # the client saw the first token 1 ms after the server stamped it, but its last byte
    # 1.5 ms *before* the server's e2e stamp: the done bound lands above the arrival bound
    wf = _client(st, first_ns=1 * MS, end_ns=-1_500_000, tokens=12)
    own = bracket(wf, st)
    assert own is not None and own.fits
    assert own.contradicted == (("done", 1_200_000),)  # 1.5 ms less the 0.3 ms send lead
    merged = merge(wf, st)
    a = merged.attributes
    assert a["server.status"] == MERGED
    assert a["server.contradicted"] == "done"
    # bracket [OFFSET − 1 ms, OFFSET + 0.3 ms]: midpoint OFFSET − 0.35 ms, and the done stamp
    # lands 1.5 + 0.35 ms after the client's last byte at that offset
    assert a["server.offset_ns"] == OFFSET - 350_000
    assert a["server.contradicted.done_ns"] == 1_850_000
    # honest uncertainty: widened from the bracket's half width (0.65 ms) to reach the bound
    assert a["server.offset_uncertainty_ns"] == 1_850_000
    assert abs(a["server.offset_ns"] - OFFSET) <= a["server.offset_uncertainty_ns"]  # type: ignore[operator]  # attribute values are a union
    assert (a["server.bracket_lo_ns"], a["server.bracket_hi_ns"]) == (
        OFFSET - 1 * MS,
        OFFSET + 300_000,
    )
    assert_exact(merged)
    # the server's stages are all there, with their recorded durations, except the part of
    # decode that the done stamp puts after the client's last byte: left unplaced, and said
    got = merged.attribution_ns()
    for stage in st.stages:
        late = 1_850_000 if stage.name == "decode" else 0
        assert got[stage.name] == stage.duration_ns - late, stage.name
    assert a["server.unplaced_ns"] == 1_850_000
    # the stage ending at the contradicted instant says so
    server = [s for c in merged.root.children for s in c.children if s.source == "server"]
    marked = {s.name for s in server if "server.contradicts" in s.attributes}
    assert marked == {"decode"}
    decode = next(s for s in server if s.name == "decode")
    assert decode.attributes["server.contradicted_ns"] == 1_850_000


def test_a_first_token_stamp_after_the_client_saw_it_is_degraded_too() -> None:
    st = _real(*CHAT)
    wf = _client(st, first_ns=-2 * MS, end_ns=1 * MS, tokens=16)
    merged = merge(wf, st)
    a = merged.attributes
    assert a["server.status"] == MERGED and a["server.contradicted"] == "first_token"
    # bracket [OFFSET − 1 ms (done), OFFSET + 0.3 ms]; first token 2 ms early: 2.35 ms at mid
    assert a["server.contradicted.first_token_ns"] == 2_350_000
    assert a["server.offset_uncertainty_ns"] == 2_350_000
    server = {s.name: s for c in merged.root.children for s in c.children if s.source == "server"}
    assert server["prefill"].attributes["server.contradicts"] == "first_token"
    assert "server.contradicts" not in server["server_queue"].attributes
    assert_exact(merged)


def test_only_a_request_whose_every_bound_contradicts_loses_its_merge() -> None:
    st = _real(*CHAT)
    wf = _client(st, first_ns=-2 * MS, end_ns=-1 * MS, tokens=16)
    merged = merge(wf, st)
    a = merged.attributes
    assert a["server.status"] == NO_OFFSET_FITS
    assert merged.root == wf.root  # nothing shifted outside a bracket
    reason = a["server.reason"]
    assert isinstance(reason, str)
    assert "arrival bound contradicts every later bound" in reason
    assert "first_token by 1.700 ms" in reason and "done by 0.700 ms" in reason


def test_one_degraded_request_among_many_merges_on_the_shared_offset() -> None:
    cases = [
        (_real(*CHAT), 1 * MS, 2 * MS, 16),
        (_real(*COMPLETIONS), 1 * MS, -1_500_000, 12),  # done contradicted
        (_real(*NONSTREAM_CHAT), 500_000, 1 * MS, 8),
    ]
    wfs = [_client(st, first, end, n) for st, first, end, n in cases]
    merged = merge_all(wfs, [c[0] for c in cases])
    assert [m.attributes["server.status"] for m in merged] == [MERGED] * 3
    assert [m.attributes.get("server.contradicted") for m in merged] == [None, "done", None]
    # the three agreeing brackets intersect in [OFFSET − 0.5 ms, OFFSET + 0.3 ms]
    assert {m.attributes["server.offset_ns"] for m in merged} == {OFFSET - 100_000}
    assert merged[0].attributes["server.offset_requests"] == 3
    # the degraded request reports its own contradiction at the shared offset, and only its
    # uncertainty is widened
    assert merged[1].attributes["server.contradicted.done_ns"] == 1_600_000
    assert merged[1].attributes["server.offset_uncertainty_ns"] == 1_600_000
    assert merged[0].attributes["server.offset_uncertainty_ns"] == 400_000
    for m in merged:
        assert_exact(m)
