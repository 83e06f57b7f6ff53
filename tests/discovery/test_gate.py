"""The approval gate: drifted slots are blocked with old and new values; the rest stay in service.

slot:   0        1        2 ...  7
GPU     1b:00.0  3c:00.0  ...        approved map: examples/fleet/slotmaps/h200-use1-s01.yaml
VF      1a:00.1  3a:00.1  ...        host: examples/sysfs xe9680l-h200
disk    ...W100  ...W101  ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from desired import models as m
from host_reconciler import discoverycommand as discovery_cli
from host_reconciler.discovery import candidates, discovering, facts, gating, rendering
from policies import eligibility
from reconciler import cli
from tests.discovery.conftest import FLEET, move_pci_function, relink

APPROVED = FLEET / "slotmaps" / "h200-use1-s01.yaml"


@pytest.fixture(scope="module")
def example() -> m.SlotMap:
    """The example map as committed."""
    return m.SlotMap.model_validate(yaml.safe_load(APPROVED.read_text()))


@pytest.fixture
def h200(trees: dict[str, Path]) -> facts.Discovery:
    return discovering.discover(trees["xe9680l-h200"])


@pytest.fixture
def approved(example: m.SlotMap, h200: facts.Discovery) -> m.SlotMap:
    """The example map with each disk's identity as discovery records it: eligible, so only drift blocks."""
    return _with_identities(example, h200)


@pytest.fixture
def approved_file(approved: m.SlotMap, tmp_path: Path) -> Path:
    path = tmp_path / "h200-use1-s01.yaml"
    path.write_text(yaml.safe_dump(rendering.slot_map_document(approved), sort_keys=False))
    return path


def test_matching_host_keeps_every_slot(approved: m.SlotMap, h200: facts.Discovery) -> None:
    result = gating.gate(approved, h200)
    assert result.schedulable == tuple(range(8))
    assert result.blocked == {} and result.ineligible == {}
    assert result.unapproved_gpus == ()


def test_renumbered_vf_blocks_exactly_that_slot(approved: m.SlotMap, tree_copy: Callable[[str], Path]) -> None:
    root = tree_copy("xe9680l-h200")
    move_pci_function(root, "0000:3a:00.1", "0000:3a:00.3")
    result = gating.gate(approved, discovering.discover(root))
    assert result.schedulable == (0, 2, 3, 4, 5, 6, 7)
    assert result.drifts == (
        gating.Drift(
            1,
            gating.VF_MISSING,
            "fabric_vf_pci_address",
            "0000:3a:00.1",
            "0000:3a:00.3",
            "VF 0000:3a:00.1 is gone; discovery now proposes 0000:3a:00.3",
        ),
    )


def test_gate_command_reports_drift_and_exit_status(
    approved_file: Path,
    trees: dict[str, Path],
    tree_copy: Callable[[str], Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["host", "gate", str(approved_file), "--sysfs-root", str(trees["xe9680l-h200"])]) == 0
    assert "8 slot(s) in service, 0 blocked" in capsys.readouterr().out
    root = tree_copy("xe9680l-h200")
    move_pci_function(root, "0000:3a:00.1", "0000:3a:00.3")
    status = cli.main(["host", "gate", str(approved_file), "--sysfs-root", str(root), "-o", "json"])
    assert status == discovery_cli.EXIT_BLOCKED == 3
    out = capsys.readouterr().out
    assert '"old": "0000:3a:00.1"' in out and '"new": "0000:3a:00.3"' in out


def _replace_gpu(d: facts.Discovery, addr: str, **changes: object) -> facts.Discovery:
    gpus = tuple(
        dataclasses.replace(g, **changes) if g.pci_address == addr else g  # type: ignore[arg-type]
        for g in d.gpus
    )
    return dataclasses.replace(d, gpus=gpus)


def _replace_disk(d: facts.Discovery, name: str, **changes: object) -> facts.Discovery:
    nvme = tuple(
        dataclasses.replace(n, **changes) if n.name == name else n  # type: ignore[arg-type]
        for n in d.nvme
    )
    return dataclasses.replace(d, nvme=nvme)


def _move_vf(d: facts.Discovery, vf_addr: str, new_parent: str) -> facts.Discovery:
    fabric = tuple(
        dataclasses.replace(
            f,
            vfs=tuple(dataclasses.replace(v, parent=new_parent) if v.pci_address == vf_addr else v for v in f.vfs),
        )
        for f in d.fabric
    )
    return dataclasses.replace(d, fabric=fabric)


W105 = "/dev/disk/by-id/nvme-SAMSUNG_MZWLR3T8HBLS-00007_S6EXNA0W105"
SWAPPED = "/dev/disk/by-id/nvme-SAMSUNG_MZWLR3T8HBLS-00007_S6EXNA0W999"

# (what changes on the host, blocked slot, code, field, old, new)
CASES: list[tuple[str, Callable[[facts.Discovery], facts.Discovery], int, str, str, object, object]] = [
    (
        "gpu gone",
        lambda d: dataclasses.replace(d, gpus=tuple(g for g in d.gpus if g.pci_address != "0000:cd:00.0")),
        6,
        gating.GPU_MISSING,
        "gpu_pci_address",
        "0000:cd:00.0",
        None,
    ),
    (
        "gpu numa",
        lambda d: _replace_gpu(d, "0000:4b:00.0", numa_node=1),
        2,
        gating.NUMA_CHANGED,
        "numa_node",
        0,
        1,
    ),
    (
        "disk swapped",
        lambda d: _replace_disk(d, "nvme6n1", by_id=SWAPPED, by_id_aliases=(SWAPPED,)),
        5,
        gating.DISK_MISSING,
        "nvme_device",
        W105,
        SWAPPED,
    ),
    (
        "disk mounted",
        lambda d: _replace_disk(d, "nvme7n1", mountpoints=("/srv/share",)),
        6,
        gating.DISK_MOUNTED,
        "mounted",
        False,
        True,
    ),
    (
        "disk is os",
        lambda d: _replace_disk(d, "nvme8n1", os_disk=True),
        7,
        gating.DISK_OS,
        "os_disk",
        False,
        True,
    ),
    (
        "vf parent",
        lambda d: _move_vf(d, "0000:9b:00.1", "0000:ba:00.0"),
        4,
        gating.VF_PARENT_CHANGED,
        "fabric_parent_device",
        "0000:9b:00.0",
        "0000:ba:00.0",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_drift_blocks_only_its_slot(approved: m.SlotMap, h200: facts.Discovery, case: tuple[Any, ...]) -> None:
    _, change, slot, code, field, old, new = case
    result = gating.gate(approved, change(h200))
    assert list(result.blocked) == [slot]
    (drift,) = result.blocked[slot]
    assert (drift.code, drift.field, drift.old, drift.new) == (code, field, old, new)
    assert result.schedulable == tuple(i for i in range(8) if i != slot)


def test_new_gpu_is_listed_not_sold(approved: m.SlotMap, h200: facts.Discovery) -> None:
    fewer = approved.model_copy(update={"slots": approved.slots[:7]})
    result = gating.gate(fewer, h200)
    assert result.schedulable == tuple(range(7))
    assert result.unapproved_gpus == ("0000:dc:00.0",)


def test_unapproved_map_blocks_everything(approved: m.SlotMap, h200: facts.Discovery) -> None:
    pending = approved.model_copy(update={"approval_required": True})
    result = gating.gate(pending, h200)
    assert result.schedulable == ()
    assert result.blocked == {}  # nothing drifted: the map is not approved yet, by policy
    assert {r.code for why in result.ineligible.values() for r in why} == {eligibility.NOT_APPROVED}
    assert result.unschedulable == tuple(range(8))


def test_gate_reads_any_by_id_alias(approved: m.SlotMap, h200: facts.Discovery) -> None:
    """An approved map may name a disk by its eui link; that is the same disk."""
    disk = h200.disk_by_id(approved.slots[0].nvme_device)
    assert disk is not None
    eui = next(a for a in disk.by_id_aliases if "eui." in a)
    slots = (approved.slots[0].model_copy(update={"nvme_device": eui}), *approved.slots[1:])
    assert gating.gate(approved.model_copy(update={"slots": slots}), h200).blocked == {}


def _with_identities(approved: m.SlotMap, found: facts.Discovery) -> m.SlotMap:
    """The approved map as discovery records it now: each slot with its disk's nvme_identity."""
    slots = []
    for s in approved.slots:
        disk = found.disk_by_id(s.nvme_device)
        assert disk is not None
        identity = candidates.nvme_identity(disk)
        slots.append(s.model_copy(update={"nvme_identity": m.NvmeIdentity.model_validate(identity)}))
    return approved.model_copy(update={"slots": tuple(slots)})


def test_recorded_identity_matches_the_host_it_was_read_from(example: m.SlotMap, h200: facts.Discovery) -> None:
    assert gating.gate(_with_identities(example, h200), h200).blocked == {}


def test_repointed_by_id_link_is_an_identity_change_of_that_slot_only(
    example: m.SlotMap, h200: facts.Discovery, tree_copy: Callable[[str], Path]
) -> None:
    """slot 0's by-id link now leads to nvme1n1 (slot 1's disk): the path still resolves, the disk is another."""
    with_ids = _with_identities(example, h200)
    root = tree_copy("xe9680l-h200")
    link = with_ids.slots[0].nvme_device.removeprefix("/")
    relink(root, link, root / "dev" / "nvme1n1")
    result = gating.gate(with_ids, discovering.discover(root))
    assert list(result.blocked) == [0]
    (drift,) = result.blocked[0]
    assert (drift.code, drift.field) == (gating.DISK_IDENTITY_CHANGED, "nvme_identity")
    assert drift.old == "serial=S6EXNA0W100 wwid=eui.0025388500001c0a"
    assert drift.new == "serial=S6EXNA0W101 wwid=eui.0025388500013d0a"
    assert "nvme1n1" in drift.message
    # Without a recorded identity the same host shows no drift: the by-id path alone cannot tell.
    no_ids = tuple(s.model_copy(update={"nvme_identity": None}) for s in example.slots)
    assert gating.gate(example.model_copy(update={"slots": no_ids}), discovering.discover(root)).blocked == {}
