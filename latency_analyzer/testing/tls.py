"""Throw-away TLS certificates for the loopback test bed, minted in memory with trustme."""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from pathlib import Path

import trustme

__all__ = ["SERVER_NAMES", "TestCA"]

#: Names and addresses the server certificate is valid for.
SERVER_NAMES = ("localhost", "127.0.0.1", "::1", "*.test", "llm.test")


class TestCA:
    """A private certificate authority and one server certificate it signed.

    The server certificate covers :data:`SERVER_NAMES`. Nothing is written to disk unless a
    ``*_pem_path`` method is called.
    """

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self) -> None:
        self._ca = trustme.CA()
        self._leaf = self._ca.issue_cert(*SERVER_NAMES)

    def server_context(self, alpn: Sequence[str] = ("http/1.1",)) -> ssl.SSLContext:
        """Return a server-side context (TLS 1.2+) with the server certificate.

        Args:
            alpn: ALPN protocols the server offers, in preference order; empty for no ALPN.
        """
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._leaf.configure_cert(context)
        if alpn:
            context.set_alpn_protocols(list(alpn))
        return context

    def client_context(self, alpn: Sequence[str] = ()) -> ssl.SSLContext:
        """Return a client-side context that trusts this CA (and verifies host names).

        Args:
            alpn: ALPN protocols the client offers; empty leaves ALPN unset.
        """
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        self._ca.configure_trust(context)
        if alpn:
            context.set_alpn_protocols(list(alpn))
        return context

    @property
    def ca_pem(self) -> bytes:
        """The CA certificate, PEM-encoded."""
        data: bytes = self._ca.cert_pem.bytes()
        return data

    def ca_pem_path(self, directory: str | Path) -> Path:
        """Write the CA certificate to ``directory`` (for ``--cacert``) and return its path."""
        path = Path(directory) / "latency-analyzer-test-ca.pem"
        path.write_bytes(self.ca_pem)
        return path

    def server_pem_path(self, directory: str | Path) -> Path:
        """Write the server key and certificate chain as one PEM file and return its path.

        Used to hand the certificate to a server running in another process.
        """
        path = Path(directory) / "latency-analyzer-test-server.pem"
        path.write_bytes(self._leaf.private_key_and_cert_chain_pem.bytes())
        return path


def server_context_from_pem(
    pem_path: str | Path, alpn: Sequence[str] = ("http/1.1",)
) -> ssl.SSLContext:
    """Return a server-side context (TLS 1.2+) loaded from a file written by ``server_pem_path``."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(pem_path))
    if alpn:
        context.set_alpn_protocols(list(alpn))
    return context
