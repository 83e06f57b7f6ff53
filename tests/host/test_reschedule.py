"""A lab host fails a provision for good; the allocation ends on another node (issue 15).

    node-a  a lab host (loop disks, libvirt test driver, netns + dnsmasq): slots 0, 1
            one slot's VF is not on vfio-pci / the image on it does not match the catalog digest
    node-b  a second node (no agent here): slot 0

The central reconciler places the allocation on node-a; the host's pass
fails it (vfio_check / image_verify) and reports; the next reconciliation
records the attempt, quarantines the slot, releases the claim through cleanup
and places the allocation on node-b; the host's next pass releases (wipe +
verify of the loop disk) and the cleanup proof leaves the slot quarantined.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from desired import models as m
from desired.state import DesiredState
from host_reconciler import converging, hostdb
from host_reconciler.drivers import wiring
from host_reconciler.drivers.fakes import FakePci
from reconciler.reconcile import reconciling
from reconciler.store import checks, connections, lifecycle
from tests.host.conftest import SLOTS, SSH_KEY, Lab

API = m.API_VERSION
SKU = "lab-slice"


def desired(lab: Lab, *, digest: str) -> DesiredState:
    state = DesiredState()
    state.fleet = m.Fleet.model_validate(
        {
            "apiVersion": API,
            "kind": "Fleet",
            "name": "lab",
            "regions": [{"name": "r1", "pools": [{"name": "p1"}]}],
            "readiness_timeout_seconds": 30,
            "placement": {"policy": "first-fit"},
            "graceful_shutdown_timeout_s": 2,
        }
    )
    state.skus[SKU] = m.Sku.model_validate(
        {
            "apiVersion": API,
            "kind": "Sku",
            "sku": SKU,
            "capacity_shape": "gpu_slice",
            "accelerator_vendor": "nvidia",
            "accelerator_model": "h200",
            "allowed_gpu_counts": [1, 2],
            "network_fabric": "infiniband",
            "gpu_hourly_price_minor": 450,
            "resource_profile": {
                "default_slice_vm_profile": "lab_1g",
                "slice_vm_profiles": {"lab_1g": {"gpu_count": 1, "vcpu_count": 2, "memory_mib": 1024}},
            },
        }
    )
    state.images["lab-image"] = m.Image.model_validate(
        {
            "apiVersion": API,
            "kind": "Image",
            "slug": "lab-image",
            "target": "vm_slice",
            "family": "ubuntu",
            "architecture": "amd64",
            "image_format": "raw",
            "source_type": "platform_storage",
            "source_ref": "lab/lab-image.raw",
            "digest_sha256": digest,
            "default_username": "ubuntu",
            "driver_strategy": "preinstalled_nvidia",
        }
    )
    for name, slots in (("node-a", (0, 1)), ("node-b", (0,))):
        state.nodes[name] = m.Node.model_validate(
            {
                "apiVersion": API,
                "kind": "Node",
                "name": name,
                "region": "r1",
                "pool": "p1",
                "profile_tags": ["gpuaas-profile-slice-vm"],
                "admin_state": "active",
                "storage_mode": "slice",
                "os_disk": lab.os_disk.by_id,
                "firmware_profile": {"version": "v1", "ready": True},
            }
        )
        state.slot_maps[name] = m.SlotMap.model_validate(
            {"apiVersion": API, "kind": "SlotMap", "node": name, "slots": [slot(lab, name, s) for s in slots]}
        )
    state.allocations["alloc-1"] = m.Allocation.model_validate(
        {
            "apiVersion": API,
            "kind": "Allocation",
            "id": "alloc-1",
            "tenant": "acme",
            "sku": SKU,
            "gpu_count": 1,
            "region": "r1",
            "image": "lab-image",
            "ssh_keys": [SSH_KEY],
            "requested_at": "2026-01-01T00:00:00Z",
        }
    )
    return state


def slot(lab: Lab, node: str, s: int) -> dict[str, Any]:
    _i, gpu, vf, numa = SLOTS[s]
    return {
        "slot_index": s,
        "gpu_pci_address": gpu,
        "gpu_model": "h200",
        "numa_node": numa,
        "slot_group": f"numa{numa}",
        "nvme_device": lab.slot_disks[s].by_id,
        "network_fabric": "infiniband",
        "nvme_identity": lab.identity(s).as_dict(),
        "fabric_claim_mode": "per_slot_vf",
        "fabric_vf_pci_address": vf,
        "mac_address": f"52:54:00:{'bb' if node == 'node-b' else 'aa'}:00:{s:02x}",
        "private_ip": f"10.100.0.{10 + s}",
        "capacity_metadata": {"storage_ownership": "slice", "destructive_wipe_policy": "wipefs-blkdiscard-verify"},
    }


def host_pass(lab: Lab, conn: Any, pci: FakePci) -> converging.PassResult:
    """One pass of node-a's host reconciler: its plan from the store, its status back."""
    s = lab.settings()
    drivers = dataclasses.replace(wiring.drivers(s), pci=pci)
    try:
        plan = hostdb.read_plan(conn, "node-a")
        assert plan is not None
        result = converging.Converger(s, drivers).converge(plan)
        hostdb.write_status(conn, result.status)
        return result
    finally:
        drivers.close()


def current_node(conn: Any) -> tuple[str | None, list[int]]:
    rows = conn.execute(
        "SELECT n.name, c.slot_index FROM allocation_resource_claims c JOIN nodes n ON n.id = c.node_id"
        " WHERE c.allocation_id = 'alloc-1' AND c.status IN ('reserved', 'provisioning', 'active')"
        " AND NOT EXISTS (SELECT 1 FROM retired_claims r WHERE r.claim_id = c.id)"
    ).fetchall()
    return (rows[0][0] if rows else None), [int(r[1]) for r in rows]


@pytest.mark.parametrize("failure", ["vf_not_on_vfio", "image_digest_mismatch"])
def test_a_permanent_host_failure_moves_the_allocation_to_another_node(lab: Lab, db_url: str, failure: str) -> None:
    digest = lab.digest if failure == "vf_not_on_vfio" else "f" * 64
    state = desired(lab, digest=digest)
    pci = FakePci(all_present=True)
    with connections.connect(db_url, autocommit=True) as conn:
        reconciling.reconcile(conn, state)
        node, slots = current_node(conn)
        assert node == "node-a", "first-fit: the lowest node"
        if failure == "vf_not_on_vfio":
            pci.drivers[SLOTS[slots[0]][2]] = "mlx5_core"  # this slot's VF only
        first = host_pass(lab, conn, pci)
        vm = first.status.vms[0]
        expected = {
            "vf_not_on_vfio": ("vfio_check", "host.pci.not_vfio"),
            "image_digest_mismatch": ("image_fetch", "host.image.digest_mismatch"),
        }[failure]
        assert (vm.state, vm.phase, vm.error and vm.error.code) == ("failed", *expected)
        reported = time.monotonic()

        result = reconciling.reconcile(conn, state)
        took = time.monotonic() - reported
        print(
            f"{failure}: failed phase reported -> new claim on another node in one reconciliation: {took * 1000:.0f} ms"
        )
        assert [(r.outcome, r.code) for r in result.rescheduled] == [("rescheduled", expected[1])]
        assert current_node(conn)[0] == "node-b"
        assert checks.run(conn) == []

        # node-a's next pass releases the failed attempt: no domain to stop, wipe + verify the disk
        second = host_pass(lab, conn, pci)
        assert not [e for e in second.errors if not e.retry], second.errors
        reconciling.reconcile(conn, state)
        cycle = lifecycle.lifecycles(conn, ["alloc-1"])["alloc-1"]
        assert cycle["failed_attempts"] == 1 and cycle["node"] == "node-b"
        status: dict[int, str] = dict(
            conn.execute(
                "SELECT s.slot_index, s.status FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id"
                " WHERE n.name = 'node-a'"
            ).fetchall()
        )
        assert status == {slots[0]: "quarantined", **{s: "available" for s in (0, 1) if s != slots[0]}}
        assert checks.run(conn) == []
        # the plan of node-a no longer mentions the allocation; the slot waits for an operator
        plan = hostdb.read_plan(conn, "node-a")
        assert plan is not None and not plan.vms and not plan.releases
