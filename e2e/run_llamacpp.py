"""End to end against a real llama.cpp server: its own ``timings`` merged as server stages.

    python e2e/run_llamacpp.py --model tiny.gguf [--server llama-server] [--requests 10]
    python e2e/run_llamacpp.py --model tiny.gguf --python-server     # llama-cpp-python's

1. the server on 127.0.0.1 (a free port): llama.cpp's ``llama-server`` (``-c 512 -np 4
   --metrics``, 1 thread), or llama-cpp-python's ``python -m llama_cpp.server``; its log goes
   to ``--log``;
2. one warm-up request, then ``--requests`` sequential streamed chat requests and a burst of
   ``--burst`` concurrent ones through ``latency_analyzer.Client``, with one ``GET /metrics``
   mid-burst (``llamacpp:requests_processing`` / ``_deferred``);
3. ``merge_timings`` on each waterfall; the server is stopped (SIGTERM to its process group,
   SIGKILL after 30 s) whatever happened.

Checks, per request: the response carried ``timings`` and the merge placed them
(``server.status == "merged"``, ``server.schema == "llamacpp-timings"``, ``server.placement``
set); the attribution sums to e2e to the nanosecond; the server's ``prefill`` + ``decode`` fit
in the client's interval from its first request byte to its last response byte, ``prefill``
ends by the client's first token chunk and ``decode`` by its last byte; the server's
``predicted_n`` is at least the client's content chunks. llama-cpp-python's server (0.3.x)
sends no ``timings``: with ``--python-server`` the check is that every request streamed, its
attribution sums, and the merge says ``no server data`` (not zero server time). Exit status 1
if a check fails, 2 if the server does not start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

import latency_analyzer as la
from latency_analyzer.merge import MERGED, PLACED_BY_CLIENT, merge_timings

READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
MS = 1e6
PROMPT = "why is the first token slow when the queue is long and the cache is cold"
METRICS = ("llamacpp:requests_processing", "llamacpp:requests_deferred")


@dataclass
class Check:
    index: int
    phase: str
    figures: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_command(args: argparse.Namespace, port: int) -> list[str]:
    if args.python_server:
        return [
            sys.executable, "-m", "llama_cpp.server", "--model", str(args.model),
            "--model_alias", "tiny", "--host", "127.0.0.1", "--port", str(port),
            "--n_ctx", "512", "--n_threads", "1", "--verbose", "false",
            # by default a new request cuts the stream being served short
            "--interrupt_requests", "false",
        ]  # fmt: skip
    binary = args.server or shutil.which("llama-server")
    if binary is None:
        raise SystemExit("no llama-server: give --server PATH (llama.cpp's server binary)")
    return [
        binary, "-m", str(args.model), "-a", "tiny", "--host", "127.0.0.1",
        "--port", str(port), "-c", "512", "-np", "4", "-t", "1", "--metrics", "--no-webui",
    ]  # fmt: skip


def start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    print("$", " ".join(cmd), flush=True)
    out = log.open("wb")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(STOP_TIMEOUT_S)


async def wait_ready(base: str, proc: subprocess.Popen[bytes]) -> float:
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as session:
        while time.monotonic() - t0 < READY_TIMEOUT_S:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode}")
            try:
                async with session.get(f"{base}/v1/models", timeout=aiohttp.ClientTimeout(2)) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(0.3)
    raise RuntimeError(f"not ready after {READY_TIMEOUT_S:.0f} s")


def body(max_tokens: int) -> dict[str, Any]:
    return {
        "model": "tiny",
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "ignore_eos": True,  # llama.cpp: a random model may stop at once
        "messages": [{"role": "user", "content": PROMPT}],
    }


async def scrape(base: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(f"{base}/metrics") as r:
        text = await r.text() if r.status == 200 else ""
    found = {}
    for name in METRICS:
        match = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", text, re.M)
        if match:
            found[name] = float(match.group(1))
    return found


def _server(wf: la.Waterfall) -> dict[str, tuple[int, int]]:
    return {
        s.name: (s.start_ns, s.end_ns)
        for c in wf.root.children
        for s in c.children
        if s.source == "server"
    }


def check(index: int, phase: str, raw: la.Waterfall, expect_timings: bool = True) -> Check:
    wf = merge_timings(raw)
    c = Check(index, phase)
    a = wf.attributes
    att = wf.attribution_ns()
    timings = {k[8:]: v for k, v in a.items() if k.startswith("timings.")}
    send, first = wf.stage("send"), wf.first_token_chunk_ns
    c.figures = {
        "status": a.get("server.status"),
        "reason": a.get("server.reason"),
        "error": wf.error,
        "ttft_ms": None if wf.ttft is None else wf.ttft * 1e3,
        "ttfc_ms": None if wf.ttfc is None else wf.ttfc * 1e3,
        "e2e_ms": wf.e2e * 1e3,
        "token_chunks": len(wf.chunk_times_ns),
        "timings": timings,
        "placement_uncertainty_ms": _ms(a.get("server.placement_uncertainty_ns")),
        "attribution_ms": {k: v / MS for k, v in att.items()},
        "reused": wf.connection.reused,
        "stale_discarded": a.get("stale.discarded", 0),
        "stale_retry": a.get("stale.retry_error_type"),
        "stale_retry_sent": a.get("stale.retry_sent"),
        "stale_retry_ms": a.get("stale.retry_ms"),
    }
    if wf.error:
        c.failures.append(f"request failed: {wf.error}")
        return c
    if not expect_timings:
        if sum(att.values()) != wf.e2e_ns:
            c.failures.append("attribution does not sum to e2e")
        if timings or a.get("server.status") != "no server data":
            c.failures.append(f"timings from a server that sends none: {timings}")
        return c
    if "prompt_ms" not in timings or "predicted_ms" not in timings:
        c.failures.append(f"no timings in the response (server.status={a.get('server.status')})")
        return c
    if a.get("server.status") != MERGED or a.get("server.placement") != PLACED_BY_CLIENT:
        c.failures.append(f"not merged: {a.get('server.status')}: {a.get('server.reason')}")
        return c
    if sum(att.values()) != wf.e2e_ns:
        c.failures.append("attribution does not sum to e2e")
    iv = _server(wf)
    prefill = round(timings["prompt_ms"] * MS)
    decode = round(timings["predicted_ms"] * MS)
    if send is None or first is None:
        c.failures.append("no send stage or no token chunk")
        return c
    window = wf.end_ns - send.start_ns
    c.figures["server_sum_ms"] = (prefill + decode) / MS
    c.figures["client_window_ms"] = window / MS
    c.figures["client_first_to_end_ms"] = (wf.end_ns - first) / MS
    if prefill + decode > window:
        c.failures.append(
            f"prefill + decode {(prefill + decode) / MS:.3f} ms > client {window / MS:.3f} ms"
        )
    if "prefill" not in iv or "decode" not in iv:
        c.failures.append(f"server stages missing: {sorted(iv)}")
        return c
    if iv["prefill"][1] > first:
        c.failures.append("prefill ends after the client's first token chunk")
    if iv["decode"][1] > wf.end_ns:
        c.failures.append("decode ends after the client's last byte")
    n = timings.get("predicted_n")
    chunks = len(wf.chunk_times_ns) + _empty_chunks(raw)
    c.figures["predicted_n"] = n
    if n is not None and wf.output_tokens is not None and round(n) < len(wf.chunk_times_ns):
        c.failures.append(f"predicted_n {n:.0f} < {len(wf.chunk_times_ns)} content chunks")
    c.figures["token_chunks_with_empty"] = chunks
    return c


def _empty_chunks(wf: la.Waterfall) -> int:
    return int(wf.first_chunk_ns is not None) + int(wf.last_chunk_ns is not None)


def _ms(ns: object) -> float | None:
    return ns / MS if isinstance(ns, int) else None


async def probe(base: str, args: argparse.Namespace, report: dict[str, Any]) -> list[Check]:
    # llama-server answers "Keep-Alive: timeout=5, max=100" yet closes the connection after a
    # stream: the client finds the closed connection at checkout (or retries once) and dials
    # a new one; the summary counts both (``stale.discarded``, ``stale.retry_*``)
    async with la.Client(base, timeout=120) as client:
        warm = await client.request("/v1/chat/completions", json=body(args.max_tokens))
        report["warmup_e2e_ms"] = warm.e2e * 1e3
        seq = [
            await client.request("/v1/chat/completions", json=body(args.max_tokens))
            for _ in range(args.requests)
        ]
        delay = statistics.median(w.e2e for w in seq) / 2
        scrape_task = asyncio.create_task(_scrape_later(base, delay))
        burst = await asyncio.gather(
            *(
                client.request("/v1/chat/completions", json=body(args.max_tokens))
                for _ in range(args.burst)
            )
        )
        report["metrics_mid_burst"] = await scrape_task
    if args.waterfalls:
        with args.waterfalls.open("w") as out:
            for wf in (*seq, *burst):
                out.write(json.dumps(merge_timings(wf).to_dict()) + "\n")
    expect = not args.python_server
    return [check(i, "seq", w, expect) for i, w in enumerate(seq)] + [
        check(i, "burst", w, expect) for i, w in enumerate(burst)
    ]


async def _scrape_later(base: str, delay: float) -> dict[str, float]:
    await asyncio.sleep(delay)
    return await scrape(base)


def print_table(checks: list[Check]) -> None:
    print(
        f"{'#':>3} {'phase':<6} {'status':<15} {'ttfc':>7} {'ttft':>7} {'e2e':>7} "
        f"{'prefill':>7} {'decode':>7} {'sum':>7} {'window':>7} {'±place':>7}"
    )
    for c in checks:
        f = c.figures
        t = f.get("timings", {})
        print(
            f"{c.index:>3} {c.phase:<6} {f.get('status')!s:<15} {f.get('ttfc_ms') or 0:7.2f} "
            f"{f.get('ttft_ms') or 0:7.2f} {f['e2e_ms']:7.2f} {t.get('prompt_ms', 0):7.2f} "
            f"{t.get('predicted_ms', 0):7.2f} {f.get('server_sum_ms') or 0:7.2f} "
            f"{f.get('client_window_ms') or 0:7.2f} {f.get('placement_uncertainty_ms') or 0:7.2f}"
        )
        for failure in c.failures:
            print(f"    FAIL: {failure}")


def summary(checks: list[Check], report: dict[str, Any]) -> None:
    def med(key: str, phase: str) -> float | None:
        vals = [c.figures[key] for c in checks if c.phase == phase and c.figures.get(key)]
        return statistics.median(vals) if vals else None

    def med_t(key: str, phase: str) -> float | None:
        vals = [
            c.figures["timings"][key]
            for c in checks
            if c.phase == phase and key in c.figures.get("timings", {})
        ]
        return statistics.median(vals) if vals else None

    report["medians"] = {
        phase: {
            "ttfc_ms": med("ttfc_ms", phase),
            "ttft_ms": med("ttft_ms", phase),
            "e2e_ms": med("e2e_ms", phase),
            "prompt_ms": med_t("prompt_ms", phase),
            "predicted_ms": med_t("predicted_ms", phase),
            "placement_uncertainty_ms": med("placement_uncertainty_ms", phase),
        }
        for phase in ("seq", "burst")
    }
    print("medians:", json.dumps(report["medians"], indent=1))
    print("metrics mid-burst:", report.get("metrics_mid_burst"))
    timed = [c for c in checks if c.figures.get("server_sum_ms") is not None]
    ratios = [c.figures["server_sum_ms"] / c.figures["client_window_ms"] for c in timed]
    fits = sum(r <= 1 for r in ratios)
    report["timings"] = {
        "requests": len(checks),
        "with_timings": len(timed),
        "merged": sum(c.figures.get("status") == MERGED for c in checks),
        "sum_within_window": fits,
        "largest_sum_over_window": max(ratios) if ratios else None,
    }
    report["connections"] = {
        "reused": sum(bool(c.figures.get("reused")) for c in checks),
        "stale_discarded": sum(int(c.figures.get("stale_discarded") or 0) for c in checks),
        "retried": sum(c.figures.get("stale_retry") is not None for c in checks),
        "retried_after_sending": sum(c.figures.get("stale_retry_sent") is True for c in checks),
    }
    largest = f"{max(ratios):.3f}" if ratios else "-"
    print(
        f"timings: {len(timed)} of {len(checks)} requests carried them, "
        f"{report['timings']['merged']} merged, prefill + decode within the client's first "
        f"request byte to last response byte for {fits} (largest sum / interval {largest})"
    )
    print(
        "connections: {reused} requests on a reused connection, {stale_discarded} closed "
        "pooled connections found at checkout, {retried} retried ({retried_after_sending} of "
        "them after request bytes had left)".format(**report["connections"])
    )


async def run(args: argparse.Namespace) -> int:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    report: dict[str, Any] = {"model": str(args.model), "python_server": args.python_server}
    proc = start(server_command(args, port), args.log)
    try:
        try:
            report["ready_s"] = await wait_ready(base, proc)
        except RuntimeError as exc:
            print(f"the server did not start: {exc}; log: {args.log}", file=sys.stderr)
            print(args.log.read_text(errors="replace")[-4000:], file=sys.stderr)
            return 2
        print(f"ready in {report['ready_s']:.1f} s")
        checks = await probe(base, args, report)
    finally:
        stop(proc)
    print_table(checks)
    summary(checks, report)
    failed = [c for c in checks if c.failures]
    report["requests"] = [
        {"index": c.index, "phase": c.phase, **c.figures, "failures": c.failures} for c in checks
    ]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str))
    print(f"{len(checks) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="from e2e/build_gguf.py")
    parser.add_argument("--server", default=None, help="llama.cpp's llama-server binary")
    parser.add_argument("--python-server", action="store_true", help="llama-cpp-python's")
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--burst", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--log", type=Path, default=Path("llamacpp-e2e.log"))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--waterfalls", type=Path, default=None)
    sys.exit(asyncio.run(run(parser.parse_args())))


if __name__ == "__main__":
    main()
