"""A whole test bed in a child process: DNS, a network delay, a TLS endpoint speaking h2 and 1.1.

:class:`TestBed` starts, in one child process (so none of it shares the caller's GIL or event
loop): a :class:`~latency_analyzer.testing.DNSServer` answering every name after
``dns_delay``, an :class:`~latency_analyzer.testing.ALPNLLMServer` (HTTP/2 and HTTP/1.1 on one
TLS port, ``tls_delay`` before each handshake) and, with ``one_way > 0``, a
:class:`~latency_analyzer.testing.DelayProxy` in front of it. The caller gets a URL with a name
(``llm.test``) that only this bed's DNS server resolves, the ``resolver`` to ask, and the CA
file to trust; :attr:`TestBed.truth` returns the child's own records (``perf_counter_ns`` is
CLOCK_MONOTONIC, shared by every process on the host).

Example::

    with TestBed(dns_delay=0.023, one_way=0.020, prefill=0.018) as bed:
        wf = latency_analyzer.probe(bed.url, resolver=bed.resolver, ssl=bed.client_context())
        truth = bed.truth()   # DNS queries, TLS handshakes, server-side request records
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
import tempfile
import time
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from typing import Any

from ._child import ChildServer, serve_commands
from .alpn_server import ALPNLLMServer
from .delay_proxy import DelayProxy
from .dns_server import DNSServer
from .tls import TestCA, server_context_from_pem

__all__ = ["TestBed"]


class TestBed(ChildServer):
    """DNS + delay proxy + dual-protocol TLS LLM server, in a child process (use as ``with``).

    Args:
        dns_delay: seconds the DNS server waits before each answer.
        one_way: seconds the proxy adds in each direction (0: no proxy); a round trip costs
            twice this, a TLS 1.3 handshake one round trip.
        tls_delay: seconds the server waits before reading each ClientHello.
        protocols: ALPN protocols the server offers, preferred first.
        path: the request path of :attr:`url`.
        **knobs: :class:`~latency_analyzer.testing.Behavior` of the LLM server (``prefill``,
            ``decode``, ``tokens``, ``header_delay`` ...).
    """

    __test__ = False  # not a pytest test class, whatever its name says

    def __init__(
        self,
        *,
        dns_delay: float = 0.0,
        one_way: float = 0.0,
        tls_delay: float = 0.0,
        protocols: Sequence[str] = ("h2", "http/1.1"),
        path: str = "/v1/chat/completions",
        **knobs: Any,
    ) -> None:
        self.ca = TestCA()
        self.path = path
        self._dir = tempfile.TemporaryDirectory(prefix="la-bed-")
        config = {
            "dns_delay": dns_delay,
            "one_way": one_way,
            "tls_delay": tls_delay,
            "protocols": list(protocols),
            "knobs": knobs,
            "tls_pem": str(self.ca.server_pem_path(self._dir.name)),
        }
        super().__init__("bed", config, "the test bed")
        self.cafile = str(self.ca.ca_pem_path(self._dir.name))

    @property
    def resolver(self) -> str:
        """``HOST:PORT`` of the bed's DNS server (``Client(resolver=...)``, ``--resolver``)."""
        return str(self.ready["resolver"])

    @property
    def url(self) -> str:
        """``https://llm.test:PORT/v1/chat/completions``: resolvable through :attr:`resolver`."""
        return f"https://llm.test:{self.port}{self.path}"

    @property
    def ip_url(self) -> str:
        """:attr:`url` with the address instead of the name: no lookup (a DNS cache's case)."""
        return f"https://127.0.0.1:{self.port}{self.path}"

    def client_context(self) -> ssl.SSLContext:
        """A client context trusting the bed's CA."""
        return self.ca.client_context()

    def truth(self) -> dict[str, Any]:
        """What the child recorded: ``dns`` ([received_ns, answered_ns] per query),
        ``handshakes`` (:class:`Handshake` fields), ``h1`` and ``h2`` request records,
        ``relays`` (the delay proxy's :class:`~.delay_proxy.Relay` fields, none without one)
        and ``anchor`` ([perf_counter_ns, time_ns] read together, to place them in epoch
        time)."""
        reply: dict[str, Any] = self._ask("truth")
        return reply

    def close(self) -> None:
        """Stop the child (close its stdin; kill it if it lingers) and remove its files."""
        super().close()
        self._dir.cleanup()


def serve_bed(config_json: str) -> None:
    """Child side of :class:`TestBed` (``python -m latency_analyzer.testing bed CONFIG``)."""
    asyncio.run(_bed_main(json.loads(config_json)))


async def _bed_main(config: Mapping[str, Any]) -> None:
    context = server_context_from_pem(config["tls_pem"], alpn=())
    async with AsyncExitStack() as stack:
        dns = await stack.enter_async_context(DNSServer(delay=config["dns_delay"]))
        llm = await stack.enter_async_context(
            ALPNLLMServer(
                ssl=context,
                protocols=config["protocols"],
                tls_delay=config["tls_delay"],
                **config["knobs"],
            )
        )
        port, proxy = llm.port, None
        if config["one_way"] > 0:
            proxy = DelayProxy(llm.host, llm.port, config["one_way"])
            port = (await stack.enter_async_context(proxy)).port
        ready = {"port": port, "resolver": dns.nameserver}
        await serve_commands(ready, {"truth": lambda: _truth(dns, llm, proxy)})


def _truth(dns: DNSServer, llm: ALPNLLMServer, proxy: DelayProxy | None) -> dict[str, Any]:
    return {
        "anchor": [time.perf_counter_ns(), time.time_ns()],  # this host's two clocks, now
        "dns": [[q.received_ns, q.answered_ns] for q in dns.log],
        "handshakes": [dataclasses.asdict(h) for h in llm.handshakes],
        "h1": [r.to_json() for r in llm.h1.records],
        "h2": [dataclasses.asdict(r) for r in llm.h2.records],
        "relays": [dataclasses.asdict(r) for r in proxy.relays] if proxy is not None else [],
    }
