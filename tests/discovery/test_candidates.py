"""Pairing rules on hand-built facts (no sysfs): what gets which VF and disk, and which blocker.

numa0: gpu 0000:10:00.0 ─ switch A ─ nic 0000:11:00.0 (vf .1 .2) ─ nvme ctrl 0000:12:00.0
       gpu 0000:20:00.0 ─ switch B ─ nic 0000:21:00.0 (vf .1)    ─ nvme ctrl 0000:22:00.0
numa1: gpu 0000:90:00.0 ─ switch C ─ (nothing)
"""

from __future__ import annotations

import dataclasses

import pytest

from desired import models as m
from host_reconciler.discovery import blockers as b
from host_reconciler.discovery import candidates, facts, hosts
from schemas.errors import PermanentError


def _path(switch: str, dev: str) -> tuple[str, ...]:
    return (f"pci0000:{switch}", f"0000:{switch}:01.0", dev)


def gpu(addr: str, switch: str, numa: int | None, **kw: object) -> facts.Gpu:
    base = facts.Gpu(addr, "10de", "2335", "030200", "h200", numa, 1, (), "vfio-pci", _path(switch, addr))
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def nic(addr: str, switch: str, numa: int, vfs: int, *, state: str = "ACTIVE") -> facts.FabricDevice:
    port = facts.FabricPort(1, state, "LinkUp", "InfiniBand", None)
    functions = tuple(
        facts.VirtualFunction(
            f"{addr[:-1]}{n + 1}",
            n,
            addr,
            "vfio-pci",
            None,
            None,
            _path(switch, f"{addr[:-1]}{n + 1}"),
        )
        for n in range(vfs)
    )
    return facts.FabricDevice(
        addr,
        "15b3",
        "1021",
        "ConnectX-7",
        "mlx5_x",
        None,
        (port,),
        numa,
        "mlx5_core",
        16,
        vfs,
        functions,
        _path(switch, addr),
    )


def disk(name: str, ctrl: str, switch: str, numa: int, **kw: object) -> facts.NvmeNamespace:
    by_id = f"/dev/disk/by-id/nvme-TEST_{name}"
    base = facts.NvmeNamespace(
        name,
        by_id,
        (by_id,),
        "TEST",
        name,
        None,
        ctrl,
        numa,
        10**12,
        (),
        (),
        (),
        None,
        True,
        False,
        _path(switch, ctrl),
    )
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


OK = tuple(
    facts.Prerequisite(n, True, "ok")
    for n in (hosts.IOMMU, hosts.KVM, hosts.VFIO_PCI, hosts.LIBVIRT, hosts.OVS, hosts.REBOOT)
)


def host(
    gpus: list[facts.Gpu],
    fabric: list[facts.FabricDevice],
    nvme: list[facts.NvmeNamespace],
    prerequisites: tuple[facts.Prerequisite, ...] = OK,
) -> facts.Discovery:
    return facts.Discovery("h", "k", "", tuple(gpus), tuple(fabric), tuple(nvme), (), (), (), prerequisites)


def codes(p: candidates.Pairing) -> list[str]:
    return [x.code for x in p.blockers]


def test_gpus_take_the_vf_and_disk_under_their_own_switch() -> None:
    found = host(
        [gpu("0000:20:00.0", "b", 0), gpu("0000:10:00.0", "a", 0)],
        [nic("0000:11:00.0", "a", 0, 2), nic("0000:21:00.0", "b", 0, 1)],
        [disk("nvme1n1", "0000:22:00.0", "b", 0), disk("nvme0n1", "0000:12:00.0", "a", 0)],
    )
    p0, p1 = candidates.pairings(found)
    assert (p0.gpu.pci_address, p0.vf and p0.vf.pci_address, p0.disk and p0.disk.name) == (
        "0000:10:00.0",
        "0000:11:00.1",
        "nvme0n1",
    )
    assert (p1.gpu.pci_address, p1.vf and p1.vf.pci_address, p1.disk and p1.disk.name) == (
        "0000:20:00.0",
        "0000:21:00.1",
        "nvme1n1",
    )
    assert codes(p0) == codes(p1) == []


def test_remote_vf_and_disk_are_flagged_missing_ones_named() -> None:
    found = host(
        [gpu("0000:10:00.0", "a", 0), gpu("0000:90:00.0", "c", 1)],
        [nic("0000:11:00.0", "a", 0, 2)],
        [disk("nvme0n1", "0000:12:00.0", "a", 0), disk("nvme1n1", "0000:13:00.0", "a", 0)],
    )
    _, far = candidates.pairings(found)
    assert far.vf is not None and far.vf.pci_address == "0000:11:00.2"
    assert codes(far) == [b.FABRIC_NUMA_REMOTE, b.DISK_NUMA_REMOTE]
    lonely = candidates.pairings(host([gpu("0000:10:00.0", "a", 0)], [], [disk("nvme0n1", "x", "a", 0)]))
    assert codes(lonely[0]) == [b.FABRIC_NO_VF]


def test_os_disk_is_a_last_resort_and_never_silent() -> None:
    found = host(
        [gpu("0000:10:00.0", "a", 0), gpu("0000:20:00.0", "b", 0)],
        [nic("0000:11:00.0", "a", 0, 2)],
        [
            disk("nvme4n1", "0000:05:00.0", "a", 0, os_disk=True, mountpoints=("/",)),
            disk("nvme0n1", "0000:12:00.0", "z", 0),
        ],
    )
    first, second = candidates.pairings(found)
    assert first.disk is not None and first.disk.name == "nvme0n1"
    assert second.disk is not None and second.disk.name == "nvme4n1"
    assert codes(second) == [b.DISK_OS, b.DISK_MOUNTED]
    slot = candidates.candidate_map(found, node="n1").slot_map
    assert slot is not None and slot.slots[1].capacity_metadata.storage_ownership == "host"
    none_left = candidates.candidate_map(host([gpu("0000:10:00.0", "a", 0)], [], []), node="n1")
    assert none_left.slot_map is None
    assert b.DISK_NONE in codes(none_left.pairings[0])


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"driver": "nvidia"}, b.GPU_NOT_VFIO),
        ({"driver": None}, b.GPU_NOT_VFIO),
        ({"iommu_group": None}, b.GPU_NO_IOMMU_GROUP),
        ({"iommu_group_peers": ("0000:10:00.1",)}, b.GPU_IOMMU_GROUP_SHARED),
    ],
)
def test_gpu_blockers(change: dict[str, object], code: str) -> None:
    found = host(
        [gpu("0000:10:00.0", "a", 0, **change)],
        [nic("0000:11:00.0", "a", 0, 1)],
        [disk("nvme0n1", "0000:12:00.0", "a", 0)],
    )
    assert codes(candidates.pairings(found)[0]) == [code]


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"mountpoints": ("/srv/share",)}, b.DISK_MOUNTED),
        ({"holders": ("dm-0",)}, b.DISK_IN_USE),
        ({"signature": "xfs"}, b.DISK_SIGNATURE),
        ({"signature_checked": False}, b.DISK_SIGNATURE_UNCHECKED),
    ],
)
def test_disk_blockers(change: dict[str, object], code: str) -> None:
    found = host(
        [gpu("0000:10:00.0", "a", 0)],
        [nic("0000:11:00.0", "a", 0, 1)],
        [disk("nvme0n1", "0000:12:00.0", "a", 0, **change)],
    )
    assert codes(candidates.pairings(found)[0]) == [code]


def test_fabric_port_down_and_vf_driver() -> None:
    down = nic("0000:11:00.0", "a", 0, 1, state="DOWN")
    vf = dataclasses.replace(down.vfs[0], driver="mlx5_core")
    found = host(
        [gpu("0000:10:00.0", "a", 0)],
        [dataclasses.replace(down, vfs=(vf,))],
        [disk("nvme0n1", "0000:12:00.0", "a", 0)],
    )
    assert codes(candidates.pairings(found)[0]) == [b.FABRIC_VF_NOT_VFIO, b.FABRIC_PORT_DOWN]


def test_failed_prerequisites_block_every_slot_optional_ones_do_not() -> None:
    prereqs = (
        *OK[:4],
        facts.Prerequisite(hosts.REBOOT, False, "reboot required"),
        facts.Prerequisite(hosts.HUGEPAGES, False, "none reserved", required=False),
    )
    found = host(
        [gpu("0000:10:00.0", "a", 0), gpu("0000:20:00.0", "b", 0)],
        [nic("0000:11:00.0", "a", 0, 1), nic("0000:21:00.0", "b", 0, 1)],
        [disk("nvme0n1", "0000:12:00.0", "a", 0), disk("nvme1n1", "0000:22:00.0", "b", 0)],
        prereqs,
    )
    assert [codes(p) for p in candidates.pairings(found)] == [["host.reboot_required"]] * 2


def test_shared_parent_without_vfs() -> None:
    found = host(
        [gpu("0000:10:00.0", "a", 0), gpu("0000:20:00.0", "b", 0)],
        [nic("0000:11:00.0", "a", 0, 0)],
        [disk("nvme0n1", "0000:12:00.0", "a", 0), disk("nvme1n1", "0000:22:00.0", "b", 0)],
    )
    cand = candidates.candidate_map(found, node="n1")
    assert cand.slot_map is not None
    for slot in cand.slot_map.slots:
        assert slot.fabric_claim_mode is m.FabricClaimMode.SHARED_HOST
        assert [x.code for x in slot.blockers] == [b.FABRIC_NO_VF, b.FABRIC_SHARED_PARENT]
    alone = candidates.candidate_map(
        host(
            [gpu("0000:10:00.0", "a", 0)],
            [nic("0000:11:00.0", "a", 0, 0)],
            [disk("nvme0n1", "0000:12:00.0", "a", 0)],
        ),
        node="n1",
    )
    assert alone.slot_map is not None
    assert alone.slot_map.slots[0].fabric_claim_mode is m.FabricClaimMode.EXCLUSIVE_DEVICE


def test_mac_ip_and_numbering_are_deterministic() -> None:
    assert candidates.mac_address("h200-use1-s01", 0) == "52:54:87:b3:44:81"
    assert candidates.private_ip(m.ManagementNetwork(), 7) == "10.100.0.17"
    gpus = [
        gpu("0000:90:00.0", "c", 1),
        gpu("0000:20:00.0", "b", None),
        gpu("0000:10:00.0", "a", 0),
    ]
    found = host(gpus, [], [disk(f"nvme{i}n1", f"0000:1{i}:00.0", "z", 0) for i in range(3)])
    cand = candidates.candidate_map(found, node="n1")
    assert cand.slot_map is not None
    assert [(s.gpu_pci_address, s.numa_node, s.pcie_pair) for s in cand.slot_map.slots] == [
        ("0000:10:00.0", 0, "numa0-pair0"),
        ("0000:20:00.0", 0, "numa0-pair0"),
        ("0000:90:00.0", 1, "numa1-pair0"),
    ]
    assert candidates.candidate_map(found, node="n1") == cand


def test_bad_node_name_is_refused_with_a_code() -> None:
    with pytest.raises(PermanentError) as e:
        candidates.candidate_map(host([], [], []), node="Not A Name")
    assert e.value.code == candidates.NODE_INVALID


def test_closeness() -> None:
    assert candidates.closeness(("r", "p", "s", "g"), ("r", "p", "s", "n")) == 3
    assert candidates.closeness(("r", "p", "g"), ("q", "p", "n")) == 0
