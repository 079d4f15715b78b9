"""``report A B --claim X --cost-per-month C ...``: the page's verdict, claimed and measured.

On the recorded runs of ``tests/fixtures/runs`` (day 1 against a candidate with a 5× faster
prefill). The page's figures are held to the library's (``check_claim`` and ``money_case``
called directly), and a headless browser must show them.
"""

from __future__ import annotations

import html
import re
import subprocess
from pathlib import Path

import pytest
from test_report_page import CHROMIUM_FLAGS, _chromium

from latency_analyzer.analysis import WaterfallSet, check_claim, money_case
from latency_analyzer.cli import main

pytest.importorskip("matplotlib")

RUNS = Path(__file__).parent / "fixtures" / "runs"
PAIR = [str(RUNS / "day1.jsonl"), str(RUNS / "candidate.jsonl")]
OPTIONS = ["--claim", "5", "--metric", "ttft_p50", "--cost-per-month", "1.2e6"]
OPTIONS += ["--migration-cost", "2e6", "--months", "12"]


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("verdict") / "report.html"
    assert main(["report", *PAIR, *OPTIONS, "-o", str(out)]) == 0
    return out


def _expected() -> tuple[str, dict[str, dict[str, str]]]:
    base, cand = WaterfallSet.load(PAIR[0]), WaterfallSet.load(PAIR[1])
    claim = check_claim(base, cand, claimed=5.0, metric="ttft_p50")
    case = money_case(
        metric="ttft_p50", cost_per_month=1.2e6, claimed=5.0, measured=claim.measured,
        migration_cost=2e6, months=12,
    )  # fmt: skip
    return claim.verdict, {w: case.cells(w) for w in ("claimed", "measured")}


def _rows(text: str) -> dict[str, list[str]]:
    section = text[text.index(">Verdict</h2>") :]
    table = section[: section.index("</table>")]
    rows = re.findall(r"<tr><td>(\w+)</td>(.*?)</tr>", table)
    return {name: [html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", cells)]
            for name, cells in rows}  # fmt: skip


def test_the_page_shows_the_claim_and_both_speedups_in_money(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    verdict, cells = _expected()
    assert verdict == "not supported"
    assert f"<b>{verdict}</b>" in text
    rows = _rows(text)
    for which in ("claimed", "measured"):
        want = cells[which]
        assert rows[which] == [want["speedup"], want["saving"], want["net"], want["payback"]]
    assert rows["claimed"][1] == "0.96 M"  # 1.2 M × (1 − 1/5)
    assert re.fullmatch(r"0\.\d\d M \[0\.\d\d, 0\.\d\d\]", rows["measured"][1])
    assert "net of migration (2.00 M) over 12 months" in text


def test_a_browser_shows_the_verdict(page: Path, tmp_path: Path) -> None:
    exe = _chromium()
    dom = subprocess.run(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
         page.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert 'data-rendered="ok 4"' in dom.stdout
    _, cells = _expected()
    assert _rows(dom.stdout)["measured"][0] == cells["measured"]["speedup"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([PAIR[0], "--claim", "5"], "--claim compares a baseline with a candidate: give two runs"),
        ([*PAIR, "--months", "12"], "--months needs --cost-per-month"),
        ([*PAIR, "--metric", "e2e_p50"], "--metric names the statistic of --claim or"),
    ],
)
def test_report_options_that_cannot_apply_exit_2(
    argv: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", *argv, "-o", str(tmp_path / "r.html")]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_report_bad_money_exits_2_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["report", *PAIR, "--cost-per-month", "0", "-o", str(tmp_path / "r.html")])
    assert exc.value.code == 2
    assert "argument --cost-per-month: must be above 0" in capsys.readouterr().err
