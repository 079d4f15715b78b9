"""SLOs and goodput: ``run --slo`` against a count done by hand on the same waterfalls."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from latency_analyzer.cli import main as cli_main
from latency_analyzer.errors import UsageError
from latency_analyzer.load._slo import parse_slos
from latency_analyzer.testing import LLMServer
from latency_analyzer.timeline import Waterfall

CHAT = "/v1/chat/completions"


def test_goodput_equals_a_count_by_hand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # half the requests are slowed past the TTFT objective by the server (a per-request knob)
    toml = tmp_path / "s.toml"
    out = tmp_path / "run.jsonl"
    with LLMServer(tokens=4, decode=0.001).run_in_subprocess() as s:
        toml.write_text(
            f'url = "{s.url}{CHAT}"\nrequests = 40\nconcurrency = 2\nwarmup_requests = 4\n'
            '[[templates]]\nname = "fast"\n'
            '[[templates]]\nname = "slow"\nbody = {testbed = {header_delay = 0.030}}\n'
        )
        argv = ["run", str(toml), "--out", str(out), "--json", "--workers", "1"]
        assert cli_main([*argv, "--slo", "ttft_p95=20ms,tpot_p99=50ms,e2e=200ms"]) == 0
    report = json.loads(capsys.readouterr().out)["slo"]
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    rows = [(Waterfall.from_dict(x["wf"]), x["tags"]) for x in lines if x["kind"] == "wf"]
    counted = [wf for wf, tags in rows if not tags["warmup"]]
    good = [
        wf
        for wf in counted
        if wf.ok
        and wf.ttft_ns is not None
        and wf.ttft_ns <= 20_000_000
        and wf.tpot is not None
        and wf.tpot <= 0.050
        and wf.e2e_ns <= 200_000_000
    ]
    ok = [wf for wf in counted if wf.ok]
    starts = [wf.start_epoch_ns or 0 for wf in ok]
    span_s = (max(t + wf.e2e_ns for t, wf in zip(starts, ok, strict=True)) - min(starts)) / 1e9
    assert report["requests"] == len(counted) == 36
    assert 0 < report["good"] == len(good) < len(counted)  # the slow half missed its TTFT
    assert report["goodput_rps"] == pytest.approx(len(good) / span_s, rel=1e-9)
    # the run's P95 TTFT, nearest rank, by hand: above 20 ms, so that objective is not met
    ttfts = sorted(wf.ttft_ns for wf in ok if wf.ttft_ns is not None)
    p95 = ttfts[math.ceil(0.95 * len(ttfts)) - 1]
    by_key = {x["key"]: x for x in report["slos"]}
    assert by_key["ttft_p95"]["measured_s"] == pytest.approx(p95 / 1e9, abs=1e-9)
    assert by_key["ttft_p95"]["met"] is False and by_key["tpot_p99"]["met"] is True


def test_slo_lines_in_the_text_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with LLMServer(tokens=2).run_in_subprocess() as s:
        argv = ["run", "--url", s.url + CHAT, "--requests", "5", "--out", str(tmp_path / "o")]
        assert cli_main([*argv, "--workers", "1", "--slo", "ttft_p50=5s"]) == 0
    text = capsys.readouterr().out
    assert "SLO ttft_p50 <= 5.000 s:" in text and ", met" in text
    assert "goodput: " in text and "(5 of 5 requests met every SLO)" in text


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("ttft_p95", "KEY=DURATION"),
        ("ttft_p95=fast", "ttft_p95"),
        ("tfft_p95=1s", "did you mean 'ttft_p95'"),
        ("itl_p99=5ms", "per token"),
        ("ttft=1s,ttft=2s", "twice"),
        ("", "no SLO"),
    ],
)
def test_bad_slos(text: str, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        parse_slos(text)


def test_a_bad_slo_flag_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli_main(["run", "--url", "http://127.0.0.1:9/", "--requests", "1", "--slo", "bogus=1s"])
    assert exc.value.code == 2 and "--slo" in capsys.readouterr().err
