"""What py-spy costs the server it profiles (``python benchmarks/bench_profile.py``).

The busy test server (``latency_analyzer.testing.busy_server``, a child process) spends
about 16 ms of CPU per streamed request in named functions (tokenize 2 ms, prefill 4 ms,
20 decode steps of 0.5 ms). A closed loop of ``--concurrency`` clients drives it for
``--seconds`` per variant; variants run in interleaved rounds (order shuffled with a fixed
seed) so drifting background load hits them alike. Reported per variant: requests/s (median
over rounds) and its ratio to the unprofiled server, py-spy's own CPU share, and the samples
it took per second.

Variants: no profiler; 100 Hz and 1000 Hz (non-blocking, the Profiler's default); 1000 Hz
blocking (py-spy's own default).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from latency_analyzer import Client
from latency_analyzer.profile import Profiler

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
WORK = ["--queue", "0", "--tokenize", "0.002", "--prefill", "0.004"]
WORK += ["--decode-step", "0.0005", "--steps", "20", "--marker", "0"]
VARIANTS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "100Hz": {"rate": 100},
    "1000Hz": {"rate": 1000},
    "1000Hz_blocking": {"rate": 1000, "nonblocking": False},
}


async def closed_loop(url: str, concurrency: int, seconds: float) -> float:
    """Requests per second completed by ``concurrency`` back-to-back clients."""
    done = 0
    stop = time.perf_counter() + seconds

    async def worker(client: Client) -> None:
        nonlocal done
        while time.perf_counter() < stop:
            wf = await client.request("/v1/chat/completions", json=BODY)
            done += wf.ok

    start = time.perf_counter()
    async with Client(url, limit=concurrency) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return done / (time.perf_counter() - start)


def start_server(folder: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    port_file = folder / "port.json"
    args = [sys.executable, "-m", "latency_analyzer.testing.busy_server"]
    proc = subprocess.Popen([*args, "--port-file", str(port_file), *WORK])
    deadline = time.monotonic() + 20
    while not port_file.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("busy server did not start")
        time.sleep(0.05)
    return proc, json.loads(port_file.read_text())


def run_variant(info: dict[str, Any], options: dict[str, Any] | None, args: Any) -> dict[str, Any]:
    url = f"http://127.0.0.1:{info['port']}"
    if options is None:
        return {"rps": asyncio.run(closed_loop(url, args.concurrency, args.seconds))}
    with Profiler(info["pid"], **options) as prof:
        rps = asyncio.run(closed_loop(url, args.concurrency, args.seconds))
    result = prof.result
    return {
        "rps": rps,
        "status": result.status,
        "sampler_cpu_share": result.sampler_cpu_share,
        "samples_per_s": result.effective_rate,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, metavar="S")
    parser.add_argument("--rounds", type=int, default=3, metavar="N")
    parser.add_argument("--concurrency", type=int, default=4, metavar="N")
    parser.add_argument("--out", type=Path, default=None, metavar="PATH")
    args = parser.parse_args()
    rng = random.Random(7)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as folder:
        proc, info = start_server(Path(folder))
        try:
            asyncio.run(closed_loop(f"http://127.0.0.1:{info['port']}", 2, 1.0))  # warm-up
            for _ in range(args.rounds):
                order = list(VARIANTS)
                rng.shuffle(order)
                for name in order:
                    runs[name].append(run_variant(info, VARIANTS[name], args))
        finally:
            proc.terminate()
            proc.wait(10)
    base = statistics.median(r["rps"] for r in runs["none"])
    report: dict[str, Any] = {
        "benchmark": "profile_overhead",
        "utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "settings": vars(args) | {"out": str(args.out)},
        "variants": {},
    }
    for name, rows in runs.items():
        rps = statistics.median(r["rps"] for r in rows)
        entry: dict[str, Any] = {"rps": round(rps, 2), "ratio_to_none": round(rps / base, 3)}
        for key in ("sampler_cpu_share", "samples_per_s"):
            values = [r[key] for r in rows if r.get(key) is not None]
            if values:
                entry[key] = round(statistics.median(values), 3)
        report["variants"][name] = entry
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
