"""The pytest plugin: budget keys, durations, percentiles, and whole pytest runs (pytester).

Pure parts are checked against hand-computed values. Whole runs go through ``pytester``: most
record hand-built waterfalls (exact nanoseconds, so every number in the output is known);
the acceptance runs probe an ``LLMServer`` in its own process with a 50 ms prefill, whose
budgets (30 ms: fails, 200 ms: passes) sit far from the measured value on purpose.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import importlib.util
import inspect
import json
import math
import re
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_exact, tolerance
from hypothesis import given
from hypothesis import strategies as st

from latency_analyzer import Span, UsageError, Waterfall
from latency_analyzer._budget_keys import NAMES, parse_key
from latency_analyzer._units import format_ns, parse_duration_ns
from latency_analyzer.pytest_plugin._budgets import (
    BudgetSpec,
    merge_specs,
    parse_budget_lines,
    parse_marker_kwargs,
)
from latency_analyzer.pytest_plugin._check import evaluate
from latency_analyzer.pytest_plugin._output import failure_text
from latency_analyzer.pytest_plugin._session import worker_path
from latency_analyzer.pytest_plugin._stats import percentile
from latency_analyzer.testing import SubprocessLLMServer

pytest_plugins = ["pytester"]

PLUGIN = "latency_analyzer.pytest_plugin"
MS = 1_000_000
PREFILL = 0.050
# the module's LLM server: its own process, so the 50 ms prefill is exact whatever this one does
LLM_KNOBS = {"prefill": PREFILL, "decode": 0.001, "tokens": 4}


def make_waterfall(
    e2e_ms: int,
    stages: Sequence[tuple[Any, ...]] = (),
    tokens_ms: Sequence[int] = (),
    error: str | None = None,
) -> Waterfall:
    """A waterfall with exact times: ``stages`` are ``(name, start_ms, end_ms[, server])``
    where ``server`` lists ``(name, start_ms, end_ms)`` server spans inside the stage;
    ``tokens_ms`` are one-token chunk arrivals."""
    ms = 1_000_000

    def span(name: str, a: int, b: int, kids: Sequence[Any] = ()) -> Span:
        inner = tuple(Span(n, x * ms, y * ms, source="server") for n, x, y in kids)
        return Span(name, a * ms, b * ms, children=inner)

    return Waterfall(
        root=Span("request", 0, e2e_ms * ms, children=tuple(span(*s) for s in stages)),
        method="POST",
        url="http://127.0.0.1:9/v1/chat/completions",
        status=None if error else 200,
        error=error,
        error_type="reset" if error else None,
        chunk_times_ns=tuple(t * ms for t in tokens_ms),
        chunk_tokens=(1,) * len(tokens_ms),
        output_tokens=len(tokens_ms) or None,
    )


# --- durations ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "ns"),
    [
        (1.5, 1_500_000_000),
        (2, 2_000_000_000),
        (0, 0),
        ("0.035", 35_000_000),  # exact: no binary float on the way
        (0.035, 35_000_000),
        ("30ms", 30_000_000),
        ("30 ms", 30_000_000),
        (" 30MS ", 30_000_000),
        ("1.5s", 1_500_000_000),
        ("250us", 250_000),
        ("250µs", 250_000),
        ("250μs", 250_000),
        ("1500ns", 1_500),
        ("1e-3", 1_000_000),
        ("2.5e1ms", 25_000_000),
        (".5ms", 500_000),
        (datetime.timedelta(milliseconds=20), 20_000_000),
    ],
)
def test_durations_parse_exactly(value: object, ns: int) -> None:
    assert parse_duration_ns(value) == ns


@pytest.mark.parametrize(
    "value",
    [True, -1, "-5ms", "30 mins", "30m", "ms", "", "fast", float("nan"), float("inf"), None, [1]],
)
def test_bad_durations_are_usage_errors(value: object) -> None:
    with pytest.raises(UsageError):
        parse_duration_ns(value)


def test_durations_format_for_people() -> None:
    assert [format_ns(x) for x in (0, 812_500, 52_314_000, 1_234_000_000)] == [
        "0 ms",
        "812.5 µs",
        "52.31 ms",
        "1.234 s",
    ]


# --- budget keys -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("dns", ("dns", "max", None)),
        ("tls_p95", ("tls", "p95", Fraction(95))),
        ("first_token", ("first_token", "max", None)),  # "_token" is not a statistic
        ("schedule_lag_p99", ("schedule_lag", "p99", Fraction(99))),
        ("h2_setup_mean", ("h2_setup", "mean", None)),
        ("e2e_max", ("e2e", "max", None)),
        ("itl_min", ("itl", "min", None)),
        ("ttft_median", ("ttft", "p50", Fraction(50))),
        ("ttft_p50", ("ttft", "p50", Fraction(50))),
        ("ttft_p5", ("ttft", "p5", Fraction(5))),
        ("ttft_p999", ("ttft", "p999", Fraction("99.9"))),
        ("ttft_p9999", ("ttft", "p9999", Fraction("99.99"))),
        ("prefill_p90", ("prefill", "p90", Fraction(90))),
        ("other", ("other", "max", None)),
    ],
)
def test_budget_keys_split_into_name_and_statistic(key: str, expected: tuple[Any, ...]) -> None:
    assert parse_key(key) == expected


@pytest.mark.parametrize(
    "key",
    ["ttfb", "ttft_p100", "ttft_p0", "ttft_p05", "ttft_p", "ttft_avg", "output_tokens", "p95"],
)
def test_unknown_budget_keys_list_the_valid_ones(key: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_key(key)
    message = str(info.value)
    assert repr(key) in message
    assert all(name in message for name in NAMES)
    assert "_p95" in message and "_mean" in message


def test_a_near_miss_gets_a_suggestion() -> None:
    with pytest.raises(UsageError, match=r"did you mean 'ttft_p95'"):
        parse_key("tftt_p95")


def test_marker_kwargs_are_checked() -> None:
    spec = parse_marker_kwargs((), {"ttft_p95": "300ms", "e2e": 1.5, "allow_errors": True})
    assert {k: b.limit_ns for k, b in spec.budgets.items()} == {
        "ttft_p95": 300 * MS,
        "e2e": 1500 * MS,
    }
    assert spec.allow_errors is True
    with pytest.raises(UsageError, match="keyword arguments only"):
        parse_marker_kwargs(("300ms",), {})
    with pytest.raises(UsageError, match="allow_errors must be True or False"):
        parse_marker_kwargs((), {"allow_errors": "yes"})
    with pytest.raises(UsageError, match=r"budget tls='20 mins'"):
        parse_marker_kwargs((), {"tls": "20 mins"})


def test_ini_lines_take_commas_spaces_and_lines() -> None:
    budgets = parse_budget_lines(["tls=20ms, ttft_p95 = 300 ms", "e2e_max=1.5", ""])
    assert {k: (b.limit_ns, b.source) for k, b in budgets.items()} == {
        "tls": (20 * MS, "ini"),
        "ttft_p95": (300 * MS, "ini"),
        "e2e_max": (1500 * MS, "ini"),
    }
    with pytest.raises(UsageError, match="expected key=value"):
        parse_budget_lines(["tls"])


def test_closest_marker_wins_over_farther_ones_and_the_ini() -> None:
    defaults = parse_budget_lines(["tls=20ms e2e=1s"])
    module = parse_marker_kwargs((), {"e2e": "2s", "allow_errors": True})
    function = parse_marker_kwargs((), {"e2e": "3s", "allow_errors": False, "dns": "5ms"})
    merged = merge_specs(defaults, [module, function])
    assert {k: b.limit_ns for k, b in merged.budgets.items()} == {
        "tls": 20 * MS,
        "e2e": 3000 * MS,
        "dns": 5 * MS,
    }
    assert merged.allow_errors is False
    assert merge_specs(defaults, [module, parse_marker_kwargs((), {})]).allow_errors is True


# --- percentiles ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1, 2, 3, 4], 50, 2.0),  # rank ceil(2) = 2
        ([1, 2, 3, 4], 95, 4.0),  # rank ceil(3.8) = 4
        ([4, 1, 3, 2], 25, 1.0),  # unsorted input; rank ceil(1) = 1
        ([10, 20], Fraction("99.9"), 20.0),  # rank ceil(1.998) = 2
        ([7], 99, 7.0),
        ([5, 1, 9], 0, 1.0),  # rank 0 is clamped to the smallest value
        ([5, 1, 9], 100, 9.0),
        (list(range(1001)), Fraction("99.9"), 999.0),  # rank ceil(999.999) = 1000, exact
        (list(range(1000)), Fraction("99.9"), 998.0),  # rank 999 exactly: no float drift up
        ([0, 30_000_000, 50_000_000, 51_000_000, 52_000_000], 95, 52_000_000.0),
    ],
)
def test_percentile_by_hand(values: list[float], q: Fraction | float, expected: float) -> None:
    assert percentile(values, q) == pytest.approx(expected, rel=1e-15, abs=0)


def test_percentile_rejects_nothing_and_out_of_range() -> None:
    with pytest.raises(UsageError):
        percentile([], 50)
    with pytest.raises(UsageError):
        percentile([1.0], 101)


@given(
    st.lists(st.integers(0, 10**10), min_size=1, max_size=60),
    st.sampled_from([0, 1, 5, 50, 90, 95, 99, 99.9, 100]),
)
def test_percentile_matches_nearest_rank_elsewhere(values: list[int], q: float) -> None:
    import numpy as np

    from latency_analyzer.analysis import percentile as set_percentile

    expected = float(np.percentile(np.array(values, dtype=float), q, method="inverted_cdf"))
    assert percentile(values, Fraction(str(q))) == set_percentile(values, q)
    assert math.isclose(percentile(values, Fraction(str(q))), expected, rel_tol=1e-12, abs_tol=1e-6)


# --- checking recorded waterfalls (no pytest run) ---------------------------------------------


def _spec(**budgets: object) -> BudgetSpec:
    return parse_marker_kwargs((), budgets)


def _by_key(ev: Any) -> dict[str, tuple[float | None, int, bool]]:
    return {r.budget.key: (r.measured_ns, r.n, r.passed) for r in ev.results}


def test_stage_budgets_count_a_missing_stage_as_zero() -> None:
    cold = make_waterfall(40, [("connect", 0, 10), ("tls", 10, 30), ("wait", 30, 40)])
    warm = make_waterfall(10, [("wait", 0, 10)])
    ev = evaluate("t", _spec(tls="25ms", tls_min="1ms", tls_mean="10ms"), [cold, warm])
    assert _by_key(ev) == {
        "tls": (20 * MS, 2, True),
        "tls_min": (0.0, 2, True),  # the warm request had no TLS: 0 ns
        "tls_mean": (10 * MS, 2, True),  # (20 + 0) / 2, equal to the budget: passes
    }
    for wf in (cold, warm):
        assert_exact(wf)


def test_metric_budgets_and_the_worst_request() -> None:
    wfs = [
        make_waterfall(100, [("first_token", 0, 30)], tokens_ms=[30, 40, 50]),
        make_waterfall(100, [("first_token", 0, 60)], tokens_ms=[60, 61, 62, 93]),
        make_waterfall(100),  # no token: no ttft, no tpot, no itl
    ]
    ev = evaluate("t", _spec(ttft_p50="20ms", tpot_max="12ms", itl_p50="10ms", e2e="1s"), wfs)
    assert _by_key(ev) == {
        "ttft_p50": (30 * MS, 2, False),  # nearest rank: the first of 30 and 60
        "tpot_max": (11 * MS, 2, True),  # (50 - 30) / 2 and (93 - 60) / 3
        "itl_p50": (10 * MS, 5, True),  # every gap: 10, 10, 1, 1, 31 -> 3rd of 5 sorted
        "e2e": (100 * MS, 3, True),
    }
    ttft = ev.results[0]
    assert (ttft.worst, ttft.unmeasured) == (1, 1)
    assert [r.worst for r in ev.results[1:]] == [1, 1, 0]


def test_server_stages_need_server_spans() -> None:
    client_only = make_waterfall(60, [("first_token", 0, 60)])
    merged = make_waterfall(60, [("first_token", 0, 60, [("prefill", 5, 55)])])
    ev = evaluate("t", _spec(prefill="40ms", network="20ms"), [client_only, merged])
    assert _by_key(ev) == {
        "prefill": (50 * MS, 1, False),
        "network": (10 * MS, 2, True),  # what the server span leaves of first_token
    }
    alone = evaluate("t", _spec(prefill="40ms"), [client_only])
    assert _by_key(alone) == {"prefill": (None, 0, False)}
    assert "prefill not measured" in failure_text(alone)
    assert "no server spans in 1 of 1 requests" in failure_text(alone)


def test_scale_loosens_and_equal_passes() -> None:
    wfs = [make_waterfall(100)]
    assert not evaluate("t", _spec(e2e="60ms"), wfs).passed
    assert not evaluate("t", _spec(e2e="60ms"), wfs, scale=1.5).passed  # 90 ms
    assert evaluate("t", _spec(e2e="50ms"), wfs, scale=2.0).passed  # exactly 100 ms


def test_failed_requests_break_the_budget_unless_allowed() -> None:
    wfs = [make_waterfall(10), make_waterfall(5, error="connection reset by peer")]
    ev = evaluate("t", _spec(e2e="1s"), wfs)
    assert ev.broken == () and ev.errors_break and not ev.passed
    text = failure_text(ev)
    assert "1 of 2 requests failed" in text.splitlines()[0]
    assert "request #2: reset: connection reset by peer" in text
    assert evaluate("t", _spec(e2e="1s", allow_errors=True), wfs).passed


def test_failure_text_names_the_stage_and_both_numbers() -> None:
    wfs = [
        make_waterfall(80, [("connect", 0, 2), ("wait", 2, 5), ("first_token", 5, 55)], [55])
        for _ in range(3)
    ]
    text = failure_text(evaluate("t", _spec(ttft_p95="30ms", e2e="1s"), wfs, scale=1.2))
    lines = text.splitlines()
    assert lines[0] == "latency budget broken: ttft_p95 55.00 ms > 36.00 ms"
    assert "  ttft_p95: measured 55.00 ms > budget 36.00 ms (30.00 ms × 1.2) (n=3; marker)" in lines
    assert "  e2e: measured 80.00 ms <= budget 1.200 s (1.000 s × 1.2) (n=3; marker)" in lines
    assert "worst request for ttft_p95: #1 of 3, largest stage first_token 50.00 ms" in lines
    header = next(line for line in lines if line.startswith("ttft (3 requests)"))
    assert header.split()[3:] == ["min", "p50", "p90", "p95", "p99", "max", "mean"]


def test_worker_files_get_the_worker_id() -> None:
    assert worker_path(Path("out/r.jsonl"), "gw3") == Path("out/r.gw3.jsonl")
    assert worker_path(Path("report"), "gw0") == Path("report.gw0")


# --- whole pytest runs ----------------------------------------------------------------------------


def _plugin_args() -> list[str]:
    """``-p`` the plugin unless the installed package already registers it (``pytest11``):
    ``-p MODULE`` beside the entry point would register the module twice."""
    registered = any(ep.value == PLUGIN for ep in importlib.metadata.entry_points(group="pytest11"))
    return [] if registered else ["-p", PLUGIN]


INI = """
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
filterwarnings =
    error
    # in-process runs: this process imported the plugin before the inner run could rewrite it
    ignore:Module already imported so cannot be rewritten:pytest.PytestAssertRewriteWarning
addopts = --strict-markers
"""


@pytest.fixture
def tester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester dir with our ini and the waterfall builder importable as ``wfkit``."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # when this suite runs under xdist
    pytester.makeini(INI)
    source = inspect.getsource(make_waterfall)
    imports = "from collections.abc import Sequence\nfrom typing import Any\n"
    imports += "from latency_analyzer import Span, Waterfall\n\n"
    pytester.makepyfile(wfkit=imports + source)
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(*_plugin_args(), *args)


def _read_report(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    summary = json.loads(Path(f"{path}.summary.json").read_text())
    return lines, summary


ACCEPTANCE = """
import pytest

URL = "{url}/v1/chat/completions"
BODY = {{"model": "m", "stream": True, "messages": [{{"role": "user", "content": "hi"}}]}}

@pytest.mark.latency_budget(ttft_p95="30ms")
def test_tight(latency):
    for _ in range(3):
        latency.probe(URL, json=BODY)

@pytest.mark.latency_budget(ttft_p95="200ms")
async def test_loose(latency):
    async with latency.client("{url}") as client:
        for _ in range(3):
            await client.request("/v1/chat/completions", json=BODY)
"""


def test_acceptance_prefill_against_ttft_budgets(
    tester: pytest.Pytester, llm: SubprocessLLMServer
) -> None:
    tester.makepyfile(test_pp_budgets=ACCEPTANCE.format(url=llm.url))
    before = len(llm.records)
    result = run(tester, "--latency-report=r.jsonl")
    served = llm.records[before : before + 3]  # test_tight's requests, as the server did them
    result.assert_outcomes(passed=1, failed=1)
    lines, summary = _read_report(tester.path / "r.jsonl")
    by_test = {r["test"].split("::")[1]: r for r in summary["results"]}
    tight, loose = by_test["test_tight"]["budgets"][0], by_test["test_loose"]["budgets"][0]
    assert (tight["passed"], loose["passed"]) == (False, True)

    # the numbers printed are the p95 of what was recorded, and the injected prefill is in them
    wfs = [Waterfall.from_dict(line) for line in lines if line["test"].endswith("test_tight")]
    ttfts = [wf.ttft for wf in wfs if wf.ttft is not None]
    assert len(ttfts) == 3 and tight["n"] == 3
    assert tight["measured_s"] == pytest.approx(percentile(ttfts, 95), rel=1e-12)
    assert tight["measured_s"] >= PREFILL  # no token before the server sent it
    # The prefill lands in first_token. Truth: the server's log (its own process), which wrote
    # the first token no sooner than the prefill after it received the request. The stage
    # runs from the headers' arrival to the first token's, kernel stamps of the reads that
    # brought them: a client woken late (a busy host wakes an ordinary process milliseconds
    # after its data came) reads the tokens written 1 ms apart in one read, stamped with its
    # last segment, so the first token's stamp lies between its own write and the write of
    # the next token that came in a later read (or the response's end).
    loopback = tolerance(0.0)  # a write to its kernel stamp on loopback, with room
    for wf, rec in zip(wfs, served, strict=True):
        assert rec.chunk_ns[0] - rec.received_ns >= PREFILL * 1e9
        stage = wf.stages["first_token"]
        assert rec.headers_ns <= stage.start_ns <= rec.chunk_ns[0] + loopback * 1e9
        shared = sum(t == wf.chunk_times_ns[0] for t in wf.chunk_times_ns)
        later = rec.chunk_ns[shared] if shared < len(rec.chunk_ns) else rec.end_ns
        assert rec.chunk_ns[0] <= stage.end_ns <= later + loopback * 1e9

    out = result.stdout.str()
    measured = format_ns(tight["measured_s"] * 1e9)
    assert f"ttft_p95: measured {measured} > budget 30.00 ms (n=3; marker)" in out
    # The worst request is the one with the largest TTFT, and the stage named is the largest of
    # its recorded self times that can delay the first token (where a busy host put the time:
    # the prefill's first_token, or the client's own `other`).
    worst = max(range(len(wfs)), key=lambda i: ttfts[i])
    attribution = wfs[worst].attribution_ns()
    before_token = {k: v for k, v in attribution.items() if k not in ("decode", "tail")}
    head = re.search(
        rf"worst request for ttft_p95: #{worst + 1} of 3, largest stage (\w+) (.+)", out
    )
    assert head is not None, out
    named = head.group(1)
    assert before_token[named] == max(before_token.values()), (named, before_token)
    assert head.group(2) == format_ns(before_token[named])
    assert "FAILED test_pp_budgets.py::test_tight - latency budget broken: ttft_p95 " in out
    result.stdout.re_match_lines(
        [
            r"=+ latency budgets =+",
            r"test\s+budget\s+measured\s+limit\s+n\s+result",
            rf"test_pp_budgets.py::test_tight\s+ttft_p95\s+{measured}\s+30.00 ms\s+3\s+FAIL",
            r"test_pp_budgets.py::test_loose\s+ttft_p95\s+\S+ ms\s+200.00 ms\s+3\s+PASS",
        ]
    )


RECORDING = """
import pytest
import latency_analyzer as la
from wfkit import make_waterfall

URL = "{url}/v1/chat/completions"
BODY = {{"model": "m", "stream": True, "messages": []}}

@pytest.mark.latency_budget(e2e="5s")
async def test_every_way(latency):
    latency.record(make_waterfall(7))
    await latency.aprobe(URL, json=BODY)
    async with latency.client() as client:
        await client.request(URL, json=BODY)
    latency.record(la.probe(URL, json=BODY))
    assert len(latency.waterfalls) == 4
    assert latency.budgets == {{"e2e": 5.0}}

def test_sync_probe_in_an_unmarked_test(latency):
    latency.probe(URL, json=BODY)

def test_record_takes_only_waterfalls(latency):
    with pytest.raises(la.UsageError, match="takes a Waterfall"):
        latency.record({{"e2e": 1}})
"""


def test_every_recording_path_reaches_the_report(
    tester: pytest.Pytester, llm: SubprocessLLMServer
) -> None:
    tester.makepyfile(test_pp_rec=RECORDING.format(url=llm.url))
    result = run(tester, "--latency-report=out/r.jsonl")
    result.assert_outcomes(passed=3)
    lines, summary = _read_report(tester.path / "out" / "r.jsonl")
    assert [(line["test"].split("::")[1], line["index"]) for line in lines] == [
        ("test_every_way", 0),
        ("test_every_way", 1),
        ("test_every_way", 2),
        ("test_every_way", 3),
        ("test_sync_probe_in_an_unmarked_test", 0),
    ]
    for line in lines:  # the canonical form, exact round trip, plus "test" and "index"
        wf = Waterfall.from_dict(line)
        assert {**wf.to_dict(), "test": line["test"], "index": line["index"]} == line
    assert [wf["root"]["end_ns"] for wf in lines[:1]] == [7 * MS]
    assert summary["waterfalls"] == 5
    assert [r["test"].split("::")[1] for r in summary["results"]] == ["test_every_way"]


@pytest.mark.parametrize(
    ("marker", "expected"),
    [
        ('ttfb_p95="30ms"', "unknown budget key 'ttfb_p95' (did you mean 'ttft_p95'?)"),
        ('ttft_p95="30 mins"', "budget ttft_p95='30 mins': not a duration: '30 mins'"),
        ('"30ms"', "latency_budget takes keyword arguments only"),
        ('e2e=1, allow_errors="no"', "allow_errors must be True or False"),
    ],
)
def test_bad_markers_fail_collection(tester: pytest.Pytester, marker: str, expected: str) -> None:
    tester.makepyfile(
        test_pp_bad=f"""
        import pytest

        @pytest.mark.latency_budget({marker})
        def test_one(latency):
            pass

        def test_two():
            pass
        """
    )
    result = run(tester)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.assert_outcomes(errors=1)
    out = result.stdout.str()
    assert "ERROR collecting test_pp_bad.py" in out
    assert f"test_pp_bad.py::test_one: @pytest.mark.latency_budget: {expected}" in out
    if "unknown" in expected:
        assert "ttft, tpot, itl, e2e" in out and "_p999 = 99.9th" in out


def test_a_budget_without_recorded_waterfalls_fails(tester: pytest.Pytester) -> None:
    tester.makepyfile(
        test_pp_empty="""
        import pytest

        @pytest.mark.latency_budget(ttft_p95="30ms")
        def test_no_fixture():
            pass

        @pytest.mark.latency_budget(e2e=1)
        def test_fixture_unused(latency):
            pass

        def test_fixture_without_budget(latency):
            pass
        """
    )
    result = run(tester)
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "latency_budget: test_pp_empty.py::test_no_fixture recorded no waterfalls, so its "
            "budgets cannot be checked.",
            "Send the requests through the `latency` fixture: latency.probe(...)*",
            "Budgets: ttft_p95=30.00 ms",
        ]
    )
    assert "Budgets: e2e=1.000 s" in result.stdout.str()


BUDGETED = """
import pytest
from wfkit import make_waterfall

@pytest.mark.latency_budget(e2e="60ms")
def test_100ms(latency):
    latency.record(make_waterfall(100))

def test_unmarked(latency):
    latency.record(make_waterfall(100, [("tls", 0, 30)]))
"""


@pytest.mark.parametrize(
    ("args", "passed", "failed"),
    [
        ((), 0, 2),  # e2e 100 ms > 60 ms (marker); tls 30 ms > 20 ms (ini)
        (("--latency-budget-scale=1.5",), 1, 1),  # e2e 100 > 90 fails; tls 30 <= 30 passes
        (("--latency-budget-scale", "2"), 2, 0),  # 100 <= 120, 30 <= 40
        (("--latency-no-fail",), 2, 0),  # checked and reported, not enforced
    ],
)
def test_scale_and_no_fail(
    tester: pytest.Pytester, args: tuple[str, ...], passed: int, failed: int
) -> None:
    tester.makepyfile(test_pp_budgeted=BUDGETED)
    tester.makeini(INI + "latency_budgets = tls=20ms e2e=500ms\n")
    result = run(tester, *args)
    result.assert_outcomes(passed=passed, failed=failed)
    verdicts = re.findall(
        r"^test_pp_budgeted.py::\S+\s+(?:e2e|tls)\s.*\s(PASS|FAIL)$", result.stdout.str(), re.M
    )
    assert len(verdicts) == 4
    if "--latency-no-fail" in args:
        assert verdicts.count("FAIL") == 2  # still reported
        assert "latency budget (not enforced)" not in result.stdout.str()  # passed: no report


def test_ini_defaults_apply_and_the_marker_overrides(tester: pytest.Pytester) -> None:
    tester.makepyfile(test_pp_budgeted=BUDGETED)
    tester.makepyprojecttoml(
        """
        [tool.pytest.ini_options]
        asyncio_default_fixture_loop_scope = "function"
        filterwarnings = ["error", "ignore::pytest.PytestAssertRewriteWarning"]
        latency_budgets = ["tls=20ms", "e2e=500ms"]
        """
    )
    (tester.path / "tox.ini").unlink()  # where makeini wrote the [pytest] section
    result = run(tester)
    result.assert_outcomes(passed=0, failed=2)
    out = result.stdout.str()
    assert "e2e: measured 100.00 ms > budget 60.00 ms (n=1; marker)" in out
    assert "tls: measured 30.00 ms > budget 20.00 ms (n=1; ini)" in out
    assert "e2e: measured 100.00 ms <= budget 500.00 ms (n=1; ini)" in out


@pytest.mark.parametrize(
    ("ini", "expected"),
    [
        ("tls=fast", "budget tls='fast': not a duration: 'fast'"),
        ("ttfb=1", "unknown budget key 'ttfb'"),
    ],
)
def test_bad_ini_budgets_are_usage_errors(tester: pytest.Pytester, ini: str, expected: str) -> None:
    tester.makeini(INI + f"latency_budgets = {ini}\n")
    tester.makepyfile("def test_x(): pass")
    result = run(tester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"latency_budgets (ini): {expected}" in result.stderr.str()


@pytest.mark.parametrize("scale", ["0", "-1", "abc", "inf"])
def test_bad_scale_is_a_usage_error(tester: pytest.Pytester, scale: str) -> None:
    result = run(tester, f"--latency-budget-scale={scale}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--latency-budget-scale" in result.stderr.str()


def test_errors_fail_unless_allowed_and_failing_tests_are_not_checked(
    tester: pytest.Pytester,
) -> None:
    tester.makepyfile(
        test_pp_errors="""
        import pytest
        from wfkit import make_waterfall

        @pytest.mark.latency_budget(e2e="1s")
        def test_error(latency):
            latency.record(make_waterfall(5, error="connection reset by peer"))

        @pytest.mark.latency_budget(e2e="1s", allow_errors=True)
        def test_error_allowed(latency):
            latency.record(make_waterfall(5, error="connection reset by peer"))

        @pytest.mark.latency_budget(e2e="1ms")
        def test_assertion_first(latency):
            latency.record(make_waterfall(100))
            assert False, "the test's own failure"

        @pytest.mark.latency_budget(e2e="1ms")
        @pytest.mark.xfail(reason="known slow")
        def test_xfail(latency):
            latency.record(make_waterfall(100))
            assert False
        """
    )
    result = run(tester)
    result.assert_outcomes(passed=1, failed=2, xfailed=1)
    out = result.stdout.str()
    assert "latency budget broken: 1 of 1 requests failed" in out
    assert "request #1: reset: connection reset by peer" in out
    assert "the test's own failure" in out
    assert "e2e 100.00 ms" not in out  # a failing test is not checked
    result.stdout.re_match_lines([r"test_pp_errors.py::test_error_allowed\s+\(errors\)\s+1 failed"])


def test_class_and_module_markers_merge(tester: pytest.Pytester) -> None:
    tester.makepyfile(
        test_pp_merge="""
        import pytest
        from wfkit import make_waterfall

        pytestmark = pytest.mark.latency_budget(e2e="50ms", tls="1ms")

        @pytest.mark.latency_budget(e2e="200ms")
        class TestMerged:
            def test_budgets(self, latency):
                assert latency.budgets == {"e2e": 0.2, "tls": 0.001}
                latency.record(make_waterfall(100))

            @pytest.mark.parametrize(
                "ms", [1, pytest.param(300, marks=pytest.mark.latency_budget(e2e="1s"))]
            )
            def test_param(self, latency, ms):
                latency.record(make_waterfall(ms))
        """
    )
    run(tester).assert_outcomes(passed=3)


def test_markers_added_after_collection_are_read_by_the_fixture(tester: pytest.Pytester) -> None:
    tester.makeconftest(
        """
        import pytest

        def pytest_collection_modifyitems(items):
            for item in items:
                budget = {"e2e": "1ms"} if "good" in item.name else {"e2e": "1 min"}
                item.add_marker(pytest.mark.latency_budget(**budget))
        """
    )
    tester.makepyfile(
        test_pp_late="""
        from wfkit import make_waterfall

        def test_good(latency):
            latency.record(make_waterfall(100))

        def test_bad(latency):
            pass
        """
    )
    result = run(tester)
    result.assert_outcomes(failed=1, errors=1)
    out = result.stdout.str()
    assert "latency budget broken: e2e 100.00 ms > 1.00 ms" in out
    assert "budget e2e='1 min': not a duration" in out


def test_help_shows_the_option_group(tester: pytest.Pytester) -> None:
    result = run(tester, "--help")
    result.stdout.fnmatch_lines(
        [
            "latency budgets (latency_analyzer):",
            "  --latency-budget-scale=FACTOR",
            "*Multiply every latency budget by FACTOR*",
            "*Default: 1.0",
            "  --latency-report=PATH",
            "*Default: None",
            "  --latency-no-fail*",
            "*Default: False",
        ]
    )
    result.stdout.fnmatch_lines(["  latency_budgets (linelist):*"])
    markers = run(tester, "--markers")
    markers.stdout.fnmatch_lines(["@pytest.mark.latency_budget(**budgets, allow_errors=False):*"])


SUMMARY_RUN = """
import pytest
from wfkit import make_waterfall

@pytest.mark.latency_budget(ttft_p50="20ms", tls="15ms")
def test_two(latency):
    latency.record(make_waterfall(50, [("tls", 0, 10), ("first_token", 10, 40)], [40, 50]))
    latency.record(make_waterfall(30, [("first_token", 0, 10)], [10, 20]))
"""

GOLDEN_SUMMARY = {
    "schema": 1,
    "generator": "latency_analyzer.pytest_plugin",
    "budget_scale": 1.5,
    "enforced": True,
    "waterfalls": 2,
    "tests_checked": 1,
    "tests_failed": 0,
    "results": [
        {
            "test": "test_pp_summary.py::test_two",
            "passed": True,
            "requests": 2,
            "failed_requests": 0,
            "allow_errors": False,
            "budgets": [
                {
                    "key": "ttft_p50",
                    "name": "ttft",
                    "stat": "p50",
                    "source": "marker",
                    "budget_s": 0.02,
                    "limit_s": 0.03,
                    "measured_s": 0.01,  # nearest rank: the first of 10 and 40 ms
                    "n": 2,
                    "unmeasured": 0,
                    "worst_request": 0,
                    "passed": True,
                },
                {
                    "key": "tls",
                    "name": "tls",
                    "stat": "max",
                    "source": "marker",
                    "budget_s": 0.015,
                    "limit_s": 0.0225,
                    "measured_s": 0.01,
                    "n": 2,
                    "unmeasured": 0,
                    "worst_request": 0,
                    "passed": True,
                },
            ],
        }
    ],
}


def test_summary_file_is_pinned(tester: pytest.Pytester) -> None:
    from latency_analyzer import __version__

    tester.makepyfile(test_pp_summary=SUMMARY_RUN)
    result = run(tester, "--latency-report=r.jsonl", "--latency-budget-scale=1.5")
    result.assert_outcomes(passed=1)
    _, summary = _read_report(tester.path / "r.jsonl")
    created = datetime.datetime.fromisoformat(summary.pop("created_utc").replace("Z", "+00:00"))
    assert created.utcoffset() == datetime.timedelta(0)
    assert abs(datetime.datetime.now(datetime.timezone.utc) - created).total_seconds() < 600
    assert summary.pop("version") == __version__
    assert summary.pop("report") == str(tester.path / "r.jsonl")
    assert summary == GOLDEN_SUMMARY


def test_worker_env_gives_per_worker_files(
    tester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    tester.makepyfile(test_pp_summary=SUMMARY_RUN)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw7")
    run(tester, "--latency-report=r.jsonl", "--latency-budget-scale=1.5").assert_outcomes(passed=1)
    assert sorted(p.name for p in tester.path.glob("r.*")) == [
        "r.gw7.jsonl",
        "r.gw7.jsonl.summary.json",
    ]
    lines, summary = _read_report(tester.path / "r.gw7.jsonl")
    assert len(lines) == 2 and summary["tests_checked"] == 1


def test_xdist_workers_are_merged(tester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    tester.makepyfile(
        test_pp_many="""
        import pytest
        from wfkit import make_waterfall

        @pytest.mark.parametrize("i", range(6))
        @pytest.mark.latency_budget(e2e="50ms")
        def test_one(latency, i):
            latency.record(make_waterfall(10 * i))
            latency.record(make_waterfall(10 * i + 1))
        """
    )
    result = tester.runpytest_subprocess(*_plugin_args(), "-n", "2", "--latency-report=r.jsonl")
    result.assert_outcomes(passed=5, failed=1)
    assert sorted(p.name for p in tester.path.glob("r.*")) == ["r.jsonl", "r.jsonl.summary.json"]
    lines, summary = _read_report(tester.path / "r.jsonl")
    assert sorted(line["root"]["end_ns"] // MS for line in lines) == sorted(
        [10 * i for i in range(6)] + [10 * i + 1 for i in range(6)]
    )
    assert summary["waterfalls"] == 12 and summary["tests_checked"] == 6
    assert summary["tests_failed"] == 1
    result.stdout.re_match_lines([r"test_pp_many.py::test_one\[5\]\s+e2e\s+51.00 ms\s+50.00 ms"])


def test_run_needs_the_load_runner(tester: pytest.Pytester) -> None:
    tester.makepyfile(
        test_pp_run="""
        import sys
        import pytest
        import latency_analyzer as la

        def test_without_runner(latency, monkeypatch):
            monkeypatch.setitem(sys.modules, "latency_analyzer.load", None)  # not installed
            with pytest.raises(la.UsageError, match=r"latency.run\\(\\) needs the load runner"):
                latency.run(None)

        async def test_without_async_runner(latency, monkeypatch):
            monkeypatch.setitem(sys.modules, "latency_analyzer.load", None)
            with pytest.raises(la.UsageError, match=r"latency.arun\\(\\) needs the load runner"):
                await latency.arun(None)
        """
    )
    run(tester).assert_outcomes(passed=2)


LOAD_RUN = """
import pytest
from latency_analyzer.load import Scenario

SCENARIO = Scenario("{url}/v1/chat/completions", concurrency=2, requests=6, warmup_requests=2)

@pytest.mark.latency_budget(ttft_p95="200ms")
def test_sync(latency, tmp_path):
    result = latency.run(SCENARIO, path=tmp_path / "kept.jsonl", rtt_samples=0)
    assert len(result.set) == 6 and (tmp_path / "kept.jsonl").exists()
    assert len(latency.waterfalls) == 4  # warm-up requests are outside budgets

@pytest.mark.latency_budget(ttft_min="30ms")
async def test_async(latency):
    await latency.arun(SCENARIO, rtt_samples=0)
    assert len(latency.waterfalls) == 4
"""


def test_run_records_a_load_run(tester: pytest.Pytester, llm: SubprocessLLMServer) -> None:
    tester.makepyfile(test_pp_load=LOAD_RUN.format(url=llm.url))
    result = run(tester, "--latency-report=r.jsonl")
    result.assert_outcomes(passed=1, failed=1)  # prefill 50 ms: every ttft > 30 ms
    lines, summary = _read_report(tester.path / "r.jsonl")
    assert len(lines) == 8
    by_test = {r["test"].split("::")[1]: r["budgets"][0] for r in summary["results"]}
    assert by_test["test_sync"]["n"] == 4 and by_test["test_sync"]["passed"]
    assert by_test["test_async"]["measured_s"] >= PREFILL and not by_test["test_async"]["passed"]


def test_entry_point_enables_the_plugin(
    tester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``pip install`` does: a pytest11 entry point, no ``-p``; ``-p no:`` turns it off."""
    dist = tester.mkdir("site") / "latency_analyzer_plugin_probe-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: la-probe\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(f"[pytest11]\nlatency_analyzer = {PLUGIN}\n")
    tester.makepyfile(test_pp_ep="def test_fixture_is_there(latency):\n    pass\n")
    site = str(tester.path / "site")
    monkeypatch.setenv("PYTHONPATH", site)  # the subprocess sees the entry point
    tester.runpytest_subprocess().assert_outcomes(passed=1)
    disabled = tester.runpytest_subprocess("-p", "no:latency_analyzer")
    disabled.assert_outcomes(errors=1)
    assert "fixture 'latency' not found" in disabled.stdout.str()


def test_untouched_tests_see_nothing(tester: pytest.Pytester) -> None:
    tester.makepyfile("def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    result = run(tester)
    result.assert_outcomes(passed=2)
    assert "latency budget" not in result.stdout.str()
    assert "latency report" not in result.stdout.str()
