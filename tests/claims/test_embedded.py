"""The embedded server and the `gpuaas db` / `gpuaas apply` commands, end to end, as a user runs them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler import settings
from reconciler.store import connections, embedded, migrations
from tests.claims import util

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def state_dir(pg_server: embedded.Server) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="gpuaas-cli-", dir="/tmp"))
    root.chmod(0o755)
    try:
        yield root / "state"
    finally:
        embedded.destroy(embedded.server_for(root / "state"))
        shutil.rmtree(root, ignore_errors=True)


def gpuaas(state: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != settings.ENV_URL}
    env[settings.ENV_STATE_DIR] = str(state)
    return subprocess.run(
        [sys.executable, "-m", "reconciler.cli", *argv],
        cwd=ROOT,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_db_commands_and_apply_on_the_embedded_server(state_dir: Path) -> None:
    assert gpuaas(state_dir, "db", "status").returncode == 3
    started = gpuaas(state_dir, "db", "start")
    assert started.returncode == 0, started.stderr
    status = gpuaas(state_dir, "db", "status", "-o", "json")
    doc = json.loads(status.stdout)
    assert status.returncode == 0 and doc["running"] and doc["data_dir"].startswith(str(state_dir))
    url = gpuaas(state_dir, "db", "url").stdout.strip()
    assert url == doc["url"]

    first = gpuaas(state_dir, "apply", "examples/fleet", "-o", "json")
    assert first.returncode == 0, first.stderr
    applied = json.loads(first.stdout)
    assert applied["changed"] and applied["placements"]
    assert all(p["code"] and p["message"] for p in applied["pending"])
    second = gpuaas(state_dir, "apply", "examples/fleet")
    assert second.returncode == 0 and "no changes" in second.stdout

    check = gpuaas(state_dir, "db", "check")
    assert check.returncode == 0 and "invariants hold" in check.stdout
    # A violation is named and exits 1 (made by hand, behind the guards' back).
    with connections.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE node_resource_slots DISABLE TRIGGER slots_guard_status")
        conn.execute("UPDATE node_resource_slots SET status = 'reserved' WHERE status = 'available' AND slot_index = 0")
        assert util.count(conn, "SELECT count(*) FROM node_resource_slots WHERE status = 'reserved'") > 0
    bad = gpuaas(state_dir, "db", "check")
    assert bad.returncode == 1 and "held_slot_without_one_claim" in bad.stderr

    assert gpuaas(state_dir, "db", "stop").stdout.strip() == "stopped"
    assert gpuaas(state_dir, "db", "status").returncode == 3
    # Reused on the next run: same data, started again on demand.
    again = gpuaas(state_dir, "apply", "examples/fleet")
    assert again.returncode == 0 and "no changes" in again.stdout


def test_an_unreachable_state_dir_keeps_its_server_under_the_embedded_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the postgres-user path only exists as root")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    root = tmp_path / "embedded-root"
    monkeypatch.setenv(settings.ENV_EMBEDDED_ROOT, str(root))
    server = embedded.server_for(private / "state")
    assert root in server.data_dir.parents  # where postgres can reach it, keyed by the checkout
    assert embedded.server_for(private / "state").data_dir == server.data_dir  # the same checkout, the same server


def test_migrations_are_recorded_and_idempotent(empty_db_url: str) -> None:
    with connections.connect(empty_db_url, autocommit=True) as conn:
        ran = migrations.migrate(conn)
        assert ran[:5] == ["0001", "0002", "0003", "0004", "0005"]
        assert migrations.migrate(conn) == []
        assert set(migrations.applied(conn)) == {m.version for m in migrations.available()}
        conn.execute("UPDATE schema_migrations SET checksum = 'edited' WHERE version = '0001'")
        with pytest.raises(Exception) as info:
            migrations.migrate(conn)
        assert getattr(info.value, "code", None) == "db.migration.changed"
