"""The host agent heartbeats as its node role: every pass, with no plan, and while a pass runs long."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest

from host_reconciler import command, hostdb
from reconciler import cli
from tests.host.test_hostdb import add_node


def reported_at(db_url: str, node: str) -> dt.datetime | None:
    with hostdb.connect(db_url) as conn:
        row = conn.execute("SELECT reported_at FROM host_status WHERE node_name = %s", (node,)).fetchone()
    return row[0] if row else None


def test_host_run_without_a_plan_still_reports_alive(
    db_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with hostdb.connect(db_url) as conn:
        add_node(conn, "node-a")
        creds = hostdb.create_node_role(conn, "node-a", "pw-beat")
    monkeypatch.setenv("GPUAAS_HOST_DB_PASSWORD", creds.password)
    config = tmp_path / "host.json"
    config.write_text('{"pci": "fake-vfio", "readiness": "none", "libvirt_uri": "test:///default"}')
    assert reported_at(db_url, "node-a") is None
    assert (
        cli.main(
            [
                "host",
                "run",
                "--node",
                "node-a",
                "--config",
                str(config),
                "--db-url",
                db_url,
                "--db-role",
                creds.role,
                "--passes",
                "1",
                "--interval",
                "0.1",
            ]
        )
        == 0
    )
    assert reported_at(db_url, "node-a") is not None


def test_the_heartbeat_thread_keeps_reported_at_fresh_during_a_long_pass(db_url: str) -> None:
    with hostdb.connect(db_url) as conn:
        add_node(conn, "node-a")
        creds = hostdb.create_node_role(conn, "node-a", "pw-beat")
    conn = hostdb.connect(db_url, role=creds.role, password=creds.password)
    beat = command._Heartbeat(lambda: hostdb.heartbeat(conn, "node-a"), 0.05)
    beat.start()
    try:
        deadline = time.monotonic() + 10
        while reported_at(db_url, "node-a") is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        first = reported_at(db_url, "node-a")
        time.sleep(0.3)  # the main loop is busy in a step; the thread beats on its own
        later = reported_at(db_url, "node-a")
    finally:
        beat.stop()
        conn.close()
    assert first is not None and later is not None and later > first


def test_no_database_no_heartbeat_thread() -> None:
    beat = command._Heartbeat(None, 0.01)
    beat.start()
    beat.stop()  # nothing was started, nothing to join
