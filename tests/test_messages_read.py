"""Messages a newcomer reads: each says what it means and, for an error, what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from latency_analyzer.analysis import Estimate, money_case
from latency_analyzer.errors import UsageError
from latency_analyzer.load import Scenario
from latency_analyzer.load._checks import request_headers
from latency_analyzer.load._length_report import _output_line


def test_a_payback_that_never_comes_says_never_once() -> None:
    case = money_case(
        metric="ttft_p95",
        cost_per_month=1.2e6,
        claimed=0.5,
        measured=Estimate(0.21, 0.16, 0.54, 60),
        migration_cost=2e6,
    )
    assert case.lines()[-1] == "migration (2.00 M) pays back in: claimed never; measured never"
    assert case.to_dict()["measured"]["payback_months"] == [None, None, None]


def test_the_length_note_names_its_range_apart_from_a_confidence_interval() -> None:
    figures = {
        "requests": 30,
        "requested_mean": 32.8,
        "received_n": 30,
        "received_mean": 32.0,
        "difference": {"median": -1.0, "min": -9, "max": 0},
        "fewer_than_requested": 12,
    }
    line = _output_line(figures)
    assert "received − requested median -1, range [-9, +0] over 30 requests" in line


def test_an_unset_header_variable_says_how_to_set_it_or_drop_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LA_NEWCOMER_KEY", raising=False)
    sc = Scenario("http://127.0.0.1:9/v1/chat/completions", requests=1, header_env={
        "Authorization": "Bearer ${LA_NEWCOMER_KEY}"
    })  # fmt: skip
    with pytest.raises(UsageError) as err:
        request_headers(sc)
    text = str(err.value)
    assert "LA_NEWCOMER_KEY, which is not set" in text
    assert "export LA_NEWCOMER_KEY=" in text and "header_env" in text


def test_the_report_waterfall_shows_the_time_between_its_stages() -> None:
    from latency_analyzer.report import waterfall_svg
    from latency_analyzer.timeline import Recorder

    ms = 1_000_000
    rec = Recorder("POST", "http://t/v1", start_ns=0)
    rec.add("connect", 0, 1 * ms)
    rec.add("send", 5 * ms, 6 * ms)  # 4 ms between connect and send: in no stage
    rec.response_headers(10 * ms, 200)
    wf = rec.finish(10 * ms)
    assert wf.attribution()["other"] == pytest.approx(0.004)
    svg = waterfall_svg(wf)
    assert ">other</text>" in svg and ">4.00 ms</text>" in svg
    assert svg.count("<rect") == len(wf.root.children)  # a row, not a bar


def test_one_chunk_read_with_later_bytes_is_one_chunk() -> None:
    import dataclasses

    from latency_analyzer.report.waterfall_text import render_waterfall
    from latency_analyzer.timeline import Recorder

    rec = Recorder("POST", "http://t/v1", start_ns=0)
    rec.response_headers(1_000_000, 200)
    rec.chunk(2_000_000, 5)
    rec.chunk(3_000_000, 5)
    wf = rec.finish(3_000_000)
    one = dataclasses.replace(wf, clock_source="kernel", shared_read_chunks=(0,))
    two = dataclasses.replace(wf, clock_source="kernel", shared_read_chunks=(0, 1))
    assert "· 1 chunk read with later bytes" in render_waterfall(one)
    assert "· 2 chunks read with later bytes" in render_waterfall(two)


@pytest.mark.parametrize("flag", ["--outage-at", "--outage"])
def test_an_outage_flag_outside_fault_injection_is_an_error_not_ignored(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from latency_analyzer.cli import main

    url = "http://127.0.0.1:9/v1/chat/completions"  # never reached: the flags are refused first
    assert main(["run", "--url", url, "--requests", "1", flag, "2"]) == 2
    err = capsys.readouterr().err
    assert "--outage-at / --outage apply only to the fault_injection scenario" in err
    assert "--preset fault_injection" in err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (
            ["--requests", "4", "--warmup-requests", "4"],
            "'warmup_requests' (--warmup-requests) is 4",
        ),
        (["--duration", "2", "--warmup-seconds", "5"], "'warmup_seconds' (--warmup-seconds) is 5s"),
    ],
)
def test_a_warm_up_that_takes_every_request_is_refused_before_the_run(
    flags: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from latency_analyzer.cli import main

    url = "http://127.0.0.1:9/v1/chat/completions"  # never reached: refused before the run
    assert main(["run", "--url", url, *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and "every request would be warm-up" in err


def test_a_saturated_worker_shows_the_lag_that_decided_it() -> None:
    from latency_analyzer.load.distributed._results import WorkerReport, worker_notes

    client = {  # the sampled loop lag was fine; the kernel-stamped reads were 14 ms late
        "saturated": True,
        "loop_lag": {"p99_s": 0.0056},
        "pacer_lag": {"p99_s": 0.0001},
        "read_lag": {"p99_s": 0.014},
    }
    notes = worker_notes([WorkerReport(worker=0, host="vm", client=client)])
    assert notes == [
        "worker 0 (vm) was saturated: loop lag P99 5.6 ms, pacer lag P99 0.1 ms, "
        "read lag P99 14.0 ms (limit 10 ms)"
    ]


def test_a_sweep_point_shows_the_slo_figure_its_verdict_rests_on() -> None:
    from latency_analyzer.cli.sweep import point_line
    from latency_analyzer.load._knee import LoadPoint
    from latency_analyzer.load._slo import SloReport, parse_slos

    slos = parse_slos("e2e_mean=16ms,e2e_p95=50ms")
    report = SloReport(slos, [17.25e6, 29.6e6], good=40, counted=50, span_s=1.0)
    lat = {f"{m}_p{q}": 10e6 for m in ("ttft", "e2e") for q in (50, 95, 99)}
    point = LoadPoint(2, "rate", 100.0, 50, 0, 98.0, latency_ns=lat, slo=report)
    line = point_line(point)
    assert line.endswith("; e2e_mean 17.2 ms, goodput 40 req/s, SLO NOT met")
    assert "e2e_p95 " not in line  # already in the line's P50/P95/P99 of e2e


def test_compare_names_a_file_that_is_not_a_run_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from latency_analyzer.cli import main

    day1 = Path(__file__).parent / "fixtures" / "runs" / "day1.jsonl"
    page = tmp_path / "page.html"
    page.write_text("<!doctype html><p>a report, not a run</p>\n")
    assert main(["compare", str(page), str(day1)]) == 2
    assert f"{page}: line 1 is not JSON; not a run file" in capsys.readouterr().err
    assert main(["compare", str(day1), str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl: cannot read the run file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["run"], "no target: give --url URL"),
        (["run", "--preset", "long_tail"], "no target: give --url URL"),
        (["sweep", "--rate", "1,2"], "no target: give --url URL"),
        (
            ["run", "--url", "http://127.0.0.1:9/v1/chat/completions"],
            "a run needs a bound: 'duration' (--duration SECONDS), 'requests' (--requests N)",
        ),
    ],
)
def test_a_run_without_a_target_or_a_bound_says_which_flag_to_give(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from latency_analyzer.cli import main

    assert main(argv) == 2
    assert says in capsys.readouterr().err


def test_an_slo_without_a_unit_is_refused_not_read_as_seconds() -> None:
    from latency_analyzer.load._slo import parse_slos

    with pytest.raises(UsageError, match="'800' has no unit; write 800ms or 800s"):
        parse_slos("ttft_p95=800")
    assert parse_slos("ttft_p95=800ms")[0].limit_ns == 800_000_000
