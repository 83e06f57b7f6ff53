"""What discover proposes beside the candidate SlotMap: the node name, a blocker summary, a Node document."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from desired import models as m
from host_reconciler.discovery import candidates, discovering, proposals
from reconciler import cli
from tests.discovery.conftest import NODES, TREES


def discover(capsys: pytest.CaptureFixture[str], root: Path, *extra: str) -> str:
    assert cli.main(["host", "discover", "--sysfs-root", str(root), *extra]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out


@pytest.mark.parametrize("tree", TREES)
def test_node_flag_names_the_node_everywhere_and_the_recorded_host_nowhere(
    tree: str, trees: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    hostname = discovering.discover(trees[tree]).hostname
    assert hostname == NODES[tree]
    out = discover(capsys, trees[tree], "--node", "gpu-new-01")
    assert hostname not in out
    assert out.splitlines()[0].startswith("# Candidate SlotMap for node gpu-new-01 ")
    slot_doc, node_doc = yaml.safe_load_all(out)
    assert (slot_doc["node"], node_doc["name"]) == ("gpu-new-01", "gpu-new-01")
    # Without --node the host's own name is the node name, in the header too.
    assert discover(capsys, trees[tree]).splitlines()[0].startswith(f"# Candidate SlotMap for node {hostname} ")


@pytest.mark.parametrize(
    ("tree", "line"),
    [
        ("xe9680l-h200", "# 8 slots ready, 0 blocked."),
        (
            "xe9680-mi300x-roce",
            "# 4 slots ready, 4 blocked: fabric.port_down (slot 3), disk.signature_present (slots 5, 7),"
            " gpu.not_vfio (slot 6), disk.mounted (slot 7).",
        ),
        (
            "xe9680l-h200-shared-parent",
            "# 0 slots ready, 8 blocked: fabric.no_vf (slots 0-7), fabric.shared_parent (slots 0-7),"
            " fabric.numa_remote (slots 4-7).",
        ),
    ],
)
def test_the_summary_opens_the_candidate(
    tree: str, line: str, trees: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert discover(capsys, trees[tree]).splitlines()[1] == line


def _slot_map(blocked: dict[int, tuple[str, ...]], n: int = 8) -> candidates.Candidate:
    slots = []
    for i in range(n):
        slots.append(
            {
                "slot_index": i,
                "gpu_pci_address": f"0000:{i + 16:02x}:00.0",
                "gpu_model": "h200",
                "numa_node": 0,
                "slot_group": "numa0",
                "nvme_device": f"/dev/disk/by-id/nvme-D{i}",
                "network_fabric": "infiniband",
                "fabric_vf_pci_address": f"0000:{i + 16:02x}:00.1",
                "fabric_claim_mode": "per_slot_vf",
                "mac_address": f"52:54:00:00:00:{i:02x}",
                "private_ip": f"10.100.0.{10 + i}",
                "nvme_identity": {"serial": f"S{i}", "size_bytes": 2**40},
                "capacity_metadata": {"storage_ownership": "slice", "destructive_wipe_policy": "w"},
                "blockers": [{"code": c, "message": c} for c in blocked.get(i, ())],
            }
        )
    smap = m.SlotMap.model_validate(
        {"apiVersion": m.API_VERSION, "kind": "SlotMap", "node": "n1", "approval_required": True, "slots": slots}
    )
    return candidates.Candidate("n1", smap, (), (), ())


@pytest.mark.parametrize(
    ("blocked", "line"),
    [
        ({}, "8 slots ready, 0 blocked"),
        ({3: ("disk.mounted",)}, "7 slots ready, 1 blocked: disk.mounted (slot 3)"),
        (
            {0: ("a.x",), 1: ("a.x",), 2: ("a.x", "b.y"), 5: ("a.x",), 7: ("b.y",)},
            "3 slots ready, 5 blocked: a.x (slots 0-2, 5), b.y (slots 2, 7)",
        ),
        ({i: ("host.no_kvm",) for i in range(8)}, "0 slots ready, 8 blocked: host.no_kvm (slots 0-7)"),
    ],
)
def test_summary_line(blocked: dict[int, tuple[str, ...]], line: str) -> None:
    assert proposals.summary(_slot_map(blocked)).line() == line


def test_a_slot_without_blockers_that_policy_refuses_is_counted_blocked_by_its_reason() -> None:
    candidate = _slot_map({})
    assert candidate.slot_map is not None
    slots = list(candidate.slot_map.slots)
    slots[4] = slots[4].model_copy(update={"fabric_vf_pci_address": slots[5].fabric_vf_pci_address})
    shared = candidate.slot_map.model_copy(update={"slots": tuple(slots)})
    summary = proposals.summary(candidates.Candidate("n1", shared, (), (), ()))
    assert summary.line() == "6 slots ready, 2 blocked: slot.vf_shared (slots 4-5)"


def test_proposed_node_takes_what_discovery_saw(trees: dict[str, Path]) -> None:
    found = discovering.discover(trees["xe9680-mi300x-roce"])
    doc = proposals.node_document(candidates.candidate_map(found, node="r09"), found)
    assert doc == {
        "apiVersion": m.API_VERSION,
        "kind": "Node",
        "name": "r09",
        "region": proposals.PLACEHOLDER,
        "pool": proposals.PLACEHOLDER,
        "hardware_tags": ["gpu-amd-mi300x"],
        "profile_tags": [m.PROFILE_SLICE_VM],
        "admin_state": "maintenance",
        "storage_mode": "slice",
        "os_disk": "/dev/disk/by-id/nvme-Dell_BOSS-N1_S7AMDR01OS",
    }
    # Filled in, the proposal is a valid Node as the loader types it.
    node = m.Node.model_validate({**doc, "region": "eu-west-1", "pool": "mi300x-roce"})
    assert node.admin_state is m.AdminState.MAINTENANCE and node.slice_tagged
