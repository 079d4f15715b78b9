"""``compare`` of several runs (do they reproduce?) and a claim in money: goldens and errors.

The run files under ``tests/fixtures/runs/`` were recorded with ``latency-analyzer run`` against
the test bed (their README says how): day 1 and day 2 on one server, day 3 with a 1.5× slower
decode, and a candidate with a 5× faster prefill. The bootstrap is seeded, so the outputs are
pinned by golden files (regenerate with ``UPDATE_GOLDEN=1`` and review the diff).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from test_report_exports import _golden

from latency_analyzer.cli import main

RUNS = Path(__file__).parent / "fixtures" / "runs"
DAYS = [str(RUNS / f"day{i}.jsonl") for i in (1, 2, 3)]
PAIR = [DAYS[0], str(RUNS / "candidate.jsonl")]
MONEY = ["--claim", "5", "--metric", "ttft_p50", "--cost-per-month", "1.2e6"]
MONEY += ["--migration-cost", "2e6", "--months", "12"]


def _pretty(text: str) -> str:
    return json.dumps(json.loads(text), indent=1, sort_keys=True) + "\n"


def test_three_days_verdict_text_is_pinned(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", *DAYS, "--within", "5%"]) == 1  # some statistics do not reproduce
    text = capsys.readouterr().out
    _golden("compare-reproduce.txt", text)
    lines = text.splitlines()
    assert lines[0] == "3 runs held to 5%: day1, day2, day3"
    verdicts = {ln.split()[0]: ln.rsplit("  ", 1)[1] for ln in lines[2:20]}
    # day 3's decode was 3 ms a token instead of 2: every decode-bound statistic differs
    assert verdicts["tpot_p50"] == verdicts["decode_p50"] == "does not reproduce"
    assert verdicts["first_token_p50"] == "reproduces"  # the same 20 ms prefill each day
    assert lines[-1].startswith("reproduces within 5%: first_token_p50; does not: tpot_p50")


def test_three_days_verdict_json_is_pinned(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", *DAYS, "--within", "0.05", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    rep = out["reproduction"]
    assert rep["runs"] == ["day1", "day2", "day3"] and rep["within"] == 0.05
    assert rep["reproduces"] is False
    tpot = next(r for r in rep["rows"] if r["metric"] == "tpot_p50")
    assert [p["runs"] for p in tpot["pairs"]] == [[0, 1], [0, 2], [1, 2]]
    assert tpot["spread"][1] > 1.05  # the whole CI above the band
    _golden("compare-reproduce.json", json.dumps(out, indent=1, sort_keys=True) + "\n")


def test_two_runs_with_within_keep_the_comparison(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", *DAYS[:2], "--within", "5%"]) == 0  # nothing shown to differ
    text = capsys.readouterr().out
    assert text.startswith("group ")  # today's comparison table first
    assert "2 runs held to 5%: day1, day2" in text
    assert "(95% for all pairs together)" in text  # one pair: no adjustment


def test_claim_in_money_text_and_json_are_pinned(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", *PAIR, *MONEY]) == 1  # 5× claimed, about 3× measured
    text = capsys.readouterr().out
    _golden("compare-money.txt", text)
    tail = text.splitlines()[-6:]
    assert tail[0].startswith("ttft_p50: claimed 5×, measured 3.1× [")
    assert tail[2] == "claimed 5× saves 0.96 M/month"  # 1.2 M × (1 − 1/5)
    assert tail[3].startswith("measured 3.1× [") and " saves 0.82 M [" in tail[3]
    assert main(["compare", *PAIR, *MONEY, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    money = out["money"]
    measured = out["claim"]["text"]
    assert money["claimed"]["saving_per_month"] == pytest.approx(0.96e6)
    speed = money["measured"]["speedup"]
    assert money["measured"]["net"] == pytest.approx(
        [12 * 1.2e6 * (1 - 1 / s) - 2e6 for s in speed]
    )
    assert f"{speed[0]:.2g}×" in measured
    _golden("compare-money.json", _pretty(json.dumps(out)))


def test_money_without_a_claim_prices_the_measured_speedup(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["compare", *PAIR, "--cost-per-month", "1000", "--metric", "e2e_p50"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2].startswith("money on e2e_p50, today 1.00 k/month")
    assert lines[-1].startswith("measured 1.9× [") and "claimed" not in lines[-1]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--within", "5"], "argument --within: '5' is ambiguous"),
        (["--within", "0"], "argument --within: the tolerance must be above 0"),
        (["--within=-5%"], "argument --within: the tolerance must be above 0"),
        (["--within", "lots"], "argument --within: 'lots' is not a tolerance"),
        (["--cost-per-month", "0"], "argument --cost-per-month: must be above 0"),
        (["--cost-per-month=-1e6"], "argument --cost-per-month: must be above 0"),
        (["--cost-per-month", "1e6", "--migration-cost", "0"], "argument --migration-cost:"),
        (["--cost-per-month", "1e6", "--months", "-12"], "argument --months: must be above 0"),
        (["--claim", "0"], "argument --claim: must be above 0"),
        (["--claim", "many"], "argument --claim: 'many' is not a number"),
    ],
)
def test_bad_numbers_exit_2_naming_the_option(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["compare", *PAIR, *argv])
    assert exc.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([DAYS[0], "--within", "5%"], "--within needs two runs or more, got 1"),
        ([DAYS[0]], "compare needs two runs: a baseline and a candidate"),
        (DAYS, "3 runs are compared for reproduction: give the tolerance, e.g. --within 5%"),
        ([*DAYS, "--within", "5%", "--claim", "2"], "--claim compares a baseline with a"),
        ([*DAYS, "--within", "5%", "--cost-per-month", "9"], "--cost-per-month compares a"),
        ([*DAYS, "--within", "5%", "--pair-by", "name"], "--pair-by pairs the scenarios of two"),
        ([*PAIR, "--migration-cost", "5"], "--migration-cost needs --cost-per-month"),
        ([*PAIR, "--months", "5", "--migration-cost", "5"], "--migration-cost, --months need"),
        ([*PAIR, "--metric", "ttft_p50"], "--metric names the statistic of --claim or"),
        ([*PAIR, "--cost-per-month", "9", "--metric", "ttft"], "metric must look like"),
        ([*PAIR, "--cost-per-month", "9", "--metric", "connect_p50"], "no measured speedup of"),
    ],
)
def test_options_that_cannot_apply_exit_2(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", *argv]) == 2
    assert says in capsys.readouterr().err


DOC = Path(__file__).resolve().parents[1] / "docs" / "load.md"


def _doc_commands() -> list[tuple[str, str]]:
    """(command, output) of each ``console`` block of docs/load.md that runs ``compare``."""
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```console\n\$ (latency-analyzer compare [^\n]*)\n(.*?)```", text, re.S)
    return [(cmd, out) for cmd, out in blocks]


def test_docs_show_what_the_commands_print(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = _doc_commands()
    assert [("--within" in c, "--cost-per-month" in c) for c, _ in blocks] == [
        (True, False),
        (False, True),
    ]
    monkeypatch.chdir(DOC.parents[1])  # the commands name the fixtures from the repository
    for command, shown in blocks:
        main(shlex.split(command)[1:])
        assert capsys.readouterr().out == shown, command
