"""A valid exporter's latency while another client floods the same receiver.

1. **Worst payload per byte.** Candidate hostile payloads (at and past the default budgets:
   attributes without keys, minimal spans, empty ``ResourceSpans``, a gzip bomb, JSON) are
   handled as the receiver handles them (inflate, check, decode, store) in this process; the
   one costing the most CPU per byte sent is the flood, per receiver and decode lane (bodies
   up to 64 KiB share the valid export's lane; larger ones have their own).
2. **Flood.** The receiver (OTLP/HTTP, then OTLP/gRPC, defaults) runs in a child process.
   ``--flooders`` child processes each send the flood payload back to back for ``--seconds``,
   while this process sends a valid export (a real vLLM export, 3 spans) every 50 ms and times
   each answer. The same exporter runs first without the flood, side by side.
3. **Memory.** The receiver's peak RSS (``VmHWM``) with the flood, against ``--rss-bound``.

Targets: the valid export's P99 latency under the flood < 100 ms; peak RSS < the bound.

    python benchmarks/bench_receivers.py --out bench-results/receivers.json [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import http.client
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import latency_analyzer as la
from latency_analyzer.server import OTLPHttpReceiver, PayloadError, SpanStore, decode_otlp, inflate

FIXTURE = Path(__file__).resolve().parent.parent / "tests/fixtures/real-servers"
VALID = (FIXTURE / "vllm-0.32-otlp-request-spans.pb").read_bytes()
PROTOBUF, JSON = "application/x-protobuf", "application/json"
MIB = 1024 * 1024
TARGET_P99_MS = 100.0


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes([*out, n])


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _one_span(extra: bytes) -> bytes:
    span = _field(1, b"\x01" * 16) + _field(2, b"\x02" * 8) + extra
    return _field(1, _field(2, _field(2, span)))


def candidates() -> dict[str, tuple[bytes, str, bool]]:
    """name → (body as sent, content type, gzipped)."""
    spans = b"".join(
        _field(2, _field(1, i.to_bytes(16, "big")) + _field(2, (i + 1).to_bytes(8, "big")))
        for i in range(1, 9_990)
    )

    def json_attrs(n: int) -> bytes:
        span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "attributes": [{}] * n}
        return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()

    return {
        # small lane (<= 64 KiB as sent): the costliest bodies an exporter's size allows
        "small_pb_keyless_attributes_64k": (_one_span(b"\x4a\x00" * 32_000), PROTOBUF, False),
        "small_json_empty_attributes_64k": (json_attrs(16_000), JSON, False),
        # large lane
        "pb_keyless_attributes_at_budget": (_one_span(b"\x4a\x00" * 99_000), PROTOBUF, False),
        "pb_minimal_spans_at_budget": (_field(1, _field(2, spans)), PROTOBUF, False),
        "pb_empty_resource_spans_16mib": (b"\x0a\x00" * (8 * MIB - 8), PROTOBUF, False),
        "pb_keyless_attributes_16mib": (_one_span(b"\x4a\x00" * (8 * MIB - 64)), PROTOBUF, False),
        "gzip_bomb_63kb": (gzip.compress(b"\x0a\x00" * (32 * MIB), 9), PROTOBUF, True),
        "json_empty_attributes_at_budget": (json_attrs(33_000), JSON, False),
    }


def cost_per_byte(body: bytes, ctype: str, gz: bool) -> dict[str, Any]:
    """CPU the receiver spends on one such request (min of 3), per byte sent."""
    best, outcome = float("inf"), ""
    for _ in range(3):
        store = SpanStore()
        t = time.process_time()
        try:
            data = inflate(body, 16 * MIB) if gz else body
            store.add(decode_otlp(data, ctype))
            outcome = "accepted"
        except PayloadError as exc:
            outcome = f"refused: {exc.message}"
        best = min(best, time.process_time() - t)
    return {
        "bytes": len(body),
        "cpu_s": best,
        "cpu_ns_per_byte": best * 1e9 / len(body),
        "outcome": outcome,
    }


# -- child processes -----------------------------------------------------------------------------


def serve(kind: str) -> None:
    """Child: a receiver with default settings; prints its port, serves until stdin closes,
    then prints its counters and peak RSS."""

    async def main() -> None:
        store = SpanStore()
        if kind == "http":
            receiver: Any = OTLPHttpReceiver(store)
        else:
            from latency_analyzer.server.otlp_grpc import OTLPGrpcReceiver

            receiver = OTLPGrpcReceiver(store)
        async with receiver:
            print(receiver.port, flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
            stats = {k: getattr(receiver, k) for k in ("accepted", "rejected", "busy")}
            stats |= {"stored_spans": len(store), "store_bytes": store.bytes}
            stats |= _rss()
            print(json.dumps(stats), flush=True)

    asyncio.run(main())


def _rss() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmHWM:", "VmRSS:")):
            out[line.split(":")[0].lower() + "_bytes"] = int(line.split()[1]) * 1024
    return out


def flood(kind: str, port: int, name: str, seconds: float) -> None:
    """Child: send the candidate ``name`` back to back for ``seconds``; print answer counts."""
    body, ctype, gz = candidates()[name]
    counts: dict[str, int] = {}
    end = time.monotonic() + seconds
    if kind == "http":
        headers = {"Content-Type": ctype, **({"Content-Encoding": "gzip"} if gz else {})}
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while time.monotonic() < end:
            try:
                conn.request("POST", "/v1/traces", body=body, headers=headers)
                resp = conn.getresponse()
                resp.read()
                key = str(resp.status)
                if resp.getheader("Connection", "").lower() == "close":
                    conn.close()
            except OSError as exc:
                key = type(exc).__name__
                conn.close()
            counts[key] = counts.get(key, 0) + 1
    else:
        import grpc

        from latency_analyzer.server.otlp_grpc import EXPORT_METHOD

        options = [("grpc.max_send_message_length", 64 * MIB)]
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            raw = channel.unary_unary(EXPORT_METHOD)
            while time.monotonic() < end:
                try:
                    raw(body, timeout=30)
                    key = "OK"
                except grpc.RpcError as exc:
                    key = exc.code().name  # type: ignore[attr-defined]  # grpc.Call's code()
                counts[key] = counts.get(key, 0) + 1
    print(json.dumps(counts), flush=True)


# -- the measuring exporter ----------------------------------------------------------------------


async def _export_loop(kind: str, port: int, seconds: float) -> list[float]:
    """Send the valid export every 50 ms for ``seconds``; latencies in ms (an error: inf)."""
    latencies: list[float] = []
    end = time.monotonic() + seconds
    if kind == "http":
        import aiohttp

        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}/v1/traces"
            while time.monotonic() < end:
                t = time.perf_counter()
                async with session.post(url, data=VALID, headers={"Content-Type": PROTOBUF}) as r:
                    await r.read()
                    ok = r.status == 200
                latencies.append((time.perf_counter() - t) * 1e3 if ok else float("inf"))
                await asyncio.sleep(max(0.0, 0.05 - (time.perf_counter() - t)))
    else:
        import grpc.aio

        from latency_analyzer.server.otlp_grpc import EXPORT_METHOD

        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            raw = channel.unary_unary(EXPORT_METHOD)
            while time.monotonic() < end:
                t = time.perf_counter()
                try:
                    await raw(VALID, timeout=10)
                    latencies.append((time.perf_counter() - t) * 1e3)
                except grpc.aio.AioRpcError:
                    latencies.append(float("inf"))
                await asyncio.sleep(max(0.0, 0.05 - (time.perf_counter() - t)))
    return latencies


def _stats(ms: list[float]) -> dict[str, Any]:
    ordered = sorted(ms)
    if not ordered:
        return {"n": 0}

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(len(ordered) * p))]

    failed = sum(1 for x in ordered if x == float("inf"))
    return {
        "n": len(ordered),
        "failed": failed,
        "p50_ms": q(0.5),
        "p99_ms": q(0.99),
        "max_ms": ordered[-1],
    }


def _child(*args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, __file__, *args]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def run_kind(kind: str, worst: str, flooders: int, seconds: float) -> dict[str, Any]:
    server = _child("--serve", kind)
    assert server.stdout is not None and server.stdin is not None
    port = int(server.stdout.readline())
    baseline = asyncio.run(_export_loop(kind, port, seconds / 2))
    floods = [_child("--flood", kind, str(port), worst, str(seconds)) for _ in range(flooders)]
    time.sleep(0.5)  # the flood is under way before the first measured export
    flooded = asyncio.run(_export_loop(kind, port, seconds - 1.0))
    answers = [json.loads(f.communicate(timeout=120)[0] or "{}") for f in floods]
    server.stdin.close()
    stats = json.loads(server.stdout.readline())
    server.wait(timeout=30)
    return {
        "flood_payload": worst,
        "flooders": flooders,
        "baseline": _stats(baseline),
        "flooded": _stats(flooded),
        "flood_answers": answers,
        "receiver": stats,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="bench-results/receivers.json")
    parser.add_argument("--seconds", type=float, default=8.0, help="flood duration per receiver")
    parser.add_argument(
        "--flooders",
        type=int,
        default=1,
        help="flooding clients (connections). Default: %(default)r",
    )
    parser.add_argument("--rss-bound", type=int, default=512 * MIB, metavar="BYTES")
    parser.add_argument("--quick", action="store_true", help="3 s floods")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--flood", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args.serve)
    if args.flood:
        kind, port, name, seconds = args.flood
        return flood(kind, int(port), name, float(seconds))
    seconds = 3.0 if args.quick else args.seconds
    costs = {name: cost_per_byte(*c) for name, c in candidates().items()}

    def worst(kind: str, lane: str) -> str:
        names = [n for n in costs if n.startswith("small_") == (lane == "small")]
        if kind == "grpc":  # protobuf only; gRPC inflates in C, within max_message
            names = [n for n in names if "_pb_" in f"_{n}" and "gzip" not in n]
        return max(names, key=lambda n: costs[n]["cpu_ns_per_byte"])

    results = {
        f"{kind}_{lane}": run_kind(kind, worst(kind, lane), args.flooders, seconds)
        for kind in ("http", "grpc")
        for lane in ("small", "large")
    }
    targets = {
        kind: {
            "valid_export_p99_ms": r["flooded"].get("p99_ms"),
            "p99_under_100_ms": (r["flooded"].get("p99_ms") or 1e9) < TARGET_P99_MS,
            "peak_rss_bytes": r["receiver"].get("vmhwm_bytes"),
            "rss_under_bound": (r["receiver"].get("vmhwm_bytes") or 1 << 62) < args.rss_bound,
        }
        for kind, r in results.items()
    }
    report = {
        "benchmark": "receivers",
        "library_version": la.__version__,
        "utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "rss_bound_bytes": args.rss_bound,
        "target_p99_ms": TARGET_P99_MS,
        "cost_per_byte": costs,
        "receivers": results,
        "targets": targets,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(targets, indent=2))


if __name__ == "__main__":
    main()
