"""Every listener the host side runs is bounded (issue 27): a total deadline per connection, a cap on
connections, and the metrics listener answers only for names it serves.

    client ── 1 byte ── 1 byte ── 1 byte ── ...     each read is quick: a per-read timeout never fires
    server ── cut at DEADLINE_S after accept ─┘     (patched short here)
"""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from host_reconciler import imageserver, listening, metrics
from host_reconciler.drivers import guestmarker

Listening = tuple[str, int, listening.BoundedServer]


@contextmanager
def _marker() -> Iterator[Listening]:
    a = guestmarker.Announcements(b"0123456789abcdef0123456789abcdef", port=0)
    a.listen("127.0.0.1")
    try:
        assert a._server is not None
        yield "127.0.0.1", a.port, a._server
    finally:
        a.close()


@contextmanager
def _metrics() -> Iterator[Listening]:
    served = metrics.Server(metrics.AgentMetrics("n"), "127.0.0.1:0")
    try:
        host, _, port = served.url.removeprefix("http://").rpartition(":")
        yield host, int(port), served._httpd
    finally:
        served.close()


@contextmanager
def _images(root: Path) -> Iterator[Listening]:
    with imageserver.ImageServer(root) as srv:
        assert isinstance(srv.httpd, listening.BoundedServer)
        yield "127.0.0.1", srv.port, srv.httpd


LISTENERS = {
    "guest_marker": (guestmarker, _marker),
    "metrics": (metrics, _metrics),
    "image_server": (imageserver, _images),
}


def _closed(sock: socket.socket) -> bool:
    """Whether the server closed (or reset) this connection."""
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


@pytest.mark.parametrize("name", LISTENERS)
def test_a_dribbling_client_is_cut_at_the_deadline(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module, make = LISTENERS[name]
    monkeypatch.setattr(module, "DEADLINE_S", 1.0, raising=False)
    with (
        make(tmp_path) if name == "image_server" else make() as (host, port, _),
        socket.create_connection((host, port), timeout=5) as sock,
    ):
        sock.settimeout(0.3)
        request = f"POST {guestmarker.PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 900\r\n\r\n".encode()
        cut_at = None
        start = time.monotonic()
        for i in range(40):  # 12 s of one byte per 0.3 s at most
            try:
                sock.send(request[i : i + 1] if i < len(request) else b"x")
            except OSError:
                cut_at = time.monotonic() - start
                break
            if _closed(sock):
                cut_at = time.monotonic() - start
                break
        assert cut_at is not None, "the connection was never cut"


@pytest.mark.parametrize("name", LISTENERS)
def test_connections_over_the_cap_are_closed_at_once(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module, make = LISTENERS[name]
    monkeypatch.setattr(module, "MAX_CONNECTIONS", 2, raising=False)
    with make(tmp_path) if name == "image_server" else make() as (host, port, server):
        held = [socket.create_connection((host, port), timeout=5) for _ in range(2)]
        try:
            deadline = time.monotonic() + 30
            while server._slots._value > 0 and time.monotonic() < deadline:
                time.sleep(0.05)  # until both are accepted, each holding its slot
            with socket.create_connection((host, port), timeout=5) as extra:
                extra.settimeout(5)
                with suppress(OSError):
                    extra.send(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert _closed(extra)
        finally:
            for sock in held:
                sock.close()


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("rebind.attacker.example", 421),
        ("rebind.attacker.example:9101", 421),
        ("127.0.0.1", 200),
        ("localhost:9101", 200),
        ("[::1]:9101", 200),
    ],
)
def test_the_metrics_listener_answers_only_for_its_names(host: str, status: int) -> None:
    with _metrics() as (address, port, _):
        conn = http.client.HTTPConnection(address, port, timeout=10)
        try:
            conn.putrequest("GET", "/metrics", skip_host=True)
            conn.putheader("Host", host)
            conn.endheaders()
            assert conn.getresponse().status == status
        finally:
            conn.close()


def test_a_metrics_name_can_be_allowed() -> None:
    served = metrics.Server(metrics.AgentMetrics("n"), "127.0.0.1:0", ["node-7.example"])
    try:
        _, _, port = served.url.rpartition(":")
        conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=10)
        conn.putrequest("GET", "/healthz", skip_host=True)
        conn.putheader("Host", "NODE-7.example:9101")
        conn.endheaders()
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        served.close()
