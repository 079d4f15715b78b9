"""``latency-analyzer sweep`` and ``search``: the usage errors (exit 2, the option named), and a
sweep against the test bed: every point a run in one file, a line per point, the plot."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from latency_analyzer.analysis import WaterfallSet
from latency_analyzer.cli import main
from latency_analyzer.errors import UsageError
from latency_analyzer.load import Scenario, sweep_points
from latency_analyzer.load import _search as search_module
from latency_analyzer.load._slo import parse_slos, slo_report
from latency_analyzer.testing import LLMServer

URL = "http://127.0.0.1:9/v1/chat/completions"  # never reached: each error comes first


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (
            ["sweep", "--url", URL, "--requests", "1", "--rate", "1,2", "--concurrency", "1,2"],
            "--rate and --concurrency",
        ),
        (["sweep", "--url", URL, "--requests", "1"], "--rate R1,R2"),
        (
            ["sweep", "--url", URL, "--requests", "1", "--rate", "1,2", "--mode", "closed"],
            "--mode closed",
        ),
        (
            ["sweep", "--url", URL, "--requests", "1", "--concurrency", "1", "--mode", "open"],
            "--mode open",
        ),
        (
            ["sweep", "--url", URL, "--requests", "1", "--rate", "1", "--trace", "t.jsonl"],
            "--trace",
        ),
        (["search", "--url", URL, "--requests", "1", "--rate-max", "10"], "--slo"),
        (["search", "--url", URL, "--requests", "1", "--slo", "e2e_p95=1s"], "--rate-max"),
        (
            [
                "search",
                "--url",
                URL,
                "--requests",
                "1",
                "--slo",
                "e2e_p95=1s",
                "--rate-max",
                "9",
                "--mode",
                "closed",
            ],
            "--mode closed",
        ),
        (
            [
                "search",
                "--url",
                URL,
                "--requests",
                "1",
                "--slo",
                "e2e_p95=1s",
                "--rate-max",
                "9",
                "--concurrency",
                "4",
            ],
            "--concurrency",
        ),
        (
            [
                "search",
                "--url",
                URL,
                "--requests",
                "1",
                "--slo",
                "e2e_p95=1s",
                "--rate-max",
                "9",
                "--rate",
                "4",
            ],
            "--rate",
        ),
        (
            [
                "search",
                "--url",
                URL,
                "--requests",
                "1",
                "--slo",
                "e2e_p95=1s",
                "--rate-max",
                "9",
                "--rate-min",
                "12",
            ],
            "--rate-min",
        ),
        (["sweep", "--url", URL, "--requests", "1", "--rate", "1", "--workers", "2"], "--workers"),
        (
            [
                "search",
                "--url",
                URL,
                "--requests",
                "1",
                "--slo",
                "e2e_p95=1s",
                "--rate-max",
                "9",
                "--scrape",
                "http://127.0.0.1:9/metrics",
            ],
            "--scrape",
        ),
        (
            [
                *("search", "--url", URL, "--requests", "1", "--slo", "e2e_p95=1s"),
                *("--rate-max", "inf"),
            ],
            "--rate-max must be a finite number",
        ),
    ],
    ids=[
        "sweep-rate-and-concurrency",
        "sweep-nothing",
        "sweep-rate-closed",
        "sweep-concurrency-open",
        "sweep-trace",
        "search-no-slo",
        "search-no-rate-max",
        "search-closed-loop",
        "search-concurrency",
        "search-rate",
        "search-rate-min-above-max",
        "sweep-workers",
        "search-scrape",
        "search-rate-max-infinite",
    ],
)
def test_usage_errors_exit_2_naming_the_option(
    argv: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*argv, "--out", str(tmp_path / "run.jsonl")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("latency-analyzer: ") and named in err, err
    assert not (tmp_path / "run.jsonl").exists()  # nothing ran


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--rate", "5,x", "--rate"),
        ("--concurrency", "0,2", "--concurrency"),
        ("--rate", "5,inf", "--rate"),  # an unpaced open loop
        ("--rate", "nan", "--rate"),
    ],
)
def test_bad_levels_exit_2_naming_the_option(
    flag: str, value: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["sweep", "--url", URL, "--requests", "1", flag, value])
    assert exc.value.code == 2 and named in capsys.readouterr().err


def test_search_resolution_must_be_a_share(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "search",
                "--url",
                URL,
                "--slo",
                "e2e_p95=1s",
                "--rate-max",
                "9",
                "--resolution",
                "150%",
            ]
        )
    assert exc.value.code == 2 and "--resolution" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ("speed = [1, 2]", "'speed'"),
        ("rate = [5, -1]", "rate"),
        ("rate = [1]\nconcurrency = [2]", "rate and concurrency"),
        ("rate = [5, inf]", "rate: expected a list of finite numbers > 0"),
        ("concurrency = [1.5]", "concurrency: expected a list of whole numbers > 0"),
    ],
    ids=["unknown-key", "negative", "both", "infinite", "fraction"],
)
def test_a_bad_sweep_table_exits_2_naming_file_and_key(
    table: str, named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.toml"
    path.write_text(f'url = "{URL}"\nrequests = 1\n[sweep]\n{table}\n')
    assert main(["sweep", str(path), "--out", str(tmp_path / "run.jsonl")]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and named in err, err


def test_a_sweep_writes_every_point_as_a_run_in_one_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, plot = tmp_path / "sweep.jsonl", tmp_path / "curve.png"
    levels = [40.0, 80.0, 160.0]
    with LLMServer(prefill=0.002, tokens=3, decode=0.001).run_in_subprocess() as s:
        argv = [
            "sweep",
            "--url",
            s.url + "/v1/chat/completions",
            "--rate",
            "40,80,160",
            "--requests",
            "24",
            "--warmup-requests",
            "4",
            "--slo",
            "e2e_p99=2s,ttft_p95=1s",
            "--out",
            str(out),
            "--plot",
            str(plot),
            "--json",
        ]
        code = main(argv)
        served = len(s.records)
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and served == 3 * 24
    ws = WaterfallSet.load(out)
    assert len(ws.runs) == 3  # a header line per point: each point is a complete run
    assert [r["scenario"]["rate"] for r in ws.runs] == levels
    steps = ws.group_by("step")
    assert sorted(steps) == [0, 1, 2] and all(len(g) == 24 for g in steps.values())
    slos = parse_slos("e2e_p99=2s,ttft_p95=1s")
    for point in result["points"]:
        group = steps[point["step"]]
        assert point["rate"] == levels[point["step"]]
        assert point["requests"] == 20  # the warm-up rows are kept, out of the statistics
        by_hand = slo_report(group, slos)  # the point's goodput is its own run's
        assert point["goodput_rps"] == pytest.approx(by_hand.goodput_rps)
        e2e = sorted(group.values("e2e"))
        assert point["latency_s"]["e2e_p50"] == pytest.approx(e2e[9], rel=1e-9)  # rank 10/20
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and result["plot"] == str(plot)


#: The sweeping client in its own process at real-time priority (as the test bed's servers are,
#: where the OS allows it): its users send again as soon as they are answered, however busy the
#: host, so the server holds as many requests at once as the level has users.
_CLIENT = """
import sys
from latency_analyzer.testing._priority import realtime
realtime()
from latency_analyzer.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def _in_flight(spans: list[tuple[int, int]]) -> int:
    """The most of these [arrival, answered) intervals that were open at one instant."""
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    depth = most = 0
    for _, step in edges:  # an end sorts before an arrival at the same instant
        depth += step
        most = max(most, depth)
    return most


def test_a_concurrency_sweep_is_a_closed_loop_per_level(tmp_path: Path) -> None:
    out = tmp_path / "users.jsonl"
    levels = [1, 2, 4]
    with LLMServer(prefill=0.003, tokens=1, slots=1).run_in_subprocess() as s:
        url = s.url + "/v1/chat/completions"
        argv = ["sweep", "--url", url, "--concurrency", "1,2,4", "--requests", "12"]
        argv += ["--out", str(out), "--plot", str(tmp_path / "u.png"), "--json"]
        proc = subprocess.run(
            [sys.executable, "-c", _CLIENT, *argv], capture_output=True, text=True, timeout=60
        )
        served = s.records
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert len(served) == 36
    assert [p["concurrency"] for p in result["points"]] == levels
    ws = WaterfallSet.load(out)
    assert [r["scenario"]["mode"] for r in ws.runs] == ["closed"] * 3
    assert [r["scenario"]["concurrency"] for r in ws.runs] == levels
    steps = ws.group_by("step")
    assert sorted(steps) == [0, 1, 2] and all(len(g) == 12 for g in steps.values())
    # the server's log, point by point (they run one after the other): a request is at the
    # server from its arrival (before any wait for the one slot) until its answer's last write
    arrived = sorted(served, key=lambda r: r.received_ns - r.slot_wait_ns)
    for step, level in enumerate(levels):
        point = arrived[12 * step : 12 * (step + 1)]
        spans = [
            (r.received_ns - r.slot_wait_ns, max(r.headers_ns or 0, *r.chunk_ns)) for r in point
        ]
        # a closed loop: each user sends again only once answered, so never more than the
        # level's users at once, and they all are there at once
        assert _in_flight(spans) == level
        # one slot: each service starts once the one before it has written its answer, so a
        # request that arrived behind others waited at the server (slot_wait) for them
        services = sorted((r.received_ns, end) for r, (_, end) in zip(point, spans, strict=True))
        assert all(b[0] >= a[1] for a, b in itertools.pairwise(services))
        # the client's e2e holds the server's whole time, the queue included: sorted, each
        # client time is at least the server's time of the same rank
        at_server = sorted(end - arrival for arrival, end in spans)
        e2e = sorted(steps[step].values("e2e", include_warmup=True) * 1e9)
        assert all(c >= t for c, t in zip(e2e, at_server, strict=True))
    # four users at once on one slot: three waited, the last of them behind at least two
    # whole services (each longer than the prefill); the queue is what the e2e grew by
    assert max(r.slot_wait_ns for r in arrived[24:]) >= 2 * 0.003e9


async def test_an_interrupted_sweep_keeps_its_finished_points(tmp_path: Path) -> None:
    out = tmp_path / "sweep.jsonl"
    finished = asyncio.Event()
    async with LLMServer(prefill=0.002, tokens=1) as s:
        sc = Scenario(s.url + "/v1/chat/completions", mode="open", rate=50, requests=6)
        # 6 requests at 50 req/s, then at 0.5 req/s (10 s): the second is cut short
        task = asyncio.create_task(
            sweep_points(sc, rate=[50, 0.5], path=out, on_point=lambda p: finished.set())
        )
        await finished.wait()  # the first point is in the file
        await asyncio.sleep(0.3)  # the second is running
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    ws = WaterfallSet.load(out)
    assert len(ws.runs) == 1 and ws.meta["result"]["interrupted"] is False
    assert set(ws.column("step").tolist()) == {0}
    part = WaterfallSet.load(out.with_name(out.name + ".part"))  # the point cut short
    assert part.meta["result"]["interrupted"] is True and set(part.column("step").tolist()) == {1}


@pytest.mark.parametrize("level", [float("inf"), float("nan"), 0.0])
def test_sweep_points_refuses_a_rate_it_cannot_pace(level: float, tmp_path: Path) -> None:
    """Before any point runs: an infinite rate would send as fast as the loop can."""
    sc = Scenario(url=URL, mode="open", rate=1.0, requests=1)
    with pytest.raises(UsageError, match="finite number > 0"):
        asyncio.run(sweep_points(sc, rate=[1.0, level], path=tmp_path / "run.jsonl"))
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_with_failed_requests_exits_1_and_keeps_every_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing listens on port 9: every request fails (connection refused), each point is
    still a run in the file, and the exit status says so."""
    out = tmp_path / "run.jsonl"
    argv = ["sweep", "--url", URL, "--requests", "2", "--rate", "50,100", "--out", str(out)]
    assert main(argv) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(";")[-2:] for line in lines[:2]] == [
        [" 2 errors", " achieved < 90% of offered"]
    ] * 2
    ws = WaterfallSet.load(out)
    assert len(ws.runs) == 2 and len(ws) == 4 and not ws.ok.any()


def _strict(text: str) -> object:
    def refuse(name: str) -> object:
        raise AssertionError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_search_json_is_json_when_no_request_succeeded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No request succeeds (nothing listens): the goodput is unknown, null, not NaN."""
    argv = [
        *("search", "--url", URL, "--requests", "1", "--slo", "e2e_p95=1s"),
        *("--rate-max", "10", "--rate-min", "5", "--json", "--out", str(tmp_path / "r.jsonl")),
    ]
    assert main(argv) == 1
    found = _strict(capsys.readouterr().out)
    assert isinstance(found, dict) and found["rate"] is None
    assert [p["slo"]["goodput_rps"] for p in found["points"]] == [None] * len(found["points"])


def _lagging_first_run(monkeypatch: pytest.MonkeyPatch, block_s: float) -> None:
    """The search's first probe runs while a callback blocks the client's loop for ``block_s``
    every 20 ms (a client too busy to read its responses); later probes run undisturbed."""
    real_run = search_module.run
    calls = itertools.count()

    async def run(*args: object, **kwargs: object) -> object:
        if next(calls):
            return await real_run(*args, **kwargs)
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle | None = None

        def block() -> None:
            nonlocal handle
            time.sleep(block_s)
            handle = loop.call_later(0.02, block)

        handle = loop.call_later(0.0, block)
        try:
            return await real_run(*args, **kwargs)
        finally:
            handle.cancel()

    monkeypatch.setattr(search_module, "run", run)


@pytest.mark.parametrize("repeat", [1, 0])
def test_a_probe_failed_while_the_client_lagged_is_run_again(
    repeat: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first probe's client blocks for 150 ms at a time, so its e2e P95 (server: 2 ms)
    breaks a 100 ms SLO: with ``--repeat-lagged 1`` the probe runs again unblocked and passes
    at ``--rate-max``; with 0 its failure stands and the search goes on to halve the rate.
    Either way every run is in the file, and the lagged one carries the client's note."""
    _lagging_first_run(monkeypatch, block_s=0.15)
    out = tmp_path / "search.jsonl"
    with LLMServer(prefill=0.002, tokens=1).run_in_subprocess() as server:
        argv = [
            *("search", "--url", server.url + "/v1/chat/completions", "--json"),
            *("--slo", "e2e_p95=100ms", "--rate-max", "40", "--resolution", "50%"),
            *("--requests", "20", "--warmup-requests", "0", "--out", str(out)),
            *("--repeat-lagged", str(repeat), "--body-extra", '{"stream": false}'),
        ]
        assert main(argv) == 0
    found = json.loads(capsys.readouterr().out)
    points = found["points"]
    first = points[0]
    assert first["rate"] == 40 and first["met"] is False, first
    assert "event-loop lag P99" in first["client_note"], first  # whichever cause it names
    assert found["repeated"] == repeat
    if repeat:
        assert found["rate"] == 40 and found["failing"] is None
        assert points[1]["rate"] == 40 and points[1]["met"] is True
        # unblocked: no note, or (a host whose other work, or the hypervisor, took the CPUs
        # meanwhile) the host's, with a loop lag far below the 150 ms blocks of the first run
        note = points[1].get("client_note")
        if note is not None:
            assert note.startswith("the HOST was contended"), note
            lag_ms = float(note.split("event-loop lag P99 ", 1)[1].split(" ms", 1)[0])
            assert lag_ms < 1e3 * 0.15 / 2, note
    else:
        assert found["failing"]["step"] == 0 and found["rate"] < 40  # halved, then bisected
    steps = WaterfallSet.load(out).group_by("step")
    assert sorted(steps) == [p["step"] for p in points] == list(range(len(points)))


def test_repeat_lagged_must_be_a_count(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        *("search", "--url", URL, "--requests", "1", "--slo", "e2e_p95=1s"),
        *("--rate-max", "10", "--repeat-lagged", "-1"),
    ]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and "--repeat-lagged" in capsys.readouterr().err
