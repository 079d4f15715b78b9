"""End to end against a real vLLM on CPU: spans over OTLP/HTTP merged into client waterfalls.

    python e2e/run_vllm.py --model DIR [--requests 10] [--burst 10] [--json OUT]

1. an ``OTLPHttpReceiver`` on 127.0.0.1 (a free port);
2. vLLM's OpenAI server on 127.0.0.1 (a free port) with ``--otlp-traces-endpoint`` pointing at
   it, ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf``, ``HF_HUB_OFFLINE=1``,
   ``VLLM_CPU_KVCACHE_SPACE=1``; its log goes to ``--log``;
3. one warm-up request, then ``--requests`` sequential streamed chat requests through
   ``latency_analyzer.Client`` (each carries a ``traceparent``), ``amerge`` with a 10 s grace;
4. a burst of ``--burst`` concurrent requests, with one ``GET /metrics`` scrape mid-burst
   (``vllm:num_requests_running`` / ``_waiting``), merged likewise;
5. with ``--concurrency 1,4,16``: at each level, ``--load-requests`` requests (at least 2 per
   stream) with that many streams in flight, ``/metrics`` scraped every 100 ms by
   ``latency_analyzer.metrics.Scraper`` and joined to each request's start (queue depth
   ``vllm_waiting@start``, KV-cache usage ``vllm_kv_cache@start``); merged and checked as above;
6. vLLM is stopped (SIGTERM to its process group, SIGKILL after 30 s) whatever happened.

Checks, per request: ``server.status == "merged"`` with the ``vllm`` schema; the attribution
sums to e2e to the nanosecond; the true clock offset (0: same host, same wall clock) lies within
the reported offset ± uncertainty; on the client's clock, the server's arrival is after the client
began to send, ``server_queue`` and ``prefill`` end before the client's first token (inside
TTFT), and ``decode`` ends before the client's last token. Exit status 1 if any check fails,
2 if vLLM does not start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
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
from latency_analyzer.analysis import WaterfallSet
from latency_analyzer.merge import MERGED, amerge
from latency_analyzer.metrics import Scraper, Target, join
from latency_analyzer.server import OTLPHttpReceiver, SpanStore, map_request

READY_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0
MS = 1e6


@dataclass
class Check:
    """One request's figures and the checks that failed for it."""

    index: int
    phase: str
    figures: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_vllm(
    model: Path, port: int, endpoint: str, log: Path, extra: list[str]
) -> subprocess.Popen[bytes]:
    """vLLM's OpenAI API server in its own process group (so every child can be stopped)."""
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_HOST_IP": "127.0.0.1",  # the engine's internal message queues stay on loopback
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model),
        "--served-model-name", "tiny",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--max-model-len", "512",
        "--otlp-traces-endpoint", endpoint,
        *extra,
    ]  # fmt: skip
    print("$", " ".join(cmd), flush=True)
    out = log.open("wb")
    return subprocess.Popen(
        cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )


def stop_vllm(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, SIGKILL it after ``STOP_TIMEOUT_S``."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(STOP_TIMEOUT_S)


def tree_rss_mb(pid: int) -> float | None:
    """Resident memory of the server and its children (psutil comes with vLLM)."""
    try:
        import psutil
    except ImportError:
        return None
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
        return float(sum(p.memory_info().rss for p in procs)) / 2**20
    except psutil.Error:
        return None


async def wait_ready(base: str, proc: subprocess.Popen[bytes]) -> float:
    """Seconds until ``GET /health`` answers 200. Raises RuntimeError if vLLM exits first."""
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as session:
        while time.monotonic() - t0 < READY_TIMEOUT_S:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {proc.returncode} before it was ready")
            try:
                async with session.get(f"{base}/health", timeout=aiohttp.ClientTimeout(2)) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(0.5)
    raise RuntimeError(f"vLLM not ready after {READY_TIMEOUT_S:.0f} s")


def special_token_ids(model: Path) -> list[int]:
    """The tokenizer's special tokens (they stream as empty content: suppressed in requests)."""
    data = json.loads((model / "tokenizer.json").read_text())
    return sorted(int(t["id"]) for t in data.get("added_tokens", []) if t.get("special"))


def body(max_tokens: int, prompt: str, suppress: list[int] | None = None) -> dict[str, Any]:
    # ignore_eos: a random model may stop at once; a fixed token count keeps TPOT comparable
    return {
        "model": "tiny",
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
        "ignore_eos": True,
        # greedy, a random model may emit one special token forever. No per-request "seed":
        # vLLM 0.32 on CPU then runs a burst nearly one request at a time (seen here)
        "temperature": 1.0,
        "messages": [{"role": "user", "content": prompt}],
        # OpenAI's logit_bias: a special token would stream as an empty delta, and the client's
        # decode window (content-carrying chunks) would then end before the server's
        "logit_bias": {str(i): -100 for i in suppress or ()},
    }


PROMPT = "why is the first token slow when the queue is long and the cache is cold"


async def scrape_metrics(base: str) -> dict[str, float]:
    """One ``GET /metrics``: the vllm gauges of requests running and waiting."""
    async with aiohttp.ClientSession() as session, session.get(f"{base}/metrics") as r:
        text = await r.text()
    found = {}
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} ([0-9.eE+-]+)$", text, re.M)
        if match:
            found[name] = float(match.group(1))
    return found


def server_intervals(wf: la.Waterfall, store: SpanStore) -> dict[str, tuple[int, int]]:
    """The server's stages of ``wf`` on the client's perf clock, with the merge's offset."""
    offset = wf.attributes.get("server.offset_ns")
    stages = map_request(store.trace(str(wf.attributes["trace_id"])), str(wf.attributes["span_id"]))
    if stages is None or not isinstance(offset, int) or wf.anchor is None:
        return {}
    anchor = wf.anchor
    out = {
        s.name: (anchor.to_perf_ns(s.start_ns - offset), anchor.to_perf_ns(s.end_ns - offset))
        for s in stages.stages
    }
    if stages.arrival_ns is not None:
        arrival = anchor.to_perf_ns(stages.arrival_ns - offset)
        out["arrival"] = (arrival, arrival)
    return out


def check(index: int, phase: str, wf: la.Waterfall, store: SpanStore) -> Check:
    """The figures of one merged waterfall and the checks it fails."""
    c = Check(index, phase)
    a = wf.attributes
    att = wf.attribution()
    send, first, last = wf.stage("send"), wf.first_token_ns, wf.last_token_ns
    c.figures = {
        "status": a.get("server.status"),
        "schema": a.get("server.schema"),
        "error": wf.error,
        "ttft_ms": None if wf.ttft is None else wf.ttft * 1e3,
        "tpot_ms": None if wf.tpot is None else wf.tpot * 1e3,
        "e2e_ms": wf.e2e * 1e3,
        "output_tokens": wf.output_tokens,
        # fewer than output_tokens: vLLM merged deltas for a consumer that fell behind
        "content_chunks": len(wf.chunk_times_ns),
        "offset_ms": _ms(a.get("server.offset_ns")),
        "uncertainty_ms": _ms(a.get("server.offset_uncertainty_ns")),
        "clamped": bool(a.get("server.offset_clamped", False)),
        "contradicted": a.get("server.contradicted"),
        "contradicted_by_ms": {
            k[len("server.contradicted.") : -3]: v / MS
            for k, v in a.items()
            if k.startswith("server.contradicted.") and k.endswith("_ns") and isinstance(v, int)
        },
        "server_ttft_ms": _s_ms(a.get("server.gen_ai.latency.time_to_first_token")),
        "attribution_ms": {k: v * 1e3 for k, v in att.items()},
    }
    if wf.error:
        c.failures.append(f"request failed: {wf.error}")
        return c
    if a.get("server.status") != MERGED or a.get("server.schema") != "vllm":
        c.failures.append(f"server.status={a.get('server.status')} schema={a.get('server.schema')}")
        return c
    # vLLM runs on this host and stamps spans with the same wall clock: the true offset is 0
    offset, unc = a.get("server.offset_ns"), a.get("server.offset_uncertainty_ns")
    if isinstance(offset, int) and isinstance(unc, int) and abs(offset) > unc:
        c.failures.append(f"same host, yet offset {offset / MS:+.3f} ms is beyond ± {unc / MS:.3f}")
    if sum(wf.attribution_ns().values()) != wf.e2e_ns:
        c.failures.append("attribution does not sum to e2e")
    if send is None or first is None or last is None:
        c.failures.append(
            f"client stages missing: send={send is not None} first token={first is not None} "
            f"last token={last is not None} (status {wf.status}, {wf.output_tokens} tokens)"
        )
        return c
    iv = server_intervals(wf, store)
    c.figures["client_windows_ms"] = {
        "ttft": [0.0, (first - wf.start_ns) / MS],
        "decode": [(first - wf.start_ns) / MS, (last - wf.start_ns) / MS],
    }
    c.figures["server_on_client_clock_ms"] = {
        k: [(s - wf.start_ns) / MS, (e - wf.start_ns) / MS] for k, (s, e) in iv.items()
    }
    # The merge's offset is known to ± its uncertainty, so a server stage may sit up to that
    # much off; the vLLM mapping's decode end (API server's first-token instant + the engine's
    # decode time) is not one of the instants that bracket the offset and is checked this way.
    slack = a.get("server.offset_uncertainty_ns")
    slack = slack if isinstance(slack, int) else 0
    rules = [
        ("arrival", 0, send.start_ns, +1, "server arrival before the client sent"),
        ("server_queue", 1, first, -1, "server_queue ends after the client's first token"),
        ("prefill", 0, send.start_ns, +1, "prefill starts before the client sent"),
        ("prefill", 1, first, -1, "prefill ends after the client's first token"),
        ("decode", 0, first, -1, "server decode starts after the client's first token"),
        ("decode", 1, last, -1, "server decode ends after the client's last token"),
    ]
    for stage, edge, bound, sign, message in rules:
        if stage not in iv:
            if stage != "server_queue":  # vLLM may report no queue time at all
                c.failures.append(f"no server {stage}")
            continue
        beyond = (bound - iv[stage][edge]) if sign > 0 else (iv[stage][edge] - bound)
        if beyond > 0:
            note = f"{message} by {beyond / MS:.3f} ms (uncertainty {slack / MS:.3f} ms)"
            (c.failures if beyond > slack else c.notes).append(note)
    return c


def _ms(ns: object) -> float | None:
    return ns / MS if isinstance(ns, int) else None


def _s_ms(s: object) -> float | None:
    return s * 1e3 if isinstance(s, (int, float)) else None


def print_table(checks: list[Check]) -> None:
    head = (
        f"{'#':>3} {'phase':<6} {'status':<8} {'chunks':>6} {'ttft':>7} {'tpot':>6} {'e2e':>7} "
        f"{'queue':>6} {'prefill':>7} {'decode':>7} {'network':>7} {'offset±unc':>16}  "
        "server queue..prefill end / client TTFT end, server decode / client decode window"
    )
    print(head)
    for c in checks:
        f = c.figures
        att: dict[str, float] = f.get("attribution_ms", {})
        iv = f.get("server_on_client_clock_ms", {})
        win = f.get("client_windows_ms", {})
        g = {k: float(att.get(k, 0.0)) for k in ("server_queue", "prefill", "decode", "network")}

        offset = (
            f"{f['offset_ms']:+.3f}±{f['uncertainty_ms']:.3f}"
            if f.get("offset_ms") is not None
            else "-"
        )
        where = ""
        if "prefill" in iv and win:
            q0 = iv.get("server_queue", iv["prefill"])[0]
            d = iv.get("decode", [0.0, 0.0])
            where = (
                f"[{q0:.2f}..{iv['prefill'][1]:.2f}] ≤ {win['ttft'][1]:.2f}; "
                f"[{d[0]:.2f}..{d[1]:.2f}] vs [{win['decode'][0]:.2f}..{win['decode'][1]:.2f}]"
            )
        print(
            f"{c.index:>3} {c.phase:<6} {f.get('status')!s:<8} "
            f"{f.get('content_chunks', 0):>3}/{f.get('output_tokens') or 0:<2} "
            f"{f.get('ttft_ms') or 0:7.2f} "
            f"{f.get('tpot_ms') or 0:6.2f} {f['e2e_ms']:7.2f} {g['server_queue']:6.2f} "
            f"{g['prefill']:7.2f} {g['decode']:7.2f} {g['network']:7.2f} {offset:>16}  {where}"
        )
        for failure in c.failures:
            print(f"    FAIL: {failure}")
        for note in c.notes:
            print(f"    within uncertainty: {note}")


async def run(args: argparse.Namespace) -> int:
    store = SpanStore()
    report: dict[str, Any] = {"model": str(args.model)}
    async with OTLPHttpReceiver(store) as receiver:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc = start_vllm(args.model, port, receiver.endpoint, args.log, args.vllm_arg)
        try:
            try:
                report["ready_s"] = await wait_ready(base, proc)
            except RuntimeError as exc:
                print(f"vLLM did not start: {exc}; log: {args.log}", file=sys.stderr)
                print(args.log.read_text(errors="replace")[-4000:], file=sys.stderr)
                return 2
            report["rss_mb_ready"] = tree_rss_mb(proc.pid)
            print(f"vLLM ready in {report['ready_s']:.1f} s, RSS {report['rss_mb_ready']:.0f} MB")
            checks = await probe(base, store, args, report)
            report["rss_mb_after"] = tree_rss_mb(proc.pid)
        finally:
            stop_vllm(proc)
        report["receiver"] = {"accepted": receiver.accepted, "rejected": receiver.rejected}
    print_table(checks)
    failed = [c for c in checks if c.failures]
    report["requests"] = [
        {"index": c.index, "phase": c.phase, **c.figures, "failures": c.failures, "notes": c.notes}
        for c in checks
    ]
    summary(checks, report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    print(f"{len(checks) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


async def probe(
    base: str, store: SpanStore, args: argparse.Namespace, report: dict[str, Any]
) -> list[Check]:
    suppress = special_token_ids(args.model)
    lag = asyncio.create_task(loop_lag(report))
    try:
        return await _probe(base, store, args, report, suppress)
    finally:
        lag.cancel()


async def loop_lag(report: dict[str, Any]) -> None:
    """The client loop's worst lateness: a stalled loop stamps arriving bytes late, in a heap.

    On a small shared machine the client may not get a core; this says how far to trust the
    client's stamps (``report["client_loop_max_lag_ms"]``).
    """
    key = "client_loop_max_lag_ms"
    while True:
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        late_ms = (time.perf_counter() - t - 0.001) * 1e3
        report[key] = max(report.get(key, 0.0), late_ms)  # the caller may reset it to 0


async def _probe(
    base: str,
    store: SpanStore,
    args: argparse.Namespace,
    report: dict[str, Any],
    suppress: list[int],
) -> list[Check]:
    async with la.Client(base, timeout=120) as client:
        warm = await client.request(
            "/v1/chat/completions", json=body(args.max_tokens, PROMPT, suppress)
        )
        report["warmup_e2e_ms"] = warm.e2e * 1e3
        report["client_loop_max_lag_ms"] = 0.0  # from here on: the measured requests
        seq = [
            await client.request(
                "/v1/chat/completions", json=body(args.max_tokens, PROMPT, suppress)
            )
            for _ in range(args.requests)
        ]
        e2e = statistics.median(w.e2e for w in seq)
        # one scrape, one sequential e2e into the burst: by then every request has arrived
        # and none can have finished (a batch of 10 decodes slower than one request)
        t0 = time.perf_counter_ns()
        metrics_task = asyncio.create_task(_scrape_later(base, e2e, t0))
        burst = await asyncio.gather(
            *(
                client.request("/v1/chat/completions", json=body(args.max_tokens, PROMPT, suppress))
                for _ in range(args.burst)
            )
        )
        report["metrics_mid_burst"] = await metrics_task
        report["burst_ends_ms"] = sorted((w.end_ns - t0) / MS for w in burst)
    merged_seq = await amerge(seq, store, grace=10.0)
    merged_burst = await amerge(list(burst), store, grace=10.0)
    if args.waterfalls:
        with args.waterfalls.open("w") as out:
            for wf in (*merged_seq, *merged_burst):
                out.write(json.dumps(wf.to_dict()) + "\n")
    checks = [check(i, "seq", wf, store) for i, wf in enumerate(merged_seq)]
    checks += [check(i, "burst", wf, store) for i, wf in enumerate(merged_burst)]
    for level in args.concurrency:
        checks += await _load_level(base, store, args, report, suppress, level)
    return checks


async def _load_level(
    base: str,
    store: SpanStore,
    args: argparse.Namespace,
    report: dict[str, Any],
    suppress: list[int],
    level: int,
) -> list[Check]:
    """``level`` streams in flight; the scrape joined to each request's start."""
    n = max(args.load_requests, 2 * level)
    gate = asyncio.Semaphore(level)
    scraper = Scraper([Target(f"{base}/metrics", name="vllm")], interval=0.1)

    async def one(client: la.Client) -> la.Waterfall:
        async with gate:
            return await client.request(
                "/v1/chat/completions", json=body(args.max_tokens, PROMPT, suppress)
            )

    async with scraper, la.Client(base, timeout=120, limit=level) as client:
        wfs = await asyncio.gather(*(one(client) for _ in range(n)))
    merged = await amerge(list(wfs), store, grace=10.0)
    ws = WaterfallSet()
    for wf in merged:
        ws.add(wf)
    cols = join(ws, scraper.series, "vllm", at=("start",))
    phase = f"c{level}"
    checks = [check(i, phase, wf, store) for i, wf in enumerate(merged)]
    for i, c in enumerate(checks):
        for key in ("vllm_waiting@start", "vllm_running@start", "vllm_kv_cache@start"):
            if key in cols:
                value = float(cols[key][i])
                c.figures[key] = None if value != value else value
    report.setdefault("load", {})[phase] = _level_summary(checks)
    return checks


def _level_summary(checks: list[Check]) -> dict[str, Any]:
    def med(get: Any) -> float | None:
        vals = [v for c in checks if (v := get(c)) is not None]
        return statistics.median(vals) if vals else None

    return {
        "requests": len(checks),
        "merged": sum(c.figures.get("status") == MERGED for c in checks),
        "degraded": sum(bool(c.figures.get("contradicted")) for c in checks),
        "ttft_ms": med(lambda c: c.figures.get("ttft_ms")),
        "server_queue_ms": med(lambda c: c.figures["attribution_ms"].get("server_queue", 0.0)),
        "waiting_at_start": med(lambda c: c.figures.get("vllm_waiting@start")),
        "waiting_at_start_max": max(
            (c.figures.get("vllm_waiting@start") or 0.0 for c in checks), default=None
        ),
        "kv_cache_at_start": med(lambda c: c.figures.get("vllm_kv_cache@start")),
    }


async def _scrape_later(base: str, delay: float, t0: int) -> dict[str, Any]:
    await asyncio.sleep(delay)
    start = time.perf_counter_ns()
    found = await scrape_metrics(base)
    end = time.perf_counter_ns()
    return {"sent_ms": (start - t0) / MS, "answered_ms": (end - t0) / MS, **found}


def summary(checks: list[Check], report: dict[str, Any]) -> None:
    def med(phase: str, key: str) -> float | None:
        vals = [
            c.figures[key] for c in checks if c.phase == phase and c.figures.get(key) is not None
        ]
        return statistics.median(vals) if vals else None

    def med_att(phase: str, key: str) -> float | None:
        vals = [c.figures["attribution_ms"].get(key, 0.0) for c in checks if c.phase == phase]
        return statistics.median(vals) if vals else None

    out = {}
    for phase in ("seq", "burst"):
        out[phase] = {
            "ttft_ms": med(phase, "ttft_ms"),
            "tpot_ms": med(phase, "tpot_ms"),
            "e2e_ms": med(phase, "e2e_ms"),
            "server_ttft_ms": med(phase, "server_ttft_ms"),
            **{
                f"{k}_ms": med_att(phase, k)
                for k in (
                    "server_queue",
                    "prefill",
                    "decode",
                    "network",
                    "preprocess",
                    "postprocess",
                )
            },
        }
    report["medians"] = out
    print("medians:", json.dumps(out, indent=1, default=lambda x: x))
    print("metrics mid-burst:", report.get("metrics_mid_burst"))
    print(f"client event loop: worst lateness {report.get('client_loop_max_lag_ms', 0):.1f} ms")
    for phase, level in report.get("load", {}).items():
        print(f"load {phase}:", json.dumps(level))
    ends = report.get("burst_ends_ms") or [0.0]
    print(f"burst requests ended {ends[0]:.1f}..{ends[-1]:.1f} ms after the burst began")
    phases = list(dict.fromkeys(c.phase for c in checks))
    merged = {
        p: [c.figures.get("status") == MERGED for c in checks if c.phase == p] for p in phases
    }
    report["merged"] = {p: [sum(m), len(m)] for p, m in merged.items()}
    degraded = [
        f"{c.phase} #{c.index}: {c.figures['contradicted']} "
        + ", ".join(f"{k} +{v:.2f} ms" for k, v in c.figures.get("contradicted_by_ms", {}).items())
        for c in checks
        if c.figures.get("contradicted")
    ]
    report["degraded"] = degraded
    total = sum(sum(m) for m in merged.values())
    print(
        f"merged {total} of {len(checks)} requests ("
        + ", ".join(f"{p} {sum(m)}/{len(m)}" for p, m in merged.items())
        + f"); degraded (a server bound contradicted the client, left out): {len(degraded)}"
    )
    for line in degraded:
        print(f"  degraded {line}")
    print(
        f"vLLM ready {report.get('ready_s', 0):.1f} s, RSS {report.get('rss_mb_ready')} MB at "
        f"ready, {report.get('rss_mb_after')} MB after; "
        f"warm-up e2e {report.get('warmup_e2e_ms', 0):.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="from e2e/build_model.py")
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--burst", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--log", type=Path, default=Path("vllm-e2e.log"))
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument("--waterfalls", type=Path, default=None, help="merged waterfalls, JSONL")
    parser.add_argument("--vllm-arg", action="append", default=[], help="extra vLLM argument")
    parser.add_argument(
        "--concurrency",
        type=lambda text: [int(x) for x in text.split(",") if x],
        default=[],
        help="load levels, e.g. 1,4,16 (streams in flight)",
    )
    parser.add_argument("--load-requests", type=int, default=16, help="requests per level")
    sys.exit(asyncio.run(run(parser.parse_args())))


if __name__ == "__main__":
    main()
