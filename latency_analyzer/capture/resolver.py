"""A dnspython resolver for aiohttp: a chosen nameserver (``HOST:PORT``) or the system's.

In system mode ``/etc/hosts`` is honoured first, as getaddrinfo would. IP literals never reach
a resolver (aiohttp skips it). Failures raise ``OSError`` with a readable message, which aiohttp
turns into ``ClientConnectorDNSError``; the connector times each request's wait.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from pathlib import Path

import dns.asyncresolver
import dns.exception
import dns.rdata
import dns.resolver
from aiohttp.abc import AbstractResolver, ResolveResult

from ..errors import UsageError

__all__ = ["DnsResolver", "parse_nameserver", "read_hosts_file"]


def parse_nameserver(spec: str) -> tuple[str, int]:
    """``"127.0.0.1:5354"``, ``"[::1]:53"`` or ``"10.0.0.2"`` → (address, port)."""
    host, port = spec, 53
    if spec.startswith("["):
        host, _, rest = spec[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") else 53
    elif spec.count(":") == 1:
        host, port_s = spec.split(":")
        port = int(port_s)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise UsageError(
            f"resolver must be an IP address with an optional port, got {spec!r}"
        ) from None
    return host, port


def read_hosts_file(path: str | Path = "/etc/hosts") -> dict[str, list[str]]:
    """Name → addresses from a hosts file (missing file: empty)."""
    table: dict[str, list[str]] = {}
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return table
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 2:
            for name in fields[1:]:
                table.setdefault(name.lower().rstrip("."), []).append(fields[0])
    return table


class DnsResolver(AbstractResolver):
    """Resolves with dnspython so every lookup is a real query we can time.

    Args:
        nameserver: ``"HOST:PORT"`` to ask one server; None for the system's configuration.
        timeout: seconds before a lookup fails (``lifetime`` in dnspython terms).
        hosts_file: path of a hosts file consulted first in system mode (None: skip it).
    """

    def __init__(
        self,
        nameserver: str | None = None,
        *,
        timeout: float = 5.0,
        hosts_file: str | None = "/etc/hosts",
    ) -> None:
        if nameserver is None:
            self._resolver = dns.asyncresolver.Resolver()
            self._hosts = read_hosts_file(hosts_file) if hosts_file else {}
        else:
            address, port = parse_nameserver(nameserver)
            self._resolver = dns.asyncresolver.Resolver(configure=False)
            self._resolver.nameservers = [address]
            self._resolver.port = port
            self._hosts = {}
        self._resolver.lifetime = timeout
        self.nameserver = nameserver
        _warm_up()

    async def resolve(
        self, host: str, port: int = 0, family: int = socket.AF_INET
    ) -> list[ResolveResult]:
        name = host.lower().rstrip(".")
        if name in self._hosts:
            addresses = self._hosts[name]
        else:
            addresses = await self._query(host, family)
        results = [_result(host, a, port) for a in addresses if _family_ok(a, family)]
        if not results:
            raise OSError(f"DNS: no address for {host!r} of the requested family")
        return results

    async def _query(self, host: str, family: int) -> list[str]:
        """A and AAAA in parallel (as getaddrinfo does); A first, so IPv4 is tried first."""
        by_family: dict[int, list[str]] = {socket.AF_INET: ["A"], socket.AF_INET6: ["AAAA"]}
        types = by_family.get(family, ["A", "AAAA"])
        answers = await asyncio.gather(*(self._one(host, t) for t in types), return_exceptions=True)
        addresses = [a for answer in answers if isinstance(answer, list) for a in answer]
        if addresses:
            return addresses
        failure = next((a for a in answers if isinstance(a, OSError)), None)
        raise failure or OSError(f"DNS: no A/AAAA records for {host!r}")

    async def _one(self, host: str, rdtype: str) -> list[str]:
        try:
            answer = await self._resolver.resolve(host, rdtype, search=False)
        except dns.resolver.NXDOMAIN:
            raise OSError(f"DNS: {host!r} does not exist (NXDOMAIN)") from None
        except (dns.resolver.NoAnswer, dns.resolver.NoNameservers):
            return []
        except dns.exception.Timeout:
            raise OSError(
                f"DNS: no answer for {host!r} within {self._resolver.lifetime} s"
            ) from None
        return [r.address for r in answer]

    async def close(self) -> None:
        return None


def _warm_up() -> None:
    """Load what dnspython loads lazily on its first lookup (its asyncio backend, the A/AAAA
    record classes): otherwise the first request's ``dns`` stage counts our imports."""
    import dns.asyncbackend
    import dns.rdataclass
    import dns.rdatatype

    dns.asyncbackend.get_backend("asyncio")
    for rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA, dns.rdatatype.CNAME):
        dns.rdata.get_rdata_class(dns.rdataclass.IN, rdtype)  # type: ignore[no-untyped-call]


def _family_ok(address: str, family: int) -> bool:
    version = ipaddress.ip_address(address).version
    return family in (0, socket.AF_UNSPEC) or (family == socket.AF_INET) == (version == 4)


def _result(host: str, address: str, port: int) -> ResolveResult:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    return {
        "hostname": host,
        "host": address,
        "port": port,
        "family": family,
        "proto": 0,
        "flags": socket.AI_NUMERICHOST,
    }
