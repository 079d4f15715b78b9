"""A load run on asyncio's eager loop beside the same run on the batching loop, in one run.

    python benchmarks/bench_batching.py --out bench-results/batching.json [--rounds 3] [--quick]

``latency_analyzer.load.run`` drives the test-bed server (a child process) on two event loops,
alternating round by round: ``eager`` (asyncio's own loop, ``read_batching = 0``) and
``batched`` (``capture.batching``, the scenario's default window). Workloads: ``flat_c64``
(64 streams of 256 tokens, the server writing flat out) and ``paced_c100`` (100 streams of 64
tokens, 20 ms apart). Per loop and workload, the medians over rounds of:

* ``client_cpu_s``: this process's CPU over the run (``getrusage``); the server's is
  ``server_cpu_s`` (its process, read before and after);
* ``wall_s`` and ``tokens_per_s`` (tokens the waterfalls counted, over the wall time);
* ``blocked``: the client thread's voluntary context switches (each a sleep the kernel had to
  wake it from);
* ``multi_event_read_share``: reads that carried more than one SSE event (their earlier
  events then carry a later segment's stamp) out of all body reads;
* ``read_lag_p99_ms``: the run's read lag P99 (how late bytes were read after they came).

The ratios (batched ÷ eager) are the result. The run's ``result.client`` health is kept too.

``jitter``: what batching costs in precision. A sender process writes 8-byte messages, each
holding its ``perf_counter_ns`` just before the send, on 64 loopback connections at
exponential gaps (mean 10 ms per connection, so some of one connection's messages come close
together); the reader stamps each read with the kernel (our ``StampedSocket``). Per loop
(eager, the default window, 1 and 2 ms): P50/P99/P99.9/max of stamp − sent and the share over
200 µs. A message read together with a later one of its connection carries the later one's
stamp: that, and loopback, is all the difference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from latency_analyzer.capture import batching
from latency_analyzer.capture._wire import StampedSocket
from latency_analyzer.load import Scenario, run
from latency_analyzer.testing import LLMServer

WORKLOADS = {
    # name: (decode s per token, tokens, concurrency, requests)
    "flat_c64": (0.0, 256, 64, 256),
    "paced_c100": (0.02, 64, 100, 400),
}


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _proc_cpu(pid: int) -> float:
    """CPU seconds of process ``pid`` (``/proc/PID/stat``: utime and stime, in clock ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _blocked() -> int:
    with open("/proc/thread-self/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches"):
                return int(line.split()[1])
    return 0


def _reads(path: Path) -> tuple[int, int]:
    reads = multi = 0
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get("kind") == "wf":
            reads += row["wf"].get("reads", 0)
            multi += row["wf"].get("multi_event_reads", 0)
    return reads, multi


def one(sc: Scenario, window: float, server: int, out: Path) -> dict[str, Any]:
    s0 = _proc_cpu(server)
    c0, b0, t0 = _cpu(), _blocked(), time.perf_counter()
    result = batching.run(run(sc, path=out), window)
    wall = time.perf_counter() - t0
    cpu, blocked = _cpu() - c0, _blocked() - b0
    server_cpu = _proc_cpu(server) - s0
    reads, multi = _reads(out)
    tokens = float(result.set.values("output_tokens").sum())
    lag = result.client.read_lag or {}
    return {
        "client_cpu_s": round(cpu, 4),
        "server_cpu_s": round(server_cpu, 4),
        "wall_s": round(wall, 4),
        "tokens_per_s": round(tokens / wall, 1),
        "blocked": blocked,
        "multi_event_read_share": round(multi / reads, 4) if reads else None,
        "read_lag_p99_ms": round(lag["p99_s"] * 1e3, 3) if lag else None,
        "ok": result.set.counts()["ok"],
        "client": result.client.to_dict(),
    }


_SENDER = """
import random, socket, struct, sys, time
port, n, mean, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
for c in conns:
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rng, t0, due = random.Random(2), time.monotonic() + 0.05, []
for i in range(n):
    t = t0
    while t < t0 + seconds:
        t += rng.expovariate(1 / mean)
        due.append((t, i))
for at, i in sorted(due):
    time.sleep(max(0.0, at - time.monotonic()))
    conns[i].send(struct.pack("@q", time.perf_counter_ns()))
"""


def jitter_once(
    window: float, streams: int = 64, mean: float = 0.010, seconds: float = 3.0
) -> list[int]:
    """Stamp − sent (ns) of every message, on a loop of ``window`` (0: asyncio's own)."""
    loop = batching.new_event_loop(window)
    errors: list[int] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        args = [str(port), str(streams), str(mean), str(seconds)]
        sender = subprocess.Popen([sys.executable, "-c", _SENDER, *args])
        done = loop.create_future()
        left = [streams]

        def on_read(sock: StampedSocket) -> None:
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                return
            if not data:
                loop.remove_reader(sock.fileno())
                sock.close()
                left[0] -= 1
                if not left[0]:
                    done.set_result(None)
                return
            stamp = sock.wire.read_kernel_ns
            errors.extend(stamp - sent for (sent,) in struct.iter_unpack("@q", data))

        for _ in range(streams):
            conn, _ = listener.accept()
            sock = StampedSocket(fileno=conn.detach())
            sock.setblocking(False)
            loop.add_reader(sock.fileno(), on_read, sock)
    try:
        loop.run_until_complete(asyncio.wait_for(done, seconds + 30))
    finally:
        sender.wait()
        loop.close()
    return errors


def jitter(quick: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    default = Scenario(url="http://127.0.0.1:1/", requests=1).read_batching
    for label, window in (("eager", 0.0), ("default", default), ("1ms", 0.001), ("2ms", 0.002)):
        errors = sorted(jitter_once(window, seconds=1.0 if quick else 3.0))

        out[label] = {
            "window_s": window,
            "messages": len(errors),
            "stamp_minus_sent_us": {
                name: round(errors[int(p * (len(errors) - 1))] / 1e3, 1)
                for name, p in (("p50", 0.5), ("p99", 0.99), ("p999", 0.999))
            },
            "max_us": round(errors[-1] / 1e3, 1),
            "share_over_200us": round(sum(e > 200_000 for e in errors) / len(errors), 4),
        }
    return out


def measure(rounds: int, quick: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    window = Scenario(url="http://127.0.0.1:1/", requests=1).read_batching
    with tempfile.TemporaryDirectory() as tmp:
        for name, (decode, tokens, conc, requests) in WORKLOADS.items():
            requests = requests // 4 if quick else requests
            bed = LLMServer(decode=decode, prefill=decode, tokens=tokens)
            runs: dict[str, list[dict[str, Any]]] = {"eager": [], "batched": []}
            with bed.run_in_subprocess() as llm:
                server = llm.pid
                sc = Scenario.from_dict(
                    {
                        "url": llm.url + "/v1/chat/completions",
                        "model": "testbed-model",
                        "concurrency": conc,
                        "requests": requests,
                        "timeout": 120.0,
                        "templates": [{"max_tokens": tokens, "prompt_tokens": 16}],
                    }
                )
                one(sc, 0.0, server, Path(tmp) / "warm.jsonl")  # imports, first dials
                for r in range(rounds):
                    order = [("eager", 0.0), ("batched", window)]
                    for label, w in order if r % 2 == 0 else order[::-1]:
                        runs[label].append(one(sc, w, server, Path(tmp) / f"{label}.jsonl"))
            med = {
                label: {
                    key: statistics.median(x[key] for x in rs if x[key] is not None)
                    for key in rs[0]
                    if isinstance(rs[0][key], (int, float))
                }
                for label, rs in runs.items()
            }
            ratios = {
                key: round(med["batched"][key] / med["eager"][key], 3)
                for key in ("client_cpu_s", "server_cpu_s", "wall_s", "tokens_per_s", "blocked")
                if med["eager"].get(key)
            }
            out[name] = {"median": med, "ratios_batched_over_eager": ratios, "runs": runs}
    return {"window_s": window, "rounds": rounds, "workloads": out, "jitter": jitter(quick)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results/batching.json"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a quarter of the requests")
    args = parser.parse_args()
    started = time.perf_counter()
    result = {
        "benchmark": "batching",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        **measure(args.rounds, args.quick),
    }
    result["wall_s"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for label, j in result["jitter"].items():
        print(
            f"jitter {label}: stamp - sent {j['stamp_minus_sent_us']} us, max {j['max_us']},"
            f" over 200 us {j['share_over_200us']:.2%}"
        )
    for name, w in result["workloads"].items():
        print(name, json.dumps(w["ratios_batched_over_eager"]))
        for label, m in w["median"].items():
            keep = ("client_cpu_s", "server_cpu_s", "wall_s", "tokens_per_s", "blocked")
            keep += ("multi_event_read_share", "read_lag_p99_ms")
            print(f"  {label}: " + ", ".join(f"{k} {m[k]}" for k in keep if k in m))


if __name__ == "__main__":
    main()
