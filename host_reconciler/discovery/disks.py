"""NVMe namespaces: stable identity, size, mounts, signatures, and the OS disk.

Identity is a `/dev/disk/by-id` path, never the volatile `nvme3n1`: udev's
links under `dev/disk/by-id` are used when the root has them, otherwise the
name udev would write is built from the controller's model and serial (or the
namespace's wwid). Mount state comes from `proc/self/mountinfo` by
major:minor, so a mounted partition, or a dm/md device stacked on one, counts
as the disk being mounted.

Signatures: a disk header is read from `dev/<name>` under the root, at most
68 KiB, with O_RDONLY. On a live host that is the block device; a recorded
tree stores the first bytes of each disk in a plain file of the same name
(an empty file is a disk whose header is all zeros). A header that cannot be
read is reported as unchecked, which blocks the slot rather than guessing.
"""

from __future__ import annotations

import re

from desired.patterns import BY_ID_PREFIX
from host_reconciler.discovery import facts
from host_reconciler.discovery.sysfs import PCI_DEVICES, SysRoot
from host_reconciler.mountinfo import parse_mountinfo

BY_ID = "dev/disk/by-id"
HEADER_BYTES = 68 * 1024
OS_MOUNTPOINTS = ("/", "/boot", "/boot/efi", "/usr", "/var")

_NAMESPACE = re.compile(r"^nvme\d+n\d+$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._:+@-]")
# Generic by-id forms; a model_serial name reads better in a review and is preferred.
_GENERIC_BY_ID = ("nvme-eui.", "nvme-nvme.", "nvme-uuid.", "wwn-")

# (offset, magic, name), most specific first: a GPT disk also carries a protective MBR.
_SIGNATURES: tuple[tuple[int, bytes, str], ...] = (
    (512, b"EFI PART", "gpt"),
    (4096, b"EFI PART", "gpt"),
    (0, b"LUKS\xba\xbe", "crypto_LUKS"),
    (0, b"XFSB", "xfs"),
    (512, b"LABELONE", "LVM2_member"),
    (1080, b"\x53\xef", "ext4"),
    (4096, b"\xfc\x4e\x2b\xa9", "linux_raid_member"),
    (65600, b"_BHRfS_M", "btrfs"),
    (4086, b"SWAPSPACE2", "swap"),
    (3, b"NTFS    ", "ntfs"),
    (510, b"\x55\xaa", "dos"),
)


def detect_signature(header: bytes) -> str | None:
    """The first filesystem, RAID, LVM or partition-table magic found; None if clean."""
    for offset, magic, name in _SIGNATURES:
        if header[offset : offset + len(magic)] == magic:
            return name
    return None


def mount_points(text: str) -> dict[str, tuple[str, ...]]:
    """major:minor -> mount points, from `/proc/self/mountinfo` text."""
    out: dict[str, list[str]] = {}
    for mount in parse_mountinfo(text):
        out.setdefault(mount.majmin, []).append(mount.mount_point)
    return {k: tuple(v) for k, v in out.items()}


def by_id_path(model: str | None, serial: str | None, wwid: str | None) -> str | None:
    """The by-id path udev writes for an NVMe namespace, from sysfs attributes."""
    if model and serial:
        name = f"nvme-{'_'.join(model.split())}_{'_'.join(serial.split())}"
    elif wwid:
        name = f"nvme-{'_'.join(wwid.split())}"
    else:
        return None
    return BY_ID_PREFIX + _UNSAFE.sub("_", name)


def _preferred(aliases: list[str]) -> str | None:
    if not aliases:
        return None
    return min(aliases, key=lambda a: (a.removeprefix(BY_ID_PREFIX).startswith(_GENERIC_BY_ID), len(a), a))


class DiskReader:
    def __init__(self, sr: SysRoot) -> None:
        self.sr = sr
        self.mounts = mount_points(sr.read("proc/self/mountinfo") or "")
        self.by_id: dict[str, list[str]] = {}
        for link in sr.listdir(BY_ID):
            target = sr.link_name(f"{BY_ID}/{link}")
            if target is not None:
                self.by_id.setdefault(target, []).append(BY_ID_PREFIX + link)
        self.os_names = self._os_disk_names()

    # --------------------------------------------------------------- OS disk

    def _os_disk_names(self) -> tuple[str, ...]:
        names: list[str] = []
        for point in OS_MOUNTPOINTS:
            for majmin, points in self.mounts.items():
                if point in points:
                    for disk in self._disks_of(f"sys/dev/block/{majmin}", depth=0):
                        if disk not in names:
                            names.append(disk)
        return tuple(names)

    def _disks_of(self, rel: str, depth: int) -> list[str]:
        """The whole disks under a block device: itself, its parent, or its dm/md slaves."""
        chain = self.sr.device_path(rel)
        if not chain or depth > 8:
            return []
        if self.sr.exists(f"{rel}/partition"):
            return [chain[-2]]
        slaves = self.sr.listdir(f"{rel}/slaves")
        if slaves:
            return [d for s in slaves for d in self._disks_of(f"sys/class/block/{s}", depth + 1)]
        return [chain[-1]]

    def os_disks(self) -> tuple[facts.BlockDevice, ...]:
        return tuple(facts.BlockDevice(name, _preferred(self.by_id.get(name, []))) for name in self.os_names)

    # ------------------------------------------------------------ namespaces

    def namespaces(self) -> tuple[facts.NvmeNamespace, ...]:
        names = [n for n in self.sr.listdir("sys/block") if _NAMESPACE.match(n)]
        names.sort(key=lambda n: tuple(int(x) for x in re.findall(r"\d+", n)))
        return tuple(self._namespace(n, n in self.os_names) for n in names)

    def _controller_address(self, base: str) -> str | None:
        addr = self.sr.read(f"{base}/device/address")
        if addr:
            return addr
        # Native NVMe multipath: the namespace hangs off a subsystem; ask its controllers.
        for ctrl in self.sr.listdir(f"{base}/device"):
            if re.match(r"^nvme\d+$", ctrl):
                addr = self.sr.read(f"{base}/device/{ctrl}/address")
                if addr:
                    return addr
        return self.sr.link_name(f"{base}/device/device")

    def _namespace(self, name: str, os_disk: bool) -> facts.NvmeNamespace:
        sr = self.sr
        base = f"sys/block/{name}"
        model = sr.read(f"{base}/device/model")
        serial = sr.read(f"{base}/device/serial")
        wwid = sr.read(f"{base}/wwid")
        aliases = sorted(self.by_id.get(name, []))
        if not aliases:
            built = by_id_path(model, serial, wwid)
            aliases = [built] if built else []
        ctrl = self._controller_address(base)
        parts = tuple(p for p in sr.listdir(base) if p.startswith(name) and sr.exists(f"{base}/{p}/partition"))
        devs = [sr.read(f"{base}/dev")] + [sr.read(f"{base}/{p}/dev") for p in parts]
        holders: list[str] = []
        for rel in [base] + [f"{base}/{p}" for p in parts]:
            holders.extend(sr.listdir(f"{rel}/holders"))
        devs.extend(sr.read(f"sys/class/block/{h}/dev") for h in holders)
        points = tuple(p for d in devs if d for p in self.mounts.get(d, ()))
        header = sr.read_bytes(f"dev/{name}", HEADER_BYTES)
        signature = detect_signature(header) if header is not None else None
        if signature is None and parts:
            signature = "partitions"
        numa = sr.read_int(f"{PCI_DEVICES}/{ctrl}/numa_node") if ctrl else None
        return facts.NvmeNamespace(
            name=name,
            by_id=_preferred(aliases),
            by_id_aliases=tuple(aliases),
            model=model,
            serial=serial,
            wwid=wwid,
            controller_pci_address=ctrl,
            numa_node=None if numa is None or numa < 0 else numa,
            size_bytes=(sr.read_int(f"{base}/size") or 0) * 512,
            partitions=parts,
            mountpoints=points,
            holders=tuple(holders),
            signature=signature,
            signature_checked=header is not None,
            os_disk=os_disk,
            pci_path=sr.device_path(f"{PCI_DEVICES}/{ctrl}") if ctrl else (),
        )
