"""Every field-scenario file in examples/scenarios parses as written and runs, shrunk, against
the test bed through the CLI a reader would use (the folder's dataset, conversation and trace
files, which need their data files, are run by tests/test_examples_traffic.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from latency_analyzer.cli import main
from latency_analyzer.load import load_scenario
from latency_analyzer.testing import LLMServer

SCENARIOS = Path(__file__).parent.parent / "examples" / "scenarios"

# the four field scenarios, each shrunk to a second or a handful of requests
SHRINK = {
    "cold_start_storm": ["--requests", "6"],
    "long_tail": ["--requests", "4", "--concurrency", "2"],
    "mixed_load": ["--duration", "1.0", "--warmup-seconds", "0"],
    "fault_injection": ["--duration", "1.2", "--outage-at", "0.4", "--outage", "0.3"],
}


FILES = [SCENARIOS / f"{name}.toml" for name in sorted(SHRINK)]
OWN_DATA = {"conversation", "dataset", "trace", "token_lengths"}  # test_examples_traffic.py


def test_there_is_one_file_per_field_scenario() -> None:
    assert sorted(f.stem for f in SCENARIOS.glob("*.toml")) == sorted({*SHRINK, *OWN_DATA})


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_the_file_parses_as_written(path: Path) -> None:
    sc, sweep = load_scenario(path)
    assert sc.name == path.stem and sweep == {}
    assert sc.url.startswith("http://127.0.0.1:8000/")
    assert sc.requests or sc.duration


@pytest.fixture(scope="module")
def server() -> object:
    with LLMServer(tokens=2, prefill=0.002).run_in_subprocess() as s:
        yield s


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_the_file_runs_shrunk(
    path: Path, server: LLMServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"{server.url}/v1/chat/completions"
    out = tmp_path / "run.jsonl"
    argv = ["run", str(path), "--url", url, "--out", str(out), "--json", *SHRINK[path.stem]]
    code = main(argv)
    result = json.loads(capsys.readouterr().out)
    assert result["run"]["scenario"] == path.stem
    assert result["run"]["issued"] == result["run"]["stored"] > 0
    if path.stem == "fault_injection":
        assert code == 1 and result["outage"]["errors"] > 0  # the outage failed requests
    else:
        assert code == 0, result["counts"]
    if path.stem == "long_tail":
        assert sum(b["requests"] for b in result["length_buckets"].values()) == 4
    if path.stem == "mixed_load":
        assert result["counts"]["warmup"] == 0
    assert out.exists()
