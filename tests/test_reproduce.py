"""Do runs reproduce within a tolerance: the rule on known data, and its error rates.

Values are drawn with known ratios between runs, so each verdict follows from what was
injected; the error rates are counted over many seeded trials.
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest
from test_analysis import build

from latency_analyzer import UsageError
from latency_analyzer.analysis import WaterfallSet, parse_tolerance, reproduce
from latency_analyzer.analysis._reproduce import pair_confidence, spread_of
from latency_analyzer.cli import main as cli_main


@pytest.mark.parametrize(
    ("text", "value"), [("5%", 0.05), ("0.05", 0.05), (" 2.5% ", 0.025), ("150%", 1.5)]
)
def test_tolerance_parses_percent_and_fractions(text: str, value: float) -> None:
    assert parse_tolerance(text) == pytest.approx(value)


@pytest.mark.parametrize(
    ("text", "says"),
    [("5", "ambiguous"), ("0", "above 0"), ("-5%", "above 0"), ("five", "not a tolerance")],
)
def test_tolerance_rejects(text: str, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        parse_tolerance(text)


def test_runs_within_the_band_reproduce_and_outside_do_not() -> None:
    rng = np.random.default_rng(7)
    base = rng.uniform(0.099, 0.101, 2000)  # a tight distribution: CIs of about 0.1 %
    runs = [base, base * 1.02, base * 0.99]  # largest / smallest: 1.02 / 0.99 = 1.0303
    five = spread_of(runs, "wait", "p50", 0.05)
    assert five.verdict == "reproduces"
    assert five.spread.value == pytest.approx(1.02 / 0.99)
    assert 1 / 1.05 <= five.spread.low <= five.spread.value <= five.spread.high <= 1.05
    one = spread_of(runs, "wait", "p50", 0.01)
    assert one.verdict == "does not reproduce"
    assert one.spread.low > 1.01
    # the pair that differs most is named: run 1 (×1.02) over run 2 (×0.99)
    worst = max(one.pairs, key=lambda p: abs(np.log(p.ratio.value)))
    assert (worst.i, worst.j) == (1, 2) and worst.verdict == "does not reproduce"


def test_few_requests_are_inconclusive_and_absent_stages_not_applicable() -> None:
    rng = np.random.default_rng(8)
    runs = [rng.uniform(0.05, 0.15, 10) for _ in range(3)]
    assert spread_of(runs, "wait", "p95", 0.05).verdict == "inconclusive"
    zeros = [np.zeros(10), np.zeros(10)]
    na = spread_of(zeros, "dns", "p50", 0.05)
    assert na.verdict == "n/a" and na.pairs == []
    assert spread_of([np.zeros(0), np.ones(5)], "dns", "p50", 0.05).verdict == "n/a"


def test_pairs_hold_together_at_the_confidence_asked() -> None:
    assert pair_confidence(0.95, 2) == pytest.approx(0.95)
    assert pair_confidence(0.95, 3) == pytest.approx(1 - 0.05 / 3)
    assert pair_confidence(0.95, 5) == pytest.approx(1 - 0.05 / 10)


def test_error_rates_of_the_verdicts() -> None:
    """Equal runs are rarely called different; runs 10 % apart are never called reproducing.

    Three runs of 200 draws from one exponential, 300 trials: "does not reproduce" is a false
    alarm, to happen at most 5 % of the time (the pairs' joint confidence); measured about
    1-3 % when this test was written. Runs 10 % apart with 20,000 draws each: "reproduces
    within 5 %" would be wrong; a CI inside the band needs a ratio within 5 %, some 8
    standard errors from the truth.
    """
    rng = np.random.default_rng(11)
    alarms = collections.Counter()
    for trial in range(300):
        runs = [rng.exponential(1.0, 200) for _ in range(3)]
        alarms[spread_of(runs, "e2e", "p50", 0.05, seed=trial).verdict] += 1
    assert alarms["does not reproduce"] <= 0.05 * 300
    assert alarms["reproduces"] == 0  # 200 draws cannot show a 5 % agreement
    wrong = collections.Counter()
    for trial in range(20):
        runs = [rng.exponential(1.0, 20_000), rng.exponential(1.1, 20_000)]
        wrong[spread_of(runs, "e2e", "p95", 0.05, seed=trial).verdict] += 1
    assert wrong["reproduces"] == 0 and wrong["does not reproduce"] >= 15


def test_reproduce_on_sets_names_runs_and_lists_verdicts() -> None:
    rng = np.random.default_rng(5)
    waits = list(rng.uniform(99, 101, 300))
    sets = [build(waits), build([w * 1.01 for w in waits]), build([w * 1.3 for w in waits])]
    rep = reproduce(sets, within=0.05, names=["a", "b", "c"], metrics=["wait"], stats=["p50"])
    row = rep.get("wait_p50")
    assert row.verdict == "does not reproduce"
    assert [round(e.value * 1e3, 1) for e in row.runs] == [
        round(np.percentile(w, 50, method="inverted_cdf"), 1)
        for w in (waits, [x * 1.01 for x in waits], [x * 1.3 for x in waits])
    ]
    assert not rep.reproduces
    assert rep.verdict_line() == "reproduces within 5%: none; does not: wait_p50"
    two = reproduce(sets[:2], within=0.05, metrics=["wait"], stats=["p50"])
    assert two.names == ["run1", "run2"] and two.reproduces
    assert two.verdict_line() == "reproduces within 5%: wait_p50; does not: none"
    with pytest.raises(UsageError, match="two runs or more"):
        reproduce(sets[:1], within=0.05)
    with pytest.raises(UsageError, match="above 0"):
        reproduce(sets, within=0.0)
    with pytest.raises(UsageError, match="2 names for 3 runs"):
        reproduce(sets, within=0.05, names=["a", "b"])


def test_a_run_without_requests_is_an_error_not_a_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing compared must not read as "none does not reproduce" (exit 0)."""
    sets = [build([100.0, 101.0, 99.0]), WaterfallSet()]
    with pytest.raises(UsageError, match="empty: no requests"):
        reproduce(sets, within=0.05, names=["full", "empty"])
    run = Path(__file__).parent / "fixtures" / "runs" / "day1.jsonl"
    empty = tmp_path / "empty.jsonl"  # a run file's header and no request
    empty.write_text(run.read_text().splitlines()[0] + "\n")
    assert cli_main(["compare", str(run), str(empty), "--within", "5%"]) == 2
    assert "empty: no requests" in capsys.readouterr().err
    notes = tmp_path / "notes.md"  # not a run file at all: said so, with its name
    notes.write_text("# not a run file\n")
    assert cli_main(["compare", str(run), str(notes), "--within", "5%"]) == 2
    assert f"{notes}: line 1 is not JSON; not a run file" in capsys.readouterr().err
