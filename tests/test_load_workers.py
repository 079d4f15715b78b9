"""Local workers: one scenario over worker processes of this machine, merged exactly.

Ground truth: the scenario's schedule (constant arrivals: every 1/R across workers, R·D of
them) and the test-bed server's own request records, in a process of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from latency_analyzer import UsageError
from latency_analyzer.analysis import WaterfallSet
from latency_analyzer.cli import main
from latency_analyzer.load import Scenario, run
from latency_analyzer.load.distributed import DistributedResult, auto_workers, usable_cores
from latency_analyzer.load.distributed._local import RATE_PER_WORKER, STREAMS_PER_WORKER
from latency_analyzer.testing import SubprocessLLMServer

CHAT = "/v1/chat/completions"
LLM_KNOBS = {"prefill": 0.010, "decode": 0.002, "tokens": 8}


def _rows(path: Path) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [obj for obj in lines if obj.get("kind") == "wf"]


async def test_a_closed_loop_is_shared_by_two_processes_and_merged(
    llm: SubprocessLLMServer, tmp_path: Path
) -> None:
    sc = Scenario(llm.url + CHAT, concurrency=4, requests=40)
    res = await run(sc, workers=2, path=tmp_path / "m.jsonl", rtt_samples=1)
    assert isinstance(res, DistributedResult) and res.backend == "processes"
    assert len(res.set) == 40 == res.issued and res.lost == 0
    assert [w.status for w in res.workers] == ["finished", "finished"]
    assert len({w.pid for w in res.workers} | {os.getpid()}) == 3  # two processes of their own
    assert sorted(res.set.column("worker").tolist()).count(0) == 20
    assert bool(res.set.ok.all())
    # the server saw every request once, and the file holds every row
    assert len([r for r in llm.records if r.path == CHAT]) >= 40
    assert len(_rows(tmp_path / "m.jsonl")) == 40
    back = WaterfallSet.load(tmp_path / "m.jsonl")
    assert back.meta["backend"] == "processes" and len(back.meta["workers"]) == 2


async def test_constant_arrivals_keep_the_one_process_schedule(
    llm: SubprocessLLMServer,
) -> None:
    rate, duration = 50.0, 1.0
    sc = Scenario(llm.url + CHAT, mode="open", rate=rate, arrival="constant", duration=duration)
    res = await run(sc, workers=2, rtt_samples=0)
    assert len(res.set) == round(rate * duration)
    intended = np.sort(res.set.column("epoch_ns"))
    gaps = np.diff(intended) / 1e9
    # intended starts are the schedule itself (no client noise): the two workers' phases
    # interleave into one arrival every 1/R, within the anchors' rounding
    assert np.allclose(gaps, 1 / rate, atol=1e-4)


async def test_a_killed_worker_keeps_what_it_streamed(
    llm: SubprocessLLMServer, tmp_path: Path
) -> None:
    sc = Scenario(llm.url + CHAT, concurrency=2, duration=2.0)
    task = asyncio.ensure_future(
        run(
            sc,
            workers=2,
            path=tmp_path / "k.jsonl",
            rtt_samples=0,
            batch_interval=0.05,
            start_delay=0.2,
        )
    )
    victim = None
    deadline = time.monotonic() + 60  # spawning two workers takes seconds on a busy host
    while time.monotonic() < deadline:  # the header names each worker's pid once identified
        await asyncio.sleep(0.02)
        path = tmp_path / "k.jsonl"
        if path.exists() and path.stat().st_size:
            header = json.loads(path.read_text().splitlines()[0])
            victim = header["meta"]["workers"][1]["pid"]
            break
    assert victim is not None
    await asyncio.sleep(0.2 + 0.6)  # past the common start: it has sent some rows by now
    os.kill(victim, signal.SIGKILL)
    res = await task
    dead, alive = res.workers[1], res.workers[0]
    assert dead.status == "died" and alive.status == "finished"
    assert dead.rows > 0 and alive.rows > dead.rows
    assert len(res.set) == dead.rows + alive.rows
    assert any("DIED" in n for n in res.notes)


def test_options_a_process_cannot_share_are_refused() -> None:
    sc = Scenario("http://127.0.0.1:9" + CHAT, concurrency=2, requests=4)
    with pytest.raises(UsageError, match="progress"):
        asyncio.run(run(sc, workers=2, progress=lambda done, total: None))
    with pytest.raises(UsageError, match="cannot be shared"):
        asyncio.run(run(sc.replace(concurrency=1), workers=2))


def test_auto_workers_is_the_usable_cores_as_far_as_the_load_needs_and_splits() -> None:
    url = "http://192.0.2.1:9" + CHAT  # another host (no request is made)
    cores = usable_cores()
    assert cores == len(os.sched_getaffinity(0))
    assert auto_workers(Scenario(url, concurrency=1, requests=9)) == 1
    many = Scenario(url, concurrency=1000, requests=10_000)
    assert auto_workers(many) == min(cores, 8)
    # a load one process keeps up with stays in one (and pays one start-up)
    assert auto_workers(Scenario(url, concurrency=STREAMS_PER_WORKER, requests=999)) == 1
    assert auto_workers(Scenario(url, concurrency=STREAMS_PER_WORKER + 1, requests=999)) == min(
        cores, 2
    )
    open_loop = Scenario(url, mode="open", rate=RATE_PER_WORKER, requests=999)
    assert auto_workers(open_loop) == 1
    assert auto_workers(open_loop.replace(rate=RATE_PER_WORKER * 3)) == min(cores, 3)
    burst = open_loop.replace(arrival="burst", requests=STREAMS_PER_WORKER * 2)
    assert auto_workers(burst) == min(cores, 2)
    # a server on this host needs cores too: half are left to it
    here_too = ("[::ffff:127.0.0.1]:9", "0.0.0.0:9", "[::]:9", "localhost.:9", "127.1:9")
    for here in ("127.0.0.1:9", "[::1]:9", "localhost:9", *here_too):
        assert auto_workers(many.replace(url=f"http://{here}{CHAT}")) == max(1, min(cores // 2, 8))
    assert auto_workers(Scenario("http://localhost:9" + CHAT, concurrency=1, requests=9)) == 1
    for elsewhere in ("example.com:9", "10.0.0.1:9", "[2001:db8::1]:9"):
        assert auto_workers(many.replace(url=f"http://{elsewhere}{CHAT}")) == min(cores, 8)


def test_cli_run_with_workers_writes_one_merged_file(
    llm: SubprocessLLMServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli.jsonl"
    argv = ["run", "--url", llm.url + CHAT, "--concurrency", "2", "--requests", "12"]
    status = main([*argv, "--workers", "2", "--out", str(out), "--json"])
    assert status == 0, capsys.readouterr().err
    rows = _rows(out)
    assert len(rows) == 12
    assert {row["tags"]["worker"] for row in rows} == {0, 1}  # type: ignore[index]  # parsed JSON, typed as object
