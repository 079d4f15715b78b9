"""``diagnose --json`` and ``export``: pinned by golden files, from a run file on disk.

The run file holds the three requests the export tests use (a cold streamed request with
server spans and a planted credential, a warm one, a failed one). ``export`` must write exactly
what the library's exporters write for them (the same golden files), and ``diagnose --json`` is
pinned by its own golden file (regenerate with ``UPDATE_GOLDEN=1`` and review the diff).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_report_exports import CREATED, SECRET, _cold, _failed, _golden, _warm

from latency_analyzer import Waterfall
from latency_analyzer.analysis import Tags, WaterfallSet
from latency_analyzer.cli import main
from latency_analyzer.testing.waterfalls import synthetic
from latency_analyzer.timeline import TlsInfo

STAMP = "2025-01-02T03:04:05.678901Z"
assert CREATED.isoformat().replace("+00:00", "Z") == STAMP


def _run_file(path: Path, wfs: list[Waterfall], warmup: int = 0) -> Path:
    with WaterfallSet(path, meta={"scenario": {"name": "golden"}}) as ws:
        for i, wf in enumerate(wfs):
            ws.add(wf, Tags(scenario="golden", warmup=i < warmup))
    return path


def _sorted(text: str) -> str:
    return json.dumps(json.loads(text), indent=1, sort_keys=True) + "\n"


def test_export_writes_what_the_exporters_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run_file(tmp_path / "run.jsonl", [_cold(), _warm(), _failed()])
    outs = {f: tmp_path / f"out.{f}" for f in ("har", "perfetto", "otlp", "csv")}
    argv = ["export", str(run), "--created", STAMP]
    argv += [x for f, p in outs.items() for x in (f"--{f}", str(p))]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert err.count("3 requests") == 4
    texts = {f: p.read_text(encoding="utf-8") for f, p in outs.items()}
    _golden("export.har.json", _sorted(texts["har"]))
    _golden("export.trace.json", _sorted(texts["perfetto"]))
    _golden("export.otlp.json", _sorted(texts["otlp"]))
    _golden("export.csv", texts["csv"])
    assert not any(SECRET in t for t in texts.values())


def test_export_leaves_warmup_out_on_request_and_says_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run_file(tmp_path / "run.jsonl", [_cold(), _warm(), _failed()], warmup=1)
    har = tmp_path / "out.har"
    assert main(["export", str(run), "--no-warmup", "--har", str(har)]) == 0
    assert len(json.loads(har.read_text())["log"]["entries"]) == 2
    assert main(["export", str(run)]) == 2
    assert "name at least one of --har" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "wf"}\n', encoding="utf-8")
    assert main(["export", str(bad), "--csv", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "not a run header" in err
    assert main(["export", str(tmp_path / "missing.jsonl"), "--csv", "x.csv"]) == 2
    assert "cannot read the run file" in capsys.readouterr().err


TLS = TlsInfo("TLSv1.3", "TLS_AES_128_GCM_SHA256", "http/1.1", False, "llm.test")


def _story_run() -> list[Waterfall]:
    """Twelve streamed requests, each on a new connection with a lookup: a bad client."""
    return [
        synthetic(
            start_ms=300.0 * i, dns=23.0, connect=0.2, tls=41.0, send=0.1, wait=40.5,
            first_token=18.0, gaps=[2.0] * 15, tail=0.3, tls_info=TLS,
            connection_id=i + 1,
        )
        for i in range(12)
    ]  # fmt: skip


def test_diagnose_json_is_pinned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_file(tmp_path / "run.jsonl", _story_run(), warmup=2)
    assert main(["diagnose", str(run), "--server-alpn", "h2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    out["run"] = "<run>"
    assert out["counts"] == {"requests": 12, "warmup": 2, "failed": 0}
    rules = [f["rule"] for f in out["findings"]]
    assert set(rules) == {"dns", "new_connection", "tls_resumption", "http1"}
    assert out["what_if"]["then_s"] == pytest.approx(0.0586, abs=1e-9)
    _golden("cli-diagnose.json", json.dumps(out, indent=1, sort_keys=True) + "\n")


def test_diagnose_text_names_the_run_and_ends_with_the_what_if(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run_file(tmp_path / "run.jsonl", _story_run())
    assert main(["diagnose", str(run)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == f"{run}: 12 requests (0 warm-up, left out; 0 failed, left out)"
    assert lines[-1].startswith("what-if: with ") and "a DNS cache" in lines[-1]
    assert "connection reuse" in lines[-1]
    assert "TTFT 58.6 ms instead of 122.8 ms" in lines[-1]
