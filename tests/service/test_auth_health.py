"""Binding, bearer tokens, /healthz and /readyz."""

from __future__ import annotations

import http.client
import json
import socket
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg.types.json import Jsonb

from reconciler import cli
from reconciler.service import api, server
from reconciler.store import connections
from tests.service.conftest import Served, serve

TOKEN = "s3cret-token-0123456789"  # noqa: S105 - a test token


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def guarded(fleet_url: str) -> Iterator[Served]:
    yield from serve(fleet_url, token=TOKEN)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8080", ("127.0.0.1", 8080)),
        (":9000", ("127.0.0.1", 9000)),
        ("9000", ("127.0.0.1", 9000)),
        ("[::1]:8081", ("::1", 8081)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),  # noqa: S104 - parsing only
    ],
)
def test_listen_addresses(text: str, expected: tuple[str, int]) -> None:
    assert server.parse_listen(text) == expected


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.4.5", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),  # noqa: S104
        ("10.0.0.5", False),
        ("::", False),
        ("gpuaas.example", False),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert server.is_loopback(host) is loopback


def test_a_public_bind_needs_a_token(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--listen", "0.0.0.0:0", "--db-url", db_url]) == 1
    assert "error: serve.listen_needs_token:" in capsys.readouterr().err


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660])
def test_a_token_file_others_can_read_is_refused(
    token_file: Path, db_url: str, mode: int, capsys: pytest.CaptureFixture[str]
) -> None:
    token_file.chmod(mode)
    assert cli.main(["serve", "--listen", "127.0.0.1:0", "--token-file", str(token_file), "--db-url", db_url]) == 1
    assert "error: serve.token_file_permissions:" in capsys.readouterr().err


def test_an_empty_or_missing_token_file_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    empty.chmod(0o600)
    for path, code in ((empty, "serve.token_file_invalid"), (tmp_path / "missing", "serve.token_file_unreadable")):
        with pytest.raises(server.ServeError) as e:
            server.load_token(path)
        assert e.value.code == code
    with pytest.raises(server.ServeError) as e:
        server.load_token(tmp_path)
    assert e.value.code in ("serve.token_file_invalid", "serve.token_file_permissions")


def test_a_token_file_too_big_or_not_text_is_refused_unquoted(tmp_path: Path) -> None:
    """A file named by mistake (a private key, a binary) is refused after a bounded read, never quoted."""
    big, binary = tmp_path / "big", tmp_path / "binary"
    big.write_text("SECRETLINE" * 1000)  # 10 KB: past the 4 KiB bound
    binary.write_bytes(b"\xff\xfeSECRET")
    for path in (big, binary):
        path.chmod(0o600)
        with pytest.raises(server.ServeError) as e:
            server.load_token(path)
        assert e.value.code == "serve.token_file_invalid" and "SECRET" not in e.value.message


def test_every_request_but_healthz_needs_the_token(guarded: Served, token_file: Path) -> None:
    assert server.load_token(token_file) == TOKEN
    assert guarded.get("/healthz")[0] == 200
    for path in (
        "/api/v1/allocations",
        "/api/v1/allocations/alloc-0001",
        "/metrics",
        "/readyz",
        "/",
        "/nodes/h200-use1-s01",
    ):
        status, headers, body = guarded.get(path)
        assert status == 401 and json.loads(body)["error"]["code"] == api.UNAUTHORIZED, path
        assert headers["WWW-Authenticate"].startswith("Bearer")
        status, _, body = guarded.get(path, token=TOKEN[:-1] + "X")
        assert status == 401 and json.loads(body)["error"]["code"] == api.TOKEN_INVALID, path
        assert guarded.get(path, token=TOKEN)[0] == 200, path


def test_readyz_is_ready_after_a_reconciliation(served: Served) -> None:
    doc = served.json("/readyz")
    assert doc["ready"] is True and doc["checks"]["database"] is True and doc["checks"]["last_applied_revision"]
    assert served.json("/healthz") == {"status": "ok"}


def test_readyz_without_a_schema(empty_db_url: str) -> None:
    for s in serve(empty_db_url):
        doc = s.json("/readyz", status=503)
        assert doc["ready"] is False and doc["error"]["code"] == "ready.no_schema"
        for path in ("/api/v1/allocations/x", "/api/v1/capacity", "/api/v1/nodes", "/api/v1/usage"):
            assert s.json(path, status=503)["error"]["code"] == api.NO_SCHEMA, path


def test_readyz_and_api_when_the_database_is_gone(tmp_path: Path) -> None:
    gone = f"postgresql://postgres@/nothing?host={tmp_path}&port=5432"
    for s in serve(gone):
        assert s.get("/healthz")[0] == 200
        doc = s.json("/readyz", status=503)
        assert doc["error"]["code"] == "ready.db_unreachable" and doc["checks"]["database"] is False
        status, headers, body = s.get("/api/v1/allocations")
        assert status == 503 and json.loads(body)["error"]["code"] == api.DB_UNAVAILABLE and "Retry-After" in headers


def test_readyz_when_reconciliation_is_old(fleet_url: str) -> None:
    with connections.connect(fleet_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE reconciliations SET finished_at = finished_at - interval '2 hours',"
            " started_at = started_at - interval '2 hours'"
        )
    for s in serve(fleet_url, max_reconcile_age_s=3600):
        doc = s.json("/readyz", status=503)
        assert doc["error"]["code"] == "ready.reconciliation_stale" and doc["checks"]["last_applied_age_s"] > 7000
    for s in serve(fleet_url, max_reconcile_age_s=3 * 3600):
        assert s.json("/readyz")["ready"] is True


def test_readyz_when_reconciliation_keeps_failing(fleet_url: str) -> None:
    with connections.connect(fleet_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO reconciliations (revision, source, reconciler, started_at, finished_at, result,"
            " errors) VALUES ('abc', 'watch', 'test:1', now() - interval '10 minutes',"
            " now() - interval '10 minutes', 'error', %s)",
            (Jsonb([{"code": "db.unavailable", "message": "connection refused"}]),),
        )
    for s in serve(fleet_url, failing_grace_s=3600, head_grace_s=3600):  # failing, but not for long enough
        assert s.json("/readyz")["checks"]["failing"]["failures"] == 1
    for s in serve(fleet_url, failing_grace_s=60):
        doc = s.json("/readyz", status=503)
        assert doc["error"]["code"] == "ready.reconciliation_failing" and "db.unavailable" in doc["error"]["message"]


def test_every_connection_it_accepts_sends_without_delay(served: Served) -> None:
    """TCP_NODELAY on each accepted connection. The listening socket was made with protocol 0, and asyncio
    sets the option only on sockets that say IPPROTO_TCP: every request after the first on a keep-alive
    connection then waited about 40 ms (the response's last segment held back until the client's delayed
    ACK), which is what the bench's 44 ms p50 for a cached document was."""
    where = urllib.parse.urlsplit(served.url)
    client = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port, timeout=60)
    try:
        for _ in range(2):  # the second on the same connection
            client.request("GET", "/healthz")
            assert client.getresponse().read()
        accepted = [c.transport.get_extra_info("socket") for c in served.httpd._server.server_state.connections]
        assert accepted, "the server holds no connection"
        assert all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in accepted)
    finally:
        client.close()
