"""Locust users get waterfalls: Locust runs as a subprocess against the test bed.

The server runs in its own process with injected delays; its records (``perf_counter_ns``,
the host-wide monotonic clock) are the ground truth. Each check compares three things:
Locust's CSV rows (our numbers, passed to Locust's ``request`` event), our run file (the same
requests as waterfalls), and what the server did.
"""

from __future__ import annotations

import ast
import contextlib
import csv
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from latency_analyzer import Waterfall
from latency_analyzer.analysis import WaterfallSet
from latency_analyzer.cli import main as cli_main
from latency_analyzer.load.distributed._results import cristian_offset
from latency_analyzer.testing import LLMServer, RequestRecord, SubprocessLLMServer
from latency_analyzer.testing.pcap import PacketCapture, require_tcpdump

# find_spec, not import: importing locust monkey-patches the whole test process with gevent
if importlib.util.find_spec("locust") is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI must install the [locust] extra (it is in [test])")
    pytest.skip("needs Locust: pip install 'latency-analyzer[locust]'", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
HEADER_DELAY, PREFILL, DECODE, TOKENS = 0.010, 0.020, 0.004, 8
SECRET = "sk-planted-secret-0123"
LOAD_TOLERANCE_S = 0.002
ROWS = 40  # requests per run (1 in 5 failing)
FAIL_EVERY = 5  # one request in five asks the test bed for an HTTP 400

LOCUSTFILE = f"""
import itertools
from locust import constant, task
from latency_analyzer.locust import OpenAIUser

_n = itertools.count()

class Bench(OpenAIUser):
    wait_time = constant(0.02)
    api_key = "{SECRET}"

    @task
    def ask(self):
        if next(_n) % {FAIL_EVERY} == {FAIL_EVERY} - 1:
            self.chat("please fail", name="chat", testbed={{"fault": "http_error"}})
        else:
            self.chat("hello there", name="chat", max_tokens={TOKENS})
"""


@pytest.fixture(scope="module")
def server() -> Any:
    bed = LLMServer(header_delay=HEADER_DELAY, prefill=PREFILL, decode=DECODE, tokens=TOKENS)
    with bed.run_in_subprocess() as s:
        yield s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _locust(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "locust", *map(str, args), "--exit-code-on-error", "0"]


def _start(cmd: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60)


def _rows(prefix: Path) -> dict[tuple[str, str], dict[str, str]]:
    with open(f"{prefix}_stats.csv", newline="") as f:
        return {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}


def _check_run(
    prefix: Path,
    ws: WaterfallSet,
    records: list[RequestRecord],
    wire: list[float],
    *,
    secret: str,
    path: Path,
) -> None:
    # nothing lost: Locust counted = waterfalls written = requests the server received,
    # failures included (and counted as failures by both)
    rows = _rows(prefix)
    main = rows[("POST", "chat")]
    counts = ws.counts()
    assert int(main["Request Count"]) == len(ws) == len(records) >= ROWS
    assert len(wire) >= ROWS // 2  # the truth's sample (a loaded kernel may drop packets)
    assert int(main["Failure Count"]) == counts["errors"] == sum(r.status == 400 for r in records)
    assert counts["errors"] >= 3 and set(counts["errors_by_type"]) == {"http_status"}
    with open(f"{prefix}_failures.csv", newline="") as f:  # Locust's failures name our type
        failures = list(csv.DictReader(f))
    assert [r["Name"] for r in failures] == ["chat"] and "http_status: " in failures[0]["Error"]
    assert int(failures[0]["Occurrences"]) == counts["errors"]
    # Locust's rows are our numbers: same counts, same means (its CSV mean is exact)
    ok = ws.filter(ok=True)
    for (kind, name), metric in {
        ("TTFT", "chat ttft"): "ttft",
        ("TPOT", "chat tpot"): "tpot",
        ("STAGE", "chat wait"): "wait",
    }.items():
        vals = ok.values(metric, present_only=True)
        assert int(rows[(kind, name)]["Request Count"]) == vals.size
        mean_ms = float(rows[(kind, name)]["Average Response Time"])
        assert mean_ms == pytest.approx(vals.mean() * 1e3, abs=1e-6), name
    all_e2e = ws.values("e2e", include_errors=True)
    assert float(main["Average Response Time"]) == pytest.approx(all_e2e.mean() * 1e3, abs=1e-6)
    # a stage row counts only the ok requests that had the stage: connect, the cold ones
    assert int(rows[("STAGE", "chat connect")]["Request Count"]) == int(ok.cold.sum()) >= 1
    # and our numbers are the wire's: medians within the tolerance our own load runs meet
    # (tests/test_load.py: a median wait within 2 ms of the injected truth). Truth for
    # wait is the wire's (request's last byte → response's first, kernel stamps: a busy
    # server's late wake-up is in it, as in ours); headers → first token (prefill) and the
    # token gaps are the server's own records. TTFT is the sum of our stages, checked above
    # as exactly our waterfalls' value.
    good = [r for r in records if r.status == 200 and r.chunk_ns]
    truth = {
        "wait": float(np.median(wire)),
        "first_token": np.median([r.chunk_ns[0] - (r.headers_ns or 0) for r in good]) / 1e9,
        "tpot": np.median([(r.chunk_ns[-1] - r.chunk_ns[0]) / (TOKENS - 1) for r in good]) / 1e9,
    }
    # a first token read together with later bytes carries their stamp (the kernel keeps a
    # read's newest): such requests say so (shared_read_chunks), and first_token is judged on
    # the others, whose stamps are their own
    wfs = [
        Waterfall.from_dict(o["wf"])
        for o in map(json.loads, path.read_text().splitlines())
        if o.get("kind") == "wf"
    ]
    own = [
        wf for wf in wfs if wf.ok and "first_token" in wf.stages and 0 not in wf.shared_read_chunks
    ]
    assert len(own) >= ROWS // 4
    measured = {
        "wait": float(np.median(ok.values("wait", present_only=True))),
        "first_token": float(np.median([wf.stages["first_token"].duration for wf in own])),
        "tpot": float(np.median(ok.values("tpot", present_only=True))),
    }
    for metric, want in truth.items():
        got = measured[metric]
        print(f"{metric}: measured {got * 1e3:.3f} ms, truth {want * 1e3:.3f} ms")
        assert abs(got - want) < LOAD_TOLERANCE_S, (metric, got, want)
    # the run file: our format, Locust's scenario, no secret anywhere
    meta = ws.meta
    assert meta["backend"] == "locust" and meta["scenario"]["locustfile_sha256"]
    assert meta["scenario"]["options"]["num_users"] >= 2
    assert secret not in path.read_text()


# -- wire truth: a packet capture on lo (kernel stamps, which host load cannot move) ---------
@contextlib.contextmanager
def _capture(port: int) -> Iterator[PacketCapture]:
    """tcpdump on ``lo`` for TCP ``port`` while the block runs (headers are all we read)."""
    require_tcpdump()
    with PacketCapture(port=port, snaplen=256) as capture:
        yield capture


def _wire_waits(capture: PacketCapture, server_port: int) -> list[float]:
    """Per response: first byte of its headers minus the request's last byte, on the wire (s)."""
    last_request: dict[int, int] = {}
    waits = []
    for p in capture.packets:
        if not p.size:
            continue  # handshake or ACK
        if p.dst[1] == server_port:
            last_request[p.src[1]] = p.time_ns
        elif p.src[1] == server_port and p.payload.startswith(b"HTTP/1.1 "):
            waits.append((p.time_ns - last_request.pop(p.dst[1])) / 1e9)
    return waits


def test_headless_run_with_web_ui_page(server: SubprocessLLMServer, tmp_path: Path) -> None:
    """One local run: CSV rows, the run file and the web UI's page, against the truth."""
    (tmp_path / "lf.py").write_text(LOCUSTFILE)
    before = len(server.records)
    port = _free_port()
    args = ["-f", "lf.py", "--host", server.url, "-u", "3", "-r", "3", "--autostart"]
    args += ["--web-host", "127.0.0.1", "--web-port", str(port)]
    args += ["--csv", "out", "--la-out", "run.jsonl"]
    with _capture(server.port) as capture:
        page, stats, out = _run_until(port, ROWS, [_start(_locust(*args), tmp_path)])
    wire = _wire_waits(capture, server.port)
    records = server.records[before:]
    ws = WaterfallSet.load(tmp_path / "run.jsonl")
    _check_run(tmp_path / "out", ws, records, wire, secret=SECRET, path=tmp_path / "run.jsonl")
    # the page: our percentile table (stage rows) and the slowest requests' waterfalls
    assert "<table" in page and "</span> ttft</td>" in page
    assert "</span> wait</td>" in page and "Slowest requests" in page and "<svg" in page
    assert SECRET not in page and SECRET not in out
    assert '"extended_stats"' in stats and '"latency-analyzer"' in stats


def _run_until(port: int, rows: int, procs: list[subprocess.Popen[str]]) -> tuple[str, str, str]:
    """Let Locust (``procs[0]``, its web UI on ``port``) run until our page counts ``rows``
    requests, then stop it with SIGTERM (Locust's clean shutdown, as at the end of ``-t``).
    Counting rows, not seconds: on a busy machine Locust's start-up eats into ``-t``.

    Returns:
        the ``/latency`` page and ``/stats/requests`` as they were, and Locust's output.
    """
    try:
        page = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            page = _fetch_page(f"http://127.0.0.1:{port}/latency", until="</html>")
            seen = re.search(r"(\d+) requests ·", page)
            if seen and int(seen.group(1)) >= rows and "Slowest requests" in page:
                break
            time.sleep(0.3)
        stats = _fetch_page(f"http://127.0.0.1:{port}/stats/requests", until="extended_stats")
        procs[0].send_signal(signal.SIGTERM)
        out, _ = procs[0].communicate(timeout=60)
        for p in procs[1:]:
            p.communicate(timeout=30)
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode == 0, out[-3000:]
    return page, stats, out


def _fetch_page(url: str, until: str) -> str:
    """The page once it shows ``until`` (the run has recorded requests), polled for 60 s: on a
    busy host three Python processes importing gevent and Locust take tens of seconds."""
    deadline = time.monotonic() + 60
    text = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:  # loopback only
                text = str(resp.read().decode())
        except OSError:
            pass
        if until in text:
            return text
        time.sleep(0.3)
    raise AssertionError(f"{url} never showed {until!r}: {text[:500]!r}")


def test_master_and_two_workers_merge_exactly(
    server: SubprocessLLMServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "lf.py").write_text(LOCUSTFILE)
    before = len(server.records)
    port = _free_port()
    web = _free_port()
    master = _locust(
        *("-f", "lf.py", "--host", server.url, "-u", "4", "-r", "4", "--autostart"),
        *("--web-host", "127.0.0.1", "--web-port", web),
        *("--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", port),
        *("--expect-workers", "2", "--csv", "out", "--la-out", "run.jsonl"),
    )
    worker = _locust("-f", "lf.py", "--worker", "--master-host", "127.0.0.1", "--master-port", port)
    with _capture(server.port) as capture:
        procs = [_start(master, tmp_path), _start(worker, tmp_path), _start(worker, tmp_path)]
        page, _, out = _run_until(web, ROWS, procs)
    assert SECRET not in out and "</span> ttft</td>" in page  # the master's page: every worker
    wire = _wire_waits(capture, server.port)
    records = server.records[before:]
    path = tmp_path / "run.jsonl"
    ws = WaterfallSet.load(path)
    _check_run(tmp_path / "out", ws, records, wire, secret=SECRET, path=path)
    # every row tagged with its worker; each worker's identity and its clock, bounded
    groups = ws.group_by("worker")
    assert len(groups) == 2 and all(len(g) > 5 for g in groups.values())
    reports = ws.meta["worker_reports"]["workers"]
    assert sorted(r["worker"] for r in reports) == sorted(groups)
    assert [r["rows"] for r in sorted(reports, key=lambda r: r["worker"])] == [
        len(groups[k]) for k in sorted(groups)
    ]
    for r in reports:
        assert r["pid"] > 0 and r["anchor"]["epoch_ns"] > 0 and r["fingerprint"]["base_rtt_s"]
        assert r["clock_error_s"] < 0.05  # one probe round trip over Locust's channel
        assert abs(r["clock_offset_s"]) <= r["clock_error_s"] + 0.001  # one host, one clock
    # our tools read it unchanged
    assert cli_main(["compare", str(path), str(path)]) == 0
    assert "ttft_p50" in capsys.readouterr().out


def test_example_locustfile_runs(server: SubprocessLLMServer, tmp_path: Path) -> None:
    args = ["-f", ROOT / "examples" / "locustfile_mixed.py", "--host", server.url]
    args += ["--headless", "-u", "8", "-r", "8", "-t", "6s", "--csv", "out", "--la-out", "m.jsonl"]
    done = _run(_locust(*args), tmp_path)  # as a user runs it: headless, for a time
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _rows(tmp_path / "out")
    ws = WaterfallSet.load(tmp_path / "m.jsonl")
    kinds = {"short_chat", "code", "long_document"}
    counted = sum(int(rows[("POST", k)]["Request Count"]) for k in kinds if ("POST", k) in rows)
    assert counted == len(ws) >= 1
    assert set(ws.group_by("template")) <= kinds
    assert ("TTFT", "short_chat ttft") in rows


KILLING = """
import os, signal
from locust import constant, task
from latency_analyzer.locust import OpenAIUser
from latency_analyzer.locust._user import run_of

_done = []

class Killer(OpenAIUser):
    wait_time = constant(0.01)

    @task
    def ask(self):
        if len(_done) % 2:
            self.completions("hello", name="chat", max_tokens=4)
        else:
            self.chat("hello", name="chat", max_tokens=4)
        _done.append(1)
        if len(_done) == 15:  # the engine dies under the run
            os.kill(run_of(self.environment).engine.proc.pid, signal.SIGKILL)
"""


def test_a_dead_engine_stops_the_run_and_loses_nothing_counted(
    server: SubprocessLLMServer, tmp_path: Path
) -> None:
    (tmp_path / "lf.py").write_text(KILLING)
    args = ["-f", "lf.py", "--host", server.url, "--headless", "-u", "3", "-r", "3", "-t", "20s"]
    done = _run(_locust(*args, "--csv", "out", "--la-out", "run.jsonl"), tmp_path)
    assert done.returncode == 1 and "stopping the test" in done.stderr  # not a silent run
    rows = _rows(tmp_path / "out")
    ws = WaterfallSet.load(tmp_path / "run.jsonl")
    assert int(rows[("POST", "chat")]["Request Count"]) == len(ws) >= 15  # counted = kept
    text = (tmp_path / "run.jsonl").read_text()  # OpenAIUser.chat and .completions, streamed
    assert "/v1/chat/completions" in text and '/v1/completions"' in text
    assert ws.counts()["errors"] == 0 and len(ws.values("tpot")) == len(ws)


def test_the_engine_process_never_loads_gevent() -> None:
    """The engine imports the package, never Locust or gevent: nothing in it is patched."""
    code = (
        "import sys, latency_analyzer.locust, latency_analyzer.locust._engine\n"
        "print(sorted(m for m in ('gevent', 'locust') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_bad_stage_option_exits_2(tmp_path: Path) -> None:
    (tmp_path / "lf.py").write_text(LOCUSTFILE)
    args = ["-f", "lf.py", "--headless", "-t", "1s", "--la-stages", "ttft,warp"]
    done = _run(_locust(*args), tmp_path)
    assert done.returncode == 2
    assert "--la-stages" in done.stderr and "'warp'" in done.stderr


def test_cristian_offset_takes_the_tightest_round_trip() -> None:
    # remote clock 5 ms ahead; the second probe has the shortest round trip (2 µs)
    samples = [(0, 5_002_500, 4_000), (10_000, 5_011_000, 12_000), (20_000, 5_030_000, 30_000)]
    offset, error = cristian_offset(samples)
    assert offset == pytest.approx(0.005, abs=1e-9) and error == pytest.approx(1e-6)
    assert cristian_offset([]) == (0.0, float("inf"))


def test_nothing_imports_the_locust_layer() -> None:
    """locust/ sits on top (beside cli): no other module of the package imports it."""
    pkg = ROOT / "latency_analyzer"
    for path in pkg.rglob("*.py"):
        if "locust" in path.relative_to(pkg).parts[:1]:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.startswith("latency_analyzer.locust") for n in names), path
            if isinstance(node, ast.ImportFrom) and node.level:
                assert not (node.module or "").startswith("locust"), path


def test_stage_names_and_client_options_are_checked() -> None:
    from latency_analyzer import UsageError
    from latency_analyzer.locust._engine import client_of
    from latency_analyzer.locust._run import parse_stages

    assert parse_stages(" dns, ttft ,tpot,server_queue,") == ("dns", "ttft", "tpot", "server_queue")
    assert parse_stages("") == ()
    with pytest.raises(ValueError, match="'warp'"):
        parse_stages("wait,warp")
    with pytest.raises(UsageError, match="colour"):
        client_of({"http2": True, "colour": "red"})
