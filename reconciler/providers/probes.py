"""The SSH readiness check of a deployed machine: does TCP port 22 (or the declared port) answer."""

from __future__ import annotations

import socket


class TcpProbe:
    def __init__(self, timeout: float = 2.0) -> None:
        self._timeout = timeout

    def answers(self, host: str, port: int) -> bool:
        try:
            with socket.create_connection((host, port), timeout=self._timeout):
                return True
        except OSError:
            return False


def endpoint(address: str, default_port: int = 22) -> tuple[str, int]:
    """host, host:port or [v6]:port -> (host, port)."""
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else default_port
    if address.count(":") == 1:
        host, port = address.split(":")
        if port.isdigit():
            return host, int(port)
    return address, default_port
