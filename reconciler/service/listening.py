"""The listening socket and uvicorn's HTTP protocol with a deadline for the request head (slowloris)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn


def _protocol_with_header_deadline(seconds: float) -> type[Any]:
    """uvicorn's HTTP protocol, plus: a request head not complete within `seconds` of its first byte is cut.

    uvicorn times out idle keep-alive connections but not a client that
    sends its head one byte at a time; the per-request `Deadline` (asgi.py)
    starts only once the head is in.
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base
    except ImportError:  # httptools not installed: the pure-Python parser
        from uvicorn.protocols.http.h11_impl import H11Protocol as Base  # type: ignore[assignment]

    class Protocol(Base):
        _head_timer: asyncio.TimerHandle | None = None

        def data_received(self, data: bytes) -> None:
            if self._head_timer is None and seconds > 0:
                self._arm(self.cycle)
            super().data_received(data)

        def _arm(self, cycle: Any) -> None:
            def fire() -> None:
                self._head_timer = None
                if self.cycle is cycle and not self.transport.is_closing():  # no new request began meanwhile
                    self.transport.close()

            self._head_timer = self.loop.call_later(seconds, fire)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().connection_lost(exc)

    return Protocol


class _Uvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # `gpuaas serve` handles SIGTERM/SIGINT itself (schemas/signals.py)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose protocol says TCP.
    # Without it every request after the first on a keep-alive connection (agents, the portal, scrapes)
    # waited about 40 ms for its response's last segment (Nagle against the client's delayed ACK).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(4096)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock
