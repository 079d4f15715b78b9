"""Load-generation and statistics benchmarks (``python benchmarks/bench_load.py``).

* ``pacer``: lateness of the open-loop pacer (wake-up − scheduled instant) at 200, 1,000 and
  2,000 arrivals/s, each arrival spawning a no-op task as the runner does. Target: P99
  ≤ 0.5 ms at 1,000/s.
* ``summary_1m``: ``WaterfallSet.summary()`` (5 percentiles with bootstrap CIs and the mean,
  for every metric and stage) over 1,000,000 synthetic rows. Targets: ≤ 1 s, ≤ 200 B/row.
* ``many_requests``: 10,000 requests at 500 concurrency against the test bed (a child
  process): every request accounted for, wall time, client CPU and peak RSS.

Not measured yet: the largest number of concurrent 256-token streams on 2 cores with loop
lag P99 ≤ 2 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from latency_analyzer.analysis import WaterfallSet
from latency_analyzer.analysis._columns import NUMERIC, Columns
from latency_analyzer.load import Pacer, Scenario, run
from latency_analyzer.testing import LLMServer

STAGES = ("pool_wait", "send", "wait", "first_token", "decode", "tail", "other")


async def pacer_lag(rate: float, seconds: float) -> dict[str, float]:
    pacer = Pacer()
    t0 = time.perf_counter_ns() + 10_000_000
    gap = round(1e9 / rate)

    async def noop() -> None:
        await asyncio.sleep(0)

    tasks = set()
    for i in range(int(rate * seconds)):
        await pacer.wait_until(t0 + i * gap)
        task = asyncio.create_task(noop())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    lag = np.array(pacer.lags_ns) / 1e6
    return {
        "rate": rate,
        "p50_ms": float(np.percentile(lag, 50)),
        "p99_ms": float(np.percentile(lag, 99)),
    }


def synthetic_set(n: int, seed: int = 0) -> WaterfallSet:
    rng = np.random.default_rng(seed)
    arrays: dict[str, Any] = {name: np.zeros(n, dtype=dtype) for name, dtype in NUMERIC.items()}
    stages = {s: rng.lognormal(13, 1, n).astype(np.int64) for s in STAGES}
    arrays["e2e_ns"] = sum(stages.values())
    arrays["ttft_ns"] = (
        stages["pool_wait"] + stages["send"] + stages["wait"] + stages["first_token"]
    ).astype(np.float64)
    arrays["tpot_ns"] = rng.lognormal(16, 0.3, n)
    arrays["output_tokens"] = np.full(n, 256, np.int32)
    arrays["epoch_ns"] = np.arange(n, dtype=np.int64) * 1_000_000
    arrays["stage_mask"] = np.full(n, (1 << len(STAGES)) - 1, np.int32)
    arrays["status"] = np.full(n, 200, np.int16)
    for s, v in stages.items():
        arrays[f"stage:{s}"] = v
    for name in ("error_type", "http_version", "scenario", "template"):
        arrays[name] = np.zeros(n, np.int16)
    cols = Columns(arrays, list(STAGES))
    return WaterfallSet._from_columns(cols)


def summary_1m(n: int) -> dict[str, float]:
    ws = synthetic_set(n)
    t = time.perf_counter()
    s = ws.summary()
    elapsed = time.perf_counter() - t
    return {"rows": n, "seconds": elapsed, "bytes_per_row": ws.nbytes / n, "metrics": len(s.rows)}


async def many_requests(n: int, concurrency: int) -> dict[str, Any]:
    with LLMServer(tokens=4).run_in_subprocess() as s:
        sc = Scenario(s.url + "/v1/chat/completions", concurrency=concurrency, requests=n)
        t = time.perf_counter()
        res = await run(sc, rtt_samples=0)
        wall = time.perf_counter() - t
        served = s.requests
    return {
        "requests": n,
        "concurrency": concurrency,
        "issued": res.issued,
        "stored": len(res.set),
        "served": served,
        "errors": res.set.counts()["errors"],
        "wall_s": wall,
        "client": res.client.to_dict(),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench-results/load.json")
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    args = parser.parse_args()
    q = args.quick
    out: dict[str, Any] = {
        "schema": 1,
        "utc": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "python": platform.python_version(),
    }
    out["pacer"] = [asyncio.run(pacer_lag(r, 0.5 if q else 3.0)) for r in (200, 1000, 2000)]
    out["summary_1m"] = summary_1m(50_000 if q else 1_000_000)
    out["many_requests"] = asyncio.run(many_requests(500 if q else 10_000, 50 if q else 500))
    out["targets"] = {
        "pacer_p99_ms_at_1000": out["pacer"][1]["p99_ms"] <= 0.5,
        "summary_s": out["summary_1m"]["seconds"] <= 1.0,
        "bytes_per_row": out["summary_1m"]["bytes_per_row"] <= 200,
        "all_accounted": out["many_requests"]["issued"] == out["many_requests"]["stored"],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
