"""HTTP listeners the host side runs (guest marker, metrics, the lab image server), bounded.

The standard library's ThreadingHTTPServer starts a thread per connection
with no cap, and its handler's `timeout` bounds each read, not the
connection: a client sending one byte every few seconds holds a thread for
good. `BoundedServer` caps concurrent connections (one over the cap is
closed at once, unread) and gives every connection a total deadline, after
which its socket is shut down whatever the handler is waiting for.
`host_allowed` is the Host allow-list of a listener a browser could reach
(DNS rebinding: a page of another origin resolving its own name to us).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Collection
from http.server import ThreadingHTTPServer
from typing import Any

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


class BoundedServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer with at most `max_connections` at once, each cut after `deadline_s`."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: Any,
        *,
        max_connections: int = 32,
        deadline_s: float = 10.0,
        bind_and_activate: bool = True,
    ) -> None:
        self.max_connections, self.deadline_s = max_connections, deadline_s
        self._slots = threading.BoundedSemaphore(max_connections)
        self.refused = 0  # connections closed because the cap was reached
        self.cut = 0  # connections shut down at their deadline
        super().__init__(address, handler, bind_and_activate=bind_and_activate)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)  # over the cap: closed unread, no thread started
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        timer = threading.Timer(self.deadline_s, self._cut, (request,))
        timer.daemon = True
        timer.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            timer.cancel()
            self._slots.release()

    def _cut(self, request: socket.socket) -> None:
        """The connection's time is up: a read or write it is blocked in returns (EOF or an error)."""
        self.cut += 1
        with contextlib.suppress(OSError):
            request.shutdown(socket.SHUT_RDWR)


def host_name(header: str | None) -> str | None:
    """The name of a `Host` header without its port (`[::1]:80` -> `::1`), lowercased; None when absent."""
    if not header:
        return None
    value = header.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else None
    name, sep, port = value.rpartition(":")
    return name if sep and port.isdigit() else value


def host_allowed(header: str | None, allowed: Collection[str]) -> bool:
    """Whether a request's `Host` names this listener (`*` in `allowed`: any name)."""
    if "*" in allowed:
        return True
    name = host_name(header)
    return name is not None and name.rstrip(".") in allowed
