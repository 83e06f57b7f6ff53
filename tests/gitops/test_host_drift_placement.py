"""Host reports in PostgreSQL feed placement, status, the PR plan and the API read model (issue 26).

Regression: a free slot its host reported drifted (`drift.pci.not_vfio`:
the GPU is bound to another driver) was placed, and the next tenant got a
failed provision; `ModeFacts.node_corrupt` had no producer. Real PostgreSQL,
real git, the reports written as a host writes them (rows of `host_status`
and `host_slot_status`).
"""

from __future__ import annotations

import json

import pytest
from psycopg.types.json import Jsonb

from reconciler import cli
from reconciler.service import statuscache
from reconciler.store import connections, live
from tests.gitops.conftest import Repo, allocation_status, claims

S01, S02 = "h200-use1-s01", "h200-use1-s02"


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _drift(code: str, slot: int | None) -> dict[str, object]:
    return {
        "code": code,
        "message": f"{code} on {slot}",
        "slot_index": slot,
        "allocation_id": None,
        "expected": None,
        "observed": None,
        "heal": None,
        "subject": None,
        "state": None,
    }


def _report_slot(conn: connections.Connection, node: str, slot: int, codes: list[str]) -> None:
    conn.execute(
        "INSERT INTO host_slot_status (node_name, slot_index, vm_state, drift) VALUES (%s, %s, 'absent', %s)"
        " ON CONFLICT (node_name, slot_index) DO UPDATE SET drift = EXCLUDED.drift, updated_at = clock_timestamp()",
        (node, slot, Jsonb([_drift(c, slot) for c in codes])),
    )


def _report_node(conn: connections.Connection, node: str, codes: list[str]) -> None:
    conn.execute(
        "INSERT INTO host_status (node_name, healthy, drift) VALUES (%s, true, %s)"
        " ON CONFLICT (node_name) DO UPDATE SET drift = EXCLUDED.drift, reported_at = now()",
        (node, Jsonb([_drift(c, None) for c in codes])),
    )


def test_host_reports_keep_drifted_slots_and_corrupt_nodes_off_the_market(
    fleet_repo: Repo, db_url: str, conn: connections.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(fleet_repo.root)
    assert _cli(capsys, "apply", root, "--db-url", db_url)[0] == 0
    _report_node(conn, S01, ["drift.identity.changed"])  # node-wide: the host is not the machine approved
    _report_node(conn, S02, [])
    for i in range(8):  # s02: every slot but 7 has its GPU bound to another driver
        _report_slot(conn, S02, i, ["drift.pci.not_vfio", "drift.reservation.stale"] if i < 7 else [])
    observed = live.observe(conn)
    assert observed.corrupt_nodes == {S01: ("drift.identity.changed",)}
    assert observed.slot_blocks == {(S02, i): ("drift.pci.not_vfio",) for i in range(7)}

    fleet_repo.request("alloc-a", 1)
    assert _cli(capsys, "apply", root, "--db-url", db_url)[0] == 0
    assert claims(conn, "alloc-a") == [(S02, 7, "reserved")]
    fleet_repo.request("alloc-b", 1)
    rc, out, _ = _cli(capsys, "apply", root, "--db-url", db_url, "-o", "json")
    assert rc == 0 and claims(conn, "alloc-b") == []
    pending = {p["allocation_id"]: p for p in json.loads(out)["pending"]}["alloc-b"]
    assert pending["code"] == "plan.sku_unavailable.capacity"
    assert "7 more slot(s) wait for their hosts to report them clear of drift" in pending["message"]

    # status (and the API, which serves the same document): the reason per node and per offer
    rc, out, _ = _cli(capsys, "status", "--db-url", db_url, "-o", "json")
    doc = json.loads(out)
    nodes = {n["name"]: n for n in doc["nodes"]}
    assert nodes[S01]["corrupt"] == ["drift.identity.changed"] and nodes[S01]["mode"] == "unavailable"
    assert nodes[S02]["host_drift"] == [{"slot_index": i, "codes": ["drift.pci.not_vfio"]} for i in range(7)]
    offer = next(o for o in doc["capacity"] if o["sku"] == "h200-sxm-slice")
    assert offer["not_launchable"] == {"host_drift": 7, "node_corrupt": 8}
    assert offer["usable"] == 0
    api = {n["name"]: n for n in statuscache.status_document(conn)["nodes"]}  # what the service serves
    assert api[S01]["corrupt"] == ["drift.identity.changed"] and len(api[S02]["host_drift"]) == 7
    rc, text, _ = _cli(capsys, "status", "--db-url", db_url)
    assert "CORRUPT (host reports node-wide corruption: drift.identity.changed" in text
    assert "slot 0 not placed: its host reports drift.pci.not_vfio" in text

    # the PR plan against the database sees the same
    rc, out, _ = _cli(capsys, "plan", root, "--db-url", db_url, "-o", "json", "--no-cache")
    assert rc == 0
    plan = json.loads(out)
    assert plan["placements"] == []
    assert {p["allocation_id"]: p["code"] for p in plan["pending"]} == {"alloc-b": "plan.sku_unavailable.capacity"}
    assert plan["host_drift"][0] == {"node": S01, "slot_index": None, "codes": ["drift.identity.changed"]}
    assert len(plan["host_drift"]) == 8
    rc, text, _ = _cli(capsys, "plan", root, "--db-url", db_url, "--no-cache")
    assert f"  {S01} (node-wide corruption): drift.identity.changed" in text
    assert f"  {S02} slots [0-6]: drift.pci.not_vfio" in text or f"  {S02} slots [0,1,2,3,4,5,6]" in text, text

    # reported clear: placeable again
    _report_slot(conn, S02, 0, ["drift.reservation.stale"])
    assert _cli(capsys, "apply", root, "--db-url", db_url)[0] == 0
    assert claims(conn, "alloc-b") == [(S02, 0, "reserved")]
    _report_node(conn, S01, [])
    assert live.observe(conn).corrupt_nodes == {}
    fleet_repo.request("alloc-c", 1)
    assert _cli(capsys, "apply", root, "--db-url", db_url)[0] == 0
    assert allocation_status(conn, "alloc-c")[0] == "reserved" and claims(conn, "alloc-c")[0][0] == S01


def test_every_slot_drifted_is_node_wide_evidence(
    fleet_repo: Repo, db_url: str, conn: connections.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli(capsys, "apply", str(fleet_repo.root), "--db-url", db_url)[0] == 0
    for i in range(8):
        _report_slot(conn, S01, i, ["drift.disk.missing"])
    assert live.observe(conn).corrupt_nodes == {S01: ("host.drift.every_slot",)}
    conn.execute("UPDATE host_slot_status SET wipe_state = 'failed' WHERE node_name = %s AND slot_index = 3", (S02,))
    _report_slot(conn, S02, 3, [])
    conn.execute("UPDATE host_slot_status SET wipe_state = 'failed' WHERE node_name = %s AND slot_index = 3", (S02,))
    assert live.observe(conn).slot_blocks[(S02, 3)] == ("host.wipe.failed",)
