"""The contract with the central reconciler, end to end on a real PostgreSQL.

git (examples/fleet) --apply--> claims + host plan of h200-use1-s01
host reconciler (node role) --converge--> VMs ready --apply--> claims active
git: alloc-0001 released --apply--> claim releasing, slot 0 in cleanup, plan.releases
host reconciler --wipe + verify--> evidence --apply--> slot 0 available, claim released
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from gpuaas_tools.demo import hosts as demo
from gpuaas_tools.lab import host as lab
from host_reconciler import converging, hostdb
from host_reconciler.drivers import wiring
from reconciler import sources
from reconciler.reconcile import reconciling
from schemas.errors import GpuaasError

NODE = "h200-use1-s01"
FLEET = Path(__file__).resolve().parents[2] / "examples" / "fleet"


def slot_and_claim(db_url: str, slot: int) -> tuple[str, str]:
    with hostdb.connect(db_url) as conn:
        row = conn.execute(
            """SELECT s.status, c.status FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id
               JOIN allocation_resource_claims c ON c.slot_id = s.id AND c.allocation_id = 'alloc-0001'
               WHERE n.name = %s AND s.slot_index = %s""",
            (NODE, slot),
        ).fetchone()
    assert row is not None
    return str(row[0]), str(row[1])


def apply(db_url: str, fleet: Path) -> None:
    with hostdb.connect(db_url) as conn:
        reconciling.reconcile(conn, sources.load(fleet).state, source="test")


def test_central_frees_a_released_slot_only_after_the_hosts_wipe_proof(db_url: str, tmp_path: Path) -> None:
    try:
        lab.check_host()
    except GpuaasError as e:
        pytest.skip(e.message)
    fleet = tmp_path / "fleet"
    shutil.copytree(FLEET, fleet)
    apply(db_url, fleet)
    with hostdb.connect(db_url) as conn:
        plan = hostdb.read_plan(conn, NODE)
        creds = hostdb.create_node_role(conn, NODE, "pw")
    assert plan is not None
    tree = lab.retag_tree(FLEET.parent / "sysfs" / "xe9680l-h200", tmp_path / "sysfs", "x", "x")
    with (
        lab.lab_host(
            NODE,
            tmp_path / "host",
            disk_paths=[s.nvme_device for s in plan.slots],
            os_disk=plan.os_disk,
            sysfs_tree=tree,
        ) as host,
        hostdb.connect(db_url, role=creds.role, password=creds.password) as conn,
    ):
        demo._restamp(db_url, NODE, host.image_dir)  # the example digests are placeholders
        s = host.settings()
        drivers = wiring.drivers(s)
        conv = converging.Converger(s, drivers)
        try:

            def host_pass() -> converging.PassResult:
                p = hostdb.read_plan(conn, NODE)
                assert p is not None
                r = conv.converge(p)
                hostdb.write_status(conn, r.status)
                return r

            first = host_pass()
            assert not first.errors and first.status.converged
            apply(db_url, fleet)  # absorbs "ready"
            assert slot_and_claim(db_url, 0) == ("active", "active")

            alloc = fleet / "allocations" / "alloc-0001.yaml"
            alloc.write_text(re.sub(r"(?m)^state: present$", "state: released", alloc.read_text()))
            apply(db_url, fleet)
            assert slot_and_claim(db_url, 0) == ("cleanup", "releasing")
            apply(db_url, fleet)  # no proof yet: nothing frees the slot
            assert slot_and_claim(db_url, 0) == ("cleanup", "releasing")

            released = host_pass()
            assert not released.errors
            rep = next(x for x in released.status.slots if x.slot_index == 0)
            assert rep.wipe_state == "verified" and rep.wipe_evidence["signature_clear"]
            apply(db_url, fleet)
            assert slot_and_claim(db_url, 0) == ("available", "released")
        finally:
            drivers.close()
