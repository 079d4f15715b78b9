"""The floor a Python streaming client stands on: aiohttp on asyncio's own loop, nothing else.

    python benchmarks/bare_client.py URL --model M --tokens N --requests R
        (--concurrency C | --rate X) [--warmup W] [--seed S] --out r.json

Each request is a streamed chat completion, read as it arrives (``iter_any``); each SSE event
is parsed with ``json.loads``, and each one with content stamped (``perf_counter`` at the
read that completed it): the first is its first token. A closed loop
(``--concurrency``) or Poisson arrivals (``--rate``), after ``--warmup`` requests sent as the
first wave and left out of the figures. It keeps no waterfall, no kernel stamp, no trace
context: what it costs is what any client built on aiohttp costs at least, which is what
``bench_peers.py`` runs it for (a reference beside the peers, not a peer).

Writes TTFT P50/P95/P99 and mean TPOT (ms), completed and failed counts to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np


async def _one(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[float, ...]:
    start = time.perf_counter()
    stamps: list[float] = []
    pending = b""
    async with session.post(url, json=body) as resp:
        resp.raise_for_status()
        async for data in resp.content.iter_any():  # what arrived, whole events or not
            now = time.perf_counter()
            *events, pending = (pending + data).split(b"\n\n")
            for event in events:
                if not event.startswith(b"data: ") or event.startswith(b"data: [DONE]"):
                    continue
                choices = json.loads(event[6:]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    stamps.append(now)
    return (start, *stamps)


def chat_body(args: argparse.Namespace) -> dict[str, Any]:
    """The streamed chat request every request of the run sends."""
    return {
        "model": args.model,
        "messages": [{"role": "user", "content": " ".join(["word"] * args.prompt_words)}],
        "max_tokens": args.tokens,
        "stream": True,
    }


async def drive(
    args: argparse.Namespace, request: Callable[[bool], Coroutine[Any, Any, None]]
) -> None:
    """``--warmup`` requests as one wave (``request(False)``: left out of the figures), then
    ``--requests`` (``request(True)``) by ``--concurrency`` users or at Poisson ``--rate``."""
    if args.warmup:
        await asyncio.gather(*(request(False) for _ in range(args.warmup)))
    if args.concurrency:
        left = iter(range(args.requests))

        async def user() -> None:
            for _ in left:
                await request(True)

        await asyncio.gather(*(user() for _ in range(args.concurrency)))
    else:
        rng = random.Random(args.seed)
        tasks = []
        for _ in range(args.requests):
            tasks.append(asyncio.create_task(request(True)))
            await asyncio.sleep(rng.expovariate(args.rate))
        await asyncio.gather(*tasks)


def figures(
    ttft_ms: list[float], tpot_ms: list[float], completed: int, failed: int
) -> dict[str, Any]:
    """What a floor writes: TTFT P50/P95/P99 and mean TPOT (ms), and its counts."""
    p50, p95, p99 = np.percentile(ttft_ms, [50, 95, 99]) if ttft_ms else (np.nan,) * 3
    return {
        "ttft_p50_ms": float(p50),
        "ttft_p95_ms": float(p95),
        "ttft_p99_ms": float(p99),
        "tpot_mean_ms": float(np.mean(tpot_ms)) if tpot_ms else float("nan"),
        "completed": completed,
        "failed": failed,
    }


def cli(
    doc: str, main: Callable[[argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]]
) -> None:
    """The floors' command line: parse it, run ``main`` on asyncio's own loop, write --out."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, required=True)
    parser.add_argument("--prompt-words", type=int, default=16)
    parser.add_argument("--requests", type=int, required=True)
    parser.add_argument("--concurrency", type=int)
    parser.add_argument("--rate", type=float)
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if (args.concurrency is None) == (args.rate is None):
        parser.error("give one of --concurrency and --rate")
    args.out.write_text(json.dumps(asyncio.run(main(args))) + "\n")


async def main(args: argparse.Namespace) -> dict[str, Any]:
    body = chat_body(args)
    results: list[tuple[float, ...]] = []
    failed = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def request(keep: bool) -> None:
            nonlocal failed
            try:
                got = await _one(session, args.url, body)
            except (aiohttp.ClientError, ValueError, asyncio.TimeoutError):
                failed += keep
                return
            if keep:
                results.append(got)

        await drive(args, request)
    ttft = [(r[1] - r[0]) * 1e3 for r in results if len(r) > 1]
    tpot = [(r[-1] - r[1]) * 1e3 / (len(r) - 2) for r in results if len(r) > 2]
    return figures(ttft, tpot, len(results), failed)


if __name__ == "__main__":
    cli(__doc__ or "", main)
