"""HTTP/2 vs HTTP/1.1 client cost: 100 concurrent 256-token streams, side by side in one run.

HTTP/2: one connection to the h2 test server carrying all 100 streams. HTTP/1.1: 100
connections to the aiohttp test server. Both servers run in their own processes with the same
knobs, so ``time.process_time()`` here is the client's CPU alone. Reported per variant: client
CPU per streamed token, event-loop lag P50/P99 (a task asking to sleep 5 ms), requests ok.
Target: the HTTP/2 path within 1.5x of HTTP/1.1's CPU per token.

    python benchmarks/bench_http2.py --out bench-results/http2.json [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import latency_analyzer as la
from latency_analyzer.load._monitor import LoopMonitor
from latency_analyzer.testing import H2LLMServer, LLMServer

BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


async def _round(url: str, http2: bool, streams: int) -> dict[str, float]:
    limit = streams if not http2 else 1
    async with la.Client(url, http2=http2 if http2 else False, limit=limit, timeout=120) as client:
        await client.request("/v1/chat/completions", json={**BODY, "max_tokens": 2})  # warm
        cpu0 = time.process_time()
        async with LoopMonitor() as monitor:
            wfs = await asyncio.gather(
                *(client.request("/v1/chat/completions", json=BODY) for _ in range(streams))
            )
        cpu = time.process_time() - cpu0
    tokens = sum(wf.output_tokens or 0 for wf in wfs)
    lags = sorted(monitor.lags_ns)
    return {
        "ok": sum(wf.ok for wf in wfs),
        "connections": len({wf.connection.connection_id for wf in wfs}),
        "tokens": tokens,
        "cpu_s": cpu,
        "cpu_us_per_token": cpu / max(tokens, 1) * 1e6,
        "loop_lag_p50_ms": lags[len(lags) // 2] / 1e6 if lags else float("nan"),
        "loop_lag_p99_ms": lags[min(len(lags) - 1, int(len(lags) * 0.99))] / 1e6
        if lags
        else float("nan"),
        "wall_s": monitor.wall_s,
    }


def _median(rounds: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rounds)


async def _run(streams: int, tokens: int, decode: float, rounds: int) -> dict[str, Any]:
    knobs = {"tokens": tokens, "decode": decode}
    out: dict[str, list[dict[str, float]]] = {"http2": [], "http1": []}
    with (
        H2LLMServer(**knobs).run_in_subprocess() as h2,
        LLMServer(**knobs).run_in_subprocess() as h1,
    ):
        for _ in range(rounds):  # alternate, so drift on a shared machine hits both alike
            out["http2"].append(await _round(h2.url, True, streams))
            out["http1"].append(await _round(h1.url, False, streams))
    summary = {
        name: {
            key: _median(rs, key)
            for key in ("ok", "connections", "tokens", "cpu_us_per_token", "loop_lag_p99_ms")
        }
        | {"loop_lag_p50_ms": _median(rs, "loop_lag_p50_ms"), "rounds": rs}
        for name, rs in out.items()
    }
    ratio = summary["http2"]["cpu_us_per_token"] / summary["http1"]["cpu_us_per_token"]
    return {"variants": summary, "cpu_per_token_ratio_h2_over_h1": ratio, "target_max": 1.5}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="bench-results/http2.json")
    parser.add_argument("--quick", action="store_true", help="10 streams, 1 round (smoke run)")
    args = parser.parse_args()
    streams, rounds = (10, 1) if args.quick else (100, 3)
    started = time.perf_counter()
    result = asyncio.run(_run(streams, tokens=256, decode=0.01, rounds=rounds))
    report = {
        "schema": 1,
        "library_version": la.__version__,
        "utc": datetime.now(timezone.utc).isoformat(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "streams": streams,
        "tokens_per_stream": 256,
        "decode_s": 0.01,
        "runtime_s": time.perf_counter() - started,
        **result,
        "target_met": result["cpu_per_token_ratio_h2_over_h1"] <= 1.5,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    for name in ("http2", "http1"):
        v = result["variants"][name]
        print(
            f"{name}: {v['ok']:.0f} ok on {v['connections']:.0f} connection(s), "
            f"{v['cpu_us_per_token']:.1f} µs CPU/token, loop lag P50 "
            f"{v['loop_lag_p50_ms']:.2f} ms / P99 {v['loop_lag_p99_ms']:.2f} ms"
        )
    ratio = result["cpu_per_token_ratio_h2_over_h1"]
    print(f"CPU per token, HTTP/2 / HTTP/1.1: {ratio:.2f} (target <= 1.5) -> {args.out}")


if __name__ == "__main__":
    main()
