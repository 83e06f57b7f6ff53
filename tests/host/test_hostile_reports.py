"""Host reports are untrusted input: the database refuses a malformed one, and readers survive one anyway.

    node-a   a good report with drift on slot 0
    node-b   drift '"garbage"'               (a string, not a list)
    node-c   drift '[1, null, {"code": 5}]'  (entries that are not findings)

A node role writes its own row (RLS), so each of these is one host away. The
check constraints of migration 0008 refuse them from the node role; the bad
rows of the reader tests are written by the table owner with the check
dropped, as rows written before 0008 (or by a buggy writer) would be.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from host_reconciler import hostdb
from host_reconciler.actions import Drift, DriftCode
from reconciler import cli
from reconciler.store import connections, hoststatus, migrations
from reconciler.store import hostplans as central_plans
from schemas import driftreports
from tests.host.test_hostdb import add_node, plan, status

GOOD = {
    "code": "drift.disk.mounted",
    "slot_index": 0,
    "message": "mounted at /mnt",
    "allocation_id": None,
    "expected": None,
    "observed": "/mnt",
    "heal": None,
    "subject": None,
}

BAD_DRIFT = {
    "a string": "garbage",
    "entries that are not findings": [1, None, {"code": 5}],
    "an object": {"code": "drift.disk.mounted", "message": "m"},
    "no message": [{"code": "drift.disk.mounted"}],
    "a code that is not a drift code": [{**GOOD, "code": "<script>alert(1)</script>"}],
    "a slot index as text": [{**GOOD, "slot_index": "0"}],
    "a fractional slot index": [{**GOOD, "slot_index": 1.5}],
    "a negative slot index": [{**GOOD, "slot_index": -1}],
    "a slot index past 255": [{**GOOD, "slot_index": 256}],
    "a boolean slot index": [{**GOOD, "slot_index": True}],
    "a number where text belongs": [{**GOOD, "expected": 5}],
    "an object where text belongs": [{**GOOD, "heal": {"step": "x"}}],
    "a message past 4096 characters": [{**GOOD, "message": "x" * 4097}],
    "more than 4096 findings": [GOOD] * 4097,
}


@pytest.fixture
def nodes(db_url: str) -> dict[str, hostdb.NodeCredentials]:
    with hostdb.connect(db_url) as conn:
        creds = {}
        for node in ("node-a", "node-b", "node-c"):
            add_node(conn, node)
            central_plans.store(conn, [plan(node)])
            creds[node] = hostdb.create_node_role(conn, node, f"pw-{node}")
    return creds


def _as_node(db_url: str, creds: hostdb.NodeCredentials) -> psycopg.Connection[Any]:
    return psycopg.connect(db_url, user=creds.role, password=creds.password, autocommit=True)


# ------------------------------------------------------------------ the database refuses


@pytest.mark.parametrize("drift", BAD_DRIFT.values(), ids=BAD_DRIFT.keys())
def test_a_node_role_cannot_store_a_malformed_drift_report(
    db_url: str, nodes: dict[str, hostdb.NodeCredentials], drift: Any
) -> None:
    with _as_node(db_url, nodes["node-a"]) as conn:
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            conn.execute("INSERT INTO host_status (node_name, drift) VALUES ('node-a', %s)", (Jsonb(drift),))
        assert refused.value.diag.constraint_name == "host_status_drift_shape"
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            conn.execute(
                "INSERT INTO host_slot_status (node_name, slot_index, drift) VALUES ('node-a', 0, %s)", (Jsonb(drift),)
            )
        assert refused.value.diag.constraint_name == "host_slot_status_drift_shape"
        hostdb.write_status(conn, status("node-a"))  # the host's own writer still goes through


@pytest.mark.parametrize(
    ("column", "value", "constraint"),
    [
        ("errors", "garbage", "host_status_errors_shape"),
        ("errors", [{"code": 5, "message": "m"}], "host_status_errors_shape"),
        # issue 26: an entry must carry the step and the allocation (null: node-wide), as the host writes it
        ("errors", [{"code": "host.vm.start", "message": "m"}], "host_status_errors_shape"),
        ("errors", [{"code": "host.vm.start", "message": "m", "step": "start"}], "host_status_errors_shape"),
        ("errors", [{"code": "host.vm.start", "message": "m", "allocation_id": None}], "host_status_errors_shape"),
        ("errors", [{"code": "", "message": "m", "step": "start", "allocation_id": None}], "host_status_errors_shape"),
        ("details", [1, 2], "host_status_objects_shape"),
        ("phase_timings", "fast", "host_status_objects_shape"),
        ("cleanup_evidence", ["verified"], "host_status_objects_shape"),
        ("details", {"blob": "x" * (1 << 20)}, "host_status_objects_shape"),
    ],
)
def test_a_node_role_cannot_store_other_malformed_node_reports(
    db_url: str, nodes: dict[str, hostdb.NodeCredentials], column: str, value: Any, constraint: str
) -> None:
    with _as_node(db_url, nodes["node-a"]) as conn, pytest.raises(psycopg.errors.CheckViolation) as refused:
        conn.execute(
            f"INSERT INTO host_status (node_name, {column}) VALUES ('node-a', %s)",  # noqa: S608 -- fixed names
            (Jsonb(value),),
        )
    assert refused.value.diag.constraint_name == constraint


@pytest.mark.parametrize(
    ("column", "value", "constraint"),
    [
        ("wipe_evidence", "verified", "host_slot_status_objects_shape"),
        ("phase_timings", [1], "host_slot_status_objects_shape"),
        ("wipe_error", "x" * 4097, "host_slot_status_text_size"),
    ],
)
def test_a_node_role_cannot_store_a_malformed_slot_report(
    db_url: str, nodes: dict[str, hostdb.NodeCredentials], column: str, value: Any, constraint: str
) -> None:
    param = value if column == "wipe_error" else Jsonb(value)
    with _as_node(db_url, nodes["node-a"]) as conn, pytest.raises(psycopg.errors.CheckViolation) as refused:
        conn.execute(
            f"INSERT INTO host_slot_status (node_name, slot_index, {column})"  # noqa: S608 -- fixed names
            " VALUES ('node-a', 0, %s)",
            (param,),
        )
    assert refused.value.diag.constraint_name == constraint


def test_every_drift_code_the_host_writes_is_accepted(db_url: str, nodes: dict[str, hostdb.NodeCredentials]) -> None:
    drift = tuple(
        Drift(
            code,
            i % 8 if i % 3 else None,
            f"finding {code}",
            allocation_id="alloc-node-a",
            expected="e",
            observed="o",
            subject="s",
        )
        for i, code in enumerate(DriftCode)
    )
    with _as_node(db_url, nodes["node-a"]) as conn:
        hostdb.write_status(conn, status("node-a", drift=drift))
    with hostdb.connect(db_url) as central:
        row = hoststatus.read(central, "node-a")[0]
    assert [d["code"] for d in row["drift"]] == [str(c) for c in DriftCode]


# ------------------------------------------------------------------ readers survive


def _plant_bad_reports(db_url: str) -> None:
    with hostdb.connect(db_url) as conn:
        hostdb.write_status(conn, status("node-a", drift=(Drift(DriftCode.DISK_MOUNTED, 0, "mounted at /mnt"),)))
        conn.execute("ALTER TABLE host_status DROP CONSTRAINT host_status_drift_shape")
        for node, drift in (("node-b", "garbage"), ("node-c", [1, None, {"code": 5}])):
            conn.execute("INSERT INTO host_status (node_name, drift) VALUES (%s, %s)", (node, Jsonb(drift)))


def test_drift_command_shows_a_malformed_report_as_invalid_and_every_other_node(
    db_url: str, nodes: dict[str, hostdb.NodeCredentials], capsys: pytest.CaptureFixture[str]
) -> None:
    _plant_bad_reports(db_url)
    capsys.readouterr()
    assert cli.main(["drift", "--db-url", db_url, "--exit-code"]) == 3
    out, err = capsys.readouterr()
    assert err == "" and "Traceback" not in out
    lines = out.splitlines()
    assert lines[0] == "3 drift finding(s) on 3 of 3 node(s)"
    assert lines[1] == "node-a slot 0: drift.disk.mounted: mounted at /mnt"
    assert lines[2].startswith("node-b slot -: drift.report.invalid: the drift report of node-b is malformed")
    assert lines[3].startswith("node-c slot -: drift.report.invalid:") and "3 of 3 entries not shown" in lines[3]

    assert cli.main(["drift", "--db-url", db_url, "-o", "markdown"]) == 0
    md = capsys.readouterr().out
    assert "| node-a | 0 | `drift.disk.mounted` |" in md
    assert "| node-b | - | `drift.report.invalid` |" in md and "| node-c | - | `drift.report.invalid` |" in md

    assert cli.main(["drift", "--db-url", db_url, "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["total"] == 3
    assert {n["node"]: [d["code"] for d in n["drift"]] for n in doc["nodes"]} == {
        "node-a": ["drift.disk.mounted"],
        "node-b": [driftreports.INVALID],
        "node-c": [driftreports.INVALID],
    }

    assert cli.main(["drift", "--db-url", db_url, "--node", "node-c", "-o", "markdown"]) == 0
    assert "| node-c | - | `drift.report.invalid` |" in capsys.readouterr().out


# ------------------------------------------------------------------ upgrade


def test_0008_repairs_malformed_rows_written_before_it(empty_db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # 0055 replaces 0008's error check, so it comes after 0008 here as in every real upgrade, and so do
    # the migrations from 0082 on (0082 re-applies the check from schemas/sql/functions/).
    later = [m.version for m in migrations.available() if m.version >= "0082"]
    before = [m for m in migrations.available() if m.version not in ("0008", "0055", *later)]
    with connections.connect(empty_db_url, autocommit=True) as conn:
        with monkeypatch.context() as patched:
            patched.setattr(migrations, "available", lambda: before)
            migrations.migrate(conn)
        for node in ("node-a", "node-b", "node-c"):
            add_node(conn, node)
        conn.execute(
            "INSERT INTO host_status (node_name, drift, errors, details) VALUES"
            " ('node-a', %s, '[]', '{}'), ('node-b', '\"garbage\"', '{\"x\": 1}', '[1]'),"
            " ('node-c', '[1, null, {\"code\": 5}]', '[]', '{}')",
            (Jsonb([GOOD]),),
        )
        conn.execute(
            "INSERT INTO host_slot_status (node_name, slot_index, drift, wipe_evidence, wipe_error) VALUES"
            " ('node-a', 0, %s, '{\"device\": \"/dev/disk/by-id/nvme-S0\"}', NULL),"
            " ('node-b', 3, '{}', '\"proof\"', repeat('e', 5000))",
            (Jsonb([GOOD]),),
        )

        assert migrations.migrate(conn) == ["0008", "0055", *later]
        rows = {
            r[0]: r[1:]
            for r in conn.execute(
                "SELECT node_name, drift, errors, details FROM host_status ORDER BY node_name"
            ).fetchall()
        }
        slots = {
            r[0]: r[1:]
            for r in conn.execute(
                "SELECT node_name, drift, wipe_evidence, length(wipe_error) FROM host_slot_status"
            ).fetchall()
        }
    assert rows["node-a"] == ([GOOD], [], {})
    assert [d["code"] for d in rows["node-b"][0]] == [driftreports.INVALID] == [d["code"] for d in rows["node-c"][0]]
    assert rows["node-b"][1][0]["code"] == "host.report.invalid" and rows["node-b"][2] == {}
    assert slots["node-a"] == ([GOOD], {"device": "/dev/disk/by-id/nvme-S0"}, None)
    assert slots["node-b"][0][0]["code"] == driftreports.INVALID and slots["node-b"][0][0]["slot_index"] == 3
    assert slots["node-b"][1:] == ({}, 4096)
