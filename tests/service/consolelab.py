"""What the console tests share: credentials, an active slice allocation, a gateway under uvicorn.

client (websockets) ──ws://127.0.0.1:PORT/.../console──▶ uvicorn + ConsoleGateway
                                                          │ PostgreSQL: allocations, console_sessions
                                                          └ libvirt (test driver, or a TCG guest)
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from reconciler.plans import Placement
from reconciler.service import console
from reconciler.service.consoleauth import Credentials, Principal, Role, token_sha256
from reconciler.service.consolestreams import ConsoleOpener
from reconciler.store import claims, cleanup, connections, inventory
from tests.claims import util
from tests.claims.conftest import small_fleet
from tests.claims.test_apply import slice_placement

NODE = "node-00000"
ALLOC = "alloc-0000000"  # of tenant-0 (gpuaas_tools.bench.synthetic: tenant-{j % 97})
TENANT = "tenant-0"
TOKENS = {"tenant": "tok-tenant-t", "other": "tok-tenant-other", "operator": "tok-operator"}


def credentials() -> Credentials:
    return Credentials(
        {
            token_sha256(TOKENS["tenant"]): Principal("alice", Role.TENANT, TENANT),
            token_sha256(TOKENS["other"]): Principal("mallory", Role.TENANT, "someone-else"),
            token_sha256(TOKENS["operator"]): Principal("oncall", Role.OPERATOR),
        }
    )


def active_allocation(db_url: str, placement: Placement | None = None) -> None:
    """The synthetic fleet synced, ALLOC placed on NODE slot 3 and reported ready (status active)."""
    with connections.connect(db_url, autocommit=True) as conn:
        inventory.sync(conn, small_fleet())
        assert claims.place(conn, placement or slice_placement(ALLOC, NODE, (3,))).placed
        util.report_vm(conn, NODE, 3, ALLOC, "ready")
        cleanup.absorb(conn)
        assert util.allocation(conn, ALLOC)["status"] == "active"


def sessions(db_url: str) -> list[dict[str, Any]]:
    with connections.connect(db_url, autocommit=True) as conn:
        cur = conn.execute("SELECT * FROM console_sessions ORDER BY id")
        assert cur.description is not None
        return [{d.name: v for d, v in zip(cur.description, row, strict=True)} for row in cur.fetchall()]


@contextlib.contextmanager
def gateway(db_url: str, opener: ConsoleOpener, *, poll_s: float = 0.3) -> Iterator[str]:
    """A uvicorn server on 127.0.0.1 (a port the OS picks) serving the console; yields its ws:// base URL."""
    gw = console.ConsoleGateway(db_url, credentials(), opener, poll_s=poll_s)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(console.app(gw), log_level="warning", ws="websockets-sansio", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the console gateway did not start")
            time.sleep(0.02)
        yield f"ws://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def url(base: str, allocation: str = ALLOC) -> str:
    return f"{base}/api/v1/allocations/{allocation}/console"
