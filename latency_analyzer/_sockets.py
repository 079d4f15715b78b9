"""Our socket objects by file descriptor, found again from the asyncio transport over one.

A transport's ``socket`` extra is a ``TransportSocket`` view, not the object asyncio reads and
writes; a socket class of our own registers each instance here so the protocol on top can
reach it (its stamps) from the transport. A leaf: it imports nothing of the package.
"""

from __future__ import annotations

import socket
import weakref
from typing import Any, Generic, TypeVar

__all__ = ["SocketRegistry"]

S = TypeVar("S", bound=socket.socket)


class SocketRegistry(Generic[S]):
    """Live sockets of one class by file descriptor (weakly held)."""

    __slots__ = ("_by_fd",)

    def __init__(self) -> None:
        self._by_fd: weakref.WeakValueDictionary[int, S] = weakref.WeakValueDictionary()

    def add(self, sock: S) -> None:
        """Register ``sock`` under its file descriptor (a reused descriptor replaces it)."""
        self._by_fd[sock.fileno()] = sock

    def get(self, fd: int) -> S | None:
        """The registered socket last given descriptor ``fd``, if still alive (it may have
        closed since: its ``fileno()`` is then -1)."""
        return self._by_fd.get(fd)

    def of(self, transport: Any) -> S | None:
        """The registered socket under ``transport`` (through TLS too), if there is one."""
        if transport is None:
            return None
        sock = transport.get_extra_info("socket")
        if sock is None:
            return None
        try:
            return self._by_fd.get(sock.fileno())
        except OSError:  # closed already
            return None
