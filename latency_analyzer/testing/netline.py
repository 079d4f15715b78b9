"""A delay and loss line *below* TCP: two network namespaces joined through a userspace process.

The delay proxy terminates TCP, so the kernel on either side never sees its delay: TCP_INFO's
RTT stays at loopback's microseconds. Here the delay is on the packets themselves. The line
process creates two fresh network namespaces, one for a client and one for a server, each with
a TUN device (``la-c`` with 10.200.0.1, ``la-s`` with 10.200.0.2). Every IP packet one side
sends is read from its TUN device, held for ``delay`` seconds (optionally dropped with
probability ``loss``, from a seeded generator) and written into the other side's device, so
each direction costs ``delay`` and the round trip ``2 * delay``, as on a long path.

    python -m latency_analyzer.testing.netline --delay 0.010 --loss 0.02 --seed 1 \\
        --server 'python server.py' --client 'python client.py {server}'

The server command runs in the server's namespace and must print its TCP port as its first
line; the client command then runs in the client's namespace with ``{server}`` replaced by
``10.200.0.2:PORT``. The client's output passes through; the line's own account (packets
forwarded and dropped, the hold each packet really had) is written as JSON to ``--stats``.
The forwarding thread runs under SCHED_FIFO where it may, so that the host's load does not
become the line's jitter.
Both namespaces are anonymous: they vanish with the processes in them, whatever happens.

Needs Linux, root, ``/dev/net/tun`` and ``ip`` (iproute2).
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import json
import os
import random
import select
import shlex
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from ._timing import NETNS_ENV

__all__ = ["CLIENT_ADDRESS", "SERVER_ADDRESS", "LineStats", "main", "run_behind_line"]

CLIENT_ADDRESS, SERVER_ADDRESS = "10.200.0.1", "10.200.0.2"
_CLONE_NEWNET = 0x40000000
_TUNSETIFF = 0x400454CA
_IFF_TUN, _IFF_NO_PI = 0x0001, 0x1000
_QUEUE_LIMIT = 10_000  # packets held per direction; beyond it the line drops, as a router would


@dataclass
class LineStats:
    """What the line did, per direction (``"c2s"``: client to server, ``"s2c"``: back).

    ``holds_ns`` are the real holds (read from one device → written to the other), the truth
    for the delay each packet had.
    """

    forwarded: dict[str, int] = field(default_factory=lambda: {"c2s": 0, "s2c": 0})
    dropped: dict[str, int] = field(default_factory=lambda: {"c2s": 0, "s2c": 0})
    holds_ns: dict[str, list[int]] = field(default_factory=lambda: {"c2s": [], "s2c": []})
    realtime: bool = False  # the forwarding thread ran under SCHED_FIFO

    def summary(self) -> dict[str, object]:
        def median(values: list[int]) -> float | None:
            return statistics.median(values) if values else None

        return {
            "forwarded": self.forwarded,
            "dropped": self.dropped,
            "hold_median_ns": {k: median(v) for k, v in self.holds_ns.items()},
            "hold_max_ns": {k: max(v, default=None) for k, v in self.holds_ns.items()},
            "realtime": self.realtime,
        }


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _new_netns() -> int:
    """Move this thread into a new network namespace; returns an fd that names it."""
    if _libc().unshare(_CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}")
    return os.open("/proc/thread-self/ns/net", os.O_RDONLY)


def _enter_netns(fd: int) -> None:
    if _libc().setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def _tun(name: str, address: str) -> int:
    """A TUN device ``name`` in the current namespace, up, with ``address``/24; its fd."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH22x", name.encode(), _IFF_TUN | _IFF_NO_PI))
    _ip("link", "set", "lo", "up")
    _ip("addr", "add", f"{address}/24", "dev", name)
    _ip("link", "set", name, "up")
    return fd


class _Line:
    """Forwards packets between two TUN fds after ``delay_ns``, dropping a ``loss`` share."""

    def __init__(self, client_fd: int, server_fd: int, delay_ns: int, loss: float, seed: int):
        self._fds = {client_fd: ("c2s", server_fd), server_fd: ("s2c", client_fd)}
        self._delay_ns = delay_ns
        self._loss = loss
        self._rng = random.Random(seed)
        self._queues: dict[int, deque[tuple[int, int, bytes]]] = {fd: deque() for fd in self._fds}
        self._stop_r, self._stop_w = os.pipe()
        self.stats = LineStats()
        self._thread = threading.Thread(target=self._run, name="netline", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        os.write(self._stop_w, b"x")
        self._thread.join(timeout=5)

    def _release(self, now: int) -> int | None:
        """Write every packet that is due; the next due instant, if any is held."""
        next_due = None
        for src, queue in self._queues.items():
            direction, dst = self._fds[src]
            while queue and queue[0][0] <= now:
                _, arrived, packet = queue.popleft()
                try:
                    os.write(dst, packet)
                except OSError:  # the device is gone or full: the packet is lost
                    self.stats.dropped[direction] += 1
                    continue
                self.stats.forwarded[direction] += 1
                self.stats.holds_ns[direction].append(time.perf_counter_ns() - arrived)
            if queue and (next_due is None or queue[0][0] < next_due):
                next_due = queue[0][0]
        return next_due

    def _take(self, src: int) -> None:
        direction, _ = self._fds[src]
        queue = self._queues[src]
        while True:
            try:
                packet = os.read(src, 65536)
            except (BlockingIOError, InterruptedError):
                return
            arrived = time.perf_counter_ns()
            if self._rng.random() < self._loss or len(queue) >= _QUEUE_LIMIT:
                self.stats.dropped[direction] += 1
                continue
            queue.append((arrived + self._delay_ns, arrived, packet))

    def _run(self) -> None:
        self.stats.realtime = _realtime()
        watched = [*self._fds, self._stop_r]
        while True:
            now = time.perf_counter_ns()
            due = self._release(now)
            timeout = None if due is None else max(0.0, (due - time.perf_counter_ns()) / 1e9)
            readable, _, _ = select.select(watched, [], [], timeout)
            if self._stop_r in readable:
                return
            for fd in readable:
                self._take(fd)


def _realtime() -> bool:
    """Run this thread under SCHED_FIFO where allowed: a line that the host's load delays
    would add that load's jitter to every packet. It sleeps in ``select`` between packets."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except (OSError, AttributeError):
        return False
    return True


def _serve_and_run(args: argparse.Namespace) -> int:
    client_ns = _new_netns()
    client_fd = _tun("la-c", CLIENT_ADDRESS)
    _new_netns()
    server_fd = _tun("la-s", SERVER_ADDRESS)
    line = _Line(client_fd, server_fd, round(args.delay * 1e9), args.loss, args.seed)
    line.start()
    env = {**os.environ, NETNS_ENV: os.readlink("/proc/thread-self/ns/net")}
    server = subprocess.Popen(
        shlex.split(args.server), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        _enter_netns(client_ns)
        command = [
            a.replace("{server}", f"{SERVER_ADDRESS}:{port}") for a in shlex.split(args.client)
        ]
        code = subprocess.call(command, timeout=args.timeout)
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        line.stop()
    if args.stats:
        with open(args.stats, "w", encoding="utf-8") as out:
            json.dump({**line.stats.summary(), "holds_ns": line.stats.holds_ns}, out)
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m latency_analyzer.testing.netline")
    parser.add_argument("--delay", type=float, default=0.0, help="one-way delay, seconds")
    parser.add_argument("--loss", type=float, default=0.0, help="drop probability per packet")
    parser.add_argument("--seed", type=int, default=0, help="seed of the loss generator")
    parser.add_argument("--server", required=True, help="server command (prints its port)")
    parser.add_argument("--client", required=True, help="client command; {server} = HOST:PORT")
    parser.add_argument("--timeout", type=float, default=60.0, help="client time limit, s")
    parser.add_argument("--stats", default=None, help="write the line's account here (JSON)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not 0.0 <= args.loss < 1.0 or args.delay < 0:
        print("netline: --loss must be in [0, 1) and --delay >= 0", file=sys.stderr)
        return 2
    return _serve_and_run(args)


def run_behind_line(
    server: list[str],
    client: list[str],
    *,
    delay: float,
    loss: float = 0.0,
    seed: int = 0,
    timeout: float = 60.0,
    stats_path: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``client`` against ``server`` across the line, in a process of its own.

    Returns the line process's result: its stdout is the client's. ``{server}`` in ``client``
    becomes ``HOST:PORT``.
    """
    argv = [
        sys.executable, "-m", "latency_analyzer.testing.netline",
        "--delay", str(delay), "--loss", str(loss), "--seed", str(seed),
        "--timeout", str(timeout), "--server", shlex.join(server), "--client", shlex.join(client),
    ]  # fmt: skip
    if stats_path is not None:
        argv += ["--stats", stats_path]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 20)


if __name__ == "__main__":
    raise SystemExit(main())
