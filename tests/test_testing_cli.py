"""The test bed's own command line and its delay proxy's ends, as a newcomer meets them."""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import sys
from pathlib import Path

import latency_analyzer as la
from latency_analyzer.testing.delay_proxy import _End, _finish


class _GoneTransport(asyncio.Transport):
    """A socket the peer reset: its half-close raises ENOTCONN, as a real one does."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        raise OSError(107, "Transport endpoint is not connected")

    def close(self) -> None:
        self.closed = True


def test_an_end_forwarded_to_a_reset_peer_closes_the_socket_without_an_error() -> None:
    sink = _GoneTransport()
    _finish(sink, _End.EOF)
    assert sink.closed


def test_the_help_says_what_each_option_does() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "latency_analyzer.testing", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    for flag in ("--header-delay", "--prefill", "--decode", "--tokens", "--slots", "--dns-delay"):
        line = next(x for x in proc.stdout.splitlines() if x.strip().startswith(flag))
        assert len(line.split(maxsplit=2)) == 3, f"{flag} has no help text: {line!r}"


def test_it_prints_the_url_to_give_the_cli_and_serves_one_slot_at_a_time() -> None:
    argv = [sys.executable, "-m", "latency_analyzer.testing", "--prefill", "0.05", "--tokens", "1"]
    with subprocess.Popen([*argv, "--slots", "1"], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            first, hint = proc.stdout.readline(), proc.stdout.readline()
            url = first.split()[2]
            assert url.startswith("http://127.0.0.1:") and url.endswith("/v1/chat/completions")
            # the example it prints is a request the server answers (a POST with a body)
            assert f'latency-analyzer probe {url} -d \'{{"messages"' in hint
            argv_hint = shlex.split(hint.split("e.g.", 1)[1])
            exe = str(Path(sys.executable).with_name(argv_hint[0]))
            probe = subprocess.run([exe, *argv_hint[1:], "--json"], capture_output=True, timeout=60)
            assert probe.returncode == 0, probe.stderr
            assert json.loads(probe.stdout)["output_tokens"] == 1
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}

            async def two() -> list[la.Waterfall]:
                return list(await asyncio.gather(*(la.aprobe(url, json=body) for _ in range(2))))

            waits = sorted(wf.ttft for wf in asyncio.run(two()) if wf.ttft is not None)
        finally:
            proc.terminate()
    assert len(waits) == 2
    # One slot: the second request waits for the first one's 50 ms prefill, then its own.
    assert waits[0] >= 0.05 and waits[1] >= 0.1, waits
