"""Host plans and status in a real PostgreSQL, with one role per node and row-level security.

central (owner) writes plans for node-a and node-b, creates both node roles
node-a's role: reads node-a's plan only, writes node-a's status only
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from host_reconciler import hostdb
from host_reconciler.actions import Drift, DriftCode, DriftMode
from host_reconciler.statuses import HostStatus, SlotReport
from reconciler import cli
from reconciler.store import hostplans as central_plans
from reconciler.store import hoststatus
from schemas import hostplans as hp
from schemas.errors import GpuaasError
from schemas.states import SlotStatus
from tests.host.conftest import NETWORK


def add_node(conn: psycopg.Connection[Any], name: str) -> None:
    conn.execute(
        """INSERT INTO nodes (name, region, pool, admin_state, storage_mode, os_disk, capability,
                              management_network)
           VALUES (%s, 'us-east-1', 'h200-slice', 'active', 'slice', '/dev/disk/by-id/nvme-OS',
                   'both_capable', %s)""",
        (name, Jsonb({"bridge": "gpuaasbr0"})),
    )


def plan(node: str, generation: int = 1) -> hp.HostPlan:
    b = hp.SlotBundle(
        0, "0000:1b:00.0", "0000:1a:00.1", "/dev/disk/by-id/nvme-S0", "52:54:00:00:00:01", "10.100.0.10", 0
    )
    vm = hp.VmSpec(f"alloc-{node}", "acme", (b,), vcpu_count=2, memory_mib=1024)
    # Each generation's spec differs (the shutdown timeout): the central writer moves the generation on a change only.
    return hp.HostPlan(
        node, generation, NETWORK, "/dev/disk/by-id/nvme-OS", shutdown_timeout_s=119 + generation, vms=(vm,), slots=(b,)
    )


def status(node: str, *, drift: tuple[Drift, ...] = (), wipe: dict[str, Any] | None = None) -> HostStatus:
    slot = SlotReport(
        0,
        SlotStatus.AVAILABLE if wipe else SlotStatus.ACTIVE,
        f"alloc-{node}",
        "absent" if wipe else "ready",
        None,
        None,
        f"alloc-{node}" if wipe else None,
        "verified" if wipe else None,
        wipe or {},
        None,
        {"lease": 1.5},
        drift,
        schedulable=bool(wipe),
    )
    return HostStatus(node, 1, 1, DriftMode.REPORT, True, True, (slot,), (), drift, (), ())


@pytest.fixture
def two_nodes(db_url: str) -> dict[str, hostdb.NodeCredentials]:
    with hostdb.connect(db_url) as conn:
        creds = {}
        for node in ("node-a", "node-b"):
            add_node(conn, node)
            central_plans.store(conn, [plan(node)])
            creds[node] = hostdb.create_node_role(conn, node, f"pw-{node}")
        hostdb.write_status(conn, status("node-b"))  # node-b already reported once
    return creds


def test_node_role_cannot_read_another_nodes_plan_or_write_its_status(
    db_url: str, two_nodes: dict[str, hostdb.NodeCredentials]
) -> None:
    a = two_nodes["node-a"]
    with hostdb.connect(db_url, role=a.role, password=a.password) as conn:
        assert hostdb.read_plan(conn, "node-a") == plan("node-a")
        assert hostdb.read_plan(conn, "node-b") is None  # invisible, not an error
        assert conn.execute("SELECT count(*) FROM host_plans").fetchone() == (1,)
        hostdb.write_status(conn, status("node-a"))
        assert [n["node"] for n in hoststatus.read(conn)] == ["node-a"]
        with pytest.raises(GpuaasError):
            hostdb.write_status(conn, status("node-b", drift=(Drift(DriftCode.DISK_MOUNTED, 0, "forged"),)))
        with pytest.raises(GpuaasError), hostdb.dberrors.wrapped("read role map"):
            conn.execute("SELECT * FROM host_node_roles").fetchall()
        changed = conn.execute("UPDATE host_status SET healthy = false WHERE node_name = 'node-b'")
        assert changed.rowcount == 0
        with pytest.raises(psycopg.Error):
            conn.execute("UPDATE host_plans SET generation = 99 WHERE node_name = 'node-a'")
    with hostdb.connect(db_url) as central:
        rows = {n["node"]: n for n in hoststatus.read(central)}
        assert rows["node-b"]["drift"] == [] and rows["node-b"]["healthy"] is True
        assert rows["node-a"]["observed_generation"] == 1
        assert central.execute("SELECT generation FROM host_plans WHERE node_name = 'node-a'").fetchone() == (1,)


def test_status_rows_carry_the_wipe_proof_the_central_reconciler_checks(
    db_url: str, two_nodes: dict[str, hostdb.NodeCredentials]
) -> None:
    a = two_nodes["node-a"]
    evidence = {"device": "/dev/disk/by-id/nvme-S0", "signature_clear": True, "sampled_zero": True}
    with hostdb.connect(db_url, role=a.role, password=a.password) as conn:
        hostdb.write_status(conn, status("node-a", wipe=evidence))
        first = conn.execute("SELECT wipe_reported_at FROM host_slot_status WHERE node_name='node-a'").fetchone()
        hostdb.write_status(conn, status("node-a", wipe=evidence))  # same evidence: time stays
        again = conn.execute("SELECT wipe_reported_at FROM host_slot_status WHERE node_name='node-a'").fetchone()
        assert first == again
        row = conn.execute(
            "SELECT wipe_state, wipe_evidence, vm_state FROM host_slot_status WHERE node_name='node-a'"
        ).fetchone()
    assert row is not None and row[0] == "verified" and row[1] == evidence and row[2] == "absent"


def test_drift_command_renders_the_fleet(
    db_url: str, two_nodes: dict[str, hostdb.NodeCredentials], capsys: pytest.CaptureFixture[str]
) -> None:
    with hostdb.connect(db_url) as conn:
        hostdb.write_status(
            conn,
            status(
                "node-a",
                drift=(
                    Drift(
                        DriftCode.RESERVATION_MISSING,
                        0,
                        "DHCP reservation of gpuaas-alloc-node-a is missing",
                        allocation_id="alloc-node-a",
                        expected="52:54:00:00:00:01,10.100.0.10",
                    ),
                ),
            ),
        )
    assert cli.main(["drift", "-o", "markdown", "--db-url", db_url]) == 0
    md = capsys.readouterr().out
    assert "| node-a | 0 | `drift.reservation.missing` |" in md
    assert cli.main(["drift", "-o", "json", "--db-url", db_url, "--exit-code"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["total"] == 1 and [n["node"] for n in doc["nodes"]] == ["node-a", "node-b"]
    assert cli.main(["drift", "--db-url", db_url, "--node", "node-b"]) == 0
    assert "no drift" in capsys.readouterr().out


def test_the_host_report_writes_firmware_ready_and_reaches_the_planner_input(
    db_url: str, two_nodes: dict[str, hostdb.NodeCredentials], tmp_path: Any
) -> None:
    """The agent's firmware evidence lands in host_status.firmware_ready (the column the planner reads)."""
    import dataclasses

    from host_reconciler import onboarding

    fw = tmp_path / "firmware-profile"
    fw.mkdir()
    (fw / "state.json").write_text(json.dumps({"profile_tag": "gpuaas-profile-slice-vm", "verified": False}))
    report = onboarding.report(fw, tmp_path / "bootstrap", reboot_flag=tmp_path / "none")
    a = two_nodes["node-a"]
    with hostdb.connect(db_url, role=a.role, password=a.password) as conn:
        hostdb.write_status(conn, dataclasses.replace(status("node-a"), host=report))
    with hostdb.connect(db_url) as central:
        row = central.execute(
            "SELECT firmware_ready, details->'host' FROM host_status WHERE node_name = 'node-a'"
        ).fetchone()
        assert row is not None and row[0] is False and row[1]["firmware_code"] == "host.firmware.not_verified"
        assert row[1]["bootstrap_state"] == "never_run" and row[1]["reboot_required"] is False
        seen = central.execute("SELECT firmware_ready FROM host_status WHERE node_name = 'node-b'").fetchone()
        assert seen == (None,)  # a host without a report leaves the git claim standing


def test_a_report_older_than_the_stored_one_is_ignored(
    db_url: str, two_nodes: dict[str, hostdb.NodeCredentials]
) -> None:
    """A delayed retry of generation 1 must not overwrite generation 2's report (nor its slot rows)."""
    import dataclasses

    creds = two_nodes["node-a"]
    newer = dataclasses.replace(status("node-a"), generation=2, observed_generation=2)
    older = dataclasses.replace(status("node-a", wipe={"verified": True}), generation=1, observed_generation=1)
    with hostdb.connect(db_url, role=creds.role, password=creds.password) as conn:
        assert hostdb.write_status(conn, newer) is True
        assert hostdb.write_status(conn, older) is False
    with hostdb.connect(db_url) as conn:
        assert conn.execute("SELECT observed_generation FROM host_status WHERE node_name = 'node-a'").fetchone() == (2,)
        assert conn.execute(
            "SELECT vm_state, observed_generation FROM host_slot_status WHERE node_name = 'node-a'"
        ).fetchall() == [("ready", 2)]
