"""`gpuaas get` / `describe` / `status --watch` on a real store: a failed allocation explained (issue 34)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from desired.state import DesiredState
from reconciler import cli
from reconciler.reconcile import reconciling
from reconciler.store.connections import Connection
from tests.claims import util
from tests.claims.test_lifecycle import fleet, report_vm_failure, where

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def failed(conn: Connection) -> tuple[DesiredState, str, str]:
    """Three slice nodes; the one allocation failed on its node with a reason the host gave."""
    state = fleet()
    reconciling.reconcile(conn, state)
    (aid,) = state.allocations
    node, slots = where(conn, aid)
    assert node is not None
    report_vm_failure(conn, node, slots, aid, "cloud_init_seed", "host.seed.ssh_key", "key 0 is not an SSH key")
    reconciling.reconcile(conn, state)
    assert util.allocation(conn, aid)["status"] == "failed"
    return state, aid, node


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_get_lists_and_names_with_the_reason(
    failed: tuple[DesiredState, str, str], db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, aid, node = failed
    code, out, _ = _cli(["get", "allocations", "--db-url", db_url], capsys)
    assert code == 0
    head, row = out.splitlines()[:2]
    assert head.split()[:2] == ["ID", "TENANT"] and row.startswith(aid)
    assert "failed" in row and "lifecycle.provision_failed" in row

    code, out, _ = _cli(["get", "allocation", aid, "--db-url", db_url, "-o", "json"], capsys)
    doc = json.loads(out)
    assert (doc["id"], doc["status"]) == (aid, "failed")
    assert "T" in doc["placed_at"]  # ISO 8601 as the API writes it, not `2026-11-27 13:38:05+00:00`

    code, out, _ = _cli(["get", "nodes", "--db-url", db_url], capsys)
    assert code == 0 and node in out and len(out.splitlines()) == 4  # header + three nodes


def test_an_unknown_name_is_a_coded_error_with_the_closest_names(
    failed: tuple[DesiredState, str, str], db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, node = failed
    code, out, err = _cli(["get", "node", node + "x", "--db-url", db_url], capsys)
    assert code == 1 and out == ""
    assert err.startswith("error: get.not_found: ") and f"did you mean {node!r}" in err


def test_describe_allocation_has_claims_phase_reason_and_events(
    failed: tuple[DesiredState, str, str], db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, aid, node = failed
    code, out, _ = _cli(["describe", "allocation", aid, "--db-url", db_url], capsys)
    assert code == 0
    assert "Reason:" in out and "lifecycle.provision_failed" in out
    assert "host.seed.ssh_key in cloud_init_seed: key 0 is not an SSH key" in out  # the attempt and its phase
    assert "Claims:" in out and node in out
    events = out.split("Events:")[1]
    assert "placed" in events and "attempt_failed" in events

    code, out, _ = _cli(["describe", "alloc", aid, "--db-url", db_url, "-o", "yaml"], capsys)
    import yaml

    doc = yaml.safe_load(out)
    assert [e["event"] for e in doc["events"]][:2] == ["requested", "placed"]
    assert doc["lifecycle"]["attempts"][0]["code"] == "host.seed.ssh_key"


def test_describe_node_and_sku(
    failed: tuple[DesiredState, str, str], db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    state, aid, node = failed
    code, out, _ = _cli(["describe", "node", node, "--db-url", db_url], capsys)
    assert code == 0 and "Liveness:" in out and "last report" in out
    assert aid in out.split("Events:")[1]
    sku = state.allocations[aid].sku
    code, out, _ = _cli(["describe", "sku", sku, "--db-url", db_url, "-o", "json"], capsys)
    doc = json.loads(out)
    assert doc["allocations"] == {"failed": 1} and doc["failed"][0]["id"] == aid
    assert {o["sku"] for o in doc["capacity"]} == {sku}


def test_get_watch_prints_again_when_the_answer_changes(
    failed: tuple[DesiredState, str, str], conn: Connection, db_url: str
) -> None:
    _, aid, _ = failed
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reconciler.cli",
            "get",
            "allocation",
            aid,
            "--watch",
            "--interval",
            "0.2",
            "-o",
            "json",
            "--db-url",
            db_url,
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as proc:
        try:
            assert proc.stdout is not None
            first = json.loads(proc.stdout.readline())
            assert first["desired_state"] == "present"
            conn.execute("UPDATE allocations SET desired_state = 'released' WHERE id = %s", (aid,))
            second = json.loads(proc.stdout.readline())  # one compact document per change
            assert second["desired_state"] == "released"
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 0  # Ctrl-C ends a watch, as kubectl's does
        finally:
            if proc.poll() is None:
                proc.kill()
