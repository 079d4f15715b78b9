"""Loopback test bed: servers that inject KNOWN delays, so measurements can be checked.

Everything binds 127.0.0.1 (or ::1) on a free port, is a context manager (``async with`` on the
current loop, ``with x.run_in_thread()`` on a private loop in a daemon thread) and records
ground truth as ``time.perf_counter_ns()`` instants. Delays are exact to a few microseconds
(:func:`sleep_until`), and sequences use absolute deadlines so errors never accumulate.

* :class:`LLMServer`: OpenAI-compatible SSE server (queue, prefill, decode, faults);
  also ``with LLMServer(...).run_in_subprocess() as s`` for a server in its own process.
* :class:`DNSServer`: A/AAAA answers after a fixed delay; NXDOMAIN and dropped names.
* :class:`TestCA`: throw-away CA and server certificate (trustme) with matching contexts.
* :class:`DelayProxy`: TCP proxy adding a one-way delay to every chunk, both ways.
* :class:`H2LLMServer`: the LLM server over HTTP/2 (TLS + ALPN or h2c), with frame-level
  faults (RST_STREAM, GOAWAY, connection close) and a chosen max-concurrent-streams.
* :class:`ALPNLLMServer`: HTTP/2 and HTTP/1.1 on one TLS port, chosen by ALPN, with an
  optional delay before each handshake.
* :class:`TestBed`: DNS + delay proxy + :class:`ALPNLLMServer` in a child process, with
  the child's records as ground truth.

Example::

    import aiohttp
    from latency_analyzer.testing import LLMServer

    async with LLMServer(prefill=0.050, decode=0.010, tokens=8) as server:
        async with aiohttp.ClientSession() as session:
            body = {"model": "m", "messages": [], "stream": True}
            async with session.post(f"{server.url}/v1/chat/completions", json=body) as resp:
                async for line in resp.content:
                    ...
        record = server.records[0]
        ttft_ns = record.first_token_ns - record.received_ns  # ~50 ms, by construction
"""

from ._timing import sleep_until
from .alpn_server import ALPNLLMServer, Handshake
from .bed import TestBed
from .delay_proxy import DelayProxy
from .dns_server import DNSQuery, DNSServer
from .h2_server import H2LLMServer, H2StreamRecord
from .llm import FAULTS, Behavior, LLMServer, RequestRecord, SubprocessLLMServer, token_text
from .tls import SERVER_NAMES, TestCA

__all__ = [
    "FAULTS",
    "SERVER_NAMES",
    "ALPNLLMServer",
    "Behavior",
    "DNSQuery",
    "DNSServer",
    "DelayProxy",
    "H2LLMServer",
    "H2StreamRecord",
    "Handshake",
    "LLMServer",
    "RequestRecord",
    "SubprocessLLMServer",
    "TestBed",
    "TestCA",
    "sleep_until",
    "token_text",
]
