"""A cold HTTP/2 request through a 10 ms round trip: our e2e beside curl ``--http2``'s time_total.

nginx (TLS 1.3, HTTP/2) in front of the test bed's HTTP/1.1 server, a delay proxy (5 ms each
way) in its own process in front of nginx. Each round runs the three parts below, their order
rotated from round to round (whoever runs right after curl's process pays ~0.1 ms for the
caches its start-up and exit churned, so no part may always have that place):

* ours: in this process, two new ``Client``s one after the other, one GET ``/health`` each;
  the second's ``e2e`` counts (a warm process opening a new connection);
* curl: one process, two URLs (``localhost`` then ``127.0.0.1``: two hosts, so two new
  connections) joined with ``--next``; the second's ``time_total`` counts (a fresh curl spends
  ~1.5 ms of one-time TLS set-up inside its first handshake).

* floors, in this process, again the second of two new connections each: the least an asyncio
  HTTP/2 client can do (``asyncio.open_connection`` with TLS, ALPN h2, one write of a request
  encoded before the clock starts, reads fed to h2 until the stream ends), and the same over a
  blocking ``SSLSocket``, which wakes straight into OpenSSL with no event loop between, and a
  worker thread that connects, handshakes and sends with blocking calls before the loop reads
  the response. No waterfall, no stamps, no pool: what asyncio, Python's ssl module and h2
  cost here; the thread floor is the way our own dial goes (``capture/_tlsthread.py``).

Reported: medians of each, the medians of the paired differences (ours − curl, ours −
floor, floor − curl for each floor, same round: the headline and the part of it that is ours), the
phases curl reports beside ours (connected, TLS done, first byte), and, with tcpdump (root),
what the wire shows of each side's second connection: SYN → ClientHello, the server's flight →
the client's next segment (its Finished; ours carries the HEADERS too), SYN → the response's last
segment. With ``--realtime`` every process (servers, proxy, curl, this one) runs under SCHED_RR,
so the host's other load does not decide who waits for a CPU.

    python benchmarks/bench_h2_cold.py --out bench-results/h2_cold.json [--rounds 30] [--realtime]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events

import latency_analyzer as la
from latency_analyzer.testing import LLMServer, TestCA
from latency_analyzer.testing._priority import realtime
from latency_analyzer.testing.pcap import Flow, PacketCapture, tcpdump_missing

ONE_WAY = 0.005
# who dials in a round, and the flows each makes in the capture, in its order (a pair each)
_PARTS = {
    "ours": ("ours",),
    "floors": ("floor_asyncio", "floor_blocking", "floor_thread"),
    "curl": ("curl",),
}
_FLOWS = [who for part in _PARTS.values() for who in part]


def _order(round_no: int) -> list[str]:
    """The round's order, rotated each round: a client that runs right after curl's process
    (its start-up and exit churn the CPU's caches) pays for it in OpenSSL's handshake step,
    ~0.1 ms here, so no client may always follow curl, nor always follow the floors."""
    parts = list(_PARTS)
    k = round_no % len(parts)
    return parts[k:] + parts[:k]


def _flow_index(order: list[str]) -> dict[str, int]:
    """Where each side's second connection (the one that counts) is among a round's flows."""
    out, at = {}, 0
    for part in order:
        for who in _PARTS[part]:
            out[who] = at + 1
            at += 2
    return out


TARGET_MS = 0.5
_PROXY = """
import asyncio, sys
from latency_analyzer.testing import DelayProxy

async def main():
    async with DelayProxy("127.0.0.1", int(sys.argv[1]), delay=float(sys.argv[2])) as proxy:
        print(proxy.port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""
_CURL_FORMAT = (
    "%{time_connect} %{time_appconnect} %{time_starttransfer} %{time_total} %{http_version}\n"
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _nginx(tmp: Path, pem: Path, upstream: int, pre: Callable[[], Any] | None) -> tuple[Any, int]:
    port = _free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(
        f"""
        daemon off; master_process off; pid {tmp}/nginx.pid; error_log {tmp}/error.log warn;
        events {{}}
        http {{
          access_log off; client_body_temp_path {tmp}/b; proxy_temp_path {tmp}/p;
          fastcgi_temp_path {tmp}/f; uwsgi_temp_path {tmp}/u; scgi_temp_path {tmp}/s;
          server {{
            listen 127.0.0.1:{port} ssl http2; ssl_protocols TLSv1.3;
            ssl_certificate {pem}; ssl_certificate_key {pem};
            location / {{
              proxy_pass http://127.0.0.1:{upstream}; proxy_http_version 1.1;
              proxy_set_header Connection ""; proxy_buffering off;
            }}
          }}
        }}
        """
    )
    proc = subprocess.Popen(["nginx", "-p", str(tmp), "-c", str(conf)], preexec_fn=pre)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.02)
    proc.kill()
    raise RuntimeError("nginx did not start listening")


async def _ours(url: str, ctx: Any, connections: int) -> list[la.Waterfall]:
    out = []
    for _ in range(connections):
        async with la.Client(ssl=ctx, http2=True) as client:
            out.append(await client.request(url))
    return out


def _encoded(port: int) -> tuple[h2.connection.H2Connection, bytes]:
    """A client's h2 state and its first flight (preface, SETTINGS, one GET), built ahead."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(header_encoding=None))
    conn.initiate_connection()
    authority = f"127.0.0.1:{port}".encode()
    head = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", authority)]
    conn.send_headers(1, [*head, (b":path", b"/health")], end_stream=True)
    return conn, conn.data_to_send()


def _ended(conn: h2.connection.H2Connection, data: bytes) -> bool:
    if not data:
        raise RuntimeError("the server closed before the floor's stream ended")
    return any(isinstance(e, h2.events.StreamEnded) for e in conn.receive_data(data))


def _check_alpn(sslobj: ssl.SSLObject | ssl.SSLSocket) -> None:
    if sslobj.selected_alpn_protocol() != "h2":
        raise RuntimeError("the floor's connection did not negotiate h2")


async def _floor_asyncio(port: int, ctx: ssl.SSLContext) -> float:
    """One cold GET over a bare asyncio TLS stream (µs from the call to the stream's end)."""
    conn, request = _encoded(port)
    t0 = time.perf_counter_ns()
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    writer.write(request)
    try:
        while not _ended(conn, await reader.read(65536)):
            pass
        elapsed = time.perf_counter_ns() - t0
        _check_alpn(writer.get_extra_info("ssl_object"))
    finally:
        writer.close()
    return elapsed / 1e3


def _floor_blocking(port: int, ctx: ssl.SSLContext) -> float:
    """The same over a blocking ``SSLSocket``: no event loop between a wake and OpenSSL."""
    conn, request = _encoded(port)
    t0 = time.perf_counter_ns()
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as asyncio sets it
    with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        sock.sendall(request)
        while not _ended(conn, sock.recv(65536)):
            pass
        elapsed = time.perf_counter_ns() - t0
        _check_alpn(sock)
    return elapsed / 1e3


def _handshake_and_send(port: int, ctx: ssl.SSLContext, request: bytes) -> _TlsOnSocket:
    """Connect, handshake and send ``request`` with blocking socket calls (in a worker thread),
    then hand over the socket, non-blocking, with the TLS state in memory."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    tls = _TlsOnSocket(raw, ctx)
    while True:
        try:
            tls.obj.do_handshake()
            break
        except ssl.SSLWantReadError:
            tls.flush()
            data = raw.recv(65536)
            if not data:
                raise RuntimeError("the server closed during the floor's handshake") from None
            tls.incoming.write(data)
    tls.obj.write(request)
    tls.flush()  # the client's Finished and the request in one send
    raw.setblocking(False)
    return tls


class _TlsOnSocket:
    """A socket and the TLS state driven over it in memory (SSLObject and its two BIOs)."""

    def __init__(self, raw: socket.socket, ctx: ssl.SSLContext) -> None:
        self.raw, self.incoming, self.outgoing = raw, ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self.incoming, self.outgoing, server_hostname="127.0.0.1")

    def flush(self) -> None:
        if self.outgoing.pending:
            self.raw.sendall(self.outgoing.read())

    def read_plain(self) -> bytes:
        data = self.raw.recv(65536)
        if not data:
            raise RuntimeError("the server closed before the floor's stream ended")
        self.incoming.write(data)
        plain = b""
        with contextlib.suppress(ssl.SSLWantReadError):
            while chunk := self.obj.read(65536):
                plain += chunk
        return plain


async def _floor_thread(port: int, ctx: ssl.SSLContext) -> float:
    """A dial whose connect, handshake and request send run in a worker thread (blocking), its
    response read by the event loop: the blocking floor's wake path where it counts, and the
    loop's I/O after."""
    conn, request = _encoded(port)
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter_ns()
    tls = await loop.run_in_executor(None, _handshake_and_send, port, ctx, request)
    done: asyncio.Future[int] = loop.create_future()

    def readable() -> None:
        try:
            plain = tls.read_plain()
            ended = plain and any(
                isinstance(e, h2.events.StreamEnded) for e in conn.receive_data(plain)
            )
        except BlockingIOError:  # woken with nothing to read
            return
        except Exception as exc:  # the floor fails rather than waiting for ever
            if not done.done():
                done.set_exception(exc)
            return
        if ended and not done.done():
            done.set_result(time.perf_counter_ns())

    loop.add_reader(tls.raw.fileno(), readable)
    try:
        elapsed = await done - t0
    finally:
        loop.remove_reader(tls.raw.fileno())
        tls.raw.close()
    _check_alpn(tls.obj)
    return elapsed / 1e3


async def _floors(port: int, ctx: ssl.SSLContext, connections: int) -> dict[str, float]:
    """Each floor's ``connections``-th new connection in a row (µs)."""
    out = {}
    for _ in range(connections):
        out["asyncio"] = await _floor_asyncio(port, ctx)
    for _ in range(connections):  # blocks the loop: nothing else runs in it meanwhile
        out["blocking"] = _floor_blocking(port, ctx)
    for _ in range(connections):
        out["thread"] = await _floor_thread(port, ctx)
    return out


def _curl(port: int, cafile: Path, pre: Callable[[], Any] | None) -> list[float]:
    """curl's phases (µs) of its second connection: connected, TLS done, first byte, total."""
    one = ["--http2", "-s", "--cacert", str(cafile), "-w", _CURL_FORMAT, "-o", "/dev/null"]
    args = ["curl", *one, f"https://localhost:{port}/health", "--next", *one]
    args.append(f"https://127.0.0.1:{port}/health")
    done = subprocess.run(args, preexec_fn=pre, check=True, capture_output=True, text=True)
    fields = done.stdout.splitlines()[1].split()
    if fields[4] != "2":
        raise RuntimeError(f"curl spoke HTTP/{fields[4]}, not 2")
    return [float(x) * 1e6 for x in fields[:4]]


def _phases(wf: la.Waterfall) -> list[float]:
    """Ours, from the request's start (µs): connected, TLS done (our handshake finished),
    first response byte, total."""
    st, t0 = wf.stages, wf.root.start_ns
    tls_done = st["tls"].end_ns + float(st["tls"].attributes.get("client_finish_ms", 0.0)) * 1e6
    return [
        (st["connect"].end_ns - t0) / 1e3,
        (tls_done - t0) / 1e3,
        (st["wait"].end_ns - t0) / 1e3,
        wf.e2e_ns / 1e3,
    ]


def _wire(flow: Flow) -> dict[str, float]:
    out = [p for p in flow.packets if p.src == flow.client and p.size]
    back = [p for p in flow.packets if p.src != flow.client and p.size]
    return {
        "syn_to_client_hello_us": (out[0].time_ns - flow.syn_ns) / 1e3,
        "flight_to_next_client_segment_us": (out[1].time_ns - back[0].time_ns) / 1e3,
        "syn_to_last_response_segment_us": (back[-1].time_ns - flow.syn_ns) / 1e3,
    }


def _median_of(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]} if rows else {}


def run(rounds: int, rt: bool) -> dict[str, Any]:
    pre = realtime if rt else None
    rt_refused = realtime() if rt else None
    ca = TestCA()
    tmp = Path(tempfile.mkdtemp(prefix="la-h2cold-"))
    pem, cafile = ca.server_pem_path(tmp), ca.ca_pem_path(tmp)
    capture = tcpdump_missing() is None
    with LLMServer(tokens=1).run_in_subprocess() as upstream:
        nginx, nginx_port = _nginx(tmp, pem, upstream.port, pre)
        proxy = subprocess.Popen(
            [sys.executable, "-c", _PROXY, str(nginx_port), str(ONE_WAY)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            preexec_fn=pre,
        )
        try:
            assert proxy.stdout is not None
            port = int(proxy.stdout.readline())
            ctx = ca.client_context()
            floor_ctx = ca.client_context()
            floor_ctx.set_alpn_protocols(["h2"])
            url = f"https://127.0.0.1:{port}/health"
            loop = asyncio.new_event_loop()
            loop.run_until_complete(_ours(url, ctx, 2))  # warm this process, as curl's first
            loop.run_until_complete(_floors(port, floor_ctx, 2))
            ours: list[list[float]] = []
            curl: list[list[float]] = []
            floors: list[dict[str, float]] = []
            wire: dict[str, list[dict[str, float]]] = {k: [] for k in _FLOWS}
            for round_no in range(rounds):
                order = _order(round_no)
                with PacketCapture(port) if capture else contextlib.nullcontext() as cap:
                    for part in order:
                        if part == "ours":
                            wf = loop.run_until_complete(_ours(url, ctx, 2))[1]
                        elif part == "floors":
                            floors.append(loop.run_until_complete(_floors(port, floor_ctx, 2)))
                        else:
                            curl.append(_curl(port, cafile, pre))
                if cap is not None:
                    flows = cap.flows()
                    for who, k in _flow_index(order).items():
                        wire[who].append(_wire(flows[k]))
                if not (wf.ok and wf.http_version == "2"):
                    raise RuntimeError(f"our request failed: {wf.error}")
                ours.append(_phases(wf))
            loop.close()
        finally:
            proxy.kill()
            proxy.wait()
            nginx.terminate()
            nginx.wait(5)
            shutil.rmtree(tmp, ignore_errors=True)
    names = ("connected", "tls_done", "first_byte", "total")
    phases = {
        name: {
            "ours_us": statistics.median(o[k] for o in ours),
            "curl_us": statistics.median(c[k] for c in curl),
            "paired_diff_median_us": statistics.median(
                o[k] - c[k] for o, c in zip(ours, curl, strict=True)
            ),
        }
        for k, name in enumerate(names)
    }
    diff_ms = phases["total"]["paired_diff_median_us"] / 1e3
    totals = [o[3] for o in ours]
    floor_s: dict[str, dict[str, float]] = {}
    for kind in ("asyncio", "blocking", "thread"):
        fl = [f[kind] for f in floors]
        floor_s[kind] = {
            "total_us": statistics.median(fl),
            "ours_minus_floor_ms": statistics.median(o - f for o, f in zip(totals, fl, strict=True))
            / 1e3,
            "floor_minus_curl_ms": statistics.median(
                f - c[3] for f, c in zip(fl, curl, strict=True)
            )
            / 1e3,
        }
    return {
        "rounds": rounds,
        "one_way_delay_s": ONE_WAY,
        "realtime": rt and rt_refused is None,
        "realtime_refused": rt_refused,
        "phases_from_start": phases,
        "e2e_minus_curl_total_ms": diff_ms,
        "target_ms": TARGET_MS,
        "target_met": abs(diff_ms) <= TARGET_MS,
        "floor": floor_s,
        "wire": {who: _median_of(rows) for who, rows in wire.items()} if capture else None,
        "wire_skipped": None if capture else tcpdump_missing(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="bench-results/h2_cold.json")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="5 rounds (smoke run)")
    parser.add_argument("--realtime", action="store_true", help="every process under SCHED_RR")
    args = parser.parse_args()
    for binary in ("nginx", "curl"):
        if shutil.which(binary) is None:
            raise SystemExit(f"{binary} is not installed (apt-get install nginx-light curl)")
    started = time.perf_counter()
    result = run(5 if args.quick else args.rounds, args.realtime)
    report = {
        "schema": 1,
        "library_version": la.__version__,
        "utc": datetime.now(timezone.utc).isoformat(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "load_average": os.getloadavg(),
        "runtime_s": time.perf_counter() - started,
        **result,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    for name, p in result["phases_from_start"].items():
        print(
            f"{name:10s} ours {p['ours_us']:8.0f} us  curl {p['curl_us']:8.0f} us  "
            f"paired diff {p['paired_diff_median_us']:+7.0f} us"
        )
    for who, w in (result["wire"] or {}).items():
        print(who, {k: round(v) for k, v in w.items()})
    for kind, fl in result["floor"].items():
        print(
            f"{kind} floor {fl['total_us']:.0f} us: ours - floor {fl['ours_minus_floor_ms']:+.2f} "
            f"ms, floor - curl {fl['floor_minus_curl_ms']:+.2f} ms"
        )
    print(
        f"e2e - curl time_total: {result['e2e_minus_curl_total_ms']:+.2f} ms "
        f"(target within {TARGET_MS} ms) -> {args.out}"
    )


if __name__ == "__main__":
    main()
