"""`gpuaas serve` on a real PostgreSQL holding the applied example fleet, plus host reports.

`fleet_url`: a fresh database with examples/fleet applied (`gpuaas apply`),
then what three hosts reported (written as a host would, straight into
host_status / host_slot_status):

    h200-use1-s01  healthy; VM of alloc-0001 provisioning at phase "image";
                   drift on slot 1 (drift.disk.signature_present)
    h200-use1-s02  a malformed drift report (an object, not a list)
    h200-euw1-s01  one node-level finding whose message is HTML, plus a
                   malformed entry (the report is invalid, the finding shown)

`served`: a `gpuaas serve` of that database on 127.0.0.1 and an ephemeral
port (capacity recomputed on every change), shut down after the test.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from reconciler import cli
from reconciler.service import server
from reconciler.store import connections

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet"
DRIFT_NODE = "h200-use1-s01"
DRIFT_SLOT = 1
BROKEN_NODE = "h200-use1-s02"
HTML_NODE = "h200-euw1-s01"
HTML_MESSAGE = "<script>document.title='pwned'</script><b>bold</b>"


def report_hosts(url: str) -> None:
    finding = {
        "code": "drift.disk.signature_present",
        "slot_index": DRIFT_SLOT,
        "message": "a filesystem signature",
        "allocation_id": None,
        "expected": "clean",
        "observed": "ext4",
        "heal": None,
        "subject": None,
    }
    details = {
        "generation": 1,
        "mode": "report",
        "converged": False,
        "pending": [],
        "pass_ms": 12.0,
        "reported_at": "2026-11-20T10:00:00+00:00",
        "vms": [
            {
                "allocation_id": "alloc-0001",
                "name": "gpuaas-alloc-0001",
                "state": "provisioning",
                "phase": "image",
                "phase_timings": {},
                "error": None,
                "hard_stopped": False,
            }
        ],
        "host": {
            "agent_version": "0.1.0",
            "firmware_ready": None,
            "firmware_code": "host.firmware.no_evidence",
            "firmware_evidence": {},
            "bootstrap_state": "reboot_required",
            "bootstrap_checked_at": "2026-11-20T09:00:00+00:00",
            "reboot_required": True,
            "reboot_reasons": ["bootstrap staged changes that take effect at the next boot"],
        },
    }
    html = {"code": "drift.network.problem", "slot_index": None, "message": HTML_MESSAGE}
    with connections.connect(url, autocommit=True) as conn:
        # Rows from before migration 0008 (which refuses malformed reports) must still read: drop its check here.
        conn.execute("ALTER TABLE host_status DROP CONSTRAINT IF EXISTS host_status_drift_shape")
        rows = [
            (DRIFT_NODE, True, [finding], details),
            (BROKEN_NODE, True, {"not": "a list"}, {}),
            (HTML_NODE, True, [html, "garbage"], {}),
        ]
        for node, healthy, drift, det in rows:
            conn.execute(
                "INSERT INTO host_status (node_name, observed_generation, healthy, drift, details)"
                " VALUES (%s, 1, %s, %s, %s)",
                (node, healthy, Jsonb(drift), Jsonb(det)),
            )
        conn.execute(
            "INSERT INTO host_slot_status (node_name, slot_index, allocation_id, vm_state, drift)"
            " VALUES (%s, 0, 'alloc-0001', 'provisioning', '[]'), (%s, %s, NULL, 'absent', %s)",
            (DRIFT_NODE, DRIFT_NODE, DRIFT_SLOT, Jsonb([finding])),
        )


@pytest.fixture
def fleet_url(db_url: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(["apply", str(EXAMPLE), "--db-url", db_url]) == 0
    capsys.readouterr()
    report_hosts(db_url)
    return db_url


@dataclass
class Served:
    url: str
    httpd: server.HTTPServer

    def get(self, path: str, *, token: str | None = None, method: str = "GET") -> tuple[int, Any, bytes]:
        req = urllib.request.Request(self.url + path, method=method)  # noqa: S310 - http://127.0.0.1 only
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - http://127.0.0.1 only (self.url)
                return resp.status, resp.headers, resp.read()  # names case-insensitive, as HTTP says
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    def json(self, path: str, *, status: int = 200, token: str | None = None) -> Any:
        code, _, body = self.get(path, token=token)
        assert code == status, (path, code, body[:500])
        return json.loads(body)


def serve(url: str, **settings: Any) -> Iterator[Served]:
    values: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": 0,
        "capacity_refresh_s": 0.0,
        "capacity_wait_s": 30.0,
        **settings,
    }
    httpd = server.make_server(url, server.Settings(**values))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield Served(httpd.url, httpd)
    finally:
        httpd.shutdown()
        httpd.server_close()
        httpd.service.close()
        thread.join(timeout=10)


@pytest.fixture
def served(fleet_url: str) -> Iterator[Served]:
    yield from serve(fleet_url)
