"""Inputs a user or a server controls, outside the receivers: OTLP JSON-lines fed in small
pieces, bad scenario files, a scrape target's charset, and Ctrl-C during a run."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from aiohttp import web

from latency_analyzer import UsageError, Waterfall
from latency_analyzer.analysis import WaterfallSet
from latency_analyzer.cli import main
from latency_analyzer.load import Scenario, long_tail, run
from latency_analyzer.metrics import Scraper, Target
from latency_analyzer.server import OTLPJsonLinesParser
from latency_analyzer.testing import LLMServer


def _feed_cpu(text: bytes, piece: int) -> float:
    best = float("inf")
    for _ in range(3):
        parser = OTLPJsonLinesParser()
        t = time.process_time()
        for i in range(0, len(text), piece):
            parser.feed(text[i : i + piece])
        parser.close()
        best = min(best, time.process_time() - t)
        assert parser.errors == []
    return best


def test_json_lines_fed_in_small_pieces_take_linear_time() -> None:
    """A long line fed 16 bytes at a time: 4× the line costs at most 6× the CPU time
    (min of 3 runs). Each feed used to search the whole pending line again."""

    def line(size: int) -> bytes:
        return json.dumps({"resourceSpans": [], "pad": "x" * size}).encode() + b"\n"

    t1, t4 = _feed_cpu(line(128 * 1024), 16), _feed_cpu(line(512 * 1024), 16)
    assert t4 <= 6 * max(t1, 1e-3), (t1, t4)


BAD_SCENARIOS = [
    (
        b'url = "http://127.0.0.1:9/x"\nrequests = 1\nconcurrency = "4"\n',
        "'concurrency'",
        "an integer",
    ),
    (b"requests = 1\nconcurrency = 4\n", "'url'", "required"),
    (b'preset = "long_tail"\nurl = "http://127.0.0.1:9/x"\nbogus = 1\n', "'bogus'", "unknown"),
    (b'url = "http://127.0.0.1:9/\xff\xfe"\nrequests = 1\n', "line 1", "not UTF-8"),
    (
        b'url = "http://127.0.0.1:9/x"\nrequests = 1\n[[templates]]\nweight = "x"\n',
        "'weight'",
        "a finite number",
    ),
    (b'url = "http://127.0.0.1:9/x"\nduration = nan\n', "'duration'", "a finite number"),
    (
        b'url = "http://127.0.0.1:9/x"\nrequests = 1\nthink_time = {uniform = ["a", 2]}\n',
        "'think_time'",
        "numbers",
    ),
    (
        b'url = "http://127.0.0.1:9/x"\nrequests = 1\ntemplates = 3\n',
        "'templates'",
        "a list of tables",
    ),
    (b'url = "http://127.0.0.1:9/x"\nrequests = 1\nsweep = 3\n', "'sweep'", "a table"),
    (b'preset = ["long_tail"]\nurl = "http://127.0.0.1:9/x"\n', "'preset'", "a string"),
    (b'preset = "long_tail"\nrequests = 1\n', "'url'", "required"),
    (b"url = \n", "line 1", "not valid TOML"),
]


@pytest.mark.parametrize(("text", "key", "reason"), BAD_SCENARIOS)
def test_a_bad_scenario_file_exits_2_naming_file_key_and_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: bytes, key: str, reason: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(text)
    assert main(["run", str(path), "--out", str(tmp_path / "out.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"latency-analyzer: {path}: ") and key in err and reason in err, err
    assert "Traceback" not in err and err.count("\n") == 1
    assert not (tmp_path / "out.jsonl").exists()  # nothing ran


def test_bad_flags_and_presets_from_python_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="'url' is required"):
        Scenario.from_dict({"requests": 1})
    with pytest.raises(UsageError, match="'concurrency': expected an integer, got true"):
        Scenario.from_dict({"url": "http://x/", "requests": 1, "concurrency": True})
    with pytest.raises(UsageError, match="unknown scenario key 'bogus'"):
        long_tail("http://x/", bogus=1)
    # the values are still taken as they were
    sc = Scenario.from_dict({"url": "http://x/", "requests": 1, "mode": "open", "rate": 2})
    assert sc.rate == 2
    sc = Scenario.from_dict({"url": "http://x/", "requests": 1, "think_time": 0.5})
    assert sc.think_time is not None and sc.think_time.params == (0.5,)


async def _metrics_app(charset: str) -> web.AppRunner:
    async def metrics(request: web.Request) -> web.Response:
        body = b"vllm:num_requests_waiting 3\n"
        return web.Response(body=body, headers={"Content-Type": f"text/plain; charset={charset}"})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


async def test_a_metrics_endpoint_with_an_unknown_charset_is_a_gap_not_an_aborted_run() -> None:
    bad, good = await _metrics_app("x-no-such-codec"), await _metrics_app("utf-8")
    try:
        targets = [
            Target(f"http://127.0.0.1:{r.addresses[0][1]}/metrics", name=n)
            for r, n in ((bad, "bad"), (good, "good"))
        ]
        scraper = Scraper(targets, interval=0.1, parser="thread")
        with LLMServer(tokens=1).run_in_subprocess() as s:
            sc = Scenario(s.url + "/v1/chat/completions", requests=5, concurrency=1)
            result = await run(sc, scraper=scraper, rtt_samples=0)
    finally:
        await bad.cleanup()
        await good.cleanup()
    assert result.issued == len(result.set) == 5 and int(result.set.ok.sum()) == 5
    ms = scraper.series
    reasons = {g.reason for g in ms.gaps if g.target == "bad"}
    assert reasons == {"unknown charset 'x-no-such-codec'"}
    assert int(ms.scrapes("good")["ok"].sum()) >= 2  # the first and the final scrape


def _running(base: str) -> int:
    """Requests the test bed is serving right now (its own gauge)."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=2) as resp:
        text = resp.read().decode()
    line = next(x for x in text.splitlines() if x.startswith("testbed_requests_running"))
    return int(float(line.split()[-1]))


def _rows(path: Path) -> list[Waterfall]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return [Waterfall.from_dict(x["wf"]) for x in lines if "wf" in x]


def test_ctrl_c_of_run_records_the_requests_in_flight_and_exits_130(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    # each request streams for 20 s: all 3 users are mid-stream when SIGINT comes
    with LLMServer(tokens=400, decode=0.05).run_in_subprocess() as s:
        argv = [sys.executable, "-m", "latency_analyzer.cli", "run", "--url"]
        argv += [s.url + "/v1/chat/completions", "--concurrency", "3", "--requests", "50"]
        proc = subprocess.Popen(
            [*argv, "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            deadline = time.monotonic() + 20
            while _running(s.url) < 3:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
            time.sleep(0.2)  # a few tokens in
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=20)
        finally:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr, stderr
    result = WaterfallSet.load(out).meta["result"]
    assert result["interrupted"] is True and result["issued"] == result["stored"] == 3
    rows = _rows(out)
    assert [wf.error_type for wf in rows] == ["cancelled"] * 3
    for wf in rows:  # every stage reached is kept; the stream's tail ends at the cancel
        stages = wf.stages
        assert {"connect", "send", "wait", "first_token", "decode"} <= set(stages), stages
        assert stages["tail"].attributes.get("interrupted") is True
        assert 0 < len(wf.chunk_times_ns) < 400


async def test_a_cancelled_open_loop_stores_every_issued_request(tmp_path: Path) -> None:
    """Requests mid-stream and requests still waiting for a client slot both become rows."""
    out = tmp_path / "run.jsonl"
    with LLMServer(tokens=400, decode=0.05).run_in_subprocess() as s:
        url = s.url + "/v1/chat/completions"
        sc = Scenario(
            url, mode="open", rate=200.0, arrival="constant", max_in_flight=2, requests=10
        )
        task = asyncio.create_task(run(sc, path=out, rtt_samples=0))
        while _running(s.url) < 2:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # the whole schedule (10 at 200/s) is issued by now
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    result = WaterfallSet.load(out).meta["result"]
    assert result["interrupted"] is True and result["issued"] == result["stored"] == 10
    rows = _rows(out)
    assert [wf.error_type for wf in rows] == ["cancelled"] * 10
    sent = [wf for wf in rows if "decode" in wf.stages]
    unsent = [wf for wf in rows if wf.error == "cancelled while waiting for a client slot"]
    assert len(sent) == 2 and len(unsent) == 8
    assert all(wf.stages["schedule_lag"].duration_ns > 0 for wf in unsent)
