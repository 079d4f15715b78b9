"""``run`` and ``compare`` subcommands, through their own argparse parsers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from latency_analyzer.analysis import Tags, WaterfallSet
from latency_analyzer.cli import main as cli_main
from latency_analyzer.cli.compare import add_compare_parser
from latency_analyzer.cli.run import add_run_parser
from latency_analyzer.testing import LLMServer
from latency_analyzer.testing.waterfalls import synthetic


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="latency-analyzer")
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_parser(sub)
    add_compare_parser(sub)
    return parser


def _main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    return int(args.func(args))


def test_run_toml_then_compare_with_a_claim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slow, fast = tmp_path / "slow.jsonl", tmp_path / "fast.jsonl"
    toml = tmp_path / "s.toml"
    with (
        LLMServer(header_delay=0.020, tokens=2).run_in_subprocess() as a,
        LLMServer(header_delay=0.005, tokens=2).run_in_subprocess() as b,
    ):
        toml.write_text(
            f'url = "{a.url}/v1/chat/completions"\nrequests = 30\nconcurrency = 2\n'
            "warmup_requests = 2\n"
        )
        assert _main(["run", str(toml), "--out", str(slow), "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["run"]["issued"] == out["run"]["stored"] == 30
        assert out["counts"]["warmup"] == 2
        flags = ["run", "--url", f"{b.url}/v1/chat/completions", "--requests", "30"]
        assert _main([*flags, "--concurrency", "2", "--out", str(fast)]) == 0
        ttft = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("ttft "))
        assert ttft.split()[1:3] == ["ms", "30"]  # its unit and its sample count
    # ttft: 20 ms vs 5 ms header delay plus ~1 ms of client/loopback each: about 3.5×, not 15×
    code = _main(["compare", str(slow), str(fast), "--claim", "15", "--metric", "ttft_p50"])
    text = capsys.readouterr().out
    assert code == 1 and "claimed 15×" in text and "not supported" in text
    assert _main(["compare", str(slow), str(fast), "--claim", "2", "--metric", "ttft_p50"]) == 0


def test_run_preset_fault_injection(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with LLMServer(tokens=2).run_in_subprocess() as s:
        argv = ["run", "--preset", "fault_injection", "--url", f"{s.url}/v1/chat/completions"]
        argv += ["--rate", "50", "--duration", "1.5", "--outage-at", "0.5", "--outage", "0.5"]
        code = _main([*argv, "--out", str(tmp_path / "f.jsonl"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1  # the outage made requests fail
    assert out["outage"]["errors"] > 0
    assert out["outage"]["recovery_s"] == pytest.approx(out["outage"]["injected_s"], rel=0.2)


def test_compare_cli_pairs_by_position_when_names_differ(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = []
    for name, wait in (("vendor-a", 30.0), ("vendor-b", 10.0)):
        path = tmp_path / f"{name}.jsonl"
        with WaterfallSet(path, meta={"scenario": {"name": name}}) as ws:
            for i in range(20):
                wf = synthetic(start_ms=50.0 * i, send=0.1, wait=wait, first_token=2.0)
                ws.add(wf, Tags(scenario=name))
        paths.append(str(path))
    assert _main(["compare", *paths, "--json"]) == 0  # auto: pairs by position
    auto = json.loads(capsys.readouterr().out)
    assert _main(["compare", *paths, "--pair-by", "position", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == auto
    assert cli_main(["compare", *paths, "--pair-by", "name"]) == 2
    err = capsys.readouterr().err
    assert "share no scenario name" in err and "vendor-a" in err and "vendor-b" in err


def test_read_batching_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--read-batching`` sets the run's window (kept in the run file's scenario); one out of
    range exits 2 with the key and the reason, before anything runs."""
    with LLMServer(tokens=2).run_in_subprocess() as s:
        url = f"{s.url}/v1/chat/completions"
        base = ["run", "--url", url, "--requests", "4", "--concurrency", "2", "--workers", "1"]
        out = tmp_path / "r.jsonl"
        assert _main([*base, "--read-batching", "0", "--out", str(out), "--json"]) == 0
        capsys.readouterr()
        assert cli_main([*base, "--read-batching", "0.05", "--out", str(tmp_path / "x")]) == 2
    meta = json.loads(out.read_text().splitlines()[0])["meta"]
    assert meta["scenario"]["read_batching"] == 0
    err = capsys.readouterr().err
    assert "read_batching must be between 0 and 0.005 seconds, got 0.05" in err
    assert not (tmp_path / "x").exists()
