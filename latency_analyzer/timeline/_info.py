"""What a request's connection was: its TLS settlement and its place in the pool."""

from __future__ import annotations

from dataclasses import dataclass

from ._unfrozen import unfrozen

__all__ = ["ConnectionInfo", "TlsInfo", "connection_info"]


@dataclass(frozen=True, slots=True)
class TlsInfo:
    """What the TLS handshake settled (None fields: not known)."""

    version: str | None = None
    cipher: str | None = None
    alpn: str | None = None
    session_reused: bool | None = None
    server_hostname: str | None = None


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """The connection a request travelled on.

    Attributes:
        reused: True when the request took an idle pooled connection (no dns/connect/tls).
        connection_id: a process-unique number per connection, to group requests by connection.
        peer: ``host:port`` of the peer, when known.
        requests_before: how many earlier requests this connection carried.
    """

    reused: bool = False
    connection_id: int | None = None
    peer: str | None = None
    requests_before: int = 0


_OpenConnectionInfo = unfrozen(ConnectionInfo)


def connection_info(
    reused: bool, connection_id: int | None, peer: str | None, requests_before: int
) -> ConnectionInfo:
    """``ConnectionInfo(reused, connection_id, peer, requests_before)`` built in its slots, for
    the connector, which makes one per request (see ``_unfrozen``): an equal instance."""
    info = object.__new__(_OpenConnectionInfo)
    info.reused = reused
    info.connection_id = connection_id
    info.peer = peer
    info.requests_before = requests_before
    info.__class__ = ConnectionInfo
    built: ConnectionInfo = info
    return built
