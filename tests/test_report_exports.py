"""Exports: HAR 1.2, Chrome trace, OTLP JSON, JSONL, CSV, DataFrame/Parquet.

Each format is validated against its own rules, pinned by a golden file (regenerate with
``UPDATE_GOLDEN=1 pytest tests/test_report_exports.py`` and review the diff), and scanned for a
planted credential.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from conftest import assert_exact

from latency_analyzer import Waterfall, __version__
from latency_analyzer.analysis import WaterfallSet
from latency_analyzer.report import (
    read_jsonl,
    to_chrome_trace,
    to_csv,
    to_har,
    to_otlp_json,
    waterfall_html,
    write_jsonl,
)
from latency_analyzer.report.waterfall_text import render_waterfall
from latency_analyzer.server import decode_otlp_json
from latency_analyzer.testing.waterfalls import ANCHOR, synthetic
from latency_analyzer.timeline import Span, TlsInfo

GOLDEN = Path(__file__).parent / "golden"
CREATED = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc)
SECRET = "sk-PLANTEDf00dfeedc0ffee42"
TRACE_ID, SPAN_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def _cold() -> Waterfall:
    return synthetic(
        dns=12.5, connect=3.25, tls=8.0, send=0.2, wait=30.0, first_token=45.0,
        gaps=[10.0, 12.0, 9.5, 10.5], tail=1.5, http_version="2",
        server=[("wait", "server_queue", 5.0, 20.0), ("first_token", "prefill", 2.0, 40.0),
                ("decode", "decode", 0.0, 41.0)],
        tls_info=TlsInfo("TLSv1.3", "TLS_AES_128_GCM_SHA256", "h2", False, "llm.test"),
        url=f"https://user:{SECRET}@llm.test/v1/chat/completions?api_key={SECRET}&model=m",
        attributes={
            "trace_id": TRACE_ID, "span_id": SPAN_ID, "server.status": "merged",
            "http.authorization": f"Bearer {SECRET}", "http.set-cookie": f"s={SECRET}",
            "http.x-api-key": SECRET, "http.content-type": "text/event-stream",
            "note": f"token {SECRET}",
        },
        profile=[("engine", "forward", 75.0, 20.0), ("engine", "sample", 96.0, 3.0),
                 ("api", "detokenize", 110.0, 4.0)],
    )  # fmt: skip


def _warm() -> Waterfall:
    return synthetic(
        start_ms=200.0,
        pool_wait=4.0,
        send=0.1,
        wait=25.0,
        first_token=35.0,
        gaps=[11.0] * 3,
        tail=1.0,
        reused=True,
        connection_id=1,
    )


def _failed() -> Waterfall:
    return synthetic(
        start_ms=400.0,
        dns=2.0,
        connect=1.0,
        send=0.1,
        wait=50.0,
        status=None,
        error_type="reset",
        url="http://127.0.0.1:8000/v1/completions",
        connection_id=2,
    )


@pytest.fixture
def wfs() -> list[Waterfall]:
    out = [_cold(), _warm(), _failed()]
    for wf in out:
        assert_exact(wf)
    return out


def _golden(name: str, text: str) -> None:
    """Compare with tests/golden/<name> (the library version normalised away)."""
    text = text.replace(__version__, "<version>")
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"{name} changed: UPDATE_GOLDEN=1 to accept"


# -- HAR ---------------------------------------------------------------------------------------
def test_har_validates_against_the_har_1_2_schema(wfs: list[Waterfall]) -> None:
    schema = json.loads((GOLDEN / "har-1.2.schema.json").read_text())
    doc = to_har(wfs, created=CREATED)
    jsonschema.validate(doc, schema)
    with pytest.raises(jsonschema.ValidationError):  # the schema has teeth
        broken = json.loads(json.dumps(doc))
        del broken["log"]["entries"][0]["timings"]["wait"]
        jsonschema.validate(broken, schema)


def test_har_timings_follow_the_har_rules(wfs: list[Waterfall]) -> None:
    entries = to_har(wfs, created=CREATED)["log"]["entries"]
    for entry, wf in zip(entries, wfs, strict=True):
        t = entry["timings"]
        summed = sum(v for k, v in t.items() if k != "ssl" and v != -1)
        assert summed == pytest.approx(entry["time"], abs=1e-5)
        assert entry["time"] == pytest.approx(wf.e2e * 1e3, abs=1e-6)
        if t["ssl"] != -1:
            assert t["ssl"] <= t["connect"]  # HAR: ssl is also included in connect
    cold, warm, failed = (e["timings"] for e in entries)
    assert cold == {
        "blocked": 0.0, "dns": 12.5, "connect": 11.25, "ssl": 8.0, "send": 0.2, "wait": 30.0,
        "receive": 45.0 + 42.0 + 1.5,
    }  # fmt: skip
    assert (warm["dns"], warm["connect"], warm["ssl"], warm["blocked"]) == (-1, -1, -1, 4.0)
    assert (failed["ssl"], failed["receive"]) == (-1, 0.0)
    assert entries[2]["response"]["status"] == 0 and entries[2]["_error"] == "synthetic reset"


def test_har_carries_llm_metrics_and_version_stamp(wfs: list[Waterfall]) -> None:
    doc = to_har(wfs, created=CREATED)
    la = doc["log"]["entries"][0]["_latency_analyzer"]
    assert la["ttft_ms"] == pytest.approx(wfs[0].ttft * 1e3)  # type: ignore[operator]  # the wfs fixture's first request has a ttft
    assert la["itl_ms"] == [10.0, 12.0, 9.5, 10.5]
    assert la["stages_ms"]["prefill"] == 40.0 and la["stages_ms"]["server_queue"] == 20.0
    assert doc["log"]["_latency_analyzer"]["created_utc"] == "2025-01-02T03:04:05.678901Z"
    assert doc["log"]["creator"]["version"] == __version__
    assert doc["log"]["entries"][0]["startedDateTime"] == "2025-01-01T00:00:01.000Z"
    _golden("export.har.json", json.dumps(doc, indent=1, sort_keys=True) + "\n")


# -- Chrome trace ------------------------------------------------------------------------------
def _check_trace(doc: dict[str, Any]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """Each B has its E (same name, LIFO), timestamps never go back on a track."""
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for ev in doc["traceEvents"]:
        if ev["ph"] != "M":
            tracks.setdefault((ev["pid"], ev["tid"]), []).append(ev)
    for key, events in tracks.items():
        stack: list[str] = []
        last = float("-inf")
        for ev in events:
            assert ev["ts"] >= last, f"time goes back on track {key}: {ev}"
            last = ev["ts"]
            if ev["ph"] == "B":
                stack.append(ev["name"])
            elif ev["ph"] == "E":
                assert stack, f"E without B on {key}"
                stack.pop()
        assert stack == [], f"unclosed B on {key}: {stack}"
    return tracks


def test_chrome_trace_pairs_and_orders_every_track(wfs: list[Waterfall]) -> None:
    doc = to_chrome_trace(wfs, created=CREATED)
    tracks = _check_trace(doc)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M"}
    assert names[(1, 1)] == "client" and names[(1, 2)] == "server"
    assert {names[(1, 3)], names[(1, 4)]} == {"profile: engine", "profile: api"}
    client = [e["name"] for e in tracks[(1, 1)] if e["ph"] == "B"]
    assert client == ["request", "dns", "connect", "tls", "send", "wait", "first_token",
                      "decode", "tail"]  # fmt: skip
    tokens = [e for e in tracks[(1, 1)] if e["ph"] == "i"]
    assert len(tokens) == len(wfs[0].chunk_times_ns) == 5
    server = [e["name"] for e in tracks[(1, 2)] if e["ph"] == "B"]
    assert server == ["server_queue", "prefill", "decode"]
    # requests share one time axis: the warm one starts 200 ms after the cold one
    starts = [e["ts"] for e in doc["traceEvents"] if e.get("name") == "request"]
    assert starts == [0.0, 200_000.0, 400_000.0]
    _golden("export.trace.json", json.dumps(doc, indent=1, sort_keys=True) + "\n")


def test_chrome_trace_clips_overlapping_siblings() -> None:
    wf = _cold()
    # a server span that spills past its client stage's sibling: clipped, still nested
    spans = list(wf.root.children)
    late = Span("late", spans[4].end_ns - 1000, spans[4].end_ns + 5000, "server")
    overlapping = (*spans[4].children, late)

    spans[4] = dataclasses.replace(spans[4], children=overlapping)
    wf = dataclasses.replace(wf, root=dataclasses.replace(wf.root, children=tuple(spans)))
    _check_trace(to_chrome_trace([wf], created=CREATED))


# -- OTLP --------------------------------------------------------------------------------------
def test_otlp_json_round_trips_through_the_server_side_reader(wfs: list[Waterfall]) -> None:
    doc = to_otlp_json(wfs, created=CREATED)
    spans = decode_otlp_json(json.dumps(doc).encode())
    cold = [s for s in spans if s.trace_id == TRACE_ID]
    root = next(s for s in cold if s.parent_span_id is None)
    # the client span has the propagated ids: the server's spans nest under it
    assert (root.span_id, root.kind, root.name) == (SPAN_ID, "client", "POST")
    assert root.start_ns == ANCHOR.to_epoch_ns(wfs[0].start_ns)
    assert root.end_ns == ANCHOR.to_epoch_ns(wfs[0].end_ns)
    stages = {s.name: s for s in cold if s.parent_span_id == SPAN_ID}
    assert list(stages) == [c.name for c in wfs[0].root.children]
    for child in wfs[0].root.children:
        got = stages[child.name]
        want = (ANCHOR.to_epoch_ns(child.start_ns), ANCHOR.to_epoch_ns(child.end_ns))
        assert (got.start_ns, got.end_ns) == want
    assert not any(s.attributes.get("source") == "server" for s in spans)  # server exports its own
    assert len({s.trace_id for s in spans}) == 3
    failed_root = next(s for s in spans if s.parent_span_id is None and s.trace_id != TRACE_ID
                       and s.attributes.get("error.type") == "reset")  # fmt: skip
    assert failed_root.attributes["http.request.method"] == "POST"
    _golden("export.otlp.json", json.dumps(doc, indent=1, sort_keys=True) + "\n")


def test_otlp_include_server_and_stable_ids(wfs: list[Waterfall]) -> None:
    with_server = decode_otlp_json(json.dumps(to_otlp_json(wfs, include_server=True)).encode())
    assert {s.name for s in with_server} >= {"server_queue", "prefill"}
    a = to_otlp_json(wfs[1:], created=CREATED)
    b = to_otlp_json(wfs[1:], created=CREATED)
    assert a == b  # ids derived from the request, not random


async def test_send_otlp_to_a_live_receiver(wfs: list[Waterfall]) -> None:
    import asyncio

    from latency_analyzer.report import send_otlp
    from latency_analyzer.server import OTLPHttpReceiver, SpanStore

    store = SpanStore()
    async with OTLPHttpReceiver(store) as receiver:
        status = await asyncio.to_thread(send_otlp, wfs[:1], receiver.endpoint)
        spans = await store.await_trace(TRACE_ID, 2.0, lambda s: len(s) >= 9)
    assert status == 200
    assert {s.name for s in spans} == {"POST", *(c.name for c in wfs[0].root.children)}


# -- JSONL / CSV / pandas ----------------------------------------------------------------------
def test_jsonl_round_trips_exactly(tmp_path: Path, wfs: list[Waterfall]) -> None:
    clean = [wfs[1], wfs[2]]  # no secrets in them: the round trip is exact
    path = write_jsonl(clean, tmp_path / "run.jsonl", created=CREATED)
    assert read_jsonl(path) == clean
    ws = WaterfallSet.load(path)  # the same file is a WaterfallSet file
    assert len(ws) == 2 and ws.meta["export"]["created_utc"] == "2025-01-02T03:04:05.678901Z"
    lines = path.read_text().splitlines()
    _golden("export.jsonl", "\n".join(lines) + "\n")


def test_csv_rows_and_stamp(wfs: list[Waterfall]) -> None:
    text = to_csv(wfs, created=CREATED)
    stamp, header = text.splitlines()[:2]
    assert stamp.startswith("# format=csv schema=1 library=latency_analyzer")
    columns = header.split(",")
    assert columns[:3] == ["start_epoch_ns", "method", "url"]
    assert columns.index("stage_dns_ms") < columns.index("stage_prefill_ms")
    _golden("export.csv", text)


def test_dataframe_and_parquet(tmp_path: Path, wfs: list[Waterfall]) -> None:
    pd = pytest.importorskip("pandas")
    pq = pytest.importorskip("pyarrow.parquet")
    from latency_analyzer.report import to_dataframe, write_parquet

    df = to_dataframe(wfs, created=CREATED)
    assert list(df["e2e_ms"]) == pytest.approx([wf.e2e * 1e3 for wf in wfs])
    assert df.attrs["latency_analyzer"]["schema"] == 1
    path = write_parquet(wfs, tmp_path / "run.parquet", created=CREATED)
    back = pd.read_parquet(path)
    assert list(back.columns) == list(df.columns) and len(back) == 3
    meta = json.loads(pq.read_schema(path).metadata[b"latency_analyzer"])
    assert meta["format"] == "parquet"
    csv_back = pd.read_csv(io.StringIO(to_csv(wfs, created=CREATED)), skiprows=1)
    assert list(csv_back["stage_dns_ms"].fillna(-1)) == [12.5, -1, 2.0]


# -- secrets -----------------------------------------------------------------------------------
def _every_export(wfs: list[Waterfall], tmp_path: Path) -> dict[str, str]:
    from latency_analyzer.report import to_dataframe, waterfall_svg, write_parquet

    out = {
        "har": json.dumps(to_har(wfs)),
        "chrome": json.dumps(to_chrome_trace(wfs)),
        "otlp": json.dumps(to_otlp_json(wfs, include_server=True)),
        "jsonl": write_jsonl(wfs, tmp_path / "x.jsonl").read_text(),
        "csv": to_csv(wfs),
        "html": waterfall_html(wfs[0]),
        "svg": waterfall_svg(wfs[0]),
        "text": render_waterfall(wfs[0]),
    }
    if _has("pandas"):
        out["dataframe"] = to_dataframe(wfs).to_json()
    if _has("pyarrow"):
        out["parquet"] = write_parquet(wfs, tmp_path / "x.parquet").read_bytes().decode("latin-1")
    return out


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def test_no_export_contains_a_planted_secret(tmp_path: Path, wfs: list[Waterfall]) -> None:
    exports = _every_export(wfs, tmp_path)
    assert len(exports) >= 8
    for name, text in exports.items():
        assert SECRET not in text, f"{name} leaks the planted key"
        assert "PLANTED" not in text, f"{name} leaks part of the planted key"
    # and the scan can fail: the raw waterfall does hold the key
    assert SECRET in json.dumps(wfs[0].to_dict())
    # the non-secret facts survive the scrub
    assert "model=m" in exports["har"] and "text/event-stream" in exports["har"]
