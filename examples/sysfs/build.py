#!/usr/bin/env python3
"""Build the recorded host trees under examples/sysfs/ in the real sysfs layout.

Each tree is a host root: `sys/` (PCI devices under `sys/devices/pci*`,
linked from `sys/bus/pci/devices`; `driver`, `iommu_group`, `virtfn*` and
`physfn` symlinks; `numa_node`, `class`, `vendor`, `device` files; for GPUs and
VFs `subsystem_vendor`, `subsystem_device` and a writable `reset` file (with
`reset_method`) standing in for the device's function-level reset;
`sys/class/infiniband/*/ports/1/{state,link_layer}`; `sys/block/nvme*`),
`dev/` (`disk/by-id` links, `kvm`, and per disk a plain file holding the
first bytes of the disk, empty when they are all zeros), `proc/`
(`self/mountinfo`, `cmdline`, `sys/kernel/hostname`), `etc/default/grub`, and
the libvirt/OVS binaries as empty marker files. Discovery reads these trees
exactly as it reads `/`.

Trees:
  xe9680l-h200               8x H200 Dell XE9680L: one ConnectX-7 (InfiniBand) with
                             2 VFs under each GPU's PCIe switch, a BlueField-3
                             (Ethernet) with VFs, 9 NVMe (nvme4n1 = BOSS-N1 OS disk)
  xe9680l-h200-shared-parent the same host before per-slot VFs: one BlueField-3,
                             SR-IOV off, no other fabric device
  xe9680-mi300x-roce         8x MI300X with ConnectX-7 in Ethernet (RoCE) mode; one
                             GPU still on amdgpu, one port down, one disk with a
                             stale ext4 signature, one disk mounted as host share

Usage:
  python examples/sysfs/build.py              rebuild every tree in place
  python examples/sysfs/build.py --out DIR    build them under DIR instead
`make demo` and `make test` build them (examples/sysfs/.built marks a finished build);
tests build their own copies once per session.
"""

from __future__ import annotations

import argparse
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

INTEL_ROOT_PORT = ("0x8086", "0x352a")
SWITCH_PORT = ("0x1000", "0xc030")  # Broadcom PEX890xx switch ports
NVME_CLASS = "0x010802"
BRIDGE_CLASS = "0x060400"
SECTORS_3T84 = 7501476528
SECTORS_480G = 937703088


@dataclass
class Disk:
    name: str  # kernel name, "nvme0n1"
    model: str
    serial: str
    sectors: int = SECTORS_3T84
    header: bytes = b""  # first bytes of the disk; empty means zeros
    partitions: tuple[tuple[str, int], ...] = ()  # (mount point or "", sectors)


@dataclass
class Rail:
    """One PCIe switch: a GPU, its fabric NIC and an NVMe drive, on one NUMA node."""

    gpu_bus: int
    nic_bus: int
    numa: int
    disk: Disk
    nic: str = "rail"  # "rail": the host's rail NIC; "bf3": a BlueField-3; "none": empty slot
    gpu_driver: str = "vfio-pci"
    vfs: int = 2
    port_state: str = "4: ACTIVE"


@dataclass
class Host:
    dirname: str
    hostname: str
    gpu: tuple[str, str, str]  # vendor, device, class
    nic: tuple[str, str]  # device, class
    link_layer: str
    rate: str
    rails: list[Rail]
    os_disk: Disk
    os_disk_bus: int
    bf3_bus: int | None = None  # a BlueField-3 with two PFs and 2 VFs each (management)
    cmdline: str = (
        "BOOT_IMAGE=/vmlinuz-6.8.0-60-generic root=UUID=8c1f0e3a-4d2b-4f7e-9a51-3e0d2c6b7a10 ro "
        "intel_iommu=on iommu=pt default_hugepagesz=1G hugepagesz=1G hugepages=512"
    )
    cpulists: tuple[str, ...] = ("0-55,112-167", "56-111,168-223")
    mem_kib: tuple[int, ...] = (1056587092, 1056895304)
    hugepages_1g: int = 512


def gpt_header() -> bytes:
    """Protective MBR plus a GPT header signature: what a partitioned disk starts with."""
    data = bytearray(1024)
    data[510:512] = b"\x55\xaa"
    data[512:520] = b"EFI PART"
    return bytes(data)


def ext4_header() -> bytes:
    data = bytearray(2048)
    data[1080:1082] = b"\x53\xef"
    return bytes(data)


class Tree:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.group = 10
        self.minor = 0
        self.mounts: list[tuple[str, str, str, str]] = []  # (major:minor, point, fstype, source)

    def file(self, rel: str, text: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n" if text else "")

    def raw(self, rel: str, data: bytes) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def link(self, rel: str, target: str) -> None:
        """A relative symlink at `rel` to the root-relative `target`, spelled as the kernel does.

        The kernel never ends a link in "..": a link to an ancestor climbs one
        level further and names it (`device -> ../../../0000:1a:00.0`).
        """
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        relative = os.path.relpath(target, os.path.dirname(rel))
        if os.path.basename(relative) == "..":
            relative = os.path.join(relative, "..", os.path.basename(target))
        path.symlink_to(relative)

    def pci(
        self,
        chain: list[str],
        addr: str,
        *,
        vendor: str,
        device: str,
        cls: str,
        numa: int,
        driver: str | None = None,
        group: bool = True,
        subsystem: tuple[str, str] | None = None,
        reset: bool = False,
    ) -> str:
        dev = "sys/devices/" + "/".join([*chain, addr])
        self.file(f"{dev}/vendor", vendor)
        self.file(f"{dev}/device", device)
        if subsystem is not None:
            self.file(f"{dev}/subsystem_vendor", subsystem[0])
            self.file(f"{dev}/subsystem_device", subsystem[1])
        if reset:  # a function-level reset the kernel offers; a writable file stands in for the device
            self.file(f"{dev}/reset", "")
            self.file(f"{dev}/reset_method", "flr bus")
        self.file(f"{dev}/class", cls)
        self.file(f"{dev}/numa_node", str(numa))
        self.link(f"sys/bus/pci/devices/{addr}", dev)
        if driver is not None:
            self.link(f"{dev}/driver", f"sys/bus/pci/drivers/{driver}")
            self.link(f"sys/bus/pci/drivers/{driver}/{addr}", dev)
        if group:
            self.group += 1
            self.link(f"{dev}/iommu_group", f"sys/kernel/iommu_groups/{self.group}")
            self.link(f"sys/kernel/iommu_groups/{self.group}/devices/{addr}", dev)
        return dev

    def bridge(self, chain: list[str], addr: str, numa: int, ids: tuple[str, str]) -> None:
        self.pci(
            chain, addr, vendor=ids[0], device=ids[1], cls=BRIDGE_CLASS, numa=numa, group=False
        )

    def block(self, rel_dir: str, name: str, sectors: int) -> str:
        dev = f"259:{self.minor}"
        self.minor += 1
        self.file(f"{rel_dir}/size", str(sectors))
        self.file(f"{rel_dir}/dev", dev)
        self.link(f"sys/class/block/{name}", rel_dir)
        self.link(f"sys/dev/block/{dev}", rel_dir)
        return dev

    def nvme(self, chain: list[str], addr: str, numa: int, index: int, disk: Disk) -> None:
        dev_dir = self.pci(
            chain, addr, vendor="0x144d", device="0xa824", cls=NVME_CLASS, numa=numa, driver="nvme"
        )
        ctrl = f"{dev_dir}/nvme/nvme{index}"
        self.file(f"{ctrl}/model", disk.model)
        self.file(f"{ctrl}/serial", disk.serial)
        self.file(f"{ctrl}/address", addr)
        self.link(f"{ctrl}/device", dev_dir)
        self.link(f"sys/class/nvme/nvme{index}", ctrl)
        ns = f"{ctrl}/{disk.name}"
        self.block(ns, disk.name, disk.sectors)
        eui = f"eui.00253885{index:04x}{int(addr[5:7], 16):02x}0a"
        self.file(f"{ns}/wwid", eui)
        self.link(f"{ns}/device", ctrl)
        self.link(f"sys/block/{disk.name}", ns)
        self.raw(f"dev/{disk.name}", disk.header)
        by_id = f"nvme-{'_'.join(disk.model.split())}_{disk.serial}"
        for alias in (by_id, f"{by_id}_1", f"nvme-{eui}"):
            self.link(f"dev/disk/by-id/{alias}", f"dev/{disk.name}")
        for number, (point, sectors) in enumerate(disk.partitions, start=1):
            part = f"{disk.name}p{number}"
            pdev = self.block(f"{ns}/{part}", part, sectors)
            self.file(f"{ns}/{part}/partition", str(number))
            self.link(f"dev/disk/by-id/{by_id}-part{number}", f"dev/{part}")
            if point:
                fstype = (
                    "vfat"
                    if point == "/boot/efi"
                    else "xfs"
                    if point.startswith("/srv")
                    else "ext4"
                )
                self.mounts.append((pdev, point, fstype, f"/dev/{part}"))

    def fabric_pf(
        self,
        chain: list[str],
        addr: str,
        numa: int,
        *,
        device: str,
        cls: str,
        ib: str,
        guid: str,
        link_layer: str,
        rate: str,
        state: str,
        vfs: list[str],
        totalvfs: int,
    ) -> None:
        dev = self.pci(
            chain, addr, vendor="0x15b3", device=device, cls=cls, numa=numa, driver="mlx5_core"
        )
        self.file(f"{dev}/sriov_totalvfs", str(totalvfs))
        self.file(f"{dev}/sriov_numvfs", str(len(vfs)))
        ibdir = f"{dev}/infiniband/{ib}"
        self.file(f"{ibdir}/node_guid", guid)
        self.file(f"{ibdir}/ports/1/state", state)
        self.file(
            f"{ibdir}/ports/1/phys_state", "5: LinkUp" if "ACTIVE" in state else "3: Disabled"
        )
        self.file(f"{ibdir}/ports/1/link_layer", link_layer)
        self.file(f"{ibdir}/ports/1/rate", rate)
        self.link(f"{ibdir}/device", dev)
        self.link(f"sys/class/infiniband/{ib}", ibdir)
        for n, vf in enumerate(vfs):
            vdev = self.pci(
                chain, vf, vendor="0x15b3", device="0x101e", cls=cls, numa=numa, driver="vfio-pci",
                subsystem=("0x15b3", "0x0023"), reset=True,
            )
            self.link(f"{dev}/virtfn{n}", vdev)
            self.link(f"{vdev}/physfn", dev)


def build(host: Host, root: Path) -> None:
    if root.exists():
        shutil.rmtree(root)
    t = Tree(root)
    # Fabric devices get RDMA names in PCI address order, as mlx5 probes them.
    functions = [(r.nic_bus, 0) for r in host.rails if r.nic != "none"]
    if host.bf3_bus is not None:
        functions += [(host.bf3_bus, 0), (host.bf3_bus, 1)]
    ib_names = {f: f"mlx5_{i}" for i, f in enumerate(sorted(functions))}

    def guid(bus: int, fn: int) -> str:
        return f"a088:c203:00{fn:x}{bus >> 4:x}:{bus:02x}7e"

    nvme_index = 0
    rails_by_numa = sorted(host.rails, key=lambda r: (r.numa, r.gpu_bus))
    for rail in rails_by_numa:
        root_bus = min(rail.gpu_bus, rail.nic_bus) - 3
        chain = [f"pci0000:{root_bus:02x}", f"0000:{root_bus:02x}:01.0"]
        t.bridge(chain[:1], chain[1], rail.numa, INTEL_ROOT_PORT)
        up = f"0000:{root_bus + 1:02x}:00.0"
        t.bridge(chain, up, rail.numa, SWITCH_PORT)
        downs = [f"0000:{root_bus + 2:02x}:0{k}.0" for k in range(3)]
        for down in downs:
            t.bridge([*chain, up], down, rail.numa, SWITCH_PORT)
        gpu_vendor, gpu_device, gpu_class = host.gpu
        t.pci(
            [*chain, up, downs[1]],
            f"0000:{rail.gpu_bus:02x}:00.0",
            vendor=gpu_vendor,
            device=gpu_device,
            cls=gpu_class,
            numa=rail.numa,
            driver=rail.gpu_driver,
            subsystem=(gpu_vendor, "0x1833"),
            reset=True,
        )
        if rail.nic != "none":
            nic = f"0000:{rail.nic_bus:02x}"
            device, cls = host.nic if rail.nic == "rail" else ("0xa2dc", "0x020700")
            t.fabric_pf(
                [*chain, up, downs[0]],
                f"{nic}:00.0",
                rail.numa,
                device=device,
                cls=cls,
                ib=ib_names[(rail.nic_bus, 0)],
                guid=guid(rail.nic_bus, 0),
                link_layer=host.link_layer,
                rate=host.rate,
                state=rail.port_state,
                vfs=[f"{nic}:00.{n + 1}" for n in range(rail.vfs)],
                totalvfs=16,
            )
        if nvme_index == 4:  # the BOSS-N1 OS disk probes between the two sockets' drives
            _os_disk(t, host)
            nvme_index += 1
        nvme_bus = max(rail.gpu_bus, rail.nic_bus) + 1
        t.nvme(
            [*chain, up, downs[2]], f"0000:{nvme_bus:02x}:00.0", rail.numa, nvme_index, rail.disk
        )
        nvme_index += 1
    if host.bf3_bus is not None:
        bus = host.bf3_bus
        chain = [f"pci0000:{bus - 1:02x}", f"0000:{bus - 1:02x}:01.0"]
        t.bridge(chain[:1], chain[1], 0, INTEL_ROOT_PORT)
        for fn in (0, 1):
            t.fabric_pf(
                chain,
                f"0000:{bus:02x}:00.{fn}",
                0,
                device="0xa2dc",
                cls="0x020000",
                ib=ib_names[(bus, fn)],
                guid=guid(bus, fn),
                link_layer="Ethernet",
                rate="200 Gb/sec (2X NDR)",
                state="4: ACTIVE",
                vfs=[f"0000:{bus:02x}:00.{2 + 2 * fn + n}" for n in range(2)],
                totalvfs=4,
            )
    _host_files(t, host)


def _os_disk(t: Tree, host: Host) -> None:
    bus = host.os_disk_bus
    chain = [f"pci0000:{bus - 1:02x}", f"0000:{bus - 1:02x}:01.0"]
    t.bridge(chain[:1], chain[1], 0, INTEL_ROOT_PORT)
    t.nvme(chain, f"0000:{bus:02x}:00.0", 0, 4, host.os_disk)


def _host_files(t: Tree, host: Host) -> None:
    for i, (cpulist, mem) in enumerate(zip(host.cpulists, host.mem_kib, strict=True)):
        node = f"sys/devices/system/node/node{i}"
        t.file(f"{node}/cpulist", cpulist)
        t.file(
            f"{node}/meminfo",
            f"Node {i} MemTotal:       {mem} kB\nNode {i} MemFree:        {mem // 2} kB",
        )
        per_node = host.hugepages_1g // len(host.cpulists)
        t.file(f"{node}/hugepages/hugepages-1048576kB/nr_hugepages", str(per_node))
        t.file(f"{node}/hugepages/hugepages-1048576kB/free_hugepages", str(per_node))
        t.file(f"{node}/hugepages/hugepages-2048kB/nr_hugepages", "0")
        t.file(f"{node}/hugepages/hugepages-2048kB/free_hugepages", "0")
    t.file("sys/devices/system/node/online", f"0-{len(host.cpulists) - 1}")
    t.file("sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages", str(host.hugepages_1g))
    t.file("sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages", str(host.hugepages_1g))
    t.file("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "0")
    t.file("sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "0")
    t.file("sys/module/vfio_pci/refcnt", "0")
    t.file("dev/kvm", "")
    for marker in (
        "usr/sbin/libvirtd",
        "usr/bin/virsh",
        "usr/sbin/ovs-vswitchd",
        "usr/bin/ovs-vsctl",
        "run/libvirt/libvirt-sock",
        "run/openvswitch/db.sock",
    ):
        t.file(marker, "")
    args = " ".join(
        a
        for a in host.cmdline.split()
        if a.split("=")[0]
        in {"intel_iommu", "amd_iommu", "iommu", "default_hugepagesz", "hugepagesz", "hugepages"}
    )
    t.file(
        "etc/default/grub",
        f'GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX_DEFAULT=""\n'
        f'GRUB_CMDLINE_LINUX="{args}"',
    )
    t.file("proc/cmdline", host.cmdline)
    t.file("proc/sys/kernel/hostname", host.hostname)
    t.file("proc/sys/kernel/osrelease", "6.8.0-60-generic")
    lines = [
        f"21 1 {dev} / / rw,relatime shared:1 - {fs} {src} rw,errors=remount-ro"
        for dev, point, fs, src in t.mounts
        if point == "/"
    ]
    lines += [
        "22 21 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw",
        "23 21 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw",
        "24 21 0:5 / /dev rw,nosuid,relatime shared:2 - devtmpfs udev rw,size=1056000000k,mode=755",
        "25 21 0:25 / /run rw,nosuid,nodev,noexec,relatime shared:5 - tmpfs tmpfs rw,mode=755",
    ]
    lines += [
        f"{30 + i} 21 {dev} / {point.replace(' ', chr(92) + '040')} rw,relatime "
        f"shared:{30 + i} - {fs} {src} rw"
        for i, (dev, point, fs, src) in enumerate(t.mounts)
        if point != "/"
    ]
    t.file("proc/self/mountinfo", "\n".join(lines))


def _samsung(
    name: str, serial: str, header: bytes = b"", partitions: tuple[tuple[str, int], ...] = ()
) -> Disk:
    return Disk(name, "SAMSUNG MZWLR3T8HBLS-00007", serial, header=header, partitions=partitions)


def _boss(name: str, serial: str) -> Disk:
    return Disk(
        name,
        "Dell BOSS-N1",
        serial,
        sectors=SECTORS_480G,
        header=gpt_header(),
        partitions=(("/boot/efi", 2201600), ("/", SECTORS_480G - 2203648)),
    )


H200 = ("0x10de", "0x2335", "0x030200")
H200_RAILS = [
    (0x1B, 0x1A, 0),
    (0x3C, 0x3A, 0),
    (0x4B, 0x4D, 0),
    (0x5C, 0x5D, 0),
    (0x9A, 0x9B, 1),
    (0xBB, 0xBA, 1),
    (0xCD, 0xCA, 1),
    (0xDC, 0xDB, 1),
]
MI300X_RAILS = [
    (0x05, 0x0C, 0),
    (0x26, 0x2C, 0),
    (0x46, 0x4C, 0),
    (0x65, 0x6C, 0),
    (0x85, 0x8C, 1),
    (0xA6, 0xAC, 1),
    (0xC6, 0xCC, 1),
    (0xE5, 0xEC, 1),
]


def _disk_names() -> list[str]:
    """Slot-order kernel names: nvme4n1 is the OS disk (seed 003)."""
    return [f"nvme{i}n1" for i in (0, 1, 2, 3, 5, 6, 7, 8)]


def hosts() -> list[Host]:
    names = _disk_names()
    h200 = Host(
        dirname="xe9680l-h200",
        hostname="h200-use1-s01",
        gpu=H200,
        nic=("0x1021", "0x020700"),
        link_layer="InfiniBand",
        rate="400 Gb/sec (4X NDR)",
        rails=[
            Rail(g, n, numa, _samsung(names[i], f"S6EXNA0W10{i}"))
            for i, (g, n, numa) in enumerate(H200_RAILS)
        ],
        os_disk=_boss("nvme4n1", "S6EXNA0W1OS"),
        os_disk_bus=0x6A,
        bf3_bus=0x29,
    )
    shared = Host(
        dirname="xe9680l-h200-shared-parent",
        hostname="h200-use1-c01",
        gpu=H200,
        nic=("0x1021", "0x020700"),
        link_layer="InfiniBand",
        rate="400 Gb/sec (4X NDR)",
        rails=[
            Rail(
                g,
                n,
                numa,
                _samsung(names[i], f"S6EXNA0W40{i}"),
                nic="bf3" if i == 0 else "none",
                vfs=0,
            )
            for i, (g, n, numa) in enumerate(H200_RAILS)
        ],
        os_disk=_boss("nvme4n1", "S6EXNA0W4OS"),
        os_disk_bus=0x6A,
    )
    mi_rails = []
    for i, (g, n, numa) in enumerate(MI300X_RAILS):
        disk = _samsung(names[i], f"S7AMDR010{i}")
        if i == 5:
            disk = _samsung(names[i], f"S7AMDR010{i}", header=ext4_header())
        if i == 7:
            disk = _samsung(
                names[i],
                f"S7AMDR010{i}",
                header=gpt_header(),
                partitions=((f"/srv/share/{names[i]}", SECTORS_3T84 - 4096),),
            )
        mi_rails.append(
            Rail(
                g,
                n,
                numa,
                disk,
                gpu_driver="amdgpu" if i == 6 else "vfio-pci",
                port_state="1: DOWN" if i == 3 else "4: ACTIVE",
            )
        )
    mi300x = Host(
        dirname="xe9680-mi300x-roce",
        hostname="mi300x-euw1-r01",
        gpu=("0x1002", "0x74a1", "0x120000"),
        nic=("0x1021", "0x020000"),
        link_layer="Ethernet",
        rate="400 Gb/sec (4X NDR)",
        rails=mi_rails,
        os_disk=_boss("nvme4n1", "S7AMDR01OS"),
        os_disk_bus=0x71,
    )
    return [h200, shared, mi300x]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=HERE, help="directory to build the trees in")
    args = parser.parse_args()
    for host in hosts():
        build(host, args.out / host.dirname)
        print(f"built {args.out / host.dirname}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
