"""sysfs readers: the parsing tables, and recorded trees changed the way real hosts change."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from host_reconciler.discovery import blockers, candidates, discovering, disks, facts, hosts

pytestmark = pytest.mark.integration  # real git repositories and subprocesses


def _at(offset: int, magic: bytes, size: int = 70000) -> bytes:
    data = bytearray(size)
    data[offset : offset + len(magic)] = magic
    return bytes(data)


@pytest.mark.parametrize(
    ("header", "signature"),
    [
        (b"", None),
        (bytes(70000), None),
        (_at(510, b"\x55\xaa"), "dos"),
        (_at(510, b"\x55\xaa")[:512] + b"EFI PART" + bytes(100), "gpt"),
        (_at(1080, b"\x53\xef"), "ext4"),
        (_at(0, b"XFSB"), "xfs"),
        (_at(0, b"LUKS\xba\xbe"), "crypto_LUKS"),
        (_at(512, b"LABELONE"), "LVM2_member"),
        (_at(65600, b"_BHRfS_M"), "btrfs"),
        (_at(4086, b"SWAPSPACE2"), "swap"),
        (_at(4096, b"\xfc\x4e\x2b\xa9"), "linux_raid_member"),
    ],
)
def test_detect_signature(header: bytes, signature: str | None) -> None:
    assert disks.detect_signature(header) == signature


def test_mount_points_decode_escapes() -> None:
    text = (
        "21 1 259:3 / / rw - ext4 /dev/nvme4n1p2 rw\n"
        "30 21 259:9 / /srv/my\\040share rw - xfs /dev/nvme8n1p1 rw\n"
        "31 21 259:9 / /mnt/again rw - xfs /dev/nvme8n1p1 rw\nshort line\n"
    )
    assert disks.mount_points(text) == {
        "259:3": ("/",),
        "259:9": ("/srv/my share", "/mnt/again"),
    }


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,8,10-11", (0, 1, 2, 3, 8, 10, 11)),
        ("", ()),
        (None, ()),
        ("0-x", ()),
        ("5", (5,)),
    ],
)
def test_parse_cpulist(text: str | None, cpus: tuple[int, ...]) -> None:
    assert hosts.parse_cpulist(text) == cpus


@pytest.mark.parametrize(
    ("model", "serial", "wwid", "name"),
    [
        (
            "SAMSUNG MZWLR3T8HBLS-00007",
            "S6EXNA0W100",
            None,
            "/dev/disk/by-id/nvme-SAMSUNG_MZWLR3T8HBLS-00007_S6EXNA0W100",
        ),
        ("Odd/Model  X", " SN 1 ", None, "/dev/disk/by-id/nvme-Odd_Model_X_SN_1"),
        (None, None, "eui.0025388a1b2c3d4e", "/dev/disk/by-id/nvme-eui.0025388a1b2c3d4e"),
        (None, None, None, None),
    ],
)
def test_by_id_path(model: str | None, serial: str | None, wwid: str | None, name: str | None) -> None:
    assert disks.by_id_path(model, serial, wwid) == name


def _prereq(found: facts.Discovery, name: str) -> facts.Prerequisite:
    return next(p for p in found.prerequisites if p.name == name)


def test_by_id_is_built_from_sysfs_without_udev_links(tree_copy: Callable[[str], Path]) -> None:
    root = tree_copy("xe9680l-h200")
    with_links = discovering.discover(root)
    shutil.rmtree(root / "dev" / "disk")
    without = discovering.discover(root)
    assert [d.by_id for d in without.nvme] == [d.by_id for d in with_links.nvme]
    assert without.os_disks == (facts.BlockDevice("nvme4n1", None),)
    assert with_links.nvme[0].by_id_aliases == (
        "/dev/disk/by-id/nvme-SAMSUNG_MZWLR3T8HBLS-00007_S6EXNA0W100",
        "/dev/disk/by-id/nvme-SAMSUNG_MZWLR3T8HBLS-00007_S6EXNA0W100_1",
        "/dev/disk/by-id/nvme-eui.0025388500001c0a",
    )


def test_unreadable_header_blocks_instead_of_guessing(tree_copy: Callable[[str], Path]) -> None:
    root = tree_copy("xe9680l-h200")
    (root / "dev" / "nvme2n1").unlink()
    found = discovering.discover(root)
    assert [d.signature_checked for d in found.nvme].count(False) == 1
    cand = candidates.candidate_map(found, node="n1")
    assert cand.slot_map is not None
    assert [x.code for x in cand.slot_map.slots[2].blockers] == [blockers.DISK_SIGNATURE_UNCHECKED]


def test_staged_kernel_args_mean_reboot_required(tree_copy: Callable[[str], Path]) -> None:
    root = tree_copy("xe9680l-h200")
    cmdline = root / "proc" / "cmdline"
    cmdline.write_text(cmdline.read_text().replace(" intel_iommu=on iommu=pt", ""))
    found = discovering.discover(root)
    reboot = _prereq(found, hosts.REBOOT)
    assert not reboot.ok and reboot.detail.endswith("intel_iommu=on iommu=pt")
    assert found.reboot_required
    cand = candidates.candidate_map(found, node="n1")
    assert cand.slot_map is not None
    assert all("host.reboot_required" in [x.code for x in s.blockers] for s in cand.slot_map.slots)


def test_reboot_flag_and_missing_host_pieces(tree_copy: Callable[[str], Path]) -> None:
    root = tree_copy("xe9680l-h200")
    (root / "run" / "reboot-required").write_text("")
    shutil.rmtree(root / "sys" / "kernel" / "iommu_groups")
    for dirpath, _, filenames in os.walk(root / "sys" / "devices"):
        if "iommu_group" in filenames:  # os.walk lists symlinks among files
            os.unlink(os.path.join(dirpath, "iommu_group"))
    shutil.rmtree(root / "sys" / "bus" / "pci" / "drivers" / "vfio-pci")
    shutil.rmtree(root / "sys" / "module" / "vfio_pci")
    (root / "dev" / "kvm").unlink()
    for gone in (
        "usr/sbin/libvirtd",
        "usr/bin/virsh",
        "usr/sbin/ovs-vswitchd",
        "usr/bin/ovs-vsctl",
    ):
        (root / gone).unlink()
    found = discovering.discover(root)
    assert {p.name: p.ok for p in found.prerequisites} == {
        "iommu": False,
        "kvm": False,
        "vfio_pci": False,
        "libvirt": False,
        "ovs": False,
        "reboot": False,
        "hugepages": True,
    }
    cand = candidates.candidate_map(found, node="n1")
    assert cand.slot_map is not None
    codes = [x.code for x in cand.slot_map.slots[0].blockers]
    assert codes[:6] == [
        "host.iommu_off",
        "host.no_kvm",
        "host.no_vfio_pci",
        "host.no_libvirt",
        "host.no_ovs",
        "host.reboot_required",
    ]
    assert blockers.GPU_NO_IOMMU_GROUP in codes


def test_gpu_driver_and_vf_read_from_links(trees: dict[str, Path]) -> None:
    found = discovering.discover(trees["xe9680-mi300x-roce"])
    assert [g.driver for g in found.gpus].count("amdgpu") == 1
    assert {g.pci_class for g in found.gpus} == {"120000"}
    nic = found.fabric_device("0000:0c:00.0")
    assert nic is not None
    assert (nic.fabric, nic.ib_device, nic.sriov_numvfs) == ("roce", "mlx5_0", 2)
    assert [(v.index, v.pci_address, v.driver) for v in nic.vfs] == [
        (0, "0000:0c:00.1", "vfio-pci"),
        (1, "0000:0c:00.2", "vfio-pci"),
    ]
    assert [n.cpulist for n in found.numa_nodes] == ["0-55,112-167", "56-111,168-223"]
    share = next(d for d in found.nvme if d.name == "nvme8n1")
    assert (share.mountpoints, share.signature, share.partitions) == (
        ("/srv/share/nvme8n1",),
        "gpt",
        ("nvme8n1p1",),
    )
