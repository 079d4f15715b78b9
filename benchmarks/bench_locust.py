"""Locust overhead: ``LatencyUser`` against Locust's own ``FastHttpUser``, one run, side by side.

``python benchmarks/bench_locust.py --out bench-results/locust.json``

The test bed (a child process) streams 8 tokens 2 ms apart; Locust runs headless with the same
users and no think time, once per variant:

* ``fasthttp``: ``FastHttpUser.client.post`` (geventhttpclient; the body read whole, no stages);
* ``latency``: ``OpenAIUser.chat`` (our engine process; every stage, TTFT/TPOT rows);
* ``latency_no_rows``: the same with ``--la-stages ''`` (one Locust row per request only);
* ``native_load_run``: no Locust, our own closed loop (``load.run``) with as many users, whose
  CPU per request is the capture's own cost (what the engine process cannot do below).

For each: requests/s over the run, and client CPU per request (user + system time of the
Locust process, plus the engine process for ours) between Locust's test start and stop, read
from ``/proc`` inside the Locust process, so start-up and imports are not counted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from latency_analyzer.testing import LLMServer

_COMMON = """
import json, os, time
from locust import constant, events, task

_TICK = os.sysconf("SC_CLK_TCK")
_ENV = []
_MARK = {}


def _cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime


def _cpu(environment):
    engine = getattr(environment, "_bench_engine", None)
    pid = engine.proc.pid if engine is not None and engine.proc is not None else None
    return {"locust": _cpu_s(os.getpid()), "engine": _cpu_s(pid) if pid else 0.0}


@events.init.add_listener
def _init(environment, **kw):
    _ENV.append(environment)


@events.request.add_listener
def _first(request_type, **kw):
    # the window opens at the first answer: start-up, imports and the engine's are not in it
    if not _MARK and request_type == "POST":
        _MARK.update(t0=time.perf_counter(), cpu0=_cpu(_ENV[0]), n0=1)


@events.test_stop.add_listener
def _stop(environment, **kw):
    cpu1 = _cpu(environment)
    stats = environment.stats.get("chat", "POST")
    out = {
        "seconds": time.perf_counter() - _MARK["t0"],
        "requests": stats.num_requests - _MARK["n0"],
        "failures": stats.num_failures,
        "cpu_s_locust": cpu1["locust"] - _MARK["cpu0"]["locust"],
        "cpu_s_engine": cpu1["engine"] - _MARK["cpu0"]["engine"],
    }
    with open(os.environ["BENCH_OUT"], "w") as f:
        json.dump(out, f)
"""

_FAST = """
from locust import FastHttpUser

BODY = {"model": "m", "messages": [{"role": "user", "content": "hello there"}],
        "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 8}


class Fast(FastHttpUser):
    wait_time = constant(0)

    @task
    def chat(self):
        self.client.post("/v1/chat/completions", json=BODY, name="chat")
"""

_OURS = """
from latency_analyzer.locust import OpenAIUser
from latency_analyzer.locust._user import run_of


class Ours(OpenAIUser):
    wait_time = constant(0)

    def on_start(self):
        self.environment._bench_engine = run_of(self.environment).engine

    @task
    def ask(self):
        self.chat("hello there", name="chat", max_tokens=8)
"""


def _variant(name: str, source: str, url: str, args: argparse.Namespace, tmp: Path) -> Any:
    locustfile = tmp / f"{name}.py"
    locustfile.write_text(_COMMON + source)
    out = tmp / f"{name}.json"
    cmd = [sys.executable, "-m", "locust", "-f", str(locustfile), "--host", url, "--headless"]
    cmd += ["-u", str(args.users), "-r", str(args.users), "-t", f"{args.seconds}s"]
    cmd += ["--csv", str(tmp / name), "--exit-code-on-error", "0"]
    if name != "fasthttp":
        cmd += ["--la-out", str(tmp / f"{name}.jsonl")]
    if name == "latency_no_rows":
        cmd += ["--la-stages", ""]
    env = {**os.environ, "BENCH_OUT": str(out)}
    timeout = args.seconds + 120
    done = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0 or not out.exists():
        raise SystemExit(f"{name}: locust failed\n{done.stderr[-3000:]}")
    res: dict[str, Any] = json.loads(out.read_text())
    res["requests_per_s"] = res["requests"] / res["seconds"]
    res["cpu_s"] = res["cpu_s_locust"] + res["cpu_s_engine"]
    n = max(1, res["requests"])
    res["cpu_us_per_request"] = res["cpu_s"] / n * 1e6
    res["engine_cpu_us_per_request"] = res["cpu_s_engine"] / n * 1e6
    return res


_NATIVE = """
import json, sys, time
from latency_analyzer.load import Scenario, Template, run_sync

url, users, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
sc = Scenario(url + "/v1/chat/completions", concurrency=users, duration=seconds,
              templates=(Template(max_tokens=8),))
cpu0, t0 = time.process_time(), time.perf_counter()
res = run_sync(sc, rtt_samples=0)
cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
print(json.dumps({"requests": len(res.set), "seconds": wall, "cpu_s": cpu}))
"""


def _native(url: str, args: argparse.Namespace) -> Any:
    """Our own closed loop (``latency_analyzer.load.run``) with as many users: the capture's
    cost without Locust or the pipe, the floor the engine's share can be compared with."""
    seconds = max(1, args.seconds - 3)  # Locust's runs lose about this much to start-up
    cmd = [sys.executable, "-c", _NATIVE, url, str(args.users), str(seconds)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120)
    res: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    res["requests_per_s"] = res["requests"] / res["seconds"]
    res["cpu_us_per_request"] = res["cpu_s"] / max(1, res["requests"]) * 1e6
    return res


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench-results/locust.json", metavar="FILE")
    parser.add_argument("--users", type=int, default=8, metavar="N")
    parser.add_argument("--seconds", type=int, default=8, metavar="S")
    args = parser.parse_args()
    bed = LLMServer(decode=0.002, tokens=8)
    out: dict[str, Any] = {
        "utc": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "python": platform.python_version(),
        "users": args.users,
        "seconds": args.seconds,
        "server": {"decode_s": 0.002, "tokens": 8},
    }
    with tempfile.TemporaryDirectory() as tmp, bed.run_in_subprocess() as s:
        for name, source in (("fasthttp", _FAST), ("latency", _OURS), ("latency_no_rows", _OURS)):
            out[name] = _variant(name, source, s.url, args, Path(tmp))
        out["native_load_run"] = _native(s.url, args)
    fast = out["fasthttp"]
    for name in ("latency", "latency_no_rows"):
        ours = out[name]
        ours["rps_ratio_vs_fasthttp"] = ours["requests_per_s"] / fast["requests_per_s"]
        ours["cpu_per_request_ratio_vs_fasthttp"] = (
            ours["cpu_us_per_request"] / fast["cpu_us_per_request"]
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
