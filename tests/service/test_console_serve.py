"""The console gateway mounted in a real `gpuaas serve` (uvicorn), real WebSocket clients.

    serve --console-credentials FILE --console-libvirt-uri test:///default

libvirt's test driver has no console for the allocation's VM: an allowed
handshake is accepted, then closed 4500 and audited (the console itself is
tests/hostnet/test_console.py). The serve guards hold for WebSockets too:
the Host allow-list (421) and the connection cap (503).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from reconciler import cli
from reconciler.service import console
from reconciler.service.consoleauth import token_sha256
from tests.service import consolelab as lab
from tests.service.conftest import Served, serve

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _credentials(tmp_path: Path) -> Path:
    path = tmp_path / "console.json"
    path.write_text(
        json.dumps(
            {
                "credentials": [
                    {
                        "principal": "alice",
                        "role": "tenant",
                        "tenant": lab.TENANT,
                        "token_sha256": token_sha256(lab.TOKENS["tenant"]),
                    },
                    {
                        "principal": "mallory",
                        "role": "tenant",
                        "tenant": "someone-else",
                        "token_sha256": token_sha256(lab.TOKENS["other"]),
                    },
                ]
            }
        )
    )
    path.chmod(0o600)
    return path


def _ws(s: Served, allocation: str = lab.ALLOC) -> str:
    return lab.url(s.url.replace("http://", "ws://"), allocation)


def _refused(
    url: str, headers: dict[str, str] | None = None, sock: socket.socket | None = None
) -> tuple[int, dict[str, str]]:
    with pytest.raises(InvalidStatus) as e:
        connect(url, additional_headers=headers, open_timeout=10, sock=sock)
    resp = e.value.response
    return int(resp.status_code), json.loads(resp.body or b"{}").get("error", {})


@pytest.fixture
def served(db_url: str, tmp_path: Path) -> Iterator[Served]:
    lab.active_allocation(db_url)
    yield from serve(
        db_url, console_credentials=_credentials(tmp_path), console_libvirt_uri="test:///default", max_connections=2
    )


def test_a_tenant_opens_its_console_and_a_foreign_credential_is_refused(served: Served, db_url: str) -> None:
    tenant = {"Authorization": f"Bearer {lab.TOKENS['tenant']}"}
    with (
        connect(_ws(served), additional_headers=tenant, open_timeout=10) as ws,
        pytest.raises(ConnectionClosed) as closed,
    ):
        ws.recv(timeout=10)  # accepted (mounted, authorised); the test driver has no console to stream
    assert closed.value.rcvd is not None and closed.value.rcvd.code == console.CLOSE_FAILED
    status, _ = _refused(_ws(served), {"Authorization": f"Bearer {lab.TOKENS['other']}"})
    assert status == 403
    rows = [(r["principal"], r["outcome"], r["reason"]) for r in lab.sessions(db_url)]
    assert rows[1] == ("mallory", "refused", "not this tenant's allocation")
    assert rows[0][:2] == ("alice", "failed") and "console.unavailable" in rows[0][2]


def test_the_host_allow_list_and_the_connection_cap_hold_for_websockets(served: Served, db_url: str) -> None:
    tenant = {"Authorization": f"Bearer {lab.TOKENS['tenant']}"}
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:  # a page on a rebound name reaching 127.0.0.1
        status, error = _refused(_ws(served).replace(host, "rebound.example"), tenant, sock)
    assert (status, error["code"]) == (421, "serve.host_not_allowed")
    held = [socket.create_connection((host, int(port))) for _ in range(2)]  # idle connections fill the cap
    try:
        for sock in held:
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # a head begun, not finished: the connection stays open
        status, error = _refused(_ws(served), tenant)
        assert (status, error["code"]) == (503, "serve.too_many_connections")
    finally:
        for sock in held:
            sock.close()
    assert lab.sessions(db_url) == []  # refused before the gateway: nothing to audit


def test_without_console_credentials_there_is_no_console_route(db_url: str) -> None:
    for s in serve(db_url):
        status, error = _refused(_ws(s), {"Authorization": f"Bearer {lab.TOKENS['tenant']}"})
        assert (status, error["code"]) == (404, "api.route_not_found")


def test_a_credentials_file_others_can_read_stops_serve(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _credentials(tmp_path)
    path.chmod(0o644)
    assert cli.main(["serve", "--listen", "127.0.0.1:0", "--db-url", db_url, "--console-credentials", str(path)]) != 0
    assert "serve.console_credentials_permissions" in capsys.readouterr().err
