"""Real parts for the host reconciler tests: loop devices, a libvirt test host, a netns.

A lab node looks like this (everything under the test's tmp dir, removed
after the test, pass or fail):

    by-id/nvme-OS   -> /dev/loopA  (ext4, the "OS disk": never touched)
    by-id/nvme-S0   -> /dev/loopB  slot 0, NUMA 0      GPU 0000:1b:00.0  VF 0000:1a:00.1
    by-id/nvme-S1   -> /dev/loopC  slot 1, NUMA 0      GPU 0000:3c:00.0  VF 0000:3a:00.1
    by-id/nvme-S2   -> /dev/loopD  slot 2, NUMA 1      GPU 0000:9a:00.0  VF 0000:9b:00.1
    ...
    libvirt  test:///<tmp>/node.xml   2 NUMA nodes x 8 CPUs, PCI devices, private per connection
    netns    gpuaas-t<hex>            bridge gpuaasbr0 10.100.0.1/24 + dnsmasq, made by the drivers

udev does not run here, so the by-id names are symlinks the test makes, and
the disk driver takes its by-id root as a setting.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from host_reconciler import settings as hs
from schemas import hostplans as hp

NODE_XML = """<node>
  <cpu>
    <mhz>2000</mhz>
    <model>x86_64</model>
    <active>16</active>
    <nodes>2</nodes>
    <sockets>2</sockets>
    <cores>4</cores>
    <threads>2</threads>
  </cpu>
  <memory>67108864</memory>
{devices}
</node>
"""
PCI_DEVICE = """  <device>
    <name>pci_{dom}_{bus}_{slot}_{fn}</name>
    <parent>computer</parent>
    <capability type='pci'>
      <domain>{idom}</domain><bus>{ibus}</bus><slot>{islot}</slot><function>{ifn}</function>
      <product id='{product}'>{label}</product>
      <vendor id='{vendor}'>{vendor_name}</vendor>
      <numa node='{numa}'/>
    </capability>
  </device>"""

SLOTS = (
    # slot, GPU, VF, NUMA
    (0, "0000:1b:00.0", "0000:1a:00.1", 0),
    (1, "0000:3c:00.0", "0000:3a:00.1", 0),
    (2, "0000:9a:00.0", "0000:9b:00.1", 1),
    (3, "0000:ba:00.0", "0000:bb:00.1", 1),
)
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGkq1pXK4n0mR2o1x0dYt1cJ3Yb0vW2e9o8G1q3hZpXa t@lab"
NETWORK = hp.Network(
    subnet="10.100.0.0/24", gateway="10.100.0.1", dhcp_start="10.100.0.10", dhcp_end="10.100.0.250", bridge="gpuaasbr0"
)


def need_root(*tools: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (loop devices, namespaces)")
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (make apt installs it)")


def run(*argv: str) -> str:
    return subprocess.run(list(argv), check=True, capture_output=True, text=True).stdout.strip()


def node_xml(path: Path, slots: tuple[tuple[int, str, str, int], ...] = SLOTS) -> str:
    devs = []
    for _slot, gpu, vf, numa in slots:
        for addr, product, label, vendor, vname in (
            (gpu, "0x2335", "H200", "0x10de", "NVIDIA"),
            (vf, "0x101e", "CX7 VF", "0x15b3", "Mellanox"),
        ):
            d, b, rest = addr.split(":")
            s, f = rest.split(".")
            devs.append(
                PCI_DEVICE.format(
                    dom=d,
                    bus=b,
                    slot=s,
                    fn=f,
                    idom=int(d, 16),
                    ibus=int(b, 16),
                    islot=int(s, 16),
                    ifn=int(f, 16),
                    product=product,
                    label=label,
                    vendor=vendor,
                    vendor_name=vname,
                    numa=numa,
                )
            )
    path.write_text(NODE_XML.format(devices="\n".join(devs)))
    return f"test://{path}"


@dataclass
class Loop:
    name: str
    device: str
    backing: Path
    by_id: str  # /dev/disk/by-id/<name>, as a plan names it

    def sha256(self) -> str:
        h = hashlib.sha256()
        with open(self.device, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
        return h.hexdigest()


@dataclass
class Loops:
    root: Path
    by_id_root: Path
    loops: list[Loop] = field(default_factory=list)
    mounts: list[Path] = field(default_factory=list)

    def make(self, name: str, size_mb: int = 16, fs: str | None = None) -> Loop:
        backing = self.root / f"{name}.img"
        with backing.open("wb") as f:
            f.truncate(size_mb << 20)
        dev = run("losetup", "--find", "--show", str(backing))
        loop = Loop(name, dev, backing, f"/dev/disk/by-id/{name}")
        self.loops.append(loop)
        (self.by_id_root / name).symlink_to(dev)
        if fs:
            run(f"mkfs.{fs}", "-q", dev)
        return loop

    def mount(self, loop: Loop, *, mkfs: bool = True) -> Path:
        """Mount `loop` (making an ext4 on it first unless told not to)."""
        if mkfs:
            run("mkfs.ext4", "-q", "-F", loop.device)
        point = self.root / f"mnt-{loop.name}"
        point.mkdir()
        run("mount", loop.device, str(point))
        self.mounts.append(point)
        return point

    def cleanup(self) -> None:
        for point in reversed(self.mounts):
            subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)
        for loop in self.loops:
            subprocess.run(["losetup", "-d", loop.device], capture_output=True, check=False)


@pytest.fixture
def loops(tmp_path: Path) -> Iterator[Loops]:
    need_root("losetup", "mkfs.ext4", "wipefs", "blkdiscard", "blkid")
    by_id = tmp_path / "by-id"
    by_id.mkdir()
    lab = Loops(tmp_path, by_id)
    try:
        yield lab
    finally:
        lab.cleanup()


@pytest.fixture
def netns() -> Iterator[str]:
    need_root("ip", "iptables", "dnsmasq")
    name = f"gpuaas-t{uuid.uuid4().hex[:8]}"
    run("ip", "netns", "add", name)
    try:
        yield name
    finally:
        kill_dnsmasq_in(name)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def kill_dnsmasq_in(ns: str) -> None:
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False)
    for pid in pids.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), 9)


@dataclass
class Lab:
    """One lab node: disks, image, settings and plan builders."""

    root: Path
    loops: Loops
    os_disk: Loop
    slot_disks: dict[int, Loop]
    image: Path
    digest: str
    settings_doc: dict[str, Any]
    node: str = "node-a"

    def settings(self, **changes: Any) -> hs.HostSettings:
        return hs.from_dict(self.node, {**self.settings_doc, **changes})

    def write_config(self, **changes: Any) -> Path:
        path = self.root / f"host-{uuid.uuid4().hex[:6]}.json"
        path.write_text(json.dumps({**self.settings_doc, **changes}))
        return path

    def bundle(self, slot: int) -> hp.SlotBundle:
        _s, gpu, vf, numa = SLOTS[slot]
        return hp.SlotBundle(
            slot, gpu, vf, self.slot_disks[slot].by_id, f"52:54:00:aa:00:{slot:02x}", f"10.100.0.{10 + slot}", numa
        )

    def vm(
        self, alloc: str, slots: tuple[int, ...], *, vcpus: int = 2, memory_mib: int = 1024, hugepages: bool = False
    ) -> hp.VmSpec:
        return hp.VmSpec(
            allocation_id=alloc,
            tenant="acme",
            bundles=tuple(self.bundle(s) for s in slots),
            vcpu_count=vcpus,
            memory_mib=memory_mib,
            hugepages=hugepages,
            hugepage_size="1G" if hugepages else None,
            image=hp.ImageRef("lab-image", "lab/lab-image.raw", self.digest, "raw"),
            ssh_keys=(SSH_KEY,),
        )

    def plan(
        self,
        generation: int = 1,
        *,
        vms: tuple[hp.VmSpec, ...] = (),
        releases: tuple[hp.VmSpec, ...] = (),
        **changes: Any,
    ) -> hp.HostPlan:
        plan = hp.HostPlan(
            node=self.node,
            generation=generation,
            network=NETWORK,
            os_disk=self.os_disk.by_id,
            shutdown_timeout_s=2,
            readiness_timeout_s=5,
            vms=vms,
            releases=releases,
            slots=tuple(self.bundle(s) for s in sorted(self.slot_disks)),
            disk_identities=tuple(hp.SlotIdentity(s, self.identity(s)) for s in sorted(self.slot_disks)),
        )
        return replace(plan, **changes)

    def identity(self, slot: int) -> hp.DiskIdentity:
        """What the approval of slot `slot` records: its loop device's backing file and size."""
        backing = self.slot_disks[slot].backing
        return hp.DiskIdentity(size_bytes=backing.stat().st_size, backing_file=os.path.realpath(backing))


def make_lab(
    tmp_path: Path, loops: Loops, ns: str, *, slots: int = 4, libvirt_uri: str | None = None, disk_mb: int = 16
) -> Lab:
    os_disk = loops.make("nvme-OS", 16, fs="ext4")
    disks = {i: loops.make(f"nvme-S{i}", disk_mb) for i in range(slots)}  # free slots: blank
    image = tmp_path / "images" / "lab" / "lab-image.raw"
    image.parent.mkdir(parents=True)
    # A small "image": a boot-sector-like header and random content, 2 MiB.
    image.write_bytes(b"\xeb\x63\x90GPUAASLAB" + os.urandom((2 << 20) - 12))
    digest = hashlib.sha256(image.read_bytes()).hexdigest()
    uri = libvirt_uri or node_xml(tmp_path / "node.xml")
    doc = {
        "libvirt_uri": uri,
        "state_dir": str(tmp_path / "state"),
        "image_dir": str(tmp_path / "images"),
        "by_id_root": str(loops.by_id_root),
        "netns": ns,
        "readiness": "none",
        "pci": "fake-vfio",
        "graceful_poll_s": 0.05,
        "wipe_sample_count": 16,
    }
    return Lab(tmp_path, loops, os_disk, disks, image, digest, doc)


@pytest.fixture
def lab(tmp_path: Path, loops: Loops, netns: str) -> Lab:
    return make_lab(tmp_path, loops, netns)
