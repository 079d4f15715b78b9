"""What kernel receive stamps cost, and what they buy: stamp − capture with them on and off.

1. Cost, side by side in one run: a read of one 200-byte chunk on loopback TCP with
   ``recvmsg`` + ``SO_TIMESTAMPNS`` (our ``StampedSocket``) against a plain ``recv`` (median
   ns per read, interleaved), and the client's CPU per warm streamed request with kernel
   stamps on and off.
2. Precision: 100 concurrent streams (20 ms per token) in one client, against a packet
   capture of the same run (tcpdump on ``lo``, needs root): P50/P99/max of token stamp −
   capture, with kernel stamps on and off (userspace stamps: when our loop read the bytes),
   beside the client thread's CPU time and its time waiting for a CPU (the host's load): a
   reader kept off the CPU lets the kernel merge queued segments, whose stamps then say the
   newest one's arrival. ``--realtime`` runs the client under SCHED_RR.

    python benchmarks/bench_stamps.py --out bench-results/stamps.json [--quick]
        [--streams-only] [--realtime]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import socket
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import latency_analyzer as la
from latency_analyzer.capture import _wire
from latency_analyzer.load._monitor import schedstat
from latency_analyzer.testing import LLMServer
from latency_analyzer.testing._priority import realtime
from latency_analyzer.testing.pcap import Flow, PacketCapture, tcpdump_missing
from latency_analyzer.timeline import process_anchor

BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


@contextmanager
def _kernel_stamps(on: bool) -> Iterator[None]:
    saved = _wire._UNSUPPORTED
    _wire._UNSUPPORTED = saved if on else "kernel stamps switched off for the benchmark"
    try:
        yield
    finally:
        _wire._UNSUPPORTED = saved


#: what asyncio's plain socket transport asks its socket for on every read
READ_SIZE: int = getattr(asyncio.selector_events._SelectorSocketTransport, "max_size", 256 * 1024)


def read_cost(reads: int) -> dict[str, Any]:
    """Median ns per read of one queued 200-byte chunk: stamped vs plain, interleaved, each
    asked for what asyncio asks (``READ_SIZE``)."""
    chunk = b"x" * 200
    with socket.create_server(("127.0.0.1", 0)) as srv:
        stamped = _wire.StampedSocket(socket.AF_INET, socket.SOCK_STREAM)
        plain = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        times: dict[str, list[int]] = {"stamped": [], "plain": []}
        with stamped, plain:
            peers = []
            for sock in (stamped, plain):
                sock.connect(srv.getsockname())
                peers.append(srv.accept()[0])
            for _ in range(reads):
                for name, sock, peer in (
                    ("stamped", stamped, peers[0]),
                    ("plain", plain, peers[1]),
                ):
                    peer.sendall(chunk)
                    while True:  # the chunk is queued before we time the read
                        try:
                            got = len(sock.recv(1, socket.MSG_PEEK))
                        except BlockingIOError:
                            got = 0
                        if got:
                            break
                    t = time.perf_counter_ns()
                    data = sock.recv(READ_SIZE)
                    times[name].append(time.perf_counter_ns() - t)
                    assert len(data) == len(chunk)
            for peer in peers:
                peer.close()
    stamped_ns = statistics.median(times["stamped"])
    plain_ns = statistics.median(times["plain"])
    return {
        "reads": reads,
        "read_size": READ_SIZE,
        "stamped_ns_per_read": stamped_ns,
        "plain_ns_per_read": plain_ns,
        "ratio": stamped_ns / plain_ns,
    }


async def request_cost(url: str, requests: int, rounds: int) -> dict[str, Any]:
    """Client CPU per warm streamed request (8 tokens), kernel stamps on vs off, alternating."""
    cpu: dict[str, list[float]] = {"kernel": [], "userspace": []}
    for _ in range(rounds):
        for mode in ("kernel", "userspace"):
            with _kernel_stamps(mode == "kernel"):
                async with la.Client(url) as client:
                    await client.request("/health")
                    t = time.process_time()
                    for _ in range(requests):
                        wf = await client.request("/v1/chat/completions", json=BODY)
                        assert wf.ok and wf.clock_source == mode, (wf.error, wf.clock_source)
                    cpu[mode].append((time.process_time() - t) / requests)
    kernel, user = statistics.median(cpu["kernel"]), statistics.median(cpu["userspace"])
    return {
        "requests_per_round": requests,
        "rounds": rounds,
        "kernel_cpu_us_per_request": kernel * 1e6,
        "userspace_cpu_us_per_request": user * 1e6,
        "ratio": kernel / user,
    }


def _token_times(flow: Flow) -> list[int]:
    return [process_anchor().to_perf_ns(epoch) for epoch in flow.content_event_ns()]


async def streams_vs_capture(streams: int, tokens: int, on: bool) -> dict[str, Any]:
    """``streams`` concurrent paced streams; token stamps against the capture."""
    server = LLMServer(prefill=0.040, decode=0.020, tokens=tokens)
    with server.run_in_subprocess() as llm, _kernel_stamps(on):
        with PacketCapture(llm.port) as cap:
            async with la.Client(llm.url, limit=streams) as client:

                async def one(i: int) -> la.Waterfall:
                    body = {**BODY, "messages": [{"role": "user", "content": f"stream-{i}"}]}
                    return await client.request("/v1/chat/completions", json=body)

                cpu0, wait0 = schedstat() or (None, None)
                wfs = await asyncio.gather(*(one(i) for i in range(streams)))
                cpu1, wait1 = schedstat() or (None, None)
    flows = {}
    for flow in cap.flows():
        found = re.search(rb"stream-(\d+)", flow.data("out"))
        if found:
            flows[int(found.group(1))] = flow
    errors, clean, flagged = [], [], 0
    for i, wf in enumerate(wfs):
        truth = _token_times(flows[i])
        shared = set(wf.shared_read_chunks)
        for k, (ours, t) in enumerate(zip(wf.chunk_times_ns, truth, strict=True)):
            errors.append(ours - t)
            if k not in shared:
                clean.append(abs(ours - t))
        flagged += len(shared)
    ordered = sorted(abs(e) for e in errors)
    clean.sort()
    lags = sorted(wf.read_lag_max_ns or 0 for wf in wfs)
    return {
        "kernel_stamps": on,
        "clock_source": sorted({str(wf.clock_source) for wf in wfs}),
        "tokens": len(errors),
        "capture_dropped": cap.dropped,
        "abs_error_p50_us": ordered[len(ordered) // 2] / 1e3,
        "abs_error_p99_us": ordered[int(0.99 * (len(ordered) - 1))] / 1e3,
        "abs_error_max_us": ordered[-1] / 1e3,
        "tokens_flagged_shared_read": flagged,
        "unflagged_abs_error_p99_us": clean[int(0.99 * (len(clean) - 1))] / 1e3 if clean else None,
        "read_lag_max_p50_us": lags[len(lags) // 2] / 1e3 if on else None,
        # what this thread did meanwhile: on CPU, and runnable but waiting for one (the host's
        # other load); a reader kept off the CPU lets the kernel merge queued segments
        "client_cpu_ms": (cpu1 - cpu0) / 1e6 if cpu0 is not None and cpu1 is not None else None,
        "client_runqueue_wait_ms": (
            (wait1 - wait0) / 1e6 if wait0 is not None and wait1 is not None else None
        ),
        "last_token_share_of_errors_over_200us": _last_share(wfs, flows),
    }


def _last_share(wfs: list[la.Waterfall], flows: dict[int, Flow]) -> float | None:
    """Of the tokens more than 0.2 ms off, the share that are their stream's last token (read
    together with the stream's closing events when our loop came late)."""
    off = last = 0
    for i, wf in enumerate(wfs):
        truth = _token_times(flows[i])
        for k, (ours, t) in enumerate(zip(wf.chunk_times_ns, truth, strict=True)):
            if abs(ours - t) > 200_000:
                off += 1
                last += k == len(truth) - 1
    return last / off if off else None


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {}
    if not args.streams_only:
        report["read_cost"] = read_cost(200 if args.quick else 5000)
        print("per read:", report["read_cost"])
        with LLMServer(tokens=8, decode=0.0).run_in_subprocess() as llm:
            n, rounds = (20, 2) if args.quick else (200, 5)
            report["request_cost"] = await request_cost(llm.url, n, rounds)
        print("per request:", report["request_cost"])
    missing = tcpdump_missing()
    if missing is not None:
        report["streams_vs_capture"] = {"skipped": missing}
    else:
        tokens = 8 if args.quick else 64
        report["streams_vs_capture"] = [
            await streams_vs_capture(100, tokens, on) for on in (True, False)
        ]
        for row in report["streams_vs_capture"]:
            print("100 streams:", row)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="bench-results/stamps.json")
    parser.add_argument("--quick", action="store_true", help="small counts (smoke run)")
    parser.add_argument("--streams-only", action="store_true", help="only the 100-stream run")
    parser.add_argument(
        "--realtime", action="store_true", help="this client under SCHED_RR (host load aside)"
    )
    args = parser.parse_args()
    refused = realtime() if args.realtime else None
    if refused is not None:
        print(f"--realtime: {refused}")
    started = time.perf_counter()
    results = asyncio.run(_run(args))
    report = {
        "schema": 1,
        "library_version": la.__version__,
        "utc": datetime.now(timezone.utc).isoformat(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "realtime": bool(args.realtime) and refused is None,
        "load_average": os.getloadavg(),
        **results,
        "runtime_s": time.perf_counter() - started,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
