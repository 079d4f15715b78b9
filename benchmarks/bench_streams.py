"""How many concurrent 256-token streams one client process holds with event-loop lag P99 <= 2 ms.

Sweeps the number of concurrent streams against the test-bed server (its own process; tokens
paced every ``--decode`` seconds) and reports, per step, the client's loop lag P50/P99 (a task
asking to sleep 5 ms), CPU share, tokens/s received and requests ok. The answer is the largest
step whose P99 stays within the limit. The sweep stops at the first step over it.

    python benchmarks/bench_streams.py --out bench-results/streams.json [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import latency_analyzer as la
from latency_analyzer.load._monitor import LoopMonitor
from latency_analyzer.testing import LLMServer

LIMIT_MS = 2.0
BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def _pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] / 1e6 if ordered else 0.0


async def _step(url: str, streams: int) -> dict[str, Any]:
    async with la.Client(url, limit=streams, timeout=120) as client:
        await asyncio.gather(*(client.request("/health") for _ in range(min(streams, 50))))
        cpu0 = time.process_time()
        async with LoopMonitor() as monitor:
            wfs = await asyncio.gather(
                *(client.request("/v1/chat/completions", json=BODY) for _ in range(streams))
            )
        cpu = time.process_time() - cpu0
    tokens = sum(wf.output_tokens or 0 for wf in wfs)
    return {
        "streams": streams,
        "ok": sum(wf.ok for wf in wfs),
        "loop_lag_p50_ms": _pct(monitor.lags_ns, 0.50),
        "loop_lag_p99_ms": _pct(monitor.lags_ns, 0.99),
        "client_cpu_share": cpu / monitor.wall_s,
        "tokens_per_s": tokens / monitor.wall_s,
        "wall_s": monitor.wall_s,
    }


async def _sweep(steps: list[int], decode: float) -> list[dict[str, Any]]:
    out = []
    with LLMServer(tokens=256, decode=decode).run_in_subprocess() as server:
        for streams in steps:
            result = await _step(server.url, streams)
            out.append(result)
            print(
                f"{streams:5d} streams: {result['ok']} ok, loop lag P50 "
                f"{result['loop_lag_p50_ms']:.2f} / P99 {result['loop_lag_p99_ms']:.2f} ms, "
                f"client CPU {result['client_cpu_share']:.0%}, {result['tokens_per_s']:.0f} tok/s"
            )
            if result["loop_lag_p99_ms"] > LIMIT_MS:
                break
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="bench-results/streams.json")
    parser.add_argument("--decode", type=float, default=0.05, help="seconds between tokens")
    parser.add_argument("--quick", action="store_true", help="two small steps (smoke run)")
    args = parser.parse_args()
    steps = [10, 20] if args.quick else [25, 50, 100, 200, 400, 700, 1000]
    started = time.perf_counter()
    results = asyncio.run(_sweep(steps, args.decode))
    within = [r["streams"] for r in results if r["loop_lag_p99_ms"] <= LIMIT_MS]
    report = {
        "schema": 1,
        "library_version": la.__version__,
        "utc": datetime.now(timezone.utc).isoformat(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "tokens_per_stream": 256,
        "decode_s": args.decode,
        "loop_lag_limit_ms": LIMIT_MS,
        "steps": results,
        "max_streams_within_limit": max(within, default=0),
        "target": 1000,
        "runtime_s": time.perf_counter() - started,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"max concurrent streams with loop lag P99 <= {LIMIT_MS} ms: {max(within, default=0)}")


if __name__ == "__main__":
    main()
