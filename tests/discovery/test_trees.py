"""Discovery on each recorded tree gives the expected candidate, compared as whole documents.

Golden files hold the full `gpuaas host discover` output (YAML for every tree,
JSON for the H200 host). Regenerate them after an intended change with
GPUAAS_UPDATE_GOLDEN=1 .venv/bin/pytest tests/discovery, then review the diff.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from desired import models as m
from host_reconciler.discovery import blockers, candidates, discovering, proposals
from policies import eligibility
from reconciler import cli, sources
from tests.discovery.conftest import FLEET, GOLDEN, NODES, TREES

UPDATE = os.environ.get("GPUAAS_UPDATE_GOLDEN") == "1"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with GPUAAS_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from its golden file"


@pytest.mark.parametrize("tree", TREES)
def test_candidate_yaml_matches_golden(tree: str, trees: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_cli(capsys, "host", "discover", "--sysfs-root", str(trees[tree]))
    assert (status, err) == (0, "")
    check_golden(f"{tree}.yaml", out)


def test_discovery_json_matches_golden(trees: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_cli(capsys, "host", "discover", "--sysfs-root", str(trees["xe9680l-h200"]), "-o", "json")
    assert status == 0
    check_golden("xe9680l-h200.json", out)
    doc = json.loads(out)
    assert doc["candidate"]["approval_required"] is True
    assert len(doc["discovery"]["gpus"]) == 8


@pytest.mark.parametrize("tree", TREES)
def test_candidate_is_the_node_example_map_plus_blockers(tree: str, trees: dict[str, Path]) -> None:
    """The example fleet's approved maps describe these hosts: discovery agrees slot by slot."""
    found = discovering.discover(trees[tree])
    candidate = candidates.candidate_map(found, node=NODES[tree])
    assert candidate.slot_map is not None
    approved = m.SlotMap.model_validate(yaml.safe_load((FLEET / "slotmaps" / f"{NODES[tree]}.yaml").read_text()))
    strip = {"blockers": (), "capacity_metadata": m.CapacityMetadata()}
    # The demo nodes' maps record no disk identity (their lab disks are loop devices): compare without it.
    if all(s.nvme_identity is None for s in approved.slots):
        strip["nvme_identity"] = None
    got = [s.model_copy(update=strip) for s in candidate.slot_map.slots]
    want = [s.model_copy(update=strip) for s in approved.slots]
    assert got == want


@pytest.mark.parametrize("tree", TREES)
def test_candidate_records_each_disk_identity_as_sysfs_reports_it(tree: str, trees: dict[str, Path]) -> None:
    found = discovering.discover(trees[tree])
    candidate = candidates.candidate_map(found, node=NODES[tree])
    assert candidate.slot_map is not None
    for slot in candidate.slot_map.slots:
        disk = found.disk_by_id(slot.nvme_device)
        assert disk is not None and slot.nvme_identity is not None
        assert slot.nvme_identity == m.NvmeIdentity(
            model=disk.model, serial=disk.serial, wwid=disk.wwid, size_bytes=disk.size_bytes
        )
        sys_block = trees[tree] / "sys" / "block" / disk.name
        assert slot.nvme_identity.size_bytes == int((sys_block / "size").read_text()) * 512
        assert slot.nvme_identity.serial == (sys_block / "device" / "serial").read_text().strip()


def test_h200_candidate_has_no_blocker(trees: dict[str, Path]) -> None:
    candidate = candidates.candidate_map(discovering.discover(trees["xe9680l-h200"]), node="n1")
    assert candidate.slot_map is not None
    assert [s.blockers for s in candidate.slot_map.slots] == [()] * 8
    assert candidate.spare_disks == ("/dev/disk/by-id/nvme-Dell_BOSS-N1_S6EXNA0W1OS",)


def test_shared_parent_tree_blocks_every_slot(trees: dict[str, Path]) -> None:
    candidate = candidates.candidate_map(
        discovering.discover(trees["xe9680l-h200-shared-parent"]), node="h200-use1-c01"
    )
    assert candidate.slot_map is not None
    slots = candidate.slot_map.slots
    assert len(slots) == 8
    for slot in slots:
        codes = {b.code for b in slot.blockers}
        assert {blockers.FABRIC_NO_VF, blockers.FABRIC_SHARED_PARENT} <= codes
        assert slot.fabric_vf_pci_address is None
        assert slot.fabric_parent_device == "0000:1a:00.0"
    # Even once an operator removes approval_required, nothing is sellable.
    approved = candidate.slot_map.model_copy(update={"approval_required": False})
    assert all(eligibility.eligible_slots(approved).values())


def test_mi300x_blockers_name_the_broken_slots(trees: dict[str, Path]) -> None:
    candidate = candidates.candidate_map(discovering.discover(trees["xe9680-mi300x-roce"]), node="mi300x-euw1-r01")
    assert candidate.slot_map is not None
    codes = {s.slot_index: [b.code for b in s.blockers] for s in candidate.slot_map.slots}
    assert codes == {
        0: [],
        1: [],
        2: [],
        4: [],
        3: [blockers.FABRIC_PORT_DOWN],
        5: [blockers.DISK_SIGNATURE],
        6: [blockers.GPU_NOT_VFIO],
        7: [blockers.DISK_MOUNTED, blockers.DISK_SIGNATURE],
    }
    assert {s.network_fabric for s in candidate.slot_map.slots} == {m.Fabric.ROCE}
    slot7 = candidate.slot_map.slots[7]
    assert slot7.capacity_metadata.storage_ownership == "share"
    assert slot7.capacity_metadata.destructive_wipe_policy is None


# A new name per host: onboarding adds a node the example fleet does not have yet.
NEW_NODES = {
    "xe9680l-h200": ("h200-use1-s09", "us-east-1", "h200-slice"),
    "xe9680l-h200-shared-parent": ("h200-use1-c09", "us-east-1", "h200-slice"),
    "xe9680-mi300x-roce": ("mi300x-euw1-r09", "eu-west-1", "mi300x-roce"),
}


@pytest.mark.parametrize("tree", TREES)
def test_candidate_and_proposed_node_validate_in_the_example_fleet(
    tree: str, trees: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node, region, pool = NEW_NODES[tree]
    status, out, _ = run_cli(capsys, "host", "discover", "--sysfs-root", str(trees[tree]), "--node", node)
    assert status == 0
    slot_doc, node_doc = yaml.safe_load_all(out)
    assert slot_doc.pop("approval_required") is True
    slot_map = m.SlotMap.model_validate(slot_doc)
    found = discovering.discover(trees[tree])
    assert (slot_map.node, node_doc["name"]) == (node, node)
    assert found.os_disks[0].by_id is not None
    assert node_doc["os_disk"] == found.os_disks[0].by_id
    assert (node_doc["region"], node_doc["pool"]) == (proposals.PLACEHOLDER,) * 2
    repo = tmp_path / "fleet"
    shutil.copytree(FLEET, repo)
    dropped = repo / "slotmaps" / f"{node}.yaml"
    # Unfilled placeholders are refused, by field.
    dropped.write_text(out)
    refused = sources.load(repo).errors
    assert {e.message.split("'")[1] for e in refused if e.code == "desired.field.value"} == {"region", "pool"}
    # ... and the slot map then names a node that does not exist; nothing else is wrong.
    assert {e.code for e in refused} == {"desired.field.value", "desired.ref.unresolved"}
    # The operator's edit: delete one line, fill the two placeholders.
    text = "\n".join(line for line in out.splitlines() if line != "approval_required: true") + "\n"
    text = text.replace("region: FILL-IN", f"region: {region}").replace("pool: FILL-IN", f"pool: {pool}")
    dropped.write_text(text)
    result = sources.load(repo)
    assert result.errors == [], [e.render() for e in result.errors]
    assert result.state.nodes[node].os_disk == node_doc["os_disk"]
    assert result.state.slot_maps[node].slots == slot_map.slots
    status, out, _ = run_cli(capsys, "validate", str(repo))
    assert status == 0 and out.splitlines()[-1].startswith("valid:")
    # Blocked slots validate but are reported as never schedulable, by code.
    unschedulable = {int(w.message.split()[3]) for w in result.warnings if w.message.startswith(f"node {node} ")}
    assert unschedulable == {s.slot_index for s in slot_map.slots if s.blockers}
    # ... and the summary at the top of the candidate counted the same slots.
    summary = proposals.summary(candidates.candidate_map(found, node=node))
    assert set(summary.blocked) == unschedulable
    assert len(summary.ready) == len(slot_map.slots) - len(unschedulable)


def test_discovery_is_read_only(trees: dict[str, Path]) -> None:
    root = trees["xe9680-mi300x-roce"]

    def snapshot() -> dict[str, tuple[int, int, int]]:
        out = {}
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                st = os.lstat(os.path.join(dirpath, name))
                out[os.path.join(dirpath, name)] = (st.st_mtime_ns, st.st_size, st.st_mode)
        return out

    before = snapshot()
    discovering.discover(root)
    assert snapshot() == before


def test_node_defaults_to_hostname_and_facts_are_frozen(trees: dict[str, Path]) -> None:
    found = discovering.discover(trees["xe9680l-h200"])
    assert found.hostname == "h200-use1-s01"
    with pytest.raises(dataclasses.FrozenInstanceError):
        found.gpus[0].driver = "nvidia"  # type: ignore[misc]
