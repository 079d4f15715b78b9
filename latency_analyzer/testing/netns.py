"""Run a command in a fresh network namespace whose only interface is loopback.

Some peers cannot be told to stay on loopback: Ray's daemons listen on every interface and
its runtime-env agent on the machine's own address, whatever the node address says. Started
inside a namespace of their own they cannot reach or be reached from anything but
127.0.0.1 / ::1, so a test that needs them keeps the loopback-only rule.

    python -m latency_analyzer.testing.netns -- pytest -m ray tests/test_load_ray.py

Needs ``unshare`` (util-linux) and ``ip`` (iproute2). As root the namespace is a plain
network namespace; otherwise an unprivileged user namespace maps the caller to root in it
(kernels that forbid those make this fail with ``unshare``'s own message).
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys

__all__ = ["isolated_command", "main", "only_loopback"]


def only_loopback() -> bool:
    """True when this process sees no network interface but loopback."""
    return {name for _, name in socket.if_nameindex()} == {"lo"}


def isolated_command(argv: list[str]) -> list[str]:
    """The command line that runs ``argv`` in a new namespace with loopback up.

    Raises:
        FileNotFoundError: ``unshare`` or ``ip`` is not installed.
    """
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            raise FileNotFoundError(f"{tool} is not installed (util-linux / iproute2)")
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    script = "ip link set lo up && exec " + shlex.join(argv)
    return ["unshare", *user, "--net", "--", "sh", "-c", script]


def main(args: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if args is None else args)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(
            "usage: python -m latency_analyzer.testing.netns -- COMMAND [ARG ...]", file=sys.stderr
        )
        return 2
    return subprocess.call(isolated_command(argv))


if __name__ == "__main__":
    raise SystemExit(main())
