"""examples/sweeps/rates.toml, shown verbatim in docs/load.md, run by ``sweep`` and ``search``
against the test bed's M/D/1 server (one slot, 6 ms of service), shrunk to 40 requests a point.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from latency_analyzer.analysis import WaterfallSet
from latency_analyzer.cli import main
from latency_analyzer.testing import LLMServer

ROOT = Path(__file__).resolve().parent.parent
FILE = ROOT / "examples" / "sweeps" / "rates.toml"
SHRINK = ["--requests", "40", "--warmup-requests", "4"]


def test_the_file_is_shown_in_the_docs() -> None:
    assert FILE.read_text() in (ROOT / "docs" / "load.md").read_text()


@pytest.fixture(scope="module")
def url() -> object:
    with LLMServer(prefill=0.006, tokens=1, slots=1).run_in_subprocess() as s:
        yield s.url + "/v1/chat/completions"


def test_sweep_runs_the_files_table(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep.jsonl"
    argv = ["sweep", str(FILE), "--url", url, "--out", str(out), *SHRINK, "--slo", "e2e_p95=1s"]
    assert main(argv) == 0
    text = capsys.readouterr().out.splitlines()
    rates = [20, 60, 100, 130, 150]
    assert [line.split(":")[1].strip() for line in text[:5]] == [f"{r} req/s" for r in rates]
    assert text[5].startswith("knee: ") and "maximum curvature of e2e_p95" in text[5]
    ws = WaterfallSet.load(out)
    assert [run["scenario"]["rate"] for run in ws.runs] == rates
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_search_on_the_same_file(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "search.jsonl"
    argv = [
        *("search", str(FILE), "--url", url, "--out", str(out), *SHRINK),
        *("--slo", "e2e_mean=16ms", "--rate-max", "300", "--resolution", "20%", "--json"),
    ]
    assert main(argv) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["rate"] is not None and found["failing"] is not None
    assert found["failing"]["rate"] / found["rate"] - 1 <= 0.20
    assert found["passing"]["met"] and not found["failing"]["met"]
    assert len(WaterfallSet.load(out).runs) == len(found["points"])
